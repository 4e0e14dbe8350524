"""bench/bench_calibration.py at tiny sizes: its main path prints and writes what it says, the fit it
times is calibrate's own on its world and recovers the truth that world was built with, and its
baseline solves the same rows. No figure here is a time: times are measurements, not results."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from extender.core.calibration import Observation

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_calibration.py"


@functools.cache
def bench() -> ModuleType:
    """The bench script as a module (it is not a package; its dataclasses need it in sys.modules)."""
    spec = importlib.util.spec_from_file_location("bench_calibration", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_main_prints_a_row_per_case_and_writes_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    out = tmp_path / "figures.json"
    assert bench().main(["--sizes", "60,120", "--nodes", "12,24", "--repeat", "1", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["starts", "nodes", "shape", "rows", "rounds"]
    assert [line.split()[:3] for line in lines[1:]] == [["60", "12", "totals"], ["60", "12", "phases"],
                                                        ["120", "24", "totals"], ["120", "24", "phases"]]
    figures = json.loads(out.read_text())
    assert figures["repeat"] == 1 and set(figures["blas_threads"]) == set(bench().BLAS_THREADS)
    cases = figures["cases"]
    assert [(c["starts"], c["nodes"], c["shape"]) for c in cases] == [
        (60, 12, "totals"), (60, 12, "phases"), (120, 24, "totals"), (120, 24, "phases")]
    for c in cases:
        # every start is used (the window keeps a pair's every start, all within maxAge), by five pairs
        assert c["pairs"] == 5 and c["used"] == c["starts"] and c["skipped"] == {}, c
        assert len(c["rounds"]) == 5 and all(1 <= r <= 50 for r in c["rounds"])
        for key in ("baseline_s", "calibrate_s", "calibrate_ratio", "fit_nodes_s", "fit_nodes_ratio",
                    "state_err", "factor_err", "slow_r", "peer_r"):
            assert isinstance(c[key], float), key
    # the totals shape fits one row per start; the phases shape a row per logged phase besides
    assert [c["rows"] == c["starts"] for c in cases] == [True, False, True, False]
    assert all(c["rows"] > 3 * c["starts"] for c in cases if c["shape"] == "phases")


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["--sizes", "200,2000", "--nodes", "50"], "--nodes gives 1 counts for 2 sizes", id="nodes per size"),
    pytest.param(["--sizes", "200,many"], "expected comma-separated whole numbers, got '200,many'", id="not a number"),
    pytest.param(["--sizes", "0"], "expected numbers of at least 1, got '0'", id="no starts"),
    pytest.param(["--repeat", "0"], "--repeat must be at least 1, got 0", id="no rounds"),
])
def test_bad_arguments_are_refused_with_what_is_wrong(argv: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench().main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("seed", [pytest.param(0, id="seed 0"), pytest.param(1, id="seed 1")])
@pytest.mark.parametrize("shape", [pytest.param(s, id=s) for s in ("totals", "phases")])
def test_the_timed_fit_is_calibrate_and_recovers_the_world(shape: str, seed: int) -> None:
    b = bench()
    w = b.build_world(2000, 100, phases=shape == "phases", seed=seed)
    result, _, timed = b.timed(w)
    # what is timed is calibrate and fit_nodes on the world, giving what the untimed first run gave
    assert timed["calibrate"]().fits == result.fits
    assert timed["fit_nodes"]() == result.nodes
    got = b.recovery(w, result)
    # 400 starts a pair: every named state's estimate within 6 % of the world's
    assert got["state_err"] < 0.06, got
    if shape == "phases":
        # the logged phases tell the factors apart: each one they time within 3 % (ln) of its truth; the
        # image pull, timed by no phase and told only by the cold starts' totals (10 %), within 10 %
        pull = b.PARAMETERS.index("imagePull")
        for pair, fit in result.fits.items():
            for j in b.involved(w.policy, *pair):
                off = abs(math.log(fit.factors[j] / w.truth[pair][j]))
                assert off < (0.10 if j == pull else 0.03), (pair, b.PARAMETERS[j], off)
        assert got["factor_err"] < 0.10, got
    # the slow nodes (1.3x) are found, shrunk by the prior; their peers stay within 6 % of 1
    assert 1.15 < got["slow_r"] <= 1.3 and got["peer_r"] < 0.06, got


def test_the_baseline_solves_the_fits_rows() -> None:
    # without noise or slow nodes the rows are exact: one least-squares solve gives every factor the
    # starts involve (the min-norm solution leaves the others, e.g. the snapshot restore's, at 0)
    b = bench()
    w = b.build_world(300, 30, phases=True, noise=0.0, slowness=1.0)
    _, rows, timed = b.timed(w)
    solved = timed["baseline"]()
    assert len(solved) == len(rows) == len(w.truth)
    for (pair, truth), m in zip(sorted(w.truth.items()), solved, strict=True):
        involved = b.involved(w.policy, *pair)
        assert b.PARAMETERS.index("snapshotRestore") not in involved
        np.testing.assert_allclose([m[j] for j in involved], [truth[j] for j in involved], rtol=1e-8)


@pytest.mark.parametrize(("pair", "left_out"), [
    pytest.param(("llama3-8b", "g5.12xlarge"), {"snapshotRestore"}, id="NVMe-bound: local weights have a column"),
    pytest.param(("mixtral-61g", "g5.48xlarge"), {"snapshotRestore", "weightsLocal"},
                 id="network faster than NVMe: local weights go at its rate"),
])
def test_involved_leaves_out_the_factors_no_start_has_seconds_in(pair: tuple[str, str], left_out: set[str]) -> None:
    b = bench()
    w = b.build_world(20, 6, phases=False)
    assert set(b.PARAMETERS) - {b.PARAMETERS[j] for j in b.involved(w.policy, *pair)} == left_out


def test_the_world_is_what_the_docstring_says() -> None:
    b = bench()
    w = b.build_world(400, 40, phases=True)
    assert len(w.observations) == 400 and w.policy.calibration.mode == "apply"
    assert w.policy.calibration.window == 80  # 400 starts over five pairs
    # every twentieth node of each class is slow: 40 nodes over three classes, 14, 13 and 13 a class
    assert len(w.slow) == 3
    assert all(w.now - o.ready_at < w.policy.calibration.max_age for o in w.observations)
    assert all(o.phases is not None and o.phases.init_engine is not None for o in w.observations)
    def named(o: Observation) -> str:
        seen = (o.image, o.weights_bytes > 0, o.compile)
        names: list[str] = [n for n in b.MIX
                            if (b.STATES[n].image, b.STATES[n].weights, b.STATES[n].compile.name.lower()) == seen]
        assert len(names) == 1, seen
        return names[0]

    shares = {s: np.mean([named(o) == s for o in w.observations]) for s in b.MIX}
    for s, share in b.MIX.items():
        assert math.isclose(shares[s], share, abs_tol=0.06), (s, shares)
