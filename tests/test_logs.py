"""One log format for every command: the formatters, and ``--log-format json`` from each real command.

Each command runs as a real process (``python -m extender.cli``) for a moment: ``serve`` under
gunicorn with its access log, ``scale`` with its External Metrics API and loop against the API
double and a vLLM-format endpoint, ``agent`` and ``sync`` against a real Redis (and the API double),
``agent --once``, ``simulate``, ``policy check`` and ``estimate``. With ``--log-format json`` every
line a command writes to stderr must be one JSON object with ``time``, ``level``, ``logger`` and
``message``, and the records the test waits for must carry their structured fields. Waits are
bounded polls for a line to appear, never assertions on time. The table of structured fields in
docs/cli.md must list every field a module passes in ``extra=``, in the row of its logger.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from extender import process
from extender.process import JsonLineFormatter, MessageFormatter, TextFormatter, setup_logging
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.net import free_port
from tests.scaler_policy import policy_text
from tests.vllm_endpoint import Counters, pod, serving

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "policies"
QWEN = str(POLICIES / "eks-p5-qwen3-moe.yaml")
FLEET = str(POLICIES / "g5-pcie-fleet.yaml")
#: Setup bound for a process to log what the test waits for.
SETTLE_S = 60.0
KEYS = {"time", "level", "logger", "message", "pid"}


# ---- the formatters --------------------------------------------------------------------------------


def record(message: str = "node %s is back", *args: Any, exc: bool = False, **extra: Any) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise KeyError("boom")
        except KeyError:
            exc_info = sys.exc_info()
    made = logging.LogRecord("extender.agent.loop", logging.WARNING, __file__, 1, message, args or ("gpu-a",),
                             exc_info)
    made.created = 1_700_000_000.25
    made.__dict__.update(extra)
    return made


@dataclass(frozen=True)
class TextCase:
    id: str
    record: logging.LogRecord
    expected: str


TEXT = [
    TextCase("no fields", record(), "2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: node gpu-a is back"),
    TextCase("plain fields", record(node="gpu-a", retry_s=2.5),
             "2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: node gpu-a is back node=gpu-a retry_s=2.5"),
    TextCase("quoted when spaced", record(error="connection refused", ok=True, gone=None),
             '2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: node gpu-a is back '
             'error="connection refused" ok=true gone=null'),
    TextCase("structures as compact JSON", record(nodes=["a", "b"], n={"x": 1}),
             '2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: node gpu-a is back '
             'nodes=["a","b"] n={"x":1}'),
    # a directory a serving pod made in a shared hub cache, quoted in a message: its line feed must
    # not start a line that reads as a record of its own
    TextCase("a line feed in a message cannot forge a record",
             record("hub caches: repositories no profile maps: %s",
                    "models--x\n2026-12-03T05:00:00.000Z ERROR [1] extender.agent.loop: forged"),
             "2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: hub caches: repositories no profile "
             "maps: models--x\n  2026-12-03T05:00:00.000Z ERROR [1] extender.agent.loop: forged"),
    TextCase("lines already indented stay as they are", record("Problems:\n  %s", "p.yaml:3: bad"),
             "2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: Problems:\n  p.yaml:3: bad"),
    TextCase("terminal escapes in a message are escaped", record("node %s is back", "gpu\x1b[2J\x1b]0;x\x07"),
             "2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: node gpu\\x1b[2J\\x1b]0;x\\x07 is back"),
    TextCase("a carriage return cannot overwrite the line", record("node %s is back", "a\r2026 ERROR forged"),
             "2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: node a\\r2026 ERROR forged is back"),
    TextCase("C1 controls and line separators are escaped", record("node %s is back", "a\x9b2J\x85b\u2028c"),
             "2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: node a\\x9b2J\\x85b\\u2028c is back"),
    TextCase("control characters in a field are quoted", record(node="gpu\x1b[2J", error="a\nb"),
             '2023-11-14T22:13:20.250Z WARNING [{pid}] extender.agent.loop: node gpu-a is back '
             'node="gpu\\u001b[2J" error="a\\nb"'),
]


@pytest.mark.parametrize("case", TEXT, ids=[c.id for c in TEXT])
def test_text_lines(case: TextCase) -> None:
    assert TextFormatter().format(case.record) == case.expected.replace("{pid}", str(case.record.process))


def test_text_puts_the_traceback_after_the_line_indented() -> None:
    lines = TextFormatter().format(record(exc=True)).splitlines()
    assert lines[0].endswith("node gpu-a is back")
    assert lines[1] == "  Traceback (most recent call last):" and lines[-1] == "  KeyError: 'boom'"
    assert all(line.startswith(" ") for line in lines[1:])  # only a record's first line starts at the margin


MESSAGES = [
    ("plain", "extender: no such file p.yaml", "extender: no such file p.yaml"),
    # docs/cli.md: a line at the margin always starts a record, in a command's report too
    ("a further line is indented", "p.yaml:3: bad\np.yaml:4: worse", "p.yaml:3: bad\n  p.yaml:4: worse"),
    ("a line feed in a quoted name cannot forge a line", "'a\nb\x1b[31m.yaml': cannot read",
     "'a\n  b\\x1b[31m.yaml': cannot read"),
    ("lines already indented stay as they are", "problems:\n  p.yaml:3: bad", "problems:\n  p.yaml:3: bad"),
    ("a tab is a blank too", "problems:\n\tp.yaml:3: bad", "problems:\n\tp.yaml:3: bad"),
    # a collector's blank is ASCII (Go's and Ruby's \s, JSON's whitespace): a line led by another
    # script's space starts at the margin for it, so it is indented like any other
    ("a no-break space is no indent", "'a\n\u00a02026-12-03 ERROR forged'", "'a\n  \u00a02026-12-03 ERROR forged'"),
    ("an ideographic space is no indent", "'a\n\u3000b'", "'a\n  \u3000b'"),
    ("an em space is no indent", "'a\n\u2003b'", "'a\n  \u2003b'"),
    ("a narrow no-break space is no indent", "'a\n\u202fb'", "'a\n  \u202fb'"),
    ("terminal escape", "p.yaml:3: name 'a\x1b[2J' is bad", "p.yaml:3: name 'a\\x1b[2J' is bad"),
    ("carriage return", "a\rb", "a\\rb"),
]


@pytest.mark.parametrize(("message", "expected"), [m[1:] for m in MESSAGES], ids=[m[0] for m in MESSAGES])
def test_a_commands_report_escapes_control_characters(message: str, expected: str) -> None:
    assert MessageFormatter().format(record("%s", message)) == expected


@dataclass(frozen=True)
class JsonCase:
    id: str
    record: logging.LogRecord
    fields: dict[str, Any]


JSON = [
    JsonCase("no fields", record(), {}),
    JsonCase("fields keep their types", record(node="gpu-a", desired=3, fresh=False, nodes=["a"]),
             {"node": "gpu-a", "desired": 3, "fresh": False, "nodes": ["a"]}),
    JsonCase("non-finite numbers become names", record(forecast=float("nan"), upper=float("inf")),
             {"forecast": "nan", "upper": "inf"}),
    JsonCase("unknown objects as text", record(where=Path("/cache")), {"where": "/cache"}),
]


@pytest.mark.parametrize("case", JSON, ids=[c.id for c in JSON])
def test_json_lines(case: JsonCase) -> None:
    line = JsonLineFormatter().format(case.record)
    assert "\n" not in line
    doc = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert list(doc)[:5] == ["time", "level", "logger", "message", "pid"]
    assert doc == {"time": "2023-11-14T22:13:20.250Z", "level": "WARNING", "logger": "extender.agent.loop",
                   "message": "node gpu-a is back", "pid": case.record.process, **case.fields}


def test_json_keeps_a_traceback_on_one_line() -> None:
    line = JsonLineFormatter().format(record(exc=True))
    assert "\n" not in line
    assert json.loads(line)["exc_info"].endswith("KeyError: 'boom'")


def test_setup_replaces_only_its_own_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    foreign = logging.NullHandler()
    root.addHandler(foreign)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        setup_logging("info", "json")
        setup_logging("warning", "text")
        ours = [h for h in root.handlers if getattr(h, "_extender_handler", False)]
        assert len(ours) == 1 and foreign in root.handlers
        logging.getLogger("extender.test").info("not shown at warning")
        logging.getLogger("extender.test").warning("shown", extra={"node": "n"})
        process.report("a problem for the user", file="p.yaml")
    finally:
        root.removeHandler(foreign)
        setup_logging()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(f"WARNING [{os.getpid()}] extender.test: shown node=n")
    assert lines[1] == "a problem for the user"  # what a command tells its user: the bare message


# ---- every command, for real ---------------------------------------------------------------------


def command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "extender.cli", *argv]


def env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "EXTENDER_DATA_DIR", "NODE_NAME")}
    return {**base, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr`` as a JSON object with the keys of every record (fails on any other line)."""
    docs = []
    for line in stderr.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\n--- stderr ---\n{stderr[-3000:]}")
        assert isinstance(doc, dict) and doc.keys() >= KEYS, line
        docs.append(doc)
    return docs


def run_briefly(argv: Sequence[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(*argv), cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300,
                          check=False)


@contextmanager
def running(argv: Sequence[str], tmp_path: Path, name: str) -> Iterator[Callable[[Callable[[dict[str, Any]], bool]],
                                                                             dict[str, Any]]]:
    """The command in the background, stderr to a file; yields ``wait(predicate)`` for a JSON record.

    On exit it sends SIGTERM, expects exit 0, and checks that *every* stderr line was a JSON record.
    """
    log = tmp_path / f"{name}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(command(*argv), cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL, stderr=err)

    def wait(predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            text = log.read_text()
            complete = text[: text.rfind("\n") + 1]
            match = next((doc for doc in json_lines(complete) if predicate(doc)), None)
            assert match is not None or proc.poll() is None, f"{name} exited with {proc.returncode}: {text[-3000:]}"
            return match

        record: dict[str, Any] = wait_until(found, timeout_s=SETTLE_S, interval_s=0.05, what=f"a {name} record",
                                            report=lambda: log.read_text()[-3000:])
        return record

    try:
        yield wait
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=SETTLE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    assert code == 0, log.read_text()[-3000:]
    assert json_lines(log.read_text())


def test_policy_check_problems_are_json_records(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: extender.io/v1alpha1\nkind: Policy\nnodeClasses:\n  - name: a\n"
                   "    nvme: {readBandwidth: 7GBps}\n")
    ok = run_briefly(["policy", "check", QWEN, "--log-format", "json"], tmp_path)
    assert ok.returncode == 0 and "ok:" in ok.stdout and ok.stderr == ""
    failed = run_briefly(["--log-format", "json", "policy", "check", str(bad)], tmp_path)
    assert failed.returncode == 1
    docs = json_lines(failed.stderr)
    bandwidth = next(d for d in docs if d["path"] == "nodeClasses[0].nvme.readBandwidth")
    assert (bandwidth["level"], bandwidth["logger"], bandwidth["file"], bandwidth["line"]) == \
        ("ERROR", "extender.cli", str(bad), 5)
    assert bandwidth["problem"].startswith("ambiguous bandwidth '7GBps'")
    assert bandwidth["message"] == f"{bad}:5: nodeClasses[0].nvme.readBandwidth: {bandwidth['problem']}"


def test_a_line_feed_in_a_file_name_starts_no_line_at_the_margin(tmp_path: Path) -> None:
    """``extender policy check $'a\\nb\\x1b[31m.yaml'``: the name's second line began at the margin."""
    checked = run_briefly(["policy", "check", "a\nb\x1b[31m.yaml"], tmp_path)
    assert checked.returncode == 1
    first, *rest = checked.stderr.splitlines()
    assert first == "a" and rest == ["  b\\x1b[31m.yaml: cannot read: No such file or directory"]


def test_estimate_and_its_errors(tmp_path: Path) -> None:
    ok = run_briefly(["estimate", "--policy", QWEN, "--json", "--log-format", "json"], tmp_path)
    assert ok.returncode == 0 and json.loads(ok.stdout) and ok.stderr == ""
    unknown = run_briefly(["estimate", "--policy", QWEN, "--workload", "nope", "--log-format", "json"], tmp_path)
    assert unknown.returncode == 1
    (doc,) = json_lines(unknown.stderr)
    assert doc["level"] == "ERROR" and "nope" in doc["message"] and doc["error"] == "UnknownNameError"


def test_simulate(tmp_path: Path) -> None:
    from tests.test_sim import write_tiny

    done = run_briefly(["simulate", str(write_tiny(tmp_path)), "--json", "--log-format", "json",
                        "--log-level", "debug"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "default" in json.loads(done.stdout)
    json_lines(done.stderr)
    broken = run_briefly(["simulate", str(tmp_path / "missing.yaml"), "--log-format", "json"], tmp_path)
    assert broken.returncode == 1
    assert json_lines(broken.stderr)[0]["file"] == str(tmp_path / "missing.yaml")


@pytest.mark.integration
def test_agent_once_and_loop(tmp_path: Path, redis_server: RedisServer) -> None:
    root = tmp_path / "cache"
    (root / "weights").mkdir(parents=True)
    once = run_briefly(["agent", "--node-name", "gpu-a", "--cache-root", str(root), "--once",
                        "--redis-url", redis_server.url, "--log-format", "json"], tmp_path)
    assert once.returncode == 0, once.stderr
    json_lines(once.stderr)
    missing = run_briefly(["agent", "--node-name", "gpu-a", "--cache-root", str(tmp_path / "nowhere"), "--once",
                           "--redis-url", redis_server.url, "--log-format", "json"], tmp_path)
    assert missing.returncode == 1
    (doc,) = json_lines(missing.stderr)
    assert "does not exist" in doc["message"] and doc["node"] == "gpu-a"
    with running(["agent", "--node-name", "gpu-a", "--cache-root", str(root), "--interval", "100ms",
                  "--redis-url", redis_server.url, "--log-format", "json"], tmp_path, "agent") as wait:
        started = wait(lambda d: d["logger"] == "extender.agent.loop" and "scanning" in d["message"])
        assert (started["node"], started["interval_s"], started["level"]) == ("gpu-a", 0.1, "INFO")


@pytest.mark.integration
def test_sync(tmp_path: Path, redis_server: RedisServer) -> None:
    with KubeDouble.running() as double:
        double.apply({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": "gpu-a", "labels": {"node.kubernetes.io/instance-type": "g5.12xlarge"}},
                      "status": {"allocatable": {"nvidia.com/gpu": "4"}}})
        kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
        with running(["sync", "--policy", FLEET, "--kubeconfig", str(kubeconfig), "--redis-url", redis_server.url,
                      "--log-format", "json"], tmp_path, "sync") as wait:
            listed = wait(lambda d: d.get("resource") == "nodes" and "listed" in d["message"])
            assert listed["objects"] == 1 and listed["logger"] == "extender.kube.reflector"


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.integration
def test_serve_with_gunicorn_logs_in_the_same_format(tmp_path: Path, redis_server: RedisServer) -> None:
    port = free_port()
    with running(["serve", "--policy", FLEET, "--bind", f"127.0.0.1:{port}", "--workers", "1",
                  "--redis-url", redis_server.url, "--access-log", "--log-format", "json"], tmp_path, "serve") as wait:
        booted = wait(lambda d: d["logger"] == "gunicorn.error" and "Booting worker" in d["message"])
        assert booted["level"] == "INFO"
        def healthy() -> bool:
            try:
                return get(f"http://127.0.0.1:{port}/healthz") == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(healthy, timeout_s=SETTLE_S, interval_s=0.05, what="serve to answer /healthz")
        access = wait(lambda d: d["logger"] == "gunicorn.access" and d.get("path") == "/healthz")
        assert (access["method"], access["status"], access["message"]) == ("GET", 200, "GET /healthz 200")
        # the duration is a field of the record, not a figure to judge: a number, whatever it measured
        assert isinstance(access["duration_s"], float) and access["bytes"] > 0 and access["remote"] == "127.0.0.1"


@pytest.mark.integration
def test_scale_decisions_carry_their_fields(tmp_path: Path, redis_server: RedisServer) -> None:
    with serving(("127.0.0.2",)) as (endpoint,), KubeDouble.running() as double:
        endpoint.counters = Counters(rate=8.0)
        double.apply(pod("qwen3-a", "127.0.0.2"))
        policy = tmp_path / "policy.yaml"
        policy.write_text(policy_text(port=endpoint.port))
        kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
        argv = ["scale", "--policy", str(policy), "--kubeconfig", str(kubeconfig), "--redis-url", redis_server.url,
                "--bind", f"127.0.0.1:{free_port()}", "--insecure-no-auth", "--tick", "200ms", "--lease-ttl", "2s",
                "--identity", "scaler-x", "--log-format", "json"]
        with running(argv, tmp_path, "scale") as wait:
            warning = wait(lambda d: "--insecure-no-auth" in d["message"])
            assert warning["level"] == "WARNING"
            leads = wait(lambda d: d.get("leader") == "scaler-x")
            assert leads["identity"] == "scaler-x" and leads["token"] >= 1
            decided = wait(lambda d: d.get("workload") == "qwen3" and "decision" in d)
            assert decided["decision"] in ("scale-up", "scale-down", "hold") and decided["desired"] >= 1
            assert decided["horizon_s"] > 0 and decided["logger"] == "extender.scaler.loop"
            wait(lambda d: d["logger"] == "gunicorn.error" and "Booting worker" in d["message"])


# ---- the fields docs/cli.md lists ----------------------------------------------------------------


def _documented_fields() -> dict[str, tuple[list[str], set[str]]]:
    """docs/cli.md's table of structured fields: process -> (its logger names, the fields it lists)."""
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("| process | logger | fields |"):]
    out: dict[str, tuple[list[str], set[str]]] = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        process_name, loggers, fields = (cell.strip() for cell in line.strip("|").split("|"))
        out[process_name] = (re.findall(r"`([\w.*]+)`", loggers), set(re.findall(r"`(\w+)`", fields)))
    return out


@cache
def _extra_keys() -> dict[str, set[str]]:
    """Module name -> the keys of every literal ``extra={...}`` its log calls pass."""
    import ast

    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "extender").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg == "extra" and isinstance(kw.value, ast.Dict):
                    out.setdefault(module, set()).update(
                        k.value for k in kw.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return out


def _row_of(module: str, rows: dict[str, tuple[list[str], set[str]]]) -> str | None:
    for name, (loggers, _) in rows.items():
        if any(module == lg or (lg.endswith(".*") and module.startswith(lg[:-1])) for lg in loggers):
            return name
    return None


#: Modules whose ``extra=`` is no log field of ours: the CLI's reports (their parts are described
#: under "What a short command reports") and the simulator's progress, which no operator filters.
NOT_LOG_FIELDS = ("extender.process", "extender.sim.")


@pytest.mark.parametrize("module", [m for m in _extra_keys() if not m.startswith(NOT_LOG_FIELDS)])
def test_every_structured_field_is_in_the_docs_table(module: str) -> None:
    """An on-call filters JSON logs by the fields docs/cli.md names: each one a module logs is listed
    in the row of the logger that writes it."""
    rows = _documented_fields()
    row = _row_of(module, rows)
    assert row is not None, f"docs/cli.md has no row for logger {module}"
    assert sorted(_extra_keys()[module] - rows[row][1]) == []
