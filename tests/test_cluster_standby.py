"""Standby placeholders on the real control plane: deploy/examples/standby.yaml and the chart's
render of the same (values ``standby``), the stock scheduler (calling the extender) and the sync.

The placeholders of ``chat`` (4 GPUs each, priority -10) fill every GPU of the stack's three KWOK
nodes (8 + 8 + 4). The sync must count their GPUs as free, since a replica preempts them (the
extender, the scaler's next replica and the warmer read that number). Then a replica of ``chat``
arrives: the stock scheduler finds no room, preempts one placeholder (DefaultPreemption; the
extender is called as for any GPU pod) and binds the replica; the placeholder's ReplicaSet makes a
new one, which stays pending, which is what asks a node autoscaler for the next node.

Each source runs in its own namespace (a namespace being deleted takes no new objects). The HPA is
not applied: the test cluster serves no External Metrics API; the test sets the count as it would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import chart
from tests.cluster_stack import NODES, Stack, namespace, pod, wait

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

NAMESPACES = {"example": "standby", "chart": "standby-chart"}
GPUS = 4  # chat's replica (and so its placeholder) asks for 4 GPUs
#: How each source's Deployment selects its placeholders.
SELECTORS = {"example": "app=qwen3-moe-standby", "chart": "app.kubernetes.io/name=chat-standby"}


def example(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((chart.EXAMPLES / "standby.yaml").read_text()) if d and d["kind"] == kind]
    return dict(doc)


def placeholders(replicas: int, namespace: str) -> dict[str, Any]:
    """The example's Deployment, for ``chat`` in ``namespace``, with ``replicas`` placeholders."""
    manifest = example("Deployment")
    manifest["metadata"] = {"name": "chat-standby", "namespace": namespace}
    manifest["spec"]["replicas"] = replicas
    template = manifest["spec"]["template"]
    template["metadata"]["labels"]["extender.io/standby-for"] = "chat"
    (container,) = template["spec"]["containers"]
    container["resources"]["limits"]["nvidia.com/gpu"] = str(GPUS)
    return manifest


def chart_objects(stack: Stack, namespace: str, directory: Path) -> dict[str, dict[str, Any]]:
    """The chart's PriorityClass and Deployment for ``chat`` (4 GPUs), checked against the stack's
    policy, there served in ``namespace`` (the profile's own is the scaling test's)."""
    policy = yaml.safe_load(stack.policy.read_text())
    (profile,) = [p for p in policy["profiles"] if p["name"] == "chat"]
    profile["autoscaling"]["namespace"] = namespace
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    done = chart.helm_template({"helmLabels": "false", "standby.enabled": "true", "standby.workloads[0].name": "chat",
                                "standby.workloads[0].gpus": str(GPUS)},
                               flags=["--set-file", f"policy={path}", "--show-only", "templates/standby.yaml"])
    docs = {doc["kind"]: doc for doc, _ in chart.chunks(done.stdout)}
    assert docs["Deployment"]["metadata"]["namespace"] == namespace
    return docs


def pods(stack: Stack, namespace: str, selector: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = stack.cluster.get("pods", "-n", namespace, "-l", selector)["items"]
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


#: The stack, the PriorityClass applied and the placeholders' Deployment (not applied yet).
Standby = tuple[Stack, dict[str, Any], dict[str, Any]]


@pytest.fixture(params=list(NAMESPACES))
def source(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def standby(cluster_stack: Stack, source: str, tmp_path: Path) -> Iterator[Standby]:
    """The stack with the source's PriorityClass applied; yields it, the PriorityClass and the
    placeholder Deployment (without its count)."""
    stack, cluster, namespace_name = cluster_stack, cluster_stack.cluster, NAMESPACES[source]
    stack.wait_for_empty_nodes()
    stack.scheduler()
    if source == "chart":
        docs = chart_objects(stack, namespace_name, tmp_path)
        priority, manifest = docs["PriorityClass"], docs["Deployment"]
    else:
        priority, manifest = example("PriorityClass"), placeholders(0, namespace_name)
    cluster.apply([namespace(namespace_name), priority])
    try:
        yield stack, priority, manifest
    finally:
        cluster.kubectl("delete", "namespace", namespace_name, "--wait=false", check=False)
        cluster.kubectl("delete", "priorityclass", priority["metadata"]["name"], "--wait=false", check=False)


def test_a_replica_preempts_a_placeholder_whose_gpus_the_inventory_counts_free(
        standby: Standby, source: str) -> None:
    stack, _, manifest = standby
    cluster, namespace_name, selector = stack.cluster, NAMESPACES[source], SELECTORS[source]
    gpus = {name: int(cluster.get("node", name)["status"]["allocatable"]["nvidia.com/gpu"]) for name in NODES}
    total = sum(gpus.values())
    manifest["spec"]["replicas"] = total // GPUS  # what the HPA would set
    cluster.apply([manifest])

    def all_bound() -> list[dict[str, Any]] | None:
        found = pods(stack, namespace_name, selector)
        return found if len(found) == total // GPUS and all(p["spec"].get("nodeName") for p in found) else None

    wait(all_bound, f"{total // GPUS} placeholders bound, every GPU held", report=cluster.report)
    # the sync sees through them: every GPU is free for the extender, the scaler and the warmer
    wait(lambda: all((r := stack.store.get(n)) is not None and r.gpus_free == gpus[n] for n in NODES),
         "the inventory counting the placeholders' GPUs as free",
         report=lambda: f"{ {n: stack.store.get(n) for n in NODES} }\n{cluster.report()}")

    cluster.apply([pod("chat-1", namespace_name, "chat", gpus=GPUS)])

    def replica_bound() -> str | None:
        (replica,) = pods(stack, namespace_name, "app=chat")
        return replica["spec"].get("nodeName") or None

    node = wait(replica_bound, "the replica bound after preempting a placeholder", report=cluster.report)
    assert node in NODES

    def one_pending() -> list[dict[str, Any]] | None:
        found = pods(stack, namespace_name, selector)
        unbound = [p for p in found if not p["spec"].get("nodeName")]
        return found if len(found) == total // GPUS and len(unbound) == 1 else None

    # the ReplicaSet replaced the preempted placeholder, and the new one waits for a node
    wait(one_pending, "one placeholder pending in place of the preempted one", report=cluster.report)
    (replica,) = pods(stack, namespace_name, "app=chat")
    assert replica["spec"].get("priority", 0) == 0
