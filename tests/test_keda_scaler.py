"""``extender keda-scaler``: KEDA's external scaler calls through a real gRPC client, over loopback.

The server runs in-process on its own event loop (one thread), reads a real Redis in which a
``LeaderLock`` commit published the decisions exactly as ``extender scale`` does, and is called
through the stub generated from extender/keda/externalscaler.proto, as KEDA's generated Go client
calls it. The policy is tests/scaler_policy.py: ``qwen3`` (namespace ``default``, minReplicas 1),
``llama`` (namespace ``ml``, minReplicas 0) and ``batch`` (not autoscaled). The command itself
(flags, SIGTERM) is at the end. Waits are bounded polls for a state, never assertions on time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extender import cli
from extender.keda import externalscaler_pb2 as pb
from extender.keda import externalscaler_pb2_grpc as pb_grpc
from extender.keda.metrics import CODES
from extender.keda.reading import METRIC_NAME, STANDBY_METRIC
from extender.keda.server import LIVENESS_SERVICE, KedaServer, KedaSettings, TlsFiles
from extender.state import connect
from extender.state.decisions import DecisionStore, Published
from extender.state.lock import LeaderLock
from extender.telemetry.served import STATES
from tests.conftest import RedisServer
from tests.kube_double.waiting import wait_until
from tests.net import free_port
from tests.pki import Pki, make_ca, make_cert, make_pki
from tests.scaler_policy import make_policy, policy_text

ROOT = Path(__file__).resolve().parent.parent
#: Bound of every wait for a state (setup bound, not an assertion on time).
SETTLE_S = 30.0
#: A decision this old is long stale (a week): still served, as the External Metrics API serves it.
WEEK_S = 7 * 86400.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    wait_until(condition, timeout_s=SETTLE_S, what=what)


def publish(redis_url: str, directory: Path, decisions: dict[str, tuple[int, float]], *, standby: int = 0) -> None:
    """Commit ``workload -> (desired, age in seconds)`` (and ``standby`` placeholders for each) as
    the scaler's leader does (fenced)."""
    client = connect(redis_url, directory)
    try:
        lock = LeaderLock(client, "test-leader", ttl_s=600)
        token = lock.acquire().token
        store = DecisionStore(client)
        now = time.time()
        lock.commit(token, *(store.stage_published(w, Published(desired=d, load=float(d), unit="requests/s",
                                                                  t=now - age, window=15, token=token,
                                                                  standby=standby))
                             for w, (d, age) in decisions.items()))
    finally:
        client.close()


@dataclass
class Running:
    server: KedaServer
    port: int
    loop: asyncio.AbstractEventLoop

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(SETTLE_S)


@contextmanager
def serving(settings: KedaSettings, redis_url: str, directory: Path) -> Iterator[Running]:
    """A :class:`KedaServer` on 127.0.0.1 (a free port) on an event loop of its own thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="keda-test-loop", daemon=True)
    thread.start()
    client = connect(redis_url, directory)
    server = KedaServer(settings, DecisionStore(client))
    try:
        port = asyncio.run_coroutine_threadsafe(server.start(), loop).result(SETTLE_S)
        running = Running(server, port, loop)
        try:
            yield running
        finally:
            running.call(server.stop())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(SETTLE_S)
        loop.close()
        client.close()


def settings(**kwargs: Any) -> KedaSettings:
    return KedaSettings(policy=make_policy(), listen="127.0.0.1:0", watch_interval_s=0.02, grace_s=1.0, **kwargs)


def ref(namespace: str, metadata: dict[str, str], name: str = "so") -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=metadata)


def stub(channel: grpc.Channel) -> Any:
    return pb_grpc.ExternalScalerStub(channel)


# ---- the four calls, table-driven ----------------------------------------------------------------

FRESH = 5.0  # seconds: decided one tick ago

class Call(NamedTuple):
    """One row: what is published, which call with which ScaledObject, and what it must answer."""

    id: str
    published: dict[str, tuple[int, float]]  # workload -> (desired, age in seconds)
    call: str
    namespace: str  # the ScaledObject's
    metadata: dict[str, str]  # its trigger's
    metric: str  # GetMetrics' metricName
    expected: Any  # a value (GetMetrics), a bool (IsActive), "spec" (GetMetricSpec), or (StatusCode, words)
    standby: int = 0  # placeholders published with every decision


STANDBY = {"workload": "qwen3", "metric": STANDBY_METRIC}


CALLS = [Call(*row) for row in [
    ("known-workload", {"qwen3": (7, FRESH)}, "GetMetrics", "default", {"workload": "qwen3"}, METRIC_NAME, 7),
    ("known-workload-active", {"qwen3": (7, FRESH)}, "IsActive", "default", {"workload": "qwen3"}, "", True),
    ("metric-spec", {}, "GetMetricSpec", "default", {"workload": "qwen3"}, "", "spec"),
    ("keda-keys-are-ignored", {"qwen3": (7, FRESH)}, "GetMetrics", "default",
     {"scalerAddress": "extender-keda-scaler.kube-system:9090", "enableTLS": "true", "workload": "qwen3"},
     METRIC_NAME, 7),
    ("other-workload", {"qwen3": (7, FRESH), "llama": (3, FRESH)}, "GetMetrics", "ml", {"workload": "llama"},
     METRIC_NAME, 3),
    # a stale decision is served as it is, like the External Metrics API serves it (docs/scaler.md 7)
    ("stale-decision", {"qwen3": (4, WEEK_S)}, "GetMetrics", "default", {"workload": "qwen3"}, METRIC_NAME, 4),
    ("stale-decision-active", {"llama": (2, WEEK_S)}, "IsActive", "ml", {"workload": "llama"}, "", True),
    # not decided yet: 0, as the External Metrics API's "0" item; active per the policy's minimum
    ("undecided-reads-zero", {}, "GetMetrics", "default", {"workload": "qwen3"}, METRIC_NAME, 0),
    ("undecided-min-1-is-active", {}, "IsActive", "default", {"workload": "qwen3"}, "", True),
    ("undecided-min-0-is-idle", {}, "IsActive", "ml", {"workload": "llama"}, "", False),
    ("decided-zero-is-idle", {"llama": (0, FRESH)}, "IsActive", "ml", {"workload": "llama"}, "", False),
    ("decided-zero-reads-zero", {"llama": (0, FRESH)}, "GetMetrics", "ml", {"workload": "llama"}, METRIC_NAME, 0),
    ("namespace-from-metadata", {"llama": (3, FRESH)}, "GetMetrics", "default",
     {"workload": "llama", "namespace": "ml"}, METRIC_NAME, 3),
    ("unknown-workload", {"qwen3": (7, FRESH)}, "GetMetrics", "default", {"workload": "mistral"}, METRIC_NAME,
     (grpc.StatusCode.NOT_FOUND, "ScaledObject default/so: no autoscaled workload 'mistral' in namespace 'default' "
                                 "(served there: qwen3)")),
    # the message names only what the namespace asked about may see, never another namespace's workloads
    ("unknown-workload-lists-its-namespace-only", {}, "GetMetrics", "ml", {"workload": "mistral"}, METRIC_NAME,
     (grpc.StatusCode.NOT_FOUND, "no autoscaled workload 'mistral' in namespace 'ml' (served there: llama)")),
    ("unknown-workload-in-an-empty-namespace", {}, "IsActive", "team-b", {"workload": "qwen3"}, "",
     (grpc.StatusCode.NOT_FOUND, "no autoscaled workload 'qwen3' in namespace 'team-b' (served there: nothing)")),
    ("unknown-workload-active", {}, "IsActive", "default", {"workload": "mistral"}, "",
     (grpc.StatusCode.NOT_FOUND, "no autoscaled workload 'mistral'")),
    ("unknown-workload-spec", {}, "GetMetricSpec", "default", {"workload": "mistral"}, "",
     (grpc.StatusCode.NOT_FOUND, "no autoscaled workload 'mistral'")),
    ("not-autoscaled", {}, "GetMetrics", "default", {"workload": "batch"}, METRIC_NAME,
     (grpc.StatusCode.NOT_FOUND, "no autoscaled workload 'batch'")),
    ("other-namespace", {"llama": (3, FRESH)}, "GetMetrics", "default", {"workload": "llama"}, METRIC_NAME,
     (grpc.StatusCode.NOT_FOUND, "no autoscaled workload 'llama' in namespace 'default'")),
    ("missing-metadata", {}, "GetMetrics", "default", {}, METRIC_NAME,
     (grpc.StatusCode.INVALID_ARGUMENT, "ScaledObject default/so: trigger metadata: 'workload' is required: the "
                                        "name of an autoscaled profile of the policy (keys given: none;")),
    ("missing-workload-key", {}, "IsActive", "default", {"scalerAddress": "x:9090", "worklaod": "qwen3"}, "",
     (grpc.StatusCode.INVALID_ARGUMENT, "'workload' is required: the name of an autoscaled profile of the policy "
                                        "(keys given: scalerAddress, worklaod; we read workload, namespace, metric)")),
    ("missing-metadata-spec", {}, "GetMetricSpec", "default", {}, "",
     (grpc.StatusCode.INVALID_ARGUMENT, "'workload' is required")),
    ("malformed-workload", {}, "GetMetrics", "default", {"workload": "Qwen_3"}, METRIC_NAME,
     (grpc.StatusCode.INVALID_ARGUMENT, "'workload': 'Qwen_3' is not a valid name")),
    ("malformed-namespace", {}, "GetMetrics", "default", {"workload": "qwen3", "namespace": "ML team"}, METRIC_NAME,
     (grpc.StatusCode.INVALID_ARGUMENT, "'namespace': 'ML team' is not a namespace name")),
    # KEDA strips its "s<index>-" prefix before asking; a name it did not get from us is not served
    ("unknown-metric", {"qwen3": (7, FRESH)}, "GetMetrics", "default", {"workload": "qwen3"},
     f"s0-{METRIC_NAME}",
     (grpc.StatusCode.NOT_FOUND, f"no metric 's0-{METRIC_NAME}' (served: {METRIC_NAME})")),
]]

# a ScaledObject on the placeholder Deployment (docs/scaler.md 5.1): the standby count, active above 0
CALLS += [
    Call("standby-value", {"qwen3": (7, FRESH)}, "GetMetrics", "default", STANDBY, STANDBY_METRIC, 2, standby=2),
    Call("standby-spec", {}, "GetMetricSpec", "default", STANDBY, "", "spec"),
    Call("standby-active", {"qwen3": (7, FRESH)}, "IsActive", "default", STANDBY, "", True, standby=2),
    Call("no-standby-is-idle-whatever-the-minimum", {"qwen3": (7, FRESH)}, "IsActive", "default", STANDBY, "",
         False),
    Call("standby-undecided-reads-zero", {}, "GetMetrics", "default", STANDBY, STANDBY_METRIC, 0),
    Call("standby-asked-for-desired", {"qwen3": (7, FRESH)}, "GetMetrics", "default", STANDBY, METRIC_NAME,
         (grpc.StatusCode.NOT_FOUND, f"no metric '{METRIC_NAME}' (served: {STANDBY_METRIC})")),
    Call("unknown-metric-key", {}, "GetMetricSpec", "default", {"workload": "qwen3", "metric": "replicas"}, "",
         (grpc.StatusCode.INVALID_ARGUMENT, "'metric': Input should be 'extender-desired-replicas' or "
                                            "'extender-standby-replicas'")),
]


@pytest.mark.integration
@pytest.mark.parametrize("row", CALLS, ids=[c.id for c in CALLS])
def test_calls(row: Call, redis_server: RedisServer, tmp_path: Path) -> None:
    call, expected = row.call, row.expected
    publish(redis_server.url, tmp_path, row.published, standby=row.standby)
    served = row.metadata.get("metric", METRIC_NAME)
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel:
        client = stub(channel)
        target = ref(row.namespace, row.metadata)
        try:
            if call == "GetMetrics":
                reply = client.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=target, metricName=row.metric))
                values = [(v.metricName, v.metricValue, v.metricValueFloat) for v in reply.metricValues]
                got: Any = values
                want: Any = [(served, expected, float(expected))] if not isinstance(expected, tuple) else None
            elif call == "IsActive":
                got, want = client.IsActive(target).result, expected
            else:
                reply = client.GetMetricSpec(target)
                got = [(s.metricName, s.targetSize, s.targetSizeFloat) for s in reply.metricSpecs]
                want = [(served, 1, 1.0)]
        except grpc.RpcError as exc:
            assert isinstance(expected, tuple), f"{call} failed: {exc.code()} {exc.details()}"
            code, words = expected
            assert exc.code() == code
            assert words in (exc.details() or "")
            assert counted(running, call) == {code.name: 1.0}
            return
        assert not isinstance(expected, tuple), f"{call} answered {got!r}, expected {expected[0]}"
        assert got == want
        assert counted(running, call) == {"OK": 1.0}


def counted(running: Running, method: str) -> dict[str, float]:
    """The server's ``extender_keda_requests_total`` of ``method`` by code, where not zero.

    The server counts a call when its handler returns, which may be just after the client has the
    reply: wait (bounded) until the call is counted.
    """
    def counts() -> dict[str, float]:
        found = {code: running.server.registry.get_sample_value(
            "extender_keda_requests_total", {"method": method, "code": code}) or 0.0 for code in CODES}
        return {code: n for code, n in found.items() if n}

    wait_for(lambda: bool(counts()), f"the {method} call counted")
    return counts()


# ---- what GetMetrics served, per workload: the decision's time and window, and the 0 of none -------

#: A series of the served metrics: (sample name, sorted label pairs).
Series = tuple[str, tuple[tuple[str, str], ...]]
TIME, WINDOW, SERVED = ("extender_served_decision_timestamp_seconds", "extender_served_decision_window_seconds",
                        "extender_served_values_total")
#: The workloads the policy autoscales (``batch`` is not): the only label values allowed.
AUTOSCALED = ("qwen3", "llama")
#: Names no policy lists, asked for in a namespace: each is NOT_FOUND, and none may become a label value.
MADE_UP = [f"w{i:03d}-{'x' * (i % 7 + 1)}" for i in range(100)]


def served_series(running: Running) -> dict[Series, float]:
    """The ``extender_served_*`` samples of the server's registry (``_created`` left out)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in running.server.registry.collect()
            for s in f.samples if s.name.startswith("extender_served_") and not s.name.endswith("_created")}


def expected_served(dated: Mapping[str, Published], counts: Mapping[tuple[str, str], float],
                    workloads: Iterable[str] = AUTOSCALED) -> dict[Series, float]:
    """Every counter of ``workloads`` (0 unless in ``counts``), and the gauges of the ``dated`` workloads."""
    out: dict[Series, float] = {(SERVED, (("api", "keda"), ("state", state), ("workload", w))):
                                counts.get((w, state), 0.0) for w in workloads for state in STATES}
    for w, decision in dated.items():
        out[(TIME, (("api", "keda"), ("workload", w)))] = decision.t
        out[(WINDOW, (("api", "keda"), ("workload", w)))] = decision.window
    return out


class Ask(NamedTuple):
    """One call: which, the ScaledObject's namespace, its trigger's metadata, GetMetrics' metricName."""

    call: str
    namespace: str
    metadata: dict[str, str]
    metric: str = METRIC_NAME


def asked(client: Any, ask: Ask) -> None:
    """Make the call; a refusal (NOT_FOUND, ...) is part of the row, not a failure."""
    target = ref(ask.namespace, ask.metadata)
    try:
        if ask.call == "GetMetrics":
            client.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=target, metricName=ask.metric))
        elif ask.call == "IsActive":
            client.IsActive(target)
        else:
            stream = client.StreamIsActive(target)
            next(stream)
            stream.cancel()
    except grpc.RpcError:
        pass


QWEN, LLAMA = Ask("GetMetrics", "default", {"workload": "qwen3"}), Ask("GetMetrics", "ml", {"workload": "llama"})


class Recorded(NamedTuple):
    """One row: what is published, the calls in order, the workloads left with a decision time, the counts."""

    id: str
    published: dict[str, tuple[int, float]]  # workload -> (desired, age in seconds)
    asks: list[Ask]
    dated: set[str]
    counts: Mapping[tuple[str, str], float]  # (workload, state) -> values served


RECORDED = [Recorded(*row) for row in [
    ("decided-exports-its-time", {"qwen3": (7, FRESH)}, [QWEN, QWEN], {"qwen3"}, {("qwen3", "decided"): 2}),
    # served however old, and said to be that old
    ("a-week-old-decision-exports-its-time", {"qwen3": (4, WEEK_S)}, [QWEN], {"qwen3"}, {("qwen3", "decided"): 1}),
    ("undecided-counts-and-has-no-time", {"qwen3": (7, FRESH)}, [LLAMA] * 3, set(), {("llama", "undecided"): 3}),
    ("decided-and-undecided-side-by-side", {"qwen3": (7, FRESH)}, [QWEN, LLAMA], {"qwen3"},
     {("qwen3", "decided"): 1, ("llama", "undecided"): 1}),
    # the placeholders' ScaledObject reads the same decision: its value counts for the workload too
    ("the-standby-metric-counts", {"qwen3": (7, FRESH)},
     [Ask("GetMetrics", "default", STANDBY, STANDBY_METRIC)], {"qwen3"}, {("qwen3", "decided"): 1}),
    ("namespace-from-metadata", {"llama": (3, FRESH)}, [Ask("GetMetrics", "default", {"workload": "llama",
                                                                                        "namespace": "ml"})],
     {"llama"}, {("llama", "decided"): 1}),
    # KEDA asks GetMetrics then IsActive at each poll: the poll is counted once, by GetMetrics
    ("is-active-and-streams-are-not-counted", {"qwen3": (7, FRESH)},
     [Ask("IsActive", "default", {"workload": "qwen3"}), Ask("IsActive", "ml", {"workload": "llama"}),
      Ask("StreamIsActive", "default", {"workload": "qwen3"}), Ask("StreamIsActive", "ml", {"workload": "llama"})],
     set(), {}),
    ("made-up-names-add-no-series", {"qwen3": (7, FRESH)},
     [Ask("GetMetrics", "default", {"workload": name}) for name in MADE_UP]
     + [Ask("IsActive", "default", {"workload": name}) for name in MADE_UP[:10]] + [QWEN],
     {"qwen3"}, {("qwen3", "decided"): 1}),
    ("a-workload-of-another-namespace-is-not-served", {"llama": (3, FRESH)},
     [Ask("GetMetrics", "default", {"workload": "llama"})], set(), {}),
    ("a-profile-not-autoscaled-is-not-served", {}, [Ask("GetMetrics", "default", {"workload": "batch"})], set(), {}),
    ("an-unknown-metric-is-not-served", {"qwen3": (7, FRESH)},
     [Ask("GetMetrics", "default", {"workload": "qwen3"}, f"s0-{METRIC_NAME}")], set(), {}),
    ("a-malformed-trigger-is-not-served", {}, [Ask("GetMetrics", "default", {"workload": "Qwen_3"}),
                                               Ask("GetMetrics", "default", {})], set(), {}),
]]


@pytest.mark.integration
@pytest.mark.parametrize("row", RECORDED, ids=[r.id for r in RECORDED])
def test_what_get_metrics_served_is_measured_per_workload(row: Recorded, redis_server: RedisServer,
                                                          tmp_path: Path) -> None:
    publish(redis_server.url, tmp_path, row.published)
    client = connect(redis_server.url, tmp_path)
    stored = DecisionStore(client).published_entries()
    client.close()
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel:
        assert served_series(running) == expected_served({}, {})  # every counter from the start, no time yet
        keda = stub(channel)
        for ask in row.asks:
            asked(keda, ask)
        dated = {w: v for w, v in stored.items() if w in row.dated and isinstance(v, Published)}
        assert set(dated) == row.dated
        assert served_series(running) == expected_served(dated, row.counts)


def publish_with_llama_unreadable(redis_url: str, tmp_path: Path) -> None:
    """qwen3 decided (7), llama's entry one no decoder takes (:data:`BAD_ENTRY`)."""
    publish(redis_url, tmp_path, {"qwen3": (7, FRESH)})
    client = connect(redis_url, tmp_path)
    client.hset(DecisionStore(client).published_key, "llama", BAD_ENTRY)
    client.close()


@pytest.mark.integration
def test_an_unreadable_entry_is_not_measured(redis_server: RedisServer, tmp_path: Path) -> None:
    publish_with_llama_unreadable(redis_server.url, tmp_path)
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel:
        asked(stub(channel), LLAMA)  # DATA_LOSS: no value served, nothing recorded
        assert served_series(running) == expected_served({}, {})


def watched_policy(redis_url: str, tmp_path: Path) -> tuple[Path, KedaSettings]:
    """qwen3 decided (5), and settings whose policy is a file the server follows (edit it to change it)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text())
    publish(redis_url, tmp_path, {"qwen3": (5, FRESH)})
    return policy, KedaSettings(policy=make_policy(), listen="127.0.0.1:0", watch_interval_s=0.02, grace_s=1.0,
                                policy_path=policy)


@pytest.mark.integration
def test_a_policy_edit_drops_the_time_of_a_workload_no_longer_served(redis_server: RedisServer,
                                                                     tmp_path: Path) -> None:
    policy, keda = watched_policy(redis_server.url, tmp_path)
    with serving(keda, redis_server.url, tmp_path) as running, grpc.insecure_channel(running.address) as channel:
        asked(stub(channel), QWEN)
        assert (TIME, (("api", "keda"), ("workload", "qwen3"))) in served_series(running)
        renamed = policy.with_name("renamed.yaml")
        renamed.write_text(policy_text().replace("name: qwen3", "name: qwen4"))
        renamed.replace(policy)  # an atomic swap, as kubelet updates a ConfigMap volume
        wait_for(lambda: "qwen4" in running.server.board.workloads, "the edited policy taken")
        asked(stub(channel), QWEN)  # NOT_FOUND now
        # no time stays behind for qwen3 (an alert would age it for ever); its counters stay, as counters do
        assert served_series(running) == expected_served({}, {("qwen3", "decided"): 1},
                                                         ("qwen3", "qwen4", "llama"))


# ---- one unreadable published entry: DATA_LOSS for its own workload, the others as usual -------------

#: What a hand-edited entry for llama holds: a window that overflows every integer.
BAD_ENTRY = '{"desired":1,"load":1,"unit":"requests/s","t":1,"window":1e999,"token":1}'


class Spoiled(NamedTuple):
    """One row: a call with llama's entry unreadable and qwen3's fine, and what it must answer."""

    id: str
    call: str
    namespace: str
    workload: str
    expected: Any  # a value (GetMetrics), a bool (IsActive), "spec", or (StatusCode, words)


UNREADABLE = "the published metrics of 'llama' are unreadable (window: Input should be a finite number)"
SPOILED = [Spoiled(*row) for row in [
    ("other-workload-metrics", "GetMetrics", "default", "qwen3", 7),
    ("other-workload-active", "IsActive", "default", "qwen3", True),
    ("bad-workload-metrics", "GetMetrics", "ml", "llama", (grpc.StatusCode.DATA_LOSS, UNREADABLE)),
    ("bad-workload-active", "IsActive", "ml", "llama", (grpc.StatusCode.DATA_LOSS, UNREADABLE)),
    ("bad-workload-stream", "StreamIsActive", "ml", "llama", (grpc.StatusCode.DATA_LOSS, UNREADABLE)),
    ("bad-workload-spec", "GetMetricSpec", "ml", "llama", "spec"),  # from the policy alone
]]


@pytest.mark.integration
@pytest.mark.parametrize("row", SPOILED, ids=[r.id for r in SPOILED])
def test_an_unreadable_entry_spoils_only_its_own_workload(row: Spoiled, redis_server: RedisServer,
                                                          tmp_path: Path) -> None:
    publish_with_llama_unreadable(redis_server.url, tmp_path)
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel:
        keda = stub(channel)
        target = ref(row.namespace, {"workload": row.workload})
        try:
            if row.call == "GetMetrics":
                got: Any = keda.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=target, metricName=METRIC_NAME)
                                           ).metricValues[0].metricValue
            elif row.call == "IsActive":
                got = keda.IsActive(target).result
            elif row.call == "StreamIsActive":
                got = next(keda.StreamIsActive(target)).result
            else:
                got = "spec" if keda.GetMetricSpec(target).metricSpecs[0].targetSize == 1 else None
        except grpc.RpcError as exc:
            assert isinstance(row.expected, tuple), f"{row.call} failed: {exc.code()} {exc.details()}"
            assert exc.code() == row.expected[0]
            assert row.expected[1] in (exc.details() or ""), exc.details()
        else:
            assert got == row.expected
        # the store is readable: the server stays SERVING and its board reads every other workload
        assert health_of(channel) == health_pb2.HealthCheckResponse.SERVING
        wait_for(lambda: running.server.board.published is not None, "the board's first read")
        assert running.server.board.healthy is True


#: (id, the JSON of llama's entry with a replica count out of 0..2**31-1, the words of the DATA_LOSS)
OUT_OF_RANGE = [
    pytest.param('{"desired":' + "9" * 401 + ',"load":1,"unit":"requests/s","t":1,"window":1,"token":1}',
                 "desired: Input should be less than or equal to 2147483647", id="desired-401-digits"),
    pytest.param('{"desired":9223372036854775808,"load":1,"unit":"requests/s","t":1,"window":1,"token":1}',
                 "desired: Input should be less than or equal to 2147483647", id="desired-past-int64"),
    pytest.param('{"desired":-7,"load":1,"unit":"requests/s","t":1,"window":1,"token":1}',
                 "desired: Input should be greater than or equal to 0", id="desired-negative"),
    pytest.param('{"desired":1,"load":1,"unit":"requests/s","t":1,"window":1,"token":1,"standby":' + "9" * 401 + "}",
                 "standby: Input should be less than or equal to 2147483647", id="standby-401-digits"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("entry", "words"), OUT_OF_RANGE)
def test_a_replica_count_out_of_range_is_data_loss(entry: str, words: str, redis_server: RedisServer,
                                                   tmp_path: Path) -> None:
    # KEDA's value is an int64 and Kubernetes' replicas an int32: a count outside them was no
    # UNKNOWN ("Value out of range", an OverflowError) and a negative one no silent 0, but unreadable
    client = connect(redis_server.url, tmp_path)
    client.hset(DecisionStore(client).published_key, "llama", entry)
    client.close()
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel:
        keda = stub(channel)
        for metric in (METRIC_NAME, STANDBY_METRIC):
            with pytest.raises(grpc.RpcError) as raised:
                keda.GetMetrics(pb.GetMetricsRequest(
                    scaledObjectRef=ref("ml", {"workload": "llama", "metric": metric}), metricName=metric))
            assert raised.value.code() == grpc.StatusCode.DATA_LOSS, raised.value.details()
            assert words in (raised.value.details() or "")
        with pytest.raises(grpc.RpcError) as raised:
            keda.IsActive(ref("ml", {"workload": "llama"}))
        assert raised.value.code() == grpc.StatusCode.DATA_LOSS, raised.value.details()


# ---- a caller's long strings: quoted cut short, the right status code back --------------------------------

#: (ScaledObject namespace, name, trigger metadata, metricName, the status, words of its message)
LONG_STRINGS = [
    pytest.param("default", "so", {"workload": "qwen3"}, "m" * 3_000_000, grpc.StatusCode.NOT_FOUND,
                 "no metric 'mmmm", id="metric-name-of-3m-characters"),
    pytest.param("default", "so", {"workload": "w" * 1_000_000}, METRIC_NAME, grpc.StatusCode.INVALID_ARGUMENT,
                 "is longer than a name", id="workload-of-1m-characters"),
    pytest.param("default", "so", {"workload": "qwen3", "namespace": "n" * 1_000_000}, METRIC_NAME,
                 grpc.StatusCode.INVALID_ARGUMENT, "is not a namespace name", id="trigger-namespace-of-1m-characters"),
    pytest.param("n" * 1_000_000, "so", {"workload": "qwen3"}, METRIC_NAME, grpc.StatusCode.NOT_FOUND,
                 "no autoscaled workload 'qwen3' in namespace 'nnnn", id="scaledobject-namespace-of-1m-characters"),
    pytest.param("default", "s" * 1_000_000, {"workload": "nosuch"}, METRIC_NAME, grpc.StatusCode.NOT_FOUND,
                 "no autoscaled workload 'nosuch'", id="scaledobject-name-of-1m-characters"),
    pytest.param("default", "so", {f"key-{i}": "" for i in range(50_000)}, METRIC_NAME,
                 grpc.StatusCode.INVALID_ARGUMENT, "(+49990 more)", id="50000-metadata-keys"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("namespace", "name", "metadata", "metric", "code", "words"), LONG_STRINGS)
def test_a_callers_long_strings_are_quoted_cut_short(  # noqa: PLR0917 (one table row)
        namespace: str, name: str, metadata: dict[str, str], metric: str, code: grpc.StatusCode, words: str,
        redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # all of the string went into the status message (past gRPC's metadata limit: the client got
    # RESOURCE_EXHAUSTED), the log line and the set of messages logged once (the same text)
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel, pytest.raises(grpc.RpcError) as raised:
        stub(channel).GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(namespace, metadata, name=name),
                                                      metricName=metric))
    details = raised.value.details() or ""
    assert raised.value.code() == code, details[:300]
    assert words in details, details
    assert len(details) < 2000
    assert "more characters)" in details or "more)" in details
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("extender.keda")]
    assert logged and all(len(line) < 2000 for line in logged)


# ---- Redis down: UNAVAILABLE, health NOT_SERVING, back when it is back ---------------------------------


def health_of(channel: grpc.Channel, service: str = "") -> Any:
    checker = health_pb2_grpc.HealthStub(channel)
    return checker.Check(health_pb2.HealthCheckRequest(service=service)).status


@pytest.mark.integration
def test_redis_outage_is_unavailable_and_not_serving(redis_server: RedisServer, tmp_path: Path) -> None:
    publish(redis_server.url, tmp_path, {"qwen3": (6, FRESH)})
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel:
        client = stub(channel)
        metrics = pb.GetMetricsRequest(scaledObjectRef=ref("default", {"workload": "qwen3"}), metricName=METRIC_NAME)
        assert client.GetMetrics(metrics).metricValues[0].metricValue == 6
        assert health_of(channel) == health_pb2.HealthCheckResponse.SERVING
        assert health_of(channel, "externalscaler.ExternalScaler") == health_pb2.HealthCheckResponse.SERVING

        redis_server.kill()
        calls: list[Callable[[], Any]] = [lambda: client.GetMetrics(metrics),
                                          lambda: client.IsActive(metrics.scaledObjectRef)]
        for call in calls:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "the scaler's decisions cannot be read" in (caught.value.details() or "")
        # the spec comes from the policy alone: KEDA can still build its HPA
        assert client.GetMetricSpec(metrics.scaledObjectRef).metricSpecs[0].targetSize == 1
        wait_for(lambda: health_of(channel) == health_pb2.HealthCheckResponse.NOT_SERVING, "NOT_SERVING")
        assert health_of(channel, "externalscaler.ExternalScaler") == health_pb2.HealthCheckResponse.NOT_SERVING
        # alive all the same: the liveness probe must not restart a scaler that waits for Redis
        assert health_of(channel, LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING

        redis_server.restart()  # empty: nothing persisted
        wait_for(lambda: health_of(channel) == health_pb2.HealthCheckResponse.SERVING, "SERVING again")
        assert client.GetMetrics(metrics).metricValues[0].metricValue == 0  # undecided again


# ---- StreamIsActive -------------------------------------------------------------------------------


@pytest.mark.integration
def test_stream_sends_at_once_then_each_change_only(redis_server: RedisServer, tmp_path: Path) -> None:
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel:
        stream = stub(channel).StreamIsActive(ref("ml", {"workload": "llama"}))
        got = [next(stream).result]  # undecided, minReplicas 0: idle, sent at once
        board = running.server.board

        def seen(desired: int) -> Callable[[], bool]:
            return lambda: board.published is not None \
                and isinstance(value := board.published.get("llama"), Published) and value.desired == desired

        publish(redis_server.url, tmp_path, {"llama": (2, FRESH)})
        got.append(next(stream).result)
        # 2 -> 3 leaves it active: the board sees the change, the stream sends nothing for it
        publish(redis_server.url, tmp_path, {"llama": (3, FRESH)})
        wait_for(seen(3), "the board to read desired 3")
        publish(redis_server.url, tmp_path, {"llama": (0, FRESH)})
        got.append(next(stream).result)
        assert got == [False, True, False]
        stream.cancel()


@pytest.mark.integration
def test_stream_ends_not_found_when_the_policy_drops_the_workload(redis_server: RedisServer, tmp_path: Path) -> None:
    policy, keda = watched_policy(redis_server.url, tmp_path)
    with serving(keda, redis_server.url, tmp_path) as running, grpc.insecure_channel(running.address) as channel:
        client = stub(channel)
        stream = client.StreamIsActive(ref("default", {"workload": "qwen3"}))
        assert next(stream).result is True
        renamed = policy.with_name("renamed.yaml")
        renamed.write_text(policy_text().replace("name: qwen3", "name: qwen4"))
        renamed.replace(policy)  # an atomic swap, as kubelet updates a ConfigMap volume
        with pytest.raises(grpc.RpcError) as caught:
            next(stream)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no autoscaled workload 'qwen3'" in (caught.value.details() or "")
        assert client.IsActive(ref("default", {"workload": "qwen4"})).result is True  # the new name is served


@pytest.mark.integration
def test_a_stopping_server_ends_streams_cleanly(redis_server: RedisServer, tmp_path: Path) -> None:
    with serving(settings(), redis_server.url, tmp_path) as running, \
            grpc.insecure_channel(running.address) as channel:
        stream = stub(channel).StreamIsActive(ref("default", {"workload": "qwen3"}))
        assert next(stream).result is True
        running.call(running.server.stop())
        assert list(stream) == []  # ended with OK: KEDA reconnects (to another replica) after 2 s
        assert stream.code() == grpc.StatusCode.OK


# ---- TLS and mutual TLS ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class Tls(NamedTuple):
    id: str
    mutual: bool  # the server requires client certificates (--client-ca)
    trust: str  # the CA the client trusts (a Pki attribute)
    client: str | None  # the client certificate it presents (a Pki attribute)
    ok: bool


TLS_ROWS = [
    Tls("tls", False, "server_ca", None, True),
    Tls("tls-client-cert-not-needed", False, "server_ca", "client", True),
    Tls("tls-untrusted-server", False, "client_ca", None, False),
    Tls("mtls", True, "server_ca", "client", True),
    Tls("mtls-without-client-cert", True, "server_ca", None, False),
    Tls("mtls-rogue-client-cert", True, "server_ca", "rogue", False),
    Tls("mtls-cert-of-another-ca", True, "server_ca", "front_proxy", False),
]


def tls_channel(address: str, pki: Pki, trust: str | None, client: str | None) -> grpc.Channel:
    if trust is None:
        return grpc.insecure_channel(address)
    cert = getattr(pki, client) if client else None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=getattr(pki, trust).cert.read_bytes(),
        private_key=cert.key.read_bytes() if cert else None,
        certificate_chain=cert.cert.read_bytes() if cert else None)
    return grpc.secure_channel(address, credentials)


@pytest.mark.integration
@pytest.mark.parametrize("row", TLS_ROWS, ids=[r.id for r in TLS_ROWS])
def test_tls(row: Tls, pki: Pki, redis_server: RedisServer, tmp_path: Path) -> None:
    publish(redis_server.url, tmp_path, {"qwen3": (9, FRESH)})
    tls = TlsFiles(pki.server.cert, pki.server.key, pki.client_ca.cert if row.mutual else None)
    with serving(settings(tls=tls), redis_server.url, tmp_path) as running, \
            tls_channel(running.address, pki, row.trust, row.client) as channel, \
            grpc.insecure_channel(running.address) as plain:
        target = ref("default", {"workload": "qwen3"})
        if row.ok:
            assert stub(channel).IsActive(target, timeout=SETTLE_S).result is True
        else:
            with pytest.raises(grpc.RpcError) as caught:
                stub(channel).IsActive(target, timeout=SETTLE_S)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as caught:  # and never plaintext on a TLS port
            stub(plain).IsActive(target, timeout=SETTLE_S)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.integration
def test_renewed_certificates_are_used_without_a_restart(pki: Pki, redis_server: RedisServer, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    cert.write_bytes(pki.server.cert.read_bytes())
    key.write_bytes(pki.server.key.read_bytes())
    renewed_ca = make_ca(tmp_path, "renewed-ca", "renewed-server-ca")
    renewed = make_cert(tmp_path, "renewed", renewed_ca, "/CN=extender-keda-scaler", server=True)
    target = ref("default", {"workload": "qwen3"})

    def works(ca: Path) -> bool:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        with grpc.secure_channel(running.address, credentials) as channel:  # a new channel: a new handshake
            try:
                return bool(stub(channel).IsActive(target, timeout=SETTLE_S).result)
            except grpc.RpcError:
                return False

    with serving(settings(tls=TlsFiles(cert, key)), redis_server.url, tmp_path) as running:
        assert works(pki.server_ca.cert)
        assert not works(renewed_ca.cert)
        for source, dest in ((renewed.key, key), (renewed.cert, cert)):  # written in place, as a renewal is
            staged = dest.with_suffix(".new")
            staged.write_bytes(source.read_bytes())
            staged.replace(dest)
        assert works(renewed_ca.cert)
        assert not works(pki.server_ca.cert)
        cert.write_text("not a certificate\n")  # a broken renewal keeps the last good one
        assert works(renewed_ca.cert)


# ---- the command ----------------------------------------------------------------------------------

USAGE = [
    ("no-tls-choice", ["keda-scaler", "--policy", "p.yaml"], 2, "or --plaintext"),
    ("cert-without-key", ["keda-scaler", "--policy", "p.yaml", "--tls-cert", "c.pem"], 2, "go together"),
    ("ca-without-cert", ["keda-scaler", "--policy", "p.yaml", "--client-ca", "ca.pem", "--plaintext"], 2,
     "--tls-client-ca needs --tls-cert"),
    ("plaintext-and-tls", ["keda-scaler", "--policy", "p.yaml", "--plaintext", "--tls-cert", "c", "--tls-key", "k"],
     2, "exclude each other"),
    ("health-on-the-serving-port", ["keda-scaler", "--policy", "p.yaml", "--plaintext", "--listen", ":9090",
                                    "--health-listen", "0.0.0.0:9090"], 2, "--health-listen must differ"),
    ("metrics-on-the-health-port", ["keda-scaler", "--policy", "p.yaml", "--plaintext", "--health-listen", ":9091",
                                    "--metrics-bind", "0.0.0.0:9091"], 2, "--metrics-bind must differ"),
    ("missing-policy", ["keda-scaler", "--policy", "/nonexistent/p.yaml", "--plaintext"], 1, "cannot read"),
]


@pytest.mark.parametrize(("argv", "code", "words"), [u[1:] for u in USAGE], ids=[u[0] for u in USAGE])
def test_usage_errors(argv: list[str], code: int, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == code
    assert words in capsys.readouterr().err


def test_bad_listen_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["keda-scaler", "--policy", "p.yaml", "--plaintext", "--listen", "nowhere"])
    assert exited.value.code == 2
    assert "is not HOST:PORT" in capsys.readouterr().err


def test_unreadable_tls_files_are_refused_before_serving(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text())
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    argv = ["keda-scaler", "--policy", str(policy), "--tls-cert", str(empty), "--tls-key", str(empty)]
    assert cli.main(argv) == 1
    assert f"{empty} holds no PEM block" in capsys.readouterr().err


def test_a_policy_without_autoscaling_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    text = policy_text()
    policy.write_text(text[:text.index("profiles:")] + "profiles: []\n")
    assert cli.main(["keda-scaler", "--policy", str(policy), "--plaintext"]) == 1
    assert "nothing to serve" in capsys.readouterr().err


@pytest.mark.integration
def test_a_taken_port_is_an_error_not_a_shared_port(redis_server: RedisServer, tmp_path: Path) -> None:
    with serving(settings(), redis_server.url, tmp_path) as first:
        taken = KedaSettings(policy=make_policy(), listen=first.address)
        client = connect(redis_server.url, tmp_path)
        second = KedaServer(taken, DecisionStore(client))
        with pytest.raises(Exception, match=f"cannot listen on {first.address}"):
            first.call(second.start())
        client.close()


@pytest.mark.integration
def test_the_process_serves_and_stops_on_sigterm(redis_server: RedisServer, pki: Pki, tmp_path: Path) -> None:
    """``python -m extender.keda keda-scaler`` with mutual TLS: a call, an open stream, SIGTERM, exit 0."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text())
    publish(redis_server.url, tmp_path, {"qwen3": (8, FRESH)})
    port, probe_port = free_port(), free_port()
    log = tmp_path / "keda.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "extender.keda", "keda-scaler", "--policy", str(policy),
             "--redis-url", redis_server.url, "--listen", f"127.0.0.1:{port}",
             "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
             "--client-ca", str(pki.client_ca.cert), "--health-listen", f"127.0.0.1:{probe_port}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        with tls_channel(f"127.0.0.1:{port}", pki, "server_ca", "client") as channel, \
                grpc.insecure_channel(f"127.0.0.1:{probe_port}") as probe:  # kubelet's probe: no TLS
            grpc.channel_ready_future(channel).result(timeout=SETTLE_S)
            client = stub(channel)
            metrics = pb.GetMetricsRequest(scaledObjectRef=ref("default", {"workload": "qwen3"}),
                                           metricName=METRIC_NAME)
            assert client.GetMetrics(metrics).metricValues[0].metricValue == 8
            assert health_of(probe) == health_pb2.HealthCheckResponse.SERVING
            assert health_of(probe, LIVENESS_SERVICE) == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as caught:  # the probe port tells nothing else
                stub(probe).GetMetrics(metrics)
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
            stream = client.StreamIsActive(metrics.scaledObjectRef)
            assert next(stream).result is True
            process.send_signal(signal.SIGTERM)
            assert list(stream) == []
            assert stream.code() == grpc.StatusCode.OK
        assert process.wait(timeout=SETTLE_S) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert "serving externalscaler.ExternalScaler" in text and "mutual TLS" in text
    assert "stopping (grace 5s)" in text
