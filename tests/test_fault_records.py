"""Fault suite, stored records: bad values in Redis under our prefix, read by every component that reads them.

A record can be bad because of a bug, a half-done upgrade (another release wrote it), a hand edit
with redis-cli, or a key of another Redis type under our prefix. The properties, checked on every
row and every generated example, whatever the value:

* no reader raises anything but our errors, and no long-running loop stops (the extender's
  refresher keeps its snapshot, the scaler's tick returns a report);
* a bad value is skipped with a warning that names its key, and the good values beside it are
  still used;
* nothing a reader could not read is deleted or rewritten by the read (``DUMP`` of every key is the
  same before and after), unless the design says so (the demand history's next fenced write).

The named rows are the defects found by the generators below, each the smallest value that showed
it; the ``@given`` tests write what hypothesis makes of each key kind into a real Redis (one server
per test, flushed per example) and run the store's readers on it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from redis.client import NEVER_DECODE

from extender import cli
from extender.api.scheduler.metrics import Metrics
from extender.api.scheduler.refresher import Refresher, Throttle
from extender.api.scheduler.settings import Settings
from extender.core.calibration import Observation
from extender.core.errors import ExtenderError, StateError
from extender.core.inventory import NodeState
from extender.core.policy import Policy
from extender.core.reports import AgentReport, KubeReport
from extender.files import load_policy
from extender.keda.reading import Served, UnreadableDecisionError, read, resolve
from extender.kube.metrics import SyncMetrics
from extender.state import InventoryStore
from extender.state.commands import parse_inventory
from extender.state.decisions import DecisionStore, Published
from extender.state.errors import raw_reply
from extender.state.history import HistoryStore
from extender.state.lock import LeaderLock
from extender.state.observations import CalibratedPolicy, ObservationStore, read_nodes
from extender.state.observations import encode as encode_observation
from extender.state.sources import SourceStore
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.test_calibration_sync import APPLY, POLICY_TEXT, doubled_starts
from tests.test_external_metrics import make_app as metrics_app
from tests.test_mixed_releases import RECORD_OF_DECISION
from tests.test_scale_loop import T0, make_rig
from tests.test_sync import G5_12, POLICY_FILE, eventually, running_sync
from tests.test_sync import node as sync_node

pytestmark = pytest.mark.integration

Setup = Callable[[redis.Redis], object]


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


def dump_all(client: redis.Redis) -> dict[bytes, Any]:
    """Every key under our prefix with its serialized value, as bytes: what a read must leave as it found."""
    keys = raw_reply(client, "listing keys", "KEYS", "extender:*")
    return {k: client.execute_command("DUMP", k, **{NEVER_DECODE: True})  # type: ignore[no-untyped-call]
            for k in sorted(keys)}


def unchanged(client: redis.Redis, before: dict[bytes, Any]) -> bool:
    """Does every key of ``before`` still hold what it held (other keys may have been written since)?"""
    after = dump_all(client)
    return {k: after.get(k) for k in before} == before


def warned(caplog: pytest.LogCaptureFixture, key: str) -> bool:
    """Was a warning (or worse) logged that names ``key``?"""
    return any(r.levelno >= logging.WARNING and key in r.getMessage() for r in caplog.records)


# ---- calibration: the observed starts and their counters -------------------------------------------

GOOD_PAIR = "llama3-8b:g5.12xlarge"


class BadCalibration(NamedTuple):
    setup: Setup
    key: str  # the key the warning must name


CALIBRATION_ROWS = [
    # each was a ValueError out of ObservationStore.read: CalibratedPolicy lets only our errors by, so
    # the extender's refresher failed every iteration before reading the inventory (a stale snapshot,
    # neutral replies for good), the scaler's loop thread ended, `calibrate show` printed a traceback
    pytest.param(BadCalibration(lambda c: c.hset("extender:calibration:discarded", "stale inventory", "x"),
                                "extender:calibration:discarded"), id="a-discard-count-that-is-no-number"),
    pytest.param(BadCalibration(lambda c: c.hset("extender:calibration:discarded", "stale inventory", "1.5"),
                                "extender:calibration:discarded"), id="a-discard-count-that-is-no-whole-number"),
    pytest.param(BadCalibration(lambda c: c.set("extender:calibration:version", "\N{SUPERSCRIPT TWO}"),
                                "extender:calibration:version"), id="a-version-str-isdigit-calls-a-digit"),
    # a StateError for the whole read: one pair of another type lost every pair's fit
    pytest.param(BadCalibration(lambda c: (c.sadd("extender:calibration:pairs", "chat:h100"),
                                           c.set("extender:calibration:observations:chat:h100", "x")),
                                "extender:calibration:observations:chat:h100"), id="a-pair-key-of-another-type"),
]


def _observed(client: redis.Redis) -> list[Observation]:
    starts = doubled_starts(APPLY)
    ObservationStore(client).append(starts, {"stale inventory": 2}, now=time.time())
    return starts


def _refresher(client: redis.Redis, tmp_path: Path) -> Refresher:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_TEXT + "calibration: {mode: apply}\n")
    settings = Settings(policy_path=path, policy=APPLY, store_factory=lambda: InventoryStore(client),
                        start_refresher=False, min_rebuild_interval_s=0.0, calibration_interval_s=0.0,
                        calibration_duty_factor=0.0)
    return Refresher(settings, APPLY, Metrics(), Throttle(60.0))


@pytest.mark.parametrize("row", CALIBRATION_ROWS)
def test_a_bad_calibration_value_is_skipped_by_every_reader(
        redis_server: RedisServer, client: redis.Redis, tmp_path: Path, row: BadCalibration, *,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    starts = _observed(client)
    row.setup(client)
    before = dump_all(client)
    stored = ObservationStore(client).read()
    assert sorted(map(encode_observation, stored.observations)) == sorted(map(encode_observation, starts))
    assert warned(caplog, row.key)
    # the extender: its refresher reads the inventory and scores with the fit of the good pair
    refresher = _refresher(client, tmp_path)
    refresher.refresh_once()
    refresher.refresh_once()
    assert refresher.error is None and refresher.engine is not None and refresher.engine.policy is not APPLY
    # the scaler: its tick calibrates first, outside any handler (LoopThread.run would end with it)
    assert CalibratedPolicy(ObservationStore(client), min_interval_s=0.0).policy_for(APPLY) is not APPLY
    rig = make_rig(redis_server.url, lambda t: 4.0, scaling_extra="calibration: {mode: apply}\n")
    rig.loop.calibration = CalibratedPolicy(ObservationStore(rig.client), clock=lambda: T0, min_interval_s=0.0)
    (decided,) = rig.run(1)
    assert decided.desired >= 1
    # `extender calibrate show`: the fit, no traceback
    path = tmp_path / "policy.yaml"
    assert cli.main(["calibrate", "show", "--policy", str(path), "--redis-url", redis_server.url]) == 0
    assert "llama3-8b on g5.12xlarge: 40 observation(s)" in capsys.readouterr().out
    assert unchanged(client, before)


# ---- the scaler's decision log: `extender scale explain` --------------------------------------------

LOG_KEY = "extender:scaler:decisions:chat"


class BadDecision(NamedTuple):
    entries: list[str | bytes]  # pushed in this order: the last is the newest
    code: int  # explain's exit status
    says: str  # in its output (stdout when 0, the one line on stderr when 1)


def _good_record() -> str:
    return json.dumps(RECORD_OF_DECISION)


DECISION_ROWS = [
    # was `extender: decision log of 'chat' holds unreadable JSON`, exit 1: the good ones were not shown
    pytest.param(BadDecision([_good_record(), '{"t": 1'], 0, "decided 2023-11-14"), id="the-newest-cut-short"),
    pytest.param(BadDecision([_good_record(), "[1, 2]", b"\xff"], 0, "decided 2023-11-14"),
                 id="a-list-and-a-byte-that-is-no-utf-8"),
    pytest.param(BadDecision(["null", "{"], 1, f"the decision log {LOG_KEY!r} holds no readable record"),
                 id="nothing-readable-is-an-error-naming-the-key"),
    # was an OverflowError traceback: datetime holds no such time
    pytest.param(BadDecision([json.dumps({**RECORD_OF_DECISION, "t": 1e20})], 1, "OverflowError"),
                 id="a-time-past-the-year-9999"),
    pytest.param(BadDecision([_good_record().replace('"t": 1700000000.0', '"t": 1e400')], 1,
                             "holds a record this release cannot show"), id="an-infinite-time"),
]


@pytest.mark.parametrize("row", DECISION_ROWS)
def test_explain_skips_an_unreadable_decision_and_shows_the_rest(
        redis_server: RedisServer, client: redis.Redis, row: BadDecision, *, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    for entry in row.entries:
        client.lpush(LOG_KEY, entry)
    before = dump_all(client)
    assert cli.main(["scale", "explain", "chat", "--last", "5", "--redis-url", redis_server.url]) == row.code
    out, err = capsys.readouterr()
    if row.code == 0:
        assert row.says in out and warned(caplog, LOG_KEY)
    else:
        assert err.startswith("extender: ") and row.says in err and err.count("\n") == 1, err
    assert unchanged(client, before)


# ---- the generators: every key kind, every reader of the store ----------------------------------------

#: Examples per generated test: each is a flushed store, a few writes and every reader once.
EXAMPLES = 40
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: Texts a person or a tool leaves where a number or a JSON document belongs.
SPECIAL = ["", " ", "nan", "-inf", "inf", "1e400", "-1", "0", "1e20", "\N{SUPERSCRIPT TWO}", "\u0661\u0662",
           "null", "[]", "{}", "true", '"x"', "{", "1 2", "1 2 3", "1e400 1 1", "1 -2"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)
GARBAGE: st.SearchStrategy[str | bytes] = st.one_of(
    st.sampled_from(SPECIAL), st.text(max_size=24), st.binary(max_size=24), JSON_VALUES.map(json.dumps))
#: Every Redis type a key can have; each writer below puts ``value`` in it.
TYPES = ("string", "hash", "list", "set", "zset", "stream")


def write_typed(client: redis.Redis, key: str, kind: str, value: str | bytes) -> None:
    """Replace ``key`` with a value of Redis type ``kind`` holding ``value`` (a stream: one entry)."""
    client.delete(key)
    if kind == "string":
        client.set(key, value)
    elif kind == "hash":
        client.hset(key, "f", value)
    elif kind == "list":
        client.rpush(key, value)
    elif kind == "set":
        client.sadd(key, value)
    elif kind == "zset":
        client.zadd(key, {value: 1.0})  # type: ignore[type-var]
    else:
        client.xadd(key, {"f": value})


@st.composite
def mutated_json(draw: st.DrawFn, base: dict[str, Any]) -> str | bytes:
    """``base`` with a field dropped, set to any JSON value or added, then maybe cut short; or plain garbage."""
    if draw(st.booleans()):
        return draw(GARBAGE)
    data = dict(base)
    field = draw(st.sampled_from([*base, "extra"]))
    if draw(st.booleans()) and field in data:
        del data[field]
    else:
        data[field] = draw(JSON_VALUES)
    text = json.dumps(data)
    return text[: draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


# ---- node records and the inventory's own keys ---------------------------------------------------------

GOOD_NODE = NodeState.model_validate({"name": "good-1", "nodeClass": "g5.12xlarge", "gpus": 4, "gpusFree": 4,
                                      "nvmeTotal": 10**12, "nvmeFree": 10**11, "images": ["vllm:1"],
                                      "heartbeat": 1000.0, "ttl": 10**9})
BAD_NODE = {"name": "bad", "nodeClass": "g5.12xlarge", "gpus": 4, "gpusFree": 1, "nvmeTotal": 10**12,
            "nvmeFree": 10**11, "images": ["vllm:1"], "weights": {"w/1": 10}, "heartbeat": 1000.0, "ttl": 60.0}
#: The inventory's own keys and the Redis type each holds.
INVENTORY_KEYS = {"extender:nodes": "set", "extender:compile-registry": "set", "extender:inventory:version": "string",
                  "extender:inventory:changes": "zset", "extender:heartbeats": "hash",
                  "extender:heartbeats:seq": "string", "extender:heartbeats:changes": "zset"}


def _inventory(client: redis.Redis) -> InventoryStore:
    store = InventoryStore(client)
    store.put(GOOD_NODE)
    store.add_registry("ck-1")
    store.beat_many({"good-1": 2000.0})
    return store


def _says_its_key(exc: StateError, key: str) -> bool:
    return key in str(exc)


def _read_everything(client: redis.Redis, url: str, tmp_path: Path, names: list[str],
                     capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Run every reader of the inventory; each result, or the StateError it raised."""
    out: dict[str, Any] = {}
    store = InventoryStore(client)
    readers: dict[str, Callable[[], Any]] = {
        "load_all": store.load_all, "changes_since": lambda: store.changes_since(0),
        "heartbeats_since": lambda: store.heartbeats_since(0), "versions": store.versions,
        "get": lambda: [store.get(n) for n in names], "read_nodes": lambda: read_nodes(store, names)}
    for name, reader in readers.items():
        try:
            out[name] = reader()
        except StateError as exc:
            out[name] = exc
        if name == "load_all":
            out["corrupt"] = dict(store.corrupt)
    refresher = _refresher(client, tmp_path)
    refresher.refresh_once()
    refresher.refresh_once()
    out["refresher"] = refresher
    capsys.readouterr()  # what earlier examples printed
    out["show"] = cli.main(["inventory", "show", "--json", "--redis-url", url])
    return out


@FUZZ
@given(kind=st.sampled_from(TYPES), value=mutated_json(BAD_NODE))
def test_a_bad_node_record_costs_only_itself(redis_server: RedisServer, client: redis.Redis, tmp_path: Path, *,
                                            capsys: pytest.CaptureFixture[str], kind: str, value: str | bytes) -> None:
    client.flushdb()
    _inventory(client)
    client.sadd("extender:nodes", "bad")
    client.zadd("extender:inventory:changes", {"bad": 1})
    write_typed(client, "extender:node:bad", kind, value)
    before = dump_all(client)
    got = _read_everything(client, redis_server.url, tmp_path, ["good-1", "bad"], capsys)
    _, records, registry = got["load_all"]
    assert "good-1" in {r.name for r in records} and registry == {"ck-1"}
    assert ("bad" in {r.name for r in records}) != ("extender:node:bad" in got["corrupt"])
    assert got["changes_since"][1]["good-1"] is not None
    assert "good-1" in got["read_nodes"][0]
    if isinstance(got["get"], StateError):  # one node asked for: unreadable is an error, never "absent"
        assert _says_its_key(got["get"], "extender:node:bad")
    refresher = got["refresher"]
    assert refresher.error is None and refresher.engine is not None
    assert "good-1" in {n.name for n in refresher.engine.snapshot.nodes}
    assert got["show"] == 0
    document = parse_inventory(capsys.readouterr().out, "shown")  # what show prints, load takes back
    assert "good-1" in {n.name for n in document.nodes}
    assert unchanged(client, before)


@FUZZ
@given(key=st.sampled_from(sorted(INVENTORY_KEYS)), kind=st.sampled_from(TYPES), value=GARBAGE)
def test_an_inventory_key_of_another_type_or_value_is_an_error_naming_it(
        redis_server: RedisServer, client: redis.Redis, tmp_path: Path, *, capsys: pytest.CaptureFixture[str],
        key: str, kind: str, value: str | bytes) -> None:
    client.flushdb()
    _inventory(client)
    write_typed(client, key, kind, value)
    before = dump_all(client)
    got = _read_everything(client, redis_server.url, tmp_path, ["good-1"], capsys)
    for name in ("load_all", "changes_since", "heartbeats_since", "versions", "get", "read_nodes"):
        if isinstance(got[name], StateError):
            assert _says_its_key(got[name], key), (name, got[name])
    refresher = got["refresher"]  # fails open: an error it names, no exception out of an iteration
    assert refresher.error is None or key in refresher.error[1]
    _, err = capsys.readouterr()
    assert got["show"] == 0 or (got["show"] == 1 and key in err and "Traceback" not in err)
    assert unchanged(client, before)


# ---- an error names the key it is about --------------------------------------------------------------


class Named(NamedTuple):
    setup: Setup
    read: Callable[[redis.Redis], object]
    key: str


def _commit_on_a_garbage_fence(client: redis.Redis) -> None:
    lock = LeaderLock(client, "a", ttl_s=30.0)
    token = lock.acquire().token
    client.set("extender:scaler:fence", "zz")
    lock.commit(token)


def _read_nodes(client: redis.Redis) -> object:
    records, _ = read_nodes(InventoryStore(client), ["good-1", "bad"])
    assert "good-1" in records
    return records


NAMED_ROWS = [
    # each said WRONGTYPE without the key (a person must find it among every key of the prefix)
    pytest.param(Named(lambda c: (c.zadd("extender:heartbeats:changes", {"good-1": 9}),
                                  c.set("extender:heartbeats", "x")),
                       lambda c: InventoryStore(c).heartbeats_since(0), "extender:heartbeats"),
                 id="heartbeats-hash-of-another-type"),
    pytest.param(Named(lambda c: c.set("extender:scaler:history:chat", "x"),
                       lambda c: HistoryStore(c).read("chat"), "extender:scaler:history:chat"),
                 id="demand-history-of-another-type"),
    pytest.param(Named(lambda c: c.set("extender:scaler:recommendations:chat", "x"),
                       lambda c: DecisionStore(c).recommendations("chat"), "extender:scaler:recommendations:chat"),
                 id="stabilisation-window-of-another-type"),
    pytest.param(Named(lambda c: c.set("extender:scaler:published", "x"),
                       lambda c: DecisionStore(c).published_entries(), "extender:scaler:published"),
                 id="published-hash-of-another-type"),
    pytest.param(Named(lambda c: c.set("extender:scaler:decisions:chat", "x"),
                       lambda c: DecisionStore(c).records("chat"), "extender:scaler:decisions:chat"),
                 id="decision-log-of-another-type"),
    pytest.param(Named(lambda c: c.set("extender:source:gpu-1", "x"),
                       lambda c: SourceStore(InventoryStore(c)).agent_report("gpu-1"), "extender:source:gpu-1"),
                 id="source-reports-of-another-type"),
    pytest.param(Named(lambda c: c.lpush("extender:scaler:leader", "x"),
                       lambda c: LeaderLock(c, "a", ttl_s=30.0).acquire(), "extender:scaler:leader"),
                 id="scaler-lock-of-another-type"),
    # named the inventory version: the heartbeat sequence was the key holding it
    pytest.param(Named(lambda c: c.set("extender:heartbeats:seq", "x"),
                       lambda c: InventoryStore(c).versions(), "extender:heartbeats:seq"),
                 id="heartbeat-sequence-that-is-no-integer"),
    # `unexpected reply [0]`: a token that is no number ends the script's reply early
    pytest.param(Named(lambda c: c.hset("extender:scaler:leader", mapping={"holder": "b", "token": "t",
                                                                          "expires": str(10**15)}),
                       lambda c: LeaderLock(c, "a", ttl_s=30.0).acquire(), "extender:scaler:leader"),
                 id="scaler-lock-token-that-is-no-number"),
    # ValueError out of the fenced commit (the tick counted it as the workload's failure, unnamed)
    pytest.param(Named(lambda c: None, _commit_on_a_garbage_fence, "extender:scaler:fence"),
                 id="fence-that-is-no-number-at-commit"),
    pytest.param(Named(lambda c: c.set("extender:scaler:fence", "t"),
                       lambda c: LeaderLock(c, "a", ttl_s=30.0).fence(), "extender:scaler:fence"),
                 id="fence-that-is-no-number-read"),
    # the warning was pydantic's own text, four lines and a URL, naming the node but not its key
    pytest.param(Named(lambda c: (InventoryStore(c).put(GOOD_NODE), c.set("extender:node:bad", '{"name": 1}')),
                       _read_nodes, "extender:node:bad"),
                 id="the-sync-s-read-of-a-corrupt-record-warns-in-one-line"),
]


@pytest.mark.parametrize("row", NAMED_ROWS)
def test_a_bad_value_is_named_by_its_key(client: redis.Redis, row: Named, caplog: pytest.LogCaptureFixture) -> None:
    row.setup(client)
    before = dump_all(client)
    try:
        row.read(client)
    except ExtenderError as exc:  # ours, one line, naming the key
        assert row.key in str(exc) and "\n" not in str(exc), exc
    else:
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert any(row.key in m and "\n" not in m for m in said), said
    assert unchanged(client, before)


# ---- the scaler's keys: the decisions served, the history, the window, the log ------------------------

GOOD_PUBLISHED = Published(desired=5, load=17.5, unit="requests/s", t=T0 - 10, window=15, token=3, standby=2)
#: The scaler's per-workload keys of ``llama`` (beside qwen3, which the rig decides) and their types.
SCALER_KEYS = {"extender:scaler:history:llama": "zset", "extender:scaler:recommendations:llama": "zset",
               "extender:scaler:decisions:llama": "list", "extender:scaler:published": "hash"}
METRIC_PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/extender-desired-replicas"


def _put_in_place(client: redis.Redis, key: str, kind: str, value: str | bytes) -> None:
    """``value`` where a reader of ``key`` looks for an entry (its own type), or ``key`` of another type."""
    if kind != SCALER_KEYS[key]:
        write_typed(client, key, kind, value)
    elif kind == "zset":
        client.zadd(key, {value: 1.0})  # type: ignore[type-var]
    elif kind == "list":
        client.lpush(key, value)
    else:
        client.hset(key, "llama", value)


def _served(client: redis.Redis, workload: str, ns: str) -> tuple[int, dict[str, Any]]:
    app = metrics_app(published=DecisionStore(client).published_entries)
    reply = app.test_client().get(METRIC_PATH.format(ns=ns), query_string={"labelSelector": f"workload={workload}"})
    return reply.status_code, reply.get_json()


@FUZZ
@given(key=st.sampled_from(sorted(SCALER_KEYS)), kind=st.sampled_from(TYPES),
       value=st.one_of(GARBAGE, mutated_json(json.loads(GOOD_PUBLISHED.encode()))))
def test_a_bad_scaler_value_costs_only_its_workload(redis_server: RedisServer, client: redis.Redis, *, key: str,
                                                   kind: str, value: str | bytes) -> None:
    client.flushdb()
    client.hset("extender:scaler:published", "qwen3", GOOD_PUBLISHED.encode())
    _put_in_place(client, key, kind, value)
    before = dump_all(client)
    # the External Metrics API: qwen3 served, llama served or a Status naming its problem, never a 5xx
    # but the store's 503 (the published hash of another type), which names the key
    for workload, ns in (("qwen3", "default"), ("llama", "ml")):
        code, body = _served(client, workload, ns)
        if code == 503:
            assert key == "extender:scaler:published" and key in body["message"]
        elif workload == "qwen3":
            assert code == 200 and body["items"][0]["value"] == "5"
        else:
            assert code in {200, 404}, body
    # the KEDA scaler's read of the same entries
    try:
        published = DecisionStore(client).published_entries()
    except StateError as exc:
        assert key == "extender:scaler:published" and key in str(exc)
    else:
        served = {"qwen3": Served("default", 1), "llama": Served("ml", 0)}
        assert read(resolve("so", "default", {"workload": "qwen3"}, served), served, published).replicas == 5
        with contextlib.suppress(UnreadableDecisionError):  # llama's own entry unreadable: DATA_LOSS for it
            read(resolve("so", "ml", {"workload": "llama"}, served), served, published)
    # what the scaler reads of llama: the entries skipped, or our error naming the key
    history, decisions = HistoryStore(client), DecisionStore(client)
    for reader in (lambda: history.read("llama", now=T0), lambda: decisions.recommendations("llama"),
                   lambda: decisions.records("llama", 5)):
        try:
            reader()
        except StateError as exc:
            assert key in str(exc) and "\n" not in str(exc)
    assert unchanged(client, before)


# ---- calibration, the sources' reports, the lock --------------------------------------------------------

#: A pair of another workload and class beside the good one, where the generated value goes.
OTHER_PAIR_KEY = "extender:calibration:observations:chat:h100"
CALIBRATION_KEYS = {OTHER_PAIR_KEY: "zset", "extender:calibration:pairs": "set",
                    "extender:calibration:discarded": "hash", "extender:calibration:version": "string"}


@pytest.fixture(scope="module")
def few_starts() -> list[Observation]:
    return doubled_starts(APPLY, n=12)


@FUZZ
@given(key=st.sampled_from(sorted(CALIBRATION_KEYS)), kind=st.sampled_from(TYPES),
       value=st.one_of(GARBAGE, st.just({}).flatmap(lambda _: mutated_json(json.loads(encode_observation(
           doubled_starts(APPLY, n=1)[0]))))))
def test_a_bad_calibration_value_costs_only_itself(
        redis_server: RedisServer, client: redis.Redis, tmp_path: Path, few_starts: list[Observation], *,
        capsys: pytest.CaptureFixture[str], key: str, kind: str, value: str | bytes) -> None:
    client.flushdb()
    ObservationStore(client).append(few_starts, {"stale inventory": 1}, now=time.time())
    client.sadd("extender:calibration:pairs", "chat:h100")
    if kind == CALIBRATION_KEYS[key] == "zset":
        client.zadd(key, {value: time.time()})  # type: ignore[type-var]
    elif kind == CALIBRATION_KEYS[key] == "hash":
        client.hset(key, "by hand", value)
    elif kind == CALIBRATION_KEYS[key] == "set":
        client.sadd(key, value)
    else:
        write_typed(client, key, kind, value)
    before = dump_all(client)
    try:
        stored = ObservationStore(client).read()
    except StateError as exc:  # only the store's own keys of another type (not a pair's): named
        assert key in str(exc) and key != OTHER_PAIR_KEY and kind != CALIBRATION_KEYS[key]
    else:
        good = set(map(encode_observation, few_starts))
        assert good <= set(map(encode_observation, stored.observations))
    assert isinstance(CalibratedPolicy(ObservationStore(client), min_interval_s=0.0).policy_for(APPLY), Policy)
    capsys.readouterr()
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_TEXT + "calibration: {mode: apply}\n")
    code = cli.main(["calibrate", "show", "--json", "--policy", str(path), "--redis-url", redis_server.url])
    _, err = capsys.readouterr()
    assert code == 0 or (code == 1 and key in err and "Traceback" not in err)
    assert unchanged(client, before)


GOOD_AGENT = AgentReport(nvme_total=10**12, nvme_free=10**11, images=("vllm:1",), heartbeat=1000.0)
GOOD_KUBE = KubeReport(node_class="g5.12xlarge", gpus=4, gpus_free=4)


@FUZZ
@given(field=st.sampled_from(["agent", "kube", "deleted"]), kind=st.sampled_from(TYPES),
       value=st.one_of(GARBAGE, mutated_json(json.loads(GOOD_KUBE.model_dump_json(by_alias=True)))))
def test_a_bad_source_report_costs_only_its_node(client: redis.Redis, *, field: str, kind: str,
                                                 value: str | bytes) -> None:
    client.flushdb()
    sources = SourceStore(InventoryStore(client))
    sources.report_kube({"good-1": GOOD_KUBE, "bad": GOOD_KUBE})
    sources.report_agent("good-1", GOOD_AGENT)
    if kind == "hash":
        client.hset("extender:source:bad", field, value)
    else:
        write_typed(client, "extender:source:bad", kind, value)
    before = dump_all(client)
    try:
        reports = sources.kube_reports(["good-1", "bad"])
    except StateError as exc:  # the hash of another type: named
        assert kind != "hash" and "extender:source:bad" in str(exc)
    else:
        assert reports["good-1"] == GOOD_KUBE
    assert sources.agent_report("good-1") == GOOD_AGENT
    try:
        sources.agent_report("bad")
    except StateError as exc:
        assert kind != "hash" and "extender:source:bad" in str(exc)
    assert unchanged(client, before)


LOCK_FIELDS = st.dictionaries(st.sampled_from(["holder", "token", "expires", "acquired"]),
                              st.one_of(GARBAGE, st.integers().map(str), st.floats().map(repr)), max_size=4)


@FUZZ
@given(fields=LOCK_FIELDS, fence=st.one_of(st.none(), GARBAGE, st.integers().map(str)), kind=st.sampled_from(TYPES))
def test_a_bad_lock_stops_no_tick(redis_server: RedisServer, client: redis.Redis, *, fields: dict[str, str | bytes],
                                  fence: str | bytes | None, kind: str) -> None:
    client.flushdb()
    if kind == "hash":
        if fields:
            client.hset("extender:scaler:leader", mapping=fields)  # type: ignore[arg-type]
    else:
        write_typed(client, "extender:scaler:leader", kind, "x")
    if fence is not None:
        client.set("extender:scaler:fence", fence)
    rig = make_rig(redis_server.url, lambda t: 4.0)
    try:
        report = rig.loop.tick(T0)  # never raises: a leader, a standby, or the error it names
        if report.error:
            assert "extender:scaler:leader" in report.error or "extender:scaler:fence" in report.error, report.error
        for result in report.results:
            assert "unexpected error" not in (result.error or ""), result.error
    finally:
        rig.client.close()


# ---- the sync's writes read the source reports: one key of another type -------------------------------


def test_a_source_key_of_another_type_costs_the_sync_only_its_node(
        double: KubeDouble, redis_server: RedisServer, client: redis.Redis, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # the batch of up to 200 nodes it was in failed on WRONGTYPE, as an outage retried for ever: none
    # of them was written again, and the resync's read of the reports failed too
    client.set("extender:source:gpu-b", "by hand")
    policy = load_policy(POLICY_FILE)
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        double.apply(sync_node(name, G5_12, gpus=4))
    registry = CollectorRegistry()
    reader = SourceStore(InventoryStore(client))
    with running_sync(double, redis_server.url, tmp_path, policy, metrics=SyncMetrics(registry, policy)) as sync:
        for name in ("gpu-a", "gpu-c"):
            eventually(reader, name, lambda r: r is not None and r.gpus == 4, f"{name} written")
        wait_until(lambda: registry.get_sample_value("extender_sync_node_problems", {"kind": "refused"}) == 1.0,
                   what="gpu-b counted as refused")
        double.apply(sync_node("gpu-a", G5_12, gpus=8))
        eventually(reader, "gpu-a", lambda r: r is not None and r.gpus == 8, "a later change still written")
        assert not sync.outage
    assert client.get("extender:source:gpu-b") == "by hand" and reader.store.get("gpu-b") is None
    assert warned(caplog, "extender:source:gpu-b")


# ---- the scaler's fenced commit: all or nothing, even beside a key of another type ------------------------


@pytest.mark.parametrize("key", [
    # Redis applies the rest of a MULTI whose one command failed: the decision was published, the
    # sample and the window stored, and the tick reported the workload as failed
    pytest.param("extender:scaler:decisions:qwen3", id="the-decision-log-of-another-type"),
    pytest.param("extender:scaler:published", id="the-published-hash-of-another-type"),
])
def test_a_commit_beside_a_key_of_another_type_writes_nothing(redis_server: RedisServer, client: redis.Redis,
                                                              key: str) -> None:
    client.set(key, "by hand")
    rig = make_rig(redis_server.url, lambda t: 4.0)
    before = dump_all(client)
    report = rig.loop.tick(T0)
    (qwen,) = [r for r in report.results if r.workload == "qwen3"]
    assert report.leader and key in qwen.error and "nothing was written" in qwen.error
    assert client.exists("extender:scaler:history:qwen3", "extender:scaler:recommendations:qwen3") == 0
    assert client.type("extender:scaler:published") != "hash" or client.hget("extender:scaler:published",
                                                                             "qwen3") is None
    assert unchanged(client, before)
    rig.client.close()


@pytest.mark.parametrize("damage", [
    pytest.param(lambda c: c.set("extender:calibration:version", "x"), id="a-word"),
    pytest.param(lambda c: c.set("extender:calibration:version", "1_000"), id="an-underscore"),
    pytest.param(lambda c: c.set("extender:calibration:version", "\u0661\u0662"), id="arabic-indic-digits"),
    pytest.param(lambda c: c.set("extender:calibration:version", "\N{SUPERSCRIPT TWO}"), id="a-superscript-digit"),
    pytest.param(lambda c: c.hset("extender:calibration:version", "v", "3"), id="a-hash"),
])
def test_a_calibration_version_that_is_no_integer_is_restarted_by_the_next_append(
        client: redis.Redis, damage: Setup, caplog: pytest.LogCaptureFixture) -> None:
    # the append's INCR failed inside its MULTI after the starts and discard counts landed: the sync
    # recorded them again every pass (the discards counted again each time), and no reader refitted
    # until the key was fixed by hand
    store = ObservationStore(client)
    first = _observed(client)
    now = [time.time()]
    reader = CalibratedPolicy(ObservationStore(client), clock=lambda: now[0], min_interval_s=30.0)
    fitted = reader.policy_for(APPLY)
    assert fitted is not APPLY
    client.delete("extender:calibration:version")
    damage(client)
    now[0] += 60.0
    assert reader.policy_for(APPLY) is fitted  # the last fit is kept, and why is said naming the key
    assert reader.error is not None and "extender:calibration:version" in reader.error
    later = doubled_starts(APPLY, n=4)
    later = [o.model_copy(update={"pod": f"{o.pod}-later"}) for o in later]
    with caplog.at_level(logging.WARNING, logger="extender.state.observations"):
        version = store.append(later, {"stale inventory": 1}, now=now[0])
    assert version == int(now[0] * 1000) and store.version() == version  # above any count a reader holds
    assert any("extender:calibration:version" in r.getMessage() and "not an integer: restarted" in r.getMessage()
               for r in caplog.records)
    stored = store.read()
    assert sorted(map(encode_observation, stored.observations)) == sorted(map(encode_observation, first + later))
    assert stored.discarded == {"stale inventory": 3}  # 2 from the first append, 1 from this one, once each
    assert store.append([], {"stale inventory": 1}, now=now[0]) == version + 1  # counting on from there
    now[0] += 60.0
    refitted = reader.policy_for(APPLY)
    assert reader.error is None and refitted is not fitted
