"""Conventions every command follows (docs/cli.md): help on every argument, one name per flag across
commands, the policy's units for durations and sizes, deprecated names that still work and warn,
``--prefix`` honoured wherever the store is used, and a clear exit for ``agent --once`` without a
cache root. Table-driven; the store tests use a real Redis."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
import redis

from extender import cli
from extender.arguments import (
    DEFAULT_PREFIX,
    Parser,
    _Renamed,
    deprecated_flags,
    duration,
    duration_or_zero,
    flag_problem,
    size,
    subparsers_of,
)
from tests.conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent
FLEET = str(ROOT / "policies" / "g5-pcie-fleet.yaml")


def commands(parser: argparse.ArgumentParser, name: str = "extender") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command path, parser)`` of the top level and of every subcommand."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from commands(sub, f"{name} {sub_name}")


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


PARSER = cli.build_parser()
COMMANDS = dict(commands(PARSER))
#: Commands that run something (a handler), as opposed to groups such as ``extender policy``.
LEAVES = {n: p for n, p in COMMANDS.items() if p.get_default("handler") is not None}


def test_the_walk_sees_every_command() -> None:
    assert len(list(subparsers_of(PARSER))) == len(COMMANDS) - 1
    assert {"extender serve", "extender agent", "extender sync", "extender scale", "extender scale explain",
            "extender simulate", "extender policy check", "extender estimate", "extender warm plan"} <= LEAVES.keys()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_reads_a_dash_and_digit_as_a_value(name: str) -> None:
    # a subcommand built by another class would read '--interval -5s' as a missing value again
    assert isinstance(COMMANDS[name], Parser)
    assert COMMANDS[name]._negative_number_matcher.match("-5s")
    assert not COMMANDS[name]._has_negative_number_optionals  # no option of ours looks like a value


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_argument_and_command_has_help(name: str) -> None:
    parser = COMMANDS[name]
    missing = [a.option_strings or a.dest for a in parser._actions
               if not isinstance(a, argparse._SubParsersAction) and (not a.help or a.help == argparse.SUPPRESS)]
    assert not missing, f"{name}: arguments without help: {missing}"
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            assert all(helps.get(n) for n in action.choices), f"{name}: a subcommand without help: {helps}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_command_takes_an_abbreviated_option(name: str) -> None:
    assert COMMANDS[name].allow_abbrev is False, f"{name}: long options may be abbreviated"


def test_an_abbreviated_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["estimate", "--policy", "policy.yaml", "--work", "llama"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --work llama" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_every_command_takes_the_logging_options(name: str) -> None:
    assert {"--log-level", "--log-format"} <= options(LEAVES[name])


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_flag_families_come_whole(name: str) -> None:
    have = options(LEAVES[name])
    if "--redis-url" in have:
        assert {"--data-dir", "--prefix"} <= have, f"{name}: the store options come together"
    if "--kubeconfig" in have:
        assert "--context" in have, f"{name}: --kubeconfig without --context"
    if "--tls-cert" in have:
        assert {"--tls-key", "--tls-client-ca"} <= have, f"{name}: the --tls-* family comes whole"


#: kube-apiserver's names, which the scaler took first: accepted, and only as deprecated aliases.
APISERVER_NAMES = {
    "--client-ca-file": "--tls-client-ca",
    "--requestheader-client-ca-file": "--tls-front-proxy-ca",
    "--requestheader-allowed-names": "--front-proxy-allowed-names",
    "--requestheader-username-headers": "--front-proxy-user-headers",
    "--requestheader-group-headers": "--front-proxy-group-headers",
    "--requestheader-extra-headers-prefix": "--front-proxy-extra-headers-prefix",
    "--authentication-skip-lookup": "--no-auth-configmap",
}


def test_apiserver_flag_names_are_only_deprecated_aliases() -> None:
    for name, parser in COMMANDS.items():
        for action in parser._actions:
            used = set(action.option_strings) & APISERVER_NAMES.keys()
            if used:
                assert action.option_strings[0] == APISERVER_NAMES[next(iter(used))], name
                assert "deprecated" in (action.help or ""), name


@pytest.mark.parametrize(("old", "new"), sorted(APISERVER_NAMES.items()))
def test_a_deprecated_name_sets_the_new_option_and_is_noted(old: str, new: str) -> None:
    flag = old == "--authentication-skip-lookup"
    args = PARSER.parse_args(["scale", "--policy", "p.yaml", old, *([] if flag else ["value"])])
    assert getattr(args, new.lstrip("-").replace("-", "_")) == (True if flag else "value")
    assert deprecated_flags(args) == [(old, new)]
    fresh = PARSER.parse_args(["scale", "--policy", "p.yaml", new, *([] if flag else ["value"])])
    assert getattr(fresh, new.lstrip("-").replace("-", "_")) == (True if flag else "value")
    assert deprecated_flags(fresh) == []


def _documented_renames() -> set[tuple[str, str]]:
    """``(old, new)`` of each row of docs/cli.md's table of deprecated flags."""
    rows = re.findall(r"^\s*\| `(--[a-z-]+)`[^|]*\| `(--[a-z-]+)` \|$", (ROOT / "docs" / "cli.md").read_text(), re.M)
    return set(rows)


def test_docs_list_every_deprecated_flag_name() -> None:
    """Every deprecated alias of every command (keda-scaler's --client-ca was missing) is in docs/cli.md."""
    renamed = [a for p in COMMANDS.values() for a in p._actions if isinstance(a, _Renamed)]
    renames = {(old, next(o for o in a.option_strings if o not in a.deprecated))
               for a in renamed for old in a.deprecated}
    assert ("--client-ca", "--tls-client-ca") in renames  # the walk sees keda-scaler's
    assert renames <= _documented_renames()


def test_the_deprecation_warning_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["scale", "--policy", "p.yaml", "--client-ca-file", "ca.pem", "--tls-cert", "c.pem"])
    assert code == 2  # --tls-cert without --tls-key: a usage error after the warning
    err = capsys.readouterr().err
    assert "extender: --client-ca-file is deprecated; use --tls-client-ca" in err
    assert "--tls-cert and --tls-key go together" in err


# ---- the policy's units --------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    id: str
    text: str
    expected: float | None  # None: rejected


DURATIONS = [
    Unit("seconds", "15s", 15.0),
    Unit("minutes", "2m", 120.0),
    Unit("compound", "1h30m", 5400.0),
    Unit("milliseconds", "250ms", 0.25),
    Unit("a plain number is seconds", "15", 15.0),
    Unit("a plain fraction", "0.5", 0.5),
    Unit("zero", "0s", None),
    Unit("negative", "-1s", None),
    Unit("minutes or months", "5M", None),
    Unit("not a duration", "soon", None),
]


#: ``--history``: a duration, or 0 to turn it off (``duration``'s rows hold for the rest).
DURATIONS_OR_ZERO = [
    Unit("zero turns it off", "0", 0.0),
    Unit("zero seconds", "0s", 0.0),
    Unit("zero minutes", "0m", 0.0),
    Unit("zero as a fraction", "0.0", 0.0),
    Unit("zero milliseconds", "0ms", 0.0),
    Unit("a day", "1d", 86_400.0),
    Unit("a plain number is seconds", "90", 90.0),
    Unit("negative", "-1h", None),
    Unit("not a duration", "a fortnight", None),
]


@pytest.mark.parametrize(("parse", "case"), [(duration, c) for c in DURATIONS]
                         + [(duration_or_zero, c) for c in DURATIONS_OR_ZERO],
                         ids=[f"duration: {c.id}" for c in DURATIONS]
                         + [f"duration_or_zero: {c.id}" for c in DURATIONS_OR_ZERO])
def test_duration_arguments(parse: Callable[[str], float], case: Unit) -> None:
    if case.expected is None:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(case.text)
    else:
        assert parse(case.text) == case.expected


SIZES = [
    Unit("binary", "64MiB", 64 * 2**20),
    Unit("kubernetes spelling", "64Mi", 64 * 2**20),
    Unit("decimal", "3.9GB", 3_900_000_000),
    Unit("a plain number is bytes", "4096", 4096),
    Unit("zero", "0", None),
    Unit("ambiguous", "64M", None),
    Unit("bits are no size", "64Mb", None),
    Unit("half a byte", "0.5B", None),
]


@pytest.mark.parametrize("case", SIZES, ids=[c.id for c in SIZES])
def test_size_arguments(case: Unit) -> None:
    if case.expected is None:
        with pytest.raises(argparse.ArgumentTypeError):
            size(case.text)
    else:
        assert size(case.text) == case.expected


@dataclass(frozen=True)
class Flag:
    id: str
    argv: list[str]
    dest: str
    expected: float


UNIT_FLAGS = [
    Flag("serve snapshot age", ["serve", "--policy", "p", "--max-snapshot-age", "1m"], "max_snapshot_age", 60.0),
    Flag("serve request budget", ["serve", "--policy", "p", "--request-budget", "300ms"], "request_budget", 0.3),
    Flag("serve poll interval", ["serve", "--policy", "p", "--poll-interval", "100ms"], "poll_interval", 0.1),
    Flag("serve rebuild interval", ["serve", "--policy", "p", "--min-rebuild-interval", "2s"],
         "min_rebuild_interval", 2.0),
    Flag("serve body limit", ["serve", "--policy", "p", "--max-body", "1MiB"], "max_body", 2**20),
    Flag("agent interval", ["agent", "--cache-root", "/c", "--interval", "30s"], "interval", 30.0),
    Flag("agent ttl", ["agent", "--cache-root", "/c", "--ttl", "2m"], "ttl", 120.0),
    Flag("scale tick", ["scale", "--tick", "15s"], "tick", 15.0),
    Flag("scale lease", ["scale", "--lease-ttl", "45s"], "lease_ttl", 45.0),
    Flag("scale history", ["scale", "--history-max-age", "3d"], "history_max_age", 259_200.0),
    Flag("bare seconds still work", ["scale", "--tick", "15"], "tick", 15.0),
    Flag("warm prepare abandoned after", ["warm", "prepare", "--root", "/c", "--cache", "weights:w/v",
                                          "--abandoned-after", "1h"], "abandoned_after", 3600.0),
]


@pytest.mark.parametrize("case", UNIT_FLAGS, ids=[c.id for c in UNIT_FLAGS])
def test_flags_take_the_policys_units(case: Flag) -> None:
    assert getattr(PARSER.parse_args(case.argv), case.dest) == case.expected


class BadFlag(NamedTuple):
    id: str
    argv: list[str]
    words: str


#: Malformed flags: each a usage error (exit 2) naming the flag, before anything runs (docs/cli.md).
BAD_FLAGS = [
    BadFlag("a Redis URL of another scheme", ["inventory", "show", "--redis-url", "notaurl://x"],
            "--redis-url: not a Redis URL (scheme 'notaurl')"),
    BadFlag("a Redis URL without a scheme", ["estimate", "--policy", "p", "--redis-url", "localhost:6379"],
            "--redis-url: not a Redis URL"),
    BadFlag("infinite history", ["simulate", "s.yaml", "--history", "99999999999999999999d"], "--history"),
    # the scenario's history is at most 366 days; the flag set it unchecked (3000d ran for minutes at 1.7 GB,
    # 1000000d ended in numpy's MemoryError)
    BadFlag("a history past the scenario's bound", ["simulate", "s.yaml", "--history", "3000d"],
            "--history: '3000d' must be at most 366d"),
    BadFlag("a Redis URL after the subcommand", ["scale", "explain", "--redis-url", "http://x"],
            "--redis-url: not a Redis URL"),
    BadFlag("an unknown strategy", ["simulate", "s.yaml", "--strategies", "default,foo"],
            "--strategies: no strategy 'foo' (known: default, cache-aware"),
    BadFlag("no strategy at all", ["simulate", "s.yaml", "--strategies", " , "], "--strategies: empty (known:"),
    BadFlag("an empty report directory", ["simulate", "s.yaml", "--out", ""], "--out: empty"),  # wrote nothing, exit 0
    # it once explained every node of the inventory, saying the inventory was empty
    BadFlag("no node to explain", ["explain", "--policy", "p", "--pod", "pod.yaml", "--nodes", ","],
            "--nodes: ',' names no node"),
    # argparse read '-5s' as an option and said the value was missing ("expected one argument")
    BadFlag("a negative duration with a unit", ["agent", "--cache-root", "/c", "--interval", "-5s"],
            "--interval: duration cannot be negative: '-5s'"),
    BadFlag("a negative fraction with a unit", ["agent", "--cache-root", "/c", "--ttl", "-.5m"],
            "--ttl: duration cannot be negative: '-.5m'"),
    # a negative limit sliced the list from its end: --limit -5 listed every observation but five
    BadFlag("a negative limit", ["calibrate", "show", "--policy", "p", "--limit", "-5"], "--limit: '-5' must be >= 0"),
    # NaN and infinity reached the plan's model: exit 1 with pydantic's validation dump
    BadFlag("a time that is not a number", ["warm", "plan", "--policy", "p", "--now", "nan"],
            "--now: 'nan' must be a finite number >= 0"),
    BadFlag("an infinite time", ["warm", "plan", "--policy", "p", "--now", "inf"],
            "--now: 'inf' must be a finite number"),
    # pydantic's multi-line dump (a negative count), an OverflowError in the planner (past int64)
    BadFlag("a negative expectation", ["warm", "plan", "--policy", "p", "--expect", "llm=-2"],
            "--expect: 'llm=-2': replicas must be between 0 and 2147483647"),
    BadFlag("an expectation past any replica count",
            ["warm", "plan", "--policy", "p", "--expect", "llm=99999999999999999999"],
            "replicas must be between 0 and 2147483647"),
    # exit 1 once the scenario was read, as if the input were wrong rather than the flag
    BadFlag("an unknown --trace field", ["simulate", "s.yaml", "--trace", "r.csv,bogus=1"],
            "--trace: r.csv,bogus=1: 'bogus=1' is not FIELD=VALUE with FIELD one of format, timeColumn"),
    BadFlag("a --trace item without a value", ["simulate", "s.yaml", "--trace", "api=r.csv,loadScale"],
            "'loadScale' is not FIELD=VALUE"),
    # a field value or a file name --trace cannot take: exit 1 once the scenario was read, in pydantic's words
    BadFlag("a --trace field value its field refuses", ["simulate", "s.yaml", "--trace", "r.csv,loadScale=0"],
            "--trace: r.csv,loadScale=0: loadScale: must be > 0"),
    BadFlag("a --trace timeScale past the bound", ["simulate", "s.yaml", "--trace", "api=r.csv,timeScale=1e12"],
            "timeScale: must be <= 1000000000"),
    # NaN from a flag's text failed the upper bound: "Input should be less than or equal to 1000000000"
    BadFlag("a NaN --trace loadScale", ["simulate", "s.yaml", "--trace", "r.csv,loadScale=nan"],
            "loadScale: expected a finite number, got 'nan'"),
    BadFlag("an empty --trace", ["simulate", "s.yaml", "--trace", ""], "--trace: '' names no file"),
    BadFlag("a --trace workload without a file", ["simulate", "s.yaml", "--trace", "api="],
            "--trace: 'api=' names no file"),
    BadFlag("an infinite load scale", ["simulate", "s.yaml", "--load-scale", "inf"],
            "--load-scale: 'inf' must be a finite number > 0"),
    BadFlag("a time scale of zero", ["simulate", "s.yaml", "--time-scale", "0"],
            "--time-scale: '0' must be a finite number > 0"),
    # past the trace field's bounds: exit 1 once the scenario was read, blaming "--trace r.csv: loadScale"
    BadFlag("a load scale past the field's bound", ["simulate", "s.yaml", "--trace", "r.csv", "--load-scale", "1e308"],
            "--load-scale: loadScale: 1e+308 is out of range"),
    # a blank file name ("$CA" unset) read as the flag left out: serve without client certificates, or no TLS
    BadFlag("a blank client CA", ["serve", "--policy", "p", "--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", ""],
            "--tls-client-ca: '' names no file"),
    BadFlag("a blank certificate", ["keda-scaler", "--policy", "p", "--tls-cert", " ", "--tls-key", "k"],
            "--tls-cert: ' ' names no file"),
    BadFlag("a blank front-proxy CA", ["scale", "--tls-front-proxy-ca", ""],
            "--requestheader-client-ca-file: '' names no file"),
    # Path("") is ".": the agent scanned, and the warm step wrote into, the current directory
    BadFlag("a blank cache root", ["agent", "--cache-root", ""], "--cache-root: '' names no directory"),
    BadFlag("a blank warm root", ["warm", "prepare", "--root", "", "--cache", "weights:w/v"],
            "--root: '' names no directory"),
    BadFlag("a blank CRI socket", ["agent", "--cache-root", "/c", "--cri-socket", " "],
            "--cri-socket: ' ' names no socket"),
    BadFlag("a CRI endpoint that names no socket", ["agent", "--cache-root", "/c", "--cri-socket", "unix://"],
            "--cri-socket: 'unix://' names no socket"),
    # a runtime listens on a unix socket; a TCP endpoint would have been read as a relative path
    BadFlag("a CRI endpoint over TCP", ["agent", "--cache-root", "/c", "--cri-socket", "tcp://10.0.0.1:1234"],
            "--cri-socket: 'tcp://10.0.0.1:1234' is not a unix socket (give its path, or unix://PATH)"),
    # any count was taken: 10,000 workers each forked with its own inventory copy and Redis poller
    BadFlag("serve workers past the bound", ["serve", "--policy", "p", "--workers", "65"],
            "--workers: '65' must be at most 64"),
    BadFlag("serve threads past the bound", ["serve", "--policy", "p", "--threads", "257"],
            "--threads: '257' must be at most 256"),
    BadFlag("scale threads past the bound", ["scale", "--threads", "100000"],
            "--threads: '100000' must be at most 256"),
    # Python's int() and float() read these as numbers: 1_000 workers, ١٢٣ seconds
    BadFlag("a count with an underscore", ["serve", "--policy", "p", "--workers", "1_0"],
            "--workers: '1_0' is not a whole number"),
    BadFlag("a count in Arabic-Indic digits", ["serve", "--policy", "p", "--threads", "١٢٣"],
            "--threads: '١٢٣' is not a whole number"),
    BadFlag("a count in full-width digits", ["scale", "--threads", "１２"], "--threads: '１２' is not a whole number"),
    BadFlag("a number with an underscore", ["warm", "plan", "--policy", "p", "--now", "1_000"],
            "--now: '1_000' is not a number"),
    BadFlag("a number in Arabic-Indic digits", ["warm", "plan", "--policy", "p", "--now", "١٢٣"],
            "--now: '١٢٣' is not a number"),
    BadFlag("a number in full-width digits", ["simulate", "s.yaml", "--load-scale", "１２"],
            "--load-scale: '１２' is not a number"),
    BadFlag("an expectation in full-width digits", ["warm", "plan", "--policy", "p", "--expect", "llm=１２"],
            "--expect: 'llm=１２': '１２' is not a whole number of replicas"),
    BadFlag("a bind port in Arabic-Indic digits", ["serve", "--policy", "p", "--bind", ":١٢٣"],
            "--bind: ':١٢٣' is not HOST:PORT"),
    BadFlag("serve workers of zero", ["serve", "--policy", "p", "--workers", "0"], "--workers: '0' must be >= 1"),
    BadFlag("a time scale below the field's bound",
            ["simulate", "s.yaml", "--trace", "r.csv", "--time-scale", "1e-300"],
            "--time-scale: timeScale: must be >= 1e-09"),
]


@pytest.mark.parametrize("case", BAD_FLAGS, ids=[c.id for c in BAD_FLAGS])
def test_malformed_flags_are_usage_errors(case: BadFlag, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        PARSER.parse_args(case.argv)
    assert exit_.value.code == 2
    assert case.words in capsys.readouterr().err


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://u:p@h:6380", "unix:///run/redis.sock",
                                 "redis+sentinel://s1:26379/mymaster"])
def test_redis_urls_of_every_scheme_are_taken(url: str) -> None:
    assert PARSER.parse_args(["inventory", "show", "--redis-url", url]).redis_url == url


class EnvUrl(NamedTuple):
    id: str
    argv: list[str]
    environ: str
    refused: bool


#: $REDIS_URL stands in for --redis-url when the flag is absent, and is refused as the flag is (docs/cli.md):
#: it used to reach the store unchecked (serve then failed open for ever; inventory show exited 1).
ENV_URLS = [
    EnvUrl("serve, another scheme", ["serve", "--policy", "p", "--bind", "127.0.0.1:18892"], "http://x:1", True),
    EnvUrl("inventory show, another scheme", ["inventory", "show"], "http://u:secret@x:1", True),
    EnvUrl("estimate, no scheme", ["estimate", "--policy", "p"], "localhost:6379", True),
    EnvUrl("scale explain, no registered check", ["scale", "explain", "w"], "http://x:1", True),
    EnvUrl("calibrate show", ["calibrate", "show", "--policy", "p"], "ftp://x", True),
    EnvUrl("the flag wins over the variable", ["inventory", "show", "--redis-url", "redis://h:1"], "http://x:1",
           False),
    EnvUrl("a Redis URL is taken", ["inventory", "show"], "rediss://u:p@h:6380/0", False),
    EnvUrl("empty means unset", ["inventory", "show"], "", False),
]


@pytest.mark.parametrize("case", ENV_URLS, ids=[c.id for c in ENV_URLS])
def test_redis_url_from_the_environment_is_checked_as_the_flag(case: EnvUrl) -> None:
    problem = flag_problem(PARSER.parse_args(case.argv), {"REDIS_URL": case.environ})
    if not case.refused:
        assert problem is None
        return
    assert problem is not None and problem.startswith("$REDIS_URL") and "not a Redis URL" in problem
    assert "secret" not in problem


@pytest.mark.parametrize("case", [c for c in ENV_URLS if c.refused], ids=[c.id for c in ENV_URLS if c.refused])
def test_a_bad_redis_url_in_the_environment_is_a_usage_error(case: EnvUrl, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", case.environ)
    assert cli.main(case.argv) == 2
    err = capsys.readouterr().err
    assert "$REDIS_URL" in err and "not a Redis URL" in err and "secret" not in err


def test_a_bad_unit_is_a_usage_error_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        PARSER.parse_args(["serve", "--policy", "p", "--max-body", "64M"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--max-body" in err and "ambiguous size '64M'" in err


# ---- --prefix wherever the store is used ---------------------------------------------------------


INVENTORY = """\
apiVersion: extender.io/v1alpha1
kind: Inventory
nodes:
  - {name: gpu-a, gpus: 8}
"""


@pytest.mark.integration
def test_prefix_separates_inventories(tmp_path: Path, redis_server: RedisServer,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "inventory.yaml"
    doc.write_text(INVENTORY)
    assert cli.main(["inventory", "load", str(doc), "--redis-url", redis_server.url, "--prefix", "team-a"]) == 0
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.exists("team-a:node:gpu-a") and not client.exists(f"{DEFAULT_PREFIX}:node:gpu-a")
    finally:
        client.close()
    capsys.readouterr()
    assert cli.main(["inventory", "show", "--redis-url", redis_server.url, "--prefix", "team-a"]) == 0
    assert "gpu-a" in capsys.readouterr().out
    assert cli.main(["inventory", "show", "--redis-url", redis_server.url]) == 0
    assert "0 node(s)" in capsys.readouterr().out
    root = tmp_path / "cache"
    root.mkdir()
    assert cli.main(["agent", "--node-name", "gpu-b", "--cache-root", str(root), "--once",
                     "--redis-url", redis_server.url, "--prefix", "team-a"]) == 0
    capsys.readouterr()
    assert cli.main(["inventory", "show", "gpu-b", "--redis-url", redis_server.url, "--prefix", "team-a"]) == 0
    assert cli.main(["inventory", "show", "gpu-b", "--redis-url", redis_server.url]) == 1


def test_agent_once_without_a_cache_root_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "file"
    afile.write_text("")
    for root, what in ((tmp_path / "missing", "does not exist"), (afile, "is not a directory")):
        assert cli.main(["agent", "--node-name", "n", "--cache-root", str(root), "--once",
                         "--data-dir", str(tmp_path / "redis")]) == 1
        err = capsys.readouterr().err
        assert err == f"extender agent: cache root {root} {what}: nothing to scan (mount the node's cache there, " \
                      "or fix --cache-root)\n"
    assert not (tmp_path / "redis").exists()  # refused before touching the store


# ---- a kubeconfig that cannot be used: one line naming it, exit 1 ---------------------------------


class BadKubeconfig(NamedTuple):
    id: str
    make: Callable[[Path], Path]
    words: str


def _file(text: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = tmp / "kubeconfig"
        path.write_text(text)
        return path
    return make


def _bytes(tmp: Path, data: bytes) -> Path:
    path = tmp / "kubeconfig"
    path.write_bytes(data)
    return path


BAD_KUBECONFIGS = [
    BadKubeconfig("missing", lambda tmp: tmp / "nowhere", "cannot read: No such file or directory"),
    BadKubeconfig("a directory", lambda tmp: tmp, "cannot read: not a regular file"),
    BadKubeconfig("a plain string", _file("not a kubeconfig\n"), "is not a kubeconfig (a YAML mapping"),
    BadKubeconfig("a list", _file("- 1\n- 2\n"), "is not a kubeconfig (a YAML mapping"),
    BadKubeconfig("clusters of the wrong type", _file("clusters: 5\n"), "is not a kubeconfig (a YAML mapping"),
    BadKubeconfig("broken YAML", _file("clusters: [\n"), "is not a kubeconfig (a YAML mapping"),
    # a UnicodeDecodeError traceback from the YAML reader
    BadKubeconfig("bytes that are not UTF-8", lambda tmp: _bytes(tmp, b"\xff\xfe\x00"), "not UTF-8 text"),
]

#: Commands that talk to Kubernetes and fail on their kubeconfig before anything else.
KUBE_COMMANDS = [
    pytest.param(["warm", "status", "--policy", FLEET], id="warm-status"),
    pytest.param(["sync", "--policy", FLEET], id="sync"),
]


@pytest.mark.parametrize("command", KUBE_COMMANDS)
@pytest.mark.parametrize("case", BAD_KUBECONFIGS, ids=[c.id for c in BAD_KUBECONFIGS])
def test_a_kubeconfig_that_cannot_be_used_is_one_line(command: list[str], case: BadKubeconfig, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = case.make(tmp_path)
    code = cli.main([*command, "--kubeconfig", str(kubeconfig), "--data-dir", str(tmp_path / "redis")]
                    if command[0] == "sync" else [*command, "--kubeconfig", str(kubeconfig)])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("extender: loading the Kubernetes client configuration: ") and case.words in err, err
    assert str(kubeconfig) in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(("argv", "level"), [
    pytest.param(["serve", "--policy", "p.yaml"], "info", id="serve-runs-until-stopped"),
    pytest.param(["scale"], "info", id="scale-loop"),
    pytest.param(["simulate", "s.yaml"], "info", id="simulate-reports-its-demand-at-info"),
    # it logged "starting embedded Redis" at info, the scale loop's level, where short commands warn
    pytest.param(["scale", "explain", "llm"], "warning", id="scale-explain-is-short"),
    pytest.param(["policy", "check", "p.yaml"], "warning", id="policy-check"),
    pytest.param(["inventory", "show"], "warning", id="inventory-show"),
])
def test_the_default_log_level(argv: list[str], level: str) -> None:
    assert cli.default_level(cli.build_parser().parse_args(argv)) == level


@pytest.mark.parametrize(("argv", "dest", "value"), [
    pytest.param(["serve", "--policy", "p", "--workers", "64"], "workers", 64, id="serve-workers-at-the-bound"),
    pytest.param(["serve", "--policy", "p", "--threads", "256"], "threads", 256, id="serve-threads-at-the-bound"),
    pytest.param(["scale", "--threads", "256"], "threads", 256, id="scale-threads-at-the-bound"),
    pytest.param(["serve", "--policy", "p", "--workers", "1"], "workers", 1, id="serve-one-worker"),
])
def test_worker_and_thread_counts_up_to_their_bounds_are_taken(argv: list[str], dest: str, value: int) -> None:
    assert getattr(PARSER.parse_args(argv), dest) == value
