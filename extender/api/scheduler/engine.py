"""Decisions for one (policy, inventory snapshot): scores, filter verdicts and explanations.

An :class:`Engine` is immutable input plus memoised work. The hot path (``nodeCacheCapable: true``,
names only) never runs the estimator per request: the first request for a profile after a snapshot
change (or the refresher, ahead of time) estimates, scores and judges *every* inventory row at once
with numpy and keeps the results as

* a map ``node name -> pre-encoded {"Host":..,"Score":..}`` (unknown names fall through to the
  cold sentinel's score), so a prioritize reply is one dict lookup per name and a string join;
* the set of names that fail a hard rule (usually empty), so a filter reply is the input list
  unless a failing name is among the candidates.

Those results depend on the clock only through record freshness, so they stay valid until the next
row's freshness changes (``valid_until``: a fresh record's heartbeat expires, or one stamped more
than its TTL ahead of the clock comes within it; :func:`next_freshness_change`) and are rebuilt
after that.

A rebuild redoes the vector arithmetic for every row (cheap) but re-encodes only the rows whose
score moved: an engine made for a snapshot that :meth:`InventorySnapshot.update` patched starts
from the previous engine's tables (``previous``), and a table rebuilt after a heartbeat expired
starts from the table it replaces. So a reload after a heartbeat costs in proportion to what
changed, not to the fleet.

Per-node calibration (:mod:`extender.core.calibration`, "Per-node factors") reaches both paths as
one factor per row (``nodes``, 1 for nodes without starts), multiplied into the estimate before
scoring; without factors (the usual case) no array is made.

Full ``NodeList`` requests and ``explain`` take the general path: gather the requested rows, let
the Node objects' labels and ``status.images`` fill in what the inventory lacks, and run the
estimator on just those rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from extender.api.scheduler.wire import NodeInfo, PodInfo, fragments_for, priority_fragment
from extender.core.calibration import NO_NODE_FACTORS, NodeFactors
from extender.core.estimate import PHASES
from extender.core.images import names_for, normalise, repository
from extender.core.inventory import InventorySnapshot, next_freshness_change
from extender.core.policy import UNKNOWN_CLASS, Policy, Profile
from extender.core.scoring import (
    MAX_SCORE,
    Evaluation,
    NodeInputs,
    Scale,
    Verdict,
    WarmSlots,
    barred_because,
    evaluate,
    larger_warm,
    scale_for,
)


class _Fragments(dict[str, str]):
    """``name -> {"Host":..,"Score":..}``; names the inventory does not know get the sentinel's score."""

    __slots__ = ("unknown_score",)

    def __init__(self, items: dict[str, str], unknown_score: int) -> None:
        super().__init__(items)
        self.unknown_score = unknown_score

    def __missing__(self, name: str) -> str:
        # Not stored: the request's names are not ours to keep, and memory must stay bounded.
        return priority_fragment(name, self.unknown_score)


@dataclass
class ProfileTable:
    """Every inventory row of one snapshot scored and judged for one profile."""

    profile: Profile
    evaluation: Evaluation
    fragments: _Fragments
    #: name -> row, for rows that fail a hard rule (the sentinel never does: no evidence).
    failing: dict[str, int]
    #: Wall-clock second from which a row's freshness may differ from :attr:`fresh` (a fresh record
    #: expired, or one stamped ahead came within its TTL): the table is rebuilt from then on.
    valid_until: float
    _reasons: dict[int, str]
    #: Which rows were fresh when the table was built (its scores depend on the clock only through this).
    fresh: NDArray[np.bool_]

    def reason(self, row: int, engine: Engine) -> str:
        """Why ``row`` failed (memoised: the same node fails the same way until the table changes)."""
        text = self._reasons.get(row)
        if text is None:
            snap = engine.snapshot
            text = self.evaluation.reason(self.profile, row, snap.classes, snap.class_index)
            self._reasons[row] = text
        return text


@dataclass(frozen=True)
class FilterDecision:
    """Which request positions pass (``None``: all), and the failures by map."""

    passing: list[int] | None
    failed: dict[str, str]
    unresolvable: dict[str, str]


class Engine:
    """Scores and verdicts for one policy and one inventory snapshot; safe to share between threads."""

    def __init__(self, policy: Policy, snapshot: InventorySnapshot, previous: Engine | None = None, *,
                 names: list[str] | None = None, nodes: NodeFactors = NO_NODE_FACTORS) -> None:
        """``previous``: the engine of the snapshot ``snapshot`` was updated from (same policy), whose
        tables the first build of each profile's table starts from. ``names``: the snapshot's node
        names in row order, when the caller has them already. ``nodes``: the per-node factors
        (per-node calibration) the estimates are multiplied by."""
        self.policy = policy
        self.snapshot = snapshot
        self.nodes = nodes
        self._row_factor: NDArray[np.float64] | None = None
        if nodes:
            self._row_factor = nodes.rows(snapshot)
        same = previous if previous is not None and previous.policy is policy else None
        self.scales: dict[str, Scale] = (same.scales if same is not None else
                                         {p.name: scale_for(policy, p) for p in policy.profiles})
        self._class_pos = {c.name: i for i, c in enumerate(snapshot.classes)}
        self._names = names if names is not None else [s.name for s in snapshot.nodes]
        self._tables: dict[str, ProfileTable] = {}
        self._lock = threading.Lock()
        #: The previous engine's tables by profile (its rows map to ours through ``snapshot.delta``).
        self._previous: dict[str, ProfileTable] = (
            dict(same._tables) if same is not None and snapshot.delta is not None else {})

    # ---- matching --------------------------------------------------------------------------------

    def match(self, pod: PodInfo) -> Profile | None:
        """The pod's workload profile, or ``None`` (the reply is then neutral)."""
        return self.policy.profile_for_pod(pod.labels, pod.annotations)

    # ---- names-only hot path --------------------------------------------------------------------

    def table(self, profile: Profile, now: float) -> ProfileTable:
        """The memoised all-rows table of ``profile``, rebuilt when a record's freshness has changed."""
        table = self._tables.get(profile.name)
        if table is not None and now < table.valid_until:
            return table
        with self._lock:  # one thread builds, the others wait instead of building the same table
            table = self._tables.get(profile.name)
            if table is None or now >= table.valid_until:
                if table is not None:  # same rows: start from the table being replaced
                    table = self._build_table(profile, now, table, np.arange(len(self.snapshot), dtype=np.intp), ())
                else:
                    old = self._previous.pop(profile.name, None)
                    delta = self.snapshot.delta
                    if old is not None and delta is not None:
                        table = self._build_table(profile, now, old, delta.carried, delta.removed)
                    else:
                        table = self._build_table(profile, now)
                self._tables[profile.name] = table
        return table

    def warm(self, now: float) -> None:
        """Build every profile's table ahead of the first request (the refresher calls this)."""
        for profile in self.policy.profiles:
            self.table(profile, now)
        self._previous = {}  # never keep a chain of old engines alive

    def _build_table(self, profile: Profile, now: float, old: ProfileTable | None = None,
                     carried: NDArray[np.intp] | None = None, removed: Sequence[str] = ()) -> ProfileTable:
        """Score and judge every row; with ``old``, re-encode only rows whose score is not ``old``'s.

        ``carried[i]`` is the row of ``old`` that row ``i`` holds unchanged (-1: a new record), and
        ``removed`` the names ``old`` has and this snapshot does not.
        """
        snap = self.snapshot
        n = len(snap)
        rows = np.arange(n + 1, dtype=np.intp)
        state, class_table = snap.state_for(profile, rows, now)
        fresh = snap.fresh(now)
        known = np.ones(n + 1, dtype=np.bool_)
        known[-1] = False
        inputs = NodeInputs(snap.classes, snap.class_index, state, fresh, known, snap.nvme_free, snap.gpus_free,
                            self._others(profile, snap.class_index, rows, now))
        ev = evaluate(self.policy, profile, inputs, scale=self.scales[profile.name], table=class_table,
                      node_factor=self._row_factor)
        if old is not None and carried is not None:
            score = ev.score[:n]
            old_score = old.evaluation.score[np.where(carried >= 0, carried, 0)]
            redo = np.flatnonzero((carried < 0) | (old_score != score)).tolist()
            items = dict(old.fragments)
            for name in removed:
                items.pop(name, None)
            names = [self._names[i] for i in redo]
            items.update(zip(names, fragments_for(names, score[redo].tolist()), strict=True))
            fragments = _Fragments(items, int(ev.score[n]))
        else:
            scores = ev.score.tolist()
            fragments = _Fragments(dict(zip(self._names, fragments_for(self._names, scores[:n]), strict=True)),
                                   scores[n])
        failing = {self._names[i]: int(i) for i in np.flatnonzero(ev.judgement.verdict[:n])}
        return ProfileTable(profile, ev, fragments, failing, next_freshness_change(snap, now), {}, fresh)

    def with_heartbeats(self, snapshot: InventorySnapshot, now: float) -> Engine:
        """The engine of ``snapshot``, which is this engine's snapshot with later heartbeats.

        (:meth:`InventorySnapshot.with_heartbeats`.) A table whose rows are fresh exactly as when it
        was built scores every row as before: it is kept, valid until the next freshness change
        under the new heartbeats. A table where a heartbeat brought a stale row back (or the clock made one stale) is
        rebuilt from the old one on first use, re-encoding only the rows whose score moved. So a
        batch of heartbeats costs a freshness mask per profile, not a scoring pass.
        """
        engine = Engine(self.policy, snapshot, previous=self, names=self._names, nodes=self.nodes)
        fresh, valid_until = snapshot.fresh(now), next_freshness_change(snapshot, now)
        for name, table in self._tables.items():
            if np.array_equal(table.fresh, fresh):
                engine._tables[name] = replace(table, valid_until=valid_until)
                engine._previous.pop(name, None)
        return engine

    def prioritize_names(self, profile: Profile, names: Sequence[str], now: float) -> str:
        """The prioritize reply body for names-only candidates."""
        fragments = self.table(profile, now).fragments
        return "[" + ",".join(map(fragments.__getitem__, names)) + "]"

    def filter_names(self, profile: Profile, names: Sequence[str], now: float) -> FilterDecision:
        """Filter verdicts for names-only candidates."""
        table = self.table(profile, now)
        failing = table.failing
        if not failing or failing.keys().isdisjoint(names):
            return FilterDecision(None, {}, {})
        verdict = table.evaluation.judgement.verdict
        passing: list[int] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for i, name in enumerate(names):
            row = failing.get(name)
            if row is None:
                passing.append(i)
            elif verdict[row] == Verdict.UNRESOLVABLE:
                unresolvable[name] = table.reason(row, self)
            else:
                failed[name] = table.reason(row, self)
        return FilterDecision(passing, failed, unresolvable)

    # ---- general path: full Node objects, explain -------------------------------------------------

    def evaluate_nodes(self, profile: Profile, nodes: Sequence[NodeInfo], now: float) -> tuple[Evaluation, NodeInputs]:
        """Estimate, score and judge the given nodes; Node labels and images fill gaps in the inventory.

        A node's class comes from its inventory record, else from its labels; its image counts as
        present when the record (fresh) or kubelet's ``status.images`` says so. Kubelet lists only the
        50 largest images, so its silence is not evidence of absence and never overrides a record.
        """
        snap = self.snapshot
        lookup = snap.lookup([n.name for n in nodes])
        rows = lookup.index
        state, class_table = snap.state_for(profile, rows, now)
        class_index = snap.class_index[rows].copy()
        unknown = self._class_pos[UNKNOWN_CLASS.name]
        seen = self._image_matcher(profile)
        kubelet_image = np.zeros(len(nodes), dtype=np.bool_)
        for i, node in enumerate(nodes):
            if class_index[i] == unknown and node.labels:
                class_index[i] = self._class_pos[self.policy.classify_node(node.labels).name]
            if node.images:
                kubelet_image[i] = seen(node.images)
        if kubelet_image.any():
            state = replace(state, image=state.image | kubelet_image)
        inputs = NodeInputs(snap.classes, class_index, state, snap.fresh(now)[rows], lookup.known, snap.nvme_free[rows],
                            snap.gpus_free[rows], self._others(profile, class_index, rows, now))
        factor = None if self._row_factor is None else self._row_factor[rows]
        ev = evaluate(self.policy, profile, inputs, scale=self.scales[profile.name], table=class_table,
                      node_factor=factor)
        return ev, inputs

    def _others(self, profile: Profile, class_index: NDArray[np.intp], rows: NDArray[np.intp],
                now: float) -> tuple[WarmSlots, ...]:
        """Where the larger profiles are warm, for ``scoring.protectWarmPoints`` (nothing when it is off)."""
        if not self.policy.scoring.protect_warm_points:
            return ()
        snap = self.snapshot
        return larger_warm(profile, self.policy.profiles, snap.classes, class_index,
                           lambda q: snap.state_for(q, rows, now)[0])

    def _image_matcher(self, profile: Profile) -> Callable[[Sequence[str]], bool]:
        digest = profile.compile.key.image_digest if profile.compile.key is not None else None
        wanted = names_for(profile.image.reference, digest)
        # Cheap pre-check before normalising: a node reports up to 50 images x 5 names each, and
        # only names that mention the repository's last path element can possibly match.
        stem = repository(profile.image.reference).rsplit("/", 1)[-1]

        def seen(images: Sequence[str]) -> bool:
            return any(stem in name and normalise(name) in wanted for name in images)

        return seen

    def prioritize_nodes(self, profile: Profile, nodes: Sequence[NodeInfo], now: float) -> list[tuple[str, int]]:
        """(host, score) pairs for full Node objects."""
        ev, _ = self.evaluate_nodes(profile, nodes, now)
        return list(zip((n.name for n in nodes), ev.score.tolist(), strict=True))

    def filter_nodes(self, profile: Profile, nodes: Sequence[NodeInfo], now: float) -> FilterDecision:
        """Filter verdicts for full Node objects."""
        ev, inputs = self.evaluate_nodes(profile, nodes, now)
        verdict = ev.judgement.verdict
        if not verdict.any():
            return FilterDecision(None, {}, {})
        passing: list[int] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for i in range(len(nodes)):
            if verdict[i] == Verdict.PASS:
                passing.append(i)
                continue
            text = ev.reason(profile, i, inputs.classes, inputs.class_index)
            (unresolvable if verdict[i] == Verdict.UNRESOLVABLE else failed)[nodes[i].name] = text
        return FilterDecision(passing, failed, unresolvable)

    def explain(self, profile: Profile, nodes: Sequence[NodeInfo], now: float) -> list[dict[str, Any]]:
        """Per node: class, what the inventory knows, phase breakdown, score and verdict."""
        ev, inputs = self.evaluate_nodes(profile, nodes, now)
        out: list[dict[str, Any]] = []
        verdict_names = {Verdict.PASS: "pass", Verdict.FAILED: "FailedNodes",
                         Verdict.UNRESOLVABLE: "FailedAndUnresolvableNodes"}
        hosts = self.policy.classes_for(profile)
        for i, node in enumerate(nodes):
            row = ev.estimate.row(i)
            out.append({
                "node": node.name,
                "class": inputs.classes[int(inputs.class_index[i])].name,
                "known": bool(inputs.free_known[i]),
                "fresh": bool(inputs.fresh[i]),
                "cache": {
                    "image": bool(inputs.state.image[i]),
                    "weightsBytes": int(inputs.state.weights_bytes[i]),
                    "compile": ["absent", "registry", "local"][int(inputs.state.compile[i])],
                    "snapshot": bool(inputs.state.snapshot[i]),
                },
                "phases": {k: round(row[k], 3) for k in PHASES},
                "totalSeconds": round(row["total_s"], 3),
                # as evaluate_nodes applied it: a node without an inventory record takes its row of 1
                "nodeFactor": round(self.nodes.factor(node.name) if inputs.free_known[i] else 1.0, 4),
                "nvmePressure": bool(ev.pressure[i]),
                "score": int(ev.score[i]),
                "verdict": verdict_names[Verdict(int(ev.judgement.verdict[i]))],
                "reason": ev.reason(profile, i, inputs.classes, inputs.class_index),
                "note": barred_because(profile, inputs.classes[int(inputs.class_index[i])], hosts),
            })
        return out

    def all_nodes(self) -> list[NodeInfo]:
        """Every node the inventory knows, as names-only NodeInfos (explain without ``--nodes``)."""
        return [NodeInfo(n, {}, ()) for n in self._names]


def scale_summary(scale: Scale) -> dict[str, float]:
    """The fixed mapping of a profile, for explain output."""
    return {
        "referenceSeconds": round(scale.reference_s, 3),
        "secondsPerPoint": round(scale.seconds_per_point, 3),
        "maxScore": MAX_SCORE,
    }


def explain_report(
    engine: Engine,
    pod: PodInfo,
    nodes: Sequence[NodeInfo] | None,
    now: float,
    *,
    fail_open: str | None = None,
) -> dict[str, Any]:
    """What the extender decides for ``pod`` on ``nodes`` (every inventory node when ``None``), and why.

    Shared by ``GET /explain`` and ``extender explain``. ``fail_open`` names the reason the server
    would answer neutrally right now (the per-node figures are still what it would compute).
    """
    snap = engine.snapshot
    profile = engine.match(pod)
    report: dict[str, Any] = {
        "pod": pod.key,
        "profile": profile.name if profile else None,
        "policy": engine.policy.metadata.name,
        "failOpen": fail_open,
        "snapshot": {"version": snap.version, "nodes": len(snap), "takenAt": snap.taken_at},
    }
    if profile is None:
        report["note"] = "no workload profile matches this pod: every node passes with score 0"
        report["nodes"] = []
        return report
    report["scale"] = scale_summary(engine.scales[profile.name])
    report["filterRules"] = profile.filter.model_dump(by_alias=True)
    report["nodes"] = engine.explain(profile, nodes if nodes is not None else engine.all_nodes(), now)
    return report

