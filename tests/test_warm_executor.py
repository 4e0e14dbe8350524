"""The warm loop against the API double: Jobs with the right spec, idempotent, retried, confirmed, surfaced.

The official client talks to the double over HTTP exactly as it would to an API server; the double
plays the Job controller when a test marks a Job complete or failed (``status.conditions`` with the
times the test chooses). Every tick gets its ``now`` from the test, so backoff and confirmation
windows are exercised tick by tick without waiting on any clock. The inventory is a real Redis
where a test needs the store (eviction re-checks, the compile registry).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from extender.core.caches import cache_id
from extender.core.calibration import NO_NODE_FACTORS
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy
from extender.core.warming import Expectation
from extender.kube.client import JSON, KubeClient
from extender.scaler.loop import TickReport as ScalerTick
from extender.scaler.serve import KubePodLister, ScaleSettings, build_loop
from extender.state import InventoryStore, connect
from extender.warm.jobspec import ACTION_ANNOTATION, action_job, format_time, job_name, publish_job_name
from extender.warm.loop import TickReport as WarmTick
from extender.warm.loop import WarmLoop
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.kinds import kind_of
from tests.test_warm import BASE, GB, LLM_KEY, NOW, load, node

pytestmark = pytest.mark.integration

JOB = kind_of("batch/v1", "Job")
EVENT = kind_of("v1", "Event")
NODE = kind_of("v1", "Node")
NS = "extender-warm"
ONE_LLM = [Expectation(workload="llm", replicas=1, within_s=600)]
# gpu-a holds the image: 0 + 10 (weights) + 100 (cold compile) + 10 + 20 = 140 s against gpu-b's 240 s,
# so the one replica lands there and staging its weights saves 140 - 135 = 5 s
WEIGHTS_A = job_name("weights", "gpu-a", "weights:llm/v1")


@pytest.fixture
def store(redis_server: RedisServer, tmp_path: Path) -> Iterator[InventoryStore]:
    client = connect(redis_server.url, tmp_path)
    try:
        yield InventoryStore(client)
    finally:
        client.close()


def snap(policy: Policy, now: float, *records: NodeState, registry: tuple[str, ...] = ()) -> InventorySnapshot:
    return InventorySnapshot.build(policy, records, taken_at=now, registry=registry)


def two_nodes(now: float, **a: Any) -> tuple[NodeState, NodeState]:
    """gpu-a with the image (and ``a``), gpu-b cold; both fresh at ``now``."""
    return node("gpu-a", now=now, images=["example.com/llm:1"], **a), node("gpu-b", now=now)


def jobs(double: KubeDouble) -> dict[str, JSON]:
    assert JOB is not None
    items, _ = double.state.list_objects(JOB, NS, lambda _: True)
    return {j["metadata"]["name"]: j for j in items}


def events(double: KubeDouble) -> list[JSON]:
    assert EVENT is not None
    items, _ = double.state.list_objects(EVENT, NS, lambda _: True)
    return items


def finish(double: KubeDouble, name: str, *, ok: bool, at: float) -> None:
    """Play the Job controller: the Job completed or failed at ``at``."""
    job = jobs(double)[name]
    stamp = format_time(at)
    if ok:
        job["status"] = {"succeeded": 1, "completionTime": stamp,
                         "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": stamp}]}
    else:
        job["status"] = {"failed": 2, "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit", "lastTransitionTime": stamp}]}
    double.apply(job)


def sample(loop: WarmLoop, name: str, **labels: str) -> float:
    return loop.metrics.registry.get_sample_value(name, labels) or 0.0


def attempt_of(job: JSON) -> str:
    return str(job["metadata"]["annotations"]["extender.io/warm-attempt"])


# ---------------------------------------------------------------------------------------------


def test_the_plan_becomes_jobs_with_the_right_spec(double: KubeDouble, kube: KubeClient) -> None:
    loop = WarmLoop(BASE, None, kube, instance="scaler-0")
    report = loop.tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW)))
    assert report.errors == [] and report.started == [WEIGHTS_A]
    assert report.plan is not None
    (a,) = report.plan.actions
    (stored,) = jobs(double).values()
    expected = action_job(BASE, a, attempt=1, node_class="gpu")
    assert stored["spec"] == expected["spec"]  # what reached the API server is the spec we built
    assert stored["metadata"]["labels"] == expected["metadata"]["labels"]
    assert stored["metadata"]["annotations"][ACTION_ANNOTATION] == a.model_dump_json()
    assert sample(loop, "extender_warm_jobs_started_total", kind="weights") == 1
    assert sample(loop, "extender_warm_actions_planned_total", kind="weights", purpose="demand") == 1


def test_replanning_and_restarts_never_start_a_second_job(double: KubeDouble, kube: KubeClient) -> None:
    first = WarmLoop(BASE, None, kube)
    assert first.tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW))).started == [WEIGHTS_A]
    # the same tick again: the running Job is in flight, its weights count as there
    again = first.tick(NOW + 1, ONE_LLM, snapshot=snap(BASE, NOW + 1, *two_nodes(NOW + 1)))
    assert again.plan is not None and again.plan.actions == () and again.started == []
    # a restarted warmer reads the Job back and does the same
    restarted = WarmLoop(BASE, None, kube).tick(NOW + 2, ONE_LLM, snapshot=snap(BASE, NOW + 2, *two_nodes(NOW + 2)))
    assert restarted.started == [] and restarted.existing == []
    assert double.count("create", "jobs") == 1

    class Blind:
        """A client that cannot see the Jobs: the planner plans the action again."""

        def __init__(self, inner: KubeClient) -> None:
            self.inner = inner

        def list_jobs(self, namespace: str, *, label_selector: str | None = None) -> list[JSON]:
            return []

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    blind = WarmLoop(BASE, None, Blind(kube))
    report = blind.tick(NOW + 3, ONE_LLM, snapshot=snap(BASE, NOW + 3, *two_nodes(NOW + 3)))
    assert report.started == [] and report.existing == [WEIGHTS_A]  # AlreadyExists: the same work
    assert double.count("create", "jobs") == 2 and list(jobs(double)) == [WEIGHTS_A]


def test_a_failed_job_is_reported_then_retried_with_backoff(double: KubeDouble, kube: KubeClient) -> None:
    loop = WarmLoop(BASE, None, kube, instance="scaler-0")

    def tick(t: float) -> Any:
        return loop.tick(NOW + t, ONE_LLM, snapshot=snap(BASE, NOW + t, *two_nodes(NOW + t)))

    tick(0)
    finish(double, WEIGHTS_A, ok=False, at=NOW + 5)
    report = tick(10)
    assert report.failed == [WEIGHTS_A] and report.started == [] and report.retried == []
    (e,) = events(double)
    assert (e["type"], e["reason"], e["involvedObject"]["kind"], e["involvedObject"]["name"]) == \
        ("Warning", "WarmJobFailed", "Job", WEIGHTS_A)
    assert e["involvedObject"]["uid"] == jobs(double)[WEIGHTS_A]["metadata"]["uid"]
    # failed at +5, first retry 30 s later: at +35; reported at +10, so 25 s to go
    assert "weights:llm/v1 on node gpu-a, attempt 1: BackoffLimitExceeded" in e["message"]
    assert "next attempt in 25s" in e["message"]
    assert sample(loop, "extender_warm_jobs_finished_total", kind="weights", outcome="failed") == 1
    # backing off: nothing planned on the failing action, the Job (the record of the failure) kept
    report = tick(34)
    assert report.plan is not None and report.plan.actions == ()
    assert report.failed == [] and len(events(double)) == 1 and WEIGHTS_A in jobs(double)
    assert sample(loop, "extender_warm_jobs_backing_off") == 1
    # +35: the failed Job goes, and the action runs again as attempt 2
    report = tick(35)
    assert report.retried == [WEIGHTS_A] and report.started == [WEIGHTS_A]
    assert attempt_of(jobs(double)[WEIGHTS_A]) == "2"
    # attempt 2 fails at +40: the wait doubles to 60 s, until +100
    finish(double, WEIGHTS_A, ok=False, at=NOW + 40)
    assert tick(41).failed == [WEIGHTS_A]
    assert any("attempt 2" in e["message"] and "next attempt in 59s" in e["message"] for e in events(double))
    assert tick(99).retried == []
    report = tick(100)
    assert report.retried == [WEIGHTS_A] and attempt_of(jobs(double)[WEIGHTS_A]) == "3"
    assert len(events(double)) == 2
    assert sample(loop, "extender_warm_jobs_retried_total", kind="weights") == 2
    assert sample(loop, "extender_warm_jobs_finished_total", kind="weights", outcome="failed") == 2


def test_a_restarted_warmer_keeps_the_backoff_and_reports_a_failure_once(double: KubeDouble,
                                                                          kube: KubeClient) -> None:
    WarmLoop(BASE, None, kube).tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW)))
    finish(double, WEIGHTS_A, ok=False, at=NOW + 5)
    WarmLoop(BASE, None, kube).tick(NOW + 10, ONE_LLM, snapshot=snap(BASE, NOW + 10, *two_nodes(NOW + 10)))
    restarted = WarmLoop(BASE, None, kube)
    report = restarted.tick(NOW + 12, ONE_LLM, snapshot=snap(BASE, NOW + 12, *two_nodes(NOW + 12)))
    assert report.started == [] and WEIGHTS_A in jobs(double)  # still backing off, from the Job's own times
    assert len(events(double)) == 1  # the same Event name: the API server refused the duplicate
    report = restarted.tick(NOW + 35, ONE_LLM, snapshot=snap(BASE, NOW + 35, *two_nodes(NOW + 35)))
    assert report.retried == [WEIGHTS_A] and attempt_of(jobs(double)[WEIGHTS_A]) == "2"


def test_success_is_confirmed_by_the_inventory_then_the_job_is_removed(double: KubeDouble,
                                                                       kube: KubeClient) -> None:
    loop = WarmLoop(BASE, None, kube)
    loop.tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW)))
    finish(double, WEIGHTS_A, ok=True, at=NOW + 5)
    # the agent has not scanned yet: still in flight (nothing re-planned, the slot still taken)
    report = loop.tick(NOW + 10, ONE_LLM, snapshot=snap(BASE, NOW + 10, *two_nodes(NOW + 10)))
    assert report.confirmed == [] and report.plan is not None and report.plan.actions == ()
    assert sample(loop, "extender_warm_jobs_in_flight", kind="weights") == 1
    warm = two_nodes(NOW + 11, weights={"llm/v1": 100 * GB})
    report = loop.tick(NOW + 11, ONE_LLM, snapshot=snap(BASE, NOW + 11, *warm))
    assert report.confirmed == [WEIGHTS_A] and jobs(double) == {}
    assert sample(loop, "extender_warm_jobs_finished_total", kind="weights", outcome="confirmed") == 1
    assert sample(loop, "extender_warm_jobs_in_flight", kind="weights") == 0


def test_a_success_the_agent_never_confirms_counts_as_a_failure(double: KubeDouble, kube: KubeClient) -> None:
    loop = WarmLoop(BASE, None, kube)
    loop.tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW)))
    finish(double, WEIGHTS_A, ok=True, at=NOW + 5)
    # confirmWithin 300 s: unconfirmed from +305, retried 30 s later
    assert loop.tick(NOW + 304, ONE_LLM, snapshot=snap(BASE, NOW + 304, *two_nodes(NOW + 304))).failed == []
    report = loop.tick(NOW + 306, ONE_LLM, snapshot=snap(BASE, NOW + 306, *two_nodes(NOW + 306)))
    assert report.failed == [WEIGHTS_A]
    (e,) = events(double)
    assert e["reason"] == "WarmNotConfirmed" and "does not show weights:llm/v1 on gpu-a" in e["message"]
    assert sample(loop, "extender_warm_jobs_finished_total", kind="weights", outcome="unconfirmed") == 1
    report = loop.tick(NOW + 335, ONE_LLM, snapshot=snap(BASE, NOW + 335, *two_nodes(NOW + 335)))
    assert report.retried == [WEIGHTS_A] and report.started == [WEIGHTS_A]


def test_disabled_warming_plans_but_starts_nothing(double: KubeDouble, kube: KubeClient) -> None:
    policy = load(enabled=False)
    report = WarmLoop(policy, None, kube).tick(NOW, ONE_LLM, snapshot=snap(policy, NOW, *two_nodes(NOW)))
    assert report.plan is not None and len(report.plan.actions) == 1
    assert [s.reason for s in report.skipped] == ["disabled"] and report.started == []
    assert double.count("create", "jobs") == 0


def test_a_dry_run_changes_nothing(double: KubeDouble, kube: KubeClient) -> None:
    loop = WarmLoop(BASE, None, kube)
    report = loop.tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW)), dry_run=True)
    assert report.would_start == [WEIGHTS_A] and report.started == []
    assert {r.verb for r in double.requests} == {"list"}
    assert sample(loop, "extender_warm_actions_planned_total", kind="weights", purpose="demand") == 0


def test_an_eviction_a_pod_started_to_need_is_not_carried_out(double: KubeDouble, kube: KubeClient,
                                                              store: InventoryStore) -> None:
    # gpu-a: 150 GB free, 100 GB reserved: room 50 GB, so staging 100 GB evicts old/v0 (idle for 2 h)
    full = {"nvmeFree": 150 * GB, "weights": {"old/v0": 400 * GB},
            "lastUsed": {cache_id("weights", "old/v0"): NOW - 7200}}
    planned_on = snap(BASE, NOW, *two_nodes(NOW, **full))
    # since the snapshot was taken, a pod of `old` started on gpu-a: the store says so
    store.put(two_nodes(NOW, **full, podWorkloads=["old"])[0])
    loop = WarmLoop(BASE, store, kube)
    report = loop.tick(NOW, ONE_LLM, snapshot=planned_on)
    assert report.plan is not None
    (a,) = report.plan.actions
    assert [e.cache for e in a.evictions] == ["weights:old/v0"]
    assert [(s.action.cache, s.reason) for s in report.skipped] == [("weights:llm/v1", "eviction-unsafe")]
    assert jobs(double) == {}
    # the pod is gone again: the eviction goes ahead, inside the Job, before the fetch
    store.put(two_nodes(NOW, **full)[0])
    assert loop.tick(NOW + 1, ONE_LLM, snapshot=planned_on).started == [WEIGHTS_A]
    (prepare,) = [c for c in jobs(double)[WEIGHTS_A]["spec"]["template"]["spec"]["initContainers"]
                  if c["name"] == "prepare"]
    assert prepare["command"][-2:] == ["--evict", "weights:old/v0"]


def test_api_failures_never_escape_a_tick(double: KubeDouble, kube: KubeClient) -> None:
    loop = WarmLoop(BASE, None, kube)
    double.fail("list", "jobs", 500)
    report = loop.tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW)))
    assert report.plan is None and report.started == [] and "list" in report.errors[0]
    double.fail("create", "jobs", 503)
    report = loop.tick(NOW + 1, ONE_LLM, snapshot=snap(BASE, NOW + 1, *two_nodes(NOW + 1)))
    assert [s.reason for s in report.skipped] == ["error"] and report.errors
    assert sample(loop, "extender_warm_errors_total", operation="read") == 1
    assert sample(loop, "extender_warm_errors_total", operation="create-job") == 1
    assert loop.tick(NOW + 2, ONE_LLM, snapshot=snap(BASE, NOW + 2, *two_nodes(NOW + 2))).started == [WEIGHTS_A]


def test_a_kind_without_a_template_does_not_hold_back_the_others(double: KubeDouble, kube: KubeClient) -> None:
    policy = load(templates={})  # no weights template: the image is what can be done
    loop = WarmLoop(policy, None, kube)
    cold = (node("gpu-a", now=NOW), node("gpu-b", now=NOW))
    report = loop.tick(NOW, ONE_LLM, snapshot=snap(policy, NOW, *cold))
    assert report.started == [job_name("image", "gpu-a", "image:example.com/llm:1")]
    assert "no warming.templates.weights: weights are not staged" in report.notes


def test_a_compile_cache_is_published_then_registered(double: KubeDouble, kube: KubeClient,
                                                      store: InventoryStore) -> None:
    store.put(node("gpu-b", compileKeys=[LLM_KEY], ttl=3600))
    loop = WarmLoop(BASE, store, kube)
    assert loop.tick(NOW).publishing == []  # first seen now: the engine may still be writing it
    report = loop.tick(NOW + 121)
    name = publish_job_name(LLM_KEY)
    assert report.publishing == [name]
    assert jobs(double)[name]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == \
        ["gpu-b"]
    assert loop.tick(NOW + 122).publishing == []  # one Job per key
    finish(double, name, ok=True, at=NOW + 130)
    report = loop.tick(NOW + 131)
    assert report.published == [LLM_KEY] and jobs(double) == {}
    assert store.load_all()[2] == {LLM_KEY}
    assert sample(loop, "extender_warm_compile_published_total") == 1


# ---------------------------------------------------------------------------------------------
# New nodes
# ---------------------------------------------------------------------------------------------


TAINTING: dict[str, Any] = {"keepWarm": ["llm"], "newNodes": {"taintUntilWarm": True}}
NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
WARMING = {"key": "extender.io/warming", "value": "true", "effect": "NoSchedule"}


def kube_node(name: str, taints: list[dict[str, str]]) -> JSON:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"pool": "gpu"}},
            "spec": {"taints": taints}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


def taints_of(double: KubeDouble, name: str) -> list[Mapping[str, str]]:
    assert NODE is not None
    return list(double.state.get(NODE, None, name)["spec"].get("taints") or [])


def test_a_new_node_stays_tainted_until_warm(double: KubeDouble, kube: KubeClient) -> None:
    policy = load(**TAINTING)
    double.apply(kube_node("gpu-new", [NOT_READY]))
    now = time.time()  # the double stamps creationTimestamp with its clock: the node is young at `now`
    loop = WarmLoop(policy, None, kube)
    report = loop.tick(now, snapshot=snap(policy, now, node("gpu-new", now=now)))
    assert report.tainted == ["gpu-new"]
    assert taints_of(double, "gpu-new") == [NOT_READY, WARMING]
    # keep-warm Jobs start on it anyway (they tolerate the taint): the image first
    assert report.started == [job_name("image", "gpu-new", "image:example.com/llm:1")]
    # not warm yet: stays
    assert loop.tick(now + 1, snapshot=snap(policy, now + 1, node("gpu-new", now=now + 1))).untainted == []
    warm = node("gpu-new", now=now + 2, images=["example.com/llm:1"], weights={"llm/v1": 100 * GB})
    report = loop.tick(now + 2, snapshot=snap(policy, now + 2, warm))
    assert report.untainted == ["gpu-new"] and taints_of(double, "gpu-new") == [NOT_READY]
    assert sample(loop, "extender_warm_taint_changes_total", change="removed", reason="warm") == 1


def test_a_node_that_never_warms_is_untainted_after_max_taint(double: KubeDouble, kube: KubeClient) -> None:
    policy = load(**TAINTING)
    double.apply(kube_node("gpu-new", []))
    now = time.time()
    loop = WarmLoop(policy, None, kube)
    assert loop.tick(now, snapshot=snap(policy, now, node("gpu-new", now=now))).tainted == ["gpu-new"]
    later = now + 1800
    report = loop.tick(later, snapshot=snap(policy, later, node("gpu-new", now=later)))
    assert report.untainted == ["gpu-new"] and taints_of(double, "gpu-new") == []
    assert sample(loop, "extender_warm_taint_changes_total", change="removed", reason="max-taint") == 1


def test_nodes_registered_with_the_taint_are_handled_old_nodes_are_left_alone(double: KubeDouble,
                                                                           kube: KubeClient) -> None:
    policy = load(**TAINTING)
    double.apply(kube_node("gpu-registered", [WARMING]))  # kubelet --register-with-taints
    double.apply(kube_node("gpu-old", []))
    later = time.time() + 3600  # both joined an hour ago: gpu-old is no new node
    loop = WarmLoop(policy, None, kube)
    records = (node("gpu-registered", now=later), node("gpu-old", now=later))
    report = loop.tick(later, snapshot=snap(policy, later, *records))
    assert report.tainted == [] and taints_of(double, "gpu-old") == []
    # the registered taint is ours to remove; an hour is past maxTaint (30 min)
    assert report.untainted == ["gpu-registered"] and taints_of(double, "gpu-registered") == []


def test_disabling_warming_releases_tainted_nodes(double: KubeDouble, kube: KubeClient) -> None:
    policy = load(**TAINTING, enabled=False)
    double.apply(kube_node("gpu-new", [WARMING]))
    now = time.time()
    report = WarmLoop(policy, None, kube).tick(now, snapshot=snap(policy, now, node("gpu-new", now=now)))
    assert report.untainted == ["gpu-new"] and taints_of(double, "gpu-new") == []


def test_a_concurrent_taint_change_is_retried_next_tick(double: KubeDouble, kube: KubeClient) -> None:
    policy = load(**TAINTING)
    double.apply(kube_node("gpu-new", []))
    now = time.time()
    loop = WarmLoop(policy, None, kube)
    # the node lifecycle controller wrote first, twice (the start-up list and the one GET of the tick)
    double.fail("patch", "nodes", 409, times=2)
    assert loop.tick(now, snapshot=snap(policy, now, node("gpu-new", now=now))).tainted == []
    # not yet seen as handled: the next tick looks again (one GET) and taints it
    assert loop.tick(now + 1, snapshot=snap(policy, now + 1, node("gpu-new", now=now + 1))).tainted == ["gpu-new"]
    assert taints_of(double, "gpu-new") == [WARMING]


class Pause(NamedTuple):
    policy: dict[str, Any]  # load()'s overrides, {} for BASE
    verb: str
    resource: str
    done: Callable[[WarmTick], bool]  # the tick did what the refused call was for


@pytest.mark.parametrize("case", [
    pytest.param(Pause({}, "create", "jobs", lambda r: r.started == [WEIGHTS_A]), id="a-job-create"),
    pytest.param(Pause(TAINTING, "patch", "nodes", lambda r: r.tainted == ["gpu-a"]), id="a-node-taint"),
])
def test_a_pause_the_api_server_asks_for_is_kept(double: KubeDouble, kube: KubeClient, case: Pause,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """``429`` with ``Retry-After: 30`` (API Priority and Fairness at its busiest): the ticks within
    those 30 s call the API server not once; the first tick after them does the work."""
    policy = load(**case.policy) if case.policy else BASE
    double.apply(kube_node("gpu-a", []))
    now = time.time()  # the node is young at `now`: a tainting policy taints it
    loop = WarmLoop(policy, None, kube)
    double.fail(case.verb, case.resource, 429, headers={"Retry-After": "30"})
    with caplog.at_level("WARNING", logger="extender.warm"):  # the loop's and the tainter's loggers
        refused = loop.tick(now, ONE_LLM, snapshot=snap(policy, now, *two_nodes(now)))
    assert refused.errors and not case.done(refused)
    assert "; retrying in 30s, as the API server asked" in caplog.text
    calls = len(double.requests)
    for t in (now + 15, now + 29):
        held = loop.tick(t, ONE_LLM, snapshot=snap(policy, t, *two_nodes(t)))
        assert held.notes == [f"the API server asked for a pause: no call to it for {now + 30 - t:.0f}s more"]
    assert len(double.requests) == calls
    assert case.done(loop.tick(now + 31, ONE_LLM, snapshot=snap(policy, now + 31, *two_nodes(now + 31))))


def test_a_clock_that_steps_back_does_not_stretch_a_pause(double: KubeDouble, kube: KubeClient) -> None:
    loop = WarmLoop(BASE, None, kube)
    double.fail("create", "jobs", 429, headers={"Retry-After": "30"})
    assert loop.tick(NOW, ONE_LLM, snapshot=snap(BASE, NOW, *two_nodes(NOW))).errors
    back = NOW - 3600  # an hour before the pause began: no pause the server asked for lasts that long
    assert loop.tick(back, ONE_LLM, snapshot=snap(BASE, back, *two_nodes(back))).started == [WEIGHTS_A]


def test_a_bad_expectation_is_reported_not_raised(double: KubeDouble, kube: KubeClient) -> None:
    loop = WarmLoop(BASE, None, kube)
    for expectations in ([Expectation(workload="nope", replicas=1, within_s=60)], ONE_LLM + ONE_LLM):
        report = loop.tick(NOW, expectations, snapshot=snap(BASE, NOW, *two_nodes(NOW)))
        assert report.plan is None and report.started == [] and report.errors[0].startswith("plan: ")
    assert double.count("create", "jobs") == 0


# ---------------------------------------------------------------------------------------------
# Taints after a policy change, Jobs of nodes that left, publish Jobs within the caps
# ---------------------------------------------------------------------------------------------


#: The node annotation naming the taint the warmer put (extender.warm.taints, docs/warming.md).
MARKER_ANNOTATION = "extender.io/warming-taint"


class TaintChange(NamedTuple):
    id: str
    after: dict[str, Any]  # warming knobs of the reloaded policy
    restart: bool  # a new warmer (its memory lost) runs the reloaded policy


TAINT_CHANGES = [
    TaintChange("taintUntilWarm switched off", {"keepWarm": ["llm"]}, False),
    TaintChange("the taint's key changed", {**TAINTING, "newNodes": {"taintUntilWarm": True,
                                                                     "taint": {"key": "example.com/cold"}}}, False),
    TaintChange("the taint's effect changed", {**TAINTING, "newNodes": {"taintUntilWarm": True,
                                                                        "taint": {"effect": "NoExecute"}}}, False),
    TaintChange("switched off, then a restart", {"keepWarm": ["llm"]}, True),
    TaintChange("the key changed, then a restart", {**TAINTING, "newNodes": {"taintUntilWarm": True,
                                                                             "taint": {"key": "example.com/cold"}}},
                True),
]


@pytest.mark.parametrize("case", TAINT_CHANGES, ids=[c.id for c in TAINT_CHANGES])
def test_a_policy_change_still_removes_the_taints_the_warmer_put(double: KubeDouble, kube: KubeClient,
                                                                  case: TaintChange) -> None:
    before = load(**TAINTING)
    double.apply(kube_node("gpu-new", [NOT_READY]))
    now = time.time()
    loop = WarmLoop(before, None, kube)
    assert loop.tick(now, snapshot=snap(before, now, node("gpu-new", now=now))).tainted == ["gpu-new"]
    assert NODE is not None
    assert double.state.get(NODE, None, "gpu-new")["metadata"]["annotations"][MARKER_ANNOTATION] == \
        "extender.io/warming:NoSchedule"
    after = load(**case.after)
    if case.restart:
        loop = WarmLoop(after, None, kube)
    else:
        loop.set_policy(after)
    report = loop.tick(now + 60, snapshot=snap(after, now + 60, node("gpu-new", now=now + 60)))
    # at once, not after maxTaint, and the new taint is not put on a node already seen
    assert report.untainted == ["gpu-new"] and report.tainted == []
    assert taints_of(double, "gpu-new") == [NOT_READY]
    assert MARKER_ANNOTATION not in (double.state.get(NODE, None, "gpu-new")["metadata"].get("annotations") or {})
    assert sample(loop, "extender_warm_taint_changes_total", change="removed", reason="policy") == 1


def test_a_registered_taint_is_released_when_taint_until_warm_is_off(double: KubeDouble, kube: KubeClient) -> None:
    policy = load(keepWarm=["llm"])  # taintUntilWarm off, but the node group still registers the taint
    double.apply(kube_node("gpu-registered", [WARMING]))
    now = time.time()
    report = WarmLoop(policy, None, kube).tick(now, snapshot=snap(policy, now, node("gpu-registered", now=now)))
    assert report.untainted == ["gpu-registered"] and taints_of(double, "gpu-registered") == []


@pytest.mark.parametrize(("taint_until_warm", "errors"), [
    pytest.param(False, 0, id="off-a-forbidden-list-ends-the-search"),
    pytest.param(True, 2, id="on-a-forbidden-list-is-an-error-each-tick"),
])
def test_a_warmer_not_granted_the_node_list(double: KubeDouble, kube: KubeClient, caplog: pytest.LogCaptureFixture,
                                           taint_until_warm: bool, errors: int) -> None:
    # the chart's warmer.taintNodes: false grants no Node API ("the warmer then calls no Node API"),
    # yet the start-up list for old taints was a 403, a warning and an error count at every tick
    policy = load(**TAINTING) if taint_until_warm else load(keepWarm=["llm"])
    double.fail("list", "nodes", 403, times=100)
    loop = WarmLoop(policy, None, kube)
    now = time.time()
    with caplog.at_level(logging.INFO, logger="extender.warm.taints"):
        reports = [loop.tick(now + i, snapshot=snap(policy, now + i)) for i in range(2)]
    assert sum(len([e for e in r.errors if "node taints" in e]) for r in reports) == errors
    assert double.count("list", "nodes") == (1 if not taint_until_warm else 2)
    said = [r for r in caplog.records if "not allowed to list Nodes" in r.getMessage()]
    assert [r.levelno for r in said] == ([] if taint_until_warm else [logging.INFO])  # once, at info


class Left(NamedTuple):
    id: str
    node_exists: bool  # the API server still has the node the inventory no longer lists
    abandoned: bool
    succeeded: bool = False  # the Job had finished: awaiting the agent's confirmation


LEFT = [
    Left("the node was deleted (a scale-down)", False, True),
    Left("the inventory lost the node but it is there", True, False),
    Left("succeeded, then the node was deleted", False, True, succeeded=True),
    Left("succeeded, then the inventory lost the node (Redis restarted empty)", True, False, succeeded=True),
]


@pytest.mark.parametrize("case", LEFT, ids=[c.id for c in LEFT])
def test_a_job_whose_node_left_the_cluster_frees_its_slot(double: KubeDouble, kube: KubeClient, case: Left) -> None:
    policy = load(maxConcurrent=1)
    if case.node_exists:
        double.apply(kube_node("gpu-z", []))
    loop = WarmLoop(policy, None, kube)
    gone = job_name("weights", "gpu-z", "weights:llm/v1")
    image = ["example.com/llm:1"]
    assert loop.tick(NOW, ONE_LLM, snapshot=snap(policy, NOW, node("gpu-z", now=NOW, images=image))).started == [gone]
    if case.succeeded:
        finish(double, gone, ok=True, at=NOW + 30)
    later = NOW + 60
    report = loop.tick(later, ONE_LLM, snapshot=snap(policy, later, node("gpu-b", now=later, images=image)))
    assert report.errors == []
    confirmed = sample(loop, "extender_warm_jobs_finished_total", kind="weights", outcome="confirmed")
    if case.abandoned:
        assert (report.abandoned, report.confirmed) == (([], [gone]) if case.succeeded else ([gone], []))
        assert gone not in jobs(double)
        assert report.started == [job_name("weights", "gpu-b", "weights:llm/v1")]  # the slot is free again
    else:
        # an inventory that lost its records neither deletes the Job nor counts its work as confirmed
        assert report.abandoned == [] and report.confirmed == [] and confirmed == 0 and gone in jobs(double)
        assert report.started == [] and report.plan is not None and report.plan.cluster_full


class PublishSlots(NamedTuple):
    id: str
    per_node: int
    cluster: int
    demand_first: bool  # the weights Job starts before the compile cache is due for publishing
    publishes: bool  # the publish Job starts at NOW + 121
    then_started: bool  # the weights Job starts at NOW + 122 (if not started before)


PUBLISH_SLOTS = [
    PublishSlots("a warm Job holds the holder's only slot", 1, 4, True, False, False),
    PublishSlots("a warm Job holds the cluster's only slot", 2, 1, True, False, False),
    PublishSlots("room on the node and in the cluster", 2, 2, True, True, False),
    PublishSlots("a publish holds the node's only slot", 1, 4, False, True, False),
    PublishSlots("a publish leaves the node a second slot", 2, 4, False, True, True),
]


@pytest.mark.parametrize("case", PUBLISH_SLOTS, ids=[c.id for c in PUBLISH_SLOTS])
def test_publish_jobs_share_the_warm_jobs_caps(double: KubeDouble, kube: KubeClient, case: PublishSlots) -> None:
    policy = load(maxConcurrentPerNode=case.per_node, maxConcurrent=case.cluster)
    loop = WarmLoop(policy, None, kube)

    def at(t: float) -> InventorySnapshot:
        return snap(policy, t, node("gpu-a", now=t, compileKeys=[LLM_KEY], images=["example.com/llm:1"]))

    first = ONE_LLM if case.demand_first else []
    assert loop.tick(NOW, first, snapshot=at(NOW)).started == ([WEIGHTS_A] if case.demand_first else [])
    report = loop.tick(NOW + 121, first, snapshot=at(NOW + 121))
    assert report.publishing == ([publish_job_name(LLM_KEY)] if case.publishes else [])
    report = loop.tick(NOW + 122, ONE_LLM, snapshot=at(NOW + 122))
    assert report.started == ([WEIGHTS_A] if case.then_started else [])
    assert len(jobs(double)) <= min(case.per_node, case.cluster)


# ---------------------------------------------------------------------------------------------
# Two scaler replicas: the warmer of a replica that leads again
# ---------------------------------------------------------------------------------------------


class Term(NamedTuple):
    id: str
    first: dict[str, Any]  # warming knobs while replica B leads first (and sees gpu-new)
    then: dict[str, Any]  # knobs when replica A takes over and B leads again
    join_before_b: bool  # gpu-new exists while B leads first
    after_s: float  # B's new term starts this long after A tainted the node
    reason: str  # why B must remove the taint A put


TERMS = [
    Term("taintUntilWarm switched off before B leads again", TAINTING, {"keepWarm": ["llm"]}, False, 60, "policy"),
    Term("B saw the node before A tainted it, then maxTaint passes", {"keepWarm": ["llm"]}, TAINTING, True, 1800,
         "max-taint"),
    Term("B saw the node with warming off, A tainted it, warming off again", {**TAINTING, "enabled": False},
         {**TAINTING, "enabled": False}, True, 60, "disabled"),
]


@pytest.mark.parametrize("case", TERMS, ids=[c.id for c in TERMS])
def test_a_replica_that_leads_again_removes_the_taints_the_other_one_put(double: KubeDouble, kube: KubeClient,
                                                                        case: Term) -> None:
    """The warm loop lives as long as its scaler replica, across leadership terms. What it learnt
    about the nodes in an earlier term is out of date when it leads again: the other replica may
    have tainted nodes meanwhile, and only the leader ever removes a taint."""
    first, then = load(**case.first), load(**case.then)
    now = time.time()
    if case.join_before_b:
        double.apply(kube_node("gpu-new", [NOT_READY]))
    b = WarmLoop(first, None, kube, instance="scaler-b")
    records = (node("gpu-new", now=now),) if case.join_before_b else ()
    assert b.tick(now, snapshot=snap(first, now, *records), term=1).tainted == []
    if not case.join_before_b:
        double.apply(kube_node("gpu-new", [NOT_READY]))
    # replica A leads (a new term) and taints the cold new node
    a = WarmLoop(load(**TAINTING), None, kube, instance="scaler-a")
    assert a.tick(now + 1, snapshot=snap(then, now + 1, node("gpu-new", now=now + 1)), term=2).tainted == ["gpu-new"]
    # A stops (rolling update, lost lease) before its next tick; B, running the new policy, leads again
    b.set_policy(then)
    t = now + case.after_s
    report = b.tick(t, snapshot=snap(then, t, node("gpu-new", now=t)), term=3)
    assert report.untainted == ["gpu-new"] and taints_of(double, "gpu-new") == [NOT_READY]
    assert sample(b, "extender_warm_taint_changes_total", change="removed", reason=case.reason) == 1


def test_the_scaler_hands_the_warmer_its_leadership_term(double: KubeDouble, kube: KubeClient,
                                                         redis_server: RedisServer, tmp_path: Path) -> None:
    """``extender scale`` (:func:`extender.scaler.serve.build_loop`) passes each led tick's fencing
    token, so its warmer knows when it leads again: here a taint the other replica put before
    ``taintUntilWarm`` was switched off is removed at the first tick of the new term."""
    client = connect(redis_server.url, tmp_path)
    try:
        b = build_loop(ScaleSettings(policy=load(**TAINTING), identity="scaler-b"), client,
                       pods=KubePodLister(kube), kube=kube)
        (warm_after,) = b.on_leader_tick
        now = time.time()
        warm_after(ScalerTick(now=now, leader=True, token=1, holder="scaler-b"))
        double.apply(kube_node("gpu-new", [NOT_READY]))
        a = WarmLoop(load(**TAINTING), None, kube, instance="scaler-a")
        assert a.tick(now + 1, snapshot=snap(a.policy, now + 1, node("gpu-new", now=now + 1)), term=2).tainted \
            == ["gpu-new"]
        for listener in b.on_estimator_policy:
            listener(load(keepWarm=["llm"]), NO_NODE_FACTORS)
        warm_after(ScalerTick(now=now + 60, leader=True, token=3, holder="scaler-b"))
        assert taints_of(double, "gpu-new") == [NOT_READY]
    finally:
        client.close()


class Reporter(NamedTuple):
    id: str
    same_loop: bool  # the warmer that reported the failure ticks again (in a new term), else another one
    term: int | None  # the term of the second look (None: no terms, a restarted process)
    outcome: str = "failed"
    confirm: bool = False  # the Job succeeded but the inventory never showed the cache


REPORTERS = [
    Reporter("a restarted warmer", False, None),
    Reporter("the other replica, leading next", False, 2),
    Reporter("the same replica, leading again", True, 3),
    Reporter("an unconfirmed success, the other replica", False, 2, "unconfirmed", True),
]


@pytest.mark.parametrize("case", REPORTERS, ids=[c.id for c in REPORTERS])
def test_a_failure_is_counted_once_whichever_warmer_sees_it_again(double: KubeDouble, kube: KubeClient,
                                                                   case: Reporter) -> None:
    """A failed Job is kept until its retry time, and each warmer that leads meanwhile reads it: the
    Event named after it (one per Job and reason) says whether it was reported already, so the
    failure is one Event, one count summed over the replicas, one entry in one tick report."""
    first = WarmLoop(BASE, None, kube, instance="scaler-a")

    def tick(loop: WarmLoop, t: float, term: int | None) -> Any:
        return loop.tick(NOW + t, ONE_LLM, snapshot=snap(BASE, NOW + t, *two_nodes(NOW + t)), term=term)

    tick(first, 0, 1)
    finish(double, WEIGHTS_A, ok=case.confirm, at=NOW + 5)
    t = 5 + BASE.warming.confirm_within + 1 if case.confirm else 10
    assert tick(first, t, 1).failed == [WEIGHTS_A]
    second = first if case.same_loop else WarmLoop(BASE, None, kube, instance="scaler-b")
    report = tick(second, t + 2, case.term)
    assert report.failed == [] and report.started == [] and WEIGHTS_A in jobs(double)  # still backing off
    assert len(events(double)) == 1
    total = sum(sample(w, "extender_warm_jobs_finished_total", kind="weights", outcome=case.outcome)
                for w in {id(first): first, id(second): second}.values())
    assert total == 1
