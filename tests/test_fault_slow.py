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
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RedisServer
from tests.net import free_port
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
    import signal
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
