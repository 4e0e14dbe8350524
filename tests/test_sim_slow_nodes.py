"""Slow nodes in the simulator's world (``truth.nodes``), and the calibrated belief learning them.

A start on a slow node takes the factor times the world's time (noise 0, by hand); which nodes are
slow (a share of each group, drawn once per node and the same for every strategy); the belief's
factor of a slow node approaching the truth as its starts grow, with the product's own shrinkage,
while its peers stay at 1; the located schema errors; a scenario whose slow nodes are not slower
running exactly as one without them; and the bundled ``slow-nodes`` scenario learning the slow
nodes it started replicas on, with docs/simulator.md's table what the simulator prints.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from extender import cli
from extender.core.calibration import NODE_DEADBAND
from extender.core.errors import DocumentError
from extender.sim.cluster import Cluster, NodeSpec
from extender.sim.report import summarise
from extender.sim.scenario import LoadedScenario, load_scenario
from extender.sim.simulation import Run, prepare, simulate
from extender.sim.strategies import STRATEGIES
from extender.sim.truth import Belief, SlowNodes, Truth, slowness_at_launch, slowness_at_start
from tests.test_doc_tables import _table
from tests.test_sim import SCENARIOS, TINY_SCENARIO, cut, write_tiny

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("rules", "expected"), [
    pytest.param("    - {share: 1, factor: 2}", 120.0, id="every-node-twice-as-slow"),
    pytest.param("    - {nodeClass: box, share: 1, factor: 0.5}", 30.0, id="faster-than-its-peers"),
    pytest.param("    - {share: 1, factor: 2}\n    - {share: 1, factor: 1.5}", 180.0, id="rules-multiply"),
    pytest.param("    - {share: 1, factor: 1}", 60.0, id="factor-one-is-the-world"),
])
def test_a_start_on_a_slow_node_takes_the_factor_times_the_worlds_time(tmp_path: Path, rules: str,
                                                                       expected: float) -> None:
    path = write_tiny(tmp_path)
    path.write_text(TINY_SCENARIO + "truth:\n  nodes:\n" + rules + "\n")
    (run,) = simulate(prepare(load_scenario(path)), ["default"])
    w = run.workloads[0]
    # tests/test_sim.py: the pod placed at 75 s on box-01 takes 60 s by the policy (and the world's phases)
    assert w.placed_s.tolist() == [75.0]
    assert w.startups.tolist() == [expected]
    assert w.believed_s.tolist() == [60.0]  # the default strategy believes the policy


def test_a_share_of_a_group_is_slow_and_the_same_nodes_in_every_run(tmp_path: Path) -> None:
    path = write_tiny(tmp_path)
    path.write_text(TINY_SCENARIO + "truth:\n  nodes:\n    - {nodeClass: box, share: 0.5, factor: 3}\n")
    prepared = prepare(load_scenario(path))
    assert prepared.slow is not None and sorted(prepared.slow.tolist()) == [1.0, 3.0]  # ceil(0.5 x 2) = 1
    (run,) = simulate(prepared, ["default"])
    assert run.workloads[0].startups.tolist() == [60.0 * float(prepared.slow[1])]  # the pod went to box-01
    assert prepare(load_scenario(write_tiny(tmp_path))).slow is None  # no truth.nodes: nothing drawn


@pytest.mark.parametrize(("share", "count", "slow"), [
    pytest.param(0.1, 16, 2, id="ceil-of-1.6"),
    pytest.param(0.25, 24, 6, id="a-quarter"),
    pytest.param(0.3, 10, 3, id="0.3x10-is-not-four"),
    pytest.param(1e-9, 5, 1, id="any-share-slows-one"),
    pytest.param(1.0, 3, 3, id="all"),
    pytest.param(0.5, 0, 0, id="an-empty-group"),
])
def test_ceil_share_x_count_nodes_are_slow_at_start(share: float, count: int, slow: int) -> None:
    truth = Truth(nodes=(SlowNodes(share=share, factor=2.0),))
    f = slowness_at_start(truth, "box", count, [7, 1])
    assert int((f == 2.0).sum()) == slow and int((f == 1.0).sum()) == count - slow
    assert np.array_equal(f, slowness_at_start(truth, "box", count, [7, 1]))  # seeded
    other = Truth(nodes=(SlowNodes.model_validate({"nodeClass": "other", "share": share, "factor": 2.0}),))
    assert (slowness_at_start(other, "box", count, [7, 1]) == 1.0).all()  # another class's rule


def test_a_launched_node_is_slow_with_the_shares_chance() -> None:
    truth = Truth(nodes=(SlowNodes(share=0.25, factor=2.0),))
    draws = [slowness_at_launch(truth, "box", [7, n]) for n in range(2000)]
    assert set(draws) == {1.0, 2.0}
    assert 0.22 < draws.count(2.0) / len(draws) < 0.28


def _belief_after(tmp_path: Path, slow_starts: int, factor: float) -> Belief:
    """A calibrated belief that saw ``slow_starts`` starts on node ``slow``, ``factor`` times the
    policy's, and as many on each of four peers at the policy's time, in turns (at most 40 each: the
    window keeps 200 starts of a pair)."""
    loaded = load_scenario(write_tiny(tmp_path))
    policy = loaded.policy
    cluster = Cluster.build(policy, [policy.profile("svc")], [NodeSpec("box-00", "box")])
    belief = Belief(policy, ("svc",), cluster.classes, calibrate=True, learn_nodes=True)
    state = cluster.state(0, 0.0, np.array([0], dtype=np.intp))
    seconds = belief.estimate(0, 0, state)
    t = 0.0
    for _ in range(slow_starts):
        for node, f in [("slow", factor), *((f"peer-{j}", 1.0) for j in range(4))]:
            belief.observe(0, 0, state, t, t + seconds * f, node=node)
            t += 1.0
    assert len(belief.observations) <= belief.base.calibration.window
    assert belief.refresh(t)
    return belief


@pytest.mark.parametrize("starts", [
    pytest.param(1, id="one-start"),
    pytest.param(3, id="as-many-as-the-prior"),
    pytest.param(10, id="ten"),
    pytest.param(40, id="forty"),
])
def test_the_calibrated_belief_learns_a_slow_node_with_the_products_shrinkage(tmp_path: Path, starts: int) -> None:
    factor = 1.6
    belief = _belief_after(tmp_path, starts, factor)
    k = belief.base.calibration.prior_observations
    # extender.core.calibration.fit_nodes: r = exp(n / (n + k) x ln f - d), peers exactly 1 (no noise)
    assert belief.nodes.factor("slow") == pytest.approx(math.exp(starts / (starts + k) * math.log(factor)
                                                                 - NODE_DEADBAND))
    assert [belief.nodes.factor(f"peer-{j}") for j in range(4)] == [1.0] * 4


def test_the_slow_nodes_factor_approaches_the_truth_as_its_starts_grow(tmp_path: Path) -> None:
    off = [abs(math.log(_belief_after(tmp_path, n, 1.6).nodes.factor("slow") / 1.6)) for n in (1, 3, 10, 20, 40)]
    assert off == sorted(off, reverse=True) and off[0] > 0.3 and off[-1] < 0.05, off


def test_a_belief_that_is_not_calibrated_learns_no_node(tmp_path: Path) -> None:
    loaded = load_scenario(write_tiny(tmp_path))
    cluster = Cluster.build(loaded.policy, [loaded.policy.profile("svc")], [NodeSpec("box-00", "box")])
    belief = Belief(loaded.policy, ("svc",), cluster.classes, calibrate=False, learn_nodes=True)
    state = cluster.state(0, 0.0, np.array([0], dtype=np.intp))
    belief.observe(0, 0, state, 0.0, 500.0, node="slow")
    assert not belief.refresh(1000.0) and not belief.nodes


@pytest.mark.parametrize(("rules", "path", "words"), [
    pytest.param("{share: 0, factor: 2}", "truth.nodes[0].share", "must be > 0", id="share-zero"),
    pytest.param("{share: 1.5, factor: 2}", "truth.nodes[0].share", "must be <= 1", id="share-above-one"),
    pytest.param("{share: .nan, factor: 2}", "truth.nodes[0].share", "expected a finite number, got nan",
                 id="share-nan"),
    pytest.param("{share: 0.5, factor: 0}", "truth.nodes[0].factor", "must be > 0", id="factor-zero"),
    pytest.param("{share: 0.5, factor: -2}", "truth.nodes[0].factor", "must be > 0", id="factor-negative"),
    pytest.param("{share: 0.5, factor: 1e9}", "truth.nodes[0].factor", "must be <= 1000", id="factor-too-large"),
    pytest.param("{share: 0.5}", "truth.nodes[0].factor", "", id="factor-missing"),
    pytest.param("{nodeClass: p4d, share: 0.5, factor: 2}", "truth.nodes[0].nodeClass", "no node class 'p4d'",
                 id="unknown-class"),
    pytest.param("{share: 0.5, factor: 2, node: box-00}", "truth.nodes[0].node", "", id="unknown-key"),
])
def test_slow_node_errors_are_located(tmp_path: Path, rules: str, path: str, words: str) -> None:
    scenario = write_tiny(tmp_path)
    scenario.write_text(TINY_SCENARIO + "truth:\n  nodes:\n    - " + rules + "\n")
    with pytest.raises(DocumentError) as info:
        load_scenario(scenario)
    (problem,) = info.value.problems
    assert problem.path == path and words in problem.message, problem
    assert problem.line is not None and problem.line > TINY_SCENARIO.count("\n")


def test_a_class_of_the_policy_with_no_node_group_is_refused_where_it_is_named(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path)
    (tmp_path / "policy.yaml").write_text((tmp_path / "policy.yaml").read_text().replace(
        "profiles:", "  - name: crate\n    matchLabels: {kind: crate}\n    gpu: {product: test-gpu, count: 1}\n"
        "    nvme: {capacity: 0}\n    network: {nic: 800Mbps, objectStorePerStream: 80Mbps, imagePull: 80Mbps}\n"
        "profiles:"))
    scenario.write_text(TINY_SCENARIO + "truth:\n  nodes:\n    - {nodeClass: crate, share: 0.5, factor: 2}\n")
    with pytest.raises(DocumentError) as info:
        load_scenario(scenario)
    (problem,) = info.value.problems
    assert problem.path == "truth.nodes[0].nodeClass"
    assert "no node group of cluster.nodes has class 'crate' (the groups' classes: box)" in problem.message


def test_slow_nodes_that_are_not_slower_change_no_run() -> None:
    """With nothing to learn (factor 1, no noise) the calibrated strategies learn factors of exactly 1
    and every figure is the run's without ``truth.nodes``: what learning costs a fleet without slow nodes."""
    loaded = cut(load_scenario(SCENARIOS / "mixed-fleet.yaml"), 4 * 3600.0)
    truth = Truth(nodes=(SlowNodes(share=0.5, factor=1.0),))
    same = LoadedScenario(loaded.scenario.model_copy(update={"truth": truth}), loaded.policy, loaded.source,
                          loaded.base_dir)
    names = ["cache-aware-calibrated", "predictive-calibrated"]
    for a, b in zip(simulate(prepare(loaded), names), simulate(prepare(same), names), strict=True):
        assert summarise(a.workloads, 10.0) == summarise(b.workloads, 10.0)
        for x, y in zip(a.workloads, b.workloads, strict=True):
            assert np.array_equal(x.startups, y.startups) and np.array_equal(x.believed_s, y.believed_s)


def test_the_bundled_scenario_learns_the_slow_nodes_it_started_replicas_on() -> None:
    prepared = prepare(cut(load_scenario(SCENARIOS / "slow-nodes.yaml"), 12 * 3600.0))
    assert prepared.slow is not None and int((prepared.slow == 2.0).sum()) == 6  # a quarter of 24
    plain = Run(prepared, STRATEGIES["cache-aware"])
    plain.run()
    assert not plain.belief.nodes  # not calibrated: every node of a class alike
    run = Run(prepared, STRATEGIES["cache-aware-calibrated"])
    run.run()
    learnt = run.belief.nodes.nodes
    slow = {n: f for n, f in learnt.items() if prepared.slow[run.cluster.index[n]] == 2.0}
    peers = {n: f for n, f in learnt.items() if n not in slow}
    assert any(f.starts >= 3 for f in slow.values()), learnt  # it started replicas on slow nodes
    for f in slow.values():  # each toward 2 by its starts' weight, the noise (5 %) aside
        assert f.factor > math.exp(f.confidence * math.log(2.0) - 0.1), f
    assert len(peers) > 5 and all(0.95 < f.factor < 1.05 for f in peers.values()), peers


def test_the_docs_show_what_the_slow_nodes_scenario_prints(capsys: pytest.CaptureFixture[str]) -> None:
    shown = _table((ROOT / "docs" / "simulator.md").read_text(), "slow-nodes")
    assert cli.main(["simulate", str(SCENARIOS / "slow-nodes.yaml")]) == 0
    assert _table(capsys.readouterr().out, "slow-nodes") == shown


def test_a_node_a_pool_launches_draws_its_own_slowness_and_is_learnt_under_a_name_of_its_own() -> None:
    loaded = load_scenario(SCENARIOS / "consolidation.yaml")
    truth = Truth(nodes=(SlowNodes.model_validate({"nodeClass": "g5.12xlarge", "share": 1.0, "factor": 2.0}),))
    prepared = prepare(LoadedScenario(loaded.scenario.model_copy(update={"truth": truth}), loaded.policy,
                                      loaded.source, loaded.base_dir))
    run = Run(prepared, STRATEGIES["predictive-calibrated"])
    result = run.run()
    assert run.slow is not None and result.nodes_launched > 0
    classes = [run.cluster.classes[int(i)].name for i in run.cluster.class_index]
    launched = np.flatnonzero(run.launches > 0)
    # share 1: every g5.12xlarge launched is slow; the rule never touches the other class's slots
    assert all(run.slow[i] == 2.0 for i in launched if classes[i] == "g5.12xlarge"), run.slow
    assert all(run.slow[i] == 1.0 for i, c in enumerate(classes) if c != "g5.12xlarge")
    # a launched machine's starts are learnt under <slot name>~<launches>, not the slot's earlier machine's
    assert any("~" in n for n in run.belief.nodes.nodes), sorted(run.belief.nodes.nodes)
    first = int(launched[0])
    assert run.node_name(first) == f"{run.cluster.records[first].name}~{run.launches[first]}"
