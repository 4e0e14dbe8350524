"""Warm Jobs and their Events as Kubernetes objects (plain JSON), and reading them back. Pure.

One action, one Job. Its name is a function of (node, cache) only (:func:`job_name`), so planning
the same action again, from this tick, the next one or a restarted warmer, names the same Job: the
API server's ``AlreadyExists`` is the idempotency check, with no state of ours to lose. Everything
the warmer needs to resume after a restart travels on the Job itself: the action (annotation
``extender.io/warm-action``, JSON), the attempt number, and Kubernetes' own status.

The pod (see docs/warming.md for why each field):

* pinned with required node affinity on ``metadata.name`` (what the DaemonSet controller uses):
  it still goes through the scheduler, so resources, taints and priority apply, unlike
  ``spec.nodeName``;
* a low ``priorityClassName``, the policy's tolerations plus the new-node taint, resource
  requests and limits on every container, ``restartPolicy: Never`` with ``backoffLimit`` pod
  retries, ``podReplacementPolicy: Failed`` (a retry starts once the failed pod has stopped, never
  beside a terminating one), ``activeDeadlineSeconds`` and ``ttlSecondsAfterFinished``;
* no service-account token (it calls no API) and no service links; the runtime's default seccomp
  profile, and no privilege escalation in any container;
* image actions: one container running the workload's own image with a no-op command (the pull is
  the work); other kinds: init containers ``prepare`` (helper: evictions, staging) and ``fetch``
  (the team's template), then ``finish`` (helper: manifest, marker, rename into place), with the
  node's cache root mounted at ``/cache``.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any, Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from extender.core.errors import InvalidValueError
from extender.core.policy import Policy, StepTemplate
from extender.core.schema import read_stored
from extender.core.units import read_int
from extender.core.warming import Action
from extender.warm.steps import ABANDONED_AFTER_ENV, CACHE_MOUNT
from extender.warm.templates import action_values, container, publish_values

JSON = dict[str, Any]

MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
MANAGED_BY = "extender-warmer"
#: Selects every warm Job (and only those).
SELECTOR = f"{MANAGED_BY_KEY}={MANAGED_BY}"
KIND_LABEL = "extender.io/warm-kind"
WORKLOAD_LABEL = "extender.io/warm-workload"
NODE_ANNOTATION = "extender.io/warm-node"
CACHE_ANNOTATION = "extender.io/warm-cache"
ACTION_ANNOTATION = "extender.io/warm-action"
PUBLISH_ANNOTATION = "extender.io/warm-publish"
ATTEMPT_ANNOTATION = "extender.io/warm-attempt"
#: ``reportingComponent`` / ``source.component`` of our Events.
COMPONENT = "extender-warmer"

MAX_NAME = 63  # a Job's name becomes its pods' job-name label value
_NOT_DNS = re.compile(r"[^a-z0-9-]+")

JobState = Literal["active", "succeeded", "failed"]


class Publish(BaseModel):
    """Publish the compile cache ``key`` from ``node`` to the registry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1)
    node: str = Field(min_length=1)
    workload: str
    node_class: str
    bytes: int = Field(ge=0)

    @property
    def cache(self) -> str:
        return f"compile:{self.key}"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def job_name(kind: str, node: str, cache: str) -> str:
    """``warm-<kind>-<node, shortened>-<12 hex of sha256(node, cache)>``: stable, unique, at most 63 characters.

    The node part is for people reading ``kubectl get jobs``; the hash alone makes the name unique.
    """
    prefix, suffix = f"warm-{kind}-", f"-{_digest(node, cache)}"
    middle = _NOT_DNS.sub("-", node.lower())[: MAX_NAME - len(prefix) - len(suffix)].strip("-")
    return f"{prefix}{middle}{suffix}" if middle else f"{prefix}{suffix[1:]}"


def publish_job_name(key: str) -> str:
    """One name per key, whatever the node: two nodes never publish the same key at once."""
    return f"warm-publish-{_digest('publish', key)}"


def _labels(kind: str, workload: str) -> dict[str, str]:
    labels = {MANAGED_BY_KEY: MANAGED_BY, KIND_LABEL: kind}
    if workload and len(workload) <= 63:
        labels[WORKLOAD_LABEL] = workload
    return labels


def _pod_spec(policy: Policy, node: str, containers: list[JSON], init: list[JSON], volumes: list[JSON]) -> JSON:
    w = policy.warming
    resources = {"requests": dict(w.resources.requests), "limits": dict(w.resources.limits)}
    for c in (*init, *containers):
        c.setdefault("resources", resources)
        c.setdefault("securityContext", {"allowPrivilegeEscalation": False})
    tolerations = [t.model_dump(exclude_defaults=True) for t in w.tolerations]
    taint = w.new_nodes.taint
    tolerations.append({"key": taint.key, "operator": "Exists", "effect": taint.effect})
    spec: JSON = {
        "restartPolicy": "Never",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
        "tolerations": tolerations,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # the runtime's default syscall filter (unset, a pod runs unconfined): the one part of the
        # restricted Pod Security level a pod that mounts a hostPath can still have
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": 10,
        "containers": containers,
    }
    if init:
        spec["initContainers"] = init
    if volumes:
        spec["volumes"] = volumes
    if w.priority_class_name:
        spec["priorityClassName"] = w.priority_class_name
    if w.service_account_name:
        spec["serviceAccountName"] = w.service_account_name
    return spec


def _job(policy: Policy, name: str, labels: dict[str, str], annotations: dict[str, str], pod: JSON) -> JSON:
    w = policy.warming
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": w.namespace, "labels": labels, "annotations": annotations},
        "spec": {
            "backoffLimit": w.retry.pod_retries,
            # a replacement pod only once the old one has stopped: the default (TerminatingOrFailed)
            # starts it while an evicted or preempted pod still runs its grace period, and both,
            # pinned to one node, would write the same staging directory at once
            "podReplacementPolicy": "Failed",
            "activeDeadlineSeconds": max(1, int(w.active_deadline)),
            "ttlSecondsAfterFinished": max(0, int(w.ttl_after_finished)),
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def _cache_volume(policy: Policy) -> JSON:
    return {"name": "cache", "hostPath": {"path": policy.warming.host_cache_root, "type": "Directory"}}


#: The helper image when neither the policy (``warming.helperImage``) nor ``extender scale
#: --warm-helper-image`` names one: a placeholder, which exists only if you pushed the image there.
PLACEHOLDER_HELPER_IMAGE = "ghcr.io/example/extender:0.1.0"


def helper_image(policy: Policy) -> str:
    """The image of a warm Job's own steps: the policy's, as the warmer completed it
    (:meth:`extender.warm.loop.WarmLoop.set_policy`), else :data:`PLACEHOLDER_HELPER_IMAGE`."""
    return policy.warming.helper_image or PLACEHOLDER_HELPER_IMAGE


def _helper(policy: Policy, name: str, args: list[str]) -> JSON:
    return {"name": name, "image": helper_image(policy), "command": ["extender", "warm", name, *args],
            "volumeMounts": [{"name": "cache", "mountPath": CACHE_MOUNT}]}


def template_for(policy: Policy, action: Action) -> StepTemplate | None:
    """The fetch template of an action's kind (``None`` for images, which need none, or when unset)."""
    t = policy.warming.templates
    match action.kind:
        case "image":
            return None
        case "weights":
            return t.weights
        case "compile":
            return t.compile
        case "snapshot":
            return t.snapshot
        case "adapter":
            return t.adapter
        case _:
            assert_never(action.kind)


def action_job(policy: Policy, action: Action, *, attempt: int = 1, node_class: str = "") -> JSON:
    """The Job that performs ``action`` (its kind's template must be set, except for images)."""
    labels = _labels(action.kind, action.workload)
    annotations = {NODE_ANNOTATION: action.node, CACHE_ANNOTATION: action.cache,
                   ACTION_ANNOTATION: action.model_dump_json(), ATTEMPT_ANNOTATION: str(attempt)}
    name = job_name(action.kind, action.node, action.cache)
    if action.kind == "image":
        pull = {"name": "pull", "image": action.cache.partition(":")[2], "imagePullPolicy": "IfNotPresent",
                "command": list(policy.warming.image_pull_command)}
        return _job(policy, name, labels, annotations, _pod_spec(policy, action.node, [pull], [], []))
    template = template_for(policy, action)
    if template is None:
        raise InvalidValueError(f"no warming.templates.{action.kind} in the policy")
    values = action_values(policy, action, node_class)
    fetch = container("fetch", template, values)
    fetch["volumeMounts"] = [{"name": "cache", "mountPath": CACHE_MOUNT}]
    evict = [a for e in action.evictions for a in ("--evict", e.cache)]
    prepare = _helper(policy, "prepare", ["--root", CACHE_MOUNT, "--cache", action.cache, *evict])
    # A staging directory untouched for longer than a Job runs plus the longest wait before its retry
    # can no longer be written or resumed: prepare deletes it (extender.warm.steps.sweep). In the
    # environment, not a flag: a helper image of an older release (a pinned warming.helperImage)
    # ignores it, where an unknown flag would fail every Job.
    prepare["env"] = [{"name": ABANDONED_AFTER_ENV,
                       "value": f"{policy.warming.active_deadline + policy.warming.retry.max:g}"}]
    finish_args = ["--root", CACHE_MOUNT, "--cache", action.cache]
    if values.get("source"):
        finish_args += ["--source", values["source"]]
    finish = _helper(policy, "finish", finish_args)
    pod = _pod_spec(policy, action.node, [finish], [prepare, fetch], [_cache_volume(policy)])
    return _job(policy, name, labels, annotations, pod)


def publish_job(policy: Policy, publish: Publish, *, attempt: int = 1) -> JSON:
    """The Job that uploads one node's compile cache (``warming.templates.publishCompile`` must be set)."""
    template = policy.warming.templates.publish_compile
    if template is None:
        raise InvalidValueError("no warming.templates.publishCompile in the policy")
    values = publish_values(policy, key=publish.key, node=publish.node, workload=publish.workload,
                            node_class=publish.node_class, size=publish.bytes)
    upload = container("publish", template, values)
    upload["volumeMounts"] = [{"name": "cache", "mountPath": CACHE_MOUNT, "readOnly": True}]
    annotations = {NODE_ANNOTATION: publish.node, CACHE_ANNOTATION: publish.cache,
                   PUBLISH_ANNOTATION: publish.model_dump_json(), ATTEMPT_ANNOTATION: str(attempt)}
    pod = _pod_spec(policy, publish.node, [upload], [], [_cache_volume(policy)])
    return _job(policy, publish_job_name(publish.key), _labels("publish", publish.workload), annotations, pod)


# ---------------------------------------------------------------------------------------------
# Reading Jobs back
# ---------------------------------------------------------------------------------------------


def parse_time(text: object) -> float | None:
    """RFC 3339 (``2025-01-02T03:04:05Z``) as unix seconds; ``None`` when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp.replace(tzinfo=stamp.tzinfo or UTC).timestamp()


def format_time(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class JobView(BaseModel):
    """A warm Job as the warmer reads it: what it does, how far it got."""

    model_config = ConfigDict(frozen=True)

    name: str
    uid: str
    namespace: str
    action: Action | None = None
    publish: Publish | None = None
    attempt: int = 1
    state: JobState
    #: When it succeeded or failed (unix seconds), from its condition.
    finished_at: float | None = None
    created_at: float | None = None
    reason: str = ""
    message: str = ""

    @property
    def node(self) -> str:
        return self.action.node if self.action is not None else self.publish.node if self.publish else ""

    @property
    def cache(self) -> str:
        return self.action.cache if self.action is not None else self.publish.cache if self.publish else ""

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the work: (node, cache) for actions, ("", compile:key) for a publish."""
        return (self.action.node, self.action.cache) if self.action is not None else ("", self.cache)

    @property
    def kind(self) -> str:
        return self.action.kind if self.action is not None else "publish"


def read_job(raw: JSON) -> JobView | None:
    """A warm Job's view, or ``None`` if its annotations are missing or corrupt (not ours to touch).

    Fields of the annotations this release does not know are ignored: a Job a newer warmer created
    (a rolling upgrade, a rollback) is still seen, so its work counts as in flight (against
    ``warming.maxConcurrent`` and its node's free NVMe) and its failures are followed up.
    """
    meta = raw.get("metadata") or {}
    notes = meta.get("annotations") or {}
    try:
        action = read_stored(Action, notes[ACTION_ANNOTATION]) if ACTION_ANNOTATION in notes else None
        publish = read_stored(Publish, notes[PUBLISH_ANNOTATION]) if PUBLISH_ANNOTATION in notes else None
        attempt = max(1, read_int(notes.get(ATTEMPT_ANNOTATION, "1")))
    except (ValidationError, ValueError):
        return None
    if action is None and publish is None:
        return None
    status = raw.get("status") or {}
    state: JobState = "active"
    finished_at: float | None = None
    reason = message = ""
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            state = "succeeded"
            finished_at = parse_time(status.get("completionTime")) or parse_time(cond.get("lastTransitionTime"))
        elif cond.get("type") == "Failed":
            state = "failed"
            finished_at = parse_time(cond.get("lastTransitionTime"))
            reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
    return JobView(name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
                   namespace=str(meta.get("namespace", "")), action=action, publish=publish, attempt=attempt,
                   state=state, finished_at=finished_at, created_at=parse_time(meta.get("creationTimestamp")),
                   reason=reason, message=message)


def event(view: JobView, *, reason: str, message: str, now: float, instance: str) -> JSON:
    """A Warning Event about a warm Job.

    Named after the Job's uid and the reason, so a restarted warmer that sees the same failed Job
    again creates the same name, which the API server refuses: one Event per failure, not per tick.
    """
    stamp = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{view.name}.{(view.uid or 'x')[:8]}.{reason.lower()}", "namespace": view.namespace},
        "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": view.name,
                           "namespace": view.namespace, "uid": view.uid},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def describe(view: JobView) -> str:
    """``weights:llm/v1 on node gpu-a`` (for messages)."""
    if view.action is not None:
        return f"{view.cache} on node {view.node}"
    return f"publishing {view.cache} from node {view.node}"
