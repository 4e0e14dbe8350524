"""The ``prometheus`` signal source against a Prometheus that asks who is calling.

* A real Prometheus (Debian's package) with its own ``--web.config.file``: TLS with a server
  certificate from a test CA, client certificates required (``RequireAndVerifyClientCert``) and a
  basic-auth user whose bcrypt hash is made here. Prometheus checks all of it itself.
* Prometheus cannot check bearer tokens or tenant headers, so for those a small authenticating
  proxy on loopback stands in front of a second, plain Prometheus, as a gateway of a managed
  Prometheus (Cortex, Mimir, Thanos) does: it answers 401 unless ``Authorization: Bearer <token>``
  and ``X-Scope-OrgID: tenant-a`` are right, and forwards everything else to the real server.

Secret and certificate files are changed while the source lives, to show they are read again.
Plus the policy's checks of the section, table-driven. Waits are bounded polls for a server to
come up (a setup bound), never assertions on time.
"""

from __future__ import annotations

import http.server
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from extender import cli
from extender.core.errors import PolicyError, SignalError
from extender.core.policy import parse_policy
from extender.scaler.prometheus import PrometheusSource
from tests.net import free_port
from tests.pki import Pair, make_ca, make_cert
from tests.scaler_policy import make_policy, policy_text
from tests.test_signal_prometheus import Prometheus, running_prometheus

QUERY = "scalar(vector(3.5))"
PASSWORD = "correct horse battery staple"


def source(prometheus: dict[str, Any]) -> PrometheusSource:
    policy = make_policy(signal={"source": "prometheus", "prometheus": {"query": QUERY, **prometheus}})
    return PrometheusSource.for_profile(policy.profile("qwen3"))


def note(src: PrometheusSource) -> str:
    """The observation's note, asserting that the query did not get through."""
    obs = src.observe([], 0.0)
    assert (obs.rate, obs.complete) == (None, False), obs
    return obs.note


def rewrite(path: Path, text: str) -> None:
    """Replace a file's content and move its modification time on, as a kubelet Secret update does."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


# ---- the policy section ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    id: str
    prometheus: dict[str, Any]
    words: str


BAD = [
    Bad("inline password", {"url": "https://p", "basicAuth": {"username": "u", "password": "x"}},
        "password: secrets are not written in the policy"),
    Bad("inline token", {"url": "https://p", "bearerToken": "x"}, "bearerToken: secrets are not written"),
    Bad("credentials in the url", {"url": "https://u:pw@p:9090"}, "credentials in the URL are not allowed"),
    Bad("token and basic", {"url": "https://p", "bearerTokenFile": "/t",
                            "basicAuth": {"username": "u", "passwordFile": "/p"}}, "exclude each other"),
    Bad("relative path", {"url": "https://p", "bearerTokenFile": "token"}, "'token' is not an absolute path"),
    Bad("tls over http", {"url": "http://p", "tls": {"caFile": "/ca.pem"}}, "tls applies to an https:// url only"),
    Bad("cert without key", {"url": "https://p", "tls": {"certFile": "/c.pem"}}, "certFile and keyFile go together"),
    Bad("authorization header", {"url": "https://p", "headers": {"Authorization": "Bearer x"}},
        "Authorization is not allowed here: give bearerTokenFile or basicAuth instead"),
    Bad("bad header name", {"url": "https://p", "headers": {"X Tenant": "a"}}, "'X Tenant' is not a header name"),
    Bad("header value with a newline", {"url": "https://p", "headers": {"X-Scope-OrgID": "a\nb"}},
        "control characters"),
    Bad("not http", {"url": "ftp://p"}, "expected http://HOST"),
    Bad("colon in the user name", {"url": "https://p", "basicAuth": {"username": "a:b", "passwordFile": "/p"}},
        "no ':'"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_the_policy_refuses(case: Bad) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(policy_text(signal={"source": "prometheus", "prometheus": case.prometheus}), "p.yaml")
    messages = [f"{p.path}: {p.message}" for p in err.value.problems]
    assert any(case.words in m for m in messages), messages
    assert all(m.startswith("profiles[0].autoscaling.signal.prometheus") for m in messages), messages


def test_the_policy_takes_every_field() -> None:
    src = source({"url": "https://prom.example:9090", "basicAuth": {"username": "u", "passwordFile": "/p"},
                  "tls": {"caFile": "/ca.pem", "certFile": "/c.pem", "keyFile": "/k.pem"},
                  "headers": {"X-Scope-OrgID": "tenant-a"}})
    assert src.credentials is not None and src.credentials.static_headers == {"X-Scope-OrgID": "tenant-a"}
    assert src.credentials.uses_tls
    assert src.backfill  # a short history is filled by default (docs/scaler.md)
    assert not source({"url": "https://prom.example:9090", "backfill": False}).backfill


# ---- a real Prometheus with TLS, client certificates and basic auth ---------------------------------


@dataclass(frozen=True)
class Secured:
    prometheus: Prometheus
    server_ca: Pair
    client: Pair
    rogue: Pair
    password_file: Path
    directory: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    pki = tmp_path_factory.mktemp("prometheus-pki")
    server_ca = make_ca(pki, "server-ca", "prometheus-test-ca")
    server = make_cert(pki, "server", server_ca, "/CN=prometheus", server=True)
    client_ca = make_ca(pki, "client-ca", "prometheus-clients")
    client = make_cert(pki, "scaler", client_ca, "/CN=extender-scaler")
    rogue = make_cert(pki, "rogue", None, "/CN=extender-scaler")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = (f"tls_server_config:\n  cert_file: {server.cert}\n  key_file: {server.key}\n"
           f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {client_ca.cert}\n"
           f"basic_auth_users:\n  scaler: '{hashed}'\n")
    password_file = pki / "password"
    password_file.write_text(PASSWORD + "\n")  # a Secret made from a file often ends with a newline

    def ready(url: str) -> bool:
        try:
            source({"url": url, "basicAuth": {"username": "scaler", "passwordFile": str(password_file)},
                    "tls": {"caFile": str(server_ca.cert), "certFile": str(client.cert),
                            "keyFile": str(client.key)}}).run("vector(1)")
        except SignalError:
            return False
        return True

    with running_prometheus([], web_config=web, scheme="https", ready=ready) as prom:
        yield Secured(prom, server_ca, client, rogue, password_file, pki)


def secured_section(s: Secured, **changes: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "url": s.prometheus.url,
        "basicAuth": {"username": "scaler", "passwordFile": str(s.password_file)},
        "tls": {"caFile": str(s.server_ca.cert), "certFile": str(s.client.cert), "keyFile": str(s.client.key)},
    }
    section.update(changes)
    return {k: v for k, v in section.items() if v is not None}


@pytest.mark.integration
def test_basic_auth_tls_and_a_client_certificate_get_through(secured: Secured) -> None:
    src = source(secured_section(secured))
    obs = src.observe([], 0.0)
    assert (obs.rate, obs.complete, obs.note) == (3.5, True, "")
    now = float(int(time.time()))  # and a history fill's range queries, the same way
    assert {s.rate for s in src.past(now - 600, now, 15.0)} == {3.5}


@dataclass(frozen=True)
class Refused:
    id: str
    changes: dict[str, Any]
    words: tuple[str, ...]


def refusals(s: Secured) -> list[Refused]:
    wrong = s.directory / "wrong-password"
    wrong.write_text("not the password")
    return [
        Refused("no credentials", {"basicAuth": None}, ("HTTP 401", "check the profile's prometheus")),
        Refused("wrong password", {"basicAuth": {"username": "scaler", "passwordFile": str(wrong)}},
                ("HTTP 401",)),
        Refused("unknown user", {"basicAuth": {"username": "mallory", "passwordFile": str(s.password_file)}},
                ("HTTP 401",)),
        Refused("the system's CAs do not know the server",
                {"tls": {"certFile": str(s.client.cert), "keyFile": str(s.client.key)}},
                ("CERTIFICATE_VERIFY_FAILED",)),
        Refused("no client certificate", {"tls": {"caFile": str(s.server_ca.cert)}}, ("rate query",)),
        Refused("a certificate no CA vouches for",
                {"tls": {"caFile": str(s.server_ca.cert), "certFile": str(s.rogue.cert), "keyFile": str(s.rogue.key)}},
                ("rate query",)),
        Refused("missing password file",
                {"basicAuth": {"username": "scaler", "passwordFile": str(s.directory / "nope")}},
                (f"basicAuth.passwordFile {s.directory / 'nope'}: cannot read: No such file or directory",)),
        Refused("missing CA file", {"tls": {"caFile": str(s.directory / "nope.pem")}},
                (f"tls.caFile {s.directory / 'nope.pem'}: cannot read",)),
        Refused("a key that is not the certificate's",
                {"tls": {"caFile": str(s.server_ca.cert), "certFile": str(s.client.cert), "keyFile": str(s.rogue.key)}},
                ("not a readable PEM certificate and matching key",)),
    ]


@pytest.mark.integration
def test_what_the_secured_prometheus_refuses_is_a_clear_note(secured: Secured) -> None:
    for case in refusals(secured):
        text = note(source(secured_section(secured, **case.changes)))
        assert all(w in text for w in case.words), (case.id, text)


@pytest.mark.integration
def test_a_changed_password_file_is_read_again(secured: Secured, tmp_path: Path) -> None:
    password = tmp_path / "password"
    rewrite(password, PASSWORD)
    src = source(secured_section(secured, basicAuth={"username": "scaler", "passwordFile": str(password)}))
    assert src.run(QUERY) == 3.5
    rewrite(password, "rotated away")
    assert "HTTP 401" in note(src)
    rewrite(password, f"  {PASSWORD}\n")
    assert src.run(QUERY) == 3.5


@pytest.mark.integration
def test_a_renewed_client_certificate_is_read_again(secured: Secured, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    rewrite(cert, secured.rogue.cert.read_text())
    rewrite(key, secured.rogue.key.read_text())
    src = source(secured_section(secured, tls={"caFile": str(secured.server_ca.cert), "certFile": str(cert),
                                               "keyFile": str(key)}))
    note(src)  # refused: nobody vouches for the rogue certificate
    rewrite(cert, secured.client.cert.read_text())
    rewrite(key, secured.client.key.read_text())
    assert src.run(QUERY) == 3.5


# ---- bearer tokens and a tenant, through an authenticating proxy ------------------------------------


class Gate:
    """A gateway on loopback: 401 unless the bearer token and the tenant are right; else forwards to Prometheus."""

    def __init__(self, upstream: str, token: str, tenant: str) -> None:
        self.upstream = upstream
        self.token = token
        self.tenant = tenant
        self.seen: list[dict[str, str]] = []
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gate.seen.append({k.lower(): v for k, v in self.headers.items()})  # names are case-insensitive
                if (self.headers.get("Authorization") != f"Bearer {gate.token}"
                        or self.headers.get("X-Scope-OrgID") != gate.tenant):
                    self._reply(401, b'{"status":"error","error":"unauthorized"}')
                    return
                try:
                    with urllib.request.urlopen(gate.upstream + self.path, timeout=5) as r:
                        self._reply(r.status, r.read())
                except urllib.error.HTTPError as exc:
                    self._reply(exc.code, exc.read())

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="gate", daemon=True)

    def __enter__(self) -> Gate:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def plain() -> Iterator[Prometheus]:
    with running_prometheus([]) as prom:
        yield prom


@pytest.mark.integration
def test_bearer_token_and_tenant_through_a_gateway(plain: Prometheus, tmp_path: Path) -> None:
    token = tmp_path / "token"
    rewrite(token, "first-token\n")
    with Gate(plain.url, token="first-token", tenant="tenant-a") as gate:
        section = {"url": gate.url, "bearerTokenFile": str(token), "headers": {"X-Scope-OrgID": "tenant-a"}}
        src = source(section)
        obs = src.observe([], 0.0)
        assert (obs.rate, obs.complete) == (3.5, True)
        assert gate.seen[-1]["authorization"] == "Bearer first-token"
        assert gate.seen[-1]["x-scope-orgid"] == "tenant-a"
        # a history fill's range queries carry the same credentials
        now = float(int(time.time()))
        assert {s.rate for s in src.past(now - 600, now, 15.0)} == {3.5}
        assert gate.seen[-1]["authorization"] == "Bearer first-token"
        assert gate.seen[-1]["x-scope-orgid"] == "tenant-a"
        # the gateway rotates the token; the source keeps the old one until the file changes
        gate.token = "second-token"
        assert "HTTP 401" in note(src)
        rewrite(token, "second-token")
        assert src.run(QUERY) == 3.5
        # without the tenant header, or for another tenant, the gateway refuses
        assert "HTTP 401" in note(source({"url": gate.url, "bearerTokenFile": str(token)}))
        assert "HTTP 401" in note(source({**section, "headers": {"X-Scope-OrgID": "tenant-b"}}))
        # an emptied token file is an error of its own, not an empty header
        rewrite(token, "\n")
        assert f"bearerTokenFile {token}: cannot read: the file is empty" in note(src)


@pytest.mark.integration
def test_scale_refuses_to_start_without_its_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    missing = tmp_path / "token"
    policy.write_text(policy_text(signal={"source": "prometheus", "prometheus": {
        "url": "https://prom.example:9090", "bearerTokenFile": str(missing)}}))
    assert cli.main(["scale", "--policy", str(policy), "--once", "--data-dir", str(tmp_path / "redis")]) == 1
    err = capsys.readouterr().err
    assert f"profile qwen3: prometheus bearerTokenFile {missing}: cannot read: No such file or directory" in err
    assert "not starting" in err
