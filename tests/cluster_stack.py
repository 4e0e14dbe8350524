"""extender deployed on the real test cluster (tests/real_cluster.py), the way the chart deploys it.

One stack per test session (:func:`tests.conftest.cluster_stack`):

* the chart's ServiceAccounts, RBAC, admission policy, warm namespace and PriorityClass
  (deploy/helm/extender, rendered with ``agent.labelNodes``) applied for real;
* three KWOK nodes of two classes: ``gpu-a`` and ``gpu-b`` (g5.48xlarge, 8 GPUs, kubelet lists the
  vLLM image), ``gpu-c`` (g5.12xlarge, 4 GPUs, no image, no agent: it stays unknown, so cold);
* a real Redis; ``extender sync`` authenticated as ServiceAccount ``extender-sync``; ``extender
  agent`` for gpu-a and gpu-b on their own cache roots, labelling their Node as ``extender-agent``
  with the token of a pod on that node (the admission policy lets an agent label only its own Node);
  the scheduler extender (gunicorn) on a free loopback port.

Each test brings its own kube-scheduler, workloads and namespace; the stack's Nodes and inventory are
shared, so tests that add caches use their own profile (see :data:`POLICY`).
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import yaml
from prometheus_client.parser import text_string_to_metric_families

from extender.layout import mark_complete, weights_dir, write_manifest
from extender.state import InventoryStore, connect
from tests import chart
from tests.kube_double.waiting import wait_until
from tests.net import free_port
from tests.real_cluster import READY_DELAY_ANNOTATION, TOKEN_HOLDER_LABEL, Cluster
from tests.test_agent_scan import sparse
from tests.test_e2e_agent_scoring import COMMAND, env
from tests.test_warm_e2e import AGENT_COMMAND

if TYPE_CHECKING:
    from tests.conftest import RedisServer

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
GB = 10**9
VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"
VLLM_NAMES = ["docker.io/vllm/vllm-openai@sha256:" + "b" * 64, "docker.io/vllm/vllm-openai:v0.11.0"]
BIG = "g5.48xlarge"
SMALL = "g5.12xlarge"
NODES = {"gpu-a": BIG, "gpu-b": BIG, "gpu-c": SMALL}
WITH_AGENT = ("gpu-a", "gpu-b")
#: Seconds anything in the cluster has to settle (a setup bound, not a performance assertion).
SETTLE_S = 90.0

#: The policy every component of the stack runs. ``big-llm``: placement; ``slo-llm``: the hard
#: rule (startup within its SLO, which only a node holding the weights meets); ``chat``: the
#: autoscaled workload of the scaling tests, its demand read from a Prometheus API the test serves
#: (``{prometheus}``); ``warm-llm``: the workload the warmer stages; ``calib-llm``: the replicas
#: whose starts calibration observes (``calibration.mode: suggest``: the sync records starts, nothing
#: is applied, so the other tests' estimates are the policy's).
POLICY = """\
apiVersion: extender.io/v1alpha1
kind: Policy
metadata: {{name: cluster-test}}
nodeClasses:
  - name: g5.48xlarge
    matchLabels: {{node.kubernetes.io/instance-type: g5.48xlarge}}
    gpu: {{product: NVIDIA-A10G, count: 8}}
    nvme: {{capacity: 7600GB, readBandwidth: 7GB/s, reserve: 100GB}}
    network: {{nic: 100Gbps, objectStorePerStream: 5.96Gbps}}
  - name: g5.12xlarge
    matchLabels: {{node.kubernetes.io/instance-type: g5.12xlarge}}
    gpu: {{product: NVIDIA-A10G, count: 4}}
    nvme: {{capacity: 3800GB, readBandwidth: 7GB/s, reserve: 100GB}}
    network: {{nic: 40Gbps, objectStorePerStream: 5.96Gbps}}
profiles:
  - name: big-llm
    match: {{labels: {{extender.io/workload: big-llm}}}}
    image: {{reference: "{image}", size: 10GB}}
    weights: {{source: "s3://models/big/", version: rev-1, bytes: 200GB, shardFiles: 8, loaderConcurrency: 1}}
  - name: slo-llm
    match: {{labels: {{extender.io/workload: slo-llm}}}}
    image: {{reference: "{image}", size: 10GB}}
    weights: {{source: "s3://models/big/", version: rev-1, bytes: 200GB, shardFiles: 8, loaderConcurrency: 1}}
    startupSlo: 5m
    filter: {{requireStartupWithinSlo: true}}
  - name: chat
    match: {{labels: {{extender.io/workload: chat}}}}
    image: {{reference: "{image}", size: 10GB}}
    weights: {{source: "s3://models/chat/", version: rev-1, bytes: 200GB, shardFiles: 8, loaderConcurrency: 1}}
    capacity: {{perReplica: 4, unit: requests/s}}
    autoscaling:
      namespace: chat
      minReplicas: 1
      maxReplicas: 4
      signal:
        source: prometheus
        prometheus: {{url: "{prometheus}", query: "demand", queueQuery: "queue"}}
  - name: warm-llm
    match: {{labels: {{extender.io/workload: warm-llm}}}}
    image: {{reference: "{image}", size: 10GB}}
    weights: {{source: "s3://models/warm/", version: rev-1, bytes: 200GB, shardFiles: 8, loaderConcurrency: 1}}
  - name: calib-llm
    match: {{labels: {{extender.io/workload: calib-llm}}}}
    image: {{reference: "{image}", size: 10GB}}
    weights: {{source: "s3://models/calib/", version: rev-1, bytes: 16GB, shardFiles: 4, loaderConcurrency: 4}}
scoring:
  # the agents report a made-up 7 TB free (AGENT_COMMAND): no pressure penalty to think about
  nvmePressurePenalty: 0
calibration:
  mode: suggest
scaling:
  tick: 1s
  hpaSyncDelay: 2s
  forecaster: ewma
  scaleDownStabilisation: 5s
warming:
  enabled: true
  templates:
    weights:
      image: amazon/aws-cli:2
      command: [aws, s3, sync, --only-show-errors, "{{{{source}}}}", "{{{{staging}}}}"]
"""

#: What the stack applies of the chart: who may do what, and where warm Jobs go.
ACCESS_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Namespace",
                "PriorityClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def access_documents(**values: str) -> list[dict[str, Any]]:
    """The chart's objects of :data:`ACCESS_KINDS` (with the agent's node grant: the stack's agents label)."""
    return [d for d in chart.rendered(agent__labelNodes="true", **values) if d["kind"] in ACCESS_KINDS]


def scheduler_configuration(**values: str) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the chart renders (ConfigMap extender-scheduler-config)."""
    config_map = chart.one(chart.rendered(**values), "ConfigMap", "extender-scheduler-config")
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return config


def node(name: str, instance_type: str) -> dict[str, Any]:
    gpus = "8" if instance_type == BIG else "4"
    resources = {"cpu": "96", "memory": "768Gi", "pods": "110", "nvidia.com/gpu": gpus}
    status: dict[str, Any] = {"allocatable": resources, "capacity": resources}
    if instance_type == BIG:
        status["images"] = [{"names": VLLM_NAMES, "sizeBytes": 10 * GB}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": instance_type,
                                                  "kubernetes.io/hostname": name, "type": "kwok"}},
            "status": status}


def pod_template(workload: str, *, gpus: int = 1, scheduler: str = "default-scheduler",
                 ready_after: dict[str, float] | None = None) -> dict[str, Any]:
    """The pod template of a vLLM replica of ``workload``; KWOK makes it Ready after ``ready_after[node]`` s."""
    annotations = {READY_DELAY_ANNOTATION: json.dumps({n: f"{s:.3f}s" for n, s in ready_after.items()})} \
        if ready_after else {}
    return {"metadata": {"labels": {"extender.io/workload": workload, "app": workload}, "annotations": annotations},
            "spec": {"schedulerName": scheduler,
                     "containers": [{"name": "vllm", "image": VLLM_IMAGE,
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def pod(name: str, namespace: str, workload: str, **kwargs: Any) -> dict[str, Any]:
    template = pod_template(workload, **kwargs)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**template["metadata"], "name": name, "namespace": namespace}, "spec": template["spec"]}


def deployment(name: str, namespace: str, workload: str, replicas: int, **kwargs: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": workload}},
                     "template": pod_template(workload, **kwargs)}}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def write_weights(root: Path, workload: str, source: str) -> None:
    """What a loader does: eight 25 GB shards (sparse), then the manifest, then the completion marker."""
    directory = weights_dir(root, workload, "rev-1")
    shards = {f"model-{i:05d}-of-00008.safetensors": 25 * GB for i in range(1, 9)}
    for shard, size in shards.items():
        sparse(directory / shard, size)
    write_manifest(directory, sorted(shards.items()), source=source)
    mark_complete(directory)


def wait(condition: Callable[[], T], what: str, timeout_s: float = SETTLE_S,
         report: Callable[[], str] | None = None) -> T:
    """:func:`wait_until` at the cluster's pace (polls every 0.2 s; the API is not a local object)."""
    return wait_until(condition, timeout_s=timeout_s, what=what, report=report, interval_s=0.2)


def post_json(port: int, path: str, body: Any) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


class Demand:
    """A Prometheus HTTP API on loopback answering the ``chat`` profile's two queries with what the
    test sets: ``demand`` (requests/s) and ``queue`` (requests waiting). The signal source under test
    is the real one (extender/scaler/prometheus.py); only the numbers are the test's."""

    def __init__(self) -> None:
        self.values = {"demand": 0.0, "queue": 0.0}
        demand = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
                if urlsplit(self.path).path != "/api/v1/query" or query not in demand.values:
                    self.send_error(400, f"unknown query {query!r}")
                    return
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
                    {"metric": {}, "value": [time.time(), repr(demand.values[query])]}]}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @contextmanager
    def serving(self) -> Iterator[Demand]:
        self.thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Stack:
    cluster: Cluster
    redis: RedisServer
    policy: Path
    extender_port: int
    roots: dict[str, Path]
    store: InventoryStore
    demand: Demand

    def python(self, name: str, args: list[str], command: str = COMMAND) -> None:
        """Start ``extender ARGS`` as a component of the cluster (logged and stopped with it)."""
        self.cluster.start(name, [sys.executable, "-c", command, *args], env=env())

    def scheduler(self, name: str = "default-scheduler", *, node_cache_capable: bool = True,
                  url: str | None = None) -> str:
        """A kube-scheduler (started once per name) on the chart's self-managed configuration, with only the
        profile's schedulerName, the extender's urlPrefix and ``nodeCacheCapable`` changed (plus the
        kubeconfig and leader election, which a test cluster must set); returns the name."""
        if name not in self.cluster.processes:
            config = scheduler_configuration()
            (profile,) = config["profiles"]
            profile["schedulerName"] = name
            (extender,) = config["extenders"]
            extender["urlPrefix"] = url or f"http://127.0.0.1:{self.extender_port}"
            extender["nodeCacheCapable"] = node_cache_capable
            self.cluster.start_scheduler(name, config)
        return name

    def wait_for_empty_nodes(self) -> None:
        """Wait until no running pod is bound to the stack's nodes (another module's pods are gone)."""
        def empty() -> bool:
            pods = self.cluster.get("pods", "--all-namespaces")["items"]
            return not [p for p in pods if p["spec"].get("nodeName") in NODES
                        and p["status"].get("phase") not in ("Succeeded", "Failed")
                        and TOKEN_HOLDER_LABEL not in p["metadata"].get("labels", {})]
        wait(empty, "the nodes to be free of other tests' pods", report=self.cluster.report)

    def extender_calls(self) -> dict[tuple[str, str], float]:
        """``extender_requests_total`` by (verb, outcome), from the extender's own /metrics."""
        conn = http.client.HTTPConnection("127.0.0.1", self.extender_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        return {(s.labels["verb"], s.labels["outcome"]): s.value for family in text_string_to_metric_families(text)
                if family.name == "extender_requests" for s in family.samples if s.name.endswith("_total")}

    def explain(self, pod_object: dict[str, Any]) -> dict[str, Any]:
        status, report = post_json(self.extender_port, "/explain", pod_object)
        assert status == 200, report
        return dict(report)

    def best_nodes(self, pod_object: dict[str, Any], nodes: list[str]) -> set[str]:
        """The nodes ``/explain`` ranks best for the pod among ``nodes``."""
        rows = {row["node"]: row for row in self.explain(pod_object)["nodes"] if row["node"] in nodes}
        top = max(row["score"] for row in rows.values())
        return {name for name, row in rows.items() if row["score"] == top}

    def startup_s(self, pod_object: dict[str, Any]) -> dict[str, float]:
        """The estimator's seconds to ready of the pod on each node, as ``/explain`` reports them."""
        return {row["node"]: float(row["totalSeconds"]) for row in self.explain(pod_object)["nodes"]}


@contextmanager
def running(cluster: Cluster, redis: RedisServer, directory: Path, demand: Demand) -> Iterator[Stack]:
    """Deploy the stack on ``cluster`` (see the module docstring); its processes stop with the cluster's."""
    cluster.apply(access_documents())
    cluster.apply([node(name, kind) for name, kind in NODES.items()])
    policy = directory / "policy.yaml"
    policy.write_text(POLICY.format(image=VLLM_IMAGE, prometheus=demand.url))
    roots = {name: directory / "nodes" / name / "cache" for name in WITH_AGENT}
    for root in roots.values():
        root.mkdir(parents=True)
    client = connect(redis.url, directory)
    stack = Stack(cluster, redis, policy, free_port(), roots, InventoryStore(client), demand)
    try:
        sync_config = cluster.token_kubeconfig("kube-system", "extender-sync")
        stack.python("sync", ["sync", "--policy", str(policy), "--kubeconfig", str(sync_config),
                              "--redis-url", redis.url])
        for name, root in roots.items():
            stack.python(f"agent-{name}", ["agent", "--node-name", name, "--cache-root", str(root),
                                           "--interval", "0.2", "--redis-url", redis.url, "--label-nodes",
                                           "--kubeconfig",
                                           str(cluster.pod_token_kubeconfig("kube-system", "extender-agent", name))],
                         AGENT_COMMAND)
        cluster.start("extender", [sys.executable, "-m", "extender.api.scheduler", "serve", "--policy", str(policy),
                                   "--bind", f"127.0.0.1:{stack.extender_port}", "--workers", "1",
                                   "--threads", "4", "--redis-url", redis.url, "--poll-interval", "0.1",
                                   "--min-rebuild-interval", "0.1"], env=env())
        wait(lambda: stack.store.names() >= set(NODES)
             and all((r := stack.store.get(n)) is not None and r.heartbeat > 0 and r.images for n in WITH_AGENT),
             "the sync's nodes and the agents' heartbeats", report=cluster.report)
        yield stack
    finally:
        client.close()
