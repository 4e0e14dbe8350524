"""deploy/: the scheduler configuration names the routes the app serves, and the manifests agree."""

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

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"

#: Fields of kubescheduler.config.k8s.io/v1 Extender (docs/kubernetes-interfaces.md 3); v1 decoding is strict.
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}


@pytest.fixture(scope="module")
def scheduler_config() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "scheduler-config.yaml").read_text())
    return doc


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "extender.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, manifests: dict[str, dict[str, Any]]) -> Flask:
    path = tmp_path_factory.mktemp("deploy") / "policy.yaml"
    path.write_text(manifests["ConfigMap"]["data"]["policy.yaml"])
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


def test_url_port_matches_the_deployment_and_service(scheduler_config: dict[str, Any],
                                                     manifests: dict[str, dict[str, Any]]) -> None:
    port = urlsplit(extender_entry(scheduler_config)["urlPrefix"]).port
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert f"--bind=0.0.0.0:{port}" in container["args"]
    assert any(p["containerPort"] == port for p in container["ports"])
    assert pod["hostNetwork"] is True  # 127.0.0.1 in urlPrefix means: the extender on the scheduler's node
    service_ports = manifests["Service"]["spec"]["ports"]
    assert any(p["port"] == port for p in service_ports)
    assert manifests["Service"]["spec"]["selector"] == manifests["Deployment"]["spec"]["selector"]["matchLabels"]


def test_probes_and_policy_mount(manifests: dict[str, dict[str, Any]], app: Flask) -> None:
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    served = routes(app)
    assert "GET" in served[container["livenessProbe"]["httpGet"]["path"]]
    assert "GET" in served[container["readinessProbe"]["httpGet"]["path"]]
    policy_arg = next(a for a in container["args"] if a.startswith("--policy="))
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policy")
    assert "subPath" not in mount  # a subPath mount never sees ConfigMap updates: no hot reload
    volume = next(v for v in pod["volumes"] if v["name"] == "policy")
    assert volume["configMap"]["name"] == manifests["ConfigMap"]["metadata"]["name"]
    key = Path(policy_arg.split("=", 1)[1]).relative_to(mount["mountPath"])
    assert str(key) in manifests["ConfigMap"]["data"]


def test_configmap_policy_is_valid(manifests: dict[str, dict[str, Any]]) -> None:
    policy = parse_policy(manifests["ConfigMap"]["data"]["policy.yaml"], "deploy/extender.yaml#policy.yaml")
    assert policy.profiles
