"""Loopback helpers shared by tests that start servers."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel picks it), for a server the test starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def stop(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM a server the test started, as Kubernetes stops a pod, and wait for it; SIGKILL it if it
    has not exited within ``timeout_s`` (a bound so a hung server fails the test instead of hanging it)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def accepting(host: str, port: int, answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[None]:
    """A TCP server on ``host:port`` for the ``with`` block: each connection goes to
    ``answer(conn, stop)`` on a thread of its own and is closed after it (a client that gives up
    first is no error); ``stop`` is set when the block ends, for an answer that waits."""
    server = socket.create_server((host, port))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                answer(conn, stop)
            except OSError:
                return  # the client gave up and closed

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), name=f"{host}:{port}-conn", daemon=True).start()

    thread = threading.Thread(target=run, name=f"{host}:{port}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        server.close()


@contextmanager
def dripping(host: str, port: int, prefix: bytes, drip: bytes, every_s: float = 0.05) -> Iterator[None]:
    """A TCP server on ``host:port`` that reads a request, sends ``prefix`` at once, then ``drip`` one
    byte every ``every_s`` seconds (each byte well within any per-read timeout), then closes.

    ``drip`` is bounded, so a client that waits for all of it still returns (late), and a test of a
    client that should give up early fails instead of hanging.
    """

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)
        conn.sendall(prefix)
        for byte in drip:
            if stop.wait(every_s):
                return
            conn.sendall(bytes([byte]))

    with accepting(host, port, answer):
        yield


@contextmanager
def recording(host: str, port: int, reply: bytes) -> Iterator[list[bytes]]:
    """A TCP server on ``host:port`` that answers ``reply`` to every request, keeping each request
    it was sent (the bytes of its first read)."""
    seen: list[bytes] = []

    def answer(conn: socket.socket, _stop: threading.Event) -> None:
        seen.append(conn.recv(65536))
        conn.sendall(reply)

    with accepting(host, port, answer):
        yield seen
