"""Fault and abuse suite, wire part: a hypothesis fuzzer over both servers' request schemas.

The extender is the real one (gunicorn on loopback, real Redis); each example is one request on a
keep-alive connection. The property is the protocol's, not a fixed answer: the reply is 200 and
decodes the way kube-scheduler's Go decoder reads it (only nodes that were sent, integer scores,
``NodeNames`` present in cache mode), or it is a 4xx with a JSON ``{"error": ...}``. Never a 5xx,
never a dropped connection. The External Metrics API is fuzzed the same way through its WSGI app:
every reply is a ``metav1.Status`` or an ``ExternalMetricValueList``, and no 5xx but the store's 503.

Bounded in count (``max_examples``) and in time (each request has a socket timeout); loopback only.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RedisServer
from tests.net import free_port
from tests.test_extender_integration import (
    NAMES,
    Server,
    go_filter,
    go_prioritize,
    load_inventory,
    running,
    serve_command,
    vllm_pod,
    wait_ready,
)
from tests.test_external_metrics import WORKLOADS
from tests.test_external_metrics import make_app as metrics_app
from tests.test_scoring import POLICY

pytestmark = pytest.mark.integration

#: Examples per property: enough to hit every branch of the strategies below many times, small
#: enough for two cores (each example is one loopback request).
EXAMPLES = 150

# Text that real clients never send but JSON can carry: lone and paired surrogates (as \u escapes),
# NUL and other control characters, quotes and backslashes, non-BMP characters, very long names.
ODD_CHARS = st.sampled_from(["\ud800", "\udfff", "\U0001f600", "\x00", "\n", '"', "\\", "\u2028", "é", "/"])
ODD_TEXT = st.one_of(
    st.text(max_size=20),
    st.lists(st.one_of(ODD_CHARS, st.characters()), max_size=12).map("".join),
    st.sampled_from(NAMES),
    st.integers(min_value=300, max_value=2000).map(lambda n: "n" * n),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False), ODD_TEXT)
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(ODD_TEXT, inner, max_size=4)),
                       max_leaves=12)


def key_case(key: str) -> st.SearchStrategy[str]:
    """Go's decoder matches keys in any letter case; so must we."""
    return st.sampled_from([key, key.lower(), key.upper()])


@st.composite
def node_object(draw: st.DrawFn) -> Any:
    name = draw(st.one_of(ODD_TEXT, SCALARS))
    return draw(st.sampled_from([
        {"metadata": {"name": name, "labels": draw(st.one_of(JSONISH, st.dictionaries(ODD_TEXT, ODD_TEXT)))},
         "status": {"images": draw(st.one_of(JSONISH, st.lists(st.fixed_dictionaries({"names": JSONISH}))))}},
        {"metadata": name},
        name,
    ]))


@st.composite
def extender_args(draw: st.DrawFn) -> Any:
    """Mostly-valid ExtenderArgs with hostile parts, and some plain garbage."""
    pod = draw(st.one_of(st.just(vllm_pod()), st.just(vllm_pod("strict")), JSONISH,
                         st.fixed_dictionaries({"metadata": st.fixed_dictionaries(
                             {"name": ODD_TEXT, "labels": st.dictionaries(ODD_TEXT, ODD_TEXT, max_size=3)})})))
    body: dict[str, Any] = {draw(key_case("Pod")): pod}
    form = draw(st.sampled_from(["names", "nodes", "both", "neither", "garbage"]))
    if form in ("names", "both"):
        body[draw(key_case("NodeNames"))] = draw(st.one_of(
            st.lists(st.one_of(st.sampled_from(NAMES), ODD_TEXT), max_size=8), JSONISH))
    if form in ("nodes", "both"):
        body[draw(key_case("Nodes"))] = draw(st.one_of(
            st.fixed_dictionaries({"items": st.lists(node_object(), max_size=4)}), JSONISH))
    if form == "garbage":
        return draw(JSONISH)
    return body


def encode(value: Any, how: str) -> bytes:
    """JSON text; lone surrogates survive as ``\\u`` escapes (ascii) or raw surrogate bytes (raw)."""
    if how == "ascii":
        return json.dumps(value, ensure_ascii=True).encode()
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


RAW_BODIES = st.one_of(
    st.binary(max_size=64),
    st.integers(min_value=1, max_value=3000).map(lambda n: b'{"Pod":{},"NodeNames":' + b"[" * n + b"]" * n + b"}"),
    st.integers(min_value=1, max_value=3000).map(lambda n: b'{"Pod":' + b'{"a":' * n + b"1" + b"}" * n + b"}"),
    st.just(b'{"Pod":{},"NodeNames":["a"'),
    st.just(b'{"Pod":{},"NodeNames":["\\ud800"]}'),
)


@pytest.fixture(scope="module")
def fuzz_extender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("fuzz")
    with RedisServer(tmp).running() as redis_server:
        load_inventory(redis_server.url, tmp)
        policy = tmp / "policy.yaml"
        policy.write_text(POLICY)
        port = free_port()
        with running(serve_command(policy, port, redis_server.url), tmp, port) as server:
            wait_ready(server)
            yield server


def sent_names(body: Any) -> list[str]:
    """The candidate names as the server would read them (for the 'only nodes that were sent' check)."""
    if not isinstance(body, dict):
        return []
    out: list[str] = []
    for key, value in body.items():
        if key.lower() == "nodenames" and isinstance(value, list):
            out += [v for v in value if isinstance(v, str)]
        if key.lower() == "nodes" and isinstance(value, dict):
            for item in value.get("items") or []:
                meta = item.get("metadata") if isinstance(item, dict) else None
                if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                    out.append(meta["name"])
    return out


def strict_json(raw: bytes) -> Any:
    """``raw`` parsed as Go's decoder parses it: ``NaN`` and ``Infinity``, which Python's json reads
    and writes, are not JSON."""
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in a reply: not JSON, and the scheduler's decoder refuses it")
    return json.loads(raw, parse_constant=refuse)


def check_reply(verb: str, body: Any, status: int, raw: bytes) -> None:
    assert status < 500, (status, raw[:300])
    if status != 200:
        assert status in (400, 413), (status, raw[:300])
        assert isinstance(strict_json(raw)["error"], str)
        return
    strict_json(raw)
    sent = sent_names(body)
    if verb == "prioritize":
        go_prioritize(raw, sent)
    elif verb == "filter":
        cache_mode = isinstance(body, dict) and any(k.lower() == "nodenames" and v is not None
                                                   for k, v in body.items())
        go_filter(raw, sent, cache_mode=cache_mode)
    else:
        report = strict_json(raw)
        assert isinstance(report["nodes"], list)


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@FUZZ
@given(verb=st.sampled_from(["filter", "prioritize", "explain"]), body=extender_args(),
       how=st.sampled_from(["ascii", "raw"]))
def test_extender_args_never_get_a_5xx(fuzz_extender: Server, verb: str, body: Any, how: str) -> None:
    status, raw = fuzz_extender.call("POST", f"/{verb}", encode(body, how))
    check_reply(verb, body, status, raw)


@FUZZ
@given(verb=st.sampled_from(["filter", "prioritize", "explain"]), body=RAW_BODIES)
def test_raw_bodies_never_get_a_5xx(fuzz_extender: Server, verb: str, body: bytes) -> None:
    status, raw = fuzz_extender.call("POST", f"/{verb}", body)
    assert status in (200, 400, 413), (status, raw[:300])
    if status != 200:
        assert isinstance(json.loads(raw)["error"], str)


#: Content-Length values gunicorn's parser refuses (RFC 9110: 1*DIGIT), and one of ASCII digits longer than
#: int() reads (4,300 digits): that one raised out of the parser, so asyncio logged a traceback and dropped
#: the connection with no reply.
BAD_LENGTHS = [
    pytest.param(b"+5", id="plus-sign"),
    pytest.param(b"1_000", id="underscore"),
    pytest.param("\u0665".encode(), id="arabic-indic-digit"),
    pytest.param(b"9" * 4301, id="more-digits-than-int-reads"),
]


@pytest.mark.parametrize("length", BAD_LENGTHS)
def test_a_bad_content_length_gets_400(fuzz_extender: Server, length: bytes) -> None:
    with socket.create_connection(("127.0.0.1", fuzz_extender.port), timeout=10) as s:
        s.sendall(b"POST /prioritize HTTP/1.1\r\nHost: extender\r\nContent-Length: " + length + b"\r\n\r\n")
        reply = b""
        while data := s.recv(65536):
            reply += data
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:300]
    assert "Traceback" not in fuzz_extender.logs()


def test_the_fuzzed_server_counted_no_error_and_logged_no_traceback(fuzz_extender: Server) -> None:
    # Runs after the fuzzers in file order; on its own it still checks a clean server.
    assert fuzz_extender.metric('extender_requests_total{outcome="error"') == 0
    assert "Traceback" not in fuzz_extender.logs()


# ---- the External Metrics API ------------------------------------------------------------------

PATH_PARTS = st.one_of(st.sampled_from(["namespaces", "default", "ml", "extender-desired-replicas",
                                        "extender-forecast-load", "apis", "external.metrics.k8s.io",
                                        "v1beta1", "..", "%00", "%2F", "%ZZ"]), ODD_TEXT)
SELECTORS = st.one_of(ODD_TEXT, st.sampled_from(["workload=qwen3", "workload in (qwen3,llama)", "!workload",
                                                 "workload in (", "a>b", "x=" + "y" * 70, "in in in"]))


def quote_path(parts: list[str]) -> str:
    return "/" + "/".join(quote(p.encode("utf-8", "surrogatepass"), safe="%") for p in parts)


@settings(max_examples=EXAMPLES * 2, deadline=None, derandomize=True)
@given(prefix=st.sampled_from(["/apis/external.metrics.k8s.io/v1beta1/namespaces", "/apis", "/readyz"]),
       parts=st.lists(PATH_PARTS, max_size=4), selector=st.one_of(st.none(), SELECTORS),
       method=st.sampled_from(["GET", "POST", "DELETE"]))
def test_external_metrics_requests_never_get_a_5xx(prefix: str, parts: list[str], selector: str | None,
                                                   method: str) -> None:
    client = metrics_app().test_client()
    path = prefix + quote_path(parts)
    query = "" if selector is None else "?labelSelector=" + quote(selector.encode("utf-8", "surrogatepass"))
    resp = client.open(path + query, method=method)
    assert resp.status_code < 500, (path, query, resp.data[:300])
    assert resp.mimetype == "application/json"
    body = resp.get_json()
    assert body["kind"] in ("Status", "ExternalMetricValueList", "APIGroupList", "APIGroup", "APIResourceList") \
        or body.get("status") == "ok", body
    if body["kind"] == "Status":
        assert body["code"] == resp.status_code
    # whatever the selector named, the app's own series are labelled with the policy's workloads only
    text = client.get("/metrics").get_data(as_text=True)
    labelled = {s.labels["workload"] for f in text_string_to_metric_families(text) for s in f.samples
                if "workload" in s.labels}
    assert labelled == set(WORKLOADS)


def test_the_suite_can_fail() -> None:
    """The property checker rejects a reply naming a node that was not sent (it is not vacuous)."""
    body = {"Pod": {}, "NodeNames": ["a"]}
    with pytest.raises(AssertionError):
        check_reply("prioritize", body, 200, b'[{"Host":"b","Score":1}]')
    with pytest.raises(AssertionError):
        check_reply("filter", body, 500, b'{"error":"x"}')
