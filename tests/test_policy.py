"""Policy files: every example validates, every problem of a broken file is reported with its place."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from extender.core import defaults
from extender.core.document import compose
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
     "profiles[0].image.reference", "is not an image reference"),
    ("registry with a newline", lambda t: t + 'warming: {registry: "s3://a\\nb"}\n',
     "warming.registry", "not a URI"),
    # a template splits a value at any script's space: refused (a non-ASCII letter is a URI's to hold)
    ("source with a no-break space", lambda t: t.replace('source: "s3://m/small/"', 'source: "s3://m/a\\u00a0b/"'),
     "profiles[0].weights.source", "not a URI"),
    ("source with an ideographic space", lambda t: t.replace('source: "s3://m/small/"', 'source: "s3://m/a\\u3000b/"'),
     "profiles[0].weights.source", "not a URI"),
    # OCI's tag grammar is ASCII ([A-Za-z0-9_] words): kubelet refuses a tag with another script's letter
    ("image tag with a non-ASCII letter",
     lambda t: t.replace('reference: "vllm/vllm-openai:v0.11.0"',
                         'reference: "vllm/vllm-openai:v0.11.0-\u00e9t\u00e9"'),
     "profiles[0].image.reference", "is not an image reference"),
]


@pytest.mark.parametrize(("edit", "path", "words"), [c[1:] for c in HOSTILE_FIELDS], ids=[c[0] for c in HOSTILE_FIELDS])
def test_values_that_reach_templates_are_validated(edit: object, path: str, words: str) -> None:
    text = edit(MINIMAL)  # type: ignore[operator]
    assert text != MINIMAL
    problems = problems_of(text)
    assert [p.path for p in problems] == [path]
    assert words in problems[0].message


@pytest.mark.parametrize("source", [
    pytest.param("s3://m/mod\u00e8le/", id="a-non-ascii-letter-in-an-object-key"),
    pytest.param("gs://m/\u30e2\u30c7\u30eb/", id="another-script-in-an-object-key"),
])
def test_a_uri_may_hold_any_scripts_letters(source: str) -> None:
    """S3 and GCS object keys are any UTF-8: a reference refuses spaces of every script, not letters."""
    policy = parse_policy(MINIMAL.replace('source: "s3://m/small/"', f'source: "{source}"'))
    assert policy.profiles[0].weights.source == source


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


# ---- values YAML or the schema used to take wrongly (review of the policy validation) ----------------

DIGITS = "9" * 5000


#: A minimal weights template, appended to MINIMAL (its lines 13 to 17).
STEP = "warming:\n  templates:\n    weights:\n      image: x\n      command: [x]\n"


class Refused(NamedTuple):
    id: str
    old: str  # replaced in MINIMAL by new ("" appends new)
    new: str
    line: int
    path: str
    words: str


REFUSED = [
    # YAML values that could not be built: a located problem, never a traceback
    Refused("an unknown tag", "", "metadata: {name: !custom x}\n", 13, "metadata.name",
            "unsupported YAML tag '!custom'"),
    Refused("a python tag", "", "metadata: {name: !!python/object:os.system x}\n", 13, "metadata.name",
            "unsupported YAML tag '!!python/object:os.system'"),
    Refused("a tag on a mapping", "", "metadata: !custom {name: x}\n", 13, "metadata", "unsupported YAML tag"),
    # printed as the title of every report: a line feed or an escape in it forged lines on stdout
    Refused("a control character in the name", "", 'metadata: {name: "a\\nb\\u001b[31m"}\n', 13, "metadata.name",
            "match pattern"),
    Refused("an integer of 5000 digits", "", f"    priority: {DIGITS}\n", 13, "profiles[0].priority",
            "thousands of digits"),
    Refused("a malformed !!int", "", "    priority: !!int twelve\n", 13, "profiles[0].priority",
            "cannot read 'twelve' as int"),
    # NaN, infinity and sizes past any sane range
    Refused("a NaN duration", "", "    compile: {cold: .nan, warm: 4s}\n", 13, "profiles[0].compile.cold",
            "finite number of seconds, got nan"),
    Refused("an infinite warm compile", "", "    compile: {cold: 53s, warm: .inf}\n", 13,
            "profiles[0].compile.warm", "finite number of seconds, got inf"),
    Refused("a 5000-digit duration", "", f'    engineInit: "{DIGITS}d"\n', 13, "profiles[0].engineInit",
            "is larger than 1e11 seconds"),
    Refused("an infinite tick", "", "scaling: {tick: .inf}\n", 13, "scaling.tick", "finite number of seconds"),
    Refused("an infinite Job TTL", "", "warming: {ttlAfterFinished: .inf}\n", 13, "warming.ttlAfterFinished",
            "finite number of seconds"),
    Refused("a duration over a year", "", "warming: {activeDeadline: 400d}\n", 13, "warming.activeDeadline",
            "longer than 365d"),
    Refused("a size of 5000 digits", "bytes: 16GB", f'bytes: "{DIGITS}PB"', 12, "profiles[0].weights.bytes",
            "larger than 1024PiB"),
    Refused("a bandwidth past 1PB/s", "capacity: 3800GB}", "capacity: 3800GB, readBandwidth: 9000PB/s}", 7,
            "nodeClasses[0].nvme.readBandwidth", "larger than 1PB/s"),
    # every download at such a rate took forever: the estimate was infinite, the horizon unbuildable
    Refused("a bandwidth of almost nothing", "capacity: 3800GB}", "capacity: 3800GB, readBandwidth: 1e-300B/s}", 7,
            "nodeClasses[0].nvme.readBandwidth", "below 0.001B/s"),
    Refused("an infinite capacity", "", "    capacity: {perReplica: .inf}\n", 13, "profiles[0].capacity.perReplica",
            "expected a finite number, got inf"),
    Refused("a NaN smoothing constant", "", "scaling: {alpha: .nan}\n", 13, "scaling.alpha",
            "expected a finite number, got nan"),
    Refused("a count past 10^15", "", f"    parallelism: {{tensor: 1{'0' * 20}}}\n", 13,
            "profiles[0].parallelism.tensor", "out of range"),
    # YAML 1.1 booleans where a number is expected
    Refused("a GPU count of yes", "count: 4}", "count: yes}", 6, "nodeClasses[0].gpu.count",
            "expected a number, got a boolean (true"),
    Refused("a tensor degree of yes", "", "    parallelism: {tensor: yes}\n", 13, "profiles[0].parallelism.tensor",
            "expected a number, got a boolean"),
    Refused("a capacity of on", "", "    capacity: {perReplica: on}\n", 13, "profiles[0].capacity.perReplica",
            "expected a number, got a boolean"),
    Refused("a calibration window of on", "", "calibration: {window: on}\n", 13, "calibration.window",
            "expected a number, got a boolean"),
    # messages that now say what is wrong, where
    Refused("two documents", "", "---\nkind: Policy\n", 13, "",
            "expected a single document in the stream, but found another document"),
    Refused("a boolean key", "", "true: 1\n", 13, "", "the key true is a boolean to YAML, not text: quote it"),
    # Python's `$` matches before a final line feed: a version naming a directory on every node took one
    Refused("a version ending in a line feed", "version: v1,", 'version: "v1\\n",', 12,
            "profiles[0].weights.version", "is not a valid version"),
    Refused("a cpu ending in a line feed", "", 'warming: {resources: {requests: {cpu: "2\\n"}}}\n', 13,
            "warming.resources.requests.cpu", "not a Kubernetes quantity"),
    Refused("a date where text is expected", "version: v1,", "version: 2024-01-01,", 12,
            "profiles[0].weights.version", "got a date (2024-01-01): quote it"),
    Refused("a boolean label value", "extender.io/workload: small}", "extender.io/workload: true}", 10,
            "profiles[0].match.labels['extender.io/workload']", "got a boolean (true): quote it"),
    # merge keys: an explicit key written twice is still a typo
    Refused("a key written twice beside a merge", "", "scoring: {<<: {packingPoints: 1}, nvmePressurePenalty: 1, "
            "nvmePressurePenalty: 2}\n", 13, "scoring.nvmePressurePenalty", "duplicate key"),
    Refused("a merge of a scalar", "", "scoring: {<<: 3}\n", 13, "scoring", "a merge key (<<) takes a mapping"),
    # warm Job resources, read as Kubernetes reads them
    Refused("a cpu of lots", "", "warming: {resources: {requests: {cpu: lots}}}\n", 13,
            "warming.resources.requests.cpu", "not a Kubernetes quantity: 'lots'"),
    Refused("memory in GB", "", "warming: {resources: {requests: {memory: 4GB}}}\n", 13,
            "warming.resources.requests.memory", "4Gi or 4G"),
    Refused("a negative limit", "", "warming: {resources: {limits: {memory: -1}}}\n", 13,
            "warming.resources.limits.memory", "cannot be negative"),
    Refused("a boolean quantity", "", "warming: {resources: {limits: {cpu: yes}}}\n", 13,
            "warming.resources.limits.cpu", "got a boolean"),
    Refused("requests above limits", "", "warming: {resources: {requests: {memory: 8Gi}, limits: {memory: 1Gi}}}\n",
            13, "warming.resources", "requests.memory (8Gi) is larger than limits.memory (1Gi)"),
    # every offending resource in one message, not the first only (policy check lists every problem)
    Refused("requests above limits for two resources", "", "warming: {resources: {requests: {cpu: '4', memory: 8Gi}, "
            "limits: {cpu: '2', memory: 4Gi}}}\n", 13, "warming.resources",
            "requests.cpu (4) is larger than limits.cpu (2); Kubernetes refuses such a Job; requests.memory (8Gi) "
            "is larger than limits.memory (4Gi)"),
    Refused("two extended resources without equal limits", "", "warming: {resources: {requests: {nvidia.com/gpu: 1, "
            "example.com/fpga: 2}, limits: {example.com/fpga: 3}}}\n", 13, "warming.resources",
            "requests.example.com/fpga (2) differs from limits.example.com/fpga (3): Kubernetes does not overcommit "
            "extended resources and hugepages, they must be equal; requests.nvidia.com/gpu needs limits.nvidia.com/"),
    Refused("two resource names without their domain", "", "warming: {resources: {limits: {gpu: 1, fpga: 1}}}\n", 13,
            "warming.resources.limits", "'gpu' is not a container resource: cpu, memory, ephemeral-storage, "
            "hugepages-<size>, or an extended resource with its domain (nvidia.com/gpu); 'fpga' is not a container"),
    # settings that are valid alone and contradict each other: the policy would silently do nothing
    Refused("a node class shadowed by an earlier one", "profiles:\n", "  - name: gpu-a-big\n"
            "    matchLabels: {node.kubernetes.io/instance-type: a, size: big}\n"
            "    gpu: {product: NVIDIA-A10G, count: 4}\n    nvme: {capacity: 3800GB}\nprofiles:\n", 9,
            "nodeClasses[1].matchLabels", "node class 'gpu-a-big' can never match a node: 'gpu-a' comes first"),
    Refused("a profile shadowed by an earlier one", "", "  - name: small-canary\n"
            "    match: {labels: {extender.io/workload: small, track: canary}}\n"
            '    image: {reference: "vllm/vllm-openai:v0.11.0"}\n'
            '    weights: {source: "s3://m/small/", version: v1, bytes: 16GB}\n', 14, "profiles[1].match",
            "profile 'small-canary' can never match a pod: 'small' comes first"),
    Refused("more observations needed than kept", "", "calibration: {minObservations: 500, window: 10}\n", 13,
            "calibration", "minObservations (500) is more than the window keeps (10)"),
    Refused("a node class named like the unknown class", "name: gpu-a\n", "name: unknown\n", 4,
            "nodeClasses[0].name", "'unknown' is reserved"),
    Refused("an NVMe rule for weights that are never cached", "bytes: 16GB}", "bytes: 16GB, cache: none}\n"
            "    filter: {requireNvmeFit: true}", 13, "profiles[0].filter.requireNvmeFit",
            "filter.requireNvmeFit is set but weights.cache is none"),
    Refused("a startup SLO of zero", "", "    startupSlo: 0s\n", 13, "profiles[0].startupSlo", "must be > 0"),
    Refused("a first retry after the longest", "", "warming: {retry: {initial: 1h, max: 1s}}\n", 13, "warming.retry",
            "initial (1h) is longer than max (1s)"),
    Refused("an override of a class the profile may not use", "profiles:\n  - name: small\n", "  - name: gpu-b\n"
            "    matchLabels: {node.kubernetes.io/instance-type: b}\n"
            "    gpu: {product: NVIDIA-A10G, count: 4}\n    nvme: {capacity: 3800GB}\nprofiles:\n"
            "  - name: small\n    nodeClasses: [gpu-a]\n    overrides: {gpu-b: {engineInit: 10s}}\n", 15,
            "profiles[0].overrides.gpu-b", "node class 'gpu-b' is not one this profile may run on"),
    Refused("an override whose warm compile is slower than cold", "", "    overrides: {gpu-a: {compileCold: 3s}}\n",
            13, "profiles[0].overrides.gpu-a", "compile warm (4s, from cache) is slower than compile cold (3s"),
    Refused("an override of both, crossed", "", "    overrides: {gpu-a: {compileCold: 1m, compileWarm: 2m}}\n",
            13, "profiles[0].overrides.gpu-a", "compile warm (2m, from cache) is slower than compile cold (1m"),
    Refused("a compile key of another digest than the pinned image", '"vllm/vllm-openai:v0.11.0"',
            f'"vllm/vllm-openai@sha256:{"a" * 64}"}}\n    compile: {{key: {{modelId: m, revision: r, imageDigest: '
            f'"sha256:{"b" * 64}", engineVersion: "1", torchVersion: "2", cudaVersion: "12", tritonVersion: "3"}}', 12,
            "profiles[0].compile.key.imageDigest", "is not the digest image.reference pins"),
    # labels a pod or node cannot carry: the scaler's label selector is built from them, and a
    # value with a comma reads there as two requirements; such a profile would never match a pod
    Refused("a pod label value with a comma", "{extender.io/workload: small}", "{extender.io/workload: 'small,x'}",
            10, "profiles[0].match.labels['extender.io/workload']", "'small,x' is not a valid label value"),
    Refused("a pod label value with a space", "{extender.io/workload: small}", "{extender.io/workload: 'sm all'}",
            10, "profiles[0].match.labels['extender.io/workload']", "'sm all' is not a valid label value"),
    Refused("a pod label key with a selector operator", "{extender.io/workload: small}", "{'app!': small}",
            10, "profiles[0].match.labels['app!']", "(the key) 'app!' is not a qualified name"),
    Refused("a pod annotation key that is no qualified name", "{labels: {extender.io/workload: small}}",
            "{annotations: {'a b': x}}", 10, "profiles[0].match.annotations['a b']",
            "(the key) 'a b' is not a qualified name"),
    Refused("a node class label value of 64 characters", "{node.kubernetes.io/instance-type: a}",
            f"{{node.kubernetes.io/instance-type: {'a' * 64}}}", 5,
            "nodeClasses[0].matchLabels['node.kubernetes.io/instance-type']", "is not a valid label value"),
    Refused("a node class label key with an empty prefix", "{node.kubernetes.io/instance-type: a}",
            "{/instance-type: a}", 5, "nodeClasses[0].matchLabels['/instance-type']",
            "(the key) '/instance-type': the prefix before '/' must be a DNS subdomain"),
    # a key that is wrong is quoted in the path as the key it is, and the message says it is the key
    # (the path was labels.bad key!.[key]: pydantic's marker, and a key with a space written bare)
    Refused("a pod label key with a space and a '!'", "{extender.io/workload: small}", "{'bad key!': x}",
            10, "profiles[0].match.labels['bad key!']", "(the key) 'bad key!' is not a qualified name"),
    Refused("a pod label key that YAML reads as a boolean", "{extender.io/workload: small}", "{true: x}",
            10, "profiles[0].match.labels[true]", "(the key) must be text, got a boolean (true)"),
    Refused("an override keyed by no plain name", "", "    overrides: {'gpu a': {engineInit: 10s}}\n", 13,
            "profiles[0].overrides['gpu a']", "'gpu a'"),
    # the engine log calibration reads: a container name the API server refuses, a read too small to
    # hold the startup lines, one past what the sync holds in memory
    Refused("an engine log container that is no DNS label", "", "    engineLog: {container: Bad_C}\n", 13,
            "profiles[0].engineLog.container", "'Bad_C' is not a valid Kubernetes name (DNS-1123 label)"),
    Refused("an engine log without its container", "", "    engineLog: {limitBytes: 1MiB}\n", 13,
            "profiles[0].engineLog.container", "required field is missing"),
    Refused("an engine log read of 1 KiB", "", "    engineLog: {container: vllm, limitBytes: 1KiB}\n", 13,
            "profiles[0].engineLog.limitBytes", "must be >= 4096, got 1024"),
    Refused("an engine log read of 1 GiB", "", "    engineLog: {container: vllm, limitBytes: 1GiB}\n", 13,
            "profiles[0].engineLog.limitBytes", "must be <= 67108864, got 1073741824"),
    # warm Job fields Kubernetes would refuse at every tick: refused when the policy loads
    Refused("a namespace that is no DNS label", "", "warming: {namespace: Extender_Warm}\n", 13, "warming.namespace",
            "'Extender_Warm' is not a valid Kubernetes name (DNS-1123 label)"),
    Refused("an Exists toleration with a value", "",
            "warming: {tolerations: [{key: a, operator: Exists, value: x, effect: NoSchedule}]}\n", 13,
            "warming.tolerations[0]", "operator Exists takes no value"),
    Refused("a toleration with a value and no key", "", "warming: {tolerations: [{key: '', value: x}]}\n", 13,
            "warming.tolerations[0]", "an empty key matches every taint and needs operator Exists"),
    Refused("a toleration key that is no qualified name", "", "warming: {tolerations: [{key: 'a b', "
            "operator: Exists}]}\n", 13, "warming.tolerations[0].key", "'a b' is not a qualified name"),
    Refused("an Equal toleration value with a space", "", "warming: {tolerations: [{key: a, value: 'x y'}]}\n", 13,
            "warming.tolerations[0].value", "'x y' is not a valid label value"),
    Refused("a taint key that is no qualified name", "", "warming: {newNodes: {taint: {key: 'bad key!/x'}}}\n", 13,
            "warming.newNodes.taint.key", "the prefix before '/' must be a DNS subdomain"),
    Refused("a taint value with spaces", "", "warming: {newNodes: {taint: {value: 'v a l'}}}\n", 13,
            "warming.newNodes.taint.value", "'v a l' is not a valid label value"),
    Refused("a resource name without its domain", "", "warming: {resources: {limits: {gpu: 1}}}\n", 13,
            "warming.resources.limits", "'gpu' is not a container resource"),
    Refused("a resource name with a space", "", "warming: {resources: {requests: {'my cpu': 1}}}\n", 13,
            "warming.resources.requests", "'my cpu' is not a qualified name"),
    Refused("an extended resource requested without its limit", "",
            "warming: {resources: {requests: {nvidia.com/gpu: 1}}}\n", 13, "warming.resources",
            "requests.nvidia.com/gpu needs limits.nvidia.com/gpu equal to it"),
    Refused("a priority class that is no DNS subdomain", "", "warming: {priorityClassName: Not_Valid}\n", 13,
            "warming.priorityClassName", "'Not_Valid' is not a valid Kubernetes name (DNS-1123 subdomain)"),
    Refused("a service account that is no DNS subdomain", "", "warming: {serviceAccountName: Bad SA}\n", 13,
            "warming.serviceAccountName", "'Bad SA' is not a valid Kubernetes name (DNS-1123 subdomain)"),
    Refused("an env name with '='", "", STEP + "      env: {'1BAD=X': v}\n", 18,
            "warming.templates.weights.env", "'1BAD=X' is not a valid environment variable name"),
    Refused("an empty env name", "", STEP + "      env: {'': v}\n", 18,
            "warming.templates.weights.env", "'' is not a valid environment variable name"),
    Refused("a Secret name that is no DNS subdomain", "", STEP + "      envFromSecrets: [Bad_Secret]\n", 18,
            "warming.templates.weights.envFromSecrets[0]", "'Bad_Secret' is not a valid Kubernetes name"),
    Refused("a helper image with a space", "", "warming: {helperImage: 'ghcr.io/ex/extender :1'}\n", 13,
            "warming.helperImage", "is not an image reference"),
    Refused("a helper image with a capital in its path", "", "warming: {helperImage: ghcr.io/Ex/extender:1}\n",
            13, "warming.helperImage", "path in lowercase letters"),
    Refused("a serving image with a capital in its path", '"vllm/vllm-openai:v0.11.0"', "vllm/VLLM:v1", 11,
            "profiles[0].image.reference", "is not an image reference"),
    Refused("a cache root with '..'", "", "warming: {hostCacheRoot: /mnt/../etc}\n", 13, "warming.hostCacheRoot",
            "no '..' component"),
    Refused("a relative cache root", "", "warming: {hostCacheRoot: mnt/cache}\n", 13, "warming.hostCacheRoot",
            "is not a host path Kubernetes takes: absolute"),
    Refused("a cache root with a NUL", "", 'warming: {hostCacheRoot: "/mnt/a\\0b"}\n', 13, "warming.hostCacheRoot",
            "is not a host path Kubernetes takes"),
    Refused("a cache root over 4096 characters", "", f"warming: {{hostCacheRoot: /{'a' * 4096}}}\n", 13,
            "warming.hostCacheRoot", "at most 4096 characters"),
    Refused("a Job TTL under a second", "", "warming: {ttlAfterFinished: 500ms, confirmWithin: 100ms}\n", 13,
            "warming.ttlAfterFinished", "must be >= 1, got '500ms'"),
    Refused("a Job deadline under a second", "", "warming: {activeDeadline: 500ms}\n", 13,
            "warming.activeDeadline", "must be >= 1, got '500ms'"),
    Refused("a Job TTL no longer than its confirmation", "", "warming: {ttlAfterFinished: 5m}\n", 13, "warming",
            "ttlAfterFinished (5m) is not longer than confirmWithin (5m)"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_values_refused_with_their_place(case: Refused) -> None:
    assert not case.old or case.old in MINIMAL
    text = MINIMAL.replace(case.old, case.new, 1) if case.old else MINIMAL + case.new
    (problem,) = problems_of(text)
    assert (problem.line, problem.path) == (case.line, case.path), problem
    assert case.words in problem.message


MERGED = MINIMAL.replace("  - name: gpu-a\n", "  - &a\n    name: gpu-a\n").replace("profiles:\n", """\
  - <<: *a
    name: gpu-b
    matchLabels: {node.kubernetes.io/instance-type: b}
    nvme: {capacity: 1TB}
profiles:
""")


def test_merged_keys_are_overridden_by_the_keys_written() -> None:
    policy = parse_policy(MERGED)
    a, b = policy.node_classes
    assert (b.name, b.match_labels, b.nvme.capacity) == ("gpu-b", {"node.kubernetes.io/instance-type": "b"}, 10**12)
    assert b.gpu == a.gpu  # merged from the anchor
    assert a.name == "gpu-a"


def test_the_first_of_several_merged_mappings_wins() -> None:
    data, lines = compose("a: &a {k: 1, j: 1}\nb: &b {k: 2, l: 2}\nc: {<<: [*a, *b], j: 3}\n", "m.yaml")
    assert data["c"] == {"k": 1, "j": 3, "l": 2}
    assert (lines[("c", "j")], lines[("c", "k")]) == (3, 1)  # a merged key is found where it is written


class Kept(NamedTuple):
    id: str
    new: str
    requests: dict[str, str]
    limits: dict[str, str]


KEPT = [
    Kept("numbers as Kubernetes takes them", "warming: {resources: {requests: {cpu: 0.5}, limits: {cpu: 2}}}\n",
         {"cpu": "0.5"}, {"cpu": "2"}),
    Kept("Kubernetes spellings", "warming: {resources: {requests: {cpu: 100m, memory: 1e9}, "
         "limits: {cpu: '1', memory: 4G}}}\n", {"cpu": "100m", "memory": "1e9"}, {"cpu": "1", "memory": "4G"}),
    Kept("requests equal to limits", "warming: {resources: {requests: {memory: 4Gi}, limits: {memory: 4096Mi}}}\n",
         {"memory": "4Gi"}, {"memory": "4096Mi"}),
    Kept("an extended resource and hugepages, requests equal to limits",
         "warming: {resources: {requests: {nvidia.com/gpu: 1, hugepages-2Mi: 1Gi}, "
         "limits: {nvidia.com/gpu: '1', hugepages-2Mi: 1Gi}}}\n",
         {"nvidia.com/gpu": "1", "hugepages-2Mi": "1Gi"}, {"nvidia.com/gpu": "1", "hugepages-2Mi": "1Gi"}),
]


@pytest.mark.parametrize("case", KEPT, ids=[c.id for c in KEPT])
def test_job_resources_kept_as_written(case: Kept) -> None:
    resources = parse_policy(MINIMAL + case.new).warming.resources
    assert (resources.requests, resources.limits) == (case.requests, case.limits)
