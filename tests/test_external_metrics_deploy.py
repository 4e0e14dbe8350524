"""The chart's scaler: the manifests agree with the code and with each other, and the RBAC is what it calls.

* the scaler Deployment runs ``extender scale`` with arguments the real parser accepts, on the policy
  the chart ships, which autoscales the workload the example HPA (deploy/examples/hpa.yaml) names,
  with the same bounds; with ``metrics.mode: keda`` it runs the loop alone, serving nothing;
* the APIService points at the scaler's Service and port, under the exact name the aggregator needs;
* the example HPA reads a metric the API serves, with the selector label items carry;
* the scaler's RBAC: its own calls run against the API double with those rules enforced
  (pods, every call allowed, every grant used); the delegated-auth calls are the ones the built-in
  roles it binds grant; the metrics reader role names exactly the served metrics.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.api.external_metrics.app import GROUP, METRICS, VERSION, WORKLOAD_LABEL
from extender.core.policy import parse_policy
from extender.kube.client import KubeClient
from extender.scaler import commands
from extender.scaler.loop import ScaleLoop, scaled_profiles
from extender.scaler.serve import KubePodLister
from extender.state import connect
from extender.state.decisions import DecisionStore
from extender.state.history import HistoryStore
from extender.state.lock import LeaderLock
from tests import chart
from tests.conftest import RedisServer
from tests.kube_double import Authorizer, KubeDouble
from tests.vllm_endpoint import Counters, pod, serving

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "examples"
SCALER = "system:serviceaccount:kube-system:extender-scaler"
HPA = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"

#: What the built-in roles the scaler is bound to grant (Kubernetes' bootstrap policy).
BUILT_IN = {
    ("ClusterRole", "system:auth-delegator"): {("create", "authentication.k8s.io", "tokenreviews"),
                                               ("create", "authorization.k8s.io", "subjectaccessreviews")},
    ("Role", "extension-apiserver-authentication-reader"): {("get", "", "configmaps"), ("list", "", "configmaps"),
                                                            ("watch", "", "configmaps")},
}
#: The delegated-auth calls of extender/kube/delegation.py and the requests they make.
DELEGATION_CALLS = {
    "create_token_review": ("create", "authentication.k8s.io", "tokenreviews"),
    "create_subject_access_review": ("create", "authorization.k8s.io", "subjectaccessreviews"),
    "read_namespaced_config_map": ("get", "", "configmaps"),
}


def docs(**values: str) -> list[dict[str, Any]]:
    return chart.rendered(**values)


def one(kind: str, name: str | None = None, **values: str) -> dict[str, Any]:
    return chart.one(docs(**values), kind, name)


def example(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    return dict(doc)


def policy_text() -> str:
    return str(one("ConfigMap", "extender-policy")["data"]["policy.yaml"])


def scale_args(**values: str) -> tuple[dict[str, Any], argparse.Namespace]:
    deployment = one("Deployment", "extender-scaler", **values)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser(prog="extender")
    commands.register(parser.add_subparsers(dest="command", required=True))
    return container, parser.parse_args([*container["command"][1:], *container["args"]])


def test_the_deployment_runs_extender_scale_with_valid_arguments() -> None:
    container, args = scale_args()
    assert container["command"] == ["extender"]
    assert args.command == "scale" and args.scale_command is None
    spec = one("Deployment", "extender-scaler")["spec"]
    assert spec["replicas"] >= 2  # a standby to take over
    pod_spec = spec["template"]["spec"]
    assert pod_spec["serviceAccountName"] == "extender-scaler"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert Path(args.policy).parent == Path(mounts["policy"])
    assert volumes["policy"]["configMap"]["name"] == one("ConfigMap", "extender-policy")["metadata"]["name"]
    assert Path(args.tls_cert).parent == Path(mounts["tls"]) == Path(args.tls_key).parent
    assert not args.insecure_no_auth
    env = {e["name"] for e in container["env"]}
    assert {"REDIS_URL", "POD_NAME"} <= env
    (port,) = container["ports"]
    assert args.bind.endswith(f":{port['containerPort']}")
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
        assert container[probe]["httpGet"]["port"] == port["containerPort"]
    assert one("PodDisruptionBudget", "extender-scaler")["spec"]["minAvailable"] == 1  # a drain leaves one


def test_beside_keda_the_scaler_runs_its_loop_and_serves_only_its_metrics() -> None:
    container, args = scale_args(metrics__mode="keda")
    assert args.no_metrics_api and not args.tls_cert
    (port,) = container["ports"]
    assert port["name"] == "metrics" and args.metrics_bind == f"0.0.0.0:{port['containerPort']}"
    assert "livenessProbe" not in container
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs(metrics__mode="keda")}
    assert ("APIService", f"{VERSION}.{GROUP}") not in kinds  # KEDA keeps the group
    assert ("Service", "extender-scaler") not in kinds and ("Deployment", "extender-keda-scaler") in kinds


def test_the_shipped_policy_autoscales_the_example_hpas_workload() -> None:
    policy = parse_policy(policy_text(), "deploy/helm/extender/policy.yaml")
    scaled = {p.name: p for p in scaled_profiles(policy)}
    hpa = example("hpa.yaml")
    (metric,) = hpa["spec"]["metrics"]
    external = metric["external"]
    assert external["metric"]["name"] in METRICS
    workload = external["metric"]["selector"]["matchLabels"][WORKLOAD_LABEL]
    profile = scaled[workload]
    assert profile.autoscaling is not None
    assert profile.autoscaling.namespace == hpa["metadata"]["namespace"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        profile.autoscaling.min_replicas, profile.autoscaling.max_replicas)
    assert external["target"] == {"type": "AverageValue", "averageValue": "1"}
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["policies"]
    # the commented alternative's target is the profile's capacity
    text = (EXAMPLES / "hpa.yaml").read_text()
    assert profile.capacity is not None
    assert f'averageValue: "{profile.capacity.per_replica:g}"' in text


def test_the_apiservice_points_at_the_scalers_service() -> None:
    api = one("APIService")
    assert api["apiVersion"] == "apiregistration.k8s.io/v1"
    assert api["metadata"]["name"] == f"{VERSION}.{GROUP}"
    spec = api["spec"]
    assert (spec["group"], spec["version"]) == (GROUP, VERSION)
    service = one("Service", "extender-scaler")
    assert (spec["service"]["name"], spec["service"]["namespace"]) == (
        service["metadata"]["name"], service["metadata"]["namespace"])
    (port,) = service["spec"]["ports"]
    assert spec["service"]["port"] == port["port"] == 443
    container, _ = scale_args()
    assert port["targetPort"] == container["ports"][0]["name"]
    assert spec["groupPriorityMinimum"] > 0 and spec["versionPriority"] > 0


def test_the_reader_role_names_exactly_the_served_metrics_and_the_hpa_gets_no_binding() -> None:
    # The HPA controller's access comes from Kubernetes' bootstrap role (tests/test_cluster_deploy.py
    # asks the real authorizer); a binding of ours for it would be a grant nothing needs.
    assert Authorizer(docs()).rules_for(HPA) == []
    (reader,) = [d for d in docs()
                 if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "extender-external-metrics-reader"]
    (rule,) = reader["rules"]
    assert (set(rule["apiGroups"]), set(rule["resources"])) == ({GROUP}, set(METRICS))
    assert "list" in rule["verbs"]  # what the SubjectAccessReview for a metric read asks for


def test_delegated_auth_calls_are_what_the_bound_built_in_roles_grant() -> None:
    source = (ROOT / "extender" / "kube" / "delegation.py").read_text()
    called = set(re.findall(r"self\._(?:authn|authz|core)\.(\w+)\(", source))
    assert called == set(DELEGATION_CALLS)
    bound = set()
    for d in docs():
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(
                s.get("name") == "extender-scaler" for s in d["subjects"]):
            ref = (d["roleRef"]["kind"], d["roleRef"]["name"])
            if ref in BUILT_IN:
                if d["kind"] == "RoleBinding":
                    assert d["metadata"]["namespace"] == "kube-system"  # where the ConfigMap is
                bound |= BUILT_IN[ref]
    assert set(DELEGATION_CALLS.values()) <= bound


@pytest.mark.integration
def test_the_scaler_loop_runs_within_its_grants(redis_server: RedisServer, tmp_path: Path) -> None:
    # the scaler's account with its warmer's grants left out (tests/test_rbac.py checks those)
    authorizer = Authorizer([d for d in docs(warmer__taintNodes="false")
                             if "extender-warmer" not in d["metadata"]["name"]])
    tokens = {"scaler-token": SCALER, "other-token": "system:serviceaccount:x:y"}
    with serving(("127.0.0.2",)) as (endpoint,), KubeDouble.running(authorizer=authorizer, tokens=tokens) as double:
        endpoint.counters = Counters(requests=10)
        text = policy_text().replace("port: 8000", f"port: {endpoint.port}")
        policy = parse_policy(text, "deploy/helm/extender/policy.yaml")
        double.apply(pod("qwen3-moe-1", "127.0.0.2", labels={"extender.io/workload": "qwen3-moe"}))
        kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kc", token="scaler-token")))
        client = connect(redis_server.url, tmp_path)
        try:
            loop = ScaleLoop(policy=policy, lock=LeaderLock(client, "s", ttl_s=45), history=HistoryStore(client),
                             decisions=DecisionStore(client), pods=KubePodLister(kube))
            report = loop.tick()
            assert report.leader
            assert all(r.decision is not None for r in report.results), report
            assert report.results[0].replicas is not None and report.results[0].replicas.ready == 1
        finally:
            kube.close()
            client.close()
        assert [r for r in double.requests if not authorizer.allowed(r)] == []
        used = {(verb, group, resource) for user, verb, group, resource in double.verbs_used() if user == SCALER}
        granted = {(v, g, r) for _, rule in authorizer.rules_for(SCALER)
                   for v in rule.verbs for g in rule.api_groups for r in rule.resources}
        assert used == granted == {("list", "", "pods")}
        # and the enforcement is real: another account may not list pods
        other = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kc2", token="other-token")))
        try:
            with pytest.raises(Exception, match="403"):
                [*KubePodLister(other).list_pods("extender.io/workload=qwen3-moe")]  # fetched as it is read
        finally:
            other.close()


def test_the_tolerance_table_in_the_docs_is_the_hpas_arithmetic() -> None:
    text = (ROOT / "docs" / "scaler.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \|$", text, flags=re.MULTILINE)
    assert len(rows) >= 5

    def acts(desired: int, current: int) -> bool:  # the HPA's test (and extender.core.scaler's)
        return not abs(1.0 - desired / current) <= 0.1

    for current, up, down in ((int(a), int(b), int(c)) for a, b, c in rows):
        assert acts(up, current) and not acts(up - 1, current), current
        assert acts(down, current) and not acts(down + 1, current), current
