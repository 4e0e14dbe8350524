"""Fault suite, all at once: load, stalled connections, a policy swap and a Redis SIGKILL and restart.

Runs bench/bench_faults.py's scenario small (4 clients x 200 /prioritize at 500 nodes, 12 stalled
connections, 2 gunicorn workers, loopback only): the real clients must get nothing but valid 200s,
and by the end every worker must answer with the new policy version. BENCHMARKS.md has the full
size (8 x 10,000 at 5,000 nodes) and how long each worker took to switch.
"""

from __future__ import annotations

import pytest

from bench.bench_faults import run

pytestmark = pytest.mark.integration


def test_real_clients_get_only_200s_through_a_policy_swap_and_a_redis_restart() -> None:
    result = run(clients=4, requests=200, nodes=500, slow=12)["result"]
    assert result["requests"] == 800
    assert (result["non200"], result["errors"]) == (0, [])
    assert len(result["last_version_by_worker"]) == 2  # both workers answered the watcher
    assert set(result["last_version_by_worker"].values()) == {result["new_version"]} != {result["old_version"]}
