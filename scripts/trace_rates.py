"""Turn a request trace into a rate trace: requests per second in bins of ``--step`` seconds.

The bundled ``scenarios/traces/azure-code-rates.csv`` was made with it from the whole Azure code
trace (see ``scenarios/traces/README.md``)::

    .venv/bin/python scripts/trace_rates.py AzureLLMInferenceTrace_code.csv scenarios/traces/azure-code-rates.csv

Row ``t`` covers ``[t, t + step)`` seconds after the first request and holds the requests that
arrived in it over ``step``: binned again at any multiple of ``step`` (as ``extender simulate`` and
``bench/bench_forecast.py`` do), the file gives the same counts as the request trace itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from extender.sim.scenario import TraceSpec
from extender.sim.traces import RequestTrace, read_trace


def rates(times: NDArray[np.float64], step: float) -> NDArray[np.float64]:
    """Requests per second in bins ``[k step, (k+1) step)`` from 0 to the last request's bin."""
    counts = np.bincount((times / step).astype(np.int64))
    return np.asarray(counts / step, dtype=np.float64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("requests", type=Path, help="a request trace (one row per request)")
    ap.add_argument("out", type=Path, help="the rate CSV to write: t,rate")
    ap.add_argument("--step", type=float, default=1.0, help="bin width, seconds (default 1)")
    args = ap.parse_args(argv)
    trace = read_trace(args.requests, TraceSpec(path=str(args.requests), format="requests"))
    assert isinstance(trace, RequestTrace)
    r = rates(trace.times, args.step)
    lines = ["t,rate", *(f"{k * args.step:g},{v:g}" for k, v in enumerate(r))]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{args.out}: {len(r)} rows of {args.step:g} s, {round(r.sum() * args.step)} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
