"""The node agent against real directory trees and a real Redis (and the API double for node labels).

The inventory matches the disk; unchanged scans write nothing until the heartbeat is due; agent
restarts and Redis restarts lose nothing; outages are ridden out; node labels follow readiness.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis

from extender.agent.commands import agent_ready
from extender.agent.loop import Agent, AgentSettings
from extender.core.errors import OversizedRecordError, StoreUnavailableError
from extender.core.inventory import MAX_ENTRIES, NodeState
from extender.core.reports import AgentReport, KubeReport
from extender.kube.client import KubeClient
from extender.kube.labels import NodeLabeler, label_key, label_patch
from extender.layout import COMPLETE, compile_dir, mark_complete, snapshot_dir, weights_dir
from extender.state import InventoryStore, connect
from extender.state.sources import SourceStore
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.test_agent_scan import GiB, make_weights, sparse

ROOT = Path(__file__).resolve().parent.parent
NODE = "gpu-node-1"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    make_weights(root, "llama3-8b", "main", {f"model-{i}.safetensors": 4 * GiB for i in range(4)})
    make_weights(root, "mixtral-61g", "v1", {"a": 40 * GiB, "b": 21 * GiB}, present={"a": 40 * GiB, "b": 3 * GiB},
                 complete=False)
    sparse(compile_dir(root, "ck1-0123456789abcdef0123456789abcdef") / "triton" / "k.cubin", 4096)
    sparse(snapshot_dir(root, "llama3-8b", "main") / "pages.img", 8 * GiB)
    mark_complete(snapshot_dir(root, "llama3-8b", "main"))
    return root


class Clients:
    """Redis clients opened by agents under test, closed at teardown."""

    def __init__(self, url: str, data_dir: Path) -> None:
        self.url = url
        self.data_dir = data_dir
        self.opened: list[redis.Redis] = []

    def open(self) -> SourceStore:
        client = connect(self.url, self.data_dir)
        self.opened.append(client)
        return SourceStore(InventoryStore(client))


@pytest.fixture
def clients(redis_server: RedisServer, tmp_path: Path) -> Iterator[Clients]:
    c = Clients(redis_server.url, tmp_path)
    try:
        yield c
    finally:
        for client in c.opened:
            client.close()


@pytest.fixture
def reader(clients: Clients) -> SourceStore:
    return clients.open()


class FakeClock:
    """A monotonic clock the test moves by hand (heartbeat scheduling without sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def agent(cache: Path, clients: Clients, **settings: Any) -> Agent:
    opts: dict[str, Any] = {"interval_s": 0.05, "ttl_s": 60.0, "backoff_initial_s": 0.02, "backoff_max_s": 0.1}
    opts.update(settings)
    kwargs: dict[str, Any] = {k: opts.pop(k) for k in ("monotonic", "clock") if k in opts}
    return Agent(AgentSettings(node_name=NODE, cache_root=cache, **opts), clients.open, **kwargs)


@contextmanager
def running(a: Agent) -> Iterator[Agent]:
    thread = threading.Thread(target=a.run, name="agent-under-test")
    thread.start()
    try:
        yield a
    finally:
        a.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the agent did not stop"


def test_the_inventory_matches_the_disk(cache: Path, clients: Clients, reader: SourceStore) -> None:
    a = agent(cache, clients)
    a.step()
    state = reader.store.get(NODE)
    assert state is not None
    assert state.weights == {"llama3-8b/main": 16 * GiB, "mixtral-61g/v1": 43 * GiB}  # 40 + 3 of 61 GiB
    assert state.compile_keys == ("ck1-0123456789abcdef0123456789abcdef",)
    assert state.snapshots == ("llama3-8b/main",)
    st = os.statvfs(cache)
    assert state.nvme_total == st.f_blocks * st.f_frsize
    assert 0 < state.nvme_free <= state.nvme_total
    assert state.heartbeat > 0 and state.ttl == 60.0
    assert a.stats.last_scan is not None and a.stats.last_scan.complete_workloads == {"llama3-8b"}


def test_only_changes_and_due_heartbeats_are_written(cache: Path, clients: Clients, reader: SourceStore) -> None:
    clock = FakeClock()
    # free space of the shared test disk may move by any amount meanwhile: that is not this test's subject
    a = agent(cache, clients, heartbeat_s=10.0, monotonic=clock, free_tolerance_bytes=2**62)
    a.step()
    first = reader.store.get(NODE)
    version = reader.store.version()
    clock.now += 5
    a.step()  # same disk, heartbeat not due: nothing written
    assert (a.stats.writes, reader.store.version()) == (1, version)
    sparse(weights_dir(cache, "mixtral-61g", "v1") / "b", 21 * GiB)  # the download finished
    mark_complete(weights_dir(cache, "mixtral-61g", "v1"))
    a.step()
    state = reader.store.get(NODE)
    assert state is not None and state.weights["mixtral-61g/v1"] == 61 * GiB
    assert a.stats.writes == 2
    clock.now += 10
    version = reader.store.version()
    a.step()  # nothing changed, but the heartbeat is due: a bare heartbeat, no record write
    beat = reader.store.get(NODE)
    assert (a.stats.writes, a.stats.heartbeats, reader.store.version()) == (3, 1, version)
    assert beat is not None and first is not None
    ignore = {"heartbeat": 0, "nvme_free": 0}
    assert beat.heartbeat >= state.heartbeat and beat.model_copy(update=ignore) == state.model_copy(update=ignore)
    assert reader.store.heartbeats_since(0)[1] == {NODE: beat.heartbeat}


def test_a_bare_heartbeat_for_a_node_the_store_lost_becomes_a_whole_report(
        cache: Path, clients: Clients, reader: SourceStore) -> None:
    clock = FakeClock()
    a = agent(cache, clients, heartbeat_s=10.0, monotonic=clock, free_tolerance_bytes=2**62)
    a.step()
    reader.store.client.delete(reader.store.keys.node(NODE), reader.store.keys.nodes)  # Redis lost the record
    clock.now += 10
    a.step()
    assert (a.stats.writes, a.stats.heartbeats) == (2, 0)
    assert reader.store.get(NODE) is not None
    reader.remove_node(NODE)  # the node left the cluster: the whole report meets the tombstone
    clock.now += 10
    a.step()
    assert reader.store.get(NODE) is None and a.stats.heartbeats == 0


class Mishap(NamedTuple):
    """What befell the store between the agent's whole report and its next (bare) heartbeat."""

    befall: Callable[[SourceStore, Path, Clients], object]


def _another_agent_under_the_same_name(reader: SourceStore, tmp_path: Path, clients: Clients) -> None:
    other = tmp_path / "other-cache"
    other.mkdir()
    agent(other, clients).step()  # a second DaemonSet pod given the same node name: an empty disk


MISHAPS = {
    "redis-restarted-empty-and-the-sync-refilled-it": Mishap(
        lambda reader, _, __: (reader.client.flushall(), reader.report_kube({NODE: KubeReport(gpus=8, gpus_free=8)}))),
    "the-node-removed-and-registered-again": Mishap(
        lambda reader, _, __: (reader.remove_node(NODE), reader.report_kube({NODE: KubeReport(gpus=8)}))),
    "a-corrupt-agent-report-in-the-source-hash": Mishap(
        lambda reader, _, __: reader.client.hset(reader.key(NODE), "agent", "{not json")),
    "another-agent-wrote-under-the-same-name": Mishap(_another_agent_under_the_same_name),
    # the node stays in the node set: only the record key is gone (redis-cli DEL behind the store's back)
    "the-record-deleted-behind-the-store-s-back": Mishap(
        lambda reader, _, __: reader.client.delete(reader.store.keys.node(NODE))),
}


@pytest.mark.parametrize("row", MISHAPS.values(), ids=MISHAPS.keys())
def test_a_bare_heartbeat_only_keeps_this_agent_s_own_report_fresh(
        cache: Path, clients: Clients, reader: SourceStore, tmp_path: Path, row: Mishap) -> None:
    clock = FakeClock()
    a = agent(cache, clients, heartbeat_s=10.0, monotonic=clock, free_tolerance_bytes=2**62)
    a.step()
    written = reader.store.get(NODE)
    row.befall(reader, tmp_path, clients)
    clock.now += 10
    a.step()  # nothing new on the disk and the heartbeat due: the bare one is refused, the report written whole
    got = reader.store.get(NODE)
    assert (a.stats.writes, a.stats.heartbeats) == (2, 0)
    assert written is not None and got is not None
    assert (got.weights, got.snapshots, got.nvme_total) == (written.weights, written.snapshots, written.nvme_total)
    clock.now += 10
    a.step()  # the record holds this agent's report again: bare heartbeats are welcome
    assert a.stats.heartbeats == 1


class ClockJump(NamedTuple):
    """The wall clock runs a day ahead for the agent's first writes, then is set right."""

    #: Bare heartbeats written while the clock was ahead (0: only the whole report was).
    beats_ahead: int


CLOCK_JUMPS = {
    "the-last-write-ahead-was-a-bare-heartbeat": ClockJump(beats_ahead=2),
    "the-last-write-ahead-was-the-whole-report": ClockJump(beats_ahead=0),
}


@pytest.mark.parametrize("row", CLOCK_JUMPS.values(), ids=CLOCK_JUMPS.keys())
def test_a_clock_set_back_replaces_the_heartbeat_it_wrote_ahead(
        cache: Path, clients: Clients, reader: SourceStore, row: ClockJump, caplog: pytest.LogCaptureFixture) -> None:
    monotonic, wall = FakeClock(), FakeClock()
    wall.now = 1_700_000_000.0 + 86_400  # a day ahead
    a = agent(cache, clients, heartbeat_s=10.0, monotonic=monotonic, clock=wall, free_tolerance_bytes=2**62)
    a.step()
    for _ in range(row.beats_ahead):
        monotonic.now += 10
        wall.now += 10
        a.step()
    assert a.stats.heartbeats == row.beats_ahead
    monotonic.now += 10
    wall.now = 1_700_000_000.0  # set right (NTP): the clock went back a day
    with caplog.at_level(logging.WARNING, logger="extender.agent.loop"):
        a.step()
    got = reader.store.get(NODE)
    assert got is not None and got.heartbeat == wall.now  # not a day ahead: the node can go stale again
    assert a.stats.heartbeats == row.beats_ahead  # the whole report, since a bare one never moves back
    behind = [r.behind_s for r in caplog.records if hasattr(r, "behind_s")]
    assert behind == [pytest.approx(86_400 + 10 * row.beats_ahead)]
    monotonic.now += 10
    wall.now += 10
    a.step()  # the clock moves forward again: bare heartbeats as before
    assert a.stats.heartbeats == row.beats_ahead + 1


def _garble_record(reader: SourceStore) -> None:
    reader.client.set(reader.store.keys.node(NODE), "garbage")  # the agent report in the source hash is intact


class Idle(NamedTuple):
    """What happens to the store while the agent has nothing new but heartbeats to send."""

    befall: Callable[[SourceStore], object]


IDLE = {
    "nothing-else-free-space-drift-under-the-tolerance": Idle(lambda reader: None),
    "the-merged-record-overwritten-with-garbage": Idle(_garble_record),
}


@pytest.mark.parametrize("row", IDLE.values(), ids=IDLE.keys())
def test_an_idle_agent_writes_its_whole_report_every_full_report_s(
        cache: Path, clients: Clients, reader: SourceStore, row: Idle) -> None:
    clock = FakeClock()
    # a TTL past the bound, so last-use times alone cannot send the whole report
    a = agent(cache, clients, heartbeat_s=10.0, ttl_s=600.0, full_report_s=60.0, monotonic=clock,
              free_tolerance_bytes=2**62)
    a.step()
    row.befall(reader)
    for _ in range(5):  # 50 s of bare heartbeats, all taken: the agent report they vouch for is intact
        clock.now += 10
        a.step()
    assert (a.stats.writes, a.stats.heartbeats) == (6, 5)
    clock.now += 10
    a.step()  # 60 s since the whole report
    assert (a.stats.writes, a.stats.heartbeats) == (7, 5)
    got = reader.store.get(NODE)
    assert got is not None and a.last_written is not None
    assert (got.nvme_free, got.heartbeat) == (a.last_written.nvme_free, a.last_written.heartbeat)


def test_an_agent_restart_loses_nothing(cache: Path, clients: Clients, reader: SourceStore) -> None:
    agent(cache, clients).step()
    before = reader.store.get(NODE)
    agent(cache, clients).step()  # a new process: its first scan is written whatever was stored
    after = reader.store.get(NODE)
    assert before is not None and after is not None
    # free space belongs to the whole (shared) disk and moves between the two scans
    ignore = {"heartbeat": 0, "nvme_free": 0}
    assert after.model_copy(update=ignore) == before.model_copy(update=ignore)


def test_a_redis_restart_loses_nothing(cache: Path, clients: Clients, reader: SourceStore,
                                       redis_server: RedisServer) -> None:
    with running(agent(cache, clients, heartbeat_s=0.2)):
        wait_until(lambda: reader.store.get(NODE), what="the first report")
        expected = reader.store.get(NODE)
        redis_server.restart()  # every key gone
        wait_until(lambda: _get(reader), what="the report after the restart")
    again = reader.store.get(NODE)
    assert expected is not None and again is not None
    assert again.weights == expected.weights and again.snapshots == expected.snapshots


def _get(reader: SourceStore) -> Any:
    try:
        return reader.store.get(NODE)
    except StoreUnavailableError:
        return None


def test_an_agent_started_while_redis_is_down_reports_when_it_returns(
    cache: Path, clients: Clients, reader: SourceStore, redis_server: RedisServer
) -> None:
    redis_server.kill()
    a = agent(cache, clients, heartbeat_s=3600.0)
    with running(a):
        wait_until(lambda: a.stats.scans >= 3, what="scans during the outage")
        sparse(compile_dir(cache, "ck1-new") / "f", 1)  # the disk changes meanwhile
        redis_server.start()
        wait_until(lambda: (s := _get(reader)) is not None and "ck1-new" in s.compile_keys,
                   what="the newest report once Redis is back")


def test_an_outage_mid_run(cache: Path, clients: Clients, reader: SourceStore, redis_server: RedisServer) -> None:
    a = agent(cache, clients, heartbeat_s=3600.0)
    with running(a):
        wait_until(lambda: _get(reader), what="the first report")
        redis_server.kill()
        shutil.rmtree(weights_dir(cache, "mixtral-61g", "v1"))  # evicted during the outage
        wait_until(lambda: a.stats.failed_writes >= 2, what="failed writes with backoff")
        redis_server.start()
        wait_until(lambda: (s := _get(reader)) is not None and "mixtral-61g/v1" not in s.weights,
                   what="the eviction reported")


def test_a_damaged_cache_is_reported_around_the_damage(cache: Path, clients: Clients, reader: SourceStore,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    (weights_dir(cache, "llama3-8b", "main") / ".manifest.json").write_text("[1, 2")
    os.remove(weights_dir(cache, "llama3-8b", "main") / "model-3.safetensors")
    a = agent(cache, clients)
    a.step()
    a.step()
    state = reader.store.get(NODE)
    assert state is not None
    assert state.weights["llama3-8b/main"] == 12 * GiB  # three shards left, no manifest to trust
    assert state.snapshots == ("llama3-8b/main",)
    corrupt = [r for r in caplog.records if "corrupt manifest" in r.getMessage()]
    assert len(corrupt) == 1  # logged once, not on every scan


def test_weights_whose_manifest_lists_no_files_are_partial_and_said_so(
        cache: Path, clients: Clients, caplog: pytest.LogCaptureFixture) -> None:
    """Another writer's empty manifest with a marker made the weights whole at 0 bytes: ready to the
    node labels, with nothing logged."""
    d = weights_dir(cache, "qwen", "v1")
    d.mkdir(parents=True)
    (d / ".manifest.json").write_text('{"files": []}')
    mark_complete(d)
    a = agent(cache, clients)
    with caplog.at_level(logging.WARNING, logger="extender.agent.loop"):
        a.step()
    assert a.stats.last_scan is not None and "qwen" not in a.stats.last_scan.complete_workloads
    said = [(r.levelno, r.cache_path) for r in caplog.records  # type: ignore[attr-defined]
            if "lists no files" in r.getMessage()]
    assert said == [(logging.WARNING, str(d / ".manifest.json"))]


class Unstorable(NamedTuple):
    """Something in the cache root a record cannot hold, what the agent says of it, and what it reports."""

    build: Callable[[Path], object]
    problem: str
    reported: Callable[[NodeState], bool]


def _compile_dirs(root: Path, names: list[str]) -> None:
    for name in names:
        sparse(compile_dir(root, name) / "f", 1)


def _invalid_utf8(root: Path) -> None:
    bad = os.path.join(os.fsencode(compile_dir(root, "x").parent), b"bad\xff")
    os.makedirs(bad)
    with open(os.path.join(bad, b"f"), "wb") as f:
        f.write(b"x")


FIXTURE_KEY = "ck1-0123456789abcdef0123456789abcdef"
UNSTORABLE = {
    "a-newline-in-a-compile-key": Unstorable(
        lambda root: _compile_dirs(root, ["bad\nname"]), "compile key 'bad\\nname' cannot be stored",
        lambda s: s.compile_keys == (FIXTURE_KEY,)),
    "a-name-that-is-not-utf-8": Unstorable(
        _invalid_utf8, "compile key 'bad\\udcff' cannot be stored", lambda s: s.compile_keys == (FIXTURE_KEY,)),
    # with the fixture's key, 4,098 keys: the first 4,096 by name are kept; and last-use times of
    # every kind (2 weights, 4,096 compile keys, 1 snapshot) are more than a record holds too
    "more-compile-keys-than-a-record-holds": Unstorable(
        lambda root: _compile_dirs(root, [f"k{i:05d}" for i in range(MAX_ENTRIES + 1)]),
        f"{MAX_ENTRIES + 2} compile keys, more than the {MAX_ENTRIES} a record holds",
        lambda s: len(s.compile_keys) == MAX_ENTRIES and s.compile_keys[-1] == f"k{MAX_ENTRIES - 2:05d}"
        and len(s.last_used) == MAX_ENTRIES),
    # 2,000 keys of 240 characters (with their usage) are about 1.5 MB of JSON: over a record's 1 MiB
    "more-bytes-than-the-agent-s-share-of-a-record": Unstorable(
        lambda root: _compile_dirs(root, [f"k{i:04d}" + "a" * 235 for i in range(2000)]),
        "the report is over the",
        lambda s: FIXTURE_KEY in s.compile_keys and 500 < len(s.compile_keys) < 2001
        and s.compile_keys == tuple(sorted(s.compile_keys))),
}


@pytest.mark.parametrize("row", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_what_a_record_cannot_hold_is_left_out_and_the_rest_reported(
        cache: Path, clients: Clients, reader: SourceStore, row: Unstorable, caplog: pytest.LogCaptureFixture) -> None:
    row.build(cache)
    a = agent(cache, clients)
    with caplog.at_level(logging.ERROR, logger="extender.agent.loop"):
        a.step()
    state = reader.store.get(NODE)
    assert state is not None and row.reported(state)
    assert state.weights == {"llama3-8b/main": 16 * GiB, "mixtral-61g/v1": 43 * GiB}  # the rest is reported
    assert state.snapshots == ("llama3-8b/main",) and state.nvme_total > 0
    assert any(p.kind == "unstorable" and row.problem in p.message for p in a.stats.problems), a.stats.problems
    assert any(row.problem in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


def test_a_record_over_the_size_limit_is_no_outage(cache: Path, clients: Clients, reader: SourceStore,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    _compile_dirs(cache, [f"k{i:04d}" + "a" * 235 for i in range(300)])  # about 230 KB of the agent's
    # the sync's part alone fits (about 900 KB of labels), but not with the agent's beside it
    reader.report_kube({NODE: KubeReport(labels={f"l{i:04d}": "v" * 1000 for i in range(900)})})
    a = agent(cache, clients, heartbeat_s=3600.0)
    with caplog.at_level(logging.INFO, logger="extender.agent.loop"), running(a):
        wait_until(lambda: a.stats.failed_writes >= 3, what="reports refused as too large")
        assert not a.outage  # the store answered: this is no outage
        reader.report_kube({NODE: KubeReport()})  # the labels shrink
        wait_until(lambda: (s := _get(reader)) is not None and len(s.compile_keys) == 301,
                   what="the report once it fits")
    refusals = [r for r in caplog.records if "refused the report" in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.ERROR]  # said once, as an error, however many tries
    assert not any("retrying with backoff" in r.getMessage() for r in caplog.records)



REFUSAL = f"the record of {NODE} would be 1.2 MB, over the 1 MiB limit"


class ScriptedReporter:
    """A store that answers each write with the next outcome of a script (the last one repeats):
    ``ok``, ``down`` (unreachable) or ``refused`` (the record too large). It never takes a bare
    heartbeat, so every write is a whole report."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.calls = 0

    def report_agent(self, name: str, report: AgentReport) -> int | None:
        outcome = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if outcome == "down":
            raise StoreUnavailableError("inventory store at redis://x: connection refused")
        if outcome == "refused":
            raise OversizedRecordError(REFUSAL)
        return self.calls

    def beat_agent(self, name: str, heartbeat: float) -> bool:
        return False


#: (name, the store's answers to the agent's writes, ready, the refusal /readyz gives)
READINESS = [
    ("never-written", ["down"], False, None),
    ("written", ["ok"], True, None),
    ("outage-after-a-write", ["ok", "down"], False, None),
    ("refused-after-a-write", ["ok", "refused"], False, REFUSAL),
    ("refused-then-taken", ["ok", "refused", "refused", "ok"], True, None),
]


@pytest.mark.parametrize(("script", "ready", "refused"), [r[1:] for r in READINESS], ids=[r[0] for r in READINESS])
def test_readiness_says_whether_the_store_takes_the_reports(cache: Path, script: list[str], ready: bool,
                                                            refused: str | None) -> None:
    store = ScriptedReporter(script)
    a = Agent(AgentSettings(node_name=NODE, cache_root=cache, interval_s=0.01, heartbeat_s=0.01,
                            backoff_initial_s=0.01, backoff_max_s=0.02), lambda: store)
    with running(a):
        wait_until(lambda: store.calls >= len(script) + 2, what="the script played")
        ok, detail = agent_ready(a)
    assert (ok, detail["refused"]) == (ready, refused)


# ---- node labels -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "ready", "expected"),
    [
        pytest.param({}, ["llama3-8b"], {"extender.io/llama3-8b.weights": "ready"}, id="new ready workload"),
        pytest.param({"extender.io/llama3-8b.weights": "ready"}, ["llama3-8b"], {}, id="steady: nothing"),
        pytest.param({"extender.io/old.weights": "ready", "team": "ml"}, [], {"extender.io/old.weights": None},
                     id="no longer ready: removed, foreign labels untouched"),
        pytest.param({"extender.io/other": "x"}, [], {}, id="our prefix, not our suffix: untouched"),
        pytest.param({}, ["x" * 60], {}, id="name too long for a label key: skipped"),
    ],
)
def test_label_patch(current: dict[str, str], ready: list[str], expected: dict[str, str | None]) -> None:
    assert label_patch(current, ready) == expected


def test_label_key() -> None:
    assert label_key("qwen3-moe") == "extender.io/qwen3-moe.weights"
    assert label_key("-bad") is None


@pytest.mark.integration
def test_node_labels_follow_readiness(cache: Path, clients: Clients, tmp_path: Path) -> None:
    with KubeDouble.running() as double:
        double.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"team": "ml"}}})
        kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kc")))
        try:
            a = Agent(AgentSettings(node_name=NODE, cache_root=cache), clients.open,
                      labeler=NodeLabeler(kube, NODE))
            a.step()
            labels = kube.get_node(NODE)["metadata"]["labels"]
            assert labels == {"team": "ml", "extender.io/llama3-8b.weights": "ready"}
            a.step()
            assert double.count("patch", "nodes") == 1  # steady: no second patch
            (weights_dir(cache, "llama3-8b", "main") / COMPLETE).unlink()
            a.step()
            assert kube.get_node(NODE)["metadata"]["labels"] == {"team": "ml"}
            assert double.count("patch", "nodes") == 2
            double.fail("patch", "nodes", 500)
            mark_complete(weights_dir(cache, "llama3-8b", "main"))
            writes = a.stats.writes
            a.step()  # the API fails: the report is still written, the label is retried after the next scan
            assert a.stats.writes == writes + 1
            assert "extender.io/llama3-8b.weights" not in kube.get_node(NODE)["metadata"]["labels"]
            a.step()
            assert kube.get_node(NODE)["metadata"]["labels"]["extender.io/llama3-8b.weights"] == "ready"
        finally:
            kube.close()


@pytest.mark.integration
def test_node_labels_removed_or_lost_with_the_node_come_back_at_the_next_resync(
        cache: Path, clients: Clients, tmp_path: Path) -> None:
    """Someone removes the label, or the Node is deleted and registers again: the agent's idea of
    the labels is stale, and only a fresh read can tell."""
    ready = {"extender.io/llama3-8b.weights": "ready"}
    with KubeDouble.running() as double:
        double.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kc")))
        clock = [0.0]
        try:
            a = Agent(AgentSettings(node_name=NODE, cache_root=cache, label_resync_s=600), clients.open,
                      labeler=NodeLabeler(kube, NODE), monotonic=lambda: clock[0])
            a.step()
            assert kube.get_node(NODE)["metadata"].get("labels") == ready
            kube.patch_node(NODE, {"metadata": {"labels": {"extender.io/llama3-8b.weights": None}}})
            clock[0] = 599.0
            gets = double.count("get", "nodes")
            a.step()  # within the resync: no read, so nothing noticed
            assert double.count("get", "nodes") == gets
            assert not kube.get_node(NODE)["metadata"].get("labels")
            clock[0] = 600.0
            a.step()
            assert kube.get_node(NODE)["metadata"]["labels"] == ready
            double.remove("v1", "Node", NODE)
            double.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            clock[0] = 1200.0
            a.step()
            assert kube.get_node(NODE)["metadata"].get("labels") == ready
            patches = double.count("patch", "nodes")
            clock[0] = 1800.0
            a.step()  # a resync that finds the labels right sends nothing
            assert double.count("patch", "nodes") == patches
        finally:
            kube.close()


# ---- the command ---------------------------------------------------------------------------------

COMMAND = ("import argparse, sys\n"
           "from extender.agent import commands\n"
           "p = argparse.ArgumentParser(); commands.register(p.add_subparsers())\n"
           "a = p.parse_args(sys.argv[1:]); sys.exit(a.handler(a))\n")


def run_command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    return subprocess.run([sys.executable, "-c", COMMAND, "agent", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**base, "PYTHONPATH": str(ROOT), **(env or {})}, check=False)


def test_dry_run_prints_the_report(cache: Path) -> None:
    out = run_command("--node-name", NODE, "--cache-root", str(cache), "--dry-run")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["node"] == NODE
    assert report["weights"] == {"llama3-8b/main": 16 * GiB, "mixtral-61g/v1": 43 * GiB}


def test_once_writes_one_report(cache: Path, redis_server: RedisServer, reader: SourceStore) -> None:
    out = run_command("--cache-root", str(cache), "--once", "--redis-url", redis_server.url, env={"NODE_NAME": NODE})
    assert out.returncode == 0, out.stderr
    state = reader.store.get(NODE)
    assert state is not None and state.snapshots == ("llama3-8b/main",)


def test_once_fails_when_redis_is_down(cache: Path, redis_server: RedisServer) -> None:
    redis_server.kill()
    out = run_command("--node-name", NODE, "--cache-root", str(cache), "--once", "--redis-url", redis_server.url)
    assert out.returncode == 1 and "unavailable" in out.stderr


def test_the_loop_stops_on_sigterm(cache: Path, redis_server: RedisServer, reader: SourceStore) -> None:
    proc = subprocess.Popen([sys.executable, "-c", COMMAND, "agent", "--node-name", NODE, "--cache-root", str(cache),
                             "--interval", "0.1", "--redis-url", redis_server.url],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _get(reader) is not None or proc.poll() is not None, what="the agent's report")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_missing_node_name_is_a_usage_error(cache: Path) -> None:
    out = run_command("--cache-root", str(cache), "--dry-run")
    assert out.returncode == 2 and "--node-name" in out.stderr


class BadNodeName(NamedTuple):
    """A node name given the agent that no record may be stored under."""

    args: tuple[str, ...]
    env: dict[str, str]


BAD_NODE_NAMES = {
    "flag-with-uppercase-and-underscore": BadNodeName(("--node-name", "N_1"), {}),
    "environment-with-a-space": BadNodeName((), {"NODE_NAME": "gpu 1"}),
}


@pytest.mark.parametrize("row", BAD_NODE_NAMES.values(), ids=BAD_NODE_NAMES.keys())
def test_a_node_name_that_is_no_kubernetes_name_is_refused_at_start(
        cache: Path, redis_server: RedisServer, reader: SourceStore, row: BadNodeName) -> None:
    out = run_command(*row.args, "--cache-root", str(cache), "--once", "--redis-url", redis_server.url, env=row.env)
    assert out.returncode == 2 and "not a Kubernetes node name" in out.stderr, out.stderr
    assert reader.store.names() == frozenset()  # nothing written that every reader would skip
