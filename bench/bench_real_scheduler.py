"""Scheduling throughput of the stock kube-scheduler with the extender off and on, on KWOK nodes.

What runs: the test control plane of tests/real_cluster.py (etcd, kube-apiserver,
kube-controller-manager, KWOK; built by scripts/build-cluster), N KWOK nodes of class p5.48xlarge
named and held in the inventory as in bench/bench_extender.py (15,000 records: a third with the vLLM
image, a tenth fully warm, 1% stale), and ``extender serve`` (gunicorn, the deploy/ defaults: 2
workers x 4 threads) with policies/eks-p5-qwen3-moe.yaml.

Each round creates P pods of ``qwen3-moe`` (1 GPU each) for a scheduler that is not running yet,
then starts a kube-scheduler on the chart's scheduler configuration (``on``: the extender as configured;
``off``: the same file without its ``extenders`` section; ``prioritize-only``: without
``filterVerb``) and polls the API until every pod is
bound. Rounds alternate the modes so both see the same machine noise. Reported per
(N, mode), the median over rounds of:

* pods/s: (P - 1) / (last binding seen - first binding seen), polled every 50 ms;
* the scheduler's own mean latency of its scheduling algorithm per pod (filter, score and the
  extender calls): ``scheduler_scheduling_algorithm_duration_seconds``, read from its /metrics
  before it stops.

The figure that matters is the ratio on/off of pods/s in the same run (target: at least 0.85 at
5,000 nodes). The machine is shared and small: absolute rates move from run to run, the ratio less.

Run (from the repository root)::

    .venv/bin/python bench/bench_real_scheduler.py                      # 1,000 and 5,000 nodes
    .venv/bin/python bench/bench_real_scheduler.py --sizes 1000 --pods 200 --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_extender import IMAGE, POLICY, PROFILE, inventory, node_name  # noqa: E402
from tests.net import free_port  # noqa: E402
from tests.real_cluster import Cluster  # noqa: E402

DEFAULT_SIZES = (1_000, 5_000)
#: off: no extenders section; on: the chart's configuration as shipped; prioritize-only: the same
#: without filterVerb (one call a pod instead of two, for policies without hard rules).
MODES = ("off", "on", "prioritize-only")
NAMESPACE = "bench"


def kwok_node(i: int) -> dict[str, Any]:
    resources = {"cpu": "192", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": "8"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name(i), "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge",
                                                          "kubernetes.io/hostname": node_name(i), "type": "kwok"}},
            "status": {"allocatable": resources, "capacity": resources,
                       "images": [{"names": [IMAGE], "sizeBytes": 10 * 10**9}] if i % 3 == 0 else []}}


def bench_pod(i: int, scheduler: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{scheduler}-{i:05d}", "namespace": NAMESPACE,
                         "labels": {"extender.io/workload": PROFILE, "app.kubernetes.io/name": PROFILE}},
            # New Nodes carry node.kubernetes.io/not-ready until the node lifecycle controller sees
            # them Ready, a few per second: tolerating it saves minutes of setup at 5,000 nodes and
            # changes nothing the extender or the scheduler's scoring does.
            "spec": {"schedulerName": scheduler,
                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                      "effect": "NoSchedule"}],
                     "containers": [
                {"name": "vllm", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def core_api(cluster: Cluster) -> Any:
    """The official client's CoreV1Api as admin (untyped here: plain dicts go in, models come out)."""
    from kubernetes import client, config

    k8s: Any = client
    k8s_config: Any = config
    return k8s.CoreV1Api(k8s_config.new_client_from_config(str(cluster.admin_kubeconfig)))


def create_nodes(cluster: Cluster, start: int, stop: int) -> None:
    api = core_api(cluster)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: api.create_node(kwok_node(i)), range(start, stop)))

    def ready() -> bool:
        nodes = cluster.get("nodes", "-l", "type=kwok")["items"]
        return len(nodes) >= stop and all(any(c["type"] == "Ready" and c["status"] == "True"
                                              for c in n["status"].get("conditions", [])) for n in nodes)

    cluster.wait_for(f"{stop} Ready KWOK nodes", ready, timeout_s=600)


def mean_seconds(text: str, histogram: str) -> float:
    """Mean of a histogram of the scheduler's /metrics (only ``result="scheduled"`` where labelled)."""
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == histogram:
            for s in family.samples:
                if s.labels.get("result", "scheduled") == "scheduled":
                    if s.name.endswith("_sum"):
                        total += s.value
                    elif s.name.endswith("_count"):
                        count += s.value
    return total / count if count else float("nan")


def one_round(cluster: Cluster, mode: str, round_no: int, pods: int, extender_url: str) -> dict[str, float]:
    scheduler = f"bench-{mode}-{round_no}"
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "List", "items": [bench_pod(i, scheduler) for i in range(pods)]}))
    from tests.cluster_stack import scheduler_configuration

    config = scheduler_configuration()
    config["profiles"][0]["schedulerName"] = scheduler
    if mode == "off":
        del config["extenders"]
    else:
        config["extenders"][0]["urlPrefix"] = extender_url
    if mode == "prioritize-only":  # no profile of the policy has a hard rule: the filter call can go
        del config["extenders"][0]["filterVerb"]
    api = core_api(cluster)
    cluster.start_scheduler(scheduler, config)
    first = last = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        items: list[Any] = api.list_namespaced_pod(NAMESPACE, field_selector=f"spec.schedulerName={scheduler}").items
        bound = len([item for item in items if item.spec.node_name])
        now = time.monotonic()
        if bound and first is None:
            first = now
        if bound == pods:
            last = now
            break
        time.sleep(0.05)
    metrics = cluster.fetch(cluster.scheduler_ports[scheduler], "/metrics")
    cluster.processes[scheduler].stop()
    cluster.kubectl("delete", "pods", "-n", NAMESPACE, "--all", "--grace-period=0", "--force", "--wait=false")
    if first is None or last is None:
        raise RuntimeError(f"{scheduler}: not every pod was bound within 600 s\n{cluster.report()}")
    return {"pods_per_s": (pods - 1) / max(last - first, 1e-3),
            "algorithm_ms": mean_seconds(metrics, "scheduler_scheduling_algorithm_duration_seconds") * 1000}


def run(sizes: Sequence[int], pods: int, rounds: int, directory: Path) -> dict[str, Any]:
    from extender.state import InventoryStore, connect

    results: dict[str, Any] = {"pods": pods, "rounds": rounds, "rows": []}
    with Cluster.started(directory / "cluster") as cluster:
        records, registry = inventory(time.time())
        data_dir = directory / "redis"
        client = connect(None, data_dir)
        InventoryStore(client).replace(records, registry)
        client.close()
        port = free_port()
        cluster.start("extender", [sys.executable, "-m", "extender.api.scheduler", "serve", "--policy", str(POLICY),
                                   "--bind", f"127.0.0.1:{port}", "--data-dir", str(data_dir),
                                   "--max-snapshot-age", "3600"])
        cluster.kubectl("create", "namespace", NAMESPACE)
        made = 0
        for size in sizes:
            create_nodes(cluster, made, size)
            made = size
            seen: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
            for r in range(rounds):
                for mode in MODES:
                    seen[mode].append(one_round(cluster, mode, len(results["rows"]) * 100 + r, pods,
                                                f"http://127.0.0.1:{port}"))
                    print(f"  {size} nodes, round {r + 1}, extender {mode}: {seen[mode][-1]}", flush=True)
            for mode in MODES:
                row: dict[str, Any] = {"nodes": size, "mode": mode, **{k: statistics.median(x[k] for x in seen[mode])
                                                       for k in ("pods_per_s", "algorithm_ms")}}
                row["ratio_pods_per_s"] = row["pods_per_s"] / statistics.median(x["pods_per_s"] for x in seen["off"])
                results["rows"].append(row)
                print(format_row(row), flush=True)
        from extender.state.embedded import stop
        stop(data_dir)
    return results


def format_row(row: dict[str, Any]) -> str:
    return (f"| {row['nodes']:,} | {row['mode']} | {row['pods_per_s']:.1f} | {row['ratio_pods_per_s']:.2f}x | "
            f"{row['algorithm_ms']:.2f} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=list(DEFAULT_SIZES))
    parser.add_argument("--pods", type=int, default=400, help="pods per round (default 400)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode and size (default 3)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    print("| nodes | extender | pods/s | vs off | scheduling algorithm ms (mean) |")
    print("|---:|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="extbench-k8s-") as tmp:
        results = run(args.sizes, args.pods, args.rounds, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
