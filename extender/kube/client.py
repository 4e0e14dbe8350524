"""A typed face on the official ``kubernetes`` client: plain JSON in and out, our errors, explicit timeouts.

Why not hand the generated models around: they are untyped for mypy, large to build for thousands
of nodes, and each caller here needs a handful of fields, which :mod:`extender.kube.objects` parses
with pydantic. So lists are read raw (``_preload_content=False``), watches use the client's own
:class:`kubernetes.watch.Watch` with ``return_type="object"`` (events arrive as dicts), and
everything the client raises is mapped by :func:`extender.kube.errors.kube_errors`.

Configuration: an explicit kubeconfig file wins; otherwise the in-cluster service account when
running in a pod (``KUBERNETES_SERVICE_HOST`` is set); otherwise ``$KUBECONFIG`` /
``~/.kube/config``. The configuration object is private to each client (never the library's
global default), so two clients in one process can point at two servers.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

import yaml
from kubernetes import client as _client
from kubernetes import config as _config
from kubernetes import watch as _watch
from urllib3 import BaseHTTPResponse
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import MaxRetryError, ResponseError
from urllib3.util.retry import Retry

from extender.core.errors import KubeError
from extender.files import open_regular
from extender.kube.errors import kube_errors

# the client is only partly typed: everything from it is Any here, and nothing of it leaves this module
k8s: Any = _client
k8s_config: Any = _config
k8s_watch: Any = _watch

JSON = dict[str, Any]
#: A list of objects (a name of its own: inside KubeClient, ``list`` is the method).
Objects = list[JSON]
Resource = Literal["nodes", "pods"]

#: Seconds to open a connection to the API server.
CONNECT_TIMEOUT_S = 10.0
#: Seconds to wait for one reply to a plain request (list pages included).
REQUEST_TIMEOUT_S = 60.0
#: Seconds to wait for each read of a container's log (:meth:`KubeClient.read_pod_log`): calibration
#: records a start without its engine's phases rather than hold the sync's writer.
LOG_TIMEOUT_S = 5.0
#: Objects per list page: big clusters are listed in pages rather than one huge response.
PAGE_SIZE = 500
#: The longest ``Retry-After`` waited for inside one call, in seconds (see :class:`_Retry`).
LONGEST_WAIT_IN_CALL_S = 5.0


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ``ADDED``, ``MODIFIED``, ``DELETED`` or ``BOOKMARK`` with its object."""

    type: str
    object: JSON

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion") or "")


def read_json(response: Any, action: str) -> dict[str, Any]:
    """The JSON object of a raw reply (its connection released), or :class:`KubeError` saying what came instead.

    A reply that is not a JSON object (an HTML page from a proxy or a web console the kubeconfig
    points at by mistake, a truncated body) would otherwise escape as ``ValueError`` and end the
    thread that made the call (a reflector), where our error is retried with backoff and logged.
    """
    try:
        data = response.data
    finally:
        response.release_conn()
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        text = bytes(data or b"")[:80].decode("utf-8", "replace")
        raise KubeError(f"{action}: the API server's reply is not JSON: {' '.join(text.split())!r}") from None
    if not isinstance(body, dict):
        raise KubeError(f"{action}: the API server sent a JSON {type(body).__name__}, not an object")
    return body


class WatchStream:
    """An open watch; iterate it for events, :meth:`stop` it from another thread to end the iteration."""

    def __init__(self, describe: str, start: Any) -> None:
        self._describe = describe
        self._start = start
        self._watch: Any = k8s_watch.Watch(return_type="object")

    def __iter__(self) -> Iterator[WatchEvent]:
        with kube_errors(self._describe):
            for event in self._start(self._watch):
                # the client yields None for a line that is not JSON (see read_json)
                if not isinstance(event, dict) or not isinstance(event.get("raw_object"), dict):
                    raise KubeError(f"{self._describe}: the API server sent a line that is not a watch event")
                yield WatchEvent(str(event.get("type")), event["raw_object"])

    def stop(self) -> None:
        """End the stream now (shuts the socket down, so a blocked read returns)."""
        self._watch.stop()


class Listing:
    """The objects of one list request, fetched a page (:data:`PAGE_SIZE` objects) at a time as it is iterated.

    Why not one Python list of every object: a parsed object weighs about six times its JSON (a
    small pod is about 20 KiB as dicts), so a cluster's 100,000 pods held at once take about 2 GiB,
    well past what a sync is given, where one page at a time is a few MiB. A consumer that keeps
    only what it needs of each object (:mod:`extender.kube.objects`) then holds a page at most.

    Iterate it once, to the end: :attr:`resource_version` (the list's, to watch from) is known after
    the last page, and :attr:`complete` says it was reached. A page that fails raises
    :class:`~extender.core.errors.KubeError` from the iteration, after the earlier pages' objects
    were handed out, so a consumer must not act on a partial list (build the new state aside, swap
    it in at the end).
    """

    def __init__(self, lister: Any, what: str, *, field_selector: str | None = None,
                 label_selector: str | None = None) -> None:
        self._lister = lister
        self._what = what
        self._field_selector = field_selector
        self._label_selector = label_selector
        #: The list's resourceVersion (all pages are one consistent snapshot), once iterated to the end.
        self.resource_version = ""
        #: Set when the last page was read.
        self.complete = False
        #: Objects handed out so far.
        self.count = 0
        self._token: str | None = None

    def __iter__(self) -> Iterator[JSON]:
        token: str | None = None
        while True:
            for item in self._page(token):
                self.count += 1
                yield item
            if not self._token:
                self.complete = True
                return
            token = self._token

    def _page(self, token: str | None) -> list[JSON]:
        """One page's objects; sets :attr:`resource_version` and the next page's token."""
        kwargs: dict[str, Any] = {"limit": PAGE_SIZE, "_preload_content": False,
                                  "_request_timeout": (CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S)}
        if self._field_selector:
            kwargs["field_selector"] = self._field_selector
        if self._label_selector:
            kwargs["label_selector"] = self._label_selector
        if token:
            kwargs["_continue"] = token
        action = f"listing {self._what}"
        with kube_errors(action):
            page = read_json(self._lister(**kwargs), action)
        meta = page.get("metadata") or {}
        self.resource_version = str(meta.get("resourceVersion") or "")
        self._token = meta.get("continue") or None
        return list(page.get("items") or [])


class _Retry(Retry):
    """urllib3's default retries (three), except that a long ``Retry-After`` ends the call at once.

    urllib3 retries an idempotent request (GET, PUT, DELETE) answered ``429`` or ``503`` with a
    ``Retry-After``, sleeping what the server asked each time, without a limit: three 32 s waits
    from API Priority and Fairness (its longest) would hold a tick or a reflector's thread for a
    minute and a half where no stop reaches it. A wait up to :data:`LONGEST_WAIT_IN_CALL_S` (the
    max-in-flight filter's 1 s, a restarting server's 5 s) is still waited for in the call; a longer
    one returns the answer, and the caller gets it as
    :attr:`extender.kube.errors.KubeApiError.retry_after_s` (a reflector waits at least that,
    where a stop can interrupt it; the scaler and the warmer try again at their next tick).
    """

    def increment(self, method: str | None = None, url: str | None = None, response: BaseHTTPResponse | None = None,
                  error: Exception | None = None, _pool: ConnectionPool | None = None,
                  _stacktrace: TracebackType | None = None) -> Self:
        wait = self.get_retry_after(response) if response is not None else None
        if wait is not None and wait > LONGEST_WAIT_IN_CALL_S:
            # with raise_on_status off, urllib3 hands the response back instead of raising this
            reason = ResponseError(f"Retry-After {wait:g}s is too long to wait in a call")
            raise MaxRetryError(_pool, url, reason) from reason  # type: ignore[arg-type]  # as urllib3 does
        return super().increment(method, url, response, error, _pool, _stacktrace)


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An official ``ApiClient``: in-cluster when running in a pod and no kubeconfig is given, else
    from the kubeconfig (``None``: ``$KUBECONFIG`` or ``~/.kube/config``)."""
    configuration = k8s.Configuration()
    action = "loading the Kubernetes client configuration"
    in_cluster = kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if kubeconfig is not None:  # the client's own errors would call a missing file "no configuration found"
        try:
            open_regular(kubeconfig).close()
        except OSError as exc:
            raise KubeError(f"{action}: kubeconfig {kubeconfig}: cannot read: {exc.strerror or exc}") from None
    elif not in_cluster:
        kubeconfig = default_kubeconfig(os.environ, action)
    with kube_errors(action):
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            try:
                k8s_config.load_kube_config(config_file=kubeconfig, context=context,
                                            client_configuration=configuration, persist_config=False)
            except (yaml.YAMLError, UnicodeDecodeError, TypeError, AttributeError, KeyError) as exc:
                # the client reads any YAML as a kubeconfig and trips on what is not one (or not text)
                where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
                why = ""
                if isinstance(exc, yaml.YAMLError):
                    why = f": {' '.join(str(exc).split())}"
                elif isinstance(exc, UnicodeDecodeError):
                    why = f": not UTF-8 text ({exc.reason} at byte {exc.start})"
                raise KubeError(f"{action}: {where} is not a kubeconfig (a YAML mapping with clusters, users "
                                f"and contexts){why}") from None
    configuration.retries = _Retry(total=3, raise_on_status=False)
    return k8s.ApiClient(configuration=configuration)


def default_kubeconfig(environ: Mapping[str, str], action: str) -> str:
    """The kubeconfig files to read without ``--kubeconfig``, as kubectl finds them: those of
    ``$KUBECONFIG`` (a list joined by ``:``) that exist, else ``~/.kube/config`` when the variable is
    unset or empty; each checked to be a regular file. The client's own lookup read the variable once,
    when it was imported, took an empty one as no file at all (where kubectl reads ~/.kube/config),
    said "No configuration found" without naming the file it looked for, and waited for ever on a FIFO.
    """
    listed = environ.get("KUBECONFIG", "").strip()
    where = "$KUBECONFIG" if listed else "the default kubeconfig"
    paths = [os.path.expanduser(p) for p in listed.split(os.pathsep) if p] if listed \
        else [os.path.expanduser("~/.kube/config")]
    found = [p for p in paths if os.path.lexists(p)]
    if not found:
        what = f"$KUBECONFIG names no file that exists ({', '.join(paths) or repr(listed)})" if listed else \
            f"no kubeconfig: {paths[0]} does not exist and $KUBECONFIG is not set"
        raise KubeError(f"{action}: {what}; give --kubeconfig, or run in a pod with a service account")
    for path in found:
        try:
            open_regular(path).close()
        except OSError as exc:
            raise KubeError(f"{action}: kubeconfig {path} ({where}): cannot read: {exc.strerror or exc}") from None
    return os.pathsep.join(found)


class KubeClient:
    """The few API calls extender makes, typed."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client
        self._core: Any = k8s.CoreV1Api(api_client)
        self._batch: Any = k8s.BatchV1Api(api_client)

    @classmethod
    def connect(cls, kubeconfig: str | None = None, *, context: str | None = None) -> KubeClient:
        """A client from a kubeconfig file, the pod's service account, or the default kubeconfig."""
        return cls(api_client(kubeconfig, context))

    @property
    def host(self) -> str:
        """The API server URL this client talks to."""
        return str(self._api.configuration.host)

    def close(self) -> None:
        self._api.close()

    def _lister(self, resource: Resource, namespace: str | None = None) -> Any:
        if resource == "nodes":
            return self._core.list_node
        if namespace is None:
            return self._core.list_pod_for_all_namespaces
        return functools.partial(self._core.list_namespaced_pod, namespace)

    def list(
        self, resource: Resource, *, field_selector: str | None = None, label_selector: str | None = None
    ) -> tuple[list[JSON], str]:
        """Every matching object (all pages) and the resourceVersion to watch from.

        Holds the whole list in memory at once: for what can be large (every pod of a cluster),
        iterate :meth:`listing` instead.
        """
        listing = self.listing(resource, field_selector=field_selector, label_selector=label_selector)
        return [*listing], listing.resource_version

    def listing(
        self, resource: Resource, *, namespace: str | None = None, field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> Listing:
        """Every matching object, fetched page by page as the caller iterates (:class:`Listing`).

        ``namespace``: only that namespace's pods (one namespaced list, which a Role can grant);
        ``None``: every namespace. Nodes have none.
        """
        if namespace is not None and resource == "nodes":
            raise KubeError("listing nodes: nodes belong to no namespace")
        what = resource if namespace is None else f"{resource} in namespace {namespace!r}"
        return Listing(self._lister(resource, namespace), what, field_selector=field_selector,
                       label_selector=label_selector)

    def watch(
        self, resource: Resource, resource_version: str, *, timeout_s: int, field_selector: str | None = None
    ) -> WatchStream:
        """A watch from ``resource_version`` with bookmarks, ended by the server after ``timeout_s``."""
        lister = self._lister(resource)
        kwargs: dict[str, Any] = {
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout_s,
            # a connection that dies without a FIN would otherwise block forever: the server ends
            # every watch after timeout_s, so silence well beyond that means the peer is gone
            "_request_timeout": (CONNECT_TIMEOUT_S, timeout_s + 30.0),
        }
        if field_selector:
            kwargs["field_selector"] = field_selector
        return WatchStream(f"watching {resource}", lambda w: w.stream(lister, **kwargs))

    def get_node(self, name: str) -> JSON:
        return self._read(f"reading node {name!r}", lambda **kw: self._core.read_node(name, **kw))

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> JSON:
        """JSON merge patch (RFC 7386) of a Node: ``None`` values delete keys (labels, annotations)."""
        return self._read(f"patching node {name!r}", lambda **kw: self._core.patch_node(
            name, dict(patch), _content_type="application/merge-patch+json", **kw))

    def read_pod_log(self, namespace: str, name: str, *, container: str, limit_bytes: int,
                     timeout_s: float = LOG_TIMEOUT_S) -> tuple[str, bool]:
        """The first ``limit_bytes`` of a container's log, and whether it may go on (``pods/log``).

        The server is asked for ``limitBytes`` and the reply is read only that far, whatever it
        sends: a log is never held whole. When it was cut, the text ends at its last complete line
        (a line cut mid-number must not be read as a smaller number). Undecodable bytes become
        U+FFFD. Errors are mapped (a 403 without the grant, a 404 pod, a 400 for a container the
        pod has not, or not yet started); ``timeout_s`` bounds each read of the reply.
        """
        action = f"reading the log of container {container!r} of pod {namespace}/{name}"
        with kube_errors(action):
            response = self._core.read_namespaced_pod_log(
                name, namespace, container=container, limit_bytes=limit_bytes, _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT_S, timeout_s))
            data = b""
            try:
                data = response.read(limit_bytes + 1)
            finally:
                # the rest of a reply longer than asked for is never read: its connection is closed,
                # not handed back to the pool with bytes pending
                if len(data) <= limit_bytes:
                    response.release_conn()
                else:
                    response.close()
        # the server stops at about limitBytes: a reply that reached it may have been cut
        cut = len(data) >= limit_bytes
        if cut:
            data = data[:limit_bytes]
            data = data[: data.rfind(b"\n") + 1]
        return bytes(data).decode("utf-8", "replace"), cut

    # ---- the cache warmer: Jobs in its namespace, Events about them ------------------------------

    def list_jobs(self, namespace: str, *, label_selector: str | None = None) -> Objects:
        """Every Job in ``namespace`` matching ``label_selector`` (all pages)."""

        def lister(**kwargs: Any) -> Any:
            return self._batch.list_namespaced_job(namespace, **kwargs)

        return [*Listing(lister, f"jobs in namespace {namespace!r}", label_selector=label_selector)]

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        """Create a Job; an existing name raises :class:`~extender.kube.errors.KubeApiError` with status 409."""
        name = body.get("metadata", {}).get("name", "?")
        return self._read(f"creating job {namespace}/{name}",
                          lambda **kw: self._batch.create_namespaced_job(namespace, dict(body), **kw))

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and, in the background, its pods (a 404 raises: the caller decides if that is fine)."""
        self._read(f"deleting job {namespace}/{name}",
                   lambda **kw: self._batch.delete_namespaced_job(name, namespace,
                                                                   propagation_policy="Background", **kw))

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        """Create a core/v1 Event (an existing name raises with status 409)."""
        name = body.get("metadata", {}).get("name", "?")
        return self._read(f"creating event {namespace}/{name}",
                          lambda **kw: self._core.create_namespaced_event(namespace, dict(body), **kw))

    def _read(self, action: str, call: Any) -> JSON:
        """Run one request with our timeouts, raw JSON in the reply, errors mapped."""
        with kube_errors(action):
            return read_json(call(_preload_content=False, _request_timeout=(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S)),
                             action)
