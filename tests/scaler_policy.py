"""A policy for the scaler's tests: two autoscaled workloads on two node classes, and one that is not.

``qwen3``: requests/s, capacity 4 per replica, pods labelled ``extender.io/workload: qwen3`` in
``default``; ``llama``: tokens/s, capacity 2000 per replica, namespace ``ml``; ``batch``: no
autoscaling section (the scaler must leave it alone). :func:`publish_decision` stores one decision
for ``qwen3`` as a leading scaler would, for the servers that read it.
"""

from __future__ import annotations

from typing import Any

from extender.core.policy import Policy, parse_policy
from extender.state.decisions import DecisionStore, Published
from extender.state.lock import LeaderLock

TEMPLATE = """\
apiVersion: extender.io/v1alpha1
kind: Policy
metadata: {{name: scaler-test}}
nodeClasses:
  - name: h100
    matchLabels: {{node.kubernetes.io/instance-type: p5.48xlarge}}
    gpu: {{product: NVIDIA-H100-80GB-HBM3, count: 8}}
    nvme: {{capacity: 30TB, readBandwidth: 30GB/s}}
    network: {{nic: 3200Gbps, objectStorePerStream: 5.96Gbps}}
  - name: a10g
    matchLabels: {{node.kubernetes.io/instance-type: g5.12xlarge}}
    gpu: {{product: NVIDIA-A10G, count: 4}}
    nvme: {{capacity: 3800GB, readBandwidth: 7GB/s}}
    network: {{nic: 40Gbps, objectStorePerStream: 5.96Gbps}}
profiles:
  - name: qwen3
    match: {{labels: {{extender.io/workload: qwen3}}}}
    image: {{reference: "vllm/vllm-openai:v0.11.0", size: 10GB}}
    weights: {{source: "s3://models/qwen3/", version: rev-1, bytes: 64GiB, shardFiles: 17, loaderConcurrency: 16}}
    compile: {{cold: 53s, warm: 4s}}
    capacity: {{perReplica: 4, unit: requests/s}}
    autoscaling:
      namespace: default
      minReplicas: {min_replicas}
      maxReplicas: 40
      signal: {signal}
  - name: llama
    match: {{labels: {{extender.io/workload: llama}}}}
    nodeClasses: [a10g]
    image: {{reference: "vllm/vllm-openai:v0.11.0", size: 10GB}}
    weights: {{source: "s3://models/llama/", version: main, bytes: 16GB, shardFiles: 4}}
    capacity: {{perReplica: 2000, unit: tokens/s}}
    autoscaling:
      namespace: ml
      minReplicas: 0
      maxReplicas: 8
      signal: {{source: scrape, engine: vllm, port: {port}}}
  - name: batch
    match: {{labels: {{extender.io/workload: batch}}}}
    image: {{reference: "busybox:1", size: 10MB}}
    weights: {{source: "s3://models/none/", version: v1, bytes: 1MB}}
scaling:
  tick: {tick}
  forecaster: {forecaster}
{scaling_extra}"""


def policy_text(*, port: int = 8000, signal: dict[str, Any] | None = None, tick: str = "15s",
                forecaster: str = "holt", min_replicas: int = 1, scaling_extra: str = "") -> str:
    import json

    sig = signal if signal is not None else {"source": "scrape", "engine": "vllm", "port": port}
    return TEMPLATE.format(signal=json.dumps(sig), port=port, tick=tick, forecaster=forecaster,
                           min_replicas=min_replicas, scaling_extra=scaling_extra)


def make_policy(**kwargs: Any) -> Policy:
    return parse_policy(policy_text(**kwargs), "scaler-test.yaml")


def publish_decision(client: Any, *, load: float = 17.5, ttl_s: float = 60) -> None:
    """Publish 5 replicas for ``qwen3`` (``load`` requests/s, a 15 s window) under a lock of its own."""
    lock = LeaderLock(client, "seeder", ttl_s=ttl_s)
    token = lock.acquire().token
    lock.commit(token, DecisionStore(client).stage_published(
        "qwen3", Published(desired=5, load=load, unit="requests/s", t=1_735_732_800.0, window=15, token=token)))
