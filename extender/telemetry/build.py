"""``extender_build_info`` and the process collectors, added to a process's registry at start.

``extender_build_info{version, python_version, command} 1`` follows the ``<name>_build_info``
convention of Prometheus itself: a gauge of value 1 whose labels carry the build, so a query can
join it (``* on(instance) group_left(version) extender_build_info``) or count versions during a rollout.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge, PlatformCollector, ProcessCollector, disable_created_metrics

from extender import __version__

BUILD_INFO = "extender_build_info"


def add_build_info(registry: CollectorRegistry, command: str) -> Gauge:
    """Register ``extender_build_info`` on ``registry`` for ``command`` (``serve``, ``scale``, ...), value 1.

    Its multiprocess mode is ``max``: under gunicorn's workers the series is one, not one per worker.
    Also turns off prometheus_client's ``*_created`` series for the process (a gauge family per
    counter and histogram that no query of ours reads, and that doubles what Prometheus stores).
    """
    disable_created_metrics()  # type: ignore[no-untyped-call]
    gauge = Gauge(BUILD_INFO, "Build of this process: version, Python version and command; always 1.",
                  ["version", "python_version", "command"], registry=registry,
                  multiprocess_mode="max")
    gauge.labels(__version__, platform.python_version(), command).set(1)
    return gauge


def add_process_collectors(registry: CollectorRegistry) -> None:
    """``process_*`` (CPU, memory, file descriptors, start time) and ``python_info`` for a single-process server.

    Not for gunicorn's multiprocess mode: there the reply comes from one worker of several, and
    its process figures would be presented as the whole server's.
    """
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
