"""Fault suite, slow clients: connections that send headers and part of a body, then stall.

With gunicorn's gthread workers each such connection held a pool thread in a blocking read: 8-12
of them (2 workers x 4 threads) made every real /prioritize and /healthz time out for as long as
they were held. kube-scheduler calls the extender inside its scheduling cycle, so the extender
must keep answering its caller whatever other clients do. Here 12 stalled connections are held
open (loopback, bounded: closed at the end of the test) while a real client sends requests; every
one must be answered 200 within the client's socket timeout (10 s, a bound on a hang, not a
latency assertion).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import RedisServer
from tests.net import free_port, stop
from tests.test_extender_integration import (
    NAMES,
    Server,
    cache_args,
    go_prioritize,
    load_inventory,
    running,
    serve_command,
    vllm_pod,
    wait_for,
    wait_ready,
)
from tests.test_scoring import POLICY

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent

SLOW_CONNECTIONS = 12
REAL_REQUESTS = 40


@contextlib.contextmanager
def stalled_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections that sent a request's headers and the first bytes of its body, then stall."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /prioritize HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000\r\n\r\n{\"Pod\": {")
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def extender(tmp_path: Path, redis_server: RedisServer) -> Iterator[Server]:
    load_inventory(redis_server.url, tmp_path)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    with running(serve_command(policy, port, redis_server.url), tmp_path, port) as server:
        wait_ready(server)
        yield server


def test_stalled_clients_do_not_stop_the_real_one(extender: Server) -> None:
    body = json.dumps(cache_args(vllm_pod(), NAMES)).encode()
    with stalled_connections(extender.port, SLOW_CONNECTIONS):
        conn = extender.connection()  # one keep-alive connection, as kube-scheduler keeps
        try:
            for _ in range(REAL_REQUESTS):
                conn.request("POST", "/prioritize", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                assert resp.status == 200
                go_prioritize(resp.read(), NAMES)
        finally:
            conn.close()
        for _ in range(REAL_REQUESTS // 4):  # and fresh connections, as probes and new clients open
            assert extender.call("GET", "/healthz")[0] == 200
            status, raw = extender.call("POST", "/prioritize", body)
            assert status == 200
            go_prioritize(raw, NAMES)


def test_a_body_over_the_limit_is_refused_while_it_arrives(tmp_path: Path, redis_server: RedisServer) -> None:
    # without Content-Length (chunked) the limit is counted as the bytes arrive, not after buffering them all
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    with running(serve_command(policy, port, redis_server.url, "--max-body", "1000"), tmp_path, port), \
            socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /prioritize HTTP/1.1\r\nHost: extender\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 800
        for _ in range(3):
            s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            data = s.recv(4096)
            if not data:
                break
            reply += data
        assert reply.startswith(b"HTTP/1.1 413")


def test_a_worker_stopping_loses_no_request_on_kept_alive_connections(tmp_path: Path,
                                                                     redis_server: RedisServer) -> None:
    # Go does not retry a POST that meets a closed connection: a stopping worker must announce
    # Connection: close before it closes, never drop a connection a client is about to reuse.
    import os
    import threading

    from tests.test_fault_reload import workers

    load_inventory(redis_server.url, tmp_path)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    command = serve_command(policy, port, redis_server.url)
    command[command.index("--workers") + 1] = "2"
    body = json.dumps(cache_args(vllm_pod(), NAMES)).encode()
    errors: list[str] = []
    answered = [0]
    stop = threading.Event()

    def client(server: Server) -> None:
        conn = server.connection()
        for _ in range(20_000):  # bounded; stopped much earlier
            if stop.is_set():
                break
            try:
                conn.request("POST", "/prioritize", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                answered[0] += 1
                if resp.status != 200:
                    errors.append(str(resp.status))
            except (OSError, http.client.HTTPException) as exc:
                errors.append(type(exc).__name__)
                conn.close()
                conn = server.connection()
        conn.close()

    with running(command, tmp_path, port) as server:
        wait_ready(server)
        threads = [threading.Thread(target=client, args=(server,)) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for _ in range(2):
                before = workers(server)
                victim = min(before)
                os.kill(victim, signal.SIGTERM)
                wait_for(lambda: victim not in workers(server) and len(workers(server)) == 2,  # noqa: B023
                         "a replacement worker", server)
                wait_ready(server)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
    assert answered[0] > 0 and errors == []


# ---- the External Metrics API (extender scale) -------------------------------------------------------

#: The scaler's --request-timeout here: long enough that every stall is still held while the real
#: client is served, short enough that the test sees the server end them.
METRICS_REQUEST_TIMEOUT = "8s"
STALLED_HANDSHAKES = 12
STALLED_KEPT_ALIVE = 8


@pytest.fixture
def metrics_api(tmp_path: Path, redis_server: RedisServer) -> Iterator[tuple[str, Any]]:
    """``extender scale --no-loop`` over TLS with a published decision: ``(base url, pki)``."""
    from extender.state import connect
    from tests.delegation_double import running as delegation
    from tests.pki import make_pki
    from tests.scaler_policy import policy_text, publish_decision
    from tests.test_external_metrics_tls import HPA, _wait_up

    pki = make_pki(tmp_path / "pki")
    with delegation() as double:
        double.state.tokens = {"hpa-token": (HPA, ["system:serviceaccounts"])}
        double.state.rule = lambda user, groups, attrs: user == HPA
        double.state.configmap = {"client-ca-file": pki.client_ca.pem(),
                                  "requestheader-client-ca-file": pki.front_proxy_ca.pem()}
        client = connect(redis_server.url, tmp_path)
        publish_decision(client, load=1.0)
        client.close()
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_text())
        port = free_port()
        log = tmp_path / "scale.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "extender.scaler", "scale", "--policy", str(policy), "--no-loop",
                 "--redis-url", redis_server.url, "--bind", f"127.0.0.1:{port}",
                 "--kubeconfig", str(double.write_kubeconfig(tmp_path / "kubeconfig.yaml")),
                 "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
                 "--request-timeout", METRICS_REQUEST_TIMEOUT],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        url = f"https://127.0.0.1:{port}"
        try:
            _wait_up(url, pki, process, log)
            yield url, pki
        finally:
            stop(process, 30)


def test_stalled_handshakes_and_kept_alive_requests_do_not_stop_the_hpa(metrics_api: tuple[str, Any]) -> None:
    # With gthread, four half-sent handshakes held every thread until each timed out, and a request
    # stalled on a kept-alive connection held one for good. Now the event loop holds them all while
    # the HPA's calls are answered, and the server ends each stall after --request-timeout.
    url, pki = metrics_api
    port = int(url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=str(pki.server_ca.cert))
    path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/extender-desired-replicas"
    query = f"{path}?labelSelector=workload%3Dqwen3"
    get = f"GET {query} HTTP/1.1\r\nHost: scaler\r\nAuthorization: Bearer hpa-token\r\n\r\n".encode()
    raw: list[socket.socket] = []
    kept: list[ssl.SSLSocket] = []
    try:
        for _ in range(STALLED_HANDSHAKES):  # the start of a ClientHello, then nothing
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            raw.append(s)
        for k in range(STALLED_KEPT_ALIVE):  # one whole request answered, then half of the next
            t = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                                    server_hostname="127.0.0.1")
            t.sendall(get)
            first = t.recv(65536)
            assert first.startswith(b"HTTP/1.1 200"), first[:200]
            # half the stalls never finish their headers, half send headers and part of a body
            t.sendall(get[:40] if k % 2 else f"POST {path} HTTP/1.1\r\nHost: scaler\r\n"
                      "Content-Length: 1000\r\n\r\n{".encode())
            kept.append(t)
        # The real client, on one kept-alive connection and on fresh ones, while every stall is held.
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        for i in range(REAL_REQUESTS):
            use = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10) if i % 4 == 0 else conn
            use.request("GET", query, headers={"Authorization": "Bearer hpa-token"})
            reply = use.getresponse()
            body = reply.read()
            if use is not conn:
                use.close()
            assert reply.status == 200, body[:300]
            assert json.loads(body)["items"][0]["value"] == "5"
        conn.close()
        # Every stall is bounded: the server ends it (the socket's 30 s timeout bounds a hang here).
        for s in raw:
            assert s.recv(65536) == b""  # the handshake timed out: closed, nothing sent
        for t in kept:
            rest = b""
            with contextlib.suppress(ssl.SSLError, ConnectionResetError):
                while chunk := t.recv(65536):
                    rest += chunk
            assert rest == b"" or rest.startswith(b"HTTP/1.1 408"), rest[:200]
    finally:
        for s in raw:
            s.close()
        for t in kept:
            t.close()


class EarlyError(NamedTuple):
    """One row: a request ``extender scale`` refuses before its app runs, and the Status it answers."""

    id: str
    request: bytes  # after the request line's path
    code: int
    reason: str


EARLY_ERRORS = [EarlyError(*row) for row in [
    ("body-over-the-limit", b"Content-Length: 2000000\r\n\r\n", 413, "RequestEntityTooLarge"),
    ("body-stalls", b"Content-Length: 1000\r\n\r\n{", 408, "RequestTimeout"),
]]


@pytest.mark.parametrize("row", EARLY_ERRORS, ids=[e.id for e in EARLY_ERRORS])
def test_the_metrics_api_answers_early_errors_as_status_objects(metrics_api: tuple[str, Any], row: EarlyError) -> None:
    # the HPA's client decodes every error as a metav1.Status, including those written before the app runs
    url, pki = metrics_api
    port = int(url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=str(pki.server_ca.cert))
    path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/extender-desired-replicas"
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                             server_hostname="127.0.0.1") as t:
        t.sendall(f"POST {path} HTTP/1.1\r\nHost: scaler\r\nAuthorization: Bearer hpa-token\r\n".encode() + row.request)
        reply = b""
        with contextlib.suppress(ssl.SSLError, ConnectionResetError):
            while chunk := t.recv(65536):  # the server closes the connection after the error
                reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {row.code}".encode()), reply[:300]
    status = json.loads(body)
    assert {k: status[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": row.reason, "code": row.code}
