"""``extender sync`` with the official client against the API double and a real Redis.

Nodes appear, change images, lose their agent's heartbeat (and turn cold), disappear; pods move
free GPUs and replica counts; cut watch streams and ``410 Gone`` are recovered without missing a
change; a Redis that restarts empty is refilled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry

from extender.core.caches import weights_key
from extender.core.inventory import MAX_ENTRIES, MAX_RECORD_BYTES, InventorySnapshot, NodeState
from extender.core.policy import Policy
from extender.core.reports import AgentReport, KubeReport, Replicas, merge
from extender.files import PolicyFile, load_policy, read_policy
from extender.kube.client import KubeClient
from extender.kube.metrics import SyncMetrics
from extender.kube.sync import ClusterSync, SyncSettings
from extender.state import InventoryStore, connect
from extender.state.sources import SourceStore
from extender.state.store import encode
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
POLICY_FILE = ROOT / "policies" / "g5-pcie-fleet.yaml"
G5_12 = {"node.kubernetes.io/instance-type": "g5.12xlarge"}
LLAMA = {"extender.io/workload": "llama3-8b"}
VLLM = ["docker.io/vllm/vllm-openai@sha256:" + "a" * 64, "docker.io/vllm/vllm-openai:v0.11.0"]

# watches outlive every test (no server-side timeout mid-test) unless a test asks for short ones
FAST = SyncSettings(watch_timeout_s=60, resync_s=0.5, version_check_s=0.05, backoff_initial_s=0.02,
                    backoff_max_s=0.2)


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(POLICY_FILE)


@pytest.fixture
def reader(redis_server: RedisServer, tmp_path: Path) -> Iterator[SourceStore]:
    """The test's own view of the store (a separate client, as the extender's would be)."""
    client = connect(redis_server.url, tmp_path)
    try:
        yield SourceStore(InventoryStore(client))
    finally:
        client.close()


def node(name: str, labels: dict[str, str] | None = None, gpus: int = 4,
         images: list[list[str]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "capacity": {"nvidia.com/gpu": str(gpus)},
                       "images": [{"names": n, "sizeBytes": 1000} for n in images or []]}}


def pod(name: str, node_name: str, *, labels: dict[str, str] | None = None, gpus: int = 1,
        phase: str = "Pending", ready: bool = False) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "serving", "labels": labels or {}},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}}


@contextmanager
def running_sync(double: KubeDouble, redis_url: str, tmp_path: Path, policy: Policy,
                 settings: SyncSettings = FAST, *, metrics: SyncMetrics | None = None,
                 policy_file: PolicyFile | None = None) -> Iterator[ClusterSync]:
    """A ClusterSync in a thread; stopped and joined (and its clients closed) however the test ends."""
    kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kubeconfig")))
    clients: list[redis.Redis] = []

    def open_sources() -> SourceStore:
        client = connect(redis_url, tmp_path)
        clients.append(client)
        return SourceStore(InventoryStore(client))

    sync = ClusterSync(kube, open_sources, policy, settings, metrics=metrics, policy_file=policy_file)
    thread = threading.Thread(target=sync.run, name="sync-under-test")
    thread.start()
    try:
        yield sync
    finally:
        sync.stop()
        thread.join(timeout=30)
        kube.close()
        for c in clients:
            c.close()
        assert not thread.is_alive(), "the sync did not stop"


def record(reader: SourceStore, name: str) -> NodeState | None:
    return reader.store.get(name)


def eventually(reader: SourceStore, name: str, check: Callable[[NodeState | None], bool], what: str) -> None:
    wait_until(lambda: check(record(reader, name)), what=what)


def test_nodes_appear_with_class_gpus_and_every_image_name(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("gpu-a", G5_12, gpus=4, images=[VLLM, ["registry.k8s.io/pause:3.9"]]))
    double.apply(node("cpu-b", {"node.kubernetes.io/instance-type": "m5.large"}, gpus=0))
    with running_sync(double, redis_server.url, tmp_path, policy):
        wait_until(lambda: reader.store.names() == {"gpu-a", "cpu-b"}, what="both nodes")
    a, b = record(reader, "gpu-a"), record(reader, "cpu-b")
    assert a is not None and b is not None
    assert (a.node_class, a.gpus, a.gpus_free, a.labels) == ("g5.12xlarge", 4, 4, G5_12)
    assert a.images == (*VLLM, "registry.k8s.io/pause:3.9")
    assert b.node_class == "" and b.gpus == 0  # no class: readers classify by labels
    assert a.heartbeat == 0.0  # no agent has reported: never fresh


def test_pods_move_free_gpus_and_replica_counts(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("gpu-a", G5_12, gpus=4))
    double.apply(pod("other", "gpu-a", gpus=2, phase="Running", ready=True))  # no profile: GPUs only
    double.apply(pod("unbound", "", labels=LLAMA))  # not on a node: nothing
    with running_sync(double, redis_server.url, tmp_path, policy):
        eventually(reader, "gpu-a", lambda r: r is not None and r.gpus_free == 2, "the other pod's GPUs")
        double.apply(pod("llama-1", "gpu-a", labels=LLAMA))
        wait_until(lambda: reader.kube_reports(["gpu-a"])["gpu-a"] == KubeReport(
            node_class="g5.12xlarge", labels=G5_12, gpus=4, gpus_free=1,
            replicas={"llama3-8b": Replicas(starting=1)}), what="a starting replica")
        eventually(reader, "gpu-a", lambda r: r is not None and r.pod_workloads == ("llama3-8b",),
                   "the workload in use on the node")
        double.apply(pod("llama-1", "gpu-a", labels=LLAMA, phase="Running", ready=True))
        wait_until(lambda: (r := reader.kube_reports(["gpu-a"])["gpu-a"]) is not None
                   and r.replicas == {"llama3-8b": Replicas(running=1)}, what="a running replica")
        double.apply(pod("llama-1", "gpu-a", labels=LLAMA, phase="Succeeded"))
        double.remove("v1", "Pod", "other", "serving")
        wait_until(lambda: (r := reader.kube_reports(["gpu-a"])["gpu-a"]) is not None
                   and r.replicas == {} and r.gpus_free == 4, what="all GPUs free again")


def test_images_change_and_deleted_nodes_disappear(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("gpu-a", G5_12, images=[["old:1"]]))
    double.apply(node("gpu-b", G5_12))
    with running_sync(double, redis_server.url, tmp_path, policy):
        eventually(reader, "gpu-a", lambda r: r is not None and r.images == ("old:1",), "the first image")
        double.apply(node("gpu-a", G5_12, images=[VLLM, ["old:1"]]))
        eventually(reader, "gpu-a", lambda r: r is not None and r.images == (*VLLM, "old:1"), "the new images")
        reader.report_agent("gpu-b", AgentReport(heartbeat=time.time()))
        double.remove("v1", "Node", "gpu-b")
        wait_until(lambda: reader.store.names() == {"gpu-a"}, what="gpu-b removed")
        # the agent of the removed node reports once more: it must not bring the node back
        written = reader.report_agent("gpu-b", AgentReport(heartbeat=time.time()))
        assert written is None
        assert reader.store.names() == {"gpu-a"}


def test_a_node_whose_agent_went_silent_is_cold(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    profile = policy.profile("llama3-8b")
    key = weights_key(profile.name, profile.weights.version)
    double.apply(node("gpu-a", G5_12, images=[VLLM]))
    with running_sync(double, redis_server.url, tmp_path, policy):
        eventually(reader, "gpu-a", lambda r: r is not None, "the node")
        heartbeat = time.time()
        reader.report_agent("gpu-a", AgentReport(weights={key: profile.weights.bytes}, heartbeat=heartbeat, ttl=60))
        # the sync keeps writing (a label changes) after the agent's last report ...
        double.apply(node("gpu-a", {**G5_12, "team": "ml"}, images=[VLLM]))
        eventually(reader, "gpu-a", lambda r: r is not None and r.labels.get("team") == "ml", "the new label")
    state = record(reader, "gpu-a")
    assert state is not None and state.heartbeat == heartbeat  # ... without refreshing the heartbeat
    snapshot = InventorySnapshot.build(policy, [state])
    rows = snapshot.lookup(["gpu-a"]).index
    warm, _ = snapshot.state_for(profile, rows, now=heartbeat + 1)
    cold, _ = snapshot.state_for(profile, rows, now=heartbeat + 61)  # one second past the TTL
    assert warm.weights_bytes.tolist() == [profile.weights.bytes] and warm.image.tolist() == [True]
    assert cold.weights_bytes.tolist() == [0.0] and not np.any(cold.image)


def _stall_watches_and_cut(double: KubeDouble, sync: ClusterSync) -> None:
    """Cut the open watches and keep new ones failing until the test calls clear_faults()."""
    wait_until(lambda: double.open_watches() >= 2, what="both watches open")
    failed = double.count("watch", "nodes")
    double.fail("watch", "nodes", 503, times=10**6)
    double.state.cut_watches()
    wait_until(lambda: double.count("watch", "nodes") > failed + 1, what="a failed re-watch")


def test_a_cut_watch_resumes_from_its_resource_version_without_missing_a_change(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("a", G5_12))
    double.apply(node("b", G5_12))
    with running_sync(double, redis_server.url, tmp_path, policy) as sync:
        wait_until(lambda: reader.store.names() == {"a", "b"}, what="both nodes")
        _stall_watches_and_cut(double, sync)
        # changes while the sync is disconnected
        double.apply(node("a", G5_12, images=[["new:1"]]))
        double.remove("v1", "Node", "b")
        double.apply(node("c", G5_12))
        double.clear_faults()
        wait_until(lambda: reader.store.names() == {"a", "c"}, what="b gone, c added")
        eventually(reader, "a", lambda r: r is not None and r.images == ("new:1",), "a's new image")
        assert sync.nodes.lists == 1  # resumed from its resourceVersion: no relist was needed


def test_410_gone_relists_and_applies_what_happened_meanwhile(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("a", G5_12))
    double.apply(node("b", G5_12))
    with running_sync(double, redis_server.url, tmp_path, policy) as sync:
        wait_until(lambda: reader.store.names() == {"a", "b"}, what="both nodes")
        _stall_watches_and_cut(double, sync)
        double.apply(node("a", G5_12, gpus=8))
        double.remove("v1", "Node", "b")
        double.apply(node("c", G5_12))
        double.state.compact()  # the sync's resourceVersion is now too old
        double.clear_faults()
        wait_until(lambda: reader.store.names() == {"a", "c"}, what="b gone, c added")
        eventually(reader, "a", lambda r: r is not None and r.gpus == 8, "a's new GPU count")
        assert sync.nodes.lists == 2


def test_an_open_watch_expired_by_the_server_relists(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("a", G5_12))
    with running_sync(double, redis_server.url, tmp_path, policy) as sync:
        wait_until(lambda: double.open_watches() >= 2, what="both watches open")
        double.state.expire_watches()
        wait_until(lambda: sync.nodes.lists == 2 and sync.pods.lists == 2, what="both relists")
        double.apply(node("b", G5_12))
        wait_until(lambda: reader.store.names() == {"a", "b"}, what="b added after the relist")


def test_watches_ended_by_the_server_are_reopened_without_a_relist(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("a", G5_12))
    settings = SyncSettings(watch_timeout_s=1, backoff_initial_s=0.02, backoff_max_s=0.2)
    with running_sync(double, redis_server.url, tmp_path, policy, settings) as sync:
        wait_until(lambda: sync.nodes.watches >= 3, what="two server-side watch timeouts")
        double.apply(node("b", G5_12))
        wait_until(lambda: reader.store.names() == {"a", "b"}, what="a change after the re-watches")
        assert sync.nodes.lists == 1


def test_api_errors_are_retried(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("a", G5_12))
    double.fail("list", "nodes", 500, times=3)
    double.fail("list", "pods", 503, times=2)
    with running_sync(double, redis_server.url, tmp_path, policy):
        wait_until(lambda: reader.store.names() == {"a"}, what="the node after the failed lists")
    assert double.count("list", "nodes") == 4


def test_records_of_nodes_no_longer_in_the_cluster_are_pruned(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    reader.store.put(NodeState.model_validate({"name": "ghost", "heartbeat": 1.0}))
    double.apply(node("a", G5_12))
    with running_sync(double, redis_server.url, tmp_path, policy):
        wait_until(lambda: reader.store.names() == {"a"}, what="the ghost pruned")


def test_a_redis_that_restarted_empty_is_refilled(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("a", G5_12, images=[VLLM]))
    double.apply(node("b", G5_12))
    with running_sync(double, redis_server.url, tmp_path, policy):
        wait_until(lambda: reader.store.names() == {"a", "b"}, what="both nodes")
        redis_server.restart()  # all data gone
        double.apply(node("c", G5_12))  # and a change during the outage
        wait_until(lambda: _names(reader) == {"a", "b", "c"}, what="every node back")
        eventually(reader, "a", lambda r: r is not None and r.images == tuple(VLLM), "a's images back")


def _names(reader: SourceStore) -> set[str]:
    try:
        return set(reader.store.names())
    except Exception:  # the test's own client reconnects on the next call
        return set()


def test_an_outage_keeps_changes_until_redis_returns(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, policy: Policy
) -> None:
    double.apply(node("a", G5_12))
    with running_sync(double, redis_server.url, tmp_path, policy) as sync:
        wait_until(lambda: reader.store.names() == {"a"}, what="the node")
        redis_server.kill()
        double.apply(node("a", G5_12, gpus=8))
        wait_until(lambda: sync._outage, what="the sync to notice the outage")
        redis_server.start()
        eventually(reader, "a", lambda r: r is not None and r.gpus == 8, "the change written after the outage")


def test_the_sync_command_runs_until_sigterm(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    double.apply(node("a", G5_12))
    kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig")
    code = ("import argparse, sys\n"
            "from extender.kube import commands\n"
            "p = argparse.ArgumentParser(); commands.register(p.add_subparsers())\n"
            "a = p.parse_args(sys.argv[1:]); sys.exit(a.handler(a))\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "sync", "--policy", str(POLICY_FILE), "--kubeconfig", str(kubeconfig),
         "--redis-url", redis_server.url],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_until(lambda: reader.store.names() == {"a"} or proc.poll() is not None, what="the command's write")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "listed 1 object(s)" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


#: The same fleet, but g5.12xlarge nodes are recognised by another label value: under it the node
#: of the test is in no class.
MOVED_SELECTOR = POLICY_FILE.read_text().replace("node.kubernetes.io/instance-type: g5.12xlarge",
                                                 "node.kubernetes.io/instance-type: g5.12xlarge-next")
LAYOUTS = [
    # (id, does the test write through the kubelet ConfigMap layout)
    ("a file edited in place", False),
    ("a ConfigMap volume's ..data swap", True),
]


@pytest.mark.parametrize("configmap", [c[1] for c in LAYOUTS], ids=[c[0] for c in LAYOUTS])
def test_an_edited_policy_is_applied_without_a_restart(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, configmap: bool
) -> None:
    # sync read the policy once at start: a new node-class selector needed a restart to take effect
    from tests.test_fault_reload import ConfigMapVolume

    if configmap:
        volume = ConfigMapVolume(tmp_path / "config")
        volume.publish(POLICY_FILE.read_text())
        path = volume.path
    else:
        path = tmp_path / "policy.yaml"
        path.write_text(POLICY_FILE.read_text())
    policy, version = read_policy(path)
    settings = SyncSettings(watch_timeout_s=60, resync_s=0.5, version_check_s=0.05, backoff_initial_s=0.02,
                            backoff_max_s=0.2, policy_check_s=0.05)
    double.apply(node("gpu-a", {**G5_12, "team": "x"}, gpus=4))
    double.apply(pod("llama-1", "gpu-a", labels=LLAMA, gpus=2, phase="Running", ready=True))
    with running_sync(double, redis_server.url, tmp_path, policy, settings,
                      policy_file=PolicyFile(path, version)) as sync:
        eventually(reader, "gpu-a", lambda r: r is not None and r.node_class == "g5.12xlarge", "the first class")
        lists = (sync.nodes.lists, sync.pods.lists)
        broken = "this: is: not: a policy"
        if configmap:
            volume.publish(broken)
        else:
            path.write_text(broken)
        wait_until(lambda: sync.policy_file is not None and sync.policy_file._rejected is not None,
                   what="the invalid edit seen")
        assert sync.policy_reloads == 0 and (sync.nodes.lists, sync.pods.lists) == lists  # last good policy kept
        if configmap:
            volume.publish(MOVED_SELECTOR)
        else:
            path.write_text(MOVED_SELECTOR)
        eventually(reader, "gpu-a", lambda r: r is not None and r.node_class == "", "the class under the new policy")
        assert sync.policy_reloads == 1
        assert sync.nodes.lists == lists[0] + 1 and sync.pods.lists == lists[1] + 1
        # The watches run again after the relist: later changes still arrive.
        double.apply(node("gpu-b", {"node.kubernetes.io/instance-type": "g5.12xlarge-next"}, gpus=4))
        eventually(reader, "gpu-b", lambda r: r is not None and r.node_class == "g5.12xlarge",
                   "a node after the relist")
        double.remove("v1", "Pod", "llama-1", "serving")
        eventually(reader, "gpu-a", lambda r: r is not None and r.gpus_free == 4, "a pod event after the relist")


def untagged_image(raw: dict[str, Any]) -> None:
    raw["status"]["images"].append({"names": None, "sizeBytes": 123})  # containerd's untagged image


def unreadable_gpu_count(raw: dict[str, Any]) -> None:
    raw["status"]["allocatable"]["nvidia.com/gpu"] = "lots"


class UnreadableCase(NamedTuple):
    id: str
    #: Turns gpu-a's next version (4 GPUs, was 8) into what the API server sends.
    change: Callable[[dict[str, Any]], None]
    #: GPUs of gpu-a's record in the end: 4 when the change was read, 8 when its last facts were kept.
    gpus: int
    #: ``extender_sync_node_problems{kind="unreadable"}`` in the end.
    unreadable: float


UNREADABLE_CASES = [
    UnreadableCase("an untagged image (names: null) is read", untagged_image, 4, 0.0),
    UnreadableCase("a node that cannot be read keeps its last facts through a relist", unreadable_gpu_count, 8, 1.0),
]


@pytest.mark.parametrize("case", UNREADABLE_CASES, ids=[c.id for c in UNREADABLE_CASES])
def test_a_node_the_sync_cannot_read_is_never_treated_as_deleted(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, case: UnreadableCase
) -> None:
    policy = load_policy(POLICY_FILE)
    # an unreadable node froze on a watch event, then vanished on the next relist as if deleted
    # (record removed, tombstone written, its agent's reports refused)
    double.apply(node("gpu-a", G5_12, gpus=8, images=[VLLM]))
    double.apply(node("gpu-b", G5_12))
    registry = CollectorRegistry()
    with running_sync(double, redis_server.url, tmp_path, policy, metrics=SyncMetrics(registry, policy)) as sync:
        wait_until(lambda: reader.store.names() == {"gpu-a", "gpu-b"}, what="both nodes")
        assert reader.report_agent("gpu-a", AgentReport(heartbeat=time.time())) is not None
        changed = node("gpu-a", G5_12, gpus=4, images=[VLLM])
        case.change(changed)
        double.apply(changed)
        wait_until(lambda: ((r := record(reader, "gpu-a")) is not None and r.gpus == 4)
                   or "gpu-a" in sync.view.unreadable, what="the change handled")
        wait_until(lambda: double.open_watches() >= 2, what="both watches open")
        double.state.expire_watches()
        wait_until(lambda: sync.nodes.lists >= 2, what="the relist")
        # a change arriving after the relist is written after the relist's prune
        double.apply(node("gpu-b", G5_12, gpus=2))
        eventually(reader, "gpu-b", lambda r: r is not None and r.gpus == 2, "gpu-b's change after the relist")
        assert reader.store.names() == {"gpu-a", "gpu-b"}
        state = record(reader, "gpu-a")
        assert state is not None and state.gpus == case.gpus and state.images == tuple(VLLM)
        assert reader.report_agent("gpu-a", AgentReport(heartbeat=time.time())) is not None  # no tombstone
        assert registry.get_sample_value("extender_sync_node_problems", {"kind": "unreadable"}) == case.unreadable


def near_full_agent_report(name: str, free: int) -> AgentReport:
    """An agent report whose record alone is ``free`` bytes under the store's limit of one record."""
    beat = float(int(time.time()))  # one heartbeat, a whole second: its JSON has the same length in every call

    def size(n: int, pad: int = 0) -> int:
        weights = {f"w{i:05d}-" + "x" * 990: 1 for i in range(n)}
        if pad:
            weights["pad-" + "y" * pad] = 1
        return len(encode(merge(name, AgentReport(weights=weights, heartbeat=beat), None)))

    base, per_entry = size(0), size(1) - size(0)
    n = (MAX_RECORD_BYTES - free - base) // per_entry - 1
    pad = MAX_RECORD_BYTES - free - size(n) - len(',"pad-":1')
    weights = {f"w{i:05d}-" + "x" * 990: 1 for i in range(n)} | {"pad-" + "y" * pad: 1}
    report = AgentReport(weights=weights, heartbeat=beat)
    assert len(encode(merge(name, report, None))) == MAX_RECORD_BYTES - free
    return report


class UnstorableCase(NamedTuple):
    id: str
    #: gpu-b's labels, and the bytes its agent's record holds before the sync starts (0: no agent).
    labels: dict[str, str]
    agent_free: int
    #: Whether gpu-b's report reaches the store, and the ``extender_sync_node_problems`` kind counting it.
    stored: bool
    kind: str


UNSTORABLE_CASES = [
    UnstorableCase("5000 labels: the report is trimmed to what a record holds",
                   {**G5_12, **{f"feature.node.kubernetes.io/f{i}": "true" for i in range(5000)}}, 0, True,
                   "trimmed"),
    UnstorableCase("a merged record over 1 MiB: refused, no outage, the other nodes written",
                   {**G5_12, **{f"example.com/label-{i:03d}": "v" * 40 for i in range(100)}}, 2000, False,
                   "refused"),
]


@pytest.mark.parametrize("case", UNSTORABLE_CASES, ids=[c.id for c in UNSTORABLE_CASES])
def test_one_node_the_store_cannot_hold_never_stops_the_others(
    double: KubeDouble, reader: SourceStore, redis_server: RedisServer, tmp_path: Path, case: UnstorableCase
) -> None:
    policy = load_policy(POLICY_FILE)
    # a ValidationError (over 4096 labels) killed the writer thread; an OversizedRecordError was
    # retried forever as an outage, and the healthy nodes of the same batch were never written
    if case.agent_free:
        assert reader.report_agent("gpu-b", near_full_agent_report("gpu-b", case.agent_free)) is not None
    double.apply(node("gpu-a", G5_12, gpus=4))
    double.apply(node("gpu-b", case.labels, gpus=4))
    registry = CollectorRegistry()
    with running_sync(double, redis_server.url, tmp_path, policy, metrics=SyncMetrics(registry, policy)) as sync:
        eventually(reader, "gpu-a", lambda r: r is not None and r.gpus == 4, "the healthy node written")
        wait_until(lambda: registry.get_sample_value("extender_sync_node_problems", {"kind": case.kind}) == 1.0,
                   what=f"gpu-b counted as {case.kind}")
        double.apply(node("gpu-a", G5_12, gpus=8))
        eventually(reader, "gpu-a", lambda r: r is not None and r.gpus == 8, "a later change still written")
        assert not sync.outage
        stored = reader.kube_reports(["gpu-b"])["gpu-b"]
        assert (stored is not None) == case.stored
        assert stored is None or 0 < len(stored.labels) <= MAX_ENTRIES


class Refill(NamedTuple):
    id: str
    writes: int  # agent reports the emptied store took, less the version the sync had seen


REFILLS = [
    Refill("refilled to below the sync's version", -2),
    # the agents' heartbeats are refused by the emptied store, so they write whole reports at once:
    # the version can reach the sync's, or pass it, before the sync's next look (every 2 s)
    Refill("refilled to exactly the sync's version", 0),
    Refill("refilled past the sync's version", 2),
]


@pytest.mark.parametrize("case", REFILLS, ids=[c.id for c in REFILLS])
def test_a_redis_that_restarted_empty_is_noticed_by_either_counter(
    double: KubeDouble, reader: SourceStore, tmp_path: Path, policy: Policy, case: Refill
) -> None:
    """Without the sync's part the refilled records have no class, labels or GPUs until the next
    resync (60 s); so the sync rewrites every node as soon as either counter went back."""
    kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kubeconfig")))
    agent = SourceStore(reader.store)
    try:
        sync = ClusterSync(kube, lambda: reader, policy, FAST)  # driven by hand, step by step
        sync.view.replace_nodes([node("a", G5_12), node("b", G5_12)])
        sync.view.replace_pods([])
        sync._flush(reader)
        for name in ("a", "b"):
            agent.report_agent(name, AgentReport(heartbeat=time.time()))
            for _ in range(3):
                assert agent.beat_agent(name, time.time())
        sync._check_version(reader)
        assert not sync.view.dirty
        ours = reader.store.version()
        reader.client.flushall()
        for i in range(ours + case.writes):
            agent.report_agent("ab"[i % 2], AgentReport(heartbeat=time.time()))
        assert reader.store.version() - ours == case.writes
        sync._check_version(reader)
        assert sync.view.dirty == {"a", "b"}
        sync._flush(reader)
        for name in ("a", "b"):
            rec = record(reader, name)
            assert rec is not None and rec.gpus == 4 and rec.labels == G5_12
    finally:
        kube.close()
