"""Every metric the code registers, built in this process, and the metric names a PromQL expression reads.

:func:`registered` builds each process's metric classes on fresh registries (the scheduler
extender's, the scaler's with its warmer's and its External Metrics API's, the agent's, the
sync's, the KEDA scaler's with what it served, build info and process collectors), for the scaler
tests' policy, and returns every sample name they expose: ``_total``, ``_bucket``, ``_count``,
``_sum`` included, and the name of a gauge whose series appear only with events.
tests/test_metrics_exposition.py checks the same families against the real processes.
:func:`metric_names` walks a parsed PromQL expression (``promql-parser``, the Rust parser's Python
binding) for the names of its vector selectors.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cache
from typing import Any

import promql_parser
from prometheus_client import CollectorRegistry

from extender.agent.metrics import AgentMetrics
from extender.keda.metrics import KedaMetrics
from extender.kube.metrics import SyncMetrics
from extender.scaler.loop import scaled_profiles
from extender.scaler.metrics import ScalerMetrics
from extender.telemetry.build import add_build_info, add_process_collectors
from extender.telemetry.served import ServedMetrics
from extender.warm.metrics import WarmMetrics
from tests.scaler_policy import make_policy

#: Attributes of promql-parser's nodes that hold sub-expressions.
CHILDREN = ("lhs", "rhs", "expr", "param", "vector_selector")


@cache
def registered() -> frozenset[str]:
    """Every sample name the code can expose (module docstring)."""
    assert not os.environ.get("PROMETHEUS_MULTIPROC_DIR"), "the catalog is built without multiprocess mode"
    from extender.api.scheduler.metrics import Metrics

    policy = make_policy()
    registries = [Metrics().registry]
    scale = CollectorRegistry()
    add_build_info(scale, "scale")
    add_process_collectors(scale)
    ScalerMetrics(scale, policy)
    WarmMetrics(scale).set_policy(policy)
    workloads = [profile.name for profile in scaled_profiles(policy)]
    ServedMetrics(scale, "external-metrics", workloads)
    registries.append(scale)
    agent = CollectorRegistry()
    AgentMetrics(agent)
    registries.append(agent)
    keda = CollectorRegistry()
    KedaMetrics(keda)
    ServedMetrics(keda, "keda", workloads)
    registries.append(keda)
    sync = CollectorRegistry()
    SyncMetrics(sync, policy)
    registries.append(sync)
    names: set[str] = set()
    for r in registries:
        for family in r.collect():
            names.update(s.name for s in family.samples)
            if family.type == "gauge":  # a labelled gauge whose series come with events has no sample yet
                names.add(family.name)
            if family.type == "histogram":
                names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
    return frozenset(names)


def _walk(node: Any) -> Iterator[str]:
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            yield node.name
        return
    for attr in CHILDREN:
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield from _walk(child)
    for arg in getattr(node, "args", None) or ():
        yield from _walk(arg)


def metric_names(expr: str) -> set[str]:
    """The metric names the expression selects (raises ``ValueError`` when it does not parse)."""
    return set(_walk(promql_parser.parse(expr)))
