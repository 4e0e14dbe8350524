"""Node and Pod objects -> inventory facts (pure; table-driven, one named row per case)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from extender.core.errors import InvalidValueError, KubeError
from extender.core.policy import Policy
from extender.core.reports import Replicas
from extender.files import load_policy
from extender.kube.objects import NodeFacts, PodFacts, kube_report, node_facts, parse_count, pod_facts

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
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


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
