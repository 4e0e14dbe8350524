"""The chart against the real kube-apiserver: every object validates, and the RBAC is right for real.

* **Validation.** Every object the chart renders, in every combination of choices (and the
  examples in deploy/examples), passes server-side validation (``kubectl apply --dry-run=server``,
  strict field validation, admission included), except the kinds of cert-manager and KEDA, which a
  bare API server does not serve (tests/test_packaging.py checks those against the objects they name).
  The scheduler configuration is loaded by the real kube-scheduler in the scheduling tests (and the
  second scheduler's in tests/test_cluster_packaging.py). A misspelt field is refused, so the check can fail.
* **RBAC.** The stack (tests/cluster_stack.py) runs ``extender sync`` and the agents with tokens of
  the ServiceAccounts the chart binds; here each account's grants meet the real authorizer:
  what the components do is allowed (the sync fills the inventory, the agent labels its Node), and
  anything outside the grants is refused with 403, through kubectl and through our own client
  (which must map it to :class:`KubeApiError` with the status). The agent's grant on Nodes, which
  RBAC cannot narrow to one, meets the chart's ValidatingAdmissionPolicy in the real admission
  chain: its own Node's readiness labels only, with the token of its pod. The warmer's and the scaler's calls
  are exercised under their account in test_cluster_warming.py and test_cluster_scaling.py.

The API double's RBAC evaluator (tests/test_rbac.py) stays for what the real server cannot tell us
cheaply: that no grant goes unused.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from extender.kube.client import KubeClient
from extender.kube.errors import KubeApiError
from tests import chart
from tests.cluster_stack import WITH_AGENT, Stack
from tests.real_cluster import Cluster
from tests.test_packaging import RENDERS

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

def example_documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((chart.EXAMPLES / name).read_text()) if d]


#: The examples a bare API server can check (scaledobject.yaml is KEDA's kind only: test_packaging.py).
EXAMPLES = [p.name for p in sorted(chart.EXAMPLES.glob("*.yaml"))
            if any(d["kind"] not in chart.FOREIGN_KINDS for d in example_documents(p.name))]


def validate(cluster: Cluster, documents: list[dict[str, Any]]) -> None:
    documents = [d for d in documents if d["kind"] not in chart.FOREIGN_KINDS]
    out = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                          input=yaml.safe_dump_all(documents)).stdout
    assert out.count("(server dry run)") == len(documents), out


@pytest.mark.parametrize(("name", "documents"), RENDERS, ids=[n for n, _ in RENDERS])
def test_everything_rendered_passes_server_side_validation(cluster_stack: Stack, name: str,
                                                           documents: list[dict[str, Any]]) -> None:
    # the stack applied the chart's access objects for real, so the extender-warm namespace exists
    assert len([d for d in documents if d["kind"] not in chart.FOREIGN_KINDS]) >= 20
    validate(cluster_stack.cluster, documents)


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_examples_pass_server_side_validation(cluster_stack: Stack, example: str) -> None:
    validate(cluster_stack.cluster, example_documents(example))


def test_a_misspelt_field_is_refused_by_the_same_check(kube_cluster: Cluster) -> None:
    service = chart.one(chart.rendered(), "Service", "extender-scaler")
    service["spec"]["clusterIp"] = "None"  # clusterIP
    done = kube_cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                                input=yaml.safe_dump(service), check=False)
    assert done.returncode != 0 and 'unknown field "spec.clusterIp"' in done.stderr, done.stderr


def test_the_sync_and_the_agents_work_with_only_their_grants(cluster_stack: Stack) -> None:
    # the stack waited for the sync's nodes and the agents' heartbeats; the agents also label
    # their Node (get + patch of nodes), which needs extender-agent's ClusterRole
    store, cluster = cluster_stack.store, cluster_stack.cluster
    assert store.names() >= {"gpu-a", "gpu-b", "gpu-c"}
    for name in WITH_AGENT:
        record = store.get(name)
        assert record is not None and record.node_class == "g5.48xlarge" and record.gpus == 8
    for name in ("sync", *(f"agent-{n}" for n in WITH_AGENT)):
        log = cluster.processes[name].log.read_text(errors="replace")
        # a refused call logs "<action>: 403 Forbidden: ..." (extender.kube.errors); a bare "403"
        # also turns up in timestamps (06:24:03.403Z) and resource versions
        assert not re.search(r": 403\b", log) and "forbidden" not in log.lower(), log[-2000:]


#: (account, kubectl verb and resource, namespace): calls outside each account's grants.
REFUSED = [
    pytest.param("extender-sync", ["get", "secrets"], "kube-system", id="sync-reads-secrets"),
    pytest.param("extender-sync", ["delete", "pod", "any-pod"], "default", id="sync-deletes-pods"),
    pytest.param("extender-sync", ["label", "node", "gpu-a", "x=y"], None, id="sync-labels-nodes"),
    pytest.param("extender-agent", ["get", "pods"], "default", id="agent-lists-pods"),
    pytest.param("extender-agent", ["delete", "node", "gpu-a"], None, id="agent-deletes-nodes"),
    pytest.param("extender-scaler", ["get", "jobs"], "default", id="warmer-jobs-outside-its-namespace"),
    pytest.param("extender-scaler", ["get", "jobs", "some-job"], "extender-warm", id="warmer-gets-a-job"),
    pytest.param("extender-scaler", ["get", "secrets"], "kube-system", id="scaler-reads-secrets"),
]


@pytest.mark.parametrize(("account", "call", "namespace"), REFUSED)
def test_calls_outside_the_grants_are_refused(cluster_stack: Stack, account: str, call: list[str],
                                              namespace: str | None) -> None:
    cluster = cluster_stack.cluster
    config = cluster.token_kubeconfig("kube-system", account)
    where = ["-n", namespace] if namespace else []
    done = cluster.kubectl(*call, *where, kubeconfig=config, check=False)
    assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr


#: (what gpu-a's agent runs with its pod's token, the refusal expected or None): RBAC grants get and
#: patch of every Node; the chart's ValidatingAdmissionPolicy narrows them to its own readiness labels.
AGENT_NODE_CHANGES = [
    pytest.param(["label", "node", "gpu-a", "extender.io/deploy-test.weights=ready"], None, id="own-readiness-label"),
    pytest.param(["label", "node", "gpu-b", "extender.io/deploy-test.weights=ready"],
                 "the agent may change only the Node its pod runs on", id="another-nodes-label"),
    pytest.param(["label", "node", "gpu-a", "extender.test/other=x"],
                 "only extender.io/<workload>.weights labels", id="a-label-it-does-not-own"),
    pytest.param(["label", "node", "gpu-a", "node.kubernetes.io/instance-type-"],
                 "only extender.io/<workload>.weights labels", id="removing-a-label-it-does-not-own"),
    pytest.param(["label", "node", "gpu-a", "extender.io/deploy-test=ready"],
                 "only extender.io/<workload>.weights labels", id="its-prefix-without-the-suffix"),
    pytest.param(["annotate", "node", "gpu-a", "extender.test/note=x"],
                 "may not change a Node's spec, annotations", id="an-annotation"),
    pytest.param(["taint", "node", "gpu-a", "extender.test/hold=x:NoSchedule"],
                 "may not change a Node's spec, annotations", id="a-taint"),
]


@pytest.mark.parametrize(("call", "refusal"), AGENT_NODE_CHANGES)
def test_an_agent_may_change_only_its_own_nodes_readiness_labels(cluster_stack: Stack, call: list[str],
                                                                  refusal: str | None) -> None:
    cluster = cluster_stack.cluster
    config = cluster.pod_token_kubeconfig("kube-system", "extender-agent", "gpu-a")
    before = cluster.get("node", call[2])["metadata"]
    done = cluster.kubectl(*call, kubeconfig=config, check=False)
    if refusal is None:
        assert done.returncode == 0, done.stderr
        cluster.kubectl("label", "node", call[2], "extender.io/deploy-test.weights-")
        return
    assert done.returncode != 0 and "Forbidden" in done.stderr and refusal in done.stderr, done.stderr
    after = cluster.get("node", call[2])["metadata"]
    assert (after.get("labels"), after.get("annotations")) == (before.get("labels"), before.get("annotations"))


def test_an_agent_token_not_bound_to_a_pod_on_the_node_changes_nothing(cluster_stack: Stack) -> None:
    """A token of the agent's account minted by hand carries no node name: RBAC lets it patch
    every Node, the admission policy lets it patch none."""
    cluster = cluster_stack.cluster
    config = cluster.token_kubeconfig("kube-system", "extender-agent")
    done = cluster.kubectl("label", "node", "gpu-a", "extender.io/deploy-test.weights=ready", kubeconfig=config,
                           check=False)
    assert done.returncode != 0 and "the agent may change only the Node its pod runs on" in done.stderr, done.stderr


def test_our_client_reports_a_refusal_as_403(cluster_stack: Stack) -> None:
    config = cluster_stack.cluster.token_kubeconfig("kube-system", "extender-agent")
    client = KubeClient.connect(str(config))
    try:
        for resource in ("pods", "nodes"):  # the agent may get and patch one Node, list nothing
            with pytest.raises(KubeApiError) as refused:
                client.list(resource)
            assert refused.value.status == 403, resource
    finally:
        client.close()


#: (account, verb, resource, group, namespace, name): what each component calls (extender/kube, the
#: scaler's delegated authentication), each of which the real authorizer must allow.
NEEDED = [
    ("extender-sync", "list", "nodes", "", "", ""),
    ("extender-sync", "watch", "nodes", "", "", ""),
    ("extender-sync", "list", "pods", "", "", ""),
    ("extender-sync", "watch", "pods", "", "", ""),
    ("extender-agent", "get", "nodes", "", "", "gpu-a"),
    ("extender-agent", "patch", "nodes", "", "", "gpu-a"),
    ("extender-scaler", "list", "pods", "", "", ""),
    ("extender-scaler", "create", "tokenreviews", "authentication.k8s.io", "", ""),
    ("extender-scaler", "create", "subjectaccessreviews", "authorization.k8s.io", "", ""),
    ("extender-scaler", "get", "configmaps", "", "kube-system", "extension-apiserver-authentication"),
    ("extender-scaler", "list", "jobs", "batch", "extender-warm", ""),
    ("extender-scaler", "create", "jobs", "batch", "extender-warm", ""),
    ("extender-scaler", "delete", "jobs", "batch", "extender-warm", "warm-x"),
    ("extender-scaler", "create", "events", "", "extender-warm", ""),
    ("extender-scaler", "patch", "nodes", "", "", "gpu-a"),
]


@pytest.mark.parametrize("call", NEEDED, ids=[f"{a}-{v}-{r}" for a, v, r, *_ in NEEDED])
def test_what_the_components_call_is_allowed(cluster_stack: Stack, call: tuple[str, str, str, str, str, str]) -> None:
    account, verb, resource, group, namespace, name = call
    allowed, reason = cluster_stack.cluster.allowed(f"system:serviceaccount:kube-system:{account}", verb, resource,
                                                    group=group, namespace=namespace, name=name)
    assert allowed, reason


@pytest.mark.parametrize("metric", ["extender-desired-replicas", "extender-forecast-load", "extender-standby-replicas"])
def test_the_hpa_controller_may_read_the_metrics(cluster_stack: Stack, metric: str) -> None:
    # The HPA reads GET .../namespaces/<ns>/<metric>?labelSelector=..., a "list" to the authorizer.
    # Kubernetes' own bootstrap role for the HPA controller already grants it every external
    # metric, so deploy/ needs no binding of its own for it (see docs/scaler.md).
    allowed, reason = cluster_stack.cluster.allowed(
        "system:serviceaccount:kube-system:horizontal-pod-autoscaler", "list", metric,
        group="external.metrics.k8s.io", namespace="chat")
    assert allowed and "system:controller:horizontal-pod-autoscaler" in reason, reason
