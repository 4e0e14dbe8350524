"""KEDA's ``externalscaler.ExternalScaler`` gRPC service over the scaler's published decisions (grpc.aio).

Four calls (docs/kubernetes-interfaces.md section 7), each answered from Redis through
:class:`~extender.state.decisions.DecisionStore` with the rules of :mod:`extender.keda.reading`:

==================  ==================================================================================
``GetMetricSpec``   one metric, ``extender-desired-replicas`` (or the trigger's ``metric``), target 1
``GetMetrics``      its value: the desired replicas (or standby placeholders) published for the
                    workload (0: not decided yet)
``IsActive``        ``max(desired, minReplicas) > 0``; for standby placeholders, ``standby > 0``
``StreamIsActive``  the same, sent at once, then whenever it changes (trigger type ``external-push``)
==================  ==================================================================================

Status codes: ``INVALID_ARGUMENT`` for trigger metadata that names no workload, ``NOT_FOUND`` for a
workload the policy does not autoscale in that namespace (or a metric name we do not serve),
``DATA_LOSS`` when that workload's published entry cannot be decoded (the other workloads are
answered as usual), ``UNAVAILABLE`` when Redis cannot be read. KEDA shows the message in its log and the
ScaledObject's events; its HPA then keeps the replicas it has, as with the External Metrics API.

Each ``GetMetrics`` answered is recorded (:class:`~extender.telemetry.served.ServedMetrics`,
``api="keda"``): the time and window of the decision served per workload, and the values served
without one, as the External Metrics API records its items. ``GetMetrics`` is the value KEDA's HPA
scales on, and KEDA asks for it at every ``pollingInterval`` (its ``GetMetricsAndActivity`` calls
``GetMetrics``, then ``IsActive``), at zero replicas too, and for each read of the HPA through
KEDA's metrics server. ``IsActive`` and ``StreamIsActive`` are not recorded: the polled
``IsActive`` follows a ``GetMetrics`` that already counted that poll (counting both would double
every rate, and the KEDA scaler's would not compare with the External Metrics API's), a stream
sends only when the answer changes (no rate to read), and neither carries a value the HPA uses.

The unary calls read Redis on every call, as the External Metrics API does. Streams share one
:class:`Board`: a task that reads the published hash every ``interval_s`` (one ``HGETALL`` for every
open stream together), takes policy edits (:class:`~extender.files.PolicyFile`) and wakes the
streams when something changed. While Redis cannot be read a stream stays open and sends nothing
(KEDA keeps the last answer it got), and so does a stream whose workload's entry cannot be
decoded; a workload that leaves the policy ends its streams with
``NOT_FOUND``; :meth:`Board.close` (SIGTERM) ends them with ``OK`` so KEDA reconnects to another
replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Protocol

import grpc
from prometheus_client import CollectorRegistry

from extender.core.errors import ExtenderError, UnknownNameError
from extender.files import PolicyFile
from extender.keda import externalscaler_pb2 as pb
from extender.keda import externalscaler_pb2_grpc as pb_grpc
from extender.keda.metrics import KedaMetrics
from extender.keda.reading import (
    TARGET_SIZE,
    Reading,
    Served,
    Target,
    TriggerError,
    UnreadableDecisionError,
    check_metric,
    read,
    resolve,
    served_workloads,
)
from extender.state.decisions import Published, Unreadable
from extender.telemetry.served import ServedMetrics

log = logging.getLogger(__name__)

#: The service's full name, as the gRPC health service and reflection know it.
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["ExternalScaler"].full_name


class PublishedSource(Protocol):
    """Where decisions are read (:class:`~extender.state.decisions.DecisionStore`); blocking, raises our errors."""

    def published_entries(self) -> Mapping[str, Published | Unreadable]: ...


class Board:
    """What the open streams share: the served workloads, the latest published values, a wake-up.

    :meth:`run` polls every ``interval_s``; ``generation`` goes up whenever the workloads or the
    published values changed, or the board closed. ``published`` is ``None`` until the first good
    read and while reads fail. ``on_health`` hears ``True``/``False`` when reads start or stop working;
    ``on_workloads`` hears the served workloads whenever a policy edit changes them (the recorder of
    what ``GetMetrics`` served labels those alone).
    """

    def __init__(self, workloads: Mapping[str, Served], source: PublishedSource, *, interval_s: float = 1.0,
                 policy_file: PolicyFile | None = None,
                 on_health: Callable[[bool], Awaitable[None]] | None = None,
                 on_workloads: Callable[[Mapping[str, Served]], None] | None = None) -> None:
        self.workloads: Mapping[str, Served] = dict(workloads)
        self.source = source
        self.interval_s = interval_s
        self.policy_file = policy_file
        self.on_health = on_health
        self.on_workloads = on_workloads
        self.published: Mapping[str, Published | Unreadable] | None = None
        self.healthy: bool | None = None
        self.generation = 0
        self.closed = False
        self._changed = asyncio.Condition()
        self._stopping = asyncio.Event()

    async def _bump(self) -> None:
        async with self._changed:
            self.generation += 1
            self._changed.notify_all()

    async def poll(self) -> None:
        """One round: policy edits, then the published values; wakes the streams on any change."""
        changed = False
        if self.policy_file is not None:
            outcome = await asyncio.to_thread(self.policy_file.poll)
            if outcome.policy is not None:
                workloads = served_workloads(outcome.policy)
                changed = workloads != self.workloads
                self.workloads = workloads
                if changed and self.on_workloads is not None:
                    self.on_workloads(workloads)
        published: Mapping[str, Published | Unreadable] | None
        try:
            published = await asyncio.to_thread(self.source.published_entries)
        except ExtenderError as exc:
            if self.healthy is not False:
                log.error("KEDA scaler: the scaler's decisions cannot be read (%s); streams hold", exc)
            published = None
        changed = changed or (published is not None and published != self.published)
        self.published = published
        healthy = published is not None
        if healthy != self.healthy:
            self.healthy = healthy
            if healthy:
                log.info("KEDA scaler: reading the scaler's decisions")
            if self.on_health is not None:
                await self.on_health(healthy)
        if changed:
            await self._bump()

    async def run(self) -> None:
        """Poll until :meth:`close`; a failed round is logged and the next one runs on time."""
        while not self.closed:
            try:
                await self.poll()
            except Exception:  # never let the task die: streams would hold for ever
                log.exception("KEDA scaler: watching the decisions failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval_s)

    async def close(self) -> None:
        """End :meth:`run` and every stream waiting in :meth:`next`."""
        self.closed = True
        self._stopping.set()
        await self._bump()

    async def next(self, seen: int) -> int | None:
        """Wait for a generation other than ``seen``; ``None`` once the board is closed."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.generation != seen or self.closed)
        return None if self.closed else self.generation


Context = grpc.aio.ServicerContext


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    """The four calls of KEDA's external scaler (module docstring)."""

    def __init__(self, board: Board, metrics: KedaMetrics | None = None, served: ServedMetrics | None = None) -> None:
        self.board = board
        self.metrics = metrics or KedaMetrics(CollectorRegistry())
        #: Where each ``GetMetrics`` value is recorded (module docstring); ``None``: nowhere.
        self.served = served
        self._told: set[str] = set()

    # ---- helpers -------------------------------------------------------------------------------

    def _note(self, message: str) -> None:
        """Log a caller's mistake once per distinct message (KEDA repeats a call every few seconds)."""
        if message not in self._told:
            if len(self._told) >= 1024:  # callers choose the names: keep the memory bounded
                self._told.clear()
            self._told.add(message)
            log.warning("KEDA scaler: %s", message)

    async def _target(self, ref: pb.ScaledObjectRef, context: Context[object, object]) -> Target:
        try:
            return resolve(ref.name, ref.namespace, ref.scalerMetadata, self.board.workloads)
        except TriggerError as exc:
            self._note(str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except UnknownNameError as exc:
            self._note(str(exc))
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))

    async def _published(self, context: Context[object, object]) -> Mapping[str, Published | Unreadable]:
        try:
            return await asyncio.to_thread(self.board.source.published_entries)
        except ExtenderError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the scaler's decisions cannot be read: {exc}")

    async def _read(self, target: Target, published: Mapping[str, Published | Unreadable],
                    context: Context[object, object]) -> Reading:
        """The target's reading; ``DATA_LOSS`` when its own entry cannot be decoded (the store logged it)."""
        try:
            return read(target, self.board.workloads, published)
        except UnreadableDecisionError as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))

    # ---- the calls -----------------------------------------------------------------------------

    async def GetMetricSpec(self, request: pb.ScaledObjectRef,  # noqa: N802 (the proto's name)
                            context: Context[object, object]) -> pb.GetMetricSpecResponse:
        with self.metrics.call("GetMetricSpec", context):
            target = await self._target(request, context)
            spec = pb.MetricSpec(metricName=target.metric, targetSize=TARGET_SIZE, targetSizeFloat=float(TARGET_SIZE))
            return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(self, request: pb.GetMetricsRequest,  # noqa: N802
                         context: Context[object, object]) -> pb.GetMetricsResponse:
        with self.metrics.call("GetMetrics", context):
            return await self._get_metrics(request, context)

    async def _get_metrics(self, request: pb.GetMetricsRequest,
                           context: Context[object, object]) -> pb.GetMetricsResponse:
        target = await self._target(request.scaledObjectRef, context)
        try:
            check_metric(target, request.metricName)
        except UnknownNameError as exc:
            self._note(str(exc))
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        reading = await self._read(target, await self._published(context), context)
        value = pb.MetricValue(metricName=target.metric, metricValue=reading.replicas,
                               metricValueFloat=float(reading.replicas))
        if self.served is not None:  # the policy's name (resolve refused any other); a name dropped since is ignored
            self.served.record(target.workload, reading.decision)
        return pb.GetMetricsResponse(metricValues=[value])

    async def IsActive(self, request: pb.ScaledObjectRef,  # noqa: N802
                       context: Context[object, object]) -> pb.IsActiveResponse:
        with self.metrics.call("IsActive", context):
            target = await self._target(request, context)
            reading = await self._read(target, await self._published(context), context)
            return pb.IsActiveResponse(result=reading.active)

    async def StreamIsActive(self, request: pb.ScaledObjectRef,  # noqa: N802
                             context: Context[object, object]) -> AsyncIterator[pb.IsActiveResponse]:
        self.metrics.streams.inc()
        try:
            with self.metrics.call("StreamIsActive", context, timed=False):
                async for response in self._stream(request, context):
                    yield response
        finally:
            self.metrics.streams.dec()

    async def _stream(self, request: pb.ScaledObjectRef,
                      context: Context[object, object]) -> AsyncIterator[pb.IsActiveResponse]:
        target = await self._target(request, context)
        seen = self.board.generation
        last = (await self._read(target, await self._published(context), context)).active
        yield pb.IsActiveResponse(result=last)
        while True:
            generation = await self.board.next(seen)
            if generation is None:
                return  # shutting down: OK, and KEDA reconnects
            seen = generation
            target = await self._target(request, context)  # the policy may have dropped the workload
            if self.board.published is None:
                continue  # Redis cannot be read: KEDA keeps the last answer
            try:
                active = read(target, self.board.workloads, self.board.published).active
            except UnreadableDecisionError:
                continue  # its entry cannot be decoded (logged by the store): KEDA keeps the last answer
            if active != last:
                last = active
                yield pb.IsActiveResponse(result=active)
