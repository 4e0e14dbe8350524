"""Two releases on one store (a rolling upgrade, a rollback): each reads what the other stored.

Every component shares its stored data: node records and the agent's and the sync's reports in
Redis, observed starts, the scaler's history and decision log, the warmer's Job annotations and the
weights manifests its helper leaves on each node's disk. During a rollout an
older and a newer release read each other's records for minutes. The rule (``read_stored`` in
extender/core/schema.py, docs/reliability.md#upgrades-and-rollbacks): fields a reader does not know
are ignored, missing optional ones take their defaults, and only what is truly unreadable is
skipped. Each row below writes what a newer (or older) release would write, byte for byte, and reads
it with this one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis

from extender import cli
from extender.agent.scan import scan_cache
from extender.core.calibration import Observation
from extender.core.inventory import NodeState
from extender.core.reports import AgentReport, KubeReport, Replicas, merge
from extender.core.scaler import decide
from extender.layout import MANIFEST, finish_from_disk, weights_dir
from extender.scaler.commands import render_record
from extender.state import InventoryStore
from extender.state.decisions import DecisionStore
from extender.state.history import HistoryStore, Sample
from extender.state.observations import ObservationStore, encode
from extender.state.sources import SourceStore
from extender.state.store import encode as encode_record
from extender.warm.jobspec import ACTION_ANNOTATION, PUBLISH_ANNOTATION, Publish, action_job, publish_job, read_job
from tests.conftest import RedisServer
from tests.test_scaler import inputs
from tests.test_warm import BASE, LLM_KEY, action

JSON = dict[str, Any]


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


def _with(**more: Any) -> Callable[[JSON], JSON]:
    """A change to stored JSON: ``more`` added at the top (what a newer release writes beside ours)."""
    return lambda data: {**data, **more}


def _without(*names: str) -> Callable[[JSON], JSON]:
    """A change to stored JSON: ``names`` left out (what an older release, before they existed, wrote)."""
    return lambda data: {k: v for k, v in data.items() if k not in names}


# ---- node records ---------------------------------------------------------------------------------

RECORD = NodeState.model_validate({
    "name": "gpu-1", "nodeClass": "gpu", "gpus": 8, "gpusFree": 2, "nvmeTotal": 10**12, "nvmeFree": 10**11,
    "images": ["vllm:1"], "weights": {"llm/v1": 10**10}, "compileKeys": ["ck-1"], "heartbeat": 1000.0,
    "lastUsed": {"weights:llm/v1": 900.0}, "inUse": ["weights:llm/v1"], "podWorkloads": ["llm"]})


class RecordRow(NamedTuple):
    change: Callable[[JSON], JSON]
    expected: NodeState


RECORD_ROWS = {
    "newer: a field this release does not know": RecordRow(_with(gpuTopology={"nvlink": 8}), RECORD),
    "newer: several unknown fields, one null": RecordRow(_with(rdma=None, zone="a", numa=[0, 1]), RECORD),
    "older: no usage fields yet": RecordRow(
        _without("lastUsed", "inUse", "podWorkloads", "cacheBytes", "adapters"),
        RECORD.model_copy(update={"last_used": {}, "in_use": (), "pod_workloads": ()})),
}


@pytest.mark.parametrize("row", RECORD_ROWS.values(), ids=RECORD_ROWS.keys())
def test_every_inventory_read_takes_a_record_another_release_wrote(client: redis.Redis, row: RecordRow) -> None:
    store = InventoryStore(client)
    store.put(RECORD)
    client.set("extender:node:gpu-1", json.dumps(row.change(json.loads(encode_record(RECORD)))))
    # the node stays known (and warm) to every reader, not skipped as corrupt, i.e. cold
    _, records, _ = store.load_all()
    assert records == [row.expected] and store.corrupt == {}
    assert store.changes_since(0)[1] == {"gpu-1": row.expected}
    assert store.get("gpu-1") == row.expected


# ---- the agent's and the sync's reports ------------------------------------------------------------

AGENT = AgentReport(nvme_total=1000, nvme_free=400, weights={"llm/v1": 16}, compile_keys=("ck-1",), heartbeat=100.0)
KUBE = KubeReport(node_class="gpu", labels={"a": "b"}, gpus=4, gpus_free=3, replicas={"llm": Replicas(running=1)})


def _kube_with_nested_field(data: JSON) -> JSON:
    return {**data, "taints": [], "replicas": {"llm": {**data["replicas"]["llm"], "pending": 2}}}


class ReportRow(NamedTuple):
    #: ``agent`` or ``kube``: the report a newer release stored.
    stored: str
    change: Callable[[JSON], JSON]


REPORT_ROWS = {
    "newer agent, this sync writes": ReportRow("agent", _with(gpuMemoryFree=80)),
    "newer sync, this agent writes": ReportRow("kube", _with(taints=[{"key": "k"}])),
    "newer sync, a field inside a workload's replicas": ReportRow("kube", _kube_with_nested_field),
}


@pytest.mark.parametrize("row", REPORT_ROWS.values(), ids=REPORT_ROWS.keys())
def test_a_report_another_release_stored_stays_in_the_merged_record(client: redis.Redis, row: ReportRow) -> None:
    sources = SourceStore(InventoryStore(client))
    stored = AGENT if row.stored == "agent" else KUBE
    text = json.dumps(row.change(stored.model_dump(mode="python", by_alias=True)))
    client.hset(sources.key("n1"), row.stored, text)
    if row.stored == "agent":
        sources.report_kube({"n1": KUBE})
    else:
        sources.report_agent("n1", AGENT)
    # the other source's part is kept: the node is not left without its disk (cold) or its class
    assert sources.store.get("n1") == merge("n1", AGENT, KUBE)
    if row.stored == "kube":
        assert sources.kube_reports(["n1"]) == {"n1": KUBE}  # no repair churn either
    else:
        assert sources.agent_report("n1") == AGENT


# ---- observed starts ------------------------------------------------------------------------------

START = Observation(pod="llm-0", workload="llm", node="gpu-1", node_class="gpu", scheduled_at=100.0, ready_at=160.0)

OBSERVATION_ROWS = {
    "newer: a field this release does not know": _with(gpuModel="h100"),
    "older: no adapters and no inventory age yet": _without("adapters", "inventoryAge"),
}


@pytest.mark.parametrize("change", OBSERVATION_ROWS.values(), ids=OBSERVATION_ROWS.keys())
def test_a_start_another_release_recorded_is_read(client: redis.Redis, change: Callable[[JSON], JSON]) -> None:
    store = ObservationStore(client)
    store.append([START], now=200.0)
    key = store.key("llm", "gpu")
    client.delete(key)
    client.zadd(key, {json.dumps(change(json.loads(encode(START)))): START.ready_at})
    stored = store.read()
    assert (stored.observations, stored.unreadable) == ((START,), 0)


# ---- the scaler's packed members: demand history and stabilisation window ----------------------------

PACKED_ROWS = {
    "this release's members": ("100.0 4.5 0.0", "90.0 3"),
    "newer: a number appended to each member": ("100.0 4.5 0.0 7.0", "90.0 3 1"),
}


@pytest.mark.parametrize(("sample", "recommendation"), PACKED_ROWS.values(), ids=PACKED_ROWS.keys())
def test_the_scaler_reads_packed_members_a_newer_release_appended_to(client: redis.Redis, sample: str,
                                                                     recommendation: str) -> None:
    history, decisions = HistoryStore(client), DecisionStore(client)
    client.zadd(history.key("llm"), {sample: 100.0})
    client.zadd(decisions.recommendations_key("llm"), {recommendation: 90.0})
    # a StateError here stopped every decision of the workload until the members aged out (3 days)
    assert history.read("llm", now=200.0) == [Sample(100.0, 4.5, 0.0)]
    assert decisions.recommendations("llm") == [(90.0, 3)]


# ---- the scaler's decision log ------------------------------------------------------------------------


DECISION = decide(inputs()).model_dump(mode="json")
#: A decision record as the scaler stores it (extender.scaler.loop), around ``DECISION``.
RECORD_OF_DECISION: JSON = {
    "t": 1.7e9, "workload": "chat", "holder": "scaler-b", "token": 3,
    "signal": {"source": "prometheus", "rate": 1.0, "queue": 0.0, "complete": True, "expected": 1, "answered": 1,
               "note": ""},
    "pods": {"listed": 1, "ready": 1, "starting": 0},
    "placement": {"node": "gpu-1", "nodeClass": "gpu", "cache": "cold", "startupSeconds": 10.0},
    "published": {"desired": 2, "load": 1.0, "unit": "requests/s", "standby": 0, "unshared": None},
    "decision": DECISION,
}


def test_explain_prints_a_decision_a_newer_scaler_recorded() -> None:
    newer = {**DECISION, "fleetShare": 0.5, "inputs": {**DECISION["inputs"], "burstiness": 1.2}}
    assert render_record({**RECORD_OF_DECISION, "decision": newer}) == render_record(RECORD_OF_DECISION)


UNSHOWABLE = {
    "a decision with an action this release does not know": (
        {**RECORD_OF_DECISION, "decision": {**DECISION, "action": "burst"}}, "decision.action"),
    "a record without a section this release prints": (
        {k: v for k, v in RECORD_OF_DECISION.items() if k != "placement"}, "KeyError: 'placement'"),
}


@pytest.mark.parametrize(("record", "says"), UNSHOWABLE.values(), ids=UNSHOWABLE.keys())
def test_explain_of_a_record_this_release_cannot_show_is_one_line_not_a_traceback(
        redis_server: RedisServer, client: redis.Redis, capsys: pytest.CaptureFixture[str], record: JSON,
        says: str) -> None:
    client.lpush(DecisionStore(client).log_key("chat"), json.dumps(record))
    assert cli.main(["scale", "explain", "chat", "--redis-url", redis_server.url]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("extender: the decision log of 'chat' holds a record this release cannot show (")
    assert says in err and err.endswith("--json prints it as stored") and "\n" not in err
    assert cli.main(["scale", "explain", "chat", "--json", "--redis-url", redis_server.url]) == 0
    assert json.loads(capsys.readouterr().out) == record


# ---- the warmer's Jobs ----------------------------------------------------------------------------


class JobRow(NamedTuple):
    job: JSON
    annotation: str


JOB_ROWS = {
    "an action with a field this release does not know": JobRow(action_job(BASE, action("weights")), ACTION_ANNOTATION),
    "a publish with a field this release does not know": JobRow(
        publish_job(BASE, Publish(key=LLM_KEY, node="gpu-b", workload="llm", node_class="gpu", bytes=10**9)),
        PUBLISH_ANNOTATION),
}


@pytest.mark.parametrize("row", JOB_ROWS.values(), ids=JOB_ROWS.keys())
def test_a_job_a_newer_warmer_created_is_still_read(row: JobRow) -> None:
    notes = row.job["metadata"]["annotations"]
    newer = {**row.job, "metadata": {**row.job["metadata"], "annotations": {
        **notes, row.annotation: json.dumps({**json.loads(notes[row.annotation]), "priority": 3})}}}
    # unseen, its work would not count as in flight: more Jobs than maxConcurrent, its NVMe promised twice
    assert read_job(newer) == read_job(row.job) is not None


# ---- weights manifests on a node's disk -----------------------------------------------------------


def _newer_file_field(data: JSON) -> JSON:
    return {**data, "files": [{**f, "mode": 420} for f in data["files"]]}


MANIFEST_ROWS = {
    "newer helper: a field at the top": _with(createdAt="2027-01-01T00:00:00Z"),
    "newer helper: a field on each file": _newer_file_field,
    "older helper: no source": _without("source"),
}


@pytest.mark.parametrize("change", MANIFEST_ROWS.values(), ids=MANIFEST_ROWS.keys())
def test_weights_a_newer_helper_finished_are_complete(tmp_path: Path, change: Callable[[JSON], JSON]) -> None:
    directory = weights_dir(tmp_path, "llm", "v1")
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"x" * 1000)
    finish_from_disk(directory, source="s3://models/llm/")
    manifest = directory / MANIFEST
    manifest.write_text(json.dumps(change(json.loads(manifest.read_text()))))
    scan = scan_cache(tmp_path)
    # a corrupt manifest made them partial, i.e. not warm, for as long as the manifest stayed
    assert [(w.bytes, w.complete) for w in scan.weights] == [(1000, True)] and scan.problems == ()
