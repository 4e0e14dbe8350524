"""The inventory store against a real Redis: encoding, versions, consistency, corruption, outages.

Also the embedded server: unix socket only, data kept across stop/start and SIGKILL, one server
per data directory shared by every client.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
from redis.client import Pipeline

from extender.core.errors import InvalidValueError, StateError, StoreUnavailableError
from extender.core.inventory import NodeState
from extender.state import InventoryStore, connect, describe, embedded
from extender.state.connection import redact
from extender.state.store import decode, encode
from tests.conftest import RedisServer


def node(name: str, **fields: Any) -> NodeState:
    """A record built the way files and agents spell it (camelCase, human units allowed)."""
    return NodeState.model_validate({"name": name, **fields})


EVERY_FIELD: dict[str, Any] = {
    "nodeClass": "p5.48xlarge",
    "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": "us-east-1a"},
    "gpus": 8,
    "gpusFree": 3,
    "nvmeTotal": "30TB",
    "nvmeFree": 1_234_567_890_123,  # not a round number: must come back to the byte
    "images": ["docker.io/vllm/vllm-openai:v0.11.0", "docker.io/vllm/vllm-openai@sha256:" + "a" * 64],
    "weights": {"qwen3-moe/rev-1": "64GiB", "llama-70b/rev-7": 12_345},
    "compileKeys": ["ck-0123456789abcdef"],
    "snapshots": ["qwen3-moe"],
    "pullingBytes": "3.9GB",
    "heartbeat": 1_700_000_000.125,
    "ttl": "90s",
}


#: Why a listed node's record is skipped when its key holds no string.
NOT_A_STRING = "listed in the node set but the record is missing or not a string"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = connect(redis_url, "unused")
    yield c
    c.close()


@pytest.fixture
def store(client: redis.Redis) -> InventoryStore:
    return InventoryStore(client)


# ---- encoding and round trips ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(node("gpu-1", **EVERY_FIELD), id="every-field-set"),
        pytest.param(node("bare"), id="only-a-name-all-defaults"),
        pytest.param(node("zero", gpus=0, nvmeTotal=0, heartbeat=0, ttl=0.001), id="zeros-and-tiny-ttl"),
        pytest.param(node("n", labels={"a.b/c": "ü", "": ""}, weights={"w/v:1": 1}), id="odd-label-and-key-text"),
    ],
)
def test_a_record_comes_back_equal(store: InventoryStore, record: NodeState) -> None:
    store.put(record)
    assert store.get(record.name) == record
    _, records, _ = store.load_all()
    assert records == [record]


def test_records_are_stored_as_camel_case_json_in_si_units(store: InventoryStore, client: redis.Redis) -> None:
    store.put(node("gpu-1", **EVERY_FIELD))
    stored = json.loads(client.get("extender:node:gpu-1"))  # type: ignore[arg-type]
    assert stored["nvmeTotal"] == 30 * 10**12  # "30TB" = 30 x 1000^4 bytes, a plain number
    assert stored["weights"]["qwen3-moe/rev-1"] == 64 * 2**30  # "64GiB"
    assert stored["ttl"] == 90.0
    assert stored["gpusFree"] == 3
    # the same bytes decode to the same record
    assert decode("gpu-1", encode(node("gpu-1", **EVERY_FIELD))) == node("gpu-1", **EVERY_FIELD)


def test_a_client_without_decoded_responses_works_too(redis_url: str) -> None:
    raw_client = redis.Redis.from_url(redis_url)  # replies as bytes, as a caller's own client may
    store = InventoryStore(raw_client)
    store.put_many([node("gpu-1", **EVERY_FIELD)], registry=["k1"])
    assert store.get("gpu-1") == node("gpu-1", **EVERY_FIELD)
    assert store.load_all() == (1, [node("gpu-1", **EVERY_FIELD)], frozenset({"k1"}))
    assert store.names() == frozenset({"gpu-1"})
    raw_client.close()


def test_get_of_an_unknown_node_is_none(store: InventoryStore) -> None:
    assert store.get("nope") is None


# ---- versions: one step per write, written in the same transaction ------------------------------


Op = Callable[[InventoryStore], int]
VERSION_STEPS: list[tuple[str, Op, int]] = [
    ("put bumps 0 -> 1", lambda s: s.put(node("a")), 1),
    ("put_many of three nodes is one step", lambda s: s.put_many([node("b"), node("c"), node("d")]), 2),
    ("put_many with registry keys is still one step", lambda s: s.put_many([node("e")], registry=["k1", "k2"]), 3),
    ("put_many of nothing writes nothing", lambda s: s.put_many([]), 3),
    ("put replacing a record", lambda s: s.put(node("a", gpus=4)), 4),
    ("delete", lambda s: s.delete("b"), 5),
    ("delete of an absent node still bumps", lambda s: s.delete("never-there"), 6),
    ("set_registry", lambda s: s.set_registry(["k3"]), 7),
    ("set_registry to empty", lambda s: s.set_registry([]), 8),
    ("add_registry", lambda s: s.add_registry("k4"), 9),
    ("replace", lambda s: s.replace([node("z")], ["k5"]), 10),
]


def test_every_write_returns_the_next_version(store: InventoryStore) -> None:
    assert store.version() == 0
    for label, op, expected in VERSION_STEPS:
        assert op(store) == expected, label
        assert store.version() == expected, label


def test_writes_change_what_load_all_returns(store: InventoryStore) -> None:
    store.put_many([node("a"), node("b")], registry=["k1"])
    store.delete("a")
    store.add_registry("k2")
    version, records, registry = store.load_all()
    assert (version, [r.name for r in records], registry) == (3, ["b"], frozenset({"k1", "k2"}))
    store.set_registry(["k3"])
    assert store.load_all()[2] == frozenset({"k3"})


def test_replace_deletes_nodes_not_listed_and_replaces_the_registry(store: InventoryStore, client: redis.Redis) -> None:
    store.put_many([node("old-1"), node("keep", gpus=1)], registry=["old-key"])
    store.replace([node("keep", gpus=2), node("new")], ["new-key"])
    _, records, registry = store.load_all()
    assert [(r.name, r.gpus) for r in records] == [("keep", 2), ("new", 0)]
    assert registry == frozenset({"new-key"})
    assert client.exists("extender:node:old-1") == 0  # the record itself is gone, not only its name


def test_a_write_that_fails_inside_the_transaction_is_a_state_error(store: InventoryStore, client: redis.Redis) -> None:
    # Only someone editing Redis by hand can break the version key; our writes must then say so
    # (as our error, naming the action) instead of leaking redis-py's ResponseError.
    client.set("extender:inventory:version", "not-a-number")
    with pytest.raises(StateError, match="writing node records") as raised:
        store.put_many([node("a"), node("b")])
    assert isinstance(raised.value.__cause__, redis.ResponseError)


def test_prefix_separates_two_inventories(client: redis.Redis) -> None:
    blue, green = InventoryStore(client, prefix="blue"), InventoryStore(client, prefix="{green}")
    blue.put(node("a"))
    assert green.load_all() == (0, [], frozenset())
    assert client.exists("blue:node:a", "blue:nodes", "blue:inventory:version") == 3


# ---- consistent reads -----------------------------------------------------------------------------


def test_load_all_never_sees_half_a_batch(client: redis.Redis) -> None:
    """A writer rewrites 30 nodes per batch with the batch number; every read sees one batch only.

    Each batch is one MULTI/EXEC, so a read must return 30 records all carrying the same batch
    number, and that number must be the one the writer got back with the version the read reports.
    """
    writer, reader = InventoryStore(client), InventoryStore(client)
    names = [f"node-{i:02d}" for i in range(30)]
    version_of_batch: dict[int, int] = {0: writer.put_many([node(n, gpusFree=0, gpus=100) for n in names])}
    seen: list[tuple[int, set[int]]] = []
    done = threading.Event()

    def write() -> None:
        for batch in range(1, 60):
            version_of_batch[batch] = writer.put_many([node(n, gpusFree=batch, gpus=100) for n in names])
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    while not done.is_set() or len(seen) < 5:
        version, records, _ = reader.load_all()
        assert len(records) == 30
        seen.append((version, {r.gpus_free for r in records}))
    thread.join()
    batch_of_version = {v: b for b, v in version_of_batch.items()}
    for version, batches in seen:
        assert batches == {batch_of_version[version]}


def test_load_all_sees_nodes_added_by_another_client(client: redis.Redis) -> None:
    reader, writer = InventoryStore(client), InventoryStore(client)
    writer.put(node("a"))
    assert [r.name for r in reader.load_all()[1]] == ["a"]  # the reader now remembers ["a"]
    writer.put_many([node("b"), node("c")])
    writer.delete("a")
    version, records, _ = reader.load_all()
    assert (version, [r.name for r in records]) == (3, ["b", "c"])


# ---- corrupt records ------------------------------------------------------------------------------


def _store_raw(text: str) -> Callable[[redis.Redis], None]:
    def corrupt(client: redis.Redis) -> None:
        client.set("extender:node:bad", text)

    return corrupt


def _no_record(client: redis.Redis) -> None:
    pass


def _hash_record(client: redis.Redis) -> None:
    client.hset("extender:node:bad", "name", "bad")  # MGET reads a non-string key as nil


CORRUPTIONS: list[tuple[str, Callable[[redis.Redis], None], str]] = [
    ("not-json", _store_raw("{not json"), "json"),
    ("schema-mismatch", _store_raw('{"name": "bad", "gpus": -1}'), "gpus"),
    # (a field this release does not know is no corruption: a newer release wrote it, and the record
    # is read; tests/test_mixed_releases.py)
    ("wrong-name-inside", _store_raw('{"name": "other"}'), "names node 'other'"),
    ("json-but-not-an-object", _store_raw("[1, 2]"), "input"),
    ("listed-but-missing", _no_record, "missing"),
    ("hash-instead-of-string", _hash_record, "missing"),
    # valid JSON and once accepted by the model; 2**64 GPUs overflowed every later snapshot build
    ("gpus-over-int64", _store_raw('{"name": "bad", "gpus": 18446744073709551616}'), "gpus"),
    ("heartbeat-infinite", _store_raw('{"name": "bad", "heartbeat": 1e400}'), "heartbeat"),
    ("control-characters", _store_raw('{"name": "bad", "images": ["x\\u001b[2J"]}'), "images"),
    ("oversized", _store_raw('{"name": "bad", "labels": {"k": "' + "v" * 2_000_000 + '"}}'), "larger than"),
]


@pytest.mark.parametrize(("corrupt", "reason"), [pytest.param(c, r, id=i) for i, c, r in CORRUPTIONS])
def test_a_corrupt_record_is_skipped_and_reported_once(
    store: InventoryStore,
    client: redis.Redis,
    corrupt: Callable[[redis.Redis], None],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store.put_many([node("good-1"), node("good-2")])
    client.sadd("extender:nodes", "bad")
    corrupt(client)
    with caplog.at_level(logging.WARNING, logger="extender.state.store"):
        for _ in range(3):
            _, records, _ = store.load_all()
            assert [r.name for r in records] == ["good-1", "good-2"]
            assert list(store.corrupt) == ["extender:node:bad"]
            assert reason in store.corrupt["extender:node:bad"].lower()
    warnings = [r for r in caplog.records if "extender:node:bad" in r.getMessage()]
    assert len(warnings) == 1  # three reads, one warning

    # repaired, it is read again and no longer listed; broken anew, it is reported anew
    client.delete("extender:node:bad")
    store.put(node("bad"))
    assert [r.name for r in store.load_all()[1]] == ["bad", "good-1", "good-2"]
    assert store.corrupt == {}
    client.set("extender:node:bad", "{")
    with caplog.at_level(logging.WARNING, logger="extender.state.store"):
        store.load_all()
    assert len([r for r in caplog.records if "extender:node:bad" in r.getMessage()]) == 2


def test_a_record_under_a_name_that_is_no_node_name_is_skipped_and_logged_escaped(
    store: InventoryStore, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    store.put(node("good-1"))
    evil = "bad\n\x1b[2Jfake"
    client.sadd("extender:nodes", evil)
    client.set(f"extender:node:{evil}", json.dumps({"name": evil}))
    with caplog.at_level(logging.WARNING, logger="extender.state.store"):
        _, records, _ = store.load_all()
    assert [r.name for r in records] == ["good-1"]
    assert "name" in store.corrupt[f"extender:node:{evil}"]
    assert all("\x1b" not in r.getMessage() and "\n" not in r.getMessage() for r in caplog.records)


#: (stored by another writer, read as (gpusFree, nvmeFree), what the warning says or None for none)
OVER_TOTALS = [
    pytest.param({"gpus": 8, "gpusFree": 3, "nvmeTotal": 10**12, "nvmeFree": 10**11}, (3, 10**11), None,
                 id="within-the-totals"),
    pytest.param({"gpus": 8, "gpusFree": 8, "nvmeTotal": 10**12, "nvmeFree": 10**12}, (8, 10**12), None,
                 id="exactly-the-totals"),
    pytest.param({"nvmeTotal": 10**12, "nvmeFree": 2 * 10**12}, (0, 10**12), "nvmeFree 2TB above nvmeTotal 1TB",
                 id="nvme-free-above-total"),
    pytest.param({"nvmeFree": 5 * 10**9}, (0, 0), "nvmeFree 5GB above nvmeTotal 0B", id="nvme-free-without-total"),
    pytest.param({"gpus": 4, "gpusFree": 8}, (4, 0), "gpusFree 8 above gpus 4", id="gpus-free-above-gpus"),
    pytest.param({"gpus": 4, "gpusFree": 8, "nvmeTotal": 10**12, "nvmeFree": 2 * 10**12}, (4, 10**12),
                 "gpusFree 8 above gpus 4 and nvmeFree 2TB above nvmeTotal 1TB", id="both"),
]


@pytest.mark.parametrize(("stored", "read", "warned"), OVER_TOTALS)
def test_free_above_its_total_is_read_as_the_total(store: InventoryStore, client: redis.Redis,
                                                     caplog: pytest.LogCaptureFixture, *, stored: dict[str, Any],
                                                     read: tuple[int, int], warned: str | None) -> None:
    # Nothing of ours writes such a record, but another writer can: it was served as stored (more
    # free than the node has) and `inventory show --json` of it was refused by `inventory load`.
    store.put(node("other"))
    client.set("extender:node:n", json.dumps({"name": "n", "heartbeat": 1.0, **stored}))
    client.sadd("extender:nodes", "n")
    client.zadd("extender:inventory:changes", {"n": store.version()})  # as the store's schema asks
    with caplog.at_level(logging.WARNING, logger="extender.state.store"):
        got = store.get("n")
        _, records, _ = store.load_all()
        _, changed, _ = store.changes_since(0)
    assert store.corrupt == {}  # served, not skipped
    changed_n = changed["n"]
    assert got is not None and changed_n is not None
    for record in (got, records[0], changed_n):
        assert record.name == "n" and (record.gpus_free, record.nvme_free) == read
    messages = [r.getMessage() for r in caplog.records]
    if warned is None:
        assert messages == []
    else:
        assert messages == [f"inventory record of node 'n' says {warned}: read as the total"] * 3


class NotUtf8(NamedTuple):
    write: Callable[[redis.Redis], object]
    corrupt: dict[str, str]  # what load_all lists as skipped
    registry: frozenset[str]


@pytest.mark.parametrize("case", [
    pytest.param(NotUtf8(lambda c: c.sadd("extender:nodes", b"bad\xff"),
                         {"extender:node:bad\\xff": NOT_A_STRING}, frozenset()),
                 id="a-node-name"),
    pytest.param(NotUtf8(lambda c: (c.sadd("extender:nodes", "bad"), c.set("extender:node:bad", b'{"name": "b\xff"}')),
                         {"extender:node:bad": "Invalid JSON: invalid escape at line 1 column 13"}, frozenset()),
                 id="a-record"),
    pytest.param(NotUtf8(lambda c: c.hset("extender:heartbeats", b"good-1\xff", "5"), {}, frozenset()),
                 id="a-heartbeat-field"),
    pytest.param(NotUtf8(lambda c: c.sadd("extender:compile-registry", b"k\xff"), {}, frozenset({"k\\xff"})),
                 id="a-compile-registry-key"),
])
def test_a_byte_that_is_not_utf_8_spoils_only_its_own_value(store: InventoryStore, client: redis.Redis,
                                                            case: NotUtf8) -> None:
    """Once, one such byte anywhere failed the whole load (a UnicodeDecodeError out of the reply):
    every reader's inventory, and the agent's every write. It reads as its escape now, text that
    names no record and is no JSON."""
    store.put_many([node("good-1"), node("good-2")])
    case.write(client)
    _, records, registry = store.load_all()
    assert [r.name for r in records] == ["good-1", "good-2"]
    assert store.corrupt == case.corrupt
    assert registry == case.registry


def test_a_write_of_an_oversized_record_is_refused(store: InventoryStore) -> None:
    huge = node("big", images=[f"registry.example/image-{n}:" + "t" * 900 for n in range(1200)])
    with pytest.raises(StateError, match="larger than"):
        store.put(huge)
    assert store.load_all()[1] == []


def test_get_of_a_corrupt_record_is_a_state_error_naming_the_key(store: InventoryStore, client: redis.Redis) -> None:
    client.set("extender:node:bad", '{"name": "bad", "gpus": "eight"}')
    with pytest.raises(StateError, match=r"extender:node:bad is corrupt: gpus"):
        store.get("bad")


@pytest.mark.parametrize("garbage", [
    pytest.param("x", id="a-word"),
    # Python's int() read these as versions; INCR refuses them, so the next write would fail
    pytest.param("1_000", id="underscore"),
    pytest.param("١٢٣", id="arabic-indic-digits"),
    pytest.param("１２", id="full-width-digits"),
    pytest.param(" 12 ", id="blanks-around"),
])
def test_a_garbage_version_key_is_a_state_error(store: InventoryStore, client: redis.Redis, garbage: str) -> None:
    client.set("extender:inventory:version", garbage)
    with pytest.raises(StateError, match="not an integer"):
        store.version()


# ---- outages --------------------------------------------------------------------------------------


OPERATIONS: list[tuple[str, Callable[[InventoryStore], object]]] = [
    ("version", lambda s: s.version()),
    ("get", lambda s: s.get("a")),
    ("load_all", lambda s: s.load_all()),
    ("put", lambda s: s.put(node("a"))),
    ("put_many", lambda s: s.put_many([node("a")])),
    ("replace", lambda s: s.replace([node("a")], [])),
    ("delete", lambda s: s.delete("a")),
    ("set_registry", lambda s: s.set_registry(["k"])),
    ("add_registry", lambda s: s.add_registry("k")),
    ("versions", lambda s: s.versions()),
    ("beat_many", lambda s: s.beat_many({"a": 1.0})),
    ("heartbeats_since", lambda s: s.heartbeats_since(0)),
]


@pytest.mark.parametrize("operation", [pytest.param(op, id=name) for name, op in OPERATIONS])
def test_redis_killed_mid_test_is_store_unavailable(
    redis_server: RedisServer, store: InventoryStore, operation: Callable[[InventoryStore], object]
) -> None:
    store.put(node("a"))
    redis_server.kill()
    with pytest.raises(StoreUnavailableError) as raised:
        operation(store)
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    # back up (empty: the test server keeps nothing): the same store object works again
    redis_server.restart()
    assert store.version() == 0
    operation(store)


# ---- connecting by URL ----------------------------------------------------------------------------


def test_connect_with_credentials_in_the_url(redis_server: RedisServer, client: redis.Redis) -> None:
    client.config_set("requirepass", "s3cret")
    base = f"127.0.0.1:{redis_server.port}/0"
    for url in (f"redis://:s3cret@{base}", f"redis://default:s3cret@{base}"):  # password; ACL user + password
        authed = connect(url, "unused")
        assert authed.ping()
        authed.close()
    with pytest.raises(StoreUnavailableError) as raised:
        connect(f"redis://:wrong@{base}", "unused")
    assert "wrong" not in str(raised.value)  # credentials never end up in messages


@pytest.mark.parametrize(
    ("url", "error", "message"),
    [
        pytest.param("http://localhost:6379", StateError, "invalid Redis URL", id="unknown-scheme"),
        pytest.param("redis://127.0.0.1:1/0", StoreUnavailableError, "127.0.0.1:1", id="nothing-listening"),
        pytest.param("unix:///nonexistent/redis.sock", StoreUnavailableError, "unix:///nonexistent", id="no-socket"),
    ],
)
def test_connect_errors_are_ours(url: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as raised:
        connect(url, "unused", timeout_s=1.0)
    assert raised.value.__cause__ is not None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("redis://:pw@host:6379/0", "redis://:***@host:6379/0", id="password-only"),
        pytest.param("rediss://user:pw@host/1", "rediss://user:***@host/1", id="user-and-password"),
        pytest.param("redis://host:6379/0", "redis://host:6379/0", id="no-credentials"),
    ],
)
def test_redact_hides_passwords(url: str, shown: str) -> None:
    assert redact(url) == shown


# ---- the embedded server --------------------------------------------------------------------------


def _server_pid(client: redis.Redis) -> int:
    return int(client.info("server")["process_id"])


def test_embedded_listens_on_a_unix_socket_only(embedded_data_dir: Path) -> None:
    client = connect(None, embedded_data_dir)
    paths = embedded.paths_for(embedded_data_dir)
    assert describe(client) == f"unix://{paths.socket}"
    assert paths.socket.is_socket()
    assert client.config_get("port") == {"port": "0"}  # no TCP listener at all
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    client.close()


def test_embedded_data_survives_a_clean_restart(embedded_data_dir: Path) -> None:
    client = connect(None, embedded_data_dir)
    InventoryStore(client).put_many([node("gpu-1", **EVERY_FIELD)], registry=["k1"])
    first = _server_pid(client)
    client.close()
    assert embedded.stop(embedded_data_dir) is True
    assert not embedded.paths_for(embedded_data_dir).socket.exists()
    assert embedded.stop(embedded_data_dir) is False  # nothing left to stop

    client = connect(None, embedded_data_dir)
    assert _server_pid(client) != first  # a new server, same data
    assert InventoryStore(client).load_all() == (1, [node("gpu-1", **EVERY_FIELD)], frozenset({"k1"}))
    client.close()


def test_a_second_connect_reuses_the_running_server(embedded_data_dir: Path) -> None:
    one, two = connect(None, embedded_data_dir), connect(None, embedded_data_dir)
    assert _server_pid(one) == _server_pid(two)
    InventoryStore(one).put(node("a"))
    assert InventoryStore(two).get("a") == node("a")
    one.close()
    two.close()


def test_processes_racing_at_start_share_one_server(embedded_data_dir: Path) -> None:
    # Separate processes, started together on an empty data dir: the flock lets one start the
    # server and the others find it answering.
    script = (
        "import sys; from extender.state import connect; "
        "print(connect(None, sys.argv[1]).info('server')['process_id'])"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", script, str(embedded_data_dir)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    pids = {int(p.communicate(timeout=60)[0]) for p in racers}
    assert all(p.returncode == 0 for p in racers)
    client = connect(None, embedded_data_dir)
    assert pids == {_server_pid(client)}
    client.close()


def test_a_killed_server_leaves_a_stale_socket_that_the_next_connect_replaces(embedded_data_dir: Path) -> None:
    client = connect(None, embedded_data_dir)
    InventoryStore(client).put(node("a", gpus=8))
    pid = _server_pid(client)
    client.close()
    os.kill(pid, signal.SIGKILL)
    while embedded.pid_running(pid):
        time.sleep(0.01)
    socket_path = embedded.paths_for(embedded_data_dir).socket
    assert socket_path.exists()  # SIGKILL gives redis no chance to remove it
    assert embedded.probe(socket_path) == "down"

    client = connect(None, embedded_data_dir)
    assert _server_pid(client) != pid
    # acknowledged writes were already handed to the kernel (AOF), so SIGKILL lost nothing
    assert InventoryStore(client).get("a") == node("a", gpus=8)
    client.close()


def test_a_data_dir_too_long_for_a_socket_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="too long for a unix socket"):
        connect(None, tmp_path / ("d" * 120))


def test_a_hung_server_costs_one_timeout_not_one_per_retry(redis_server: RedisServer,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused connection is retried (a restart, a failover); a read that timed out is not: the
    server is hung, and each retry waited the whole timeout again (four in all)."""
    client = connect(redis_server.url, "unused", timeout_s=0.2)
    sent: list[bytes] = []
    send: Any = redis.connection.AbstractConnection.send_packed_command  # untyped in redis-py

    def counted(self: redis.connection.AbstractConnection, command: Any, *args: Any, **kwargs: Any) -> None:
        sent.append(command)
        send(self, command, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(StoreUnavailableError, match="Timeout reading from"):
            InventoryStore(client).version()
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    assert len(sent) == 1
    client.close()


def _cannot_persist(client: redis.Redis) -> None:
    """Make the server fail to write its RDB snapshot, as on a full or read-only disk: with a save
    point configured, it then answers MISCONF to every write and to PING (nothing can be written
    under /proc, even by root)."""
    client.config_set("save", "3600 1")
    client.config_set("stop-writes-on-bgsave-error", "yes")
    client.config_set("dir", "/proc")
    client.bgsave()
    while client.info("persistence")["rdb_bgsave_in_progress"]:
        time.sleep(0.01)
    assert client.info("persistence")["rdb_last_bgsave_status"] == "err"


def test_a_server_that_cannot_persist_is_unavailable_and_says_why(embedded_data_dir: Path) -> None:
    """Once a ResponseError that no caller expected: a traceback from every command, and an agent
    that exited where it retries through any other outage."""
    client = connect(None, embedded_data_dir)
    _cannot_persist(client)
    with pytest.raises(StoreUnavailableError, match=r"^writing node records: Redis is unavailable: .*MISCONF "):
        InventoryStore(client).put(node("a"))
    client.close()
    with pytest.raises(StoreUnavailableError, match=r"^embedded Redis at .*/redis\.sock refuses commands: MISCONF "):
        connect(None, embedded_data_dir)


def test_a_server_out_of_memory_is_unavailable_and_says_why(store: InventoryStore, client: redis.Redis) -> None:
    store.put(node("a"))
    client.config_set("maxmemory", "1")  # under noeviction, the default: every write is refused
    try:
        refused = r"^writing node records: Redis is unavailable: .*when used memory > 'maxmemory'"
        with pytest.raises(StoreUnavailableError, match=refused):
            store.put(node("b"))
    finally:
        client.config_set("maxmemory", "0")


def test_a_lock_file_that_cannot_be_opened_is_a_clear_error(tmp_path: Path) -> None:
    paths = embedded.paths_for(tmp_path / "data")
    paths.lockfile.mkdir(parents=True)  # as a read-only data directory would refuse it: no traceback
    with pytest.raises(StateError, match=r"^cannot open the lock file .*: Is a directory$"):
        connect(None, tmp_path / "data")


# ---- incremental reads: what changed since a version -----------------------------------------------


def test_changes_since_names_what_each_write_touched(store: InventoryStore, client: redis.Redis) -> None:
    from extender.core.reports import AgentReport
    from extender.state.sources import SourceStore

    v1 = store.put_many([node("a"), node("b"), node("c")])
    assert store.changes_since(0)[1].keys() == {"a", "b", "c"}
    v2 = store.put(node("b", gpus=8))
    version, changed, _ = store.changes_since(v1)
    assert (version, {n: r.gpus if r else None for n, r in changed.items()}) == (v2, {"b": 8})
    v3 = store.delete("c")
    assert store.changes_since(v2)[:2] == (v3, {"c": None})
    v4 = SourceStore(store).report_agent("a", AgentReport(nvme_free=5, nvme_total=10, heartbeat=1.0))
    assert v4 is not None and set(store.changes_since(v3)[1]) == {"a"}
    v5 = store.replace([node("d")], [])
    assert {n: r is not None for n, r in store.changes_since(v4)[1].items()} == {"a": False, "b": False, "d": True}
    assert store.changes_since(v5)[:2] == (v5, {})


@pytest.mark.parametrize("damage", [
    pytest.param(lambda c: (c.delete("extender:node:bad"), c.hset("extender:node:bad", "name", "bad")),
                 id="record-key-is-a-hash"),
    pytest.param(lambda c: (c.delete("extender:node:bad"), c.rpush("extender:node:bad", "x")),
                 id="record-key-is-a-list"),
    pytest.param(lambda c: c.delete("extender:node:bad"), id="record-key-deleted-behind-the-store-s-back"),
])
def test_changes_since_lists_a_record_key_of_another_type_as_corrupt(
        store: InventoryStore, client: redis.Redis, damage: Callable[[redis.Redis], object]) -> None:
    # it was reported as a deleted node: dropped from the reader's snapshot and listed nowhere
    v1 = store.put(node("a"))
    store.put_many([node("a", gpus=2), node("bad")])
    damage(client)
    version, changed, _ = store.changes_since(v1)
    assert {n: r.gpus if r else None for n, r in changed.items()} == {"a": 2, "bad": None}  # the rest arrives
    assert store.corrupt == {"extender:node:bad": NOT_A_STRING}
    store.load_all()
    assert store.corrupt == {"extender:node:bad": NOT_A_STRING}  # as a full read says
    store.delete("bad")  # a deletion is no corruption
    assert store.changes_since(version)[1] == {"bad": None} and store.corrupt == {}


def test_changes_since_skips_a_corrupt_record(store: InventoryStore, client: redis.Redis) -> None:
    v1 = store.put(node("a"))
    store.put(node("bad"))
    client.set("extender:node:bad", '{"name": "bad", "gpus": 18446744073709551616}')
    _, changed, _ = store.changes_since(v1)
    assert changed == {"bad": None}
    assert "gpus" in store.corrupt["extender:node:bad"]


# ---- heartbeats apart from records ------------------------------------------------------------------


def test_a_heartbeat_moves_no_version_and_every_read_sees_it(store: InventoryStore) -> None:
    v1 = store.put_many([node("a", heartbeat=100.0, gpus=8), node("b", heartbeat=100.0)])
    assert store.versions() == (v1, 0)
    seq, missing = store.beat_many({"a": 250.5})
    assert (seq, missing) == (1, [])
    assert store.versions() == (v1, 1)  # the record version did not move: nothing to decode
    assert store.changes_since(v1)[1] == {}
    assert store.heartbeats_since(0) == (1, {"a": 250.5})
    assert store.heartbeats_since(1) == (1, {})
    store.beat_many({"a": 200.0})  # out of order: an older heartbeat than the stored one is ignored
    assert store.heartbeats_since(1) == (2, {"a": 250.5})
    got = store.get("a")
    assert got is not None and (got.heartbeat, got.gpus) == (250.5, 8)
    assert {r.name: r.heartbeat for r in store.load_all()[1]} == {"a": 250.5, "b": 100.0}
    store.put(node("b", heartbeat=100.0, gpus=4))  # a record written later still shows a's heartbeat
    assert {n: r.heartbeat if r else None for n, r in store.changes_since(v1)[1].items()} == {"b": 100.0}


@pytest.mark.parametrize(("beats", "expected"), [
    pytest.param({"a": 90.0}, 100.0, id="older-than-the-record-s-own-is-ignored"),
    pytest.param({"a": 300.0}, 300.0, id="a-newer-one-is-taken"),
    pytest.param({"a": 300.0, "ghost": 300.0}, 300.0, id="with-a-node-that-has-no-record"),
])
def test_a_heartbeat_never_moves_back(store: InventoryStore, beats: dict[str, float], expected: float) -> None:
    store.put(node("a", heartbeat=100.0))
    _, missing = store.beat_many(beats)
    assert missing == [n for n in beats if n != "a"]
    got = store.get("a")
    assert got is not None and got.heartbeat == expected
    assert store.get("ghost") is None  # a heartbeat never creates a record


def _agent_report(store: InventoryStore) -> object:
    from extender.core.reports import AgentReport
    from extender.state.sources import SourceStore

    return SourceStore(store).report_agent("a", AgentReport(heartbeat=50.0))


@pytest.mark.parametrize("write", [
    pytest.param(lambda s: s.put(node("a", heartbeat=50.0)), id="put-says-its-own-heartbeat"),
    pytest.param(lambda s: s.replace([node("a", heartbeat=50.0)], []), id="replace-clears-every-heartbeat"),
    # a heartbeat from a clock that ran a day ahead must not outlive the report that corrects it
    pytest.param(_agent_report, id="a-whole-agent-report-says-its-own"),
])
def test_a_whole_record_written_after_a_heartbeat_says_its_own(store: InventoryStore,
                                                              write: Callable[[InventoryStore], object]) -> None:
    store.put(node("a", heartbeat=10.0))
    store.beat_many({"a": 500.0})
    write(store)
    got = store.get("a")
    assert got is not None and got.heartbeat == 50.0
    assert store.heartbeats_since(0)[1] == {}


def test_a_deleted_node_takes_its_heartbeat_with_it(store: InventoryStore) -> None:
    store.put(node("a", heartbeat=10.0))
    store.beat_many({"a": 500.0})
    store.delete("a")
    assert store.beat_many({"a": 600.0})[1] == ["a"]
    store.put(node("a", heartbeat=20.0))  # back, with its own heartbeat and not the old one
    got = store.get("a")
    assert got is not None and got.heartbeat == 20.0


@pytest.mark.parametrize("damage", [
    pytest.param(lambda c: c.delete("extender:node:a"), id="record-deleted-behind-the-store-s-back"),
    pytest.param(lambda c: (c.delete("extender:node:a"), c.hset("extender:node:a", "x", "1")),
                 id="record-key-holds-a-hash"),
])
def test_a_heartbeat_for_a_node_listed_without_a_record_is_refused(
        store: InventoryStore, client: redis.Redis, damage: Callable[[redis.Redis], object]) -> None:
    store.put_many([node("a", heartbeat=10.0), node("b", heartbeat=10.0)])
    damage(client)  # "a" stays in the node set
    _, missing = store.beat_many({"a": 500.0, "b": 500.0})
    assert missing == ["a"]  # its writer must write the whole record again
    assert store.heartbeats_since(0)[1] == {"b": 500.0}


def test_a_merged_record_keeps_the_later_heartbeat(store: InventoryStore) -> None:
    from extender.core.reports import AgentReport, KubeReport
    from extender.state.sources import SourceStore

    sources = SourceStore(store)
    sources.report_agent("a", AgentReport(heartbeat=100.0, nvme_total=10))
    assert sources.beat_agent("a", 400.0)
    sources.report_kube({"a": KubeReport(gpus=8)})  # rewrites the merged record with the agent's old report
    got = store.get("a")
    assert got is not None and (got.heartbeat, got.gpus) == (400.0, 8)
    sources.remove_node("a")
    assert store.heartbeats_since(0)[1] == {}  # the removal took the heartbeat with it
    assert not sources.beat_agent("a", 500.0)  # no record: the agent must write whole (and meet the tombstone)


@pytest.mark.parametrize("value", [
    pytest.param(float("nan"), id="nan"),
    pytest.param(-1.0, id="negative"),
    pytest.param(1e12, id="past-the-largest-timestamp"),
    pytest.param(float("inf"), id="infinite"),
])
def test_an_impossible_heartbeat_is_refused_naming_the_node(store: InventoryStore, value: float) -> None:
    store.put(node("a", heartbeat=10.0))
    with pytest.raises(InvalidValueError, match="heartbeat of node 'a'"):
        store.beat_many({"a": value})
    got = store.get("a")
    assert got is not None and got.heartbeat == 10.0


@pytest.mark.parametrize("garbage", [
    "abc", "-5", "1e300", "nan",
    # the heartbeat script's tonumber() counts these as absent; Python's float() read them as times
    pytest.param("1_000", id="underscore"),
    pytest.param("١٢٣", id="arabic-indic-digits"),
    pytest.param("１２", id="full-width-digits"),
])
def test_a_garbage_heartbeat_in_redis_leaves_the_record_s_own(store: InventoryStore, client: redis.Redis,
                                                             garbage: str) -> None:
    store.put(node("a", heartbeat=10.0))
    store.beat_many({"a": 20.0})
    client.hset("extender:heartbeats", "a", garbage)
    got = store.get("a")
    assert got is not None and got.heartbeat == 10.0
    assert [r.heartbeat for r in store.load_all()[1]] == [10.0]
    assert store.heartbeats_since(0)[1] == {}


class LaterBeat(NamedTuple):
    """A malformed value in the heartbeat hash, and the heartbeat that must still land after it."""

    garbage: str


LATER_BEATS = {
    "past-the-largest-timestamp": LaterBeat("1e12"),
    "infinite": LaterBeat("inf"),
    "not-a-number": LaterBeat("nan"),
    "huge": LaterBeat("1e300"),
    "negative": LaterBeat("-5"),
    "junk": LaterBeat("abc"),
}


@pytest.mark.parametrize("row", LATER_BEATS.values(), ids=LATER_BEATS.keys())
def test_a_garbage_heartbeat_in_redis_does_not_block_later_ones(store: InventoryStore, client: redis.Redis,
                                                                row: LaterBeat) -> None:
    store.put(node("a", heartbeat=10.0))
    client.hset("extender:heartbeats", "a", row.garbage)  # readers count it as absent; so must the writer
    assert store.beat_many({"a": 30.0})[1] == []
    got = store.get("a")
    assert got is not None and got.heartbeat == 30.0


class BadName(NamedTuple):
    """A node name the merged record refuses on write."""

    name: str


BAD_NAMES = {
    "uppercase-and-underscore": BadName("N_1"),
    "newline": BadName("gpu\n1"),
    "longer-than-253-characters": BadName("a" * 254),
}


@pytest.mark.parametrize("row", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_a_report_under_a_name_that_is_no_node_name_is_refused_on_write(store: InventoryStore,
                                                                        row: BadName) -> None:
    from extender.core.reports import AgentReport, KubeReport
    from extender.state.sources import SourceStore

    sources = SourceStore(store)
    with pytest.raises(InvalidValueError, match="not a Kubernetes node name"):
        sources.report_agent(row.name, AgentReport(heartbeat=10.0))
    with pytest.raises(InvalidValueError, match="not a Kubernetes node name"):
        sources.report_kube({row.name: KubeReport(gpus=1)})
    assert store.names() == frozenset() and store.version() == 0  # nothing written that readers would skip


def test_a_full_read_decodes_only_records_whose_text_changed(store: InventoryStore,
                                                             decoded_records: list[str]) -> None:
    store.put_many([node("a", gpus=1), node("b", gpus=2), node("c", gpus=3)])
    store.load_all()
    decoded_records.clear()
    store.put(node("b", gpus=4))
    store.beat_many({"c": 500.0})
    _, records, _ = store.load_all()
    assert decoded_records == ["b"]  # a heartbeat changes no text; a rewritten record is read anew
    assert {r.name: (r.gpus, r.heartbeat) for r in records} == {"a": (1, 0.0), "b": (4, 0.0), "c": (3, 500.0)}


# ---- scripts by digest ------------------------------------------------------------------------------


def _beat(store: InventoryStore, client: redis.Redis) -> None:
    store.put(node("a"))
    assert store.beat_many({"a": 5.0})[1] == []


def _typed_commit(store: InventoryStore, client: redis.Redis) -> None:
    from extender.state.lock import LeaderLock

    lock = LeaderLock(client, "me", ttl_s=30)
    token = lock.acquire().token
    def stage(pipe: Pipeline) -> None:
        pipe.hset("extender:scaler:x", "a", "1")

    lock.commit(token, stage, types={"extender:scaler:x": "hash"})
    assert client.hget("extender:scaler:x", "a") == "1"


@pytest.mark.parametrize(("call", "evals", "loads"), [
    pytest.param(_beat, 2, 2, id="heartbeat-batch"),  # the two puts' version bumps are the EVALs
    pytest.param(_typed_commit, 0, 4, id="fenced-commit-key-types"),  # the lock's take is loaded too
])
def test_a_script_goes_by_digest_and_is_loaded_again_after_a_script_flush(
        store: InventoryStore, client: redis.Redis, call: Callable[[InventoryStore, redis.Redis], None],
        evals: int, loads: int) -> None:
    # EVALSHA, not the script's text each call; a server that lost its scripts answers NOSCRIPT and
    # the script is loaded again (the version bump inside MULTI is the one script sent as text: see
    # extender.state.store._BUMP)
    client.script_flush()
    client.config_resetstat()
    call(store, client)
    client.script_flush()
    call(store, client)
    stats: Any = client.info("commandstats")
    sent = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}
    # Redis 6.2 counts SCRIPT as one command (the flush between the calls is one), 7 each subcommand
    loaded = sent["script|load"] if "script|load" in sent else sent.get("script", 0) - 1
    assert (sent.get("eval", 0), loaded) == (evals, loads)
    assert sent.get("evalsha", 0) >= 2
