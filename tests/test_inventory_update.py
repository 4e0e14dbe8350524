"""Incremental snapshot updates: patching the changed rows equals building from the same records.

The oracle is :meth:`InventorySnapshot.build` itself. A hypothesis test applies random sequences
of change batches (new nodes, replaced records, deleted nodes, compile-registry changes) with
:meth:`InventorySnapshot.update` and checks after each batch that every column and every memoised
per-profile cache state equals a full build from the updated snapshot's records, and that those
records are exactly the ones the batches leave.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.core.caches import compile_key, weights_key
from extender.core.estimate import CacheState
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy
from extender.files import load_policy

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_000_000.0
POLICY = load_policy(ROOT / "policies" / "h200-b200-snapshot.yaml")
PROFILE = POLICY.profiles[0]
KEYS = [k for k in (compile_key(PROFILE, c) for c in POLICY.node_classes) if k is not None]
IMAGE = PROFILE.image.reference
NAMES = [f"node-{i}" for i in range(8)]
COLUMNS = ("class_index", "heartbeat", "ttl", "gpus_free", "nvme_free", "pulling_bytes")

records = st.builds(
    lambda name, cls, labels, image, weights, keys, snap, beat, free, pulling: NodeState.model_validate({
        "name": name, "nodeClass": cls, "labels": labels, "images": [IMAGE] if image else [],
        "weights": {weights_key(PROFILE.name, PROFILE.weights.version): weights} if weights else {},
        "compileKeys": keys, "snapshots": [PROFILE.name] if snap else [], "heartbeat": beat,
        "gpusFree": free, "pullingBytes": pulling}),
    st.sampled_from(NAMES),
    st.sampled_from(["", "h200", "b200", "not-a-class"]),
    st.sampled_from([{}, {"nvidia.com/gpu.product": "NVIDIA-H200"}, {"nvidia.com/gpu.product": "NVIDIA-B200"}]),
    st.booleans(),
    st.sampled_from([0, 10**9, 10**11]),
    st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
    st.booleans(),
    st.sampled_from([0.0, NOW - 1, NOW - 3600, NOW + 30, NOW + 3600]),  # ahead: within the TTL, beyond it
    st.integers(0, 8),
    st.sampled_from([0, 5 * 10**9]),
)
#: One batch: name -> new record or ``None`` (deleted); plus an optional new compile registry.
batches = st.tuples(
    st.dictionaries(st.sampled_from(NAMES), st.one_of(st.none(), records), max_size=6),
    st.one_of(st.none(), st.lists(st.sampled_from(KEYS), max_size=2, unique=True)),
)


def assert_same(updated: InventorySnapshot, built: InventorySnapshot, policy: Policy) -> None:
    assert updated.nodes == built.nodes
    assert updated.registry == built.registry
    assert updated.positions == built.positions
    for name in COLUMNS:
        np.testing.assert_array_equal(getattr(updated, name), getattr(built, name), err_msg=name)
        assert getattr(updated, name).dtype == getattr(built, name).dtype, name
    for profile in policy.profiles:
        got, want = updated.cache_state(profile)[0], built.cache_state(profile)[0]
        for f in fields(CacheState):
            np.testing.assert_array_equal(getattr(got, f.name), getattr(want, f.name), err_msg=f.name)
            assert getattr(got, f.name).dtype == getattr(want, f.name).dtype, f.name


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.lists(records, max_size=6, unique_by=lambda r: r.name), steps=st.lists(batches, max_size=6),
       memoise=st.booleans())
def test_an_update_equals_a_full_build_from_the_same_records(start: list[NodeState],
                                                             steps: list[tuple[dict[str, NodeState | None],
                                                                               list[str] | None]],
                                                             memoise: bool) -> None:
    expected = {r.name: r for r in start}
    registry: list[str] = []
    snap = InventorySnapshot.build(POLICY, start, version=0, taken_at=NOW, registry=registry)
    for version, (batch, new_registry) in enumerate(steps, start=1):
        # A record's name is the key it is written under.
        changed = {name: None if r is None else r.model_copy(update={"name": name}) for name, r in batch.items()}
        if memoise:  # the memoised per-profile states are patched, not recomputed
            for profile in POLICY.profiles:
                snap.cache_state(profile)
        before = snap.nodes
        registry = registry if new_registry is None else new_registry
        snap = snap.update(POLICY, changed, version=version, taken_at=NOW, registry=new_registry)
        for name, record in changed.items():
            if record is None:
                expected.pop(name, None)
            else:
                expected[name] = record
        assert {r.name: r for r in snap.nodes} == expected
        assert snap.version == version
        built = InventorySnapshot.build(POLICY, snap.nodes, version=version, taken_at=NOW, registry=registry)
        assert_same(snap, built, POLICY)
        # The delta says which rows are carried unchanged from the previous snapshot.
        assert snap.delta is not None
        for row, old in enumerate(snap.delta.carried.tolist()):
            if old >= 0:
                assert before[old] is snap.nodes[row]
            else:
                assert snap.nodes[row].name in changed


CASES = [
    # (id, changes, rows after: names in row order)
    ("heartbeat keeps the row", {"b": "beat"}, ["a", "b", "c"]),
    ("a new node is appended", {"d": "new"}, ["a", "b", "c", "d"]),
    ("a deleted node's row is removed", {"b": None}, ["a", "c"]),
    ("deleting an unknown name is nothing", {"zz": None}, ["a", "b", "c"]),
    ("delete, add and replace at once", {"a": None, "e": "new", "c": "beat"}, ["b", "c", "e"]),
]


@pytest.mark.parametrize(("changes", "order"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rows_after_an_update(changes: dict[str, str | None], order: list[str]) -> None:
    base = [NodeState(name=n, heartbeat=NOW - 10) for n in "abc"]
    snap = InventorySnapshot.build(POLICY, base, taken_at=NOW)
    changed = {n: None if v is None else NodeState(name=n, heartbeat=NOW) for n, v in changes.items()}
    updated = snap.update(POLICY, changed, version=1, taken_at=NOW)
    assert [r.name for r in updated.nodes] == order
    assert [updated.positions[n] for n in order] == list(range(len(order)))
    assert len(updated.heartbeat) == len(order) + 1  # the sentinel stays last
    assert updated.heartbeat[-1] == 0.0
    assert [r.name for r in snap.nodes] == ["a", "b", "c"]  # the old snapshot is untouched
    assert snap.heartbeat.tolist() == [NOW - 10] * 3 + [0.0]


#: A batch of bare heartbeats: names the snapshot may or may not hold, times older or newer than its own.
beat_batches = st.dictionaries(st.sampled_from([*NAMES, "not-held"]),
                               st.sampled_from([0.0, NOW - 3600, NOW - 1, NOW, NOW + 3600]), max_size=6)


def merged(start: list[NodeState], beats: dict[str, float]) -> list[NodeState]:
    """The records as the store returns them after ``beats``: each with the later heartbeat."""
    return [r.model_copy(update={"heartbeat": max(r.heartbeat, beats.get(r.name, 0.0))}) for r in start]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.lists(records, max_size=6, unique_by=lambda r: r.name), beats=st.lists(beat_batches, max_size=3),
       memoise=st.booleans())
def test_heartbeats_equal_a_full_build_from_the_merged_records(start: list[NodeState],
                                                               beats: list[dict[str, float]], memoise: bool) -> None:
    snapshot = InventorySnapshot.build(POLICY, start, taken_at=NOW)
    if memoise:
        snapshot.cache_state(PROFILE)
    seen: dict[str, float] = {}
    for batch in beats:
        before = snapshot.heartbeat.copy()
        snapshot = snapshot.with_heartbeats(batch, taken_at=NOW)
        for name, beat in batch.items():
            seen[name] = max(seen.get(name, 0.0), beat)
        built = InventorySnapshot.build(POLICY, merged(start, seen), taken_at=NOW)
        assert [r.name for r in snapshot.nodes] == [r.name for r in built.nodes]
        assert_same(replace(snapshot, nodes=built.nodes), built, POLICY)
        assert (snapshot.heartbeat >= before).all()  # never back


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.lists(records, max_size=6, unique_by=lambda r: r.name), beats=beat_batches,
       later=st.sampled_from([0.0, 30.0, 4000.0]))
def test_an_engine_given_heartbeats_scores_like_one_built_from_the_merged_records(
        start: list[NodeState], beats: dict[str, float], later: float) -> None:
    from extender.api.scheduler.engine import Engine

    engine = Engine(POLICY, InventorySnapshot.build(POLICY, start, taken_at=NOW))
    engine.warm(NOW)
    now = NOW + later
    given_beats = engine.with_heartbeats(engine.snapshot.with_heartbeats(beats, taken_at=now), now)
    oracle = Engine(POLICY, InventorySnapshot.build(POLICY, merged(start, beats), taken_at=now))
    for profile in POLICY.profiles:
        got, want = given_beats.table(profile, now), oracle.table(profile, now)
        assert dict(got.fragments) == dict(want.fragments)
        assert got.failing == want.failing
        assert got.valid_until == want.valid_until
        np.testing.assert_array_equal(got.fresh, want.fresh)


def test_heartbeats_that_change_no_freshness_keep_the_score_tables() -> None:
    from extender.api.scheduler.engine import Engine

    start = [NodeState(name=n, heartbeat=NOW - 10, ttl=60) for n in NAMES[:3]]
    engine = Engine(POLICY, InventorySnapshot.build(POLICY, start, taken_at=NOW))
    engine.warm(NOW)
    kept = engine.with_heartbeats(engine.snapshot.with_heartbeats({"node-0": NOW}, taken_at=NOW), NOW)
    assert all(kept.table(p, NOW).fragments is engine.table(p, NOW).fragments for p in POLICY.profiles)
    assert kept.table(PROFILE, NOW).valid_until == NOW - 10 + 60  # node-1 and node-2 still expire first
    stale = [NodeState(name="node-0", heartbeat=NOW - 100, ttl=60)]
    engine = Engine(POLICY, InventorySnapshot.build(POLICY, stale, taken_at=NOW))
    engine.warm(NOW)
    back = engine.with_heartbeats(engine.snapshot.with_heartbeats({"node-0": NOW}, taken_at=NOW), NOW)
    assert back.table(PROFILE, NOW).fragments is not engine.table(PROFILE, NOW).fragments  # rescored
    assert back.table(PROFILE, NOW).fresh[0]


def test_a_table_is_rebuilt_when_a_row_ahead_turns_fresh_and_again_when_it_expires() -> None:
    # A heartbeat more than a TTL ahead of the clock is stale (cold); it turns fresh as the clock
    # reaches heartbeat - ttl. The tables used to be kept until the next fresh row expired, so
    # the node stayed cold past that instant (and, before the window, it was fresh from the start).
    from extender.api.scheduler.engine import Engine

    warm = {"labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}, "images": [IMAGE],
            "weights": {weights_key(PROFILE.name, PROFILE.weights.version): PROFILE.weights.bytes}}
    start = [NodeState.model_validate({"name": "steady", "heartbeat": NOW, "ttl": 3600, **warm}),
             NodeState.model_validate({"name": "ahead", "heartbeat": NOW + 600, "ttl": 60, **warm})]
    snapshot = InventorySnapshot.build(POLICY, start, taken_at=NOW)
    engine = Engine(POLICY, snapshot)
    engine.warm(NOW)
    table = engine.table(PROFILE, NOW)
    assert table.valid_until == NOW + 540  # the row ahead turns fresh before "steady" expires
    cold = table.evaluation.score[1]
    assert cold < table.evaluation.score[0]  # stale ahead: cold, though its record is as warm
    assert engine.table(PROFILE, NOW + 539) is table
    for t, fresh, until in [(NOW + 540, True, NOW + 660), (NOW + 661, False, NOW + 3600)]:
        rebuilt = engine.table(PROFILE, t)
        assert rebuilt is not table and bool(rebuilt.fresh[1]) is fresh and rebuilt.valid_until == until
        assert bool(rebuilt.evaluation.score[1] > cold) is fresh
        oracle = Engine(POLICY, snapshot).table(PROFILE, t)  # a table built at that instant
        assert dict(rebuilt.fragments) == dict(oracle.fragments) and rebuilt.failing == oracle.failing
        table = rebuilt
