"""The warmer and the sync against the real API: warm Jobs, taint-until-warm, and real watches.

The warm loop runs in the test, ticked as the scaler's leader ticks it, authenticated as the
scaler's ServiceAccount (the chart's RBAC gives it Jobs in ``extender-warm`` and Nodes), on the
stack's policy with ``warm-llm`` kept warm and joining nodes tainted until warm:

* a warm Job is created in the real API, pinned to its node; the Job controller creates its pod,
  the stock scheduler binds it there (the Job asks for no GPU, so the extender is not called) and
  KWOK completes it; a second warm loop (a restarted scaler) plans the same work and creates nothing;
  once the node's agent reports the staged weights, the Job is confirmed and deleted;
* a warm Job's pod deleted while running (preempted, evicted) is replaced only once it has stopped,
  never beside it while it is still terminating;
* a joining Node gets the warming taint on the real Node object and loses it once its agent
  reports every keep-warm cache;
* ``extender sync`` follows real watches: a relabelled Node changes class in the inventory, a
  deleted Node leaves it, and after kube-apiserver restarts (its watch cache starts anew, so the
  sync's resourceVersion is too old: 410 Gone) the sync lists again and carries on. That test runs
  last here (see the comment above it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extender.core.policy import Policy, parse_policy
from extender.core.warming import Action, Expectation
from extender.kube.client import KubeClient
from extender.warm.jobspec import action_job, helper_image
from extender.warm.loop import WarmLoop
from tests.cluster_stack import BIG, POLICY, VLLM_IMAGE, Stack, node, wait, write_weights
from tests.real_cluster import READY_DELAY_ANNOTATION
from tests.test_warm_e2e import AGENT_COMMAND, run_job

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

WARM_NS = "extender-warm"
SOURCE = "s3://models/warm/"


def warm_policy(stack: Stack) -> Policy:
    """The stack's policy with ``warm-llm`` kept warm and joining nodes tainted until warm."""
    text = POLICY.format(image=VLLM_IMAGE, prometheus=stack.demand.url)
    text = text.replace("warming:\n  enabled: true\n", "warming:\n  enabled: true\n  keepWarm: [warm-llm]\n"
                        "  newNodes: {taintUntilWarm: true}\n")
    return parse_policy(text)


@pytest.fixture(scope="module")
def warmer(cluster_stack: Stack) -> Iterator[tuple[Stack, KubeClient]]:
    cluster_stack.scheduler()  # the warm Jobs' pods are scheduled by the stock scheduler
    client = KubeClient.connect(str(cluster_stack.cluster.token_kubeconfig("kube-system", "extender-scaler")))
    try:
        yield cluster_stack, client
    finally:
        client.close()


def jobs(stack: Stack) -> dict[str, dict[str, Any]]:
    return {j["metadata"]["name"]: j for j in stack.cluster.get("jobs", "-n", WARM_NS)["items"]}


def complete(job: dict[str, Any]) -> bool:
    return any(c["type"] == "Complete" and c["status"] == "True" for c in job.get("status", {}).get("conditions", []))


def test_warm_jobs_run_pinned_are_not_duplicated_and_are_confirmed(warmer: tuple[Stack, KubeClient]) -> None:
    stack, client = warmer
    policy = warm_policy(stack)
    expect = [Expectation(workload="warm-llm", replicas=1, within_s=600)]
    loop = WarmLoop(policy, stack.store, client, instance="scaler-0")
    report = loop.tick(time.time(), expect)
    assert report.errors == [], report.errors
    started = [a for a in (report.plan.actions if report.plan else []) if a.workload == "warm-llm"]
    assert started, report
    action = started[0]
    name = next(n for n in report.started if n in jobs(stack))
    job = jobs(stack)[name]
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert str(terms).count(action.node) == 1

    # a restarted scaler sees the Job in flight (or plans the same work and finds it): nothing new
    before = set(jobs(stack))
    again = WarmLoop(policy, stack.store, client, instance="scaler-1").tick(time.time(), expect)
    assert again.errors == [] and again.started == [], again
    assert set(jobs(stack)) == before

    # the Job controller, the scheduler and KWOK run it to completion on the pinned node
    wait(lambda: complete(jobs(stack).get(name, {})), f"Job {name} to complete", report=stack.cluster.report)
    (job_pod,) = stack.cluster.get("pods", "-n", WARM_NS, "-l", f"job-name={name}")["items"]
    assert job_pod["spec"]["nodeName"] == action.node

    # what the Job's containers did on the node; the agent reports it and the loop confirms
    run_job(jobs(stack)[name], stack.roots[action.node], helper_image(policy), source=SOURCE)
    confirmed = wait(lambda: loop.tick(time.time(), expect).confirmed, "the warm loop confirming the Job",
                     report=stack.cluster.report)
    assert name in confirmed
    wait(lambda: name not in jobs(stack), f"Job {name} deleted after confirmation", report=stack.cluster.report)


def taints(stack: Stack, name: str) -> list[str]:
    return [t["key"] for t in stack.cluster.get("node", name)["spec"].get("taints", [])]


def test_a_joining_node_is_tainted_until_warm(warmer: tuple[Stack, KubeClient], tmp_path: Path) -> None:
    stack, client = warmer
    policy = warm_policy(stack)
    loop = WarmLoop(policy, stack.store, client, instance="scaler-0")
    loop.tick(time.time())  # a running warmer, before the node joins
    stack.cluster.apply([node("gpu-d", BIG)])
    wait(lambda: "gpu-d" in stack.store.names(), "the sync adding gpu-d", report=stack.cluster.report)
    tainted = wait(lambda: loop.tick(time.time()).tainted, "the warmer tainting gpu-d", report=stack.cluster.report)
    assert tainted == ["gpu-d"]
    assert policy.warming.new_nodes.taint.key in taints(stack, "gpu-d")

    # the node gets its keep-warm cache and an agent that reports it: the taint comes off
    root = tmp_path / "gpu-d"
    write_weights(root, "warm-llm", SOURCE)
    stack.python("agent-gpu-d", ["agent", "--node-name", "gpu-d", "--cache-root", str(root), "--interval", "0.2",
                                 "--redis-url", stack.redis.url], AGENT_COMMAND)
    wait(lambda: loop.tick(time.time()).untainted == ["gpu-d"], "the warmer untainting gpu-d",
         report=stack.cluster.report)
    assert policy.warming.new_nodes.taint.key not in taints(stack, "gpu-d")

    # a deleted Node leaves the inventory (the sync's watch sees DELETED)
    stack.cluster.processes["agent-gpu-d"].stop()
    stack.cluster.kubectl("delete", "node", "gpu-d")
    wait(lambda: "gpu-d" not in stack.store.names(), "the sync removing gpu-d", report=stack.cluster.report)


def node_class(stack: Stack, name: str) -> str:
    record = stack.store.get(name)
    return record.node_class if record is not None else ""


def test_a_warm_jobs_pod_is_replaced_only_once_the_old_one_has_stopped(warmer: tuple[Stack, KubeClient]) -> None:
    """Two pods of one warm Job never run at once: pinned to one node, both would write the same
    staging directory. The Job controller's default (``podReplacementPolicy: TerminatingOrFailed``)
    replaces a pod as soon as it is terminating (evicted, preempted: the warm Jobs' priority is low),
    while it still runs its grace period (seen here about 8 s after the deletion: the controller's
    first failure backoff is 10 s)."""
    stack, client = warmer
    cluster = stack.cluster
    policy = warm_policy(stack)
    action = Action(node="gpu-b", workload="warm-llm", kind="image", cache="image:registry.test/warm-hold:1",
                    bytes=0, nvme_bytes=0, duration_s=1.0, deadline=None, saved_s=0.0, purpose="keep-warm")
    body = action_job(policy, action)
    name = body["metadata"]["name"]
    # KWOK leaves the pod bound but not started for an hour: running as far as the Job can tell
    body["spec"]["template"]["metadata"]["annotations"] = {READY_DELAY_ANNOTATION: json.dumps({"gpu-b": "1h"})}

    def pods(*, bound: bool = False) -> list[str]:
        """The Job's pods (only those bound to a node with ``bound``)."""
        return [p["metadata"]["name"] for p in cluster.get("pods", "-n", WARM_NS, "-l", f"job-name={name}")["items"]
                if p["spec"].get("nodeName") or not bound]

    steps: list[str] = []  # what the test did to the pod, with kubectl's answer

    def report() -> str:
        """What the test did, the Job's status and its pods' state, then the components' logs."""
        listed = cluster.get("pods", "-n", WARM_NS, "-l", f"job-name={name}")["items"]
        state = [{"name": p["metadata"]["name"], "node": p["spec"].get("nodeName"),
                  "phase": p.get("status", {}).get("phase"), "deleted": p["metadata"].get("deletionTimestamp"),
                  "finalizers": p["metadata"].get("finalizers")} for p in listed]
        status = jobs(stack).get(name, {}).get("status")
        return (f"steps: {json.dumps(steps)}\njob status: {json.dumps(status)}\npods: {json.dumps(state)}"
                f"{cluster.report()}")

    client.create_job(WARM_NS, body)
    (first,) = wait(lambda: pods(bound=True), f"the pod of Job {name} bound to gpu-b", report=report)
    hold = '[{"op": "add", "path": "/metadata/finalizers/-", "value": "extender.test/hold"}]'
    cluster.kubectl("patch", "pod", first, "-n", WARM_NS, "--type=json", "-p", hold)
    try:
        cluster.kubectl("delete", "pod", first, "-n", WARM_NS, "--wait=false")
        wait(lambda: jobs(stack)[name].get("status", {}).get("terminating") == 1,
             "the Job controller counting the pod as terminating", report=report)
        # held terminating past the controller's backoff: no second pod meanwhile
        with pytest.raises(AssertionError, match="timed out"):
            wait(lambda: len(pods()) > 1, "a second pod while the first still terminates", timeout_s=15)
    finally:
        finalizers = cluster.get("pod", first, "-n", WARM_NS)["metadata"].get("finalizers", [])
        index = finalizers.index("extender.test/hold")
        cluster.kubectl("patch", "pod", first, "-n", WARM_NS, "--type=json", "-p",
                        f'[{{"op": "remove", "path": "/metadata/finalizers/{index}"}}]')
        # what the kubelet does once the containers are stopped (KWOK has no kubelet for a deleted pod)
        failed = cluster.kubectl("patch", "pod", first, "-n", WARM_NS, "--subresource=status", "--type=merge",
                                 "-p", '{"status": {"phase": "Failed"}}', check=False)  # gone already: replaced early
        steps.append(f"{time.strftime('%H:%M:%S')} phase Failed: rc={failed.returncode} "
                     f"{(failed.stdout + failed.stderr).strip()}")
    try:
        # once the old pod has stopped, the work is retried
        wait(lambda: (now := pods()) and first not in now, "the replacement after the old pod stopped",
             report=report)
    finally:
        client.delete_job(WARM_NS, name)


# Last in the module: after kube-apiserver restarts, kube-controller-manager's informers lag for a
# few seconds, and a Job whose pod its pod informer first sees already terminating never counts that
# pod's creation (the Job controller's addPod skips it), so it creates no replacement until its
# expectations expire five minutes later. The replacement test above met exactly that in CI.
def test_the_sync_follows_watches_and_relists_after_an_apiserver_restart(warmer: tuple[Stack, KubeClient]) -> None:
    stack, _ = warmer
    cluster = stack.cluster
    assert node_class(stack, "gpu-c") == "g5.12xlarge"
    cluster.kubectl("label", "node", "gpu-c", "--overwrite", "node.kubernetes.io/instance-type=g5.48xlarge")
    wait(lambda: node_class(stack, "gpu-c") == "g5.48xlarge", "the sync seeing gpu-c relabelled",
         report=cluster.report)

    sync_log = cluster.processes["sync"].log
    relists_before = sync_log.read_text(errors="replace").count("listing again")
    cluster.restart_apiserver()
    cluster.kubectl("label", "node", "gpu-c", "--overwrite", "node.kubernetes.io/instance-type=g5.12xlarge")
    wait(lambda: node_class(stack, "gpu-c") == "g5.12xlarge", "the sync seeing gpu-c relabelled back",
         report=cluster.report)
    relists = sync_log.read_text(errors="replace").count("listing again") - relists_before
    assert relists >= 1, sync_log.read_text(errors="replace")[-3000:]
