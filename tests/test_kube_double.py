"""The API double, driven by the official ``kubernetes`` client (and kubectl) over real HTTP.

What later tests rely on: CRUD of every served kind, list + watch resumable by resourceVersion,
bookmarks, ``410 Gone`` after compaction, streams cut mid-chunk, selectors, the status subresource,
optimistic concurrency, RBAC decisions, and a clean stop (no thread, no listener left).
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client as _client
from kubernetes import config as _config
from kubernetes import watch as _watch

from tests.kube_double import Authorizer, KubeDouble
from tests.kube_double.waiting import wait_until

pytestmark = pytest.mark.integration

# the client is partly typed (pydantic models, untyped helpers); these tests drive it as a user would
k8s: Any = _client
k8s_config: Any = _config
k8s_watch: Any = _watch


@pytest.fixture
def api(double: KubeDouble, tmp_path: Path) -> Iterator[Any]:
    """An ApiClient built from a kubeconfig file, exactly as a user's would be."""
    kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
    api_client = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api_client
    finally:
        api_client.close()


def node(name: str, labels: dict[str, str] | None = None, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "status": status}


def pod(name: str, node_name: str = "", labels: dict[str, str] | None = None, phase: str = "Pending") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": phase}}


# ---- CRUD of every kind, one row per kind -----------------------------------------------------


@dataclass(frozen=True)
class KindCase:
    id: str
    body: dict[str, Any]
    create: Callable[[Any, dict[str, Any]], Any]
    read: Callable[[Any, str], Any]
    patch: Callable[[Any, str, dict[str, Any]], Any]
    delete: Callable[[Any, str], Any]


MERGE = {"_content_type": "application/merge-patch+json"}

KIND_CASES = [
    KindCase("node", node("n1"),
             lambda a, b: k8s.CoreV1Api(a).create_node(b),
             lambda a, n: k8s.CoreV1Api(a).read_node(n),
             lambda a, n, p: k8s.CoreV1Api(a).patch_node(n, p, **MERGE),
             lambda a, n: k8s.CoreV1Api(a).delete_node(n)),
    KindCase("pod", pod("p1"),
             lambda a, b: k8s.CoreV1Api(a).create_namespaced_pod("default", b),
             lambda a, n: k8s.CoreV1Api(a).read_namespaced_pod(n, "default"),
             lambda a, n, p: k8s.CoreV1Api(a).patch_namespaced_pod(n, "default", p, **MERGE),
             lambda a, n: k8s.CoreV1Api(a).delete_namespaced_pod(n, "default")),
    KindCase("event", {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1"},
                       "involvedObject": {"kind": "Node", "name": "n1"}, "reason": "Warmed", "message": "ok"},
             lambda a, b: k8s.CoreV1Api(a).create_namespaced_event("default", b),
             lambda a, n: k8s.CoreV1Api(a).read_namespaced_event(n, "default"),
             lambda a, n, p: k8s.CoreV1Api(a).patch_namespaced_event(n, "default", p, **MERGE),
             lambda a, n: k8s.CoreV1Api(a).delete_namespaced_event(n, "default")),
    KindCase("job", {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j1"},
                     "spec": {"template": {"spec": {"restartPolicy": "Never",
                                                    "containers": [{"name": "c", "image": "busybox"}]}}}},
             lambda a, b: k8s.BatchV1Api(a).create_namespaced_job("default", b),
             lambda a, n: k8s.BatchV1Api(a).read_namespaced_job(n, "default"),
             lambda a, n, p: k8s.BatchV1Api(a).patch_namespaced_job(n, "default", p, **MERGE),
             lambda a, n: k8s.BatchV1Api(a).delete_namespaced_job(n, "default")),
    KindCase("lease", {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l1"},
                       "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}},
             lambda a, b: k8s.CoordinationV1Api(a).create_namespaced_lease("default", b),
             lambda a, n: k8s.CoordinationV1Api(a).read_namespaced_lease(n, "default"),
             lambda a, n, p: k8s.CoordinationV1Api(a).patch_namespaced_lease(n, "default", p, **MERGE),
             lambda a, n: k8s.CoordinationV1Api(a).delete_namespaced_lease(n, "default")),
]


@pytest.mark.parametrize("case", KIND_CASES, ids=[c.id for c in KIND_CASES])
def test_crud_of_every_kind_with_the_official_client(api: Any, case: KindCase) -> None:
    name = case.body["metadata"]["name"]
    created = case.create(api, case.body)
    assert created.metadata.name == name
    assert created.metadata.uid and created.metadata.resource_version
    read = case.read(api, name)
    assert read.metadata.uid == created.metadata.uid
    patched = case.patch(api, name, {"metadata": {"labels": {"patched": "yes"}}})
    assert patched.metadata.labels == {"patched": "yes"}
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    case.delete(api, name)
    with pytest.raises(k8s.ApiException) as excinfo:
        case.read(api, name)
    assert excinfo.value.status == 404


@dataclass(frozen=True)
class ErrorCase:
    id: str
    call: Callable[[Any], Any]
    status: int


ERROR_CASES = [
    ErrorCase("get a missing node", lambda a: k8s.CoreV1Api(a).read_node("nope"), 404),
    ErrorCase("create twice", lambda a: [k8s.CoreV1Api(a).create_node(node("dup")) for _ in range(2)], 409),
    ErrorCase("update with a stale resourceVersion",
              lambda a: k8s.CoreV1Api(a).replace_node("old", {**node("old"), "metadata": {
                  "name": "old", "resourceVersion": "1"}}) if k8s.CoreV1Api(a).create_node(node("old")) else None,
              409),
    ErrorCase("server-side apply is not served",
              lambda a: k8s.CoreV1Api(a).patch_node("x", {}, _content_type="application/apply-patch+yaml")
              if k8s.CoreV1Api(a).create_node(node("x")) else None, 415),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c.id for c in ERROR_CASES])
def test_errors_are_status_objects_the_client_raises(api: Any, case: ErrorCase) -> None:
    with pytest.raises(k8s.ApiException) as excinfo:
        case.call(api)
    assert excinfo.value.status == case.status
    body = json.loads(excinfo.value.body)
    assert body["kind"] == "Status" and body["code"] == case.status


def test_json_patch_and_strategic_merge_patch(api: Any) -> None:
    core = k8s.CoreV1Api(api)
    core.create_node(node("n", {"a": "1", "b": "2"}))
    core.patch_node("n", [{"op": "remove", "path": "/metadata/labels/a"},
                          {"op": "add", "path": "/metadata/labels/c", "value": "3"}],
                    _content_type="application/json-patch+json")
    core.patch_node("n", {"metadata": {"labels": {"b": None}}},
                    _content_type="application/strategic-merge-patch+json")
    assert core.read_node("n").metadata.labels == {"c": "3"}


def test_status_is_a_subresource(api: Any, double: KubeDouble) -> None:
    core = k8s.CoreV1Api(api)
    double.apply(node("n", images=[{"names": ["a:1"], "sizeBytes": 10}]))
    # a write to the main resource keeps the stored status
    core.patch_node("n", {"status": {"images": []}, "metadata": {"labels": {"x": "y"}}}, **MERGE)
    stored = core.read_node("n")
    assert [i.names for i in stored.status.images] == [["a:1"]]
    assert stored.metadata.labels == {"x": "y"}
    # and /status changes only the status
    core.patch_node_status("n", {"status": {"images": [{"names": ["b:2"], "sizeBytes": 5}]},
                                 "metadata": {"labels": {"ignored": "1"}}}, **MERGE)
    stored = core.read_node("n")
    assert [i.names for i in stored.status.images] == [["b:2"]]
    assert stored.metadata.labels == {"x": "y"}


# ---- list and watch ---------------------------------------------------------------------------


def collect(api: Any, resource_version: str, n: int, **kwargs: Any) -> list[tuple[str, str]]:
    """Watch nodes from ``resource_version`` until ``n`` non-bookmark events arrived."""
    events: list[tuple[str, str]] = []
    w = k8s_watch.Watch(return_type="object")
    for ev in w.stream(k8s.CoreV1Api(api).list_node, resource_version=resource_version, timeout_seconds=10, **kwargs):
        if ev["type"] != "BOOKMARK":
            events.append((ev["type"], ev["raw_object"]["metadata"]["name"]))
        if len(events) >= n:
            w.stop()
    return events


def test_watch_resumes_from_a_resource_version_without_missing_a_change(api: Any, double: KubeDouble) -> None:
    core = k8s.CoreV1Api(api)
    core.create_node(node("a"))
    listed = core.list_node()
    assert [n.metadata.name for n in listed.items] == ["a"]
    core.create_node(node("b"))
    core.patch_node("a", {"metadata": {"labels": {"x": "1"}}}, **MERGE)
    core.delete_node("b")
    # all three changes happened before the watch opened; resuming from the list's RV replays them
    assert collect(api, listed.metadata.resource_version, 3) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]


def test_watch_from_zero_starts_with_the_current_state(api: Any, double: KubeDouble) -> None:
    double.apply(node("a"))
    double.apply(node("b"))
    assert collect(api, "0", 2) == [("ADDED", "a"), ("ADDED", "b")]


def test_bookmarks_carry_the_latest_resource_version(api: Any, double: KubeDouble) -> None:
    double.apply(node("a"))
    start = k8s.CoreV1Api(api).list_node().metadata.resource_version
    double.apply(node("other"))  # moves the revision
    w = k8s_watch.Watch(return_type="object")
    for ev in w.stream(k8s.CoreV1Api(api).list_node, resource_version=start, allow_watch_bookmarks=True,
                       timeout_seconds=10):
        if ev["type"] == "BOOKMARK":
            assert int(ev["raw_object"]["metadata"]["resourceVersion"]) == double.state.revision
            w.stop()


def test_a_compacted_resource_version_is_410_gone(api: Any, double: KubeDouble) -> None:
    double.apply(node("a"))
    old = k8s.CoreV1Api(api).list_node().metadata.resource_version
    double.apply(node("b"))
    double.state.compact()
    with pytest.raises(k8s.ApiException) as excinfo:
        collect(api, old, 1)
    assert excinfo.value.status == 410


def test_an_open_watch_can_be_expired(api: Any, double: KubeDouble) -> None:
    rv = k8s.CoreV1Api(api).list_node().metadata.resource_version
    errors: list[int] = []

    def watch() -> None:
        try:
            collect(api, rv, 5)
        except k8s.ApiException as exc:
            errors.append(exc.status)

    t = threading.Thread(target=watch)
    t.start()
    wait_until(lambda: double.open_watches() >= 1, what="the watch to open")
    double.state.expire_watches()
    t.join(timeout=20)
    assert errors == [410]


def test_a_cut_watch_is_a_broken_connection_to_the_client(api: Any, double: KubeDouble) -> None:
    rv = k8s.CoreV1Api(api).list_node().metadata.resource_version
    errors: list[BaseException] = []

    def watch() -> None:
        try:
            collect(api, rv, 5)
        except Exception as exc:
            errors.append(exc)

    t = threading.Thread(target=watch)
    t.start()
    wait_until(lambda: double.open_watches() >= 1, what="the watch to open")
    double.state.cut_watches()
    t.join(timeout=20)
    assert len(errors) == 1 and isinstance(errors[0], urllib3.exceptions.ProtocolError)


def test_watch_streams_are_chunked(double: KubeDouble) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", double.port, timeout=10)
    try:
        conn.request("GET", "/api/v1/nodes?watch=true&resourceVersion=0&timeoutSeconds=1")
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("Transfer-Encoding") == "chunked"
        assert response.read() == b""  # no nodes, no events; the stream ends at the timeout
    finally:
        conn.close()


@dataclass(frozen=True)
class SelectorCase:
    id: str
    field_selector: str | None
    label_selector: str | None
    expected: list[str]


SELECTOR_CASES = [
    SelectorCase("everything", None, None, ["p-bound", "p-done", "p-free"]),
    SelectorCase("bound pods", "spec.nodeName!=", None, ["p-bound", "p-done"]),
    SelectorCase("assigned and not finished", "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
                 None, ["p-bound"]),
    SelectorCase("on one node", "spec.nodeName=n1", None, ["p-bound", "p-done"]),
    SelectorCase("label equals", None, "app=web", ["p-bound"]),
    SelectorCase("label in a set", None, "app in (web,db)", ["p-bound", "p-free"]),
    SelectorCase("label absent", None, "!app", ["p-done"]),
    SelectorCase("both", "spec.nodeName=n1", "app", ["p-bound"]),
]


@pytest.mark.parametrize("case", SELECTOR_CASES, ids=[c.id for c in SELECTOR_CASES])
def test_list_selectors(api: Any, double: KubeDouble, case: SelectorCase) -> None:
    double.apply(pod("p-bound", "n1", {"app": "web"}, "Running"))
    double.apply(pod("p-done", "n1", None, "Succeeded"))
    double.apply(pod("p-free", "", {"app": "db"}))
    items = k8s.CoreV1Api(api).list_pod_for_all_namespaces(field_selector=case.field_selector,
                                                           label_selector=case.label_selector).items
    assert [p.metadata.name for p in items] == case.expected


def test_an_object_leaving_a_watched_selection_arrives_as_deleted(api: Any, double: KubeDouble) -> None:
    double.apply(pod("p", "n1", phase="Running"))
    rv = k8s.CoreV1Api(api).list_pod_for_all_namespaces().metadata.resource_version
    k8s.CoreV1Api(api).patch_namespaced_pod_status("p", "default", {"status": {"phase": "Succeeded"}}, **MERGE)
    w = k8s_watch.Watch(return_type="object")
    for ev in w.stream(k8s.CoreV1Api(api).list_pod_for_all_namespaces, resource_version=rv,
                       field_selector="status.phase!=Succeeded", timeout_seconds=10):
        assert (ev["type"], ev["raw_object"]["metadata"]["name"]) == ("DELETED", "p")
        w.stop()


# ---- kubectl, RBAC, faults, lifecycle ---------------------------------------------------------


def test_kubectl_reads_the_double(double: KubeDouble, tmp_path: Path) -> None:
    double.apply(node("gpu-1", {"node.kubernetes.io/instance-type": "p5.48xlarge"}))
    kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
    out = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "get", "--raw", "/api/v1/nodes"],
                         capture_output=True, text=True, timeout=60, check=True)
    listed = json.loads(out.stdout)
    assert listed["kind"] == "NodeList"
    assert [n["metadata"]["name"] for n in listed["items"]] == ["gpu-1"]


RBAC = [
    {"kind": "ClusterRole", "metadata": {"name": "read-nodes"},
     "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]},
    {"kind": "ClusterRoleBinding", "metadata": {"name": "read-nodes"},
     "roleRef": {"kind": "ClusterRole", "name": "read-nodes"},
     "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "ops"}]},
    {"kind": "Role", "metadata": {"name": "leases", "namespace": "ops"},
     "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]},
    {"kind": "RoleBinding", "metadata": {"name": "leases", "namespace": "ops"},
     "roleRef": {"kind": "Role", "name": "leases"},
     "subjects": [{"kind": "ServiceAccount", "name": "reader"}]},
]


def test_rbac_decides_every_request(double: KubeDouble, tmp_path: Path) -> None:
    double.add_token("reader-token", "system:serviceaccount:ops:reader")
    double.set_authorizer(Authorizer(RBAC))
    double.apply(node("n"))
    kubeconfig = double.write_kubeconfig(tmp_path / "kc", token="reader-token")
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        core = k8s.CoreV1Api(api)
        assert [n.metadata.name for n in core.list_node().items] == ["n"]
        with pytest.raises(k8s.ApiException) as denied:
            core.patch_node("n", {"metadata": {"labels": {"a": "b"}}}, **MERGE)
        assert denied.value.status == 403
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {}}
        k8s.CoordinationV1Api(api).create_namespaced_lease("ops", lease)
        with pytest.raises(k8s.ApiException) as other_ns:
            k8s.CoordinationV1Api(api).create_namespaced_lease("default", lease)
        assert other_ns.value.status == 403
    finally:
        api.close()
    assert ("system:serviceaccount:ops:reader", "patch", "", "nodes") in double.verbs_used()


def test_an_unknown_token_is_401(double: KubeDouble, tmp_path: Path) -> None:
    api = k8s_config.new_client_from_config(config_file=str(double.write_kubeconfig(tmp_path / "kc", token="bad")))
    try:
        with pytest.raises(k8s.ApiException) as excinfo:
            k8s.CoreV1Api(api).list_node()
        assert excinfo.value.status == 401
    finally:
        api.close()


def test_injected_failures(api: Any, double: KubeDouble) -> None:
    double.fail("list", "nodes", 500, times=1)
    with pytest.raises(k8s.ApiException) as excinfo:
        k8s.CoreV1Api(api).list_node()
    assert excinfo.value.status == 500
    assert k8s.CoreV1Api(api).list_node().items == []  # only once


def test_stop_leaves_no_thread_and_no_listener(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with KubeDouble.running(bookmark_interval_s=0.05) as d:
        port = d.port
        api = k8s_config.new_client_from_config(config_file=str(d.write_kubeconfig(tmp_path / "kc")))
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        idle.request("GET", "/api/v1/nodes")
        idle.getresponse().read()  # an idle keep-alive connection stays open
        opened = threading.Thread(target=lambda: collect(api, "0", 1))  # and a watch nobody ends
        opened.daemon = True
        opened.start()
        wait_until(lambda: d.open_watches() >= 1 and d.open_connections() >= 2, what="a watch and a keep-alive")
    opened.join(timeout=20)
    api.close()
    idle.close()
    assert not opened.is_alive()
    assert set(threading.enumerate()) - before == set()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))


def test_a_client_closing_on_an_unread_reply_prints_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """A client may close with a reply unread (the log reader past limitBytes does, when the server
    ignores it); the kernel then resets the connection under the handler. That is no fault of the
    double: no socketserver traceback on the run's output. Any other error in a handler is printed."""
    with KubeDouble.running() as d:
        server = d._server
        assert server is not None
        d.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "serving"},
                 "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}})
        d.set_log("serving", "p", "vllm", "x" * 1_000_000, honor_limit=False)
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
            conn.request("GET", "/api/v1/namespaces/serving/pods/p/log?container=vllm&limitBytes=100")
            reply = conn.getresponse()
            assert reply.status == 200 and reply.read(100) == b"x" * 100
            conn.close()  # the rest unread: the kernel answers the handler's bytes with a reset
    # stopping joined every handler thread, so each has met the reset by now
    assert "Exception occurred" not in capsys.readouterr().err
    try:
        raise ValueError("a fault of the double")
    except ValueError:
        server.handle_error(None, ("127.0.0.1", 1))
    assert "ValueError: a fault of the double" in capsys.readouterr().err
