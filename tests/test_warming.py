"""The cache-warming planner: named plans worked out by hand, a slow best-K oracle, and properties.

Every hand-worked case uses one node class and the profiles below, with round numbers::

    class gpu: 8 GPUs, NVMe 1000 GB (reserve 100 GB) read at 20 GB/s, NIC 100 Gbps = 12.5 GB/s,
               8 Gbps = 1 GB/s per object-store stream, image pulls at 100 MB/s
    llm:       TP 8 (one replica per node), image 10 GB, weights 100 GB in 10 files, compile
               100 s cold / 10 s warm, 1 GB of artifacts, graph 10 s, init 20 s

    image     10 GB / 100 MB/s                                    = 100 s
    weights   remote 100 GB / min(12.5, 10 x 1) GB/s               =  10 s
              local  100 GB / max(20, 10) GB/s                     =   5 s   (staging saves 5 s)
    compile   cold 100 s; in the registry 1 GB / min(12.5, 1) GB/s + 10 = 11 s; local 10 s (saves 1 s)
    cold node, key in the registry: 100 + 10 + 11 + 10 + 20        = 151 s
    same with the image:                                                51 s

``snapw`` is ``llm`` with a 40 GB snapshot (restore 5 s) and no compile key:
    no snapshot, image on the node: 0 + 10 + 100 + 10 + 20 = 140 s
    snapshot on the node:           0 + 40 GB / 20 GB/s + 5 =   7 s   (saves 133 s; fetch 40 GB / 10 GB/s = 4 s)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from extender.core.cachekey import CompileKeyInputs, compile_cache_key
from extender.core.caches import cache_id
from extender.core.calibration import NodeFactor, NodeFactors
from extender.core.errors import UnknownNameError
from extender.core.estimate import CompileCache, estimate
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.placement import next_replica
from extender.core.policy import Policy, Warming, parse_policy
from extender.core.scaler import DecisionInputs, decide, horizon
from extender.core.warming import (
    MAX_EVICTIONS,
    Action,
    Eviction,
    Expectation,
    Plan,
    apply,
    best_k_sum,
    best_k_sums_after,
    look_ahead,
    look_ahead_s,
    plan,
    standby_replicas,
)
from tests.gpu_policy import GPU_LLM_POLICY, KEY_INPUTS, LLM_IMAGE

NOW = 1_000_000.0
GB = 10**9
POLICY = GPU_LLM_POLICY + """\
  - name: snapw
    match: {labels: {app: snapw}}
    image: {reference: "example.com/snapw:1", size: 10GB}
    weights: {source: "s3://m/snapw/", version: v1, bytes: 100GB, shardFiles: 10, loaderConcurrency: 10}
    parallelism: {tensor: 8}
    compile: {cold: 100s, warm: 10s, artifactBytes: 1GB}
    graphCapture: 10s
    engineInit: 20s
    snapshot: {bytes: 40GB, restore: 5s}
"""
BASE = parse_policy(POLICY)
SNAPW_IMAGE = "example.com/snapw:1"


def with_warming(**knobs: Any) -> Policy:
    """The test policy with these warming knobs (camelCase, as in a policy file)."""
    return BASE.model_copy(update={"warming": Warming.model_validate(knobs)})


def llm_key() -> str:
    """llm's compile-cache key on class gpu, as the inventory computes it."""
    snap = InventorySnapshot.build(BASE, [node("probe", compile=True)])
    return snap.nodes[0].compile_keys[0]


def node(name: str, *, image: bool = False, llm_weights: int = 0, compile: bool = False, gpus_free: int = 8,
         nvme_free: int = 900 * GB, **fields: Any) -> NodeState:
    """A fresh gpu node with llm's caches as asked; ``fields`` are further NodeState fields (camelCase,
    ``weights`` adds to llm's)."""
    doc: dict[str, Any] = {
        "name": name, "labels": {"pool": "gpu"}, "gpus": 8, "gpusFree": gpus_free, "nvmeTotal": 1000 * GB,
        "nvmeFree": nvme_free, "heartbeat": NOW - 1,
        "images": [LLM_IMAGE] if image else [],
        "weights": {"llm/v1": llm_weights} if llm_weights else {},
        "compileKeys": [compile_cache_key(CompileKeyInputs.model_validate(KEY_INPUTS), gpu_product="TEST-GPU",
                                          tensor_parallel=8, pipeline_parallel=1)] if compile else [],
    }
    extra_weights = fields.pop("weights", None)
    doc.update(fields)
    if extra_weights:
        doc["weights"] = {**doc["weights"], **extra_weights}
    return NodeState.model_validate(doc)


def run(policy: Policy, nodes: Sequence[NodeState], expectations: Sequence[Expectation] = (), *,
        registry: bool = True, in_flight: Sequence[Action] = (),
        published: Sequence[tuple[str, str]] = ()) -> Plan:
    """The plan; checked against the one made without outlooks (the simulator's), which must hold
    the same actions, skips and cluster-full flag."""
    snap = InventorySnapshot.build(policy, nodes, registry=[llm_key()] if registry else [])
    got = plan(policy, snap, expectations, now=NOW, in_flight=in_flight, published_snapshots=published)
    fresh = InventorySnapshot.build(policy, nodes, registry=[llm_key()] if registry else [])
    bare = plan(policy, fresh, expectations, now=NOW, in_flight=in_flight, published_snapshots=published,
                outlooks=False)
    assert bare == got.model_copy(update={"outlooks": ()})
    return got


def expect(workload: str = "llm", replicas: int = 1, within_s: float = 600.0) -> Expectation:
    return Expectation(workload=workload, replicas=replicas, within_s=within_s)


def busy(node_name: str, n: int = 1, nvme: int = 0) -> list[Action]:
    """``n`` in-flight actions of an unrelated workload on a node."""
    return [Action(node=node_name, workload="other", kind="weights", cache=f"weights:other/v{i}", bytes=nvme,
                   nvme_bytes=nvme, duration_s=1.0, deadline=None, saved_s=1.0, purpose="demand")
            for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Named plans, worked out by hand
# ---------------------------------------------------------------------------------------------

#: (node, workload, kind, purpose, saved seconds, evicted cache ids)
Act = tuple[str, str, str, str, float, tuple[str, ...]]
#: (node, workload, kind, reason, saved seconds)
Skp = tuple[str, str, str, str, float]


class Case(NamedTuple):
    name: str
    policy: Policy
    nodes: list[NodeState]
    expectations: list[Expectation]
    actions: list[Act]
    skipped: list[Skp]
    in_flight: list[Action] = []
    published: list[tuple[str, str]] = []
    registry: bool = True
    cluster_full: bool = False


CAP1 = with_warming(maxConcurrentPerNode=1, maxConcurrent=4)
OLD = NOW - 10_000  # long idle: evictable under the default 600 s

CASES = [
    Case(
        "cold-cluster",
        CAP1, [node("c"), node("b"), node("a")], [expect(replicas=2)],
        # 1: all at 151 s, F = 302; an image on any node takes it to 51: F = 202, gain 100 -> a (name)
        # 2: F = 51 + 151; image on b or c: F = 102, gain 100 -> b; a is busy (1 per node)
        # 3: an image on c no longer helps (51 + 51 already); a's and b's next steps wait for their node
        [("a", "llm", "image", "demand", 100.0, ()), ("b", "llm", "image", "demand", 100.0, ())],
        [("a", "llm", "weights", "node-concurrency", 5.0), ("b", "llm", "weights", "node-concurrency", 5.0),
         ("a", "llm", "compile", "node-concurrency", 1.0), ("b", "llm", "compile", "node-concurrency", 1.0)],
    ),
    Case(
        "partially-warm",
        CAP1, [node("a"), node("b", image=True), node("c")], [expect()],
        # b is at 51 s, the others at 151: an image elsewhere only ties b (gain 0); b's weights save 5
        [("b", "llm", "weights", "demand", 5.0, ())],
        [("b", "llm", "compile", "node-concurrency", 1.0)],
    ),
    Case(
        "prefers-free-gpus",
        CAP1, [node("a", gpus_free=0), node("b", gpus_free=4), node("c")], [expect()],
        # a has no GPU free and b only 4 of the 8 a replica needs: only c can take it
        [("c", "llm", "image", "demand", 100.0, ())],
        [("c", "llm", "weights", "node-concurrency", 5.0), ("c", "llm", "compile", "node-concurrency", 1.0)],
    ),
    Case(
        "no-gpu-report-means-the-class-gpus",
        CAP1, [node("a", gpus=0, gpus_free=0)], [expect()],
        # no cluster sync for this record: its class's 8 GPUs are assumed, or nothing would ever warm
        [("a", "llm", "image", "demand", 100.0, ())],
        [("a", "llm", "weights", "node-concurrency", 5.0), ("a", "llm", "compile", "node-concurrency", 1.0)],
    ),
    Case(
        "stale-node-is-not-planned",
        CAP1, [node("a", heartbeat=NOW - 3600), node("b")], [expect()],
        [("b", "llm", "image", "demand", 100.0, ())],
        [("b", "llm", "weights", "node-concurrency", 5.0), ("b", "llm", "compile", "node-concurrency", 1.0)],
    ),
    Case(
        "nvme-full-evicts-lru",
        with_warming(maxConcurrentPerNode=2),
        [node("a", image=True, nvme_free=100 * GB,  # exactly the reserve: no room at all
              weights={"old/v0": 60 * GB, "older/v0": 50 * GB, "busy/v1": 200 * GB, "recent/v0": 100 * GB,
                       "llm/v0": 90 * GB},
              lastUsed={"weights:old/v0": OLD, "weights:older/v0": OLD - 10_000,
                        "weights:busy/v1": OLD - 20_000, "weights:recent/v0": NOW - 60},
              inUse=["weights:busy/v1"])],
        [expect()],
        # weights need 100 GB: oldest first, skipping busy (in use), recent (used 60 s ago) and llm/v0
        # (no last-use time: unknown use is kept): older 50 + old 60 = 110 GB. Compile's 1 GB fits in
        # the 10 GB left over.
        [("a", "llm", "weights", "demand", 5.0, ("weights:older/v0", "weights:old/v0")),
         ("a", "llm", "compile", "demand", 1.0, ())],
        [],
    ),
    Case(
        "pod-uses-the-only-evictable-cache",
        CAP1,
        [node("a", image=True, nvme_free=100 * GB, weights={"other/v1": 500 * GB},
              lastUsed={"weights:other/v1": OLD}, podWorkloads=["other"])],
        [expect()],
        [],
        [("a", "llm", "weights", "nvme", 5.0), ("a", "llm", "compile", "nvme", 1.0)],
    ),
    Case(
        "in-use-cache-is-never-evicted",
        CAP1,
        [node("a", image=True, nvme_free=100 * GB, weights={"other/v1": 500 * GB},
              lastUsed={"weights:other/v1": OLD}, inUse=["weights:other/v1"])],
        [expect()],
        [],
        [("a", "llm", "weights", "nvme", 5.0), ("a", "llm", "compile", "nvme", 1.0)],
    ),
    Case(
        "cluster-concurrency-reached",
        CAP1, [node("a"), node("b")], [expect()],
        [], [],
        in_flight=[*busy("x", 2), *busy("y", 2)],  # 4 in flight elsewhere = maxConcurrent
        cluster_full=True,
    ),
    Case(
        "node-concurrency-reached",
        CAP1, [node("a"), node("b"), node("c")], [expect()],
        # a already runs an action: its image is ruled out and the tie goes to b
        [("b", "llm", "image", "demand", 100.0, ())],
        [("a", "llm", "image", "node-concurrency", 100.0), ("b", "llm", "weights", "node-concurrency", 5.0),
         ("b", "llm", "compile", "node-concurrency", 1.0)],
        in_flight=busy("a"),
    ),
    Case(
        "deadline-too-short",
        CAP1, [node("a"), node("b"), node("c")], [expect(within_s=50.0)],
        # pulls take 100 s > 50 s; weights take 10 s and still save 5 s on a (the tie-break pick)
        [("a", "llm", "weights", "demand", 5.0, ())],
        [("a", "llm", "image", "deadline", 100.0), ("b", "llm", "image", "deadline", 100.0),
         ("c", "llm", "image", "deadline", 100.0), ("a", "llm", "compile", "node-concurrency", 1.0)],
    ),
    Case(
        "byte-budget",
        with_warming(maxConcurrentPerNode=3, bytesPerTick="50GB"),
        [node("a")], [expect()],
        # image 10 GB fits (40 GB left); weights 100 GB do not; compile 1 GB does
        [("a", "llm", "image", "demand", 100.0, ()), ("a", "llm", "compile", "demand", 1.0, ())],
        [("a", "llm", "weights", "byte-budget", 5.0)],
    ),
    Case(
        "keep-warm-on-a-new-node",
        with_warming(keepWarm=["llm"], maxConcurrentPerNode=2),
        [node("old", image=True, llm_weights=100 * GB, compile=True), node("new", gpus_free=0)],
        [],
        # no demand; the new node is at 151 s: image saves 100, weights 5, compile 1 (cap 2 per node)
        [("new", "llm", "image", "keep-warm", 100.0, ()), ("new", "llm", "weights", "keep-warm", 5.0, ())],
        [("new", "llm", "compile", "node-concurrency", 1.0)],
    ),
    Case(
        "keep-warm-never-evicts",
        with_warming(keepWarm=["llm"], maxConcurrentPerNode=2),
        [node("new", image=True, nvme_free=100 * GB, weights={"other/v1": 500 * GB},
              lastUsed={"weights:other/v1": OLD})],
        [],
        [],
        [("new", "llm", "weights", "nvme", 5.0), ("new", "llm", "compile", "nvme", 1.0)],
    ),
    Case(
        "published-snapshot",
        CAP1, [node("a", images=[SNAPW_IMAGE])], [expect("snapw")],
        # 140 s -> 7 s with the snapshot; after it, weights no longer change the minimum
        [("a", "snapw", "snapshot", "demand", 133.0, ())],
        [],
        published=[("snapw", "gpu")],
    ),
    Case(
        "unpublished-snapshot",
        CAP1, [node("a", images=[SNAPW_IMAGE])], [expect("snapw")],
        [("a", "snapw", "weights", "demand", 5.0, ())],
        [],
    ),
    Case(
        "nothing-in-the-registry",
        with_warming(maxConcurrentPerNode=3), [node("a", image=True)], [expect()],
        # the compile key is not published: nothing to fetch (compiling needs the GPUs)
        [("a", "llm", "weights", "demand", 5.0, ())],
        [],
        registry=False,
    ),
    Case("no-nodes", CAP1, [], [expect()], [], []),
    Case("zero-replicas", CAP1, [node("a")], [expect(replicas=0)], [], []),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_named_plans(case: Case) -> None:
    got = run(case.policy, case.nodes, case.expectations, registry=case.registry, in_flight=case.in_flight,
              published=case.published)
    actions = [(a.node, a.workload, a.kind, a.purpose, round(a.saved_s, 6), tuple(e.cache for e in a.evictions))
               for a in got.actions]
    skipped = [(s.node, s.workload, s.kind, s.reason, round(s.saved_s, 6)) for s in got.skipped]
    assert actions == case.actions
    assert skipped == case.skipped
    assert got.cluster_full == case.cluster_full


def small_old_weights(n: int, size: int = GB) -> dict[str, Any]:
    """``n`` idle weights of retired workloads (NodeState fields), ``size`` bytes each: evictable (the
    class reserves 100 GB, so with 100 GB free the 100 GB of llm's weights need 100 of 1 GB)."""
    return {"weights": {f"gone{i:03d}/v0": size for i in range(n)},
            "lastUsed": {f"weights:gone{i:03d}/v0": OLD for i in range(n)}}


class Capped(NamedTuple):
    id: str
    policy: Policy
    nodes: list[NodeState]
    other_jobs: list[str]  # nodes of other warm Jobs running (compile publishes)
    actions: list[tuple[str, str, int]]  # (node, kind, evictions)
    reasons: list[str]  # of the skips
    cluster_full: bool = False


CAPPED = [
    Capped("a publish on the node takes its only slot", CAP1, [node("a", image=True)], ["a"], [],
           ["node-concurrency", "node-concurrency"]),
    Capped("a publish elsewhere leaves the node its slot", CAP1, [node("a", image=True)], ["b"],
           [("a", "weights", 0)], ["node-concurrency"]),
    Capped("publishes fill the cluster", with_warming(maxConcurrent=2), [node("a", image=True)], ["b", "c"], [], [],
           cluster_full=True),
    Capped("room made by as many evictions as one action may make", CAP1,
           [node("a", image=True, nvme_free=100 * GB, **small_old_weights(MAX_EVICTIONS))], [],
           [("a", "weights", MAX_EVICTIONS)], ["node-concurrency"]),
    Capped("room that needs more evictions than one action may make", CAP1,
           [node("a", image=True, nvme_free=100 * GB, **small_old_weights(MAX_EVICTIONS + 150, GB // 2))], [],
           [("a", "compile", 2)], ["nvme"]),  # the weights would need 200; the 1 GB compile cache fits
]


@pytest.mark.parametrize("case", CAPPED, ids=[c.id for c in CAPPED])
def test_other_jobs_and_the_eviction_cap_bound_the_plan(case: Capped) -> None:
    snap = InventorySnapshot.build(case.policy, case.nodes, registry=[llm_key()])
    got = plan(case.policy, snap, [expect()], now=NOW, other_jobs=case.other_jobs)
    assert [(a.node, a.kind, len(a.evictions)) for a in got.actions] == case.actions
    assert [s.reason for s in got.skipped] == case.reasons
    assert got.cluster_full == case.cluster_full


def test_an_action_spelled_out() -> None:
    got = run(CAP1, [node("a", image=True, pullingBytes=25 * GB)], [expect(within_s=300.0)])
    assert got.actions == (
        Action(node="a", workload="llm", kind="weights", cache="weights:llm/v1", bytes=100 * GB, nvme_bytes=100 * GB,
               # 25 GB already pulling onto a at 12.5 GB/s (2 s) + 100 GB at 10 GB/s (10 s)
               duration_s=12.0, deadline=NOW + 300.0, saved_s=5.0, purpose="demand"),
    )
    assert [(s.kind, s.reason) for s in got.skipped] == [("compile", "node-concurrency")]
    (outlook,) = got.outlooks
    # image on a, 25 GB queued (2 s, paid because the pod still downloads): 2 + 51 = 53 s -> 48 s
    assert (outlook.placeable, outlook.before_s, outlook.after_s, outlook.nodes) == (1, 53.0, 48.0, ("a",))


def test_eviction_record() -> None:
    got = run(CAP1, [node("a", image=True, nvme_free=100 * GB, weights={"x/v0": 300 * GB},
                          lastUsed={"weights:x/v0": OLD})], [expect()])
    assert got.actions[0].evictions == (Eviction(node="a", cache="weights:x/v0", bytes=300 * GB, last_used=OLD),)


def test_eviction_respects_the_idle_knob() -> None:
    nodes = [node("a", image=True, nvme_free=100 * GB, weights={"x/v0": 300 * GB}, lastUsed={"weights:x/v0": OLD})]
    assert run(with_warming(evictAfterIdle="1d"), nodes, [expect()]).actions == ()
    assert run(with_warming(evictAfterIdle="0s"), nodes, [expect()]).actions != ()


def test_compile_and_snapshot_sizes_come_from_the_record_or_the_policy() -> None:
    # an old compile key (not llm's current one) with its size in the record, and snapw's snapshot
    # whose size comes from the policy (40 GB)
    nodes = [node("a", image=True, nvme_free=100 * GB, compileKeys=["ck1-old"], snapshots=["snapw/v1"],
                  cacheBytes={"compile:ck1-old": 70 * GB},
                  lastUsed={"compile:ck1-old": OLD, "snapshot:snapw/v1": OLD - 1})]
    got = run(CAP1, nodes, [expect()])
    # need 100 GB: snapshot 40 GB (older) then compile 70 GB
    assert [(e.cache, e.bytes) for e in got.actions[0].evictions] == [
        ("snapshot:snapw/v1", 40 * GB), ("compile:ck1-old", 70 * GB)]


def test_expected_workloads_caches_are_never_evicted() -> None:
    # snapw is expected too: its snapshot is protected even though it is old and idle
    nodes = [node("a", images=[LLM_IMAGE, SNAPW_IMAGE], nvme_free=100 * GB, snapshots=["snapw/v1"],
                  lastUsed={"snapshot:snapw/v1": OLD})]
    got = run(CAP1, nodes, [expect(), expect("snapw")])
    assert all(e.cache != "snapshot:snapw/v1" for a in got.actions for e in a.evictions)
    assert [(s.workload, s.kind, s.reason) for s in got.skipped] == [("llm", "weights", "nvme"),
                                                                     ("llm", "compile", "nvme")]


def factors_of(**by_node: float) -> NodeFactors:
    """Per-node factors as a calibration would give them (the statistics do not matter to the plan)."""
    return NodeFactors({n: NodeFactor(node=n, factor=f, starts=10, confidence=0.9, lower=0.5, upper=2.0)
                        for n, f in by_node.items()})


class Speed(NamedTuple):
    id: str
    factors: dict[str, float]
    picked: str  # the node of the one action (one replica, one action in the cluster)


SPEEDS = [
    Speed("no factors: the name tie-break", {}, "a"),
    Speed("slow node a: its peer b", {"a": 1.3}, "b"),
    Speed("slightly slow node a: its peer b", {"a": 1.011}, "b"),
    Speed("factor 1 listed: as none", {"a": 1.0}, "a"),
    Speed("fast node b: b", {"b": 0.8}, "b"),
    Speed("both slow, a more: b", {"a": 1.5, "b": 1.2}, "b"),
    Speed("a factor of a node not in the snapshot: the name tie-break", {"gone": 2.0}, "a"),
]


@pytest.mark.parametrize("case", SPEEDS, ids=[c.id for c in SPEEDS])
def test_the_plan_prepares_the_node_the_extender_will_pick(case: Speed) -> None:
    """Two cold peers, one replica expected and one action allowed: the warmer prepares the node
    the extender scores best (its estimate times its per-node factor), as next_replica places it."""
    policy = with_warming(maxConcurrentPerNode=1, maxConcurrent=1)
    nodes = [node("a"), node("b")]
    registry = [llm_key()]
    snap = InventorySnapshot.build(policy, nodes, registry=registry)
    nodes_factors = factors_of(**case.factors)
    got = plan(policy, snap, [expect()], now=NOW, nodes=nodes_factors)
    assert [a.node for a in got.actions] == [case.picked]
    (outlook,) = got.outlooks
    assert outlook.nodes == (case.picked,)
    placed = next_replica(policy, policy.profile("llm"), InventorySnapshot.build(policy, nodes, registry=registry),
                          NOW, nodes=nodes_factors)
    assert placed.node == case.picked  # where the scaler expects the next replica
    # the extender's seconds: the outlook's startup is the picked node's estimate times its factor
    cold = run(policy, nodes, [expect()], registry=True).outlooks[0].before_s
    assert cold is not None and outlook.before_s == pytest.approx(
        min(cold * nodes_factors.factor(n) for n in ("a", "b")))


def test_in_flight_caches_count_as_present() -> None:
    staging = Action(node="a", workload="llm", kind="image", cache=f"image:{LLM_IMAGE}", bytes=10 * GB,
                     nvme_bytes=0, duration_s=100.0, deadline=None, saved_s=100.0, purpose="demand")
    got = run(with_warming(maxConcurrentPerNode=2), [node("a"), node("b")], [expect()], in_flight=[staging])
    # a counts as 51 s already (its image is not planned again, and b's image would only tie it);
    # a has one slot left: weights (5 s) before compile (1 s)
    assert [(a.node, a.kind, a.saved_s) for a in got.actions] == [("a", "weights", 5.0)]
    assert [(s.node, s.kind, s.reason) for s in got.skipped] == [("a", "compile", "node-concurrency")]
    assert [(o.before_s, o.after_s) for o in got.outlooks] == [(51.0, 46.0)]


def test_two_expectations_share_the_cluster_cap() -> None:
    got = run(with_warming(maxConcurrent=2), [node("a"), node("b", images=[SNAPW_IMAGE])],
              [expect(), expect("snapw")], published=[("snapw", "gpu")])
    # snapw's snapshot on b saves 133 s, llm's image on a 100 s; both fit the cap of 2
    assert [(a.node, a.workload, a.kind) for a in got.actions] == [("b", "snapw", "snapshot"), ("a", "llm", "image")]


def test_expectation_from_a_decision() -> None:
    d = decide(DecisionInputs(workload="llm", now_s=NOW, demand=50.0, capacity=10.0,
                              horizon=horizon(151.0, 15.0, 15.0), ready=2, max_replicas=20))
    e = Expectation.from_decision(d)
    assert (e.workload, e.replicas, e.within_s) == ("llm", 3, 181.0)  # need 5, have 2; 151 + 15 + 15
    # starting replicas count as had: need ceil(30 / 10) = 3, current 1 ready + 1 starting
    d = decide(DecisionInputs(workload="llm", now_s=NOW, demand=30.0, capacity=10.0, ready=1, starting=1,
                              max_replicas=10, horizon=horizon(120.0, 15.0, 15.0)))
    assert d.desired == 3
    assert Expectation.from_decision(d) == Expectation(workload="llm", replicas=1, within_s=150.0)


@pytest.mark.parametrize(("upper", "utilization", "desired", "current", "replicas"), [
    pytest.param(50.0, 1.0, 3, 2, 3, id="the-forecast-needs-more-than-the-decision"),  # ceil(50 / 10) = 5
    pytest.param(10.0, 1.0, 3, 2, 1, id="never-fewer-than-the-decision-orders"),
    pytest.param(500.0, 1.0, 3, 2, 18, id="capped-at-max-replicas"),  # 20 - 2
    pytest.param(45.0, 0.9, 3, 2, 3, id="target-utilization-divides-capacity"),  # ceil(45 / 9) = 5
    pytest.param(30.0, 1.0, 1, 1, 2, id="an-exact-multiple-does-not-round-up"),  # 3, not 4
    pytest.param(30.0, 1.0, 3, 6, 0, id="more-running-than-needed"),
    pytest.param(0.0, 1.0, 0, 0, 0, id="no-demand"),
    # 1e308 / (10 x 1e-300) overflowed to infinity, and ceil(inf) raised: now the most, then maxReplicas
    pytest.param(1e308, 1e-300, 3, 2, 18, id="a-need-past-what-a-float-holds"),
])
def test_look_ahead(upper: float, utilization: float, desired: int, current: int, replicas: int) -> None:
    got = look_ahead("llm", upper, capacity=10.0, target_utilization=utilization, desired=desired,
                     current=current, max_replicas=20, within_s=600.0)
    assert got == Expectation(workload="llm", replicas=replicas, within_s=600.0)


def test_expectation_ahead_reads_the_decision() -> None:
    d = decide(DecisionInputs(workload="llm", now_s=NOW, demand=50.0, capacity=10.0, target_utilization=0.8,
                              horizon=horizon(151.0, 15.0, 15.0), ready=2, starting=1, max_replicas=9))
    assert (d.desired, d.current) == (7, 3)  # ceil(50 / 8)
    assert Expectation.ahead(d, 100.0, 700.0) == Expectation(workload="llm", replicas=6, within_s=700.0)  # 9 - 3
    assert Expectation.ahead(d, 10.0, 700.0).replicas == 4  # the decision's own 7 - 3


@pytest.mark.parametrize(("ahead", "desired", "current", "standby"), [
    pytest.param(5, 4, 2, 3, id="the-hpa-creates-two-placeholders-hold-the-other-three"),
    pytest.param(5, 2, 2, 5, id="nothing-created-this-tick"),
    pytest.param(2, 4, 2, 0, id="the-hpa-creates-everything-expected"),
    pytest.param(0, 1, 3, 0, id="scaling-down"),
])
def test_standby_replicas(ahead: int, desired: int, current: int, standby: int) -> None:
    expectation = Expectation(workload="llm", replicas=ahead, within_s=600.0)
    assert standby_replicas(expectation, desired=desired, current=current) == standby


def test_look_ahead_is_a_cold_start_and_a_new_node() -> None:
    autoscaled = BASE.model_copy(update={"scaling": BASE.scaling.model_copy(update={"provision_delay": 180.0})})
    llm = BASE.profile("llm")
    cold = next_replica(BASE, llm, None, NOW)  # no node with room: the slowest class, cold
    assert cold.node is None and look_ahead_s(BASE, llm) == pytest.approx(cold.startup_s)
    assert look_ahead_s(autoscaled, llm) == pytest.approx(cold.startup_s + 180.0)
    assert next_replica(autoscaled, llm, None, NOW).startup_s == pytest.approx(cold.startup_s + 180.0)


def test_duplicate_and_unknown_expectations() -> None:
    with pytest.raises(ValueError, match="llm"):
        run(CAP1, [node("a")], [expect(), expect()])
    with pytest.raises(UnknownNameError):
        run(CAP1, [node("a")], [expect("nope")])


def test_apply_gives_the_end_state() -> None:
    record = node("a", nvme_free=500 * GB, weights={"x/v0": 50 * GB}, lastUsed={"weights:x/v0": OLD})
    act = Action(node="a", workload="llm", kind="weights", cache="weights:llm/v1", bytes=100 * GB,
                 nvme_bytes=100 * GB, duration_s=10.0, deadline=None, saved_s=5.0, purpose="demand",
                 evictions=(Eviction(node="a", cache="weights:x/v0", bytes=50 * GB, last_used=OLD),))
    after = apply(record, act, now=NOW)
    assert after.weights == {"llm/v1": 100 * GB}
    assert after.nvme_free == 450 * GB  # 500 + 50 evicted - 100 staged
    assert after.last_used == {"weights:llm/v1": NOW}
    image = apply(record, act.model_copy(update={"kind": "image", "cache": f"image:{LLM_IMAGE}",
                                                 "nvme_bytes": 0, "evictions": ()}), now=NOW)
    assert LLM_IMAGE in image.images


def test_cache_ids() -> None:
    assert cache_id("weights", "llm/v1") == "weights:llm/v1"
    assert cache_id("image", LLM_IMAGE) == "image:example.com/llm:1"


def test_old_records_without_usage_fields_still_load() -> None:
    record = NodeState.model_validate({"name": "a"})
    assert (record.last_used, record.in_use, record.pod_workloads, record.cache_bytes) == ({}, (), (), {})


# ---------------------------------------------------------------------------------------------
# The best-K sum: table rows and a brute-force oracle
# ---------------------------------------------------------------------------------------------


def slow_best_k(values: Sequence[float], slots: Sequence[int], k: int) -> float:
    """Expand every node into its slots, sort, add the k smallest."""
    expanded = sorted(v for v, m in zip(values, slots, strict=True) for _ in range(m))
    return float(sum(expanded[:k]))


BEST_K = [
    # (id, values, slots, k, expected)
    ("empty", [], [], 3, 0.0),
    ("fewer-slots-than-k", [5.0, 7.0], [1, 1], 5, 12.0),
    ("multiplicity", [5.0, 7.0], [3, 1], 2, 10.0),          # both replicas on the first node
    ("zero-slot-node-ignored", [1.0, 7.0, 9.0], [0, 1, 1], 1, 7.0),
    ("ties", [4.0, 4.0, 4.0], [1, 1, 1], 2, 8.0),
    ("k-zero", [1.0], [1], 0, 0.0),
]


@pytest.mark.parametrize(("values", "slots", "k", "expected"), [r[1:] for r in BEST_K], ids=[r[0] for r in BEST_K])
def test_best_k_sum(values: list[float], slots: list[int], k: int, expected: float) -> None:
    assert best_k_sum(np.array(values, dtype=np.float64), np.array(slots, dtype=np.int64), k) == expected


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_best_k_after_matches_brute_force(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 8))
    values = data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, 3.0, 7.0, 10.0]), min_size=n, max_size=n))
    slots = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    lowered = [v - data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0])) for v in values]
    k = data.draw(st.integers(0, 10))
    got = best_k_sums_after(np.array(values), np.array(slots, dtype=np.int64), k, np.array(lowered))
    for i in range(n):
        changed = [*values[:i], lowered[i], *values[i + 1:]]
        assert got[i] == pytest.approx(slow_best_k(changed, slots, k), abs=1e-9)


# ---------------------------------------------------------------------------------------------
# Properties over random clusters
# ---------------------------------------------------------------------------------------------

CACHE_NAMES = ["weights:x/v0", "weights:y/v0", "weights:llm/v0", "weights:llm/v1", "weights:snapw/v1",
               "snapshot:snapw/v1", "snapshot:snapw/v0", "compile:ck1-old"]


@st.composite
def clusters(draw: st.DrawFn, tight: bool = False) -> dict[str, Any]:
    """A random cluster, its expectations and knobs. ``tight``: every node short of NVMe, images
    present and room in the caps, so that most plans need evictions."""
    warming: dict[str, Any] = {
        "maxConcurrentPerNode": draw(st.integers(2 if tight else 1, 3)),
        "maxConcurrent": draw(st.integers(4 if tight else 1, 6)),
        "evictAfterIdle": f"{draw(st.sampled_from([0, 600, 5000]))}s",
        "keepWarm": draw(st.lists(st.sampled_from(["llm", "snapw"]), unique=True, max_size=2)),
    }
    if draw(st.booleans()):
        warming["bytesPerTick"] = f"{draw(st.integers(1, 300))}GB"
    n = draw(st.integers(1, 6))
    nodes: list[NodeState] = []
    for i in range(n):
        entries = draw(st.lists(st.sampled_from(CACHE_NAMES), unique=True, min_size=1, max_size=5))
        weights = {e.partition(":")[2]: draw(st.integers(1, 400)) * GB
                   for e in entries if e.startswith("weights:")}
        fields: dict[str, Any] = {
            "weights": weights,
            "snapshots": [e.partition(":")[2] for e in entries if e.startswith("snapshot:")],
            "lastUsed": {e: NOW - draw(st.integers(0, 20_000)) for e in entries if tight or draw(st.integers(0, 3))},
            "inUse": [e for e in entries if not draw(st.integers(0, 6 if tight else 3))],
            "podWorkloads": draw(st.lists(st.sampled_from(["x", "llm", "snapw"]), unique=True, max_size=2)),
            "pullingBytes": draw(st.sampled_from([0, 5 * GB, 50 * GB])),
            "heartbeat": NOW - draw(st.sampled_from([1, 1, 1, 3600])),
        }
        if "compile:ck1-old" in entries:
            fields["compileKeys"] = ["ck1-old"]
            fields["cacheBytes"] = {"compile:ck1-old": draw(st.integers(1, 50)) * GB}
        images = [im for im in (LLM_IMAGE, SNAPW_IMAGE) if tight or draw(st.integers(0, 3))]
        free = [0, 50, 100, 150] if tight else [0, 50, 100, 101, 150, 250, 900]
        record = node(f"n{i}", gpus_free=draw(st.sampled_from([0, 4, 8, 8])),
                      nvme_free=draw(st.sampled_from(free)) * GB, compile=draw(st.booleans()), **fields)
        nodes.append(record.model_copy(update={"images": tuple(images)}))
    expectations = [Expectation(workload=w, replicas=draw(st.integers(1 if tight else 0, 3)),
                                within_s=float(draw(st.sampled_from([5, 50, 150, 700, 700]))))
                    for w in draw(st.lists(st.sampled_from(["llm", "snapw"]), unique=True, min_size=1, max_size=2))]
    names = [r.name for r in nodes] + ["elsewhere"]
    in_flight = [Action(node=draw(st.sampled_from(names)), workload="other", kind="weights",
                        cache=f"weights:other/v{j}", bytes=0, nvme_bytes=draw(st.integers(0, 50)) * GB,
                        duration_s=1.0, deadline=None, saved_s=1.0, purpose="demand")
                 for j in range(draw(st.integers(0, 1 if tight else 3)))]
    return {
        "policy": with_warming(**warming), "nodes": nodes, "expectations": expectations, "in_flight": in_flight,
        "registry": draw(st.booleans()), "published": [("snapw", "gpu")] if draw(st.booleans()) else [],
    }


def reference_best_k(policy: Policy, records: Sequence[NodeState], e: Expectation, registry: bool) -> float:
    """Best-K startup of an expectation over fresh nodes, estimated one node at a time."""
    profile = policy.profile(e.workload)
    values, slots = [], []
    for r in records:
        snap = InventorySnapshot.build(policy, [r], registry=[llm_key()] if registry else [])
        if not snap.fresh(NOW)[0]:
            continue
        state, table = snap.state_for(profile, snap.lookup([r.name]).index, NOW)
        values.append(float(estimate(profile, snap.classes, snap.class_index[:1], state, table).total_s[0]))
        slots.append(min(r.gpus_free // profile.parallelism.gpus, e.replicas))
    return slow_best_k(values, slots, e.replicas)


def end_state(records: Sequence[NodeState], got: Plan) -> list[NodeState]:
    by_name = {r.name: r for r in records}
    for a in got.actions:
        by_name[a.node] = apply(by_name[a.node], a, now=NOW)
    return [by_name[r.name] for r in records]


def protected_ids(policy: Policy, record: NodeState, tracked: set[str], in_flight: Sequence[Action]) -> set[str]:
    """What the planner must never evict on a node, written out independently of the planner."""
    ids = set(record.in_use) | {a.cache for a in in_flight if a.node == record.name}
    for w in record.pod_workloads:  # a pod may run any version of its weights
        ids |= {f"weights:{k}" for k in record.weights if k.startswith(f"{w}/")}
    for w in set(record.pod_workloads) | tracked:
        if w in {p.name for p in policy.profiles}:
            version = policy.profile(w).weights.version
            ids.add(f"snapshot:{w}/{version}")
            ids.add(f"weights:{w}/{version}")
            if w == "llm":
                ids.add(f"compile:{llm_key()}")
    return ids


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(clusters(), clusters(tight=True)))
def test_plan_properties(c: dict[str, Any]) -> None:
    policy: Policy = c["policy"]
    nodes: list[NodeState] = c["nodes"]
    in_flight: list[Action] = c["in_flight"]
    got = run(policy, nodes, c["expectations"], registry=c["registry"], in_flight=in_flight,
              published=c["published"])
    w = policy.warming
    event(f"actions: {min(len(got.actions), 3)}")
    event(f"evictions: {any(a.evictions for a in got.actions)}")
    for reason in sorted({s.reason for s in got.skipped}):
        event(f"skipped: {reason}")
    event(f"kinds: {sorted({a.kind for a in got.actions})}")
    by_name = {r.name: r for r in nodes}
    tracked = {e.workload for e in c["expectations"] if e.replicas > 0} | set(w.keep_warm)

    # concurrency, counting what is in flight
    if got.actions:
        assert len(got.actions) + len(in_flight) <= w.max_concurrent
    for name in {a.node for a in got.actions}:
        mine = sum(a.node == name for a in got.actions) + sum(a.node == name for a in in_flight)
        assert mine <= w.max_concurrent_per_node
    # byte budget
    if w.bytes_per_tick is not None:
        assert sum(a.bytes for a in got.actions) <= w.bytes_per_tick
    # deadlines; every action is worth something
    for a in got.actions:
        assert a.saved_s > 0
        if a.purpose == "demand":
            done_at = NOW + a.duration_s
            assert a.deadline is not None and done_at <= a.deadline + 1e-9
        assert by_name[a.node].fresh(NOW)
    # evictions: only idle, known-use, unprotected entries, each once, keep-warm never evicts
    for name in {a.node for a in got.actions}:
        record = by_name[name]
        protected = protected_ids(policy, record, tracked, in_flight)
        evicted = [e for a in got.actions if a.node == name for e in a.evictions]
        assert len({e.cache for e in evicted}) == len(evicted)
        for e in evicted:
            assert e.cache not in protected
            assert e.cache in record.last_used and NOW - record.last_used[e.cache] >= w.evict_after_idle
        assert all(not a.evictions for a in got.actions if a.purpose == "keep-warm")
        # NVMe never filled past capacity minus the reserve (in-flight staging counted), and each
        # action evicts no more than it needs: without its last (most recently used) eviction it
        # would not fit
        room = (record.nvme_free - policy.node_class("gpu").nvme.reserve
                - sum(a.nvme_bytes for a in in_flight if a.node == name))
        for a in got.actions:
            if a.node != name:
                continue
            if a.evictions:
                assert room + sum(e.bytes for e in a.evictions[:-1]) < a.nvme_bytes
                assert [e.last_used for e in a.evictions] == sorted(e.last_used for e in a.evictions)
            room += sum(e.bytes for e in a.evictions) - a.nvme_bytes
            assert a.nvme_bytes == 0 or room >= 0
    # never worse, and the outlook agrees with the oracle
    after = end_state(nodes, got)
    outlooks = {o.workload: o for o in got.outlooks}
    for e in c["expectations"]:
        if e.replicas == 0:
            continue
        before_s = reference_best_k(policy, nodes, e, c["registry"])
        after_s = reference_best_k(policy, after, e, c["registry"])
        assert after_s <= before_s + 1e-6
        o = outlooks[e.workload]
        if o.placeable:
            assert o.after_s is not None and o.after_s * o.placeable == pytest.approx(after_s, abs=1e-6)
    # deterministic whatever the order of the records
    shuffled = list(nodes)
    random.Random(7).shuffle(shuffled)
    assert run(policy, shuffled, c["expectations"], registry=c["registry"], in_flight=in_flight,
               published=c["published"]) == got


def test_compile_state_helper_is_consistent() -> None:
    # the helper node(compile=True) must produce the key the inventory recognises as local
    snap = InventorySnapshot.build(BASE, [node("a", compile=True)])
    state, _ = snap.state_for(BASE.profile("llm"), snap.lookup(["a"]).index, NOW)
    assert int(state.compile[0]) == CompileCache.LOCAL


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_a_factor_shared_by_every_node_changes_no_action(c: dict[str, Any]) -> None:
    """Every node twice as slow: the same actions as without factors (the current path is the
    oracle), each saving twice the seconds."""
    policy: Policy = c["policy"]
    nodes: list[NodeState] = c["nodes"]
    registry = [llm_key()] if c["registry"] else []
    kwargs: dict[str, Any] = {"now": NOW, "in_flight": c["in_flight"], "published_snapshots": c["published"]}
    bare = plan(policy, InventorySnapshot.build(policy, nodes, registry=registry), c["expectations"], **kwargs)
    doubled = plan(policy, InventorySnapshot.build(policy, nodes, registry=registry), c["expectations"],
                   nodes=factors_of(**dict.fromkeys((r.name for r in nodes), 2.0)), **kwargs)
    assert [a.model_copy(update={"saved_s": 0.0}) for a in doubled.actions] == \
        [a.model_copy(update={"saved_s": 0.0}) for a in bare.actions]
    assert [a.saved_s for a in doubled.actions] == pytest.approx([2 * a.saved_s for a in bare.actions])
