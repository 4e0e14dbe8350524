"""The protection term (scoring.protectWarmPoints): a placement pays for the warm replica slots it takes
from larger profiles. Named table rows with the arithmetic, the real engine, and the policy's errors."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest

from extender.api.scheduler.engine import Engine
from extender.core.caches import cache_id, weights_key, with_entries
from extender.core.errors import PolicyError
from extender.core.estimate import CacheState
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy, parse_policy
from extender.core.scoring import NodeInputs, WarmSlots, evaluate, larger_warm, protection, warm_nodes

GB = 10**9

#: One 8-GPU class and one 4-GPU class; a one-GPU model, a TP=2 and a TP=8 one.
POLICY = textwrap.dedent("""\
    apiVersion: extender.io/v1alpha1
    kind: Policy
    metadata: {name: protect-test}
    nodeClasses:
      - name: big
        matchLabels: {pool: big}
        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}
        nvme: {capacity: 4TB, readBandwidth: 20GB/s, reserve: 100GB}
        network: {nic: 400Gbps, objectStorePerStream: 4Gbps, imagePull: 200MB/s}
      - name: mid
        matchLabels: {pool: mid}
        gpu: {product: NVIDIA-L40S, count: 4}
        nvme: {capacity: 2TB, readBandwidth: 7GB/s, reserve: 100GB}
        network: {nic: 100Gbps, objectStorePerStream: 2Gbps, imagePull: 50MB/s}
    profiles:
      - name: small
        match: {labels: {app: small}}
        image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
        weights: {source: "s3://m/small/", version: v1, bytes: 16GB}
      - name: pair
        match: {labels: {app: pair}}
        image: {reference: "lmsysorg/sglang:v0.4.9", size: 14GB}
        weights: {source: "s3://m/pair/", version: v1, bytes: 64GB}
        parallelism: {tensor: 2}
      - name: huge
        match: {labels: {app: huge}}
        nodeClasses: [big]
        image: {reference: "nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3", size: 22GB}
        weights: {source: "s3://m/huge/", version: v1, bytes: 400GB}
        parallelism: {tensor: 8}
    scoring: {secondsPerPoint: 30s}
""")


@pytest.fixture(scope="module")
def policy() -> Policy:
    return parse_policy(POLICY, "protect-test.yaml")


def with_points(policy: Policy, points: int) -> Policy:
    return policy.model_copy(update={"scoring": policy.scoring.model_copy(update={"protect_warm_points": points})})


# --------------------------------------------------------------------------------------------
# The arithmetic: lost = sum over larger warm profiles of g x (F // g - (F - r) // g); round(p x lost / G)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    node_class: str  # "big" (G = 8) or "mid" (G = 4)
    free: int
    request: int
    others: tuple[tuple[int, bool], ...]  # (GPUs per replica, warm on the node)
    points: int
    want: int


ROWS = [
    # F = 8, r = 1: the TP=8 slot goes (8 // 8 - 7 // 8 = 1 slot of 8 GPUs): lost 8 of 8
    Row("one-GPU pod on a node warm for TP=8 with room for it: the whole charge", "big", 8, 1, ((8, True),), 4, 4),
    Row("the same node, the TP=8 model not warm there: nothing", "big", 8, 1, ((8, False),), 4, 0),
    # F = 7: no TP=8 slot is left to lose
    Row("no TP=8 slot left to lose: nothing", "big", 7, 1, ((8, True),), 4, 0),
    # mid, F = 4, r = 1: 4 // 2 - 3 // 2 = 1 slot of 2 GPUs: 2 of 4 -> round(4 x 0.5) = 2
    Row("one-GPU pod on a 4-GPU node warm for TP=2: half", "mid", 4, 1, ((2, True),), 4, 2),
    # F = 3, r = 1: 3 // 2 - 2 // 2 = 0: the odd GPU is free anyway
    Row("taking the odd GPU costs no TP=2 slot", "mid", 3, 1, ((2, True),), 4, 0),
    # big, F = 8, r = 1, TP=2 and TP=8 warm: 2 x (4 - 3) + 8 x (1 - 0) = 10 of 8, capped at 1
    Row("several larger profiles add up, capped at the whole node", "big", 8, 1, ((2, True), (8, True)), 3, 3),
    Row("same-size profiles do not count", "mid", 4, 2, ((2, True),), 4, 0),
    Row("the pod does not fit: nothing (the scheduler filters it)", "mid", 1, 2, ((4, True),), 4, 0),
    Row("off at 0 points", "big", 8, 1, ((8, True),), 0, 0),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_protection_arithmetic(policy: Policy, row: Row) -> None:
    classes = policy.node_classes
    index = np.array([next(i for i, c in enumerate(classes) if c.name == row.node_class)], dtype=np.intp)
    others = [WarmSlots(g, np.array([warm])) for g, warm in row.others]
    got = protection(classes, index, np.array([row.free], dtype=np.int64), row.request, others, points=row.points)
    assert got.tolist() == [row.want]


# --------------------------------------------------------------------------------------------
# Which nodes count as warm, which profiles are guarded
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WarmRow:
    name: str
    image: bool
    weights_gb: float
    want: bool


WARM_ROWS = [
    WarmRow("image and whole weights", True, 400, True),
    WarmRow("image and part of the weights", True, 399, False),
    WarmRow("weights without the image", False, 400, False),
    WarmRow("nothing", False, 0, False),
]


@pytest.mark.parametrize("row", WARM_ROWS, ids=[r.name for r in WARM_ROWS])
def test_warm_nodes(policy: Policy, row: WarmRow) -> None:
    state = CacheState.uniform(1)
    state.image[0] = row.image
    state.weights_bytes[0] = row.weights_gb * GB
    got = warm_nodes(policy.profile("huge"), policy.node_classes, np.array([0], dtype=np.intp), state)
    assert got.tolist() == [row.want]


@pytest.mark.parametrize(("profile", "want"), [("small", [2, 8]), ("pair", [8]), ("huge", [])],
                         ids=["one GPU guards TP=2 and TP=8", "TP=2 guards TP=8", "TP=8 guards nothing"])
def test_larger_warm_lists_only_larger_profiles(policy: Policy, profile: str, want: list[int]) -> None:
    index = np.array([0], dtype=np.intp)
    got = larger_warm(policy.profile(profile), policy.profiles, policy.node_classes, index,
                      lambda q: CacheState.uniform(1))
    assert [w.gpus for w in got] == want


def test_evaluate_takes_the_charge_off_the_score(policy: Policy) -> None:
    # two equally cold 8-GPU nodes for `small`; `huge` is warm on the first
    index = np.array([0, 0], dtype=np.intp)
    state = CacheState.uniform(2)
    ones = np.ones(2, dtype=np.bool_)
    free = np.array([8, 8], dtype=np.int64)
    others = [WarmSlots(8, np.array([True, False]))]
    inputs = NodeInputs(policy.node_classes, index, state, ones, ones, np.full(2, 1000.0 * GB), free, others)
    plain = evaluate(policy, policy.profile("small"), inputs).score.tolist()
    guarded = evaluate(with_points(policy, 3), policy.profile("small"), inputs).score.tolist()
    assert plain[0] == plain[1]
    assert guarded == [max(plain[0] - 3, 0), plain[1]]


# --------------------------------------------------------------------------------------------
# The real extender's engine applies it from the inventory
# --------------------------------------------------------------------------------------------


def record(policy: Policy, name: str, *, huge_warm: bool) -> NodeState:
    bare = NodeState.model_validate({"name": name, "nodeClass": "big", "gpus": 8, "gpusFree": 8,
                                     "nvmeTotal": 4 * 10**12, "nvmeFree": 4 * 10**12, "heartbeat": 1000.0,
                                     "ttl": 60.0})
    if not huge_warm:
        return bare
    p = policy.profile("huge")
    add = {cache_id("image", p.image.reference): 0, cache_id("weights", weights_key(p.name, p.weights.version)):
           p.weights.bytes}
    return bare.model_copy(update={**with_entries(bare, add=add), "nvme_free": 4 * 10**12 - p.weights.bytes})


@pytest.mark.parametrize(("points", "gap"), [(0, 0), (3, 3)],
                         ids=["off: equal scores", "3 points: the warm node pays 3"])
def test_engine_scores_with_the_charge(policy: Policy, points: int, gap: int) -> None:
    pol = with_points(policy, points)
    snap = InventorySnapshot.build(pol, [record(pol, "warm-for-huge", huge_warm=True),
                                         record(pol, "empty", huge_warm=False)])
    body = Engine(pol, snap).prioritize_names(pol.profile("small"), ["warm-for-huge", "empty"], 1010.0)
    got = {item["Host"]: item["Score"] for item in json.loads(body)}
    assert got["empty"] - got["warm-for-huge"] == gap


# --------------------------------------------------------------------------------------------
# Bad values are policy errors with file:line
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "words"), [("11", "<= 10"), ("-1", ">= 0"), ("lots", "whole number")],
                         ids=["above 10", "negative", "not a number"])
def test_protect_warm_points_bad_value_is_an_error_with_its_line(value: str, words: str) -> None:
    text = POLICY.replace("scoring: {secondsPerPoint: 30s}",
                          f"scoring:\n  secondsPerPoint: 30s\n  protectWarmPoints: {value}")
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    (problem,) = err.value.problems
    assert (problem.line, problem.path) == (POLICY.count("\n") + 2, "scoring.protectWarmPoints")
    assert words in problem.message
