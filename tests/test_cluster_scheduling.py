"""Placement through the stock kube-scheduler calling ``extender serve`` over the extender v1 protocol.

The stack (tests/cluster_stack.py) has gpu-a and gpu-b (g5.48xlarge, image on both, agents) and
gpu-c (g5.12xlarge, no image, no agent). Here ``big-llm``'s weights are written into gpu-b's cache
root the way a loader writes them, so ``/explain`` ranks gpu-b first (image and weights: 132.6 s
against gpu-a's 372.5 s, tests/test_e2e_agent_scoring.py). Then real pods are created:

* with the chart's configuration (``nodeCacheCapable: true``, names only) and with full Node
  objects (``nodeCacheCapable: false``, a second scheduler process), each lands where ``/explain``
  ranks best, and the extender counted the calls;
* with the extender unreachable (a third scheduler whose urlPrefix nobody listens on;
  ``ignorable: true``) pods still schedule;
* with a hard rule (``slo-llm``: startup within 5 min, which the cold gpu-a misses) the filter's
  reason reaches the pod's FailedScheduling event, word for word.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster_stack import Stack, namespace, pod, wait, write_weights
from tests.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

NAMESPACE = "placement"


@pytest.fixture(scope="module")
def warm_gpu_b(cluster_stack: Stack) -> Iterator[Stack]:
    """big-llm's weights on gpu-b, seen by the extender (its score above gpu-a's)."""
    cluster_stack.wait_for_empty_nodes()
    cluster_stack.cluster.apply([namespace(NAMESPACE)])
    write_weights(cluster_stack.roots["gpu-b"], "big-llm", "s3://models/big/")
    probe = pod("probe", NAMESPACE, "big-llm")
    wait(lambda: cluster_stack.best_nodes(probe, ["gpu-a", "gpu-b", "gpu-c"]) == {"gpu-b"},
         "the extender ranking gpu-b first for big-llm", report=cluster_stack.cluster.report)
    yield cluster_stack
    cluster_stack.cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def bound_node(stack: Stack, name: str) -> str:
    def node_name() -> str:
        return str(stack.cluster.get("pod", name, "-n", NAMESPACE)["spec"].get("nodeName") or "")
    return wait(node_name, f"pod {name} to be bound", report=stack.cluster.report)


@pytest.mark.parametrize(("scheduler", "node_cache_capable"), [
    pytest.param("default-scheduler", True, id="names-only"),
    pytest.param("extender-full-nodes", False, id="full-node-objects"),
])
def test_pods_land_where_explain_ranks_best(warm_gpu_b: Stack, scheduler: str, node_cache_capable: bool) -> None:
    stack = warm_gpu_b
    stack.scheduler(scheduler, node_cache_capable=node_cache_capable)
    name = f"big-llm-{scheduler}"
    manifest = pod(name, NAMESPACE, "big-llm", scheduler=scheduler)
    best = stack.best_nodes(manifest, ["gpu-a", "gpu-b", "gpu-c"])
    before = stack.extender_calls()
    stack.cluster.apply([manifest])
    landed = bound_node(stack, name)
    after = stack.extender_calls()
    assert best == {"gpu-b"} and landed == "gpu-b"
    for verb in ("filter", "prioritize"):
        assert after.get((verb, "scored"), 0) > before.get((verb, "scored"), 0), (verb, before, after)


def test_pods_still_schedule_when_the_extender_is_unreachable(warm_gpu_b: Stack) -> None:
    stack = warm_gpu_b
    scheduler = stack.scheduler("extender-down", url=f"http://127.0.0.1:{free_port()}")
    stack.cluster.apply([pod("big-llm-extender-down", NAMESPACE, "big-llm", scheduler=scheduler)])
    assert bound_node(stack, "big-llm-extender-down") in {"gpu-a", "gpu-b", "gpu-c"}
    log = stack.cluster.processes[scheduler].log.read_text(errors="replace")
    assert "connection refused" in log.lower(), log[-2000:]  # it did try, and went on without us


def failed_scheduling(stack: Stack, name: str) -> str:
    events: list[dict[str, Any]] = stack.cluster.get(
        "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={name},reason=FailedScheduling")["items"]
    return "\n".join(str(e.get("message") or e.get("note") or "") for e in events)


def test_a_hard_rule_puts_the_filter_reason_in_the_pods_event(warm_gpu_b: Stack) -> None:
    stack = warm_gpu_b
    stack.scheduler()
    name = "slo-llm-on-gpu-a"
    manifest = pod(name, NAMESPACE, "slo-llm")
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-a"}
    (row,) = [r for r in stack.explain(manifest)["nodes"] if r["node"] == "gpu-a"]
    # what the extender will say about gpu-a
    assert row["verdict"] == "FailedAndUnresolvableNodes" and row["reason"], row
    stack.cluster.apply([manifest])
    message = wait(lambda: failed_scheduling(stack, name), "a FailedScheduling event", report=stack.cluster.report)
    assert row["reason"] in message, message
    assert stack.cluster.get("pod", name, "-n", NAMESPACE)["spec"].get("nodeName") is None
