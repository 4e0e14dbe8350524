"""Serving engines' metric names, and reading them out of a Prometheus text exposition.

The scaler needs three things from a serving pod: a counter of finished requests, counters of
prompt and generation tokens, and a gauge of requests waiting in the queue. Each engine names them
differently; :data:`ENGINES` maps the policy's ``signal.engine`` to the names:

* vLLM (``/metrics`` on the API port): ``vllm:request_success_total`` (labelled by
  ``finished_reason``), ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:num_requests_waiting``, ``vllm:num_requests_running``;
* SGLang (``--enable-metrics``): ``sglang:num_requests_total``, ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``.

Parsing uses prometheus_client's own parser. A metric counts as *present* when its family is
declared in the exposition, even with no samples yet (a labelled counter before its first
request): that is a real zero. A family that is not there at all is *missing*, which the signal
sources treat as "no observation" for that pod, never as zero load.

A counter is a count: a sample of one that is NaN, infinite or negative makes the whole reading
unusable, never a zero (which the next good reading would take for a counter reset, counting the
pod's whole history as new demand). So does a series given twice (the same name and labels), which
Prometheus refuses too. A NaN gauge is an engine's "not computed yet" and is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

from extender.core.errors import InvalidValueError, UnknownNameError
from extender.core.quoting import clip


@dataclass(frozen=True)
class EngineMetrics:
    """The metric names of one serving engine (sample names, counters with their ``_total``)."""

    requests: tuple[str, ...]
    tokens: tuple[str, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]


#: Engine name (as in the policy's ``signal.engine``) -> its metric names.
ENGINES: Mapping[str, EngineMetrics] = MappingProxyType({
    "vllm": EngineMetrics(
        requests=("vllm:request_success_total",),
        tokens=("vllm:prompt_tokens_total", "vllm:generation_tokens_total"),
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
    ),
    "sglang": EngineMetrics(
        requests=("sglang:num_requests_total",),
        tokens=("sglang:prompt_tokens_total", "sglang:generation_tokens_total"),
        waiting=("sglang:num_queue_reqs",),
        running=("sglang:num_running_reqs",),
    ),
})


def engine(name: str) -> EngineMetrics:
    """The metric names of engine ``name``; :class:`UnknownNameError` lists the known engines."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownNameError(f"no serving engine {name!r} (known: {', '.join(sorted(ENGINES))})") from None


def _family_names(sample_name: str) -> tuple[str, ...]:
    # prometheus_client names a counter family without its "_total" suffix
    return (sample_name, sample_name.removesuffix("_total")) if sample_name.endswith("_total") else (sample_name,)


def read_sums(text: str, names: Iterable[str], counters: Iterable[str] = ()) -> dict[str, float | None]:
    """Per wanted sample name: the sum over every series in ``text``, or ``None`` if the family is missing.

    ``counters``: the wanted names that are counters (rules in the module docstring); the others'
    non-finite samples are skipped. Raises :class:`InvalidValueError` when the text is not a valid
    exposition (a scrape of the wrong port), gives a series twice, or a counter a value that is no count.
    """
    wanted, counts = set(names), set(counters)
    sums: dict[str, float | None] = dict.fromkeys(wanted)
    declared = {f: n for n in wanted for f in _family_names(n)}
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise InvalidValueError(f"not a Prometheus exposition: {exc}") from None
    for family in families:
        owner = declared.get(family.name)
        if owner is not None and sums[owner] is None:
            sums[owner] = 0.0
        for sample in family.samples:
            if sample.name not in wanted:
                continue
            series = (sample.name, frozenset(sample.labels.items()))
            if series in seen:
                raise InvalidValueError(f"series {_series(sample.name, sample.labels)} is given twice")
            seen.add(series)
            if sample.name in counts and not (math.isfinite(sample.value) and sample.value >= 0):
                raise InvalidValueError(f"counter {_series(sample.name, sample.labels)} is {sample.value:g}, no count")
            if math.isfinite(sample.value):  # a NaN gauge says nothing; it must not poison the sum
                sums[sample.name] = (sums[sample.name] or 0.0) + float(sample.value)
    return sums


def _series(name: str, labels: Mapping[str, str]) -> str:
    """A series as an exposition writes it, cut to 120 characters (it quotes what a pod answered)."""
    text = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    return clip(text, 120)
