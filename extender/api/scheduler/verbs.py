"""The scheduler verbs: ``POST /filter``, ``POST /prioritize``, and ``/explain`` for people.

Every reply to the scheduler is HTTP 200 with the Go field names, except bad input (400) and an
oversized body (413). Whatever goes wrong on our side gives the *neutral* reply instead of an
error, so the extender is never the reason a pod stays pending unless a hard rule says so:

=======================  ===============================================  ====================
situation                reply                                            counted as
=======================  ===============================================  ====================
pod matches no profile   filter: all pass; prioritize: every score 0      outcome=unmatched
no snapshot yet          neutral                                          reason=no_snapshot
store down or hung,      neutral                                          reason=store_unavailable
snapshot older than the
bound
snapshot older than the  neutral                                          reason=stale_snapshot
bound (Redis answers
with errors, or the
refresher is stuck)
any exception            neutral                                          reason=exception
time budget overrun      neutral                                          reason=budget
invalid JSON, no Pod,    HTTP 400 ``{"error": ...}``                      outcome=bad_request
no NodeNames/Nodes,
a number beyond float64
body over the limit      HTTP 413 ``{"error": ...}``                      (werkzeug)
a bug outside the guard  HTTP 500 ``{"error": ...}``                      outcome=error
=======================  ===============================================  ====================

``/explain`` is for people and shares the worker's threads with the scheduler's calls, so it is
bounded: one at a time per worker (another gets HTTP 429 with ``Retry-After``), and at most
:data:`EXPLAIN_MAX_NODES` nodes per report (more is a 400 asking for the nodes by name). A few
explain calls can then hold at most one thread of each worker, for at most one report's work.

No ``bind`` verb: binding through an extender replaces the in-tree binder (the extender must then
create the Binding itself, docs/kubernetes-interfaces.md 2.7) and buys nothing for cache-aware placement, which is
decided at scoring time. No ``preempt`` verb either: our verdicts do not depend on which pods run.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from extender.api.scheduler.engine import Engine, explain_report
from extender.api.scheduler.metrics import Metrics
from extender.api.scheduler.refresher import Refresher, Throttle
from extender.api.scheduler.settings import Settings
from extender.api.scheduler.wire import (
    BadRequestError,
    ExtenderArgs,
    NodeInfo,
    PodInfo,
    decode_json,
    encode_error,
    encode_filter_result,
    encode_priorities,
    encode_uniform_priorities,
    get_ci,
    has_ci,
    parse_args,
)
from extender.core.inventory import InventorySnapshot

log = logging.getLogger(__name__)

JSON = "application/json"

#: The routes the scheduler calls; the chart's scheduler configuration (deploy/helm/extender) must name the same verbs.
FILTER_VERB = "filter"
PRIORITIZE_VERB = "prioritize"


#: The most nodes one ``/explain`` report covers: Kubernetes' tested scale (5,000 nodes per cluster),
#: about 3 MB of indented JSON. A report of more nodes than any cluster has is only a cost.
EXPLAIN_MAX_NODES = 5000


class BusyError(Exception):
    """Another ``/explain`` is running in this worker."""


class BudgetExceededError(Exception):
    """The request used up its time budget; the reply goes neutral."""


class SchedulerService:
    """Turns request bodies into reply bodies; owns the fail-open policy."""

    def __init__(self, settings: Settings, refresher: Refresher, metrics: Metrics, throttle: Throttle) -> None:
        self.settings = settings
        self.refresher = refresher
        self.metrics = metrics
        self.throttle = throttle
        self._explaining = threading.Lock()

    def handle(self, verb: str, body: bytes) -> tuple[int, str]:
        """Answer one ``filter`` or ``prioritize`` call: ``(HTTP status, JSON text)``."""
        started = time.perf_counter()
        try:
            return self._handle(verb, body, started)
        except BadRequestError as exc:  # found while writing the reply: a number JSON cannot carry
            self.metrics.requests.labels(verb, "bad_request").inc()
            return 400, encode_error(str(exc))
        finally:
            self.metrics.latency.labels(verb).observe(time.perf_counter() - started)

    def _handle(self, verb: str, body: bytes, started: float) -> tuple[int, str]:
        try:
            args = parse_args(body)
        except BadRequestError as exc:
            self.metrics.requests.labels(verb, "bad_request").inc()
            return 400, encode_error(str(exc))
        try:
            now = time.time()
            health = self.refresher.health(now)
            profile = health.policy.profile_for_pod(args.pod.labels, args.pod.annotations)
            if profile is None:
                self.metrics.requests.labels(verb, "unmatched").inc()
                return 200, neutral(verb, args)
            if health.fail_open is not None or health.engine is None:
                reason = health.fail_open or "no_snapshot"
                return 200, self._fail_open(verb, args, reason, f"snapshot age {health.age_s:.1f} s")
            self._check_budget(started)
            reply = self._decide(verb, args, health.engine, profile.name, now)
            self._check_budget(started)
        except BudgetExceededError:
            return 200, self._fail_open(verb, args, "budget", f"over the {self.settings.request_budget_s} s budget")
        except BadRequestError:
            raise
        except Exception as exc:
            held = self.throttle.allow(f"exception:{verb}:{type(exc).__name__}")
            if held is not None:
                log.exception("%s for pod %s failed; answering neutrally%s", verb, args.pod.key,
                              f" [{held} similar failures not logged]" if held else "",
                              extra={"verb": verb, "pod": args.pod.key,
                                     "decision": "fail_open", "reason": "exception", "suppressed": held})
            return 200, self._fail_open(verb, args, "exception", None, logged=True)
        self.metrics.requests.labels(verb, "scored").inc()
        return 200, reply

    def _check_budget(self, started: float) -> None:
        if time.perf_counter() - started > self.settings.request_budget_s:
            raise BudgetExceededError

    def _decide(self, verb: str, args: ExtenderArgs, engine: Engine, profile_name: str, now: float) -> str:
        profile = engine.policy.profile(profile_name)
        if verb == PRIORITIZE_VERB:
            if args.cache_mode:
                return engine.prioritize_names(profile, args.names, now)
            return encode_priorities(engine.prioritize_nodes(profile, args.nodes, now))
        if args.cache_mode:
            decision = engine.filter_names(profile, args.names, now)
        else:
            decision = engine.filter_nodes(profile, args.nodes, now)
        return encode_filter_result(args, decision.passing, decision.failed, decision.unresolvable)

    def _fail_open(
        self, verb: str, args: ExtenderArgs, reason: str, detail: str | None, *, logged: bool = False
    ) -> str:
        self.metrics.fail_open.labels(verb, reason).inc()
        self.metrics.requests.labels(verb, "fail_open").inc()
        if not logged:
            held = self.throttle.allow(f"fail-open:{reason}")
            if held is not None:
                log.warning("answering %s neutrally (fail open: %s%s)%s", verb, reason,
                            f", {detail}" if detail else "",
                            f" [{held} more since the last message]" if held else "",
                            extra={"verb": verb, "pod": args.pod.key, "decision": "fail_open", "reason": reason,
                                   "suppressed": held})
        return neutral(verb, args)

    def explain(self, pod: PodInfo, nodes: list[NodeInfo] | None) -> dict[str, Any]:
        """The explain report for ``pod`` against the worker's current snapshot.

        Raises :class:`BusyError` while another report is being made in this worker, and
        :class:`BadRequestError` for more than :data:`EXPLAIN_MAX_NODES` nodes.
        """
        if not self._explaining.acquire(blocking=False):
            raise BusyError
        try:
            now = time.time()
            health = self.refresher.health(now)
            engine = self.refresher.engine
            if engine is None:  # nothing loaded yet: explain against an empty inventory (everything unknown)
                engine = Engine(health.policy, InventorySnapshot.build(health.policy, [], taken_at=now))
            named = nodes is not None
            nodes = nodes if nodes is not None else engine.all_nodes()
            if len(nodes) > EXPLAIN_MAX_NODES:
                if named:  # the request named them: ask for fewer, in more than one report
                    raise BadRequestError(f"the request names {len(nodes)} nodes, more than one report covers "
                                          f"({EXPLAIN_MAX_NODES}); ask about at most {EXPLAIN_MAX_NODES} a time")
                raise BadRequestError(f"the inventory holds {len(nodes)} nodes, more than one report covers "
                                      f"({EXPLAIN_MAX_NODES}); name the nodes to explain (?nodes=a,b)")
            report = explain_report(engine, pod, nodes, now, fail_open=health.fail_open)
            report["snapshot"]["ageSeconds"] = round(health.age_s, 3)
            return report
        finally:
            self._explaining.release()


def neutral(verb: str, args: ExtenderArgs) -> str:
    """The reply that leaves scheduling to the in-tree plugins: every node passes, every score equal."""
    if verb == PRIORITIZE_VERB:
        return encode_uniform_priorities(args.names, 0, args.plain)
    return encode_filter_result(args, None, {}, {})


# ---------------------------------------------------------------------------------------------
# Blueprint
# ---------------------------------------------------------------------------------------------

bp = Blueprint("scheduler", __name__)


def _service() -> SchedulerService:
    service: SchedulerService = current_app.extensions["extender"]
    return service


def _reply(status: int, body: str) -> Response:
    return Response(body, status=status, mimetype=JSON)


def read_body(limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (else 413), read in one call.

    Werkzeug enforces ``MAX_CONTENT_LENGTH`` by wrapping the stream in a reader that pulls 8 KiB at
    a time through Python; at 15,000 names that alone cost a millisecond and a half per request.
    kube-scheduler always sends ``Content-Length`` (Go marshals the body into a buffer first), so
    we check it and read exactly that much; a body without one (chunked) is read up to the limit.
    """
    stream = request.environ["wsgi.input"]
    length = request.content_length
    if length is not None:
        if length > limit:
            raise RequestEntityTooLarge()
        data: bytes = stream.read(length)
        return data
    chunks: list[bytes] = []
    size = 0
    while chunk := stream.read(min(65536, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise RequestEntityTooLarge()
    return b"".join(chunks)


@bp.post(f"/{FILTER_VERB}")
def filter_nodes() -> Response:
    """kube-scheduler's extender filter call."""
    service = _service()
    return _reply(*service.handle(FILTER_VERB, read_body(service.settings.max_body_bytes)))


@bp.post(f"/{PRIORITIZE_VERB}")
def prioritize_nodes() -> Response:
    """kube-scheduler's extender prioritize call."""
    service = _service()
    return _reply(*service.handle(PRIORITIZE_VERB, read_body(service.settings.max_body_bytes)))


@bp.route("/explain", methods=["GET", "POST"])
def explain() -> Response:
    """Per-node breakdown for a pod posted as JSON: a Pod object, or an ExtenderArgs body.

    ``?nodes=a,b,c`` (or the body's ``NodeNames``/``Nodes``) limits the nodes; otherwise every node
    in the inventory is explained.
    """
    body = request.get_data(cache=False)
    try:
        data = decode_json(body) if body else None
    except BadRequestError as exc:
        return _reply(400, encode_error(str(exc)))
    if not isinstance(data, dict):
        return _reply(400, encode_error("post a Pod object, or an ExtenderArgs body with Pod"))
    nodes: list[NodeInfo] | None = None
    pod_obj = get_ci(data, "Pod")
    if not has_ci(data, "Pod"):  # a Pod object itself
        pod = PodInfo.from_object(data)
    elif pod_obj is None:  # an ExtenderArgs body whose Pod is null, refused as /filter refuses it
        return _reply(400, encode_error("body has no Pod object (ExtenderArgs.Pod)"))
    elif get_ci(data, "NodeNames") is None and get_ci(data, "Nodes") is None:
        if not isinstance(pod_obj, dict):
            return _reply(400, encode_error("Pod must be an object"))
        pod = PodInfo.from_object(pod_obj)
    else:
        # Candidates that cannot be read are an error, never "explain every node" (the caller
        # asked about some nodes and would get an answer about others).
        try:
            args = parse_args(body)
        except BadRequestError as exc:
            return _reply(400, encode_error(str(exc)))
        pod, nodes = args.pod, args.node_infos()
    query = request.args.get("nodes")
    if query:
        nodes = [NodeInfo(n.strip(), {}, ()) for n in query.split(",") if n.strip()]
    try:
        report = _service().explain(pod, nodes)
    except BusyError:
        reply = _reply(429, encode_error("another /explain is running in this worker; retry in a second"))
        reply.headers["Retry-After"] = "1"
        return reply
    except BadRequestError as exc:
        return _reply(400, encode_error(str(exc)))
    return _reply(200, json.dumps(report, indent=2))
