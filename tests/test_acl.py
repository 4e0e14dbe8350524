"""Least-privilege Redis users (extender.state.acl), on a real redis-server.

Each component's user runs the store calls the component makes (the real classes and methods, as
the component calls them) and is refused nothing; a representative call outside its role is
refused by the server, changing nothing; and every rule a user is granted is needed by some call
(take it away and the same calls are refused). So the rules can drift from the code in neither
direction unnoticed: a store method that starts sending another command, or touching another key,
fails its component's row here, and so does a component that starts calling a store method its row
does not run (:func:`test_each_component_runs_every_store_call_it_makes`).

"Refused" is what the server says: an entry for the user in ``ACL LOG``. The one refusal every user
gets is left out: redis-py's ``CLIENT SETINFO`` on each new connection, which it ignores (the rules
do not grant it; see the module docstring of extender.state.acl). The users connect to database 1,
so ``SELECT`` is exercised too.
"""

from __future__ import annotations

import ast
import contextlib
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis

from extender import cli
from extender.core.errors import (
    ExtenderError,
    FencedOutError,
    InvalidValueError,
    StoreUnavailableError,
    UnknownNameError,
)
from extender.core.inventory import NodeState
from extender.core.policy import parse_policy
from extender.core.reports import AgentReport, KubeReport
from extender.state import acl, embedded
from extender.state.connection import Client, connect
from extender.state.decisions import DecisionStore, Published
from extender.state.history import HistoryStore, Sample
from extender.state.lock import LeaderLock, LockKeys
from extender.state.observations import CalibratedPolicy, ObservationStore, read_nodes
from extender.state.sources import SourceStore
from extender.state.store import InventoryStore
from tests.calibration_world import starts
from tests.conftest import RedisServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "ext{a}*"  # a hash tag and a glob character: the prefix must be escaped in every pattern
NOW = 1.7e9
WORKLOAD, CLASS = "llama3-8b", "g5.12xlarge"
APPLY = parse_policy((ROOT / "policies" / "g5-pcie-fleet.yaml").read_text() + "calibration: {mode: apply}\n")
OBSERVED = starts(APPLY, APPLY, WORKLOAD, CLASS, ["warm", "cold"], t0=NOW - 600)
AGENT = AgentReport(nvme_total=2 << 40, nvme_free=1 << 40, weights={"llama3-8b/v1": 16 << 30}, heartbeat=NOW)
KUBE = KubeReport(node_class=CLASS, gpus=4, gpus_free=2)
PUBLISHED = Published(desired=3, load=12.0, unit="requests/s", t=NOW, window=15, token=1)
KEY = "ck1-" + "0" * 32
#: A name no record can have: merging its report raises between WATCH and EXEC, so redis-py UNWATCHes.
NO_NODE = "Not_A_Node"


# ---- the server, its admin and the users ------------------------------------------------------------


class Store(NamedTuple):
    server: RedisServer
    admin: Client  # the default user (the test's own: no rules)
    tmp: Path

    def url(self, user: str) -> str:
        return f"redis://{user}:pw-{user}@127.0.0.1:{self.server.port}/1"

    def reset(self) -> None:
        """The seed below alone, no script cached (a user's first EVALSHA loads it), an empty ACL LOG."""
        self.admin.flushall()
        seed(self.admin)
        self.admin.script_flush()
        self.command("ACL", "LOG", "RESET")

    def command(self, *args: str) -> Any:
        """One command as the admin (redis-py has no typed method for ACL)."""
        return self.admin.execute_command(*args)  # type: ignore[no-untyped-call]

    def user(self, name: str, rules: tuple[str, ...]) -> None:
        """Create or update the user as the docs say: the rules, then a password apart from them."""
        self.command("ACL", "SETUSER", name, *rules)
        self.command("ACL", "SETUSER", name, f">pw-{name}")

    def refusals(self, name: str) -> list[str]:
        """What ``ACL LOG`` says the server refused ``name`` (not redis-py's ``CLIENT SETINFO``)."""
        entries: Any = self.command("ACL", "LOG")
        return [f"{e['reason']} {e['object']} ({e['context']})" for e in entries
                if e["username"] == name and not (e["reason"] == "command" and e["object"] == "client")]

    def contents(self) -> dict[str, bytes]:
        raw = redis.Redis(port=self.server.port, db=1)
        try:
            return {k.decode(): raw.dump(k) for k in raw.keys("*")}  # type: ignore[misc, union-attr]
        finally:
            raw.close()

    def run_as(self, name: str, calls: Callable[[Client], object]) -> None:
        """``calls`` on a connection of user ``name`` (connecting is part of it: PING, SELECT)."""
        client = connect(self.url(name), self.tmp)
        try:
            calls(client)
        finally:
            client.close()

    def run_component(self, component: Component) -> None:
        self.run_as(component.name, lambda client: component.calls(client, PREFIX, self.admin))


@pytest.fixture
def store(redis_server: RedisServer, tmp_path: Path) -> Iterator[Store]:
    admin = connect(redis_server.url.removesuffix("/0") + "/1", tmp_path)
    try:
        yield Store(redis_server, admin, tmp_path)
    finally:
        admin.close()


def seed(admin: Client) -> None:
    """What the components find in a running cluster, written by the real stores as the admin: two
    nodes with both reports, a removed node's tombstone, bare heartbeats, a compile key, observed
    starts, a scaler's history (with a member no release wrote), decisions and published metrics."""
    sources = SourceStore(InventoryStore(admin, prefix=PREFIX))
    sources.report_kube({"gpu-a": KUBE, "gpu-b": KUBE, "gpu-gone": KUBE})
    sources.report_agent("gpu-b", AGENT)
    sources.remove_node("gpu-gone")
    sources.store.beat_many({"gpu-a": NOW})
    sources.store.add_registry("ck1-" + "1" * 32)
    ObservationStore(admin, prefix=PREFIX).append(OBSERVED, {"seen late": 1}, now=NOW)
    lock = LeaderLock(admin, "seed", ttl_s=30, prefix=PREFIX)
    token = lock.acquire().token
    history, decisions = HistoryStore(admin, prefix=PREFIX), DecisionStore(admin, prefix=PREFIX)
    lock.commit(token, history.stage_append("llm", [Sample(NOW - 30, 10.0)], now=NOW),
                decisions.stage_record("llm", {"t": NOW - 30}), decisions.stage_recommendations("llm", [(NOW - 30, 3)]),
                decisions.stage_published("llm", PUBLISHED))
    lock.release(token)
    admin.zadd(history.key("llm"), {"cut sho": NOW - 20})


def calibrated(store: ObservationStore) -> None:
    """The calibrated policy as its consumers take it: a fit, then, after the interval, the version."""
    now = [NOW]
    policy = CalibratedPolicy(store, clock=lambda: now[0], min_interval_s=30.0)
    policy.policy_for(APPLY)
    now[0] += 60.0
    policy.policy_for(APPLY)
    assert policy.error is None


# ---- what each component does, as it does it -----------------------------------------------------
# ``world``: the admin's client, for what happens around the component (the store losing its data).


def agent_calls(client: Client, prefix: str, world: Client) -> None:
    sources = SourceStore(InventoryStore(client, prefix=prefix))
    assert sources.report_agent("gpu-a", AGENT) is not None
    assert sources.beat_agent("gpu-a", NOW + 10)
    assert sources.report_agent("gpu-gone", AGENT) is None  # the tombstone keeps it out
    with pytest.raises(InvalidValueError):
        sources.report_agent(NO_NODE, AGENT)


def sync_calls(client: Client, prefix: str, world: Client) -> None:
    sources = SourceStore(InventoryStore(client, prefix=prefix))
    sources.report_kube({"gpu-a": KUBE, "gpu-c": KUBE})
    sources.report_kube({})
    with pytest.raises(InvalidValueError):
        sources.report_kube({NO_NODE: KUBE})
    assert sources.kube_reports(["gpu-a", "gpu-x"])["gpu-a"] == KUBE
    sources.store.versions()
    for name in sorted(sources.store.names() - {"gpu-a", "gpu-c"}):  # the prune of a relist
        sources.remove_node(name)
    observations = ObservationStore.for_policy(client, APPLY, prefix=prefix)
    read_nodes(sources.store, {"gpu-a"})
    read_nodes(sources.store, set())
    observations.append(starts(APPLY, APPLY, WORKLOAD, CLASS, ["warm"], t0=NOW - 60), {"stale inventory": 1},
                        now=NOW)
    calibrated(observations)


def extender_calls(client: Client, prefix: str, world: Client) -> None:
    store = InventoryStore(client, prefix=prefix)
    store.versions()
    assert {n.name for n in store.load_all()[1]} == {"gpu-a", "gpu-b"}
    store.changes_since(0)
    assert store.heartbeats_since(0)[1] == {"gpu-a": NOW}
    calibrated(ObservationStore(client, prefix=prefix))


def scaler_calls(client: Client, prefix: str, world: Client) -> None:
    lock = LeaderLock(client, "scaler-0", ttl_s=45, prefix=prefix)
    lease = lock.acquire()
    assert lease.leader and lock.acquire().leader  # taken (the script loaded on NOSCRIPT), then renewed
    lock.set_ttl(30)
    history, decisions = HistoryStore(client, prefix=prefix), DecisionStore(client, prefix=prefix)
    assert [s.rate for s in history.read("llm", now=NOW)] == [10.0]  # the unreadable member skipped
    assert decisions.recommendations("llm") == [(NOW - 30, 3)]
    lock.commit(lease.token, history.stage_append("llm", [Sample(NOW, 12.0)], now=NOW),
                decisions.stage_record("llm", {"t": NOW}), decisions.stage_recommendations("llm", [(NOW, 3)]),
                decisions.stage_published("llm", PUBLISHED), action="deciding llm")
    with pytest.raises(FencedOutError):
        lock.commit(lease.token - 1, decisions.stage_published("llm", PUBLISHED))
    assert "llm" in decisions.published_entries()
    inventory = InventoryStore(client, prefix=prefix)
    inventory.versions()
    inventory.load_all()
    assert inventory.get("gpu-a") is not None
    inventory.add_registry(KEY)  # the warmer's publish
    calibrated(ObservationStore(client, prefix=prefix))
    assert lock.release(lease.token)
    world.delete(LockKeys(prefix).fence)  # the store lost its data: the fence is carried past the last token
    assert lock.acquire().token == lease.token + 1


def keda_calls(client: Client, prefix: str, world: Client | None = None) -> None:
    assert DecisionStore(client, prefix=prefix).published_entries() == {"llm": PUBLISHED}


def publish_calls(client: Client, prefix: str, world: Client) -> None:
    InventoryStore(client, prefix=prefix).add_registry(KEY)


def cli_calls(client: Client, prefix: str, world: Client) -> None:
    store = InventoryStore(client, prefix=prefix)
    assert store.get("gpu-a") is not None and store.get("gpu-x") is None  # inventory show NODE
    store.names()
    store.load_all()  # inventory show, explain, warm plan
    observations = ObservationStore(client, prefix=prefix)
    assert observations.read().observations  # calibrate show, estimate --calibrated
    calibrated(observations)
    assert DecisionStore(client, prefix=prefix).records("llm", 5)  # scale explain
    node = NodeState(name="gpu-c", gpus=8, heartbeat=NOW)
    store.put_many([node], registry=[KEY])  # inventory load
    store.put_many([])
    store.add_registry(KEY)  # warm publish, by hand
    store.replace([node], [KEY])  # inventory load --replace


class Component(NamedTuple):
    name: str
    calls: Callable[[Client, str, Client], None]
    #: Where the component's store calls are (a file, a directory, or ``file::function``).
    callers: tuple[str, ...]


COMPONENTS = [
    Component("agent", agent_calls, ("extender/agent",)),
    Component("sync", sync_calls, ("extender/kube/sync.py", "extender/kube/observe.py", "extender/kube/commands.py")),
    Component("extender", extender_calls, ("extender/api/scheduler",)),
    Component("scaler", scaler_calls, ("extender/scaler/loop.py", "extender/scaler/serve.py",
                                       "extender/scaler/commands.py::_once", "extender/warm/loop.py",
                                       "extender/api/external_metrics")),
    Component("keda", keda_calls, ("extender/keda",)),
    Component("publish", publish_calls, ("extender/warm/commands.py::run_publish",)),
    Component("cli", cli_calls, ("extender/state/commands.py", "extender/state/calibration_commands.py",
                                 "extender/scaler/commands.py::_explain",
                                 "extender/api/scheduler/commands.py::_explain", "extender/warm/commands.py")),
]


def test_every_role_has_a_row() -> None:
    assert [c.name for c in COMPONENTS] == [r.name for r in acl.ROLES]


@pytest.mark.parametrize("component", COMPONENTS, ids=[c.name for c in COMPONENTS])
def test_each_component_does_its_work_as_its_own_user(store: Store, component: Component) -> None:
    store.reset()
    store.user(component.name, acl.rules(PREFIX, component.name))
    store.run_component(component)
    assert store.refusals(component.name) == []


#: Grants a component needs on a path its calls above cannot take, and why.
UNREACHED = {
    ("cli", "+unwatch"): "InventoryStore.replace raises nothing between WATCH and EXEC, but redis-py unwatches "
                         "when anything (Ctrl-C) interrupts it there, and a refusal would replace that error",
}


@pytest.mark.parametrize("component", COMPONENTS, ids=[c.name for c in COMPONENTS])
def test_every_rule_is_needed(store: Store, component: Component) -> None:
    # least privilege, checked: without any one grant, the same calls are refused something
    full = acl.rules(PREFIX, component.name)
    grants = [r for r in full if r.startswith(("+", "~")) and (component.name, r) not in UNREACHED]
    unneeded = []
    for grant in grants:
        store.reset()
        store.user(component.name, tuple(r for r in full if r != grant))
        # a refusal surfaces as our StateError, or as a result the calls did not expect
        with contextlib.suppress(ExtenderError, AssertionError):
            store.run_component(component)
        if not store.refusals(component.name):
            unneeded.append(grant)
    assert not unneeded, f"{component.name}: granted but never needed: {unneeded}"


# ---- every store call a component makes is among its calls above ------------------------------------

STORE_MODULES = ("store.py", "sources.py", "history.py", "decisions.py", "lock.py", "observations.py")
#: Store method names that other objects have too (dicts, lists, files, caches, locks, strings,
#: DecisionInputs.for_policy): a use of these names says nothing about the store, so they are not looked for.
COMMON = {"get", "append", "read", "replace", "put", "delete", "decode", "encode", "names", "key", "version",
          "current", "commit", "acquire", "release", "length", "published", "fence", "for_policy"}
#: Public functions of the store modules that send nothing to Redis (key names, parsing, settings).
PURE = {"corrupt_reason", "stored_beat", "with_beat", "observations_of", "node", "log_key", "recommendations_key",
        "set_ttl"}


def store_api() -> set[str]:
    """Public functions and methods of the store modules (not properties: key names), less :data:`COMMON`
    and :data:`PURE`."""
    names: set[str] = set()
    for module in STORE_MODULES:
        tree = ast.parse((ROOT / "extender" / "state" / module).read_text())
        for node in tree.body:
            body = node.body if isinstance(node, ast.ClassDef) else [node]
            names |= {f.name for f in body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")
                      and not any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)}
    return names - COMMON - PURE


def used(spec: str) -> set[str]:
    """Names called or referred to (``x.name``, ``name(...)``: a method may be handed on uncalled, as the KEDA
    scaler hands ``published_entries`` to a thread) in a file, every file of a directory, or one function."""
    path, _, function = spec.partition("::")
    files = sorted((ROOT / path).rglob("*.py")) if (ROOT / path).is_dir() else [ROOT / path]
    names: set[str] = set()
    for file in files:
        tree: ast.AST = ast.parse(file.read_text())
        if function:
            tree = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                names.add(node.func.id)
    return names


def run_traced(calls: Callable[[], None]) -> set[str]:
    """The functions of extender/state that ran during ``calls``."""
    state = str(ROOT / "extender" / "state")
    ran: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(state):
            ran.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        calls()
    finally:
        sys.setprofile(None)
    return ran


@pytest.mark.parametrize("component", COMPONENTS, ids=[c.name for c in COMPONENTS])
def test_each_component_runs_every_store_call_it_makes(store: Store, component: Component) -> None:
    api = store_api()
    made = {name for spec in component.callers for name in used(spec)} & api
    assert made, f"{component.name}: no store call found in {component.callers}; is the list of callers stale?"
    store.reset()
    store.user(component.name, acl.rules(PREFIX, component.name))
    ran = run_traced(lambda: store.run_component(component))
    missing = sorted(made - ran)
    assert not missing, f"{component.name} calls {missing}, which its row does not run as its user"


# ---- outside its role, refused -----------------------------------------------------------------------


def take_lock(client: Client, prefix: str) -> object:
    return LeaderLock(client, "intruder", ttl_s=30, prefix=prefix).acquire()


def publish_decision(client: Client, prefix: str) -> object:
    lock = LeaderLock(client, "intruder", ttl_s=30, prefix=prefix)
    lock.commit(2, DecisionStore(client, prefix=prefix).stage_published("llm", PUBLISHED))
    return None


def write_record(client: Client, prefix: str) -> object:
    return InventoryStore(client, prefix=prefix).put(NodeState(name="gpu-a", gpus=64, heartbeat=NOW))


def write_agent_report(client: Client, prefix: str) -> object:
    return SourceStore(InventoryStore(client, prefix=prefix)).report_agent("gpu-a", AGENT)


def record_starts(client: Client, prefix: str) -> object:
    return ObservationStore(client, prefix=prefix).append(OBSERVED, {"forged": 1}, now=NOW)


def read_records(client: Client, prefix: str) -> object:
    return InventoryStore(client, prefix=prefix).load_all()


class Refusal(NamedTuple):
    component: str
    calls: Callable[[Client, str], object]


REFUSALS = [
    pytest.param(Refusal("agent", take_lock), id="the agent cannot take the scaler lock"),
    pytest.param(Refusal("agent", publish_decision), id="the agent cannot publish a decision"),
    pytest.param(Refusal("agent", record_starts), id="the agent cannot record observed starts"),
    pytest.param(Refusal("agent", lambda c, p: InventoryStore(c, prefix=p).delete("gpu-b")),
                 id="the agent cannot delete a node"),
    pytest.param(Refusal("agent", lambda c, p: InventoryStore(c, prefix=p).replace([], [])),
                 id="the agent cannot empty the inventory"),
    pytest.param(Refusal("sync", take_lock), id="the sync cannot take the scaler lock"),
    pytest.param(Refusal("sync", publish_decision), id="the sync cannot publish a decision"),
    pytest.param(Refusal("extender", write_record), id="the extender cannot write a node record"),
    pytest.param(Refusal("extender", write_agent_report), id="the extender cannot write a node's report"),
    pytest.param(Refusal("extender", take_lock), id="the extender cannot take the scaler lock"),
    pytest.param(Refusal("extender", record_starts), id="the extender cannot record observed starts"),
    pytest.param(Refusal("scaler", write_agent_report), id="the scaler cannot write a node's report"),
    pytest.param(Refusal("keda", read_records), id="the keda scaler cannot read the inventory"),
    pytest.param(Refusal("keda", publish_decision), id="the keda scaler cannot publish a decision"),
    pytest.param(Refusal("publish", write_record), id="a publishing sidecar cannot write a node record"),
    pytest.param(Refusal("publish", lambda c, p: DecisionStore(c, prefix=p).published_entries()),
                 id="a publishing sidecar cannot read the published metrics"),
    pytest.param(Refusal("cli", take_lock), id="the operator's user cannot take the scaler lock"),
    pytest.param(Refusal("cli", publish_decision), id="the operator's user cannot publish a decision"),
]


@pytest.mark.parametrize("case", REFUSALS)
def test_outside_its_role_a_component_is_refused_and_nothing_changes(store: Store, case: Refusal) -> None:
    store.reset()
    store.user(case.component, acl.rules(PREFIX, case.component))
    before = store.contents()
    with pytest.raises(ExtenderError):  # our StateError, saying what was refused
        store.run_as(case.component, lambda client: case.calls(client, PREFIX))
    assert store.refusals(case.component)
    assert store.contents() == before


def test_no_user_may_run_an_administrative_command(store: Store) -> None:
    for role in acl.ROLES:
        store.user(role.name, acl.rules(PREFIX, role))
        client = connect(store.url(role.name), store.tmp)
        try:
            for command in (["FLUSHALL"], ["CONFIG", "GET", "*"], ["KEYS", "*"], ["ACL", "LIST"],
                            ["CLIENT", "KILL", "TYPE", "normal"], ["SHUTDOWN", "NOSAVE"], ["SCRIPT", "FLUSH"]):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    client.execute_command(*command)  # type: ignore[no-untyped-call]
        finally:
            client.close()


# ---- the rules themselves -----------------------------------------------------------------------------


class Pattern(NamedTuple):
    prefix: str
    key: str
    pattern: str


PATTERNS = [
    pytest.param(Pattern("extender", "node:*", "~extender:node:*"), id="the default prefix"),
    pytest.param(Pattern("{extender}", "nodes", "~{extender}:nodes"), id="a Redis Cluster hash tag is no glob"),
    pytest.param(Pattern("team*", "node:*", "~team\\*:node:*"), id="a star in the prefix is escaped"),
    pytest.param(Pattern("a?[b]\\", "nodes", "~a\\?\\[b\\]\\\\:nodes"), id="every glob character is escaped"),
]


@pytest.mark.parametrize("case", PATTERNS)
def test_key_patterns_escape_the_prefix(case: Pattern) -> None:
    assert acl.key_pattern(case.prefix, case.key) == case.pattern


@pytest.mark.parametrize("prefix", ["", "two words", "tab\there", 'quo"te', "it's", "bell\x07"],
                         ids=["empty", "a space", "a tab", "a double quote", "a single quote", "a control character"])
def test_a_prefix_no_rule_can_hold_is_refused(prefix: str) -> None:
    with pytest.raises(InvalidValueError, match="prefix"):
        acl.rules(prefix, "agent")


def test_an_unknown_component_is_named_with_the_known_ones() -> None:
    known = r"'warmer' \(known: agent, sync, extender, scaler, keda, publish, cli\)"
    with pytest.raises(UnknownNameError, match=known):
        acl.role("warmer")


@pytest.mark.parametrize("role", acl.ROLES, ids=[r.name for r in acl.ROLES])
def test_rules_grant_commands_one_by_one_and_reset_what_was_there(role: acl.Role) -> None:
    rules = acl.rules("extender", role)
    assert rules[:4] == ("on", "resetkeys", "resetchannels", "-@all")
    granted = [r for r in rules if r.startswith("+")]
    assert granted and not [r for r in granted if "@" in r], "no category: each command by name"
    assert not [r for r in rules if r in ("nopass", "resetpass", "allkeys", "allcommands", "allchannels")
                or r.startswith((">", "#", "&", "%"))]
    assert len(granted) == len(set(granted))


# ---- the command ---------------------------------------------------------------------------------------


def test_the_printed_commands_create_the_users_through_redis_cli(store: Store,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inventory", "acl", "--prefix", PREFIX]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [shlex.split(line)[2] for line in lines] == [r.name for r in acl.ROLES]
    redis_cli = embedded.redis_server_executable().with_name("redis-cli")

    def apply() -> None:
        done = subprocess.run([str(redis_cli), "-p", str(store.server.port)], input="\n".join(lines) + "\n",
                              capture_output=True, text=True, check=True, timeout=30)
        assert done.stdout.split() == ["OK"] * len(lines)

    apply()
    store.reset()
    with pytest.raises(StoreUnavailableError, match="invalid username-password pair"):
        store.run_component(COMPONENTS[0])  # no password yet: nobody logs in as the new user
    store.command("ACL", "LOG", "RESET")  # the refused login is logged, as it should be
    store.command("ACL", "SETUSER", "agent", ">pw-agent")  # the password, apart
    apply()  # the rules again, as after an upgrade: the password stays
    store.run_component(COMPONENTS[0])
    assert store.refusals("agent") == []


def test_an_acl_file_of_the_printed_lines_is_loaded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inventory", "acl", "--prefix", PREFIX, "--format", "aclfile", "--component", "keda"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line == f"user keda {' '.join(acl.rules(PREFIX, 'keda'))}"
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(f"user default on nopass ~* &* +@all\n{line} >pw-keda\n")
    server = RedisServer(tmp_path, args=("--aclfile", str(aclfile)))
    server.start()
    try:
        admin = connect(f"redis://127.0.0.1:{server.port}/1", tmp_path)
        try:
            DecisionStore(admin, prefix=PREFIX).published_entries()
            lock = LeaderLock(admin, "seed", ttl_s=30, prefix=PREFIX)
            lock.commit(lock.acquire().token, DecisionStore(admin, prefix=PREFIX).stage_published("llm", PUBLISHED))
        finally:
            admin.close()
        keda = connect(f"redis://keda:pw-keda@127.0.0.1:{server.port}/1", tmp_path)
        try:
            keda_calls(keda, PREFIX)
        finally:
            keda.close()
    finally:
        server.stop()


def test_a_prefix_no_rule_can_hold_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inventory", "acl", "--prefix", "two words"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("extender: key prefix 'two words' cannot be written in an ACL rule "
                            "(it holds whitespace, a quote or a control character)\n")


def test_an_unknown_component_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["inventory", "acl", "--component", "warmer"])
    assert exit_.value.code == 2
    assert "invalid choice: 'warmer'" in capsys.readouterr().err
