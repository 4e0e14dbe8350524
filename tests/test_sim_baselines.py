"""The stock Kubernetes baselines: ImageLocality and LeastAllocated scores, the HPA's decisions.

Expected values are computed by hand from the upstream formulas (kubescheduler/hpa docstrings), and
a plain reference of the Go integer arithmetic checks the vectorised ImageLocality on every row.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest

from extender.sim.hpa import Hpa, replicas_for_external, to_milli
from extender.sim.kubescheduler import image_locality, least_allocated, select_host

MiB = 2**20


def reference_image_locality(present: list[list[bool]], sizes: list[int], containers: int) -> list[int]:
    """The Go code, line by line: per-image int64(float64(size) * spread), clamp, 100 * (s - min) / (max - min)."""
    total = len(present)
    out = []
    for row in present:
        s = 0
        for j, size in enumerate(sizes):
            if row[j]:
                num = sum(1 for r in present if r[j])
                s += int(float(size) * (float(num) / float(total)))
        lo, hi = 23 * MiB, 1000 * MiB * containers
        s = min(max(s, lo), hi)
        out.append(100 * (s - lo) // (hi - lo))
    return out


class LocalityCase(NamedTuple):
    name: str
    present: list[list[bool]]
    sizes: list[int]
    expected: list[int]


LOCALITY_CASES = [
    # below the 23 MiB floor: 10 MiB on every node clamps up to 23 MiB -> 0
    LocalityCase("small image clamps to 0", [[True], [True]], [10 * MiB], [0, 0]),
    # 23 MiB exactly on every node: (23 - 23) -> 0
    LocalityCase("at the min threshold", [[True], [True]], [23 * MiB], [0, 0]),
    # 20 GiB on every node: far above 1000 MiB, clamps to 100; the node without it: 0
    LocalityCase("large image clamps to 100", [[True], [True], [False]], [20 * 1024 * MiB], [100, 100, 0]),
    # 1000 MiB on every node: exactly the max -> 100
    LocalityCase("at the max threshold", [[True], [True]], [1000 * MiB], [100, 100]),
    # spread: 500 MiB on 1 of 4 nodes -> 125 MiB: 100 x (125 - 23) // 977 = 10
    LocalityCase("spread on 1 of 4", [[True], [False], [False], [False]], [500 * MiB], [10, 0, 0, 0]),
    # same image on 3 of 4 nodes -> 375 MiB: 100 x 352 // 977 = 36 (more spread, higher score)
    LocalityCase("spread on 3 of 4", [[True], [True], [True], [False]], [500 * MiB], [36, 36, 36, 0]),
    # a 10 GB vLLM image on 1 of 100 nodes: 1e8 B = 95.37 MiB: 100 x (1e8 - 23 MiB) // 977 MiB = 7
    LocalityCase("vLLM image on 1 of 100", [[True]] + [[False]] * 99, [10 * 10**9], [7] + [0] * 99),
    # per-container max: two 800 MiB images on all nodes -> 1600 MiB of a 2000 MiB max:
    # 100 x (1600 - 23) // (2000 - 23) = 79 (a single-container max would have clamped to 100)
    LocalityCase("per-container max", [[True, True], [True, True]], [800 * MiB, 800 * MiB], [79, 79]),
    # node 0 holds only the first image (on 2 of 2 nodes: 800 MiB) -> 100 x 777 // 1977 = 39; node 1 holds
    # both, the second on 1 of 2 nodes (400 MiB): 1200 MiB -> 100 x 1177 // 1977 = 59
    LocalityCase("one of two containers", [[True, False], [True, True]], [800 * MiB, 800 * MiB], [39, 59]),
]


def test_image_locality_of_no_node_is_empty() -> None:
    """An autoscaled pool may have no node yet: nothing to score, not a division by zero."""
    assert image_locality(np.zeros((0, 1), dtype=np.bool_), [500 * MiB], 0).tolist() == []


@pytest.mark.parametrize("case", LOCALITY_CASES, ids=[c.name for c in LOCALITY_CASES])
def test_image_locality_matches_upstream(case: LocalityCase) -> None:
    got = image_locality(np.array(case.present), case.sizes, len(case.present)).tolist()
    assert got == case.expected
    assert got == reference_image_locality(case.present, case.sizes, len(case.sizes))


def test_image_locality_reference_on_random_clusters() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        n, k = int(rng.integers(1, 30)), int(rng.integers(1, 4))
        present = (rng.random((n, k)) < rng.random()).tolist()
        sizes = [int(s) for s in rng.integers(1, 3000 * MiB, k)]
        assert image_locality(np.array(present), sizes, n).tolist() == reference_image_locality(present, sizes, k)


class FitCase(NamedTuple):
    name: str
    allocatable: list[int]
    allocated: list[int]
    request: int
    expected: list[int]


FIT_CASES = [
    # (8 - (0 + 1)) x 100 // 8 = 87; (8 - (4 + 1)) x 100 // 8 = 37; (8 - 8) = 0
    FitCase("least allocated wins", [8, 8, 8], [0, 4, 7], 1, [87, 37, 0]),
    # a request that does not fit scores 0; a node without allocatable scores 0
    FitCase("does not fit", [4, 0], [2, 0], 4, [0, 0]),
    # four GPUs on an empty 4-GPU node: 0; on an empty 8-GPU node: 50
    FitCase("tensor parallel replica", [4, 8], [0, 0], 4, [0, 50]),
]


@pytest.mark.parametrize("case", FIT_CASES, ids=[c.name for c in FIT_CASES])
def test_least_allocated(case: FitCase) -> None:
    got = least_allocated(np.array(case.allocatable), np.array(case.allocated), case.request)
    assert got.tolist() == case.expected


def test_select_host_breaks_ties_at_random_but_reproducibly() -> None:
    feasible = np.array([True, True, True, False])
    totals = np.array([50, 50, 10, 99], dtype=np.int64)
    picks = {select_host(feasible, totals, np.random.default_rng(s)) for s in range(40)}
    assert picks == {0, 1}  # both tied nodes, never the lower one, never the infeasible 99
    assert select_host(feasible, totals, None) == 0
    assert select_host(np.zeros(4, dtype=np.bool_), totals, None) is None
    a = [select_host(feasible, totals, rng) for rng in [np.random.default_rng(7)] * 5]
    b = [select_host(feasible, totals, rng) for rng in [np.random.default_rng(7)] * 5]
    assert a == b


class HpaCase(NamedTuple):
    name: str
    usage_milli: int
    target_milli: int
    status: int
    expected: int


HPA_CASES = [
    # ratio 1050 / (1000 x 1) = 1.05: within 0.1 -> keep 1
    HpaCase("within tolerance", 1050, 1000, 1, 1),
    # ratio 1.1 exactly: |1 - 1.1| = 0.10000000000000009 > 0.1 in floating point -> ceil(1.1) = 2
    HpaCase("tolerance edge in floating point", 1100, 1000, 1, 2),
    # ratio 2.25 -> ceil(2250 / 1000) = 3
    HpaCase("scale up", 2250, 1000, 1, 3),
    # ratio 0.5 with 4 replicas -> ceil(2000 / 1000) = 2
    HpaCase("scale down", 2000, 1000, 4, 2),
    # no replicas yet: ceil(usage / target)
    HpaCase("from zero", 3500, 1000, 0, 4),
]


@pytest.mark.parametrize("case", HPA_CASES, ids=[c.name for c in HPA_CASES])
def test_external_average_value(case: HpaCase) -> None:
    assert replicas_for_external(case.usage_milli, case.target_milli, case.status, 0.1) == case.expected


def test_hpa_scale_up_limit_is_max_of_double_and_four() -> None:
    # 1 replica wants 20: limit max(1 + 4, 2 x 1) = 5; then from 5: max(9, 10) = 10; then 20.
    h = Hpa(min_replicas=1, max_replicas=100)
    assert h.sync(0.0, 1, 1, 20.0, 1.0) == 5
    assert h.sync(15.0, 5, 5, 20.0, 1.0) == 10
    assert h.sync(30.0, 10, 10, 20.0, 1.0) == 20
    assert h.sync(45.0, 20, 20, 200.0, 1.0) == 40
    assert h.sync(60.0, 40, 40, 200.0, 1.0) == 80


def test_hpa_holds_a_scale_down_for_the_stabilisation_window() -> None:
    h = Hpa(min_replicas=1, max_replicas=100)
    assert h.sync(0.0, 10, 10, 10.0, 1.0) == 10
    # load halves: the recommendation 5 is held at 10 while the 10 of t = 0 is in the 300 s window
    for t in (15.0, 150.0, 299.0):
        assert h.sync(t, 10, 10, 5.0, 1.0) == 10
    # at 300 s the t = 0 recommendation is no longer strictly inside the window
    assert h.sync(300.0, 10, 10, 5.0, 1.0) == 5
    # and the min/max clamps still apply to a current count outside them
    assert Hpa(min_replicas=3, max_replicas=4).sync(0.0, 9, 9, 1.0, 1.0) == 4


class ReferenceHpa:
    """``reconcileAutoscaler`` for one External ``AverageValue`` metric with the default behavior, written
    from the Go code (replica_calculator.go, horizontal.go) independently of extender.sim.hpa: the
    tolerance on ``usage / (target x statusReplicas)``, then ``stabilizeRecommendationWithBehaviors``
    (windows 0 s up, 300 s down), then ``convertDesiredReplicasWithBehaviorRate`` (up: Max of Pods 4
    and Percent 100 per 15 s; down: Percent 100 per 15 s), min/max only on the way out of the limits."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.recs: list[tuple[float, int]] = []
        self.ups: list[tuple[float, int]] = []
        self.downs: list[tuple[float, int]] = []

    def sync(self, now: float, spec: int, status: int, usage_milli: int, target_milli: int) -> int:
        if spec == 0 and self.lo != 0:
            return 0
        if spec > self.hi:
            out = self.hi
        elif spec < self.lo:
            out = self.lo
        else:
            proposal = status
            ratio = usage_milli / (target_milli * status) if status else (math.inf if usage_milli else math.nan)
            if abs(1.0 - ratio) > 0.1:  # NaN (0 / 0) compares false: keep statusReplicas
                proposal = math.ceil(usage_milli / target_milli)
            up_rec = down_rec = proposal
            for at, rec in self.recs:
                if at > now:  # up window 0 s: only a recommendation after now would count
                    up_rec = min(rec, up_rec)
                if at > now - 300:
                    down_rec = max(rec, down_rec)
            stabilised = min(max(spec, up_rec), down_rec)
            self.recs.append((now, proposal))
            start = (spec - sum(n for at, n in self.ups if at > now - 15)
                     + sum(n for at, n in self.downs if at > now - 15))
            if stabilised > spec:
                out = min(stabilised, self.hi, max(start + 4, math.ceil(start * 2.0), spec))
            elif stabilised < spec:
                out = max(stabilised, self.lo, min(int(start * 0.0), spec))
            else:
                out = stabilised
        if out > spec:
            self.ups.append((now, out - spec))
        elif out < spec:
            self.downs.append((now, spec - out))
        return out


class HpaRun(NamedTuple):
    name: str
    lo: int
    hi: int
    #: (now, spec, status, usage, target) per sync, and the replicas upstream sets
    syncs: list[tuple[float, int, int, float, float, int]]


HPA_RUNS = [
    # 2.25 requests/s on one replica of capacity 1: ceil(2.25) = 3, limit max(1 + 4, 2) = 5 -> 3
    HpaRun("tolerance-then-ceil", 1, 10, [(0.0, 1, 1, 2.25, 1.0, 3)]),
    # 4.2 on 4 replicas: ratio 1.05, within 0.1 -> hold 4; then 2.0: ceil(2) = 2, held by the 4 in the window
    HpaRun("within-tolerance-holds", 1, 10, [(0.0, 4, 4, 4.2, 1.0, 4), (15.0, 4, 4, 2.0, 1.0, 4)]),
    # up to 30 from 2: limit max(2 + 4, 2 x 2) = 6, then max(10, 12) = 12, then 24, then 30
    HpaRun("scale-up-rate-limited", 1, 40, [(0.0, 2, 2, 30.0, 1.0, 6), (15.0, 6, 6, 30.0, 1.0, 12),
                                            (30.0, 12, 12, 30.0, 1.0, 24), (45.0, 24, 24, 30.0, 1.0, 30)]),
    # 10 then 5: the 10 of t = 0 holds the scale-down until it leaves the 300 s window (strictly newer)
    HpaRun("scale-down-stabilised", 1, 40, [(0.0, 10, 10, 10.0, 1.0, 10), (150.0, 10, 10, 5.0, 1.0, 10),
                                            (300.0, 10, 10, 5.0, 1.0, 5)]),
    # the need is 16 on 11 replicas, max 12: tolerance first (16 / 11), then the clamp -> 12
    HpaRun("max-after-tolerance", 1, 12, [(0.0, 11, 11, 16.0, 1.0, 12)]),
    # the same 12 published as the metric: 12 / 11 is within 0.1 -> 11 (what the predictive scaler meets)
    HpaRun("clamped-metric-within-tolerance", 1, 12, [(0.0, 11, 11, 12.0, 1.0, 11)]),
    # spec above max / below min: clamped without a metric; spec 0 with minReplicas 1: disabled
    HpaRun("bounds-and-disabled", 2, 5, [(0.0, 9, 9, 1.0, 1.0, 5), (15.0, 1, 1, 9.0, 1.0, 2)]),
    HpaRun("spec-zero-disabled", 1, 5, [(0.0, 0, 0, 9.0, 1.0, 0)]),
    # minReplicas 0: from 0 pods, ceil(usage / target); no usage at 0 pods stays 0
    HpaRun("scale-from-zero", 0, 5, [(0.0, 0, 0, 0.0, 1.0, 0), (15.0, 0, 0, 2.5, 1.0, 3)]),
    # 0.9 target (AverageValue 900m): 4.5 requests/s on 4 pods -> ratio 1.25 -> ceil(4500 / 900) = 5
    HpaRun("milli-target", 1, 10, [(0.0, 4, 4, 4.5, 0.9, 5)]),
]


@pytest.mark.parametrize("case", HPA_RUNS, ids=[c.name for c in HPA_RUNS])
def test_hpa_matches_an_independent_reference(case: HpaRun) -> None:
    model, ref = Hpa(case.lo, case.hi), ReferenceHpa(case.lo, case.hi)
    for now, spec, status, usage, target, expected in case.syncs:
        assert ref.sync(now, spec, status, to_milli(usage), to_milli(target)) == expected
        assert model.sync(now, spec, status, usage, target) == expected


def test_hpa_matches_the_reference_on_random_histories() -> None:
    rng = np.random.default_rng(11)
    for _ in range(400):
        lo = int(rng.integers(0, 4))
        hi = int(rng.integers(max(lo, 1), 40))
        model, ref = Hpa(lo, hi), ReferenceHpa(lo, hi)
        spec, now = int(rng.integers(0, 45)), 0.0
        for _ in range(40):
            status = max(0, spec + int(rng.integers(-2, 3))) if rng.random() < 0.3 else spec
            usage = float(rng.choice([0.0, rng.uniform(0, 60), spec * rng.uniform(0.85, 1.15)]))
            target = float(rng.choice([1.0, 0.9, 2.0, 3.6]))
            got = model.sync(now, spec, status, usage, target)
            assert got == ref.sync(now, spec, status, to_milli(usage), to_milli(target))
            spec = got if rng.random() < 0.9 else int(rng.integers(0, 45))
            now += float(rng.choice([15.0, 15.0, 7.0, 30.0, 300.0]))
