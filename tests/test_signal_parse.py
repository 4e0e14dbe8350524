"""The ``scrape`` source's arithmetic: parsing expositions, counter rates, resets, pods coming and going, failures.

Scripted ticks against a fake fetcher (the HTTP path and the API double are in test_signal_scrape.py):
each row is a workload's pods and their counters over a few ticks, with the rate, completeness and
queue the source must report, and the arithmetic beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender.core.errors import InvalidValueError, SignalError, UnknownNameError
from extender.scaler.exposition import ENGINES, engine, read_sums
from extender.scaler.observation import Fetcher
from extender.scaler.pods import Pod, count_replicas, label_selector, parse_pod, workload_pods
from extender.scaler.scrape import ScrapeSource
from tests.scaler_policy import make_policy
from tests.vllm_endpoint import Counters, pod, sglang_text, vllm_text

POLICY = make_policy()
QWEN = POLICY.profile("qwen3")  # requests/s
LLAMA = POLICY.profile("llama")  # tokens/s

# ---- parsing -------------------------------------------------------------------------------------


def test_vllm_exposition_sums_every_series() -> None:
    text = vllm_text(Counters(requests=100, prompt_tokens=7000, generation_tokens=3000, waiting=3, running=8))
    sums = read_sums(text, ("vllm:request_success_total", "vllm:num_requests_waiting", "vllm:prompt_tokens_total"))
    # 90 (stop) + 10 (length): two series of one counter; the _created sample is not a value
    assert sums == {"vllm:request_success_total": 100.0, "vllm:num_requests_waiting": 3.0,
                    "vllm:prompt_tokens_total": 7000.0}


def test_sglang_exposition() -> None:
    text = sglang_text(Counters(requests=12, waiting=2))
    names = engine("sglang")
    sums = read_sums(text, (*names.requests, *names.waiting))
    assert sums == {"sglang:num_requests_total": 12.0, "sglang:num_queue_reqs": 2.0}


PARSE_ROWS = [
    ("missing-family-is-none", "# TYPE other gauge\nother 1\n", None),
    ("declared-without-samples-is-zero", "# HELP vllm:request_success_total x\n"
                                         "# TYPE vllm:request_success_total counter\n", 0.0),
    ("untyped-sample", "vllm:request_success_total 5\n", 5.0),
    ("nan-sample-skipped", "# TYPE vllm:request_success_total counter\nvllm:request_success_total NaN\n", 0.0),
]


@pytest.mark.parametrize(("text", "expected"), [r[1:] for r in PARSE_ROWS], ids=[r[0] for r in PARSE_ROWS])
def test_parse_rows(text: str, expected: float | None) -> None:
    assert read_sums(text, ("vllm:request_success_total",)) == {"vllm:request_success_total": expected}


def test_not_an_exposition_raises() -> None:
    with pytest.raises(InvalidValueError, match=r"^not a Prometheus exposition: "):
        read_sums("<html><body>404{</body></html>", ("vllm:request_success_total",))


COUNTER = "# TYPE vllm:request_success_total counter\n"
GAUGE = "# TYPE vllm:num_requests_waiting gauge\n"


@pytest.mark.parametrize(("text", "refused"), [
    # each once read as a zero, which the next good reading took for a counter reset
    pytest.param(COUNTER + "vllm:request_success_total NaN\n", "counter vllm:request_success_total is nan, no count",
                 id="a-nan-counter"),
    pytest.param(COUNTER + "vllm:request_success_total +Inf\n", "is inf, no count", id="an-infinite-counter"),
    pytest.param(COUNTER + 'vllm:request_success_total{r="stop"} 5\nvllm:request_success_total{r="x"} -2\n',
                 'counter vllm:request_success_total{r="x"} is -2, no count', id="a-negative-counter"),
    # Prometheus refuses it too; summed, it doubled the pod's demand
    pytest.param(COUNTER + 'vllm:request_success_total{r="stop"} 5\nvllm:request_success_total{r="stop"} 5\n',
                 'series vllm:request_success_total{r="stop"} is given twice', id="a-series-given-twice"),
    pytest.param(COUNTER + f'vllm:request_success_total{{r="{"x" * 300}"}} -1\n', '{r="xxx', id="a-long-series-cut"),
])
def test_a_counter_that_is_no_count_spoils_the_reading(text: str, refused: str) -> None:
    with pytest.raises(InvalidValueError, match=re.escape(refused)) as raised:
        read_sums(text, ("vllm:request_success_total",), ("vllm:request_success_total",))
    assert len(str(raised.value)) < 200


def test_a_nan_gauge_is_skipped_beside_good_counters() -> None:
    text = COUNTER + "vllm:request_success_total 5\n" + GAUGE + "vllm:num_requests_waiting NaN\n"
    assert read_sums(text, ("vllm:request_success_total", "vllm:num_requests_waiting"),
                     ("vllm:request_success_total",)) == {"vllm:request_success_total": 5.0,
                                                          "vllm:num_requests_waiting": 0.0}


def test_unknown_engine() -> None:
    with pytest.raises(UnknownNameError, match="known: sglang, vllm"):
        engine("tgi")
    assert set(ENGINES) == {"vllm", "sglang"}


# ---- pods ----------------------------------------------------------------------------------------

POD_ROWS = [
    ("ready", pod("a", "10.0.0.1"), True, False, True),
    ("running-not-ready", pod("a", "10.0.0.1", ready=False), False, True, True),
    ("pending", pod("a", "", ready=False, phase="Pending"), False, True, False),
    ("terminating", pod("a", "10.0.0.1", terminating=True), False, False, False),
    ("failed", pod("a", "10.0.0.1", ready=False, phase="Failed"), False, False, False),
    ("unknown-phase", pod("a", "10.0.0.1", ready=True, phase="Unknown"), False, False, False),
]


@pytest.mark.parametrize(("obj", "ready", "starting", "scrapeable"), [r[1:] for r in POD_ROWS],
                         ids=[r[0] for r in POD_ROWS])
def test_pod_states(obj: dict[str, Any], ready: bool, starting: bool, scrapeable: bool) -> None:
    p = parse_pod(obj)
    assert p is not None
    assert (p.ready, p.starting, p.scrapeable) == (ready, starting, scrapeable)


def test_workload_pods_filter_by_labels_annotations_and_namespace() -> None:
    objs = [pod("a", "1"), pod("b", "2", namespace="other"), pod("c", "3", labels={"extender.io/workload": "llama"}),
            pod("d", "4", ready=False), pod("e", "5", phase="Pending", ready=False)]
    pods = workload_pods(objs, QWEN, "default")
    assert [p.name for p in pods] == ["a", "d", "e"]
    assert count_replicas(pods).__dict__ == {"ready": 1, "starting": 2}
    assert label_selector(QWEN) == "extender.io/workload=qwen3"


# ---- the scrape source over scripted ticks -------------------------------------------------------


@dataclass
class Tick:
    now: float
    pods: list[dict[str, Any]]
    counters: dict[str, Counters]
    down: set[str] = field(default_factory=set)
    rate: float | None = None
    complete: bool = False
    queue: float = 0.0


def c(requests: float, waiting: float = 0.0) -> Counters:
    return Counters(requests=requests, waiting=waiting)


P1 = pod("p1", "10.0.0.2", start_time="2025-01-01T00:00:00Z")
P2 = pod("p2", "10.0.0.3", start_time="2025-01-01T00:00:00Z")
T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z: both pods started then
LATE_P2 = pod("p2", "10.0.0.3", start_time="2025-01-01T00:01:45Z")  # T0 + 105 s
NOT_READY_P2 = pod("p2", "10.0.0.3", ready=False)
DYING_P2 = pod("p2", "10.0.0.3", terminating=True)

SCRIPTS: list[tuple[str, list[Tick]]] = [
    ("two-pods-steady", [
        Tick(T0 + 100, [P1, P2], {"10.0.0.2": c(0), "10.0.0.3": c(0)}, rate=None),  # first sight: no rate yet
        # (50 - 0) / 10 + (30 - 0) / 10 = 8
        Tick(T0 + 110, [P1, P2], {"10.0.0.2": c(50, 3), "10.0.0.3": c(30, 4)}, rate=8.0, complete=True, queue=7.0),
    ]),
    ("counter-reset", [
        Tick(T0 + 100, [P1], {"10.0.0.2": c(1000)}),
        Tick(T0 + 110, [P1], {"10.0.0.2": c(1100)}, rate=10.0, complete=True),
        # 40 < 1100: the engine restarted; all 40 happened since: 40 / 10 = 4
        Tick(T0 + 120, [P1], {"10.0.0.2": c(40)}, rate=4.0, complete=True),
    ]),
    ("pod-started-since-last-tick", [
        Tick(T0 + 100, [P1], {"10.0.0.2": c(0)}),
        # p1: 100 / 10 = 10; p2 started at +105, so its 25 requests took 110 - 105 = 5 s: 5/s; total 15
        Tick(T0 + 110, [P1, LATE_P2], {"10.0.0.2": c(100), "10.0.0.3": c(25)}, rate=15.0, complete=True),
    ]),
    ("older-pod-seen-first-time", [
        Tick(T0 + 100, [P1], {"10.0.0.2": c(0)}),
        # p2 has been up since T0: its 500 requests are not all from this interval, so no rate
        # this tick; the total is a lower bound
        Tick(T0 + 110, [P1, P2], {"10.0.0.2": c(100), "10.0.0.3": c(500)}, rate=10.0, complete=False),
        Tick(T0 + 120, [P1, P2], {"10.0.0.2": c(200), "10.0.0.3": c(560)}, rate=16.0, complete=True),
    ]),
    ("pod-vanishes", [
        Tick(T0 + 100, [P1, P2], {"10.0.0.2": c(0), "10.0.0.3": c(0)}),
        Tick(T0 + 110, [P1], {"10.0.0.2": c(100)}, rate=10.0, complete=True),
    ]),
    ("scrape-fails-then-recovers", [
        Tick(T0 + 100, [P1, P2], {"10.0.0.2": c(0), "10.0.0.3": c(0)}),
        Tick(T0 + 110, [P1, P2], {"10.0.0.2": c(100)}, down={"10.0.0.3"}, rate=10.0, complete=False),
        # p2's rate over its own 20 s since the last answer: 200 / 20 = 10; p1: 100 / 10 = 10
        Tick(T0 + 120, [P1, P2], {"10.0.0.2": c(200), "10.0.0.3": c(200)}, rate=20.0, complete=True),
    ]),
    ("starting-pod-failure-is-not-missing-load", [
        Tick(T0 + 100, [P1, NOT_READY_P2], {"10.0.0.2": c(0), "10.0.0.3": c(0)}),
        Tick(T0 + 110, [P1, NOT_READY_P2], {"10.0.0.2": c(100)}, down={"10.0.0.3"}, rate=10.0, complete=True),
    ]),
    ("everything-down", [
        Tick(T0 + 100, [P1], {"10.0.0.2": c(0)}),
        Tick(T0 + 110, [P1], {}, down={"10.0.0.2"}, rate=None, complete=False),
    ]),
    ("no-pods", [Tick(T0 + 100, [], {}, rate=None, complete=False)]),
    # a NaN counter was a complete zero, and the recovery a reset: 1,200 requests of demand in 10 s
    ("nan-counter-is-no-reading", [
        Tick(T0 + 100, [P1], {"10.0.0.2": c(1000)}),
        Tick(T0 + 110, [P1], {"10.0.0.2": c(float("nan"))}, rate=None, complete=False),
        # the previous good sample is kept: (1200 - 1000) / 20 = 10
        Tick(T0 + 120, [P1], {"10.0.0.2": c(1200)}, rate=10.0, complete=True),
    ]),
    # a negative counter raised out of the tick (a negative demand), then the same spike
    ("negative-counter-is-no-reading", [
        Tick(T0 + 100, [P1], {"10.0.0.2": c(1000)}),
        Tick(T0 + 110, [P1], {"10.0.0.2": c(-50)}, rate=None, complete=False),
        Tick(T0 + 120, [P1], {"10.0.0.2": c(1200)}, rate=10.0, complete=True),
    ]),
    ("terminating-pod-not-scraped", [
        Tick(T0 + 100, [P1, DYING_P2], {"10.0.0.2": c(0), "10.0.0.3": c(0)}),
        Tick(T0 + 110, [P1, DYING_P2], {"10.0.0.2": c(100), "10.0.0.3": c(9999)}, rate=10.0, complete=True),
    ]),
]


def fake_fetch(counters: dict[str, Counters], down: set[str], seen: list[str]) -> Fetcher:
    def fetch(url: str, timeout_s: float, **_: object) -> str:
        seen.append(url)
        ip = url.split("//")[1].split(":", maxsplit=1)[0]
        if ip in down or ip not in counters:
            raise SignalError(f"GET {url}: connection refused")
        return vllm_text(counters[ip])
    return fetch


@pytest.mark.parametrize("ticks", [s[1] for s in SCRIPTS], ids=[s[0] for s in SCRIPTS])
def test_scrape_scripts(ticks: list[Tick]) -> None:
    state: dict[str, Any] = {"counters": {}, "down": set()}
    seen: list[str] = []

    def fetch(url: str, timeout_s: float, **_: object) -> str:
        return fake_fetch(state["counters"], state["down"], seen)(url, timeout_s)

    source = ScrapeSource.for_profile(QWEN, fetch)
    for i, tick in enumerate(ticks):
        state["counters"], state["down"] = tick.counters, tick.down
        pods = [p for p in (parse_pod(o) for o in tick.pods) if p is not None]
        obs = source.observe(pods, tick.now)
        assert obs.rate == (pytest.approx(tick.rate) if tick.rate is not None else None), f"tick {i}"
        assert obs.complete == tick.complete, f"tick {i}: {obs.note}"
        assert obs.queue == pytest.approx(tick.queue), f"tick {i}"
    assert all(url.endswith(":8000/metrics") for url in seen)


def test_a_pod_without_the_counter_gives_no_rate() -> None:
    def fetch(url: str, timeout_s: float, **_: object) -> str:
        return "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 2\n"

    source = ScrapeSource.for_profile(QWEN, fetch)
    pods = [parse_pod(P1)]
    obs = [source.observe([p for p in pods if p], T0 + t) for t in (100, 110)][-1]
    assert obs.rate is None
    assert not obs.complete
    assert "no vllm:request_success_total" in obs.note


def test_tokens_unit_uses_token_counters_and_converts_the_queue() -> None:
    counters = {"10.0.0.2": Counters(requests=0, prompt_tokens=0, generation_tokens=0)}

    def fetch(url: str, timeout_s: float, **_: object) -> str:
        return vllm_text(counters["10.0.0.2"])

    source = ScrapeSource.for_profile(LLAMA, fetch)
    p = parse_pod(pod("l1", "10.0.0.2", namespace="ml", labels={"extender.io/workload": "llama"}))
    assert p is not None
    first = source.observe([p], T0 + 100)
    assert first.rate is None
    counters["10.0.0.2"] = Counters(requests=20, prompt_tokens=2000, generation_tokens=1000, waiting=4)
    obs = source.observe([p], T0 + 110)
    # (2000 + 1000) tokens / 10 s = 300 tokens/s; 3000 tokens / 20 requests = 150 per request,
    # so 4 waiting requests are 600 tokens of queue
    assert obs.rate == pytest.approx(300.0)
    assert obs.queue == pytest.approx(600.0)


def test_tokens_queue_before_any_finished_request_is_not_invented() -> None:
    def fetch(url: str, timeout_s: float, **_: object) -> str:
        return vllm_text(Counters(waiting=9))

    source = ScrapeSource.for_profile(LLAMA, fetch)
    p = parse_pod(pod("l1", "10.0.0.2", namespace="ml", labels={"extender.io/workload": "llama"}))
    assert p is not None
    source.observe([p], T0 + 100)
    obs = source.observe([p], T0 + 110)
    assert (obs.rate, obs.queue) == (0.0, 0.0)
    assert "not converted to tokens" in obs.note


def test_sglang_engine() -> None:
    profile = make_policy(signal={"source": "scrape", "engine": "sglang", "port": 30000}).profile("qwen3")
    values = iter([Counters(requests=10, waiting=1), Counters(requests=70, waiting=5)])

    def fetch(url: str, timeout_s: float, **_: object) -> str:
        assert url == "http://10.0.0.2:30000/metrics"
        return sglang_text(next(values))

    source = ScrapeSource.for_profile(profile, fetch)
    pods: list[Pod] = [p for p in [parse_pod(P1)] if p]
    source.observe(pods, T0 + 100)
    obs = source.observe(pods, T0 + 115)
    assert obs.rate == pytest.approx(4.0)  # (70 - 10) / 15
    assert obs.queue == 5.0


def test_ipv6_pod_address_is_bracketed() -> None:
    def nothing(url: str, timeout_s: float, **_: object) -> str:
        return ""

    source = ScrapeSource.for_profile(QWEN, nothing)
    p = parse_pod(pod("v6", "fd00::5"))
    assert p is not None
    assert source.url(p) == "http://[fd00::5]:8000/metrics"
