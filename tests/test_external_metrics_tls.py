"""Real clients read the External Metrics API over TLS: kubectl and the official Python client.

One ``python -m extender.scaler scale --no-loop`` process (gunicorn, TLS, the same entry ``extender
scale`` uses) serves a published value from a real Redis. It learns its front-proxy and client CAs
from the cluster's ``extension-apiserver-authentication`` ConfigMap and checks bearer tokens and
access through TokenReview / SubjectAccessReview, all served by tests/delegation_double.py. The
certificates are made for the test with ``openssl`` (tests/pki.py).

Waits are bounded polls for the server to come up (a setup bound), never assertions on time.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import urllib3
import yaml
from kubernetes import client as k8s

from extender.state import connect
from tests.conftest import RedisServer
from tests.delegation_double import DelegationDouble, running
from tests.kube_double.waiting import wait_until
from tests.net import free_port, stop
from tests.pki import Pki, make_pki
from tests.scaler_policy import policy_text, publish_decision

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
HPA = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
PATH = "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/extender-desired-replicas"
SELECTOR = "workload%3Dqwen3"
START_TIMEOUT_S = 60.0


@dataclass
class Served:
    url: str
    pki: Pki
    double: DelegationDouble
    directory: Path


def _wait_up(url: str, pki: Pki, process: subprocess.Popen[bytes], log: Path) -> None:
    context = ssl.create_default_context(cafile=str(pki.server_ca.cert))

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"extender scale exited with {process.returncode}: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", context=context, timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    wait_until(up, timeout_s=START_TIMEOUT_S, what="extender scale to come up", interval_s=0.05,
               report=lambda: log.read_text()[-3000:])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("tls")
    pki = make_pki(directory / "pki")
    with RedisServer(tmp_path_factory.mktemp("redis")).running() as redis_server, running() as double:
        double.state.tokens = {"hpa-token": (HPA, ["system:serviceaccounts", "system:serviceaccounts:kube-system"]),
                               "bob-token": ("bob", [])}
        double.state.rule = lambda user, groups, attrs: user in (HPA, "jane")
        double.state.configmap = {
            "client-ca-file": pki.client_ca.pem(),
            "requestheader-client-ca-file": pki.front_proxy_ca.pem(),
            "requestheader-allowed-names": '["front-proxy-client"]',
            "requestheader-username-headers": '["X-Remote-User"]',
            "requestheader-group-headers": '["X-Remote-Group"]',
            "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
        }
        client = connect(redis_server.url, directory)
        publish_decision(client)
        client.close()
        policy = directory / "policy.yaml"
        policy.write_text(policy_text())
        kubeconfig = double.write_kubeconfig(directory / "scaler-kubeconfig.yaml")
        port = free_port()
        log = directory / "scale.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "extender.scaler", "scale", "--policy", str(policy),
                 "--redis-url", redis_server.url, "--kubeconfig", str(kubeconfig), "--no-loop",
                 "--bind", f"127.0.0.1:{port}",
                 "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        url = f"https://127.0.0.1:{port}"
        try:
            _wait_up(url, pki, process, log)
            yield Served(url, pki, double, directory)
        finally:
            stop(process, 30)


# ---- kubectl -------------------------------------------------------------------------------------


def kubeconfig(served: Served, name: str, user: dict[str, Any]) -> Path:
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "scaler", "cluster": {"server": served.url,
                                                       "certificate-authority": str(served.pki.server_ca.cert)}}],
           "users": [{"name": name, "user": user}],
           "contexts": [{"name": name, "context": {"cluster": "scaler", "user": name, "namespace": "default"}}],
           "current-context": name}
    path = served.directory / f"kubeconfig-{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def kubectl(served: Served, config: Path, raw: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed (Debian: apt-get install kubernetes-client, or the upstream binary)")
    return subprocess.run(["kubectl", "--kubeconfig", str(config), "--cache-dir", str(served.directory / "kcache"),
                           "--request-timeout", "20s", "get", "--raw", raw],
                          capture_output=True, text=True, timeout=60, check=False)


def test_kubectl_reads_the_metric_with_a_token(served: Served) -> None:
    done = kubectl(served, kubeconfig(served, "hpa", {"token": "hpa-token"}), f"{PATH}?labelSelector={SELECTOR}")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["kind"] == "ExternalMetricValueList"
    assert body["items"] == [{"metricName": "extender-desired-replicas", "metricLabels": {"workload": "qwen3"},
                              "timestamp": "2025-01-01T12:00:00Z", "window": 15, "value": "5"}]


def test_kubectl_reads_the_metric_with_a_client_certificate(served: Served) -> None:
    config = kubeconfig(served, "jane", {"client-certificate": str(served.pki.client.cert),
                                         "client-key": str(served.pki.client.key)})
    done = kubectl(served, config, f"{PATH}?labelSelector={SELECTOR}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["items"][0]["value"] == "5"
    review = served.double.state.access_reviews[-1]
    assert review["user"] == "jane"
    assert "team-a" in review["groups"]
    assert review["resourceAttributes"] == {"verb": "list", "group": "external.metrics.k8s.io", "version": "v1beta1",
                                            "resource": "extender-desired-replicas", "namespace": "default"}


def test_kubectl_reads_discovery(served: Served) -> None:
    done = kubectl(served, kubeconfig(served, "hpa", {"token": "hpa-token"}), "/apis/external.metrics.k8s.io/v1beta1")
    assert done.returncode == 0, done.stderr
    names = [r["name"] for r in json.loads(done.stdout)["resources"]]
    assert names == ["extender-desired-replicas", "extender-forecast-load", "extender-standby-replicas"]


@pytest.mark.parametrize(("user", "words"), [
    pytest.param({"token": "bob-token"}, "Forbidden", id="forbidden-user"),
    pytest.param({"token": "not-a-token"}, "Unauthorized", id="unknown-token"),
])
def test_kubectl_is_refused_without_the_right_credentials(served: Served, user: dict[str, Any], words: str) -> None:
    done = kubectl(served, kubeconfig(served, "other", user), f"{PATH}?labelSelector={SELECTOR}")
    assert done.returncode != 0
    assert words in done.stderr


# ---- the official Python client ------------------------------------------------------------------


def python_client(served: Served, *, token: str | None = None, cert: tuple[Path, Path] | None = None,
                  headers: dict[str, str] | None = None) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    configuration.host = served.url
    configuration.ssl_ca_cert = str(served.pki.server_ca.cert)
    if token:
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
    if cert:
        configuration.cert_file, configuration.key_file = str(cert[0]), str(cert[1])
    configuration.retries = 0
    api = k8s.ApiClient(configuration)
    for name, value in (headers or {}).items():
        api.set_default_header(name, value)  # type: ignore[no-untyped-call]
    return api


def read_metric(api: k8s.ApiClient, metric: str = "extender-desired-replicas") -> Any:
    return k8s.CustomObjectsApi(api).list_namespaced_custom_object(
        "external.metrics.k8s.io", "v1beta1", "default", metric, label_selector="workload=qwen3")


def test_python_client_reads_both_metrics_with_a_token(served: Served) -> None:
    with python_client(served, token="hpa-token") as api:
        desired = read_metric(api)
        load = read_metric(api, "extender-forecast-load")
    assert desired["items"][0]["value"] == "5"
    assert load["items"][0]["value"] == "17500m"


def test_python_client_through_the_front_proxy(served: Served) -> None:
    # what kube-apiserver's aggregator does: its front-proxy certificate, the caller in X-Remote-*
    before = len(served.double.state.token_reviews)
    with python_client(served, cert=(served.pki.front_proxy.cert, served.pki.front_proxy.key),
                       headers={"X-Remote-User": HPA, "X-Remote-Group": "system:serviceaccounts"}) as api:
        assert read_metric(api)["items"][0]["value"] == "5"
    assert served.double.state.access_reviews[-1]["user"] == HPA
    assert len(served.double.state.token_reviews) == before  # no token involved


def test_identity_headers_from_a_user_certificate_are_ignored(served: Served) -> None:
    with python_client(served, cert=(served.pki.client.cert, served.pki.client.key),
                       headers={"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}) as api:
        read_metric(api, "extender-forecast-load")
    # had the headers been trusted, system:masters would have skipped the review altogether
    review = served.double.state.access_reviews[-1]
    assert (review["user"], review["resourceAttributes"]["resource"]) == ("jane", "extender-forecast-load")


def test_a_certificate_no_ca_signed_fails_the_handshake(served: Served) -> None:
    rogue = (served.pki.rogue.cert, served.pki.rogue.key)
    with python_client(served, cert=rogue, headers={"X-Remote-User": HPA}) as api, \
            pytest.raises((urllib3.exceptions.HTTPError, ssl.SSLError)):
        read_metric(api)


def test_python_client_without_credentials_gets_401(served: Served) -> None:
    # (kubectl would prompt for a password on a 401 without credentials, so this case uses the client)
    with python_client(served) as api, pytest.raises(k8s.ApiException) as err:
        read_metric(api)
    assert err.value.status == 401
    assert json.loads(err.value.body or "")["reason"] == "Unauthorized"


def test_python_client_sees_status_errors(served: Served) -> None:
    with python_client(served, token="hpa-token") as api, pytest.raises(k8s.ApiException) as err:
        k8s.CustomObjectsApi(api).list_namespaced_custom_object(
            "external.metrics.k8s.io", "v1beta1", "default", "extender-desired-replicas",
            label_selector="workload=nope")
    assert err.value.status == 404
    status = json.loads(err.value.body or "")
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "NotFound", 404)


def test_half_sent_tls_handshakes_do_not_stop_the_hpa(served: Served) -> None:
    # Eight clients send the start of a TLS ClientHello and stall (the scaler has 4 request
    # threads). Each handshake is bounded, so the HPA's call is answered once they time out.
    import socket

    port = int(served.url.rsplit(":", 1)[1])
    stalled = []
    try:
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a record header, a few bytes of hello
            stalled.append(s)
        context = ssl.create_default_context(cafile=str(served.pki.server_ca.cert))
        request = urllib.request.Request(f"{served.url}{PATH}?labelSelector={SELECTOR}",
                                         headers={"Authorization": "Bearer hpa-token"})
        with urllib.request.urlopen(request, context=context, timeout=START_TIMEOUT_S) as reply:
            assert reply.status == 200
            assert json.loads(reply.read())["items"][0]["value"] == "5"
    finally:
        for s in stalled:
            s.close()


# ---- --no-delegated-auth: certificates only, the CAs from the flags or the ConfigMap ---------------


class CertificatesOnly(NamedTuple):
    configmap: Callable[[Pki], dict[str, str]]
    flags: tuple[str, ...]
    starts: bool


CERTIFICATES_ONLY = [
    # the ConfigMap was not read with --no-delegated-auth, though the docs and --tls-client-ca's help
    # promise it: the scaler refused to start, blaming an --authentication-skip-lookup nobody gave
    pytest.param(CertificatesOnly(lambda pki: {"client-ca-file": pki.client_ca.pem(),
                                               "requestheader-client-ca-file": pki.front_proxy_ca.pem(),
                                               "requestheader-allowed-names": '["front-proxy-client"]'}, (), True),
                 id="the-configmaps-cas-are-used"),
    pytest.param(CertificatesOnly(lambda pki: {"client-ca-file": pki.client_ca.pem()}, ("--no-auth-configmap",),
                                  False),
                 id="not-with-no-auth-configmap"),
    pytest.param(CertificatesOnly(lambda pki: {}, (), False), id="an-empty-configmap-gives-none"),
]

#: The refusal names the flags by their current names (docs/cli.md), never kube-apiserver's deprecated ones.
REFUSAL = ("extender scale: not starting: the External Metrics API could authenticate no caller: "
           "--no-delegated-auth turns off tokens, and there is no client CA or front-proxy CA (--tls-client-ca, "
           "--tls-front-proxy-ca, or the cluster's extension-apiserver-authentication ConfigMap unless "
           "--no-auth-configmap); every request would be answered 401")


@pytest.mark.parametrize("case", CERTIFICATES_ONLY)
def test_certificates_only_reads_its_cas_from_the_configmap(case: CertificatesOnly, tmp_path: Path,
                                                             redis_server: RedisServer) -> None:
    pki = make_pki(tmp_path / "pki")
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text())
    with running() as double:
        double.state.configmap = case.configmap(pki)
        kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig.yaml")
        port = free_port()
        log = tmp_path / "scale.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "extender.cli", "scale", "--policy", str(policy), "--no-loop",
                 "--redis-url", redis_server.url, "--kubeconfig", str(kubeconfig), "--bind", f"127.0.0.1:{port}",
                 "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key), "--no-delegated-auth",
                 *case.flags],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            if case.starts:
                _wait_up(f"https://127.0.0.1:{port}", pki, process, log)
            else:
                assert process.wait(timeout=START_TIMEOUT_S) == 1, log.read_text()
                assert log.read_text().strip() == REFUSAL
        finally:
            stop(process, 30)
