"""Reading the phase times out of a vLLM or SGLang startup log (pure): every format we read, workers, garbage.

The log lines below are written for these tests in the formats of vLLM's and SGLang's own logger
calls (the module docstring names the files); the numbers and model names are made up.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from extender.core.enginelog import MAX_PHASE_S, EnginePhases, parse_engine_log

V1_TP1_COLD = """\
INFO 11-02 09:14:01 [__init__.py:239] Automatically detected platform cuda.
(EngineCore_DP0 pid=812) INFO 11-02 09:14:09 [gpu_model_runner.py:2602] Starting to load model org/model-a...
(EngineCore_DP0 pid=812) INFO 11-02 09:14:40 [default_loader.py:267] Loading weights took 29.15 seconds
(EngineCore_DP0 pid=812) INFO 11-02 09:14:41 [gpu_model_runner.py:2653] Model loading took 15.2 GiB memory and 31.402117 seconds
(EngineCore_DP0 pid=812) INFO 11-02 09:14:47 [backends.py:548] Using cache directory: /c/torch_compile_cache/ab12 for vLLM's torch.compile
(EngineCore_DP0 pid=812) INFO 11-02 09:14:47 [backends.py:559] Dynamo bytecode transform time: 6.02 s
(EngineCore_DP0 pid=812) INFO 11-02 09:15:05 [backends.py:218] Compiling a graph for dynamic shape takes 17.40 s
(EngineCore_DP0 pid=812) INFO 11-02 09:15:10 [monitor.py:34] torch.compile takes 23.42 s in total
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67 [00:09<00:00,  7.1it/s]\r
(EngineCore_DP0 pid=812) INFO 11-02 09:15:25 [gpu_model_runner.py:3480] Graph capturing finished in 11 secs, took 0.61 GiB
(EngineCore_DP0 pid=812) INFO 11-02 09:15:25 [core.py:210] init engine (profile, create kv cache, warmup model) took 43.87 seconds
(APIServer pid=700) INFO 11-02 09:15:27 [api_server.py:1880] Starting vLLM API server 0 on http://0.0.0.0:8000
"""  # noqa: E501 (log lines as vLLM writes them)

V1_NEW_CACHED = """\
(EngineCore pid=90) INFO 03-01 10:00:10 [gpu_model_runner.py:4120] Model loading took 8.1 GiB memory and 12.500000 seconds
(EngineCore pid=90) INFO 03-01 10:00:12 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.850 s
(EngineCore pid=90) INFO 03-01 10:00:13 [monitor.py:53] torch.compile took 3.10 s in total
(EngineCore pid=90) INFO 03-01 10:00:20 [gpu_model_runner.py:5011] Graph capturing finished in 6 secs, took 0.40 GiB
(EngineCore pid=90) INFO 03-01 10:00:21 [core.py:337] init engine (profile, create kv cache, warmup model) took 14.25 s (compilation: 3.10 s)
"""  # noqa: E501 (log lines as vLLM writes them)

V1_NEW_INIT_ONLY = """\
(EngineCore pid=90) INFO 03-01 10:00:21 [core.py:337] init engine (profile, create kv cache, warmup model) took 40.50 s (compilation: 22.00 s)
"""  # noqa: E501 (log lines as vLLM writes them)

V1_ENCODER = """\
(EngineCore pid=5) INFO 03-01 10:00:21 [core.py:330] init engine (profile, create kv cache, warmup model) took 60.00 s (compilation: 30.00 s \u2014 language_model: 25.00 s, encoder: 5.00 s)
"""  # noqa: E501 (log lines as vLLM writes them)

V1_NO_COMPILE = """\
(EngineCore pid=5) INFO 03-01 10:00:21 [core.py:330] init engine (profile, create kv cache, warmup model) took 7.25 s
"""

V0_TP2 = """\
INFO 01-20 08:00:00 model_runner.py:1094] Starting to load model org/model-b...
(VllmWorkerProcess pid=2201) INFO 01-20 08:00:00 model_runner.py:1094] Starting to load model org/model-b...
INFO 01-20 08:00:41 model_runner.py:1099] Model loading took 30.5012 GB and 40.912345 seconds
(VllmWorkerProcess pid=2201) INFO 01-20 08:00:44 model_runner.py:1099] Model loading took 30.5012 GB and 43.500000 seconds
INFO 01-20 08:01:02 model_runner.py:1535] Graph capturing finished in 18 secs, took 1.20 GiB
(VllmWorkerProcess pid=2201) INFO 01-20 08:01:03 model_runner.py:1535] Graph capturing finished in 19 secs, took 1.20 GiB
INFO 01-20 08:01:03 llm_engine.py:431] init engine (profile, create kv cache, warmup model) took 22.71 seconds
"""  # noqa: E501 (log lines as vLLM writes them)

V0_OLD = """\
INFO 07-10 12:00:00 model_runner.py:720] Starting to load model org/model-c...
INFO 07-10 12:00:30 weight_utils.py:236] Using model weights format ['*.safetensors']
INFO 07-10 12:00:55 model_runner.py:732] Loading model weights took 14.9888 GB
INFO 07-10 12:01:20 model_runner.py:1225] Graph capturing finished in 25 secs.
"""

LOADER_ONLY_DRAFT = """\
(Worker_TP0 pid=31) INFO 05-05 05:05:05 [default_loader.py:262] Loading weights took 20.00 seconds
(Worker_TP0 pid=31) INFO 05-05 05:05:09 [default_loader.py:262] Loading weights took 2.50 seconds
(Worker_TP1 pid=32) INFO 05-05 05:05:06 [default_loader.py:262] Loading weights took 21.00 seconds
"""

PER_GRAPH = """\
(Worker_TP0 pid=41) INFO 08-20 17:21:54 [backends.py:393] Compiling a graph for compile range (1, 2730) takes 5.57 s
(Worker_TP0 pid=41) INFO 08-20 17:21:54 [backends.py:393] Compiling a graph for compile range (2731, 8192) takes 5.60 s
(Worker_TP1 pid=42) INFO 08-20 17:21:55 [backends.py:393] Compiling a graph for compile range (1, 2730) takes 6.10 s
(Worker_TP1 pid=42) INFO 08-20 17:21:55 [backends.py:393] Compiling a graph for compile range (2731, 8192) takes 6.20 s
"""

MIXED_CACHE = """\
(Worker_TP0 pid=41) INFO 08-20 17:21:54 [backends.py:161] Directly load the compiled graph(s) for dynamic shape from the cache, took 1.500 s
(Worker_TP1 pid=42) INFO 08-20 17:21:54 [backends.py:218] Compiling a graph for dynamic shape takes 15.00 s
(Worker_TP0 pid=41) INFO 08-20 17:21:55 [monitor.py:34] torch.compile takes 4.00 s in total
(Worker_TP1 pid=42) INFO 08-20 17:21:58 [monitor.py:34] torch.compile takes 19.00 s in total
"""  # noqa: E501 (log lines as vLLM writes them)

AOT_HIT = """\
(EngineCore_DP0 pid=57) INFO 06-21 07:20:13 [decorators.py:311] Directly load AOT compilation from path /c/torch_aot_compile/ff/rank_0_0/model
(EngineCore_DP0 pid=57) INFO 06-21 07:20:13 [monitor.py:53] torch.compile took 2.89 s in total
"""  # noqa: E501 (log lines as vLLM writes them)

V0_COMPILE_SHAPES = """\
INFO 02-02 02:02:02 backends.py:300] Compiling a graph for general shape takes 30.00 s
INFO 02-02 02:02:12 backends.py:310] Directly load the compiled graph for shape 8 from the cache, took 0.120 s
INFO 02-02 02:02:40 monitor.py:33] torch.compile takes 41.50 s in total
"""


SGL_NEW_TP2 = """\
[2026-02-03 10:00:01] server_args=ServerArgs(model_path='org/model-d', tp_size=2)
[2026-02-03 10:00:09 TP0] Load weight begin. avail mem=78.10 GB
[2026-02-03 10:00:09 TP1] Load weight begin. avail mem=78.10 GB
[2026-02-03 10:00:40 TP1] Load weight end. elapsed=31.20 s, type=LlamaForCausalLM, avail mem=62.50 GB, mem usage=15.60 GB.
[2026-02-03 10:00:41 TP0] Load weight end. elapsed=32.45 s, type=LlamaForCausalLM, quant=fp8, avail mem=62.40 GB, mem usage=15.70 GB.
[2026-02-03 10:00:42 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 411200, K size: 25.10 GB, V size: 25.10 GB
[2026-02-03 10:00:42 TP0] Memory pool end. avail mem=10.20 GB
[2026-02-03 10:00:43 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=10.10 GB
[2026-02-03 10:00:55 TP1] Capture target decode CUDA graph end. elapsed=12.40 s, mem usage=0.70 GB, avail mem=9.40 GB.
[2026-02-03 10:00:56 TP0] Capture target decode CUDA graph end. elapsed=12.85 s, mem usage=0.71 GB, avail mem=9.39 GB.
[2026-02-03 10:00:57 TP0] max_total_num_tokens=411200, chunked_prefill_size=8192, available_gpu_mem=9.39 GB
[2026-02-03 10:01:05] The server is fired up and ready to roll!
"""  # noqa: E501 (log lines as SGLang writes them)

SGL_OLD_ONE_GPU = """\
[2025-03-10 08:00:05] Load weight begin. avail mem=23.40 GB
[2025-03-10 08:00:30] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=8.90 GB
[2025-03-10 08:00:31] Memory pool end. avail mem=2.10 GB
[2025-03-10 08:00:31] Capture cuda graph begin. This can take up to several minutes. avail mem=2.00 GB
[2025-03-10 08:00:39] Capture cuda graph end. Time elapsed: 7.84 s. mem usage=0.40 GB. avail mem=1.60 GB.
"""

SGL_PIECEWISE = """\
[2025-11-20 12:00:40] Load weight end. elapsed=9.10 s, type=Qwen3ForCausalLM, avail mem=60.00 GB, mem usage=16.00 GB.
[2025-11-20 12:00:50] Capture cuda graph end. Time elapsed: 5.38 s. mem usage=0.60 GB. avail mem=23.56 GB.
[2025-11-20 12:00:50] Capture piecewise CUDA graph begin. avail mem=23.56 GB
[2025-11-20 12:00:59] Compiling a graph for dynamic shape takes 9.20 s
[2025-11-20 12:01:08] Capture piecewise CUDA graph end. Time elapsed: 18.18 s. mem usage=2.32 GB. avail mem=21.24 GB.
"""

SGL_COMPILE_ONLY = """\
[2025-11-20 12:00:59] Compiling a graph for dynamic shape takes 9.20 s
"""

SGL_COMPILE_RANKS = """\
[2025-11-20 12:00:59 TP0] Compiling a graph for dynamic shape takes 9.20 s
[2025-11-20 12:00:59 TP1] Compiling a graph for dynamic shape takes 9.40 s
"""

SGL_PIECEWISE_NO_STAMP = """\
Compiling a graph for dynamic shape takes 9.20 s
Capture piecewise CUDA graph end. Time elapsed: 18.18 s. mem usage=2.32 GB. avail mem=21.24 GB.
"""

SGL_SPECULATIVE_DP = """\
[2026-04-01 09:00:30 DP0 TP0 EP0] Load weight end. elapsed=40.00 s, type=DeepseekV3ForCausalLM, avail mem=20.00 GB, mem usage=60.00 GB.
[2026-04-01 09:00:31 DP1 TP1 EP1] Load weight end. elapsed=41.00 s, type=DeepseekV3ForCausalLM, avail mem=20.00 GB, mem usage=60.00 GB.
[2026-04-01 09:00:34 DP0 TP0 EP0] Load weight end. elapsed=3.50 s, type=DeepseekV3ForCausalLMNextN, avail mem=19.00 GB, mem usage=1.00 GB.
[2026-04-01 09:00:34 DP1 TP1 EP1] Load weight end. elapsed=1.50 s, type=DeepseekV3ForCausalLMNextN, avail mem=19.00 GB, mem usage=1.00 GB.
[2026-04-01 09:00:50 DP0 TP0 EP0] Capture target verify CUDA graph end. elapsed=10.00 s, mem usage=1.10 GB, avail mem=17.90 GB.
[2026-04-01 09:00:50 DP1 TP1 EP1] Capture target verify CUDA graph end. elapsed=11.00 s, mem usage=1.10 GB, avail mem=17.90 GB.
[2026-04-01 09:00:53 DP0 TP0 EP0] Capture draft decode CUDA graph end. elapsed=2.00 s, mem usage=0.20 GB, avail mem=17.70 GB.
[2026-04-01 09:00:55 DP0 TP0 EP0] Capture draft extend CUDA graph end. step=0, elapsed=1.50 s, mem usage=0.10 GB, avail mem=17.60 GB.
"""  # noqa: E501 (log lines as SGLang writes them)

SGL_EAGLE_OLD = """\
[2025-06-01 07:00:10] Capture cuda graph end. Time elapsed: 20.00 s. mem usage=1.00 GB. avail mem=9.00 GB.
[2025-06-01 07:00:14] Capture draft cuda graph end. Time elapsed: 4.00 s. mem usage=0.30 GB. avail mem=8.70 GB.
[2025-06-01 07:00:16] Capture draft extend cuda graph end. Time elapsed: 2.25 s. mem usage=0.20 GB. avail mem=8.50 GB.
"""

SGL_TP2_NOISE = """\
[2025-05-05 05:05:05 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.float16, avail mem=30.00 GB, mem usage=14.00 GB.
[2025-05-05 05:05:05 TP1] Load weight end. type=LlamaForCausalLM, dtype=torch.float16, avail mem=30.00 GB, mem usage=14.00 GB.
[2025-05-05 05:05:06 TP0] Memory pool end. avail mem=5.00 GB
[2025-05-05 05:05:06 TP1] Capture cuda graph begin. This can take up to several minutes. avail mem=5.00 GB
[2025-05-05 05:05:07 TP0] Init torch distributed ends. elapsed=1.25 s, mem usage=0.10 GB
[2025-05-05 05:05:20 TP0] Capture cuda graph end. Time elapsed: 13.00 s. mem usage=0.50 GB. avail mem=4.50 GB.
[2025-05-05 05:05:21 TP1] Capture cuda graph end. Time elapsed: 14.00 s. mem usage=0.50 GB. avail mem=4.50 GB.
[2025-05-05 05:05:30] The server is fired up and ready to roll!
"""  # noqa: E501 (log lines as SGLang writes them)


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param(V1_TP1_COLD, EnginePhases(weights_load=31.402117, compile=23.42, compile_cached=False,
                                           graph_capture=11.0, init_engine=43.87),
                 id="v1-one-process-cold: 'Model loading took' wins over the loader's line"),
    pytest.param(V1_NEW_CACHED, EnginePhases(weights_load=12.5, compile=3.10, compile_cached=True, graph_capture=6.0,
                                             init_engine=14.25), id="v1-new-wording-cache-hit"),
    pytest.param(V1_NEW_INIT_ONLY, EnginePhases(compile=22.0, init_engine=40.5),
                 id="v1-compile-from-the-init-line-when-no-monitor-line"),
    pytest.param(V1_ENCODER, EnginePhases(compile=30.0, init_engine=60.0), id="v1-encoder-and-language-model"),
    pytest.param(V1_NO_COMPILE, EnginePhases(init_engine=7.25), id="v1-no-compile"),
    pytest.param(V0_TP2, EnginePhases(weights_load=43.5, graph_capture=19.0, init_engine=22.71),
                 id="v0-two-workers-take-the-slowest"),
    pytest.param(V0_OLD, EnginePhases(graph_capture=25.0), id="v0-old-weights-line-is-memory-not-time"),
    pytest.param(LOADER_ONLY_DRAFT, EnginePhases(weights_load=22.5),
                 id="loader-lines-add-up-in-a-worker-max-across-workers"),
    pytest.param(PER_GRAPH, EnginePhases(compile=6.20, compile_cached=False),
                 id="per-graph-lines-count-from-one-start-longest-wins"),
    pytest.param(MIXED_CACHE, EnginePhases(compile=19.0, compile_cached=False),
                 id="one-worker-compiled-from-scratch-so-not-cached"),
    pytest.param(AOT_HIT, EnginePhases(compile=2.89, compile_cached=True), id="aot-cache-hit"),
    pytest.param(V0_COMPILE_SHAPES, EnginePhases(compile=41.5, compile_cached=False), id="v0-compile-per-shape"),
    pytest.param(SGL_NEW_TP2, EnginePhases(weights_load=32.45, graph_capture=12.85),
                 id="sglang-two-tp-ranks-take-the-slowest"),
    pytest.param(SGL_OLD_ONE_GPU, EnginePhases(graph_capture=7.84),
                 id="sglang-old-weight-line-is-memory-not-time"),
    pytest.param(SGL_PIECEWISE, EnginePhases(weights_load=9.1, compile=9.2, compile_cached=None,
                                             graph_capture=5.38 + 18.18),
                 id="sglang-piecewise-capture-adds-to-decode-capture-compile-read-in-vllm-words"),
    # SGLang logs its compile line on an Inductor cache hit too: the line says nothing of the cache
    pytest.param(SGL_COMPILE_ONLY, EnginePhases(compile=9.2), id="sglang-compile-line-in-its-stamp-cache-unknown"),
    pytest.param(SGL_COMPILE_RANKS, EnginePhases(compile=9.4), id="sglang-ranked-compile-lines-cache-unknown"),
    pytest.param(SGL_PIECEWISE_NO_STAMP, EnginePhases(compile=9.2, graph_capture=18.18),
                 id="sglang-lines-without-stamps-known-by-the-capture-line-cache-unknown"),
    pytest.param(SGL_SPECULATIVE_DP, EnginePhases(weights_load=43.5, graph_capture=13.5),
                 id="sglang-dp-tp-ep-ranks-target-plus-draft-add-up-in-a-rank"),
    pytest.param(SGL_EAGLE_OLD, EnginePhases(graph_capture=26.25), id="sglang-old-draft-captures-add-up"),
    pytest.param(SGL_TP2_NOISE, EnginePhases(graph_capture=14.0),
                 id="sglang-memory-only-and-distributed-init-lines-ignored"),
])
def test_phases_of_real_format_logs(text: str, expected: EnginePhases) -> None:
    got = parse_engine_log(text)
    assert got == expected


@pytest.mark.parametrize(("line", "field"), [
    pytest.param("Model loading took 1 GiB memory and nan seconds", "weights_load", id="nan"),
    pytest.param("Model loading took 1 GiB memory and inf seconds", "weights_load", id="inf"),
    pytest.param("Model loading took 1 GiB memory and -3.0 seconds", "weights_load", id="negative"),
    pytest.param("Model loading took 1 GiB memory and 0.000000 seconds", "weights_load", id="zero"),
    pytest.param("Model loading took 1 GiB memory and 1e300 seconds", "weights_load", id="beyond-max"),
    pytest.param("Model loading took 1 GiB memory and 12,5 seconds", "weights_load", id="not-a-number"),
    # Python's float() read these as seconds; an engine prints none of them
    pytest.param("Model loading took 1 GiB memory and 1_000 seconds", "weights_load", id="underscore"),
    pytest.param("Loading weights took ١٢٣.5 seconds", "weights_load", id="arabic-indic-digits"),
    pytest.param("torch.compile takes １２.0 s in total", "compile", id="full-width-digits"),
    pytest.param("Graph capturing finished in 0 secs, took 0.10 GiB", "graph_capture", id="capture-rounded-to-0"),
    pytest.param("torch.compile takes -1.00 s in total", "compile", id="negative-compile"),
    pytest.param("init engine (profile, create kv cache, warmup model) took NaN seconds", "init_engine",
                 id="nan-init"),
    pytest.param("Model loading took and 12.0 seconds", "weights_load", id="truncated"),
    pytest.param("model loading took 1 GiB memory and 12.0 seconds", "weights_load", id="other-case"),
    pytest.param("Graph capturing finished in 12", "graph_capture", id="cut-off"),
    pytest.param("[2026-01-01 00:00:00 TP0] Load weight end. elapsed=nan s, type=X", "weights_load",
                 id="sglang-nan-load"),
    pytest.param("Load weight end. elapsed=0.00 s, type=X", "weights_load", id="sglang-zero-load"),
    pytest.param("Load weight end. type=X, dtype=torch.bfloat16, avail mem=8.90 GB", "weights_load",
                 id="sglang-load-memory-only"),
    pytest.param("Capture cuda graph end. Time elapsed: -2.00 s.", "graph_capture", id="sglang-negative-capture"),
    pytest.param("Capture target decode CUDA graph end. elapsed=inf s, mem usage=0.1 GB", "graph_capture",
                 id="sglang-inf-capture"),
    pytest.param("Capture cuda graph begin. This can take up to several minutes. avail mem=2.00 GB",
                 "graph_capture", id="sglang-capture-begin-has-no-time"),
    pytest.param("Capture cuda graph end. avail mem=2.00 GB", "graph_capture", id="sglang-capture-end-without-time"),
    pytest.param("Capture a b c d graph end. elapsed=3.00 s", "graph_capture", id="sglang-capture-four-words"),
    pytest.param("capture cuda graph end. Time elapsed: 3.00 s", "graph_capture", id="sglang-other-case"),
    pytest.param("Capture target decode CUDA graph end. step=٣, elapsed=3.00 s", "graph_capture",
                 id="sglang-capture-step-in-another-script"),
])
def test_garbled_numbers_and_lines_are_ignored(line: str, field: str) -> None:
    assert getattr(parse_engine_log(line), field) is None
    assert parse_engine_log(line).empty


def test_a_garbled_model_loading_line_lets_the_loader_line_count() -> None:
    text = ("Loading weights took 9.00 seconds\n"
            "Model loading took 1 GiB memory and nan seconds\n")
    assert parse_engine_log(text).weights_load == 9.0


def test_a_garbled_compiling_line_does_not_say_the_cache_missed() -> None:
    text = ("Compiling a graph for dynamic shape takes inf s\n"
            "Directly load the compiled graph(s) for dynamic shape from the cache, took 1.000 s\n")
    assert parse_engine_log(text) == EnginePhases(compile=1.0, compile_cached=True)


@pytest.mark.parametrize("text", [
    pytest.param("", id="empty"),
    pytest.param("\n\r\n", id="blank-lines"),
    pytest.param("Traceback (most recent call last):\n  File \"x.py\"\nRuntimeError: CUDA out of memory\n",
                 id="a-crash"),
    pytest.param("\x00\xff\ufffd garbage \x1b[31mred\x1b[0m", id="binary-noise"),
    pytest.param("INFO Loading model weights took 14.9888 GB", id="memory-only"),
])
def test_logs_without_phases_give_none(text: str) -> None:
    got = parse_engine_log(text)
    assert got.empty and got == EnginePhases()


def test_carriage_returns_split_lines_like_newlines() -> None:
    text = "Capturing CUDA graphs: 50%\rCapturing CUDA graphs: 100%\rGraph capturing finished in 7 secs, took 1 GiB"
    assert parse_engine_log(text).graph_capture == 7.0


@pytest.mark.parametrize(("text", "weights"), [
    pytest.param("[2026-01-01 00:00:01 TP0] Load weight end. elapsed=5.00 s, type=X\n"
                 "[2026-01-01 00:00:02 TP0] Load weight end. elapsed=6.00 s, type=Y\n", 11.0,
                 id="one-rank-parts-add-up"),
    pytest.param("[2026-01-01 00:00:01 TP0] Load weight end. elapsed=5.00 s, type=X\n"
                 "[2026-01-01 00:00:02 TP1] Load weight end. elapsed=6.00 s, type=X\n", 6.0,
                 id="two-ranks-slowest"),
    pytest.param("[2026-01-01 00:00:01 DP0 TP0] Load weight end. elapsed=5.00 s, type=X\n"
                 "[2026-01-01 00:00:02 DP1 TP0] Load weight end. elapsed=6.00 s, type=X\n", 6.0,
                 id="same-tp-rank-other-dp-rank-is-another-process"),
    pytest.param("[01-01 00:00:01 TP0] Load weight end. elapsed=5.00 s, type=X\n"
                 "[01-01 00:00:02 TP1] Load weight end. elapsed=6.00 s, type=X\n", 6.0,
                 id="stamp-without-a-year"),
    pytest.param("[2026-01-01 00:00:01] Load weight end. elapsed=5.00 s, type=X\n"
                 "Load weight end. elapsed=6.00 s, type=X\n", 11.0,
                 id="a-stamp-without-ranks-is-the-main-process"),
    pytest.param("[2026-01-01 00:00:01 tp0] Load weight end. elapsed=5.00 s, type=X\n"
                 "[2026-01-01 00:00:02 tp1] Load weight end. elapsed=6.00 s, type=X\n", 11.0,
                 id="lower-case-is-not-a-rank-tag"),
    pytest.param("[2026-01-01 00:00:01 TP٠] Load weight end. elapsed=5.00 s, type=X\n"
                 "[2026-01-01 00:00:02 TP١] Load weight end. elapsed=6.00 s, type=X\n", 11.0,
                 id="a-rank-in-another-script-is-not-a-rank-tag"),
    pytest.param("[２０２６-01-01 00:00:01 TP0] Load weight end. elapsed=5.00 s, type=X\n"
                 "[２０２６-01-01 00:00:02 TP1] Load weight end. elapsed=6.00 s, type=X\n", 11.0,
                 id="a-stamp-in-full-width-digits-is-not-a-stamp"),
])
def test_sglang_rank_tags_are_processes(text: str, weights: float) -> None:
    assert parse_engine_log(text).weights_load == weights


@pytest.mark.parametrize("tag", [
    pytest.param("(Worker)", id="without-a-pid"),
    pytest.param("(Worker pid=١٢)", id="pid-in-arabic-indic-digits"),  # engines print ASCII pids
    pytest.param("(Worker pid=１２)", id="pid-in-full-width-digits"),
])
def test_process_tags_without_an_ascii_pid_are_the_main_process(tag: str) -> None:
    text = (f"{tag} INFO Loading weights took 5.00 seconds\n"
            "INFO Loading weights took 6.00 seconds\n")
    assert parse_engine_log(text).weights_load == 11.0  # one process: parts add up


def test_a_sum_above_the_maximum_is_not_read() -> None:
    half = MAX_PHASE_S * 0.6
    text = f"Loading weights took {half} seconds\nLoading weights took {half} seconds\n"
    assert parse_engine_log(text).weights_load is None


@pytest.mark.parametrize(("phases", "engine"), [
    pytest.param(EnginePhases(init_engine=40.0, compile=15.0), 25.0, id="init-minus-compile"),
    pytest.param(EnginePhases(init_engine=40.0), 40.0, id="no-compile-reported"),
    pytest.param(EnginePhases(init_engine=10.0, compile=15.0), None, id="compile-longer-than-init"),
    pytest.param(EnginePhases(compile=15.0, graph_capture=9.0), None, id="no-init"),
])
def test_the_engine_phase_is_init_minus_compile(phases: EnginePhases, engine: float | None) -> None:
    assert phases.engine_s == engine


def test_the_record_reads_camel_case_and_refuses_what_no_log_gives() -> None:
    record = EnginePhases.model_validate({"weightsLoad": 3.5, "compileCached": True, "initEngine": 9})
    assert record == EnginePhases(weights_load=3.5, compile_cached=True, init_engine=9.0)
    assert record.model_dump(by_alias=True) == {"weightsLoad": 3.5, "compile": None, "compileCached": True,
                                                "graphCapture": None, "initEngine": 9.0}
    for bad in ({"compile": 0}, {"graphCapture": -1}, {"initEngine": float("nan")}, {"weightsLoad": 2e7},
                {"other": 1}):
        with pytest.raises(ValidationError):
            EnginePhases.model_validate(bad)
