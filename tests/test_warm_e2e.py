"""End to end: the warmer stages weights on the node the next replica will land on, and it shows.

Real components, started the way their deployments start them (as in tests/test_e2e_agent_scoring.py):
the API double serving three g5.48xlarge Nodes (kubelet lists the vLLM image on each), ``extender
sync``, ``extender agent`` for gpu-a and gpu-b on their own cache roots (gpu-c has none: cold), and
``python -m extender.api.scheduler serve`` (gunicorn) answering ``/prioritize``. The warm loop runs in the
test, ticked as the scaler's leader would tick it, against the double and the same Redis.

The scaler expects one more ``big-llm`` replica within ten minutes. Both agent nodes hold the image,
so the replica lands on gpu-a (ties go to the first name) and the plan stages the weights there.
The test then plays the Job: it runs the Job's own helper commands (``extender warm prepare`` and
``finish``, from the Job's containers) against gpu-a's cache root, with the fetch step writing the
shards into staging, and marks the Job complete in the double. The agent's next scan reports the
weights, the next tick confirms the Job and deletes it, and:

* ``/prioritize`` prefers gpu-a: 8 against 5 (scores from tests/test_e2e_agent_scoring.py:
  image 372.5 s -> 5, image and weights 132.6 s -> 8);
* the scaler's horizon shrinks: startup on the best node 372.5 s -> 132.6 s, plus tick and HPA
  sync (15 s each): 402.5 s -> 162.6 s.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from extender.arguments import Parser
from extender.core.estimate import estimate
from extender.core.inventory import InventorySnapshot
from extender.core.policy import Policy, parse_policy
from extender.core.scaler import Horizon, horizon
from extender.core.warming import Expectation
from extender.kube.client import KubeClient
from extender.state import InventoryStore
from extender.warm import commands as warm_commands
from extender.warm.jobspec import helper_image
from extender.warm.loop import WarmLoop
from extender.warm.steps import CACHE_MOUNT
from tests.conftest import RedisServer
from tests.kube_double.waiting import wait_until
from tests.test_agent_scan import sparse
from tests.test_e2e_agent_scoring import COMMAND, GB, POLICY, running_stack
from tests.test_warm_executor import finish, jobs

pytestmark = pytest.mark.integration

#: The agent as deployed, but measuring a g5.48xlarge's 7.6 TB NVMe with 7 TB free rather than the
#: test machine's disk (the plan must find room for 200 GB of weights whatever disk the test runs on).
AGENT_COMMAND = ("import extender.agent.loop as agent_loop\n"
                 "from extender.agent.disk import DiskUsage\n"
                 "agent_loop.disk_usage = lambda path: DiskUsage(7_600 * 10**9, 7_000 * 10**9)\n" + COMMAND)

WARM_POLICY = POLICY + """\
warming:
  enabled: true
  templates:
    weights:
      image: amazon/aws-cli:2
      command: [aws, s3, sync, --only-show-errors, "{{source}}", "{{staging}}"]
"""


def best_horizon(policy: Policy, store: InventoryStore, now: float) -> Horizon:
    """The scaler's horizon for big-llm: the estimator's startup on the best node, plus tick and HPA sync."""
    version, records, registry = store.load_all()
    snap = InventorySnapshot.build(policy, records, version=version, registry=registry)
    profile = policy.profile("big-llm")
    rows = np.arange(len(snap.nodes), dtype=np.intp)
    state, table = snap.state_for(profile, rows, now)
    totals = estimate(profile, snap.classes, snap.class_index[rows], state, table).total_s
    best = int(np.argmin(totals))
    return horizon(float(totals[best]), policy.scaling.tick, policy.scaling.hpa_sync_delay,
                   node=snap.nodes[best].name)


def run_job(job: dict[str, Any], root: Path, helper: str, source: str = "s3://models/big/") -> None:
    """Do on ``root`` what the Job's containers would do on its node (cache root mounted at /cache);
    the fetch step (the team's ``aws s3 sync <source> <staging>``) writes eight 25 GB shards."""
    parser = Parser()
    warm_commands.register(parser.add_subparsers())
    pod = job["spec"]["template"]["spec"]
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        if c["image"] == helper:  # extender warm prepare|finish ...
            args = [str(root) if a == CACHE_MOUNT else a for a in c["command"][1:]]
            parsed = parser.parse_args(args)
            assert parsed.handler(parsed) == 0
        else:  # the team's fetch: `aws s3 sync s3://models/big/ <staging>`, here eight 25 GB shards
            env = {e["name"]: e.get("value", "") for e in c["env"]}  # the API drops empty values
            staging = root / Path(env["WARM_STAGING"]).relative_to(CACHE_MOUNT)
            assert c["command"][-2:] == [source, env["WARM_STAGING"]]
            for i in range(1, 9):
                sparse(staging / f"model-{i:05d}-of-00008.safetensors", 25 * GB)


def test_warm_then_schedule(redis_server: RedisServer, tmp_path: Path) -> None:
    policy = parse_policy(WARM_POLICY)
    with running_stack(tmp_path, WARM_POLICY, redis_server.url, agent_command=AGENT_COMMAND) as cluster, \
            ExitStack() as stack:
        double, roots, store = cluster.double, cluster.roots, cluster.store
        kube = KubeClient.connect(str(cluster.kubeconfig))
        stack.callback(kube.close)
        before = cluster.wait_for_setup(with_images=True)
        horizon_before = best_horizon(policy, store, time.time())

        # the scaler's leader tick: one more replica expected within ten minutes
        loop = WarmLoop(policy, store, kube, instance="scaler-0")
        expect = [Expectation(workload="big-llm", replicas=1, within_s=600)]
        report = loop.tick(time.time(), expect)
        assert report.errors == [], report.errors
        assert report.plan is not None
        (action,) = report.plan.actions
        assert (action.node, action.kind, action.cache) == ("gpu-a", "weights", "weights:big-llm/rev-1")
        (name,) = report.started
        # a second tick while the Job runs: nothing new
        again = loop.tick(time.time(), expect)
        assert again.started == []

        # the Job runs on gpu-a and completes
        run_job(jobs(double)[name], roots["gpu-a"], helper_image(policy))
        finish(double, name, ok=True, at=time.time())
        wait_until(lambda: (r := store.get("gpu-a")) is not None and r.weights == {"big-llm/rev-1": 200 * GB},
                   what="the agent reporting the staged weights")
        confirmed = wait_until(lambda: loop.tick(time.time(), expect).confirmed,
                               what="the warm loop confirming the Job")
        assert confirmed == [name] and jobs(double) == {}

        after = cluster.wait_for_rise("gpu-a")
        horizon_after = best_horizon(policy, store, time.time())

    assert before == {"gpu-a": 5, "gpu-b": 5, "gpu-c": 0}
    assert after == {"gpu-a": 8, "gpu-b": 5, "gpu-c": 0}
    # 372.5 s + 15 + 15 -> 132.6 s + 15 + 15
    assert round(horizon_before.startup_s, 1) == 372.5 and round(horizon_before.seconds, 1) == 402.5
    assert (horizon_after.node, round(horizon_after.startup_s, 1), round(horizon_after.seconds, 1)) == \
        ("gpu-a", 132.6, 162.6)
    assert horizon_after.seconds < horizon_before.seconds
