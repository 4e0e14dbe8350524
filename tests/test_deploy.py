"""The chart's scheduler wiring: the scheduler configuration names the routes the app serves, and
the manifests agree, in each way the chart runs the extender (self-managed on loopback or with
mutual TLS, and as the second scheduler's sidecar)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from flask import Flask

from extender.api.scheduler.app import create_app
from extender.api.scheduler.settings import Settings
from extender.api.scheduler.verbs import FILTER_VERB, PRIORITIZE_VERB
from extender.core.policy import parse_policy
from tests import chart

#: Fields of kubescheduler.config.k8s.io/v1 Extender (docs/kubernetes-interfaces.md 3); v1 decoding is strict.
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}
#: Each way the chart runs the extender: the values, and the workload and container that serve.
MODES = {
    "self-managed": ({}, "Deployment", "scheduler-extender"),
    "second-scheduler": ({"mode": "second-scheduler"}, "Deployment", "extender-scheduler"),
    "self-managed-tls": ({"extender__listen": "tls"}, "Deployment", "scheduler-extender"),
}


@pytest.fixture(scope="module", params=list(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def manifests(mode: str) -> list[dict[str, Any]]:
    return chart.rendered(**MODES[mode][0])


@pytest.fixture(scope="module")
def scheduler_config(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = chart.one(manifests, "ConfigMap", "extender-scheduler-config")
    doc: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return doc


@pytest.fixture(scope="module")
def workload(mode: str, manifests: list[dict[str, Any]]) -> dict[str, Any]:
    _, kind, name = MODES[mode]
    return chart.one(manifests, kind, name)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, manifests: list[dict[str, Any]]) -> Flask:
    path = tmp_path_factory.mktemp("deploy") / "policy.yaml"
    path.write_text(chart.one(manifests, "ConfigMap", "extender-policy")["data"]["policy.yaml"])
    return create_app(Settings(policy_path=path, start_refresher=False))


def routes(app: Flask) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        out.setdefault(rule.rule, set()).update(rule.methods or ())
    return out


def extender_entry(config: dict[str, Any]) -> dict[str, Any]:
    (entry,) = config["extenders"]
    assert isinstance(entry, dict)
    return entry


def test_scheduler_config_kind(scheduler_config: dict[str, Any]) -> None:
    assert scheduler_config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert scheduler_config["kind"] == "KubeSchedulerConfiguration"
    assert "extenders" in scheduler_config  # top level, not per profile
    assert all("extenders" not in p for p in scheduler_config["profiles"])


def test_verbs_match_the_apps_routes(scheduler_config: dict[str, Any], app: Flask) -> None:
    entry = extender_entry(scheduler_config)
    served = routes(app)
    prefix_path = urlsplit(entry["urlPrefix"]).path.rstrip("/")
    for verb in (entry["filterVerb"], entry["prioritizeVerb"]):
        # kube-scheduler: strings.TrimRight(urlPrefix, "/") + "/" + verb, always POST
        assert "POST" in served[f"{prefix_path}/{verb}"], verb
    assert (entry["filterVerb"], entry["prioritizeVerb"]) == (FILTER_VERB, PRIORITIZE_VERB)
    for unserved in ("bindVerb", "preemptVerb"):
        verb = entry.get(unserved)
        assert not verb or f"{prefix_path}/{verb}" in served, f"{unserved} names a route the app does not serve"


def test_extender_entry_is_the_recommended_shape(scheduler_config: dict[str, Any]) -> None:
    entry = extender_entry(scheduler_config)
    assert set(entry) <= EXTENDER_FIELDS  # strict decoding rejects anything else
    assert entry["nodeCacheCapable"] is True
    assert entry["ignorable"] is True
    assert isinstance(entry["weight"], int) and entry["weight"] > 0  # required > 0 with prioritizeVerb
    assert re.fullmatch(r"\d+(ms|s)", entry["httpTimeout"])
    scheme = urlsplit(entry["urlPrefix"]).scheme
    assert (scheme == "https") == bool(entry.get("enableHTTPS"))
    for resource in entry.get("managedResources", []):
        assert set(resource) <= {"name", "ignoredByScheduler"} and "/" in resource["name"]
    assert 0 <= scheduler_config["percentageOfNodesToScore"] <= 100


def test_the_scheduler_reaches_the_extender_and_nothing_else_can_unauthenticated(
        mode: str, scheduler_config: dict[str, Any], workload: dict[str, Any]) -> None:
    entry = extender_entry(scheduler_config)
    url = urlsplit(entry["urlPrefix"])
    pod = workload["spec"]["template"]["spec"]
    container = chart.container(workload, "extender")
    bind = next(a for a in container["args"] if a.startswith("--bind=")).removeprefix("--bind=")
    host, port = bind.rsplit(":", 1)
    assert url.hostname == "127.0.0.1" and url.port == int(port)  # the extender on the scheduler's node or pod
    assert any(p["containerPort"] == url.port for p in container["ports"])
    if mode == "second-scheduler":
        # beside the scheduler in one pod: loopback is the pod's own
        assert "hostNetwork" not in pod and {c["name"] for c in pod["containers"]} == {"kube-scheduler", "extender"}
    else:
        assert pod["hostNetwork"] is True  # 127.0.0.1 in urlPrefix means: the extender on the scheduler's node
    if host != "127.0.0.1":
        # on every interface only with mutual TLS: a certificate, and client certificates required
        assert mode == "self-managed-tls" and url.scheme == "https" and entry["enableHTTPS"] is True
        args = set(container["args"])
        assert {a.split("=")[0] for a in args} >= {"--tls-cert", "--tls-key", "--tls-client-ca"}
        assert set(entry["tlsConfig"]) == {"serverName", "caFile", "certFile", "keyFile"}
    else:
        assert url.scheme == "http" and mode != "self-managed-tls"


def test_probes_and_policy_mount(mode: str, manifests: list[dict[str, Any]], workload: dict[str, Any],
                                 app: Flask) -> None:
    pod = workload["spec"]["template"]["spec"]
    container = chart.container(workload, "extender")
    served = routes(app)
    if mode == "self-managed-tls":  # kubelet has no client certificate: the port is all it can check
        assert container["livenessProbe"]["tcpSocket"] == container["readinessProbe"]["tcpSocket"]
    else:
        assert "GET" in served[container["livenessProbe"]["httpGet"]["path"]]
        assert "GET" in served[container["readinessProbe"]["httpGet"]["path"]]
    policy_arg = next(a for a in container["args"] if a.startswith("--policy="))
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policy")
    assert "subPath" not in mount  # a subPath mount never sees ConfigMap updates: no hot reload
    volume = next(v for v in pod["volumes"] if v["name"] == "policy")
    config_map = chart.one(manifests, "ConfigMap", "extender-policy")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    key = Path(policy_arg.split("=", 1)[1]).relative_to(mount["mountPath"])
    assert str(key) in config_map["data"]


def test_configmap_policy_is_valid(manifests: list[dict[str, Any]]) -> None:
    text = chart.one(manifests, "ConfigMap", "extender-policy")["data"]["policy.yaml"]
    policy = parse_policy(text, "deploy/helm/extender/policy.yaml")
    assert policy.profiles


def test_one_policy_feeds_every_component(manifests: list[dict[str, Any]]) -> None:
    """Every workload of ours mounts the same ConfigMap, and its --policy points into that mount."""
    readers = 0
    for doc in manifests:
        if doc["kind"] not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for container in pod["containers"]:
            policy = [a for a in container.get("args", []) if a.startswith("--policy=")]
            if not policy:
                continue
            readers += 1
            mount = next(m for m in container["volumeMounts"] if m["name"] == "policy")
            assert Path(policy[0].removeprefix("--policy=")).parent == Path(mount["mountPath"])
            volume = next(v for v in pod["volumes"] if v["name"] == "policy")
            assert volume == {"name": "policy", "configMap": {"name": "extender-policy"}}
    assert readers >= 3  # the extender, the sync and the scaler at least
