"""Bad input on the command line, each a usage error or a located one-line refusal that changes nothing.

Found by feeding every subcommand a platform engineer's mistakes (docs/cli.md's invariants: exit 2 for
a malformed flag or variable, one line on stderr naming it, no traceback, no password repeated, nothing
written). Each row is the smallest input that showed a defect; the fuzz tests hold the invariants over
generated inputs. Redis is real (tests/conftest.py); every command runs in-process (``cli.main``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender import cli
from extender.arguments import redis_url
from extender.core.errors import StateError, StoreUnavailableError
from extender.state.connection import connect, url_problem
from tests.conftest import RedisServer

if TYPE_CHECKING:
    from tests.kube_double import KubeDouble

#: Bound on a command that must not hang (generous: CI machines stall); never asserted on.
HANG_BOUND_S = 60.0

#: A password no message may repeat.
SECRET = "s3cr3t-pw"

INVENTORY = """\
apiVersion: extender.io/v1alpha1
kind: Inventory
nodes:
  - {name: gpu-a, gpus: 8}
"""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server whose user ``cli`` has the password :data:`SECRET`, shared by this module's tests."""
    directory = tmp_path_factory.mktemp("redis")
    users = directory / "users.acl"
    users.write_text(f"user default on nopass ~* &* +@all\nuser cli on >{SECRET} ~* &* +@all\n")
    server = RedisServer(directory, args=("--aclfile", str(users)))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _written(server: RedisServer) -> list[int]:
    """The databases of ``server`` that hold a key."""
    client = redis.Redis(port=server.port)
    try:
        return [db for db in range(16) if client.execute_command("SELECT", db) and client.dbsize()]  # type: ignore[no-untyped-call]
    finally:
        client.close()


class BadUrl(NamedTuple):
    id: str
    url: str  # formatted as PLAIN
    words: str


#: A Redis URL's start, to be formatted: {auth} cli:SECRET@, {port} a real server's.
PLAIN = "redis://{auth}127.0.0.1:{port}"

#: Redis URLs whose form the store cannot use as meant: each refused before anything connects.
BAD_URLS = [
    # redis-py read a path that is no number as database 0: `inventory load` wrote the nodes there, exit 0
    BadUrl("a database path that is a name", PLAIN + "/prod", "the path '/prod' is not a database number"),
    # every '/' of the path was dropped: /1/2 selected database 12
    BadUrl("a database path of two numbers", PLAIN + "/1/2", "the path '/1/2' is not a database number"),
    # TypeError traceback from deep in the first connection attempt
    BadUrl("an unknown query option", PLAIN + "/0?socket_timout=2", "unknown option 'socket_timout' in the query"),
    # ValueError traceback from socket.settimeout
    BadUrl("a negative timeout", PLAIN + "/0?socket_timeout=-1", "option socket_timeout must be a finite number"),
    BadUrl("a timeout that is not a number", PLAIN + "/0?socket_connect_timeout=nan",
           "option socket_connect_timeout must be a finite number"),
    BadUrl("a negative timeout of a Sentinel URL", "redis+sentinel://{auth}127.0.0.1:{port}/m?socket_timeout=-1",
           "Sentinel URL option socket_timeout must be a finite number of seconds >= 0"),
]


def _url(server_port: int, case: BadUrl) -> str:
    return case.url.format(auth=f"cli:{SECRET}@", port=server_port)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in BAD_URLS])
def test_a_redis_url_the_store_cannot_use_is_refused_before_it_connects(
        case: BadUrl, tmp_path: Path, guarded: RedisServer, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As a flag and as $REDIS_URL: exit 2, one line naming where and what, no password, nothing written."""
    url = _url(guarded.port, case)
    doc = tmp_path / "inventory.yaml"
    doc.write_text(INVENTORY)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["inventory", "load", str(doc), "--redis-url", url])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --redis-url: not a usable Redis URL" in err and case.words in err and SECRET not in err
    monkeypatch.setenv("REDIS_URL", url)
    assert cli.main(["inventory", "load", str(doc)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("extender inventory: $REDIS_URL (used as --redis-url is not given)"), err
    assert case.words in err and SECRET not in err and len(err.splitlines()) == 1
    # connect() itself refuses it too, for the long-running commands' settings
    with pytest.raises(StateError) as refused:
        connect(url, tmp_path / "redis")
    assert case.words in str(refused.value) and SECRET not in str(refused.value)
    assert _written(guarded) == []


# ---- fuzz: every Redis URL either means what it says or is refused ------------------------------

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: Path and query pieces of the mistakes people make, and of the right spellings.
PATHS = st.sampled_from(["", "/", "/0", "/3", "/15", "/x", "/0/", "/1/2", "/3x", "/-1", "/ 3", "/%31", "/٣"])
QUERIES = st.lists(st.sampled_from([
    "socket_timeout=2", "socket_timeout=-1", "socket_timeout=nan", "socket_timeout=inf", "socket_timeout=x",
    "socket_connect_timeout=0.5", "socket_timout=2", "db=x", "foo=bar", "protocol=2", "protocol=9",
    "max_connections=4", "health_check_interval=x", "client_name=cli",
]), max_size=3)


@FUZZ
@given(path=PATHS, query=QUERIES, uppercase=st.booleans())
def test_a_redis_url_is_refused_or_connects_to_the_database_it_names(
        guarded: RedisServer, tmp_path_factory: pytest.TempPathFactory, path: str, query: list[str],
        uppercase: bool) -> None:
    """Invariant: the argparse type and connect() agree; a refusal never repeats the password and is
    our error; an accepted URL connects to the database its path names (0 when it names none)."""
    scheme = "REDIS" if uppercase else "redis"
    url = f"{scheme}://cli:{SECRET}@127.0.0.1:{guarded.port}{path}" + (f"?{'&'.join(query)}" if query else "")
    problem = url_problem(url)
    try:
        redis_url(url)
    except argparse.ArgumentTypeError as exc:
        assert problem is not None and problem in str(exc) and SECRET not in str(exc)
    else:
        assert problem is None
    data_dir = tmp_path_factory.mktemp("unused")
    try:
        client = connect(url, data_dir)
    except (StateError, StoreUnavailableError) as exc:  # never a TypeError or ValueError from redis-py
        assert SECRET not in str(exc)
        assert problem is not None, exc
        return
    try:
        named = path.strip("/")
        assert client.connection_pool.connection_kwargs.get("db", 0) == (int(named) if named else 0)
    finally:
        client.close()
    assert problem is None


# ---- $KUBECONFIG: read as kubectl reads it, a file that cannot be one named ------------------------

ROOT = Path(__file__).resolve().parent.parent
FLEET = str(ROOT / "policies" / "g5-pcie-fleet.yaml")


class EnvKubeconfig(NamedTuple):
    id: str
    value: str  # {tmp}: the test's directory
    words: str


#: ``$KUBECONFIG`` set to what holds no kubeconfig: exit 1, one line naming the file and the variable.
BAD_ENV_KUBECONFIGS = [
    # "invalid Kubernetes client configuration: Invalid kube-config file. No configuration found."
    EnvKubeconfig("a file that does not exist", "{tmp}/nowhere",
                  "$KUBECONFIG names no file that exists ({tmp}/nowhere)"),
    # "connection error: [Errno 21] Is a directory"
    EnvKubeconfig("a directory", "{tmp}", "kubeconfig {tmp} ($KUBECONFIG): cannot read: not a regular file"),
    EnvKubeconfig("a device", "/dev/null", "kubeconfig /dev/null ($KUBECONFIG): cannot read: not a regular file"),
    EnvKubeconfig("only separators", ":", "$KUBECONFIG names no file that exists"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in BAD_ENV_KUBECONFIGS])
def test_a_kubeconfig_variable_that_names_no_kubeconfig_is_one_line(
        case: EnvKubeconfig, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", case.value.format(tmp=tmp_path))
    assert cli.main(["warm", "status", "--policy", FLEET]) == 1
    err = capsys.readouterr().err
    assert err.startswith("extender: loading the Kubernetes client configuration: ") and len(err.splitlines()) == 1
    assert case.words.format(tmp=tmp_path) in err, err


def test_an_empty_kubeconfig_variable_means_the_default_file(
        tmp_path: Path, double: KubeDouble, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """KUBECONFIG="" is unset to kubectl: ~/.kube/config is read (the client read no file and said
    "No configuration found")."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", "")
    (tmp_path / ".kube").mkdir()
    double.write_kubeconfig(tmp_path / ".kube" / "config")
    assert cli.main(["warm", "status", "--namespace", "extender-warm"]) == 0, capsys.readouterr().err
    assert "no warm jobs in namespace extender-warm" in capsys.readouterr().out


def test_a_kubeconfig_variable_naming_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A real process: the client opened the FIFO and waited for a writer for ever."""
    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo)
    env = {**os.environ, "KUBECONFIG": str(fifo), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    start = "import sys; from extender.cli import main; sys.exit(main(sys.argv[1:]))"
    try:
        proc = subprocess.run([sys.executable, "-c", start, "warm", "status"], cwd=ROOT, env=env, text=True,
                              capture_output=True, timeout=HANG_BOUND_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"extender warm status waited on the FIFO {fifo} named by $KUBECONFIG")
    assert proc.returncode == 1
    assert proc.stderr == (f"extender: loading the Kubernetes client configuration: kubeconfig {fifo} ($KUBECONFIG): "
                           "cannot read: not a regular file (a FIFO, device, socket or directory)\n")


# ---- a CA file that holds no certificate ------------------------------------------------------------

QWEN = str(ROOT / "policies" / "eks-p5-qwen3-moe.yaml")


@pytest.mark.parametrize("flag", [pytest.param("--tls-front-proxy-ca", id="front-proxy-ca"),
                                  pytest.param("--tls-client-ca", id="client-ca")])
def test_a_ca_file_without_a_certificate_is_one_line_naming_the_flag(
        flag: str, tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    """It was an ssl.SSLError traceback from the scaler's preflight (and from every worker's boot)."""
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    argv = ["scale", "--policy", QWEN, "--no-loop", "--bind", "127.0.0.1:1", "--tls-cert", str(tmp_path / "c.pem"),
            "--tls-key", str(tmp_path / "k.pem"), flag, str(ca), "--no-auth-configmap", "--no-delegated-auth",
            "--redis-url", redis_server.url]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"extender scale: not starting: the CA of {flag} ") and "no PEM certificate" in err, err
    assert len(err.splitlines()) == 1


def test_a_server_that_asks_for_a_password_the_url_lacks_says_so(
        tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "HELLO must be called with the client already authenticated, otherwise the HELLO AUTH
    <user> <pass> option can be used ...": the words of redis-py's handshake, not of the URL at fault."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "default", "resetpass", f">{SECRET}")  # type: ignore[no-untyped-call]
        admin.close()
        assert cli.main(["inventory", "show", "--redis-url", server.url]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"extender: connecting to {server.url}: ") and len(err.splitlines()) == 1, err
        assert "the server asks for credentials and none were given" in err
    finally:
        server.stop()


@pytest.mark.parametrize("query", [
    pytest.param("?socket_timeout=0.3&socket_connect_timeout=0.3", id="rediss-to-a-plain-port"),
    pytest.param("?socket_connect_timeout=0.3&ssl_cert_reqs=none", id="rediss-to-a-plain-port-unverified"),
])
def test_rediss_to_a_plain_redis_says_the_tls_handshake_did_not_complete(
        redis_url: str, query: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "Timeout connecting to server", as for a host that does not answer: a plain server reads
    the TLS ClientHello as the start of a command and waits for the rest."""
    url = redis_url.replace("redis://", "rediss://", 1) + query
    assert cli.main(["inventory", "show", "--redis-url", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"extender: connecting to {redis_url.replace('redis://', 'rediss://', 1)}: ") and \
        len(err.splitlines()) == 1, err
    assert "the TLS handshake did not complete before the timeout: the server may not speak TLS" in err


# ---- fuzz: every typed option of every command takes a value or refuses it naming the flag -----------


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    if parser.get_default("handler") is not None:
        out.append((path, parser))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _leaves(sub, (*path, name))
    return out


#: Values for the required arguments, where "x" is refused.
REQUIRED = {"key": "ck1-" + "0" * 32, "cache": "weights:w/v"}


def _required(parser: argparse.ArgumentParser) -> list[str]:
    argv: list[str] = []
    for a in parser._actions:
        if a.required and not isinstance(a, argparse._SubParsersAction):
            value = REQUIRED.get(a.dest, "x")
            argv += [value] if not a.option_strings else [a.option_strings[0], value]
    return argv


PARSER = cli.build_parser()
#: (command, the command's required arguments, a typed option): every option whose value is checked.
TYPED = [(path, _required(p), a.option_strings[0]) for path, p in _leaves(PARSER) for a in p._actions
         if a.option_strings and a.type is not None and a.nargs != 0]
#: What people type by mistake, and anything else (a command line holds no NUL).
VALUES = st.one_of(
    st.sampled_from(["5", "5x", "-1s", "1e999", "nan", "inf", "-inf", "", " ", "0", "-0", "1e308",
                     "99999999999999999999", "0x10", "5 s", "+5", "1_000", "１５", "5s\n", "redis://h/x", "unix://",
                     "http://x", "ck1-", "a=b", ",", "w=-1", "llm=2@soon", ":", "[::1]:", "host:0"]),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=16),
)


def test_the_walk_finds_the_typed_options() -> None:
    options = {o for _, _, o in TYPED}
    assert {"--redis-url", "--interval", "--max-body", "--expect", "--trace", "--load-scale", "--tls-client-ca",
            "--cache-root", "--last", "--bind"} <= options


@settings(max_examples=400, deadline=None, derandomize=True)
@given(case=st.sampled_from(TYPED), value=VALUES)
def test_every_typed_option_takes_its_value_or_refuses_it_naming_the_flag(
        case: tuple[tuple[str, ...], list[str], str], value: str) -> None:
    """Parsing never raises anything but argparse's usage error (exit 2), whose message names the option."""
    path, required, option = case
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            PARSER.parse_args([*path, *required, f"{option}={value}"])
    except SystemExit as exc:
        assert exc.code == 2
        assert f"argument {option}" in stderr.getvalue(), stderr.getvalue()
        assert "Traceback" not in stderr.getvalue()
