"""Karpenter's consolidation of under-used nodes in the simulator (a pool's ``consolidationPolicy:
WhenEmptyOrUnderutilized``): a node whose pods all fit elsewhere is drained after
``consolidateAfter``, its pods made again and scheduled as any new pod; ``WhenEmpty``, the
default, is the simulator as it was."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from extender.core.warming import Action
from extender.sim.report import build, markdown, summarise, to_json
from extender.sim.scenario import Rollout, load_scenario
from extender.sim.simulation import Prepared, Run, RunResult, _first_fit, prepare
from extender.sim.strategies import STRATEGIES
from tests.test_sim_inputs import assert_scenario_error
from tests.test_sim_shared_forecasts import figures
from tests.test_sim_world import POLICY_TEXT, POOLED

#: Two 4-GPU nodes, one 1-GPU replica on each (LeastAllocated spreads them), demand for two: each
#: node's replica fits on the other's free GPUs, so one node is under-used and can go.
UNDERUSED = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
policy: policy.yaml
seed: 3
duration: 40m
slo: {queueDelay: 10s}
cluster:
  autoscaling:
    consolidateAfter: 5m
  nodes:
    - nodeClass: g5.12xlarge
      count: 2
      minCount: 0
      maxCount: 3
      consolidationPolicy: WhenEmptyOrUnderutilized
      warm: [{workload: llama3-8b, nodes: [0, 1]}]
workloads:
  - name: llama3-8b
    initialReplicas: 2
    demand:
      synthetic: {duration: 40m, base: 6, arrivals: fluid}
"""
POLICY_LINE = "      consolidationPolicy: WhenEmptyOrUnderutilized\n"
#: A daily cycle on a 4-GPU pool that grows from one node: after the peak, replicas are spread
#: thin over the nodes the peak launched (under ``predictive`` no node empties).
DAILY = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
policy: policy.yaml
seed: 3
slo: {queueDelay: 10s}
cluster:
  autoscaling:
    provisioning: {median: 2m, p90: 4m}
    consolidateAfter: 5m
  nodes:
    - nodeClass: g5.12xlarge
      count: 1
      minCount: 0
      maxCount: 6
      consolidationPolicy: WhenEmptyOrUnderutilized
      warm: [{workload: llama3-8b, nodes: [0]}]
workloads:
  - name: llama3-8b
    initialReplicas: 2
    demand:
      synthetic: {duration: 8h, base: 12, daily: {amplitude: 0.8, peak: 3h}, noise: 0.1, arrivals: fluid}
"""


def _prepared(tmp_path: Path, text: str) -> Prepared:
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    (tmp_path / "s.yaml").write_text(text)
    return prepare(load_scenario(tmp_path / "s.yaml"))


def _run(tmp_path: Path, text: str, strategy: str = "default") -> RunResult:
    return Run(_prepared(tmp_path, text), STRATEGIES[strategy]).run()


def _first_drop_s(result: RunResult) -> float | None:
    """When the provisioned GPUs first went down (a node removed), or None."""
    down = np.flatnonzero(np.diff(result.fleet_gpus) < 0)
    return None if len(down) == 0 else float(down[0] + 1) * result.tick_s


class Case(NamedTuple):
    text: str
    strategy: str
    consolidated: int
    at_s: float | None  # when the node goes


CASES = [
    pytest.param(Case(UNDERUSED, "default", 1, 300.0), id="fits-elsewhere-drained-at-consolidateAfter"),
    pytest.param(Case(UNDERUSED.replace("consolidateAfter: 5m", "consolidateAfter: 12m"), "default", 1, 720.0),
                 id="a-longer-consolidateAfter-drains-later-not-before"),
    pytest.param(Case(UNDERUSED, "cache-aware", 1, 300.0), id="with-the-extender-placing-the-pod-again"),
    pytest.param(Case(UNDERUSED.replace("initialReplicas: 2", "initialReplicas: 8").replace("base: 6", "base: 30"),
                      "default", 0, None), id="full-nodes-fit-nowhere-kept"),
    pytest.param(Case(UNDERUSED.replace("minCount: 0", "minCount: 2"), "default", 0, None), id="minCount-holds"),
    pytest.param(Case(UNDERUSED.replace(POLICY_LINE, "      consolidationPolicy: WhenEmpty\n"), "default", 0, None),
                 id="when-empty-keeps-a-node-with-a-pod"),
    pytest.param(Case(UNDERUSED.replace("initialReplicas: 2", "initialReplicas: 2\n    doNotDisrupt: true"),
                      "default", 0, None), id="do-not-disrupt-pods-keep-their-node"),
]


@pytest.mark.parametrize("case", CASES)
def test_an_underused_node_is_drained_only_when_its_pods_fit_elsewhere(tmp_path: Path, case: Case) -> None:
    result = _run(tmp_path, case.text, case.strategy)
    w = result.workloads[0]
    assert result.nodes_consolidated == case.consolidated
    assert w.disrupted == case.consolidated  # one replica on the drained node
    assert result.nodes_removed == case.consolidated  # no node was ever empty
    assert _first_drop_s(result) == case.at_s
    if case.consolidated:
        assert result.fleet_gpus[-1] == 4 and w.timeline.ready[-1] == 2  # both replicas on the node left


def test_the_drained_pod_starts_again_and_its_cost_shows(tmp_path: Path) -> None:
    drained = _run(tmp_path, UNDERUSED)
    kept = _run(tmp_path, UNDERUSED.replace(POLICY_LINE, ""))
    d, k = drained.workloads[0], kept.workloads[0]
    assert (k.disrupted, len(k.startups)) == (0, 0)  # without it nothing starts: demand is flat
    assert d.disrupted == 1 and len(d.startups) == 1 and d.startups[0] > 0  # the new replica's start is counted
    assert len(d.ready_waits) == 1 and d.ready_waits[0] >= d.startups[0]  # pending a tick, then starting
    assert d.timeline.ready.min() == 1  # one replica served alone while the other started again
    slo = 10.0
    s_d = summarise(drained.workloads, slo, drained.fleet_gpu_seconds, drained.nodes_consolidated)
    s_k = summarise(kept.workloads, slo, kept.fleet_gpu_seconds, kept.nodes_consolidated)
    assert s_d.slo_attainment < s_k.slo_attainment and s_d.p99_delay_s > s_k.p99_delay_s  # what it costs
    assert s_d.gpu_hours < s_k.gpu_hours  # what it saves: one node of four GPUs for 35 minutes
    assert s_k.gpu_hours - s_d.gpu_hours == pytest.approx(4 * 35 / 60)
    assert (s_d.disrupted_pods, s_d.consolidated_nodes) == (1, 1)
    assert (s_k.disrupted_pods, s_k.consolidated_nodes) == (0, 0)


def test_the_report_counts_disruptions_in_json_and_markdown_only(tmp_path: Path) -> None:
    runs = [_run(tmp_path, UNDERUSED)]
    report = build("t", 10.0, 2400.0, runs)
    doc = to_json(report)
    assert '"disrupted_pods": 1' in doc and '"consolidated_nodes": 1' in doc
    assert "drained 1 nodes, deleting 1 pods" in markdown(report, [], {})
    quiet = build("t", 10.0, 2400.0, [_run(tmp_path, UNDERUSED.replace(POLICY_LINE, ""))])
    assert "drained" not in markdown(quiet, [], {})  # a report without it reads as before


@pytest.mark.parametrize("text", [
    pytest.param(UNDERUSED, id="two-replicas-on-two-nodes"),
    pytest.param(POOLED, id="growing-pool-with-empty-nodes"),
    pytest.param(DAILY, id="daily-cycle"),
])
@pytest.mark.parametrize("strategy", ["default", "predictive"])
def test_without_the_field_a_pool_is_when_empty(tmp_path: Path, text: str, strategy: str) -> None:
    """The default changes nothing: a scenario without ``consolidationPolicy`` runs exactly as one
    that sets ``WhenEmpty``, the simulator as it was before the field."""
    bare = text.replace(POLICY_LINE, "")
    explicit = bare.replace("      maxCount:", "      consolidationPolicy: WhenEmpty\n      maxCount:")
    assert explicit != bare
    assert figures(_run(tmp_path, bare, strategy)) == figures(_run(tmp_path, explicit, strategy))


def test_the_same_seed_gives_the_same_run(tmp_path: Path) -> None:
    first, again = _run(tmp_path, DAILY, "predictive"), _run(tmp_path, DAILY, "predictive")
    assert first.nodes_consolidated >= 1  # the case this is for
    assert figures(first) == figures(again)


@pytest.mark.parametrize(("warming", "kept"), [
    pytest.param([0, 1], [True, True], id="both-warming-both-kept"),
    pytest.param([0], [True, False], id="the-warming-node-kept-the-other-drained"),
    pytest.param([], [False, True], id="none-warming-the-first-drained"),
])
def test_a_warm_action_on_a_node_holds_it(tmp_path: Path, warming: list[int], kept: list[bool]) -> None:
    run = Run(_prepared(tmp_path, UNDERUSED), STRATEGIES["default"])
    run._initial()
    c = run.cluster
    after = run.auto.consolidate_after
    run._autoscale(0.0)  # both nodes hold a replica that fits on the other: the clock starts
    for i in warming:
        c.start_action(Action(node=c.records[i].name, workload="llama3-8b", kind="image", cache="image:x", bytes=0,
                              nvme_bytes=0, duration_s=2 * after, deadline=None, saved_s=0.0, purpose="keep-warm"),
                       0.0)
    run._autoscale(after)
    assert c.present[:2].tolist() == kept
    assert run.consolidated == kept.count(False)
    c.finish_actions(2 * after)
    run._autoscale(2 * after)  # the actions are done: a node goes now (only one: the other took its pod)
    assert run.consolidated == 1 and c.present[:2].sum() == 1


def test_draining_during_a_rollout_keeps_the_replicas(tmp_path: Path) -> None:
    """A pod a rolling update pairs with another is not made again: its pair stands in for it, so
    the Deployment's replicas (pods less replacements in progress) stay what the HPA set."""
    run = Run(_prepared(tmp_path, UNDERUSED), STRATEGIES["default"])
    run._initial()
    s = run.w[0]
    run._autoscale(0.0)
    run._rollout(Rollout.model_validate({"workload": "llama3-8b", "at": 1.0, "weightsVersion": "v2"}), 1.0)
    run._rolling(s, 1.0)
    assert len(s.links) == 1 and len(s.pods) == 3
    run._autoscale(run.auto.consolidate_after)
    assert run.consolidated == 1 and s.disrupted == 1
    assert len(s.pods) - len(s.links) == 2


BAD = [
    pytest.param(UNDERUSED.replace("WhenEmptyOrUnderutilized", "Sometimes"), 15, "cluster.nodes[0].consolidationPolicy",
                 "'WhenEmpty' or 'WhenEmptyOrUnderutilized'", id="unknown-policy"),
    pytest.param(UNDERUSED.replace("      minCount: 0\n      maxCount: 3\n", ""), 11, "cluster.nodes[0]",
                 "consolidationPolicy needs maxCount", id="on-a-fixed-group"),
    pytest.param(UNDERUSED.replace("initialReplicas: 2", "initialReplicas: 2\n    doNotDisrupt: maybe"), 20,
                 "workloads[0].doNotDisrupt", "bool", id="do-not-disrupt-not-a-boolean"),
]


@pytest.mark.parametrize(("text", "line", "where", "message"), BAD)
def test_bad_consolidation_fields_are_refused_with_file_and_line(tmp_path: Path, text: str, line: int, where: str,
                                                                 message: str) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    assert_scenario_error(tmp_path / "s.yaml", text, where, line, message)


# ---- pending pods in the fit check --------------------------------------------------------------

#: Three 4-GPU nodes of one pool that drains under-used nodes, no room to grow: llama3-8b takes one
#: GPU a replica, mixtral-61g four. The rows below place the pods by hand.
THREE = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
policy: policy.yaml
seed: 3
duration: 20m
slo: {queueDelay: 10s}
cluster:
  autoscaling:
    consolidateAfter: 5m
  nodes:
    - nodeClass: g5.12xlarge
      count: 3
      minCount: 0
      maxCount: 3
      consolidationPolicy: WhenEmptyOrUnderutilized
workloads:
  - name: llama3-8b
    demand:
      synthetic: {duration: 20m, base: 1, arrivals: fluid}
  - name: mixtral-61g
    demand:
      synthetic: {duration: 20m, base: 1, arrivals: fluid}
"""
#: The same nodes as two pools: node 0 alone in the first, nodes 1 and 2 in the second.
TWO_POOLS = THREE.replace("""\
      count: 3
      minCount: 0
      maxCount: 3
""", """\
      count: 1
      minCount: 0
      maxCount: 1
      consolidationPolicy: WhenEmptyOrUnderutilized
    - nodeClass: g5.12xlarge
      name: second
      count: 2
      minCount: 0
      maxCount: 2
""")
#: Three 1-GPU nodes, and a policy that lets mixtral-61g (4 GPUs) ask for one: its pods are larger
#: than any node.
SMALL = THREE.replace("nodeClass: g5.12xlarge", "nodeClass: g5.xlarge")
WIDE_POLICY = POLICY_TEXT.replace("nodeClasses: [g5.12xlarge, g5.48xlarge]",
                                  "nodeClasses: [g5.xlarge, g5.12xlarge, g5.48xlarge]")
PODS = {"L": 0, "M": 1}  # a llama3-8b replica, a mixtral-61g replica


class Pending(NamedTuple):
    text: str
    nodes: tuple[str, ...]  # the pods on each node, one letter each (PODS)
    pending: str  # the pods pending, oldest first
    drained: tuple[int, ...]  # the nodes drained after consolidateAfter (at most one per pool)
    policy: str = POLICY_TEXT


PENDING = [
    pytest.param(Pending(THREE, ("L", "LL", "M"), "", (0,)), id="no-pending-pods-drained-as-before"),
    pytest.param(Pending(THREE, ("L", "LLL", "M"), "L", ()),
                 id="a-pending-pod-takes-the-last-free-gpu-its-pod-needs-kept"),
    pytest.param(Pending(THREE, ("L", "LL", "M"), "L", (0,)), id="room-for-the-pending-pod-and-its-pod-drained"),
    pytest.param(Pending(THREE, ("L", "LL", "M"), "LL", ()), id="room-for-the-pending-pods-only-kept"),
    pytest.param(Pending(THREE, ("L", "", "M"), "M", ()), id="a-pending-4-gpu-pod-takes-the-empty-node-kept"),
    pytest.param(Pending(THREE, ("L", "LL", "M"), "MM", (0,)),
                 id="pending-pods-with-no-room-anywhere-do-not-block-drained"),
    pytest.param(Pending(THREE, ("L", "LLLL", ""), "LM", (0,)),
                 id="oldest-first-the-1-gpu-pod-leaves-room-drained"),
    pytest.param(Pending(THREE, ("L", "LLLL", ""), "ML", ()), id="oldest-first-the-4-gpu-pod-takes-the-node-kept"),
    pytest.param(Pending(SMALL, ("L", "", "L"), "M", (0,), WIDE_POLICY),
                 id="a-pending-pod-larger-than-any-node-is-left-out-drained"),
    pytest.param(Pending(SMALL, ("L", "", "L"), "ML", (), WIDE_POLICY),
                 id="after-a-pod-larger-than-any-node-the-next-pending-pod-still-counts-kept"),
    pytest.param(Pending(TWO_POOLS, ("L", "L", "LLL"), "", (0,)),
                 id="the-pod-a-drain-makes-again-is-pending-for-the-next-pool"),
]


@pytest.mark.parametrize("case", PENDING)
def test_pending_pods_take_their_gpus_before_a_drained_nodes_pods(tmp_path: Path, case: Pending) -> None:
    """As Karpenter's disruption simulation, the fit check schedules the pending pods (oldest first,
    first fit) before the candidate's pods; a pending pod that fits on no node is left out."""
    (tmp_path / "policy.yaml").write_text(case.policy)
    (tmp_path / "s.yaml").write_text(case.text)
    run = Run(prepare(load_scenario(tmp_path / "s.yaml")), STRATEGIES["default"])
    c = run.cluster
    assert c.present.tolist() == [True] * len(case.nodes)
    for node, pods in enumerate(case.nodes):
        for letter in pods:
            pod = run._new_pod(PODS[letter], 0.0)
            c.place(pod, node, 0.0)
            run._placed_on_node(pod)
    for letter in case.pending:
        run._new_pod(PODS[letter], 0.0)
    assert c.gpus_free().min() >= 0
    run._underused(0.0)  # every node whose pods fit elsewhere starts its clock
    assert run.consolidated == 0
    run._underused(run.auto.consolidate_after)
    assert [i for i in range(len(case.nodes)) if not c.present[i]] == list(case.drained)
    assert run.consolidated == len(case.drained)



class Fit(NamedTuple):
    left: list[int]  # free GPUs per node
    allowed: list[int]  # 1 where the workload's class is allowed
    gpus: int  # per pod
    k: int  # pods asked for
    placed: int
    after: list[int]  # free GPUs per node once they are placed


@pytest.mark.parametrize("case", [
    pytest.param(Fit([4, 4, 4], [1, 1, 1], 1, 5, 5, [0, 3, 4]), id="fills-the-nodes-in-index-order"),
    pytest.param(Fit([3, 5], [1, 1], 2, 3, 3, [1, 1]), id="floor-of-free-over-gpus-on-each"),
    pytest.param(Fit([3, 5], [1, 1], 2, 9, 3, [1, 1]), id="more-than-fit-places-what-fits"),
    pytest.param(Fit([4, 4], [0, 1], 4, 1, 1, [4, 0]), id="a-class-not-allowed-is-skipped"),
    pytest.param(Fit([4, 4], [1, 1], 1, 0, 0, [4, 4]), id="none-asked-none-placed"),
    pytest.param(Fit([4, 4], [1, 1], 8, 1, 0, [4, 4]), id="larger-than-any-node-placed-nowhere"),
])
def test_first_fit_takes_the_gpus_of_the_pods_it_places(case: Fit) -> None:
    free = np.array(case.left, dtype=np.int64)
    assert _first_fit(free, np.array(case.allowed, dtype=np.bool_), case.gpus, case.k) == case.placed
    assert free.tolist() == case.after
