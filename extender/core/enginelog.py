"""The phase times a vLLM or SGLang server reports as it starts, read from its log's text (pure).

Calibration (:mod:`extender.core.calibration`) sees a start's total; the engine itself logs how long
some of its phases took. :func:`parse_engine_log` reads those lines, of either engine (a log is one
engine's, and no line below is written by both except where said), and gives :class:`EnginePhases`.

vLLM:

==================  ===============================================================================
phase               the lines read (the vLLM file that logs them, and which engine)
==================  ===============================================================================
``weightsLoad``     ``Model loading took <mem> GB and <s> seconds`` (V0 ``worker/model_runner.py``
                    and early V1 ``v1/worker/gpu_model_runner.py``), ``... <mem> GiB and <s>
                    seconds`` (V1) and ``... <mem> GiB memory and <s> seconds`` (later V1, also
                    ``v1/worker/gpu/model_runner.py``). When a log has none of them:
                    ``Loading weights took <s> seconds`` (the default loader,
                    ``model_executor/model_loader/default_loader.py``), which leaves out building
                    the model and processing weights after the read. Older V0 logged
                    ``Loading model weights took <mem> GB``: memory, no time, not read.
``compile``         ``torch.compile takes <s> s in total`` (``compilation/monitor.py``, V0 with
                    ``-O3`` and V1) or ``torch.compile took <s> s in total`` (its later wording);
                    else the ``(compilation: <s> s ...)`` of the engine-init line below (later
                    V1); else the per-graph lines of ``compilation/backends.py``:
                    ``Compiling a graph for <shape|dynamic shape|compile range (a, b)> takes <s> s``
                    and ``Directly load the compiled graph(s) for <...> from the cache, took <s> s``
                    (each counts from the same start, so a worker's longest is its compile; the
                    Dynamo bytecode transform before it is not in them). What a line names between
                    ``for`` and its time is read only up to 200 characters (a bound that keeps the
                    parse linear in a long line).
``compileCached``   false when any ``Compiling a graph for ...`` line (something compiled from
                    scratch), else true when a ``Directly load the compiled graph...`` or
                    ``Directly load AOT compilation from path`` (``compilation/decorators.py``) line,
                    else unknown. Unknown in an SGLang log (below), whatever it holds.
``graphCapture``    ``Graph capturing finished in <s> secs, took <mem> GiB`` (V0
                    ``worker/model_runner.py``, V1 ``gpu_model_runner.py``; logged in whole
                    seconds, so a capture under half a second reads 0 and is not read).
``initEngine``      ``init engine (profile, create kv cache, warmup model) took <s> seconds`` (V0
                    ``engine/llm_engine.py``, earlier V1 ``v1/engine/core.py``) or ``... took <s>
                    s`` with an optional ``(compilation: <s> s ...)`` (later V1). In both engines
                    this span holds the memory profiling run (where torch.compile runs), the KV
                    cache allocation and the warm-up (where graphs are captured).
==================  ===============================================================================

SGLang (the files named are under ``python/sglang/srt/``; SGLang logs no engine-init span, so
``initEngine`` stays unknown and so does :attr:`EnginePhases.engine_s`):

==================  ===============================================================================
phase               the lines read (the SGLang file that logs them)
==================  ===============================================================================
``weightsLoad``     ``Load weight end. elapsed=<s> s, type=<class>, ...`` (``model_executor/
                    model_runner.py``, later releases; a speculative-decoding draft model logs its
                    own after the target's). Earlier releases log ``Load weight end. type=<class>,
                    dtype=<dtype>, avail mem=<mem> GB``: memory, no time, not read.
``compile``         the piecewise backend (``model_executor/compilation/backend.py``) logs
                    ``Compiling a graph for dynamic shape takes <s> s`` in vLLM's words, read as
                    above. SGLang logs it whether or not Inductor's cache served the compile, and
                    logs no hit or miss, so ``compileCached`` stays unknown in an SGLang log: one
                    with a line in SGLang's stamp (``[<date> <time>...]`` at its start) or an
                    SGLang weight-load or capture line. (Releases before this one stored false
                    there, which reads as a miss: docs/calibration.md.) Plain
                    ``--enable-torch-compile`` compiles inside the graph capture and logs no time
                    of its own.
``graphCapture``    ``Capture cuda graph end. Time elapsed: <s> s. ...`` (earlier
                    ``model_executor/model_runner.py``; ``cuda`` may be ``cpu`` or ``npu``, and the
                    speculative worker's ``Capture draft cuda graph end.`` and ``Capture draft
                    extend cuda graph end.`` have the same tail), ``Capture piecewise CUDA graph
                    end. Time elapsed: <s> s. ...`` (``model_runner.py``; its span holds the
                    piecewise compile above), and ``Capture <target|draft> <decode|verify|prefill|
                    extend> CUDA graph end. [step=<k>, ]elapsed=<s> s, ...`` (later
                    ``model_executor/device_graphs.py`` and the speculative workers). What is read
                    is ``Capture``, one to three words, ``graph end.``, then either tail.
==================  ===============================================================================

Each SGLang line is prefixed by ``[<date> <time>]`` and, in a scheduler process, its ranks:
``[2025-01-02 03:04:05 TP1]``, ``[... DP0 TP1 EP1]`` (``managers/scheduler.py`` builds the tag from
the DP, PP, TP, EP and other rank ids that are in use; ``utils/common.py`` puts it in the stamp). Those
ranks are SGLang's workers below; a stamp without ranks (one GPU) is the main process's.

Workers. With tensor (or data) parallelism each worker process logs its own load, compile and
capture, prefixed by its process tag (``(Worker_TP1 pid=123)``, ``(VllmWorkerProcess pid=123)``,
``(RayWorkerWrapper pid=123)``, ``(EngineCore_DP0 pid=123)``; lines without a tag are the main
process's). They combine as::

    phase = max over processes p of  sum of p's values of the phase      (per-graph compile lines:
                                                                          max within p, then max)

Within one process a phase's lines are parts run one after another (a draft model loaded after the
main one, an encoder compiled after the language model); the processes run the phase at the same
time and the start waits for the slowest.

What is not read: a line that matches no format, and a number that does not parse, is not finite,
is not positive or is above :data:`MAX_PHASE_S` (the whole line is then ignored, as if garbled).
A phase no line gives is ``None``. Nor is anything from the first line that says the server is up
on: ``Starting vLLM API server`` (vLLM's ``entrypoints/openai/api_server.py``, logged once its
engines are ready and before it listens) or uvicorn's ``Started server process``, ``Waiting for
application startup``, ``Application startup complete`` and ``Uvicorn running on`` (what both
engines' HTTP servers log as they start, SGLang's after its schedulers are ready), or SGLang's ``The
server is fired up and ready to roll``. Every phase is logged before it, and what follows holds
what clients send: a prompt logged with vLLM's ``--enable-log-requests`` or SGLang's
``--log-requests`` could otherwise write any phase time into calibration.

The formats were checked against copies of vLLM's and SGLang's source (the files named above, across
releases); "earlier" and "later" are as far as we can date them. A format an engine changes in a
future release is simply not read: the start is then fitted from its total, as without a log.

The engine phase the estimator calls graph capture plus engine init is
:attr:`EnginePhases.engine_s`: ``initEngine - compile`` (the init span holds the compile). vLLM's
span holds the graph capture too, so its engine init alone is ``engine_s - graphCapture``; SGLang's
capture span may hold a compile (piecewise graphs, ``--enable-torch-compile``) and SGLang logs no
init span (:mod:`extender.core.calibration` says which rows each gives).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Annotated

from pydantic import ConfigDict, Field

from extender.core.schema import Schema
from extender.core.units import read_float

#: The longest phase read (about 116 days); a larger number is taken for garbage.
MAX_PHASE_S = 1e7

PhaseSeconds = Annotated[float, Field(gt=0, le=MAX_PHASE_S, allow_inf_nan=False)]


class EnginePhases(Schema):
    """The seconds of the phases a vLLM or SGLang start reported (each ``None`` when its log did not say)."""

    model_config = ConfigDict(populate_by_name=True)

    #: Loading the model and its weights (reading them, local or streamed, included).
    weights_load: PhaseSeconds | None = None
    #: torch.compile, from scratch or from its cache.
    compile: PhaseSeconds | None = None
    #: Whether torch.compile loaded everything from its cache (``None``: the log did not say, as
    #: an SGLang log never does; a false stored by an earlier release for an SGLang start reads as
    #: a miss, as it was written).
    compile_cached: bool | None = None
    #: CUDA graph capture.
    graph_capture: PhaseSeconds | None = None
    #: vLLM's whole engine init: profiling (with the compile), KV cache and warm-up (with the capture).
    #: SGLang logs no such span.
    init_engine: PhaseSeconds | None = None

    @property
    def engine_s(self) -> float | None:
        """``initEngine - compile`` (compile 0 when not reported): graph capture plus the rest of init.

        ``None`` without an engine-init time or when the difference is not positive.
        """
        if self.init_engine is None:
            return None
        rest = self.init_engine - (self.compile or 0.0)
        return rest if rest > 0 else None

    @property
    def empty(self) -> bool:
        """True when the log gave no phase at all."""
        return all(v is None for v in (self.weights_load, self.compile, self.compile_cached, self.graph_capture,
                                       self.init_engine))


#: A number as the engine prints it, up to the next blank. The engines' log grammar is ASCII (their
#: stamps, words and digits), so every pattern here reads ``\s``, ``\S`` and ``\b`` as ASCII (``re.ASCII``).
_N = r"(?a:(\S+?))"
#: What a per-graph line names between ``for`` and ``takes`` / ``from the cache`` (``dynamic shape``,
#: ``shape 8``, ``compile range (1, 8192)``): at most 200 characters. Bounded, so each of a line's
#: ``Compiling a graph for`` is tried over a bounded span: an unbounded ``.+`` there tried the whole
#: rest of the line from each of them, and a line repeating the phrase (an engine that logs prompts
#: logs whatever a client sends) cost the square of its length (a 1 MiB line, about 90 s of the sync).
_GRAPH_SET = r".{1,200}"
_MODEL_LOADING = re.compile(r"Model loading took \S+ Gi?B(?: memory)? and " + _N + r" seconds", re.ASCII)
_LOADING_WEIGHTS = re.compile(r"Loading weights took " + _N + r" seconds")
_COMPILE_TOTAL = re.compile(r"torch\.compile (?:takes|took) " + _N + r" s in total")
_COMPILED_GRAPH = re.compile(r"Compiling a graph for " + _GRAPH_SET + r" takes " + _N + r" s\b", re.ASCII)
_LOADED_GRAPH = re.compile(r"Directly load the compiled graph(?:\(s\))? for " + _GRAPH_SET + r" from the cache, took "
                           + _N + r" s\b", re.ASCII)
_LOADED_AOT = re.compile(r"Directly load AOT compilation from path \S", re.ASCII)
_GRAPH_CAPTURE = re.compile(r"Graph capturing finished in " + _N + r" secs")
#: SGLang's weight-load line (only the versions that give ``elapsed=``; older ones log memory only).
_SGL_LOAD_WEIGHT = re.compile(r"\bLoad weight end\. elapsed=" + _N + r" s\b", re.ASCII)
#: SGLang's graph-capture lines: ``Capture <words> graph end.`` then ``Time elapsed: <s> s`` (older) or
#: ``[step=<k>, ]elapsed=<s> s`` (later); one to three words name the graph set and its device.
_SGL_CAPTURE = re.compile(r"\bCapture (?:[A-Za-z]+ ){1,3}graph end\. (?:Time elapsed: |(?:step=[0-9]+, )?elapsed=)"
                          + _N + r" s\b", re.ASCII)
_INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _N
                          + r" (?:seconds|s)\b(?: \(compilation: " + _N + r" s\b)?", re.ASCII)
#: A worker's tag at the start of a line (after any leading spaces); engines print ASCII digits, so
#: every digit read in a line is ``[0-9]`` (``\d`` takes any script's, and a line a client wrote could
#: then pass for a worker's or a stamp).
_PROCESS = re.compile(r"^\s*\(([A-Za-z_][^()]*?\bpid=[0-9]+)\)", re.ASCII)
#: An SGLang scheduler's rank tag inside its time stamp: ``[2025-01-02 03:04:05 DP0 TP1]`` gives ``DP0 TP1``.
_SGL_RANK = re.compile(r"^\s*\[(?:[0-9]{4}-)?[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}((?: [A-Z][A-Z_]*[0-9]+)+)\]",
                       re.ASCII)
#: SGLang's time stamp at the start of a line, with or without ranks (vLLM's starts with its level).
_SGL_STAMP = re.compile(r"^\s*\[(?:[0-9]{4}-)?[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(?: [A-Z][A-Z_]*[0-9]+)*\]",
                        re.ASCII)
_LINES = re.compile(r"[\r\n]+")
#: The server is up (module docstring): startup is over, and the lines from here on may hold requests.
_SERVING = re.compile(r"Starting vLLM API server|Started server process|Waiting for application startup"
                      r"|Application startup complete|Uvicorn running on|The server is fired up and ready to roll")


def _seconds(text: str | None) -> float | None:
    """The number if it is finite, positive and at most :data:`MAX_PHASE_S`, else ``None``."""
    if text is None:
        return None
    try:
        value = read_float(text)  # ASCII digits: an engine prints no 1_000, no other script's digits
    except ValueError:
        return None
    return _bounded(value)


def _bounded(value: float) -> float | None:
    return value if math.isfinite(value) and 0 < value <= MAX_PHASE_S else None


#: kind -> process -> the values its lines gave, in order.
Found = dict[str, dict[str, list[float]]]


def _combine(per_process: dict[str, list[float]], within: Callable[[Iterable[float]], float]) -> float | None:
    """``max over processes of within(values)``; ``None`` when no process has one (or the result is too large)."""
    tops = [within(values) for values in per_process.values() if values]
    return _bounded(max(tops)) if tops else None


def _record(found: Found, kind: str, process: str, pattern: re.Pattern[str], line: str) -> bool:
    """Add the seconds ``pattern`` reads in ``line`` to ``found[kind][process]``; True if it read any."""
    match = pattern.search(line)
    value = _seconds(match.group(1)) if match else None
    if value is not None:
        found[kind][process].append(value)
    return value is not None


def parse_engine_log(text: str) -> EnginePhases:
    """The phases a vLLM or SGLang startup log reports (module docstring: lines, workers, what is ignored)."""
    kinds = ("model_loading", "loading_weights", "compile_total", "compile_init", "graph", "init", "capture")
    found: Found = {k: defaultdict(list) for k in kinds}
    compiled = loaded = sglang = False
    for line in _LINES.split(text):
        if _SERVING.search(line):
            break
        tag = _PROCESS.match(line) or _SGL_RANK.match(line)
        process = tag.group(1).strip() if tag else ""
        sglang = sglang or _SGL_STAMP.match(line) is not None
        _record(found, "model_loading", process, _MODEL_LOADING, line)
        sglang = _record(found, "model_loading", process, _SGL_LOAD_WEIGHT, line) or sglang
        _record(found, "loading_weights", process, _LOADING_WEIGHTS, line)
        _record(found, "compile_total", process, _COMPILE_TOTAL, line)
        compiled = _record(found, "graph", process, _COMPILED_GRAPH, line) or compiled
        loaded = _record(found, "graph", process, _LOADED_GRAPH, line) or loaded
        loaded = loaded or _LOADED_AOT.search(line) is not None
        _record(found, "capture", process, _GRAPH_CAPTURE, line)
        sglang = _record(found, "capture", process, _SGL_CAPTURE, line) or sglang
        init = _INIT_ENGINE.search(line)
        if init is not None and (total := _seconds(init.group(1))) is not None:
            found["init"][process].append(total)
            if (compile_s := _seconds(init.group(2))) is not None:
                found["compile_init"][process].append(compile_s)

    weights = _combine(found["model_loading"], sum)
    if weights is None and not found["model_loading"]:
        weights = _combine(found["loading_weights"], sum)
    compile_s = _combine(found["compile_total"], sum)
    if compile_s is None and not found["compile_total"]:
        compile_s = _combine(found["compile_init"], sum)
    if compile_s is None and not found["compile_total"] and not found["compile_init"]:
        compile_s = _combine(found["graph"], max)
    return EnginePhases(
        weights_load=weights,
        compile=compile_s,
        # SGLang logs its compile line on a cache hit too, and no hit or miss: unknown, not a miss
        compile_cached=None if sglang else (False if compiled else (True if loaded else None)),
        graph_capture=_combine(found["capture"], sum),
        init_engine=_combine(found["init"], sum),
    )
