"""Fault suite, the scaler's network APIs: the External Metrics API and the KEDA external scaler, fuzzed.

* Label selectors: a reference reader written here from the Kubernetes grammar
  (``k8s.io/apimachinery/pkg/labels``, selector.go: its lexer, parser and ``NewRequirement`` checks)
  decides for every generated selector whether Kubernetes accepts it and which label sets it
  matches; :func:`~extender.api.external_metrics.label_selector.parse_selector` must agree.
* The External Metrics API as production serves it (``python -m extender.scaler scale --no-loop``:
  gunicorn's asyncio worker on loopback, a real Redis): generated paths, queries, methods and
  headers. Every reply is JSON; every error a ``metav1.Status`` with its HTTP code; never a 5xx; a
  metric reply holds exactly the workloads the reference selects.
* Who may call (in-process, through the real :class:`Authenticator`): generated ``Authorization``
  forms, ``X-Remote-*`` headers and peer certificates against a reference of the rules.
* KEDA's four calls (the real gRPC server, a real client): generated ScaledObject references,
  trigger metadata and metric names. Every call is OK with the reference's value, or
  ``INVALID_ARGUMENT``/``NOT_FOUND`` as the reference says; the server keeps serving.

The reference's one deliberate difference from Go: a NUL byte. Go's lexer reads it as the end of the
input (``a=b\\x00garbage`` is ``a=b``); we refuse it, and the generators leave NUL out of that comparison.
Bounded in count; loopback only; no assertion on time.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from werkzeug.datastructures import Headers

from extender.api.external_metrics.app import METRICS, ExternalMetricsApi, create_app
from extender.api.external_metrics.auth import Access, AuthConfig, Authenticator, Name, User
from extender.api.external_metrics.label_selector import SelectorError, parse_selector
from extender.keda import externalscaler_pb2 as pb
from extender.keda.reading import METRIC_NAME, STANDBY_METRIC
from extender.state import connect
from tests.conftest import RedisServer
from tests.kube_double.waiting import wait_until
from tests.net import free_port, stop
from tests.scaler_policy import policy_text, publish_decision
from tests.test_keda_scaler import publish, ref, serving, stub
from tests.test_keda_scaler import settings as keda_settings

ROOT = Path(__file__).resolve().parent.parent
FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])

# ---- the reference: Kubernetes' label selector grammar -------------------------------------------

_QNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SYMBOLS = frozenset("=!(),<>")
_BLANK = frozenset(" \t\r\n")
#: (key, operator, values) with operators "=", "!=", "in", "notin", "exists", "!", ">", "<"
Req = tuple[str, str, frozenset[str]]


class Refused(Exception):  # noqa: N818 (the reference's verdict, not an error of the code under test)
    """Kubernetes refuses the selector."""


def k8s_tokens(text: str) -> list[tuple[str, str]]:
    """apimachinery's lexer: (kind, literal); kinds are the symbol itself, ``in``, ``notin``, ``ID``, ``END``."""
    out: list[tuple[str, str]] = []
    i = 0
    while True:
        while i < len(text) and text[i] in _BLANK:
            i += 1
        if i == len(text):
            return [*out, ("END", "")]
        if text[i] in _SYMBOLS:
            two = text[i:i + 2]
            width = 2 if two in ("==", "!=") else 1
            out.append((text[i:i + width], text[i:i + width]))
            i += width
            continue
        j = i
        while j < len(text) and text[j] not in _SYMBOLS and text[j] not in _BLANK:
            j += 1
        word = text[i:j]
        out.append((word if word in ("in", "notin") else "ID", word))
        i = j


def k8s_key_ok(key: str) -> bool:
    parts = key.split("/")
    if len(parts) > 2 or (len(parts) == 2 and not (parts[0] and len(parts[0]) <= 253 and _DNS.fullmatch(parts[0]))):
        return False
    return 0 < len(parts[-1]) <= 63 and bool(_QNAME.fullmatch(parts[-1]))


def k8s_value_ok(value: str) -> bool:
    return value == "" or (len(value) <= 63 and bool(_QNAME.fullmatch(value)))


def k8s_int(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


def k8s_parse(text: str) -> list[Req]:
    """The requirements Kubernetes reads from ``text``, or :class:`Refused`."""
    tokens, pos = k8s_tokens(text), 0

    def look(as_value: bool = True) -> str:
        kind = tokens[pos][0]
        return "ID" if as_value and kind in ("in", "notin") else kind

    def take(as_value: bool = True) -> tuple[str, str]:
        nonlocal pos
        kind, literal = look(as_value), tokens[pos][1]
        pos += 1
        return kind, literal

    out: list[Req] = []
    if look() == "END":
        return out
    while True:
        kind, key = take()
        op = ""
        if kind == "!":
            op = "!"
            kind, key = take()
        if kind != "ID" or not k8s_key_ok(key):
            raise Refused
        values: set[str] = set()
        if look() in ("END", ","):
            op = op or "exists"
        elif op == "!":
            raise Refused  # "!key" takes no operator
        else:
            op = {"in": "in", "notin": "notin", "=": "=", "==": "=", "!=": "!=", ">": ">", "<": "<"}.get(
                take(as_value=False)[0], "")
            if not op:
                raise Refused
            if op in ("in", "notin"):
                if take()[0] != "(":
                    raise Refused
                if look() == ")":
                    values.add("")
                elif look() in ("ID", ","):
                    while True:
                        kind, literal = take()
                        if kind == "ID":
                            values.add(literal)
                            if look() == ")":
                                break
                            if look() != ",":
                                raise Refused
                        elif kind == ",":
                            if not values:
                                values.add("")
                            if look() == ")":
                                values.add("")
                                break
                            if look() == ",":
                                take()
                                values.add("")
                        else:
                            raise Refused
                else:
                    raise Refused
                take()  # the ")"
            else:
                if look() in ("END", ","):
                    values.add("")
                else:
                    kind, literal = take()
                    if kind != "ID":
                        raise Refused
                    values.add(literal)
                if op in (">", "<") and k8s_int(next(iter(values))) is None:
                    raise Refused
        if not all(k8s_value_ok(v) for v in values):
            raise Refused
        out.append((key, op, frozenset(values)))
        kind, _ = take()
        if kind == "END":
            return out
        if kind != "," or look() not in ("ID", "!"):
            raise Refused


def k8s_matches(requirements: list[Req], labels: Mapping[str, str]) -> bool:
    for key, op, values in requirements:
        has, value = key in labels, labels.get(key, "")
        if op in ("=", "in"):
            ok = has and value in values
        elif op in ("!=", "notin"):
            ok = not has or value not in values
        elif op in ("exists", "!"):
            ok = has == (op == "exists")
        else:
            label, bound = k8s_int(value) if has else None, k8s_int(next(iter(values)))
            ok = label is not None and bound is not None and (label > bound if op == ">" else label < bound)
        if not ok:
            return False
    return True


#: Facts of the grammar the reference must state (so it is not vacuous), and which the parser under
#: test now agrees with: (id, selector, accepted).
GRAMMAR_FACTS = [
    pytest.param("workload in ()", True, id="empty-parens-are-the-empty-value"),
    pytest.param("workload notin ()", True, id="empty-parens-notin"),
    pytest.param("workload in (a,,)", False, id="comma-pair-before-paren"),
    pytest.param("workload in (,,)", False, id="two-commas-alone"),
    pytest.param("workload in (a,,,)", True, id="three-commas-before-paren"),
    pytest.param("in in (notin)", True, id="keywords-as-key-and-value"),
    pytest.param("workload=\x0bqwen3", False, id="vertical-tab-is-part-of-the-value"),
    pytest.param("workload=\u00a0qwen3", False, id="no-break-space-is-part-of-the-value"),
    pytest.param("replicas>-1", False, id="signed-bound-is-no-label-value"),
    pytest.param("replicas>9223372036854775807", True, id="int64-max-bound"),
    pytest.param("replicas>9223372036854775808", False, id="bound-past-int64"),
    pytest.param("!workload=qwen3", False, id="not-exists-takes-no-operator"),
    pytest.param("workload===qwen3", False, id="triple-equals"),
    pytest.param(" \t\r\n", True, id="blank-is-everything"),
]


@pytest.mark.parametrize(("text", "accepted"), GRAMMAR_FACTS)
def test_grammar_facts(text: str, accepted: bool) -> None:
    try:
        k8s_parse(text)
        reference = True
    except Refused:
        reference = False
    assert reference == accepted
    try:
        parse_selector(text)
        ours = True
    except SelectorError as exc:
        ours = False
        assert "label" in str(exc)  # says it is the selector, and quotes the part
    assert ours == accepted


KEYS = ["workload", "tier", "in", "notin", "example.com/app", "a.b_c-d", "replicas"]
WORDS = st.one_of(
    st.sampled_from([*KEYS, "qwen3", "llama", "anywhere", "5", "-5", "+5", "007", "9223372036854775808", "x" * 63,
                     "x" * 64, "Bad.Prefix/x", "a/b/c", "/x", "x/", "-x", "x-", "é", "%3D", "a\x00b"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6),
)
PIECES = st.one_of(WORDS, st.sampled_from(["=", "==", "!=", "!", "(", ")", ",", ",,", "<", ">", " ", "\t", "\n",
                                           " in ", " notin ", "\x0b", "\u00a0", "\u2003"]))
#: Selectors from the grammar's own pieces, most of them near-valid.
SELECTOR_TEXT = st.one_of(
    st.lists(PIECES, max_size=12).map("".join),
    st.builds(lambda k, op, v: f"{k}{op}{v}", st.sampled_from(KEYS), st.sampled_from(["=", "==", "!=", ">", "<"]),
              WORDS),
    st.builds(lambda k, op, vs, sep: f"{k} {op} ({sep.join(vs)})", st.sampled_from(KEYS),
              st.sampled_from(["in", "notin"]), st.lists(st.one_of(WORDS, st.just("")), max_size=4),
              st.sampled_from([",", ", ", ",,"])),
)
LABELS = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(["", "qwen3", "llama", "5", "-5", "in", "007",
                                                                  "9223372036854775808"]), max_size=3)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(texts=st.lists(SELECTOR_TEXT, min_size=1, max_size=3), labels=st.lists(LABELS, max_size=4))
def test_selectors_are_read_as_kubernetes_reads_them(texts: list[str], labels: list[dict[str, str]]) -> None:
    text = ",".join(texts) if len(texts) > 1 else texts[0]
    if "\x00" in text:
        return  # the reference's one difference (module docstring)
    try:
        reference: list[Req] | None = k8s_parse(text)
    except Refused:
        reference = None
    event("Kubernetes refuses" if reference is None else "Kubernetes accepts")
    try:
        ours = parse_selector(text)
    except SelectorError:
        assert reference is None, f"Kubernetes accepts {text!r}, we refuse it"
        return
    assert reference is not None, f"Kubernetes refuses {text!r}, we accept it as {str(ours)!r}"
    for label_set in labels:
        assert ours.matches(label_set) == k8s_matches(reference, label_set), (text, label_set)
    # what we print (in a 404's message) is read back the same way by us and by Kubernetes
    assert sorted(k8s_parse(str(ours))) == sorted(reference)
    assert parse_selector(str(ours)) == ours


# ---- the External Metrics API over the wire ------------------------------------------------------


def mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` three times in four, else ``odd`` (so most requests get past the first check)."""
    return st.integers(0, 3).flatmap(lambda n: odd if n == 0 else usual)


#: The scaler policy's autoscaled workloads and their namespaces (tests/scaler_policy.py).
SERVED = {"qwen3": "default", "llama": "ml"}
PREFIX = "/apis/external.metrics.k8s.io/v1beta1/namespaces"


@dataclass
class Scale:
    port: int
    log: Path
    process: subprocess.Popen[bytes]

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def raw(self, request: bytes) -> bytes:
        """``request`` as bytes on a new connection; everything the server sends before it closes."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            sock.sendall(request)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scale]:
    """``extender scale --no-loop`` as production runs it, without TLS or auth (those are below), with
    one decision published for ``qwen3``."""
    directory = tmp_path_factory.mktemp("scale-api")
    with RedisServer(directory).running() as redis_server:
        client = connect(redis_server.url, directory)
        publish_decision(client, ttl_s=600)
        client.close()
        policy = directory / "policy.yaml"
        policy.write_text(policy_text())
        port = free_port()
        log = directory / "scale.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "extender.scaler", "scale", "--policy", str(policy), "--redis-url",
                 redis_server.url, "--no-loop", "--insecure-no-auth", "--bind", f"127.0.0.1:{port}"],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        served = Scale(port, log, process)

        def up() -> bool:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                conn = served.connection()
                conn.request("GET", "/healthz")
                return conn.getresponse().status == 200
            except OSError:
                return False

        try:
            wait_until(up, timeout_s=60, what="extender scale to come up", interval_s=0.05)
            yield served
        finally:
            stop(process, 30)


def check_json_reply(status: int, content_type: str, raw: bytes) -> dict[str, Any]:
    """What every reply of the API is: JSON, never a 5xx (the store is up), an error as a Status."""
    assert status < 500, (status, raw[:300])
    assert content_type == "application/json", (status, content_type, raw[:300])
    body: dict[str, Any] = json.loads(raw)
    if status >= 400:
        assert (body["kind"], body["apiVersion"], body["status"], body["code"]) == ("Status", "v1", "Failure", status)
        assert body["reason"] and body["message"], body
    return body


SEGMENTS = st.one_of(
    st.sampled_from(["default", "ml", "other", "", ".", "..", "a/b", "%", "%2F", "?", "#", " ", "x" * 300]),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=10),
)
METRIC_SEGMENTS = st.one_of(st.sampled_from([*METRICS, "extender-desired-replicas/", "Extender-Desired-Replicas"]),
                            SEGMENTS)


#: A selector an HPA would send (most of them match), or one from the grammar's pieces.
WIRE_SELECTORS = mostly(st.sampled_from(["workload=qwen3", "workload in (qwen3,llama)", "workload notin ()",
                                         "!workload", "workload", "workload!=llama", "workload in ()"]),
                        SELECTOR_TEXT)


@FUZZ
@given(namespace=mostly(st.sampled_from(["default", "ml", "other"]), SEGMENTS),
       metric=mostly(st.sampled_from(list(METRICS)), METRIC_SEGMENTS),
       selectors=st.lists(WIRE_SELECTORS, max_size=2),
       other=st.sampled_from(["", "&labelselector=workload%3Dnope", "&watch=true", "&labelSelector", "&&", "&=x"]),
       method=mostly(st.just("GET"), st.sampled_from(["POST", "PUT", "DELETE", "OPTIONS"])),
       accept=st.sampled_from([None, "application/json", "application/vnd.kubernetes.protobuf,application/json",
                               "text/html", "*/*;q=0.1"]))
def test_metric_requests_over_the_wire_are_answered_as_the_reference_says(
        scale: Scale, *, namespace: str, metric: str, selectors: list[str], other: str, method: str,
        accept: str | None) -> None:
    selectors = [s for s in selectors if "\x00" not in s]
    path = f"{PREFIX}/{quote(namespace, safe='')}/{quote(metric, safe='')}"
    query = "&".join(f"labelSelector={quote(s, safe='')}" for s in selectors) + other
    conn = scale.connection()
    try:
        conn.request(method, f"{path}?{query}", headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        status, ctype, raw = resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()
    body = check_json_reply(status, ctype, raw)
    event(f"HTTP {status}")  # --hypothesis-show-statistics: every outcome is reached
    if "/" in namespace + metric or not namespace or not metric:  # no such path
        assert status == 404, (status, body)
        return
    if method not in ("GET", "HEAD"):
        assert status == 405 and "GET" in (resp.getheader("Allow") or ""), (status, body)
        return
    if metric not in METRICS:
        assert status == 404 and "could not find the metric" in body["message"], (status, body)
        return
    selector = selectors[0] if selectors else ""
    try:
        requirements = k8s_parse(selector)
    except Refused:
        assert status == 400, (selector, status, body)
        return
    expected = sorted(w for w, ns in SERVED.items() if ns == namespace and k8s_matches(requirements, {"workload": w}))
    if not expected:
        assert status == 404 and "matches the selector" in body["message"], (selector, status, body)
        return
    assert status == 200, (selector, status, body)
    assert [item["metricLabels"]["workload"] for item in body["items"]] == expected
    assert all(item["metricName"] == metric for item in body["items"])


def test_the_fuzzed_server_logged_no_traceback(scale: Scale) -> None:
    conn = scale.connection()
    conn.request("GET", f"{PREFIX}/default/extender-desired-replicas?labelSelector=workload%3Dqwen3")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["items"][0]["value"] == "5"
    assert "Traceback" not in scale.log.read_text(errors="replace")


#: Requests gunicorn answers before the app sees them, and a method the app does not serve:
#: (id, raw request, code). They were gunicorn's text/plain (or Flask's empty text/html 200 for OPTIONS).
TRANSPORT = [
    pytest.param(b"GET " + PREFIX.encode() + b"/default/" + b"m" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
                 id="request-line-too-long"),
    pytest.param(b"GET " + PREFIX.encode() + b"/d\xffefault/extender-desired-replicas HTTP/1.1\r\nHost: x\r\n\r\n",
                 400, id="raw-byte-in-the-path"),
    pytest.param(b"GET /apis HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, id="bad-content-length"),
    # Content-Length is 1*DIGIT (RFC 9110 8.6): gunicorn refuses what Python's int() would read (a sign,
    # 1_000, another script's digits) before the app sees the request, so asgi._content_length only ever
    # reads ASCII digits; more digits than int() reads raised out of gunicorn's parser (a traceback, no
    # reply) until asgi._parse_errors_answered
    *(pytest.param(b"POST /apis HTTP/1.1\r\nHost: x\r\nContent-Length: " + value + b"\r\n\r\n", 400,
                   id=f"content-length-{name}")
      for name, value in (("plus-sign", b"+5"), ("minus-sign", b"-5"), ("underscore", b"1_000"),
                          ("arabic-indic", "\u0665".encode()), ("full-width", "\uff15".encode()),
                          ("inner-blank", b"1 0"), ("more-digits-than-int-reads", b"9" * 4301))),
    pytest.param(b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400, id="asterisk-target"),
    pytest.param(b"GET /apis HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"p" * 9000 + b"\r\n\r\n", 431,
                 id="header-line-too-long"),
    pytest.param(b"OPTIONS /apis HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405, id="options"),
]


@pytest.mark.parametrize(("request_bytes", "code"), TRANSPORT)
def test_malformed_requests_get_a_status_too(scale: Scale, request_bytes: bytes, code: int) -> None:
    raw = scale.raw(request_bytes)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])}
    assert status == code, raw[:300]
    check_json_reply(status, headers[b"content-type"].decode(), body)
    assert "Traceback" not in scale.log.read_text(errors="replace")


# ---- who may call: the authentication and authorization rules ------------------------------------


def _dn(cn: str, org: str = "") -> tuple[tuple[tuple[str, str], ...], ...]:
    return ((("commonName", cn),),) + (((("organizationName", org),),) if org else ())


FRONT_PROXY_CA: Name = _dn("front-proxy-ca")
CLIENT_CA: Name = _dn("kubernetes")
CERTS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "front-proxy": {"issuer": FRONT_PROXY_CA, "subject": _dn("front-proxy-client")},
    "front-proxy-other-name": {"issuer": FRONT_PROXY_CA, "subject": _dn("someone-else")},
    "client": {"issuer": CLIENT_CA, "subject": _dn("jane", "team")},
    "client-no-cn": {"issuer": CLIENT_CA, "subject": ()},
    "unknown-issuer": {"issuer": _dn("rogue"), "subject": _dn("front-proxy-client")},
}
TOKENS = {"hpa-token": User("hpa", ("system:serviceaccounts",)), "bob-token": User("bob")}
#: Who the reviewer lets list the metrics.
ALLOWED = {"hpa", "jane", "proxied"}


class Reviews:
    def review_token(self, token: str) -> User | None:
        return TOKENS.get(token)

    def review_access(self, user: User, access: Access) -> tuple[bool, str]:
        return user.name in ALLOWED, ""


def expected_auth(cert: str, headers: Headers) -> tuple[int, str | None]:
    """The reference: (code, user name) for a discovery-free metric request (module docstring of auth.py)."""
    if cert == "front-proxy":
        # a WSGI server joins repeated headers with commas; the name is the whole value, never split
        # (a name may hold a comma: reading its first part would take another identity), so two
        # X-Remote-User headers name nobody the reviewer allows
        name = ", ".join(headers.getlist("X-Remote-User")).strip()
        groups = {part.strip() for v in headers.getlist("X-Remote-Group") for part in v.split(",")}
        if name:
            return (200 if name in ALLOWED or "system:masters" in groups else 403), name
    if cert == "client":
        return 200, "jane"
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        user = TOKENS.get(token)
        if user is None:
            return 401, None
        return (200 if user.name in ALLOWED else 403), user.name
    return 401, None


HEADER_TEXT = st.one_of(st.sampled_from(["proxied", "bob", "", " ", "system:masters", "a,b", "%41"]),
                        st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=8))


@FUZZ
@given(cert=st.sampled_from(list(CERTS)),
       authorization=st.one_of(st.none(), st.sampled_from(["Bearer hpa-token", "bearer hpa-token", "BEARER  bob-token ",
                                                           "Bearer", "Bearer ", "Basic aHBhOng=", "Bearer nope",
                                                           "Token hpa-token", "Bearerhpa-token", "Bearer hpa-token x"]),
                               HEADER_TEXT.map(lambda t: "Bearer " + t)),
       users=st.lists(HEADER_TEXT, max_size=2), groups=st.lists(HEADER_TEXT, max_size=2),
       extras=st.dictionaries(st.sampled_from(["X-Remote-Extra-Scopes", "x-remote-extra-a%2Fb", "X-Remote-Extra-"]),
                              HEADER_TEXT, max_size=2),
       path=st.sampled_from([f"{PREFIX}/default/extender-desired-replicas?labelSelector=workload%3Dqwen3",
                             f"{PREFIX}/ml/extender-forecast-load", "/apis"]))
def test_who_may_call_follows_the_rules(*, cert: str, authorization: str | None, users: list[str], groups: list[str],
                                        extras: dict[str, str], path: str) -> None:
    config = AuthConfig(requestheader_cas=frozenset({FRONT_PROXY_CA}), allowed_names=("front-proxy-client",),
                        client_cas=frozenset({CLIENT_CA}))
    reviews = Reviews()
    app = create_app(ExternalMetricsApi(published=lambda: {}, workloads={"qwen3": "default", "llama": "ml"},
                                        auth=Authenticator(config, tokens=reviews, access=reviews)))
    headers = Headers()
    if authorization is not None:
        headers.add("Authorization", authorization)
    for user in users:
        headers.add("X-Remote-User", user)
    for group in groups:
        headers.add("X-Remote-Group", group)
    for name, value in extras.items():
        headers.add(name, value)
    environ = {} if CERTS[cert] is None else {"extender.peer_cert": CERTS[cert]}
    resp = app.test_client().get(path, headers=headers, environ_base=environ)
    body = check_json_reply(resp.status_code, resp.mimetype or "", resp.data)
    code, _ = expected_auth(cert, headers)
    if path == "/apis" and code == 403:
        code = 200  # discovery needs authentication only
    assert resp.status_code == code, (cert, headers, body)
    if code == 401:
        assert body["reason"] == "Unauthorized"
    if code == 403:
        assert body["reason"] == "Forbidden" and "cannot list" in body["message"]


# ---- KEDA's external scaler ---------------------------------------------------------------------

_PROFILE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: The scaler policy's autoscaled workloads: namespace and minReplicas (tests/scaler_policy.py).
KEDA_SERVED = {"qwen3": ("default", 1), "llama": ("ml", 0)}
#: What is published: qwen3 desired 3 with 2 standby placeholders; llama nothing yet.
KEDA_PUBLISHED = {"qwen3": (3, 2)}


def keda_expected(call: str, namespace: str, metadata: Mapping[str, str],
                  metric_name: str) -> tuple[grpc.StatusCode, int | bool | None]:
    """The reference: the status of ``call`` and, when OK, the value (GetMetrics) or activity."""
    workload = metadata.get("workload")
    if (workload is None or len(workload) > 63 or not _PROFILE_NAME.fullmatch(workload)
            or ("namespace" in metadata and not (len(metadata["namespace"]) <= 63
                                                 and _DNS_LABEL.fullmatch(metadata["namespace"])))
            or metadata.get("metric", METRIC_NAME) not in (METRIC_NAME, STANDBY_METRIC)):
        return grpc.StatusCode.INVALID_ARGUMENT, None
    scope = metadata.get("namespace") or namespace
    if workload not in KEDA_SERVED or KEDA_SERVED[workload][0] != scope:
        return grpc.StatusCode.NOT_FOUND, None
    metric = metadata.get("metric", METRIC_NAME)
    if call == "GetMetrics" and metric_name != metric:
        return grpc.StatusCode.NOT_FOUND, None
    desired, standby = KEDA_PUBLISHED.get(workload, (0, 0))
    if call == "GetMetricSpec":
        return grpc.StatusCode.OK, None
    value = standby if metric == STANDBY_METRIC else desired
    if call == "GetMetrics":
        return grpc.StatusCode.OK, value
    return grpc.StatusCode.OK, value > 0 if metric == STANDBY_METRIC else max(value, KEDA_SERVED[workload][1]) > 0


@pytest.fixture(scope="module")
def keda(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    directory = tmp_path_factory.mktemp("keda-fuzz")
    with RedisServer(directory).running() as redis_server:
        publish(redis_server.url, directory, {w: (d, 5.0) for w, (d, _) in KEDA_PUBLISHED.items()}, standby=2)
        with serving(keda_settings(), redis_server.url, directory) as running, \
                grpc.insecure_channel(running.address) as channel:
            yield stub(channel)


KEDA_TEXT = st.one_of(
    st.sampled_from(["qwen3", "llama", "batch", "default", "ml", "", "qwen3\n", "ml\n", " ml", "QWEN3", "qwen3.",
                     "kube-system", "ǅ", "\u212a", "x" * 64, "n" * 5000]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
)
#: Trigger metadata: KEDA's own keys and others, then (mostly) a namespace and a metric of ours.
KEDA_METADATA = st.builds(
    lambda other, namespace, metric: {**other, **namespace, **metric},
    st.dictionaries(st.one_of(st.sampled_from(["scalerAddress", "Workload", "workload ", "NAMESPACE"]), KEDA_TEXT),
                    KEDA_TEXT, max_size=2),
    mostly(st.one_of(st.just({}), st.sampled_from(["default", "ml"]).map(lambda n: {"namespace": n})),
           KEDA_TEXT.map(lambda n: {"namespace": n})),
    mostly(st.one_of(st.just({}), st.sampled_from([METRIC_NAME, STANDBY_METRIC]).map(lambda m: {"metric": m})),
           KEDA_TEXT.map(lambda m: {"metric": m})))


@FUZZ
@given(call=st.sampled_from(["IsActive", "GetMetricSpec", "GetMetrics", "StreamIsActive"]),
       namespace=mostly(st.sampled_from(["default", "ml"]), KEDA_TEXT), name=KEDA_TEXT,
       workload=mostly(st.sampled_from(["qwen3", "llama"]), st.one_of(st.sampled_from([None, "batch"]), KEDA_TEXT)),
       metadata=KEDA_METADATA,
       metric_name=mostly(st.sampled_from([METRIC_NAME, STANDBY_METRIC]), KEDA_TEXT))
def test_keda_calls_are_answered_as_the_reference_says(keda: Any, *, call: str, namespace: str, name: str,
                                                       workload: str | None, metadata: dict[str, str],
                                                       metric_name: str) -> None:
    if workload is not None:  # most calls name a workload, as a ScaledObject's trigger does
        metadata = {**metadata, "workload": workload}
    code, value = keda_expected(call, namespace, metadata, metric_name)
    event(f"{call} {code.name}")
    request = ref(namespace, metadata, name)
    try:
        if call == "GetMetrics":
            reply = keda.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=request, metricName=metric_name), timeout=30)
            got: Any = reply.metricValues[0].metricValue
        elif call == "StreamIsActive":
            stream = keda.StreamIsActive(request, timeout=30)
            got = next(stream).result
            stream.cancel()
        elif call == "GetMetricSpec":
            spec = keda.GetMetricSpec(request, timeout=30).metricSpecs[0]
            assert spec.metricName == metadata.get("metric", METRIC_NAME) and spec.targetSize == 1
            got = None
        else:
            got = keda.IsActive(request, timeout=30).result
    except grpc.RpcError as exc:
        assert exc.code() == code, (call, namespace, metadata, metric_name, exc.code(), exc.details())
        assert 0 < len(exc.details() or "") < 4000, exc.details()
        return
    assert code == grpc.StatusCode.OK, (call, namespace, metadata, metric_name, got)
    assert got == value, (call, namespace, metadata, got, value)


#: Trigger metadata whose names only looked valid: Python's ``$`` also matches before a final line
#: feed, so these were read as names and answered NOT_FOUND instead of INVALID_ARGUMENT.
KEDA_ROWS = [
    pytest.param("default", {"workload": "qwen3\n"}, id="workload-with-a-trailing-line-feed"),
    pytest.param("default", {"workload": "llama", "namespace": "ml\n"}, id="namespace-with-a-trailing-line-feed"),
]


@pytest.mark.parametrize(("namespace", "metadata"), KEDA_ROWS)
def test_keda_names_are_whole_names(keda: Any, namespace: str, metadata: dict[str, str]) -> None:
    assert keda_expected("IsActive", namespace, metadata, METRIC_NAME)[0] == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        keda.IsActive(ref(namespace, metadata), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "\\n" in (err.value.details() or "")  # the name is quoted, its line feed shown


def test_keda_still_serves_after_the_fuzzing(keda: Any) -> None:
    assert keda.IsActive(ref("default", {"workload": "qwen3"}), timeout=30).result is True
