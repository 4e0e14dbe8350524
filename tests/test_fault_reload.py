"""Fault suite, policy reload: the kubelet ConfigMap layout, and workers restarted after a reload.

kubelet mounts a ConfigMap as ``policy.yaml -> ..data/policy.yaml`` with ``..data`` a symlink to a
timestamped directory, and updates it by pointing ``..data`` at a new directory (one atomic rename)
and deleting the old one. A server that resolved the path once at start kept reading the deleted
directory and never reloaded. A gunicorn worker restarted after a reload must come up on the
file's policy, not the one the master validated at launch. The promise (docs/reliability.md):
every worker serves one policy version within ``policy_check_interval`` + ``--poll-interval`` of
the swap (2.1 s here), and a restarted worker from its first request. The polls below wait up to
SETTLE_S for that state (a setup bound, never asserted on).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RedisServer
from tests.net import free_port
from tests.test_extender_integration import (
    NAMES,
    Server,
    cache_args,
    go_prioritize,
    load_inventory,
    running,
    serve_command,
    vllm_pod,
    wait_for,
    wait_ready,
)
from tests.test_scoring import POLICY

pytestmark = pytest.mark.integration

NEW_POLICY = POLICY.replace("secondsPerPoint: 30s", "secondsPerPoint: 100s")
#: Replies in a row that must all agree before the fleet counts as converged.
AGREEING_REPLIES = 30


class ConfigMapVolume:
    """A directory laid out and updated the way kubelet does it for a ConfigMap volume."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir()

    @property
    def path(self) -> Path:
        return self.root / "policy.yaml"

    def publish(self, text: str) -> None:
        self.generation += 1
        new = self.root / f"..2026_11_30_21_00_{self.generation:02d}.000000000"
        new.mkdir()
        (new / "policy.yaml").write_text(text)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(new.name)
        os.rename(tmp, self.root / "..data")  # the atomic swap
        if not self.path.is_symlink():
            self.path.symlink_to("..data/policy.yaml")
        if old is not None:
            (self.root / old / "policy.yaml").unlink()
            (self.root / old).rmdir()


def workers(server: Server) -> set[int]:
    """The gunicorn worker pids (children of the master we started)."""
    pid = server.process.pid
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def policy_versions(server: Server, replies: int) -> tuple[set[str], set[int]]:
    """``(policy versions, worker pids)`` seen in ``replies`` fresh-connection /readyz calls."""
    versions: set[str] = set()
    pids: set[int] = set()
    for _ in range(replies):
        _, data = server.call("GET", "/readyz")  # 503 while a worker still loads: its policy counts too
        body = json.loads(data)
        versions.add(body["policyVersion"])
        pids.add(body["worker"])
    return versions, pids


@pytest.fixture
def volume(tmp_path: Path) -> ConfigMapVolume:
    v = ConfigMapVolume(tmp_path / "config")
    v.publish(POLICY)
    return v


@pytest.fixture
def two_workers(volume: ConfigMapVolume, redis_server: RedisServer, tmp_path: Path) -> Iterator[Server]:
    load_inventory(redis_server.url, tmp_path)
    port = free_port()
    command = serve_command(volume.path, port, redis_server.url)
    command[command.index("--workers") + 1] = "2"
    with running(command, tmp_path, port) as server:
        wait_ready(server)
        yield server


def test_a_configmap_swap_reaches_every_worker_and_a_restarted_one(two_workers: Server,
                                                                    volume: ConfigMapVolume) -> None:
    server = two_workers
    (before,), _ = policy_versions(server, 4)
    volume.publish(NEW_POLICY)

    def converged() -> bool:
        versions, pids = policy_versions(server, AGREEING_REPLIES)
        return len(versions) == 1 and versions != {before} and pids == workers(server)

    wait_for(converged, "every worker on the new policy", server)
    (after,), _ = policy_versions(server, 1)
    body = cache_args(vllm_pod(), NAMES)
    assert go_prioritize(server.post("prioritize", body), NAMES)["gpu-fast-warm"] == 4  # (570 - 175) / 100

    # a worker dies and gunicorn starts a new one from the launch-time settings
    old = workers(server)
    victim = min(old)
    os.kill(victim, signal.SIGKILL)
    # from the moment it answers, the replacement serves the new policy: every reply until both
    # workers have been heard from must carry it (the refresher's own check comes 2 s later)
    seen: set[str] = set()

    def replacement_heard() -> bool:
        versions, pids = policy_versions(server, 1)
        seen.update(versions)
        return len(pids - old) == 1

    wait_for(replacement_heard, "a reply from the replacement worker", server)
    assert seen == {after}
    versions, _ = policy_versions(server, AGREEING_REPLIES)
    assert versions == {after}
    for _ in range(AGREEING_REPLIES):
        assert go_prioritize(server.post("prioritize", body), NAMES)["gpu-fast-warm"] == 4
