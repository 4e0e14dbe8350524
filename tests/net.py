"""Loopback helpers shared by tests that start servers."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
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
def dripping(host: str, port: int, prefix: bytes, drip: bytes, every_s: float = 0.05) -> Iterator[None]:
    """A TCP server on ``host:port`` that reads a request, sends ``prefix`` at once, then ``drip`` one
    byte every ``every_s`` seconds (each byte well within any per-read timeout), then closes.

    ``drip`` is bounded, so a client that waits for all of it still returns (late), and a test of a
    client that should give up early fails instead of hanging.
    """
    server = socket.create_server((host, port))
    server.settimeout(0.1)
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(prefix)
                for byte in drip:
                    if stop.wait(every_s):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return  # the client gave up and closed

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=answer, args=(conn,), name="dripping-conn", daemon=True).start()

    thread = threading.Thread(target=run, name="dripping", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        server.close()
