"""Cost of one calibration refit (:func:`extender.core.calibration.calibrate`) against one least-squares
solve of the same rows.

What runs, in one process, per case (a number of observed starts, a number of nodes, a shape):

* the world: ``policies/g5-pcie-fleet.yaml`` with ``calibration.mode: apply`` and a ``window`` that
  keeps every start of a pair (the store trims each pair to its window, so what it holds is what a
  refit reads); its five (workload, node class) pairs each get true factors of their own, drawn
  with a fixed seed (:func:`true_factors`), applied with the function calibration applies fits
  with (:func:`tests.calibration_world.world`). The starts go round the pairs in turn, each on a
  node of its class drawn at random, in a named cache state drawn from a realistic mix (10 % cold,
  20 % image, 30 % image and weights, 40 % warm), a minute apart (closer when more than six days of
  them would not fit in the default ``maxAge`` of a week); its duration is the pair's
  world's estimate for that state, times a log-normal noise of 5 %, times 1.3 on every twentieth
  node of each class (:data:`SLOW_EVERY`, :data:`SLOWNESS`: a degraded disk, which per-node factors
  are there to find);
* the shapes: ``totals`` (only scheduled and Ready times, as every start has) and ``phases``
  (every start also carries the phases vLLM logs: weights load, compile with its cache hit, graph
  capture and ``initEngine``; the world's phase seconds are the estimator's own columns at the
  true factors, each with its own 5 % noise, as tests/test_calibration_phases.py makes them),
  so the fit has weights, compile, capture and init rows besides the totals;
* **baseline**: one ``numpy.linalg.lstsq`` per pair of that pair's rows (totals and, for
  ``phases``, every phase row that counts), in the fit's relative scaling, the matrices built once
  before the timing. Any fit of these factors must at least solve this least-squares problem once;
  the refit also picks its observations (window, age, version), rebuilds the design on the current
  paths every IRLS round, reweighs (Huber, per kind of row), solves within the bounds, computes
  the confidence, writes the fits into the policy and estimates every start again for the per-node
  factors. So the ratio says how many bare solves' worth the whole refit costs, on this machine at
  this moment;
* **calibrate**: ``calibrate(policy, observations, now=...)``, whole, on the validated observations
  (what :class:`extender.state.observations.CalibratedPolicy` runs after reading the store);
* **fit_nodes**: :func:`extender.core.calibration.fit_nodes` alone, on the same groups and the
  calibrated policy of a first untimed ``calibrate``.

The three are timed in turn within each round (medians of ``--repeat`` rounds), so all see the same
machine noise. Each case also reports how close the fit it timed came to the world it was built
from (:func:`recovery`; tests/test_bench_calibration.py holds bounds on them): the calibrated
policy's estimate of every named state of every pair against the world's (``state err``, worst over
pairs and states); every fitted factor against the truth (``factor err``: the largest
``|ln(fit / truth)|`` over the factors each pair's starts involve, :func:`involved`; from totals alone
most factors cannot be told apart, so it is large for ``totals`` by design and means something for
``phases``); and the per-node factors (``slow r``: the median of the slow nodes' factors; ``peer r``:
the largest of the others' ``|r - 1|``).

The starts are built here, not with :func:`tests.calibration_world.starts` (one estimate per start,
seven fixed node names): each pair's named states are estimated once and the nodes are drawn.

BLAS threads. numpy's OpenBLAS starts a thread per CPU for a large enough product or solve; on a
shared 2-CPU machine the baseline's lstsq of 10,000 rows then took anywhere from 1 to 50 ms from one
run to the next, against about 1 ms on one thread. Run with ``OPENBLAS_NUM_THREADS=1`` (the figures
record the variables) so that both sides run on one thread and the baseline is steady.

Run (from the repository root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_calibration.py
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/bench_calibration.py --sizes 2000 --nodes 200 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.timing import interleaved  # noqa: E402
from extender.core.calibration import (  # noqa: E402
    COLD,
    GRAPH,
    INIT,
    LOCAL,
    PARAMETERS,
    REMOTE,
    RESTORE,
    WARM,
    CalibrationResult,
    Observation,
    Pair,
    PhaseRows,
    cache_state,
    calibrate,
    design,
    fit_nodes,
    select,
)
from extender.core.enginelog import EnginePhases  # noqa: E402
from extender.core.estimate import STATES, CacheState, breakdown  # noqa: E402
from extender.core.policy import Policy, parse_policy  # noqa: E402
from tests.calibration_world import world  # noqa: E402

F64 = NDArray[np.float64]
POLICY = ROOT / "policies" / "g5-pcie-fleet.yaml"
#: The named cache states starts are drawn from, and how often.
MIX = {"cold": 0.1, "image": 0.2, "image+weights": 0.3, "warm": 0.4}
#: Every this-many-th node of a class starts everything SLOWNESS times slower.
SLOW_EVERY = 20
SLOWNESS = 1.3
NOISE = 0.05
T0 = 1.75e9
_WORDS = {0: "absent", 1: "registry", 2: "local"}
SHAPES = ("totals", "phases")
#: The variables that set how many threads numpy's BLAS uses (recorded with the figures).
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class World:
    """A policy, the truth of each of its pairs, and the starts that truth produced."""

    policy: Policy
    truth: dict[Pair, tuple[float, ...]]
    slow: frozenset[str]
    nodes: int
    observations: list[Observation]
    now: float


def true_factors(pairs: Sequence[Pair], seed: int) -> dict[Pair, tuple[float, ...]]:
    """Per pair, a factor per parameter drawn uniformly: 1-1.6 for the remote weights (no fit makes a
    download faster than the NIC, and g5.xlarge's streams already fill it), 0.7-1.5 for the others;
    the snapshot restore stays 1 (no snapshots here)."""
    rng = np.random.default_rng(seed)
    out = {}
    for pair in pairs:
        f = rng.uniform(0.7, 1.5, len(PARAMETERS))
        f[REMOTE] = rng.uniform(1.0, 1.6)
        f[RESTORE] = 1.0
        out[pair] = tuple(float(v) for v in f)
    return out


def named_state(policy: Policy, workload: str, names: Sequence[str]) -> CacheState:
    """The cache state of each named state in ``names``, one row each."""
    p = policy.profile(workload)
    width = len(p.preloaded_adapters)
    rows = [STATES[n] for n in names]
    return CacheState(np.array([s.image for s in rows]),
                      np.array([float(p.weights.bytes) if s.weights else 0.0 for s in rows]),
                      np.array([int(s.compile) for s in rows], dtype=np.int8), np.array([s.snapshot for s in rows]),
                      np.zeros(len(rows)),
                      np.array([[s.adapters] * width for s in rows], dtype=np.bool_).reshape(len(rows), width))


def build_world(starts: int, nodes: int, *, phases: bool, seed: int = 0, noise: float = NOISE,
                slowness: float = SLOWNESS, policy_path: Path = POLICY, t0: float = T0,
                node_name: Callable[[int], str] | None = None) -> World:
    """``starts`` observed starts on ``nodes`` nodes (module docstring), with engine phases when ``phases``;
    ``noise`` is the log-normal noise of every time, ``slowness`` the slow nodes' factor.

    ``policy_path`` is the policy whose pairs the starts go round (without a ``calibration`` block: one
    with ``mode: apply`` and the window is added), ``t0`` the first start's time and ``node_name(i)``
    the name of the fleet's i-th node (``<class>-<i>`` when not given): bench/bench_extender.py stores
    such a world, made current, for the extender's own policy and inventory names."""
    text = policy_path.read_text()
    base = parse_policy(text)
    pairs = [(p.name, c.name) for p in base.profiles for c in base.classes_for(p)]
    window = max(base.calibration.min_observations, math.ceil(starts / len(pairs)))
    policy = parse_policy(text + f"calibration: {{mode: apply, window: {window}}}\n")
    truth = true_factors(pairs, seed)
    classes = [c.name for c in policy.node_classes]
    fleet = {c: [node_name(i) if node_name else f"{c}-{i:04d}" for i in range(i0, nodes, len(classes))]
             for i0, c in enumerate(classes)}
    slow = frozenset(n for names in fleet.values() for n in names[::SLOW_EVERY])
    names = list(MIX)
    # per pair: the world's total and phase seconds of each named state (design at the true factors)
    seconds: dict[Pair, tuple[F64, F64]] = {}
    for workload, cls in pairs:
        m = np.array(truth[(workload, cls)])
        d = design(policy.profile(workload), policy.node_class(cls), named_state(policy, workload, names), m)
        seconds[(workload, cls)] = (d.total(m), d.columns * m)
        expected = [breakdown(world(policy, workload, cls, m.tolist()).profile(workload),
                              policy.node_class(cls))[n]["total_s"] for n in names]
        assert np.allclose(seconds[(workload, cls)][0], expected, rtol=1e-9), (workload, cls)
    # a minute apart, or closer so that every start is within the default maxAge (a week) at the end
    gap = min(60.0, (policy.calibration.max_age - 86_400.0) / starts)
    rng = np.random.default_rng(seed + 1)
    drawn = rng.choice(len(names), size=starts, p=list(MIX.values()))
    out: list[Observation] = []
    for i in range(starts):
        workload, cls = pairs[i % len(pairs)]
        p = policy.profile(workload)
        node = fleet[cls][int(rng.integers(len(fleet[cls])))]
        s = STATES[names[drawn[i]]]
        total, cols = seconds[(workload, cls)]
        slower = slowness if node in slow else 1.0
        took = float(total[drawn[i]]) * slower * math.exp(rng.normal(0.0, noise))
        logged = None
        if phases:
            c = cols[drawn[i]] * slower * np.exp(rng.normal(0.0, noise, len(PARAMETERS)))
            compile_s = float(c[COLD] + c[WARM])
            logged = EnginePhases(weights_load=float(c[REMOTE] + c[LOCAL]), compile=compile_s,
                                  compile_cached=bool(c[WARM] > 0), graph_capture=float(c[GRAPH]),
                                  init_engine=float(c[INIT] + c[GRAPH]) + compile_s)
        at = t0 + gap * i
        out.append(Observation(
            pod=f"serving/{workload}-{i}", workload=workload, node=node, node_class=cls,
            image_reference=p.image.reference, weights_version=p.weights.version, image=s.image,
            weights_bytes=float(p.weights.bytes) if s.weights else 0.0, compile=_WORDS[int(s.compile)],
            snapshot=s.snapshot, adapters=(s.adapters,) * len(p.preloaded_adapters), scheduled_at=at,
            ready_at=at + took, phases=logged))
    return World(policy, truth, slow, nodes, out, t0 + gap * starts + 3600.0)


def baseline_rows(w: World) -> list[tuple[F64, F64]]:
    """Per pair, the fit's rows at factors 1 (totals, then the phase rows that count) and their targets."""
    groups, _ = select(w.policy, w.observations, now=w.now)
    out = []
    for (workload, cls), group in sorted(groups.items()):
        profile, node_class = w.policy.profile(workload), w.policy.node_class(cls)
        d = design(profile, node_class, cache_state(group))
        total = np.maximum(d.total(np.ones(len(PARAMETERS))), 1e-6)
        observed = np.array([o.total_s for o in group])
        x, y = d.columns / total[:, None], (observed - d.offset) / total
        rows = PhaseRows.of(group, d.columns)
        if len(rows):
            xp, yp, live = rows.rows(d.columns)
            x, y = np.vstack([x, xp[live]]), np.concatenate([y, yp[live]])
        out.append((np.ascontiguousarray(x), np.ascontiguousarray(y)))
    return out


def least_squares(rows: list[tuple[F64, F64]]) -> list[F64]:
    """The baseline: one ``numpy.linalg.lstsq`` per pair."""
    return [np.asarray(np.linalg.lstsq(x, y, rcond=None)[0], dtype=np.float64) for x, y in rows]


def involved(policy: Policy, workload: str, node_class: str) -> list[int]:
    """The factors a pair's starts have seconds in (its design's non-zero columns over the named
    states): not the snapshot restore (no snapshots here), nor the NVMe read where the network is
    the faster and the local weights go at its rate (mixtral-61g on g5.48xlarge)."""
    d = design(policy.profile(workload), policy.node_class(node_class), named_state(policy, workload, list(MIX)))
    return [j for j in range(len(PARAMETERS)) if d.columns[:, j].any()]


def recovery(w: World, result: CalibrationResult) -> dict[str, float]:
    """How close the timed fit came to the world it was built from (module docstring)."""
    state_err = 0.0
    factor_err = 0.0
    for (workload, cls), fit in result.fits.items():
        truth = w.truth[(workload, cls)]
        true_world = world(w.policy, workload, cls, truth)
        got = breakdown(result.calibrated.profile(workload), result.calibrated.node_class(cls))
        want = breakdown(true_world.profile(workload), w.policy.node_class(cls))
        for name in MIX:
            state_err = max(state_err, abs(got[name]["total_s"] / want[name]["total_s"] - 1.0))
        off = [abs(math.log(fit.factors[j] / truth[j])) for j in involved(w.policy, workload, cls)]
        factor_err = max(factor_err, *off)
    slow = [f.factor for f in result.nodes.nodes.values() if f.node in w.slow]
    peers = [abs(f.factor - 1.0) for f in result.nodes.nodes.values() if f.node not in w.slow]
    return {"state_err": state_err, "factor_err": factor_err,
            "slow_r": statistics.median(slow) if slow else math.nan, "peer_r": max(peers, default=math.nan)}


def timed(w: World) -> tuple[CalibrationResult, list[tuple[F64, F64]], dict[str, Callable[[], Any]]]:
    """A first, untimed calibration of the world, the baseline's rows, and the three things timed."""
    result = calibrate(w.policy, w.observations, now=w.now)
    rows = baseline_rows(w)
    groups, _ = select(w.policy, w.observations, now=w.now)
    return result, rows, {
        "baseline": lambda: least_squares(rows),
        "calibrate": lambda: calibrate(w.policy, w.observations, now=w.now),
        "fit_nodes": lambda: fit_nodes(w.policy, result.calibrated, groups),
    }


def run_case(starts: int, nodes: int, shape: str, repeat: int, seed: int = 0) -> dict[str, Any]:
    """Build one world, time the baseline, calibrate and fit_nodes in turn, and check the fit."""
    w = build_world(starts, nodes, phases=shape == "phases", seed=seed)
    result, rows, fns = timed(w)
    medians = interleaved(fns, repeat)
    base = medians["baseline"]
    return {"starts": starts, "nodes": nodes, "shape": shape, "pairs": len(result.fits),
            "used": sum(len(v) for v in result.used.values()), "skipped": dict(result.skipped),
            "rows": sum(len(y) for _, y in rows), "rounds": [f.rounds for f in result.fits.values()],
            "baseline_s": base, "calibrate_s": medians["calibrate"], "calibrate_ratio": medians["calibrate"] / base,
            "fit_nodes_s": medians["fit_nodes"], "fit_nodes_ratio": medians["fit_nodes"] / base,
            **recovery(w, result)}


def sizes_arg(text: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers of at least 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_arg, default=[200, 2000, 20_000], help="observed starts per case")
    parser.add_argument("--nodes", type=sizes_arg, default=[50, 200, 500], help="nodes of each size, in order")
    parser.add_argument("--shapes", choices=[*SHAPES, "both"], default="both")
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if len(args.nodes) != len(args.sizes):
        parser.error(f"--nodes gives {len(args.nodes)} counts for {len(args.sizes)} sizes; give one per size")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    shapes = SHAPES if args.shapes == "both" else (args.shapes,)

    results: dict[str, Any] = {"repeat": args.repeat, "seed": args.seed, "python": platform.python_version(),
                               "numpy": np.__version__, "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
                               "blas_threads": {v: os.environ.get(v) for v in BLAS_THREADS},
                               "cases": []}
    print(f"{'starts':>7} {'nodes':>5} {'shape':<7} {'rows':>6} {'rounds':>6} {'baseline ms':>11} "
          f"{'calibrate ms':>12} {'ratio':>7} {'fit_nodes ms':>12} {'ratio':>6} "
          f"{'state err':>9} {'factor err':>10} {'slow r':>6} {'peer r':>6}")
    for starts, nodes in zip(args.sizes, args.nodes, strict=True):
        for shape in shapes:
            r = run_case(starts, nodes, shape, args.repeat, args.seed)
            results["cases"].append(r)
            print(f"{starts:>7} {nodes:>5} {shape:<7} {r['rows']:>6} {statistics.mean(r['rounds']):>6.1f} "
                  f"{r['baseline_s'] * 1e3:>11.3f} {r['calibrate_s'] * 1e3:>12.1f} {r['calibrate_ratio']:>7.0f} "
                  f"{r['fit_nodes_s'] * 1e3:>12.1f} {r['fit_nodes_ratio']:>6.0f} {r['state_err']:>9.1%} "
                  f"{r['factor_err']:>10.3f} {r['slow_r']:>6.3f} {r['peer_r']:>6.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
