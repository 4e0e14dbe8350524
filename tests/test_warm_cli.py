"""``extender warm plan | status | prepare | finish`` through their argument parser, as the console script runs them.

``plan`` and ``status`` read a real Redis and the API double; the dry run must leave both as they were.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from extender.agent.scan import scan_cache
from extender.arguments import Parser
from extender.core.errors import DocumentError, ExtenderError
from extender.core.warming import Expectation
from extender.kube.client import KubeClient
from extender.state import InventoryStore, connect
from extender.warm import commands as warm_commands
from extender.warm.loop import WarmLoop
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.test_agent_scan import sparse
from tests.test_warm import GB, POLICY, node
from tests.test_warm_executor import finish, jobs

WEIGHTS_A = "weights:llm/v1"


def run(argv: Sequence[str]) -> int:
    """What ``extender.cli.main`` does with a ``warm`` command."""
    parser = Parser(prog="extender")
    warm_commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    try:
        code: int = args.handler(args)
    except DocumentError as exc:
        raise AssertionError(exc.problems) from exc
    except ExtenderError:
        return 1
    return code


@pytest.mark.parametrize(("text", "expected"), [
    ("llm=2", Expectation(workload="llm", replicas=2, within_s=600)),
    ("llm=1@5m", Expectation(workload="llm", replicas=1, within_s=300)),
    ("a.b=0@90s", Expectation(workload="a.b", replicas=0, within_s=90)),
])
def test_expectations_on_the_command_line(text: str, expected: Expectation) -> None:
    assert warm_commands.parse_expectation(text) == expected


#: Refused ``--expect`` values and what the one-line refusal says (pydantic's multi-line dump, or an
#: OverflowError deep in the planner for a count past int64, were what came out before).
BAD_EXPECTATIONS = [
    pytest.param("llm", "expected WORKLOAD=N[@WITHIN]", id="no count"),
    pytest.param("=2", "expected WORKLOAD=N[@WITHIN]", id="no workload"),
    pytest.param("llm=two", "'two' is not a whole number of replicas", id="a count that is no number"),
    pytest.param("llm=-1", "replicas must be between 0 and 2147483647", id="a negative count"),
    pytest.param("llm=99999999999999999999", "replicas must be between 0 and 2147483647", id="past any int"),
    pytest.param("llm=2147483648", "replicas must be between 0 and 2147483647", id="one past int32"),
    pytest.param("llm=1@soon", "not a duration: 'soon'", id="a horizon that is no duration"),
    pytest.param("llm=1@-5s", "duration cannot be negative", id="a negative horizon"),
]


@pytest.mark.parametrize(("text", "words"), BAD_EXPECTATIONS)
def test_bad_expectations_are_usage_errors(text: str, words: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        warm_commands.parse_expectation(text)
    message = str(refused.value)
    assert words in message and "\n" not in message


@pytest.mark.integration
def test_the_largest_expectation_plans(redis_server: RedisServer, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    assert run(["warm", "plan", "--policy", str(policy), "--redis-url", redis_server.url,
                "--expect", "llm=2147483647"]) == 0
    assert "llm: 2147483647 replica(s)" in capsys.readouterr().out


@pytest.mark.integration
def test_plan_gives_no_advice_on_a_flag_it_does_not_take(redis_server: RedisServer, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The policy names no warming.helperImage: the scaler warns that its Jobs would run a placeholder
    (pass --warm-helper-image); a dry run starts no Job, and has no such flag."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    assert "helperImage" not in POLICY
    assert run(["warm", "plan", "--policy", str(policy), "--redis-url", redis_server.url,
                "--expect", "llm=1"]) == 0
    told = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in told if "--warm-helper-image" in m or "placeholder" in m], told


#: ``warm prepare --abandoned-after`` (or ``$WARM_ABANDONED_AFTER``, as the warm Job sets it): a duration
#: typed as in a policy, and the bare seconds of a Job of any release (``{:g}``: ``1e+06`` for a long one).
ABANDONED_AFTER = [
    pytest.param(["--abandoned-after", "1h"], None, 3600.0, id="a duration"),
    pytest.param(["--abandoned-after", "1h30m"], None, 5400.0, id="a compound duration"),
    pytest.param([], "1h", 3600.0, id="a duration from the environment"),
    pytest.param([], "5400", 5400.0, id="bare seconds as the Job sets them"),
    pytest.param([], "1e+06", 1e6, id="a long bound as the Job formats it"),
    pytest.param(["--abandoned-after", "90"], "1h", 90.0, id="the flag over the environment"),
    pytest.param([], None, None, id="neither: keep them"),
    pytest.param(["--abandoned-after", "0"], None, 2, id="zero"),
    pytest.param(["--abandoned-after", "nan"], None, 2, id="not a number"),
    pytest.param(["--abandoned-after", "-1h"], None, 2, id="negative"),
    pytest.param(["--abandoned-after", "5M"], None, 2, id="minutes or months"),
]


@pytest.mark.parametrize(("flag", "env", "expected"), ABANDONED_AFTER)
def test_abandoned_after_takes_a_duration(flag: list[str], env: str | None, expected: float | int | None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``expected``: seconds, ``None`` (unset), or an ``int`` exit code (a usage error)."""
    from extender.cli import build_parser

    if env is None:
        monkeypatch.delenv("WARM_ABANDONED_AFTER", raising=False)
    else:
        monkeypatch.setenv("WARM_ABANDONED_AFTER", env)
    argv = ["warm", "prepare", "--root", "/cache", "--cache", "weights:llm/v1", *flag]
    if isinstance(expected, int):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(argv)
        assert exit_.value.code == expected
    else:
        assert build_parser().parse_args(argv).abandoned_after == expected


@pytest.mark.integration
def test_plan_prints_what_a_tick_would_do_and_does_nothing(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    now = time.time()
    client = connect(redis_server.url, tmp_path)
    try:
        store = InventoryStore(client)
        store.put_many([node("gpu-a", now=now, images=["example.com/llm:1"]), node("gpu-b", now=now)])
        version = store.version()
        with KubeDouble.running() as double:
            kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
            base = ["warm", "plan", "--policy", str(policy), "--redis-url", redis_server.url, "--now", str(now),
                    "--expect", "llm=1@10m"]
            assert run(base) == 0
            text = capsys.readouterr().out
            assert run([*base, "--json", "--kubeconfig", str(kubeconfig)]) == 0
            doc = json.loads(capsys.readouterr().out)
            assert {r.verb for r in double.requests} == {"list"}  # read the Jobs, nothing else
        assert store.version() == version  # nothing written
    finally:
        client.close()
    assert "warming enabled; dry run: nothing is started" in text
    # gpu-a has the image: 140 s; staging its weights: 135 s (hand arithmetic in tests/test_warm_executor.py)
    assert "llm: 1 replica(s) within 10m: mean startup 140.0s -> 135.0s on gpu-a" in text
    assert "gpu-a  llm       weights  demand   100GB" in text
    (action,) = doc["plan"]["actions"]
    assert (action["node"], action["cache"], action["saved_s"]) == ("gpu-a", WEIGHTS_A, 5.0)
    assert doc["would_start"] == ["warm-weights-gpu-a-1fe3c4b98384"] and doc["in_flight"] == []


@pytest.mark.integration
def test_status_lists_the_jobs_and_where_each_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_warm import BASE, NOW
    from tests.test_warm_executor import ONE_LLM, snap, two_nodes

    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    with KubeDouble.running() as double:
        kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
        kube = KubeClient.connect(str(kubeconfig))
        try:
            loop = WarmLoop(BASE, None, kube)
            loop.tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW)))
            (name,) = jobs(double)
            finish(double, name, ok=False, at=time.time())
        finally:
            kube.close()
        assert run(["warm", "status", "--policy", str(policy_file), "--kubeconfig", str(kubeconfig)]) == 0
        table = capsys.readouterr().out
        assert run(["warm", "status", "--kubeconfig", str(kubeconfig), "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert run(["warm", "status", "--namespace", "elsewhere", "--kubeconfig", str(kubeconfig)]) == 0
        empty = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["JOB", "NODE", "WORKLOAD", "KIND", "STATE", "ATTEMPT", "DETAIL"]
    assert f"{name}  gpu-a  llm       weights  failed  1        BackoffLimitExceeded; retry in" in table
    assert (row["job"], row["state"], row["cache"], row["attempt"]) == (name, "failed", WEIGHTS_A, 1)
    assert empty == "no warm jobs in namespace elsewhere\n"


def test_prepare_and_finish_as_a_warm_job_runs_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path)
    assert run(["warm", "prepare", "--root", root, "--cache", WEIGHTS_A, "--evict", "weights:old/v0"]) == 0
    staging = Path(capsys.readouterr().out.strip())
    sparse(staging / "model.safetensors", GB)
    assert run(["warm", "finish", "--root", root, "--cache", WEIGHTS_A, "--source", "s3://m/"]) == 0
    (entry,) = scan_cache(tmp_path).weights
    assert (entry.key, entry.bytes, entry.complete) == ("llm/v1", GB, True)
    # a fetch that wrote nothing fails the Job (exit 1), and nothing appears in the cache
    assert run(["warm", "prepare", "--root", root, "--cache", "snapshot:llm/v1"]) == 0
    assert run(["warm", "finish", "--root", root, "--cache", "snapshot:llm/v1"]) == 1
    assert "left no files" in capsys.readouterr().err
    assert scan_cache(tmp_path).snapshots == ()


@pytest.mark.parametrize(("env", "code", "said"), [
    pytest.param("", 0, None, id="empty-means-unset"),
    pytest.param("bogus", 2, "extender warm prepare: $WARM_ABANDONED_AFTER (used as --abandoned-after is not given): "
                 "not a duration: 'bogus'", id="a-bad-value-names-the-variable"),
])
def test_the_abandoned_after_variable_is_read_as_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str], *, env: str,
                                                          code: int, said: str | None) -> None:
    """It was argparse's string default: an empty one was refused, a bad one blamed the flag."""
    monkeypatch.setenv("WARM_ABANDONED_AFTER", env)
    assert run(["warm", "prepare", "--root", str(tmp_path), "--cache", WEIGHTS_A]) == code
    err = capsys.readouterr().err
    assert (said is None and err == "") or (said is not None and err.startswith(said)), err


def _no_space_for_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    """``mkdir`` of the staging directory fails as on a full disk (root cannot be stopped by chmod)."""
    real = os.mkdir

    def mkdir(path: str, *args: Any, **kwargs: Any) -> None:
        if path == ".v1.warming":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)


def _linked_fetch(root: Path) -> None:
    assert run(["warm", "prepare", "--root", str(root), "--cache", WEIGHTS_A]) == 0
    sparse(root / "weights/llm/.v1.warming/a.bin", 10)
    (root / "weights/llm/.v1.warming/shadow").symlink_to("/etc/shadow")


@pytest.mark.parametrize(("setup", "argv", "said"), [
    pytest.param(lambda root, _: None, ["prepare", "--cache", WEIGHTS_A, "--root", "{root}/typo"],
                 "extender warm prepare: the cache root {root}/typo does not exist", id="a-missing-root"),
    pytest.param(lambda _, monkeypatch: _no_space_for_staging(monkeypatch),
                 ["prepare", "--cache", WEIGHTS_A, "--root", "{root}"],
                 f"extender warm prepare: {WEIGHTS_A} under {{root}}: No space left on device (.v1.warming)",
                 id="an-os-error-names-the-entry-and-the-file"),
    pytest.param(lambda root, _: None, ["prepare", "--cache", WEIGHTS_A, "--root", "{root}",
                                        "--evict", "weights:llm/" + "é" * 128],
                 "extender warm prepare: version 'éééé", id="a-name-too-long-in-bytes-names-the-limit"),
    pytest.param(lambda root, _: _linked_fetch(root), ["finish", "--cache", WEIGHTS_A, "--root", "{root}"],
                 "extender warm finish: {root}/weights/llm/.v1.warming/shadow is a symbolic link: ",
                 id="a-fetched-link-is-named"),
])
def test_a_failed_node_step_says_what_and_where_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch, *,
                                                            setup: Callable[[Path, pytest.MonkeyPatch], object],
                                                            argv: list[str], said: str) -> None:
    setup(tmp_path, monkeypatch)
    capsys.readouterr()
    assert run(["warm", *(a.format(root=tmp_path) for a in argv)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(said.format(root=tmp_path)), line
    if "--evict" in argv:
        assert line.endswith("(+64 more characters) takes 256 bytes: a directory name takes at most 255"), line


@pytest.mark.integration
def test_publish_records_a_key_for_a_sidecar(redis_server: RedisServer, tmp_path: Path) -> None:
    client = connect(redis_server.url, tmp_path)
    try:
        store = InventoryStore(client)
        before = store.version()
        assert run(["warm", "publish", "--key", KEY, "--redis-url", redis_server.url]) == 0
        _, _, registry = store.load_all()
        assert registry == {KEY} and store.version() == before + 1  # readers notice through the version
    finally:
        client.close()


KEY = "ck1-d11f4f5a1d55e5b4043c336ee5514b08"


@pytest.mark.parametrize("key", [
    pytest.param("", id="empty: the sidecar's $KEY unset"),
    pytest.param("ck1-abc", id="cut short"),
    pytest.param("CK1-D11F4F5A1D55E5B4043C336EE5514B08", id="upper case"),
    pytest.param(f"{KEY}\n", id="a trailing newline"),
    pytest.param(f"/cache/compile/{KEY}", id="a path, not a key"),
])
def test_publish_refuses_what_is_not_a_key(key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        run(["warm", "publish", "--key", key, "--data-dir", str(tmp_path / "redis")])
    assert exit_.value.code == 2
    assert f"argument --key: {key!r} is not a compile-cache key" in capsys.readouterr().err
    assert not (tmp_path / "redis").exists()  # refused before touching the store


def test_the_key_pattern_takes_every_key_the_code_makes() -> None:
    from extender.core.cachekey import KEY_PATTERN, compile_cache_key_of

    assert KEY_PATTERN.fullmatch(compile_cache_key_of({"engine": "vllm"}))
    assert KEY_PATTERN.fullmatch(KEY)
