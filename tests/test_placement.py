"""The next replica's placement: the node and cache words it assumes, and the class it assumes when none has room."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.core.caches import compile_key, weights_key
from extender.core.estimate import cold_by_class
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.placement import next_replica, on_new_node
from extender.core.policy import parse_policy
from extender.core.scoring import scale_for
from extender.files import load_policy

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_000_000.0
IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0"


@pytest.mark.parametrize(("fields", "in_registry", "words"), [
    pytest.param({}, False, "cold", id="nothing-anywhere"),
    pytest.param({"images": [IMAGE]}, False, "image local", id="image-only"),
    pytest.param({}, True, "compile cache in the registry", id="registry-only-is-not-called-local"),
    pytest.param({"images": [IMAGE], "weights": {weights_key("dynamo-worker", "r1"): "30GB"}}, True,
                 "image, weights 50% local; compile cache in the registry", id="local-caches-then-the-registry"),
    pytest.param({"images": [IMAGE], "compileKeys": ["KEY"]}, True, "image, compile cache local",
                 id="a-local-compile-cache-wins-over-the-registry"),
])
def test_cache_words(fields: dict[str, object], in_registry: bool, words: str) -> None:
    policy = load_policy(ROOT / "policies" / "h200-b200-snapshot.yaml")
    profile = policy.profile("dynamo-worker")
    key = compile_key(profile, policy.node_class("h200"))
    assert key is not None
    if fields.get("compileKeys"):
        fields = {**fields, "compileKeys": [key]}
    record = NodeState.model_validate({"name": "n1", "nodeClass": "h200", "gpus": 8, "gpusFree": 8,
                                       "heartbeat": NOW, **fields})
    snap = InventorySnapshot.build(policy, [record], registry=[key] if in_registry else [])
    placement = next_replica(policy, profile, snap, NOW)
    assert (placement.node, placement.cache) == ("n1", words)


TWO_SIZES = """\
apiVersion: extender.io/v1alpha1
kind: Policy
nodeClasses:
  - {name: h100x8, matchLabels: {k: h}, gpu: {product: H100, count: 8}, nvme: {capacity: 4TB},
     network: {nic: 400Gbps, imagePull: 200MB/s}}
  - {name: l4x1, matchLabels: {k: l}, gpu: {product: L4, count: 1}, nvme: {capacity: 0},
     network: {nic: 10Gbps, imagePull: 20MB/s}}
profiles:
  - name: w
    match: {labels: {app: w}}
    parallelism: {tensor: TP}
    image: {reference: "vllm/vllm-openai:v1", size: 10GB}
    weights: {source: "s3://m/", version: v1, bytes: 400GB}
"""


@pytest.mark.parametrize(("tensor", "node_class"), [
    pytest.param(1, "l4x1", id="one-gpu-replica-assumes-the-slowest-class"),
    pytest.param(8, "h100x8", id="tp8-replica-never-assumes-a-one-gpu-class"),
])
def test_new_node_and_scale_reference_are_on_a_class_that_can_hold_a_replica(tensor: int, node_class: str) -> None:
    # Cold: h100x8 10 GB / 200 MB/s + 400 GB / min(50 GB/s, 16 x 745 MB/s) + 104 s = 187.6 s;
    # l4x1 10 GB / 20 MB/s + 400 GB / 1.25 GB/s + 104 s = 924 s. A TP=8 replica never lands on l4x1, so
    # neither the scaler's new-node horizon nor the score's T_ref may be its 924 s.
    policy = parse_policy(TWO_SIZES.replace("TP", str(tensor)), "two-sizes.yaml")
    profile = policy.profile("w")
    cold = dict(zip([c.name for c in policy.node_classes],
                    cold_by_class(profile, policy.node_classes).total_s.tolist(), strict=True))
    placement = on_new_node(policy, profile)
    assert placement.node_class == node_class
    assert placement.startup_s == pytest.approx(cold[node_class])
    assert scale_for(policy, profile).reference_s == pytest.approx(cold[node_class])
