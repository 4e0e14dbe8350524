"""The warmer's planning snapshot, made incrementally (``Cluster.planning_snapshot``), equals the one
made from scratch (``Cluster.full_planning_snapshot``) at every plan of a run, cache states included."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from extender.core.estimate import CacheState, ClassTable
from extender.core.inventory import InventorySnapshot
from extender.core.policy import Policy
from extender.sim.cluster import Cluster
from extender.sim.scenario import load_scenario
from extender.sim.simulation import Run, prepare
from extender.sim.strategies import STRATEGIES
from tests.test_sim_world import FIXED, POLICY_TEXT, POOLED

BENCH_LIKE = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
policy: policy.yaml
seed: 5
slo: {queueDelay: 10s}
cluster:
  compileRegistry: REGISTRY
  nodes:
    - {nodeClass: g5.12xlarge, count: 6, warm: [{workload: llama3-8b, fraction: 0.2}]}
    - {nodeClass: g5.48xlarge, count: 3, warm: [{workload: llama3-8b, fraction: 0.2}]}
    - {nodeClass: g5.xlarge, count: 6, warm: [{workload: llama3-8b, fraction: 0.2}]}
workloads:
  - name: llama3-8b
    maxReplicas: 40
    demand:
      synthetic: {duration: 3h, base: 25, daily: {amplitude: 0.6, peak: 2h}, noise: 0.1,
                  bursts: {perDay: 24, amplitude: 1.0, duration: 10m}}
"""


class Case(NamedTuple):
    name: str
    scenario: str
    strategy: str
    warms: bool  # the run starts warm actions (so the snapshots change under the planner)


CASES = [
    Case("fixed fleet, warm-only", BENCH_LIKE.replace("REGISTRY", "false"), "warm-only", True),
    Case("fixed fleet, predictive, compile registry", BENCH_LIKE.replace("REGISTRY", "true"), "predictive", True),
    Case("autoscaled pool: nodes join and leave", POOLED, "predictive", False),
    Case("announced rollout: staged plans and a new profile", FIXED.replace("ANNOUNCE", "30m"), "predictive", True),
    Case("rollout on a busy fleet: rows patched with the new profile",
         BENCH_LIKE.replace("REGISTRY", "false")
         + "rollouts:\n  - {workload: llama3-8b, at: 1h, weightsVersion: v2, announce: 20m, maxSurge: 4}\n",
         "warm-only", True),
    Case("calibrated belief: the planner's policy changes", BENCH_LIKE.replace("REGISTRY", "false"),
         "predictive-calibrated", True),
]


def assert_same_snapshot(got: InventorySnapshot, want: InventorySnapshot, policy: Policy | None) -> None:
    """Same records, columns and, for the planner's ``policy``, cache states (without one, the
    caller's profiles may differ from any policy's, and asking for others would memoise them)."""
    assert got.nodes == want.nodes
    assert got.positions == want.positions and got.registry == want.registry and got.classes == want.classes
    for column in ("class_index", "heartbeat", "ttl", "gpus_free", "nvme_free", "pulling_bytes"):
        assert np.array_equal(getattr(got, column), getattr(want, column)), column
    for profile in policy.profiles if policy is not None else ():
        (gs, gt), (ws, wt) = got.cache_state(profile), want.cache_state(profile)
        for f in fields(CacheState):
            assert np.array_equal(getattr(gs, f.name), getattr(ws, f.name)), (profile.name, f.name)
        for f in fields(ClassTable):
            assert np.array_equal(getattr(gt, f.name), getattr(wt, f.name)), (profile.name, f.name)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_incremental_planning_snapshot_equals_the_full_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Case) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    (tmp_path / "s.yaml").write_text(case.scenario)
    run = Run(prepare(load_scenario(tmp_path / "s.yaml")), STRATEGIES[case.strategy])
    incremental = Cluster.planning_snapshot
    seen: list[int] = []

    def checked(self: Cluster, now: float, policy: Policy | None = None) -> InventorySnapshot:
        got = incremental(self, now, policy)
        assert_same_snapshot(got, self.full_planning_snapshot(now), policy)
        seen.append(len(got.nodes))
        return got

    monkeypatch.setattr(Cluster, "planning_snapshot", checked)
    run.run()
    assert len(seen) >= 3, "the run planned too rarely to test anything"
    assert (run.warm_actions > 0) is case.warms
