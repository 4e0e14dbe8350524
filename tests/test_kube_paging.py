"""Large lists are read page by page: every consumer keeps only what it needs of each page's objects;
and a reply that is not JSON is our error, never an exception that ends a reflector's thread.

A cluster's pods parsed into Python dicts take about six times their JSON (about 20 KiB each), so a
sync that held the whole list at once before keeping its few facts would need about 2 GiB for
100,000 pods, four times the chart's memory limit. Each consumer of a list (the sync's two
reflectors, the warmer's start-up look at the Nodes, the scaler's pod listing) must therefore have
read each object before the next page is even requested. Against the API double, which pages as the
real server does (``limit``, ``continue``, ``410 Expired`` for a token it forgot).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

import extender.kube.client as kube_client
import extender.kube.sync as kube_sync
import extender.scaler.pods as scaler_pods
from extender.core.backoff import Backoff
from extender.core.errors import KubeError
from extender.core.inventory import InventorySnapshot
from extender.core.policy import Policy
from extender.files import load_policy
from extender.kube.client import KubeClient
from extender.kube.delegation import Delegation
from extender.kube.reflector import Reflector
from extender.kube.sync import ASSIGNED_PODS, ClusterView
from extender.scaler.pods import label_selector, workload_pods
from extender.scaler.serve import KubePodLister
from extender.warm.metrics import WarmMetrics
from extender.warm.taints import NodeTainter
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
POLICY_FILE = ROOT / "policies" / "g5-pcie-fleet.yaml"
G5_12 = {"node.kubernetes.io/instance-type": "g5.12xlarge"}
LLAMA = {"extender.io/workload": "llama3-8b"}
PAGE = 2
OBJECTS = 5


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(POLICY_FILE)


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of :data:`PAGE` objects, so a handful of objects make several pages."""
    monkeypatch.setattr(kube_client, "PAGE_SIZE", PAGE)


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(G5_12)},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}, "capacity": {"nvidia.com/gpu": "4"}}}


def pod(name: str, namespace: str = "serving") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": LLAMA},
            "spec": {"nodeName": "n0", "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, seen: Callable[[], None]) -> None:
    """Call ``seen`` each time ``owner.name`` reads one object, then do what it did."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        seen()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def reflect(kube: KubeClient, view: ClusterView, resource: str) -> None:
    """One reflector's first list, then stop."""
    if resource == "nodes":
        reflector = Reflector(kube, "nodes", on_replace=view.replace_nodes, on_event=view.node_event)
    else:
        reflector = Reflector(kube, "pods", on_replace=view.replace_pods, on_event=view.pod_event,
                              field_selector=ASSIGNED_PODS)
    stop = threading.Event()
    thread = threading.Thread(target=reflector.run, args=(stop,))
    thread.start()
    try:
        assert reflector.synced.wait(30), "the first list never completed"
    finally:
        stop.set()
        reflector.interrupt()
        thread.join(30)
    assert not thread.is_alive()


def sync_nodes(kube: KubeClient, policy: Policy, monkeypatch: pytest.MonkeyPatch, seen: Callable[[], None]) -> int:
    spy(monkeypatch, kube_sync, "node_facts", seen)
    view = ClusterView(policy, "nvidia.com/gpu")
    reflect(kube, view, "nodes")
    return len(view.nodes)


def sync_pods(kube: KubeClient, policy: Policy, monkeypatch: pytest.MonkeyPatch, seen: Callable[[], None]) -> int:
    spy(monkeypatch, kube_sync, "pod_facts", seen)
    view = ClusterView(policy, "nvidia.com/gpu")
    reflect(kube, view, "pods")
    return len(view.pods)


def warmer_nodes(kube: KubeClient, policy: Policy, monkeypatch: pytest.MonkeyPatch,
                 seen: Callable[[], None]) -> int:
    spy(monkeypatch, NodeTainter, "_first_sight", seen)
    tainter = NodeTainter(kube, WarmMetrics(CollectorRegistry()))
    changes = tainter.reconcile(policy, InventorySnapshot.build(policy, []), 0.0, ())
    assert not changes.errors
    return len(tainter.seen)


def scaler_pods_of(kube: KubeClient, policy: Policy, monkeypatch: pytest.MonkeyPatch,
                   seen: Callable[[], None]) -> int:
    spy(monkeypatch, scaler_pods, "parse_pod", seen)
    profile = policy.profile("llama3-8b")
    return len(workload_pods(KubePodLister(kube).list_pods(label_selector(profile)), profile, None))


@pytest.mark.parametrize(("resource", "consume"), [
    pytest.param("nodes", sync_nodes, id="sync-nodes-reflector"),
    pytest.param("pods", sync_pods, id="sync-pods-reflector"),
    pytest.param("nodes", warmer_nodes, id="warmer-start-up-node-list"),
    pytest.param("pods", scaler_pods_of, id="scaler-workload-pods"),
])
def test_each_page_is_read_before_the_next_is_requested(
    double: KubeDouble, kube: KubeClient, policy: Policy, monkeypatch: pytest.MonkeyPatch, *,
    resource: str, consume: Callable[..., int],
) -> None:
    for i in range(OBJECTS):
        double.apply(node(f"n{i}") if resource == "nodes" else pod(f"p{i}"))
    pages_requested: list[int] = []
    read = consume(kube, policy, monkeypatch, lambda: pages_requested.append(double.count("list", resource)))
    assert read == OBJECTS
    # object i is read while its own page is the last one requested: pages 1,1,2,2,3 for 5 objects
    assert pages_requested == [i // PAGE + 1 for i in range(OBJECTS)]


def test_a_list_that_fails_midway_leaves_the_view_as_it_was(
    double: KubeDouble, kube: KubeClient, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = ClusterView(policy, "nvidia.com/gpu")
    view.replace_nodes([node("old")])
    for i in range(OBJECTS):
        double.apply(node(f"n{i}"))
    spy(monkeypatch, kube_sync, "node_facts", lambda: double.fail("list", "nodes", 500))
    with pytest.raises(KubeError, match="listing nodes: 500"):
        view.replace_nodes(kube.listing("nodes"))
    assert set(view.nodes) == {"old"}


def test_a_handler_that_stops_reading_midway_replaces_nothing(double: KubeDouble, kube: KubeClient,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """``on_replace`` must read the whole list: one that returns early would swap in a partial view
    and watch on from a resourceVersion it never reached, so the reflector refuses and lists again."""
    for i in range(OBJECTS):
        double.apply(node(f"n{i}"))
    calls: list[str] = []

    def first_only(items: Iterable[dict[str, Any]]) -> None:
        calls.append(next(iter(items))["metadata"]["name"])

    errors: list[str] = []
    reflector = Reflector(kube, "nodes", on_replace=first_only, on_event=lambda etype, obj: None,
                          backoff=Backoff(0.01, 0.02), note=lambda resource, what: errors.append(what))
    stop = threading.Event()
    thread = threading.Thread(target=reflector.run, args=(stop,))
    caplog.set_level("WARNING", logger="extender.kube.reflector")
    thread.start()
    try:
        wait_until(lambda: errors.count("error") >= 2, what="two refused partial lists")
    finally:
        stop.set()
        reflector.interrupt()
        thread.join(30)
    assert not thread.is_alive()
    assert calls[:2] == ["n0", "n0"]  # each try lists anew from the first object
    assert reflector.lists == 0 and not reflector.synced.is_set()
    assert reflector.resource_version == ""  # no watch from a list that was never read to the end
    assert ("listing nodes: the handler stopped reading after 1 object(s); a partial list cannot replace "
            "the view") in caplog.text


def test_an_expired_continue_token_lists_again_from_the_start(
    double: KubeDouble, kube: KubeClient, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``410 Expired`` on a later page (the list's snapshot was compacted): the reflector starts over."""
    for i in range(OBJECTS):
        double.apply(node(f"n{i}"))
    expired: list[bool] = []

    def expire_once() -> None:
        if not expired:
            expired.append(True)
            double.expire_continues()

    spy(monkeypatch, kube_sync, "node_facts", expire_once)
    view = ClusterView(policy, "nvidia.com/gpu")
    reflector = Reflector(kube, "nodes", on_replace=view.replace_nodes, on_event=view.node_event,
                          backoff=Backoff(0.01, 0.05))
    stop = threading.Event()
    thread = threading.Thread(target=reflector.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: len(view.nodes) == OBJECTS, what="every node after the relist")
        assert reflector.lists == 1  # the expired list did not count: only the one that completed
    finally:
        stop.set()
        reflector.interrupt()
        thread.join(30)
    assert not thread.is_alive()
    # page 1, page 2 refused with 410, then the three pages of the fresh list
    assert double.count("list", "nodes") == 5


@pytest.mark.parametrize(("namespace", "listed"), [
    pytest.param("serving", ["s0", "s1", "s2"], id="a-namespace-lists-only-its-own-pages"),
    pytest.param(None, ["o0", "o1", "s0", "s1", "s2"], id="no-namespace-lists-every-namespace"),
])
def test_the_scaler_lists_pods_in_the_workload_s_namespace(double: KubeDouble, kube: KubeClient,
                                                          namespace: str | None, listed: list[str]) -> None:
    """A workload with ``autoscaling.namespace`` costs one namespaced list a tick, paged like any other."""
    for i in range(3):
        double.apply(pod(f"s{i}"))
    for i in range(2):
        double.apply(pod(f"o{i}", namespace="other"))
    names = [p["metadata"]["name"] for p in KubePodLister(kube).list_pods("extender.io/workload=llama3-8b", namespace)]
    assert sorted(names) == listed
    lists = [r for r in double.requests if r.verb == "list" and r.resource == "pods"]
    assert [r.namespace for r in lists] == [namespace] * -(-len(listed) // PAGE)


def test_nodes_cannot_be_listed_in_a_namespace(kube: KubeClient) -> None:
    with pytest.raises(KubeError, match=r"^listing nodes: nodes belong to no namespace$"):
        kube.listing("nodes", namespace="serving")


class _NotJson(BaseHTTPRequestHandler):
    """Answers every request ``200`` with an HTML page, as a web console or a proxy's login page does."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b"<html><body>Please sign in</body></html>\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def do_PATCH(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def not_json(tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig pointing at a server that answers HTML."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotJson)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "x", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}))
    try:
        yield config
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.parametrize(("call", "action"), [
    pytest.param(lambda k: k.list("nodes"), "listing nodes", id="list"),
    pytest.param(lambda k: [*k.watch("nodes", "1", timeout_s=5)], "watching nodes", id="watch"),
    pytest.param(lambda k: k.get_node("a"), "reading node 'a'", id="get-node"),
    pytest.param(lambda k: k.patch_node("a", {"metadata": {"labels": {"x": "y"}}}), "patching node 'a'",
                 id="patch-node"),
    pytest.param(lambda k: k.create_job("warm", {"metadata": {"name": "j"}}), "creating job warm/j",
                 id="create-job"),
    pytest.param(lambda k: Delegation(k._api).review_token("t"), "TokenReview", id="token-review"),
])
def test_a_reply_that_is_not_json_is_our_error_naming_the_call(
    not_json: Path, call: Callable[[KubeClient], Any], action: str
) -> None:
    """Not ``ValueError``/``TypeError``: a reflector's thread retries our error but dies of those."""
    client = KubeClient.connect(str(not_json))
    try:
        with pytest.raises(KubeError, match=f"^{re.escape(action)}: the API server") as raised:
            call(client)
        assert "\n" not in str(raised.value)
    finally:
        client.close()


def test_a_reflector_keeps_retrying_a_server_that_answers_html(not_json: Path) -> None:
    client = KubeClient.connect(str(not_json))
    errors: list[str] = []

    def read_all(items: Iterable[dict[str, Any]]) -> None:
        for _ in items:
            pass

    reflector = Reflector(client, "nodes", on_replace=read_all,
                          on_event=lambda etype, obj: None, backoff=Backoff(0.01, 0.02),
                          note=lambda resource, what: errors.append(what) if what == "error" else None)
    stop = threading.Event()
    thread = threading.Thread(target=reflector.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: len(errors) >= 3 or not thread.is_alive(), what="three failed lists")
        assert thread.is_alive(), "the reflector's thread ended"
    finally:
        stop.set()
        reflector.interrupt()
        thread.join(30)
        client.close()
