"""The command line, run the way a person runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from extender.cli import main
from extender.core.estimate import PHASES, breakdown
from extender.core.policy import parse_policy
from extender.files import load_policy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(str(p) for p in (ROOT / "policies").glob("*.yaml"))
QWEN = str(ROOT / "policies" / "eks-p5-qwen3-moe.yaml")
FLEET = str(ROOT / "policies" / "g5-pcie-fleet.yaml")
SNAPSHOT = str(ROOT / "policies" / "h200-b200-snapshot.yaml")

BROKEN = """\
apiVersion: extender.io/v1alpha1
kind: Policy
nodeClasses:
  - name: a
    matchLabels: {x: y}
    gpu: {product: A10G, count: 1}
    nvme: {capacity: 1TB, readBandwidth: 7GBps}
profiles:
  - name: w
    match: {labels: {app: w}}
    image: {reference: img}
    weights: {source: s3://b/, version: v1, bytes: -3GB}
"""


def test_policy_check_passes_every_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", *EXAMPLES]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(EXAMPLES)
    assert all(": ok: " in line for line in out)


def test_policy_check_lists_every_error_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    assert main(["policy", "check", QWEN, str(bad)]) == 1
    captured = capsys.readouterr()
    assert f"{QWEN}: ok" in captured.out  # the good file is still reported
    errors = captured.err.splitlines()
    assert errors[0].startswith(f"{bad}:7: nodeClasses[0].nvme.readBandwidth: ambiguous bandwidth '7GBps'")
    assert errors[1].startswith(f"{bad}:12: profiles[0].weights.bytes: size cannot be negative")
    assert len(errors) == 2


def test_policy_show_prints_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "show", QWEN]) == 0
    shown = capsys.readouterr().out
    doc = yaml.safe_load(shown)
    assert doc["nodeClasses"][0]["network"]["nic"] == "400GB/s"  # 3200Gbps, shortest exact spelling
    assert doc["profiles"][0]["graphCapture"] == "17s"  # a default, filled in
    assert parse_policy(shown) == load_policy(QWEN)


def test_estimate_json_shape_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--policy", QWEN, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    policy = load_policy(QWEN)
    assert set(doc) == {p.name for p in policy.profiles}
    cell = doc["qwen3-moe"]["p5.48xlarge"]
    assert list(cell) == ["cold", "image", "image+weights", "warm"]
    assert {"image_s", "weights_s", "compile_s", "graph_s", "init_s", "total_s"} <= set(cell["cold"])
    expected = breakdown(policy.profile("qwen3-moe"), policy.node_class("p5.48xlarge"))
    for state, row in cell.items():
        for key in (*PHASES, "total_s"):
            assert row[key] == pytest.approx(expected[state][key], abs=1e-3)


def test_estimate_filters_by_workload_and_class(capsys: pytest.CaptureFixture[str]) -> None:
    fleet = str(ROOT / "policies" / "g5-pcie-fleet.yaml")
    assert main(["estimate", "--policy", fleet, "--workload", "mixtral-61g", "--node-class", "g5.12xlarge",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out).keys() == {"mixtral-61g"}


def test_estimate_table_has_a_row_per_state(capsys: pytest.CaptureFixture[str]) -> None:
    snap = str(ROOT / "policies" / "h200-b200-snapshot.yaml")
    assert main(["estimate", "--policy", snap, "--node-class", "h200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "dynamo-worker on h200  (seconds to ready)"
    assert [line.split()[0] for line in lines[2:7]] == ["cold", "image", "image+weights", "warm", "snapshot"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["estimate", "--policy", QWEN, "--workload", "nope"], "no workload profile 'nope'"),
        (["estimate", "--policy", QWEN, "--node-class", "nope"], "no node class 'nope'"),
        (["cachekey", "--policy", QWEN, "--workload", "qwen3-moe-default-loader", "--node-class", "p5.48xlarge"],
         "has no compile.key"),
        (["estimate", "--policy", "/nonexistent.yaml"], "cannot read"),
        # it said "no (workload, node class) pairs to show: the policy has no profiles", exit 0
        (["estimate", "--policy", FLEET, "--workload", "mixtral-61g", "--node-class", "g5.xlarge"],
         "extender: workload 'mixtral-61g' does not run on node class 'g5.xlarge' (it runs on g5.12xlarge, "
         "g5.48xlarge)"),
        (["estimate", "--policy", FLEET, "--workload", "mixtral-61g", "--node-class", "g5.xlarge", "--json"],
         "does not run on node class 'g5.xlarge'"),
    ],
    ids=["unknown-workload", "unknown-class", "no-compile-key", "missing-file", "a-class-the-workload-skips",
         "a-class-the-workload-skips-json"],
)
def test_clear_errors_exit_1(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 1
    assert words in capsys.readouterr().err


def test_cachekey_depends_on_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    snap = str(ROOT / "policies" / "h200-b200-snapshot.yaml")
    keys = []
    for cls in ("h200", "b200"):
        assert main(["cachekey", "--policy", snap, "--workload", "dynamo-worker", "--node-class", cls]) == 0
        keys.append(capsys.readouterr().out.strip())
    assert all(k.startswith("ck1-") for k in keys)
    assert keys[0] != keys[1]


@pytest.mark.parametrize("flags", [
    pytest.param([], id="text"),
    pytest.param(["--log-format", "json"], id="json"),
    pytest.param(["--log-format", "json", "--log-level", "error"], id="json-quietest-level"),
    pytest.param(["--log-level", "error"], id="text-quietest-level"),
])
def test_cachekey_verbose_prints_the_document_hashed(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """README: -v prints the canonical document hashed, in either log format, whatever the log level
    (in json it was an INFO record, dropped at cachekey's default level, warning)."""
    argv = ["cachekey", "--policy", SNAPSHOT, "--workload", "dynamo-worker", "--node-class", "h200", "-v", *flags]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    if "json" in flags:
        record = json.loads(err)  # one record, one line
        document, key = record["inputs"], record["key"]
    else:
        document, key = json.loads(err), out.strip()
    assert key == out.strip()
    assert document["gpuProduct"] == "NVIDIA-H200" and document["modelId"] == "example/worker-model"


def test_console_script_runs() -> None:
    # the installed entry point, as a user types it
    exe = Path(sys.executable).parent / "extender"
    proc = subprocess.run([str(exe), "policy", "check", QWEN], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_ctrl_c_is_one_line_and_exit_130() -> None:
    """Ctrl-C during a command that does not stop on signals itself (here a simulation): the shell's
    code for SIGINT and one line, not a KeyboardInterrupt traceback from wherever the run was."""
    # the console script's main, with Python's SIGINT handler even when the test runner ignores SIGINT
    # (a background job does, and Python then leaves it ignored)
    start = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "from extender.cli import main; sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-c", start, "simulate", str(ROOT / "scenarios" / "nab-production.yaml")]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # the demand it loaded is logged before the simulation starts
        assert first.startswith("demand "), first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)  # a bound on a hung process, never asserted on
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.splitlines()[-1] == "extender: interrupted"
    assert out == ""  # no table of a run that did not finish
