"""The chart's second-scheduler mode on the real control plane.

The scheduler configuration the chart renders for ``mode: second-scheduler`` (ConfigMap
extender-scheduler-config) runs as a real kube-scheduler process with the chart's own grants for
it: its ServiceAccount, bound to Kubernetes' scheduler roles and its leader-election Role, applied
from the same rendering, and a token of that account (leader election on, as rendered). The only
changes are the ones a process outside a pod needs: the kubeconfig (instead of the in-cluster
token) and the extender's port (the stack's extender, instead of the sidecar's 8888).

It schedules the pods that name it, through the extender (which counts the calls), and only those:
a pod naming another scheduler stays unbound. Its Lease shows it took the lock it was given.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests import chart
from tests.cluster_stack import Stack, namespace, pod, scheduler_configuration, wait

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

NAMESPACE = "opt-in"
VALUES = {"mode": "second-scheduler"}


@pytest.fixture(scope="module")
def second_scheduler(cluster_stack: Stack) -> Iterator[str]:
    stack, cluster = cluster_stack, cluster_stack.cluster
    stack.wait_for_empty_nodes()
    rendered = chart.rendered(**VALUES)
    config = scheduler_configuration(**VALUES)
    (profile,) = config["profiles"]
    name = str(profile["schedulerName"])
    account = chart.one(rendered, "ServiceAccount", name)
    access = [d for d in rendered if d["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRoleBinding")
              and d["metadata"]["name"].startswith(name)]
    assert len(access) >= 5  # the account, the scheduler roles, the authentication reader, the Lease
    cluster.apply([*access, namespace(NAMESPACE)])
    (extender,) = config["extenders"]
    url = urlsplit(extender["urlPrefix"])
    assert url.hostname == "127.0.0.1"  # the sidecar in the same pod
    extender["urlPrefix"] = f"{url.scheme}://127.0.0.1:{stack.extender_port}"
    token = cluster.token_kubeconfig(account["metadata"]["namespace"], name)
    cluster.start_scheduler(name, config, kubeconfig=token, leader_election=True)
    try:
        yield name
    finally:
        cluster.processes[name].stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def node_of(stack: Stack, name: str) -> str:
    return str(stack.cluster.get("pod", name, "-n", NAMESPACE)["spec"].get("nodeName") or "")


def test_it_schedules_the_pods_that_name_it_through_the_extender(cluster_stack: Stack, second_scheduler: str) -> None:
    stack = cluster_stack
    before = stack.extender_calls()
    stack.cluster.apply([pod("opted-in", NAMESPACE, "big-llm", scheduler=second_scheduler)])
    landed = wait(lambda: node_of(stack, "opted-in"), "the opted-in pod to be bound", report=stack.cluster.report)
    assert landed in {"gpu-a", "gpu-b", "gpu-c"}
    after = stack.extender_calls()
    assert after.get(("prioritize", "scored"), 0) > before.get(("prioritize", "scored"), 0), (before, after)
    events: list[dict[str, Any]] = stack.cluster.get(
        "events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=opted-in,reason=Scheduled")["items"]
    assert events and {e.get("reportingComponent") or e["source"]["component"] for e in events} == {second_scheduler}
    # it holds the Lease its Role names (leader election with its own grants)
    lease = stack.cluster.get("lease", second_scheduler, "-n", "kube-system")
    assert lease["spec"]["holderIdentity"]


def test_it_leaves_every_other_pod_alone(cluster_stack: Stack, second_scheduler: str) -> None:
    stack = cluster_stack
    stack.cluster.apply([pod("someone-elses", NAMESPACE, "big-llm", scheduler="no-such-scheduler"),
                         pod("marker", NAMESPACE, "big-llm", scheduler=second_scheduler)])
    # once a later pod of ours is bound, the other one was seen by the same informer and left
    wait(lambda: node_of(stack, "marker"), "the marker pod to be bound", report=stack.cluster.report)
    assert node_of(stack, "someone-elses") == ""
    log = stack.cluster.processes[second_scheduler].log.read_text(errors="replace")
    assert "forbidden" not in log.lower(), log[-3000:]  # its grants were enough for everything it did
