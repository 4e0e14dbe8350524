"""Policy files: every example validates, every problem of a broken file is reported with its place."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from extender.core import defaults
from extender.core.errors import PolicyError, Problem, UnknownNameError
from extender.core.policy import UNKNOWN_CLASS, Policy, parse_policy
from extender.files import load_policy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "policies").glob("*.yaml"))

MINIMAL = """\
apiVersion: extender.io/v1alpha1
kind: Policy
nodeClasses:
  - name: gpu-a
    matchLabels: {node.kubernetes.io/instance-type: a}
    gpu: {product: NVIDIA-A10G, count: 4}
    nvme: {capacity: 3800GB}
profiles:
  - name: small
    match: {labels: {extender.io/workload: small}}
    image: {reference: "vllm/vllm-openai:v0.11.0"}
    weights: {source: "s3://m/small/", version: v1, bytes: 16GB}
"""


def problems_of(text: str, source: str = "x.yaml") -> list[Problem]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source)
    return info.value.problems


def test_examples_exist() -> None:
    # the issue asks for at least the two seed-000 scenarios and the G5 fleet
    names = {p.name for p in EXAMPLES}
    assert {"eks-p5-qwen3-moe.yaml", "eks-p5-llama4-scout.yaml", "g5-pcie-fleet.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_policy_is_valid(path: Path) -> None:
    policy = load_policy(path)
    assert policy.profiles, "an example without profiles shows nothing"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_normalised_form_round_trips(path: Path) -> None:
    # `policy show` prints model_dump(mode="json"); reading that back must give the same policy
    policy = load_policy(path)
    shown = yaml.safe_dump(policy.model_dump(mode="json", by_alias=True), sort_keys=False)
    assert parse_policy(shown, "shown.yaml") == policy


def test_minimal_policy_fills_defaults_from_the_seeds() -> None:
    policy = parse_policy(MINIMAL)
    cls = policy.node_classes[0]
    assert cls.nvme.read_bandwidth == defaults.NVME_READ_BPS == 7e9
    assert cls.network.nic == defaults.NIC_BPS == 5e9
    assert cls.network.object_store_per_stream == defaults.OBJECT_STORE_STREAM_BPS == 745e6
    profile = policy.profiles[0]
    assert (profile.compile.cold, profile.compile.warm) == (53.0, 4.0)
    assert profile.graph_capture == 17.0
    assert profile.image.size == 10 * 10**9
    # 16 GB / 3.9 GiB shards -> 4 files; min(4, 16 workers) = 4 streams
    assert (profile.weights.shards, profile.weights.streams) == (4, 4)


def test_a_broken_file_reports_every_problem_with_line_and_path() -> None:
    text = textwrap.dedent("""\
        apiVersion: extender.io/v1alpha1
        kind: Policy
        nodeClasses:
          - name: gpu-a
            matchLabels: {node.kubernetes.io/instance-type: a}
            gpu: {product: NVIDIA-A10G, count: 0}
            nvme: {capacity: 64G}
        profiles:
          - name: small
            match: {labels: {extender.io/workload: small}}
            image: {reference: "vllm/vllm-openai:v0.11.0"}
            weights:
              source: s3://m/small/
              version: v1
              bytes: 0
              shardFile: 4
          - name: Bad_Name
            match: {labels: {a: b}}
            image: {reference: x}
            weights: {source: s, version: v, bytes: 1GB}
            compile: {cold: 10s, warm: 20s}
        """)
    got = [(p.line, p.path) for p in problems_of(text)]
    assert got == [
        (6, "nodeClasses[0].gpu.count"),
        (7, "nodeClasses[0].nvme.capacity"),
        (15, "profiles[0].weights.bytes"),
        (16, "profiles[0].weights.shardFile"),
        (17, "profiles[1].name"),
        (21, "profiles[1].compile"),
    ]
    messages = {p.path: p.message for p in problems_of(text)}
    assert messages["nodeClasses[0].gpu.count"] == "must be >= 1, got 0"
    assert "ambiguous size '64G'" in messages["nodeClasses[0].nvme.capacity"]
    assert messages["profiles[0].weights.bytes"] == "must be > 0, got 0"
    assert "did you mean 'shardFiles'?" in messages["profiles[0].weights.shardFile"]
    assert "not a valid name" in messages["profiles[1].name"]
    assert "warm (from cache) is slower than cold" in messages["profiles[1].compile"]


def test_problem_renders_as_file_line_path_message() -> None:
    text = MINIMAL.replace("bytes: 16GB", "bytes: 0")
    (problem,) = problems_of(text, "policies/x.yaml")
    assert str(problem) == "policies/x.yaml:12: profiles[0].weights.bytes: must be > 0, got 0"


CROSS = [
    # (id, edit applied to MINIMAL, expected path, words in the message)
    (
        "unknown-node-class",
        lambda t: t.replace("    image: {ref", "    nodeClasses: [gpu-b]\n    image: {ref"),
        "profiles[0].nodeClasses[0]",
        "no node class 'gpu-b'",
    ),
    (
        "tp-larger-than-every-class",
        lambda t: t + "    parallelism: {tensor: 8}\n",
        "profiles[0].parallelism",
        "needs 8 GPUs",
    ),
    (
        "required-cache-larger-than-every-nvme",
        lambda t: t.replace("bytes: 16GB}", "bytes: 4000GB, cache: required}"),
        "profiles[0].weights.bytes",
        "larger than the usable NVMe",
    ),
    (
        "override-for-unknown-class",
        lambda t: t + "    overrides: {gpu-z: {engineInit: 5s}}\n",
        "profiles[0].overrides.gpu-z",
        "no node class 'gpu-z'",
    ),
    (
        "duplicate-profile",
        lambda t: t + t[t.index("  - name: small") :],
        "profiles[1].name",
        "duplicate profile name",
    ),
    (
        "keep-warm-unknown-profile",
        lambda t: t + "warming: {keepWarm: [nope]}\n",
        "warming.keepWarm[0]",
        "no profile 'nope'",
    ),
]


@pytest.mark.parametrize(("edit", "path", "words"), [c[1:] for c in CROSS], ids=[c[0] for c in CROSS])
def test_cross_field_checks(edit: object, path: str, words: str) -> None:
    text = edit(MINIMAL)  # type: ignore[operator]
    problems = problems_of(text)
    assert [p.path for p in problems] == [path]
    assert words in problems[0].message
    assert problems[0].line is not None


HOSTILE_FIELDS = [
    # (id, edit applied to MINIMAL, path, words): values that reach warm templates and node paths
    ("source with a quote and semicolon",
     lambda t: t.replace('source: "s3://m/small/"', "source: \"s3://m'; rm -rf /\""),
     "profiles[0].weights.source", "not a URI"),
    ("source with command substitution", lambda t: t.replace('source: "s3://m/small/"', 'source: "s3://m/$(id)"'),
     "profiles[0].weights.source", "not a URI"),
    ("source starting with a dash", lambda t: t.replace('source: "s3://m/small/"', "source: --delete"),
     "profiles[0].weights.source", "not a URI"),
    ("version escaping the cache root", lambda t: t.replace("version: v1,", "version: ../../etc,"),
     "profiles[0].weights.version", "not a valid version"),
    ("version with a space", lambda t: t.replace("version: v1,", "version: v1 v2,"),
     "profiles[0].weights.version", "not a valid version"),
    ("image with a backtick", lambda t: t.replace('reference: "vllm/vllm-openai:v0.11.0"', 'reference: "x`id`"'),
     "profiles[0].image.reference", "not a URI or image reference"),
    ("registry with a newline", lambda t: t + 'warming: {registry: "s3://a\\nb"}\n',
     "warming.registry", "not a URI"),
]


@pytest.mark.parametrize(("edit", "path", "words"), [c[1:] for c in HOSTILE_FIELDS], ids=[c[0] for c in HOSTILE_FIELDS])
def test_values_that_reach_templates_are_validated(edit: object, path: str, words: str) -> None:
    text = edit(MINIMAL)  # type: ignore[operator]
    assert text != MINIMAL
    problems = problems_of(text)
    assert [p.path for p in problems] == [path]
    assert words in problems[0].message


def test_required_cache_that_fits_some_class_is_fine() -> None:
    # 3000 GB fits the 3800 GB class: the check is "every class", not "any class"
    parse_policy(MINIMAL.replace("bytes: 16GB}", "bytes: 3000GB, cache: required}"))


DOCUMENT_ERRORS = [
    ("yaml-syntax", "apiVersion: x\nkind:\n\t- tab\n", 3, "YAML syntax"),
    ("no-node-classes", "apiVersion: extender.io/v1alpha1\nkind: Policy\n", 1, "at least one node class"),
    ("duplicate-key", MINIMAL.replace("kind: Policy\n", "kind: Policy\nkind: Policy\n"), 3, "duplicate key"),
    ("not-a-mapping", "- just\n- a list\n", 1, "must be a mapping"),
    ("wrong-api-version", MINIMAL.replace("v1alpha1", "v2"), 1, "extender.io/v1alpha1"),
    ("empty-file", "", None, "must be a mapping"),
]


@pytest.mark.parametrize(
    ("text", "line", "words"), [d[1:] for d in DOCUMENT_ERRORS], ids=[d[0] for d in DOCUMENT_ERRORS]
)
def test_document_level_errors(text: str, line: int | None, words: str) -> None:
    (problem,) = problems_of(text)
    assert problem.line == line
    assert words in problem.message


def test_missing_file_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy("/nonexistent/policy.yaml")


def test_lookups_and_matching() -> None:
    policy = parse_policy(MINIMAL)
    assert policy.classify_node({"node.kubernetes.io/instance-type": "a"}).name == "gpu-a"
    assert policy.classify_node({"node.kubernetes.io/instance-type": "zzz"}) is UNKNOWN_CLASS
    assert policy.profile_for_pod({"extender.io/workload": "small"}, {}) is policy.profiles[0]
    assert policy.profile_for_pod({"app": "other"}, {}) is None
    with pytest.raises(UnknownNameError, match="known: small"):
        policy.profile("big")
    with pytest.raises(UnknownNameError, match="known: gpu-a"):
        policy.node_class("gpu-b")


def test_policy_is_frozen() -> None:
    policy = parse_policy(MINIMAL)
    with pytest.raises(ValueError, match="frozen"):
        policy.metadata = policy.metadata  # type: ignore[misc]
    assert isinstance(policy, Policy)
