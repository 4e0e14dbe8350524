"""Demand history and decision records in a real Redis: order, bounds, restarts, fencing, unreadable data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from extender.core.errors import FencedOutError, StateError, StoreUnavailableError
from extender.state import connect
from extender.state.decisions import DecisionStore, Published
from extender.state.history import HistoryStore, Sample
from extender.state.lock import LeaderLock
from tests.conftest import RedisServer


@pytest.fixture
def parts(redis_server: RedisServer, tmp_path: object) -> tuple[HistoryStore, DecisionStore, LeaderLock, int]:
    client = connect(redis_server.url, "/nonexistent")
    lock = LeaderLock(client, "a", ttl_s=60)
    return HistoryStore(client, max_age_s=100, max_points=5), DecisionStore(client, keep=3), lock, lock.acquire().token


SAMPLES = [
    ("plain", Sample(1000.5, 4.25, 3.0)),
    ("zero", Sample(0.0, 0.0, 0.0)),
    ("tiny-and-huge", Sample(1.7e9, 1e-12, 1e12)),
    # a time from numpy (np.arange) encoded as 'np.float64(...)': Redis refused the whole append
    ("numpy-scalars", Sample(np.float64(1.7e9), np.float64(4.25), np.float64(0.5))),
]


@pytest.mark.parametrize("sample", [s[1] for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_sample_round_trips(sample: Sample) -> None:
    assert Sample.decode(sample.encode()) == sample


def test_append_and_read_in_time_order(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    history, _, lock, token = parts
    lock.commit(token, history.stage_append("w", [Sample(30, 3), Sample(10, 1)], now=30))
    lock.commit(token, history.stage_append("w", [Sample(20, 2, 5)], now=30))
    assert history.read("w") == [Sample(10, 1), Sample(20, 2, 5), Sample(30, 3)]
    assert history.read("other") == []


def test_bounded_by_age_and_by_count(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    history, _, lock, token = parts
    # max_age 100 s: at now=200 everything before t=100 goes; max_points 5 keeps the newest five
    lock.commit(token, history.stage_append("w", [Sample(t, t) for t in range(0, 200, 10)], now=200))
    assert [s.t for s in history.read("w")] == [150, 160, 170, 180, 190]
    assert history.length("w") == 5
    lock.commit(token, history.stage_append("w", [], now=275))  # trimming happens even without a new sample
    assert [s.t for s in history.read("w")] == [180, 190]
    assert [s.t for s in history.read("w", now=285)] == [190]  # a reader may ask for less


def test_samples_from_a_clock_ahead_are_skipped_then_removed(
        parts: tuple[HistoryStore, DecisionStore, LeaderLock, int], caplog: pytest.LogCaptureFixture) -> None:
    history, _, lock, token = parts
    # a replica 40 s ahead wrote its samples at its own now; this replica's now is 110
    lock.commit(token, history.stage_append("w", [Sample(100, 1), Sample(140, 2), Sample(150, 3)], now=150))
    assert history.read("w", now=110) == [Sample(100, 1)]
    assert "skipped 2 samples dated up to 40s after now" in caplog.text
    assert [s.t for s in history.read("w")] == [100, 140, 150]  # a reader without a clock sees all
    lock.commit(token, history.stage_append("w", [Sample(110, 4)], now=110))
    assert history.read("w") == [Sample(100, 1), Sample(110, 4)]


def test_a_sample_after_now_is_refused(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    history, *_ = parts
    with pytest.raises(ValueError, match=r"cannot be dated after now \(10\)"):
        history.stage_append("w", [Sample(11, 1)], now=10)


def test_history_survives_a_restart_of_the_scaler(redis_server: RedisServer) -> None:
    first = connect(redis_server.url, "/nonexistent")
    lock = LeaderLock(first, "old", ttl_s=60)
    token = lock.acquire().token
    lock.commit(token, HistoryStore(first).stage_append("w", [Sample(1, 2.0), Sample(2, 3.0)], now=2))
    lock.release(token)
    first.close()
    # a new process: new client, new store objects, same Redis
    again = HistoryStore(connect(redis_server.url, "/nonexistent"))
    assert again.read("w") == [Sample(1, 2.0), Sample(2, 3.0)]


def test_a_fenced_out_write_changes_nothing(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    history, decisions, lock, token = parts
    with pytest.raises(FencedOutError):
        lock.commit(token + 1, history.stage_append("w", [Sample(1, 1)], now=1),
                    decisions.stage_record("w", {"t": 1}))
    assert history.read("w") == []
    assert decisions.records("w") == []


@pytest.mark.parametrize("bad", [Sample(math.nan, 1), Sample(1, math.inf), Sample(1, 1, -math.inf)],
                         ids=["nan-time", "infinite-rate", "infinite-queue"])
def test_non_finite_samples_are_refused(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int],
                                        bad: Sample) -> None:
    history, *_ = parts
    with pytest.raises(ValueError, match="finite"):
        history.stage_append("w", [bad], now=1)


UNREADABLE_SAMPLES = [
    ("words", b"not a sample"),
    ("two-numbers", b"5 1"),
    ("nan-rate", b"5 nan 0"),
    ("infinite-time", b"inf 1 0"),
    ("not-utf8", b"5 \xff 0"),
    ("empty", b""),
    # Python's float() read these as numbers; nothing of ours writes them
    ("underscore-in-a-rate", b"5 1_000 0"),
    ("arabic-indic-time", "١٢٣ 1 0".encode()),
    ("full-width-queue", "5 1 １２".encode()),
]


@pytest.mark.parametrize("member", [m for _, m in UNREADABLE_SAMPLES], ids=[n for n, _ in UNREADABLE_SAMPLES])
def test_an_unreadable_sample_is_skipped_then_removed(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int],
                                                      member: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """One bad member used to stop every decision of the workload until it aged out (three days)."""
    history, _, lock, token = parts
    lock.commit(token, history.stage_append("w", [Sample(1, 1), Sample(9, 2)], now=10))
    history.client.zadd(history.key("w"), {member: 5})
    with caplog.at_level("WARNING", logger="extender.state.history"):
        assert history.read("w", now=10) == [Sample(1, 1), Sample(9, 2)]
    assert "skipped 1 unreadable sample" in caplog.text
    assert history.length("w") == 3  # a read writes nothing
    lock.commit(token, history.stage_append("w", [Sample(10, 3)], now=10))
    assert history.length("w") == 3 and history.read("w", now=10)[-1] == Sample(10, 3)


def test_an_append_removes_only_what_its_own_read_skipped(
        parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    history, _, lock, token = parts
    history.client.zadd(history.key("w"), {"broken": 5})
    lock.commit(token, history.stage_append("w", [Sample(6, 1)], now=10))  # nothing read yet: nothing known
    assert history.length("w") == 2
    history.read("w", now=10)
    lock.commit(token, history.stage_append("w", [], now=10))
    assert history.length("w") == 1
    history.client.zadd(history.key("w"), {"broken again": 7})
    lock.commit(token, history.stage_append("w", [], now=10))  # a removal is done once, not remembered
    assert history.length("w") == 2


UNREADABLE_RECOMMENDATIONS = [
    ("one-word", b"12.5"),
    ("fractional-replicas", b"12.5 2.5"),
    ("negative-replicas", b"12.5 -1"),
    ("nan-time", b"nan 3"),
    ("not-utf8", b"12.5 \xff"),
    ("underscore-in-replicas", b"12.5 1_000"),
    ("arabic-indic-replicas", "12.5 ١٢٣".encode()),
    ("full-width-time", "１２ 3".encode()),
]


@pytest.mark.parametrize("member", [m for _, m in UNREADABLE_RECOMMENDATIONS],
                         ids=[n for n, _ in UNREADABLE_RECOMMENDATIONS])
def test_an_unreadable_recommendation_starts_the_window_anew(
        parts: tuple[HistoryStore, DecisionStore, LeaderLock, int], member: bytes,
        caplog: pytest.LogCaptureFixture) -> None:
    """Empty, not without the bad entry: it may have been the highest, and an empty window holds
    scale-downs (extender.core.scaler) where a partial one could allow one too early."""
    _, decisions, lock, token = parts
    lock.commit(token, decisions.stage_recommendations("w", [(10.0, 3), (25.0, 4)]))
    decisions.client.zadd(decisions.recommendations_key("w"), {member: 20.0})
    with caplog.at_level("WARNING", logger="extender.state.decisions"):
        assert decisions.recommendations("w") == []
    assert "stabilisation window starts anew" in caplog.text


def test_unreadable_records_are_a_state_error(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    history, decisions, *_ = parts
    history.client.lpush(decisions.log_key("w"), "{broken")
    with pytest.raises(StateError, match="holds no readable record among its newest 1 \\(entry 0 is not JSON\\)"):
        decisions.records("w")
    history.client.hset(decisions.published_key, "w", '{"desired": 1}')
    with pytest.raises(StateError, match="published metrics of 'w' are unreadable"):
        decisions.published()


def test_store_outage_is_store_unavailable(redis_server: RedisServer) -> None:
    history = HistoryStore(connect(redis_server.url, "/nonexistent"))
    redis_server.kill()
    with pytest.raises(StoreUnavailableError):
        history.read("w")


def test_decision_log_is_newest_first_and_trimmed(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    _, decisions, lock, token = parts
    for i in range(5):
        lock.commit(token, decisions.stage_record("w", {"t": i}))
    assert [r["t"] for r in decisions.records("w", 10)] == [4, 3, 2]  # keep=3
    assert decisions.records("w") == [{"t": 4}]
    with pytest.raises(ValueError):
        decisions.stage_record("w", {"t": math.nan})


def test_recommendations_are_replaced_as_a_window(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    _, decisions, lock, token = parts
    lock.commit(token, decisions.stage_recommendations("w", [(10.0, 3), (25.0, 4)]))
    lock.commit(token, decisions.stage_recommendations("w", [(25.0, 4), (40.0, 2)]))
    assert decisions.recommendations("w") == [(25.0, 4), (40.0, 2)]
    lock.commit(token, decisions.stage_recommendations("w", []))
    assert decisions.recommendations("w") == []


def test_published_values_round_trip(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    _, decisions, lock, token = parts
    value = Published(desired=7, load=26.5, unit="requests/s", t=1000.0, window=15, token=token)
    lock.commit(token, decisions.stage_published("qwen3", value))
    assert decisions.published() == {"qwen3": value}
    with pytest.raises(ValueError):
        decisions.stage_published("qwen3", Published(1, math.nan, "requests/s", 1.0, 15, token))


def test_samples_of_numpy_scalars_are_stored(parts: tuple[HistoryStore, DecisionStore, LeaderLock, int]) -> None:
    # redis-py sends a numpy score as its repr, 'np.float64(30.0)', and Redis refused the whole append
    history, _, lock, token = parts
    samples = [Sample(t, t / 10) for t in np.arange(10.0, 40.0, 10.0)]
    lock.commit(token, history.stage_append("w", samples, now=np.float64(30.0)))
    assert history.read("w") == [Sample(10.0, 1.0), Sample(20.0, 2.0), Sample(30.0, 3.0)]
