"""The External Metrics API in-process: selectors, quantities, discovery, metric replies, Status errors, auth rules.

Real clients over TLS (kubectl, the official Python client) are in test_external_metrics_tls.py.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.datastructures import Headers

from extender.api.external_metrics.app import (
    GROUP_VERSION,
    PEER_CERT_ENVIRON,
    ExternalMetricsApi,
    create_app,
    format_quantity,
    rfc3339,
    status_json,
)
from extender.api.external_metrics.auth import (
    Access,
    AuthConfig,
    Authenticator,
    AuthUnavailableError,
    ForbiddenError,
    Name,
    UnauthenticatedError,
    User,
    parse_list,
)
from extender.api.external_metrics.label_selector import Selector, SelectorError, parse_selector
from extender.core.errors import StateError, StoreUnavailableError
from extender.state import connect
from extender.state.decisions import DecisionStore, Published, Unreadable
from extender.telemetry.served import STATES, Api, ServedMetrics
from tests.conftest import RedisServer

# ---- label selectors -----------------------------------------------------------------------------

#: (id, selector text, canonical form, labels that match, labels that do not)
SELECTORS: list[tuple[str, str, str, list[dict[str, str]], list[dict[str, str]]]] = [
    ("empty", "", "", [{}, {"a": "b"}], []),
    ("equals", "workload=qwen3", "workload=qwen3", [{"workload": "qwen3"}], [{"workload": "x"}, {}]),
    ("double-equals", "workload==qwen3", "workload=qwen3", [{"workload": "qwen3"}], [{}]),
    ("not-equals", "workload!=qwen3", "workload!=qwen3", [{"workload": "x"}, {}], [{"workload": "qwen3"}]),
    ("in", "workload in (qwen3,llama)", "workload in (llama,qwen3)",
     [{"workload": "qwen3"}, {"workload": "llama"}], [{"workload": "x"}, {}]),
    ("notin", "workload notin (qwen3)", "workload notin (qwen3)", [{"workload": "x"}, {}], [{"workload": "qwen3"}]),
    ("exists", "workload", "workload", [{"workload": ""}, {"workload": "a"}], [{}]),
    ("not-exists", "!workload", "!workload", [{}], [{"workload": "a"}]),
    ("greater", "replicas>3", "replicas>3", [{"replicas": "4"}], [{"replicas": "3"}, {"replicas": "x"}, {}]),
    ("less", "replicas<3", "replicas<3", [{"replicas": "-1"}], [{"replicas": "3"}]),
    ("whitespace", "  workload  in ( a , b ) ,  tier = gpu ", "tier=gpu,workload in (a,b)",
     [{"workload": "a", "tier": "gpu"}], [{"workload": "a"}]),
    # labels.Selector.String() sorts by key; parsing must not care about the order it gets
    ("sorted-by-key", "zone=a,app=x", "app=x,zone=a", [{"zone": "a", "app": "x"}], [{"zone": "a"}]),
    ("empty-value", "tier=", "tier=", [{"tier": ""}], [{"tier": "gpu"}, {}]),
    ("empty-in-set", "tier in (a,)", "tier in (,a)", [{"tier": ""}, {"tier": "a"}], [{}]),
    # Selector.String() of a set holding only "" (an HPA's matchExpressions values: [""]) reads "in ()"
    ("empty-set", "tier in ()", "tier in ()", [{"tier": ""}], [{"tier": "a"}, {}]),
    ("empty-notin-set", "tier notin ()", "tier notin ()", [{"tier": "a"}, {}], [{"tier": ""}]),
    ("comma-runs", "tier in (a,,,)", "tier in (,a)", [{"tier": ""}, {"tier": "a"}], [{"tier": "b"}]),
    ("int64-label", "replicas>1", "replicas>1", [{"replicas": "9223372036854775807"}],
     [{"replicas": "9223372036854775808"}]),
    ("prefixed-key", "example.com/app=x", "example.com/app=x", [{"example.com/app": "x"}], [{"app": "x"}]),
    ("mixed", "workload=qwen3,!canary,tier notin (cpu)", "!canary,tier notin (cpu),workload=qwen3",
     [{"workload": "qwen3"}], [{"workload": "qwen3", "canary": "1"}, {"workload": "qwen3", "tier": "cpu"}]),
]


@pytest.mark.parametrize(("text", "canonical", "yes", "no"), [r[1:] for r in SELECTORS], ids=[r[0] for r in SELECTORS])
def test_selector_forms(text: str, canonical: str, yes: list[dict[str, str]], no: list[dict[str, str]]) -> None:
    selector = parse_selector(text)
    assert str(selector) == canonical
    assert str(parse_selector(str(selector))) == canonical  # what we print parses back the same
    for labels in yes:
        assert selector.matches(labels), labels
    for labels in no:
        assert not selector.matches(labels), labels


BAD_SELECTORS = [
    ("comma-pair-before-paren", "workload in (a,,)", "expected a value after ','"),
    ("vertical-tab-is-not-whitespace", "workload=\x0bqwen3", "invalid label value"),
    ("no-break-space-is-not-whitespace", "workload=\xa0qwen3", "invalid label value"),
    ("signed-bound", "replicas>-1", "invalid label value"),
    ("bound-past-int64", "replicas<9223372036854775808", "64-bit integer"),
    ("unclosed-set", "workload in (a,b", "unclosed"),
    ("no-key", "=qwen3", "expected a label key"),
    ("trailing-comma", "workload=qwen3,", "expected a label key"),
    ("set-without-parens", "workload notin a", "expected '('"),
    ("bad-key", "-bad=x", "invalid label key"),
    ("bad-prefix", "Example.COM/app=x", "prefix must be a DNS subdomain"),
    ("long-value", "a=" + "v" * 64, "invalid label value"),
    ("bad-value-char", "a=b@c", "invalid label value"),
    ("not-an-integer", "replicas>three", "must be a 64-bit integer"),
    ("two-values", "a = b c", "expected ','"),
    ("missing-comma-in-set", "a in (b c)", "expected ',' or ')'"),
]


@pytest.mark.parametrize(("text", "words"), [r[1:] for r in BAD_SELECTORS], ids=[r[0] for r in BAD_SELECTORS])
def test_bad_selectors_are_errors(text: str, words: str) -> None:
    with pytest.raises(SelectorError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_selector(text)


# ---- quantities ----------------------------------------------------------------------------------

QUANTITIES = [
    ("zero", 0.0, "0"),
    ("integer", 3.0, "3"),
    ("half", 1.5, "1500m"),  # the HPA reads MilliValue(): 1500
    ("below-a-milli", 0.0004, "0"),
    ("half-a-milli-rounds-up", 0.0005, "1m"),
    ("float-noise", 2.0000001, "2"),
    ("large", 1e9, "1000000000"),
    ("fraction-of-large", 12345.6789, "12345679m"),
    ("nan", math.nan, "0"),
    ("infinite", math.inf, "0"),
    ("negative", -1.0, "0"),
]


@pytest.mark.parametrize(("value", "text"), [q[1:] for q in QUANTITIES], ids=[q[0] for q in QUANTITIES])
def test_quantities(value: float, text: str) -> None:
    assert format_quantity(value) == text


def test_timestamps_are_rfc3339_utc() -> None:
    assert rfc3339(1735732800.9) == "2025-01-01T12:00:00Z"


# ---- the app -------------------------------------------------------------------------------------

NOW = 1_735_732_800.0  # 2025-01-01T12:00:00Z
PUBLISHED = {"qwen3": Published(desired=5, load=17.5, unit="requests/s", t=NOW - 10, window=15, token=3, standby=2)}
WORKLOADS: dict[str, str | None] = {"qwen3": "default", "llama": "ml", "anywhere": None}
#: The ``api`` label of what this app serves (extender.telemetry.served).
API: Api = "external-metrics"


def make_app(published: Callable[[], Mapping[str, Published | Unreadable]] = lambda: PUBLISHED,
             auth: Authenticator | None = None) -> Flask:
    """The app as the scaler builds it: it records what it serves (so every test, and the fuzzer of
    tests/test_fault_wire.py, goes through the recorder too) and serves that at ``/metrics``."""
    registry = CollectorRegistry()
    return create_app(ExternalMetricsApi(published=published, workloads=WORKLOADS,
                                         auth=auth or Authenticator(AuthConfig(insecure=True)), clock=lambda: NOW,
                                         registry=registry, served_metrics=ServedMetrics(registry, API, WORKLOADS)))


@pytest.fixture
def client() -> FlaskClient:
    return make_app().test_client()


def test_discovery_documents(client: FlaskClient) -> None:
    gv = {"groupVersion": "external.metrics.k8s.io/v1beta1", "version": "v1beta1"}
    group = {"name": "external.metrics.k8s.io", "versions": [gv], "preferredVersion": gv}
    r = client.get("/apis")
    assert r.content_type == "application/json"
    assert r.get_json() == {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
    assert client.get("/apis/external.metrics.k8s.io").get_json() == {"kind": "APIGroup", "apiVersion": "v1", **group}
    resources = client.get("/apis/external.metrics.k8s.io/v1beta1").get_json()
    assert resources["kind"] == "APIResourceList"
    assert resources["groupVersion"] == GROUP_VERSION
    assert resources["resources"] == [
        {"name": name, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList", "verbs": ["get"]}
        for name in ("extender-desired-replicas", "extender-forecast-load", "extender-standby-replicas")
    ]


def get(client: FlaskClient, path: str, selector: str | None = None) -> tuple[int, dict[str, Any], str]:
    query = {} if selector is None else {"labelSelector": selector}
    r = client.get(f"/apis/external.metrics.k8s.io/v1beta1/{path}", query_string=query)
    return r.status_code, json.loads(r.data), r.content_type


def test_desired_replicas_of_one_workload(client: FlaskClient) -> None:
    code, body, ctype = get(client, "namespaces/default/extender-desired-replicas", "workload=qwen3")
    assert (code, ctype) == (200, "application/json")
    assert body == {
        "kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1", "metadata": {},
        "items": [{"metricName": "extender-desired-replicas", "metricLabels": {"workload": "qwen3"},
                   "timestamp": "2025-01-01T11:59:50Z", "window": 15, "value": "5"}],
    }


def test_forecast_load_is_a_milli_quantity(client: FlaskClient) -> None:
    _, body, _ = get(client, "namespaces/default/extender-forecast-load", "workload=qwen3")
    assert body["items"][0]["value"] == "17500m"  # HPA: ceil(17500 / 4000 per replica) = 5


def test_standby_replicas_are_served_for_the_placeholder_hpa(client: FlaskClient) -> None:
    _, body, _ = get(client, "namespaces/default/extender-standby-replicas", "workload=qwen3")
    assert body["items"] == [{"metricName": "extender-standby-replicas", "metricLabels": {"workload": "qwen3"},
                              "timestamp": "2025-01-01T11:59:50Z", "window": 15, "value": "2"}]


def test_a_value_published_before_standby_existed_reads_as_none() -> None:
    old = '{"desired":5,"load":17.5,"unit":"requests/s","t":1.0,"window":15,"token":3}'
    assert Published.decode(old).standby == 0
    assert Published.decode(PUBLISHED["qwen3"].encode()) == PUBLISHED["qwen3"]


def test_no_data_yet_is_one_zero_item(client: FlaskClient) -> None:
    # an empty list is an error to the HPA ("no metrics returned from external metrics API")
    code, body, _ = get(client, "namespaces/ml/extender-desired-replicas", "workload=llama")
    assert code == 200
    assert body["items"] == [{"metricName": "extender-desired-replicas", "metricLabels": {"workload": "llama"},
                              "timestamp": "2025-01-01T12:00:00Z", "value": "0"}]


def test_a_set_selector_returns_every_match_sorted(client: FlaskClient) -> None:
    _, body, _ = get(client, "namespaces/default/extender-desired-replicas", "workload in (qwen3,anywhere)")
    assert [i["metricLabels"]["workload"] for i in body["items"]] == ["anywhere", "qwen3"]


DESIRED = "namespaces/default/extender-desired-replicas"
ERRORS: list[tuple[str, str, str | None, int, str, str]] = [
    ("unknown-metric", "namespaces/default/queue_depth", "workload=qwen3", 404, "NotFound",
     "could not find the metric"),
    ("wrong-namespace", "namespaces/ml/extender-desired-replicas", "workload=qwen3", 404, "NotFound",
     "no autoscaled workload in namespace 'ml'"),
    ("selector-matches-nothing", DESIRED, "workload=typo", 404, "NotFound", "matches the selector 'workload=typo'"),
    ("bad-selector", DESIRED, "workload in (", 400, "BadRequest", "unable to parse label selector"),
    ("cluster-scoped-path", "extender-desired-replicas", None, 404, "NotFound",
     "could not find the requested resource"),
    ("too-deep", "namespaces/default/extender-desired-replicas/x", None, 404, "NotFound", "could not find"),
]


@pytest.mark.parametrize("row", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_are_status_objects(client: FlaskClient, row: tuple[str, str, str | None, int, str, str]) -> None:
    _, path, selector, code, reason, words = row
    got, body, ctype = get(client, path, selector)
    assert (got, ctype) == (code, "application/json")
    assert {k: body[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
    assert words in body["message"]


def test_wrong_method_is_a_status(client: FlaskClient) -> None:
    r = client.post("/apis/external.metrics.k8s.io/v1beta1/namespaces/default/extender-desired-replicas")
    assert r.status_code == 405
    assert r.get_json()["reason"] == "MethodNotAllowed"


def test_store_outage_is_503() -> None:
    def down() -> Mapping[str, Published]:
        raise StoreUnavailableError("Redis is unavailable: connection refused")

    code, body, _ = get(make_app(down).test_client(), "namespaces/default/extender-desired-replicas", "workload=qwen3")
    assert (code, body["reason"]) == (503, "ServiceUnavailable")
    assert "connection refused" in body["message"]


# ---- one unreadable published entry: its own workload only (a real Redis) ----------------------------


class Bad(NamedTuple):
    """One row: what a hand-edited (or newer) entry for ``llama`` holds, and words of its error."""

    id: str
    raw: bytes
    words: str


BAD_ENTRIES = [Bad(*row) for row in [
    ("field-missing", b'{"desired":1}', "load: Field required"),
    ("infinite-window", b'{"desired":1,"load":1,"unit":"x","t":1,"window":1e999,"token":1}',
     "window: Input should be a finite number"),
    ("time-past-year-9999", b'{"desired":1,"load":1,"unit":"x","t":1e20,"window":1,"token":1}', "t: Input should be"),
    ("nan-load", b'{"desired":1,"load":NaN,"unit":"x","t":1,"window":1,"token":1}', "load: Input should be a finite"),
    ("not-json", b"{broken", "Invalid JSON"),
    ("not-utf-8", b"\xff\xfe", "Invalid JSON"),
    ("not-an-object", b"[1, 2]", "Input should be an object"),
    # replica counts outside Kubernetes' int32: no float() overflow (a 500), no silent 0 for a negative
    ("desired-401-digits", b'{"desired":' + b"9" * 401 + b',"load":1,"unit":"x","t":1,"window":1,"token":1}',
     "desired: Input should be less than or equal to 2147483647"),
    ("desired-past-int64", b'{"desired":9223372036854775808,"load":1,"unit":"x","t":1,"window":1,"token":1}',
     "desired: Input should be less than or equal to 2147483647"),
    ("desired-past-int32", b'{"desired":2147483648,"load":1,"unit":"x","t":1,"window":1,"token":1}',
     "desired: Input should be less than or equal to 2147483647"),
    ("desired-negative", b'{"desired":-7,"load":1,"unit":"x","t":1,"window":1,"token":1}',
     "desired: Input should be greater than or equal to 0"),
    ("standby-401-digits", b'{"desired":1,"load":1,"unit":"x","t":1,"window":1,"token":1,"standby":'
     + b"9" * 401 + b"}", "standby: Input should be less than or equal to 2147483647"),
    ("standby-negative", b'{"desired":1,"load":1,"unit":"x","t":1,"window":1,"token":1,"standby":-1}',
     "standby: Input should be greater than or equal to 0"),
    # was served: Go's decoder then refused the whole list (windowSeconds is an int64), every workload in it
    ("window-past-int64", b'{"desired":1,"load":1,"unit":"x","t":1,"window":9223372036854775808,"token":1}',
     "window: Input should be less than or equal to 9223372036854775807"),
]]


@pytest.mark.integration
@pytest.mark.parametrize("row", BAD_ENTRIES, ids=[b.id for b in BAD_ENTRIES])
def test_an_unreadable_entry_spoils_only_its_own_workload(row: Bad, redis_server: RedisServer,
                                                          tmp_path: Path) -> None:
    client = connect(redis_server.url, tmp_path)
    store = DecisionStore(client)
    client.hset(store.published_key, mapping={"qwen3": PUBLISHED["qwen3"].encode(), "llama": row.raw,
                                              "anywhere": PUBLISHED["qwen3"].encode()})
    app = make_app(store.published_entries).test_client()
    # the others are served as usual ...
    code, body, _ = get(app, DESIRED, "workload=qwen3")
    assert (code, [i["value"] for i in body["items"]]) == (200, ["5"]), body
    code, body, _ = get(app, "namespaces/ml/extender-desired-replicas", "workload=anywhere")
    assert (code, [i["value"] for i in body["items"]]) == (200, ["5"]), body
    # ... and the bad one is a Status saying what is wrong with it, never a 500 or a 503
    for selector in ("workload=llama", "workload in (anywhere,llama)"):
        code, body, _ = get(app, "namespaces/ml/extender-desired-replicas", selector)
        assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound"), body
        assert "the published metrics of 'llama' are unreadable" in body["message"]
        assert row.words in body["message"], body["message"]
    client.close()


@pytest.mark.integration
def test_a_store_that_cannot_be_read_is_503(redis_server: RedisServer, tmp_path: Path) -> None:
    store = DecisionStore(connect(redis_server.url, tmp_path))
    app = make_app(store.published_entries).test_client()
    assert get(app, DESIRED, "workload=qwen3")[0] == 200  # not decided yet: "0"
    redis_server.kill()
    code, body, _ = get(app, DESIRED, "workload=qwen3")
    assert (code, body["reason"]) == (503, "ServiceUnavailable")
    assert "the scaler's metrics cannot be read" in body["message"]


# ---- what was served, per workload: the decision's time and window, and the "0" of none ---------------

#: A series of the served metrics: (sample name, sorted label pairs).
Series = tuple[str, tuple[tuple[str, str], ...]]
TIME, WINDOW, SERVED = ("extender_served_decision_timestamp_seconds", "extender_served_decision_window_seconds",
                        "extender_served_values_total")


def served_series(client: FlaskClient) -> dict[Series, float]:
    """The ``extender_served_*`` samples of the app's own ``/metrics`` (``_created`` left out)."""
    text = client.get("/metrics").get_data(as_text=True)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith("extender_served_") and not s.name.endswith("_created")}


def expected_series(dated: Mapping[str, tuple[float, int]], counts: Mapping[tuple[str, str], float],
                    workloads: Mapping[str, str | None] = WORKLOADS) -> dict[Series, float]:
    """Every counter of ``workloads`` (0 unless in ``counts``) and the gauges of the ``dated`` workloads."""
    out: dict[Series, float] = {(SERVED, (("api", API), ("state", state), ("workload", w))): counts.get((w, state), 0.0)
                                for w in workloads for state in STATES}
    for w, (t, window) in dated.items():
        out[(TIME, (("api", API), ("workload", w)))] = t
        out[(WINDOW, (("api", API), ("workload", w)))] = float(window)
    return out


class Ask(NamedTuple):
    """One request: what the published hash holds first (``None``: as it is), and the reply's code."""

    stored: Mapping[str, bytes] | None
    namespace: str
    selector: str
    code: int
    metric: str = "extender-desired-replicas"


class Served(NamedTuple):
    """One row: requests in order, then the gauges (workload -> decision time, window) and counts expected."""

    id: str
    asks: list[Ask]
    dated: Mapping[str, tuple[float, int]]
    counts: Mapping[tuple[str, str], float]


QWEN = PUBLISHED["qwen3"].encode().encode()
NEWER = Published(desired=6, load=20.0, unit="requests/s", t=NOW - 2, window=30, token=4).encode().encode()
#: Names no policy lists: each is a 404, and none may become a label value.
MADE_UP = [f"w{i:03d}-{'x' * (i % 7 + 1)}" for i in range(200)]

SERVED_ROWS = [Served(*row) for row in [
    ("decided-exports-its-time", [Ask({"qwen3": QWEN}, "default", "workload=qwen3", 200)] * 2,
     {"qwen3": (NOW - 10, 15)}, {("qwen3", "decided"): 2}),
    ("every-metric-counts", [Ask({"qwen3": QWEN}, "default", "workload=qwen3", 200, m) for m in
                             ("extender-desired-replicas", "extender-forecast-load", "extender-standby-replicas")],
     {"qwen3": (NOW - 10, 15)}, {("qwen3", "decided"): 3}),
    ("undecided-counts-and-has-no-time", [Ask({}, "ml", "workload=llama", 200)] * 3, {}, {("llama", "undecided"): 3}),
    ("one-reply-two-workloads", [Ask({"anywhere": QWEN}, "ml", "workload in (anywhere,llama)", 200)],
     {"anywhere": (NOW - 10, 15)}, {("anywhere", "decided"): 1, ("llama", "undecided"): 1}),
    ("a-newer-decision-replaces-the-time", [Ask({"qwen3": QWEN}, "default", "workload=qwen3", 200),
                                            Ask({"qwen3": NEWER}, "default", "workload=qwen3", 200)],
     {"qwen3": (NOW - 2, 30)}, {("qwen3", "decided"): 2}),
    # the decision vanished (a flushed Redis): no time is left standing for a decision no longer served
    ("a-lost-decision-drops-the-time", [Ask({"qwen3": QWEN}, "default", "workload=qwen3", 200),
                                        Ask({}, "default", "workload=qwen3", 200)],
     {}, {("qwen3", "decided"): 1, ("qwen3", "undecided"): 1}),
    ("made-up-names-add-no-series",
     [Ask({"qwen3": QWEN}, "default", f"workload={name}", 404) for name in MADE_UP]
     + [Ask(None, "default", f"workload in ({MADE_UP[0]},{MADE_UP[1]})", 404),
        Ask(None, "default", f"workload in (qwen3,{MADE_UP[2]})", 200)],
     {"qwen3": (NOW - 10, 15)}, {("qwen3", "decided"): 1}),
    ("another-namespace-s-workload-is-not-served", [Ask({"qwen3": QWEN}, "ml", "workload=qwen3", 404)], {}, {}),
    ("an-unknown-metric-is-not-served", [Ask({"qwen3": QWEN}, "default", "workload=qwen3", 404, "queue_depth")],
     {}, {}),
    # a 404 serves nothing, the readable workload of the same selector included
    ("an-unreadable-entry-is-not-served", [Ask({"llama": b"{broken", "anywhere": QWEN}, "ml",
                                               "workload in (anywhere,llama)", 404)], {}, {}),
]]


@pytest.mark.integration
@pytest.mark.parametrize("row", SERVED_ROWS, ids=[r.id for r in SERVED_ROWS])
def test_what_was_served_is_measured_per_workload(row: Served, redis_server: RedisServer, tmp_path: Path) -> None:
    client = connect(redis_server.url, tmp_path)
    store = DecisionStore(client)
    registry = CollectorRegistry()
    app = create_app(ExternalMetricsApi(published=store.published_entries, workloads=WORKLOADS,
                                        auth=Authenticator(AuthConfig(insecure=True)), clock=lambda: NOW,
                                        registry=registry, served_metrics=ServedMetrics(registry, API, WORKLOADS)))
    c = app.test_client()
    assert served_series(c) == expected_series({}, {})  # every counter from the start, no time yet
    for ask in row.asks:
        if ask.stored is not None:
            client.delete(store.published_key)
            for workload, raw in ask.stored.items():
                client.hset(store.published_key, workload, raw)
        code, body, _ = get(c, f"namespaces/{ask.namespace}/{ask.metric}", ask.selector)
        assert code == ask.code, body
    assert served_series(c) == expected_series(row.dated, row.counts)
    client.close()


def test_a_policy_edit_drops_the_times_of_the_workloads_it_no_longer_serves() -> None:
    registry = CollectorRegistry()
    api = ExternalMetricsApi(published=lambda: PUBLISHED, workloads=WORKLOADS, clock=lambda: NOW,
                             auth=Authenticator(AuthConfig(insecure=True)), registry=registry,
                             served_metrics=ServedMetrics(registry, API, WORKLOADS))
    c = create_app(api).test_client()
    assert get(c, DESIRED, "workload=qwen3")[0] == 200
    edited: dict[str, str | None] = {"llama": "ml", "new": "default"}
    api.set_workloads(edited)
    assert get(c, DESIRED, "workload=qwen3")[0] == 404  # no longer served ...
    # ... so no time of it stays behind (an alert would age it for ever); counters stay, as counters do
    assert served_series(c) == expected_series({}, {("qwen3", "decided"): 1}, {**WORKLOADS, **edited})


#: (id, what is recorded in order, workloads whose gauges are left): the recorder alone, without the app.
RECORDS: list[tuple[str, list[tuple[str, Published | None]], set[str]]] = [
    ("a-name-the-policy-does-not-list", [("intruder", PUBLISHED["qwen3"]), ("intruder", None)], set()),
    ("decided-then-undecided", [("qwen3", PUBLISHED["qwen3"]), ("qwen3", None)], set()),
    ("undecided-then-decided", [("qwen3", None), ("qwen3", PUBLISHED["qwen3"])], {"qwen3"}),
]


@pytest.mark.parametrize(("records", "dated"), [r[1:] for r in RECORDS], ids=[r[0] for r in RECORDS])
def test_the_recorder_labels_only_the_policy_s_workloads(records: list[tuple[str, Published | None]],
                                                         dated: set[str]) -> None:
    registry = CollectorRegistry()
    metrics = ServedMetrics(registry, API, WORKLOADS)
    for workload, value in records:
        metrics.record(workload, value)
    labelled = {s.labels["workload"] for f in registry.collect() for s in f.samples if "workload" in s.labels}
    assert labelled == set(WORKLOADS)
    timed = {s.labels["workload"] for f in registry.collect() for s in f.samples if s.name == TIME}
    assert timed == dated


# ---- what a 404 names: the workloads of the namespace asked about, never another's ---------------


class Listed(NamedTuple):
    id: str
    namespace: str
    listed: str  # the message's "workloads: ..." part


LISTED = [Listed(*row) for row in [
    ("default", "default", "workloads: anywhere, qwen3)"),
    ("ml", "ml", "workloads: anywhere, llama)"),
    # a namespace with nothing of its own still sees the workloads served in every namespace
    ("other", "team-b", "workloads: anywhere)"),
]]


@pytest.mark.parametrize("row", LISTED, ids=[r.id for r in LISTED])
def test_a_404_lists_only_the_namespace_s_workloads(row: Listed, client: FlaskClient) -> None:
    code, body, _ = get(client, f"namespaces/{row.namespace}/extender-desired-replicas", "workload=typo")
    assert code == 404
    assert body["message"].endswith(row.listed), body["message"]


# ---- 408 and 413, answered before the app sees the request (extender.api.asgi) ----------------------


class Early(NamedTuple):
    """One row: a request the ASGI layer refuses, and the Status it must get."""

    id: str
    headers: list[tuple[bytes, bytes]]
    body: list[dict[str, Any]]  # the http.request messages the client sends (then it stalls)
    code: int
    reason: str
    words: str


EARLY = [Early(*row) for row in [
    ("content-length-over-the-limit", [(b"content-length", b"2000000")], [], 413, "RequestEntityTooLarge",
     "larger than the 1048576 byte limit"),
    ("body-over-the-limit", [], [{"type": "http.request", "body": b"x" * 600_000, "more_body": True}] * 2, 413,
     "RequestEntityTooLarge", "larger than the 1048576 byte limit"),
    ("body-stalls", [(b"content-length", b"10")], [{"type": "http.request", "body": b"12345", "more_body": True}],
     408, "RequestTimeout", "did not arrive within 0.05 s"),
]]


def early_reply(row: Early, error_body: Callable[[int, str], bytes] | None) -> tuple[int, dict[bytes, bytes], bytes]:
    """``(status, headers, body)`` of ``row``'s request through :func:`whole_requests` around the real app."""
    from extender.api.asgi import whole_requests

    kwargs = {} if error_body is None else {"error_body": error_body}
    app = whole_requests(make_app(), 1 << 20, 1, 0.05, **kwargs)
    path = f"/apis/external.metrics.k8s.io/v1beta1/{DESIRED}"
    scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": b"labelSelector=workload%3Dqwen3", "headers": row.headers, "scheme": "https",
             "server": ("127.0.0.1", 6443), "client": ("127.0.0.1", 5555), "root_path": ""}
    messages = list(row.body)
    sent: list[Mapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stalls (the 408's timer ends this)
        raise AssertionError("unreachable")

    async def send(message: Mapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    start, *rest = sent
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in rest)


@pytest.mark.parametrize("row", EARLY, ids=[e.id for e in EARLY])
def test_early_errors_are_status_objects(row: Early) -> None:
    code, headers, raw = early_reply(row, status_json)
    body = json.loads(raw)
    assert (code, headers[b"content-type"], headers[b"connection"]) == (row.code, b"application/json", b"close")
    assert {k: body[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": row.reason, "code": row.code}
    assert row.words in body["message"]


@pytest.mark.parametrize("row", EARLY, ids=[e.id for e in EARLY])
def test_the_scheduler_extenders_early_errors_keep_their_format(row: Early) -> None:
    # extender serve uses the same layer with its own body, {"error": ...}: unchanged
    code, _, raw = early_reply(row, None)
    assert code == row.code and list(json.loads(raw)) == ["error"] and row.words in json.loads(raw)["error"]


def test_probes_need_no_credentials() -> None:
    app = make_app(auth=Authenticator(AuthConfig()))
    c = app.test_client()
    assert c.get("/healthz").status_code == 200
    assert c.get("/readyz").status_code == 200
    assert c.get("/apis").status_code == 401


@pytest.mark.parametrize("served", [True, False], ids=["registry", "no-registry"])
def test_metrics_need_no_credentials_and_are_a_status_404_without_a_registry(served: bool) -> None:
    registry = CollectorRegistry()
    Counter("extender_test_events_total", "A family only this test registers.", registry=registry)
    app = create_app(ExternalMetricsApi(published=lambda: PUBLISHED, workloads=WORKLOADS,
                                        auth=Authenticator(AuthConfig()), clock=lambda: NOW,
                                        registry=registry if served else None))
    r = app.test_client().get("/metrics")  # no credentials: Prometheus scrapes it like a probe
    if served:
        assert r.status_code == 200 and r.content_type.startswith("text/plain")
        assert "extender_test_events_total 0.0" in r.get_data(as_text=True)
    else:
        assert (r.status_code, r.content_type, r.get_json()["reason"]) == (404, "application/json", "NotFound")


# ---- authentication and authorization ------------------------------------------------------------

FRONT_PROXY_CA: Name = ((("commonName", "front-proxy-ca"),),)
CLIENT_CA: Name = ((("commonName", "kubernetes"),),)
OTHER_CA: Name = ((("commonName", "someone-else"),),)


def cert(issuer: Name, cn: str, *orgs: str) -> dict[str, Any]:
    subject = ((("commonName", cn),), *((("organizationName", o),) for o in orgs))
    return {"issuer": issuer, "subject": subject}


class FakeReviews:
    """TokenReview / SubjectAccessReview stand-ins that count their calls."""

    def __init__(self, allowed: set[str] | None = None, fail: bool = False) -> None:
        self.tokens = {"good-token": User("system:serviceaccount:kube-system:horizontal-pod-autoscaler",
                                          ("system:serviceaccounts",), method="token")}
        self.allowed = allowed if allowed is not None else set()
        self.fail = fail
        self.token_calls = 0
        self.access_calls = 0

    def review_token(self, token: str) -> User | None:
        self.token_calls += 1
        if self.fail:
            raise StateError("the API server is unreachable")
        return self.tokens.get(token)

    def review_access(self, user: User, access: Access) -> tuple[bool, str]:
        self.access_calls += 1
        if self.fail:
            raise StateError("the API server is unreachable")
        return user.name in self.allowed, "" if user.name in self.allowed else "RBAC: not allowed"


CONFIG = AuthConfig(requestheader_cas=frozenset({FRONT_PROXY_CA}), allowed_names=("front-proxy-client",),
                    client_cas=frozenset({CLIENT_CA}))
HPA = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"

#: (id, peer certificate, headers, expected user name or the error type)
AUTHN = [
    ("front-proxy", cert(FRONT_PROXY_CA, "front-proxy-client"),
     {"X-Remote-User": HPA, "X-Remote-Group": "system:serviceaccounts"}, HPA),
    ("front-proxy-name-not-allowed", cert(FRONT_PROXY_CA, "mallory"), {"X-Remote-User": "admin"},
     UnauthenticatedError),
    ("headers-without-proxy-cert", None, {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"},
     UnauthenticatedError),
    ("headers-with-a-client-cert-are-ignored", cert(CLIENT_CA, "jane", "team-a"), {"X-Remote-User": "admin"}, "jane"),
    ("client-cert", cert(CLIENT_CA, "jane", "team-a"), {}, "jane"),
    ("unknown-issuer", cert(OTHER_CA, "jane"), {}, UnauthenticatedError),
    ("proxy-cert-without-user-header-and-no-token", cert(FRONT_PROXY_CA, "front-proxy-client"), {},
     UnauthenticatedError),
    ("bearer-token", None, {"Authorization": "Bearer good-token"}, HPA),
    ("bad-token", None, {"Authorization": "Bearer forged"}, UnauthenticatedError),
    ("basic-auth-is-not-a-token", None, {"Authorization": "Basic Zm9vOmJhcg=="}, UnauthenticatedError),
    ("nothing", None, {}, UnauthenticatedError),
]


@pytest.mark.parametrize(("peer", "headers", "expected"), [a[1:] for a in AUTHN], ids=[a[0] for a in AUTHN])
def test_authentication(peer: dict[str, Any] | None, headers: dict[str, str], expected: str | type[Exception]) -> None:
    auth = Authenticator(CONFIG, tokens=FakeReviews())
    if isinstance(expected, str):
        user = auth.authenticate(peer, Headers(headers))
        assert user.name == expected
        assert "system:authenticated" in user.groups
    else:
        with pytest.raises(expected):
            auth.authenticate(peer, Headers(headers))


def test_front_proxy_carries_groups_and_extras() -> None:
    headers = Headers([("X-Remote-User", "jane"), ("X-Remote-Group", "team-a"), ("X-Remote-Group", "team-b"),
                       ("X-Remote-Extra-Scopes", "read"), ("X-Remote-Extra-Scopes", "write"),
                       ("X-Remote-Extra-Acme.com%2Fproject", "p1")])
    user = Authenticator(CONFIG).authenticate(cert(FRONT_PROXY_CA, "front-proxy-client"), headers)
    assert user.groups == ("team-a", "team-b", "system:authenticated")
    assert dict(user.extra) == {"acme.com/project": ("p1",), "scopes": ("read", "write")}
    assert user.method == "front-proxy"


def test_repeated_headers_joined_by_the_wsgi_server_are_split_again() -> None:
    # kube-apiserver's aggregator sends X-Remote-Group once per group (admin: system:masters and
    # system:authenticated); gunicorn hands them over as one comma-joined value. Read as one group,
    # a cluster admin was refused by the real aggregator (tests/test_cluster_scaling.py).
    headers = Headers([("X-Remote-User", "admin"), ("X-Remote-Group", "system:masters,system:authenticated"),
                       ("X-Remote-Extra-Scopes", "read,write")])
    user = Authenticator(CONFIG).authenticate(cert(FRONT_PROXY_CA, "front-proxy-client"), headers)
    assert user.groups == ("system:masters", "system:authenticated")
    assert dict(user.extra) == {"scopes": ("read", "write")}


def test_client_cert_groups_are_its_organizations() -> None:
    user = Authenticator(CONFIG).authenticate(cert(CLIENT_CA, "jane", "team-a", "team-b"), Headers())
    assert user.groups == ("team-a", "team-b", "system:authenticated")


def test_token_reviews_are_cached_for_their_ttl() -> None:
    now = [0.0]
    reviews = FakeReviews()
    auth = Authenticator(CONFIG, tokens=reviews, clock=lambda: now[0])
    headers = Headers({"Authorization": "Bearer good-token"})
    for _ in range(3):
        auth.authenticate(None, headers)
    assert reviews.token_calls == 1
    now[0] = 10.5  # past the 10 s cache
    auth.authenticate(None, headers)
    assert reviews.token_calls == 2
    for _ in range(2):  # a rejected token is cached too: a flood of bad tokens costs one review each 10 s
        with pytest.raises(UnauthenticatedError):
            auth.authenticate(None, Headers({"Authorization": "Bearer forged"}))
    assert reviews.token_calls == 3


def test_review_outage_is_unavailable_not_unauthorized() -> None:
    auth = Authenticator(CONFIG, tokens=FakeReviews(fail=True), access=FakeReviews(fail=True))
    with pytest.raises(AuthUnavailableError):
        auth.authenticate(None, Headers({"Authorization": "Bearer good-token"}))
    with pytest.raises(AuthUnavailableError):
        auth.authorize(User("jane", ("system:authenticated",)), Access("list", "g", "v", "m", "default"))


def test_tokens_without_a_reviewer_are_refused() -> None:
    with pytest.raises(UnauthenticatedError, match="no TokenReview"):
        Authenticator(CONFIG).authenticate(None, Headers({"Authorization": "Bearer good-token"}))


ACCESS = Access("list", "external.metrics.k8s.io", "v1beta1", "extender-desired-replicas", "default")


def test_authorization_asks_per_user_and_caches() -> None:
    reviews = FakeReviews(allowed={HPA})
    auth = Authenticator(CONFIG, access=reviews)
    hpa = User(HPA, ("system:serviceaccounts", "system:authenticated"))
    auth.authorize(hpa, ACCESS)
    auth.authorize(hpa, ACCESS)
    assert reviews.access_calls == 1
    with pytest.raises(ForbiddenError) as err:
        auth.authorize(User("jane", ("system:authenticated",)), ACCESS)
    assert str(err.value).startswith('extender-desired-replicas.external.metrics.k8s.io is forbidden: User "jane" '
                                     'cannot list resource "extender-desired-replicas" in API group '
                                     '"external.metrics.k8s.io" in the namespace "default"')
    # system:masters (the aggregator's availability checks) is never asked about
    auth.authorize(User("system:kube-aggregator", ("system:masters",)), ACCESS)
    assert reviews.access_calls == 2


def test_forbidden_reply_over_http() -> None:
    auth = Authenticator(CONFIG, tokens=FakeReviews(), access=FakeReviews(allowed=set()))
    c = make_app(auth=auth).test_client()
    r = c.get("/apis/external.metrics.k8s.io/v1beta1/namespaces/default/extender-desired-replicas",
              query_string={"labelSelector": "workload=qwen3"}, headers={"Authorization": "Bearer good-token"})
    assert r.status_code == 403
    assert r.get_json()["reason"] == "Forbidden"
    # discovery needs authentication only
    assert c.get("/apis", headers={"Authorization": "Bearer good-token"}).status_code == 200


def test_front_proxy_over_http_through_the_peer_certificate() -> None:
    auth = Authenticator(CONFIG, access=FakeReviews(allowed={HPA}))
    c = make_app(auth=auth).test_client()
    path = f"/apis/external.metrics.k8s.io/v1beta1/{DESIRED}?labelSelector=workload%3Dqwen3"
    ok = c.get(path, headers={"X-Remote-User": HPA},
               environ_base={PEER_CERT_ENVIRON: cert(FRONT_PROXY_CA, "front-proxy-client")})
    assert ok.status_code == 200
    spoofed = c.get(path, headers={"X-Remote-User": HPA})
    assert spoofed.status_code == 401
    assert spoofed.get_json()["reason"] == "Unauthorized"


def test_overlapping_cas_need_allowed_names() -> None:
    with pytest.raises(ValueError, match="allowed names"):
        Authenticator(AuthConfig(requestheader_cas=frozenset({CLIENT_CA}), client_cas=frozenset({CLIENT_CA})))
    Authenticator(AuthConfig(requestheader_cas=frozenset({CLIENT_CA}), client_cas=frozenset({CLIENT_CA}),
                             allowed_names=("front-proxy-client",)))


LISTS = [
    ("json-array", '["front-proxy-client","aggregator"]', ("front-proxy-client", "aggregator")),
    ("commas", "a, b,,c", ("a", "b", "c")),
    ("empty", "", ()),
    ("empty-array", "[]", ()),
]


@pytest.mark.parametrize(("text", "expected"), [x[1:] for x in LISTS], ids=[x[0] for x in LISTS])
def test_configmap_lists(text: str, expected: tuple[str, ...]) -> None:
    assert parse_list(text) == expected


def test_selector_is_a_value() -> None:
    assert parse_selector("b=1,a=2") == Selector(parse_selector("a=2,b=1").requirements)


@pytest.mark.parametrize("path", ["/apis/external.metrics.k8s.io/v1beta1/namespaces/default//extender-desired-replicas",
                                  "//apis"], ids=["a doubled slash inside", "a doubled slash first"])
def test_a_doubled_slash_is_a_status_not_a_redirect(path: str, client: FlaskClient) -> None:
    # werkzeug answered these with a 308 redirect in HTML that no error handler sees (found by the fuzzer)
    resp = client.get(path)
    assert resp.status_code == 404 and resp.mimetype == "application/json"
    assert resp.get_json()["kind"] == "Status"
