"""The agent reads the container runtime's whole image list over CRI (``extender agent --cri-socket``).

Against a real containerd (Debian's package, tests/containerd.py) on its own socket, a real Redis
and the extender's real refresher: images are reported by tag and digest, largest first; a socket
with no runtime, a runtime that hangs and one without CRI give a report without the list (readers
fall back to kubelet's ``status.images``), logged once per change of state and counted; a runtime
stopped mid-run comes back; and 60 images seen by the runtime beat kubelet's 50 in the scheduler's
view. The pure parts (the names of a ListImages answer, what a record holds of them) are rows here
too. No row asserts on time: the deadline row only says the scan came back and why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from prometheus_client import CollectorRegistry

from extender.agent.loop import Agent, AgentSettings
from extender.agent.metrics import AgentMetrics
from extender.cli import main
from extender.core.inventory import MAX_ENTRIES
from extender.core.reports import AGENT_RECORD_BYTES, AgentReport, KubeReport, fit_agent_report
from extender.cri import api_pb2
from extender.cri.images import image_names, list_images
from extender.state import InventoryStore, connect
from extender.state.sources import SourceStore
from tests.conftest import RedisServer
from tests.containerd import Containerd, TestImage, containerd, oci_archive
from tests.kube_double.waiting import wait_until
from tests.test_agent_scan import GiB, make_weights
from tests.test_extender_integration import IMAGE_NAMES, hand_driven_refresher
from tests.test_scoring import POLICY

NODE = "gpu-node-1"
#: kubelet's list, as the sync reports it: what readers use while the agent has none
KUBELET = ("docker.io/library/kubelet-saw:1",)


# ---- the names of a ListImages answer (pure) -------------------------------------------------------


def img(ident: str, size: int, tags: tuple[str, ...] = (), digests: tuple[str, ...] = ()) -> api_pb2.Image:
    return api_pb2.Image(id=ident, size=size, repo_tags=tags, repo_digests=digests)


@pytest.mark.parametrize(("images", "names"), [
    pytest.param([], (), id="no-image"),
    pytest.param([img("sha256:a", 1, ("a:1", "a:latest"), ("a@sha256:1",))], ("a@sha256:1", "a:1", "a:latest"),
                 id="digests-then-tags-as-kubelet-lists-names"),
    pytest.param([img("sha256:s", 10, ("small:1",)), img("sha256:b", 99, ("big:1",))], ("big:1", "small:1"),
                 id="largest-image-first"),
    pytest.param([img("sha256:b", 5, ("b:1",)), img("sha256:a", 5, ("a:1",))], ("a:1", "b:1"),
                 id="same-size-by-image-id"),
    # one name on two images (a runtime mid-retag): said once, where its larger image puts it
    pytest.param([img("sha256:s", 1, ("x:1",)), img("sha256:b", 2, ("x:1", "y:1"))], ("x:1", "y:1"),
                 id="a-name-once"),
    pytest.param([img("sha256:u", 7)], (), id="an-image-with-no-name-gives-none"),  # pulled by digest, untagged
])
def test_image_names(images: list[api_pb2.Image], names: tuple[str, ...]) -> None:
    assert image_names(images) == names
    assert image_names(reversed(images)) == names  # the runtime's order does not matter


# ---- what a record holds of them (pure) ------------------------------------------------------------


def fit(images: list[str] | None, budget: int = AGENT_RECORD_BYTES) -> tuple[AgentReport, tuple[str, ...]]:
    return fit_agent_report(nvme_total=10, nvme_free=5, weights={}, compile_keys=(), snapshots=(), adapters=(),
                            ttl=60.0, last_used={}, cache_bytes={}, images=images, budget=budget)


class FitRow(NamedTuple):
    images: list[str] | None
    reported: Callable[[tuple[str, ...] | None], bool]
    said: tuple[str, ...]


MANY = [f"registry.example.com/team/tool-{i:05d}:1" for i in range(MAX_ENTRIES + 10)]
FIT_ROWS = {
    "no-runtime-list-stays-none": FitRow(None, lambda r: r is None, ()),
    "an-empty-list-is-a-list": FitRow([], lambda r: r == (), ()),
    "names-kept-in-the-order-given-each-once": FitRow(["b:1", "a:1", "b:1"], lambda r: r == ("b:1", "a:1"), ()),
    "a-name-a-record-refuses-is-left-out": FitRow(
        ["a:1", "bad\nname:1", "c:1"], lambda r: r == ("a:1", "c:1"), ("image name 'bad\\nname:1' cannot be stored",)),
    # the lister gives the largest image first, so the first names are the ones kept
    "more-names-than-a-record-holds-keeps-the-first": FitRow(
        MANY, lambda r: r == tuple(MANY[:MAX_ENTRIES]),
        (f"{MAX_ENTRIES + 10} image names, more than the {MAX_ENTRIES} a record holds: reported the first "
         f"{MAX_ENTRIES} (largest images first), left out 10",)),
}


@pytest.mark.parametrize("row", FIT_ROWS.values(), ids=FIT_ROWS.keys())
def test_what_a_record_holds_of_the_runtime_s_names(row: FitRow) -> None:
    report, dropped = fit(row.images)
    assert row.reported(report.images), report.images
    assert len(dropped) == len(row.said)
    for reason, said in zip(dropped, row.said, strict=True):
        assert reason.startswith(said), reason


def test_names_over_the_agent_s_share_of_a_record_lose_the_smallest_images() -> None:
    names = [f"registry.example.com/{i:04d}/" + "a" * 200 for i in range(400)]  # about 90 KB of JSON
    report, dropped = fit(names, budget=40_000)
    assert report.images is not None and 100 < len(report.images) < 400
    assert report.images == tuple(names[:len(report.images)])  # the end of the list (the smallest) went
    assert len(dropped) == 1 and dropped[0].startswith("the report is over the 40000 bytes")
    assert "image names (the smallest images)" in dropped[0]


# ---- against a real containerd -----------------------------------------------------------------------


@pytest.fixture
def runtime() -> Iterator[Containerd]:
    with containerd() as started:
        yield started


@pytest.fixture
def sources(redis_server: RedisServer, tmp_path: Path) -> Iterator[SourceStore]:
    client = connect(redis_server.url, tmp_path / "unused")
    try:
        store = SourceStore(InventoryStore(client))
        store.report_kube({NODE: KubeReport(images=KUBELET)})
        yield store
    finally:
        client.close()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    make_weights(root, "llama3-8b", "main", {"model.safetensors": 4 * GiB})
    return root


def agent(cache: Path, sources: SourceStore, socket: Path | None, **settings: Any) -> Agent:
    """An agent of :data:`NODE` reporting to ``sources``, with its metrics in a registry of its own."""
    return Agent(AgentSettings(node_name=NODE, cache_root=cache, ttl_s=600.0, cri_socket=socket, **settings),
                 lambda: sources, metrics=AgentMetrics(CollectorRegistry()))


def failures(a: Agent, reason: str) -> float:
    assert a.metrics is not None
    value = a.metrics.registry.get_sample_value("extender_agent_runtime_image_list_failures_total",
                                                {"reason": reason})
    assert value is not None
    return value


def stored_images(sources: SourceStore) -> tuple[str, ...]:
    state = sources.store.get(NODE)
    assert state is not None
    return state.images


def listing(runtime: Containerd, names: tuple[str, ...]) -> None:
    """Wait until the runtime lists exactly ``names``: the CRI plugin learns of an import or a tag from
    containerd's events, a moment after ``ctr`` returns."""
    wait_until(lambda: list_images(runtime.socket, 5.0) == names, what=f"containerd listing {names}")


def runtime_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if "container runtime at" in r.getMessage()]


BIG, SMALL = "docker.io/library/big-llm:2", "quay.io/team/small:1.0"


def test_the_runtime_s_images_are_reported_by_tag_and_digest(
        runtime: Containerd, sources: SourceStore, cache: Path, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    digests = oci_archive(tmp_path / "images.tar", [TestImage(SMALL, 10), TestImage(BIG, 50_000)])
    runtime.import_images(tmp_path / "images.tar")
    big_digest = f"docker.io/library/big-llm@{digests[BIG]}"
    runtime.tag(BIG, big_digest)
    expected = (big_digest, BIG, SMALL)  # the larger image first, its digest before its tag
    listing(runtime, expected)
    a = agent(cache, sources, runtime.socket)
    with caplog.at_level(logging.INFO, logger="extender.agent.loop"):
        report = a.step()
        a.step()
    assert report.images == expected
    assert stored_images(sources) == expected  # the runtime's list replaces kubelet's in the record
    state = sources.store.get(NODE)
    assert state is not None and state.weights == {"llama3-8b/main": 4 * GiB}  # the disk report as ever
    said = f"container runtime at {runtime.socket} lists 3 image names; reporting them"
    assert runtime_lines(caplog) == [(logging.INFO, said)]  # once, at the first list
    assert a.stats.runtime_failures == 0


class Failure(NamedTuple):
    """A runtime that gives no list: which runtime fixture (``None``: none, its socket path unused), whether it
    hangs, and what the agent says."""

    runtime: str | None
    frozen: bool
    reason: str
    said: str


FAILURES = {
    "no-socket": Failure(None, False, "unreachable", "no socket there (is the runtime running, and is its "
                         "directory mounted into the agent's pod?)"),
    # SIGSTOPped: the kernel still queues the connection, nothing answers; the deadline ends the wait
    "a-runtime-that-hangs": Failure("runtime", True, "timeout", "no answer within 0.3s"),
    "a-containerd-without-its-cri-plugin": Failure(
        "runtime_without_cri", False, "unimplemented",
        "it serves no CRI runtime.v1 image service (is it a CRI runtime, with its CRI plugin on?)"),
}


@pytest.fixture
def runtime_without_cri() -> Iterator[Containerd]:
    with containerd(cri=False) as started:
        yield started


@pytest.mark.parametrize("row", FAILURES.values(), ids=FAILURES.keys())
def test_a_runtime_that_gives_no_list_leaves_kubelet_s_and_is_said_once(
        request: pytest.FixtureRequest, sources: SourceStore, cache: Path, row: Failure,
        caplog: pytest.LogCaptureFixture) -> None:
    rt: Containerd | None = None if row.runtime is None else request.getfixturevalue(row.runtime)
    socket = cache.parent / "containerd.sock" if rt is None else rt.socket
    a = agent(cache, sources, socket, cri_timeout_s=0.3)
    with caplog.at_level(logging.INFO, logger="extender.agent.loop"), \
            (rt.frozen() if rt is not None and row.frozen else contextlib.nullcontext()):
        reports = [a.step() for _ in range(3)]
    assert [r.images for r in reports] == [None] * 3
    assert stored_images(sources) == KUBELET  # readers use kubelet's list
    state = sources.store.get(NODE)
    assert state is not None and state.weights == {"llama3-8b/main": 4 * GiB} and state.heartbeat > 0
    lines = runtime_lines(caplog)
    assert len(lines) == 1, lines  # once, not at every scan
    level, message = lines[0]
    assert level == logging.WARNING
    assert message == (f"container runtime at {socket}: {row.said}; reporting no image list (readers use "
                       "kubelet's status.images) until it answers")
    assert a.stats.runtime_failures == 3 and failures(a, row.reason) == 3


def test_a_runtime_stopped_mid_run_gives_no_list_then_its_list_again(
        runtime: Containerd, sources: SourceStore, cache: Path, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    oci_archive(tmp_path / "images.tar", [TestImage(BIG, 1000)])
    runtime.import_images(tmp_path / "images.tar")
    listing(runtime, (BIG,))
    a = agent(cache, sources, runtime.socket)
    with caplog.at_level(logging.INFO, logger="extender.agent.loop"):
        assert a.step().images == (BIG,)
        runtime.stop()  # containerd removes its socket on the way out
        assert [a.step().images for _ in range(2)] == [None, None]
        assert stored_images(sources) == KUBELET
        runtime.start()  # same directories: the same images
        assert a.step().images == (BIG,)
    assert stored_images(sources) == (BIG,)
    socket = runtime.socket
    assert runtime_lines(caplog) == [
        (logging.INFO, f"container runtime at {socket} lists 1 image names; reporting them"),
        (logging.WARNING, f"container runtime at {socket}: no socket there (is the runtime running, and is its "
                          "directory mounted into the agent's pod?); reporting no image list (readers use kubelet's "
                          "status.images) until it answers"),
        (logging.INFO, f"container runtime at {socket} answers again: lists 1 image names; reporting them"),
    ]
    assert failures(a, "unreachable") == 2


def test_the_dry_run_prints_the_runtime_s_images(runtime: Containerd, cache: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    oci_archive(tmp_path / "images.tar", [TestImage(SMALL, 10)])
    runtime.import_images(tmp_path / "images.tar")
    listing(runtime, (SMALL,))
    # crictl's spelling of an endpoint is taken too
    code = main(["agent", "--node-name", NODE, "--cache-root", str(cache), "--cri-socket", f"unix://{runtime.socket}",
                 "--dry-run"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["images"] == [SMALL]


# ---- the scheduler's view --------------------------------------------------------------------------


VLLM_TAG = IMAGE_NAMES[1]  # docker.io/vllm/vllm-openai:v0.11.0, the policy's image


def test_sixty_images_from_the_runtime_beat_kubelet_s_fifty_in_the_scheduler_s_view(
        runtime: Containerd, redis_server: RedisServer, cache: Path, tmp_path: Path) -> None:
    """kubelet lists the 50 largest images; the vLLM image is the 60th, so its silence says nothing. The node
    whose agent reads the runtime is scored with the image; its twin, whose agent does not, as cold."""
    tools = [TestImage(f"registry.example.com/team/tool-{i:02d}:1", 100_000 + i) for i in range(59)]
    oci_archive(tmp_path / "images.tar", [*tools, TestImage(VLLM_TAG, 10)])
    runtime.import_images(tmp_path / "images.tar")
    # a tar is padded to 10 KiB records: the tools are one size, ordered by image id; the vLLM image is smaller
    def all_sixty() -> tuple[str, ...] | None:
        names = list_images(runtime.socket, 5.0)
        return names if len(names) == 60 else None

    listed = wait_until(all_sixty, what="containerd listing 60 image names")
    assert set(listed) == {*(t.name for t in tools), VLLM_TAG} and listed[-1] == VLLM_TAG
    client = connect(redis_server.url, tmp_path / "unused")
    try:
        sources = SourceStore(InventoryStore(client))
        kubelet_50 = listed[:50]  # kubelet's status.images: the 50 largest
        fast = KubeReport(labels={"pool": "fast"}, gpus=8, gpus_free=8, images=kubelet_50)
        sources.report_kube({"with-cri": fast, "without-cri": fast})
        for name, socket in (("with-cri", runtime.socket), ("without-cri", None)):
            Agent(AgentSettings(node_name=name, cache_root=cache, ttl_s=3600.0, cri_socket=socket),
                  lambda: sources).step()
        state = sources.store.get("with-cri")
        assert state is not None and state.images == listed
        policy_file = tmp_path / "policy.yaml"
        policy_file.write_text(POLICY)
        refresher = hand_driven_refresher(policy_file, client)
        now = time.time()
        refresher.refresh_once(now)
        engine = refresher.engine
        assert engine is not None
        profile = refresher.policy.profiles[0]
        rows = engine.snapshot.lookup(["with-cri", "without-cri"]).index
        image = engine.snapshot.state_for(profile, rows, now)[0].image
        assert image.tolist() == [True, False]
        score = engine.table(profile, now).evaluation.score
        positions = engine.snapshot.positions
        assert score[positions["with-cri"]] > score[positions["without-cri"]]
    finally:
        client.close()

