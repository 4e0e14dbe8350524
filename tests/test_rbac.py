"""The chart's RBAC grants exactly what the sync, the agent and the warmer call: every call allowed, every grant used.

Two checks that back each other up:

* dynamic: the sync and the agent's node labeler run against the API double with the RBAC objects the
  chart renders (deploy/helm/extender, with ``agent.labelNodes``) *enforced* and each component
  authenticated as its ServiceAccount (a bearer token per account). The scenario walks every code
  path that calls the API: first list, watch, a cut stream (re-watch), 410 Gone (relist), label set
  and label removal. Any forbidden call fails it,
  and the (verb, group, resource) triples each account used must equal what its roles grant. The
  cache warmer gets the same treatment as the scaler's account: Jobs created, failed (an Event),
  retried (deleted), confirmed (deleted), and a new node tainted and untainted.
* static: every method of the official client named in extender/kube is in a table of the API
  calls it makes; the table's calls must equal the grants. A new client call anywhere therefore
  fails this test until the table and the chart say what it needs.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extender.agent import commands as agent_commands
from extender.arguments import Parser
from extender.kube import commands as sync_commands
from extender.kube.client import KubeClient
from extender.kube.errors import KubeApiError
from extender.kube.labels import NodeLabeler
from extender.kube.sync import ClusterSync, SyncSettings
from extender.state import InventoryStore, connect
from extender.state.observations import ObservationStore
from extender.state.sources import SourceStore
from tests import chart
from tests.conftest import RedisServer
from tests.kube_double import Authorizer, KubeDouble
from tests.kube_double.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "kube-system"
SYNC_USER = f"system:serviceaccount:{NAMESPACE}:extender-sync"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:extender-agent"
#: The warmer runs inside `extender scale`, as the scaler's account.
WARMER_USER = f"system:serviceaccount:{NAMESPACE}:extender-scaler"
G5_12 = {"node.kubernetes.io/instance-type": "g5.12xlarge"}

Triple = tuple[str, str, str]  # (verb, API group, resource[/subresource])

#: Every official-client method extender/kube calls, and the API requests each one makes.
#: (list_* serve both list and, through kubernetes.watch.Watch, watch.)
CLIENT_CALLS: dict[str, set[Triple]] = {
    "list_node": {("list", "", "nodes"), ("watch", "", "nodes")},
    "list_pod_for_all_namespaces": {("list", "", "pods"), ("watch", "", "pods")},
    "list_namespaced_pod": {("list", "", "pods"), ("watch", "", "pods")},
    "read_node": {("get", "", "nodes")},
    "patch_node": {("patch", "", "nodes")},
    "list_namespaced_job": {("list", "batch", "jobs")},
    "create_namespaced_job": {("create", "batch", "jobs")},
    "delete_namespaced_job": {("delete", "batch", "jobs")},
    "create_namespaced_event": {("create", "", "events")},
    "read_namespaced_pod_log": {("get", "", "pods/log")},
}
#: Which component makes which call.
CALLS_BY_USER: dict[str, set[str]] = {
    SYNC_USER: {"list_node", "list_pod_for_all_namespaces", "read_namespaced_pod_log"},
    AGENT_USER: {"read_node", "patch_node"},
    WARMER_USER: {"list_namespaced_job", "create_namespaced_job", "delete_namespaced_job", "create_namespaced_event",
                  "list_node", "read_node", "patch_node",
                  "list_pod_for_all_namespaces", "list_namespaced_pod"},  # the scaler's own (SCALER_ONLY)
}
#: What the scaler itself (not its warmer) calls as the same account: its replicas, each tick
#: (run for real in tests/test_external_metrics_deploy.py).
SCALER_ONLY: set[Triple] = {("list", "", "pods")}


#: Methods a user calls only as a plain list: the warmer lists Nodes once at start (taint
#: bookkeeping) and never watches them; the scaler lists its pods each tick (in the workload's
#: namespace when it names one, else in all).
LIST_ONLY: dict[str, set[str]] = {WARMER_USER: {"list_node", "list_pod_for_all_namespaces", "list_namespaced_pod"}}


#: The chart with every grant the code can use: the agent labelling Nodes, the warmer tainting them,
#: the sync reading engine logs.
LABELLING = {"agent__labelNodes": "true"}
EVERYTHING = {**LABELLING, "sync__readEngineLogs": "true"}


@pytest.fixture(scope="module")
def authorizer() -> Authorizer:
    return Authorizer(chart.rendered(**EVERYTHING))


def granted(authorizer: Authorizer, user: str) -> set[Triple]:
    """Every (verb, group, resource) the user's roles grant; our roles use no wildcards."""
    out: set[Triple] = set()
    for _scope, rule in authorizer.rules_for(user):
        assert "*" not in rule.verbs | rule.api_groups | rule.resources, "least privilege: no wildcards"
        out |= {(v, g, r) for v in rule.verbs for g in rule.api_groups for r in rule.resources}
    return out


# ---- the manifests ------------------------------------------------------------------------------


def container_args(kind: str, name: str, **values: str) -> tuple[dict[str, Any], list[str]]:
    workload = chart.one(chart.rendered(**values), kind, name)
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return workload, [*container["command"][1:], *container["args"]]


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="extender")
    sub = p.add_subparsers(dest="command", required=True)
    agent_commands.register(sub)
    sync_commands.register(sub)
    return p


@pytest.mark.parametrize(
    ("kind", "account", "command"),
    [
        pytest.param("DaemonSet", "extender-agent", "agent", id="agent"),
        pytest.param("Deployment", "extender-sync", "sync", id="sync"),
    ],
)
def test_workloads_run_our_commands_as_their_accounts(kind: str, account: str, command: str) -> None:
    workload, args = container_args(kind, account)
    assert workload["metadata"]["namespace"] == NAMESPACE
    assert workload["spec"]["template"]["spec"]["serviceAccountName"] == account
    parsed = parser().parse_args(args)  # the deployed arguments are valid for the real parser
    assert parsed.command == command
    service_accounts = {(d["metadata"]["namespace"], d["metadata"]["name"])
                        for d in chart.rendered() if d["kind"] == "ServiceAccount"}
    assert (NAMESPACE, account) in service_accounts


@pytest.mark.parametrize("label", [False, True], ids=["default", "labelNodes"])
def test_the_agent_gets_a_token_and_a_node_grant_only_when_it_labels_nodes(label: bool) -> None:
    values = LABELLING if label else {}
    workload, args = container_args("DaemonSet", "extender-agent", **values)
    assert parser().parse_args(args).label_nodes is label
    assert workload["spec"]["template"]["spec"]["automountServiceAccountToken"] is label
    roles = Authorizer(chart.rendered(**values)).rules_for(AGENT_USER)
    assert bool(roles) is label, "without --label-nodes the agent is granted nothing"


def test_the_agent_mounts_everything_read_only() -> None:
    workload, args = container_args("DaemonSet", "extender-agent")
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}  # the cache root and the policy
    assert all(m["readOnly"] is True for m in mounts.values()), mounts
    parsed = parser().parse_args(args)
    assert str(parsed.cache_root) in mounts and parsed.policy.parent == Path("/etc/extender") and len(mounts) == 2


# ---- static: the calls in the code ---------------------------------------------------------------


def test_every_client_call_in_the_code_is_in_the_table(authorizer: Authorizer) -> None:
    # delegation.py (TokenReview, SubjectAccessReview, the extension-apiserver-authentication
    # ConfigMap) is the External Metrics API's delegated auth: its grants are Kubernetes' built-in
    # roles the chart binds (templates/external-metrics.yaml), checked by tests/test_external_metrics_deploy.py.
    kube = sorted(p for p in (ROOT / "extender" / "kube").glob("*.py") if p.name != "delegation.py")
    source = "\n".join(p.read_text() for p in kube)
    called = set(re.findall(r"_(?:core|batch)\.(\w+)", source))
    assert called == set(CLIENT_CALLS), "a new client call: add it to CLIENT_CALLS and to the chart's RBAC"
    # only these API classes are used (any other would need its own rows)
    assert set(re.findall(r"k8s\.(\w+Api)\(", source)) == {"CoreV1Api", "BatchV1Api"}
    for user, methods in CALLS_BY_USER.items():
        needed = set().union(*(CLIENT_CALLS[m] for m in methods))
        # a list_* the user only calls as a plain list (never through Watch) needs no watch grant
        needed -= {("watch", g, r) for m in LIST_ONLY.get(user, set()) for _, g, r in CLIENT_CALLS[m]}
        assert granted(authorizer, user) == needed, user


# ---- dynamic: the code run against the double with the RBAC enforced ------------------------------


@pytest.fixture
def enforcing(authorizer: Authorizer) -> Iterator[KubeDouble]:
    with KubeDouble.running(bookmark_interval_s=0.05, authorizer=authorizer,
                            tokens={"sync-token": SYNC_USER, "agent-token": AGENT_USER,
                                    "warmer-token": WARMER_USER}) as double:
        yield double


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}}


def pod(name: str, node_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "serving", "labels": {"extender.io/workload": "llama3-8b"}},
            "spec": {"nodeName": node_name,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def engine_log_sync(kube: KubeClient, sources: SourceStore) -> ClusterSync:
    """A sync whose policy calibrates and reads llama3-8b's engine log (container ``vllm``)."""
    from tests.test_calibration_sync import engine_log_policy

    return ClusterSync(kube, lambda: sources, engine_log_policy("{container: vllm}"),
                       SyncSettings(watch_timeout_s=60, backoff_initial_s=0.02, backoff_max_s=0.1))


def start_with_a_log(double: KubeDouble, sources: SourceStore, name: str, node_name: str) -> None:
    """A llama3-8b replica on ``node_name`` (its agent reporting) that starts, logs and turns Ready."""
    from extender.core.reports import AgentReport
    from tests.test_calibration_sync import VLLM_STARTUP, serving_pod
    from tests.test_sync import VLLM

    sources.report_agent(node_name, AgentReport(heartbeat=time.time(), ttl=600, images=VLLM))
    now = time.time()
    double.apply(serving_pod(name, node_name, scheduled=now))
    double.set_log("serving", name, "vllm", VLLM_STARTUP)
    double.apply(serving_pod(name, node_name, scheduled=now, ready=now + 5))


@pytest.mark.integration
def test_every_call_is_allowed_and_every_grant_is_used(
    enforcing: KubeDouble, authorizer: Authorizer, redis_server: RedisServer, tmp_path: Path
) -> None:
    double = enforcing
    double.apply(node("gpu-a", G5_12))
    double.apply(pod("p1", "gpu-a"))
    client = connect(redis_server.url, tmp_path)
    sync_kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "sync.kubeconfig", token="sync-token")))
    agent_kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "agent.kubeconfig", token="agent-token")))
    sources = SourceStore(InventoryStore(client))
    sync = engine_log_sync(sync_kube, sources)
    observations = ObservationStore(client)
    thread = threading.Thread(target=sync.run)
    thread.start()
    try:
        wait_until(lambda: sources.store.names() == {"gpu-a"}, what="the first list")
        wait_until(lambda: double.open_watches() >= 2, what="both watches")
        double.state.cut_watches()  # re-watch from the resourceVersion
        wait_until(lambda: sync.nodes.watches >= 2 and sync.pods.watches >= 2 and double.open_watches() >= 2,
                   what="both re-watches open on the server")
        double.state.expire_watches()  # 410: relist
        wait_until(lambda: sync.nodes.lists >= 2 and sync.pods.lists >= 2, what="relists")
        double.apply(node("gpu-b", G5_12))
        wait_until(lambda: sources.store.names() == {"gpu-a", "gpu-b"}, what="a watched change")
        start_with_a_log(double, sources, "p2", "gpu-a")  # a recorded start: its engine's log read
        wait_until(lambda: [o.phases is not None for o in observations.read().observations] == [True],
                   what="the start recorded with its engine's phases")

        labeler = NodeLabeler(agent_kube, "gpu-a")
        assert labeler.apply(["llama3-8b"])  # get + patch
        assert labeler.apply([])  # patch (removal)
    finally:
        sync.stop()
        thread.join(timeout=30)
        sync_kube.close()
        agent_kube.close()
        client.close()
    assert not thread.is_alive()

    forbidden = [r for r in double.requests if not authorizer.allowed(r)]
    assert forbidden == []
    for user in (SYNC_USER, AGENT_USER):
        used = {(verb, group, resource) for u, verb, group, resource in double.verbs_used() if u == user}
        assert used == granted(authorizer, user), user


@pytest.mark.integration
def test_a_call_outside_the_grants_is_refused(enforcing: KubeDouble, tmp_path: Path) -> None:
    """The check above is only as good as the enforcement: the sync's account may not patch nodes."""
    enforcing.apply(node("gpu-a"))
    kube = KubeClient.connect(str(enforcing.write_kubeconfig(tmp_path / "kc", token="sync-token")))
    try:
        with pytest.raises(KubeApiError) as excinfo:
            NodeLabeler(kube, "gpu-a").apply(["llama3-8b"])
        assert excinfo.value.status == 403
    finally:
        kube.close()


@pytest.mark.integration
def test_without_the_log_grant_starts_are_recorded_without_phases(redis_server: RedisServer, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The chart's default (sync.readEngineLogs off) with a policy that asks for engine logs: the API
    server refuses each read (403), every start is still recorded, and the cause is warned about once."""
    values = {k: v for k, v in EVERYTHING.items() if k != "sync__readEngineLogs"}
    chart_default = Authorizer(chart.rendered(**values))
    with KubeDouble.running(bookmark_interval_s=0.05, authorizer=chart_default,
                            tokens={"sync-token": SYNC_USER}) as double:
        double.apply(node("gpu-a", G5_12))
        client = connect(redis_server.url, tmp_path)
        kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "sync.kubeconfig", token="sync-token")))
        sources = SourceStore(InventoryStore(client))
        observations = ObservationStore(client)
        sync = engine_log_sync(kube, sources)
        thread = threading.Thread(target=sync.run)
        thread.start()
        try:
            wait_until(lambda: sources.store.names() == {"gpu-a"}, what="the first list")
            with caplog.at_level("WARNING", logger="extender.kube.observe"):
                for name in ("p1", "p2"):
                    start_with_a_log(double, sources, name, "gpu-a")
                wait_until(lambda: len(observations.read().observations) == 2, what="both starts recorded")
            recorded = observations.read().observations
        finally:
            sync.stop()
            thread.join(timeout=30)
            kube.close()
            client.close()
        assert not thread.is_alive()
        refused = [r for r in double.requests if r.subresource == "log"]
    assert len(refused) == 2 and not any(chart_default.allowed(r) for r in refused)
    assert [o.phases for o in recorded] == [None, None]
    warned = [r.getMessage() for r in caplog.records if r.name == "extender.kube.observe"]
    assert len(warned) == 1 and "403" in warned[0] and "sync.readEngineLogs" in warned[0], warned


@pytest.mark.integration
def test_every_warmer_call_is_allowed_and_every_grant_is_used(enforcing: KubeDouble, authorizer: Authorizer,
                                                              tmp_path: Path) -> None:
    from extender.core.warming import Expectation
    from extender.warm.loop import WarmLoop
    from tests.test_warm import GB, load, node
    from tests.test_warm_executor import TAINTING, finish, snap

    double = enforcing
    policy = load(**TAINTING)
    double.apply(node_object("gpu-a", {"pool": "gpu"}))  # joins now: young and cold
    kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "warmer.kubeconfig", token="warmer-token")))
    expect = [Expectation(workload="llm", replicas=1, within_s=600)]
    try:
        t = time.time()  # the double stamps creationTimestamp with its own clock
        loop = WarmLoop(policy, None, kube)

        def tick(now: float, *records: Any) -> Any:
            report = loop.tick(now, expect, snapshot=snap(policy, now, *records))
            assert report.errors == []
            return report

        report = tick(t, node("gpu-a", now=t))  # list nodes, taint (patch), list jobs, create
        (image,) = report.started
        finish(double, image, ok=False, at=t + 1)
        report = tick(t + 2, node("gpu-a", now=t + 2))  # an Event; the image backs off, the weights start
        assert report.failed == [image]
        (weights,) = report.started
        assert tick(t + 40, node("gpu-a", now=t + 40)).retried == [image]  # delete
        finish(double, weights, ok=True, at=t + 41)
        warm = node("gpu-a", now=t + 42, images=["example.com/llm:1"], weights={"llm/v1": 100 * GB})
        double.apply(node_object("gpu-b", {"pool": "gpu"}))
        report = tick(t + 42, warm, node("gpu-b", now=t + 42))  # confirm (delete); gpu-b: get; untaint gpu-a
        assert report.confirmed == [weights] and "gpu-a" in report.untainted
    finally:
        kube.close()
    assert [r for r in double.requests if not authorizer.allowed(r)] == []
    used = {(verb, group, resource) for u, verb, group, resource in double.verbs_used() if u == WARMER_USER}
    assert used == granted(authorizer, WARMER_USER) - SCALER_ONLY


def node_object(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {**node(name, labels), "spec": {"taints": []}}
