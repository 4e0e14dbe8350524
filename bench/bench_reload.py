"""Cost of one snapshot reload, patched (``InventorySnapshot.update``) against a full rebuild.

What runs, in one process: the 15,000-record p5.48xlarge inventory of :mod:`bench.bench_extender`
and its policy. Each round times, on the same records,

* a full rebuild: ``InventorySnapshot.build`` plus an ``Engine`` with every profile's score table
  (what each reload cost before the snapshot was patched);
* a patch: ``InventorySnapshot.update`` with N heartbeats (records whose ``heartbeat`` moved), plus
  an ``Engine`` started from the previous one's tables (what a reload costs now).

Reading the records from Redis is not included in either (the store already reads only the
records written since a version). The ratio patch/full is the figure; absolute times depend on the
machine's load.

Run (from the repository root)::

    .venv/bin/python bench/bench_reload.py                 # N = 50 and 2,000, 7 rounds each
    .venv/bin/python bench/bench_reload.py --changed 500 --rounds 11
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_extender import POLICY, inventory


def measure(changed: int, rounds: int) -> tuple[list[float], list[float]]:
    """``(full rebuild seconds, patch seconds)`` per round."""
    from extender.api.scheduler.engine import Engine
    from extender.core.inventory import InventorySnapshot
    from extender.files import load_policy

    now = time.time()
    records, registry = inventory(now)
    policy = load_policy(POLICY)

    def full() -> Engine:
        engine = Engine(policy, InventorySnapshot.build(policy, records, registry=registry))
        engine.warm(now)
        return engine

    engine = full()
    fulls: list[float] = []
    patches: list[float] = []
    for r in range(rounds):
        started = time.perf_counter()
        full()
        fulls.append(time.perf_counter() - started)
        start = r * changed % len(records)
        beats = {x.name: x.model_copy(update={"heartbeat": now + r + 1})
                 for x in (records[(start + k) % len(records)] for k in range(changed))}
        started = time.perf_counter()
        snapshot = engine.snapshot.update(policy, beats, version=r + 1, taken_at=now, registry=registry)
        patched = Engine(policy, snapshot, previous=engine)
        patched.warm(now)
        patches.append(time.perf_counter() - started)
        engine = patched
    return fulls, patches


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--changed", default="50,2000", help="records changed per reload (default: 50,2000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per case (default: 7)")
    args = parser.parse_args(argv)
    print("| changed | full rebuild ms (median) | patch ms (median) | patch/full (median) | patch/full (min-max) |")
    print("|---:|---:|---:|---:|---:|")
    for changed in (int(c) for c in args.changed.split(",") if c):
        fulls, patches = measure(changed, args.rounds)
        ratios = [p / f for p, f in zip(patches, fulls, strict=True)]
        print(f"| {changed:,} | {statistics.median(fulls) * 1e3:.1f} | {statistics.median(patches) * 1e3:.1f} | "
              f"{statistics.median(ratios):.3f}x | {min(ratios):.3f}x-{max(ratios):.3f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
