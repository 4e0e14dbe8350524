"""The simulated world of issue #13: autoscaled node pools, rollouts, and the new scenario fields."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from extender.core.caches import warm_entries
from extender.core.policy import Policy
from extender.files import load_policy
from extender.sim.cluster import Cluster, NodeSpec, Pod
from extender.sim.errors import ScenarioError
from extender.sim.scenario import Rollout, load_scenario
from extender.sim.simulation import Run, prepare, rolled_policy
from extender.sim.strategies import STRATEGIES
from tests.test_sim_inputs import assert_scenario_error

ROOT = Path(__file__).resolve().parents[1]
POLICY_TEXT = (ROOT / "scenarios/mixed-fleet-policy.yaml").read_text()


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(ROOT / "scenarios/mixed-fleet-policy.yaml")


def _warm_node(policy: Policy, name: str, *, present: bool = True) -> NodeSpec:
    cls = policy.node_class("g5.xlarge")
    p = policy.profile("llama3-8b")
    caches: dict[str, int] = {}
    for kind in ("image", "weights", "compile"):
        caches.update(warm_entries(p, cls, kind))
    return NodeSpec(name, cls.name, tuple(caches.items()) if present else (), present=present, pool=0)


# ---------------------------------------------------------------------------------------------
# The cluster: nodes that join and leave
# ---------------------------------------------------------------------------------------------


def test_a_joining_node_is_cold_and_a_removed_node_forgets_its_caches(policy: Policy) -> None:
    p = policy.profile("llama3-8b")
    c = Cluster.build(policy, [p], [_warm_node(policy, "a-00"), _warm_node(policy, "a-01", present=False)])
    assert c.feasible(0).tolist() == [True, False]  # the absent slot takes no pod
    assert not c.cost(0, 0, 0.0).cold
    c.join(1)
    assert c.feasible(0).tolist() == [True, True]
    joined = c.cost(0, 1, 0.0)
    assert joined.cold and joined.estimate.total_s[0] > c.cost(0, 0, 0.0).estimate.total_s[0]
    c.remove(0)
    assert c.feasible(0).tolist() == [False, True]
    c.join(0)  # the slot launches again: a new machine, nothing cached
    assert c.cost(0, 0, 0.0).cold
    c.remove(1)
    assert [r.name for r in c.planning_snapshot(0.0).nodes] == ["a-00"]  # the warmer never plans on a gone node


def test_a_rollout_makes_the_old_version_cold(policy: Policy) -> None:
    p = policy.profile("llama3-8b")
    c = Cluster.build(policy, [p], [_warm_node(policy, "a-00")])
    assert not c.cost(0, 0, 0.0).cold
    rollout = Rollout.model_validate({"workload": "llama3-8b", "at": 60.0, "weightsVersion": "v2"})
    rolled = rolled_policy(policy, rollout)
    c.set_profile(0, rolled.profile("llama3-8b"))
    start = c.cost(0, 0, 0.0)
    assert start.cold
    assert start.download_bytes >= rolled.profile("llama3-8b").weights.bytes  # the new weights are fetched


def _with_snapshot(text: str, *, published: bool) -> str:
    """The mixed-fleet policy with a process snapshot for ``llama3-8b`` (published for g5.xlarge or not)."""
    text = text.replace("    capacity: {perReplica: 4, unit: requests/s}\n    startupSlo: 2m\n",
                        "    capacity: {perReplica: 4, unit: requests/s}\n    startupSlo: 2m\n"
                        "    snapshot: {bytes: 18GB, restore: 10s}\n", 1)
    assert "snapshot:" in text
    if published:
        published_line = "  publishedSnapshots: [{workload: llama3-8b, nodeClass: g5.xlarge}]\n"
        text = text.replace("warming:\n", "warming:\n" + published_line, 1)
    return text


def test_a_rollout_makes_the_old_version_s_snapshot_stop_counting(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(_with_snapshot(POLICY_TEXT, published=True))
    policy = load_policy(tmp_path / "policy.yaml")
    cls, p = policy.node_class("g5.xlarge"), policy.profile("llama3-8b")
    caches: dict[str, int] = {}
    for kind in ("image", "weights", "compile", "snapshot"):
        caches.update(warm_entries(p, cls, kind))
    c = Cluster.build(policy, [p], [NodeSpec("a-00", cls.name, tuple(caches.items()))])
    assert c.records[0].snapshots == ("llama3-8b/main",)  # named by the weights version it holds
    assert c.cost(0, 0, 0.0).estimate.restore_s[0] > 10.0  # the restore path: the read, then 10 s
    rollout = Rollout.model_validate({"workload": "llama3-8b", "at": 60.0, "weightsVersion": "v2"})
    c.set_profile(0, rolled_policy(policy, rollout).profile("llama3-8b"))
    assert c.records[0].snapshots == ("llama3-8b/main",)  # still on the disk, like the old weights
    start = c.cost(0, 0, 0.0)
    assert start.cold and start.estimate.restore_s[0] == 0.0  # but the old model is not restored


# ---------------------------------------------------------------------------------------------
# Whole runs
# ---------------------------------------------------------------------------------------------

POOLED = """\
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
    - nodeClass: g5.xlarge
      count: 2
      minCount: 0
      maxCount: 6
      warm: [{workload: llama3-8b, nodes: [0, 1]}]
workloads:
  - name: llama3-8b
    initialReplicas: 1
    demand:
      synthetic: {duration: 8h, base: 3, trend: 10, arrivals: fluid}
"""


def _run(tmp_path: Path, text: str, strategy: str = "default") -> Run:
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    (tmp_path / "s.yaml").write_text(text)
    run = Run(prepare(load_scenario(tmp_path / "s.yaml")), STRATEGIES[strategy])
    run.run()
    return run


def test_autoscaled_nodes_arrive_cold_and_empty_ones_are_removed(tmp_path: Path) -> None:
    run = _run(tmp_path, POOLED)
    result = run._result()
    c = run.cluster
    # the second warm node stayed empty (one initial replica): removed after consolidateAfter
    assert run.removed >= 1
    assert result.fleet_gpus[0] == 2 and result.fleet_gpus.min() == 1
    # 3 -> 13 requests/s in 8 h: demand outgrows the two nodes, so nodes are launched, and pods on them start cold
    assert run.launched >= 2
    launched_nodes = {i for i in range(len(c)) if c.records[i].name not in {"g5.xlarge-00", "g5.xlarge-01"}}
    on_new = [p for p in run.placed if p.node in launched_nodes]
    assert on_new, "no pod landed on a launched node"
    first_on_each: dict[int, bool] = {}
    for pod in sorted(on_new, key=lambda p: p.placed_s):
        first_on_each.setdefault(pod.node, pod.cold)
    assert all(first_on_each.values()), "the first pod on a new node found caches"
    # the fleet's cost is the provisioned GPUs: at least what the pods held
    assert result.fleet_gpu_seconds is not None
    assert result.fleet_gpu_seconds >= sum(w.gpu_seconds for w in result.workloads)
    assert np.all(result.fleet_gpus <= 6)


def test_standby_placeholders_hold_free_gpus_keep_their_node_and_launch_only_without_room(tmp_path: Path) -> None:
    """The overprovisioning pattern as ``provisionAhead`` models it (docs/scaler.md section 5.1)."""
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    (tmp_path / "s.yaml").write_text(POOLED)
    run = Run(prepare(load_scenario(tmp_path / "s.yaml")), STRATEGIES["predictive"])
    run._initial()
    c, s = run.cluster, run.w[0]
    (empty,) = np.flatnonzero(c.present & (c.gpus_used == 0))  # two nodes, one initial replica
    free = c.gpus_free().copy()
    after = run.auto.consolidate_after + run.dt

    # one placeholder, and an empty node has room: it sits there, launches nothing, and the node stays
    s.standby = 1
    run._autoscale(0.0)
    run._autoscale(after)
    assert c.present[empty] and (run.launched, run.removed) == (0, 0)
    assert np.array_equal(c.gpus_free(), free)  # its GPU is still free for a replica (it would be preempted)

    # no placeholder: the empty node goes once it has been empty for consolidateAfter
    s.standby = 0
    run._autoscale(after + run.dt)
    run._autoscale(2 * after + run.dt)
    assert not c.present[empty] and run.removed == 1

    # three placeholders of one GPU and no free GPU left: each launches a node (one GPU per g5.xlarge)
    s.standby = 3
    run._autoscale(3 * after)
    assert run.launched == 3 and len(run.launching) == 3

    # the default strategy keeps none, whatever the count
    default = Run(prepare(load_scenario(tmp_path / "s.yaml")), STRATEGIES["default"])
    default._initial()
    default.w[0].standby = 3
    default._autoscale(0.0)
    assert default.launched == 0


def test_a_rollout_replaces_every_replica_and_they_start_cold(tmp_path: Path) -> None:
    text = (POOLED.replace("trend: 10", "trend: 0")
            + "rollouts:\n  - {workload: llama3-8b, at: 1h, weightsVersion: v2, maxSurge: 1}\n")
    run = _run(tmp_path, text)
    s = run.w[0]
    assert not s.old and not s.links  # the update finished
    after = [p for p in run.placed if p.placed_s >= 3600.0]
    assert after and after[0].cold  # the first replica of v2 finds no v2 weights anywhere
    assert run.policy.profile("llama3-8b").weights.version == "v2"
    # every v1 replica (the initial one included) was replaced by one created at or after the rollout
    assert s.pods and all(p.created_s >= 3600.0 for p in s.pods.values())


EMPTY_POOL = (POOLED.replace("      count: 2\n", "      count: 0\n")
              .replace("      warm: [{workload: llama3-8b, nodes: [0, 1]}]\n", "")
              .replace("duration: 8h", "duration: 1h"))


@pytest.mark.parametrize("strategy", [
    pytest.param("default", id="kube-scheduler-scores-no-node"),
    pytest.param("cache-aware", id="extender-scores-no-node"),
    pytest.param("predictive", id="predictive-with-no-node"),
])
def test_a_pool_with_no_node_at_the_start_launches_one(tmp_path: Path, strategy: str) -> None:
    """``count: 0`` is a valid pool: the initial replica waits for a node instead of crashing the
    scheduler's ImageLocality on zero nodes (its spread is num_nodes / total_nodes)."""
    run = _run(tmp_path, EMPTY_POOL, strategy)
    result = run._result()
    assert not any(n.present for n in run.p.nodes) and run.launched >= 1
    assert run.w[0].ready >= 1 and result.workloads[0].served > 0


@pytest.mark.parametrize("text", [
    pytest.param(EMPTY_POOL + "rollouts:\n  - {workload: llama3-8b, at: 1m, weightsVersion: v2}\n",
                 id="every-replica-pending-at-the-rollout"),
    pytest.param(POOLED.replace("initialReplicas: 1", "initialReplicas: 3").replace("duration: 8h", "duration: 1h")
                 + "rollouts:\n  - {workload: llama3-8b, at: 1m, weightsVersion: v2}\n",
                 id="one-of-three-pending-at-the-rollout"),
])
def test_a_rollout_replaces_the_starts_it_abandons(tmp_path: Path, text: str) -> None:
    """A rolling update leaves the Deployment's replicas as the HPA set them: a start of the old
    version is abandoned and one of the new version takes its place. Dropping it instead could leave
    the workload at 0 replicas, where the HPA never scales again (``ScalingDisabled``)."""
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    (tmp_path / "s.yaml").write_text(text)
    prepared = prepare(load_scenario(tmp_path / "s.yaml"))
    run = Run(prepared, STRATEGIES["default"])
    run._initial()
    s = run.w[0]
    waiting = len(s.waiting)
    before = len(s.pods)
    assert waiting >= 1  # the rollout finds a replica that has not started
    run._rollout(prepared.scenario.rollouts[0], 60.0)
    assert len(s.pods) == before and len(s.waiting) == waiting
    assert not (set(s.waiting) & s.old)  # the replacements are of the new version
    whole = Run(prepared, STRATEGIES["default"])
    result = whole.run()
    assert whole.w[0].pods and result.workloads[0].served > 0


# ---------------------------------------------------------------------------------------------
# New scenario fields reject bad values with file:line
# ---------------------------------------------------------------------------------------------


class Bad(NamedTuple):
    name: str
    text: str
    line: int
    path: str
    message: str


BAD = [
    Bad("pool max below count", POOLED.replace("maxCount: 6", "maxCount: 1"), 11, "cluster.nodes[0]",
        "minCount <= count <= maxCount"),
    Bad("minCount without maxCount", POOLED.replace("      maxCount: 6\n", ""), 11, "cluster.nodes[0]",
        "minCount needs maxCount"),
    Bad("fixed group of zero",
        POOLED.replace("      minCount: 0\n      maxCount: 6\n", "").replace("count: 2", "count: 0"), 11,
        "cluster.nodes[0]", "count >= 1"),
    Bad("p90 below median", POOLED.replace("p90: 4m", "p90: 1m"), 8, "cluster.autoscaling.provisioning",
        "below the median"),
    Bad("bad consolidation", POOLED.replace("consolidateAfter: 5m", "consolidateAfter: soon"), 9,
        "cluster.autoscaling.consolidateAfter", "not a duration"),
    Bad("utilisation above 1", POOLED + "hpa: {targetUtilization: 1.5}\n", 21, "hpa.targetUtilization", "<= 1"),
    Bad("rollout of nobody", POOLED + "rollouts:\n  - {workload: nobody, at: 1h, image: x}\n", 22,
        "rollouts[0].workload", "no workload 'nobody'"),
    Bad("rollout changing nothing", POOLED + "rollouts:\n  - {workload: llama3-8b, at: 1h}\n", 22, "rollouts[0]",
        "weightsVersion, image or both"),
    Bad("rollout to the same version", POOLED + "rollouts:\n  - {workload: llama3-8b, at: 1h, weightsVersion: main}\n",
        22, "rollouts[0].weightsVersion", "already the version"),
    Bad("initial 0 leaves the HPA disabled", POOLED.replace("initialReplicas: 1", "initialReplicas: 0"), 17,
        "workloads[0]", "set initialReplicas >= 1, or minReplicas: 0"),
    Bad("rollout surge 0", POOLED + "rollouts:\n  - {workload: llama3-8b, at: 1h, image: x, maxSurge: 0}\n", 22,
        "rollouts[0].maxSurge", ">= 1"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.name for c in BAD])
def test_new_scenario_fields_reject_bad_values_with_file_and_line(tmp_path: Path, case: Bad) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    assert_scenario_error(tmp_path / "s.yaml", case.text, case.path, case.line, case.message)


def test_the_flagship_loads_with_pools_and_a_rollout() -> None:
    loaded = load_scenario(ROOT / "scenarios/flagship.yaml")
    sc = loaded.scenario
    assert len(sc.workloads) >= 12
    assert all(g.max_count is not None for g in sc.cluster.nodes)
    assert len(sc.rollouts) == 1
    sizes = [loaded.policy.profile(w.name).weights.bytes for w in sc.workloads]
    assert min(sizes) <= 8 * 2**30 and max(sizes) >= 400 * 2**30
    assert {loaded.policy.profile(w.name).parallelism.gpus for w in sc.workloads} >= {1, 2, 4, 8}


FIXED = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
policy: policy.yaml
seed: 3
slo: {queueDelay: 10s}
cluster:
  nodes:
    - nodeClass: g5.xlarge
      count: 4
      warm: [{workload: llama3-8b, fraction: 1}]
workloads:
  - name: llama3-8b
    initialReplicas: 1
    demand:
      synthetic: {duration: 2h, base: 2, arrivals: fluid}
rollouts:
  - {workload: llama3-8b, at: 1h, weightsVersion: v2, announce: ANNOUNCE}
"""


@pytest.mark.parametrize(("announce", "cold"), [("0s", True), ("30m", False)], ids=["not told", "announced"])
def test_an_announced_rollout_is_staged_ahead(tmp_path: Path, announce: str, cold: bool) -> None:
    run = _run(tmp_path, FIXED.replace("ANNOUNCE", announce), "predictive")
    first = min((p for p in run.placed if p.placed_s >= 3600.0), key=lambda p: p.placed_s)
    assert first.cold is cold


def test_an_announcement_before_the_run_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    path = tmp_path / "s.yaml"
    path.write_text(FIXED.replace("ANNOUNCE", "2h"))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    assert (problem.line, problem.path) == (17, "rollouts[0].announce")


# ---------------------------------------------------------------------------------------------
# The protection term in the simulator's placement (scoring.protectWarmPoints, extender.core.scoring)
# ---------------------------------------------------------------------------------------------

PROTECTED = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
policy: policy.yaml
seed: 3
slo: {queueDelay: 10s}
cluster:
  nodes:
    - nodeClass: g5.12xlarge
      count: 2
      warm: [{workload: mixtral-61g, nodes: [0]}]
workloads:
  - name: llama3-8b
    initialReplicas: 0
    minReplicas: 0
    demand:
      synthetic: {duration: 1h, base: 1, arrivals: fluid}
  - name: mixtral-61g
    initialReplicas: 0
    minReplicas: 0
    demand:
      synthetic: {duration: 1h, base: 1, arrivals: fluid}
"""


def _scored(tmp_path: Path, points: int) -> list[int]:
    """Total scores of the two nodes for a llama3-8b pod (workload 0, one GPU) under cache-aware."""
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT + f"scoring: {{protectWarmPoints: {points}}}\n")
    (tmp_path / "s.yaml").write_text(PROTECTED)
    run = Run(prepare(load_scenario(tmp_path / "s.yaml")), STRATEGIES["cache-aware"])
    assert run.policy.scoring.protect_warm_points == points
    feasible, totals, _ = run._scores(0, 0.0)
    assert feasible.tolist() == [True, True]
    return [int(t) for t in totals]


@pytest.mark.parametrize(("points", "charge"), [(1, 1), (3, 3)], ids=["1 point", "3 points"])
def test_the_simulator_scores_with_the_protection_term(tmp_path: Path, points: int, charge: int) -> None:
    # node 0 is warm for mixtral-61g (TP=4) with its 4 GPUs free: a one-GPU pod there takes its only
    # TP=4 slot (4 of 4 GPUs), so it pays the whole charge; node 1 is warm for nothing and pays none
    off = _scored(tmp_path, 0)
    on = _scored(tmp_path, points)
    weight = 2 * 10  # the scenario's extenderWeight (default 2) x kube-scheduler's 10
    assert [a - b for a, b in zip(off, on, strict=True)] == [charge * weight, 0]


# ---------------------------------------------------------------------------------------------
# Process snapshots: the simulator's warmer stages the published ones, as the production warmer does
# ---------------------------------------------------------------------------------------------


#: FIXED without its rollout, on six nodes of which one is warm, and demand that grows.
GROWING = (FIXED.split("rollouts:", maxsplit=1)[0]
           .replace("count: 4\n      warm: [{workload: llama3-8b, fraction: 1}]",
                    "count: 6\n      warm: [{workload: llama3-8b, nodes: [0]}]")
           .replace("{duration: 2h, base: 2, arrivals: fluid}", "{duration: 4h, base: 2, trend: 8, arrivals: fluid}"))


@pytest.mark.parametrize("published", [True, False], ids=["published", "not published"])
def test_the_warmer_stages_published_snapshots_and_replicas_restore_them(tmp_path: Path, published: bool) -> None:
    (tmp_path / "policy.yaml").write_text(_with_snapshot(POLICY_TEXT, published=published))
    (tmp_path / "s.yaml").write_text(GROWING)
    run = Run(prepare(load_scenario(tmp_path / "s.yaml")), STRATEGIES["predictive"])
    restored: list[bool] = []
    place = run._place

    def spy(pod: Pod, node: int, now: float) -> None:
        place(pod, node, now)
        restored.append(bool(run.cluster.state(pod.workload, now, np.array([node], dtype=np.intp)).snapshot[0]))

    run._place = spy  # type: ignore[method-assign]
    run.run()
    held = sum("llama3-8b/main" in r.snapshots for r in run.cluster.records)
    assert (held > 0) is published
    assert any(restored) is published
