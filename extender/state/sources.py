"""Two writers, one node record: what the node agent measures and what the cluster sync reads from the API.

The agent knows the node's disk (NVMe total/free, weights, compile keys, snapshots, and possibly
the runtime's complete image list); the sync knows the Node object (labels, class, GPUs, kubelet's
``status.images``) and the pods bound to it. Both write at their own pace, and neither may clobber
the other's fields. So each writes only its own *report*, and the :class:`NodeState` readers see is
rebuilt from both reports in the same transaction::

    <p>:source:<name>   hash   agent -> AgentReport JSON, kube -> KubeReport JSON,
                               deleted -> unix time (tombstone of a node removed from the cluster)
    <p>:node:<name>     the merged NodeState, written by extender.state.store's rules

A write WATCHes the node's source hash, reads the other report, merges (:func:`extender.core.reports.merge`, pure), then
in one MULTI/EXEC stores its report, the merged record, the node set and the version bump. A
concurrent write of the other source makes EXEC fail and the write is retried with the fresh
report, so the last merged record always contains the latest of both: no lock, no lost update.

A bare heartbeat (:meth:`SourceStore.beat_agent`) keeps the record fresh only while the record
holds the agent report this writer last wrote: the heartbeat script compares the SHA-1 of the
stored ``agent`` field with that of the JSON written (:class:`extender.state.store.Guard`). So a
store that restarted empty and was refilled by the sync (no agent report), a node removed and
registered again, a corrupt ``agent`` field, or another agent writing under the same node name
all refuse the heartbeat, and the agent writes its whole report. A whole agent report drops the
node's bare heartbeat, like every whole record write: it carries its own.

Deleting a node leaves a tombstone for :data:`TOMBSTONE_TTL_S`: an agent still running on a node the
cluster already removed must not bring the record back. A later sync report of that name (the node
re-registered) clears it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis
from pydantic import ValidationError
from redis.client import Pipeline

from extender.core.errors import ExtenderError, InvalidValueError, StateError
from extender.core.inventory import NodeState
from extender.core.reports import AgentReport, KubeReport, Report, merge
from extender.core.schema import read_stored
from extender.state.errors import redis_errors
from extender.state.store import Guard, InventoryStore, corrupt_reason, encode

log = logging.getLogger(__name__)

AGENT = "agent"
KUBE = "kube"
DELETED = "deleted"

#: How long a deleted node's tombstone keeps late agent reports out (an agent's pod is gone minutes
#: after its node; an hour leaves room for a node stuck terminating).
TOMBSTONE_TTL_S = 3600

#: Nodes per transaction when the sync writes many reports (its first list of a large cluster).
BATCH = 200


def _dump(report: Report) -> str:
    # plain numbers in SI units, like extender.state.store.encode: any writer can produce them
    return json.dumps(report.model_dump(mode="python", by_alias=True), separators=(",", ":"), sort_keys=True)


def _load(model: type[AgentReport] | type[KubeReport], key: str, raw: str | bytes | None) -> Any:
    """Parse a stored report; a corrupt one counts as absent (the next write replaces it).

    Fields this release does not know are ignored (:func:`extender.core.schema.read_stored`): an
    older sync must not drop the disk report of a newer agent from the merged record, or the node
    would look cold for as long as the rollout lasts.
    """
    if raw is None:
        return None
    try:
        return read_stored(model, raw)
    except (ValidationError, ValueError) as exc:
        log.warning("ignoring corrupt %s report in %s: %s", model.__name__, key, corrupt_reason(exc))
        return None


def _refuse_other_types(pipe: Pipeline, keys: Iterable[str], error: type[ExtenderError]) -> None:
    """Refuse to write reports into a source key that holds another Redis type than a hash (someone's
    hand edit, another tool): ``error`` naming it, and the key left as it is for a person to see.
    The sync's batch raises :class:`InvalidValueError`, so that only that node's write is refused (it
    writes the others one by one); the agent's write a :class:`StateError`, retried with backoff.
    """
    for key in keys:
        kind = _text(pipe.type(key))
        if kind not in {"hash", "none"}:
            raise error(f"{key} holds a Redis {kind}, not the hash of a node's reports; nothing is "
                        "written for that node until it is deleted")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class SourceStore:
    """Per-source writes on top of an :class:`InventoryStore` (same client, prefix and version counter)."""

    def __init__(self, store: InventoryStore) -> None:
        self.store = store
        self.client = store.client
        #: Node name -> SHA-1 of the agent report JSON this object last wrote (what its heartbeats vouch for).
        self._written: dict[str, str] = {}

    def key(self, name: str) -> str:
        return f"{self.store.keys.prefix}:source:{name}"

    def _stage_record(self, pipe: Pipeline, state: NodeState) -> None:
        pipe.set(self.store.keys.node(state.name), encode(state))
        pipe.sadd(self.store.keys.nodes, state.name)

    # ---- the agent -------------------------------------------------------------------------

    def report_agent(self, name: str, report: AgentReport) -> int | None:
        """Store the agent's report and the merged record; ``None`` if the node was deleted (tombstone).

        The node's bare heartbeat is dropped in the same transaction: the report carries its own,
        and a heartbeat from a clock that ran ahead must not outlive the report that corrects it.
        """
        key = self.key(name)
        text = _dump(report)
        outcome: list[int | None] = []

        def write(pipe: Pipeline) -> None:
            _refuse_other_types(pipe, [key], StateError)
            stored = pipe.hgetall(key)
            pipe.multi()
            if DELETED in stored:
                outcome.append(None)
                pipe.get(self.store.keys.version)
                return
            kube = _load(KubeReport, key, stored.get(KUBE))
            pipe.hset(key, AGENT, text)
            self._stage_record(pipe, merge(name, report, kube))
            pipe.hdel(self.store.keys.heartbeats, name)
            self.store.stage_bump(pipe, [name])
            outcome.append(0)

        with redis_errors(f"writing the agent report of node {name!r}"):
            result: Any = self.client.transaction(write, key)
        if outcome[-1] is None:
            self._written.pop(name, None)
            return None
        self._written[name] = hashlib.sha1(text.encode()).hexdigest()
        return int(result[-1])

    def beat_agent(self, name: str, heartbeat: float) -> bool:
        """Record a heartbeat of an agent whose report did not change; False when the record does not
        hold the agent report this object last wrote.

        Only the heartbeat is written (:meth:`InventoryStore.beat_many`), not the report nor the
        merged record, so readers have nothing to decode. It is refused when the node has no record
        (a removed node, a store that lost data) and when the stored agent report is not the one
        last written here (see the module docstring): the agent must then write its whole report,
        which also meets the tombstone of a removed node.
        """
        digest = self._written.get(name)
        if digest is None:
            return False
        _, missing = self.store.beat_many({name: heartbeat}, guards={name: Guard(self.key(name), AGENT, digest)})
        return not missing

    # ---- the sync --------------------------------------------------------------------------

    def report_kube(self, reports: Mapping[str, KubeReport]) -> int:
        """Store the sync's reports (clearing tombstones) and the merged records; returns the version."""
        items = sorted(reports.items())
        version = self.store.version() if not items else 0
        for start in range(0, len(items), BATCH):
            batch = items[start : start + BATCH]
            keys = [self.key(name) for name, _ in batch]

            def write(pipe: Pipeline, batch: list[tuple[str, KubeReport]] = batch, keys: list[str] = keys) -> None:
                _refuse_other_types(pipe, keys, InvalidValueError)
                agents = [pipe.hget(k, AGENT) for k in keys]
                pipe.multi()
                for (name, report), k, raw in zip(batch, keys, agents, strict=True):
                    pipe.hset(k, KUBE, _dump(report))
                    pipe.hdel(k, DELETED)
                    pipe.persist(k)
                    self._stage_record(pipe, merge(name, _load(AgentReport, k, raw), report))
                self.store.stage_bump(pipe, [name for name, _ in batch])

            with redis_errors(f"writing the cluster reports of {len(batch)} node(s)"):
                result: Any = self.client.transaction(write, *keys)
            version = int(result[-1])
        return version

    def remove_node(self, name: str) -> int:
        """The node left the cluster: drop both reports and the record, leave a tombstone."""
        key = self.key(name)

        def write(pipe: Pipeline) -> None:
            pipe.delete(key)
            pipe.hset(key, DELETED, str(time.time()))
            pipe.expire(key, TOMBSTONE_TTL_S)
            pipe.delete(self.store.keys.node(name))
            pipe.srem(self.store.keys.nodes, name)
            pipe.hdel(self.store.keys.heartbeats, name)
            self.store.stage_bump(pipe, [name])

        with redis_errors(f"removing node {name!r}"), self.client.pipeline(transaction=True) as pipe:
            write(pipe)
            return int(pipe.execute()[-1])

    def kube_reports(self, names: Iterable[str]) -> dict[str, KubeReport | None]:
        """The stored sync reports of ``names`` (``None`` where missing or corrupt, or the record is gone).

        The sync compares these with what it knows to repair a store that lost data.
        """
        ordered = list(names)
        if not ordered:
            return {}
        with redis_errors("reading cluster reports"), self.client.pipeline(transaction=False) as pipe:
            for name in ordered:
                pipe.hget(self.key(name), KUBE)
                pipe.exists(self.store.keys.node(name))
            raw = pipe.execute(raise_on_error=False)  # a key of another type spoils only its own node
        out: dict[str, KubeReport | None] = {}
        for i, name in enumerate(ordered):
            report, present = raw[2 * i], raw[2 * i + 1]
            if isinstance(report, redis.RedisError):
                log.warning("ignoring the reports in %r: %s", self.key(name), report, extra={"node": name})
                report = None
            elif isinstance(present, redis.RedisError):  # pragma: no cover - EXISTS takes any key
                raise StateError(f"reading cluster reports: {present}")
            out[name] = _load(KubeReport, self.key(name), report) if present else None
        return out

    def agent_report(self, name: str) -> AgentReport | None:
        """The stored agent report of ``name``."""
        key = self.key(name)
        with redis_errors(f"reading the agent report of node {name!r} (HGET {key})"):
            raw = self.client.hget(key, AGENT)
        result: AgentReport | None = _load(AgentReport, key, raw)
        return result
