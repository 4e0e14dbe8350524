"""The Flask app at unit level: handlers through the test client, the refresher driven by hand.

The store here is an in-memory stand-in with the two methods the refresher calls; the real Redis
store is exercised by tests/test_extender_integration.py.
"""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from extender.api.scheduler import verbs
from extender.api.scheduler.app import create_app
from extender.api.scheduler.commands import exposure_warning
from extender.api.scheduler.engine import Engine
from extender.api.scheduler.settings import Settings
from extender.api.scheduler.verbs import SchedulerService
from extender.cli import build_parser
from extender.core.caches import weights_key
from extender.core.errors import StateError, StoreUnavailableError
from extender.core.inventory import NodeState
from tests.kube_double.waiting import wait_until
from tests.test_scoring import POLICY

GB = 10**9
IMAGE = "docker.io/vllm/vllm-openai:v0.11.0"


def record(name: str, pool: str, *, image: bool = False, weights: bool = False, free: float = 1000 * GB,
           heartbeat: float | None = None, ttl: float = 600.0) -> NodeState:
    return NodeState.model_validate({
        "name": name, "labels": {"pool": pool}, "nvmeFree": int(free),
        "images": [IMAGE] if image else [],
        "weights": {weights_key("llm", "r1"): 100 * GB, weights_key("strict", "r1"): 100 * GB} if weights else {},
        "heartbeat": time.time() if heartbeat is None else heartbeat, "ttl": ttl,
    })


class MemoryStore:
    """Stand-in for InventoryStore: a version, records, and a switch to fail like Redis does."""

    def __init__(self, records: list[NodeState]) -> None:
        self.records = records
        self.current = 1
        self.fail: Exception | None = None
        self.loads = 0
        self.previous: set[str] = set()  # every name ever served, so that removals are reported

    def set(self, records: list[NodeState]) -> None:
        self.records = records
        self.current += 1

    def versions(self) -> tuple[int, int]:
        if self.fail is not None:
            raise self.fail
        return self.current, 0  # no heartbeat lane: every heartbeat is a record write here

    def heartbeats_since(self, seq: int) -> tuple[int, dict[str, float]]:
        return 0, {}

    def load_all(self) -> tuple[int, list[NodeState], frozenset[str]]:
        if self.fail is not None:
            raise self.fail
        self.loads += 1
        return self.current, list(self.records), frozenset()

    def changes_since(self, version: int) -> tuple[int, dict[str, NodeState | None], frozenset[str]]:
        # no change log here: everything counts as changed, and a name no longer held as gone
        current, records, registry = self.load_all()
        changed: dict[str, NodeState | None] = {r.name: r for r in records}
        changed.update({n: None for n in self.previous - changed.keys()})
        self.previous = set(changed)
        return current, changed, registry


def fleet() -> list[NodeState]:
    return [
        record("fast-warm", "fast", image=True, weights=True),
        record("fast-cold", "fast"),
        record("slow-warm", "slow", image=True, weights=True),
        record("slow-cold", "slow"),
        record("tiny-1", "tiny", free=10 * GB),
    ]


def pod(app_label: str = "llm", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "web-1", "namespace": "default", "uid": "5f0c", "labels": {"app": app_label},
                         "creationTimestamp": None},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "resources": {}}],
                     "schedulerName": "default-scheduler"},
            "status": {"phase": "Pending"}, **extra}


def args(names: list[str], app_label: str = "llm") -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends it with nodeCacheCapable: true."""
    return {"Pod": pod(app_label), "Nodes": None, "NodeNames": names}


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(fleet())


def make_app(policy_file: Path, store: MemoryStore, **overrides: Any) -> Flask:
    knobs: dict[str, Any] = {"policy_check_interval_s": 0.0, "min_rebuild_interval_s": 0.0,
                             "rebuild_duty_factor": 0.0, **overrides}
    settings = Settings(policy_path=policy_file, start_refresher=False, store_factory=lambda: store, **knobs)
    return create_app(settings)


def service(app: Flask) -> SchedulerService:
    svc: SchedulerService = app.extensions["extender"]
    return svc


@pytest.fixture
def app(policy_file: Path, store: MemoryStore) -> Flask:
    application = make_app(policy_file, store)
    service(application).refresher.refresh_once()
    return application


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def post(client: FlaskClient, verb: str, body: Any) -> Any:
    resp = client.post(f"/{verb}", data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 200, resp.data
    assert resp.mimetype == "application/json"
    return json.loads(resp.data)


def scores(reply: list[dict[str, Any]]) -> dict[str, int]:
    return {h["Host"]: h["Score"] for h in reply}


def metric(client: FlaskClient, line_start: str) -> float:
    text = client.get("/metrics").data.decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)]
    return sum(values)


# --------------------------------------------------------------------------------------------
# Prioritize and filter
# --------------------------------------------------------------------------------------------


def test_prioritize_scores_are_go_shaped_integers(client: FlaskClient) -> None:
    reply = post(client, "prioritize", args(["fast-warm", "fast-cold", "slow-warm", "slow-cold", "nobody"]))
    assert isinstance(reply, list)
    assert all(set(h) == {"Host", "Score"} and type(h["Score"]) is int for h in reply)
    # fast: image+weights 175 s -> (570-175)/57 = 6.9 -> 7; cold 230 s -> 6
    # slow: image+weights 370 s (the NVMe is slower than the network) -> 3.5 -> 4; cold 570 s -> 0
    # unknown name: cold on seed-default bandwidths, slower than the reference -> 0
    assert scores(reply) == {"fast-warm": 7, "fast-cold": 6, "slow-warm": 4, "slow-cold": 0, "nobody": 0}


def test_scores_do_not_depend_on_the_other_candidates(client: FlaskClient) -> None:
    alone = scores(post(client, "prioritize", args(["fast-cold"])))
    together = scores(post(client, "prioritize", args(["fast-warm", "fast-cold", "slow-cold"])))
    assert alone["fast-cold"] == together["fast-cold"] == 6


def test_filter_is_soft_by_default(client: FlaskClient) -> None:
    names = ["fast-warm", "slow-cold", "tiny-1", "nobody"]
    reply = post(client, "filter", args(names))
    assert reply == {"Nodes": None, "NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                     "Error": ""}


def test_filter_hard_rules_name_actionable_reasons(client: FlaskClient) -> None:
    names = ["fast-warm", "fast-cold", "tiny-1", "nobody"]
    reply = post(client, "filter", args(names, "strict"))
    # fast-warm: image + weights 175 s > 120 s SLO (compile is cold); fast-cold 230 s > 120 s;
    # tiny: 50 GB NVMe < 100 GB weights; nobody: no record, no evidence -> passes
    assert reply["NodeNames"] == ["nobody"]
    assert reply["FailedNodes"] == {}
    assert set(reply["FailedAndUnresolvableNodes"]) == {"fast-warm", "fast-cold", "tiny-1"}
    assert "exceeds the 120 s startup SLO" in reply["FailedAndUnresolvableNodes"]["fast-warm"]
    assert "node class tiny has 50.0 GB of usable NVMe" in reply["FailedAndUnresolvableNodes"]["tiny-1"]
    assert set(reply["NodeNames"]) | set(reply["FailedAndUnresolvableNodes"]) <= set(names)


def test_filter_free_nvme_goes_to_failed_nodes(policy_file: Path) -> None:
    full = record("fast-full", "fast", image=True, free=150 * GB)
    roomy = record("fast-roomy", "fast", free=1000 * GB)
    stale_full = record("fast-stale", "fast", free=0, heartbeat=time.time() - 3600, ttl=60)
    application = make_app(policy_file, MemoryStore([full, roomy, stale_full]))
    service(application).refresher.refresh_once()
    names = ["fast-full", "fast-roomy", "fast-stale", "tiny-new"]
    reply = post(application.test_client(), "filter", args(names, "fits"))
    # profile "fits" has only requireNvmeFit: 150 GB free - 100 GB reserve = 50 GB < 100 GB of
    # weights missing -> FailedNodes (space changes as caches are evicted); a stale record and a
    # node without one are no evidence -> pass
    assert reply["NodeNames"] == ["fast-roomy", "fast-stale", "tiny-new"]
    assert list(reply["FailedNodes"]) == ["fast-full"]
    assert reply["FailedAndUnresolvableNodes"] == {}
    assert "free NVMe 50.0 GB" in reply["FailedNodes"]["fast-full"]


def test_keys_are_read_in_any_letter_case(client: FlaskClient) -> None:
    body = {"pod": pod(), "nodes": None, "NODENAMES": ["fast-warm", "fast-cold"]}
    reply = post(client, "prioritize", body)
    assert scores(reply) == {"fast-warm": 7, "fast-cold": 6}
    reply = post(client, "filter", {"POD": pod(), "nodeNames": ["fast-cold"]})
    assert reply["NodeNames"] == ["fast-cold"] and "Nodes" in reply


def node_object(name: str, labels: dict[str, str], images: list[list[str]]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"images": [{"names": n, "sizeBytes": 10 * GB} for n in images]}}


def test_full_node_list_mode_reads_labels_and_images(client: FlaskClient) -> None:
    items = [
        # not in the inventory: class from labels, image from kubelet's status.images
        node_object("new-fast", {"pool": "fast"}, [["docker.io/vllm/vllm-openai@sha256:abc",
                                                    "docker.io/vllm/vllm-openai:v0.11.0"]]),
        node_object("new-fast-no-image", {"pool": "fast"}, [["docker.io/library/nginx:1.25"]]),
        node_object("fast-cold", {"pool": "fast"}, []),
    ]
    body = {"Pod": pod(), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    reply = post(client, "prioritize", body)
    # image present 180 s -> (570-180)/57 = 6.8 -> 7; fast and cold 230 s -> 6
    assert scores(reply) == {"new-fast": 7, "new-fast-no-image": 6, "fast-cold": 6}
    filtered = post(client, "filter", body)
    assert filtered["NodeNames"] is None
    assert filtered["Nodes"]["items"] == items  # returned verbatim


def test_unknown_nodes_are_cold_not_errors(client: FlaskClient) -> None:
    reply = post(client, "prioritize", args(["never-heard-of-it"]))
    assert reply == [{"Host": "never-heard-of-it", "Score": 0}]


def test_names_that_need_escaping_are_escaped(client: FlaskClient) -> None:
    odd = ['we"ird', "back\\slash", "tab\tname", "ünïcode"]
    reply = post(client, "prioritize", args(odd))
    assert [h["Host"] for h in reply] == odd
    assert post(client, "filter", args(odd))["NodeNames"] == odd


def test_empty_candidate_list(client: FlaskClient) -> None:
    assert post(client, "prioritize", args([])) == []
    assert post(client, "filter", args([]))["NodeNames"] == []


# --------------------------------------------------------------------------------------------
# Neutral replies and fail-open
# --------------------------------------------------------------------------------------------


def test_unmatched_pod_gets_the_neutral_reply(client: FlaskClient) -> None:
    names = ["fast-warm", "slow-cold"]
    assert post(client, "prioritize", args(names, "something-else")) == [
        {"Host": "fast-warm", "Score": 0}, {"Host": "slow-cold", "Score": 0}]
    assert post(client, "filter", args(names, "something-else"))["NodeNames"] == names
    assert metric(client, 'extender_requests_total{outcome="unmatched"') == 2
    assert metric(client, "extender_fail_open_total") == 0


def test_no_snapshot_yet_is_neutral(policy_file: Path, store: MemoryStore) -> None:
    client = make_app(policy_file, store).test_client()  # refresher never ran
    assert scores(post(client, "prioritize", args(["fast-warm"]))) == {"fast-warm": 0}
    assert metric(client, 'extender_fail_open_total{reason="no_snapshot"') == 1


def test_store_down_past_the_bound_is_neutral(policy_file: Path, store: MemoryStore) -> None:
    application = make_app(policy_file, store, max_snapshot_age_s=5.0)
    refresher = service(application).refresher
    client = application.test_client()
    refresher.refresh_once(now=time.time())
    assert scores(post(client, "prioritize", args(["fast-warm"]))) == {"fast-warm": 7}
    store.fail = StoreUnavailableError("connection refused")
    refresher.refresh_once()
    # still within the bound: the snapshot confirmed a moment ago is used
    assert scores(post(client, "prioritize", args(["fast-warm"]))) == {"fast-warm": 7}
    refresher.confirmed_at -= 60  # as if the store had been down for a minute
    assert scores(post(client, "prioritize", args(["fast-warm"]))) == {"fast-warm": 0}
    assert post(client, "filter", args(["fast-warm"], "strict"))["NodeNames"] == ["fast-warm"]
    assert metric(client, 'extender_fail_open_total{reason="store_unavailable"') == 2
    store.fail = None
    refresher.refresh_once()
    assert scores(post(client, "prioritize", args(["fast-warm"]))) == {"fast-warm": 7}


def test_stale_snapshot_without_store_error_is_neutral(app: Flask) -> None:
    refresher = service(app).refresher
    refresher.refresh_once(now=time.time() - 3600)  # the last confirmation an hour ago, no error since
    client = app.test_client()
    assert scores(post(client, "prioritize", args(["fast-warm"]))) == {"fast-warm": 0}
    assert metric(client, 'extender_fail_open_total{reason="stale_snapshot"') == 1


def test_an_exception_is_neutral_and_logged_once(app: Flask, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def boom(*_: Any, **__: Any) -> str:
        raise ZeroDivisionError("bug in scoring")

    monkeypatch.setattr(Engine, "prioritize_names", boom)
    client = app.test_client()
    with caplog.at_level(logging.ERROR, logger="extender.api.scheduler.verbs"):
        for _ in range(3):
            assert post(client, "prioritize", args(["fast-warm", "slow-cold"])) == [
                {"Host": "fast-warm", "Score": 0}, {"Host": "slow-cold", "Score": 0}]
    assert metric(client, 'extender_fail_open_total{reason="exception"') == 3
    logged = [r for r in caplog.records if "failed; answering neutrally" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


def test_time_budget_overrun_is_neutral(policy_file: Path, store: MemoryStore) -> None:
    application = make_app(policy_file, store, request_budget_s=1e-9)
    service(application).refresher.refresh_once()
    client = application.test_client()
    assert scores(post(client, "prioritize", args(["fast-warm"]))) == {"fast-warm": 0}
    assert metric(client, 'extender_fail_open_total{reason="budget"') == 1


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

BAD_BODIES = [
    ("invalid JSON", b"{not json", "not valid JSON"),
    ("not an object", b"[1, 2]", "must be a JSON object"),
    ("no Pod", json.dumps({"NodeNames": ["a"]}).encode(), "no Pod"),
    ("Pod is not an object", json.dumps({"Pod": "web-1", "NodeNames": ["a"]}).encode(), "no Pod"),
    ("NodeNames not strings", json.dumps({"Pod": {}, "NodeNames": [1, 2]}).encode(), "array of strings"),
    ("NodeNames not a list", json.dumps({"Pod": {}, "NodeNames": "a"}).encode(), "array of strings"),
    ("neither NodeNames nor Nodes", json.dumps({"Pod": {}, "Nodes": None, "NodeNames": None}).encode(),
     "neither NodeNames nor Nodes"),
    ("node without a name", json.dumps({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}).encode(),
     "no metadata.name"),
    ("empty body", b"", "not valid JSON"),
    # valid JSON, but the reply could not be written as UTF-8 (a lone surrogate is no Unicode text)
    ("lone surrogate in NodeNames", b'{"Pod":{},"NodeNames":["\\ud800"]}', "not valid JSON"),
    ("lone surrogate as raw bytes", b'{"Pod":{},"NodeNames":["\xed\xa0\x80"]}', "not valid JSON"),
    # 1,000 levels overflowed Python's stack inside json.loads (RecursionError, not a ValueError)
    ("nested 1,000 levels", b'{"Pod":{},"NodeNames":[],"x":' + b"[" * 1000 + b"]" * 1000 + b"}", "nested deeper"),
    ("Nodes is a string", json.dumps({"Pod": {}, "Nodes": "abc"}).encode(), "NodeList object"),
    ("Nodes is an array", json.dumps({"Pod": {}, "Nodes": [{"metadata": {"name": "a"}}]}).encode(),
     "NodeList object"),
    ("Nodes.items is an object", json.dumps({"Pod": {}, "Nodes": {"items": {"a": 1}}}).encode(), "NodeList object"),
    # Python's json reads these and writes them back; they are not JSON, and Go's decoder refuses them
    ("NaN", b'{"Pod":{},"NodeNames":["a"],"x":NaN}', "not valid JSON"),
    ("Infinity", b'{"Pod":{},"NodeNames":["a"],"x":-Infinity}', "not valid JSON"),
]


@pytest.mark.parametrize(("name", "body", "message"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_bad_input_is_400_with_a_json_error(client: FlaskClient, verb: str, name: str, body: bytes,
                                            message: str) -> None:
    resp = client.post(f"/{verb}", data=body, content_type="application/json")
    assert resp.status_code == 400
    assert message in json.loads(resp.data)["error"]


EXPLAIN_BAD_BODIES = [
    ("NodeNames not strings", json.dumps({"Pod": pod(), "NodeNames": [1, 2]}).encode(), "array of strings"),
    ("Nodes is a string", json.dumps({"Pod": pod(), "Nodes": "abc"}).encode(), "NodeList object"),
    ("nested 1,000 levels", b'{"metadata":' + b"[" * 1000 + b"]" * 1000 + b"}", "nested deeper"),
    ("lone surrogate", b'{"Pod":{},"NodeNames":["\\udfff"]}', "not valid JSON"),
    # a null Pod was read as "no Pod key": the wrapper itself was explained as the pod (200)
    ("Pod is null, with NodeNames", json.dumps({"Pod": None, "NodeNames": ["fast-warm"]}).encode(), "no Pod object"),
    ("Pod is null, alone", json.dumps({"Pod": None}).encode(), "no Pod object"),
    ("pod is null, in another case", json.dumps({"pod": None, "nodeNames": ["fast-warm"]}).encode(), "no Pod object"),
    ("Pod is a string", json.dumps({"Pod": "x"}).encode(), "Pod must be an object"),
]


@pytest.mark.parametrize(("name", "body", "message"), EXPLAIN_BAD_BODIES, ids=[b[0] for b in EXPLAIN_BAD_BODIES])
def test_explain_bad_input_is_400_not_every_node(client: FlaskClient, name: str, body: bytes, message: str) -> None:
    resp = client.post("/explain", data=body, content_type="application/json")
    assert resp.status_code == 400, resp.data
    assert message in json.loads(resp.data)["error"]


def test_an_unexpected_error_is_counted_and_logged_once(app: Flask, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    # A failure outside the fail-open guard (here: while parsing) still answers JSON, is counted in
    # extender_requests_total, and writes one traceback per interval, not one per request.
    def boom(_: bytes) -> Any:
        raise ZeroDivisionError("bug in parsing")

    monkeypatch.setattr("extender.api.scheduler.verbs.parse_args", boom)
    client = app.test_client()
    with caplog.at_level(logging.ERROR):
        statuses = [client.post("/prioritize", data=json.dumps(args(["fast-warm"]))).status_code for _ in range(3)]
    assert statuses == [500, 500, 500]
    assert metric(client, 'extender_requests_total{outcome="error",verb="prioritize"}') == 3
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1, [r.getMessage() for r in caplog.records]


def test_body_over_the_limit_is_413(policy_file: Path, store: MemoryStore) -> None:
    application = make_app(policy_file, store, max_body_bytes=1000)
    service(application).refresher.refresh_once()
    resp = application.test_client().post("/prioritize", data=json.dumps(args(["n"] * 500)),
                                          content_type="application/json")
    assert resp.status_code == 413
    assert "1000 byte limit" in json.loads(resp.data)["error"]


@pytest.mark.parametrize(("limit", "status"), [(100_000, 200), (1000, 413)], ids=["fits", "over the limit"])
def test_body_without_content_length(policy_file: Path, store: MemoryStore, limit: int, status: int) -> None:
    application = make_app(policy_file, store, max_body_bytes=limit)
    service(application).refresher.refresh_once()
    body = json.dumps(args(["fast-warm"] * 200)).encode()  # about 5 KB, sent without Content-Length
    resp = application.test_client().post("/prioritize", input_stream=io.BytesIO(body),
                                          headers={"Transfer-Encoding": "chunked"})
    assert resp.status_code == status
    if status == 200:
        assert len(json.loads(resp.data)) == 200


def test_unknown_route_and_method_are_json(client: FlaskClient) -> None:
    assert client.post("/bind", data=b"{}").status_code == 404
    resp = client.get("/filter")
    assert resp.status_code == 405 and "error" in json.loads(resp.data)
    # werkzeug answered `//prioritize` with a 308 redirect in HTML that no error handler sees
    for path in ("//prioritize", "/prioritize/"):
        resp = client.post(path, data=json.dumps(args(["fast-warm"])))
        assert resp.status_code == 404 and resp.mimetype == "application/json", path


# --------------------------------------------------------------------------------------------
# Ops endpoints, explain
# --------------------------------------------------------------------------------------------


def test_health_ready_metrics(policy_file: Path, store: MemoryStore) -> None:
    application = make_app(policy_file, store, startup_grace_s=3600.0)
    client = application.test_client()
    assert client.get("/healthz").status_code == 200
    not_yet = client.get("/readyz")
    assert not_yet.status_code == 503 and json.loads(not_yet.data)["mode"] == "loading"
    service(application).refresher.refresh_once()
    ready = json.loads(client.get("/readyz").data)
    assert ready["ready"] and ready["mode"] == "snapshot" and ready["nodes"] == 5
    post(client, "prioritize", args(["fast-warm"]))
    text = client.get("/metrics").data.decode()
    for name in ("extender_request_duration_seconds_bucket", "extender_fail_open_total",
                 "extender_snapshot_age_seconds", "extender_nodes_known"):
        assert name in text
    assert metric(client, "extender_nodes_known") == 5


def test_readyz_says_fail_open_during_a_store_outage_past_the_bound(app: Flask, store: MemoryStore) -> None:
    # Readiness stays 200: neutral replies still serve the scheduler better than a removed endpoint
    # (docs/extender.md). But it must say that the answers are neutral, not "snapshot".
    refresher = service(app).refresher
    client = app.test_client()
    assert json.loads(client.get("/readyz").data)["mode"] == "snapshot"
    store.fail = StoreUnavailableError("Redis is unavailable: connection refused")
    refresher.refresh_once()
    within = json.loads(client.get("/readyz").data)
    assert (within["mode"], within["storeError"] is not None) == ("snapshot", True)  # within the bound
    refresher.confirmed_at -= 3600  # the bound has passed
    resp = client.get("/readyz")
    body = json.loads(resp.data)
    assert resp.status_code == 200
    assert (body["ready"], body["mode"], body["failOpen"]) == (True, "fail-open", "store_unavailable")


def test_ready_in_declared_fail_open_mode_after_the_grace(policy_file: Path, store: MemoryStore) -> None:
    store.fail = StoreUnavailableError("down")
    application = make_app(policy_file, store, startup_grace_s=1.0)
    refresher = service(application).refresher
    refresher.refresh_once()
    refresher.started_at -= 10  # the grace is over
    body = json.loads(application.test_client().get("/readyz").data)
    assert body["ready"] and body["mode"] == "fail-open" and "down" in body["storeError"]


def test_a_number_beyond_float64_is_never_echoed_as_infinity(client: FlaskClient) -> None:
    # 1e400 is valid JSON and parses to inf; filter would echo the Node back as Infinity
    node = {"metadata": {"name": "fast-warm", "labels": {"pool": "fast"}}, "status": {"x": 1e400}}
    body = b'{"Pod":' + json.dumps(pod()).encode() + b',"Nodes":{"items":[' + json.dumps(node).replace(
        "Infinity", "1e400").encode() + b"]}}"
    resp = client.post("/filter", data=body, content_type="application/json")
    assert resp.status_code == 400 and "float64" in json.loads(resp.data)["error"]
    resp = client.post("/prioritize", data=body, content_type="application/json")  # nothing echoed
    assert resp.status_code == 200
    assert json.loads(resp.data, parse_constant=lambda c: pytest.fail(f"{c} in the reply")) == [
        {"Host": "fast-warm", "Score": scores(json.loads(resp.data))["fast-warm"]}]


def test_explain_is_one_at_a_time_per_worker(app: Flask, client: FlaskClient) -> None:
    lock = service(app)._explaining
    assert lock.acquire(blocking=False)
    try:
        resp = client.post("/explain", data=json.dumps(pod()))
        assert resp.status_code == 429 and resp.headers["Retry-After"] == "1"
        assert "another /explain is running" in json.loads(resp.data)["error"]
        assert post(client, "prioritize", args(["fast-warm"]))  # the scheduler's verbs are not held up
    finally:
        lock.release()
    assert client.post("/explain", data=json.dumps(pod())).status_code == 200


def test_explain_covers_at_most_a_cluster_of_nodes(client: FlaskClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verbs, "EXPLAIN_MAX_NODES", 2)
    named = client.post("/explain?nodes=a,b,c", data=json.dumps(pod()))
    assert named.status_code == 400
    error = json.loads(named.data)["error"]
    # the request named its nodes: it is told the limit, not to name them (?nodes=a,b)
    assert "the request names 3 nodes, more than one report covers (2); ask about at most 2 a time" in error
    assert "?nodes" not in error
    body = client.post("/explain", data=json.dumps({"Pod": pod(), "NodeNames": ["a", "b", "c"]}))
    assert body.status_code == 400 and "?nodes" not in json.loads(body.data)["error"]
    everything = client.post("/explain", data=json.dumps(pod()))
    assert everything.status_code == 400
    assert f"the inventory holds {len(fleet())} nodes" in json.loads(everything.data)["error"]
    assert client.post("/explain?nodes=a,b", data=json.dumps(pod())).status_code == 200


def test_explain_gives_phases_scores_and_verdicts(client: FlaskClient) -> None:
    resp = client.post("/explain?nodes=fast-warm,tiny-1,nobody", data=json.dumps(pod("strict")),
                       content_type="application/json")
    report = json.loads(resp.data)
    assert report["profile"] == "strict" and report["failOpen"] is None
    by_node = {n["node"]: n for n in report["nodes"]}
    assert by_node["fast-warm"]["phases"]["image_s"] == 0.0
    assert by_node["fast-warm"]["totalSeconds"] == pytest.approx(175.0)
    assert by_node["tiny-1"]["verdict"] == "FailedAndUnresolvableNodes"
    assert by_node["nobody"]["known"] is False and by_node["nobody"]["verdict"] == "pass"
    assert by_node["nobody"]["note"].startswith("no known node class") and by_node["fast-warm"]["note"] == ""
    llm = {n["node"]: n for n in json.loads(client.post("/explain?nodes=tiny-1,fast-cold",
                                                        data=json.dumps(pod())).data)["nodes"]}
    assert llm["tiny-1"]["note"] == "class tiny is not among the node classes llm runs on (fast, slow): scored 0"
    assert llm["tiny-1"]["score"] == 0 and llm["fast-cold"]["note"] == ""
    everything = json.loads(client.get("/explain", data=json.dumps(args([]))).data)
    assert everything["nodes"] == []  # the body's NodeNames (empty) wins over "all nodes"
    all_nodes = json.loads(client.post("/explain", data=json.dumps(pod())).data)
    assert {n["node"] for n in all_nodes["nodes"]} == {r.name for r in fleet()}


def test_explain_unmatched_pod(client: FlaskClient) -> None:
    report = json.loads(client.post("/explain", data=json.dumps(pod("other"))).data)
    assert report["profile"] is None and report["nodes"] == []


# --------------------------------------------------------------------------------------------
# Refresher: store versions, freshness, policy hot reload, the thread
# --------------------------------------------------------------------------------------------


def test_snapshot_follows_the_store_version(app: Flask, store: MemoryStore) -> None:
    client = app.test_client()
    refresher = service(app).refresher
    assert scores(post(client, "prioritize", args(["fast-cold"]))) == {"fast-cold": 6}
    loads = store.loads
    refresher.refresh_once()
    assert store.loads == loads  # version unchanged: nothing reloaded
    store.set([record("fast-cold", "fast", image=True, weights=True)])
    refresher.refresh_once()
    assert scores(post(client, "prioritize", args(["fast-cold"]))) == {"fast-cold": 7}


def test_reloads_are_spaced_by_their_cost(policy_file: Path, store: MemoryStore) -> None:
    application = make_app(policy_file, store, rebuild_duty_factor=1e9)
    refresher = service(application).refresher
    refresher.refresh_once()  # the first load always happens
    store.set(fleet())
    refresher.refresh_once()  # a reload now would exceed the duty cycle: deferred, still confirmed
    assert store.loads == 1 and refresher.error is None
    health = refresher.health(time.time())
    assert health.fail_open is None


def test_a_record_going_stale_turns_cold(policy_file: Path) -> None:
    now = time.time()
    store = MemoryStore([record("fast-warm", "fast", image=True, weights=True, heartbeat=now, ttl=30.0)])
    application = make_app(policy_file, store)
    engine = service(application).refresher
    engine.refresh_once(now=now)
    assert engine.engine is not None
    profile = engine.policy.profile("llm")
    fresh = engine.engine.prioritize_names(profile, ["fast-warm"], now + 10)
    stale = engine.engine.prioritize_names(profile, ["fast-warm"], now + 31)
    # warm-ish 175 s -> 7 while fresh; past its TTL it is cold: 230 s -> 6
    assert json.loads(fresh) == [{"Host": "fast-warm", "Score": 7}]
    assert json.loads(stale) == [{"Host": "fast-warm", "Score": 6}]


def test_a_record_that_breaks_the_build_is_skipped_not_the_whole_inventory(
        app: Flask, store: MemoryStore, caplog: pytest.LogCaptureFixture) -> None:
    # The model refuses 2**64 GPUs now; a record that still slipped past it (another writer, a
    # future field) must cost only itself. Before, the OverflowError stopped every rebuild, and the
    # old snapshot was served as fresh while later valid updates never arrived.
    poison = NodeState.model_construct(**{**record("poison", "fast").__dict__, "gpus_free": 2**64})
    store.set([*fleet(), poison, record("joined-later", "fast", image=True, weights=True)])
    refresher = service(app).refresher
    with caplog.at_level(logging.WARNING, logger="extender.api.scheduler.refresher"):
        refresher.refresh_once()
        store.set(list(store.records))  # a heartbeat elsewhere: a new version, the same poison
        refresher.refresh_once()
    engine = refresher.engine
    assert engine is not None and engine.snapshot.version == store.current
    assert sorted(r.name for r in engine.snapshot.nodes) == sorted([*(r.name for r in fleet()), "joined-later"])
    client = app.test_client()
    assert scores(post(client, "prioritize", args(["joined-later"]))) == {"joined-later": 7}
    assert metric(client, 'extender_snapshot_refresh_errors_total{reason="bad_record"}') == 2
    assert len([r for r in caplog.records if "'poison'" in r.getMessage()]) == 1  # throttled


def test_refresh_errors_keep_the_last_snapshot(app: Flask, store: MemoryStore) -> None:
    refresher = service(app).refresher
    engine = refresher.engine
    store.fail = StateError("WRONGTYPE")
    refresher.refresh_once()
    assert refresher.engine is engine and refresher.error is not None and refresher.error[0] == "store_error"


def test_policy_hot_reload_and_invalid_versions(app: Flask, policy_file: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    client = app.test_client()
    refresher = service(app).refresher
    assert scores(post(client, "prioritize", args(["fast-cold"]))) == {"fast-cold": 6}
    # a valid change: secondsPerPoint 100 s -> (570 - 230) / 100 = 3.4 -> 3
    policy_file.write_text(POLICY.replace("secondsPerPoint: 30s", "secondsPerPoint: 100s"))
    assert refresher.check_policy()
    refresher.refresh_once()
    assert scores(post(client, "prioritize", args(["fast-cold"]))) == {"fast-cold": 3}
    # an invalid change: rejected, every problem logged, the last good policy kept
    policy_file.write_text(POLICY.replace("secondsPerPoint: 30s", "secondsPerPoint: -1s")
                           .replace("count: 8", "count: 0"))
    with caplog.at_level(logging.ERROR, logger="extender.api.scheduler.refresher"):
        assert not refresher.check_policy()
    message = "\n".join(r.getMessage() for r in caplog.records)
    assert "keeping the last good policy" in message
    assert "gpu.count" in message and "secondsPerPoint" in message
    refresher.refresh_once()
    assert scores(post(client, "prioritize", args(["fast-cold"]))) == {"fast-cold": 3}
    assert metric(client, 'extender_policy_reloads_total{result="invalid"}') == 1


def test_a_worker_started_after_a_reload_serves_the_files_policy(policy_file: Path, store: MemoryStore) -> None:
    # gunicorn restarts a worker with the launch-time Settings, whose policy is the one the master
    # validated at start. The file has changed since; the new worker must not serve the old policy
    # next to workers on the new one (the same node scored 9 and 3 on alternate requests).
    from extender.files import read_policy

    launch_policy, launch_version = read_policy(policy_file)
    policy_file.write_text(POLICY.replace("secondsPerPoint: 30s", "secondsPerPoint: 100s"))
    settings = Settings(policy_path=policy_file, policy=launch_policy, policy_version=launch_version,
                        start_refresher=False, store_factory=lambda: store, min_rebuild_interval_s=0.0,
                        rebuild_duty_factor=0.0)
    application = create_app(settings)
    service(application).refresher.refresh_once()
    client = application.test_client()
    assert scores(post(client, "prioritize", args(["fast-cold"]))) == {"fast-cold": 3}  # (570 - 230) / 100
    ready = json.loads(client.get("/readyz").data)
    assert ready["policyVersion"] == read_policy(policy_file)[1] != launch_version
    assert metric(client, 'extender_policy_reloads_total{result="ok"}') == 1


def test_an_unchanged_file_is_not_reloaded_at_worker_start(policy_file: Path, store: MemoryStore) -> None:
    from extender.files import read_policy

    launch_policy, launch_version = read_policy(policy_file)
    settings = Settings(policy_path=policy_file, policy=launch_policy, policy_version=launch_version,
                        start_refresher=False, store_factory=lambda: store)
    client = create_app(settings).test_client()
    assert metric(client, "extender_policy_reloads_total") == 0
    assert json.loads(client.get("/readyz").data)["policyVersion"] == launch_version


def test_the_refresher_thread_loads_and_stops(policy_file: Path, store: MemoryStore) -> None:
    settings = Settings(policy_path=policy_file, store_factory=lambda: store, poll_interval_s=0.01)
    application = create_app(settings)
    refresher = service(application).refresher
    try:
        wait_until(lambda: refresher.engine, what="the refresher's first engine")
        assert refresher.alive()
    finally:
        refresher.stop()
    assert refresher._thread is not None and not refresher._thread.is_alive()


# ---- where serve listens ------------------------------------------------------------------------------


#: (name, --bind, --tls-client-ca, whether serve warns that anyone reaching it may call it)
EXPOSURES = [
    ("loopback", "127.0.0.1:8888", None, False),
    ("loopback-v6", "[::1]:8888", None, False),
    ("localhost", "localhost:8888", None, False),
    ("all-interfaces", "0.0.0.0:8888", None, True),
    ("all-interfaces-v6", "[::]:8888", None, True),
    ("a-pod-ip", "10.0.0.5:8888", None, True),
    ("a-host-name", "extender.example:8888", None, True),
    ("mutual-tls", "0.0.0.0:8888", "/var/run/extender-tls/ca.crt", False),
]


@pytest.mark.parametrize(("bind", "client_ca", "warned"), [e[1:] for e in EXPOSURES], ids=[e[0] for e in EXPOSURES])
def test_serve_warns_when_anyone_beyond_loopback_may_call_it(bind: str, client_ca: str | None, warned: bool) -> None:
    warning = exposure_warning(bind, client_ca)
    assert (warning is not None) == warned
    if warning is not None:
        assert warning.startswith(f"listening on {bind} without --tls-client-ca")


def test_serve_listens_beside_the_scheduler_by_default() -> None:
    # the scheduler sends no credentials: a default on every interface served the inventory to the network
    args = build_parser().parse_args(["serve", "--policy", "p.yaml"])
    assert args.bind == "127.0.0.1:8888"
    assert exposure_warning(args.bind, args.tls_client_ca) is None
