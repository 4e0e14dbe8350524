"""The ``prometheus`` source against a real Prometheus server, and the ``scrape`` source on the same pods.

The test starts Debian's ``prometheus`` on a free loopback port with a temporary config that scrapes
two vLLM-format endpoints (127.0.0.2 and 127.0.0.3, one port) every second, and removes its data
directory afterwards. The endpoints' counters grow by exactly 6 requests/s each (100 prompt and 50
generation tokens per request), so any correct rate is 12 requests/s or 1800 tokens/s in total,
whichever way it is measured.

No Prometheus binary is a failure with the install step, not a skip: ``scripts/test`` installs it
when run as root.

Waits are bounded polls for Prometheus to have scraped enough (a setup bound), never assertions on time.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

from extender.core.errors import SignalError
from extender.kube.client import KubeClient
from extender.scaler import prometheus
from extender.scaler.pods import label_selector, workload_pods
from extender.scaler.prometheus import PrometheusSource
from extender.scaler.scrape import ScrapeSource
from extender.scaler.serve import KubePodLister
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.net import dripping, free_port
from tests.prometheus_tools import prometheus_tool
from tests.scaler_policy import make_policy
from tests.vllm_endpoint import MetricsEndpoint, pod, serving

pytestmark = pytest.mark.integration

RATE_PER_POD = 6.0
TOTAL = 2 * RATE_PER_POD
#: Setup bound: Prometheus starting and gathering two scrapes per series.
SETTLE_S = 60.0


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]


def prometheus_binary() -> str:
    return prometheus_tool("prometheus")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextlib.contextmanager
def running_prometheus(targets: list[str], *, web_config: str | None = None, scheme: str = "http",
                       ready: Callable[[str], bool] = _answers, openmetrics: str | None = None) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` every second; stopped and its data directory removed afterwards.

    ``web_config``: the text of its ``--web.config.file`` (TLS, basic auth users), served at
    ``scheme``; ``ready(url)`` tells when it answers (the default asks ``/-/ready`` without credentials).
    ``openmetrics``: samples of the past, written into its data directory as blocks by ``promtool tsdb
    create-blocks-from openmetrics`` before it starts (Prometheus's own backfill).
    """
    binary = prometheus_binary()
    work = Path(tempfile.mkdtemp(prefix="extender-prometheus-"))
    try:
        if openmetrics is not None:
            (work / "past.om").write_text(openmetrics)
            subprocess.run([prometheus_tool("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                            str(work / "past.om"), str(work / "data")], check=True, capture_output=True)
        config = work / "prometheus.yml"
        static = "\n".join(f"      - targets: ['{t}']\n        labels: {{namespace: default, pod: pod-{i}}}"
                           for i, t in enumerate(targets))
        scrape = f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n{static}\n" if targets else ""
        config.write_text(f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                          f"{scrape}")
        port = free_port()
        log = work / "prometheus.log"
        flags = [f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
        if web_config is not None:
            (work / "web.yml").write_text(web_config)
            flags.append(f"--web.config.file={work / 'web.yml'}")
        with log.open("wb") as out:
            process = subprocess.Popen([binary, *flags], stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, cwd=work)
        try:
            url = f"{scheme}://127.0.0.1:{port}"

            def up() -> bool:
                if process.poll() is not None:
                    raise AssertionError(f"prometheus exited with {process.returncode}: {log.read_text()[-2000:]}")
                return ready(url)

            wait_until(up, timeout_s=SETTLE_S, what="prometheus to become ready", interval_s=0.1,
                       report=lambda: log.read_text()[-2000:])
            yield Prometheus(url, process)
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert not work.exists()


@pytest.fixture(scope="module")
def pods_and_prometheus() -> Iterator[tuple[list[MetricsEndpoint], Prometheus]]:
    with serving(("127.0.0.2", "127.0.0.3")) as endpoints:
        start = time.time()
        for ep in endpoints:
            ep.counters.rate, ep.counters.t0, ep.counters.waiting = RATE_PER_POD, start, 3.0
        with running_prometheus([f"{ep.host}:{ep.port}" for ep in endpoints]) as prom:
            yield endpoints, prom


def wait_for_value(source: PrometheusSource, query: str) -> float:
    """Poll until both pods have filled the 5 s window with samples, then evaluate ``query``.

    (rate() over a window a series only partly covers extrapolates just half an interval past its
    first sample, so it reads low until the window is full.)
    """
    def value() -> tuple[float] | None:
        series = source.run('count(vllm:request_success_total{finished_reason="stop"})') or 0
        samples = source.run('min(count_over_time(vllm:request_success_total{finished_reason="stop"}[5s]))') or 0
        got = source.run(query) if series >= 2 and samples >= 5 else None
        return None if got is None else (got,)  # a tuple: a value of 0.0 is an answer, not "not yet"

    return wait_until(value, timeout_s=SETTLE_S, what=f"a value for {query!r} from prometheus", interval_s=0.2)[0]


def test_prometheus_source_reads_the_rate_and_queue(
        pods_and_prometheus: tuple[list[MetricsEndpoint], Prometheus]) -> None:
    _, prom = pods_and_prometheus
    policy = make_policy(signal={"source": "prometheus", "prometheus": {
        "url": prom.url, "selector": 'job="vllm"', "rateWindow": "5s"}})
    source = PrometheusSource.for_profile(policy.profile("qwen3"))
    wait_for_value(source, source.query)
    obs = source.observe([], time.time())
    assert obs.complete
    assert obs.rate == pytest.approx(TOTAL, rel=0.05)
    assert obs.queue == 6.0  # 3 waiting on each pod


def test_prometheus_tokens_per_second_and_converted_queue(
        pods_and_prometheus: tuple[list[MetricsEndpoint], Prometheus]) -> None:
    _, prom = pods_and_prometheus
    text_signal = {"source": "prometheus", "prometheus": {"url": prom.url, "rateWindow": "5s"}}
    policy = make_policy(signal=text_signal)
    llama = policy.profile("llama").model_copy(update={"autoscaling": policy.profile("qwen3").autoscaling})
    source = PrometheusSource.for_profile(llama)
    wait_for_value(source, source.query)
    obs = source.observe([], time.time())
    # 12 requests/s x (100 + 50) tokens = 1800 tokens/s; 6 waiting requests x 150 tokens = 900 tokens
    assert obs.rate == pytest.approx(TOTAL * 150, rel=0.05)
    assert obs.queue == pytest.approx(6 * 150, rel=0.05)


def test_prometheus_answers_that_are_not_a_rate(pods_and_prometheus: tuple[list[MetricsEndpoint], Prometheus]) -> None:
    _, prom = pods_and_prometheus
    scalar = PrometheusSource(url=prom.url, query="scalar(vector(3.5))", queue_query=None)
    observed = scalar.observe([], time.time())
    assert observed.rate == 3.5
    empty = PrometheusSource(url=prom.url, query="sum(rate(no_such_metric_total[5s]))", queue_query=None)
    obs = empty.observe([], time.time())
    assert (obs.rate, obs.complete, obs.note) == (None, False, "rate query returned no series")
    broken = PrometheusSource(url=prom.url, query="sum(rate(", queue_query=None)
    obs = broken.observe([], time.time())
    assert obs.rate is None
    assert "HTTP 400" in obs.note


class Queries(NamedTuple):
    """One row: the two queries, and the observation they make."""

    id: str
    query: str
    queue_query: str | None
    rate: float | None
    queue: float
    complete: bool
    note: str  # words in the note ("" for none)


QUERIES = [Queries(*row) for row in [
    ("both-answer", "scalar(vector(1))", "scalar(vector(2))", 1.0, 2.0, True, ""),
    ("no-queue-query", "scalar(vector(1))", None, 1.0, 0.0, True, ""),
    # no series waiting is a queue of zero, not a failure
    ("queue-has-no-series", "scalar(vector(1))", "sum(no_such_gauge)", 1.0, 0.0, True, ""),
    # the queue is unknown: rate + 0 is only a lower bound of the demand, so no scale-down on it
    ("queue-query-fails", "scalar(vector(1))", "sum(", 1.0, 0.0, False, "queue query"),
    ("rate-query-fails", "sum(rate(", "scalar(vector(2))", None, 0.0, False, "rate query"),
]]


@pytest.mark.parametrize("row", QUERIES, ids=[q.id for q in QUERIES])
def test_the_observation_is_complete_only_when_every_query_answers(
        row: Queries, pods_and_prometheus: tuple[list[MetricsEndpoint], Prometheus]) -> None:
    _, prom = pods_and_prometheus
    obs = PrometheusSource(url=prom.url, query=row.query, queue_query=row.queue_query).observe([], time.time())
    assert (obs.rate, obs.queue, obs.complete) == (row.rate, row.queue, row.complete)
    assert row.note in obs.note and bool(obs.note) == bool(row.note)


def test_unreachable_prometheus_is_no_observation() -> None:
    source = PrometheusSource(url=f"http://127.0.0.1:{free_port()}", query="vector(1)", queue_query=None, timeout_s=1)
    obs = source.observe([], time.time())
    assert (obs.rate, obs.complete) == (None, False)
    assert "rate query" in obs.note


#: A Prometheus that sends its reply a byte every 0.05 s (4 s in all): every read is within the timeout.
SLOW_PROMETHEUS = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 80\r\n\r\n", b" " * 80)


@pytest.mark.parametrize("call", [pytest.param("observe", id="instant-query"),
                                  pytest.param("past", id="range-query-budget")])
def test_a_prometheus_that_answers_a_byte_at_a_time_is_given_up_on(call: str) -> None:
    # the instant query's timeout and the range queries' budget bound the whole reply, not each read
    port = free_port()
    source = PrometheusSource(url=f"http://127.0.0.1:{port}", query="vector(1)", queue_query=None, timeout_s=0.5)
    with dripping("127.0.0.1", port, *SLOW_PROMETHEUS):
        if call == "observe":
            obs = source.observe([], time.time())
            assert (obs.rate, obs.complete, obs.answered) == (None, False, 0)
            assert "rate query: GET " in obs.note and "timed out" in obs.note, obs.note
        else:
            with pytest.raises(SignalError, match=r"timed out: no whole reply within 0\.5s"):
                source.past(time.time() - 600, time.time(), 15.0, budget_s=0.5)


def test_scrape_source_agrees_through_the_api_double(pods_and_prometheus: tuple[list[MetricsEndpoint], Prometheus],
                                                     tmp_path: Path) -> None:
    endpoints, prom = pods_and_prometheus
    profile = make_policy(port=endpoints[0].port).profile("qwen3")
    with KubeDouble.running() as double:
        double.apply(pod("qwen3-a", "127.0.0.2"))
        double.apply(pod("qwen3-b", "127.0.0.3"))
        client = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kubeconfig")))
        try:
            lister = KubePodLister(client)
            source = ScrapeSource.for_profile(profile)
            rates = []
            for _ in range(2):
                pods = workload_pods(lister.list_pods(label_selector(profile)), profile, "default")
                rates.append(source.observe(pods, time.time()).rate)
                time.sleep(1.0)  # one interval between the two scrapes
        finally:
            client.close()
    assert rates[0] is None
    assert rates[1] == pytest.approx(TOTAL, rel=0.05)
    promql = PrometheusSource(url=prom.url, query="sum(rate(vllm:request_success_total[5s]))", queue_query=None)
    assert wait_for_value(promql, promql.query) == pytest.approx(rates[1], rel=0.05)


def past_demand(start: int, end: int) -> str:
    """OpenMetrics for ``[start, end)`` every 15 s: two pods' request counters, 1 request/s each for
    the first half and 2.5 after (2 and 5 in all), and a queue of 1.5 on each."""
    half = (start + end) // 2
    lines = ["# TYPE demo_requests counter", "# TYPE demo_waiting gauge"]
    served = 0.0
    for t in range(start, end, 15):
        lines += [f'demo_requests_total{{pod="{p}"}} {served} {t}' for p in ("a", "b")]
        lines += [f'demo_waiting{{pod="{p}"}} 1.5 {t}' for p in ("a", "b")]
        served += 15 * (1.0 if t < half else 2.5)
    return "\n".join([*lines[:2], *sorted(lines[2:], key=lambda line: line.split()[0].split("{")[0]), "# EOF"]) + "\n"


def test_the_past_is_read_with_range_queries_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    end = int(time.time()) // 15 * 15 - 60
    start = end - 4 * 3600
    with running_prometheus([], openmetrics=past_demand(start, end)) as prom:
        # by pod: a matrix of two series, summed at each time as a vector is
        source = PrometheusSource(url=prom.url, query="sum by (pod) (rate(demo_requests_total[1m]))",
                                  queue_query="sum(demo_waiting)")
        first, last = start + 300, end - 300
        whole = source.past(first, last, 15.0)
        monkeypatch.setattr(prometheus, "RANGE_POINTS", 100)  # 921 points: ten range queries each
        assert source.past(first, last, 15.0) == whole
    assert [s.t for s in whole] == [first + 15.0 * k for k in range((last - first) // 15 + 1)]
    half = (start + end) // 2
    assert all(s.rate == pytest.approx(2.0) for s in whole if s.t < half)
    assert all(s.rate == pytest.approx(5.0) for s in whole if s.t >= half + 60)  # the 1m window past the change
    assert {s.queue for s in whole} == {3.0}


def test_a_failed_range_query_says_why() -> None:
    with running_prometheus([]) as prom:
        broken = PrometheusSource(url=prom.url, query="sum(rate(", queue_query=None)
        with pytest.raises(SignalError, match="HTTP 400"):
            broken.past(time.time() - 600, time.time(), 15.0)
        nothing = PrometheusSource(url=prom.url, query="sum(rate(no_such_metric_total[1m]))", queue_query=None)
        assert nothing.past(time.time() - 600, time.time(), 15.0) == []
        with pytest.raises(SignalError, match="ran out of their time"):  # the loop gives a fill one tick
            nothing.past(time.time() - 600, time.time(), 15.0, budget_s=0.0)
