"""Agent and sync reports merged into one node record: the rules (pure) and the transactions (real Redis)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from extender.core.errors import StoreUnavailableError
from extender.core.inventory import NodeState
from extender.core.reports import AgentReport, KubeReport, Replicas, merge
from extender.state import InventoryStore, connect
from extender.state.sources import SourceStore
from tests.conftest import RedisServer

AGENT = AgentReport(nvme_total=1000, nvme_free=400, weights={"llama3-8b/main": 16}, compile_keys=("ck1-a",),
                    snapshots=("llama3-8b",), heartbeat=100.0, ttl=60.0)
KUBE = KubeReport(node_class="g5.12xlarge", labels={"a": "b"}, gpus=4, gpus_free=3, images=("kubelet:1",))


@dataclass(frozen=True)
class MergeCase:
    id: str
    agent: AgentReport | None
    kube: KubeReport | None
    expected: dict[str, object]


MERGE_CASES = [
    MergeCase("nothing", None, None, {"heartbeat": 0.0, "images": (), "gpus": 0, "weights": {}}),
    MergeCase("sync only: never fresh (no heartbeat)", None, KUBE,
              {"node_class": "g5.12xlarge", "gpus": 4, "gpus_free": 3, "images": ("kubelet:1",), "heartbeat": 0.0}),
    MergeCase("agent only: no class, disk facts", AGENT, None,
              {"node_class": "", "nvme_total": 1000, "nvme_free": 400, "weights": {"llama3-8b/main": 16},
               "heartbeat": 100.0}),
    MergeCase("both: each source's fields", AGENT, KUBE,
              {"node_class": "g5.12xlarge", "labels": {"a": "b"}, "gpus": 4, "nvme_free": 400,
               "compile_keys": ("ck1-a",), "snapshots": ("llama3-8b",), "heartbeat": 100.0,
               "images": ("kubelet:1",)}),
    MergeCase("agent reports images: its list wins over kubelet's 50",
              AGENT.model_copy(update={"images": ("runtime:1", "runtime:2")}), KUBE,
              {"images": ("runtime:1", "runtime:2")}),
    MergeCase("agent reports an empty image list: still wins", AGENT.model_copy(update={"images": ()}), KUBE,
              {"images": ()}),
    MergeCase("workloads with a pod starting or running here",
              None, KUBE.model_copy(update={"replicas": {"b": Replicas(starting=1), "a": Replicas(running=2),
                                                         "gone": Replicas()}}),
              {"pod_workloads": ("a", "b")}),
    MergeCase("free never above total", AGENT.model_copy(update={"nvme_free": 2000}),
              KUBE.model_copy(update={"gpus_free": 9}), {"nvme_free": 1000, "gpus_free": 4}),
]


@pytest.mark.parametrize("case", MERGE_CASES, ids=[c.id for c in MERGE_CASES])
def test_merge(case: MergeCase) -> None:
    state = merge("n1", case.agent, case.kube)
    got = {k: getattr(state, k) for k in case.expected}
    assert got == case.expected
    # the merged record is a valid NodeState (what InventoryStore decodes)
    assert NodeState.model_validate(state.model_dump(by_alias=True)) == state


def test_agent_report_content_ignores_the_heartbeat() -> None:
    assert AGENT.same_content(AGENT.model_copy(update={"heartbeat": 999.0}))
    assert not AGENT.same_content(AGENT.model_copy(update={"nvme_free": 1}))
    assert not AGENT.same_content(None)
    # free space drifts with logs and scratch files; only a drift beyond the tolerance is news
    assert AGENT.same_content(AGENT.model_copy(update={"nvme_free": 390}), free_tolerance=10)
    assert not AGENT.same_content(AGENT.model_copy(update={"nvme_free": 389}), free_tolerance=10)


# ---- against a real Redis -----------------------------------------------------------------------


@pytest.fixture
def sources(redis_server: RedisServer, tmp_path: Path) -> Iterator[SourceStore]:
    client = connect(redis_server.url, tmp_path)
    try:
        yield SourceStore(InventoryStore(client))
    finally:
        client.close()



@pytest.mark.integration
def test_each_source_keeps_the_others_fields(sources: SourceStore) -> None:
    sources.report_agent("n1", AGENT)
    sources.report_kube({"n1": KUBE})
    record = sources.store.get("n1")
    assert record == merge("n1", AGENT, KUBE)
    # the sync's next write changes labels only; the agent's heartbeat and weights stay
    sources.report_kube({"n1": KUBE.model_copy(update={"labels": {"a": "c"}})})
    record = sources.store.get("n1")
    assert record is not None
    assert record.labels == {"a": "c"} and record.heartbeat == 100.0 and record.weights == {"llama3-8b/main": 16}


@pytest.mark.integration
def test_concurrent_writers_never_lose_an_update(sources: SourceStore) -> None:
    rounds = 60

    def agent() -> None:
        for i in range(rounds):
            sources.report_agent("n1", AGENT.model_copy(update={"weights": {"w/v": i}}))

    def sync() -> None:
        for i in range(rounds):
            sources.report_kube({"n1": KUBE.model_copy(update={"labels": {"round": str(i)}})})

    threads = [threading.Thread(target=agent), threading.Thread(target=sync)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    record = sources.store.get("n1")
    assert record is not None
    assert record.weights == {"w/v": rounds - 1}
    assert record.labels == {"round": str(rounds - 1)}


@pytest.mark.integration
def test_every_write_bumps_the_inventory_version(sources: SourceStore) -> None:
    v1 = sources.report_agent("n1", AGENT)
    v2 = sources.report_kube({"n1": KUBE, "n2": KUBE})  # one transaction: one step
    v3 = sources.remove_node("n2")
    assert v1 is not None and v1 < v2 < v3 == sources.store.version()
    assert sources.store.names() == {"n1"}


@pytest.mark.integration
def test_a_deleted_node_keeps_late_agent_reports_out_until_it_returns(sources: SourceStore) -> None:
    sources.report_kube({"n1": KUBE})
    sources.report_agent("n1", AGENT)
    sources.remove_node("n1")
    assert sources.store.get("n1") is None
    assert sources.report_agent("n1", AGENT) is None  # the agent on a removed node
    assert sources.store.get("n1") is None
    assert sources.client.ttl(sources.key("n1")) > 0  # the tombstone expires on its own
    sources.report_kube({"n1": KUBE})  # the node registered again
    assert sources.client.ttl(sources.key("n1")) == -1
    assert sources.report_agent("n1", AGENT) is not None
    assert sources.store.get("n1") == merge("n1", AGENT, KUBE)


@pytest.mark.integration
@pytest.mark.parametrize("stored", [
    pytest.param("{not json", id="not-json"),
    pytest.param(b"\xff\xfe", id="not-utf-8"),  # once a UnicodeDecodeError that ended the agent
    pytest.param('{"gpus": "eight"}', id="schema-mismatch"),
])
def test_a_corrupt_stored_report_counts_as_absent(sources: SourceStore, caplog: pytest.LogCaptureFixture,
                                                  stored: str | bytes) -> None:
    sources.client.hset(sources.key("n1"), "kube", stored)
    with caplog.at_level(logging.WARNING):
        sources.report_agent("n1", AGENT)
    assert sources.store.get("n1") == merge("n1", AGENT, None)
    (warning,) = [r.getMessage() for r in caplog.records if "corrupt KubeReport" in r.getMessage()]
    assert "\n" not in warning  # one line: where and why, not pydantic's whole report


@pytest.mark.integration
def test_kube_reports_reads_back_what_is_stored(sources: SourceStore) -> None:
    sources.report_kube({"n1": KUBE})
    sources.report_agent("n2", AGENT)
    assert sources.kube_reports(["n1", "n2", "n3"]) == {"n1": KUBE, "n2": None, "n3": None}
    sources.store.delete("n1")  # someone removed the record: the report alone is not enough
    assert sources.kube_reports(["n1"]) == {"n1": None}
    assert sources.agent_report("n2") == AGENT


@pytest.mark.integration
def test_an_outage_is_store_unavailable(sources: SourceStore, redis_server: RedisServer) -> None:
    redis_server.kill()
    with pytest.raises(StoreUnavailableError):
        sources.report_agent("n1", AGENT)
    with pytest.raises(StoreUnavailableError):
        sources.report_kube({"n1": KUBE})
