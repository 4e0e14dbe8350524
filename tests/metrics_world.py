"""Every long-running ``extender`` process, started for real, and its ``/metrics`` as Prometheus reads it.

:func:`running_processes` starts ``serve`` (gunicorn, multiprocess metrics), ``scale`` (gunicorn,
loop and warmer), ``agent``, ``sync`` and ``keda-scaler`` (``--metrics-bind``) against one real
Redis, a KubeDouble API server and a vLLM-like metrics endpoint, waits until each has done its
work once (ticked, scanned and written, listed, read the decisions), and scrapes each one.
The tests of the expositions (promtool), the docs' tables and the dashboard read these scrapes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.net import free_port
from tests.scaler_policy import policy_text
from tests.vllm_endpoint import Counters, pod, serving

ROOT = Path(__file__).resolve().parent.parent
#: Seconds a process has to do its first round of work (a setup bound, not an assertion).
SETTLE_S = 90.0
#: ``extender ARGS...`` from the source tree, as the installed entry point runs it.
CLI = "import sys; from extender.cli import main; sys.exit(main())"
PROCESSES = ("serve", "scale", "agent", "sync", "keda-scaler")


@dataclass(frozen=True)
class Scrape:
    """One ``GET /metrics``: the body and the ``Content-Type`` it came with."""

    process: str
    text: str
    content_type: str

    def families(self) -> dict[str, str]:
        """Family name as exposed (counters with ``_total``) -> type."""
        out: dict[str, str] = {}
        for family in text_string_to_metric_families(self.text):
            name = family.name + "_total" if family.type == "counter" else family.name
            out[name] = family.type
        return out

    def sample_names(self) -> set[str]:
        """Every sample name (``_bucket``, ``_count``, ``_sum``, ``_total``, ``_created`` included)."""
        return {s.name for f in text_string_to_metric_families(self.text) for s in f.samples}

    def value(self, name: str, **labels: str) -> float | None:
        for family in text_string_to_metric_families(self.text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return None


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b"", ""


@dataclass
class Process:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    metrics_url: str
    #: ``serve --metrics-bind``: the gunicorn master's aggregate of every worker.
    master_url: str = ""

    def scrape(self) -> Scrape:
        code, body, content_type = get(self.metrics_url)
        assert code == 200, f"{self.name}: /metrics answered {code}: {self.log.read_text()[-2000:]}"
        return Scrape(self.name, body.decode(), content_type)

    def wait(self, done: Callable[[Scrape], bool], what: str) -> Scrape:
        def ready() -> Scrape | None:
            assert self.process.poll() is None, f"{self.name} exited: {self.log.read_text()[-3000:]}"
            code, body, content_type = get(self.metrics_url)
            scrape = Scrape(self.name, body.decode(), content_type) if code == 200 else None
            return scrape if scrape is not None and done(scrape) else None

        scrape = wait_until(ready, timeout_s=SETTLE_S, what=f"{self.name}: {what}", interval_s=0.1,
                            report=lambda: self.log.read_text()[-3000:])
        assert scrape is not None  # wait_until returns only a truthy value
        return scrape

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _start(name: str, argv: list[str], directory: Path, metrics_url: str) -> Process:
    log = directory / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "REDIS_URL")}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-c", CLI, *argv], cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"})
    return Process(name, process, log, metrics_url)


def _positive(name: str, **labels: str) -> Callable[[Scrape], bool]:
    return lambda s: (s.value(name, **labels) or 0.0) > 0


@contextlib.contextmanager
def running_processes(directory: Path) -> Iterator[dict[str, Process]]:
    """The five processes, each having done its work once (module docstring); stopped however the block ends."""
    redis = RedisServer(directory / "redis")
    redis.directory.mkdir()
    redis.start()
    processes: dict[str, Process] = {}
    try:
        with serving(("127.0.0.2",)) as (endpoint,), KubeDouble.running(bookmark_interval_s=0.5) as double:
            endpoint.counters = Counters(rate=8.0)
            double.apply(pod("qwen3-a", "127.0.0.2"))
            double.apply({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": "node-a", "labels": {"node.kubernetes.io/instance-type": "g5.12xlarge"}},
                          "status": {"allocatable": {"nvidia.com/gpu": "4"}, "capacity": {"nvidia.com/gpu": "4"}}})
            policy = directory / "policy.yaml"
            policy.write_text(policy_text(port=endpoint.port, tick="1s"))
            kubeconfig = double.write_kubeconfig(directory / "kubeconfig")
            cache = directory / "cache"
            (cache / "weights" / "qwen3" / "rev-1").mkdir(parents=True)
            store = ["--redis-url", redis.url]
            ports = {p: free_port() for p in PROCESSES}
            serve_port, scale_port, master_port = ports["serve"], ports["scale"], free_port()
            agent_port, sync_port, keda_port = ports["agent"], ports["sync"], ports["keda-scaler"]
            processes["serve"] = _start("serve", [
                "serve", "--policy", str(policy), "--bind", f"127.0.0.1:{serve_port}", "--workers", "2",
                "--threads", "2", "--poll-interval", "0.1", "--metrics-bind", f"127.0.0.1:{master_port}", *store],
                directory, f"http://127.0.0.1:{serve_port}/metrics")
            processes["serve"].master_url = f"http://127.0.0.1:{master_port}/metrics"
            processes["scale"] = _start("scale", [
                "scale", "--policy", str(policy), "--kubeconfig", str(kubeconfig), "--bind", f"127.0.0.1:{scale_port}",
                "--insecure-no-auth", "--tick", "0.2", "--lease-ttl", "2", "--identity", "scaler-x", *store],
                directory, f"http://127.0.0.1:{scale_port}/metrics")
            processes["agent"] = _start("agent", [
                "agent", "--node-name", "node-a", "--cache-root", str(cache), "--interval", "0.2",
                "--metrics-bind", f"127.0.0.1:{agent_port}", *store], directory, f"http://127.0.0.1:{agent_port}/metrics")
            processes["sync"] = _start("sync", [
                "sync", "--policy", str(policy), "--kubeconfig", str(kubeconfig),
                "--metrics-bind", f"127.0.0.1:{sync_port}", *store], directory, f"http://127.0.0.1:{sync_port}/metrics")
            processes["keda-scaler"] = _start("keda-scaler", [
                "keda-scaler", "--policy", str(policy), "--listen", f"127.0.0.1:{free_port()}", "--plaintext",
                "--metrics-bind", f"127.0.0.1:{keda_port}", *store], directory,
                f"http://127.0.0.1:{keda_port}/metrics")
            yield processes
    finally:
        for p in processes.values():
            p.stop()
        redis.stop()


#: What each process must have done before its scrape counts (a series that moved).
READY: dict[str, tuple[Callable[[Scrape], bool], str]] = {
    "serve": (lambda s: s.value("extender_nodes_known") is not None, "snapshot"),
    "scale": (_positive("extender_scaler_ticks_total", role="leader", result="ok"), "leader tick"),
    "agent": (_positive("extender_agent_reports_total", result="written"), "report written"),
    "sync": (_positive("extender_sync_synced"), "list of nodes and pods"),
    "keda-scaler": (_positive("extender_keda_decisions_readable"), "read of the decisions"),
}


def scrape_all(processes: dict[str, Process]) -> dict[str, Scrape]:
    """Each process's ``/metrics`` once it has done its work (:data:`READY`)."""
    return {name: p.wait(*READY[name]) for name, p in processes.items()}
