"""Cost of filling a new scaler's history from Prometheus, against one tick's instant queries.

What runs, in one process, against a real Prometheus (Debian's package) on loopback: its past is
``--days`` of one request counter every 15 s, written as blocks by ``promtool tsdb
create-blocks-from openmetrics`` before it starts. Each round times

* one tick's observation: the ``prometheus`` source's two instant queries (``observe``);
* one workload's fill: the same two queries as range queries over the days, one point per 15 s,
  in pieces of at most 10,000 points (``past``), which is what the scaler's first tick asks;
* the look for a span to fill in a whole history without a hole (``unfilled_span``), which every
  tick pays for every workload whose source has a past, whether or not anything is filled.

The ratio fill/observation is the figure; absolute times depend on the machine's load.

Run (from the repository root)::

    .venv/bin/python bench/bench_backfill.py               # 3 days, 7 rounds
    .venv/bin/python bench/bench_backfill.py --days 1 --rounds 11
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEP = 15


def past_counter(start: int, end: int, rate: float) -> str:
    """OpenMetrics: one request counter growing by ``rate`` per second, a sample every 15 s."""
    lines = ["# TYPE bench_requests counter"]
    lines += [f"bench_requests_total{{pod=\"a\"}} {rate * (t - start)} {t}" for t in range(start, end, STEP)]
    return "\n".join([*lines, "# EOF"]) + "\n"


@contextmanager
def prometheus_with_past(days: float) -> Iterator[str]:
    """A Prometheus whose storage holds ``days`` of the counter up to a minute ago; yields its URL."""
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or promtool is None:
        raise SystemExit("needs Debian's prometheus package: apt-get install -y prometheus")
    work = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
    try:
        end = int(time.time()) // STEP * STEP - 60
        (work / "past.om").write_text(past_counter(end - int(days * 86_400) - 3600, end, 3.0))
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(work / "past.om"),
                        str(work / "data")], check=True, capture_output=True)
        (work / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        process = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                    "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise SystemExit("prometheus did not start") from None
                    time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=20)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--days", type=float, default=3.0, help="history to fill (default: the store's 3 days)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    from extender.scaler.loop import unfilled_span
    from extender.scaler.prometheus import PrometheusSource

    with prometheus_with_past(args.days) as url:
        rate = "sum(rate(bench_requests_total[1m]))"
        source = PrometheusSource(url=url, query=rate, queue_query=f"{rate} * 0")
        observe, fill, look, samples = [], [], [], 0
        for _ in range(args.rounds):
            now = time.time()
            t0 = time.perf_counter()
            source.observe([], now)
            observe.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            past = source.past(now - args.days * 86_400 + STEP, now - STEP, STEP)
            fill.append(time.perf_counter() - t0)
            samples = len(past)
            t0 = time.perf_counter()
            span = unfilled_span(past, now - args.days * 86_400, now, STEP, set())
            look.append(time.perf_counter() - t0)
            assert span is None, span  # the history just filled has no hole
    o, f, g = statistics.median(observe), statistics.median(fill), statistics.median(look)
    print(f"prometheus, {args.days:g} days at {STEP} s: {samples} samples filled")
    print(f"  one tick's observation (2 instant queries): median {o * 1000:.1f} ms")
    print(f"  one workload's fill (2 range queries):       median {f * 1000:.1f} ms")
    print(f"  one tick's look for a hole in them:          median {g * 1000:.2f} ms")
    print(f"  fill / observation: {f / o:.1f}x, look / observation: {g / o:.2f}x  ({args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
