"""deploy/keda-scaledobject-example.yaml: KEDA's object shapes, and a trigger our server accepts.

The test cluster has no KEDA, so the shapes are checked against the fields of KEDA's Go types
(kedacore/keda ``apis/keda/v1alpha1/scaledobject_types.go``, ``scaletriggers_types.go``,
``triggerauthentication_types.go``; HPA behavior from ``k8s.io/api/autoscaling/v2``), transcribed
below as pydantic models that refuse unknown fields, as the API server's strict validation does.
Then the trigger is resolved by the same code the server runs, against the policy of
deploy/scaler.yaml, and its bounds are compared with the profile's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from extender.core.policy import parse_policy
from extender.keda.commands import DEFAULT_LISTEN
from extender.keda.reading import METADATA_KEYS, resolve, served_workloads

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "keda-scaledobject-example.yaml"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ObjectMeta(Strict):
    name: StrictStr
    namespace: StrictStr
    labels: dict[str, StrictStr] = {}
    annotations: dict[str, StrictStr] = {}


class ScaleTarget(Strict):
    name: StrictStr
    apiVersion: StrictStr | None = None  # noqa: N815 (the wire names)
    kind: StrictStr | None = None
    envSourceContainerName: StrictStr | None = None  # noqa: N815


class HpaPolicy(Strict):
    type: Literal["Pods", "Percent"]
    value: StrictInt = Field(gt=0)
    periodSeconds: StrictInt = Field(gt=0, le=1800)  # noqa: N815


class HpaRules(Strict):
    stabilizationWindowSeconds: StrictInt | None = Field(default=None, ge=0, le=3600)  # noqa: N815
    selectPolicy: Literal["Max", "Min", "Disabled"] | None = None  # noqa: N815
    policies: list[HpaPolicy] = []
    tolerance: StrictStr | None = None


class HpaBehavior(Strict):
    scaleUp: HpaRules | None = None  # noqa: N815
    scaleDown: HpaRules | None = None  # noqa: N815


class HpaConfig(Strict):
    behavior: HpaBehavior | None = None
    name: StrictStr | None = None


class ScalingModifiers(Strict):
    formula: StrictStr | None = None
    target: StrictStr | None = None
    activationTarget: StrictStr | None = None  # noqa: N815
    metricType: Literal["AverageValue", "Value"] | None = None  # noqa: N815


class Advanced(Strict):
    horizontalPodAutoscalerConfig: HpaConfig | None = None  # noqa: N815
    restoreToOriginalReplicaCount: bool | None = None  # noqa: N815
    scalingModifiers: ScalingModifiers | None = None  # noqa: N815


class AuthenticationRef(Strict):
    name: StrictStr
    kind: Literal["TriggerAuthentication", "ClusterTriggerAuthentication"] | None = None


class Trigger(Strict):
    type: StrictStr
    name: StrictStr | None = None
    useCachedMetrics: bool | None = None  # noqa: N815
    metadata: dict[str, StrictStr]  # map[string]string: an unquoted true or 9090 is refused
    authenticationRef: AuthenticationRef | None = None  # noqa: N815
    metricType: Literal["AverageValue", "Value", "Utilization"] | None = None  # noqa: N815


class Fallback(Strict):
    failureThreshold: StrictInt  # noqa: N815
    replicas: StrictInt
    behavior: Literal["static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"] | None = None


class ScaledObjectSpec(Strict):
    scaleTargetRef: ScaleTarget  # noqa: N815
    pollingInterval: StrictInt | None = None  # noqa: N815
    initialCooldownPeriod: StrictInt | None = None  # noqa: N815
    cooldownPeriod: StrictInt | None = None  # noqa: N815
    idleReplicaCount: StrictInt | None = None  # noqa: N815
    minReplicaCount: StrictInt | None = None  # noqa: N815
    maxReplicaCount: StrictInt | None = None  # noqa: N815
    advanced: Advanced | None = None
    triggers: list[Trigger] = Field(min_length=1)
    fallback: Fallback | None = None


class ScaledObject(Strict):
    apiVersion: Literal["keda.sh/v1alpha1"]  # noqa: N815
    kind: Literal["ScaledObject"]
    metadata: ObjectMeta
    spec: ScaledObjectSpec


class SecretTargetRef(Strict):
    parameter: StrictStr
    name: StrictStr
    key: StrictStr


class TriggerAuthenticationSpec(Strict):
    secretTargetRef: list[SecretTargetRef] = []  # noqa: N815
    env: list[dict[str, StrictStr]] = []


class TriggerAuthentication(Strict):
    apiVersion: Literal["keda.sh/v1alpha1"]  # noqa: N815
    kind: Literal["TriggerAuthentication"]
    metadata: ObjectMeta
    spec: TriggerAuthenticationSpec


#: The authentication parameters KEDA's external scaler reads (pkg/scalers/external_scaler.go).
TLS_PARAMETERS = {"caCert", "tlsClientCert", "tlsClientKey"}


@pytest.fixture(scope="module")
def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]


@pytest.fixture(scope="module")
def scaled_object(documents: list[dict[str, Any]]) -> ScaledObject:
    (doc,) = [d for d in documents if d["kind"] == "ScaledObject"]
    return ScaledObject.model_validate(doc)


def test_every_object_has_keda_shape(documents: list[dict[str, Any]]) -> None:
    kinds: dict[str, type[BaseModel]] = {"ScaledObject": ScaledObject, "TriggerAuthentication": TriggerAuthentication}
    for doc in documents:
        kinds[doc["kind"]].model_validate(doc)
    assert sorted(d["kind"] for d in documents) == ["ScaledObject", "TriggerAuthentication"]


def test_the_shape_check_refuses_what_keda_refuses(documents: list[dict[str, Any]]) -> None:
    (doc,) = [d for d in documents if d["kind"] == "ScaledObject"]
    misspelt = {**doc, "spec": {**doc["spec"], "minReplicas": 1}}
    with pytest.raises(ValidationError, match="minReplicas"):
        ScaledObject.model_validate(misspelt)
    trigger = {**doc["spec"]["triggers"][0], "metadata": {"scalerAddress": "x:9090", "enableTLS": True}}
    with pytest.raises(ValidationError, match="enableTLS"):
        ScaledObject.model_validate({**doc, "spec": {**doc["spec"], "triggers": [trigger]}})


def test_the_trigger_reaches_our_scaler_for_an_autoscaled_workload(scaled_object: ScaledObject) -> None:
    (trigger,) = scaled_object.spec.triggers
    assert trigger.type in ("external", "external-push")
    assert trigger.metricType in (None, "AverageValue")  # Value would multiply by the ready pods
    host, _, port = trigger.metadata["scalerAddress"].rpartition(":")
    assert host.endswith(".kube-system.svc") and port == DEFAULT_LISTEN.rpartition(":")[2]
    assert set(trigger.metadata) - {"scalerAddress"} <= set(METADATA_KEYS)
    scaler = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "scaler.yaml").read_text())
                  if d and d["kind"] == "ConfigMap")
    policy = parse_policy(scaler["data"]["policy.yaml"], "deploy/scaler.yaml")
    workloads = served_workloads(policy)
    target = resolve(scaled_object.metadata.name, scaled_object.metadata.namespace, trigger.metadata, workloads)
    profile = policy.profile(target.workload)
    assert profile.autoscaling is not None
    assert scaled_object.spec.minReplicaCount == profile.autoscaling.min_replicas
    assert scaled_object.spec.maxReplicaCount == profile.autoscaling.max_replicas


def test_the_trigger_authentication_gives_the_tls_parameters(documents: list[dict[str, Any]],
                                                              scaled_object: ScaledObject) -> None:
    (trigger,) = scaled_object.spec.triggers
    assert trigger.authenticationRef is not None
    (doc,) = [d for d in documents if d["kind"] == "TriggerAuthentication"]
    auth = TriggerAuthentication.model_validate(doc)
    assert auth.metadata.name == trigger.authenticationRef.name
    assert auth.metadata.namespace == scaled_object.metadata.namespace  # a TriggerAuthentication is namespaced
    assert {ref.parameter for ref in auth.spec.secretTargetRef} == TLS_PARAMETERS
