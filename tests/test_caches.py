"""Cache kinds: the registry is complete, derived facts agree, and LoRA adapters (the newest kind) work end to end.

The LoRA numbers, on the class of tests/gpu_policy.py (NVMe read 20 GB/s, NIC 12.5 GB/s, 1 GB/s per
object-store stream)::

    tenants: llm's shape, adapters acme 2 GB, globex 1 GB, initech 1 GB; preload 2, load 3 s
    adapters fetched   2 GB / min(12.5, 1) GB/s + 1 GB / 1 GB/s + 2 x 3 s          = 9.0 s
    adapters on NVMe   3 GB / max(20, 1) GB/s + 2 x 3 s                             = 6.15 s
    only acme on NVMe  2 GB / 20 GB/s + 1 GB / 1 GB/s + 2 x 3 s                     = 7.1 s
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple, get_args

import numpy as np
import pytest

from extender.agent.scan import scan_cache
from extender.core.caches import (
    KINDS,
    NVME_KINDS,
    SPECS,
    CacheKind,
    adapter_keys,
    cache_id,
    compile_key,
    ids_in_use,
    parse_cache_id,
    replica_ids,
    warm_entries,
    with_entries,
)
from extender.core.errors import InvalidValueError, PolicyError, UnknownNameError
from extender.core.estimate import CacheState, CompileCache, estimate
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy, Warming, parse_policy
from extender.core.scoring import NodeInputs, evaluate
from extender.core.warming import Action, Expectation, apply, plan
from extender.layout import finish_from_disk
from extender.sim.cluster import Cluster, NodeSpec
from extender.warm.checks import present
from extender.warm.steps import StepError, cache_path, finish, prepare
from extender.warm.templates import action_values
from tests.gpu_policy import GPU_LLM_POLICY

NOW = 1_000_000.0
GB = 10**9
TENANTS = """\
  - name: tenants
    match: {labels: {app: tenants}}
    image: {reference: "example.com/tenants:1", size: 10GB}
    weights: {source: "s3://m/tenants/", version: v1, bytes: 100GB, shardFiles: 10, loaderConcurrency: 10}
    parallelism: {tensor: 8}
    compile: {cold: 100s, warm: 10s, artifactBytes: 1GB}
    graphCapture: 10s
    engineInit: 20s
    lora:
      adapters:
        - {name: acme, source: "s3://m/lora/acme/", bytes: 2GB}
        - {name: globex, source: "s3://m/lora/globex/", bytes: 1GB}
        - {name: initech, source: "s3://m/lora/initech/", bytes: 1GB}
      preload: 2
      load: 3s
  - name: snapw
    match: {labels: {app: snapw}}
    image: {reference: "example.com/snapw:1", size: 10GB}
    weights: {source: "s3://m/snapw/", version: v1, bytes: 100GB, shardFiles: 10, loaderConcurrency: 10}
    parallelism: {tensor: 8}
    snapshot: {bytes: 40GB, restore: 5s}
"""
POLICY = parse_policy(GPU_LLM_POLICY + TENANTS)
GPU = POLICY.node_class("gpu")
TEN = POLICY.profile("tenants")


def node(name: str = "n1", **fields: Any) -> NodeState:
    doc: dict[str, Any] = {"name": name, "labels": {"pool": "gpu"}, "gpus": 8, "gpusFree": 8, "nvmeTotal": 1000 * GB,
                           "nvmeFree": 900 * GB, "heartbeat": NOW - 1}
    return NodeState.model_validate(doc | fields)


def adapters_state(*present: bool) -> CacheState:
    """One node with the image, every weight and the compile cache, and the preloaded adapters as given."""
    warm = CacheState.uniform(1, image=True, weights_bytes=100 * GB, compile=CompileCache.LOCAL, adapters=2)
    return replace(warm, adapters=np.array([present], dtype=np.bool_))


# ---- the registry ----------------------------------------------------------------------------------


def test_every_kind_has_one_spec_in_tie_break_order() -> None:
    assert [s.kind for s in KINDS] == list(get_args(CacheKind))
    assert set(SPECS) == set(get_args(CacheKind))
    for spec in KINDS:
        assert hasattr(NodeState(name="x"), spec.field), spec
        assert (spec.directory is None) == (not spec.on_nvme), spec


@pytest.mark.parametrize("text, expected", [
    pytest.param("weights:llm/v1", ("weights", "llm/v1"), id="weights"),
    pytest.param("adapter:tenants/acme", ("adapter", "tenants/acme"), id="adapter"),
    pytest.param("image:example.com/x:1", ("image", "example.com/x:1"), id="image-with-colon"),
])
def test_cache_ids_round_trip(text: str, expected: tuple[str, str]) -> None:
    assert parse_cache_id(text) == expected
    assert cache_id(*parse_cache_id(text)) == text


@pytest.mark.parametrize("text, error", [
    pytest.param("weights", InvalidValueError, id="no-colon"),
    pytest.param("weights:", InvalidValueError, id="no-name"),
    pytest.param("lora:x", UnknownNameError, id="unknown-kind"),
])
def test_bad_cache_ids_are_refused(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_cache_id(text)


def test_every_kind_is_planned_applied_and_seen_by_the_executor() -> None:
    # One cold node, three workloads that between them make every kind obtainable: llm (image,
    # weights, compile from the registry), snapw (a published snapshot), tenants (adapters).
    policy = POLICY.model_copy(update={"warming": Warming.model_validate(
        {"maxConcurrentPerNode": 50, "maxConcurrent": 50})})
    llm_key = compile_key(policy.profile("llm"), GPU)
    assert llm_key is not None
    snap = InventorySnapshot.build(policy, [node()], registry=[llm_key])
    wanted = [Expectation(workload=w, replicas=1, within_s=3600.0) for w in ("llm", "snapw", "tenants")]
    result = plan(policy, snap, wanted, now=NOW, published_snapshots=[("snapw", "gpu")])
    assert {a.kind for a in result.actions} == set(get_args(CacheKind))
    record = snap.nodes[0]
    for action in result.actions:
        record = apply(record, action, now=NOW)
    after = InventorySnapshot.build(policy, [record], registry=[llm_key])
    assert all(present(policy, after, a, NOW) for a in result.actions)


def test_every_kind_a_warm_node_holds_reaches_the_simulated_record() -> None:
    held = {i: b for p in POLICY.profiles for k in get_args(CacheKind) for i, b in warm_entries(p, GPU, k).items()}
    assert {parse_cache_id(i)[0] for i in held} == set(get_args(CacheKind))
    cluster = Cluster.build(POLICY, POLICY.profiles, [NodeSpec("n1", "gpu", tuple(held.items()))])
    record = cluster.records[0]
    for ident in held:
        kind, name = parse_cache_id(ident)
        assert name in getattr(record, SPECS[kind].field), ident
    on_nvme = sum(b for i, b in held.items() if SPECS[parse_cache_id(i)[0]].on_nvme)
    assert record.nvme_free == GPU.nvme.capacity - on_nvme


def test_every_kind_on_nvme_has_a_path_the_agent_reads(tmp_path: Path) -> None:
    ids = {"weights": "weights:llm/v1", "compile": "compile:ck1-abc", "snapshot": "snapshot:snapw/v1",
           "adapter": "adapter:tenants/acme"}
    assert set(ids) == {s.kind for s in NVME_KINDS}
    for ident in ids.values():
        staging = prepare(tmp_path, ident)
        (staging / "data.bin").write_bytes(b"x" * 10)
        finish(tmp_path, ident)
    scan = scan_cache(tmp_path)
    assert scan.weights_bytes == {"llm/v1": 10}
    assert scan.compile_keys == ("ck1-abc",)
    assert scan.snapshots == ("snapw/v1",)
    assert scan.adapters == ("tenants/acme",)


# ---- derived facts -------------------------------------------------------------------------------


@pytest.mark.parametrize("add, remove, expected", [
    pytest.param({"weights:llm/v1": 5}, (), {"weights": {"llm/v1": 5}}, id="weights-bytes"),
    pytest.param({"adapter:tenants/acme": 7}, (), {"adapters": ("tenants/acme",),
                                                    "cache_bytes": {"adapter:tenants/acme": 7}}, id="adapter-sized"),
    pytest.param({"image:example.com/x:1": 0}, (), {"images": ("example.com/x:1",), "cache_bytes": {}},
                 id="image-no-size"),
    pytest.param({}, ("compile:k1",), {"compile_keys": (), "cache_bytes": {}, "last_used": {}}, id="remove"),
])
def test_with_entries(add: dict[str, int], remove: tuple[str, ...], expected: dict[str, Any]) -> None:
    record = node(compileKeys=["k1"], cacheBytes={"compile:k1": 3}, lastUsed={"compile:k1": 1.0})
    if not remove:
        expected.setdefault("compile_keys", ("k1",))
    updates = with_entries(record, add=add, remove=remove)
    for name, value in expected.items():
        assert updates.get(name, getattr(record, name)) == (value if name != "cache_bytes" or remove else
                                                            {"compile:k1": 3, **value}), name


def test_a_pod_protects_its_adapters_and_every_version_of_its_weights() -> None:
    record = node(podWorkloads=["tenants"], weights={"tenants/v0": 1, "llm/v1": 1},
                  adapters=["tenants/acme", "tenants/old"], inUse=["compile:x"])
    needed = ids_in_use(POLICY, record, GPU)
    assert {"weights:tenants/v0", "adapter:tenants/acme", "adapter:tenants/old", "compile:x"} <= needed
    assert "weights:llm/v1" not in needed
    assert replica_ids(TEN, GPU) <= needed


LLM_KEY = compile_key(POLICY.profile("llm"), GPU)
#: A compile key no current profile computes: llm's before a rollout (another image digest), say.
OLD_KEY = "0" * 64


class CompileKept(NamedTuple):
    id: str
    pods: tuple[str, ...]
    keys: tuple[str, ...]
    kept: frozenset[str]  # of keys: those ids_in_use protects


COMPILE_KEPT = [
    CompileKept("a running pod's key of the previous rollout", ("llm",), (OLD_KEY, str(LLM_KEY)),
                frozenset({OLD_KEY, str(LLM_KEY)})),
    CompileKept("a key nobody can attribute, while another workload's pod runs", ("tenants",), (OLD_KEY,),
                frozenset({OLD_KEY})),
    CompileKept("a pod of a workload the policy no longer has", ("retired",), (OLD_KEY,), frozenset({OLD_KEY})),
    CompileKept("the current key of a workload with no pod on the node", ("tenants",), (str(LLM_KEY),), frozenset()),
    CompileKept("no pod on the node: nothing is read", (), (OLD_KEY, str(LLM_KEY)), frozenset()),
]


@pytest.mark.parametrize("case", COMPILE_KEPT, ids=[c.id for c in COMPILE_KEPT])
def test_a_pod_protects_every_compile_key_it_may_read(case: CompileKept) -> None:
    record = node(podWorkloads=list(case.pods), compileKeys=list(case.keys))
    needed = ids_in_use(POLICY, record, GPU)
    assert {k for k in case.keys if cache_id("compile", k) in needed} == case.kept


def test_the_planner_never_evicts_a_running_pods_old_compile_cache() -> None:
    record = node(podWorkloads=["llm"], compileKeys=[OLD_KEY], cacheBytes={f"compile:{OLD_KEY}": 60 * GB},
                  lastUsed={f"compile:{OLD_KEY}": NOW - 7200}, nvmeFree=60 * GB, gpusFree=8)
    snap = InventorySnapshot.build(POLICY, [record], taken_at=NOW, registry=())
    result = plan(POLICY, snap, [Expectation(workload="tenants", replicas=1, within_s=3600)], now=NOW)
    assert all(e.cache != f"compile:{OLD_KEY}" for a in result.actions for e in a.evictions)
    assert all(a.kind != "weights" for a in result.actions)  # 100 GB does not fit without that eviction


# ---- LoRA adapters --------------------------------------------------------------------------------


@pytest.mark.parametrize("here, seconds", [
    pytest.param((False, False), 9.0, id="fetched"),
    pytest.param((True, True), 6.15, id="on-nvme"),
    pytest.param((True, False), 7.1, id="first-only"),
])
def test_adapter_phase(here: tuple[bool, bool], seconds: float) -> None:
    est = estimate(TEN, [GPU], np.zeros(1, dtype=np.intp), adapters_state(*here))
    assert float(est.adapters_s[0]) == pytest.approx(seconds)
    assert float(est.total_s[0]) == pytest.approx(10 * 100 / 20 / 10 + 10 + 10 + 20 + seconds)  # weights 5 s


def test_the_inventory_and_the_score_see_adapters() -> None:
    warm = node("warm", adapters=list(adapter_keys(TEN)))
    cold = node("cold")
    snap = InventorySnapshot.build(POLICY, [warm, cold])
    state, _ = snap.state_for(TEN, np.array([0, 1], dtype=np.intp), NOW)
    assert state.adapters.tolist() == [[True, True], [False, False]]
    # staleness makes them cold like every other cache
    stale, _ = snap.state_for(TEN, np.array([0], dtype=np.intp), NOW + 3600)
    assert stale.adapters.tolist() == [[False, False]]
    inputs = NodeInputs(classes=snap.classes, class_index=snap.class_index[:2], state=state,
                        fresh=np.array([True, True]), free_known=np.array([True, True]),
                        nvme_free=np.array([900.0 * GB, 900.0 * GB]))
    est = evaluate(POLICY, TEN, inputs)
    assert est.estimate.total_s[0] < est.estimate.total_s[1]
    assert est.score[0] >= est.score[1]


def test_the_planner_stages_adapters_in_popularity_order() -> None:
    policy = POLICY.model_copy(update={"warming": Warming.model_validate({"maxConcurrentPerNode": 3})})
    key = cache_id("image", TEN.image.reference)
    ready = node(images=[TEN.image.reference], weights={"tenants/v1": 100 * GB})
    snap = InventorySnapshot.build(policy, [ready])
    result = plan(policy, snap, [Expectation(workload="tenants", replicas=1, within_s=600.0)], now=NOW)
    assert [(a.kind, a.cache, a.bytes) for a in result.actions] == [
        ("adapter", "adapter:tenants/acme", 2 * GB), ("adapter", "adapter:tenants/globex", GB)]
    assert result.actions[0].duration_s == pytest.approx(2.0)  # one stream at 1 GB/s
    assert key not in {a.cache for a in result.actions}  # the image is there already


def test_an_in_flight_adapter_is_not_planned_twice() -> None:
    ready = node(images=[TEN.image.reference], weights={"tenants/v1": 100 * GB})
    snap = InventorySnapshot.build(POLICY, [ready])
    flying = Action(node="n1", workload="tenants", kind="adapter", cache="adapter:tenants/globex", bytes=GB,
                    nvme_bytes=GB, duration_s=1.0, deadline=None, saved_s=1.0, purpose="demand")
    policy = POLICY.model_copy(update={"warming": Warming.model_validate({"maxConcurrentPerNode": 3})})
    result = plan(policy, snap, [Expectation(workload="tenants", replicas=1, within_s=600.0)], now=NOW,
                  in_flight=[flying])
    assert [a.cache for a in result.actions] == ["adapter:tenants/acme"]


def test_adapter_templates_get_the_adapters_source() -> None:
    action = Action(node="n1", workload="tenants", kind="adapter", cache="adapter:tenants/globex", bytes=GB,
                    nvme_bytes=GB, duration_s=1.0, deadline=None, saved_s=1.0, purpose="demand")
    values = action_values(POLICY, action, "gpu")
    assert values["source"] == "s3://m/lora/globex/"
    assert values["adapter"] == "globex"
    assert values["dest"] == str(PurePosixPath("/cache/adapters/tenants/globex"))


@pytest.mark.parametrize("ident", [
    pytest.param("adapter:tenants", id="one-part"),
    pytest.param("adapter:tenants/../x", id="climbs"),
    pytest.param("adapter:tenants/.hidden", id="staging-name"),
    pytest.param("image:example.com/x:1", id="not-on-disk"),
])
def test_unsafe_or_impossible_paths_are_refused(tmp_path: Path, ident: str) -> None:
    with pytest.raises(StepError):
        cache_path(tmp_path, ident)


def test_an_adapter_without_its_marker_is_not_reported(tmp_path: Path) -> None:
    partial = tmp_path / "adapters" / "tenants" / "acme"
    partial.mkdir(parents=True)
    (partial / "adapter_model.safetensors").write_bytes(b"x")
    assert scan_cache(tmp_path).adapters == ()
    finish_from_disk(partial)
    assert scan_cache(tmp_path).adapters == ("tenants/acme",)


@pytest.mark.parametrize("lora, message", [
    pytest.param("{adapters: [{name: a, source: s3://x/, bytes: 1GB}, {name: a, source: s3://y/, bytes: 1GB}]}",
                 "adapter names must be unique; repeated: a", id="duplicate"),
    pytest.param("{adapters: [{name: a, source: s3://x/, bytes: 1GB}], preload: -1}", "must be >= 0, got -1",
                 id="negative-preload"),
    pytest.param("{adapters: []}", "at least 1 item", id="empty"),
    pytest.param("{adapters: [{name: a, source: s3://x/, bytes: 0}]}", "", id="zero-bytes"),
])
def test_bad_lora_sections_name_file_and_line(lora: str, message: str) -> None:
    text = GPU_LLM_POLICY + f"    lora: {lora}\n"
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    shown = str(err.value)
    assert "p.yaml:" in shown and "lora" in shown and message in shown


def test_preload_beyond_the_list_preloads_every_adapter() -> None:
    policy: Policy = parse_policy(GPU_LLM_POLICY + "    lora: {adapters: [{name: a, source: s3://x/, bytes: 1GB}], "
                                                   "preload: 5}\n")
    assert [a.name for a in policy.profile("llm").preloaded_adapters] == ["a"]


def test_no_compile_key_without_inputs_or_on_the_unknown_class() -> None:
    from extender.core.policy import UNKNOWN_CLASS

    assert compile_key(POLICY.profile("llm"), GPU) is not None
    assert compile_key(POLICY.profile("llm"), UNKNOWN_CLASS) is None  # the key hashes a GPU product nobody knows
    assert compile_key(TEN, GPU) is None  # no compile.key section
