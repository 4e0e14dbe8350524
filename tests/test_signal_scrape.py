"""The ``scrape`` source end to end: pods discovered through the Kubernetes API double, scraped over HTTP.

Each "pod" is a vLLM-format endpoint on its own loopback address (127.0.0.2, 127.0.0.3) and one shared
port, as pods of a Deployment share a container port. The official client lists them from the API
double with the profile's label selector; counters are set by the test and the clock is passed in,
so rates are exact.
"""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from extender.core.errors import SignalError
from extender.kube.client import KubeClient
from extender.scaler import observation
from extender.scaler.observation import MAX_LOCATION, http_get
from extender.scaler.pods import count_replicas, label_selector, workload_pods
from extender.scaler.scrape import ScrapeSource
from extender.scaler.serve import KubePodLister
from tests.kube_double import KubeDouble
from tests.net import accepting, dripping, free_port, recording
from tests.pki import Pki, make_pki
from tests.scaler_policy import make_policy
from tests.vllm_endpoint import Counters, MetricsEndpoint, pod, serving, vllm_text

pytestmark = pytest.mark.integration

T0 = 1_735_689_600.0


@pytest.fixture
def double() -> Iterator[KubeDouble]:
    with KubeDouble.running() as d:
        yield d


@pytest.fixture
def endpoints() -> Iterator[list[MetricsEndpoint]]:
    with serving(("127.0.0.2", "127.0.0.3")) as eps:
        yield eps


def test_scrape_through_the_api_double(double: KubeDouble, endpoints: list[MetricsEndpoint], tmp_path: Path) -> None:
    port = endpoints[0].port
    profile = make_policy(port=port).profile("qwen3")
    double.apply(pod("qwen3-a", "127.0.0.2"))
    double.apply(pod("qwen3-b", "127.0.0.3"))
    double.apply(pod("qwen3-c", "", ready=False, phase="Pending"))  # starting: counted, not scraped
    double.apply(pod("other", "127.0.0.4", labels={"extender.io/workload": "llama"}))
    client = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        lister = KubePodLister(client)
        source = ScrapeSource.for_profile(profile)

        def observe(now: float) -> tuple[float | None, bool, float]:
            pods = workload_pods(lister.list_pods(label_selector(profile)), profile, "default")
            assert count_replicas(pods).__dict__ == {"ready": 2, "starting": 1}
            obs = source.observe(pods, now)
            return obs.rate, obs.complete, obs.queue

        endpoints[0].counters, endpoints[1].counters = Counters(requests=1000), Counters(requests=500)
        assert observe(T0) == (None, False, 0.0)
        endpoints[0].counters = Counters(requests=1150, waiting=2)
        endpoints[1].counters = Counters(requests=530, waiting=1)
        # (1150 - 1000) / 15 + (530 - 500) / 15 = 10 + 2
        rate, complete, queue = observe(T0 + 15)
        assert rate == pytest.approx(12.0)
        assert (complete, queue) == (True, 3.0)
        endpoints[1].fail_next = 1
        endpoints[0].counters = Counters(requests=1300)
        rate, complete, _ = observe(T0 + 30)
        assert rate == pytest.approx(10.0)
        assert not complete  # b failed: a lower bound
        endpoints[1].counters = Counters(requests=590)
        endpoints[0].counters = Counters(requests=1450)
        rate, complete, _ = observe(T0 + 45)
        assert rate == pytest.approx(10.0 + 2.0)  # b over its 30 s: 60 / 30
        assert complete
        assert all(ep.scrapes == 4 for ep in endpoints)
    finally:
        client.close()
    # the scaler listed pods with the profile's selector, in one call per tick
    assert double.count("list", "pods") == 4


# ---- a pod whose port does not speak HTTP/1 ---------------------------------------------------------------


@contextmanager
def replying(host: str, port: int, reply: bytes) -> Iterator[None]:
    """A TCP server on ``host:port`` that reads a request and answers ``reply`` whatever it was."""
    with recording(host, port, reply):
        yield


def _exposition(content_type: str, counters: Counters) -> bytes:
    body = vllm_text(counters).encode()
    return (f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


#: (name, what 127.0.0.3 answers, the reason its pod has no reading, or None when it is read)
ODD_PORTS = [
    ("http2-only-port", b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64\x00\x04\x00\x10\x00\x00",
     "not an HTTP/1 reply (BadStatusLine"),
    ("broken-chunked-body", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     "not an HTTP/1 reply (IncompleteRead"),
    ("unknown-charset", None, None),
]


@pytest.mark.parametrize(("reply", "reason"), [r[1:] for r in ODD_PORTS], ids=[r[0] for r in ODD_PORTS])
def test_a_pod_whose_port_is_no_http1_is_a_missing_reading(reply: bytes | None, reason: str | None) -> None:
    # one pod's odd port must cost that pod's reading (a lower bound), not raise out of the source:
    # the workload would get no decision, and the scaler log a traceback, at every tick
    port = free_port()
    profile = make_policy(port=port).profile("qwen3")
    pods = workload_pods([pod("qwen3-a", "127.0.0.2"), pod("qwen3-b", "127.0.0.3")], profile, "default")
    source = ScrapeSource.for_profile(profile)
    observations = []
    for k, requests in enumerate((1000.0, 1150.0)):
        good = _exposition("text/plain; version=0.0.4; charset=utf-8", Counters(requests=requests))
        odd = reply if reply is not None else _exposition("text/plain; charset=x-no-such-charset",
                                                           Counters(requests=requests))
        with replying("127.0.0.2", port, good), replying("127.0.0.3", port, odd):
            observations.append(source.observe(pods, T0 + 15.0 * k))
    last = observations[-1]
    if reason is None:
        assert (last.complete, last.answered) == (True, 2)
        assert last.rate == pytest.approx(20.0)
    else:
        assert (last.complete, last.answered) == (False, 1)
        assert last.rate == pytest.approx(10.0)
        assert f"default/qwen3-b: GET http://127.0.0.3:{port}/metrics: {reason}" in last.note


# ---- a pod that answers with a redirect -------------------------------------------------------------------


#: (name, the redirect's status line, the headers the fetch sends)
REDIRECTS = [
    ("301-moved", "301 Moved Permanently", {}),
    ("302-found", "302 Found", {}),
    ("303-see-other", "303 See Other", {}),
    ("307-temporary", "307 Temporary Redirect", {}),
    ("308-permanent", "308 Permanent Redirect", {}),
    ("302-with-a-bearer-token", "302 Found", {"Authorization": "Bearer s3cret-token"}),
    ("307-with-basic-auth", "307 Temporary Redirect", {"Authorization": "Basic dXNlcjpzM2NyZXQ="}),
]


@pytest.mark.parametrize(("status", "headers"), [r[1:] for r in REDIRECTS], ids=[r[0] for r in REDIRECTS])
def test_a_redirect_is_not_followed(status: str, headers: dict[str, str]) -> None:
    # any pod with the workload's labels is scraped: its redirect must not make the scaler GET another
    # address (cloud metadata, a node's kubelet, Redis), nor carry a Prometheus credential there
    port, elsewhere = free_port(), free_port()
    target = f"http://127.0.0.9:{elsewhere}/latest/meta-data/iam/security-credentials/node"
    redirect = f"HTTP/1.1 {status}\r\nLocation: {target}\r\nContent-Length: 0\r\n\r\n".encode()
    secret = b"HTTP/1.1 200 OK\r\nContent-Length: 29\r\n\r\nAccessKeyId SECRET-abcdefghij\n"
    with replying("127.0.0.2", port, redirect), recording("127.0.0.9", elsewhere, secret) as seen:
        with pytest.raises(SignalError) as raised:
            http_get(f"http://127.0.0.2:{port}/metrics", 2.0, headers=headers)
        profile = make_policy(port=port).profile("qwen3")
        pods = workload_pods([pod("qwen3-a", "127.0.0.2")], profile, "default")
        observation = ScrapeSource.for_profile(profile).observe(pods, T0)
    assert seen == []  # the redirect's target was never asked, with or without the credential
    code = status.split(maxsplit=1)[0]
    assert str(raised.value) == (f"GET http://127.0.0.2:{port}/metrics: HTTP {code} redirect to {target!r} "
                                 "not followed (the scaler reads the address it is given)")
    assert (observation.rate, observation.answered) == (None, 0)
    assert f"HTTP {code} redirect to {target!r} not followed" in observation.note
    assert "SECRET" not in observation.note


def test_a_redirects_location_is_quoted_cut_to_its_first_characters() -> None:
    """The pod chose the ``Location``: the error (and the observation's note) quotes at most
    :data:`MAX_LOCATION` characters of it."""
    port = free_port()
    target = "http://127.0.0.9/" + "x" * 4000
    reply = f"HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\n\r\n".encode()
    with replying("127.0.0.2", port, reply), pytest.raises(SignalError) as raised:
        http_get(f"http://127.0.0.2:{port}/metrics", 2.0)
    assert f"redirect to {target[:MAX_LOCATION]!r} not followed" in str(raised.value)
    assert len(str(raised.value)) < MAX_LOCATION + 200


# ---- a hostname whose lookup hangs, fails or gives several addresses -------------------------------------

#: A name only the resolver below knows (a real resolver cannot be made to hang on demand).
HOST = "prometheus.monitoring.test"


@contextmanager
def resolver(monkeypatch: pytest.MonkeyPatch, answer: list[str] | BaseException | None) -> Iterator[threading.Event]:
    """``socket.getaddrinfo`` for :data:`HOST`: ``answer``'s addresses, its error, or (None) no answer
    until the event yielded is set; numeric addresses go to the real one."""
    real = socket.getaddrinfo
    release = threading.Event()

    def lookup(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host != HOST or kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(host, port, *args, **kwargs)
        if answer is None:
            release.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if isinstance(answer, BaseException):
            raise answer
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in answer]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    try:
        yield release
    finally:
        release.set()


#: (row, what the resolver does, the error the fetch raises, or None when it reads the reply)
LOOKUPS = [
    pytest.param(None, r"timed out: no whole reply within 0\.5s", id="lookup-never-answers"),
    pytest.param(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "Name or service not known",
                 id="name-unknown"),
    pytest.param(["127.0.0.2"], None, id="one-address"),
    pytest.param(["127.0.0.4", "127.0.0.2"], None, id="first-address-refuses"),
    pytest.param(["127.0.0.4"], "Connection refused", id="every-address-refuses"),
]


@pytest.mark.parametrize(("answer", "error"), LOOKUPS)
def test_the_fetch_deadline_bounds_the_lookup_of_a_hostname(monkeypatch: pytest.MonkeyPatch,
                                                           answer: list[str] | BaseException | None,
                                                           error: str | None) -> None:
    # getaddrinfo has no timeout: with the cluster's DNS down a Prometheus hostname held the tick for
    # the resolver's own retries (5 s and more per search domain), whatever signal.timeout said
    port = free_port()
    url = f"http://{HOST}:{port}/metrics"
    with replying("127.0.0.2", port, _exposition("text/plain", Counters(requests=7.0))), \
            resolver(monkeypatch, answer) as release:
        if error is None:
            assert "vllm:request_success_total" in http_get(url, FETCH_TIMEOUT_S)
            return
        with pytest.raises(SignalError, match=error) as raised:
            http_get(url, FETCH_TIMEOUT_S)
        # given up on while the lookup still hung, not after it ended
        assert not release.is_set()
    assert str(raised.value).startswith(f"GET {url}: ")


# ---- a pod that answers a byte at a time ------------------------------------------------------------------

#: The whole fetch must end within this (a test value; the policy's signal.timeout defaults to 2 s).
FETCH_TIMEOUT_S = 0.5

#: (what the server sends at once, then a byte every 0.05 s: 4 s in all, each read well within the timeout)
SLOW_REPLIES = [
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 80\r\n\r\n", b"#" * 80,
                 id="body-a-byte-at-a-time"),
    pytest.param(b"", b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 40 + b"\r\nContent-Length: 0\r\n\r\n",
                 id="headers-a-byte-at-a-time"),
    pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"1\r\n#\r\n" * 12 + b"0\r\n\r\n",
                 id="chunks-a-byte-at-a-time"),
]


@pytest.mark.parametrize(("prefix", "drip"), SLOW_REPLIES)
def test_a_pod_that_answers_a_byte_at_a_time_is_a_missing_reading(prefix: bytes, drip: bytes) -> None:
    # urllib's timeout bounds each socket read: a byte a second held `scale --once` past 40 s with a
    # 2 s signal.timeout. The whole fetch is bounded now, and the pod is one missing reading.
    port = free_port()
    profile = make_policy(port=port).profile("qwen3")
    pods = workload_pods([pod("qwen3-a", "127.0.0.2"), pod("qwen3-b", "127.0.0.3")], profile, "default")
    source = ScrapeSource.for_profile(profile)
    source.timeout_s = FETCH_TIMEOUT_S
    good = _exposition("text/plain; version=0.0.4", Counters(requests=1000.0))
    url = f"http://127.0.0.3:{port}/metrics"
    with replying("127.0.0.2", port, good), dripping("127.0.0.3", port, prefix, drip):
        with pytest.raises(SignalError) as raised:
            http_get(url, FETCH_TIMEOUT_S)
        observation = source.observe(pods, T0)
    assert str(raised.value) == f"GET {url}: timed out: no whole reply within {FETCH_TIMEOUT_S:.3g}s"
    assert (observation.expected, observation.answered) == (2, 1)
    assert f"default/qwen3-b: GET {url}: timed out" in observation.note


# ---- every fetch through one opener, each with its own deadline and TLS context ----------------------------

QUICK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nquick\n"
#: Twenty bytes of body, one every 0.05 s: a whole reply needs about a second.
SLOW_PREFIX, SLOW_DRIP = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 20\r\n\r\n", b"#" * 20


@pytest.fixture(scope="module")
def server_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def tls_replying(port: int, pki: Pki, reply: bytes) -> Iterator[None]:
    """An https server on 127.0.0.1 (``pki``'s serving certificate) answering ``reply`` to every request."""
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(pki.server.cert, pki.server.key)

    def answer(conn: socket.socket, _stop: threading.Event) -> None:
        with served.wrap_socket(conn, server_side=True) as tls:  # a client that distrusts it: an OSError
            tls.recv(65536)
            tls.sendall(reply)

    with accepting("127.0.0.1", port, answer):
        yield


#: One fetch: the server asked, its timeout in s, its TLS context, the words of its error (None: it reads).
Fetch = tuple[str, float, str | None, str | None]
#: (row, fetches in order);
#: each fetch after the first must keep its own deadline and context, not the previous fetch's
ONE_OPENER = [
    pytest.param([("quick", 0.5, None, None), ("slow", 5.0, None, None)], id="a-long-deadline-after-a-short-one"),
    pytest.param([("quick", 5.0, None, None), ("slow", 0.5, None, r"timed out: no whole reply within 0\.5s")],
                 id="a-short-deadline-after-a-long-one"),
    pytest.param([("tls", 2.0, "system", "CERTIFICATE_VERIFY_FAILED"), ("tls", 2.0, "server-ca", None)],
                 id="a-trusting-context-after-a-distrusting-one"),
    pytest.param([("tls", 2.0, "server-ca", None), ("tls", 2.0, "system", "CERTIFICATE_VERIFY_FAILED")],
                 id="a-distrusting-context-after-a-trusting-one"),
]


@pytest.mark.parametrize("fetches", ONE_OPENER)
def test_each_fetch_keeps_its_own_deadline_and_context(server_pki: Pki, fetches: list[Fetch]) -> None:
    # the fetches share one opener (building one per fetch was 0.4-0.6 ms, a third of a tick's two
    # Prometheus queries); what differs per fetch travels with its request
    quick, slow, tls = free_port(), free_port(), free_port()
    urls = {"quick": f"http://127.0.0.2:{quick}/metrics", "slow": f"http://127.0.0.3:{slow}/metrics",
            "tls": f"https://127.0.0.1:{tls}/api/v1/query"}
    contexts = {None: None, "system": ssl.create_default_context(),
                "server-ca": ssl.create_default_context(cafile=str(server_pki.server_ca.cert))}
    with replying("127.0.0.2", quick, QUICK), dripping("127.0.0.3", slow, SLOW_PREFIX, SLOW_DRIP), \
            tls_replying(tls, server_pki, QUICK):
        for server, timeout_s, context, error in fetches:
            if error is None:
                assert http_get(urls[server], timeout_s, context=contexts[context]) in ("quick\n", "#" * 20)
                continue
            with pytest.raises(SignalError, match=error) as raised:
                http_get(urls[server], timeout_s, context=contexts[context])
            assert str(raised.value).startswith(f"GET {urls[server]}: ")


def test_fetches_build_one_opener_between_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # urllib's build_opener reads the environment's proxies and lists every handler's methods: done per
    # fetch it added about 0.8 ms to a tick's two Prometheus queries (BENCHMARKS.md, the backfill section)
    built = []

    def counted(*handlers: Any) -> urllib.request.OpenerDirector:
        built.append(handlers)
        return real(*handlers)

    real = urllib.request.build_opener
    monkeypatch.setattr(urllib.request, "build_opener", counted)
    observation._opener.cache_clear()
    port = free_port()
    with replying("127.0.0.2", port, QUICK):
        got = [http_get(f"http://127.0.0.2:{port}/metrics", 2.0) for _ in range(3)]
    observation._opener.cache_clear()  # the next fetch builds one with the real build_opener
    assert got == ["quick\n"] * 3
    assert len(built) == 1
