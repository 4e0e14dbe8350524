"""What KEDA is told about a workload: pure functions of the policy, the trigger and the published decision.

No gRPC and no Redis here (:mod:`extender.keda.service` does the I/O), so every rule is testable
on plain values. The rules are those of the External Metrics API (docs/scaler.md section 3), so
the two paths scale a workload alike:

* a ScaledObject's trigger names the workload in its metadata (``workload: <profile name>``,
  optionally ``namespace:``, else the ScaledObject's own namespace). A workload the policy does
  not autoscale in that namespace is *not found*: a typo must show up in KEDA, not as a silent 0.
* the metric is the scaler's desired replicas, target 1 (``AverageValue``), so KEDA's HPA computes
  ``desired = ceil(value / 1)``: the published number itself (docs/kubernetes-interfaces.md 4.3).
  With ``metric: extender-standby-replicas`` in the metadata it is the standby placeholders'
  count instead (docs/scaler.md section 5.1), for a ScaledObject on the placeholder Deployment.
* a workload not decided yet is served as 0 (the External Metrics API's ``"0"`` item); a published
  entry that cannot be decoded is :class:`UnreadableDecisionError` for that workload alone (gRPC
  ``DATA_LOSS``; the other workloads are read as usual); a decision is served however old it is
  (the HPA then keeps the last decision while no scaler leads, docs/scaler.md section 7).
* active (KEDA's 0 <-> 1 switch): ``max(desired, minReplicas of the policy) > 0``. A workload whose
  policy minimum is at least 1 is therefore always active, decided or not: KEDA never scales it to
  zero while a new scaler makes its first decision. Placeholders are active while the standby count
  is above 0, so with ``minReplicaCount: 0`` none idles when nothing is expected (an HPA of its own
  keeps at least one).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from extender.core.errors import ExtenderError, InvalidValueError, UnknownNameError
from extender.core.k8snames import DNS_LABEL
from extender.core.policy import Name, Policy
from extender.core.quoting import clip, quote
from extender.scaler.loop import scaled_profiles
from extender.state.decisions import Published, Unreadable

MetricName = Literal["extender-desired-replicas", "extender-standby-replicas"]
#: The metric served unless the trigger asks for another, named as the External Metrics API names it.
METRIC_NAME: MetricName = "extender-desired-replicas"
#: The standby placeholders' count (extender.core.warming.standby_replicas).
STANDBY_METRIC: MetricName = "extender-standby-replicas"
#: Their HPA target (``AverageValue``): one replica per unit of the published count.
TARGET_SIZE = 1
#: Trigger metadata keys we read; KEDA passes every key of the trigger, its own included.
METADATA_KEYS = ("workload", "namespace", "metric")

#: Characters of a caller's string quoted in a status message or a log line; the rest is counted,
#: not copied (a 3,000,000-character metric name made a status message past gRPC's metadata limit,
#: RESOURCE_EXHAUSTED instead of NOT_FOUND, and a log line as long).
MAX_QUOTED = 100
#: Trigger metadata keys listed in a message (KEDA passes a handful; the caller chooses how many).
MAX_KEYS_LISTED = 10


def _listed(keys: Collection[str]) -> str:
    names = [quote(k, MAX_QUOTED) if len(k) > MAX_QUOTED else k for k in sorted(keys)[:MAX_KEYS_LISTED]]
    more = len(keys) - len(names)
    return ", ".join(names) + (f" (+{more} more)" if more else "") if names else "none"


def _short(value: object) -> object:
    """A name is at most 63 characters: refuse a longer one before :data:`Name`'s check quotes all of it."""
    if isinstance(value, str) and len(value) > 63:
        raise InvalidValueError(f"{quote(value, MAX_QUOTED)} is longer than a name (at most 63 characters)")
    return value


def _namespace(value: str) -> str:
    if len(value) > 63 or not DNS_LABEL.fullmatch(value):
        raise InvalidValueError(f"{quote(value, MAX_QUOTED)} is not a namespace name (a DNS label: lowercase "
                                "letters, digits and '-', at most 63 characters)")
    return value


class TriggerError(ExtenderError, ValueError):
    """A ScaledObject's trigger metadata cannot name a workload (gRPC ``INVALID_ARGUMENT``)."""


class TriggerMetadata(BaseModel):
    """The keys of a trigger's ``metadata`` that we read; every other key (``scalerAddress``, ...) is KEDA's."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    workload: Annotated[Name, BeforeValidator(_short)]
    namespace: Annotated[str, AfterValidator(_namespace)] | None = None
    metric: MetricName = METRIC_NAME


class UnreadableDecisionError(ExtenderError):
    """The target's published entry cannot be decoded (gRPC ``DATA_LOSS``): no value to give."""


@dataclass(frozen=True)
class Served:
    """One autoscaled workload as the policy has it: the namespace it is served in (``None``: every
    namespace) and its ``minReplicas``."""

    namespace: str | None
    min_replicas: int


def served_workloads(policy: Policy) -> dict[str, Served]:
    """Every workload the scaler decides for, by profile name."""
    out: dict[str, Served] = {}
    for profile in scaled_profiles(policy):
        scaling = profile.autoscaling
        assert scaling is not None  # scaled_profiles keeps only profiles with one
        out[profile.name] = Served(namespace=scaling.namespace, min_replicas=scaling.min_replicas)
    return out


@dataclass(frozen=True)
class Target:
    """The workload one ScaledObject scales on, and where that ScaledObject is (for messages)."""

    workload: str
    namespace: str
    scaled_object: str
    metric: MetricName = METRIC_NAME


def resolve(name: str, namespace: str, metadata: Mapping[str, str], workloads: Mapping[str, Served]) -> Target:
    """The target of the ScaledObject ``namespace/name`` whose trigger has ``metadata``.

    Raises :class:`TriggerError` when ``workload`` is missing or malformed, and
    :class:`~extender.core.errors.UnknownNameError` when no autoscaled workload of that name is
    served in the namespace.
    """
    where = f"ScaledObject {clip(namespace, MAX_QUOTED) or '?'}/{clip(name, MAX_QUOTED) or '?'}"
    try:
        meta = TriggerMetadata.model_validate(dict(metadata))
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        given = _listed(metadata.keys())
        raise TriggerError(f"{where}: trigger metadata: {problems} (keys given: {given}; "
                           f"we read {', '.join(METADATA_KEYS)})") from None
    scope = meta.namespace or namespace
    served = workloads.get(meta.workload)
    if served is None or (served.namespace is not None and served.namespace != scope):
        # name only what that namespace may see, never other namespaces' workloads
        names = ", ".join(w for w, s in sorted(workloads.items()) if s.namespace is None or s.namespace == scope)
        shown = quote(scope, MAX_QUOTED) if scope else "(none given)"
        raise UnknownNameError(f"{where}: no autoscaled workload {meta.workload!r} in namespace {shown} "
                               f"(served there: {names or 'nothing'})")
    return Target(workload=meta.workload, namespace=scope, scaled_object=where, metric=meta.metric)


def _problem(error: ErrorDetails) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "metadata"
    if error["type"] == "missing":
        return f"{key!r} is required: the name of an autoscaled profile of the policy"
    return f"{key!r}: {error['msg'].removeprefix('Value error, ')}"


def check_metric(target: Target, metric_name: str) -> None:
    """Raise :class:`~extender.core.errors.UnknownNameError` unless ``metric_name`` is the target's."""
    if metric_name != target.metric:
        raise UnknownNameError(f"{target.scaled_object}: no metric {quote(metric_name, MAX_QUOTED)} "
                               f"(served: {target.metric})")


@dataclass(frozen=True)
class Reading:
    """What one ScaledObject is told: ``replicas`` (desired, or standby placeholders), whether the
    target is ``active``, and the decision they come from (``None``: not decided yet; its ``t`` and
    ``window`` are what :class:`~extender.telemetry.served.ServedMetrics` records)."""

    replicas: int
    active: bool
    decision: Published | None


def read(target: Target, workloads: Mapping[str, Served],
         published: Mapping[str, Published | Unreadable]) -> Reading:
    """The reading of ``target`` from every workload's published values (module docstring for the rules).

    Raises :class:`UnreadableDecisionError` when the target's own entry is :class:`Unreadable`.
    """
    value = published.get(target.workload)
    if isinstance(value, Unreadable):
        raise UnreadableDecisionError(f"{target.scaled_object}: {value.reason}; no value until the scaler's "
                                      "next decision for it")
    if target.metric == STANDBY_METRIC:
        standby = max(0, value.standby) if value is not None else 0
        return Reading(replicas=standby, active=standby > 0, decision=value)
    desired = max(0, value.desired) if value is not None else 0
    served = workloads.get(target.workload)
    floor = served.min_replicas if served is not None else 0
    return Reading(replicas=desired, active=max(desired, floor) > 0, decision=value)
