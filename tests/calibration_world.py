"""A world whose true phase times differ from the policy's, and the starts it produces (for calibration tests).

The world is the policy with true factors applied by the same function calibration applies fits
with (:func:`extender.core.calibration.apply_calibration`); a start's duration is the world's
estimate in its node's cache state, times a log-normal noise factor.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from extender.core.calibration import PARAMETERS, Fit, Observation, apply_calibration, parameters_named
from extender.core.estimate import STATES, CacheState, NamedState, estimate
from extender.core.policy import Policy
from extender.state import InventoryStore

if TYPE_CHECKING:
    from extender.api.scheduler.refresher import Refresher

#: The named cache states a fleet without snapshots starts replicas in.
STARTS = ("cold", "image", "image+weights", "warm")
_WORDS = {0: "absent", 1: "registry", 2: "local"}


def factors(**by_name: float) -> tuple[float, ...]:
    """A factor per parameter (``PARAMETERS``, or ``engine``: graph capture and engine init), 1 where not given."""
    f = [1.0] * len(PARAMETERS)
    for name, value in by_name.items():
        assert parameters_named(name), name
        for j in parameters_named(name):
            f[j] = float(value)
    return tuple(f)


def world(policy: Policy, workload: str, node_class: str, truth: Sequence[float]) -> Policy:
    """The policy with the true factors of one (workload, class) applied."""
    fit = Fit(workload, node_class, 1, tuple(truth), (0.0,) * len(PARAMETERS), (0.0,) * len(PARAMETERS),
              (1e9,) * len(PARAMETERS), 0.0, 0.0, 0.0, 0, True)
    return apply_calibration(policy, [fit])


def state_of(policy: Policy, workload: str, named: NamedState) -> CacheState:
    p = policy.profile(workload)
    return CacheState(np.array([named.image]), np.array([float(p.weights.bytes) if named.weights else 0.0]),
                      np.array([int(named.compile)], dtype=np.int8), np.array([named.snapshot]), np.zeros(1),
                      np.full((1, len(p.preloaded_adapters)), named.adapters))


def true_seconds(truth: Policy, workload: str, node_class: str, state: str) -> float:
    """The world's startup of one named state."""
    est = estimate(truth.profile(workload), [truth.node_class(node_class)], np.zeros(1, dtype=np.intp),
                   state_of(truth, workload, STATES[state]))
    return float(est.total_s[0])


def starts(policy: Policy, truth: Policy, workload: str, node_class: str, states: Sequence[str], *,
           noise: float = 0.05, seed: int = 0, t0: float = 1.7e9) -> list[Observation]:
    """One observed start per entry of ``states``, a minute apart, with log-normal noise ``noise``."""
    rng = np.random.default_rng(seed)
    p = policy.profile(workload)
    out: list[Observation] = []
    for i, name in enumerate(states):
        named = STATES[name]
        seconds = true_seconds(truth, workload, node_class, name) * float(np.exp(rng.normal(0.0, noise)))
        at = t0 + 60.0 * i
        out.append(Observation(
            pod=f"serving/{workload}-{i}", workload=workload, node=f"node-{i % 7}", node_class=node_class,
            image_reference=p.image.reference, weights_version=p.weights.version, image=named.image,
            weights_bytes=float(p.weights.bytes) if named.weights else 0.0, compile=_WORDS[int(named.compile)],
            snapshot=named.snapshot, adapters=(named.adapters,) * len(p.preloaded_adapters), scheduled_at=at,
            ready_at=at + seconds))
    return out


def round_robin(n: int, states: Sequence[str] = STARTS) -> list[str]:
    """``n`` start states cycling through ``states``."""
    return [states[i % len(states)] for i in range(n)]


def refresher_on(client: Any, directory: Path, policy_text: str, policy: Policy) -> Refresher:
    """The scheduler extender's refresher (not started) on ``client``, serving ``policy`` (parsed from
    ``policy_text``, written to ``directory``), that rebuilds and refits on every ``refresh_once`` (no
    interval, no duty factor)."""
    from extender.api.scheduler.metrics import Metrics
    from extender.api.scheduler.refresher import Refresher, Throttle
    from extender.api.scheduler.settings import Settings

    path = directory / "policy.yaml"
    path.write_text(policy_text)
    settings = Settings(policy_path=path, policy=policy, store_factory=lambda: InventoryStore(client),
                        start_refresher=False, min_rebuild_interval_s=0.0, calibration_interval_s=0.0,
                        calibration_duty_factor=0.0)
    return Refresher(settings, policy, Metrics(), Throttle(60.0))
