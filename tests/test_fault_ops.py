"""Fault suite, operations: the embedded Redis dying under the extender, start-up refusals of the
metrics API, and gunicorn's control socket. Real processes on loopback; waits are bounded polls for
a state (SETTLE_S, a setup bound), never assertions on time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from extender.core.inventory import NodeState
from extender.state import InventoryStore, connect, embedded
from tests.conftest import RedisServer
from tests.net import free_port
from tests.pki import make_pki
from tests.scaler_policy import policy_text
from tests.test_extender_integration import ROOT, Server, running, serve_command, wait_for, wait_ready
from tests.test_scoring import POLICY

pytestmark = pytest.mark.integration

#: Bound on a command that must refuse to start (it would otherwise serve for ever); never asserted on.
REFUSAL_BOUND_S = 60.0


def readyz(server: Server) -> dict[str, object]:
    _, data = server.call("GET", "/readyz")
    body: dict[str, object] = json.loads(data)
    return body


def test_the_extender_restarts_the_embedded_redis_it_started(tmp_path: Path, embedded_data_dir: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    client = connect(None, embedded_data_dir)
    InventoryStore(client).put(NodeState.model_validate({"name": "gpu-1", "heartbeat": 1.0}))
    client.close()
    port = free_port()
    command = [sys.executable, "-m", "extender.api.scheduler", "serve", "--policy", str(policy),
               "--bind", f"127.0.0.1:{port}", "--workers", "1", "--data-dir", str(embedded_data_dir),
               "--poll-interval", "0.1", "--max-snapshot-age", "1.5"]
    with running(command, tmp_path, port) as server:
        wait_ready(server)
        pid = int(embedded.paths_for(embedded_data_dir).pidfile.read_text().strip())
        os.kill(pid, signal.SIGKILL)  # the embedded server the extender started dies
        wait_for(lambda: readyz(server)["storeError"] is not None, "the outage noticed", server)
        wait_for(lambda: readyz(server)["storeError"] is None and readyz(server)["failOpen"] is None,
                 "the embedded Redis started again and the snapshot confirmed", server)
        assert int(embedded.paths_for(embedded_data_dir).pidfile.read_text().strip()) != pid


def test_gunicorn_opens_no_control_socket(tmp_path: Path, redis_server: RedisServer) -> None:
    # gunicorn 25.1+ opens $XDG_RUNTIME_DIR/gunicorn.ctl (or ~/.gunicorn/gunicorn.ctl): one fixed
    # path shared by every instance on the host, through which anyone with access may stop it
    run_dir, home = tmp_path / "run", tmp_path / "home"
    run_dir.mkdir()
    home.mkdir()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    port = free_port()
    with running(serve_command(policy, port, redis_server.url), tmp_path, port,
                 env={"XDG_RUNTIME_DIR": str(run_dir), "HOME": str(home)}) as server:
        wait_ready(server)
        assert sorted(p.name for p in [*run_dir.rglob("*"), *home.rglob("*")]) == []


def scale_refusal(tmp_path: Path, redis_url: str, *auth: str) -> subprocess.CompletedProcess[str]:
    pki = make_pki(tmp_path / "pki")
    policy = tmp_path / "p.yaml"
    policy.write_text(policy_text())
    argv = [sys.executable, "-m", "extender.cli", "scale", "--policy", str(policy), "--no-loop",
            "--redis-url", redis_url, "--bind", f"127.0.0.1:{free_port()}",
            "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key), *auth]
    env = {**os.environ, "HOME": str(tmp_path)}
    return subprocess.run(argv, cwd=ROOT, env=env, check=False, capture_output=True, text=True,
                          timeout=REFUSAL_BOUND_S)


def test_scale_refuses_an_api_that_could_authenticate_nobody(tmp_path: Path, redis_server: RedisServer) -> None:
    done = scale_refusal(tmp_path, redis_server.url, "--no-delegated-auth", "--authentication-skip-lookup")
    assert done.returncode == 1, done.stderr
    assert "not starting" in done.stderr and "could authenticate no caller" in done.stderr
    assert "Traceback" not in done.stderr


def test_scale_refuses_one_ca_for_both_roles_before_starting(tmp_path: Path, redis_server: RedisServer) -> None:
    ca = make_pki(tmp_path / "shared").client_ca.cert
    done = scale_refusal(tmp_path, redis_server.url, "--no-delegated-auth", "--authentication-skip-lookup",
                         "--requestheader-client-ca-file", str(ca), "--client-ca-file", str(ca))
    assert done.returncode == 1, done.stderr
    assert "not starting" in done.stderr and "share a subject name" in done.stderr
    assert "Traceback" not in done.stderr

