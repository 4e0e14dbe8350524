"""The policy's ``autoscaling`` section and the signal-source registry it names."""

from __future__ import annotations

from typing import get_args

import pytest

from extender.core.errors import PolicyError, UnknownNameError
from extender.core.policy import EngineName, SignalSourceName, parse_policy
from extender.scaler.exposition import ENGINES
from extender.scaler.prometheus import PrometheusSource, default_queries, promql_duration
from extender.scaler.scrape import ScrapeSource
from extender.scaler.signals import SOURCES, build_source, source_factory
from tests.scaler_policy import make_policy, policy_text


def test_registry_names_match_the_policy_literals() -> None:
    assert set(SOURCES) == set(get_args(SignalSourceName))
    assert set(ENGINES) == set(get_args(EngineName))


def test_unknown_source_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"no signal source 'kafka' \(known: prometheus, scrape\)"):
        source_factory("kafka")


def test_sources_are_built_from_the_policy() -> None:
    policy = make_policy(signal={"source": "prometheus", "prometheus": {"url": "http://prom:9090/"}})
    qwen = build_source(policy.profile("qwen3"))
    assert isinstance(qwen, PrometheusSource)
    assert qwen.url == "http://prom:9090"
    assert isinstance(build_source(policy.profile("llama")), ScrapeSource)


def problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    return [(p.path, p.message) for p in err.value.problems]


BAD = [
    ("prometheus-without-section", {"source": "prometheus"}, "needs a prometheus section"),
    ("unknown-source", {"source": "kafka"}, "'scrape' or 'prometheus'"),
    ("unknown-engine", {"engine": "tgi"}, "'vllm' or 'sglang'"),
    ("port-out-of-range", {"port": 70000}, "must be <= 65535"),
    ("relative-path", {"path": "metrics"}, "should match pattern"),
    ("unknown-field", {"intervall": "5s"}, "unknown field (allowed: source, engine"),
]


@pytest.mark.parametrize(("signal", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_signal_sections(signal: dict[str, object], words: str) -> None:
    found = problems(policy_text(signal=signal))
    assert len(found) == 1
    path, message = found[0]
    assert path.startswith("profiles[0].autoscaling.signal")
    assert words in message


def test_min_above_max_is_an_error() -> None:
    (found,) = problems(policy_text(min_replicas=50))
    assert found[0] == "profiles[0].autoscaling"
    assert "minReplicas 50 is larger than maxReplicas 40" in found[1]


def test_autoscaling_needs_capacity() -> None:
    text = policy_text().replace("    capacity: {perReplica: 4, unit: requests/s}\n", "")
    (found,) = problems(text)
    assert found == ("profiles[0].autoscaling", "autoscaling needs capacity (perReplica and unit) to turn demand "
                                                "into replicas")


PROMQL = [
    ("requests", "qwen3", {"source": "prometheus", "prometheus": {"url": "http://p"}},
     "sum(rate(vllm:request_success_total[60s]))", "sum(vllm:num_requests_waiting)"),
    ("selector-and-window", "qwen3",
     {"source": "prometheus", "prometheus": {"url": "http://p", "selector": 'namespace="llm"', "rateWindow": "30s"}},
     'sum(rate(vllm:request_success_total{namespace="llm"}[30s]))', 'sum(vllm:num_requests_waiting{namespace="llm"})'),
    ("sglang", "qwen3", {"source": "prometheus", "engine": "sglang", "prometheus": {"url": "http://p"}},
     "sum(rate(sglang:num_requests_total[60s]))", "sum(sglang:num_queue_reqs)"),
    ("overridden-metrics", "qwen3",
     {"source": "prometheus", "rateMetrics": ["a_total", "b_total"], "queueMetrics": ["my_queue"],
      "prometheus": {"url": "http://p"}},
     "sum(rate(a_total[60s])) + sum(rate(b_total[60s]))", "sum(my_queue)"),
]


@pytest.mark.parametrize(("workload", "signal", "rate", "queue"), [p[1:] for p in PROMQL], ids=[p[0] for p in PROMQL])
def test_default_promql(workload: str, signal: dict[str, object], rate: str, queue: str) -> None:
    assert default_queries(make_policy(signal=signal).profile(workload)) == (rate, queue)


def test_tokens_queue_promql_converts_requests_to_tokens() -> None:
    text = policy_text().replace("signal: {source: scrape, engine: vllm, port: 8000}",
                                 "signal: {source: prometheus, prometheus: {url: 'http://p'}}")
    rate, queue = default_queries(parse_policy(text, "p.yaml").profile("llama"))
    tokens = "sum(rate(vllm:prompt_tokens_total[60s])) + sum(rate(vllm:generation_tokens_total[60s]))"
    assert rate == tokens
    assert queue == f"(sum(vllm:num_requests_waiting)) * ({tokens}) / (sum(rate(vllm:request_success_total[60s])))"


@pytest.mark.parametrize(("seconds", "text"), [(60.0, "60s"), (1.5, "1500ms"), (0.0001, "1ms"), (300.0, "300s")])
def test_promql_durations(seconds: float, text: str) -> None:
    rendered = promql_duration(seconds)
    assert rendered == text
