"""Caches workloads leave on a node without any marker of ours, on real directory trees.

Hugging Face hub caches are built the way ``huggingface_hub`` writes them (blobs named by etag,
snapshot links ``../../blobs/<etag>``, ``refs/<branch>`` holding the commit, ``.incomplete`` for a
download in progress); vLLM compile trees the way vLLM writes them under ``VLLM_CACHE_ROOT``. One
named row per situation; expected bytes are worked out beside each row. The agent itself, with a
real Redis and the extender's estimate, is in tests/test_agent_hub_e2e.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from extender.agent.hub import (
    HubMap,
    IndexCache,
    Target,
    hub_map,
    merge_into,
    repo_folder,
    repo_id_of,
    scan_hub,
)
from extender.agent.scan import scan_cache
from extender.core.caches import cache_id
from extender.core.policy import parse_policy
from extender.layout import compile_dir
from tests.test_agent_scan import make_weights, sparse

C1 = "a1b2c3d4" * 5
C2 = "f0e1d2c3" * 5
REPO = "meta-llama/Llama-3.1-8B"


class Repo:
    """One ``models--ORG--NAME`` folder, written the way huggingface_hub writes it."""

    def __init__(self, hub: Path, repo_id: str = REPO) -> None:
        self.path = hub / repo_folder(repo_id)
        (self.path / "blobs").mkdir(parents=True, exist_ok=True)

    def blob(self, etag: str, size: int) -> None:
        sparse(self.path / "blobs" / etag, size)

    def link(self, commit: str, rel: str, etag: str, *, size: int | None = None) -> None:
        """``snapshots/<commit>/<rel>`` -> ``../../blobs/<etag>``, relative as upstream writes it (and the blob)."""
        if size is not None:
            self.blob(etag, size)
        link = self.path / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(self.path / "blobs" / etag, link.parent), link)

    def ref(self, name: str, commit: str) -> None:
        (self.path / "refs").mkdir(exist_ok=True)
        (self.path / "refs" / name).write_text(commit)

    def index(self, commit: str, etag: str, shards: list[str], rel: str = "model.safetensors.index.json") -> None:
        weight_map = {f"layer.{i}": s for i, s in enumerate(shards)}
        body = '{"metadata": {"total_size": 1}, "weight_map": ' + str(weight_map).replace("'", '"') + "}"
        (self.path / "blobs" / etag).write_text(body)
        self.link(commit, rel, etag)


def sharded(repo: Repo, commit: str, shards: int = 4, size: int = 1000, *, index: bool = True) -> None:
    """A complete sharded checkpoint: config, ``shards`` numbered shards of ``size`` bytes, and their index."""
    repo.link(commit, "config.json", "cfg", size=10)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for i, name in enumerate(names):
        repo.link(commit, name, f"shard{i}", size=size)
    if index:
        repo.index(commit, "idx", names)


def index_bytes(repo: Repo) -> int:
    return (repo.path / "blobs" / "idx").stat().st_size


ONE = {"llm": (REPO, C1)}


@dataclass
class Case:
    build: Callable[[Path], None]
    #: workload -> (repo id, version) the policy maps
    targets: dict[str, tuple[str, str]]
    #: workload/version -> (bytes, complete) expected; absent keys must not be reported
    expected: Callable[[Path], dict[str, tuple[int, bool]]]
    problems: set[str] = field(default_factory=set)
    declared: int = 10**9


def complete_build(hub: Path) -> None:
    sharded(Repo(hub), C1)


def incomplete_blob_build(hub: Path) -> None:
    # shard 4 still downloading: its bytes sit in blobs/<etag>.incomplete and the snapshot has no link yet;
    # the index is not there yet either (vLLM fetches it after the shards)
    r = Repo(hub)
    sharded(r, C1, index=False)
    (r.path / "snapshots" / C1 / "model-00004-of-00004.safetensors").unlink()
    os.rename(r.path / "blobs" / "shard3", r.path / "blobs" / "shard3.incomplete")


def download_elsewhere_build(hub: Path) -> None:
    # every file of C1 is whole, but another revision's download into the repository is in progress
    r = Repo(hub)
    sharded(r, C1)
    r.blob("next.incomplete", 500)


def dangling_build(hub: Path) -> None:
    r = Repo(hub)
    sharded(r, C1)
    (r.path / "blobs" / "shard1").unlink()  # a blob deleted under its link


def index_missing_shard_build(hub: Path) -> None:
    # the index names five shards, four are there (and numbered "of 00004", so the numbering alone looks whole)
    r = Repo(hub)
    sharded(r, C1, index=False)
    r.index(C1, "idx", [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)] + ["extra.safetensors"])


def numbering_gap_build(hub: Path) -> None:
    r = Repo(hub)
    sharded(r, C1, index=False)
    (r.path / "snapshots" / C1 / "model-00002-of-00004.safetensors").unlink()


def other_script_shard_build(hub: Path) -> None:
    # shard 2 is missing, and a file numbered in Arabic-Indic digits, which no loader opens, sits beside them
    r = Repo(hub)
    sharded(r, C1, index=False)
    (r.path / "snapshots" / C1 / "model-00002-of-00004.safetensors").unlink()
    r.link(C1, "model-٠٠٠٠٢-of-00004.safetensors", "stray", size=1000)


def branch_build(hub: Path) -> None:
    r = Repo(hub)
    sharded(r, C1)
    sharded(r, C2, shards=2, size=300)
    r.ref("main", C2)  # main moved to C2; the profile asks for "main"


def branch_unresolved_build(hub: Path) -> None:
    r = Repo(hub)
    sharded(r, C1)
    r.ref("main", "not-a-commit")


def shared_build(hub: Path) -> None:
    # C2 changed only the config: both revisions link the same four shard blobs; C1 also links one
    # shard under two names
    r = Repo(hub)
    sharded(r, C1)
    r.link(C1, "original/consolidated.safetensors", "shard0")
    for rel in ("model.safetensors.index.json", *(f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5))):
        os.symlink(os.readlink(r.path / "snapshots" / C1 / rel), _mkparent(r.path / "snapshots" / C2 / rel))
    r.link(C2, "config.json", "cfg2", size=20)


def _mkparent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def unmapped_build(hub: Path) -> None:
    sharded(Repo(hub), C1)
    sharded(Repo(hub, "someone/other-model"), C1)


def escape_build(hub: Path) -> None:
    r = Repo(hub)
    sharded(r, C1)
    outside = hub.parent / "outside.safetensors"
    sparse(outside, 7777)
    link = r.path / "snapshots" / C1 / "model-00003-of-00004.safetensors"
    link.unlink()
    os.symlink(os.path.relpath(outside, link.parent), link)  # ../../../../outside.safetensors


def other_repo_blob_build(hub: Path) -> None:
    # a link into another repository's blobs/ is out of this repository too
    r = Repo(hub)
    sharded(r, C1)
    other = Repo(hub, "someone/other-model")
    other.blob("theirs", 5000)
    link = r.path / "snapshots" / C1 / "model-00002-of-00004.safetensors"
    link.unlink()
    os.symlink(os.path.relpath(other.path / "blobs" / "theirs", link.parent), link)


def link_to_incomplete_build(hub: Path) -> None:
    r = Repo(hub)
    sharded(r, C1)
    os.rename(r.path / "blobs" / "shard2", r.path / "blobs" / "shard2.incomplete")
    link = r.path / "snapshots" / C1 / "model-00003-of-00004.safetensors"
    link.unlink()
    os.symlink("../../blobs/shard2.incomplete", link)


def copies_build(hub: Path) -> None:
    # upstream's degraded mode (no symbolic links): files copied into the snapshot
    r = Repo(hub)
    sparse(r.path / "snapshots" / C1 / "config.json", 10)
    sparse(r.path / "snapshots" / C1 / "model.safetensors", 4000)


def config_only_build(hub: Path) -> None:
    Repo(hub).link(C1, "config.json", "cfg", size=10)


def symlinked_repo_build(hub: Path) -> None:
    real = hub.parent / "elsewhere"
    sharded(Repo(real), C1)
    os.symlink(real / repo_folder(REPO), hub / repo_folder(REPO))


def symlinked_blobs_build(hub: Path) -> None:
    # blobs/ itself a link to elsewhere: not followed, so nothing in the snapshot resolves
    r = Repo(hub)
    sharded(r, C1)
    os.rename(r.path / "blobs", hub.parent / "blobs-elsewhere")
    os.symlink(hub.parent / "blobs-elsewhere", r.path / "blobs")


def corrupt_index_build(hub: Path) -> None:
    r = Repo(hub)
    sharded(r, C1, index=False)
    (r.path / "blobs" / "idx").write_text('{"weight_map": ["not", "a", "map"]}')
    r.link(C1, "model.safetensors.index.json", "idx")


def two_roots_build(hub: Path) -> None:
    # the same repository in two hub roots: the complete copy wins
    sharded(Repo(hub), C1)
    r = Repo(hub.parent / "hub2")
    sharded(r, C1, index=False)
    (r.path / "snapshots" / C1 / "model-00004-of-00004.safetensors").unlink()


FULL = 10 + 4 * 1000  # config + four shards, plus the index blob (added where it is there)

CASES: dict[str, Case] = {
    "complete": Case(complete_build, ONE, lambda h: {f"llm/{C1}": (FULL + index_bytes(Repo(h)), True)}),
    # 10 + 3 x 1000 present; the .incomplete's 1000 bytes never count
    "incomplete-blob": Case(incomplete_blob_build, ONE, lambda h: {f"llm/{C1}": (3010, False)}),
    # all of C1 is there, but a download is in progress: partial, capped at declared - 1 = 3999
    "download-in-progress": Case(download_elsewhere_build, ONE, lambda h: {f"llm/{C1}": (3999, False)},
                                 declared=4000),
    # shard1's blob is gone: 10 + 3 x 1000 + index
    "dangling-link": Case(dangling_build, ONE, lambda h: {f"llm/{C1}": (3010 + index_bytes(Repo(h)), False)},
                          problems={"inconsistent"}),
    "index-lists-missing-shard": Case(index_missing_shard_build, ONE,
                                      lambda h: {f"llm/{C1}": (FULL + index_bytes(Repo(h)), False)}),
    "numbering-gap": Case(numbering_gap_build, ONE, lambda h: {f"llm/{C1}": (3010, False)}),
    "numbering-gap-filled-by-another-script": Case(other_script_shard_build, ONE,
                                                   lambda h: {f"llm/{C1}": (4010, False)}),
    # main -> C2: config + 2 x 300 + the index blob
    "branch-ref": Case(branch_build, {"llm": (REPO, "main")},
                       lambda h: {"llm/main": (10 + 600 + index_bytes(Repo(h)), True)}),
    "branch-ref-corrupt": Case(branch_unresolved_build, {"llm": (REPO, "main")}, lambda h: {},
                               problems={"corrupt"}),
    "commit-not-cached": Case(complete_build, {"llm": (REPO, C2)}, lambda h: {}),
    # C1: config + 4 shards (shard0 under two names counts once) + index; C2: cfg2 (20) + 4 shards + index;
    # the shared shards count in each entry
    "two-snapshots-share-blobs": Case(
        shared_build, {"llm": (REPO, C1), "llm-next": (REPO, C2)},
        lambda h: {f"llm/{C1}": (FULL + index_bytes(Repo(h)), True),
                   f"llm-next/{C2}": (20 + 4000 + index_bytes(Repo(h)), True)}),
    "repo-no-profile-maps": Case(unmapped_build, ONE, lambda h: {f"llm/{C1}": (FULL + index_bytes(Repo(h)), True)}),
    # the escaping link is neither followed nor counted: 10 + 3 x 1000 + index
    "link-escapes-hub-root": Case(escape_build, ONE,
                                  lambda h: {f"llm/{C1}": (3010 + index_bytes(Repo(h)), False)},
                                  problems={"unreadable"}),
    "link-into-another-repo": Case(other_repo_blob_build, ONE,
                                   lambda h: {f"llm/{C1}": (3010 + index_bytes(Repo(h)), False)},
                                   problems={"unreadable"}),
    "link-to-incomplete": Case(link_to_incomplete_build, ONE,
                               lambda h: {f"llm/{C1}": (3010 + index_bytes(Repo(h)), False)},
                               problems={"inconsistent"}),
    "copied-files": Case(copies_build, ONE, lambda h: {f"llm/{C1}": (4010, False)}),
    "config-only": Case(config_only_build, ONE, lambda h: {f"llm/{C1}": (10, False)}),
    "symlinked-repo-folder": Case(symlinked_repo_build, ONE, lambda h: {}, problems={"unreadable"}),
    "symlinked-blobs-folder": Case(symlinked_blobs_build, ONE, lambda h: {f"llm/{C1}": (0, False)},
                                   problems={"unreadable"}),
    "corrupt-index": Case(corrupt_index_build, ONE, lambda h: {f"llm/{C1}": (FULL + index_bytes(Repo(h)), False)},
                          problems={"corrupt"}),
    "two-roots": Case(two_roots_build, ONE, lambda h: {f"llm/{C1}": (FULL + index_bytes(Repo(h)), True)}),
}


def mapping(targets: dict[str, tuple[str, str]], declared: int) -> HubMap:
    out: dict[str, list[Target]] = {}
    for workload, (repo, version) in targets.items():
        out.setdefault(repo_folder(repo), []).append(Target(workload, version, declared))
    return HubMap({k: tuple(v) for k, v in out.items()})


@pytest.mark.parametrize("name", list(CASES))
def test_hub_snapshot(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    hub = tmp_path / "hub"
    hub.mkdir()
    case.build(hub)
    roots = [hub, *([tmp_path / "hub2"] if (tmp_path / "hub2").exists() else [])]
    found = scan_hub(roots, mapping(case.targets, case.declared))
    assert {w.key: (w.bytes, w.complete) for w in found.weights} == case.expected(hub)
    assert all(w.last_used is None and w.expected_bytes is None for w in found.weights)
    assert set(found.partial) == {w.key for w in found.weights if not w.complete}  # each says why
    assert {p.kind for p in found.problems} == case.problems, found.problems
    assert len(found.problems) <= 1, found.problems  # one problem for one fault, not one per file


def test_unmapped_repositories_are_listed_not_reported(tmp_path: Path) -> None:
    unmapped_build(tmp_path)
    found = scan_hub([tmp_path], mapping(ONE, 10**9))
    assert found.unmapped == ("models--someone--other-model",)
    assert [w.workload for w in found.weights] == ["llm"]


def test_a_missing_hub_root_is_a_problem(tmp_path: Path) -> None:
    found = scan_hub([tmp_path / "absent"], mapping(ONE, 10**9))
    assert found.weights == () and [p.kind for p in found.problems] == ["unreadable"]


def test_an_index_is_parsed_once_while_its_blob_is_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.agent import hub as hub_module
    from extender.files import read_regular as real

    complete_build(tmp_path)
    reads: list[str] = []

    def counting(path: str | os.PathLike[str], limit: int, *, follow_symlinks: bool = True) -> bytes:
        reads.append(os.fspath(path))
        return real(path, limit, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(hub_module, "read_regular", counting)
    cache = IndexCache()
    for _ in range(3):
        assert scan_hub([tmp_path], mapping(ONE, 10**9), indexes=cache).weights[0].complete
    assert len([r for r in reads if r.endswith("/idx")]) == 1


@pytest.mark.parametrize(("source", "repo"), [
    ("hf://meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("hf://meta-llama/Llama-3.1-8B/", "meta-llama/Llama-3.1-8B"),
    ("hf://gpt2", "gpt2"),
    ("hf://datasets/org/name", None),
    ("hf://org/name/sub", None),
    ("hf://org--x/name", None),
    ("hf://org/../name", None),
    ("s3://models/llama/", None),
])
def test_repo_id_of(source: str, repo: str | None) -> None:
    assert repo_id_of(source) == repo


def test_repo_folder() -> None:
    assert repo_folder("meta-llama/Llama-3.1-8B") == "models--meta-llama--Llama-3.1-8B"
    assert repo_folder("gpt2") == "models--gpt2"


POLICY = """\
apiVersion: extender.io/v1alpha1
kind: Policy
nodeClasses:
  - name: g5
    matchLabels: {t: g5}
    gpu: {product: NVIDIA-A10G, count: 8}
    nvme: {capacity: 7600GB, readBandwidth: 7GB/s}
    network: {nic: 100Gbps, objectStorePerStream: 5.96Gbps}
profiles:
  - name: llm
    match: {labels: {app: llm}}
    image: {reference: "vllm/vllm-openai:v0.11.0"}
    weights: {source: "hf://meta-llama/Llama-3.1-8B", version: main, bytes: 16GB}
  - name: llm-pinned
    match: {labels: {app: llm-pinned}}
    image: {reference: "vllm/vllm-openai:v0.11.0"}
    weights: {source: "hf://meta-llama/Llama-3.1-8B", version: PINNED, bytes: 16GB}
  - name: s3
    match: {labels: {app: s3}}
    image: {reference: "vllm/vllm-openai:v0.11.0"}
    weights: {source: "s3://models/x/", version: v1, bytes: 1GB}
  - name: dataset
    match: {labels: {app: dataset}}
    image: {reference: "vllm/vllm-openai:v0.11.0"}
    weights: {source: "hf://datasets/org/name", version: v1, bytes: 1GB}
""".replace("PINNED", C1)


def test_hub_map_from_the_policy() -> None:
    m = hub_map(parse_policy(POLICY))
    assert m.targets == {"models--meta-llama--Llama-3.1-8B": (Target("llm", "main", 16 * 10**9),
                                                             Target("llm-pinned", C1, 16 * 10**9))}
    assert m.unusable == ("dataset",)


def test_merge_keeps_the_better_entry_and_drops_its_last_use(tmp_path: Path) -> None:
    # our layout holds a partial llm/<C1>; the hub holds it complete
    root = tmp_path / "cache"
    make_weights(root, "llm", C1, {"a": 5000}, present={"a": 100}, complete=False)
    make_weights(root, "other", "v1", {"b": 10})
    complete_build(tmp_path / "hub")
    ours = scan_cache(root)
    assert cache_id("weights", f"llm/{C1}") in ours.last_used
    merged = merge_into(ours, scan_hub([tmp_path / "hub"], mapping(ONE, 10**9)))
    assert {w.key: (w.bytes, w.complete) for w in merged.weights} == {
        f"llm/{C1}": (FULL + index_bytes(Repo(tmp_path / "hub")), True), "other/v1": (10, True)}
    assert set(merged.last_used) == {cache_id("weights", "other/v1")}
    assert merged.complete_workloads == {"llm", "other"}


# ---- vLLM's compile tree inside a key directory -----------------------------------------------------

KEY = "ck1-" + "a" * 32
HASH = "3f9c2a1b7e"


def vllm_compiled(root: Path) -> None:
    """What a finished piecewise compile leaves (vllm/compilation/backends.py, compiler_interface.py)."""
    rank = root / "torch_compile_cache" / HASH / "rank_0_0"
    sparse(rank / "backbone" / "cache_key_factors.json", 900)
    sparse(rank / "backbone" / "computation_graph.py", 40000)
    sparse(rank / "backbone" / "transformed_code.py", 3000)
    sparse(rank / "backbone" / "vllm_compile_cache.py", 1200)
    sparse(rank / "inductor_cache" / "fxgraph" / "ab" / "entry", 5000)
    sparse(rank / "triton_cache" / "XYZ" / "kernel.cubin", 20000)


def vllm_started(root: Path) -> None:
    """A pod that died during its first compile: what vLLM writes before compiling, and empty cache dirs."""
    rank = root / "torch_compile_cache" / HASH / "rank_0_0"
    sparse(rank / "backbone" / "cache_key_factors.json", 900)
    sparse(rank / "backbone" / "computation_graph.py", 40000)
    (rank / "inductor_cache").mkdir()
    (rank / "triton_cache").mkdir()


def vllm_compiled_unprefixed(root: Path, *, finished: bool = True) -> None:
    """Releases before the per-prefix directory (v0.8 among them): vLLM's files straight in the rank directory."""
    rank = root / "torch_compile_cache" / HASH / "rank_0_0"
    sparse(rank / "computation_graph.py", 40000)
    sparse(rank / "inductor_cache" / "fxgraph" / "ab" / "entry", 5000)
    if finished:
        sparse(rank / "vllm_compile_cache.py", 1200)


def vllm_aot(root: Path, *, nested: bool = True) -> None:
    base = root / "torch_compile_cache" / "torch_aot_compile" if nested else root / "torch_aot_compile"
    sparse(base / ("b" * 64) / "rank_0_0" / "model", 80000)
    sparse(base / ("b" * 64) / "inductor_cache" / "x", 10)


def key_dir(root: Path) -> Path:
    return compile_dir(root, KEY)


def index_elsewhere(root: Path) -> None:
    vllm_started(key_dir(root) / "vllm")
    outside = root.parent / "index.py"
    sparse(outside, 100)
    os.symlink(outside, key_dir(root) / "vllm" / "torch_compile_cache" / HASH / "rank_0_0" / "backbone" /
               "vllm_compile_cache.py")


def beside_inductor(vllm: Callable[[Path], None]) -> Callable[[Path], None]:
    """``vllm`` under ``<key>/vllm`` with an Inductor cache file next to it (``<key>/inductor``)."""
    def build(root: Path) -> None:
        vllm(key_dir(root) / "vllm")
        sparse(key_dir(root) / "inductor" / "a.py", 10)
    return build


def empty_index(root: Path) -> None:
    vllm_started(key_dir(root) / "vllm")
    sparse(key_dir(root) / "vllm" / "torch_compile_cache" / HASH / "rank_0_0" / "backbone" / "vllm_compile_cache.py", 0)


COMPILE_CASES: dict[str, tuple[Callable[[Path], None], bool]] = {
    "vllm-root-below-key": (lambda r: vllm_compiled(key_dir(r) / "vllm"), True),
    "vllm-root-is-key": (lambda r: vllm_compiled(key_dir(r)), True),
    "vllm-beside-inductor": (beside_inductor(vllm_compiled), True),
    "vllm-compile-died": (lambda r: vllm_started(key_dir(r) / "vllm"), False),
    # the index straight in the rank directory was never looked for: a finished compile counted as none
    "vllm-index-in-rank-dir-earlier-release": (lambda r: vllm_compiled_unprefixed(key_dir(r) / "vllm"), True),
    "vllm-compile-died-earlier-release": (
        lambda r: vllm_compiled_unprefixed(key_dir(r) / "vllm", finished=False), False),
    # vLLM's tree decides: the Inductor file beside it is what the dead compile left too
    "vllm-compile-died-beside-inductor": (beside_inductor(vllm_started), False),
    "vllm-empty-index": (empty_index, False),
    "vllm-index-is-a-link": (index_elsewhere, False),
    "vllm-aot": (lambda r: vllm_aot(key_dir(r) / "vllm"), True),
    "vllm-aot-earlier-release": (lambda r: vllm_aot(key_dir(r) / "vllm", nested=False), True),
    "vllm-aot-not-saved": (lambda r: sparse(key_dir(r) / "vllm" / "torch_aot_compile" / "h" / "inductor_cache" / "x",
                                            10), False),
    "no-vllm-tree": (lambda r: sparse(key_dir(r) / "inductor" / "fx" / "ab.py", 100), True),
    "empty-key": (lambda r: (key_dir(r) / "vllm").mkdir(parents=True), False),
}


@pytest.mark.parametrize("name", list(COMPILE_CASES))
def test_vllm_compile_tree(name: str, tmp_path: Path) -> None:
    build, present = COMPILE_CASES[name]
    root = tmp_path / "cache"
    build(root)
    scan = scan_cache(root)
    assert scan.compile_keys == ((KEY,) if present else ())
    assert (cache_id("compile", KEY) in scan.last_used) == present
    assert scan.problems == ()
