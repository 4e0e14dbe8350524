"""Scaling through the real aggregator and the real HPA, and the whole loop down to Ready pods.

``extender scale`` runs as ServiceAccount ``extender-scaler`` (the chart's RBAC) with delegated
authentication read from the cluster (its front-proxy CA ConfigMap, TokenReview,
SubjectAccessReview). It is registered with the chart's APIService of the plain-Secret path: its
``caBundle`` is the CA that signed the scaler's serving certificate (SAN
``extender-scaler.kube-system.svc``), so the aggregator verifies the scaler for real. The one
change is where the Service points: ``type: ExternalName`` with ``externalName: localhost`` and the
port the scaler listens on, which the aggregator dials (a ClusterIP would need kube-proxy, and
Endpoints may not hold loopback addresses). The HPA is deploy/examples/hpa.yaml with the names of this test's
workload, ``chat`` (namespace ``chat``, 4 GPUs a replica, 1-4 replicas, 4 requests/s each); demand
comes from a Prometheus HTTP API the test serves (tests/cluster_stack.py, ``Demand``).

The loop: chat's weights are on gpu-a only, so the estimator says gpu-a starts a replica in
132.6 s, gpu-b (image only) in 372.5 s, gpu-c (nothing) far later. The Deployment's pods carry those
seconds, divided by :data:`TIME_SCALE`, for KWOK to wait before making a pod Ready on each node.
Demand rises; the scaler publishes 4 replicas; the HPA scales; the stock scheduler, calling the
extender, fills gpu-a (2 replicas of 4 GPUs) before gpu-b and leaves the cold gpu-c empty; and each
pod's own conditions show the warm replicas Ready sooner than the others.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import yaml

from tests import chart
from tests.cluster_stack import Stack, deployment, namespace, pod_template, wait, write_weights
from tests.net import free_port
from tests.pki import make_cert

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

NAMESPACE = "chat"
GPUS = 4
#: Cluster seconds per estimated second: a replica the estimator gives 132.6 s is Ready after 2.7 s.
TIME_SCALE = 50.0
METRIC_PATH = (f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/extender-desired-replicas"
               "?labelSelector=workload%3Dchat")


@pytest.fixture(scope="module")
def scaler(cluster_stack: Stack) -> Iterator[Stack]:
    """The scaler serving the External Metrics API behind the real aggregator (APIService Available)."""
    stack, cluster = cluster_stack, cluster_stack.cluster
    stack.wait_for_empty_nodes()
    port = free_port()
    serving = make_cert(cluster.directory / "pki", "scaler-serving", cluster.pki.ca, "/CN=extender-scaler",
                        server=True, dns=("extender-scaler.kube-system.svc",))
    config = cluster.token_kubeconfig("kube-system", "extender-scaler")
    stack.python("scaler", ["scale", "--policy", str(stack.policy), "--redis-url", stack.redis.url,
                            "--kubeconfig", str(config), "--bind", f"127.0.0.1:{port}",
                            "--tls-cert", str(serving.cert), "--tls-key", str(serving.key)])
    ca_bundle = base64.b64encode(cluster.pki.ca.cert.read_bytes()).decode()
    apiservice = chart.one(chart.rendered(metrics__externalMetrics__certificates="secret",
                                          metrics__externalMetrics__caBundle=ca_bundle), "APIService")
    assert "insecureSkipTLSVerify" not in apiservice["spec"]
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": apiservice["spec"]["service"]["name"],
                            "namespace": apiservice["spec"]["service"]["namespace"]},
               "spec": {"type": "ExternalName", "externalName": "localhost"}}
    apiservice["spec"]["service"]["port"] = port
    cluster.apply([service, apiservice, namespace(NAMESPACE)])

    def available() -> bool:
        conditions = cluster.get("apiservice", apiservice["metadata"]["name"])["status"].get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    wait(available, "the APIService to become Available", timeout_s=120, report=cluster.report)
    try:
        yield stack
    finally:
        # before the scaler stops: a dead aggregated API stalls namespace deletion on discovery
        cluster.kubectl("delete", "apiservice", apiservice["metadata"]["name"], "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        cluster.processes["scaler"].stop()


def published(stack: Stack) -> int | None:
    """The desired replicas for chat, read through the aggregator with ``kubectl get --raw``."""
    done = stack.cluster.kubectl("get", "--raw", METRIC_PATH, check=False)
    if done.returncode != 0:
        return None
    items = json.loads(done.stdout)["items"]
    return int(float(items[0]["value"])) if items else None


def hpa(stack: Stack) -> dict[str, Any]:
    """deploy/examples/hpa.yaml, renamed to this test's workload and the profile's bounds."""
    (manifest,) = [d for d in yaml.safe_load_all((chart.EXAMPLES / "hpa.yaml").read_text()) if d]
    manifest["metadata"] = {"name": "chat", "namespace": NAMESPACE}
    manifest["spec"]["scaleTargetRef"]["name"] = "chat"
    manifest["spec"]["minReplicas"], manifest["spec"]["maxReplicas"] = 1, 4
    (metric,) = manifest["spec"]["metrics"]
    metric["external"]["metric"]["selector"]["matchLabels"] = {"workload": "chat"}
    return dict(manifest)


def condition(stack: Stack, name: str, kind: str) -> str | None:
    conditions = stack.cluster.get("hpa", name, "-n", NAMESPACE).get("status", {}).get("conditions", [])
    return next((c["status"] for c in conditions if c["type"] == kind), None)


def at(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def test_the_metric_is_served_through_the_aggregator(scaler: Stack) -> None:
    scaler.demand.values.update(demand=0.0, queue=0.0)

    def served() -> tuple[int] | None:
        value = published(scaler)
        return None if value is None else (value,)

    seen = wait(served, "a published desired-replicas value", report=scaler.cluster.report)
    assert seen is not None
    (value,) = seen
    assert value == 0  # no demand: the need, 0; the HPA applies the profile's minReplicas (1) itself
    # the discovery document lists both metrics, through the same path the HPA uses
    discovery = json.loads(scaler.cluster.kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1").stdout)
    assert {r["name"] for r in discovery["resources"]} == {"extender-desired-replicas", "extender-forecast-load",
                                                           "extender-standby-replicas"}


def test_demand_rises_the_hpa_scales_and_warm_replicas_are_ready_first(scaler: Stack) -> None:
    stack, cluster = scaler, scaler.cluster
    write_weights(stack.roots["gpu-a"], "chat", "s3://models/chat/")
    probe = {"metadata": {"name": "probe", "namespace": NAMESPACE, **pod_template("chat")["metadata"]},
             "spec": pod_template("chat", gpus=GPUS)["spec"]}
    wait(lambda: stack.best_nodes(probe, ["gpu-a", "gpu-b", "gpu-c"]) == {"gpu-a"},
         "the extender ranking gpu-a first for chat", report=cluster.report)
    startup = stack.startup_s(probe)
    assert startup["gpu-a"] < startup["gpu-b"] < startup["gpu-c"], startup
    stack.scheduler()  # the chart's configuration
    ready_after = {node: seconds / TIME_SCALE for node, seconds in startup.items()}
    cluster.apply([deployment("chat", NAMESPACE, "chat", 1, gpus=GPUS, ready_after=ready_after), hpa(stack)])
    wait(lambda: condition(stack, "chat", "ScalingActive") == "True", "the HPA reporting ScalingActive=True",
         report=cluster.report)

    stack.demand.values.update(demand=15.0, queue=0.0)  # 15 requests/s at 4 a replica: 4 replicas
    wait(lambda: published(stack) == 4, "the scaler publishing 4 replicas", report=cluster.report)
    wait(lambda: cluster.get("deployment", "chat", "-n", NAMESPACE)["spec"]["replicas"] == 4,
         "the HPA scaling the Deployment to 4", report=cluster.report)

    def all_ready() -> list[dict[str, Any]] | None:
        pods: list[dict[str, Any]] = cluster.get("pods", "-n", NAMESPACE, "-l", "app=chat")["items"]
        ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p["status"].get("conditions", []))]
        return ready if len(ready) == 4 else None

    def pod_states() -> str:
        return cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "yaml").stdout + cluster.report()

    placed: dict[str, list[float]] = {}
    for p in wait(all_ready, "4 Ready replicas", report=pod_states) or []:
        conditions = {c["type"]: at(c["lastTransitionTime"]) for c in p["status"]["conditions"]}
        placed.setdefault(p["spec"]["nodeName"], []).append(conditions["Ready"] - conditions["PodScheduled"])
    sys.stderr.write(f"chat replicas: seconds from scheduled to Ready by node {placed}\n")
    # gpu-a (warm) is filled first; the rest go to the node with the image, none to the cold one
    assert sorted(placed) == ["gpu-a", "gpu-b"] and len(placed["gpu-a"]) == len(placed["gpu-b"]) == 2, placed
    # Ready after KWOK waited the estimator's time for the node (2.7 s against 7.5 s):
    assert max(placed["gpu-a"]) < min(placed["gpu-b"]), placed
