"""Tests for the compile-cache key: what must keep it, what must change it, what is rejected."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from extender.core.cachekey import (
    BUILTIN_IGNORED_FLAGS,
    KEY_VERSION,
    CacheKeyError,
    CompileKeyInputs,
    compile_cache_key,
    key_material,
    normalise_launch_args,
)
from extender.core.errors import ExtenderError

MODEL = "Qwen/Qwen3-30B-A3B"
COMPILATION_CONFIG = '{"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}'

BASE_ARGS: list[str] = [
    "--max-model-len",
    "8192",
    "--enable-prefix-caching",
    "--compilation-config",
    COMPILATION_CONFIG,
    "--port",
    "8000",
]
BACKEND = "VLLM_ATTENTION_BACKEND"
TRITON_FA = "VLLM_USE_TRITON_FLASH_ATTN"
BASE_ENV: dict[str, str] = {BACKEND: "FLASH_ATTN", TRITON_FA: "0"}

# The policy YAML form (camelCase), as a platform team would write it.
BASE: dict[str, object] = {
    "modelId": MODEL,
    "revision": "ae659febe817e4b3ebd7355f47792725801204c9",
    "imageDigest": "sha256:" + "0123456789abcdef" * 4,
    "dtype": "bfloat16",
    "quantization": "fp8",
    "engine": "vllm",
    "engineVersion": "0.10.1",
    "torchVersion": "2.7.1",
    "tritonVersion": "3.3.1",
    "cudaVersion": "12.8",
    "driverVersion": "570.133.20",
    "launchArgs": BASE_ARGS,
    "ignoreArgs": [],
    "graphEnv": BASE_ENV,
}
PLACEMENT: dict[str, object] = {"gpu_product": "NVIDIA-H200", "tensor_parallel": 2, "pipeline_parallel": 1}


def inputs(overrides: Mapping[str, object] | None = None) -> CompileKeyInputs:
    return CompileKeyInputs.model_validate({**BASE, **(overrides or {})})


def key(overrides: Mapping[str, object] | None = None, placement: Mapping[str, object] | None = None) -> str:
    where = {**PLACEMENT, **(placement or {})}
    return compile_cache_key(
        inputs(overrides),
        gpu_product=str(where["gpu_product"]),
        tensor_parallel=int(str(where["tensor_parallel"])),
        pipeline_parallel=int(str(where["pipeline_parallel"])),
    )


BASE_KEY = key()

# --- rows that must keep the key identical ------------------------------------------------------

SAME: list[tuple[str, dict[str, object]]] = [
    (
        "flag-order",
        {
            "launchArgs": [
                "--port",
                "8000",
                "--compilation-config",
                COMPILATION_CONFIG,
                "--enable-prefix-caching",
                "--max-model-len",
                "8192",
            ]
        },
    ),
    (
        "equals-form",
        {
            "launchArgs": [
                "--max-model-len=8192",
                "--enable-prefix-caching",
                f"--compilation-config={COMPILATION_CONFIG}",
                "--port=8000",
            ]
        },
    ),
    (
        "underscore-names",
        {
            "launchArgs": [
                "--max_model_len",
                "8192",
                "--enable_prefix_caching",
                "--compilation_config",
                COMPILATION_CONFIG,
                "--port",
                "8000",
            ]
        },
    ),
    (
        "json-whitespace-and-key-order",
        {
            "launchArgs": [
                "--max-model-len",
                "8192",
                "--enable-prefix-caching",
                "--compilation-config",
                '{ "cudagraph_capture_sizes" : [ 1,2, 4 ],\n  "level":3 }',
                "--port",
                "8000",
            ]
        },
    ),
    (
        "other-port",
        {"launchArgs": ["--max-model-len", "8192", "--enable-prefix-caching",
                        "--compilation-config", COMPILATION_CONFIG, "--port", "9000"]},
    ),
    (
        "no-port",
        {"launchArgs": ["--max-model-len", "8192", "--enable-prefix-caching",
                        "--compilation-config", COMPILATION_CONFIG]},
    ),
    (
        "builtin-ignored-flags-added",
        {
            "launchArgs": [
                *BASE_ARGS,
                "--host", "0.0.0.0",
                "--served-model-name", "qwen3",
                "--api-key", "s3cret",
                "--uvicorn-log-level", "warning",
                "--log-level", "debug",
                "--disable-log-requests",
                "--enable-log-requests",
                "--no-enable-log-requests",
                "--disable-log-stats",
                "--root-path", "/qwen",
                "--ssl-keyfile", "/tls/key.pem",
                "--ssl-certfile=/tls/cert.pem",
                "--model", "/models/qwen3",
                "--model-path", "/models/qwen3",
            ]
        },
    ),
    ("positional-model", {"launchArgs": [MODEL, *BASE_ARGS]}),
    ("vllm-serve-model", {"launchArgs": ["vllm", "serve", "/models/qwen3", *BASE_ARGS]}),
    (
        "team-ignored-flag",
        {
            "launchArgs": [*BASE_ARGS, "--disable-fastapi-docs", "--otlp-traces-endpoint", "x:4317"],
            "ignoreArgs": ["--disable_fastapi_docs", "--otlp-*"],
        },
    ),
    ("unused-ignore-entry", {"ignoreArgs": ["--metrics-port"]}),
    ("graph-env-order", {"graphEnv": {TRITON_FA: "0", BACKEND: "FLASH_ATTN"}}),
]


@pytest.mark.parametrize("overrides", [row for _, row in SAME], ids=[name for name, _ in SAME])
def test_key_unchanged(overrides: dict[str, object]) -> None:
    assert key(overrides) == BASE_KEY


# --- rows that must change the key --------------------------------------------------------------

# One row per CompileKeyInputs field, keyed by the Python field name. The test below is parametrised
# over the model's field list, so adding a field without a row here makes it fail.
FIELD_CHANGES: dict[str, dict[str, object]] = {
    "model_id": {"modelId": "Qwen/Qwen3-32B"},
    "revision": {"revision": "0000000000000000000000000000000000000000"},
    "image_digest": {"imageDigest": "sha256:" + "f" * 64},
    "dtype": {"dtype": "float16"},
    "quantization": {"quantization": None},
    "engine": {"engine": "sglang"},
    "engine_version": {"engineVersion": "0.10.2"},
    "torch_version": {"torchVersion": "2.8.0"},
    "triton_version": {"tritonVersion": "3.4.0"},
    "cuda_version": {"cudaVersion": "12.9"},
    "driver_version": {"driverVersion": None},
    "launch_args": {"launchArgs": ["--max-model-len", "4096", "--enable-prefix-caching",
                                   "--compilation-config", COMPILATION_CONFIG]},
    "ignore_args": {"ignoreArgs": ["--enable-prefix-caching", "--max-model-len"]},
    "graph_env": {"graphEnv": {}},
}

# Same idea for the keyword-only placement arguments of compile_cache_key.
PLACEMENT_CHANGES: dict[str, object] = {
    "gpu_product": "NVIDIA-B200",
    "tensor_parallel": 4,
    "pipeline_parallel": 2,
}

FIELDS = sorted(CompileKeyInputs.model_fields)
PLACEMENT_PARAMS = sorted(
    name
    for name, param in inspect.signature(compile_cache_key).parameters.items()
    if param.kind is inspect.Parameter.KEYWORD_ONLY
)


@pytest.mark.parametrize("field", FIELDS, ids=[f"field-{name}" for name in FIELDS])
def test_every_field_changes_key(field: str) -> None:
    assert field in FIELD_CHANGES, f"add a FIELD_CHANGES row for the new field {field!r}"
    assert key(FIELD_CHANGES[field]) != BASE_KEY


@pytest.mark.parametrize("param", PLACEMENT_PARAMS, ids=[f"placement-{name}" for name in PLACEMENT_PARAMS])
def test_every_placement_argument_changes_key(param: str) -> None:
    assert param in PLACEMENT_CHANGES, f"add a PLACEMENT_CHANGES row for the new argument {param!r}"
    assert key(placement={param: PLACEMENT_CHANGES[param]}) != BASE_KEY


def _without(group_start: int, length: int) -> list[str]:
    launch = list(BASE_ARGS)
    del launch[group_start : group_start + length]
    return launch


def _replaced(index: int, value: str) -> list[str]:
    launch = list(BASE_ARGS)
    launch[index] = value
    return launch


# Every graph-affecting argument and every graph_env entry of BASE, each changed on its own.
ARG_CHANGES: list[tuple[str, dict[str, object]]] = [
    ("max-model-len-value", {"launchArgs": _replaced(1, "16384")}),
    ("max-model-len-dropped", {"launchArgs": _without(0, 2)}),
    ("prefix-caching-dropped", {"launchArgs": _without(2, 1)}),
    ("prefix-caching-negated", {"launchArgs": _replaced(2, "--no-enable-prefix-caching")}),
    ("compilation-level", {"launchArgs": _replaced(4, '{"level": 2, "cudagraph_capture_sizes": [1, 2, 4]}')}),
    ("compilation-sizes", {"launchArgs": _replaced(4, '{"level": 3, "cudagraph_capture_sizes": [1, 2]}')}),
    ("compilation-config-dropped", {"launchArgs": _without(3, 2)}),
    ("graph-arg-added", {"launchArgs": [*BASE_ARGS, "--kv-cache-dtype", "fp8"]}),
    ("short-flag-added", {"launchArgs": [*BASE_ARGS, "-O3"]}),
    ("env-backend-value", {"graphEnv": {BACKEND: "FLASHINFER", TRITON_FA: "0"}}),
    ("env-backend-removed", {"graphEnv": {TRITON_FA: "0"}}),
    ("env-triton-value", {"graphEnv": {BACKEND: "FLASH_ATTN", TRITON_FA: "1"}}),
    ("env-triton-removed", {"graphEnv": {BACKEND: "FLASH_ATTN"}}),
    ("env-added", {"graphEnv": {**BASE_ENV, "VLLM_FLASH_ATTN_VERSION": "3"}}),
    ("quantization-set-differently", {"quantization": "awq"}),
    ("driver-set-differently", {"driverVersion": "575.51.03"}),
]


@pytest.mark.parametrize("overrides", [row for _, row in ARG_CHANGES], ids=[name for name, _ in ARG_CHANGES])
def test_graph_input_changes_key(overrides: dict[str, object]) -> None:
    assert key(overrides) != BASE_KEY


def test_change_rows_never_collide() -> None:
    keys = [key(row) for row in FIELD_CHANGES.values()]
    keys += [key(row) for _, row in ARG_CHANGES]
    keys += [key(placement={name: value}) for name, value in PLACEMENT_CHANGES.items()]
    assert len(set(keys)) == len(keys)
    assert BASE_KEY not in keys


# --- validation ---------------------------------------------------------------------------------

INVALID: list[tuple[str, dict[str, object], str]] = [
    ("digest-no-algorithm", {"imageDigest": "0123456789abcdef" * 4}, "sha256:"),
    ("digest-too-short", {"imageDigest": "sha256:abc123"}, "64 lowercase hex"),
    ("digest-uppercase", {"imageDigest": "sha256:" + "ABCDEF0123456789" * 4}, "64 lowercase hex"),
    ("digest-is-a-tag", {"imageDigest": "vllm/vllm-openai:v0.10.1"}, "a tag is not stable"),
    ("engine-unknown", {"engine": "tgi"}, "unknown engine 'tgi'"),
    ("engine-wrong-case", {"engine": "VLLM"}, "unknown engine"),
    ("unknown-field", {"gpuProduct": "NVIDIA-H200"}, "Extra inputs are not permitted"),
    ("snake-case-name", {"engine_version": "0.10.1"}, "Extra inputs are not permitted"),
    ("empty-version", {"torchVersion": ""}, "at least 1 character"),
    ("graph-env-bad-name", {"graphEnv": {"NOT A NAME": "1"}}, "not environment variable names"),
    ("ignore-not-a-flag", {"ignoreArgs": ["port"]}, "must be flag names"),
    ("ignore-with-value", {"ignoreArgs": ["--port=8000"]}, "must be flag names"),
    ("launch-args-one-string", {"launchArgs": "--port 8000"}, "tuple"),
    ("launch-args-double-dash", {"launchArgs": ["--enforce-eager", "--", MODEL]}, "bare '--'"),
    ("launch-args-empty-flag", {"launchArgs": ["--=3"]}, "has no flag name"),
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(row, message) for _, row, message in INVALID],
    ids=[name for name, _, _ in INVALID],
)
def test_invalid_inputs_rejected(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        inputs(overrides)


def test_missing_required_field_rejected() -> None:
    document = dict(BASE)
    del document["torchVersion"]
    with pytest.raises(ValidationError, match="torchVersion"):
        CompileKeyInputs.model_validate(document)


BAD_PLACEMENT: list[tuple[str, dict[str, object]]] = [
    ("gpu-empty", {"gpu_product": " "}),
    ("tp-zero", {"tensor_parallel": 0}),
    ("pp-negative", {"pipeline_parallel": -1}),
    ("tp-bool", {"tensor_parallel": True}),
]


@pytest.mark.parametrize(
    "placement", [row for _, row in BAD_PLACEMENT], ids=[name for name, _ in BAD_PLACEMENT]
)
def test_invalid_placement_rejected(placement: dict[str, object]) -> None:
    where = {**PLACEMENT, **placement}
    with pytest.raises(CacheKeyError):
        key_material(inputs(), **where)  # type: ignore[arg-type]


# --- normalise_launch_args ----------------------------------------------------------------------

NORMALISE: list[tuple[str, list[str], list[str], list[tuple[str, str]]]] = [
    ("space-and-equals", ["--a", "1", "--b=2"], [], [("--a", "1"), ("--b", "2")]),
    ("bare-boolean-last", ["--a", "1", "--flag"], [], [("--a", "1"), ("--flag", "")]),
    ("bare-boolean-before-flag", ["--flag", "--a", "1"], [], [("--a", "1"), ("--flag", "")]),
    ("no-flag-kept-apart", ["--no-flag", "--flag"], [], [("--flag", ""), ("--no-flag", "")]),
    ("negative-number-value", ["--seed", "-1"], [], [("--seed", "-1")]),
    ("repeated-flag-keeps-order", ["--x", "b", "--a", "1", "--x", "a"], [],
     [("--a", "1"), ("--x", "b"), ("--x", "a")]),
    ("list-valued-flag", ["--cuda-graph-sizes", "1", "2", "4"], [],
     [("--cuda-graph-sizes", "1"), ("--cuda-graph-sizes", "2"), ("--cuda-graph-sizes", "4")]),
    ("underscores-in-name", ["--max_model_len=1"], [], [("--max-model-len", "1")]),
    ("dotted-subkey-kept", ["--compilation_config.cudagraph_mode=FULL"], [],
     [("--compilation-config.cudagraph_mode", "FULL")]),
    ("short-flags-as-written", ["-tp", "2", "-O3"], [], [("-O3", ""), ("-tp", "2")]),
    ("json-object", ["--c", '{"b": [1, 2], "a": {"y": 1, "x": 2}}'], [],
     [("--c", '{"a":{"x":2,"y":1},"b":[1,2]}')]),
    ("json-array", ["--c=[ 1, 2 ]"], [], [("--c", "[1,2]")]),
    ("not-json-kept", ["--c", "{not json"], [], [("--c", "{not json")]),
    ("json-scalar-kept", ["--c", " 3.0"], [], [("--c", " 3.0")]),
    ("leading-positionals-dropped", ["vllm", "serve", MODEL, "--a", "1"], [], [("--a", "1")]),
    ("only-positionals", [MODEL], [], []),
    ("ignored-value-consumed", ["--port", "8000", "--a", "1"], [], [("--a", "1")]),
    ("ignored-equals-form", ["--host=0.0.0.0", "--a"], [], [("--a", "")]),
    ("ignored-prefix-builtin", ["--ssl-ca-certs", "/ca.pem", "--a"], [], [("--a", "")]),
    ("ignored-by-caller", ["--metrics-port", "9", "--a", "1"], ["--metrics_port"], [("--a", "1")]),
    ("ignored-prefix-by-caller", ["--otlp-x", "1", "--otlp-y=2", "--a"], ["--otlp-*"], [("--a", "")]),
    ("negated-ignored", ["--no-enable-log-requests", "--a"], [], [("--a", "")]),
    ("empty", [], [], []),
]


@pytest.mark.parametrize(
    ("args", "ignore", "expected"),
    [(args, ignore, expected) for _, args, ignore, expected in NORMALISE],
    ids=[name for name, _, _, _ in NORMALISE],
)
def test_normalise_launch_args(args: list[str], ignore: list[str], expected: list[tuple[str, str]]) -> None:
    assert normalise_launch_args(args, ignore) == tuple(expected)


@pytest.mark.parametrize(
    ("args", "ignore"),
    [("--port 8000", ()), (["--a"], "--port"), (["--"], ()), (["-"], ())],
    ids=["args-one-string", "ignore-one-string", "double-dash", "lone-dash"],
)
def test_normalise_rejects(args: list[str] | str, ignore: tuple[str, ...] | str) -> None:
    with pytest.raises(CacheKeyError):
        normalise_launch_args(args, ignore)


def test_error_is_ours() -> None:
    assert issubclass(CacheKeyError, ExtenderError)


def test_builtin_ignores_are_normalised_flag_names() -> None:
    for name in BUILTIN_IGNORED_FLAGS:
        assert name.startswith("--")
        assert "_" not in name


# --- key material, format and a pinned value ----------------------------------------------------


def test_key_material_is_what_is_hashed() -> None:
    document = key_material(inputs(), gpu_product="NVIDIA-H200", tensor_parallel=2, pipeline_parallel=1)
    assert document["keyVersion"] == KEY_VERSION
    assert document["launchArgs"] == [
        ["--compilation-config", '{"cudagraph_capture_sizes":[1,2,4],"level":3}'],
        ["--enable-prefix-caching", ""],
        ["--max-model-len", "8192"],
    ]
    assert document["gpuProduct"] == "NVIDIA-H200"
    assert "ignoreArgs" not in document
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = f"ck{KEY_VERSION}-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
    assert expected == BASE_KEY


def test_key_format() -> None:
    assert re.fullmatch(r"ck1-[0-9a-f]{32}", BASE_KEY)


PINNED_INPUTS: dict[str, object] = {
    "modelId": "Qwen/Qwen3-30B-A3B",
    "revision": "ae659febe817e4b3ebd7355f47792725801204c9",
    "imageDigest": "sha256:" + "0123456789abcdef" * 4,
    "quantization": "fp8",
    "engineVersion": "0.10.1",
    "torchVersion": "2.7.1",
    "tritonVersion": "3.3.1",
    "cudaVersion": "12.8",
    "driverVersion": "570.133.20",
    "launchArgs": ["--max-model-len=8192", "--enable-prefix-caching", "--port", "8000",
                   "--compilation-config", '{"level": 3}'],
    "graphEnv": {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"},
}


def test_pinned_key() -> None:
    # DO NOT update this value to make the test pass. Every compile cache on every node in every
    # cluster is stored under keys computed this way; a different value here means all of them
    # become unreachable at once. Change the key format only on purpose, together with a bump of
    # KEY_VERSION (and so of the "ckN-" prefix).
    pinned = CompileKeyInputs.model_validate(PINNED_INPUTS)
    got = compile_cache_key(pinned, gpu_product="NVIDIA-H200", tensor_parallel=2, pipeline_parallel=1)
    assert got == "ck1-d8f304930456c1378fe6d1c36f9b3695"


# --- property: flag-group order and ignored flags never matter ----------------------------------

GRAPH_GROUPS: list[list[str]] = [
    ["--max-model-len", "8192"],
    ["--enable-prefix-caching"],
    ["--no-enable-chunked-prefill"],
    ["--kv-cache-dtype", "fp8"],
    ["--compilation-config", COMPILATION_CONFIG],
    ["--cuda-graph-sizes", "1", "2", "4"],
    ["--seed", "-1"],
    ["-tp", "2"],
    ["--gpu-memory-utilization=0.9"],
]
IGNORED_GROUPS: list[list[str]] = [
    ["--port", "8000"],
    ["--host", "0.0.0.0"],
    ["--served-model-name", "qwen3"],
    ["--api-key", "s3cret"],
    ["--disable-log-stats"],
    ["--uvicorn-log-level=warning"],
    ["--ssl-keyfile", "/tls/key.pem"],
    ["--metrics-port", "9000"],  # ignored through ignoreArgs below
]


def _flatten(groups: list[list[str]]) -> list[str]:
    return [token for group in groups for token in group]


@given(
    chosen=st.lists(st.sampled_from(range(len(GRAPH_GROUPS))), unique=True),
    data=st.data(),
)
def test_group_order_and_ignored_flags_never_change_key(chosen: list[int], data: st.DataObject) -> None:
    groups = [GRAPH_GROUPS[i] for i in sorted(chosen)]
    reference = key({"launchArgs": ["serve", MODEL, *_flatten(groups)], "ignoreArgs": ["--metrics-port"]})

    shuffled = list(data.draw(st.permutations(groups), label="order"))
    for extra in data.draw(st.lists(st.sampled_from(IGNORED_GROUPS), max_size=6), label="ignored"):
        shuffled.insert(data.draw(st.integers(0, len(shuffled)), label="position"), extra)
    candidate = key({"launchArgs": ["serve", MODEL, *_flatten(shuffled)], "ignoreArgs": ["--metrics-port"]})

    assert candidate == reference
