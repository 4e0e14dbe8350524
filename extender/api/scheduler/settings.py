"""Server settings: everything ``create_app`` needs, decided once by the launcher or a test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from extender.core.inventory import NodeState
from extender.core.policy import Policy


class Store(Protocol):
    """What the refresher reads from the inventory store (``extender.state.InventoryStore``)."""

    def versions(self) -> tuple[int, int]:
        """``(a counter bumped by every record write, a counter bumped by every heartbeat batch)``."""
        ...

    def load_all(self) -> tuple[int, list[NodeState], frozenset[str]]:
        """``(version, records, compile registry)`` from one instant."""
        ...

    def changes_since(self, version: int) -> tuple[int, dict[str, NodeState | None], frozenset[str]]:
        """``(version, name -> record or None when gone, compile registry)`` for nodes written after ``version``."""
        ...

    def heartbeats_since(self, seq: int) -> tuple[int, dict[str, float]]:
        """``(heartbeat counter, name -> heartbeat)`` for nodes that reported a bare heartbeat after ``seq``."""
        ...


StoreFactory = Callable[[], Store]


@dataclass(frozen=True)
class Settings:
    """Knobs of one extender server process.

    Defaults suit a production deployment with kube-scheduler's ``httpTimeout`` of a few seconds;
    tests shrink the time bounds.
    """

    policy_path: Path
    #: The policy already validated by the launcher (so a worker never starts on a different file
    #: than the one checked); ``None``: load ``policy_path`` in ``create_app``.
    policy: Policy | None = None
    #: The version of ``policy`` (:func:`extender.files.policy_version` of its text). A worker that
    #: starts later compares it with the file's and takes the file's policy when they differ.
    policy_version: str | None = None
    redis_url: str | None = None
    #: The embedded Redis's directory when ``redis_url`` is empty (as ``extender inventory`` uses).
    data_dir: Path = Path("var/redis")
    #: Prefix of the inventory's Redis keys (``--prefix``; the same as the agents' and the sync's).
    key_prefix: str = "extender"
    #: How often each worker asks the store for its version (one GET).
    poll_interval_s: float = 0.5
    #: Rebuild the snapshot at most this often: with thousands of agents the version moves on every
    #: poll, and a full reload per poll would keep a worker's GIL busy.
    min_rebuild_interval_s: float = 2.0
    #: ...and at least this many times as long as the last reload took (20: a worker spends at most
    #: 1/20 of its time reloading, so few requests overlap a reload).
    rebuild_duty_factor: float = 20.0
    #: A snapshot not confirmed against the store for this long is stale: replies go neutral.
    max_snapshot_age_s: float = 15.0
    #: With no snapshot after this long, readiness declares fail-open mode (neutral replies).
    startup_grace_s: float = 10.0
    #: Work on one request beyond this gives the neutral reply (well under kube-scheduler's httpTimeout).
    request_budget_s: float = 0.5
    #: Largest request body accepted; bigger ones get 413. Names-only requests for 15,000 nodes are
    #: about 0.5 MB; full NodeLists are tens of KB per node.
    max_body_bytes: int = 64 * 2**20
    #: Between full reads the refresher reads only the records written since its version; a full
    #: read this often all the same catches a writer that does not mark what it changed.
    full_reload_interval_s: float = 60.0
    #: How often the policy file is checked for changes.
    policy_check_interval_s: float = 2.0
    #: Each distinct fail-open reason or refresh error is logged at most once per this interval.
    log_interval_s: float = 60.0
    #: Start the background refresher in ``create_app`` (tests drive it by hand instead).
    start_refresher: bool = True
    #: With ``calibration.mode: apply``, new observed starts are fitted at most this often...
    calibration_interval_s: float = 30.0
    #: ...and at least this many times as long as the last refit took (200: a worker spends at most
    #: 1/200 of its time refitting; at 20,000 stored starts a refit is 1-2.5 s, so one every 4-8 min).
    calibration_duty_factor: float = 200.0
    #: Builds the store client in the refresher thread; ``None``: ``extender.state`` with
    #: ``redis_url`` / ``data_dir``.
    store_factory: StoreFactory | None = None
