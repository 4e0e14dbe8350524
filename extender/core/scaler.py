"""The scaling decision: desired replicas of one workload at one tick, and every reason for it.

Pure: the loop (signal, history, forecast, estimator, leader election, publishing) gathers the
inputs into :class:`DecisionInputs`; :func:`decide` returns a :class:`Decision` that carries those
inputs and each intermediate number, so ``extender scale explain`` can print why.

Units: demand and per-replica capacity in the same rate (requests/s or tokens/s, ``unit``); queue
depth in the matching amount (requests or tokens); times in seconds; replicas are counts.

The rules (docs/scaler.md; docs/prior-art.md Part B for the failures they avoid)::

    current    = ready + starting                   replicas still starting are capacity in flight
    usable     = capacity x target_utilization      (scaling.targetUtilization, default 1)
    r_reactive = (demand + queue / queue_drain_s) / usable              serve arrivals now and
                                                                        drain the backlog in time
    r_forecast = forecast.upper / usable            demand one horizon ahead, at the upper quantile
                                                    (each need at most MAX_NEED replicas)
    r          = max(r_reactive, r_forecast)        the forecast can only raise (a floor)
    candidate  = ceil(r)
    recommendation = current      if current > 0 and |1 - candidate / current| <= tolerance
                   = candidate    otherwise                          (the HPA's own tolerance test)
    gap_s      = max(window, 2 x tick_s)                a longer pause between two decisions is an outage
    since      = t_k, the oldest of the recommendation times t_1 < ... < t_n (and now = t_n+1) with
                 t_j+1 - t_j <= gap_s for every j >= k      (now when there is none: the first start)
    covered    = window = 0  or  since <= now - window
    stabilised = recommendation                                      if recommendation >= current
               = current                                             if not covered
               = min(current, max(recommendation, recommendations in (now - window, now]))
                                                                     otherwise (HPA downscale rule)
    desired    = clamp(stabilised, min_replicas, max_replicas)
    desired    = share(every workload's claim, fleet GPUs)[workload]     when the fleet cannot hold
                                                 every desired replica (extender.core.sharing)
    published  = stabilised, or desired when sharing cut it      the value of the desired-replicas
                                                 metric: the HPA clamps to its min/max after its test

Why each rule:

* **Absolute need, counted against ready + starting.** The need is a replica count computed from
  demand, never a multiple of the current count. While replicas start, the same demand gives the
  same need, which already equals ready + starting, so nothing more is asked: the 2->4->8->16
  cascade of vllm-project/aibrix#2670 (pending pods emit no metrics, the ratio stays high, the
  current count is multiplied again) cannot happen. What can grow while replicas start is the
  queue, and with it the drain term: linearly in the backlog, because a larger backlog really does
  need more drain capacity to clear within ``queue_drain_s``. A drain time shorter than a startup
  cannot be met by new replicas anyway; set it to at least the cold startup to damp that growth.
* **Headroom by a target utilisation.** A replica planned at its full capacity queues requests
  whenever arrivals in a tick run above their mean, which Poisson arrivals do half the time;
  ``target_utilization`` below 1 keeps the same margin as the stock HPA's target (an
  ``AverageValue`` of 90 % of a replica's capacity), for the reactive and the forecast need alike.
* **Forecast at the upper quantile, as a floor.** ``desired >= reactive need`` always, so a
  forecast can raise the decision but never lower it (AIBrix ``final = max(reactive, projected)``,
  AWS "will not scale in" on a forecast).
* **Scale down only on observed load.** Because of the max, a recommendation below ``current``
  needs the observed (reactive) need below ``current`` too. Without an observation this tick
  (``demand=None``: scrape failed) the reactive need is unknown, so the decision holds ``current``
  and only the forecast may raise it; nothing is ever removed on missing data.
* **Stabilisation.** A scale-down takes the largest recommendation of the last
  ``stabilisation_s`` seconds, as the HPA's downscale stabilisation does, so a dip shorter than
  the window does not shed capacity that a cold start would take minutes to bring back. Until the
  recommendations cover the whole window (one at or before ``now - window``; e.g. right after the
  first start) there is no evidence the load stayed low for the window, and a scale-down is held.
  A pause in the decisions longer than the window (the scaler down, Redis down, no leader) is such a
  start too: the recommendations before it say nothing about the load since, so the window counts
  only from the first decision after it, and a scale-down is held until that one is at or before
  ``now - window`` (a window between the two would be empty and let one low tick remove replicas).
  A pause no longer than the window (or than two ticks) is not: the recommendations before it are
  still in the window, as in the HPA's own, which never pauses. Scale-ups are not stabilised (the
  HPA default).
* **Tolerance.** The published desired-replicas metric goes through the HPA, which ignores a change
  within its tolerance (``AverageValue`` target: ratio = desired / current, docs/kubernetes-interfaces.md 4.3). The
  decision applies the same test, in the same floating point, so its result is what the HPA will
  actually do and the stabilisation history records effective recommendations. The HPA clamps to
  its ``minReplicas``/``maxReplicas`` after that test, as the decision does, so the metric carries
  the number before the clamp (``published``): given the clamped one, the HPA would test that
  against ``current`` and could stay one short of a bound (a need of 16 clamped to a maximum of 12
  is within 10% of 11 replicas; 16 is not, and the HPA then clamps it to 12 itself). The HPA's
  bounds must be the profile's (docs/scaler.md). A cut by sharing is published as it is: the HPA
  knows nothing of the fleet.

The horizon (:func:`horizon`) is when capacity ordered now can serve::

    horizon_s = startup_s + tick_s + hpa_sync_s

``startup_s``: the estimator's total for the next replica on the node it would land on (warm node:
short, cold: long); ``hpa_sync_s``: the HPA reads the published metric up to one sync period later;
``tick_s``: the next decision is one tick later, so this one must cover demand until that one's
replicas arrive.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from extender.core.errors import InvalidValueError
from extender.core.forecast import Forecast
from extender.core.policy import ReplicaBounds, Scaling

#: The policy's defaults, the one place the decision's knobs get theirs from.
_DEFAULTS = Scaling()

#: ceil() of a need computed as 11.000000000000002 (1.1 / 0.1) must be 11, not 12.
_CEIL_SLACK = 1e-9


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Horizon(_Model):
    """How far ahead this tick must provision, and where that number came from.

    ``node`` / ``node_class``: where the next replica would land (as the extender would score it);
    ``cache``: the cache state the estimate assumed there, in words (``"image, weights, compile
    local"``, ``"cold"``).
    """

    seconds: float = Field(ge=0)
    startup_s: float = Field(ge=0)
    tick_s: float = Field(ge=0)
    hpa_sync_s: float = Field(ge=0)
    node: str | None = None
    node_class: str | None = None
    cache: str = ""


def horizon(startup_s: float, tick_s: float, hpa_sync_s: float, *, node: str | None = None,
            node_class: str | None = None, cache: str = "") -> Horizon:
    """``horizon_s = startup_s + tick_s + hpa_sync_s`` (seconds; reasons in the module docstring)."""
    return Horizon(seconds=startup_s + tick_s + hpa_sync_s, startup_s=startup_s, tick_s=tick_s,
                   hpa_sync_s=hpa_sync_s, node=node, node_class=node_class, cache=cache)


class Recommendation(_Model):
    """One past recommendation (before stabilisation and clamping), at ``at_s`` seconds."""

    at_s: float
    replicas: int = Field(ge=0)


class DecisionInputs(_Model):
    """Everything one decision depends on (units in the module docstring).

    ``demand=None``: no observation this tick. ``forecast=None``: reactive only. ``recent``: past
    recommendations of this workload; keep at least one at or before ``now - stabilisation_s``, with
    no pause longer than the window (or two ticks, ``horizon.tick_s``) between it, the later ones and
    now, or a scale-down is held (the window is not covered).
    """

    workload: str
    now_s: float
    unit: str = "requests/s"
    demand: float | None = Field(ge=0)
    queue: float = Field(default=0.0, ge=0)
    capacity: float = Field(gt=0)
    forecast: Forecast | None = None
    horizon: Horizon
    ready: int = Field(ge=0)
    starting: int = Field(default=0, ge=0)
    min_replicas: int = Field(default=ReplicaBounds.model_fields["min_replicas"].default, ge=0)
    max_replicas: int = Field(ge=1)
    tolerance: float = Field(default=_DEFAULTS.tolerance, ge=0, lt=1)
    stabilisation_s: float = Field(default=_DEFAULTS.scale_down_stabilisation, ge=0)
    queue_drain_s: float = Field(default=_DEFAULTS.queue_drain, gt=0)
    target_utilization: float = Field(default=_DEFAULTS.target_utilization, gt=0, le=1)
    recent: tuple[Recommendation, ...] = ()

    @classmethod
    def for_policy(cls, scaling: Scaling, bounds: ReplicaBounds, **observed: object) -> DecisionInputs:
        """Inputs with the policy's knobs and the workload's bounds; ``observed``: this tick's fields.

        The scaler and the simulator both build their inputs here, so they decide by the same rules.
        """
        return cls.model_validate({
            **observed, "min_replicas": bounds.min_replicas, "max_replicas": bounds.max_replicas,
            "tolerance": scaling.tolerance, "stabilisation_s": scaling.scale_down_stabilisation,
            "queue_drain_s": scaling.queue_drain, "target_utilization": scaling.target_utilization,
        })

    @model_validator(mode="after")
    def _bounds(self) -> DecisionInputs:
        if self.min_replicas > self.max_replicas:
            raise InvalidValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


Action = Literal["scale-up", "scale-down", "hold"]
Driver = Literal["reactive", "forecast", "unobserved"]


class Decision(_Model):
    """The result and every number on the way to it (formulas in the module docstring).

    ``reactive_replicas`` / ``forecast_replicas`` / ``forecast_point_replicas``: fractional needs
    (``None`` when there is no observation / no forecast). ``recommendation`` goes into the
    stabilisation history; ``desired`` is what to publish.
    """

    inputs: DecisionInputs
    current: int
    reactive_replicas: float | None
    forecast_replicas: float | None
    forecast_point_replicas: float | None
    need: float
    driver: Driver
    candidate: int
    within_tolerance: bool
    recommendation: int
    window_max: int | None
    window_covered: bool
    stabilised: int
    desired: int
    action: Action
    reasons: tuple[str, ...]
    #: The desired replicas before a fleet too small cut them (extender.core.sharing); ``None``: not cut.
    unshared: int | None = None

    @property
    def published(self) -> int:
        """The value of the desired-replicas metric: ``stabilised``, before the min/max clamp the HPA
        applies itself, or ``desired`` when sharing cut it (module docstring, "Tolerance")."""
        return self.desired if self.unshared is not None else self.stabilised

    def explain(self) -> str:
        """A few lines for ``extender scale explain``: inputs, needs, horizon provenance, result."""
        i = self.inputs
        h = i.horizon
        where = ", ".join(x for x in (h.node and f"node {h.node}", h.node_class and f"class {h.node_class}",
                                      h.cache and f"cache: {h.cache}") if x) or "no placement given"
        observed = "no observation" if i.demand is None else f"{i.demand:g} {i.unit}, queue {i.queue:g}"
        lines = [
            f"{i.workload}: {self.action} {'at' if self.action == 'hold' else 'to'} {self.desired} "
            f"(current {i.ready} ready + {i.starting} starting)"
            + ("" if self.unshared is None else f", cut from {self.unshared} by sharing the fleet"),
            f"  observed: {observed}; capacity {i.capacity:g} {i.unit} per replica",
            f"  horizon: {h.seconds:g}s = startup {h.startup_s:g}s + tick {h.tick_s:g}s + "
            f"hpa sync {h.hpa_sync_s:g}s ({where})",
        ]
        if i.forecast is not None:
            f = i.forecast
            fell = f" ({f.note})" if f.note else ""
            median = f" (median, shifted {f.median_shift:+g})" if f.median_shift else ""
            basis = (f"from {f.residuals} errors at {f.errors_steps} step(s)" if f.residuals
                     else "no errors yet: the point")
            lines.append(f"  forecast: {f.method}{fell}: point {f.point:g}{median}, p{100 * f.level:g} {f.upper:g} "
                         f"{i.unit} at +{f.lead_s:g}s ({basis})")
            if f.constants:
                consts = ", ".join(f"{k} {v:g}" for k, v in f.constants.items())
                lines.append(f"  constants ({'fitted' if f.fitted else 'fixed'}): {consts}")
        lines += [f"  - {r}" for r in self.reasons]
        return "\n".join(lines)


#: The most replicas a fractional need says (2**53, above the largest ``maxReplicas``, 10**15, so the
#: clamp is what it was): a demand over a capacity small enough overflowed to infinity (1e300 over
#: 1e-10) and capacity x targetUtilization could underflow to 0 (1e-200 each), both accepted by the
#: policy; the decision then failed with a ValueError or a ZeroDivisionError every tick.
MAX_NEED = float(2**53)


def replicas_for(amount: float, usable: float) -> float:
    """``amount / usable`` replicas (``usable = capacity x target_utilization``), at most :data:`MAX_NEED`."""
    if usable <= 0.0:  # underflowed: any demand at all is the most
        return MAX_NEED if amount > 0.0 else 0.0
    return min(amount / usable, MAX_NEED)


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _CEIL_SLACK * max(1.0, abs(x))))


@dataclass(frozen=True)
class _Numbers:
    """Every number of one decision, in the order :func:`decide` reaches them."""

    current: int
    reactive: float | None
    fc: float | None
    fc_point: float | None
    need: float
    driver: Driver
    candidate: int
    within: bool
    recommendation: int
    window_max: int | None
    covered: bool
    #: The pause in the decisions that restarted the window, ``(last before it, first after it)``.
    gap: tuple[float, float] | None
    stabilised: int
    desired: int
    action: Action


def _numbers(i: DecisionInputs) -> _Numbers:
    """The decision's numbers (rules in the module docstring); :func:`decide` adds the reasons."""
    current = i.ready + i.starting
    usable = i.capacity * i.target_utilization
    reactive = None if i.demand is None else replicas_for(i.demand + i.queue / i.queue_drain_s, usable)
    fc = None if i.forecast is None else replicas_for(i.forecast.upper, usable)
    fc_point = None if i.forecast is None else replicas_for(i.forecast.point, usable)

    driver: Driver
    if reactive is None:
        # Nothing observed: never shed capacity on missing data, but a forecast may still raise.
        need = max(float(current), fc or 0.0)
        driver = "forecast" if fc is not None and fc > current else "unobserved"
    else:
        need = max(reactive, fc or 0.0)
        driver = "forecast" if fc is not None and fc > reactive else "reactive"

    candidate = _ceil(need)
    # The HPA's test on our metric (AverageValue 1: ratio = candidate / current), same float maths.
    within = current > 0 and abs(1.0 - candidate / current) <= i.tolerance
    recommendation = current if within else candidate

    cutoff = i.now_s - i.stabilisation_s
    window = [r.replicas for r in i.recent if cutoff < r.at_s <= i.now_s]
    window_max = max(window) if window else None
    since, gap = _since(i)
    covered = i.stabilisation_s == 0 or since <= cutoff
    if recommendation >= current:
        stabilised = recommendation
    elif not covered:
        stabilised = current
    else:
        stabilised = min(current, max(recommendation, window_max if window_max is not None else 0))

    desired = min(max(stabilised, i.min_replicas), i.max_replicas)
    action: Action = "scale-up" if desired > current else "scale-down" if desired < current else "hold"
    return _Numbers(current, reactive, fc, fc_point, need, driver, candidate, within, recommendation, window_max,
                    covered, gap, stabilised, desired, action)


def _gap_s(i: DecisionInputs) -> float:
    """``gap_s = max(stabilisation_s, 2 x tick_s)``: a longer pause between two decisions restarts the window."""
    return max(i.stabilisation_s, 2 * i.horizon.tick_s)


def _since(i: DecisionInputs) -> tuple[float, tuple[float, float] | None]:
    """``since`` of the module docstring, and the last pause longer than :func:`_gap_s` (``None``: none)."""
    times = [*sorted(r.at_s for r in i.recent if r.at_s <= i.now_s), i.now_s]
    longest = _gap_s(i)
    since, gap = times[0], None
    for before, after in itertools.pairwise(times):
        if after - before > longest:
            since, gap = after, (before, after)
    return since, gap


def recommend(inputs: DecisionInputs) -> tuple[int, int, int]:
    """``(recommendation, desired, published)`` of :func:`decide`, without its reasons and record
    (for a loop, such as the simulator's, that reads only these every tick)."""
    n = _numbers(inputs)
    return n.recommendation, n.desired, n.stabilised


def decide(inputs: DecisionInputs) -> Decision:
    """Desired replicas for one workload at ``inputs.now_s`` (rules in the module docstring)."""
    i = inputs
    n = _numbers(i)
    reasons: list[str] = []
    current, reactive, fc = n.current, n.reactive, n.fc
    per = f"{i.capacity:g}" if i.target_utilization == 1 else f"({i.capacity:g} x {i.target_utilization:g})"

    if reactive is not None:
        reasons.append(f"reactive need {reactive:.3g} = ({i.demand:g} + queue {i.queue:g} / "
                       f"{i.queue_drain_s:g}s) / {per}")
    if fc is not None and i.forecast is not None:
        reasons.append(f"forecast need {fc:.3g} = p{100 * i.forecast.level:g} {i.forecast.upper:g} / "
                       f"{per} at +{i.forecast.lead_s:g}s")
        if abs(i.forecast.horizon_s - i.horizon.seconds) > 1e-6:
            reasons.append(f"note: forecast horizon {i.forecast.horizon_s:g}s differs from the decision "
                           f"horizon {i.horizon.seconds:g}s")
    if reactive is None:
        reasons.append(f"no observation this tick: holding {current} unless the forecast needs more")
    if n.within and n.candidate != current:
        reasons.append(f"{n.candidate} is within the {i.tolerance:g} tolerance of {current}: the HPA would "
                       "not act, so holding")
    if n.recommendation < current and not n.covered and n.gap is not None:
        before, after = n.gap
        reasons.append(f"scale-down to {n.recommendation} held: no decision for {after - before:g}s (longer than "
                       f"{_gap_s(i):g}s), so the {i.stabilisation_s:g}s stabilisation window counts from the first "
                       "decision after that pause")
    elif n.recommendation < current and not n.covered:
        reasons.append(f"scale-down to {n.recommendation} held: recommendations do not yet cover the "
                       f"{i.stabilisation_s:g}s stabilisation window")
    elif n.recommendation < current and n.stabilised > n.recommendation:
        reasons.append(f"scale-down limited to {n.stabilised}: the largest recommendation of the last "
                       f"{i.stabilisation_s:g}s")
    if n.desired != n.stabilised:
        bound = "min" if n.desired > n.stabilised else "max"
        reasons.append(f"clamped to {bound}Replicas {n.desired}; published as {n.stabilised}, which the HPA "
                       f"clamps itself after its tolerance test")
    if n.action == "scale-up":
        reasons.append(f"scale-up driven by the {n.driver} need")
    elif n.action == "scale-down":
        reasons.append("scale-down on observed load")
    return Decision(
        inputs=i, current=current, reactive_replicas=reactive, forecast_replicas=fc,
        forecast_point_replicas=n.fc_point, need=n.need, driver=n.driver, candidate=n.candidate,
        within_tolerance=n.within, recommendation=n.recommendation, window_max=n.window_max,
        window_covered=n.covered, stabilised=n.stabilised, desired=n.desired, action=n.action,
        reasons=tuple(reasons),
    )


def prune(recent: Sequence[Recommendation], now_s: float, stabilisation_s: float) -> tuple[Recommendation, ...]:
    """The recommendations still needed: those in the window plus the newest one at or before its start.

    Keeping that one older recommendation is what tells :func:`decide` the window is covered (unless
    a pause longer than the window follows it: module docstring).
    """
    cutoff = now_s - stabilisation_s
    older = [r for r in recent if r.at_s <= cutoff]
    keep = [r for r in recent if r.at_s > cutoff]
    if older:
        keep.insert(0, max(older, key=lambda r: r.at_s))
    return tuple(keep)
