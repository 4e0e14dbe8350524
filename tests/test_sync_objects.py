"""Node and Pod objects -> inventory facts (pure; table-driven, one named row per case)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from extender.core.errors import InvalidValueError, KubeError
from extender.core.policy import Policy
from extender.core.reports import KUBE_RECORD_BYTES, Replicas, stored_size
from extender.files import load_policy
from extender.kube.objects import (
    NodeFacts,
    PodFacts,
    fitted_kube_report,
    kube_report,
    node_facts,
    parse_count,
    pod_facts,
)

POLICY_FILE = Path(__file__).resolve().parent.parent / "policies" / "g5-pcie-fleet.yaml"


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(POLICY_FILE)


@dataclass(frozen=True)
class CountCase:
    id: str
    quantity: str | int | float | None
    expected: int


COUNTS = [
    CountCase("plain", "8", 8),
    CountCase("a JSON number", 8, 8),
    CountCase("a JSON fraction rounds up", 0.5, 1),
    CountCase("zero", "0", 0),
    CountCase("absent", None, 0),
    CountCase("decimal suffix", "1k", 1000),
    CountCase("binary suffix", "2Ki", 2048),
    CountCase("millis round up", "500m", 1),  # 0.5 -> 1
    CountCase("fraction rounds up", "1.5", 2),
    CountCase("exponent", "1e3", 1000),
    CountCase("capital exponent", "2E2", 200),
    CountCase("leading dot", ".5", 1),
    CountCase("pebibyte", "1Pi", 2**50),
    CountCase("exa", "1E", 10**18),
    CountCase("micro rounds up", "1u", 1),
    CountCase("nano rounds up", "1n", 1),
    CountCase("explicit plus", "+3", 3),
    CountCase("whole millis", "4000m", 4),
]


@pytest.mark.parametrize("case", COUNTS, ids=[c.id for c in COUNTS])
def test_parse_count(case: CountCase) -> None:
    assert parse_count(case.quantity) == case.expected


@pytest.mark.parametrize("text", ["", "eight", "8 GPUs", "-1", "1Xi", "1ki", "NaN", "Infinity", "1.2.3", "--1"])
def test_parse_count_rejects(text: str) -> None:
    with pytest.raises(InvalidValueError, match="not a resource quantity"):
        parse_count(text)


def node(name: str = "n1", labels: dict[str, str] | None = None, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "status": status, "spec": {"taints": []}, "unknownField": {"ignored": True}}


G5_12 = {"node.kubernetes.io/instance-type": "g5.12xlarge"}


@dataclass(frozen=True)
class NodeCase:
    id: str
    raw: dict[str, Any]
    expected: NodeFacts


NODE_CASES = [
    NodeCase("class matched, GPUs from allocatable",
             node(labels=G5_12, allocatable={"nvidia.com/gpu": "4"}, capacity={"nvidia.com/gpu": "4"}),
             NodeFacts("n1", "g5.12xlarge", G5_12, 4, ())),
    NodeCase("no class: left empty for readers to classify",
             node(labels={"node.kubernetes.io/instance-type": "m5.large"}),
             NodeFacts("n1", "", {"node.kubernetes.io/instance-type": "m5.large"}, 0, ())),
    NodeCase("allocatable absent: capacity", node(capacity={"nvidia.com/gpu": "8"}), NodeFacts("n1", "", {}, 8, ())),
    NodeCase("allocatable below capacity (a GPU marked unhealthy)",
             node(allocatable={"nvidia.com/gpu": "7"}, capacity={"nvidia.com/gpu": "8"}),
             NodeFacts("n1", "", {}, 7, ())),
    NodeCase("every name of every image, digests included, first-seen order, no duplicates",
             node(images=[{"names": ["docker.io/vllm/vllm-openai@sha256:aa", "docker.io/vllm/vllm-openai:v0.11.0"],
                           "sizeBytes": 10_000_000_000},
                          {"names": ["registry.k8s.io/pause:3.9", "docker.io/vllm/vllm-openai:v0.11.0"],
                           "sizeBytes": 300_000}]),
             NodeFacts("n1", "", {}, 0, ("docker.io/vllm/vllm-openai@sha256:aa", "docker.io/vllm/vllm-openai:v0.11.0",
                                         "registry.k8s.io/pause:3.9"))),
    NodeCase("an image without names", node(images=[{"sizeBytes": 5}]), NodeFacts("n1", "", {}, 0, ())),
]


@pytest.mark.parametrize("case", NODE_CASES, ids=[c.id for c in NODE_CASES])
def test_node_facts(policy: Policy, case: NodeCase) -> None:
    assert node_facts(case.raw, policy) == case.expected


def test_node_facts_other_gpu_resource(policy: Policy) -> None:
    raw = node(allocatable={"nvidia.com/gpu": "8", "amd.com/gpu": "2"})
    assert node_facts(raw, policy, "amd.com/gpu").gpus == 2


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param({"kind": "Node", "metadata": {}}, id="no name"),
        pytest.param(node(allocatable={"nvidia.com/gpu": "lots"}), id="GPU quantity unreadable"),
        pytest.param({"metadata": {"name": "n"}, "status": {"images": "not a list"}}, id="images not a list"),
    ],
)
def test_unreadable_nodes_are_kube_errors(policy: Policy, raw: dict[str, Any]) -> None:
    with pytest.raises(KubeError):
        node_facts(raw, policy)


def pod(
    name: str = "p",
    *,
    node_name: str = "n1",
    labels: dict[str, str] | None = None,
    phase: str = "Pending",
    ready: bool = False,
    gpus: list[str] | None = None,
    init_gpus: list[str] | None = None,
    deleting: bool = False,
    statuses: list[dict[str, Any]] | None = None,
    init_statuses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    def containers(values: list[str] | None) -> list[dict[str, Any]]:
        return [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": v}}} for i, v in enumerate(values or [])]

    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node_name, "containers": containers(gpus) or [{"name": "c"}],
                 "initContainers": containers(init_gpus)},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": statuses, "initContainerStatuses": init_statuses},
    }


RUNNING = {"running": {"startedAt": "2025-01-01T00:10:00Z"}}
ENDED = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
STARTED_AT = 1735690200.0  # 2025-01-01T00:10:00Z


LLAMA = {"extender.io/workload": "llama3-8b"}


@dataclass(frozen=True)
class PodCase:
    id: str
    raw: dict[str, Any]
    expected: PodFacts | None


POD_CASES = [
    PodCase("pending on a node: starting", pod(labels=LLAMA, gpus=["1"]),
            PodFacts("ml/p", "n1", 1, "llama3-8b", "starting")),
    PodCase("running but not ready: starting", pod(labels=LLAMA, phase="Running", gpus=["1"]),
            PodFacts("ml/p", "n1", 1, "llama3-8b", "starting")),
    PodCase("running and ready: running", pod(labels=LLAMA, phase="Running", ready=True, gpus=["1"]),
            PodFacts("ml/p", "n1", 1, "llama3-8b", "running")),
    PodCase("being deleted: holds GPUs, no longer a replica", pod(labels=LLAMA, phase="Running", ready=True,
                                                                 gpus=["1"], deleting=True),
            PodFacts("ml/p", "n1", 1, "llama3-8b", "terminating")),
    PodCase("no profile: GPUs only", pod(gpus=["2"]), PodFacts("ml/p", "n1", 2, None, "starting")),
    PodCase("GPUs summed over containers", pod(gpus=["1", "2"]), PodFacts("ml/p", "n1", 3, None, "starting")),
    PodCase("a larger init container wins", pod(gpus=["1"], init_gpus=["4", "2"]),  # max(1, max(4, 2)) = 4
            PodFacts("ml/p", "n1", 4, None, "starting")),
    PodCase("a standby placeholder: its GPUs count as free (a replica preempts it)",
            pod(labels={"extender.io/standby-for": "llama3-8b"}, phase="Running", ready=True, gpus=["4"]),
            PodFacts("ml/p", "n1", 0, None, "running")),
    PodCase("unbound: nothing", pod(node_name="", labels=LLAMA), None),
    PodCase("succeeded: nothing", pod(labels=LLAMA, phase="Succeeded"), None),
    PodCase("failed: nothing", pod(labels=LLAMA, phase="Failed"), None),
    # a container that ran before: the pod is starting again, not for the first time (calibration)
    PodCase("a container restarted: restarted",
            pod(labels=LLAMA, phase="Running", statuses=[{"restartCount": 2, "state": RUNNING, "lastState": ENDED}]),
            PodFacts("ml/p", "n1", 0, "llama3-8b", "starting", started_at=STARTED_AT, restarted=True)),
    PodCase("a last terminated state with no count yet: restarted",
            pod(labels=LLAMA, phase="Running", statuses=[{"restartCount": 0, "state": {}, "lastState": ENDED}]),
            PodFacts("ml/p", "n1", 0, "llama3-8b", "starting", restarted=True)),
    PodCase("an init container retried: restarted",
            pod(labels=LLAMA, init_statuses=[{"restartCount": 1, "state": RUNNING}]),
            PodFacts("ml/p", "n1", 0, "llama3-8b", "starting", restarted=True)),
    PodCase("an init container that ran to its end once: not restarted",
            pod(labels=LLAMA, phase="Running", init_statuses=[{"restartCount": 0, "state": ENDED}],
                statuses=[{"restartCount": 0, "state": RUNNING}]),
            PodFacts("ml/p", "n1", 0, "llama3-8b", "starting", started_at=STARTED_AT)),
    PodCase("null counts and states read as absent: not restarted",
            pod(labels=LLAMA, statuses=[{"restartCount": None, "state": None, "lastState": None}]),
            PodFacts("ml/p", "n1", 0, "llama3-8b", "starting")),
]


@pytest.mark.parametrize("case", POD_CASES, ids=[c.id for c in POD_CASES])
def test_pod_facts(policy: Policy, case: PodCase) -> None:
    assert pod_facts(case.raw, policy) == case.expected


def test_kube_report_counts_gpus_of_every_pod_and_replicas_of_profile_pods() -> None:
    facts = NodeFacts("n1", "g5.12xlarge", G5_12, 4, ("a:1",))
    pods = [
        PodFacts("ml/a", "n1", 1, "llama3-8b", "starting"),
        PodFacts("ml/b", "n1", 1, "llama3-8b", "running"),
        PodFacts("ml/c", "n1", 1, "llama3-8b", "terminating"),
        PodFacts("ml/d", "n1", 2, None, "running"),
    ]
    report = kube_report(facts, pods)
    assert report.gpus == 4
    assert report.gpus_free == 0  # 4 - (1 + 1 + 1 + 2) = -1, floored at 0
    assert report.replicas == {"llama3-8b": Replicas(starting=1, running=1)}
    assert report.node_class == "g5.12xlarge" and report.images == ("a:1",)


class NullCase(NamedTuple):
    id: str
    raw: dict[str, Any]
    expected: NodeFacts


#: The API's ``null`` reads as the field's absence: real API servers send ``"names": null`` for an
#: untagged image (containerd), and a node that cannot be read would keep stale facts.
NULL_CASES = [
    NullCase("an untagged image: names null",
             node(labels=G5_12, allocatable={"nvidia.com/gpu": "4"},
                  images=[{"names": None, "sizeBytes": 5}, {"names": ["a:1"], "sizeBytes": 3}]),
             NodeFacts("n1", "g5.12xlarge", G5_12, 4, ("a:1",))),
    NullCase("images null", node(labels=G5_12, images=None), NodeFacts("n1", "g5.12xlarge", G5_12, 0, ())),
    NullCase("sizeBytes null", node(images=[{"names": ["a:1"], "sizeBytes": None}]),
             NodeFacts("n1", "", {}, 0, ("a:1",))),
    NullCase("allocatable null: capacity", node(allocatable=None, capacity={"nvidia.com/gpu": "8"}),
             NodeFacts("n1", "", {}, 8, ())),
    NullCase("labels null", {"metadata": {"name": "n1", "labels": None}, "status": {}}, NodeFacts("n1", "", {}, 0, ())),
    NullCase("status null", {"metadata": {"name": "n1"}, "status": None}, NodeFacts("n1", "", {}, 0, ())),
]


@pytest.mark.parametrize("case", NULL_CASES, ids=[c.id for c in NULL_CASES])
def test_null_fields_of_a_node_read_as_absent(policy: Policy, case: NullCase) -> None:
    assert node_facts(case.raw, policy) == case.expected


def container(gpus: str | None, *, sidecar: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus else None}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


class GpuCase(NamedTuple):
    id: str
    init: list[dict[str, Any]]
    containers: list[dict[str, Any]]
    expected: int


#: Kubernetes' effective request with sidecars (objects.pod_gpus): regular init containers run one at
#: a time beside the sidecars declared before them; sidecars then run beside the app containers.
GPU_CASES = [
    GpuCase("a GPU sidecar runs beside the app container", [container("1", sidecar=True)], [container("2")], 3),
    GpuCase("an init container after a sidecar runs beside it",  # max(1 + 4, 1 + 2)
            [container("1", sidecar=True), container("4")], [container("2")], 5),
    GpuCase("an init container before a sidecar runs alone",  # max(4, 1 + 2)
            [container("4"), container("1", sidecar=True)], [container("2")], 4),
    GpuCase("sidecars add up", [container("1", sidecar=True), container("2", sidecar=True)], [container("1")], 4),
    GpuCase("regular init containers only: the largest", [container("4"), container("2")], [container("1")], 4),
    GpuCase("null resources and restartPolicy read as absent",
            [{"name": "i", "resources": None, "restartPolicy": None}], [container("2")], 2),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_gpus_of_a_pod_with_init_containers_and_sidecars(policy: Policy, case: GpuCase) -> None:
    raw = {"metadata": {"name": "p", "namespace": "ml", "annotations": None},
           "spec": {"nodeName": "n1", "initContainers": case.init, "containers": case.containers},
           "status": {"phase": "Pending", "conditions": None, "containerStatuses": None}}
    facts = pod_facts(raw, policy)
    assert facts is not None and facts.gpus == case.expected


class FitCase(NamedTuple):
    id: str
    facts: NodeFacts
    #: What the report holds: labels kept, image names kept, GPUs.
    labels: int
    images: int
    gpus: int
    #: Words each problem reported must contain, one entry per problem.
    problems: tuple[str, ...]


def many_labels(n: int, width: int = 20) -> dict[str, str]:
    return {f"example.com/l{i:05d}" + "x" * width: "v" for i in range(n)}


#: What a record cannot hold is left out of the sync's report (reports.fit_kube_report), with a reason
#: each: built as it was, one such node made the sync's writer thread die on a ValidationError.
FIT_CASES = [
    FitCase("an ordinary node: nothing left out", NodeFacts("n1", "g5.12xlarge", G5_12, 4, ("a:1",)), 1, 1, 4, ()),
    FitCase("5000 labels: the first 4096 by key", NodeFacts("n1", "", many_labels(5000, width=0), 4, ()), 4096, 0, 4,
            ("5000 labels, more than the 4096 a record holds: reported the first 4096 by key, left out 904 from "
             "'example.com/l04096' on",)),
    FitCase("labels over the sync's share of a record", NodeFacts("n1", "", many_labels(3000, width=200), 4, ()),
            582, 0, 4, ("over the 131072 bytes the sync's part of a record may take: left out the last 2418 of 3000 "
                        "labels",)),
    FitCase("image names over the sync's share: the smallest images (last) left out",
            NodeFacts("n1", "", G5_12, 4, tuple(f"registry.example/i{i:03d}:" + "t" * 990 for i in range(200))),
            1, 128, 4, ("left out the last 72 of 200 image names",)),
    FitCase("a label value a record refuses", NodeFacts("n1", "", {"ok": "v", "bad": "a\nb"}, 4, ()), 1, 0, 4,
            ("label 'bad' cannot be stored",)),
    FitCase("an image name a record refuses", NodeFacts("n1", "", {}, 4, ("a:1", "x" * 2000)), 0, 1, 4,
            ("image name",)),
    FitCase("more GPUs than a record holds", NodeFacts("n1", "", {}, 100_000, ()), 0, 0, 4096, ("100000 GPUs",)),
]


@pytest.mark.parametrize("case", FIT_CASES, ids=[c.id for c in FIT_CASES])
def test_a_report_leaves_out_what_a_record_cannot_hold(case: FitCase) -> None:
    report, problems = fitted_kube_report(case.facts, [PodFacts("ml/a", "n1", 1, "llama3-8b", "running")])
    assert (len(report.labels), len(report.images), report.gpus) == (case.labels, case.images, case.gpus)
    storable = sorted(k for k, v in case.facts.labels.items() if "\n" not in v)
    assert list(report.labels) == storable[: case.labels]  # the first by key
    assert report.images == case.facts.images[: case.images]  # the first in kubelet's order (largest first)
    assert report.gpus_free == min(case.gpus, case.facts.gpus - 1)
    assert stored_size(report) <= KUBE_RECORD_BYTES
    assert len(problems) == len(case.problems)
    for problem, words in zip(problems, case.problems, strict=True):
        assert words in problem
    assert kube_report(case.facts, [PodFacts("ml/a", "n1", 1, "llama3-8b", "running")]) == report
