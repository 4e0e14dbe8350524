"""Seconds -> scores and filter verdicts: named table rows with the arithmetic, an oracle, properties."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.caches import keeps_weights
from extender.core.errors import PolicyError
from extender.core.estimate import CacheState, CompileCache
from extender.core.policy import UNKNOWN_CLASS, Policy, parse_policy
from extender.core.scoring import (
    MAX_SCORE,
    NodeInputs,
    Rule,
    Scale,
    Verdict,
    evaluate,
    judge,
    lacking_bytes,
    nvme_pressure,
    reason,
    scale_for,
    scores,
)

GB = 10**9

#: Two classes far enough apart that class matters: the estimates (from ``extender estimate``) are
#:   llm on fast: cold 230 = 50 image + 10 weights + 120 compile + 20 graph + 30 init; image-only 180;
#:                warm 60 = 5 weights (NVMe) + 5 compile + 20 + 30
#:   llm on slow: cold 570 = 200 image + 20 weights + 240 compile + 20 graph + 90 init; warm 135
#: so T_ref = 570 s and s = max(30, 570 / 10) = 57 s per point.
POLICY = textwrap.dedent("""\
    apiVersion: extender.io/v1alpha1
    kind: Policy
    metadata: {name: scoring-test}
    nodeClasses:
      - name: fast
        matchLabels: {pool: fast}
        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}
        nvme: {capacity: 4TB, readBandwidth: 20GB/s, reserve: 100GB}
        network: {nic: 400Gbps, objectStorePerStream: 4Gbps, imagePull: 200MB/s}
      - name: slow
        matchLabels: {pool: slow}
        gpu: {product: NVIDIA-A10G, count: 4}
        nvme: {capacity: 2TB, readBandwidth: 4GB/s}
        network: {nic: 50Gbps, objectStorePerStream: 2Gbps, imagePull: 50MB/s}
      - name: tiny
        matchLabels: {pool: tiny}
        gpu: {product: NVIDIA-L4, count: 1}
        nvme: {capacity: 50GB}
    profiles:
      - name: llm
        match: {labels: {app: llm}}
        nodeClasses: [fast, slow]
        image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
        weights: {source: "s3://m/llm/", version: r1, bytes: 100GB, shardFiles: 20, loaderConcurrency: 20}
        compile: {cold: 120s, warm: 5s}
        graphCapture: 20s
        engineInit: 30s
        overrides:
          slow: {compileCold: 240s, engineInit: 90s}
      - name: short
        match: {labels: {app: short}}
        nodeClasses: [fast]
        image: {reference: "vllm/vllm-openai:v0.11.0", size: 2GB}
        weights: {source: "s3://m/s/", version: r1, bytes: 10GB, cache: none}
        compile: {cold: 30s, warm: 2s}
        graphCapture: 5s
        engineInit: 10s
      - name: strict
        match: {labels: {app: strict}}
        image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
        weights: {source: "s3://m/llm/", version: r1, bytes: 100GB, shardFiles: 20, loaderConcurrency: 20,
                  cache: required}
        compile: {cold: 120s, warm: 5s}
        graphCapture: 20s
        engineInit: 30s
        startupSlo: 2m
        filter: {requireNvmeFit: true, requireStartupWithinSlo: true}
      - name: fits
        match: {labels: {app: fits}}
        nodeClasses: [fast, tiny]
        image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
        weights: {source: "s3://m/llm/", version: r1, bytes: 100GB, cache: required}
        filter: {requireNvmeFit: true}
      - name: snap
        match: {labels: {app: snap}}
        image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
        weights: {source: "s3://m/llm/", version: r1, bytes: 100GB}
        snapshot: {bytes: 200GB, restore: 20s}
    scoring: {secondsPerPoint: 30s, nvmePressurePenalty: 2}
""")


@pytest.fixture(scope="module")
def policy() -> Policy:
    return parse_policy(POLICY, "scoring-test.yaml")


# --------------------------------------------------------------------------------------------
# The scale of a profile
# --------------------------------------------------------------------------------------------


def test_scale_reference_is_the_slowest_cold_class(policy: Policy) -> None:
    scale = scale_for(policy, policy.profile("llm"))
    # slow cold: 200 + 20 + 240 + 20 + 90 = 570 s; fast cold is 230 s
    assert scale.reference_s == pytest.approx(570.0)
    # max(30 s per point, 570 / 10 = 57 s per point)
    assert scale.seconds_per_point == pytest.approx(57.0)


def test_scale_keeps_seconds_per_point_for_short_starts(policy: Policy) -> None:
    scale = scale_for(policy, policy.profile("short"))
    # fast cold: 2 GB / 200 MB/s = 10 s image + 10 GB / min(50 GB/s, 3 x 0.5 GB/s) = 6.67 s weights
    #            + 30 compile + 5 graph + 10 init = 61.67 s; 61.67 / 10 = 6.2 s < 30 s per point
    assert scale.reference_s == pytest.approx(61.667, abs=0.01)
    assert scale.seconds_per_point == 30.0


@dataclass(frozen=True)
class PointsRow:
    name: str
    total_s: float
    expected: int


POINTS_ROWS = [
    # T_ref = 570 s, s = 57 s
    PointsRow("instant start", 0.0, 10),                    # 570 / 57 = 10
    PointsRow("fast warm", 60.0, 9),                        # 510 / 57 = 8.95 -> 9
    PointsRow("slow warm", 135.0, 8),                       # 435 / 57 = 7.63 -> 8
    PointsRow("fast image only", 180.0, 7),                 # 390 / 57 = 6.84 -> 7
    PointsRow("fast cold", 230.0, 6),                       # 340 / 57 = 5.96 -> 6
    PointsRow("slow image only", 370.0, 4),                 # 200 / 57 = 3.51 -> 4
    PointsRow("half a point rounds to even", 541.5, 0),     # 28.5 / 57 = 0.5 -> 0 (half to even)
    PointsRow("one and a half rounds to even", 484.5, 2),   # 85.5 / 57 = 1.5 -> 2
    PointsRow("slow cold is the reference", 570.0, 0),      # 0 / 57 = 0
    PointsRow("slower than the reference", 900.0, 0),       # -330 / 57 = -5.8 -> clamped to 0
    PointsRow("negative estimate", -100.0, 10),             # 670 / 57 = 11.75 -> clamped to 10
    PointsRow("not a number counts as cold", math.nan, 0),
    PointsRow("infinitely slow", math.inf, 0),
]


@pytest.mark.parametrize("row", POINTS_ROWS, ids=[r.name for r in POINTS_ROWS])
def test_points(row: PointsRow) -> None:
    got = Scale(570.0, 57.0).points(np.array([row.total_s]))
    assert got.dtype == np.int64
    assert got.tolist() == [row.expected]


def test_two_seconds_among_cold_nodes_is_not_ten_points() -> None:
    # Two cold nodes 2 s apart: (570 - 228) / 57 = 6.0 and (570 - 230) / 57 = 5.96, both 6. A
    # per-request rescaling would have made them 10 and 0.
    assert Scale(570.0, 57.0).points(np.array([228.0, 230.0])).tolist() == [6, 6]


# --------------------------------------------------------------------------------------------
# NVMe pressure and the penalty
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PressureRow:
    name: str
    profile: str
    weights_local: float
    usable_free: float
    known: bool
    expected: bool


PRESSURE_ROWS = [
    PressureRow("room for the missing 100 GB", "llm", 0, 500 * GB, True, False),
    PressureRow("40 GB free, 100 GB missing", "llm", 0, 40 * GB, True, True),
    PressureRow("exactly fits", "llm", 0, 100 * GB, True, False),
    PressureRow("60 GB present, 40 GB missing, 40 GB free", "llm", 60 * GB, 40 * GB, True, False),
    PressureRow("all weights present, disk full", "llm", 100 * GB, 0, True, False),
    PressureRow("free space unknown (no record)", "llm", 0, 0, False, False),
    PressureRow("profile streams weights (cache: none)", "short", 0, 0, True, False),
]


@pytest.mark.parametrize("row", PRESSURE_ROWS, ids=[r.name for r in PRESSURE_ROWS])
def test_nvme_pressure(policy: Policy, row: PressureRow) -> None:
    profile = policy.profile(row.profile)
    lacking = lacking_bytes(profile, np.array([row.weights_local], dtype=np.float64))
    keeps = keeps_weights(profile, policy.node_classes, np.zeros(1, dtype=np.intp))  # a "fast" node
    got = nvme_pressure(lacking, np.array([row.usable_free], dtype=np.float64), np.array([row.known]), keeps)
    assert got.tolist() == [row.expected]


#: One class with NVMe and one without (the weights are streamed there, nothing is written or evicted).
DISKLESS_POLICY = textwrap.dedent("""\
    apiVersion: extender.io/v1alpha1
    kind: Policy
    nodeClasses:
      - name: disk
        matchLabels: {pool: disk}
        gpu: {product: NVIDIA-L4, count: 4}
        nvme: {capacity: 1TB}
      - name: diskless
        matchLabels: {pool: diskless}
        gpu: {product: NVIDIA-L4, count: 4}
        nvme: {capacity: 0}
    profiles:
      - name: llm
        match: {labels: {app: llm}}
        image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
        weights: {source: "s3://m/llm/", version: r1, bytes: 100GB}
""")


@pytest.mark.parametrize(("node_class", "pressure"), [
    pytest.param(1, False, id="diskless-class-is-never-pressured"),
    pytest.param(0, True, id="class-with-nvme-and-no-room-is-pressured"),
])
def test_nvme_pressure_needs_a_class_that_caches(node_class: int, pressure: bool) -> None:
    # Two nodes of one class holding the image, no free NVMe: one has an inventory record (free space
    # known, 0), the other none. On a class without NVMe the weights are streamed whatever the free
    # space, so the record must not cost the node the penalty the record-less node escapes.
    policy = parse_policy(DISKLESS_POLICY, "diskless.yaml")
    profile = policy.profile("llm")
    inputs = NodeInputs(policy.node_classes, np.full(2, node_class, dtype=np.intp), CacheState.uniform(2, image=True),
                        fresh=np.array([True, False]), free_known=np.array([True, False]), nvme_free=np.zeros(2))
    ev = evaluate(policy, profile, inputs)
    assert ev.pressure.tolist() == [pressure, False]
    penalty = policy.scoring.nvme_pressure_penalty if pressure else 0
    assert ev.score.tolist() == [ev.score[1] - penalty, ev.score[1]]


@dataclass(frozen=True)
class PenaltyRow:
    name: str
    total_s: float
    pressure: bool
    penalty: int
    expected: int


PENALTY_ROWS = [
    PenaltyRow("no pressure", 60.0, False, 2, 9),           # 9 points
    PenaltyRow("pressure takes 2 points", 60.0, True, 2, 7),  # 9 - 2
    PenaltyRow("never below zero", 541.0, True, 2, 0),      # 29 / 57 = 0.5 -> 1; 1 - 2 -> 0
    PenaltyRow("penalty zero", 60.0, True, 0, 9),
    PenaltyRow("penalty ten", 0.0, True, 10, 0),           # 10 - 10
]


@pytest.mark.parametrize("row", PENALTY_ROWS, ids=[r.name for r in PENALTY_ROWS])
def test_penalty(row: PenaltyRow) -> None:
    got = scores(Scale(570.0, 57.0), np.array([row.total_s]), np.array([row.pressure]), row.penalty)
    assert got.tolist() == [row.expected]


# --------------------------------------------------------------------------------------------
# Hard rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeRow:
    name: str
    profile: str
    total_s: float
    weights_local: float
    usable_free: float
    usable_capacity: float
    fresh: bool
    verdict: Verdict
    rules: int


NAN = math.nan
JUDGE_ROWS = [
    JudgeRow("no rules: everything passes", "llm", 9999, 0, 0, 0, True, Verdict.PASS, 0),
    # strict: weights 100 GB, SLO 120 s
    JudgeRow("warm and roomy", "strict", 60, 100 * GB, 500 * GB, 3900 * GB, True, Verdict.PASS, 0),
    JudgeRow("class NVMe smaller than the weights", "strict", 60, 0, 0, 50 * GB, True,
             Verdict.UNRESOLVABLE, Rule.NVME_CAPACITY),
    JudgeRow("class too small even with a stale record", "strict", 60, 0, 0, 50 * GB, False,
             Verdict.UNRESOLVABLE, Rule.NVME_CAPACITY),
    JudgeRow("free NVMe 40 GB < 100 GB missing", "strict", 60, 0, 40 * GB, 3900 * GB, True,
             Verdict.FAILED, Rule.NVME_FREE),
    JudgeRow("stale record: free space is no evidence", "strict", 60, 0, 40 * GB, 3900 * GB, False,
             Verdict.PASS, 0),
    JudgeRow("unknown class: capacity is no evidence", "strict", 60, 0, 0, NAN, False, Verdict.PASS, 0),
    JudgeRow("121 s > 120 s SLO", "strict", 121, 100 * GB, 500 * GB, 3900 * GB, True,
             Verdict.UNRESOLVABLE, Rule.SLO),
    JudgeRow("exactly the SLO passes", "strict", 120, 100 * GB, 500 * GB, 3900 * GB, True, Verdict.PASS, 0),
    JudgeRow("slow but stale: no evidence", "strict", 500, 0, 500 * GB, 3900 * GB, False, Verdict.PASS, 0),
    JudgeRow("slow on an unknown class: a seed-default estimate is no evidence", "strict", 500, 100 * GB, 500 * GB,
             NAN, True, Verdict.PASS, 0),
    JudgeRow("too small and too slow: both named", "strict", 500, 0, 0, 50 * GB, True,
             Verdict.UNRESOLVABLE, Rule.NVME_CAPACITY | Rule.SLO),
    JudgeRow("no room and too slow: unresolvable wins", "strict", 500, 0, 10 * GB, 3900 * GB, True,
             Verdict.UNRESOLVABLE, Rule.NVME_FREE | Rule.SLO),
]


@pytest.mark.parametrize("row", JUDGE_ROWS, ids=[r.name for r in JUDGE_ROWS])
def test_judge(policy: Policy, row: JudgeRow) -> None:
    profile = policy.profile(row.profile)
    j = judge(
        profile,
        total_s=np.array([row.total_s]),
        lacking=lacking_bytes(profile, np.array([row.weights_local], dtype=np.float64)),
        usable_free=np.array([row.usable_free], dtype=np.float64),
        usable_capacity=np.array([row.usable_capacity], dtype=np.float64),
        fresh=np.array([row.fresh]),
    )
    assert int(j.verdict[0]) == row.verdict
    assert int(j.rules[0]) == row.rules


def test_reasons_name_the_rule_the_numbers_and_a_remedy(policy: Policy) -> None:
    profile = policy.profile("strict")
    text = reason(profile, Rule.NVME_CAPACITY | Rule.NVME_FREE | Rule.SLO, node_class="tiny", total_s=547.0,
                  lacking=100 * GB, usable_free=10 * GB, usable_capacity=50 * GB,
                  phases={"image_s": 357.0, "compile_s": 120.0, "weights_s": 20.0})
    assert "node class tiny has 50.0 GB of usable NVMe" in text
    assert "free NVMe 10.0 GB" in text and "100.0 GB" in text
    assert "estimated startup 547 s (mostly image pull 357 s, torch.compile 120 s)" in text
    assert "120 s startup SLO" in text
    assert "requireNvmeFit" in text and "requireStartupWithinSlo" in text


# --------------------------------------------------------------------------------------------
# Whole evaluation: the comparisons the issue asks for
# --------------------------------------------------------------------------------------------

IMAGE, WEIGHTS, COMPILE = "image", "weights", "compile"


def nodes(policy: Policy, rows: list[tuple[str, set[str], float]]) -> NodeInputs:
    """(class, caches held, free NVMe) per node, all fresh with known records."""
    classes = (*policy.node_classes, UNKNOWN_CLASS)
    pos = {c.name: i for i, c in enumerate(classes)}
    n = len(rows)
    return NodeInputs(
        classes=classes,
        class_index=np.array([pos[c] for c, _, _ in rows], dtype=np.intp),
        state=CacheState(
            image=np.array([IMAGE in h for _, h, _ in rows]),
            weights_bytes=np.array([100.0 * GB if WEIGHTS in h else 0.0 for _, h, _ in rows]),
            compile=np.array([CompileCache.LOCAL if COMPILE in h else CompileCache.ABSENT for _, h, _ in rows],
                             dtype=np.int8),
            snapshot=np.zeros(n, dtype=np.bool_),
            queued_bytes=np.zeros(n),
            adapters=np.zeros((n, 0), dtype=np.bool_),
        ),
        fresh=np.ones(n, dtype=np.bool_),
        free_known=np.ones(n, dtype=np.bool_),
        nvme_free=np.array([f for _, _, f in rows], dtype=np.float64),
    )


def test_a_node_of_no_known_class_never_outranks_a_known_cold_one(policy: Policy) -> None:
    # On seed-default bandwidths an unknown node estimates 547 s cold and 69 s warm, both under
    # T_ref = 570 s (the slow class cold): by the seconds alone the warm one would score 9.
    warm, roomy = {IMAGE, WEIGHTS, COMPILE}, 1000.0 * GB
    inputs = nodes(policy, [(UNKNOWN_CLASS.name, set(), roomy), (UNKNOWN_CLASS.name, warm, roomy),
                            ("slow", set(), roomy)])
    ev = evaluate(policy, policy.profile("llm"), inputs)
    assert ev.estimate.total_s.tolist()[1] < 570.0
    assert ev.score.tolist() == [0, 0, 0]


@pytest.mark.parametrize(("free", "want"), [
    pytest.param([4, 1], [0 + 1, 0], id="an-unknown-node-with-one-free-gpu-stays-below-an-empty-known-one"),
    pytest.param([1, 1], [0 + 4, 0], id="a-nearly-full-known-node-outranks-an-unknown-one"),
])
def test_a_node_of_no_known_class_gets_no_packing_points(policy: Policy, free: list[int], want: list[int]) -> None:
    # A cold slow node (4 GPUs: 0 points + round(4 x (4 - F + 1) / 4) for packing) beside an unknown
    # node with a fresh record: the unknown class's one-GPU stand-in made fill = (1 - 1 + 1) / 1 = 1,
    # the whole packing term, which lifted it over the known node.
    packed = policy.model_copy(update={"scoring": policy.scoring.model_copy(update={"packing_points": 4})})
    base = nodes(policy, [("slow", set(), 1000.0 * GB), (UNKNOWN_CLASS.name, set(), 1000.0 * GB)])
    inputs = NodeInputs(base.classes, base.class_index, base.state, base.fresh, base.free_known, base.nvme_free,
                        np.array(free, dtype=np.int64))
    assert evaluate(packed, packed.profile("llm"), inputs).score.tolist() == want


@pytest.mark.parametrize(("profile", "want"), [
    pytest.param("llm", [0, 6], id="a-class-outside-nodeClasses-scores-0-without-packing-points"),
    pytest.param("snap", [10, 7], id="a-profile-on-any-class-scores-it"),
])
def test_a_class_outside_the_profiles_node_classes_scores_0(policy: Policy, profile: str, want: list[int]) -> None:
    # llm runs on fast and slow only. Warm on a tiny node it estimates 69 s: round((570 - 69) / 57) = 9
    # points, and packing would fill the one-GPU node (+4, to the cap of 10); the policy says it does
    # not run there, so 0. Cold on a fast node, 230 s: 6 points, and 1 of 8 GPUs filled adds none.
    # snap may run anywhere (no filter rules either): the same tiny node scores its points plus packing,
    # capped at 10.
    packed = policy.model_copy(update={"scoring": policy.scoring.model_copy(update={"packing_points": 4})})
    base = nodes(policy, [("tiny", {IMAGE, WEIGHTS, COMPILE}, 1000.0 * GB), ("fast", set(), 1000.0 * GB)])
    inputs = NodeInputs(base.classes, base.class_index, base.state, base.fresh, base.free_known, base.nvme_free,
                        np.array([1, 8], dtype=np.int64))
    ev = evaluate(packed, packed.profile(profile), inputs)
    assert ev.score.tolist() == want
    assert ev.judgement.verdict.tolist() == [Verdict.PASS, Verdict.PASS]  # the pod's spec decides where it may run


def test_absolute_comparisons_across_classes(policy: Policy) -> None:
    warm = {IMAGE, WEIGHTS, COMPILE}
    roomy = 1000.0 * GB
    inputs = nodes(policy, [("fast", warm, roomy), ("slow", warm, roomy), ("fast", set(), roomy),
                            ("slow", set(), roomy)])
    ev = evaluate(policy, policy.profile("llm"), inputs)
    fast_warm, slow_warm, fast_cold, slow_cold = ev.score.tolist()
    # fast warm 60 s -> 9; slow warm 135 s -> 8; fast cold 230 s -> 6; slow cold 570 s -> 0
    assert (fast_warm, slow_warm, fast_cold, slow_cold) == (9, 8, 6, 0)
    assert fast_warm > slow_warm > fast_cold > slow_cold


def test_nvme_pressure_lowers_a_cold_node_only(policy: Policy) -> None:
    warm = {IMAGE, WEIGHTS, COMPILE}
    inputs = nodes(policy, [("fast", {IMAGE}, 1000.0 * GB), ("fast", {IMAGE}, 150.0 * GB),
                            ("fast", warm, 0.0)])
    ev = evaluate(policy, policy.profile("llm"), inputs)
    # image-only 180 s -> 7 with room; 150 GB free - 100 GB fast-class reserve = 50 GB < 100 GB
    # missing -> 7 - 2 = 5; a warm node lacks nothing, so a full disk costs it nothing (9)
    assert ev.score.tolist() == [7, 5, 9]
    assert ev.pressure.tolist() == [False, True, False]


# --------------------------------------------------------------------------------------------
# Oracle and properties
# --------------------------------------------------------------------------------------------


def reference_score(total_s: float, ref: float, spp: float, pressure: bool, penalty: int) -> int:
    """One node at a time, the way the docstring says it."""
    if math.isnan(total_s):
        points = 0
    else:
        raw = (ref - total_s) / spp
        points = 0 if raw <= 0 else MAX_SCORE if raw >= MAX_SCORE else round(raw)
    return max(points - (penalty if pressure else 0), 0)


@settings(max_examples=300, deadline=None)
@given(
    totals=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=50),
    ref=st.floats(1.0, 1e5),
    spp=st.floats(0.1, 1e4),
    pressure=st.lists(st.booleans(), min_size=50, max_size=50),
    penalty=st.integers(0, 10),
)
def test_scores_are_integers_0_to_10_and_match_the_oracle(
    totals: list[float], ref: float, spp: float, pressure: list[bool], penalty: int
) -> None:
    n = len(totals)
    got = scores(Scale(ref, spp), np.array(totals), np.array(pressure[:n]), penalty)
    assert got.dtype == np.int64
    assert all(0 <= s <= MAX_SCORE for s in got.tolist())
    assert got.tolist() == [reference_score(t, ref, spp, p, penalty) for t, p in zip(totals, pressure, strict=False)]


@st.composite
def cache_pair(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A node's cache state and the same node holding at least as much of everything."""
    less: dict[str, Any] = {
        "image": draw(st.booleans()),
        "weights": draw(st.floats(0, 100.0 * GB)),
        "compile": draw(st.sampled_from([0, 1, 2])),
        "snapshot": draw(st.booleans()),
    }
    more: dict[str, Any] = {
        "image": less["image"] or draw(st.booleans()),
        "weights": draw(st.floats(less["weights"], 100.0 * GB)),
        "compile": draw(st.integers(less["compile"], 2)),
        "snapshot": less["snapshot"] or draw(st.booleans()),
    }
    return less, more


@dataclass(frozen=True)
class Place:
    """Where the two states are compared: profile, node class, and what does not change."""

    profile: str
    node_class: str
    free: float
    queued: float
    fresh: bool


places = st.builds(
    Place,
    profile=st.sampled_from(["llm", "short", "strict", "fits", "snap"]),
    node_class=st.sampled_from(["fast", "slow", "tiny", "unknown"]),
    free=st.floats(0, 500.0 * GB),
    # Without bytes queued ahead: see test_registry_fetch_behind_a_queue below for why.
    queued=st.just(0.0),
    fresh=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(pair=cache_pair(), place=places)
def test_more_cache_never_lowers_a_score(
    policy: Policy, pair: tuple[dict[str, Any], dict[str, Any]], place: Place
) -> None:
    profile_name, class_name, free, queued, fresh = (place.profile, place.node_class, place.free,
                                                     place.queued, place.fresh)
    classes = (*policy.node_classes, UNKNOWN_CLASS)
    index = np.array([[c.name for c in classes].index(class_name)] * 2, dtype=np.intp)
    less, more = pair
    inputs = NodeInputs(
        classes=classes,
        class_index=index,
        state=CacheState(
            image=np.array([less["image"], more["image"]]),
            weights_bytes=np.array([less["weights"], more["weights"]]),
            compile=np.array([less["compile"], more["compile"]], dtype=np.int8),
            snapshot=np.array([less["snapshot"], more["snapshot"]]),
            queued_bytes=np.array([queued, queued]),
            adapters=np.zeros((2, 0), dtype=np.bool_),
        ),
        fresh=np.array([fresh, fresh]),
        free_known=np.array([True, True]),
        nvme_free=np.array([free, free]),
    )
    ev = evaluate(policy, policy.profile(profile_name), inputs)
    low, high = ev.score.tolist()
    assert 0 <= low <= high <= MAX_SCORE
    # and more cache never turns a pass into a failure
    assert int(ev.judgement.verdict[1]) <= int(ev.judgement.verdict[0])


def test_registry_fetch_behind_a_queue_is_never_slower_than_no_cache(policy: Policy) -> None:
    # Found by test_more_cache_never_lowers_a_score: a node with the image and all weights, 141 GB of
    # other pulls queued. Compile key absent: nothing to download, no queue, cold compile 30 s. Key
    # in the registry: fetching would make the pod wait 141 GB / 5 GB/s = 28.2 s behind the queue,
    # plus the fetch itself, which is slower than the 30 s cold compile; the estimator compiles.
    classes = (*policy.node_classes, UNKNOWN_CLASS)
    tiny = [c.name for c in classes].index("tiny")
    inputs = NodeInputs(
        classes=classes,
        class_index=np.array([tiny, tiny], dtype=np.intp),
        state=CacheState(
            image=np.array([True, True]),
            weights_bytes=np.array([10.0 * GB, 10.0 * GB]),
            compile=np.array([CompileCache.ABSENT, CompileCache.REGISTRY], dtype=np.int8),
            snapshot=np.array([False, False]),
            queued_bytes=np.array([141e9, 141e9]),
            adapters=np.zeros((2, 0), dtype=np.bool_),
        ),
        fresh=np.array([True, True]),
        free_known=np.array([True, True]),
        nvme_free=np.array([0.0, 0.0]),
    )
    ev = evaluate(policy, policy.profile("short"), inputs)
    absent, registry = ev.estimate.total_s.tolist()
    assert registry <= absent


# --------------------------------------------------------------------------------------------
# GPU bin-packing (scoring.packingPoints)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackingRow:
    name: str
    points: int
    gpus_free: list[int]
    want: list[int]
    fresh: tuple[bool, ...] = (True, True, True, True)


#: llm (one GPU per replica) on four equally cold fast nodes (8 GPUs, score 6).
PACKING_ROWS = [
    PackingRow("off by default", 0, [8, 4, 1, 0], [6, 6, 6, 6]),
    # fill = (8 - F + 1) / 8: 1/8, 5/8, 8/8; a full node gets nothing (the pod does not fit)
    PackingRow("fuller node scores higher", 4, [8, 4, 1, 0], [6 + 0, 6 + 2, 6 + 4, 6]),
    PackingRow("clamped at 10", 10, [8, 4, 1, 0], [6 + 1, 6 + 4, 10, 6]),
    # a record an hour old says 1 GPU free: old news, so no bonus (the fresh rows keep theirs)
    PackingRow("a stale record's free GPUs count as none", 4, [8, 4, 1, 1], [6 + 0, 6, 6, 6 + 4],
               (True, False, False, True)),
]


@pytest.mark.parametrize("row", PACKING_ROWS, ids=[r.name for r in PACKING_ROWS])
def test_packing_term(policy: Policy, row: PackingRow) -> None:
    packed = policy.model_copy(update={"scoring": policy.scoring.model_copy(update={"packing_points": row.points})})
    base = nodes(policy, [("fast", set(), 1000.0 * GB)] * 4)
    inputs = NodeInputs(base.classes, base.class_index, base.state, np.array(row.fresh), base.free_known,
                        base.nvme_free, np.array(row.gpus_free, dtype=np.int64))
    assert evaluate(packed, packed.profile("llm"), inputs).score.tolist() == row.want


def test_packing_needs_known_free_gpus(policy: Policy) -> None:
    packed = policy.model_copy(update={"scoring": policy.scoring.model_copy(update={"packing_points": 5})})
    inputs = nodes(policy, [("fast", set(), 1000.0 * GB)] * 2)
    assert evaluate(packed, packed.profile("llm"), inputs).score.tolist() == [6, 6]


def test_packing_points_out_of_range_is_a_policy_error_with_its_line() -> None:
    text = POLICY.replace("scoring: {secondsPerPoint: 30s, nvmePressurePenalty: 2}",
                          "scoring:\n  secondsPerPoint: 30s\n  packingPoints: 11")
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    (problem,) = err.value.problems
    assert (problem.line, problem.path) == (POLICY.count("\n") + 2, "scoring.packingPoints")
    assert "<= 10" in problem.message
