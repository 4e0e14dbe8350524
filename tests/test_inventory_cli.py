"""``extender inventory load|show`` end to end, against a real Redis.

The commands run through ``extender.cli.main`` (its error printing and exit codes) with a parser
that holds only what ``extender.state.commands.register`` adds, so these tests do not depend on
how the rest of the CLI is wired.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from extender import cli
from extender.arguments import Parser
from extender.core.inventory import NodeState
from extender.state import InventoryStore, connect
from extender.state.commands import age, freshness, human_bytes, register, stamp_heartbeats

#: The reader's clock of the rendering tests (unix seconds).
NOW = 1_000_000.0

VALID_YAML = """\
apiVersion: extender.io/v1alpha1
kind: Inventory
compileRegistry: [ck-aaa, ck-bbb]
nodes:
  - name: gpu-1
    nodeClass: p5.48xlarge
    labels: {node.kubernetes.io/instance-type: p5.48xlarge}
    gpus: 8
    gpusFree: 2
    nvmeTotal: 30TB
    nvmeFree: 1.5TiB
    images: ["vllm/vllm-openai:v0.11.0"]
    weights: {qwen3-moe/rev-1: 64GiB}
    compileKeys: [ck-aaa]
    snapshots: [qwen3-moe]
  - name: gpu-2
    gpus: 8
    heartbeat: 0        # explicitly never reported: kept, so the node is stale
"""

VALID_JSON = json.dumps({
    "nodes": [
        {"name": "gpu-1", "nodeClass": "p5.48xlarge", "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
         "gpus": 8, "gpusFree": 2, "nvmeTotal": "30TB", "nvmeFree": "1.5TiB",
         "images": ["vllm/vllm-openai:v0.11.0"], "weights": {"qwen3-moe/rev-1": "64GiB"},
         "compileKeys": ["ck-aaa"], "snapshots": ["qwen3-moe"]},
        {"name": "gpu-2", "gpus": 8, "heartbeat": 0},
    ],
    "compileRegistry": ["ck-aaa", "ck-bbb"],
}, indent=2)

Run = Callable[..., tuple[int, str, str]]


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="extender")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``run(*argv)`` -> (exit code, stdout, stderr) through ``cli.main``."""
    monkeypatch.setattr(cli, "build_parser", _parser)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("EXTENDER_DATA_DIR", raising=False)

    def invoke(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = connect(redis_url, "unused")
    yield c
    c.close()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---- load -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "text"), [pytest.param("inv.yaml", VALID_YAML, id="yaml"),
                                            pytest.param("inv.json", VALID_JSON, id="json")])
def test_load_writes_every_node_in_one_version_step(
    run: Run, redis_url: str, client: redis.Redis, tmp_path: Path, *, name: str, text: str
) -> None:
    path = write(tmp_path, name, text)
    code, out, err = run("inventory", "load", path, "--redis-url", redis_url)
    assert (code, err) == (0, "")
    assert out == (f"{path}: loaded 2 node(s) and 2 compile-registry key(s) into redis://127.0.0.1:"
                   f"{redis_url.split(':')[2]}; inventory version 1\n")
    version, records, registry = InventoryStore(client).load_all()
    assert (version, [r.name for r in records], registry) == (1, ["gpu-1", "gpu-2"], frozenset({"ck-aaa", "ck-bbb"}))
    gpu1, gpu2 = records
    assert (gpu1.nvme_free, gpu1.weights) == (1.5 * 2**40, {"qwen3-moe/rev-1": 64 * 2**30})
    assert gpu1.heartbeat > 0  # none in the file: stamped at load time
    assert gpu2.heartbeat == 0  # explicit in the file: kept


def test_load_merges_and_replace_makes_the_inventory_exactly_the_file(
    run: Run, redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    store = InventoryStore(client)
    store.put_many([NodeState.model_validate({"name": "other"})], registry=["ck-old"])
    path = write(tmp_path, "inv.yaml", VALID_YAML)
    assert run("inventory", "load", path, "--redis-url", redis_url)[0] == 0
    assert sorted(store.names()) == ["gpu-1", "gpu-2", "other"]
    code, out, _ = run("inventory", "load", path, "--replace", "--redis-url", redis_url)
    assert code == 0 and "replaced the inventory with 2 node(s)" in out
    _, records, registry = store.load_all()
    assert ([r.name for r in records], registry) == (["gpu-1", "gpu-2"], frozenset({"ck-aaa", "ck-bbb"}))


BROKEN = [
    pytest.param(
        """\
nodes:
  - name: gpu-1
    gpus: -1
    nvmeFree: 12GB/s
  - gpus: 8
  - name: gpu-3
    imagez: []
""",
        [
            r"inv.yaml:3: nodes\[0\].gpus: must be >= 0, got -1",
            r"inv.yaml:4: nodes\[0\].nvmeFree: .*not a size",
            r"inv.yaml:5: nodes\[1\].name: required field is missing",
            r"inv.yaml:7: nodes\[2\].imagez: unknown field; did you mean 'images'\?",
        ],
        id="schema-errors-all-at-once",
    ),
    pytest.param(
        """\
nodes:
  - name: gpu-1
    gpus: 8
    gpusFree: 9
  - name: gpu-2
    nvmeTotal: 1TB
    nvmeFree: 2TB
  - name: gpu-1
""",
        [
            r"inv.yaml:4: nodes\[0\].gpusFree: must be <= gpus \(8\), got 9",
            r"inv.yaml:7: nodes\[1\].nvmeFree: must be <= nvmeTotal \(1TB\), got 2TB",
            r"inv.yaml:8: nodes\[2\].name: duplicate node name 'gpu-1' \(first at nodes\[0\], line 2\)",
        ],
        id="cross-field-errors",
    ),
    # docs/inventory.md's example: the duplicate name was reported only once the schema passed
    pytest.param(
        """\
nodes:
  - name: gpu-1
    gpus: -1
  - name: gpu-2
    gpus: 8
  - name: gpu-3
    imagez: []
  - name: gpu-1
""",
        [
            r"inv.yaml:3: nodes\[0\].gpus: must be >= 0, got -1",
            r"inv.yaml:7: nodes\[2\].imagez: unknown field; did you mean 'images'\?",
            r"inv.yaml:8: nodes\[3\].name: duplicate node name 'gpu-1' \(first at nodes\[0\], line 2\)",
        ],
        id="schema-and-cross-record-errors-at-once",
    ),
    pytest.param(
        """\
nodes:
  - name: gpu-1
    gpus: 8
    gpusFree: 9
  - name: gpu-2
    gpus: -1
    gpusFree: 9
""",
        [
            r"inv.yaml:4: nodes\[0\].gpusFree: must be <= gpus \(8\), got 9",
            r"inv.yaml:6: nodes\[1\].gpus: must be >= 0, got -1",
        ],
        id="free-beyond-total-beside-a-schema-error",
    ),
    pytest.param(
        "nodes:\n  - name: a\n    gpus: 1\n    gpus: 2\n",
        [r"inv.yaml:4: nodes\[0\].gpus: duplicate key \(first set on line 3\)"],
        id="duplicate-key",
    ),
    pytest.param("nodes: [\n", [r"inv.yaml:2: YAML syntax"], id="yaml-syntax"),
    pytest.param("kind: Policy\n", [r"inv.yaml:1: kind: .*Inventory"], id="wrong-kind"),
]


@pytest.mark.parametrize(("text", "expected"), BROKEN)
def test_a_broken_file_reports_every_problem_and_writes_nothing(
    run: Run, redis_url: str, client: redis.Redis, tmp_path: Path, *, text: str, expected: list[str]
) -> None:
    path = write(tmp_path, "inv.yaml", text)
    code, out, err = run("inventory", "load", path, "--redis-url", redis_url)
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert len(lines) == len(expected), err
    for line, pattern in zip(lines, expected, strict=True):
        assert re.match(re.escape(str(tmp_path)) + "/" + pattern, line), line
    assert client.keys("*") == []  # nothing written, not even the version


def test_load_of_a_missing_file(run: Run, redis_url: str, tmp_path: Path) -> None:
    code, _, err = run("inventory", "load", str(tmp_path / "nope.yaml"), "--redis-url", redis_url)
    assert code == 1 and "nope.yaml: cannot read" in err


def test_load_with_redis_down_is_a_clear_error(run: Run, tmp_path: Path) -> None:
    path = write(tmp_path, "inv.yaml", VALID_YAML)
    code, _, err = run("inventory", "load", path, "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 1 and err.startswith("extender: connecting to redis://127.0.0.1:1/0: Redis is unavailable")


def test_stamp_heartbeats_fills_only_missing_ones() -> None:
    nodes = [NodeState.model_validate({"name": "a"}), NodeState.model_validate({"name": "b", "heartbeat": 5})]
    assert [n.heartbeat for n in stamp_heartbeats(nodes, now=1000.0)] == [1000.0, 5.0]


# ---- show -----------------------------------------------------------------------------------------


@pytest.fixture
def loaded(run: Run, redis_url: str, tmp_path: Path) -> str:
    assert run("inventory", "load", write(tmp_path, "inv.yaml", VALID_YAML), "--redis-url", redis_url)[0] == 0
    return redis_url


def test_show_prints_a_table(run: Run, loaded: str) -> None:
    code, out, err = run("inventory", "show", "--redis-url", loaded)
    assert (code, err) == (0, "")
    header, columns, row1, row2 = out.splitlines()
    assert header.startswith("inventory version 1 at redis://")
    assert header.endswith("2 node(s), 2 compile-registry key(s)")
    assert columns.split() == ["NODE", "CLASS", "STATE", "GPUS", "NVME", "FREE/TOTAL", "IMAGES", "WEIGHTS", "COMPILE",
                               "SNAPSHOTS"]
    # freshness is "fresh <age>": the age is wall-clock dependent, so only its shape is checked
    assert re.fullmatch(r"gpu-1 +p5\.48xlarge +fresh \d+s +2/8 +1\.5TiB/30TB +1 +1 +1 +1", row1), row1
    assert re.fullmatch(r"gpu-2 +- +stale never +0/8 +0B/0B +0 +0 +0 +0", row2), row2


def test_show_node_adds_the_details(run: Run, loaded: str) -> None:
    code, out, _ = run("inventory", "show", "gpu-1", "--redis-url", loaded)
    assert code == 0
    assert out.splitlines()[0].split()[0] == "NODE"  # no inventory header for one node
    assert "labels:       node.kubernetes.io/instance-type=p5.48xlarge" in out
    assert "  qwen3-moe/rev-1  64GiB" in out
    assert "  vllm/vllm-openai:v0.11.0" in out


def test_show_json_is_a_document_load_accepts(run: Run, loaded: str, client: redis.Redis, tmp_path: Path) -> None:
    code, out, _ = run("inventory", "show", "--json", "--redis-url", loaded)
    assert code == 0
    document = json.loads(out)
    assert [n["name"] for n in document["nodes"]] == ["gpu-1", "gpu-2"]
    assert document["nodes"][0]["nvmeFree"] == "1.5TiB"
    assert document["compileRegistry"] == ["ck-aaa", "ck-bbb"]
    # round trip: load the output back with --replace; the records are unchanged
    store = InventoryStore(client)
    version, before, _ = store.load_all()
    assert run("inventory", "load", write(tmp_path, "back.json", out), "--replace", "--redis-url", loaded)[0] == 0
    assert store.load_all()[:2] == (version + 1, before)


def test_show_json_of_a_record_with_free_above_total_loads_back(run: Run, loaded: str, client: redis.Redis,
                                                                  tmp_path: Path) -> None:
    # Another writer stored free space above the total: show --json printed it as stored and load
    # refused it ("nodes[2].nvmeFree: must be <= nvmeTotal"), so the backup could not be restored.
    client.set("extender:node:gpu-3", json.dumps({"name": "gpu-3", "gpus": 4, "gpusFree": 8, "nvmeTotal": 10**12,
                                                  "nvmeFree": 2 * 10**12, "heartbeat": 1.0}))
    client.sadd("extender:nodes", "gpu-3")
    code, out, err = run("inventory", "show", "--json", "--redis-url", loaded)
    assert code == 0
    assert "gpu-3" in err and "nvmeFree 2TB above nvmeTotal 1TB" in err  # what was cut is said
    shown = json.loads(out)["nodes"][2]
    assert (shown["name"], shown["gpusFree"], shown["nvmeFree"]) == ("gpu-3", 4, "1TB")
    code, back, err = run("inventory", "load", write(tmp_path, "backup.json", out), "--replace", "--redis-url", loaded)
    assert (code, err) == (0, ""), err
    assert "replaced the inventory with 3 node(s)" in back
    restored = InventoryStore(client).get("gpu-3")
    assert restored is not None and (restored.gpus_free, restored.nvme_free) == (4, 10**12)
    code, again, _ = run("inventory", "show", "--json", "--redis-url", loaded)
    assert json.loads(again)["nodes"] == json.loads(out)["nodes"]  # and the restored store shows the same


def test_show_node_json_is_the_record(run: Run, loaded: str) -> None:
    code, out, _ = run("inventory", "show", "gpu-2", "--json", "--redis-url", loaded)
    assert code == 0
    assert NodeState.model_validate(json.loads(out)) == NodeState.model_validate({"name": "gpu-2", "gpus": 8})


def test_show_of_an_unknown_node_is_an_error(run: Run, loaded: str) -> None:
    code, out, err = run("inventory", "show", "gpu-9", "--redis-url", loaded)
    assert (code, out) == (1, "")
    assert err == f"extender: node 'gpu-9' is not in the inventory at {loaded} (2 node(s) stored)\n"


@pytest.mark.parametrize(("name", "quoted"), [
    pytest.param("bad", "'extender:node:bad'", id="a-plain-name"),
    pytest.param("evil\n\x1b[31mred", "'extender:node:evil\\n\\x1b[31mred'", id="a-name-that-would-forge-a-line"),
    pytest.param(b"bad\xff", "'extender:node:bad\\\\xff'", id="a-name-that-is-not-utf-8"),
])
def test_show_warns_about_corrupt_records_and_shows_the_rest(run: Run, loaded: str, client: redis.Redis,
                                                              name: str | bytes, quoted: str) -> None:
    client.sadd("extender:nodes", name)
    client.set(b"extender:node:" + (name if isinstance(name, bytes) else name.encode()), "{")
    code, out, err = run("inventory", "show", "--redis-url", loaded)
    assert code == 0
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warning.startswith(f"warning: skipped corrupt record {quoted}: ")
    assert "2 node(s)" in out.splitlines()[0]


def test_show_of_an_empty_inventory(run: Run, redis_url: str) -> None:
    code, out, _ = run("inventory", "show", "--redis-url", redis_url)
    assert (code, out.count("\n")) == (0, 1)
    assert "version 0" in out and "0 node(s)" in out


# ---- where the store is ---------------------------------------------------------------------------


def test_redis_url_comes_from_the_environment(
    run: Run, monkeypatch: pytest.MonkeyPatch, redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert run("inventory", "load", write(tmp_path, "inv.yaml", VALID_YAML))[0] == 0
    assert InventoryStore(client).version() == 1


def test_without_a_url_the_embedded_server_in_the_data_dir_is_used(
    run: Run, monkeypatch: pytest.MonkeyPatch, embedded_data_dir: Path, tmp_path: Path
) -> None:
    path = write(tmp_path, "inv.yaml", VALID_YAML)
    code, out, _ = run("inventory", "load", path, "--data-dir", str(embedded_data_dir))
    assert code == 0 and f"into unix://{embedded_data_dir / 'redis.sock'}" in out
    monkeypatch.setenv("EXTENDER_DATA_DIR", str(embedded_data_dir))  # same dir, from the environment
    code, out, _ = run("inventory", "show")
    assert code == 0 and "2 node(s)" in out


# ---- rendering helpers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        pytest.param(0, "0B", id="zero"),
        pytest.param(64 * 2**30, "64GiB", id="binary-exact"),
        pytest.param(3_900_000_000, "3.9GB", id="decimal-exact"),
        pytest.param(123_456_789_012, "~123GB", id="odd-rounded-to-3-digits"),
        pytest.param(1_234_567_890_123, "~1.23TB", id="odd-terabytes"),
        pytest.param(999_600_001, "~1GB", id="rounds-up-into-the-next-unit"),
    ],
)
def test_human_bytes(n: int, shown: str) -> None:
    assert human_bytes(n) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        pytest.param(-3.0, "0s", id="future-heartbeat-clamped"),
        pytest.param(59.9, "59s", id="under-a-minute"),
        pytest.param(119, "119s", id="seconds-until-two-minutes"),
        pytest.param(120, "2m", id="two-minutes"),
        pytest.param(7199, "119m", id="minutes-until-two-hours"),
        pytest.param(2 * 86400 + 5, "2d", id="days"),
    ],
)
def test_age(seconds: float, shown: str) -> None:
    assert age(seconds) == shown


@pytest.mark.parametrize(
    ("heartbeat", "shown"),
    [
        pytest.param(0.0, "stale never", id="never-reported"),
        pytest.param(NOW - 12, "fresh 12s", id="behind-within-ttl"),
        pytest.param(NOW - 60, "fresh 60s", id="behind-exactly-at-ttl"),
        pytest.param(NOW - 300, "stale 5m", id="behind-beyond-ttl"),
        pytest.param(NOW + 0.4, "fresh 0s", id="ahead-by-under-a-second"),
        pytest.param(NOW + 20, "fresh ahead 20s", id="ahead-within-ttl"),
        pytest.param(NOW + 60, "fresh ahead 60s", id="ahead-exactly-at-ttl"),
        # a dead agent's clock ran ahead: it used to show "fresh 0s" until ours caught up
        pytest.param(NOW + 300, "stale ahead 5m", id="ahead-beyond-ttl"),
    ],
)
def test_freshness_says_how_far_ahead_a_heartbeat_is(heartbeat: float, shown: str) -> None:
    assert freshness(NodeState(name="n", heartbeat=heartbeat, ttl=60), NOW) == shown
