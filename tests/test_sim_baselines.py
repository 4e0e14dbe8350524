"""The stock Kubernetes baselines: ImageLocality and LeastAllocated scores, the HPA's decisions.

Expected values are computed by hand from the upstream formulas (kubescheduler/hpa docstrings), and
a plain reference of the Go integer arithmetic checks the vectorised ImageLocality on every row.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from extender.sim.hpa import Hpa, replicas_for_external
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
