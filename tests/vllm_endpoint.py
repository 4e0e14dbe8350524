"""A serving pod's ``/metrics`` endpoint in vLLM's (or SGLang's) exposition format, for signal-source tests.

Counters are either set by the test (deterministic rates when the test also passes the clock) or
grow linearly with wall time (``linear(rate)``), which is what a real Prometheus server needs: it
scrapes on its own schedule, and a counter that grows by exactly ``rate`` per second gives
``rate()`` = ``rate`` whenever it samples. Each endpoint binds one loopback address, so several
"pods" (127.0.0.2, 127.0.0.3, ...) can share one port as real pods do.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.net import free_port


@dataclass
class Counters:
    """What the pod reports; with ``rate`` set, counters grow by it per second from ``t0``."""

    requests: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    rate: float | None = None
    prompt_per_request: float = 100.0
    generation_per_request: float = 50.0
    t0: float = field(default_factory=time.time)

    def now(self) -> tuple[float, float, float]:
        if self.rate is None:
            return self.requests, self.prompt_tokens, self.generation_tokens
        done = self.rate * (time.time() - self.t0)
        return done, done * self.prompt_per_request, done * self.generation_per_request


def vllm_text(c: Counters) -> str:
    """vLLM's names and label layout; finished requests split over two ``finished_reason`` series."""
    requests, prompt, generation = c.now()
    labels = 'engine="0",model_name="qwen3"'
    return "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {c.running!r}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {c.waiting!r}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} {0.9 * requests!r}',
        f'vllm:request_success_total{{{labels},finished_reason="length"}} {0.1 * requests!r}',
        f'vllm:request_success_created{{{labels},finished_reason="stop"}} {c.t0!r}',
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {prompt!r}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {generation!r}",
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:gpu_cache_usage_perc gauge",
        f"vllm:gpu_cache_usage_perc{{{labels}}} 0.42",
        "",
    ])


def sglang_text(c: Counters) -> str:
    """SGLang's names (``--enable-metrics``)."""
    requests, prompt, generation = c.now()
    labels = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    return "\n".join([
        "# HELP sglang:num_requests_total Number of requests processed.",
        "# TYPE sglang:num_requests_total counter",
        f"sglang:num_requests_total{{{labels}}} {requests!r}",
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE sglang:prompt_tokens_total counter",
        f"sglang:prompt_tokens_total{{{labels}}} {prompt!r}",
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
        "# TYPE sglang:generation_tokens_total counter",
        f"sglang:generation_tokens_total{{{labels}}} {generation!r}",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{{{labels}}} {c.waiting!r}",
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{labels}}} {c.running!r}",
        "",
    ])


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    endpoint: MetricsEndpoint


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        ep = self.server.endpoint
        with ep.lock:
            ep.scrapes += 1
            failing = ep.fail_next > 0
            if failing:
                ep.fail_next -= 1
            body = b"" if failing else ep.render().encode()
        if failing:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.split("?")[0] != "/metrics":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class MetricsEndpoint:
    """One pod's metrics server on ``host:port``; ``counters`` may be changed while it runs."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, engine: str = "vllm") -> None:
        self.host = host
        self.counters = Counters()
        self.engine = engine
        self.fail_next = 0
        self.scrapes = 0
        self.lock = threading.Lock()
        self._server = _Server((host, port), _Handler)
        self._server.endpoint = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"metrics-{host}", daemon=False)

    def render(self) -> str:
        return vllm_text(self.counters) if self.engine == "vllm" else sglang_text(self.counters)

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@contextlib.contextmanager
def serving(hosts: tuple[str, ...] = ("127.0.0.1",), *, engine: str = "vllm") -> Iterator[list[MetricsEndpoint]]:
    """Endpoints on each host, all on one port (as pods of one Deployment); stopped however the block ends."""
    port = 0
    endpoints: list[MetricsEndpoint] = []
    try:
        for attempt in range(20):
            port = free_port(hosts[0])
            try:
                endpoints = [MetricsEndpoint(h, port, engine) for h in hosts]
                break
            except OSError:  # taken on another loopback address: try another port
                if attempt == 19:
                    raise
        for ep in endpoints:
            ep.start()
        yield endpoints
    finally:
        for ep in endpoints:
            ep.stop()


def pod(name: str, ip: str, *, ready: bool = True, phase: str = "Running", namespace: str = "default",
        labels: dict[str, str] | None = None, start_time: str = "2025-01-01T00:00:00Z",
        terminating: bool = False, uid: str | None = None) -> dict[str, Any]:
    """A pod object as the API server returns it, with the fields the scaler reads."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                            "labels": labels if labels is not None else {"extender.io/workload": "qwen3"}}
    if terminating:
        meta["deletionTimestamp"] = "2025-01-01T00:10:00Z"
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]},
        "status": {"phase": phase, "podIP": ip, "startTime": start_time,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }
