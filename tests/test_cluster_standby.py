"""Standby placeholders on the real control plane: deploy/examples/standby.yaml, the stock scheduler
(calling the extender) and the sync.

The placeholders of ``chat`` (4 GPUs each, priority -10) fill every GPU of the stack's three KWOK
nodes (8 + 8 + 4). The sync must count their GPUs as free, since a replica preempts them (the
extender, the scaler's next replica and the warmer read that number). Then a replica of ``chat``
arrives: the stock scheduler finds no room, preempts one placeholder (DefaultPreemption; the
extender is called as for any GPU pod) and binds the replica; the placeholder's ReplicaSet makes a
new one, which stays pending, which is what asks a node autoscaler for the next node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests import chart
from tests.cluster_stack import NODES, Stack, namespace, pod, wait

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

NAMESPACE = "standby"
GPUS = 4  # chat's replica (and so its placeholder) asks for 4 GPUs


def example(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((chart.EXAMPLES / "standby.yaml").read_text()) if d and d["kind"] == kind]
    return dict(doc)


def placeholders(replicas: int) -> dict[str, Any]:
    """The example's Deployment, for ``chat`` in this test's namespace, with ``replicas`` placeholders."""
    manifest = example("Deployment")
    manifest["metadata"] = {"name": "chat-standby", "namespace": NAMESPACE}
    manifest["spec"]["replicas"] = replicas
    template = manifest["spec"]["template"]
    template["metadata"]["labels"]["extender.io/standby-for"] = "chat"
    (container,) = template["spec"]["containers"]
    container["resources"]["limits"]["nvidia.com/gpu"] = str(GPUS)
    return manifest


def pods(stack: Stack, selector: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = stack.cluster.get("pods", "-n", NAMESPACE, "-l", selector)["items"]
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
def standby(cluster_stack: Stack) -> Iterator[Stack]:
    stack, cluster = cluster_stack, cluster_stack.cluster
    stack.wait_for_empty_nodes()
    stack.scheduler()
    priority = example("PriorityClass")
    cluster.apply([namespace(NAMESPACE), priority])
    try:
        yield stack
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        cluster.kubectl("delete", "priorityclass", priority["metadata"]["name"], "--wait=false", check=False)


def test_a_replica_preempts_a_placeholder_whose_gpus_the_inventory_counts_free(standby: Stack) -> None:
    stack, cluster = standby, standby.cluster
    gpus = {name: int(cluster.get("node", name)["status"]["allocatable"]["nvidia.com/gpu"]) for name in NODES}
    total = sum(gpus.values())
    cluster.apply([placeholders(total // GPUS)])

    def all_bound() -> list[dict[str, Any]] | None:
        found = pods(stack, "app=qwen3-moe-standby")
        return found if len(found) == total // GPUS and all(p["spec"].get("nodeName") for p in found) else None

    wait(all_bound, f"{total // GPUS} placeholders bound, every GPU held", report=cluster.report)
    # the sync sees through them: every GPU is free for the extender, the scaler and the warmer
    wait(lambda: all((r := stack.store.get(n)) is not None and r.gpus_free == gpus[n] for n in NODES),
         "the inventory counting the placeholders' GPUs as free",
         report=lambda: f"{ {n: stack.store.get(n) for n in NODES} }\n{cluster.report()}")

    cluster.apply([pod("chat-1", NAMESPACE, "chat", gpus=GPUS)])

    def replica_bound() -> str | None:
        (replica,) = pods(stack, "app=chat")
        return replica["spec"].get("nodeName") or None

    node = wait(replica_bound, "the replica bound after preempting a placeholder", report=cluster.report)
    assert node in NODES

    def one_pending() -> list[dict[str, Any]] | None:
        found = pods(stack, "app=qwen3-moe-standby")
        unbound = [p for p in found if not p["spec"].get("nodeName")]
        return found if len(found) == total // GPUS and len(unbound) == 1 else None

    # the ReplicaSet replaced the preempted placeholder, and the new one waits for a node
    wait(one_pending, "one placeholder pending in place of the preempted one", report=cluster.report)
    (replica,) = pods(stack, "app=chat")
    assert replica["spec"].get("priority", 0) == 0
