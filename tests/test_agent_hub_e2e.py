"""The real agent reports caches workloads left without our markers, and the extender's estimate sees them.

``extender agent --once --policy P --hub-cache H`` runs as a process against a real Redis; a
Hugging Face hub cache (one complete repository, one still downloading, one no profile maps) and a
vLLM compile tree inside a key directory are built on disk the way huggingface_hub and vLLM write
them. Then ``extender explain`` (the extender's own estimate, from the live inventory) must count
the hub weights as local and the compile cache as on the node.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from extender.agent.hub import HubCaches
from extender.agent.loop import Agent, AgentSettings
from extender.core.caches import cache_id, compile_key
from extender.core.reports import KubeReport
from extender.files import PolicyFile, read_policy
from extender.layout import compile_dir
from extender.state import InventoryStore, connect
from extender.state.sources import SourceStore
from tests.conftest import RedisServer
from tests.test_agent_hub import Repo, index_bytes, sharded, vllm_compiled
from tests.test_agent_scan import make_weights, sparse

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
NODE = "gpu-hub-1"
GB = 10**9
LLAMA = "meta-llama/Llama-3.1-8B"
QWEN = "Qwen/Qwen3-8B"
C1 = "5f0b02c75b1c7a4e9d2f3e1a0b8c6d4e2f1a3b5c"
C2 = "9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b"
Q1 = "d0c1b2a3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9"
SHARD = 4 * GB
DIGEST = "sha256:" + "c" * 64
KEY_INPUTS = {"modelId": LLAMA, "revision": C1, "imageDigest": DIGEST, "engineVersion": "0.11.0",
              "torchVersion": "2.8.0", "tritonVersion": "3.4.0", "cudaVersion": "12.8"}


def policy_text(llama_bytes: int, *, with_qwen: bool = True) -> str:
    qwen = f"""
  - name: qwen
    match: {{labels: {{app: qwen}}}}
    image: {{reference: "vllm/vllm-openai:v0.11.0", size: 10GB}}
    weights: {{source: "hf://{QWEN}", version: {Q1}, bytes: 16GB, shardFiles: 4, loaderConcurrency: 4}}
""" if with_qwen else ""
    return f"""\
apiVersion: extender.io/v1alpha1
kind: Policy
nodeClasses:
  - name: g5
    matchLabels: {{node.kubernetes.io/instance-type: g5.48xlarge}}
    gpu: {{product: NVIDIA-A10G, count: 8}}
    nvme: {{capacity: 7600GB, readBandwidth: 7GB/s, reserve: 100GB}}
    network: {{nic: 100Gbps, objectStorePerStream: 5.96Gbps}}
profiles:
  - name: llm
    match: {{labels: {{app: llm}}}}
    image: {{reference: "vllm/vllm-openai:v0.11.0", size: 10GB}}
    weights: {{source: "hf://{LLAMA}", version: main, bytes: {llama_bytes}, shardFiles: 4, loaderConcurrency: 4}}
    compile: {{cold: 60s, warm: 5s, key: {json.dumps(KEY_INPUTS)}}}
  - name: s3-model
    match: {{labels: {{app: s3-model}}}}
    image: {{reference: "vllm/vllm-openai:v0.11.0", size: 10GB}}
    weights: {{source: "s3://models/s3-model/", version: v1, bytes: 1GB}}
{qwen}scoring:
  nvmePressurePenalty: 0
"""


def build_hub(hub: Path) -> tuple[int, int]:
    """The hub cache; returns (llama bytes on disk, qwen bytes on disk)."""
    llama = Repo(hub, LLAMA)
    sharded(llama, C1, size=SHARD)
    llama.ref("main", C1)
    qwen = Repo(hub, QWEN)  # two of four shards whole, the third downloading, the index not fetched yet
    qwen.link(Q1, "config.json", "qcfg", size=700)
    for i in (1, 2):
        qwen.link(Q1, f"model-{i:05d}-of-00004.safetensors", f"q{i}", size=SHARD)
    qwen.blob("q3.incomplete", GB)
    sharded(Repo(hub, "someone/unmapped"), C1, size=GB)
    return 10 + 4 * SHARD + index_bytes(llama), 700 + 2 * SHARD


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Any]:
    hub, cache = tmp_path / "hub", tmp_path / "cache"
    hub.mkdir()
    llama_bytes, qwen_bytes = build_hub(hub)
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policy_text(llama_bytes))
    policy, _ = read_policy(policy_file)
    key = compile_key(policy.profile("llm"), policy.node_classes[0])
    assert key is not None
    vllm_compiled(compile_dir(cache, key) / "vllm")  # VLLM_CACHE_ROOT=<root>/compile/<key>/vllm
    make_weights(cache, "s3-model", "v1", {"a.safetensors": 10**6})  # our own layout, beside the hub
    return {"hub": hub, "cache": cache, "policy": policy_file, "key": key, "llama": llama_bytes,
            "qwen": qwen_bytes}


COMMAND = "import sys\nfrom extender.cli import main\nsys.exit(main())\n"


def extender(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    return subprocess.run([sys.executable, "-c", COMMAND, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(ROOT)}, check=False)


def pod(workload: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{workload}-0", "namespace": "inference", "labels": {"app": workload}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def explain(node: dict[str, Any], redis_url: str, workload: str, tmp_path: Path) -> dict[str, Any]:
    pod_file = tmp_path / f"{workload}.json"
    pod_file.write_text(json.dumps(pod(workload)))
    out = extender("explain", "--policy", str(node["policy"]), "--pod", str(pod_file), "--json",
                   "--nodes", NODE, "--redis-url", redis_url)
    assert out.returncode == 0, out.stderr
    row: dict[str, Any] = json.loads(out.stdout)["nodes"][0]
    assert row["node"] == NODE and row["fresh"]
    return row


def test_the_agent_reports_hub_and_vllm_caches_and_the_estimate_counts_them(
        node: dict[str, Any], redis_server: RedisServer, tmp_path: Path) -> None:
    out = extender("agent", "--node-name", NODE, "--cache-root", str(node["cache"]), "--policy", str(node["policy"]),
                   "--hub-cache", str(node["hub"]), "--once", "--redis-url", redis_server.url)
    assert out.returncode == 0, out.stderr
    assert "1 repositories no profile maps (skipped): models--someone--unmapped" in out.stderr
    assert f"qwen/{Q1} is partial" in out.stderr and "model-00003-of-00004.safetensors is not present" in out.stderr
    sources = SourceStore(InventoryStore(connect(redis_server.url, tmp_path / "unused")))
    sources.report_kube({NODE: KubeReport(node_class="g5", gpus=8, gpus_free=8)})  # what the sync would add
    state = sources.store.get(NODE)
    assert state is not None
    # llm: complete snapshot (4 x 4 GB + config + index); qwen: two whole shards and the config, never the
    # 1 GB .incomplete; our own s3-model beside them; nothing for the repository no profile maps
    assert state.weights == {"llm/main": node["llama"], f"qwen/{Q1}": node["qwen"], "s3-model/v1": 10**6}
    assert state.compile_keys == (node["key"],)
    # hub entries carry no last use, so the warmer never evicts them; ours do
    assert set(state.last_used) == {cache_id("weights", "s3-model/v1"), cache_id("compile", node["key"])}

    # T_weights = local / max(nvme, remote) + remote_bytes / remote_bps, remote_bps = min(100 Gbps,
    # 4 streams x 5.96 Gbps) = 2.98 GB/s, nvme 7 GB/s (extender/core/estimate.py)
    remote_bps = 4 * 5.96e9 / 8
    llm = explain(node, redis_server.url, "llm", tmp_path)
    assert llm["cache"]["weightsBytes"] == node["llama"] and llm["cache"]["compile"] == "local"
    assert llm["phases"]["weights_s"] == round(node["llama"] / 7e9, 3)
    assert llm["phases"]["compile_s"] == 5.0
    qwen = explain(node, redis_server.url, "qwen", tmp_path)
    assert qwen["cache"]["weightsBytes"] == node["qwen"]
    assert qwen["phases"]["weights_s"] == round(node["qwen"] / 7e9 + (16 * GB - node["qwen"]) / remote_bps, 3)


def test_without_a_policy_hub_caches_are_skipped_with_a_log_line(node: dict[str, Any]) -> None:
    out = extender("agent", "--node-name", NODE, "--cache-root", str(node["cache"]),
                   "--hub-cache", str(node["hub"]), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["weights"] == {"s3-model/v1": 10**6}
    assert f"hub caches {node['hub']} are not scanned: give --policy" in out.stderr


def test_an_invalid_policy_is_refused_at_start(node: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(policy_text(1).replace("count: 8", "count: 0"))
    out = extender("agent", "--node-name", NODE, "--cache-root", str(node["cache"]), "--policy", str(bad),
                   "--hub-cache", str(node["hub"]), "--dry-run")
    assert out.returncode == 1 and "gpu.count" in out.stderr and "not starting" in out.stderr


def replace_file(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_policy_edits_and_moved_refs_are_followed(node: dict[str, Any], redis_server: RedisServer,
                                                  tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    policy, version = read_policy(node["policy"])
    replace_file(node["policy"], policy_text(node["llama"], with_qwen=False))
    client = connect(redis_server.url, tmp_path / "unused")
    try:
        reader = SourceStore(InventoryStore(client))
        hub = HubCaches([node["hub"]], policy, PolicyFile(node["policy"], version))
        agent = Agent(AgentSettings(node_name=NODE, cache_root=node["cache"]), lambda: reader, hub=hub)
        with caplog.at_level(logging.INFO, logger="extender"):
            agent.step()  # the first poll reads the edited file: qwen is no longer mapped
        state = reader.store.get(NODE)
        assert state is not None and set(state.weights) == {"llm/main", "s3-model/v1"}
        assert "policy" in caplog.text and "reloaded" in caplog.text

        # main moves to C2, whose download has started: llm/main is partial until it ends
        llama = Repo(node["hub"], LLAMA)
        llama.link(C2, "config.json", "cfg2", size=12)
        llama.link(C2, "model-00001-of-00002.safetensors", "n1", size=SHARD)
        llama.blob("n2.incomplete", 10)
        llama.ref("main", C2)
        agent.step()
        state = reader.store.get(NODE)
        assert state is not None and state.weights["llm/main"] == 12 + SHARD

        os.rename(llama.path / "blobs" / "n2.incomplete", llama.path / "blobs" / "n2")
        sparse(llama.path / "blobs" / "n2", SHARD)
        llama.link(C2, "model-00002-of-00002.safetensors", "n2")
        agent.step()
        state = reader.store.get(NODE)
        assert state is not None and state.weights["llm/main"] == 12 + 2 * SHARD
        assert agent.stats.last_scan is not None and "llm" in agent.stats.last_scan.complete_workloads
    finally:
        client.close()
