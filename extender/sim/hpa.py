"""The HorizontalPodAutoscaler controller for one External metric with an ``AverageValue`` target.

What the stock HPA does every sync period (``pkg/controller/podautoscaler``; docs/kubernetes-interfaces.md 4.3;
docs/prior-art.md Part B 1.2), with the upstream defaults:

1. Replicas for the metric (``GetExternalPerPodMetricReplicas``), in milli-units::

       ratio = usage / (target x statusReplicas)
       desired = statusReplicas                  if |1 - ratio| <= tolerance (0.1)
               = ceil(usage / target)            otherwise

2. Stabilisation (``stabilizeRecommendationWithBehaviors``): the recommendation is brought within
   ``[min of recommendations in the scale-up window, max of those in the scale-down window]``
   around the current replicas; windows 0 s (up) and 300 s (down). A recommendation counts when it
   is strictly newer than ``now - window``.
3. Rate limits (``convertDesiredReplicasWithBehaviorRate``): scale-up at most to
   ``max(periodStart x 2, periodStart + 4)`` per 15 s (policies Percent 100 and Pods 4, select
   Max); scale-down at most 100 % per 15 s. ``periodStart`` is the current replicas minus the
   scale-ups (plus the scale-downs) of the last period. Then min/max replicas.

``currentReplicas`` is the scale target's ``spec.replicas`` (pods asked for, ready or not);
``statusReplicas`` the pods that exist. This model is the controller, nothing of the simulator:
the simulator calls :meth:`Hpa.sync` every tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

#: HPA defaults (pkg/controller/podautoscaler/config/v1alpha1/defaults.go; HPAScalingRules docs).
TOLERANCE = 0.1
SYNC_PERIOD_S = 15.0
SCALE_DOWN_STABILISATION_S = 300.0


@dataclass(frozen=True)
class ScalingPolicy:
    """``HPAScalingPolicy``: change at most ``value`` pods (or percent) per ``period_s``."""

    kind: Literal["Pods", "Percent"]
    value: int
    period_s: float


@dataclass(frozen=True)
class Rules:
    """``HPAScalingRules``: a stabilisation window and rate policies, combined by ``select``."""

    stabilisation_s: float
    policies: tuple[ScalingPolicy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"


#: The default behaviour: "allow doubling the number of pods, or an absolute change of 4 pods in a
#: 15s window" up, no stabilisation; down: remove all in 15 s, after 300 s of stabilisation.
DEFAULT_SCALE_UP = Rules(0.0, (ScalingPolicy("Pods", 4, 15.0), ScalingPolicy("Percent", 100, 15.0)))
DEFAULT_SCALE_DOWN = Rules(SCALE_DOWN_STABILISATION_S, (ScalingPolicy("Percent", 100, 15.0),))


def to_milli(value: float) -> int:
    """A quantity's ``MilliValue()``: milli-units, rounded up."""
    return math.ceil(value * 1000 - 1e-9)


def replicas_for_external(usage_milli: int, target_milli: int, status_replicas: int, tolerance: float) -> int:
    """Step 1: ``GetExternalPerPodMetricReplicas`` (AverageValue target)."""
    if status_replicas > 0:
        ratio = usage_milli / (target_milli * status_replicas)
        if abs(1.0 - ratio) <= tolerance:
            return status_replicas
    return math.ceil(usage_milli / target_milli)


@dataclass
class Hpa:
    """One HPA's controller state: past recommendations and scale events (upstream keeps the same)."""

    min_replicas: int
    max_replicas: int
    tolerance: float = TOLERANCE
    up: Rules = DEFAULT_SCALE_UP
    down: Rules = DEFAULT_SCALE_DOWN
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)

    def sync(self, now: float, current: int, status_replicas: int, usage: float, target: float) -> int:
        """The replicas the HPA sets this sync (``reconcileAutoscaler`` for one metric)."""
        if current == 0 and self.min_replicas != 0:
            return 0  # scaling is disabled for a target scaled to zero by hand
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            proposal = replicas_for_external(to_milli(usage), to_milli(target), status_replicas, self.tolerance)
            desired = self._normalise(now, current, proposal)
        if desired != current:
            events = self.up_events if desired > current else self.down_events
            events.append((now, abs(desired - current)))
        self._forget(now)
        return desired

    def _normalise(self, now: float, current: int, desired: int) -> int:
        """Steps 2 and 3 (``normalizeDesiredReplicasWithBehaviors``)."""
        up_cut, down_cut = now - self.up.stabilisation_s, now - self.down.stabilisation_s
        up_rec = desired
        down_rec = desired
        for at, rec in self.recommendations:
            if at > up_cut:
                up_rec = min(rec, up_rec)
            if at > down_cut:
                down_rec = max(rec, down_rec)
        stabilised = min(max(current, up_rec), down_rec)
        self.recommendations.append((now, desired))
        if stabilised > current:
            limit = max(self._limit(now, current, self.up, up=True), current)
            return min(stabilised, self.max_replicas, limit)
        if stabilised < current:
            limit = min(self._limit(now, current, self.down, up=False), current)
            return max(stabilised, self.min_replicas, limit)
        return stabilised

    def _limit(self, now: float, current: int, rules: Rules, *, up: bool) -> int:
        """``calculateScale{Up,Down}Limit...``: the furthest the policies allow from the period start."""
        if rules.select == "Disabled":
            return current
        proposals: list[int] = []
        for p in rules.policies:
            added = sum(n for at, n in self.up_events if at > now - p.period_s)
            removed = sum(n for at, n in self.down_events if at > now - p.period_s)
            start = current - added + removed
            if up:
                proposals.append(start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100)))
            else:
                proposals.append(start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100)))
        # up: Max picks the largest change (largest count); down: Max picks the largest change (smallest count)
        if up:
            return max(proposals) if rules.select == "Max" else min(proposals)
        return min(proposals) if rules.select == "Max" else max(proposals)

    def _forget(self, now: float) -> None:
        """Drop what no window or period can see any more (upstream reuses such slots)."""
        keep = max(self.up.stabilisation_s, self.down.stabilisation_s)
        self.recommendations = [r for r in self.recommendations if r[0] > now - keep]
        longest = max((p.period_s for p in (*self.up.policies, *self.down.policies)), default=0.0)
        self.up_events = [e for e in self.up_events if e[0] > now - longest]
        self.down_events = [e for e in self.down_events if e[0] > now - longest]
