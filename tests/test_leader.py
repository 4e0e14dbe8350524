"""Leader election and fencing: exactly one scaler acts, a standby takes over, a deposed leader's writes bounce.

* The lock's rules with the test's own clock: take, renew, stand by, expire, take over (token + 1),
  release.
* Fencing: a write with a stale token changes nothing, even when the takeover lands between the
  token check and the write.
* Two scaler loops on one Redis: the leader dies, the standby leads within ``ttl / tick`` ticks; a
  leader that was paused past its lease is refused when it wakes.
* Under contention (threads, real time, leases shorter than the pauses): the decision log, in
  commit order, never goes back to an older token.
* Two real ``extender scale`` processes: SIGKILL the leader, the other takes over; SIGTERM releases
  the lock.

Waits are bounded polls for a state (setup bounds), never assertions on time.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from extender.core.errors import FencedOutError
from extender.scaler.loop import ScaleLoop
from extender.scaler.observation import Observation
from extender.scaler.pods import Pod
from extender.state import connect
from extender.state.decisions import DecisionStore
from extender.state.history import HistoryStore
from extender.state.lock import LeaderLock
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.scaler_policy import make_policy, policy_text
from tests.vllm_endpoint import Counters, pod, serving

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_735_689_600.0
SETTLE_S = 60.0


def ms(t: float) -> int:
    return int(t * 1000)


@pytest.fixture
def client(redis_server: RedisServer) -> object:
    return connect(redis_server.url, "/nonexistent")


# ---- the lock ------------------------------------------------------------------------------------


def test_take_renew_standby_expire_take_over_release(client: object) -> None:
    now = [T0]
    a = LeaderLock(client, "a", ttl_s=30, clock=lambda: ms(now[0]))  # type: ignore[arg-type]
    b = LeaderLock(client, "b", ttl_s=30, clock=lambda: ms(now[0]))  # type: ignore[arg-type]
    first = a.acquire()
    assert (first.leader, first.token, first.expires_ms) == (True, 1, ms(T0 + 30))
    now[0] = T0 + 10
    assert (b.acquire().leader, b.acquire().holder) == (False, "a")
    renewed = a.acquire()
    assert (renewed.leader, renewed.token, renewed.expires_ms) == (True, 1, ms(T0 + 40))  # same token
    now[0] = T0 + 39.999
    assert not b.acquire().leader
    now[0] = T0 + 40  # expired: the next candidate takes it with a new token
    taken = b.acquire()
    assert (taken.leader, taken.token) == (True, 2)
    lost = a.acquire()
    assert (lost.leader, lost.holder, lost.token) == (False, "b", 2)
    assert b.current() == ("b", 2, ms(T0 + 70))
    assert not a.release(1)  # not a's to release
    assert b.release(2)
    assert b.current() is None
    again = a.acquire()
    assert (again.leader, again.token) == (True, 3)
    assert a.fence() == 3


def test_a_leader_that_expired_unnoticed_keeps_its_token(client: object) -> None:
    now = [T0]
    a = LeaderLock(client, "a", ttl_s=30, clock=lambda: ms(now[0]))  # type: ignore[arg-type]
    a.acquire()
    now[0] = T0 + 100  # nobody else came: nothing acted in between, so no new epoch is needed
    lease = a.acquire()
    assert (lease.leader, lease.token) == (True, 1)


def test_the_server_clock_is_the_default(client: object) -> None:
    a = LeaderLock(client, "a", ttl_s=0.2)  # type: ignore[arg-type]
    b = LeaderLock(client, "b", ttl_s=0.2)  # type: ignore[arg-type]
    assert a.acquire().leader
    assert not b.acquire().leader
    lease = wait_until(lambda: (got := b.acquire()).leader and got, timeout_s=SETTLE_S, interval_s=0.05,
                       what="the lease to expire on the server's clock")
    assert lease.token == 2


def test_a_stale_token_writes_nothing(client: object) -> None:
    lock = LeaderLock(client, "a", ttl_s=30)  # type: ignore[arg-type]
    token = lock.acquire().token
    history = HistoryStore(client)  # type: ignore[arg-type]
    with pytest.raises(FencedOutError, match="fencing token 7 is stale"):
        lock.commit(7, history.stage_append("w", [], now=1))
    def write(pipe: Any) -> None:
        pipe.set("x", "1")

    lock.commit(token, write)
    assert client.get("x") == "1"  # type: ignore[attr-defined]


def test_a_takeover_between_check_and_write_aborts_the_write(redis_server: RedisServer) -> None:
    old = connect(redis_server.url, "/nonexistent")
    other = connect(redis_server.url, "/nonexistent")
    now = [T0]
    a = LeaderLock(old, "a", ttl_s=30, clock=lambda: ms(now[0]))
    b = LeaderLock(other, "b", ttl_s=30, clock=lambda: ms(now[0]))
    token = a.acquire().token

    def write_while_b_takes_over(pipe: object) -> None:
        pipe.set("written-by-a", "1")  # type: ignore[attr-defined]
        now[0] = T0 + 31  # a stalls past its lease; b takes the lock on its own connection
        assert b.acquire().leader

    with pytest.raises(FencedOutError, match="changed hands during the write"):
        a.commit(token, write_while_b_takes_over)
    assert old.get("written-by-a") is None


# ---- two loops -----------------------------------------------------------------------------------


class Steady:
    name = "steady"

    def __init__(self, pause_s: float = 0.0) -> None:
        self.pause_s = pause_s

    def observe(self, pods: Sequence[Pod], now: float) -> Observation:
        if self.pause_s and random.random() < 0.3:
            time.sleep(self.pause_s)  # a GC pause, a stalled node: past the lease
        return Observation(rate=4.0, complete=True, expected=1, answered=1)


class OnePod:
    def list_pods(self, label_selector: str, namespace: str | None = None) -> list[dict[str, object]]:
        return [pod("qwen3-1", "10.0.0.1")] if label_selector == "extender.io/workload=qwen3" else []


def loop(client: object, holder: str, now: list[float] | None, *, ttl_s: float = 45.0, tick_s: float | None = None,
         pause_s: float = 0.0) -> ScaleLoop:
    clock = (lambda: ms(now[0])) if now is not None else None
    return ScaleLoop(policy=make_policy(), lock=LeaderLock(client, holder, ttl_s=ttl_s, clock=clock),  # type: ignore[arg-type]
                     history=HistoryStore(client), decisions=DecisionStore(client), pods=OnePod(),  # type: ignore[arg-type]
                     sources={"qwen3": Steady(pause_s)}, tick_s=tick_s)


def test_the_standby_takes_over_within_ttl_over_tick_ticks(client: object) -> None:
    now = [T0]
    a, b = loop(client, "a", now), loop(client, "b", now)  # 15 s ticks, 45 s lease
    for k in range(5):
        now[0] = T0 + 15 * k
        assert a.tick().leader
        assert not b.tick().leader
    died_at = now[0]  # a's last renewal; then it is killed (no release)
    took_over = None
    for k in range(1, 10):
        now[0] = died_at + 15 * k
        report = b.tick()
        if report.leader:
            took_over = k
            assert report.token == 2 and report.results and report.results[0].decision is not None
            break
    assert took_over is not None and took_over <= 45 / 15  # lease / tick
    published = DecisionStore(client).published()  # type: ignore[arg-type]
    assert published["qwen3"].token == 2


def test_a_paused_leader_is_fenced_out_when_it_wakes(client: object) -> None:
    now = [T0]
    a, b = loop(client, "a", now), loop(client, "b", now)
    assert a.tick().leader
    decisions = DecisionStore(client)  # type: ignore[arg-type]
    now[0] = T0 + 60  # a is paused past its lease; b takes over and acts
    report = b.tick()
    assert (report.leader, report.token) == (True, 2)
    records = len(decisions.records("qwen3", 100))
    # a wakes up in the middle of its old tick and tries to record a decision with token 1
    with pytest.raises(FencedOutError):
        a.commit(a.draft(a.profiles[0], now[0], None), 1, now[0])
    assert len(decisions.records("qwen3", 100)) == records
    assert decisions.published()["qwen3"].token == 2
    # and at its next tick it sees b and stands by
    assert (a.tick().leader, a.tick().holder) == (False, "b")


class LostData(NamedTuple):
    name: str
    wipe: str  # how the store lost its data: "restart" (no persistence) or "flushall"
    taker: str  # who takes the lock next: "standby" (saw a's token), "fresh" (started after), "a" (itself)


LOST_DATA = [
    LostData("restarted-empty-the-standby-takes-over", "restart", "standby"),
    LostData("flushall-the-standby-takes-over", "flushall", "standby"),
    LostData("restarted-empty-a-candidate-started-since-takes-over", "restart", "fresh"),
    LostData("flushall-the-leader-itself-takes-again", "flushall", "a"),
]


@pytest.mark.parametrize("case", LOST_DATA, ids=[c.name for c in LOST_DATA])
def test_a_store_that_lost_its_data_hands_out_no_token_a_leader_still_holds(redis_server: RedisServer,
                                                                           case: LostData) -> None:
    """The fence counted from 1 again after Redis lost its data: a new leader got the token a
    deposed one was still writing under, and both leaders' writes were accepted (a's stale decision
    published over b's); a replica that led again under its old number kept its warmer's term."""
    now = [T0]
    clients = [connect(redis_server.url, "/nonexistent") for _ in range(3)]
    a, b = loop(clients[0], "a", now), loop(clients[1], "b", now)
    assert (a.tick(now[0]).token, b.tick(now[0]).leader) == (1, False)
    now[0] = T0 + 15
    lease = a.lock.acquire()
    draft = a.draft(a.profiles[0], now[0], None)  # a is in the middle of its tick ...
    if case.wipe == "restart":  # ... when the store loses everything
        redis_server.restart()
    else:
        clients[2].flushall()
    taker = {"standby": b, "fresh": loop(clients[2], "c", now), "a": a}[case.taker]
    report = taker.tick(now[0])
    assert report.leader
    if case.taker == "a":
        assert report.token != lease.token  # a new term: the warmer starts over, as after any other leader
        return
    decisions = DecisionStore(clients[1])
    with pytest.raises(FencedOutError):
        a.commit(draft, lease.token, now[0])
    (record,) = decisions.records("qwen3", 100)
    assert record["holder"] == taker.holder
    assert decisions.published()["qwen3"].token == report.token


#: (row, what happens to the store after "a" took token 1, the refusal a's commit under token 1 gets)
REFUSALS = [
    pytest.param("b-took-over", "fencing token 1 is stale (current: 2); another scaler leads now", id="stale-token"),
    pytest.param("flushed-then-a-fresh-candidate-took-1",
                 "the lock is held by c under token 1, not a; another scaler leads now", id="same-token-other-holder"),
    pytest.param("lock-key-lost", "the lock is held by no one under token 1 (the store lost it or it was released); "
                                  "leading again takes it anew", id="held-by-no-one"),
]


@pytest.mark.parametrize(("event", "refusal"), REFUSALS)
def test_a_refused_commit_says_why(redis_server: RedisServer, event: str, refusal: str) -> None:
    # after a FLUSHALL the refusal said "another scaler leads now" whether one did or not
    client = connect(redis_server.url, "/nonexistent")
    now = [T0]
    clock = lambda: ms(now[0])  # noqa: E731
    a = LeaderLock(client, "a", ttl_s=45, clock=clock)
    assert a.acquire().token == 1
    if event == "b-took-over":
        now[0] = T0 + 60  # a's lease ran out
        assert LeaderLock(client, "b", ttl_s=45, clock=clock).acquire().token == 2
    elif event == "flushed-then-a-fresh-candidate-took-1":
        client.flushall()
        assert LeaderLock(client, "c", ttl_s=45, clock=clock).acquire().token == 1
    else:
        client.delete(a.keys.leader)
    with pytest.raises(FencedOutError) as refused:
        a.commit(1, action="committing")
    assert str(refused.value) == f"committing: {refusal}"


def test_under_contention_commits_never_go_back_to_an_older_token(redis_server: RedisServer) -> None:
    clients = [connect(redis_server.url, "/nonexistent") for _ in range(3)]
    loops = [loop(c, f"s{i}", None, ttl_s=0.15, tick_s=0.01, pause_s=0.2) for i, c in enumerate(clients)]
    errors: list[BaseException] = []

    def run(lp: ScaleLoop) -> None:
        try:
            for _ in range(25):
                lp.tick()
                time.sleep(random.random() * 0.02)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    # Takeovers depend on thread timing; on a loaded machine one round may see none, so run rounds
    # until the log holds at least two tokens (bounded), then check every commit of every round.
    log: list[dict[str, Any]] = []
    for _ in range(8):
        threads = [threading.Thread(target=run, args=(lp,)) for lp in loops]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        log = DecisionStore(clients[0], keep=10_000).records("qwen3", 10_000)
        if len({r["token"] for r in log}) >= 2:
            break
    tokens = [r["token"] for r in reversed(log)]  # commit order
    assert tokens == sorted(tokens), "a commit with an older token landed after a newer one"
    assert len(set(tokens)) >= 2, "the test did not provoke a takeover"
    holders_by_token: dict[int, set[str]] = {}
    for r in log:
        holders_by_token.setdefault(r["token"], set()).add(r["holder"])
    assert all(len(h) == 1 for h in holders_by_token.values())  # one holder per token


# ---- two real processes --------------------------------------------------------------------------


@contextlib.contextmanager
def scaler_process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "extender.scaler", "scale", *args], cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def wait_for(condition: Callable[[], object], what: str, logs: Sequence[Path]) -> None:
    wait_until(condition, timeout_s=SETTLE_S, what=what, interval_s=0.05,
               report=lambda: "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in logs))


@pytest.mark.integration
def test_killing_the_leader_process_hands_over_to_the_standby(redis_server: RedisServer, tmp_path: Path) -> None:
    with serving(("127.0.0.2",)) as (endpoint,), KubeDouble.running() as double:
        endpoint.counters = Counters(rate=5.0)
        double.apply(pod("qwen3-a", "127.0.0.2"))
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_text(port=endpoint.port))
        kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
        common = ["--policy", str(policy), "--redis-url", redis_server.url, "--kubeconfig", str(kubeconfig),
                  "--no-metrics-api", "--tick", "0.2", "--lease-ttl", "1"]
        lock = LeaderLock(connect(redis_server.url, "/nonexistent"), "observer", ttl_s=1)
        decisions = DecisionStore(connect(redis_server.url, "/nonexistent"))
        logs = [tmp_path / "a.log", tmp_path / "b.log"]

        def holder() -> str | None:
            current = lock.current()
            return current[0] if current else None

        with scaler_process([*common, "--identity", "scaler-a"], logs[0]) as a:
            wait_for(lambda: holder() == "scaler-a" and decisions.records("qwen3"), "scaler-a to lead", logs)
            with scaler_process([*common, "--identity", "scaler-b"], logs[1]) as b:
                wait_for(lambda: b.poll() is None and "ticking every" in logs[1].read_text(), "scaler-b to start", logs)
                assert holder() == "scaler-a"
                a.send_signal(signal.SIGKILL)  # no goodbye: the lock is left to expire
                a.wait()
                wait_for(lambda: holder() == "scaler-b" and decisions.records("qwen3")[0]["holder"] == "scaler-b",
                         "scaler-b to take over", logs)
                assert lock.fence() == 2
                log = decisions.records("qwen3", 300)
                tokens = [r["token"] for r in reversed(log)]
                assert tokens == sorted(tokens) and set(tokens) == {1, 2}
                assert {r["holder"] for r in log if r["token"] == 1} == {"scaler-a"}
                # the new leader observes the pod itself: after its first tick, a real rate
                wait_for(lambda: decisions.records("qwen3")[0]["signal"]["rate"] is not None
                         and decisions.records("qwen3")[0]["holder"] == "scaler-b", "a rate from scaler-b", logs)
                # only that it observed: two reads 0.2 s apart on a loaded machine make the value itself
                # noisy (6.8 for 5.0 once); the arithmetic is tests/test_signal_scrape.py's, on fixed times
                rate = decisions.records("qwen3")[0]["signal"]["rate"]
                assert rate > 0
                b.send_signal(signal.SIGTERM)  # clean stop: finish the tick, release the lock
                assert b.wait(timeout=SETTLE_S) == 0
                assert lock.current() is None
        assert sum(1 for _ in (a, b) if _.returncode is not None) == 2


