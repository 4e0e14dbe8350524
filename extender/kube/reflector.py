"""List-then-watch of one resource, kept going forever: client-go's reflector, in a few lines.

The loop::

    list                     -> on_replace(all objects, page by page); remember the list's
                                resourceVersion (RV)
    watch from RV            -> on_event(type, object) for each change; RV := the event's RV
                                (BOOKMARK events only move RV: nothing changed for us, but a
                                later resume starts from there instead of an old, compacted RV)
    stream ends (timeout)    -> watch again from RV: nothing is missed, the server replays after RV
    stream cut / unreachable -> wait (exponential backoff with jitter), watch again from RV
    429 Too Many Requests    -> the same, waiting at least the server's Retry-After
    410 Gone (RV compacted)  -> list again: on_replace gets the whole truth, so whatever happened
                                while we were away (deletions included) is applied
    relist() (a new policy)  -> end the watch, list again: on_replace sees every object anew

Every event is applied in order by the thread that runs :meth:`Reflector.run`; the handlers do
their own locking. :meth:`Reflector.interrupt` ends a blocked watch so a stop is prompt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from extender.core.backoff import Backoff
from extender.core.errors import KubeError
from extender.kube.client import JSON, Listing, Resource, WatchStream
from extender.kube.errors import KubeGoneError, asked_wait_s

log = logging.getLogger(__name__)

#: Seconds the API server keeps one watch open before we start a fresh one (it ends it then).
DEFAULT_WATCH_TIMEOUT_S = 300


class Lister(Protocol):
    """What a reflector needs from :class:`extender.kube.client.KubeClient`."""

    def listing(self, resource: Resource, *, field_selector: str | None = None) -> Listing: ...

    def watch(
        self, resource: Resource, resource_version: str, *, timeout_s: int, field_selector: str | None = None
    ) -> WatchStream: ...


class Reflector:
    """Keeps handlers told about every change of one resource."""

    def __init__(
        self,
        client: Lister,
        resource: Resource,
        *,
        on_replace: Callable[[Iterable[JSON]], None],
        on_event: Callable[[str, JSON], None],
        field_selector: str | None = None,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
        backoff: Backoff | None = None,
        note: Callable[[str, str], None] | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.on_replace = on_replace
        self.on_event = on_event
        self.field_selector = field_selector
        self.watch_timeout_s = watch_timeout_s
        self.backoff = backoff or Backoff()
        #: Told ``(resource, what)`` for each list, watch opened, failure and event (metrics).
        self.note = note or (lambda resource, what: None)
        #: Set once the first list has been handed to ``on_replace``.
        self.synced = threading.Event()
        self.resource_version = ""
        #: Counters for logs and tests: lists done, watches opened.
        self.lists = 0
        self.watches = 0
        self._stream: WatchStream | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._relist = threading.Event()

    def run(self, stop: threading.Event) -> None:
        """List and watch until ``stop`` is set (call :meth:`interrupt` too, to end a blocked watch)."""
        need_list = True
        while not (stop.is_set() or self._stopping.is_set()):
            try:
                if need_list or self._relist.is_set():
                    self._relist.clear()
                    self._list()
                    need_list = False
                self._watch(stop)
            except KubeGoneError as exc:
                # our RV was compacted away: only a fresh list can tell what we missed
                log.info("%s: %s; listing again", self.resource, exc, extra={"resource": self.resource})
                need_list = True
            except KubeError as exc:
                if stop.is_set() or self._stopping.is_set():
                    break
                if self._relist.is_set():  # we ended the watch ourselves (:meth:`relist`)
                    continue
                self.note(self.resource, "error")
                delay = self.backoff.next(at_least=asked_wait_s(exc))
                log.warning("%s: %s; retrying in %.1fs", self.resource, exc, delay,
                            extra={"resource": self.resource, "error": str(exc), "retry_s": delay})
                if stop.wait(delay):
                    break

    def _list(self) -> None:
        """Hand the whole list to ``on_replace`` as it arrives, page by page (a cluster's pods do not
        fit in memory at once as raw objects: :class:`~extender.kube.client.Listing`).

        ``on_replace`` must read every object before it changes anything: a page that fails raises
        out of its iteration, and the handler's state must then be the old one.
        """
        listing = self.client.listing(self.resource, field_selector=self.field_selector)
        self.on_replace(listing)
        if not listing.complete:
            raise KubeError(f"listing {self.resource}: the handler stopped reading after "
                            f"{listing.count} object(s); a partial list cannot replace the view")
        resource_version = listing.resource_version
        self.lists += 1
        self.note(self.resource, "list")
        self.resource_version = resource_version
        self.synced.set()
        self.backoff.reset()
        log.info("%s: listed %d object(s) at resourceVersion %s", self.resource, listing.count, resource_version,
                 extra={"resource": self.resource, "objects": listing.count, "resource_version": resource_version})

    def _watch(self, stop: threading.Event) -> None:
        stream = self.client.watch(self.resource, self.resource_version, timeout_s=self.watch_timeout_s,
                                   field_selector=self.field_selector)
        with self._lock:
            if self._stopping.is_set() or self._relist.is_set():
                stream.stop()
                return
            self._stream = stream
        self.watches += 1
        self.note(self.resource, "watch")
        try:
            for event in stream:
                if stop.is_set() or self._relist.is_set():
                    return
                if event.type != "BOOKMARK":
                    self.on_event(event.type, event.object)
                    self.note(self.resource, event.type)
                if event.resource_version:
                    self.resource_version = event.resource_version
                self.backoff.reset()
        finally:
            with self._lock:
                self._stream = None

    def relist(self) -> None:
        """List again soon (the handlers now read objects differently, e.g. under a new policy).

        Ends the open watch; :meth:`run` then lists, hands the whole list to ``on_replace`` and
        watches from the new list's resourceVersion, so nothing is missed in between.
        """
        with self._lock:
            self._relist.set()
            stream = self._stream
        if stream is not None:
            stream.stop()

    def interrupt(self) -> None:
        """Stop for good: end the open watch (if any) so :meth:`run` returns promptly."""
        with self._lock:
            self._stopping.set()
            stream = self._stream
        if stream is not None:
            stream.stop()
