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

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
from redis.client import NEVER_DECODE

from extender import cli
from extender.api.scheduler.metrics import Metrics
from extender.api.scheduler.refresher import Refresher, Throttle
from extender.api.scheduler.settings import Settings
from extender.core.calibration import Observation
from extender.state import InventoryStore, connect
from extender.state.errors import raw_reply
from extender.state.observations import CalibratedPolicy, ObservationStore
from extender.state.observations import encode as encode_observation
from tests.conftest import RedisServer
from tests.test_calibration_sync import APPLY, POLICY_TEXT, doubled_starts
from tests.test_mixed_releases import RECORD_OF_DECISION
from tests.test_scale_loop import T0, make_rig

pytestmark = pytest.mark.integration

Setup = Callable[[redis.Redis], object]


@pytest.fixture
def client(redis_server: RedisServer, tmp_path: Path) -> Iterator[redis.Redis]:
    c = connect(redis_server.url, tmp_path)
    yield c
    c.close()


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
                        start_refresher=False, min_rebuild_interval_s=0.0, calibration_interval_s=0.0)
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
