"""Every start of a simulator run, by cause: why new replicas start cold, and where a start's time goes.

One run per named strategy of a scenario (default: the flagship), with hooks on the simulator's node
joins, node launches, placements and warm actions. Each pod placed during the run is classified:

* **warm**: the simulator's own test (``Start.cold`` false: every cache the pod can use was there);
* **rollout**: cold, a pod of a rolled-out workload placed in the hour after its rollout;
* **new node**: cold, on a node that joined less than ``consolidateAfter`` before (and whether that
  node was launched for a pending pod or ahead, for the warmer's expectation; and whether a warm
  action ran on it for that workload);
* **evicted**: cold, on a node that held the workload's current weights at some point before;
* **not prepared**: cold, on an existing node where no warm action ran for that workload since the
  node joined (``prepared in part``: one did, and something was still missing).

It also prints the mean of the estimator's phases over warm and over cold starts, and the SLO figures
of the run, so the breakdown can be set against them. BENCHMARKS.md (the flagship section) has a run.

Run (from the repository root)::

    .venv/bin/python bench/flagship_starts.py
    .venv/bin/python bench/flagship_starts.py --strategies predictive,default --seed 3
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extender.core.caches import weights_key  # noqa: E402
from extender.core.estimate import CompileCache  # noqa: E402
from extender.core.policy import Policy  # noqa: E402
from extender.core.warming import Action  # noqa: E402
from extender.sim.cluster import Pod  # noqa: E402
from extender.sim.report import summarise  # noqa: E402
from extender.sim.scenario import load_scenario  # noqa: E402
from extender.sim.simulation import Prepared, Run, prepare  # noqa: E402
from extender.sim.strategies import STRATEGIES  # noqa: E402

PHASES = ("queue_s", "image_s", "weights_s", "compile_s", "graph_s", "init_s", "restore_s")


@dataclass
class Start:
    """One placed pod, as seen when it was placed."""

    workload: str
    placed_s: float
    created_s: float
    #: For a cold start on a new node: when that node was launched (else NaN).
    launched_s: float
    cold: bool
    missing: tuple[str, ...]
    phases: dict[str, float]
    cause: str


class Traced(Run):
    """A run that records joins, launches (and why), warm actions and every placement."""

    def __init__(self, prepared: Prepared, strategy: str) -> None:
        super().__init__(prepared, STRATEGIES[strategy])
        self.joined: dict[int, float] = {}
        self.ahead: set[int] = set()
        self.launched_at: dict[int, float] = {}
        self.actions: list[tuple[float, Action]] = []
        self.held: set[tuple[int, str]] = set()
        self.starts: list[Start] = []
        self.rollout_at = {r.workload: r.at for r in prepared.scenario.rollouts}
        self.window = float(prepared.scenario.cluster.autoscaling.consolidate_after)

    def _joins(self, now: float) -> None:
        for slot, at in self.launching.items():
            if at <= now:
                self.joined[slot] = now
        super()._joins(now)

    def _launch(self, w: int, gpus: int, now: float, *, standby: bool = False) -> int | None:
        slot = super()._launch(w, gpus, now, standby=standby)
        if slot is not None:
            self.launched_at[slot] = now
        if slot is not None and standby:  # launched for a placeholder: ahead of demand
            self.ahead.add(slot)
        elif slot is not None:
            self.ahead.discard(slot)
        return slot

    def _start(self, actions: Sequence[Action], now: float, belief: Policy) -> None:
        self.actions.extend((now, a) for a in actions)
        super()._start(actions, now, belief)

    def _events(self, now: float) -> None:
        super()._events(now)
        c = self.cluster
        for i in np.flatnonzero(c.present):
            for key in c.records[int(i)].weights:
                self.held.add((int(i), key))

    def _place(self, pod: Pod, node: int, now: float) -> None:
        c = self.cluster
        p = c.profiles[pod.workload]
        state = c.state(pod.workload, now, np.array([node], dtype=np.intp))
        start = c.cost(pod.workload, node, now)
        missing = tuple(kind for kind, absent in (
            ("image", not bool(state.image[0])),
            ("weights", float(state.weights_bytes[0]) < p.weights.bytes),
            ("compile", int(state.compile[0]) != CompileCache.LOCAL)) if absent)
        super()._place(pod, node, now)
        name = c.records[node].name
        since = self.joined.get(node, -1.0)
        acted = any(a.node == name and a.workload == p.name and t >= since for t, a in self.actions)
        rolled = self.rollout_at.get(p.name)
        if not pod.cold:
            cause = "warm"
        elif rolled is not None and rolled <= now < rolled + 3600.0:
            cause = "cold: in the hour after its rollout"
        elif node in self.joined and now - self.joined[node] < self.window:
            why = "launched ahead" if node in self.ahead else "launched for a pending pod"
            cause = f"cold: new node ({why}), warmer {'acted' if acted else 'did nothing'} there"
        elif (node, weights_key(p.name, p.weights.version)) in self.held:
            cause = "cold: the node held its weights before (evicted)"
        elif acted:
            cause = "cold: existing node, prepared in part"
        else:
            cause = "cold: existing node the warmer never prepared for it"
        fresh = "new node" in cause
        self.starts.append(Start(p.name, now, pod.created_s, self.launched_at[node] if fresh else float("nan"),
                                 pod.cold, missing,
                                 {k: float(getattr(start.estimate, k)[0]) for k in PHASES}, cause))


def report(run: Traced, name: str) -> None:
    """Print the breakdown of one run."""
    starts = run.starts
    cold = [s for s in starts if s.cold]
    print(f"== {name}: {len(starts)} starts, {len(cold)} cold; {len(run.actions)} warm actions "
          f"({dict(collections.Counter(a.kind for _, a in run.actions))}); "
          f"{run.launched} nodes launched, {len(run.ahead)} ahead")
    for cause, n in collections.Counter(s.cause for s in starts).most_common():
        print(f"  {n:5d}  {cause}")
    print("  missing at a cold start:", dict(collections.Counter("+".join(s.missing) for s in cold)))
    fresh = [s for s in cold if not np.isnan(s.launched_s)]
    if fresh:
        print(f"  cold starts on new nodes: pod created {np.median([s.created_s - s.launched_s for s in fresh]):.0f} s "
              f"(median) after its node was launched, placed "
              f"{np.median([s.placed_s - s.created_s for s in fresh]):.0f} s after it was created")
    for label, group in (("warm", [s for s in starts if not s.cold]), ("cold", cold)):
        if group:
            means = {k.removesuffix("_s"): round(float(np.mean([s.phases[k] for s in group])), 1) for k in PHASES}
            total = float(np.mean([sum(s.phases.values()) for s in group]))
            print(f"  {label} starts: mean phases {means}, total {total:.1f} s")
    result = run._result()
    slo = float(run.p.scenario.slo.queue_delay)
    s = summarise(result.workloads, slo, result.fleet_gpu_seconds)
    print(f"  SLO met {100 * s.slo_attainment:.2f} %, p99 wait {s.p99_delay_s:.1f} s, mean startup "
          f"{s.mean_startup_s:.0f} s, mean ready {s.mean_ready_s:.0f} s, GPU-h {s.gpu_hours:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(ROOT / "scenarios/flagship.yaml"))
    parser.add_argument("--strategies", default="predictive,default")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    prepared = prepare(load_scenario(args.scenario), seed=args.seed)
    for name in args.strategies.split(","):
        run = Traced(prepared, name)
        run.run()
        report(run, name)


if __name__ == "__main__":
    main()
