"""End to end: agents and the sync keep the inventory true, and ``/prioritize`` ranks by what is on disk.

Every component is a real process started the way its deployment starts it:

* the API double serves three g5.48xlarge Nodes (kubelet lists the vLLM image on each);
* ``extender sync`` list-watches them into Redis;
* ``extender agent`` runs for two of the nodes, each on its own cache root (the third has no agent:
  its record never gets a heartbeat, so it stays cold);
* ``python -m extender.api.scheduler serve`` (gunicorn) answers kube-scheduler's ``/prioritize``.

Then weights are written into one node's cache root the way a loader would (shards, manifest,
completion marker last) and that node's score rises after the agent's next scan and the
extender's next refresh. Waits are bounded polls for a state, never assertions on time.

Expected scores (``extender estimate`` on the policy below; s = max(30, T_ref / 10) = 72.96 s):
cold 729.6 s -> 0; image on the node 372.5 s -> round(357.1 / 72.96) = 5; image and weights
132.6 s -> round(597.0 / 72.96) = 8. (The NVMe pressure penalty is off: the agents report the free
space of whatever disk the test runs on.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from extender.layout import mark_complete, weights_dir, write_manifest
from extender.state import InventoryStore, connect
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.net import free_port
from tests.test_agent_scan import sparse

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
GB = 10**9
CLASS_LABELS = {"node.kubernetes.io/instance-type": "g5.48xlarge"}
VLLM = ["docker.io/vllm/vllm-openai@sha256:" + "b" * 64, "docker.io/vllm/vllm-openai:v0.11.0"]
NODES = ["gpu-a", "gpu-b", "gpu-c"]
WITH_AGENT = ["gpu-a", "gpu-b"]

POLICY = """\
apiVersion: extender.io/v1alpha1
kind: Policy
nodeClasses:
  - name: g5.48xlarge
    matchLabels: {node.kubernetes.io/instance-type: g5.48xlarge}
    gpu: {product: NVIDIA-A10G, count: 8}
    nvme: {capacity: 7600GB, readBandwidth: 7GB/s, reserve: 100GB}
    network: {nic: 100Gbps, objectStorePerStream: 5.96Gbps}
profiles:
  - name: big-llm
    match:
      labels: {extender.io/workload: big-llm}
    image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
    weights: {source: "s3://models/big/", version: rev-1, bytes: 200GB, shardFiles: 8, loaderConcurrency: 1}
scoring:
  # the agents report the free space of the test machine's disk, which varies: no pressure penalty
  nvmePressurePenalty: 0
"""

#: ``extender agent`` and ``extender sync``, as the console script runs them.
COMMAND = "import sys\nfrom extender.cli import main\nsys.exit(main())\n"


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(CLASS_LABELS)},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"},
                       "images": [{"names": VLLM, "sizeBytes": 10 * GB}]}}


def pod() -> dict[str, Any]:
    return {"metadata": {"name": "big-llm-0", "namespace": "serving", "uid": "u-1",
                         "labels": {"extender.io/workload": "big-llm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}


def env() -> dict[str, str]:
    """The environment of the processes started: ours, without settings that would redirect them."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("REDIS_URL", "NODE_NAME", "PROMETHEUS_MULTIPROC_DIR", "KUBECONFIG")}
    return {**clean, "PYTHONPATH": str(ROOT)}


@contextmanager
def process(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child process with its output in ``log``; SIGTERM (then SIGKILL) and reaped at exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def prioritize(port: int) -> dict[str, int]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        body = json.dumps({"Pod": pod(), "Nodes": None, "NodeNames": NODES})
        conn.request("POST", "/prioritize", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200
        return {item["Host"]: item["Score"] for item in json.loads(reply.read())}
    finally:
        conn.close()


def scores_or_none(port: int) -> dict[str, int] | None:
    try:
        return prioritize(port)
    except (OSError, AssertionError):
        return None



@dataclass
class E2EStack:
    """A running end-to-end cluster: the API double, the sync, one agent per cache root, the extender."""

    double: KubeDouble
    kubeconfig: Path
    roots: dict[str, Path]
    port: int
    logs: Path
    store: InventoryStore

    def logs_tail(self) -> str:
        """The end of every process's log, for a failure message."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(self.logs.iterdir()))

    def scores(self) -> dict[str, int] | None:
        """``/prioritize`` for the test pod, or ``None`` while the extender is not answering yet."""
        return scores_or_none(self.port)

    def wait_for_setup(self, *, with_images: bool = False) -> dict[str, int]:
        """Wait until the sync knows every node and each agent has reported; the scores then.

        Image on the node (kubelet's list, through the sync) -> 5; no agent (unknown = cold) -> 0.
        """
        try:
            wait_until(lambda: self.store.names() == set(NODES)
                       and all((r := self.store.get(n)) is not None and r.heartbeat > 0
                               and (r.images or not with_images) for n in WITH_AGENT),
                       what="the sync's nodes and the agents' heartbeats")
            return self._wait_for_scores(lambda s: s == {"gpu-a": 5, "gpu-b": 5, "gpu-c": 0},
                                         "scores from image presence alone")
        except AssertionError:
            raise AssertionError(f"setup did not converge: {self.scores()}\n{self.logs_tail()}") from None

    def wait_for_rise(self, node_name: str) -> dict[str, int]:
        """Wait until ``node_name`` scores above the image-only 5; the scores then."""
        try:
            return self._wait_for_scores(lambda s: s[node_name] > 5,
                                         f"{node_name}'s score rising after its agent's next scan")
        except AssertionError:
            raise AssertionError(f"the score did not rise\n{self.logs_tail()}") from None

    def wait_for_scores(self, expected: dict[str, int], what: str) -> None:
        """Wait until ``/prioritize`` gives exactly ``expected``; fail with the last scores and the logs."""
        try:
            self._wait_for_scores(lambda s: s == expected, f"scores {expected} ({what})")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last scores {self.scores()}\n{self.logs_tail()}") from None

    def _wait_for_scores(self, ok: Callable[[dict[str, int]], bool], what: str) -> dict[str, int]:
        def matching() -> dict[str, int] | None:
            scores = self.scores()
            return scores if scores is not None and ok(scores) else None

        found = wait_until(matching, what=what)
        assert found is not None
        return found


@contextmanager
def running_stack(tmp_path: Path, policy_text: str, redis_url: str, *,
                  agent_command: str = COMMAND) -> Iterator[E2EStack]:
    """Start the end-to-end cluster on ``policy_text``; every process is stopped on exit."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    roots = {name: tmp_path / "nodes" / name / "cache" for name in WITH_AGENT}
    for root in roots.values():
        root.mkdir(parents=True)
    port = free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    with KubeDouble.running(bookmark_interval_s=0.2) as double, ExitStack() as stack:
        for name in NODES:
            double.apply(node(name))
        kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
        stack.enter_context(process([sys.executable, "-c", COMMAND, "sync", "--policy", str(policy),
                                     "--kubeconfig", str(kubeconfig), "--redis-url", redis_url], logs / "sync.log"))
        for name, root in roots.items():
            stack.enter_context(process([sys.executable, "-c", agent_command, "agent", "--node-name", name,
                                         "--cache-root", str(root), "--interval", "0.2",
                                         "--redis-url", redis_url], logs / f"agent-{name}.log"))
        stack.enter_context(process([sys.executable, "-m", "extender.api.scheduler", "serve", "--policy", str(policy),
                                     "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "2",
                                     "--redis-url", redis_url, "--poll-interval", "0.1",
                                     "--min-rebuild-interval", "0.1"], logs / "extender.log"))
        client = connect(redis_url, tmp_path)
        stack.callback(client.close)
        yield E2EStack(double, kubeconfig, roots, port, logs, InventoryStore(client))

def write_weights(root: Path) -> None:
    """What a loader does: shards first, then the manifest, then the completion marker."""
    directory = weights_dir(root, "big-llm", "rev-1")
    shards = {f"model-{i:05d}-of-00008.safetensors": 25 * GB for i in range(1, 9)}
    for name, size in shards.items():
        sparse(directory / name, size)
    write_manifest(directory, sorted(shards.items()), source="s3://models/big/")
    mark_complete(directory)


def test_writing_weights_into_a_cache_root_raises_the_nodes_score(redis_server: RedisServer, tmp_path: Path) -> None:
    with running_stack(tmp_path, POLICY, redis_server.url) as cluster:
        assert cluster.wait_for_setup() == {"gpu-a": 5, "gpu-b": 5, "gpu-c": 0}
        write_weights(cluster.roots["gpu-b"])
        # a scan may land while the loader is still writing (some shards, no manifest yet): the
        # score rises on that partial entry first, so wait for the scan that sees every byte
        wait_until(lambda: (r := cluster.store.get("gpu-b")) is not None and r.weights.get("big-llm/rev-1") == 200 * GB,
                   what="gpu-b's inventory holding all 200 GB of big-llm/rev-1", report=cluster.logs_tail)
        record = cluster.store.get("gpu-b")
        assert record is not None and record.weights == {"big-llm/rev-1": 200 * GB}
        cluster.wait_for_scores({"gpu-a": 5, "gpu-b": 8, "gpu-c": 0}, "complete weights on gpu-b")
