"""The chart's standby placeholders (values ``standby``; docs/scaler.md 5.1).

* Off by default: nothing is rendered; ``enabled`` alone renders the PriorityClass.
* One workload renders what deploy/examples/standby.yaml holds, field by field: the example stays
  the one documented reference (its comments give the reasons), and the chart may not drift from it.
  The one difference is on purpose: the chart leaves ``spec.replicas`` to the HPA (or KEDA), since an
  upgrade would otherwise set the count back to what the chart says.
* With ``metrics.mode: keda`` a ScaledObject of KEDA's shape (tests/test_keda_example.py's models)
  replaces the HPA, its trigger resolved by the keda-scaler's own code to the standby metric.
* Values that change the render are table rows; the template's own checks (one value against
  another, or against the policy) fail the render with one line naming the value. The schema's
  refusals are rows of tests/test_chart_schema.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.core.policy import parse_policy
from extender.keda.reading import resolve, served_workloads
from extender.kube.objects import STANDBY_LABEL
from tests import chart
from tests.test_keda_example import ScaledObject

EXAMPLE = chart.EXAMPLES / "standby.yaml"
#: The example's workload, as the values name it: the rest comes from the chart's policy.
ONE = {"standby.enabled": "true", "standby.workloads[0].name": "qwen3-moe", "standby.workloads[0].gpus": "2"}
KINDS = ("PriorityClass", "Deployment", "HorizontalPodAutoscaler", "ScaledObject")


def example(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == kind]
    return dict(doc)


def standby_objects(values: dict[str, str], *, flags: list[str | Path] | None = None) -> list[dict[str, Any]]:
    """The objects of templates/standby.yaml the chart renders with ``values``."""
    done = chart.helm_template(values, flags=["--show-only", "templates/standby.yaml", *(flags or [])])
    return [doc for doc, _ in chart.chunks(done.stdout)]


def without_labels(doc: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["metadata"].pop("labels", None)
    return out


# ---- off by default -----------------------------------------------------------------------------


def test_nothing_is_rendered_by_default() -> None:
    assert [d for d in chart.rendered() if d["kind"] in KINDS and "standby" in d["metadata"]["name"]] == []
    done = chart.helm_template({"standby.workloads[0].name": "qwen3-moe", "standby.workloads[0].gpus": "2"},
                               flags=["--show-only", "templates/standby.yaml"], check=False)
    assert done.returncode != 0 and "could not find template" in done.stderr, done.stderr  # listed, not enabled


def test_enabled_without_workloads_renders_the_priority_class_only() -> None:
    (priority,) = standby_objects({"standby.enabled": "true"})
    assert priority["kind"] == "PriorityClass"


# ---- one workload is the example ----------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered_one() -> dict[str, dict[str, Any]]:
    docs = standby_objects(ONE)
    assert sorted(d["kind"] for d in docs) == ["Deployment", "HorizontalPodAutoscaler", "PriorityClass"]
    return {d["kind"]: d for d in docs}


def test_the_priority_class_is_the_examples(rendered_one: dict[str, dict[str, Any]]) -> None:
    assert without_labels(rendered_one["PriorityClass"]) == example("PriorityClass")


def test_the_placeholder_deployment_is_the_examples(rendered_one: dict[str, dict[str, Any]]) -> None:
    ours, theirs = rendered_one["Deployment"], example("Deployment")
    for field in ("name", "namespace"):
        assert ours["metadata"][field] == theirs["metadata"][field], field
    # the pods: the same spec, field by field
    assert ours["spec"]["template"]["spec"] == theirs["spec"]["template"]["spec"]
    # labelled for the workload they stand for, never as one of its replicas
    ours_labels, theirs_labels = ours["spec"]["template"]["metadata"]["labels"], theirs["spec"]["template"]["metadata"][
        "labels"]
    assert ours_labels[STANDBY_LABEL] == theirs_labels[STANDBY_LABEL] == "qwen3-moe"
    policy = parse_policy(chart.policy_text(), "policy.yaml")
    assert policy.profile_for_pod(ours_labels, {}) is None
    # the selector selects the template (apps/v1 refuses it otherwise)
    selector = ours["spec"]["selector"]["matchLabels"]
    assert selector.items() <= ours_labels.items()
    # the count is the HPA's alone: the rest of the spec is the example's
    assert "replicas" not in ours["spec"] and theirs["spec"]["replicas"] == 1
    assert set(ours["spec"]) == set(theirs["spec"]) - {"replicas"}


def test_the_hpa_is_the_examples(rendered_one: dict[str, dict[str, Any]]) -> None:
    """Name, namespace and the whole spec: target, bounds (the profile's maxReplicas), the metric, behavior."""
    assert without_labels(rendered_one["HorizontalPodAutoscaler"]) == example("HorizontalPodAutoscaler")
    assert rendered_one["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == rendered_one["Deployment"][
        "metadata"]["name"]


def test_placeholders_get_no_token_and_need_no_grant(rendered_one: dict[str, dict[str, Any]]) -> None:
    """They run as their own pods under the namespace's default account, with no token; the chart's
    RBAC is the same with them as without (the HPA controller reads external metrics by its own role)."""
    assert rendered_one["Deployment"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in rendered_one["Deployment"]["spec"]["template"]["spec"]
    rbac = ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")

    def grants(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted((d for d in docs if d["kind"] in rbac), key=lambda d: (d["kind"], d["metadata"]["name"]))

    assert grants(chart.rendered(**{k.replace(".", "__"): v for k, v in ONE.items()})) == grants(chart.rendered())


# ---- KEDA ---------------------------------------------------------------------------------------


def test_with_keda_a_scaled_object_asks_the_keda_scaler_for_the_standby_count() -> None:
    docs = {d["kind"]: d for d in standby_objects({**ONE, "metrics.mode": "keda"})}
    assert sorted(docs) == ["Deployment", "PriorityClass", "ScaledObject"]
    scaled = ScaledObject.model_validate(docs["ScaledObject"])
    assert scaled.spec.scaleTargetRef.name == docs["Deployment"]["metadata"]["name"]
    # to zero (KEDA deactivates while the count is 0), up to the profile's bound
    hpa = example("HorizontalPodAutoscaler")
    assert (scaled.spec.minReplicaCount, scaled.spec.maxReplicaCount) == (0, hpa["spec"]["maxReplicas"])
    assert docs["ScaledObject"]["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"][
        "behavior"]
    (trigger,) = scaled.spec.triggers
    service = chart.one(chart.rendered(metrics__mode="keda"), "Service", "extender-keda-scaler")
    (port,) = service["spec"]["ports"]
    assert trigger.type == "external" and trigger.metricType is None  # AverageValue: the count itself
    assert trigger.metadata["scalerAddress"] == f"extender-keda-scaler.{chart.NAMESPACE}.svc:{port['port']}"
    assert trigger.authenticationRef is not None and trigger.authenticationRef.name == "extender-keda-scaler-mtls"
    policy = parse_policy(chart.policy_text(), "policy.yaml")
    target = resolve(scaled.metadata.name, scaled.metadata.namespace, trigger.metadata, served_workloads(policy))
    assert (target.workload, target.metric) == ("qwen3-moe", "extender-standby-replicas")


# ---- values -------------------------------------------------------------------------------------


def pod_spec(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = docs["Deployment"]["spec"]["template"]["spec"]
    return spec


def placeholder(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (found,) = pod_spec(docs)["containers"]
    return dict(found)


def bounds(docs: dict[str, dict[str, Any]]) -> tuple[int, int]:
    spec = docs["HorizontalPodAutoscaler"]["spec"]
    return spec["minReplicas"], spec["maxReplicas"]


def quantities(resources: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """``resources`` with each quantity as text (``--set`` gives 4, Kubernetes reads "4" the same)."""
    return {part: {name: str(q) for name, q in listed.items()} for part, listed in resources.items()}


Check = Callable[[dict[str, dict[str, Any]]], bool]

VALID: list[Any] = [
    pytest.param({}, lambda d: d["Deployment"]["metadata"]["namespace"] == "default" and bounds(d) == (1, 40),
                 id="namespace-and-bound-from-the-profile"),
    pytest.param({"standby.workloads[0].namespace": "default"},
                 lambda d: d["HorizontalPodAutoscaler"]["metadata"]["namespace"] == "default",
                 id="namespace-as-the-profile"),
    pytest.param({"standby.workloads[0].minReplicas": "0"}, lambda d: bounds(d) == (0, 40),
                 id="min-zero-with-hpa-scale-to-zero"),
    pytest.param({"standby.workloads[0].minReplicas": "3", "standby.workloads[0].maxReplicas": "3"},
                 lambda d: bounds(d) == (3, 3), id="min-equals-max"),
    pytest.param({"standby.workloads[0].maxReplicas": "8"}, lambda d: bounds(d) == (1, 8),
                 id="max-below-the-profiles"),
    pytest.param({"standby.workloads[0].resources.requests.cpu": "4", "standby.workloads[0].resources.requests.memory":
                  "64Gi", "standby.workloads[0].resources.limits.rdma/hca": "1"},
                 lambda d: quantities(placeholder(d)["resources"]) == {
                     "requests": {"cpu": "4", "memory": "64Gi"}, "limits": {"rdma/hca": "1", "nvidia.com/gpu": "2"}},
                 id="more-than-gpus"),
    pytest.param({"scheduler.gpuResource": "amd.com/gpu", "standby.workloads[0].gpus": "8"},
                 lambda d: placeholder(d)["resources"] == {"limits": {"amd.com/gpu": "8"}},
                 id="the-charts-gpu-resource"),
    pytest.param({"standby.workloads[0].nodeSelector.node\\.kubernetes\\.io/instance-type": "p5.48xlarge",
                  "standby.workloads[0].tolerations[0].key": "nvidia.com/gpu",
                  "standby.workloads[0].tolerations[0].operator": "Exists",
                  "standby.workloads[0].affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                  ".nodeSelectorTerms[0].matchExpressions[0].key": "zone"},
                 lambda d: pod_spec(d)["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
                 and pod_spec(d)["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
                 and "nodeAffinity" in pod_spec(d)["affinity"], id="where-a-replica-may-go"),
    pytest.param({"standby.priorityClass.create": "false", "standby.priorityClass.name": "gpu-overprovisioning"},
                 lambda d: "PriorityClass" not in d and pod_spec(d)["priorityClassName"] == "gpu-overprovisioning",
                 id="an-existing-priority-class"),
    pytest.param({"standby.priorityClass.value": "-100"}, lambda d: d["PriorityClass"]["value"] == -100,
                 id="below-the-autoscalers-cutoff"),
    pytest.param({"standby.behavior.scaleDown.stabilizationWindowSeconds": "300",
                  "standby.behavior.scaleDown.policies[0].type": "Pods",
                  "standby.behavior.scaleDown.policies[0].value": "1",
                  "standby.behavior.scaleDown.policies[0].periodSeconds": "120"},
                 lambda d: d["HorizontalPodAutoscaler"]["spec"]["behavior"]["scaleDown"] == {
                     "stabilizationWindowSeconds": 300,
                     "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]},
                 id="a-slower-way-down"),
    pytest.param({"metrics.mode": "keda", "standby.behavior.scaleUp.selectPolicy": "Max"},
                 lambda d: d["ScaledObject"]["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"][
                     "scaleUp"]["selectPolicy"] == "Max", id="keda-takes-the-behavior"),
    pytest.param({"standby.image": "mirror.example.com/pause:3.10"},
                 lambda d: placeholder(d)["image"] == "mirror.example.com/pause:3.10", id="a-mirrored-pause-image"),
    pytest.param({"metrics.mode": "keda", "standby.workloads[0].minReplicas": "1",
                  "standby.kedaAuthentication.kind": "ClusterTriggerAuthentication",
                  "standby.kedaAuthentication.name": "extender"},
                 lambda d: d["ScaledObject"]["spec"]["minReplicaCount"] == 1
                 and d["ScaledObject"]["spec"]["triggers"][0]["authenticationRef"]
                 == {"name": "extender", "kind": "ClusterTriggerAuthentication"}, id="keda-floor-and-authentication"),
]


@pytest.mark.parametrize(("values", "check"), VALID)
def test_values_change_the_render_as_documented(values: dict[str, str], check: Check) -> None:
    docs = {d["kind"]: d for d in standby_objects({**ONE, **values})}
    assert check(docs), docs


def test_two_workloads_render_two_of_each(tmp_path: Path) -> None:
    policy = yaml.safe_load(chart.policy_text())
    second = copy.deepcopy(policy["profiles"][0])
    second["name"], second["match"] = "llama", {"labels": {"extender.io/workload": "llama"}}
    second["autoscaling"] = {"minReplicas": 1, "maxReplicas": 6}  # served in every namespace
    policy["profiles"].append(second)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    docs = standby_objects({**ONE, "standby.workloads[1].name": "llama", "standby.workloads[1].gpus": "1",
                            "standby.workloads[1].namespace": "llm"}, flags=["--set-file", f"policy={path}"])
    hpas = {d["metadata"]["name"]: d for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    assert sorted(hpas) == ["llama-standby", "qwen3-moe-standby"]
    assert hpas["llama-standby"]["metadata"]["namespace"] == "llm" and hpas["llama-standby"]["spec"]["maxReplicas"] == 6
    assert [d["kind"] for d in docs].count("PriorityClass") == 1


# ---- what the template refuses ------------------------------------------------------------------

#: A profile whose pods are matched by a label every placeholder carries.
GREEDY_PROFILE = {"name": "greedy", "match": {"labels": {"app.kubernetes.io/part-of": "extender"}},
                  "autoscaling": {"minReplicas": 1, "maxReplicas": 2}}

REFUSED: list[Any] = [
    pytest.param({"metrics.mode": "none"}, "standby.workloads need metrics.mode external-metrics", id="no-metrics-api"),
    pytest.param({"standby.workloads[0].name": "qwen3"},
                 'standby.workloads[0].name: "qwen3" is no profile with autoscaling in the policy (qwen3-moe)',
                 id="not-a-profile"),
    pytest.param({"standby.workloads[0].namespace": "llm"},
                 'standby.workloads[0].namespace: "llm", but the profile qwen3-moe is served in namespace "default"',
                 id="namespace-of-another"),
    pytest.param({"standby.workloads[0].minReplicas": "41"},
                 "standby.workloads[0]: maxReplicas 40 (the profile's autoscaling.maxReplicas) is below minReplicas 41",
                 id="min-above-the-profiles-max"),
    pytest.param({"standby.workloads[0].minReplicas": "5", "standby.workloads[0].maxReplicas": "4"},
                 "standby.workloads[0]: maxReplicas 4 is below minReplicas 5", id="max-below-min"),
    pytest.param({"standby.workloads[1].name": "qwen3-moe", "standby.workloads[1].gpus": "2"},
                 "standby.workloads[1]: qwen3-moe in namespace default is listed twice (first as standby.workloads[0])",
                 id="listed-twice"),
    pytest.param({"standby.workloads[0].resources.limits.nvidia\\.com/gpu": "2"},
                 "standby.workloads[0].resources.limits: give the GPUs as standby.workloads[0].gpus", id="gpus-twice"),
    pytest.param({"standby.workloads[0].gpus": None}, "standby.workloads[0].gpus: missing", id="gpus-missing"),
    pytest.param({"standby.workloads[0].name": None}, "standby.workloads[0].name: missing", id="name-missing"),
]


@pytest.mark.parametrize(("values", "message"), REFUSED)
def test_what_the_template_refuses_names_the_value(values: dict[str, str | None], message: str) -> None:
    """With the schema skipped too: these are the template's own checks (one line, the value named)."""
    merged = {k: v for k, v in {**ONE, **values}.items() if v is not None}
    done = chart.helm_template(merged, check=False, flags=["--skip-schema-validation"])
    assert done.returncode != 0 and message in done.stderr, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("Error:")]
    assert line.count("standby") >= 1


def test_a_profile_matching_the_placeholders_is_refused(tmp_path: Path) -> None:
    policy = yaml.safe_load(chart.policy_text())
    policy["profiles"].append(GREEDY_PROFILE)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    done = chart.helm_template(ONE, check=False, flags=["--set-file", f"policy={path}"])
    assert done.returncode != 0, done.stdout
    assert ("standby.workloads[0]: the placeholders' labels match the profile greedy (match.labels), which would "
            "count them as its replicas") in done.stderr, done.stderr


def test_a_profile_without_a_namespace_needs_one_in_the_values(tmp_path: Path) -> None:
    policy = yaml.safe_load(chart.policy_text())
    del policy["profiles"][0]["autoscaling"]["namespace"]
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    flags: list[str | Path] = ["--set-file", f"policy={path}"]
    done = chart.helm_template(ONE, check=False, flags=flags)
    assert done.returncode != 0 and ("standby.workloads[0].namespace: needed, where the replicas of qwen3-moe run "
                                     "(its profile sets no autoscaling.namespace)") in done.stderr, done.stderr
    docs = standby_objects({**ONE, "standby.workloads[0].namespace": "llm"}, flags=flags)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "PriorityClass"} == {"llm"}


def test_a_values_file_renders_what_set_renders(tmp_path: Path) -> None:
    """Numbers of a values file are floats to Helm: the GPUs and bounds must still be written whole."""
    path = tmp_path / "values.yaml"
    path.write_text("standby:\n  enabled: true\n  workloads:\n    - {name: qwen3-moe, gpus: 2, minReplicas: 2,"
                    " maxReplicas: 12}\n")
    from_file = standby_objects({}, flags=["-f", path])
    from_set = standby_objects({**ONE, "standby.workloads[0].minReplicas": "2",
                                "standby.workloads[0].maxReplicas": "12"})
    assert from_file == from_set
    hpa = chart.one(from_file, "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 12)


def test_a_policy_helm_cannot_read_is_named_when_standby_needs_it(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("profiles: [\n")
    done = chart.helm_template(ONE, check=False, flags=["--set-file", f"policy={path}"])
    assert done.returncode != 0 and "standby: the policy is not YAML the chart can read" in done.stderr, done.stderr
