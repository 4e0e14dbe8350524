"""The scaler loop shares a fleet too small for every decision: real Redis, lock, inventory and decide().

Two workloads on one node class (``a10g``, 4 GPUs a node, ``maxNodes: 4``; two nodes exist, so
the fleet is 2 x 4 + 2 x 4 = 16 GPUs): ``chat`` (priority 10) on a steep ramp, whose forecast one
cold start ahead asks for more than the fleet holds; ``batch`` (priority 0) at a flat load of 5
requests/s, 5 replicas. Sharing must serve ``batch``'s observed load in full and cut ``chat``'s
forecast to what is left, publish the cut, and say so in ``extender scale explain``. Without
``maxNodes`` (an unbounded pool) or without an inventory, nothing is cut (fail open).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender import cli
from extender.core.inventory import NodeState
from extender.core.policy import parse_policy
from extender.core.scaler import Decision
from extender.scaler.loop import ScaleLoop
from extender.scaler.observation import Observation
from extender.scaler.pods import Pod
from extender.state import InventoryStore, connect
from extender.state.decisions import DecisionStore
from extender.state.history import HistoryStore
from extender.state.lock import LeaderLock
from tests.conftest import RedisServer
from tests.vllm_endpoint import pod

pytestmark = pytest.mark.integration

T0 = 1_735_689_600.0
TICK = 15.0
FLEET_GPUS = 16

POLICY = """\
apiVersion: extender.io/v1alpha1
kind: Policy
metadata: {{name: sharing-test}}
nodeClasses:
  - name: a10g
    matchLabels: {{node.kubernetes.io/instance-type: g5.12xlarge}}
    gpu: {{product: NVIDIA-A10G, count: 4}}
    nvme: {{capacity: 3800GB, readBandwidth: 7GB/s}}
{max_nodes}profiles:
  - name: chat
    match: {{labels: {{extender.io/workload: chat}}}}
    image: {{reference: "vllm/vllm-openai:v0.11.0", size: 10GB}}
    weights: {{source: "s3://models/chat/", version: v1, bytes: 16GB, shardFiles: 4}}
    capacity: {{perReplica: 1, unit: requests/s}}
    priority: 10
    autoscaling: {{namespace: default, minReplicas: 1, maxReplicas: 64, signal: {{source: scrape, engine: vllm}}}}
  - name: batch
    match: {{labels: {{extender.io/workload: batch}}}}
    image: {{reference: "vllm/vllm-openai:v0.11.0", size: 10GB}}
    weights: {{source: "s3://models/batch/", version: v1, bytes: 16GB, shardFiles: 4}}
    capacity: {{perReplica: 1, unit: requests/s}}
    autoscaling: {{namespace: default, minReplicas: 1, maxReplicas: 64, signal: {{source: scrape, engine: vllm}}}}
scaling:
  tick: 15s
  forecaster: holt
  tolerance: 0
"""


def chat_demand(t: float) -> float:
    return 1.0 + 0.015 * (t - T0)  # +0.225 requests/s a tick: 10 requests/s after 40 ticks


def batch_demand(t: float) -> float:
    return 5.0


@dataclass
class Scripted:
    demand: Callable[[float], float]
    name: str = "scripted"

    def observe(self, pods: Sequence[Pod], now: float) -> Observation:
        return Observation(rate=self.demand(now), complete=True, expected=1, answered=1)


@dataclass
class Cluster:
    """The HPA and the kubelet for both workloads: replicas follow the published desired count at once."""

    replicas: dict[str, int] = field(default_factory=lambda: {"chat": 1, "batch": 1})

    def list_pods(self, label_selector: str, namespace: str | None = None) -> list[dict[str, Any]]:
        name = label_selector.removeprefix("extender.io/workload=")
        return [pod(f"{name}-{i}", f"10.1.0.{i}", uid=f"{name}-{i}", labels={"extender.io/workload": name})
                for i in range(self.replicas.get(name, 0))]


def node(name: str) -> NodeState:
    return NodeState.model_validate({"name": name, "nodeClass": "a10g", "gpus": 4, "gpusFree": 4,
                                     "nvmeTotal": 3800 * 10**9, "nvmeFree": 3000 * 10**9,
                                     "heartbeat": T0, "ttl": 10**9})


def run(redis_url: str, *, max_nodes: int | None, inventory: bool = True, ticks: int = 40) -> dict[str, Decision]:
    text = POLICY.format(max_nodes="" if max_nodes is None else f"    maxNodes: {max_nodes}\n")
    policy = parse_policy(text, "sharing-test.yaml")
    client = connect(redis_url, "/nonexistent")
    store = InventoryStore(client)
    if inventory:
        store.put_many([node("a10g-1"), node("a10g-2")])
    clock = [T0]
    cluster = Cluster()
    loop = ScaleLoop(policy=policy, lock=LeaderLock(client, "a", ttl_s=45, clock=lambda: int(clock[0] * 1000)),
                     history=HistoryStore(client), decisions=DecisionStore(client), pods=cluster,
                     inventory=store if inventory else None,
                     sources={"chat": Scripted(chat_demand), "batch": Scripted(batch_demand)},
                     monotonic=lambda: clock[0])  # a tick takes none of the test's time
    last: dict[str, Decision] = {}
    for k in range(ticks):
        clock[0] = T0 + k * TICK
        report = loop.tick(clock[0])
        assert report.leader and not report.error, report
        for r in report.results:
            assert r.decision is not None, r.error
            last[r.workload] = r.decision
            cluster.replicas[r.workload] = r.decision.desired
        if inventory and max_nodes is not None:
            assert sum(cluster.replicas.values()) <= FLEET_GPUS  # one GPU a replica: never more than the fleet
    return last


def test_a_forecast_is_cut_but_another_workloads_observed_load_is_served(
        redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    last = run(redis_server.url, max_nodes=4)
    chat, batch = last["chat"], last["batch"]
    # batch (priority 0): its observed load, 5 replicas, in full, although chat has priority 10
    assert batch.reactive_replicas == pytest.approx(5.0)
    assert (batch.desired, batch.unshared) == (5, None)
    # chat: its own observed need is served, its forecast only up to what the fleet has left
    assert chat.driver == "forecast" and chat.unshared is not None
    assert chat.unshared > FLEET_GPUS - batch.desired
    assert chat.desired == FLEET_GPUS - batch.desired
    assert chat.reactive_replicas is not None and chat.desired >= math.ceil(chat.reactive_replicas - 1e-9)
    assert any("cut from" in r and "by sharing the fleet (16 GPUs (a10g 8 on 2 nodes + 8 to maxNodes 4))" in r
               for r in chat.reasons)

    # what the HPA reads is the cut count, and its load matches it
    published = DecisionStore(connect(redis_server.url, "/nonexistent")).published()
    assert published["chat"].desired == chat.desired
    assert published["chat"].load == pytest.approx(chat.desired * 1.0)
    assert published["batch"].desired == 5

    assert cli.main(["scale", "explain", "chat", "--redis-url", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert f"cut from {chat.unshared} by sharing the fleet" in out.splitlines()[1]
    assert f"published: extender-desired-replicas {chat.desired}" in out
    assert f"(cut from {chat.unshared} by sharing the fleet)" in out
    assert cli.main(["scale", "explain", "chat", "--json", "--redis-url", redis_server.url]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["published"]["unshared"], record["decision"]["unshared"]) == (chat.unshared, chat.unshared)


@pytest.mark.parametrize(("max_nodes", "inventory", "reason"), [
    pytest.param(None, True, None, id="no-maxNodes-unbounded-pool"),
    pytest.param(4, False, "fleet capacity not capped: no inventory", id="no-inventory-fails-open"),
])
def test_nothing_is_cut_when_the_fleet_is_not_bounded_or_not_known(
        redis_server: RedisServer, max_nodes: int | None, inventory: bool, reason: str | None) -> None:
    last = run(redis_server.url, max_nodes=max_nodes, inventory=inventory)
    chat, batch = last["chat"], last["batch"]
    assert chat.unshared is None and batch.unshared is None
    assert chat.desired + batch.desired > FLEET_GPUS  # what the bounded fleet had to cut
    for d in (chat, batch):
        assert any(reason in r for r in d.reasons) if reason else not any("fleet capacity" in r for r in d.reasons)
