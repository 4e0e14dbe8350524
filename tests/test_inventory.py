"""The columnar inventory snapshot: lookups, staleness, and the cache state it hands the estimator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from extender.core.cachekey import compile_cache_key
from extender.core.caches import adapter_key, weights_key
from extender.core.errors import InvalidValueError
from extender.core.estimate import CompileCache
from extender.core.images import check_reference, normalise, repository
from extender.core.inventory import InventorySnapshot, NodeState, next_freshness_change
from extender.core.policy import Policy
from extender.files import load_policy

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_000_000.0


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(ROOT / "policies" / "h200-b200-snapshot.yaml")


def node(name: str, **fields: object) -> NodeState:
    doc: dict[str, object] = {"name": name, "heartbeat": NOW - 1, "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}}
    doc.update(fields)
    return NodeState.model_validate(doc)


def test_unknown_names_map_to_the_cold_sentinel(policy: Policy) -> None:
    snap = InventorySnapshot.build(policy, [node("a"), node("b")], taken_at=NOW)
    found = snap.lookup(["b", "zz", "a"])
    assert found.index.tolist() == [1, 2, 0]  # row 2 is the sentinel
    assert found.known.tolist() == [True, False, True]
    assert snap.classes[snap.class_index[2]].name == "unknown"


def test_class_from_labels_or_explicit_name(policy: Policy) -> None:
    records = [
        node("by-label"),
        node("explicit", nodeClass="b200"),
        node("no-match", labels={"x": "y"}),
        node("bad-name", nodeClass="nope"),
    ]
    snap = InventorySnapshot.build(policy, records)
    names = [snap.classes[i].name for i in snap.class_index[:-1]]
    assert names == ["h200", "b200", "unknown", "unknown"]


IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime"
ABSENT = CompileCache.ABSENT
STATES = [
    # (id, record fields, expected (image, weights bytes, compile, snapshot)) for profile dynamo-worker
    ("empty", {}, (False, 0.0, CompileCache.ABSENT, False)),
    ("image-by-tag", {"images": [f"{IMAGE}:0.6.0"]}, (True, 0.0, ABSENT, False)),
    ("other-tag", {"images": [f"{IMAGE}:0.5.0"]}, (False, 0.0, ABSENT, False)),
    ("partial-weights", {"weights": {weights_key("dynamo-worker", "r1"): "10GB"}}, (False, 1e10, ABSENT, False)),
    ("other-version", {"weights": {weights_key("dynamo-worker", "r0"): "60GB"}}, (False, 0.0, ABSENT, False)),
    ("snapshot", {"snapshots": ["dynamo-worker/r1"]}, (False, 0.0, CompileCache.ABSENT, True)),
    ("snapshot-of-another-version", {"snapshots": ["dynamo-worker/r0"]}, (False, 0.0, CompileCache.ABSENT, False)),
]


@pytest.mark.parametrize(("fields", "expected"), [s[1:] for s in STATES], ids=[s[0] for s in STATES])
def test_cache_state_per_record(policy: Policy, fields: dict[str, object], expected: tuple[object, ...]) -> None:
    snap = InventorySnapshot.build(policy, [node("n", **fields)])
    profile = policy.profile("dynamo-worker")
    state, _ = snap.state_for(profile, snap.lookup(["n"]).index, NOW)
    got = (bool(state.image[0]), float(state.weights_bytes[0]), int(state.compile[0]), bool(state.snapshot[0]))
    assert got == expected


def test_image_by_digest(policy: Policy) -> None:
    profile = policy.profile("dynamo-worker")
    assert profile.compile.key is not None
    by_digest = f"{repository(profile.image.reference)}@{profile.compile.key.image_digest}"
    snap = InventorySnapshot.build(policy, [node("n", images=[by_digest])])
    state, _ = snap.state_for(profile, snap.lookup(["n"]).index, NOW)
    assert state.image.tolist() == [True]


def test_compile_key_is_per_gpu_product(policy: Policy) -> None:
    profile = policy.profile("dynamo-worker")
    assert profile.compile.key is not None

    def key(product: str) -> str:
        assert profile.compile.key is not None
        return compile_cache_key(profile.compile.key, gpu_product=product, tensor_parallel=8, pipeline_parallel=1)

    h200, b200 = key("NVIDIA-H200"), key("NVIDIA-B200")
    records = [
        node("h-local", compileKeys=[h200]),
        node("h-wrong-gpu-key", compileKeys=[b200]),  # a B200 artifact is no use on an H200
        node("h-registry"),
    ]
    snap = InventorySnapshot.build(policy, records, registry=[h200])
    state, _ = snap.state_for(profile, snap.lookup(["h-local", "h-wrong-gpu-key", "h-registry"]).index, NOW)
    assert state.compile.tolist() == [CompileCache.LOCAL, CompileCache.REGISTRY, CompileCache.REGISTRY]


def test_stale_and_unknown_records_are_cold(policy: Policy) -> None:
    warm = {
        "images": ["nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0"],
        "weights": {weights_key("dynamo-worker", "r1"): "60GB"},
        "snapshots": ["dynamo-worker/r1"],
        "pullingBytes": "5GB",
    }
    records = [node("fresh", **warm), node("stale", **{**warm, "heartbeat": NOW - 61, "ttl": "60s"})]
    snap = InventorySnapshot.build(policy, records)
    profile = policy.profile("dynamo-worker")
    state, _ = snap.state_for(profile, snap.lookup(["fresh", "stale", "missing"]).index, NOW)
    assert state.image.tolist() == [True, False, False]
    assert state.weights_bytes.tolist() == [60e9, 0.0, 0.0]
    assert state.snapshot.tolist() == [True, False, False]
    # bytes in flight still count against a stale node: it is no faster for being unknown
    assert state.queued_bytes.tolist() == [5e9, 5e9, 0.0]
    assert snap.fresh(NOW).tolist() == [True, False, False]


#: (id, heartbeat minus the reader's now, fresh?) with a TTL of 60 s: fresh while the heartbeat is
#: within the TTL of the reader's clock in either direction, bounds included.
WINDOW = [
    pytest.param(-30.0, True, id="behind-within-ttl"),
    pytest.param(-60.0, True, id="behind-exactly-at-ttl"),
    pytest.param(-60.5, False, id="behind-beyond-ttl"),
    pytest.param(0.0, True, id="at-the-readers-now"),
    pytest.param(30.0, True, id="ahead-within-ttl"),
    pytest.param(60.0, True, id="ahead-exactly-at-ttl"),
    # used to be fresh until the reader's clock caught up: an hour, however long ago the agent died
    pytest.param(60.5, False, id="ahead-beyond-ttl"),
    pytest.param(3600.0, False, id="ahead-an-hour"),
]


#: An agent whose clock ran an hour ahead wrote its last report at reader time 0 and died: rows at
#: the reader's seconds since (heartbeat minus now = 3600 - since). Fresh only in the two TTLs around
#: its stamp, stale for good after.
DEAD_AHEAD = [
    pytest.param(3600.0 - 0.0, False, id="dead-ahead-just-died-stale-ahead"),
    pytest.param(3600.0 - 3539.0, False, id="dead-ahead-still-more-than-a-ttl-ahead"),
    pytest.param(3600.0 - 3540.0, True, id="dead-ahead-reader-clock-reaches-the-window"),
    pytest.param(3600.0 - 3660.0, True, id="dead-ahead-last-second-of-the-window"),
    pytest.param(3600.0 - 3661.0, False, id="dead-ahead-stale-behind-for-good"),
    pytest.param(3600.0 - 86400.0, False, id="dead-ahead-a-day-later"),
]


@pytest.mark.parametrize(("offset", "fresh"), WINDOW + DEAD_AHEAD)
def test_fresh_while_the_heartbeat_is_within_the_ttl_either_way(policy: Policy, offset: float, fresh: bool) -> None:
    record = node("n", heartbeat=NOW + offset, ttl="60s")
    assert record.fresh(NOW) is fresh
    assert InventorySnapshot.build(policy, [record]).fresh(NOW).tolist() == [fresh, False]  # and the sentinel


@pytest.mark.parametrize(("beats", "now", "expected"), [
    pytest.param([NOW - 10, NOW - 30], NOW, NOW + 30, id="the-first-fresh-row-to-expire"),
    pytest.param([NOW - 10, NOW + 600], NOW, NOW + 50, id="an-expiry-before-a-row-ahead-turns-fresh"),
    pytest.param([NOW - 59, NOW + 100], NOW, NOW + 1, id="expiry-first-by-a-second"),
    pytest.param([NOW - 3600, NOW + 100], NOW, NOW + 40, id="a-row-ahead-turns-fresh-first"),
    pytest.param([NOW + 100], NOW + 40, NOW + 160, id="at-its-turn-the-row-ahead-is-fresh-and-expires-next"),
    pytest.param([NOW - 3600], NOW, float("inf"), id="a-stale-row-behind-never-changes-by-the-clock"),
    pytest.param([], NOW, float("inf"), id="empty"),
])
def test_next_freshness_change(policy: Policy, beats: list[float], now: float, expected: float) -> None:
    records = [node(f"n{i}", heartbeat=b, ttl="60s") for i, b in enumerate(beats)]
    snap = InventorySnapshot.build(policy, records)
    assert next_freshness_change(snap, now) == expected


def test_per_profile_state_is_computed_once(policy: Policy) -> None:
    snap = InventorySnapshot.build(policy, [node("a")])
    profile = policy.profile("dynamo-worker")
    first = snap.cache_state(profile)
    assert snap.cache_state(profile) is first


def test_empty_inventory(policy: Policy) -> None:
    snap = InventorySnapshot.build(policy, [])
    assert len(snap) == 0
    found = snap.lookup(["a"])
    assert found.known.tolist() == [False]
    state, _ = snap.state_for(policy.profile("dynamo-worker"), found.index, NOW)
    assert state.image.tolist() == [False]
    assert np.all(snap.fresh(NOW) == np.array([False]))


IMAGES = [
    ("bare-name", "nginx", "docker.io/library/nginx:latest"),
    ("hub-org", "vllm/vllm-openai:v0.11.0", "docker.io/vllm/vllm-openai:v0.11.0"),
    ("registry-with-dot", "nvcr.io/nvidia/x:1", "nvcr.io/nvidia/x:1"),
    ("registry-with-port", "localhost:5000/a/b", "localhost:5000/a/b:latest"),
    ("digest", "repo@sha256:abc", "docker.io/library/repo@sha256:abc"),
    ("already-normal", "docker.io/library/nginx:latest", "docker.io/library/nginx:latest"),
    ("capital-means-registry-host", "Mirror/vllm:1", "Mirror/vllm:1"),
    ("hub-single-name-with-registry", "docker.io/nginx:1.25", "docker.io/library/nginx:1.25"),
    ("legacy-hub-registry", "index.docker.io/vllm/vllm-openai:v1", "docker.io/vllm/vllm-openai:v1"),
    ("tag-and-digest-keeps-the-digest", "vllm/vllm-openai:v1@sha256:abc", "docker.io/vllm/vllm-openai@sha256:abc"),
    ("port-tag-and-digest", "localhost:5000/a/b:1@sha256:d", "localhost:5000/a/b@sha256:d"),
]


@pytest.mark.parametrize(("ref", "expected"), [i[1:] for i in IMAGES], ids=[i[0] for i in IMAGES])
def test_image_normalisation(ref: str, expected: str) -> None:
    assert normalise(ref) == expected


@pytest.mark.parametrize("ref", [
    pytest.param("nginx", id="bare-name"),
    pytest.param("ghcr.io/example/extender:0.1.0", id="registry-path-tag"),
    pytest.param("localhost:5000/a/b:c", id="registry-port"),
    pytest.param("[::1]:5000/x", id="ipv6-registry"),
    pytest.param("Registry.Example.COM/x__y/z--w:T_1.2-rc", id="host-any-case-separators"),
    pytest.param("vllm/vllm-openai@sha256:" + "0" * 64, id="digest"),
    pytest.param("vllm/vllm-openai:v1@sha256:" + "f" * 64, id="tag-and-digest"),
])
def test_image_reference_accepted(ref: str) -> None:
    assert check_reference(ref) == ref


@pytest.mark.parametrize(("ref", "expected"), [
    pytest.param("vllm/Serve:1", "not an image reference", id="capital-in-path"),
    pytest.param("ghcr.io/ex/extender :1", "not an image reference", id="space"),
    pytest.param("a:", "not an image reference", id="empty-tag"),
    pytest.param("a:-x", "not an image reference", id="tag-starting-with-dash"),
    pytest.param("a:" + "x" * 129, "not an image reference", id="tag-over-128"),
    pytest.param("a//b", "not an image reference", id="empty-component"),
    pytest.param("-a", "not an image reference", id="leading-dash"),
    pytest.param("a@sha256:123", "not an image reference", id="short-digest"),
    pytest.param("caf\u00e9/x", "not an image reference", id="non-ascii"),
    pytest.param("r.io/" + "a" * 251, "longer than 255", id="name-over-255"),
    pytest.param("a" * 5000, "not an image reference", id="far-too-long"),
])
def test_image_reference_refused(ref: str, expected: str) -> None:
    with pytest.raises(InvalidValueError, match=expected):
        check_reference(ref)


DIGEST = "sha256:" + "c" * 64


@pytest.mark.parametrize(("reference", "reported"), [
    pytest.param(f"vllm/vllm-openai:v0.11.0@{DIGEST}", f"docker.io/vllm/vllm-openai@{DIGEST}",
                 id="pinned-by-tag-and-digest-reported-by-digest"),
    pytest.param("docker.io/python:3.11", "docker.io/library/python:3.11", id="hub-single-name-with-registry"),
    pytest.param("index.docker.io/vllm/vllm-openai:v1", "docker.io/vllm/vllm-openai:v1", id="legacy-hub-registry"),
])
def test_image_found_under_the_name_kubelet_reports(reference: str, reported: str) -> None:
    # kubelet lists an image under containerd's names: a tag is dropped beside a digest, Docker Hub
    # images of one path element are under library/, and index.docker.io is docker.io
    policy = Policy.model_validate({
        "apiVersion": "extender.io/v1alpha1", "kind": "Policy",
        "nodeClasses": [{"name": "a", "matchLabels": {"k": "a"}, "gpu": {"product": "H100", "count": 8},
                         "nvme": {"capacity": "1TB"}}],
        "profiles": [{"name": "w", "match": {"labels": {"app": "w"}}, "image": {"reference": reference},
                      "weights": {"source": "s3://m/w/", "version": "v1", "bytes": "1GB"}}],
    })
    snap = InventorySnapshot.build(policy, [node("n", nodeClass="a", images=[reported])])
    state, _ = snap.state_for(policy.profile("w"), snap.lookup(["n"]).index, NOW)
    assert state.image.tolist() == [True]


@pytest.mark.parametrize(("cache", "node_class", "local"), [
    pytest.param("preferred", "nvme", 1e9, id="kept-on-nvme"),
    pytest.param("none", "nvme", 0.0, id="left-over-after-cache-none"),
    pytest.param("preferred", "diskless", 0.0, id="class-without-nvme"),
    pytest.param("preferred", "nobody-knows", 0.0, id="unknown-class"),
])
def test_weights_count_only_where_the_class_keeps_them(cache: str, node_class: str, local: float) -> None:
    # a record may list weights a replica would not read: left on disk after a switch to cache: none,
    # or on a class the policy says has no NVMe; the estimate must not count them as a local read
    policy = Policy.model_validate({
        "apiVersion": "extender.io/v1alpha1", "kind": "Policy",
        "nodeClasses": [{"name": "nvme", "matchLabels": {"k": "a"}, "gpu": {"product": "H100", "count": 8},
                         "nvme": {"capacity": "1TB"}},
                        {"name": "diskless", "matchLabels": {"k": "b"}, "gpu": {"product": "H100", "count": 8},
                         "nvme": {"capacity": 0}}],
        "profiles": [{"name": "w", "match": {"labels": {"app": "w"}}, "image": {"reference": "w:1"},
                      "weights": {"source": "s3://m/w/", "version": "v1", "bytes": "1GB", "cache": cache},
                      "lora": {"adapters": [{"name": "t1", "source": "s3://m/t1/", "bytes": "1MB"}]}}],
    })
    wkey, akey = weights_key("w", "v1"), adapter_key("w", "t1")
    record = node("n", nodeClass=node_class, weights={wkey: 10**9}, adapters=[akey])
    snap = InventorySnapshot.build(policy, [record])
    state, _ = snap.state_for(policy.profile("w"), snap.lookup(["n"]).index, NOW)
    assert state.weights_bytes.tolist() == [local]
    assert state.adapters.tolist() == [[local > 0]]


# ---- bounded records: nothing a writer stores can stop a snapshot build ---------------------------

POISONED: list[tuple[str, dict[str, object]]] = [
    # (id, fields that must be refused on write and skipped on read)
    ("gpus over int64", {"gpus": 2**64}),
    ("gpusFree over int64", {"gpusFree": 2**64}),
    ("gpus absurd", {"gpus": 100_000}),
    ("nvme over an exabyte", {"nvmeTotal": 2**80}),
    ("weights bytes over an exabyte", {"weights": {"w/r1": 2**70}}),
    ("heartbeat infinite", {"heartbeat": float("inf")}),
    ("heartbeat NaN", {"heartbeat": float("nan")}),
    ("ttl infinite", {"ttl": float("inf")}),
    ("lastUsed infinite", {"lastUsed": {"image:x": float("inf")}}),
    ("image name with a newline", {"images": ["evil\n\x1b[2J"]}),
    ("image name of 5,000 characters", {"images": ["i" * 5000]}),
    ("100,000 images", {"images": [f"i{n}" for n in range(100_000)]}),
    ("label value with NUL", {"labels": {"a": "b\x00"}}),
]
BAD_NAMES: list[tuple[str, str]] = [
    ("NUL", "node\x00a"),
    ("newline", "node\nfake-row"),
    ("300 characters", "n" * 300),
    ("escape sequence", "\x1b[31mred"),
    ("space", "node a"),
    ("upper case", "Node-A"),
    ("empty", ""),
]


@pytest.mark.parametrize("fields", [f for _, f in POISONED], ids=[i for i, _ in POISONED])
def test_unbounded_values_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        node("n1", **fields)


@pytest.mark.parametrize("name", [n for _, n in BAD_NAMES], ids=[i for i, _ in BAD_NAMES])
def test_node_names_must_be_kubernetes_names(name: str) -> None:
    with pytest.raises(ValueError):
        node(name)


def test_the_largest_valid_record_still_builds(policy: Policy) -> None:
    # Every bound at its maximum: the numpy columns must hold them (int64 GPUs, float64 bytes).
    from extender.core.inventory import MAX_BYTES, MAX_GPUS, MAX_NAME_LENGTH

    biggest = node("a" * MAX_NAME_LENGTH, gpus=MAX_GPUS, gpusFree=MAX_GPUS, nvmeTotal=MAX_BYTES, nvmeFree=MAX_BYTES,
                   pullingBytes=MAX_BYTES, weights={"w/r1": MAX_BYTES})
    snap = InventorySnapshot.build(policy, [biggest, node("b")])
    assert snap.gpus_free.tolist() == [MAX_GPUS, 0, 0]
