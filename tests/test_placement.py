"""The next replica's placement: the cache words ``extender scale explain`` shows for the node it assumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.core.caches import compile_key, weights_key
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.placement import next_replica
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
