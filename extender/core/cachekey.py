"""Stable identity for a torch.compile artifact cache (vLLM / SGLang).

Compiled artifacts are generated code specialised to one exact runtime. Reusing them under a
different runtime is at best a silent miss inside the engine and at worst a crash or wrong kernels,
so the node cache must be addressed by a key that changes whenever anything the artifacts depend on
changes, and stays put when only deployment trivia (ports, log levels, argument order) change.

The compile-cache and snapshot report (``docs/sources.md``) built exactly such a key for an S3
compile-cache registry: "the launch arguments, model ID, container version, CUDA runtime, host
driver and CUDA compatibility, and the GPU configuration", hashed so the artifact is not tied to one
machine or provider, with H200 and B200 getting separate artifacts. The same report notes that "a
model name doesn't tell you what code is actually running", which is why versions and the image are
keyed too.

What goes into the key (the canonical document, see :func:`key_material`)
--------------------------------------------------------------------------
``keyVersion``
    Format version of this document (currently 1). Bumping it re-keys every cache on purpose.
``modelId``, ``revision``
    The model and its exact commit: the traced forward graph and weight shapes come from them.
``imageDigest``
    The serving image's content digest (``sha256:<64 hex>``), the report's "container version".
    A digest, not a tag, because tags move.
``dtype``, ``quantization``
    Select different kernels and graph shapes for the same model.
``engine``, ``engineVersion``
    vLLM or SGLang and its release: the engine's own compile passes and cache layout.
``torchVersion``, ``tritonVersion``
    Inductor and Triton generate the artifacts; their output format is version-specific.
``cudaVersion``, ``driverVersion``
    The report's "CUDA runtime" and "host driver and CUDA compatibility". The driver is ``null``
    when the platform team does not pin it.
``launchArgs``
    The serving arguments after :func:`normalise_launch_args`, a list of ``[flag, value]`` pairs.
    Flags such as ``--max-model-len`` or ``--compilation-config`` change what is compiled.
``graphEnv``
    Environment variables that change the graph (for example ``VLLM_ATTENTION_BACKEND``), as an
    object. Only variables the team lists are keyed; everything else is out by construction.
``gpuProduct``, ``tensorParallel``, ``pipelineParallel``
    The report's "GPU configuration": kernels are tuned per architecture and artifacts are written
    per rank, so both the GPU product (from the node class) and the TP/PP degree (from the
    profile) matter. They are arguments rather than policy fields because they come from there.

``ignoreArgs`` is not keyed itself; only its effect (which flags are dropped) is.

Canonical form
--------------
The document is serialised as JSON with sorted object keys, ``(",", ":")`` separators and UTF-8
(non-ASCII characters kept as they are). The key is ``"ck1-"`` followed by the first 32 hex
characters (128 bits) of the SHA-256 of those bytes. The prefix carries the format version so a key
of a future format can never collide with this one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import Final

from pydantic import Field, field_validator

from extender.core.errors import ExtenderError, InvalidValueError
from extender.core.schema import Schema

__all__ = [
    "BUILTIN_IGNORED_FLAGS",
    "ENGINES",
    "KEY_PATTERN",
    "KEY_VERSION",
    "CacheKeyError",
    "CompileKeyInputs",
    "compile_cache_key",
    "key_material",
    "normalise_launch_args",
]

KEY_VERSION: Final = 1
"""Version of the canonical document; part of both the hashed document and the key prefix."""

KEY_PATTERN: Final = re.compile(r"ck[0-9]+-[0-9a-f]{32}")
"""Every compile-cache key (:func:`compile_cache_key_of`), of any key version: ``ck``, the version, ``-``
and 32 lowercase hex digits."""

ENGINES: Final = frozenset({"vllm", "sglang"})

# Flags that are dropped from every key. Each one only affects how the server is reached, named,
# secured or logged, or where the model is read from; none reaches the model code that torch.compile
# traces, so letting them split the cache would only cause needless misses. A name ending in "*"
# matches by prefix. Anything not listed here stays in the key: an unknown flag costs at worst a
# cache miss, while wrongly dropping one could hand a worker stale artifacts.
BUILTIN_IGNORED_FLAGS: Final[tuple[str, ...]] = (
    # Where the HTTP server listens.
    "--host",
    "--port",
    # TLS material for that server (--ssl-keyfile, --ssl-certfile, --ssl-ca-certs, ...).
    "--ssl-*",
    # Request authentication.
    "--api-key",
    # Names and URL prefixes clients use; the model behind them is unchanged.
    "--served-model-name",
    "--root-path",
    # Logging verbosity and request logging.
    "--log-level",
    "--uvicorn-log-level",
    "--disable-log-requests",
    "--enable-log-requests",
    "--disable-log-stats",
    # The model as a path or name (vLLM --model, SGLang --model-path): already keyed by modelId and
    # revision, and the mount path of the weights is a deployment detail.
    "--model",
    "--model-path",
)

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A token starting with "-" that is really a value: a negative number such as "-1" or "-.5". Any script's
# digit on purpose (re.UNICODE says so): the engines' argparse takes ``-١`` for a number too (its own
# matcher is ``\d``, and int() reads the digit), so the key splits launch arguments as they do.
_NEGATIVE_NUMBER = re.compile(r"-\.?\d", re.UNICODE)


class CacheKeyError(ExtenderError, ValueError):
    """Launch arguments or key parameters that cannot be turned into a compile-cache key.

    It is a ``ValueError`` too, so a pydantic validator raising it becomes a ValidationError.
    """


class CompileKeyInputs(Schema):
    """What a platform team declares under ``profiles[].compile.key`` in the policy.

    Everything here goes into the key except ``ignore_args``, which only removes flags from
    ``launch_args``. The GPU product and the TP/PP degree are deliberately absent: they come from
    the node class and the profile's parallelism and are passed to :func:`compile_cache_key`.
    """

    #: Model repository id, e.g. Qwen/Qwen3-30B-A3B.
    model_id: str = Field(min_length=1)
    #: Model revision (a commit hash is stable; a branch is not).
    revision: str = Field(min_length=1)
    #: Content digest of the serving image, sha256:<64 hex>.
    image_digest: str
    #: Weights dtype as given to the engine.
    dtype: str = Field(default="auto", min_length=1)
    #: Quantisation method, if any.
    quantization: str | None = None
    #: Serving engine (vllm or sglang).
    engine: str = "vllm"
    #: Engine version.
    engine_version: str = Field(min_length=1)
    #: PyTorch version.
    torch_version: str = Field(min_length=1)
    #: Triton version.
    triton_version: str = Field(min_length=1)
    #: CUDA version.
    cuda_version: str = Field(min_length=1)
    #: GPU driver version, when the artifacts depend on it.
    driver_version: str | None = None
    #: Engine launch arguments; those that do not change the graph are dropped.
    launch_args: tuple[str, ...] = ()
    #: More flags to drop from launchArgs before hashing.
    ignore_args: tuple[str, ...] = ()
    #: Environment variables that change the compiled graph.
    graph_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("image_digest")
    @classmethod
    def _check_digest(cls, value: str) -> str:
        if not _DIGEST.fullmatch(value):
            raise InvalidValueError(
                "must be the image's content digest, 'sha256:' followed by 64 lowercase hex "
                f"characters (a tag is not stable enough to key a cache), got {value!r}"
            )
        return value

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str) -> str:
        if value not in ENGINES:
            raise InvalidValueError(f"unknown engine {value!r}; expected one of {sorted(ENGINES)}")
        return value

    @field_validator("ignore_args")
    @classmethod
    def _check_ignore_args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            _check_flag_name(name)
        return value

    @field_validator("graph_env")
    @classmethod
    def _check_graph_env(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [name for name in value if not _ENV_NAME.fullmatch(name)]
        if bad:
            raise InvalidValueError(f"not environment variable names: {bad}")
        return value

    @field_validator("launch_args")
    @classmethod
    def _check_launch_args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Parse once here so a malformed command is reported when the policy loads, not later.
        normalise_launch_args(value)
        return value


def _check_flag_name(name: str) -> None:
    """Reject an ignore entry that is not a bare flag name (``--x``, ``-x`` or ``--x-*``)."""
    if not name.startswith("-") or name.strip("-") == "" or "=" in name or any(c.isspace() for c in name):
        raise CacheKeyError(f"ignore entries must be flag names such as '--metrics-port', got {name!r}")


def _normalise_flag(name: str) -> str:
    """Spell a flag name the way the engine reads it.

    Like vLLM's argument parser, underscores become dashes in a long flag's name up to the first
    ".", so ``--max_model_len`` equals ``--max-model-len`` while the dotted sub-key in
    ``--compilation-config.cudagraph_capture_sizes`` is left alone. Short flags (``-tp``, ``-O``)
    are kept as written; aliases (``-tp`` for ``--tensor-parallel-size``) are not resolved, so
    spelling a flag two ways only costs a cache miss, never a wrong hit.
    """
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not _NEGATIVE_NUMBER.match(token)


def _canonical_value(value: str) -> str:
    """Re-dump a JSON object or array value so whitespace and key order do not matter.

    Only values that start with ``{`` or ``[`` and parse as JSON are touched; scalars stay as
    written (``8192`` and ``8192.0`` remain different, which can only cause a miss).
    """
    if value.lstrip()[:1] not in ("{", "["):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        if pattern.endswith("*"):
            if name.startswith(pattern[:-1]):
                return True
        elif name == pattern:
            return True
    return False


def _ignored(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a flag is dropped; ``--no-x`` is the negated form of ``--x`` and follows it."""
    if _matches(name, patterns):
        return True
    return name.startswith("--no-") and _matches("--" + name[5:], patterns)


def normalise_launch_args(args: Sequence[str], ignore: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    """Turn a serving command's arguments into sorted ``(flag, value)`` pairs for the key.

    Parsing rules:

    * ``--flag value`` and ``--flag=value`` give the same pair; a flag followed by another flag or
      by the end of the list is a boolean and gets the value ``""``. ``--no-flag`` is a flag of its
      own (it is not folded into ``--flag``).
    * A token starting with ``-`` is a flag unless it is a negative number (``--seed -1``). Write
      any other value that starts with ``-`` as ``--flag=-value``.
    * Positionals: every token before the first flag is dropped. Those are the program, the
      subcommand and the model (``vllm serve MODEL ...``), all already keyed by ``engine`` and
      ``model_id``. A non-flag token after a flag's value is another value of the same flag
      (list flags such as ``--cuda-graph-sizes 1 2 4``), so put the model first. A bare ``--``
      is rejected because what follows it could not be attributed.
    * Flag names are normalised (see :func:`_normalise_flag`); JSON object and array values are
      canonicalised (sorted keys, no spaces).
    * :data:`BUILTIN_IGNORED_FLAGS` and ``ignore`` (names, or prefixes ending in ``*``) are
      dropped with their values, and so are their ``--no-`` forms.
    * The result is sorted by flag name only, with a stable sort: the order of different flags
      never matters, while a flag given several times keeps all its values in the order written
      (for list-valued flags that order can be significant, so it stays in the key).

    Raises :class:`CacheKeyError` for a bare string instead of a list, a bare ``--``, or a flag
    with an empty name (``--=x``).
    """
    if isinstance(args, str) or isinstance(ignore, str):
        raise CacheKeyError("launch and ignore arguments must be lists of strings, not one string")
    patterns = BUILTIN_IGNORED_FLAGS + tuple(_normalise_flag(name) for name in ignore)

    pairs: list[tuple[str, str]] = []
    current: str | None = None  # flag whose values are being read; None before the first flag
    awaiting = False  # the last pair is a bare `--flag` that may take the next token as its value
    for token in args:
        if token == "--":
            raise CacheKeyError("a bare '--' in launch arguments is not supported; list the model first")
        if _is_flag(token):
            name, eq, value = token.partition("=")
            if name.strip("-") == "":
                raise CacheKeyError(f"launch argument {token!r} has no flag name")
            current = _normalise_flag(name)
            pairs.append((current, value))
            awaiting = not eq
        elif current is None:
            continue  # leading positional: program, subcommand or model
        elif awaiting:
            pairs[-1] = (current, token)
            awaiting = False
        else:
            pairs.append((current, token))  # a further value of a list-valued flag

    kept = [(name, _canonical_value(value)) for name, value in pairs if not _ignored(name, patterns)]
    kept.sort(key=lambda pair: pair[0])
    return tuple(kept)


def key_material(
    inputs: CompileKeyInputs, *, gpu_product: str, tensor_parallel: int, pipeline_parallel: int
) -> dict[str, object]:
    """The canonical document that :func:`compile_cache_key` hashes (see the module docstring).

    It is plain JSON data, so ``extender cachekey`` can print exactly what went into a key.
    """
    if not gpu_product.strip():
        raise CacheKeyError("gpu_product must name the GPU (the node class's GPU product label)")
    for label, degree in (("tensor_parallel", tensor_parallel), ("pipeline_parallel", pipeline_parallel)):
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise CacheKeyError(f"{label} must be a positive integer, got {degree!r}")
    launch = normalise_launch_args(inputs.launch_args, inputs.ignore_args)
    return {
        "keyVersion": KEY_VERSION,
        "modelId": inputs.model_id,
        "revision": inputs.revision,
        "imageDigest": inputs.image_digest,
        "dtype": inputs.dtype,
        "quantization": inputs.quantization,
        "engine": inputs.engine,
        "engineVersion": inputs.engine_version,
        "torchVersion": inputs.torch_version,
        "tritonVersion": inputs.triton_version,
        "cudaVersion": inputs.cuda_version,
        "driverVersion": inputs.driver_version,
        "launchArgs": [[name, value] for name, value in launch],
        "graphEnv": dict(sorted(inputs.graph_env.items())),
        "gpuProduct": gpu_product,
        "tensorParallel": tensor_parallel,
        "pipelineParallel": pipeline_parallel,
    }


def compile_cache_key(
    inputs: CompileKeyInputs, *, gpu_product: str, tensor_parallel: int, pipeline_parallel: int
) -> str:
    """The compile-cache key, ``"ck1-"`` plus 32 hex characters of SHA-256 over the canonical JSON."""
    document = key_material(
        inputs,
        gpu_product=gpu_product,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )
    return compile_cache_key_of(document)


def compile_cache_key_of(document: dict[str, object]) -> str:
    """The key of a :func:`key_material` document."""
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return f"ck{KEY_VERSION}-{hashlib.sha256(encoded).hexdigest()[:32]}"
