"""The registry of demand signal sources, selected by name in a profile's ``autoscaling.signal.source``.

======================  =====================================================================
``scrape``              the workload's pods, found through the Kubernetes API, scraped directly
                        (:mod:`extender.scaler.scrape`)
``prometheus``          PromQL instant queries against a Prometheus server
                        (:mod:`extender.scaler.prometheus`)
======================  =====================================================================

Adding a source is one module implementing :class:`~extender.scaler.observation.SignalSource`
and one row here (the policy's ``SignalSourceName`` literal lists the same names; a test checks
that the two agree). A factory reads the profile's ``autoscaling.signal`` and ``capacity`` only
(:func:`source_inputs`): the scale loop keeps a source, and what it learnt (a pod's previous
counters), across a policy edit that changed neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from extender.core.errors import InvalidValueError, UnknownNameError
from extender.core.policy import Profile
from extender.scaler.observation import Fetcher, SignalSource, http_get
from extender.scaler.prometheus import PrometheusSource
from extender.scaler.scrape import ScrapeSource

#: Builds a profile's source; ``Fetcher`` does the HTTP GETs (tests may pass their own).
SourceFactory = Callable[[Profile, Fetcher], SignalSource]

SOURCES: Mapping[str, SourceFactory] = MappingProxyType({
    "scrape": ScrapeSource.for_profile,
    "prometheus": PrometheusSource.for_profile,
})


def source_factory(name: str) -> SourceFactory:
    """The factory registered as ``name``; :class:`UnknownNameError` lists the known sources."""
    try:
        return SOURCES[name]
    except KeyError:
        raise UnknownNameError(f"no signal source {name!r} (known: {', '.join(sorted(SOURCES))})") from None


def build_source(profile: Profile, fetch: Fetcher = http_get) -> SignalSource:
    """The signal source of a profile with an ``autoscaling`` section."""
    if profile.autoscaling is None:
        raise InvalidValueError(f"profile {profile.name!r} has no autoscaling section")
    return source_factory(profile.autoscaling.signal.source)(profile, fetch)


def source_inputs(profile: Profile) -> tuple[object, object]:
    """What :func:`build_source` builds ``profile``'s source from: its ``autoscaling.signal`` and its
    ``capacity`` (the unit chooses the counters). Equal inputs build an equal source."""
    return (profile.autoscaling.signal if profile.autoscaling is not None else None), profile.capacity
