"""extender.core.sharing: a fleet too small for every decision, shared by rounds and priority."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from extender.core.errors import PolicyError
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy, parse_policy
from extender.core.scaler import DecisionInputs, decide, horizon
from extender.core.sharing import Claim, FleetCapacity, apply_share, claim, fleet_capacity, share
from extender.scaler.loop import fresh_nodes, freshness
from extender.sim.errors import ScenarioError
from extender.sim.scenario import load_scenario
from tests.scaler_policy import policy_text

ROOT = Path(__file__).resolve().parents[1]


class Row(NamedTuple):
    name: str
    claims: list[Claim]
    gpus: int
    want: dict[str, int]


def c(name: str, *, priority: int = 0, gpus: int = 1, minimum: int = 0, observed: int = 0, desired: int = 0) -> Claim:
    return Claim(name, priority, gpus, minimum, observed, desired)


ROWS = [
    Row("everything fits: every decision stands",
        [c("a", observed=2, desired=4), c("b", gpus=4, observed=1, desired=2)], 12, {"a": 4, "b": 2}),
    Row("a forecast never starves another's observed load, whatever the priority",
        # a (priority 9) forecasts 10 but observes 2; b observes 4: b's 4 come before a's forecast
        [c("a", priority=9, observed=2, desired=10), c("b", observed=4, desired=4)], 8, {"a": 4, "b": 4}),
    Row("observed needs that do not fit go by priority",
        [c("a", priority=1, observed=5, desired=5), c("b", observed=5, desired=5)], 6, {"a": 5, "b": 1}),
    Row("equal priority: shares of the round's target stay even",
        [c("a", observed=4, desired=4), c("b", observed=4, desired=4)], 4, {"a": 2, "b": 2}),
    Row("minimum replicas first",
        [c("a", priority=5, observed=8, desired=8), c("b", minimum=2, observed=0, desired=2)], 6, {"a": 4, "b": 2}),
    Row("a replica that does not fit drops out; a smaller one still gets the GPUs left",
        [c("big", gpus=8, observed=2, desired=2), c("small", observed=3, desired=3)], 11, {"big": 1, "small": 3}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_share(row: Row) -> None:
    got = share(row.claims, row.gpus)
    assert got == row.want
    by_name = {cl.workload: cl for cl in row.claims}
    assert sum(n * by_name[w].gpus for w, n in got.items()) <= row.gpus
    assert all(got[w] <= by_name[w].desired for w in got)


def test_priority_out_of_range_is_a_policy_error_with_its_line() -> None:
    text = (ROOT / "scenarios/mixed-fleet-policy.yaml").read_text()
    anchor = "    capacity: {perReplica: 4, unit: requests/s}\n"
    line = text[: text.index(anchor)].count("\n") + 2
    with pytest.raises(PolicyError) as err:
        parse_policy(text.replace(anchor, anchor + "    priority: -1\n", 1), "p.yaml")
    (problem,) = err.value.problems
    assert (problem.line, problem.path) == (line, "profiles[0].priority")
    assert ">= 0" in problem.message


# ---- the pool the scaler shares: fleet_capacity ------------------------------------------------------


def sized_policy(**max_nodes: int) -> Policy:
    """tests/scaler_policy.py's policy (h100: 8 GPUs, a10g: 4; llama runs on a10g only) with ``maxNodes``."""
    text = policy_text()
    for name, n in max_nodes.items():
        anchor = f"  - name: {name}\n"
        text = text.replace(anchor, f"{anchor}    maxNodes: {n}\n", 1)
    return parse_policy(text, "p.yaml")


class CapacityRow(NamedTuple):
    name: str
    max_nodes: dict[str, int]
    profiles: tuple[str, ...]
    nodes: list[tuple[str, int]] | None
    gpus: int | None
    note: str


CAPACITY_ROWS = [
    CapacityRow("no inventory: nothing known, not capped", {"h100": 2, "a10g": 2}, ("qwen3",), None, None,
                "not capped: no inventory"),
    CapacityRow("a class without maxNodes: its pool is unbounded, not capped", {"a10g": 2}, ("qwen3",),
                [("a10g", 4)], None, "not capped: node class h100 has no maxNodes"),
    CapacityRow("nodes present plus what each pool can still add", {"h100": 2, "a10g": 1}, ("qwen3",),
                [("h100", 8), ("a10g", 4)], 8 + 4 + 1 * 8 + 0, "20 GPUs (h100 8 on 1 nodes + 8 to maxNodes 2"),
    CapacityRow("only the classes the workloads may use count", {"a10g": 3}, ("llama",),
                [("a10g", 4), ("h100", 8), ("h100", 8)], 4 + 2 * 4, "12 GPUs (a10g 4 on 1 nodes + 8"),
    CapacityRow("the union of every shared workload's classes", {"h100": 1, "a10g": 1}, ("llama", "qwen3"),
                [("a10g", 4)], 4 + 8, "12 GPUs"),
    CapacityRow("more nodes than maxNodes: no negative headroom", {"a10g": 1}, ("llama",),
                [("a10g", 4), ("a10g", 4), ("a10g", 4)], 12, "a10g 12 on 3 nodes + 0 to maxNodes 1"),
    CapacityRow("a record's own GPU count is what it has", {"a10g": 2}, ("llama",), [("a10g", 2)], 2 + 4, ""),
    CapacityRow("maxNodes 0 and no nodes: nothing to share", {"a10g": 0}, ("llama",), [], 0, "0 GPUs"),
]


@pytest.mark.parametrize("row", CAPACITY_ROWS, ids=[r.name for r in CAPACITY_ROWS])
def test_fleet_capacity(row: CapacityRow) -> None:
    policy = sized_policy(**row.max_nodes)
    got = fleet_capacity(policy, [policy.profile(n) for n in row.profiles], row.nodes)
    assert got.gpus == row.gpus
    assert row.note in got.note


@pytest.mark.parametrize(("tensor", "gpus", "granted"), [
    pytest.param(8, 8, 1, id="tp8-gets-nothing-from-one-gpu-nodes"),
    pytest.param(1, 16, 3, id="one-gpu-replicas-count-every-node"),
])
def test_fleet_capacity_counts_classes_that_hold_a_replica(tensor: int, gpus: int, granted: int) -> None:
    # One 8-GPU node and eight 1-GPU nodes, every pool at its maxNodes: 16 GPUs, but a TP=8 replica
    # fits only on the 8-GPU node, so three TP=8 replicas wanted get one, not two.
    text = policy_text().replace("{product: NVIDIA-A10G, count: 4}", "{product: NVIDIA-A10G, count: 1}")
    text = text.replace("  - name: h100\n", "  - name: h100\n    maxNodes: 1\n").replace(
        "  - name: a10g\n", "  - name: a10g\n    maxNodes: 8\n")
    text = text.replace("    capacity: {perReplica: 4, unit: requests/s}",
                        f"    parallelism: {{tensor: {tensor}}}\n    capacity: {{perReplica: 4, unit: requests/s}}")
    policy = parse_policy(text, "p.yaml")
    profile = policy.profile("qwen3")
    got = fleet_capacity(policy, [profile], [("h100", 8)] + [("a10g", 1)] * 8)
    assert got.gpus == gpus
    mine = Claim("qwen3", 0, profile.parallelism.gpus, 1, 3, 3)
    assert share([mine], gpus)["qwen3"] == granted


class ClaimRow(NamedTuple):
    name: str
    reactive: float | None
    current: int
    observed: int


CLAIM_ROWS = [
    ClaimRow("nothing observed: the current replicas are the observed need", None, 3, 3),
    ClaimRow("a fractional need rounds up", 2.5, 7, 3),
    ClaimRow("float noise does not add a replica", 1.1 / 0.1, 0, 11),
    ClaimRow("no load: no replica", 0.0, 2, 0),
]


@pytest.mark.parametrize("row", CLAIM_ROWS, ids=[r.name for r in CLAIM_ROWS])
def test_claim_from_a_decision(row: ClaimRow) -> None:
    profile = sized_policy().profile("llama")
    got = claim(profile, minimum=1, reactive=row.reactive, current=row.current, desired=9)
    assert got == Claim("llama", 0, 1, 1, row.observed, 9)


def test_a_cut_decision_says_so() -> None:
    h = horizon(100.0, 15.0, 15.0)
    d = decide(DecisionInputs(workload="w", now_s=0.0, demand=4.0, capacity=1.0, horizon=h, ready=2, max_replicas=20,
                              forecast=None))
    assert (d.desired, d.action, d.unshared) == (4, "scale-up", None)
    mine = Claim("w", 3, 1, 0, 4, 4)
    cap = FleetCapacity(2, "2 GPUs (x)")
    assert apply_share(d, mine, 4, cap) is d  # fits: unchanged
    cut = apply_share(d, mine, 1, cap)
    assert (cut.desired, cut.unshared, cut.action, cut.published) == (1, 4, "scale-down", 1)  # published as cut
    assert "cut from 4 to 1 by sharing the fleet (2 GPUs (x))" in cut.reasons[-1]
    assert "cut from 4 by sharing the fleet" in cut.explain().splitlines()[0]
    assert apply_share(d, mine, 2, cap).action == "hold"


@pytest.mark.parametrize(("value", "message"), [
    pytest.param("-1", ">= 0", id="negative"),
    pytest.param("many", "whole number", id="not-a-number"),
    pytest.param("100001", "<= 100000", id="too-large"),
    pytest.param("2.5", "whole number", id="fractional"),
])
def test_max_nodes_bad_values_are_policy_errors_with_their_line(value: str, message: str) -> None:
    text = policy_text()
    anchor = "  - name: a10g\n"
    line = text[: text.index(anchor)].count("\n") + 2
    with pytest.raises(PolicyError) as err:
        parse_policy(text.replace(anchor, f"{anchor}    maxNodes: {value}\n", 1), "p.yaml")
    (problem,) = err.value.problems
    assert (problem.line, problem.path) == (line, "nodeClasses[1].maxNodes")
    assert message in problem.message
    assert "p.yaml:" in str(err.value)


def test_a_scenario_pool_larger_than_the_policys_max_nodes_is_an_error(tmp_path: Path) -> None:
    policy = (ROOT / "scenarios/mixed-fleet-policy.yaml").read_text()
    anchor = "  - name: g5.xlarge\n"
    (tmp_path / "policy.yaml").write_text(policy.replace(anchor, f"{anchor}    maxNodes: 4\n", 1))
    scenario = (
        "apiVersion: extender.io/v1alpha1\nkind: Scenario\npolicy: policy.yaml\nslo: {queueDelay: 10s}\n"
        "cluster:\n  nodes:\n    - nodeClass: g5.xlarge\n      count: 2\n      maxCount: 6\n"
        "workloads:\n  - name: llama3-8b\n    initialReplicas: 1\n"
        "    demand:\n      synthetic: {duration: 1h, base: 3, arrivals: fluid}\n"
    )
    path = tmp_path / "s.yaml"
    path.write_text(scenario)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    (problem,) = err.value.problems
    assert (problem.line, problem.path) == (9, "cluster.nodes[0].maxCount")
    assert "can hold 6 nodes, more than the policy's maxNodes 4" in problem.message
    path.write_text(scenario.replace("maxCount: 6", "maxCount: 4"))
    assert load_scenario(path).policy.node_class("g5.xlarge").max_nodes == 4


def test_the_loop_counts_fresh_inventory_records_only() -> None:
    policy = sized_policy(a10g=3)
    records = [NodeState.model_validate(r) for r in (
        {"name": "fresh", "nodeClass": "a10g", "gpus": 4, "heartbeat": 1000.0, "ttl": 60},
        {"name": "stale", "nodeClass": "a10g", "gpus": 4, "heartbeat": 100.0, "ttl": 60},
        {"name": "no-gpus-reported", "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
         "heartbeat": 1000.0, "ttl": 60},
    )]
    nodes = fresh_nodes(InventorySnapshot.build(policy, records), 1010.0)
    assert nodes == [("a10g", 4), ("h100", 8)]  # the stale record is left out; the class gives the GPUs
    got = fleet_capacity(policy, [policy.profile("llama")], nodes)
    assert got.gpus == 4 + 2 * 4  # the stale node's slot counts as headroom up to maxNodes 3


@pytest.mark.parametrize(("heartbeat", "fresh"), [
    pytest.param(950.0, True, id="behind-within-ttl"),
    pytest.param(900.0, False, id="behind-beyond-ttl"),
    pytest.param(1050.0, True, id="ahead-within-ttl"),
    # a dead agent's clock ran ahead: it counted as fresh until the leader's clock caught up
    pytest.param(5000.0, False, id="ahead-beyond-ttl"),
])
def test_the_loop_judges_freshness_within_the_ttl_either_way(heartbeat: float, fresh: bool) -> None:
    policy = sized_policy(a10g=3)
    record = NodeState(name="n", nodeClass="a10g", gpus=4, heartbeat=heartbeat, ttl=60)
    snapshot = InventorySnapshot.build(policy, [record])
    assert fresh_nodes(snapshot, 1000.0) == ([("a10g", 4)] if fresh else [])
    assert freshness(snapshot, 1000.0) == ((1, 0) if fresh else (0, 1))  # extender_scaler_inventory_nodes
