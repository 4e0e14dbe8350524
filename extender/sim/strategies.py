"""The strategies the simulator compares: each a named combination of placement, scaling and warming.

* ``default``: kube-scheduler's default plugins (NodeResourcesFit LeastAllocated, ImageLocality);
  the stock HPA on the load signal; no warming.
* ``cache-aware``: the same plugins plus the extender (its filter, and its score x weight x 10); the
  stock HPA on the load signal; no warming.
* ``predictive``: placement as cache-aware; the predictive scaler (forecast + decide, horizon from
  the estimator) published to the stock HPA; the warmer's planner.
* ``oracle``: as predictive, but the forecast is the true future demand.
* ``predictive-no-warm`` (ablation): predictive without the warmer.
* ``warm-only`` (ablation): cache-aware scaled by the stock HPA, plus the warmer fed by the
  forecaster (the same look-ahead expectation as ``predictive``). With ``default``, ``cache-aware``
  and ``predictive`` these attribute a gain to placement, forecasting and warming separately.
* ``cache-aware-calibrated``, ``predictive-calibrated``: as without the suffix, but estimating with
  the policy calibrated from the starts seen so far (``calibration.mode: apply``,
  extender.sim.truth); they differ from their base only when the scenario's ``truth`` makes the
  world differ from the policy. Not run unless named.

The stock HPA (extender.sim.hpa) uses its upstream defaults everywhere: 15 s sync, tolerance 0.1,
300 s scale-down stabilisation, scale-up by at most max(100 %, 4 pods) per 15 s. For ``default``
and ``cache-aware`` its metric is the load signal ``demand + queue / queueDrain`` (requests/s, the
same reactive need the predictive scaler computes) with an ``AverageValue`` target of one replica's
capacity; for ``predictive`` and ``oracle`` it is the scaler's desired replicas with target 1, as in
production (docs/scaler.md section 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Placement = Literal["kube-scheduler", "extender"]
Scaling = Literal["hpa", "predictive", "oracle"]


@dataclass(frozen=True)
class Strategy:
    """One row of the comparison."""

    name: str
    placement: Placement
    scaling: Scaling
    warming: bool
    summary: str
    #: Estimate with the policy calibrated from the starts seen so far (extender.sim.truth.Belief).
    calibrated: bool = False
    #: Run only when named (a scenario's ``strategies`` or ``--strategies``).
    extra: bool = False

    @property
    def forecasts(self) -> bool:
        """Whether its runs call the forecaster: the predictive scaler, or the warmer's look-ahead
        (the oracle's forecast is the true demand)."""
        return self.scaling == "predictive" or (self.warming and self.scaling == "hpa")


STRATEGIES = MappingProxyType({s.name: s for s in (
    Strategy("default", "kube-scheduler", "hpa", False,
             "kube-scheduler default plugins + stock HPA, no warming"),
    Strategy("cache-aware", "extender", "hpa", False,
             "default plugins + the extender's score and filter + stock HPA"),
    Strategy("predictive", "extender", "predictive", True,
             "extender + predictive scaler (horizon from the estimator) + warmer"),
    Strategy("oracle", "extender", "oracle", True,
             "extender + a scaler that sees the true future demand + warmer"),
    Strategy("predictive-no-warm", "extender", "predictive", False,
             "ablation: predictive without the warmer (placement + forecasting only)", extra=True),
    Strategy("warm-only", "extender", "hpa", True,
             "ablation: cache-aware + the warmer on the forecast, scaled by the stock HPA", extra=True),
    Strategy("cache-aware-calibrated", "extender", "hpa", False,
             "cache-aware, estimating with the phase times calibrated from the starts seen so far", True),
    Strategy("predictive-calibrated", "extender", "predictive", True,
             "predictive, estimating with the phase times calibrated from the starts seen so far", True),
)})
