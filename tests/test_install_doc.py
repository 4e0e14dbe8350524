"""docs/install.md: every command block is run here as written, or marked as needing a real cluster.

Each ```sh block is preceded by one marker:

* ``<!-- tested: offline -->``: run with bash (``set -euo pipefail``) in a scratch folder that holds
  the repository's ``deploy/`` and ``policies/``, with helm, kubectl and extender on PATH;
* ``<!-- tested: cluster -->``: the same, with KUBECONFIG naming the admin of the test control plane
  (tests/real_cluster.py) on which the chart's scheduler ConfigMap was applied, as an install would;
* ``<!-- real cluster: why -->``: not run (nodes, a registry, cert-manager, an installed release);
  the workloads such a block names must still be ones the chart renders.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import chart
from tests.real_cluster import Cluster
from tests.test_packaging import RENDERS

DOC = chart.ROOT / "docs" / "install.md"
BLOCK = re.compile(r"(?:<!-- (?P<marker>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.DOTALL)
#: Secrets the cluster blocks create (deleted first, so the blocks run again in one session).
CREATED = ("extender-redis", "extender-redis-sentinel-example", "extender-scaler-tls")


def blocks() -> list[tuple[str, str]]:
    """``(marker, body)`` of every sh block, in order."""
    return [(m["marker"] or "", m["body"]) for m in BLOCK.finditer(DOC.read_text()) if m["lang"] == "sh"]


def blocks_marked(marker: str) -> list[str]:
    return [body for m, body in blocks() if m == marker]


def test_every_command_block_is_marked() -> None:
    found = blocks()
    assert len(found) >= 10
    unmarked = [body for marker, body in found
                if marker not in ("tested: offline", "tested: cluster") and not marker.startswith("real cluster: ")]
    assert unmarked == []
    assert blocks_marked("tested: offline") and blocks_marked("tested: cluster")


def test_the_workloads_real_cluster_blocks_name_are_rendered() -> None:
    rendered = {(d["kind"].lower(), d["metadata"]["name"]) for _, docs in RENDERS for d in docs}
    named = set()
    for _, body in blocks():
        for kind, name in re.findall(r"\b(deployment|daemonset|statefulset)/([a-z0-9-]+)", body):
            named.add((kind, name))
    assert named and named <= rendered, named - rendered


def shell(body: str, directory: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=directory, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture
def scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    for name in ("deploy", "policies"):
        (tmp_path / name).symlink_to(chart.ROOT / name)
    path = os.pathsep.join([str(chart.helm().parent), str(chart.kubectl().parent),
                            str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "HOME": str(tmp_path)}
    env.pop("KUBECONFIG", None)
    return tmp_path, env


@pytest.mark.parametrize("body", blocks_marked("tested: offline"))
def test_offline_blocks_run(scratch: tuple[Path, dict[str, str]], body: str) -> None:
    directory, env = scratch
    done = shell(body, directory, env)
    assert done.returncode == 0, f"{body}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


@pytest.mark.integration
@pytest.mark.cluster
def test_cluster_blocks_run_in_order(kube_cluster: Cluster, scratch: tuple[Path, dict[str, str]]) -> None:
    directory, env = scratch
    env["KUBECONFIG"] = str(kube_cluster.admin_kubeconfig)
    for secret in CREATED:
        kube_cluster.kubectl("-n", "kube-system", "delete", "secret", secret, "--ignore-not-found")
    kube_cluster.apply([chart.one(chart.rendered(), "ConfigMap", "extender-scheduler-config")])
    for body in blocks_marked("tested: cluster"):
        done = shell(body, directory, env)
        assert done.returncode == 0, f"{body}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    # what the blocks made is what the chart reads
    tls = kube_cluster.get("secret", "extender-scaler-tls", "-n", "kube-system")
    assert tls["type"] == "kubernetes.io/tls"
    verified = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "tls.crt"], cwd=directory,
                              capture_output=True, text=True, check=False)
    assert verified.returncode == 0, verified.stderr
    names = subprocess.run(["openssl", "x509", "-in", "tls.crt", "-noout", "-ext", "subjectAltName"], cwd=directory,
                           capture_output=True, text=True, check=True).stdout
    service = chart.one(chart.rendered(), "APIService")["spec"]["service"]
    assert f"DNS:{service['name']}.{service['namespace']}.svc" in names
    redis = kube_cluster.get("secret", "extender-redis", "-n", "kube-system")
    assert set(redis["data"]) == {"password", "url"}
    for secret in CREATED:
        kube_cluster.kubectl("-n", "kube-system", "delete", "secret", secret, "--ignore-not-found")
