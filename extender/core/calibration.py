"""Calibration: the startup phases learnt from the replicas the cluster starts (pure).

Every new replica is a measurement. ``extender sync`` records where it landed, what its node held
for it when it was scheduled (from the inventory) and when it became Ready
(:class:`Observation`); this module fits the estimator's parameters to those observations, per
(workload, node class), and :func:`apply_calibration` writes the fit into a policy as per-class
overrides, which is all the extender, the scaler and the warmer need (they take a policy). Besides,
each node gets a factor on its whole startup against its class's peers (:func:`fit_nodes`, "Per-node
factors" below), which the consumers that estimate named nodes take alongside the policy
(:func:`effective_calibration`).

The model. Given the cache state, the estimator (:mod:`extender.core.estimate`) is linear in eight
unknown *factors* ``m`` on the policy's seconds. For observation i on class c (policy values
``pull, remote_bps, local_bps, cold, warm, graph, init, restore`` of that class)::

    T_i = o_i + sum_j a_ij m_j                                       seconds
    a_i,imagePull       = [image absent] x image_bytes / pull
    a_i,weightsRemote   = remote_bytes_i / remote_bps                remote_bps = min(nic, streams x stream_bps)
                          (+ local_bytes_i / remote_bps when remote_bps > nvme_bps)
    a_i,weightsLocal    = local_bytes_i / nvme_bps  when nvme_bps >= remote_bps, else 0
    a_i,compileCold     = [compiles from scratch] x cold
    a_i,compileWarm     = [cache on the node, or fetched] x warm
    a_i,graphCapture    = [no snapshot restore] x graph
    a_i,engineInit      = [no snapshot restore] x init
    a_i,snapshotRestore = [snapshot restore] x restore
    o_i = queue wait + registry fetch transfer + snapshot read + LoRA adapters
                                                                     (policy values, not fitted)

``m = 1`` is the policy: with it, ``o_i + sum_j a_ij`` is exactly the estimator's total (a test holds
the two together). Which path a start took (registry fetch or compile, snapshot or not) is the
estimator's own choice, re-evaluated with the current factors.

Local weights. The estimator reads them at ``local_bps = max(nvme_bps, remote_bps)``. When the
network is the faster, the local bytes go at the remote rate: they are in the ``weightsRemote``
column, ``weightsLocal`` (the NVMe read) has no column and keeps the policy's value, and applying a
fit never writes the NVMe read (:func:`_override`). Which side of the max applies is decided at the
policy's rates: a fit that moves the remote rate across the NVMe rate is applied through the
estimator's max, so for those starts the applied estimate and ``design`` part.

The fit. Errors are relative (a 10 s miss on a 30 s start matters as much as 100 s on 300 s), so
each row is divided by the policy's estimate ``P_i``: ``x_ij = a_ij / P_i``, ``y_i = (T_i - o_i) / P_i``.
Then::

    m = argmin  sum_i w_i (y_i - x_i . m)^2  +  sum_j lambda_j (m_j - 1)^2     lo_j <= m_j <= hi_j
    lambda_j = k x s_j

``k`` is ``calibration.priorObservations`` and ``s_j`` the share of phase j in the policy's estimate
of the named cache state where that phase is largest (cold for the pull, the remote weights and the
cold compile; warm for local weights, warm compile, graph capture and engine init; snapshot for the restore): the
policy's value weighs as much as k observed starts in that state, so a few observations cannot
swing it, and with one phase and n observations the fit moves ``n / (n + k)`` of the way to them.
``w_i`` are Huber weights (``c = 1.345`` robust scales, the scale being 1.4826 x the median absolute
residual, at least :data:`NOISE_FLOOR`), found by iteratively reweighted least squares; each
weighted problem is a convex quadratic in a box, solved exactly (:func:`box_ridge`). Bounds are
the policy's ``calibration.bounds`` factors, and for ``weightsRemote`` also ``m >= remote_bps / nic``
(no fit makes a download faster than the NIC).

Confidence of a parameter is the share of its prior variance the observations removed::

    confidence_j = 1 - lambda_j [(X^T X + Lambda)^-1]_jj          in [0, 1)

computed from the design alone (unit weights, paths of the policy): it grows with the number of
observations that involve the parameter and with their variety (collinear columns share what they
teach), never with how well they happen to agree, so more observations never lower it.

Engine phase times. A start may also carry what its engine (vLLM, SGLang) logged of its phases
(:attr:`Observation.phases`, read by :mod:`extender.core.enginelog`). Each phase it measured adds
one row in only that phase's columns, with no offset, on the start's path at the current factors::

    W_i = a_i,weightsRemote m_weightsRemote + a_i,weightsLocal m_weightsLocal     weights load
    C_i = a_i,compileCold m_compileCold + a_i,compileWarm m_compileWarm           torch.compile
    G_i = a_i,graphCapture m_graphCapture                                         graph capture
    I_i = a_i,engineInit m_engineInit                   I_i = initEngine - compile - graphCapture
    E_i = a_i,graphCapture m_graphCapture + a_i,engineInit m_engineInit           E_i = initEngine - compile

vLLM's ``initEngine`` span holds the compile and the graph capture: with a capture time it gives
``G_i`` and ``I_i`` (no ``I_i`` when the difference is not positive: the capture is logged in whole
seconds); without one, the one row ``E_i`` of both. Each row is scaled relatively like the totals'
rows, by the policy's seconds of that phase on that start ``Q_i = sum over the row's columns of
a_ij`` (factors 1, the policy's path): ``x_ij = a_ij / Q_i``, ``y = W_i / Q_i`` (``C_i``, ...).
They join the sums of the weighted problem above; their Huber weights are computed the same way,
each kind of row (totals, weights, compile, engine, capture, init) with its own robust scale, as
each is measured with its own noise. A row is left out when ``Q_i`` is 0 (the policy gives the
start no such phase: a snapshot restore) or the current path gives it no seconds; a compile row
when vLLM's cache hit or miss disagrees with the estimator's path (it would measure the other
compile; an unknown hit or miss, as in every SGLang log, disagrees with nothing); an engine or
init row when the start compiles but its log gave no compile time (``initEngine`` holds the
compile); and a capture row when the start compiles and the log gave no
``initEngine`` (SGLang's, whose capture may hold the compile: piecewise graphs, plain
``--enable-torch-compile``; vLLM's capture never does). ``confidence`` takes the rows into ``X``
(policy paths): a phase row weighs like a start made of that phase alone.

Graph capture and engine init. Both columns are ``[no restore]`` times a constant of the class, so
only capture and init rows tell them apart. Without those rows the fit is exactly the one-factor
fit of ``graph + init`` (the model before they were fitted apart): their priors ``k x s_j`` are in
the policy's proportions (both shares above :data:`MIN_SHARE`), so the factors stay equal, and
each one's confidence is its share ``graph / (graph + init)`` (``init / ...``) of that factor's.

Per-node factors. The fit above is per (workload, class): every node of a class gets its estimate.
A node that starts every replica slower than its peers (a degraded NVMe, a throttled NIC, a bad
PCIe link) is learnt as one factor ``r_n`` on its whole estimated startup. For start i on node n of
pair p (the starts the pair's fit used: same window and maxAge), with ``E_i`` the estimate of the
calibrated policy (the pair's fit applied when it is) for the node's state then::

    z_i  = ln(T_i / E_i) - c_p              c_p = median over the pair's starts of ln(T_i / E_i)
    m_n  = n / (n + k) x median_{i on n} z_i                         k = priorObservations
    u_n  = sign(m_n) x max(|m_n| - d, 0)                             d = ln 1.01 (NODE_DEADBAND)
    r_n  = clip(exp(u_n), lo, hi)                                    calibration.bounds.node
    confidence_n = n / (n + k)

``c_p`` centres each pair on its typical start, so ``r_n`` is the node against its peers of the
same workload and class, not the class fit's own error again (a fit shrunk toward the policy leaves
every start of the pair with the same residual, which is no node's doing). The median over all
workloads of the node's centred residuals is robust to a stray slow start, and the prior shrinks
it as the class fit's prior does (``k`` starts at the peers' speed: one start moves ``m`` by
``1 / (1 + k)`` of its residual). The dead band ``d`` (soft, so ``r`` stays continuous) leaves
differences under 1 % alone: a start's times have a resolution of a second, and a factor that
moves no decision would still make each engine's scores differ from its class's. A node with no
starts, or one no fit knows, has ``r = 1``. The factors multiply the node's estimate wherever a
node is estimated by name (the extender's scores and filter, ``extender explain``); the class fit
stays what a class-level estimate uses.

Feedback: a node that is estimated slower gets fewer starts, so fewer new starts can clear its
name. Its old starts still leave the pair's window (the newest ``window`` of the pair, pushed out
by its peers' starts) and expire at ``maxAge``; with none left ``r`` is 1 again, and the node is
scored as its class until new starts say otherwise. The shrinkage keeps a node from being sent away
on one or two slow starts, and the bounds cap what any evidence can do.

Identifiability. The peers are the pair's typical start: a pair whose starts mostly come from one
node cannot tell that node from its class (the class fit takes its speed, ``r`` stays near 1).
One factor per node: a node slow for one workload only (a cache directory of one model on a bad
disk) has that workload's residuals diluted by the others', and is not modelled.

Identifiability (docs/calibration.md): a fleet that is always warm never pulls an image, streams
weights or compiles from scratch, so those factors keep the policy's value and a confidence of 0;
and warm compile, local weights, graph capture and engine init, always seen together in warm
starts, are told apart from totals only by the prior (a discrepancy no observation can attribute
is shared among them equally in seconds), and by the engine phase times of the starts that report
them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict, Field, model_validator

from extender.core.enginelog import EnginePhases
from extender.core.errors import InvalidValueError
from extender.core.estimate import STATES, CacheState, ClassTable, CompileCache, estimate
from extender.core.inventory import InventorySnapshot
from extender.core.policy import NodeClass, PhaseOverride, Policy, Profile
from extender.core.schema import Schema, Text

F64 = NDArray[np.float64]

#: The fitted parameters, in column order (camelCase as in ``calibration.bounds``).
PARAMETERS = ("imagePull", "weightsRemote", "weightsLocal", "compileCold", "compileWarm", "graphCapture",
              "engineInit", "snapshotRestore")
_FIELDS = ("image_pull", "weights_remote", "weights_local", "compile_cold", "compile_warm", "graph_capture",
           "engine_init", "snapshot_restore")
IMAGE, REMOTE, LOCAL, COLD, WARM, GRAPH, INIT, RESTORE = range(len(PARAMETERS))
#: Names that stand for several parameters: ``engine``, graph capture and engine init together (one
#: factor before they were fitted apart), as a scenario's ``truth`` may still say.
ALIASES = {"engine": ("graphCapture", "engineInit")}


def parameters_named(name: str) -> tuple[int, ...]:
    """The columns a name stands for: its parameter's, or an alias's (:data:`ALIASES`); none for an unknown name."""
    return tuple(PARAMETERS.index(n) for n in ALIASES.get(name, (name,)) if n in PARAMETERS)
#: What each parameter is shown as: a bandwidth (seconds per byte inverted) or seconds.
BANDWIDTH_PARAMETERS = frozenset({IMAGE, REMOTE, LOCAL})

#: Smallest robust scale of relative residuals (2 %): timestamps have a resolution of one second,
#: and a handful of identical observations must not make every other one an outlier.
NOISE_FLOOR = 0.02
#: Huber's tuning constant (95 % efficiency under normal errors).
HUBER_C = 1.345
#: IRLS rounds at most, and the change in every factor below which it stops.
MAX_ROUNDS = 50
TOLERANCE = 1e-7
#: A share below this counts as this much in ``lambda_j`` (a phase absent from every named state
#: still has a finite prior).
MIN_SHARE = 1e-2

CompileWord = Literal["absent", "registry", "local"]
_COMPILE = {"absent": CompileCache.ABSENT, "registry": CompileCache.REGISTRY, "local": CompileCache.LOCAL}
Seconds = Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)]
Amount = Annotated[float, Field(ge=0, le=2.0**60, allow_inf_nan=False)]


class Observation(Schema):
    """One replica's start: where, what its node held for it when it was scheduled, and its times.

    Times are unix seconds from the pod's status as the sync saw it turn Ready (each field says
    which part of it). ``imageReference`` and ``weightsVersion`` are the
    profile's when the start was observed: a fit uses only starts of the image and weights the
    profile names now (a new engine version may compile for longer; its old starts say nothing).
    """

    model_config = ConfigDict(populate_by_name=True)

    pod: Text = Field(min_length=1)
    workload: Text = Field(min_length=1)
    node: Text = Field(min_length=1)
    node_class: Text = Field(min_length=1)
    image_reference: Text = ""
    weights_version: Text = ""
    image: bool = False
    weights_bytes: Amount = 0.0
    compile: CompileWord = "absent"
    snapshot: bool = False
    queued_bytes: Amount = 0.0
    #: Per preloaded LoRA adapter of the profile (in its order): on the node or not.
    adapters: tuple[bool, ...] = ()
    #: Age of the node's inventory record when the state above was read.
    inventory_age: Seconds = 0.0
    #: The ``PodScheduled`` condition's last transition.
    scheduled_at: Seconds
    #: The earliest ``state.running.startedAt`` among the pod's app containers running when the sync
    #: saw it Ready (init containers and sidecars not counted): the start of the containers of that
    #: moment, so after a container restarted before Ready (a crash, an OOM kill) the restart's
    #: time, not the pod's first container start; ``None`` when the status gave none. Stored for
    #: reading a start, never fitted: the fit takes ``readyAt - scheduledAt`` alone.
    started_at: Seconds | None = None
    #: The ``Ready`` condition's last transition (the sync's clock if the status gave none).
    ready_at: Seconds
    #: What the engine logged of its phases (:mod:`extender.core.enginelog`); ``None`` when its log
    #: was not read. Each phase it gives is one more row of the fit (module docstring).
    phases: EnginePhases | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Observation:
        if self.ready_at < self.scheduled_at:
            raise InvalidValueError("readyAt is before scheduledAt")
        return self

    @property
    def total_s(self) -> float:
        """Seconds from scheduled to Ready: what the estimator estimates."""
        return self.ready_at - self.scheduled_at

    def matches(self, profile: Profile) -> bool:
        """True when the start was of the image, weights and number of adapters the profile names now."""
        return (self.image_reference == profile.image.reference and self.weights_version == profile.weights.version
                and len(self.adapters) == len(profile.preloaded_adapters))


def cache_state(observations: Sequence[Observation]) -> CacheState:
    """The estimator's cache-state columns of the observations' nodes at scheduling time (same adapter count)."""
    width = len(observations[0].adapters) if observations else 0
    return CacheState(
        image=np.array([o.image for o in observations], dtype=np.bool_),
        weights_bytes=np.array([o.weights_bytes for o in observations], dtype=np.float64),
        compile=np.array([int(_COMPILE[o.compile]) for o in observations], dtype=np.int8),
        snapshot=np.array([o.snapshot for o in observations], dtype=np.bool_),
        queued_bytes=np.array([o.queued_bytes for o in observations], dtype=np.float64),
        adapters=np.array([o.adapters for o in observations], dtype=np.bool_).reshape(len(observations), width),
    )


# ---------------------------------------------------------------------------------------------
# The design: the estimator, written as offset + columns x factors
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Design:
    """``T = offset + columns @ m`` for n starts (columns: n x 7 seconds at m = 1)."""

    columns: F64
    offset: F64

    def total(self, m: F64) -> F64:
        """Estimated seconds with factors ``m``."""
        return np.asarray(self.offset + self.columns @ m, dtype=np.float64)


def design(profile: Profile, node_class: NodeClass, state: CacheState, m: F64 | None = None) -> Design:
    """The estimator of ``profile`` on ``node_class`` as offsets and columns, paths chosen with ``m``.

    Mirrors :func:`extender.core.estimate.estimate` phase by phase (module docstring); with
    ``m = 1`` the total equals it. The LoRA adapters' phase is the estimator's own, at the policy's
    values (an offset: not fitted).
    """
    f = np.ones(len(PARAMETERS)) if m is None else np.asarray(m, dtype=np.float64)
    t = ClassTable.build(profile, [node_class])
    adapters_s = estimate(profile, [node_class], np.zeros(len(state), dtype=np.intp), state, t).adapters_s
    fetched = ~state.adapters.all(axis=1) if state.adapters.shape[1] else np.zeros(len(state), dtype=np.bool_)
    nvme, nic, stream, pull = float(t.nvme_bps[0]), float(t.nic_bps[0]), float(t.stream_bps[0]), float(t.pull_bps[0])
    n = len(state)
    cols = np.zeros((n, len(PARAMETERS)))
    cols[:, IMAGE] = np.where(state.image, 0.0, float(profile.image.size) / pull)
    total_bytes = float(profile.weights.bytes)
    local = np.clip(state.weights_bytes, 0.0, total_bytes)
    remote = total_bytes - local
    remote_bps = min(nic, profile.weights.streams * stream)
    if nvme >= remote_bps:  # NVMe-bound: the local bytes are the NVMe read's
        cols[:, REMOTE] = remote / remote_bps
        cols[:, LOCAL] = local / nvme
    else:  # local_bps = remote_bps: the local bytes go at the remote rate too
        cols[:, REMOTE] = (remote + local) / remote_bps

    cold, warm = float(t.compile_cold_s[0]), float(t.compile_warm_s[0])
    waiting = np.maximum(state.queued_bytes, 0.0) / nic
    downloads = ~state.image | (remote > 0) | fetched
    transfer = float(profile.compile.artifact_bytes) / min(nic, stream)
    extra_queue = np.where(downloads, 0.0, waiting)
    use_fetch = (state.compile == CompileCache.REGISTRY) & (extra_queue + transfer + warm * f[WARM] < cold * f[COLD])
    warm_path = (state.compile == CompileCache.LOCAL) | use_fetch
    cols[:, COLD] = np.where(warm_path, 0.0, cold)
    cols[:, WARM] = np.where(warm_path, warm, 0.0)
    cols[:, GRAPH] = float(t.graph_s[0])
    cols[:, INIT] = float(t.init_s[0])
    offset = np.where(downloads | use_fetch, waiting, 0.0) + np.where(use_fetch, transfer, 0.0) + adapters_s

    if profile.snapshot is not None:
        normal = offset + cols @ f
        read = float(profile.snapshot.bytes) / nvme
        restore = float(t.restore_s[0])
        snap_offset = np.where(state.image & ~fetched, 0.0, waiting) + read + adapters_s
        snap_total = snap_offset + cols[:, IMAGE] * f[IMAGE] + restore * f[RESTORE]
        use = state.snapshot & (snap_total < normal)
        for j in (REMOTE, LOCAL, COLD, WARM, GRAPH, INIT):
            cols[:, j] = np.where(use, 0.0, cols[:, j])
        cols[:, RESTORE] = np.where(use, restore, 0.0)
        offset = np.where(use, snap_offset, offset)
    return Design(cols, offset)


def _named_shares(profile: Profile, node_class: NodeClass) -> F64:
    """``s_j``: each phase's largest share of the policy's estimate over the named cache states."""
    named = [s for s in STATES.values() if not s.snapshot or profile.snapshot is not None]
    width = len(profile.preloaded_adapters)
    state = CacheState(
        image=np.array([s.image for s in named], dtype=np.bool_),
        weights_bytes=np.array([profile.weights.bytes if s.weights else 0 for s in named], dtype=np.float64),
        compile=np.array([int(s.compile) for s in named], dtype=np.int8),
        snapshot=np.array([s.snapshot for s in named], dtype=np.bool_),
        queued_bytes=np.zeros(len(named)),
        adapters=np.array([[s.adapters] * width for s in named], dtype=np.bool_).reshape(len(named), width),
    )
    d = design(profile, node_class, state)
    totals = np.maximum(d.total(np.ones(len(PARAMETERS))), 1e-9)
    return np.asarray(np.maximum((d.columns / totals[:, None]).max(axis=0), MIN_SHARE), dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The fit
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """The calibrated factors of one (workload, node class), with what they rest on.

    ``factors[j]`` multiplies the policy's seconds of parameter j (``PARAMETERS``); ``confidence[j]``
    is in [0, 1). ``error_policy`` / ``error_fit``: median absolute relative error of the policy's and
    the fit's estimates over the observations used. ``applied``: enough observations to apply.
    """

    workload: str
    node_class: str
    observations: int
    factors: tuple[float, ...]
    confidence: tuple[float, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    spread: float
    error_policy: float
    error_fit: float
    rounds: int
    applied: bool

    def factor(self, name: str) -> float:
        """The factor of a parameter by name."""
        return self.factors[PARAMETERS.index(name)]


def _bounds(policy: Policy, profile: Profile, node_class: NodeClass) -> tuple[F64, F64]:
    bounds = policy.calibration.bounds
    lo = np.array([bounds.of(f).min for f in _FIELDS])
    hi = np.array([bounds.of(f).max for f in _FIELDS])
    t = ClassTable.build(profile, [node_class])
    remote_bps = min(float(t.nic_bps[0]), profile.weights.streams * float(t.stream_bps[0]))
    lo[REMOTE] = max(lo[REMOTE], remote_bps / float(t.nic_bps[0]))
    return lo, hi


#: The kinds of phase rows, and the columns each is an equation in (an engine row: graph capture and
#: engine init together, from a log that gave no capture time).
PHASE_COLUMNS: tuple[tuple[int, ...], ...] = ((REMOTE, LOCAL), (COLD, WARM), (GRAPH, INIT), (GRAPH,), (INIT,))
WEIGHTS_ROW, COMPILE_ROW, ENGINE_ROW, CAPTURE_ROW, INIT_ROW = range(len(PHASE_COLUMNS))


@dataclass(frozen=True)
class PhaseRows:
    """The engine phase times of a fit's starts as rows (module docstring, "Engine phase times").

    One entry per measured phase: the start it is of (``start``, a row of the design), its kind,
    the seconds the engine logged, ``Q_i`` (the policy's seconds of that phase on that start) and,
    for compile rows, vLLM's cache hit (1), miss (0) or unknown (-1: SGLang logs neither).
    """

    start: NDArray[np.intp]
    kind: NDArray[np.intp]
    seconds: F64
    scale: F64
    cached: NDArray[np.int8]

    @classmethod
    def of(cls, observations: Sequence[Observation], policy_columns: F64) -> PhaseRows:
        """The rows of the starts' measured phases whose policy seconds ``Q_i`` are positive."""
        rows: list[tuple[int, int, float, float, int]] = []
        # Q_i of every kind of row on every start, in one pass over the columns (a numpy call per row
        # was most of a refit's time at thousands of starts with logged phases)
        scales: list[list[float]] = np.stack([policy_columns[:, list(cols)].sum(axis=1) for cols in PHASE_COLUMNS],
                                             axis=1).tolist()
        for i, o in enumerate(observations):
            phases = o.phases
            if phases is None:
                continue
            cached = -1 if phases.compile_cached is None else int(phases.compile_cached)
            compiles = scales[i][COMPILE_ROW] > 0
            # initEngine holds the compile: without its time, the engine's seconds are not known
            engine = phases.engine_s if phases.compile is not None or not compiles else None
            # vLLM's capture (the log has initEngine) holds no compile; SGLang's may, and logs no time of it
            capture = phases.graph_capture if phases.init_engine is not None or not compiles else None
            parts: tuple[tuple[int, float | None], ...]
            if engine is not None and capture is not None:  # initEngine holds the capture too
                rest = engine - capture
                parts = ((CAPTURE_ROW, capture), (INIT_ROW, rest if rest > 0 else None))
            else:
                parts = ((ENGINE_ROW, engine), (CAPTURE_ROW, capture))
            for kind, seconds in ((WEIGHTS_ROW, phases.weights_load), (COMPILE_ROW, phases.compile), *parts):
                scale = scales[i][kind]
                if seconds is not None and scale > 0:
                    rows.append((i, kind, seconds, scale, cached))
        return cls(np.array([r[0] for r in rows], dtype=np.intp), np.array([r[1] for r in rows], dtype=np.intp),
                   np.array([r[2] for r in rows], dtype=np.float64), np.array([r[3] for r in rows], dtype=np.float64),
                   np.array([r[4] for r in rows], dtype=np.int8))

    def __len__(self) -> int:
        return len(self.start)

    def rows(self, columns: F64) -> tuple[F64, F64, NDArray[np.bool_]]:
        """``x``, ``y`` and which rows count, with the design's ``columns`` (its paths)."""
        x = np.zeros((len(self), columns.shape[1]))
        for kind, cols in enumerate(PHASE_COLUMNS):
            mine = self.kind == kind
            for j in cols:
                x[mine, j] = columns[self.start[mine], j]
        live = x.sum(axis=1) > 0
        warm_path = columns[self.start, WARM] > 0
        disagrees = (self.kind == COMPILE_ROW) & (self.cached >= 0) & ((self.cached == 1) != warm_path)
        live &= ~disagrees
        return x / self.scale[:, None], self.seconds / self.scale, live


def _huber(residual: F64) -> tuple[float, F64]:
    """The robust scale of ``residual`` and their Huber weights (module docstring)."""
    scale = max(1.4826 * float(np.median(np.abs(residual))), NOISE_FLOOR)
    cut = HUBER_C * scale
    return scale, np.where(np.abs(residual) <= cut, 1.0, cut / np.maximum(np.abs(residual), 1e-300))


def _phase_weights(rows: PhaseRows, residual: F64, live: NDArray[np.bool_]) -> F64:
    """Huber weights of the phase rows, each kind with its own scale; 0 for rows that do not count."""
    weights = np.zeros(len(rows))
    for kind in range(len(PHASE_COLUMNS)):
        mine = (rows.kind == kind) & live
        if mine.any():
            weights[mine] = _huber(residual[mine])[1]
    return weights


def box_ridge(q: F64, b: F64, lo: F64, hi: F64, start: F64, *, sweeps: int = 500) -> F64:
    """``argmin 1/2 m^T Q m - b^T m`` over ``lo <= m <= hi`` by coordinate descent (Q positive definite).

    When the unconstrained minimum ``Q^-1 b`` is inside the box it is the answer. Otherwise each
    step sets one coordinate to its exact minimiser given the others, clipped to its box; on a
    strictly convex quadratic the sweeps converge to the unique constrained minimum (slowly along
    nearly collinear columns, as graph capture and engine init are without capture rows).
    """
    inside = np.linalg.solve(q, b)
    if np.all((lo <= inside) & (inside <= hi)):
        return np.asarray(inside, dtype=np.float64)
    m = np.clip(np.asarray(start, dtype=np.float64).copy(), lo, hi)
    diag = np.diag(q)
    for _ in range(sweeps):
        change = 0.0
        for j in range(len(m)):
            value = (b[j] - q[j] @ m + diag[j] * m[j]) / diag[j]
            value = min(max(value, lo[j]), hi[j])
            change = max(change, abs(value - m[j]))
            m[j] = value
        if change < 1e-12:
            break
    return m


def confidence(x: F64, lam: F64) -> F64:
    """``1 - lambda_j [(X^T X + Lambda)^-1]_jj`` per parameter (module docstring)."""
    precision = x.T @ x + np.diag(lam)
    cov = np.linalg.inv(precision)
    return np.asarray(np.clip(1.0 - lam * np.diag(cov), 0.0, 1.0), dtype=np.float64)


def fit_pair(policy: Policy, profile: Profile, node_class: NodeClass, observations: Sequence[Observation]) -> Fit:
    """Fit the factors of one (profile, node class) to its observations (formulas in the module docstring)."""
    settings = policy.calibration
    p = len(PARAMETERS)
    ones = np.ones(p)
    lo, hi = _bounds(policy, profile, node_class)
    lam = settings.prior_observations * _named_shares(profile, node_class)
    n = len(observations)
    if n == 0:
        return Fit(profile.name, node_class.name, 0, tuple(ones), tuple(np.zeros(p)), tuple(lo), tuple(hi),
                   math.nan, math.nan, math.nan, 0, False)
    state = cache_state(observations)
    observed = np.array([o.total_s for o in observations], dtype=np.float64)
    base = design(profile, node_class, state)
    prior_total = np.maximum(base.total(ones), 1e-6)
    phase_rows = PhaseRows.of(observations, base.columns)
    m = ones.copy()
    rounds = 0
    scale = NOISE_FLOOR
    weights = np.ones(n)
    for rounds in range(1, MAX_ROUNDS + 1):  # noqa: B007 - the count is reported
        d = design(profile, node_class, state, m)
        x = d.columns / prior_total[:, None]
        y = (observed - d.offset) / prior_total
        residual = y - x @ m
        scale, weights = _huber(residual)
        q = (x * weights[:, None]).T @ x + np.diag(lam)
        b = (x * weights[:, None]).T @ y + lam * ones
        if len(phase_rows):
            xp, yp, live = phase_rows.rows(d.columns)
            wp = _phase_weights(phase_rows, yp - xp @ m, live)
            q = q + (xp * wp[:, None]).T @ xp
            b = b + (xp * wp[:, None]).T @ yp
        new = box_ridge(q, b, lo, hi, m)
        step = float(np.max(np.abs(new - m)))
        m = new
        if step < TOLERANCE:
            break
    x_conf = base.columns / prior_total[:, None]
    if len(phase_rows):
        xp, _, live = phase_rows.rows(base.columns)
        x_conf = np.vstack([x_conf, xp[live]])
    conf = confidence(x_conf, lam)
    fitted = design(profile, node_class, state, m).total(m)
    error_policy = float(np.median(np.abs(prior_total - observed) / np.maximum(observed, 1e-6)))
    error_fit = float(np.median(np.abs(fitted - observed) / np.maximum(observed, 1e-6)))
    return Fit(profile.name, node_class.name, n, tuple(float(v) for v in m), tuple(float(v) for v in conf),
               tuple(float(v) for v in lo), tuple(float(v) for v in hi), scale, error_policy, error_fit, rounds,
               n >= settings.min_observations)


#: ``d`` of the per-node factors: log-differences from the peers up to ln 1.01 are not acted on.
NODE_DEADBAND = math.log(1.01)
#: ``extender calibrate show`` lists the nodes whose factor is off 1 by more than this (5 %).
NODE_SHOWN = 0.05


@dataclass(frozen=True)
class NodeFactor:
    """One node's factor on its whole estimated startup, with the starts behind it."""

    node: str
    factor: float
    #: Starts of the node among the fits' starts (every workload and class).
    starts: int
    #: ``n / (n + k)``: the share of the prior's weight the node's starts outweigh.
    confidence: float
    lower: float
    upper: float


@dataclass(frozen=True)
class NodeFactors:
    """The per-node factors of one calibration; a node not listed has factor 1."""

    nodes: Mapping[str, NodeFactor]

    def factor(self, node: str) -> float:
        """``r_n``: 1 for a node without starts (or unknown)."""
        found = self.nodes.get(node)
        return 1.0 if found is None else found.factor

    def differing(self, threshold: float) -> list[NodeFactor]:
        """Nodes whose factor is off 1 by more than ``threshold`` (0.05: 5 %), the furthest first."""
        far = [f for f in self.nodes.values() if abs(math.log(f.factor)) > math.log1p(threshold)]
        return sorted(far, key=lambda f: (-abs(math.log(f.factor)), f.node))

    def __bool__(self) -> bool:
        return any(f.factor != 1.0 for f in self.nodes.values())

    def rows(self, snapshot: InventorySnapshot) -> F64:
        """``r_n`` per row of ``snapshot``, its cold sentinel (the last row) included: 1 where not listed."""
        listed = list(self.nodes)
        found = snapshot.lookup(listed)
        factor = np.ones(len(snapshot) + 1, dtype=np.float64)
        values = np.array([self.nodes[n].factor for n in listed], dtype=np.float64)
        factor[found.index[found.known]] = values[found.known]
        return factor


NO_NODE_FACTORS = NodeFactors({})


Pair = tuple[str, str]


@dataclass(frozen=True)
class CalibrationResult:
    """Every (workload, node class) fit of a policy, and what was left out of them and why."""

    fits: Mapping[Pair, Fit]
    used: Mapping[Pair, tuple[Observation, ...]]
    #: reason -> count: ``unknown workload``, ``unknown node class``, ``class not allowed``,
    #: ``other version`` (image or weights changed since), ``too old``, ``beyond window``.
    skipped: Mapping[str, int]
    #: The policy with the applicable fits applied (:func:`apply_calibration`).
    calibrated: Policy
    #: The per-node factors of the same starts, against :attr:`calibrated`.
    nodes: NodeFactors = NO_NODE_FACTORS


def select(policy: Policy, observations: Iterable[Observation], *, now: float | None = None
           ) -> tuple[dict[Pair, list[Observation]], dict[str, int]]:
    """The observations each fit uses: known pair, current image and weights, recent, newest ``window``."""
    settings = policy.calibration
    profiles = {p.name: p for p in policy.profiles}
    classes = {c.name for c in policy.node_classes}
    groups: dict[Pair, list[Observation]] = {}
    skipped: dict[str, int] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    for o in observations:
        profile = profiles.get(o.workload)
        if profile is None:
            skip("unknown workload")
        elif o.node_class not in classes:
            skip("unknown node class")
        elif profile.node_classes and o.node_class not in profile.node_classes:
            skip("class not allowed")
        elif not o.matches(profile):
            skip("other version")
        elif now is not None and now - o.ready_at > settings.max_age:
            skip("too old")
        else:
            groups.setdefault((o.workload, o.node_class), []).append(o)
    for key, group in groups.items():
        group.sort(key=lambda o: o.ready_at, reverse=True)
        if len(group) > settings.window:
            skipped["beyond window"] = skipped.get("beyond window", 0) + len(group) - settings.window
            groups[key] = group[: settings.window]
    return groups, skipped


def calibrate(policy: Policy, observations: Iterable[Observation], *, now: float | None = None) -> CalibrationResult:
    """Fit every (workload, node class) that has observations (:func:`select` decides which count)."""
    groups, skipped = select(policy, observations, now=now)
    fits: dict[Pair, Fit] = {}
    for (workload, cls), group in sorted(groups.items()):
        fits[(workload, cls)] = fit_pair(policy, policy.profile(workload), policy.node_class(cls), group)
    calibrated = apply_calibration(policy, fits.values())
    return CalibrationResult(fits, {k: tuple(v) for k, v in groups.items()}, skipped, calibrated,
                             fit_nodes(policy, calibrated, groups))


# ---------------------------------------------------------------------------------------------
# Per-node factors (module docstring, "Per-node factors")
# ---------------------------------------------------------------------------------------------


def fit_nodes(policy: Policy, calibrated: Policy, groups: Mapping[Pair, Sequence[Observation]]) -> NodeFactors:
    """``r_n`` of every node with starts in ``groups`` (formulas in the module docstring).

    ``calibrated`` is the policy the starts are estimated with (``policy`` with the applicable fits
    applied); ``policy`` gives ``k`` and the bounds. Starts of 0 s (Ready in the second they were
    scheduled) or estimated at 0 s have no ratio and are left out.
    """
    settings = policy.calibration
    k = float(settings.prior_observations)
    bounds = settings.bounds.of("node")
    residuals: dict[str, list[float]] = {}
    for (workload, cls), group in sorted(groups.items()):
        try:
            profile, node_class = calibrated.profile(workload), calibrated.node_class(cls)
        except KeyError:
            continue
        if not group:
            continue
        est = estimate(profile, [node_class], np.zeros(len(group), dtype=np.intp), cache_state(group)).total_s
        observed = np.array([o.total_s for o in group], dtype=np.float64)
        ok = (observed > 0) & (est > 0) & np.isfinite(est)
        if not ok.any():
            continue
        ratio = np.log(observed[ok] / est[ok])
        centred = ratio - float(np.median(ratio))
        for o, z in zip((o for o, keep in zip(group, ok, strict=True) if keep), centred.tolist(), strict=True):
            residuals.setdefault(o.node, []).append(z)
    out: dict[str, NodeFactor] = {}
    for node, zs in sorted(residuals.items()):
        n = len(zs)
        m = n / (n + k) * float(np.median(zs))
        u = math.copysign(max(abs(m) - NODE_DEADBAND, 0.0), m)
        r = min(max(math.exp(u), bounds.min), bounds.max)
        out[node] = NodeFactor(node, r, n, n / (n + k), bounds.min, bounds.max)
    return NodeFactors(out)


# ---------------------------------------------------------------------------------------------
# Use: a fit written into the policy (the one function every consumer goes through)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyValues:
    """One (profile, class)'s parameters in the units people read: bandwidths in bytes/s, seconds."""

    image_pull_bps: float
    remote_bps: float
    local_bps: float
    compile_cold_s: float
    compile_warm_s: float
    graph_s: float
    init_s: float
    restore_s: float

    @classmethod
    def of(cls, profile: Profile, node_class: NodeClass) -> PolicyValues:
        t = ClassTable.build(profile, [node_class])
        remote = min(float(t.nic_bps[0]), profile.weights.streams * float(t.stream_bps[0]))
        return cls(float(t.pull_bps[0]), remote, max(float(t.nvme_bps[0]), remote), float(t.compile_cold_s[0]),
                   float(t.compile_warm_s[0]), float(t.graph_s[0]), float(t.init_s[0]), float(t.restore_s[0]))

    def scaled(self, factors: Sequence[float]) -> PolicyValues:
        """The values with each parameter's seconds multiplied by its factor (bandwidths divided).

        The warm compile is at most the cold one, ``min(warm x m_warm, cold x m_cold)``, as the
        estimator reads it (:class:`~extender.core.estimate.ClassTable`) and as a policy must say
        it: factors each within their bounds (compileWarm x4, compileCold x0.25) can cross them.
        """
        f = factors
        cold = self.compile_cold_s * f[COLD]
        return PolicyValues(self.image_pull_bps / f[IMAGE], self.remote_bps / f[REMOTE], self.local_bps / f[LOCAL],
                            cold, min(self.compile_warm_s * f[WARM], cold), self.graph_s * f[GRAPH],
                            self.init_s * f[INIT], self.restore_s * f[RESTORE])

    def value(self, j: int) -> float:
        """Parameter j as shown: bytes/s for the three bandwidths, seconds for the rest."""
        return (self.image_pull_bps, self.remote_bps, self.local_bps, self.compile_cold_s, self.compile_warm_s,
                self.graph_s, self.init_s, self.restore_s)[j]


def _override(profile: Profile, node_class: NodeClass, factors: Sequence[float]) -> PhaseOverride:
    """The profile's override for the class with the factors applied (fields of factor 1 left alone).

    ``weightsLocal`` writes ``nvmeRead = nvme_bps / m`` only when the local weights read is
    NVMe-bound (``nvme_bps >= remote_bps``), the only case where :func:`design` gives it a column.
    Otherwise the NVMe read is left alone: the local bytes went at the remote rate
    (``weightsRemote``), and writing the remote rate over the NVMe read would change what the fit
    never modelled (the snapshot read, the adapters read from NVMe).
    """
    base = PolicyValues.of(profile, node_class)
    new = base.scaled(factors)
    old = profile.overrides.get(node_class.name) or PhaseOverride()
    update: dict[str, float] = {}

    def moved(j: int) -> bool:
        return abs(factors[j] - 1.0) > 1e-12

    if moved(IMAGE):
        update["image_pull"] = new.image_pull_bps
    if moved(REMOTE):
        update["stream_bandwidth"] = new.remote_bps / profile.weights.streams
    nvme_bound = float(ClassTable.build(profile, [node_class]).nvme_bps[0]) >= base.remote_bps
    if moved(LOCAL) and nvme_bound:
        update["nvme_read"] = new.local_bps  # = nvme_bps / m: local_bps is the NVMe read here
    if moved(COLD):
        update["compile_cold"] = new.compile_cold_s
    if moved(WARM) or new.compile_warm_s != base.compile_warm_s:  # a cold compile fitted below it cuts it
        update["compile_warm"] = new.compile_warm_s
    if moved(GRAPH):
        update["graph_capture"] = new.graph_s
    if moved(INIT):
        update["engine_init"] = new.init_s
    if moved(RESTORE) and profile.snapshot is not None:
        update["snapshot_restore"] = new.restore_s
    return old.model_copy(update=update)


def apply_calibration(policy: Policy, fits: Iterable[Fit]) -> Policy:
    """The policy with every applicable fit written in as per-class overrides of its profile.

    The one way calibrated parameters reach the estimator: the extender's scores, the scaler's
    horizon and the warmer's plans all take a policy, and get this one when
    ``calibration.mode: apply`` (:func:`effective_policy`); the per-node factors travel beside it
    (:func:`effective_calibration`). Fits with too few observations
    (``applied`` false) and fits of pairs the policy no longer has are left out.
    """
    by_profile: dict[str, dict[str, PhaseOverride]] = {}
    for fit in fits:
        if not fit.applied:
            continue
        try:
            profile, node_class = policy.profile(fit.workload), policy.node_class(fit.node_class)
        except KeyError:
            continue
        overrides = by_profile.setdefault(profile.name, dict(profile.overrides))
        overrides[node_class.name] = _override(profile, node_class, fit.factors)
    if not by_profile:
        return policy
    profiles = tuple(p.model_copy(update={"overrides": by_profile[p.name]}) if p.name in by_profile else p
                     for p in policy.profiles)
    return policy.model_copy(update={"profiles": profiles})


def effective_policy(policy: Policy, observations: Iterable[Observation], *, now: float | None = None) -> Policy:
    """The policy the estimator should use: calibrated with ``calibration.mode: apply``, else unchanged."""
    return effective_calibration(policy, observations, now=now)[0]


def effective_calibration(policy: Policy, observations: Iterable[Observation], *, now: float | None = None
                          ) -> tuple[Policy, NodeFactors]:
    """The policy and the per-node factors the estimator should use: with ``calibration.mode: apply``
    the calibrated policy and the fitted node factors, else the policy unchanged and no factors."""
    if policy.calibration.mode != "apply":
        return policy, NO_NODE_FACTORS
    result = calibrate(policy, observations, now=now)
    return result.calibrated, result.nodes


# ---------------------------------------------------------------------------------------------
# Estimate error of a start (for metrics and reports)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EstimateError:
    """What the estimator said of a start and what it took: ``relative = (estimated - observed) / observed``."""

    workload: str
    node_class: str
    estimated_s: float
    observed_s: float

    @property
    def relative(self) -> float:
        return (self.estimated_s - self.observed_s) / self.observed_s if self.observed_s > 0 else math.nan


def estimate_errors(policy: Policy, observations: Sequence[Observation]) -> list[EstimateError]:
    """The estimate ``policy`` gives each observed start (its node's state then) against its duration.

    For metrics: pass the policy the components used (``effective_policy``) and each new start.
    Starts of a workload or class the policy does not know are left out, and so are starts recorded
    with another number of preloaded adapters than the profile has now (``lora.preload`` or the
    adapters changed since): the estimator has no column for their adapters, or lacks some.
    """
    out: list[EstimateError] = []
    for o in observations:
        try:
            profile, node_class = policy.profile(o.workload), policy.node_class(o.node_class)
        except KeyError:
            continue
        if len(o.adapters) != len(profile.preloaded_adapters):
            continue
        est = estimate(profile, [node_class], np.zeros(1, dtype=np.intp), cache_state([o]))
        out.append(EstimateError(o.workload, o.node_class, float(est.total_s[0]), o.total_s))
    return out
