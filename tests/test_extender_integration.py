"""The extender end to end: real gunicorn on loopback, real Redis, requests shaped as kube-scheduler sends them.

Each test starts ``python -m extender.api.scheduler serve`` (the same entry ``extender serve`` uses) on a
free port and always stops it. Replies are read the way the scheduler's Go decoder reads them
(:func:`go_filter`, :func:`go_prioritize`): keys case-insensitively, scores as JSON integers (a float
would fail the decode), the prioritize reply as an array, and a filter reply without
``NodeNames`` (cache mode) meaning "every node filtered out".

Waits in these tests are bounded polls for a state (a setup bound), never assertions on time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from flask import Flask

from extender.core.caches import weights_key
from extender.core.inventory import NodeState
from extender.state import InventoryStore, connect
from tests.conftest import RedisServer
from tests.kube_double.waiting import wait_until
from tests.net import free_port, stop
from tests.test_scoring import POLICY

if TYPE_CHECKING:
    import redis

    from extender.api.scheduler.refresher import Refresher

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
GB = 10**9
IMAGE_NAMES = ["docker.io/vllm/vllm-openai@sha256:4f6c2a9d0b1e3c5a7f9e8d6c4b2a0918273645546372819a0b1c2d3e4f506172",
               "docker.io/vllm/vllm-openai:v0.11.0"]
#: Bounds for polling a state change (generous: CI machines stall); never asserted on.
SETTLE_S = 30.0


# --------------------------------------------------------------------------------------------
# Realistic Kubernetes objects
# --------------------------------------------------------------------------------------------


def vllm_pod(workload: str = "llm") -> dict[str, Any]:
    """A pending vLLM pod of a Deployment, as kube-scheduler marshals ``ExtenderArgs.Pod``."""
    return {
        "metadata": {
            "name": f"{workload}-6b8c9d7f4-q2w9x", "generateName": f"{workload}-6b8c9d7f4-",
            "namespace": "inference", "uid": "0e6b1a8c-3f4d-4b2a-9c8e-7d6f5a4b3c2d",
            "resourceVersion": "9812734", "creationTimestamp": "2025-06-01T12:00:00Z",
            "labels": {"app": workload, "app.kubernetes.io/name": workload, "pod-template-hash": "6b8c9d7f4"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{workload}-6b8c9d7f4",
                                 "uid": "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d", "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": {
            "volumes": [{"name": "models", "hostPath": {"path": "/mnt/nvme/models", "type": "DirectoryOrCreate"}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
            "containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "command": ["vllm", "serve"],
                "args": ["meta-llama/Llama-3.1-8B-Instruct", "--port=8000", "--max-model-len=8192"],
                "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                "env": [{"name": "HF_HOME", "value": "/models"}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1", "cpu": "4"}},
                "volumeMounts": [{"name": "models", "mountPath": "/models"}, {"name": "shm", "mountPath": "/dev/shm"}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "schedulerName": "default-scheduler",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def node_object(name: str, pool: str, *, with_vllm_image: bool) -> dict[str, Any]:
    """A v1.Node as the scheduler holds it: labels, capacity, conditions, and kubelet's status.images."""
    images = [{"names": [f"registry.example.com/team/tool-{i}@sha256:{i:064x}",
                         f"registry.example.com/team/tool-{i}:1"],
               "sizeBytes": 900_000_000 - i * 10_000_000} for i in range(40)]
    if with_vllm_image:
        images.insert(0, {"names": IMAGE_NAMES, "sizeBytes": 10_137_000_000})
    return {
        "metadata": {
            "name": name, "uid": f"uid-{name}", "resourceVersion": "77", "creationTimestamp": "2025-05-01T00:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": "us-west-2a",
                       "pool": pool},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"providerID": f"aws:///us-west-2a/i-{sum(map(ord, name)):012d}",
                 "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "192", "memory": "2097152Mi", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "191450m", "memory": "2050000Mi", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": "2025-06-01T11:59:50Z", "lastTransitionTime": "2025-05-01T00:01:00Z"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.1.23"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.31.2", "containerRuntimeVersion": "containerd://1.7.22",
                         "osImage": "Amazon Linux 2023", "architecture": "amd64"},
            "images": images,
        },
    }


def cache_args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``ExtenderArgs`` with nodeCacheCapable: true (Go writes every field, the unused one null)."""
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def full_args(pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """``ExtenderArgs`` with nodeCacheCapable: false: a whole v1.NodeList."""
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


# --------------------------------------------------------------------------------------------
# Reading replies like Go's encoding/json
# --------------------------------------------------------------------------------------------


def _no_floats(text: str) -> Any:
    raise AssertionError(f"a JSON number with a fraction or exponent ({text}) fails Go's int64 decode")


def go_json(raw: bytes) -> Any:
    return json.loads(raw, parse_float=_no_floats)


def go_field(obj: dict[str, Any], name: str) -> Any:
    """Go's decoder: exact key, else a case-insensitive match; absent means the zero value (nil)."""
    if name in obj:
        return obj[name]
    return next((v for k, v in obj.items() if k.lower() == name.lower()), None)


def go_prioritize(raw: bytes, sent: list[str]) -> dict[str, int]:
    reply = go_json(raw)
    assert isinstance(reply, list), "HostPriorityList must be a JSON array"
    out: dict[str, int] = {}
    for item in reply:
        host, score = go_field(item, "Host"), go_field(item, "Score")
        assert isinstance(host, str) and host in sent, f"{host!r} was not in the request"
        assert type(score) is int and 0 <= score <= 10
        out[host] = score
    return out


@dataclass
class FilterReply:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


def go_filter(raw: bytes, sent: list[str], *, cache_mode: bool) -> FilterReply:
    reply = go_json(raw)
    assert isinstance(reply, dict)
    assert go_field(reply, "Error") in (None, "")
    if cache_mode:
        names = go_field(reply, "NodeNames")
        assert names is not None, "no NodeNames in cache mode: the scheduler would filter out every node"
        passed = list(names)
    else:
        nodes = go_field(reply, "Nodes")
        assert nodes is not None, "no Nodes in full mode: the scheduler would filter out every node"
        passed = [go_field(go_field(n, "metadata"), "name") for n in go_field(nodes, "items")]
    assert set(passed) <= set(sent), "the scheduler errors on a node it did not send"
    failed = go_field(reply, "FailedNodes") or {}
    unresolvable = go_field(reply, "FailedAndUnresolvableNodes") or {}
    return FilterReply(passed, failed, unresolvable)


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


@dataclass
class Server:
    """A gunicorn process we started."""

    port: int
    process: subprocess.Popen[bytes]
    log: Path
    tls_context: ssl.SSLContext | None = None

    def connection(self) -> http.client.HTTPConnection:
        if self.tls_context is not None:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.tls_context)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = self.connection()
        try:
            conn.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post(self, verb: str, body: dict[str, Any]) -> bytes:
        status, data = self.call("POST", f"/{verb}", json.dumps(body).encode())
        assert status == 200, data
        return data

    def metric(self, prefix: str) -> float:
        status, data = self.call("GET", "/metrics")
        assert status == 200
        return sum(float(line.rsplit(" ", 1)[1]) for line in data.decode().splitlines() if line.startswith(prefix))

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


def wait_for(check: Callable[[], bool], what: str, server: Server | None = None, bound_s: float = SETTLE_S) -> None:
    def attempt() -> bool:
        with contextlib.suppress(OSError, http.client.HTTPException):
            return check()
        return False  # the server is not answering yet

    wait_until(attempt, timeout_s=bound_s, what=what, interval_s=0.05,
               report=None if server is None else lambda: f"--- server log ---\n{server.logs()[-4000:]}")


@contextlib.contextmanager
def running(command: list[str], tmp_path: Path, port: int, *, tls_context: ssl.SSLContext | None = None,
            env: dict[str, str] | None = None) -> Iterator[Server]:
    log = tmp_path / f"server-{port}.log"
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "REDIS_URL")}
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env={**clean_env, **(env or {})})
    server = Server(port, process, log, tls_context)
    try:
        wait_for(lambda: process.poll() is None and server.call("GET", "/healthz")[0] == 200, "/healthz", server)
        yield server
    finally:
        stop(process)


def serve_command(policy: Path, port: int, redis_url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "extender.api.scheduler", "serve", "--policy", str(policy),
            "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4", "--redis-url", redis_url,
            "--poll-interval", "0.1", "--max-snapshot-age", "1.5", *extra]


def wait_ready(server: Server) -> None:
    def ready() -> bool:
        status, data = server.call("GET", "/readyz")
        return status == 200 and json.loads(data)["mode"] == "snapshot"

    wait_for(ready, "/readyz with a snapshot", server)


# --------------------------------------------------------------------------------------------
# Fixtures: inventory in Redis, the policy, a running extender
# --------------------------------------------------------------------------------------------


def records(now: float) -> list[NodeState]:
    def rec(name: str, pool: str, *, warm: bool) -> NodeState:
        return NodeState.model_validate({
            "name": name, "labels": {"pool": pool}, "gpus": 8, "gpusFree": 8,
            "nvmeTotal": 4 * 10**12, "nvmeFree": 3 * 10**12,
            "images": IMAGE_NAMES if warm else [],
            "weights": {weights_key("llm", "r1"): 100 * GB} if warm else {},
            "heartbeat": now, "ttl": 3600,
        })

    return [rec("gpu-fast-warm", "fast", warm=True), rec("gpu-fast-cold", "fast", warm=False),
            rec("gpu-slow-warm", "slow", warm=True), rec("gpu-slow-cold", "slow", warm=False)]


NAMES = ["gpu-fast-warm", "gpu-fast-cold", "gpu-slow-warm", "gpu-slow-cold"]


def load_inventory(redis_url: str, tmp_path: Path) -> None:
    client = connect(redis_url, tmp_path / "unused")
    try:
        InventoryStore(client).replace(records(time.time()), [])
    finally:
        client.close()


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


@pytest.fixture
def extender(policy_file: Path, redis_server: RedisServer, tmp_path: Path) -> Iterator[Server]:
    load_inventory(redis_server.url, tmp_path)
    port = free_port()
    with running(serve_command(policy_file, port, redis_server.url), tmp_path, port) as server:
        wait_ready(server)
        yield server


# --------------------------------------------------------------------------------------------
# Both modes, as kube-scheduler sends them
# --------------------------------------------------------------------------------------------


def test_cache_mode_warm_outranks_cold(extender: Server) -> None:
    body = cache_args(vllm_pod(), [*NAMES, "gpu-not-in-inventory"])
    scores = go_prioritize(extender.post("prioritize", body), body["NodeNames"])
    # (arithmetic in tests/test_scoring.py) fast image+weights 175 s -> 7, fast cold 230 s -> 6,
    # slow image+weights 370 s -> 4, slow cold 570 s -> 0, unknown -> cold -> 0
    assert scores == {"gpu-fast-warm": 7, "gpu-fast-cold": 6, "gpu-slow-warm": 4, "gpu-slow-cold": 0,
                      "gpu-not-in-inventory": 0}
    filtered = go_filter(extender.post("filter", body), body["NodeNames"], cache_mode=True)
    assert filtered.passed == body["NodeNames"] and not filtered.failed and not filtered.unresolvable


def test_full_node_list_mode_reads_status_images(extender: Server) -> None:
    nodes = [node_object("gpu-fast-cold", "fast", with_vllm_image=False),
             node_object("new-fast-with-image", "fast", with_vllm_image=True),
             node_object("new-fast-without", "fast", with_vllm_image=False)]
    body = full_args(vllm_pod(), nodes)
    sent = [n["metadata"]["name"] for n in nodes]
    scores = go_prioritize(extender.post("prioritize", body), sent)
    # not in the inventory, classified by its labels; kubelet reports the image: 180 s -> 7
    assert scores == {"gpu-fast-cold": 6, "new-fast-with-image": 7, "new-fast-without": 6}
    filtered = go_filter(extender.post("filter", body), sent, cache_mode=False)
    assert filtered.passed == sent


def test_hard_rules_fail_nodes_with_reasons(extender: Server) -> None:
    body = cache_args(vllm_pod("strict"), NAMES)
    filtered = go_filter(extender.post("filter", body), NAMES, cache_mode=True)
    # strict: no compile cache anywhere, so even fast image+weights (175 s) misses the 120 s SLO
    assert filtered.passed == []
    assert set(filtered.unresolvable) == set(NAMES)
    assert all("startup SLO" in reason for reason in filtered.unresolvable.values())


def test_unmatched_pod_is_neutral(extender: Server) -> None:
    body = cache_args(vllm_pod("not-a-workload"), NAMES)
    assert set(go_prioritize(extender.post("prioritize", body), NAMES).values()) == {0}
    assert go_filter(extender.post("filter", body), NAMES, cache_mode=True).passed == NAMES


def test_keep_alive_connection_serves_many_calls(extender: Server) -> None:
    conn = extender.connection()
    try:
        body = json.dumps(cache_args(vllm_pod(), NAMES)).encode()
        for _ in range(20):
            conn.request("POST", "/prioritize", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("Connection") != "close"
            go_prioritize(resp.read(), NAMES)
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# Fail open
# --------------------------------------------------------------------------------------------


def all_neutral(server: Server) -> bool:
    body = cache_args(vllm_pod(), NAMES)
    return set(go_prioritize(server.post("prioritize", body), NAMES).values()) == {0}


def scored(server: Server) -> bool:
    body = cache_args(vllm_pod(), NAMES)
    return go_prioritize(server.post("prioritize", body), NAMES)["gpu-fast-warm"] == 7


def test_redis_killed_mid_test_fails_open_then_recovers(extender: Server, redis_server: RedisServer,
                                                        tmp_path: Path) -> None:
    assert scored(extender)
    redis_server.kill()
    wait_for(lambda: all_neutral(extender), "neutral scores after Redis died", extender)
    assert go_filter(extender.post("filter", cache_args(vllm_pod("strict"), NAMES)), NAMES,
                     cache_mode=True).passed == NAMES  # hard rules fail open too
    assert extender.metric('extender_fail_open_total{reason="store_unavailable"') >= 1
    status, ready = extender.call("GET", "/readyz")
    assert status == 200 and json.loads(ready)["failOpen"] == "store_unavailable"
    redis_server.restart()  # comes back empty (nothing persisted): the agents would refill it
    load_inventory(redis_server.url, tmp_path)
    wait_for(lambda: scored(extender), "scores back after Redis returned", extender)


def test_frozen_redis_means_stale_snapshot_and_requests_never_wait(extender: Server,
                                                                   redis_server: RedisServer) -> None:
    assert redis_server.process is not None
    assert scored(extender)
    redis_server.process.send_signal(signal.SIGSTOP)  # a hung server: reads block until their timeout
    try:
        # Every one of these calls is answered (10 s client timeout) while the refresher is stuck
        # in a Redis read: the request path does not touch Redis.
        wait_for(lambda: all_neutral(extender), "neutral scores with Redis frozen", extender)
        assert extender.metric('extender_fail_open_total{reason="stale_snapshot"') >= 1
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    wait_for(lambda: scored(extender), "scores back after Redis thawed", extender)


def faulty_app() -> Flask:
    """gunicorn factory for the exception test: the real app with scoring that raises."""
    from extender.api.scheduler.app import create_app
    from extender.api.scheduler.engine import Engine
    from extender.api.scheduler.settings import Settings

    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("injected scoring failure")

    Engine.prioritize_names = boom  # type: ignore[method-assign]
    Engine.filter_names = boom  # type: ignore[method-assign]
    settings = Settings(policy_path=Path(os.environ["EXTENDER_TEST_POLICY"]),
                        redis_url=os.environ["EXTENDER_TEST_REDIS_URL"], poll_interval_s=0.1)
    return create_app(settings)


def test_exception_in_scoring_fails_open(policy_file: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    load_inventory(redis_server.url, tmp_path)
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--threads", "2", "--workers", "1",
               "--bind", f"127.0.0.1:{port}", "tests.test_extender_integration:faulty_app()"]
    env = {"EXTENDER_TEST_POLICY": str(policy_file), "EXTENDER_TEST_REDIS_URL": redis_server.url}
    with running(command, tmp_path, port, env=env) as server:
        wait_ready(server)
        assert all_neutral(server)
        assert go_filter(server.post("filter", cache_args(vllm_pod("strict"), NAMES)), NAMES,
                         cache_mode=True).passed == NAMES
        assert server.metric('extender_fail_open_total{reason="exception"') == 2
    assert server.logs().count("injected scoring failure") >= 1


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_bad_input_gets_400_and_oversized_413(policy_file: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    load_inventory(redis_server.url, tmp_path)
    port = free_port()
    with running(serve_command(policy_file, port, redis_server.url, "--max-body", "65536"), tmp_path, port) as server:
        status, data = server.call("POST", "/filter", b"{not json")
        assert status == 400 and "not valid JSON" in json.loads(data)["error"]
        status, data = server.call("POST", "/prioritize", json.dumps({"NodeNames": NAMES}).encode())
        assert status == 400 and "Pod" in json.loads(data)["error"]
        big = json.dumps(cache_args(vllm_pod(), [f"node-{i:06d}" for i in range(10_000)])).encode()
        conn = server.connection()
        try:
            conn.request("POST", "/prioritize", big, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 413 and "limit" in json.loads(resp.read())["error"]
        finally:
            conn.close()
        status, _ = server.call("POST", "/prioritize", json.dumps(cache_args(vllm_pod(), NAMES)).encode())
        assert status == 200  # the server is fine afterwards


# --------------------------------------------------------------------------------------------
# Serving: TLS, several workers, policy on disk
# --------------------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=scheduler-extender.kube-system.svc",
                    "-addext", "subjectAltName=DNS:scheduler-extender.kube-system.svc,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_tls(policy_file: Path, redis_server: RedisServer, tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    load_inventory(redis_server.url, tmp_path)
    cert, key = certificate
    context = ssl.create_default_context(cafile=str(cert))
    port = free_port()
    command = serve_command(policy_file, port, redis_server.url, "--tls-cert", str(cert), "--tls-key", str(key))
    with running(command, tmp_path, port, tls_context=context) as server:
        wait_ready(server)
        assert scored(server)
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.request("GET", "/healthz")
            plain.getresponse().read()
        plain.close()


def test_metrics_add_up_across_workers(policy_file: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    load_inventory(redis_server.url, tmp_path)
    port = free_port()
    command = serve_command(policy_file, port, redis_server.url)
    command[command.index("--workers") + 1] = "3"
    with running(command, tmp_path, port) as server:
        wait_for(lambda: server.logs().count("Booting worker") >= 3, "three workers booted", server)
        body = cache_args(vllm_pod(), NAMES)
        for _ in range(30):  # a new connection each time, so the calls spread over the workers
            server.post("prioritize", body)
        # every call is counted once, whichever worker answered it and whatever it answered
        assert server.metric("extender_requests_total{") == 30
        requests_seen = server.metric('extender_request_duration_seconds_count{verb="prioritize"}')
        assert requests_seen == 30


def test_policy_change_on_disk_is_picked_up_and_invalid_one_ignored(extender: Server, policy_file: Path) -> None:
    assert scored(extender)
    # secondsPerPoint 100 s: fast image+weights (570 - 175) / 100 = 3.95 -> 4
    policy_file.write_text(POLICY.replace("secondsPerPoint: 30s", "secondsPerPoint: 100s"))
    body = cache_args(vllm_pod(), NAMES)
    wait_for(lambda: go_prioritize(extender.post("prioritize", body), NAMES)["gpu-fast-warm"] == 4,
             "the new policy in effect", extender)
    policy_file.write_text(POLICY.replace("secondsPerPoint: 30s", "secondsPerPoint: banana"))
    wait_for(lambda: "keeping the last good policy" in extender.logs(), "the invalid policy rejected", extender)
    assert go_prioritize(extender.post("prioritize", body), NAMES)["gpu-fast-warm"] == 4


def test_serve_refuses_an_invalid_policy(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY.replace("count: 8", "count: 0").replace("secondsPerPoint: 30s", "secondsPerPoint: soon"))
    done = subprocess.run([sys.executable, "-m", "extender.api.scheduler", "serve", "--policy", str(bad),
                           "--bind", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert "gpu.count" in done.stderr and "secondsPerPoint" in done.stderr
    assert "not starting" in done.stderr


def test_explain_command_reads_the_live_inventory(policy_file: Path, redis_server: RedisServer,
                                                   tmp_path: Path) -> None:
    load_inventory(redis_server.url, tmp_path)
    pod_file = tmp_path / "pod.json"
    pod_file.write_text(json.dumps(vllm_pod()))
    base = [sys.executable, "-m", "extender.api.scheduler", "explain", "--policy", str(policy_file),
            "--pod", str(pod_file),
            "--redis-url", redis_server.url, "--nodes", "gpu-fast-warm,gpu-new"]
    table = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert table.returncode == 0, table.stderr
    assert "profile llm" in table.stdout
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines() if line.startswith("gpu-")}
    assert rows["gpu-fast-warm"][-2:] == ["7", "pass"] and rows["gpu-new"][1:3] == ["unknown", "unknown"]
    report = json.loads(subprocess.run([*base, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60,
                                       check=True).stdout)
    warm = report["nodes"][0]
    assert warm["node"] == "gpu-fast-warm" and warm["totalSeconds"] == 175.0 and warm["score"] == 7
    assert warm["phases"]["image_s"] == 0.0 and warm["cache"]["weightsBytes"] == 100 * GB
    redis_server.kill()
    down = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert down.returncode == 1 and "unavailable" in down.stderr


def hand_driven_refresher(policy_file: Path, client: redis.Redis) -> Refresher:
    """The refresher of a real app on ``client``'s inventory, without its thread and without spacing
    between reloads: each ``refresh_once`` reads whatever changed."""
    from extender.api.scheduler.app import create_app
    from extender.api.scheduler.settings import Settings

    settings = Settings(policy_path=policy_file, start_refresher=False, store_factory=lambda: InventoryStore(client),
                        min_rebuild_interval_s=0.0, rebuild_duty_factor=0.0)
    refresher: Refresher = create_app(settings).extensions["extender"].refresher
    return refresher


def test_a_heartbeat_costs_a_reader_one_record_not_the_inventory(
        policy_file: Path, redis_server: RedisServer, tmp_path: Path, decoded_records: list[str]) -> None:
    # 1,000 heartbeats a second used to make every worker re-read all 15,000 records per reload

    decoded = decoded_records
    client = connect(redis_server.url, tmp_path / "unused")
    writer = InventoryStore(client)
    now = time.time()
    writer.replace(records(now), [])
    refresher = hand_driven_refresher(policy_file, client)
    refresher.refresh_once()
    assert sorted(decoded) == sorted(NAMES)  # the first read is whole
    decoded.clear()
    beat = records(now + 1)[1]
    writer.put(beat.model_copy(update={"heartbeat": now + 1, "gpus_free": 3}))
    refresher.refresh_once()
    assert decoded == ["gpu-fast-cold"]
    engine = refresher.engine
    assert engine is not None and engine.snapshot.version == writer.version()
    held = {r.name: r for r in engine.snapshot.nodes}
    assert sorted(held) == sorted(NAMES) and held["gpu-fast-cold"].gpus_free == 3
    writer.delete("gpu-slow-cold")
    refresher.refresh_once()
    engine = refresher.engine
    assert engine is not None
    assert sorted(r.name for r in engine.snapshot.nodes) == sorted(set(NAMES) - {"gpu-slow-cold"})


def test_a_bare_heartbeat_decodes_no_record_and_brings_a_stale_node_back(
        policy_file: Path, redis_server: RedisServer, tmp_path: Path, decoded_records: list[str]) -> None:
    # Heartbeats were record writes: each bumped the version, and every worker read, decoded and
    # re-scored the records of every node that reported (issue: p99 under 1,000 heartbeats/s).

    client = connect(redis_server.url, tmp_path / "unused")
    writer = InventoryStore(client)
    now = time.time()
    stale = [r.model_copy(update={"ttl": 60.0, "heartbeat": now - 120}) if r.name == "gpu-fast-warm" else r
             for r in records(now)]
    writer.replace(stale, [])
    refresher = hand_driven_refresher(policy_file, client)
    refresher.refresh_once(now)
    profile = refresher.policy.profiles[0]
    engine = refresher.engine
    assert engine is not None
    cold_score = engine.table(profile, now).evaluation.score[engine.snapshot.positions["gpu-fast-warm"]]
    decoded_records.clear()
    version = writer.version()
    writer.beat_many({"gpu-fast-warm": now + 1, "gpu-slow-cold": now + 1})
    refresher.refresh_once(now + 1)
    assert decoded_records == [] and writer.version() == version  # no record read, no record version moved
    engine = refresher.engine
    assert engine is not None and engine.snapshot.version == version
    row = engine.snapshot.positions["gpu-fast-warm"]
    assert engine.snapshot.heartbeat[row] == now + 1
    assert engine.table(profile, now + 1).evaluation.score[row] > cold_score  # fresh again, so warm again
    # A policy change rebuilds from the records held, which do not carry the heartbeat: it must stay.
    refresher._policy_dirty = True
    refresher.refresh_once(now + 2)
    engine = refresher.engine
    assert engine is not None and engine.snapshot.heartbeat[engine.snapshot.positions["gpu-fast-warm"]] == now + 1


def test_a_whole_report_replaces_a_heartbeat_stamped_ahead_also_in_a_rebuild(
        policy_file: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    # The refresher kept every bare heartbeat read since its last full read and put them back on
    # any rebuild, also one the store had dropped when a whole report replaced it: a heartbeat
    # from a clock that ran an hour ahead then made the node stale ahead (cold) again after a
    # policy change, until the next full read.

    client = connect(redis_server.url, tmp_path / "unused")
    writer = InventoryStore(client)
    now = time.time()
    start = [r.model_copy(update={"ttl": 60.0}) if r.name == "gpu-fast-warm" else r for r in records(now)]
    writer.replace(start, [])
    refresher = hand_driven_refresher(policy_file, client)
    refresher.refresh_once(now)
    profile = refresher.policy.profiles[0]

    def fresh_and_score(t: float) -> tuple[bool, float]:
        engine = refresher.engine
        assert engine is not None
        row = engine.snapshot.positions["gpu-fast-warm"]
        return bool(engine.snapshot.fresh(t)[row]), float(engine.table(profile, t).evaluation.score[row])

    fresh, warm_score = fresh_and_score(now)
    assert fresh
    writer.beat_many({"gpu-fast-warm": now + 3600})  # the agent's clock jumped an hour ahead
    refresher.refresh_once(now + 1)
    fresh, score = fresh_and_score(now + 1)
    assert not fresh and score < warm_score  # stale ahead: cold
    writer.put(start[0].model_copy(update={"heartbeat": now + 2}))  # set right, it writes whole
    refresher.refresh_once(now + 2)
    assert fresh_and_score(now + 2) == (True, warm_score)
    refresher._policy_dirty = True  # a rebuild from the records held
    refresher.refresh_once(now + 3)
    assert fresh_and_score(now + 3) == (True, warm_score)


def test_a_store_that_restarted_empty_is_read_whole_at_once(
        policy_file: Path, redis_server: RedisServer, tmp_path: Path) -> None:
    # Its change log starts again below our version: asking it for "changes since" finds nothing,
    # and the snapshot kept serving the lost nodes until the next periodic full read (60 s).

    client = connect(redis_server.url, tmp_path / "unused")
    writer = InventoryStore(client)
    now = time.time()
    writer.replace(records(now), [])
    for _ in range(3):
        writer.put(records(now)[0])
    refresher = hand_driven_refresher(policy_file, client)
    refresher.refresh_once(now)
    client.flushall()
    writer.put(NodeState(name="gpu-new", labels={"pool": "fast"}, heartbeat=now))
    refresher.refresh_once(now + 1)
    engine = refresher.engine
    assert engine is not None and [r.name for r in engine.snapshot.nodes] == ["gpu-new"]


class Refill(NamedTuple):
    id: str
    writes: int  # whole writes the store took after it restarted, less the version we had seen


REFILLS = [
    Refill("refilled to below our version", -2),
    # agents whose heartbeats the empty store refuses all write whole reports at once: the version
    # can reach ours, or pass it, before the worker looks, and only the heartbeat sequence still
    # says that the store lost what it had
    Refill("refilled to exactly our version", 0),
    Refill("refilled past our version", 2),
]


@pytest.mark.parametrize("case", REFILLS, ids=[c.id for c in REFILLS])
def test_a_store_that_restarted_empty_is_noticed_by_either_counter(
        policy_file: Path, redis_server: RedisServer, tmp_path: Path, case: Refill) -> None:
    client = connect(redis_server.url, tmp_path / "unused")
    writer = InventoryStore(client)
    now = time.time()
    writer.replace(records(now), [])
    for _ in range(3):
        writer.put(records(now)[0])
    for i in range(3):  # the agents' bare heartbeats
        writer.beat_many({r.name: now + i for r in records(now)})
    refresher = hand_driven_refresher(policy_file, client)
    refresher.refresh_once(now)
    ours = writer.version()
    client.flushall()
    fresh = NodeState(name="gpu-new", labels={"pool": "fast"}, heartbeat=now)
    for _ in range(ours + case.writes):
        writer.put(fresh)
    assert writer.version() - ours == case.writes
    refresher.refresh_once(now + 1)  # long before the next periodic full read (60 s)
    engine = refresher.engine
    assert engine is not None and [r.name for r in engine.snapshot.nodes] == ["gpu-new"]


def test_a_heartbeat_rebuilds_its_own_row_not_the_fleet(
        policy_file: Path, redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Reading one record was not enough: each reload still rebuilt the columnar snapshot, every
    # profile's cache state and every score fragment for the whole fleet (0.15 s at 15,000 nodes).
    from extender.api.scheduler import engine as engine_module
    from extender.api.scheduler.engine import Engine
    from extender.api.scheduler.wire import fragments_for
    from extender.core.inventory import InventorySnapshot

    client = connect(redis_server.url, tmp_path / "unused")
    writer = InventoryStore(client)
    now = time.time()
    fleet = records(now) + [r.model_copy(update={"name": f"{r.name}-{i}"}) for i in range(50) for r in records(now)]
    writer.replace(fleet, [])
    refresher = hand_driven_refresher(policy_file, client)
    refresher.refresh_once()
    rows_done: list[int] = []
    encoded: list[str] = []
    real_rows = InventorySnapshot._rows_state

    def counted_rows(self: InventorySnapshot, profile: Any, rows: Any) -> Any:
        rows_done.append(len(rows))
        return real_rows(self, profile, rows)

    def counted_fragments(names: list[str], scores: list[int]) -> list[str]:
        encoded.extend(names)
        return fragments_for(names, scores)

    monkeypatch.setattr(InventorySnapshot, "_rows_state", counted_rows)
    monkeypatch.setattr(engine_module, "fragments_for", counted_fragments)
    beat = next(r for r in fleet if r.name == "gpu-fast-warm-7")
    writer.put(beat.model_copy(update={"heartbeat": now + 1, "images": ()}))  # the image is gone: its score moves
    writer.put(NodeState(name="gpu-new", labels={"pool": "fast"}, heartbeat=now + 1))
    writer.delete("gpu-slow-cold-3")
    refresher.refresh_once()
    engine = refresher.engine
    assert engine is not None and engine.snapshot.version == writer.version()
    profiles = len(engine.policy.profiles)
    assert rows_done == [2] * profiles  # the replaced and the new record, once per profile
    assert set(encoded) <= {"gpu-fast-warm-7", "gpu-new"} and "gpu-new" in encoded
    # Oracle: the patched engine answers exactly like one built from scratch on the same records.
    fresh = Engine(engine.policy, InventorySnapshot.build(engine.policy, engine.snapshot.nodes,
                                                          registry=engine.snapshot.registry))
    monkeypatch.undo()
    t = time.time()
    for profile in engine.policy.profiles:
        got, want = engine.table(profile, t), fresh.table(profile, t)
        assert dict(got.fragments) == dict(want.fragments)
        assert got.fragments.unknown_score == want.fragments.unknown_score
        assert got.failing == want.failing
    held = {r.name for r in engine.snapshot.nodes}
    assert "gpu-new" in held and "gpu-slow-cold-3" not in held and len(held) == len(fleet)


def test_a_patch_that_fails_falls_back_to_a_full_rebuild_and_says_so(
        policy_file: Path, redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from extender.core.inventory import InventorySnapshot

    client = connect(redis_server.url, tmp_path / "unused")
    writer = InventoryStore(client)
    now = time.time()
    writer.replace(records(now), [])
    refresher = hand_driven_refresher(policy_file, client)
    refresher.refresh_once()

    def broken(*args: Any, **kwargs: Any) -> InventorySnapshot:
        raise RuntimeError("a bug in the patch")

    monkeypatch.setattr(InventorySnapshot, "update", broken)
    writer.put(NodeState(name="gpu-new", labels={"pool": "fast"}, heartbeat=now + 1))
    with caplog.at_level("WARNING", logger="extender"):
        refresher.refresh_once()
    engine = refresher.engine
    assert engine is not None and engine.snapshot.version == writer.version()
    assert "gpu-new" in {r.name for r in engine.snapshot.nodes}  # the full rebuild took it in
    warned = [r.getMessage() for r in caplog.records if "patching" in r.getMessage()]
    assert warned == ["patching 1 changed records failed, rebuilding from every record: a bug in the patch"]
