"""Fault suite, operations: the embedded Redis dying under the extender, start-up refusals of the
metrics API and of TLS files that cannot be used, and gunicorn's control socket. Real processes on
loopback; waits are bounded polls for a state (SETTLE_S, a setup bound), never assertions on time.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from gunicorn.arbiter import Arbiter
from gunicorn.config import Config
from gunicorn.glogging import Logger as GunicornLogger

from extender.api.asgi import LingeringASGIWorker
from extender.core.inventory import NodeState
from extender.state import InventoryStore, connect, embedded
from tests.conftest import RedisServer
from tests.net import free_port
from tests.pki import Pki, make_pki
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



# ---- TLS files that cannot be used: a refusal before start, never plain HTTP on the TLS port -----------


class BadTls(NamedTuple):
    command: str  # serve or scale
    files: Callable[[Pki, Path], dict[str, Path]]  # --tls-* flag -> file
    words: Callable[[Pki, Path], str]


def _not_pem(tmp: Path) -> Path:
    path = tmp / "not-pem.txt"
    path.write_text("not a certificate\n")
    return path


BAD_TLS = [
    pytest.param(BadTls("serve", lambda p, t: {"--tls-cert": t / "missing.pem", "--tls-key": p.server.key},
                        lambda p, t: f"extender: --tls-cert {t / 'missing.pem'}: cannot read: No such file"),
                 id="serve-a-missing-certificate"),
    pytest.param(BadTls("serve", lambda p, t: {"--tls-cert": p.server.cert, "--tls-key": t},
                        lambda p, t: f"extender: --tls-key {t}: cannot read: not a regular file"),
                 id="serve-a-directory-as-key"),
    pytest.param(BadTls("serve", lambda p, t: {"--tls-cert": _not_pem(t), "--tls-key": _not_pem(t)},
                        lambda p, t: "not a usable PEM certificate, private key and CA certificates"),
                 id="serve-a-certificate-that-is-not-pem"),
    pytest.param(BadTls("serve", lambda p, t: {"--tls-cert": p.server.cert, "--tls-key": p.client.key},
                        lambda p, t: "not a usable PEM certificate, private key and CA certificates"),
                 id="serve-the-key-of-another-certificate"),
    pytest.param(BadTls("serve", lambda p, t: {"--tls-cert": p.server.cert, "--tls-key": p.server.key,
                                               "--tls-client-ca": _not_pem(t)},
                        lambda p, t: f"--tls-client-ca {t / 'not-pem.txt'}: not a usable PEM"),
                 id="serve-a-client-ca-that-holds-no-certificate"),
    pytest.param(BadTls("scale", lambda p, t: {"--tls-cert": _not_pem(t), "--tls-key": p.server.key,
                                               "--tls-client-ca": p.client_ca.cert},
                        lambda p, t: "not a usable PEM certificate, private key and CA certificates"),
                 id="scale-a-certificate-that-is-not-pem"),
]


@pytest.mark.parametrize("case", BAD_TLS)
def test_unusable_tls_files_are_refused_before_start(case: BadTls, tmp_path: Path, redis_server: RedisServer) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = [arg for flag, path in case.files(pki, tmp_path).items() for arg in (flag, str(path))]
    port = free_port()
    if case.command == "serve":
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        argv = serve_command(policy, port, redis_server.url, *tls)
    else:
        policy = tmp_path / "p.yaml"
        policy.write_text(policy_text())
        argv = [sys.executable, "-m", "extender.cli", "scale", "--policy", str(policy), "--no-loop",
                "--redis-url", redis_server.url, "--bind", f"127.0.0.1:{port}", "--no-delegated-auth",
                "--no-auth-configmap", *tls]
    # without the check, gunicorn's asyncio worker logged the error and served plain HTTP until stopped
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "HOME": str(tmp_path)}, check=False,
                          capture_output=True, text=True, timeout=REFUSAL_BOUND_S)
    assert done.returncode == 1, done.stderr
    assert case.words(pki, tmp_path) in done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stderr.lower()
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_worker_that_cannot_build_its_tls_context_stops_the_server(tmp_path: Path) -> None:
    """The backstop behind the check at start: a worker (re)started after the certificate was replaced
    by a broken one exits with gunicorn's boot-error code, which stops the master, instead of serving
    plain HTTP on the TLS port."""
    not_pem = _not_pem(tmp_path)
    cfg = Config()
    cfg.set("certfile", str(not_pem))
    cfg.set("keyfile", str(not_pem))
    worker = LingeringASGIWorker(0, os.getpid(), [], None, 30, cfg, GunicornLogger(cfg))
    with pytest.raises(SystemExit) as stopped:
        worker._get_ssl_context()
    assert stopped.value.code == Arbiter.WORKER_BOOT_ERROR
    pki = make_pki(tmp_path / "pki")
    cfg.set("certfile", str(pki.server.cert))
    cfg.set("keyfile", str(pki.server.key))
    assert isinstance(worker._get_ssl_context(), ssl.SSLContext)
