"""The double's cluster state: objects, one resourceVersion counter, and the event history watches read.

Like etcd behind the real server, every write takes the next revision from one global counter and
the object's ``metadata.resourceVersion`` is that revision. The history keeps every change after
the *compaction point*; a watch that asks to resume from a revision older than that gets
``410 Gone`` (``Expired``), which is what forces a well-behaved client to list again.

Every method takes the one lock; watches wait on the same condition for new revisions.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.kube_double.kinds import Kind
from tests.kube_double.patch import PatchError, apply_patch

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource key, namespace or "", name)

#: Revision of an empty cluster; not 0 or 1, so code that treats small numbers specially shows up.
FIRST_REVISION = 1000


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resource_key(kind: Kind) -> str:
    return f"{kind.group}/{kind.resource}"


class ApiError(Exception):
    """A request the server refuses; becomes a ``Status`` object with this code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None, *,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})
        self.headers = dict(headers or {})

    def status(self) -> Obj:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> Obj:
    """A ``metav1.Status`` failure."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = dict(details)
    return body


@dataclass(frozen=True)
class Change:
    """One write, as watches replay it: the object before (``None`` on create) and after (``None`` on delete)."""

    revision: int
    kind: Kind
    namespace: str
    before: Obj | None
    after: Obj | None


Predicate = Callable[[Mapping[str, Any]], bool]


def watch_event(change: Change, matches: Predicate) -> tuple[str, Obj] | None:
    """The event a watcher with this selector sees for a change (or nothing).

    An object that starts matching arrives as ADDED and one that stops matching leaves as DELETED,
    as the real server does for selector-filtered watches.
    """
    was = change.before is not None and matches(change.before)
    now = change.after is not None and matches(change.after)
    if now and was:
        assert change.after is not None
        return "MODIFIED", change.after
    if now:
        assert change.after is not None
        return "ADDED", change.after
    if was:
        final = change.after if change.after is not None else change.before
        assert final is not None
        if change.after is None:
            final = copy.deepcopy(final)
            final["metadata"]["resourceVersion"] = str(change.revision)
        return "DELETED", final
    return None


class ClusterState:
    """Objects of every served kind, the revision counter and the retained history."""

    def __init__(self, *, history_limit: int = 100_000) -> None:
        self.cond = threading.Condition()
        self.revision = FIRST_REVISION
        #: Watches may resume from this revision or later; older ones get 410.
        self.compacted = FIRST_REVISION
        self.objects: dict[Key, Obj] = {}
        self.history: deque[Change] = deque()
        self.history_limit = history_limit
        #: Bumped by fault injection; open watches compare it with the value they started with.
        self.cut_epoch = 0
        self.expire_epoch = 0
        self.stopping = False

    # ---- reads -----------------------------------------------------------------------------

    def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        with self.cond:
            obj = self.objects.get((resource_key(kind), namespace or "", name))
            if obj is None:
                raise _not_found(kind, name)
            return copy.deepcopy(obj)

    def list_objects(self, kind: Kind, namespace: str | None, matches: Predicate) -> tuple[list[Obj], int]:
        """Matching objects sorted by (namespace, name), and the revision they are current at."""
        rkey = resource_key(kind)
        with self.cond:
            items = [
                copy.deepcopy(obj)
                for (r, ns, _), obj in sorted(self.objects.items())
                if r == rkey and (namespace is None or ns == namespace) and matches(obj)
            ]
            return items, self.revision

    def changes_after(self, kind: Kind, namespace: str | None, revision: int) -> list[Change]:
        """Changes to ``kind`` after ``revision``; :class:`ApiError` 410 if they were compacted away."""
        with self.cond:
            if revision < self.compacted:
                raise ApiError(
                    410, "Expired", f"too old resource version: {revision} ({self.compacted})"
                )
            rkey = resource_key(kind)
            return [
                c
                for c in self.history
                if c.revision > revision
                and resource_key(c.kind) == rkey
                and (namespace is None or c.namespace == namespace)
            ]

    # ---- writes ----------------------------------------------------------------------------

    def _commit(self, kind: Kind, namespace: str, name: str, after: Obj | None) -> Obj | None:
        """Store a new version (or delete); caller holds the lock. Returns the stored object."""
        key = (resource_key(kind), namespace, name)
        before = self.objects.get(key)
        self.revision += 1
        if after is None:
            self.objects.pop(key, None)
        else:
            after["metadata"]["resourceVersion"] = str(self.revision)
            self.objects[key] = after
        self.history.append(Change(self.revision, kind, namespace, before, copy.deepcopy(after)))
        while len(self.history) > self.history_limit:
            dropped = self.history.popleft()
            self.compacted = dropped.revision
        self.cond.notify_all()
        return copy.deepcopy(after) if after is not None else None

    def create(self, kind: Kind, namespace: str | None, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{kind.kind} has no metadata.name")
        if kind.namespaced:
            namespace = namespace or meta.get("namespace") or "default"
            if meta.get("namespace") not in (None, namespace):
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
            meta["namespace"] = namespace
        else:
            namespace = ""
            meta.pop("namespace", None)
        with self.cond:
            if (resource_key(kind), namespace, name) in self.objects:
                raise ApiError(
                    409, "AlreadyExists", f'{kind.resource} "{name}" already exists',
                    {"name": name, "kind": kind.resource},
                )
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta.setdefault("generation", 1)
            meta.pop("resourceVersion", None)
            stored = self._commit(kind, namespace, name, obj)
        assert stored is not None
        return stored

    def _replace(self, kind: Kind, namespace: str, name: str, current: Obj, new: Obj, *, sub: str | None) -> Obj:
        """Write ``new`` over ``current`` with the server's rules for identity fields and status."""
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the request")
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409, "Conflict",
                f'Operation cannot be fulfilled on {kind.resource} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "kind": kind.resource},
            )
        if "status" in kind.subresources:
            if sub == "status":
                # /status writes change only the status
                status = new.get("status")
                new = copy.deepcopy(current)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
                meta = new["metadata"]
            elif "status" in current:
                new["status"] = copy.deepcopy(current["status"])
            else:
                new.pop("status", None)
        for field in ("uid", "creationTimestamp", "namespace"):
            if field in current["metadata"]:
                meta[field] = current["metadata"][field]
        meta["name"] = name
        if new.get("spec") != current.get("spec"):
            meta["generation"] = int(current["metadata"].get("generation", 1)) + 1
        stored = self._commit(kind, namespace, name, new)
        assert stored is not None
        return stored

    def update(self, kind: Kind, namespace: str | None, name: str, body: Obj, *, sub: str | None = None) -> Obj:
        ns = namespace or ""
        with self.cond:
            current = self.objects.get((resource_key(kind), ns, name))
            if current is None:
                raise _not_found(kind, name)
            return self._replace(kind, ns, name, current, copy.deepcopy(body), sub=sub)

    def patch(
        self, kind: Kind, namespace: str | None, name: str, content_type: str, patch: Any, *, sub: str | None = None
    ) -> Obj:
        ns = namespace or ""
        with self.cond:
            current = self.objects.get((resource_key(kind), ns, name))
            if current is None:
                raise _not_found(kind, name)
            try:
                patched = apply_patch(content_type, current, patch)
            except LookupError as exc:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: "
                               f"accepted media types include: application/json-patch+json, "
                               f"application/merge-patch+json, application/strategic-merge-patch+json; got {exc}"
                               ) from exc
            except (PatchError, ValueError, TypeError, IndexError) as exc:
                raise ApiError(422, "Invalid", f"the patch cannot be applied: {exc}") from exc
            if not isinstance(patched, dict):
                raise ApiError(422, "Invalid", "the patched object is not an object")
            # a patch never carries a precondition unless it names a resourceVersion itself
            meta = patched.setdefault("metadata", {})
            if not (isinstance(patch, dict) and isinstance(patch.get("metadata"), dict)
                    and "resourceVersion" in patch["metadata"]):
                meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            return self._replace(kind, ns, name, current, patched, sub=sub)

    def delete(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        ns = namespace or ""
        with self.cond:
            current = self.objects.get((resource_key(kind), ns, name))
            if current is None:
                raise _not_found(kind, name)
            self._commit(kind, ns, name, None)
            gone = copy.deepcopy(current)
            gone["metadata"]["resourceVersion"] = str(self.revision)
            return gone

    # ---- faults ----------------------------------------------------------------------------

    def compact(self) -> int:
        """Forget all history: resuming a watch from any earlier revision now gets 410."""
        with self.cond:
            self.history.clear()
            self.compacted = self.revision
            return self.compacted

    def cut_watches(self) -> None:
        """Open watch streams end abruptly (connection reset, no final chunk)."""
        with self.cond:
            self.cut_epoch += 1
            self.cond.notify_all()

    def expire_watches(self) -> None:
        """Open watch streams receive an ERROR 410 event and end, as when the watch cache falls behind."""
        with self.cond:
            self.expire_epoch += 1
            self.history.clear()
            self.compacted = self.revision
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


def _not_found(kind: Kind, name: str) -> ApiError:
    group = kind.group or ""
    resource = f"{kind.resource}.{group}" if group else kind.resource
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": kind.resource})
