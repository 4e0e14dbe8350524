"""What the node agent tells the warmer about usage: last use and size of each cache entry.

The planner evicts least recently used entries with a known size (``NodeState.last_used``,
``cache_bytes``); these tests pin where those numbers come from and that reporting them costs the
agent neither extra writes nor full walks of compile caches on every scan.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extender.agent.loop import Agent, AgentSettings
from extender.agent.scan import SizeCache, scan_cache
from extender.core.caches import cache_id
from extender.core.reports import AgentReport
from extender.layout import compile_dir, mark_complete, snapshot_dir, weights_dir
from extender.state import InventoryStore, connect
from extender.state.sources import SourceStore
from tests.conftest import RedisServer
from tests.test_agent_scan import make_weights, sparse

KEY = "ck1-" + "b" * 60


def build(root: Path) -> None:
    make_weights(root, "llm", "v1", {"a": 100, "b": 50})
    sparse(compile_dir(root, KEY) / "inductor" / "x.py", 300)
    sparse(compile_dir(root, KEY) / "triton" / "y.cubin", 700)
    sparse(snapshot_dir(root, "llm", "v1") / "pages.img", 4000)
    mark_complete(snapshot_dir(root, "llm", "v1"))


def age(path: Path, seconds: float) -> None:
    """Make every file below ``path`` look last read and written ``seconds`` ago (the change time stays now)."""
    then = time.time() - seconds
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            os.utime(Path(dirpath, f), (then, then))


def test_a_scan_with_a_size_cache_measures_compile_and_snapshot_entries(tmp_path: Path) -> None:
    built_from = time.time()
    build(tmp_path)
    plain = scan_cache(tmp_path)
    assert plain.cache_bytes == {}  # without a size cache, compile directories are not walked
    assert set(plain.last_used) == {"weights:llm/v1", f"compile:{KEY}", "snapshot:llm/v1"}
    result = scan_cache(tmp_path, sizes=SizeCache())
    assert result.cache_bytes == {f"compile:{KEY}": 1000, "snapshot:llm/v1": 4000}
    scanned_by = time.time()
    # the times of the files just written: between the build and the scan (1 s of timestamp granularity)
    assert all(built_from - 1 <= t <= scanned_by + 1 for t in result.last_used.values())


def test_the_size_cache_walks_a_directory_again_only_when_it_changed_or_is_due(tmp_path: Path) -> None:
    build(tmp_path)
    clock = [0.0]
    sizes = SizeCache(refresh_s=300, clock=lambda: clock[0])
    scan_cache(tmp_path, sizes=sizes)
    assert sizes.walks == 2  # the compile key and the snapshot
    scan_cache(tmp_path, sizes=sizes)
    assert sizes.walks == 2  # nothing changed, not due: no walk
    sparse(compile_dir(tmp_path, KEY) / "z.so", 24)  # a file added at the top: the directory's mtime moves
    assert scan_cache(tmp_path, sizes=sizes).cache_bytes[f"compile:{KEY}"] == 1024
    assert sizes.walks == 3
    sparse(compile_dir(tmp_path, KEY) / "inductor" / "deep.py", 1)  # deeper: seen when due
    assert scan_cache(tmp_path, sizes=sizes).cache_bytes[f"compile:{KEY}"] == 1024
    clock[0] = 301.0
    assert scan_cache(tmp_path, sizes=sizes).cache_bytes[f"compile:{KEY}"] == 1025


def test_last_use_follows_reads_not_the_agents_own_scans(tmp_path: Path) -> None:
    build(tmp_path)
    w = weights_dir(tmp_path, "llm", "v1")
    # files written a while ago: change time (when they landed) rules until something reads them
    age(w, 7200)
    landed = scan_cache(tmp_path).last_used[cache_id("weights", "llm/v1")]
    # a later read (access time) moves last use forward
    later = time.time() + 3600
    os.utime(w / "a", (later, time.time() - 7200))
    assert scan_cache(tmp_path).last_used[cache_id("weights", "llm/v1")] == pytest.approx(later)
    # scanning again (listing directories, reading the manifest) does not
    assert scan_cache(tmp_path).last_used[cache_id("weights", "llm/v1")] == pytest.approx(later)
    assert landed <= later


@pytest.fixture
def sources(redis_server: RedisServer, tmp_path: Path) -> Iterator[SourceStore]:
    client = connect(redis_server.url, tmp_path)
    try:
        yield SourceStore(InventoryStore(client))
    finally:
        client.close()


def test_the_agent_reports_usage_into_the_node_record(tmp_path: Path, sources: SourceStore) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    build(root)
    agent = Agent(AgentSettings(node_name="gpu-a", cache_root=root), lambda: sources)
    agent.step()
    record = sources.store.get("gpu-a")
    assert record is not None
    assert record.cache_bytes == {f"compile:{KEY}": 1000, "snapshot:llm/v1": 4000}
    assert set(record.last_used) == {"weights:llm/v1", f"compile:{KEY}", "snapshot:llm/v1"}
    assert record.in_use == ()  # the agent cannot see which files pods hold open; podWorkloads covers it


def test_a_change_of_last_use_alone_rides_on_a_whole_report_once_per_ttl(tmp_path: Path) -> None:
    writes: list[AgentReport] = []
    beats: list[float] = []

    class Recorder:
        def report_agent(self, name: str, report: AgentReport) -> int | None:
            writes.append(report)
            return len(writes)

        def beat_agent(self, name: str, heartbeat: float) -> bool:
            beats.append(heartbeat)
            return True

    build(tmp_path)
    clock = [0.0]
    agent = Agent(AgentSettings(node_name="n", cache_root=tmp_path, ttl_s=60), Recorder, monotonic=lambda: clock[0])
    agent.step()
    os.utime(weights_dir(tmp_path, "llm", "v1") / "a", (time.time() + 100, time.time()))  # a pod read it
    clock[0] = 1.0
    agent.step()
    assert (len(writes), len(beats)) == (1, 0)  # the same content: no write for an access time
    clock[0] = 15.0  # the heartbeat (ttl / 4) is due, the last whole report is younger than the ttl
    agent.step()
    assert (len(writes), len(beats)) == (1, 1)
    clock[0] = 60.0  # the last whole report is a ttl old: this one carries the new time
    agent.step()
    assert (len(writes), len(beats)) == (2, 1)
    assert writes[1].last_used["weights:llm/v1"] > writes[0].last_used["weights:llm/v1"]
