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

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import chart
from tests.conftest import RedisServer
from tests.real_cluster import Cluster
from tests.test_packaging import RENDERS

DOC = chart.ROOT / "docs" / "install.md"
BLOCK = re.compile(r"(?:<!-- (?P<marker>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.DOTALL)
#: Secrets the cluster blocks create (deleted first, so the blocks run again in one session).
CREATED = ("extender-redis", "extender-redis-sentinel-example", "extender-scaler-tls", "extender-keda-scaler-tls",
           "extender-keda-client-tls")
#: ... and the copy of KEDA's client Secret in the ScaledObjects' namespace.
CREATED_ELSEWHERE = (("default", "extender-keda-client-tls"),)


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
def test_cluster_blocks_run_in_order(kube_cluster: Cluster, redis_server: RedisServer,
                                     scratch: tuple[Path, dict[str, str]]) -> None:
    directory, env = scratch
    env["KUBECONFIG"] = str(kube_cluster.admin_kubeconfig)
    forget(kube_cluster)
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
    keda_mutual_tls_works(kube_cluster, redis_server, directory)
    forget(kube_cluster)


def forget(cluster: Cluster) -> None:
    for secret in CREATED:
        cluster.kubectl("-n", "kube-system", "delete", "secret", secret, "--ignore-not-found")
    for namespace, secret in CREATED_ELSEWHERE:
        cluster.kubectl("-n", namespace, "delete", "secret", secret, "--ignore-not-found")


def secret_files(cluster: Cluster, namespace: str, name: str, directory: Path) -> dict[str, Path]:
    """The Secret's keys written as files, as kubelet mounts a Secret volume."""
    data = cluster.get("secret", name, "-n", namespace)["data"]
    directory.mkdir(parents=True)
    out = {}
    for key, value in data.items():
        out[key] = directory / key
        out[key].write_bytes(base64.b64decode(value))
    return out


def keda_mutual_tls_works(cluster: Cluster, redis: RedisServer, directory: Path) -> None:
    """The KEDA Secrets the guide makes carry working mutual TLS: the real keda-scaler serving what
    ``kube-system/extender-keda-scaler-tls`` holds (where the chart mounts it, by the flags it
    renders) answers a client holding ``default/extender-keda-client-tls`` (what KEDA's
    TriggerAuthentication reads), for the host of the example's ``scalerAddress``, and refuses a
    client without a certificate."""
    import grpc

    from extender.keda.server import TlsFiles
    from tests.test_keda_scaler import ref, serving, settings, stub

    server = secret_files(cluster, "kube-system", "extender-keda-scaler-tls", directory / "mounted")
    client = secret_files(cluster, "default", "extender-keda-client-tls", directory / "keda")
    assert set(server) == set(client) == {"ca.crt", "tls.crt", "tls.key"}
    deployment = chart.one(chart.rendered(metrics__mode="keda"), "Deployment", "extender-keda-scaler")
    flags = dict(a.split("=", 1) for a in chart.container(deployment, "keda-scaler")["args"] if "=" in a)
    mounted = {flag: server[Path(flags[flag]).name] for flag in ("--tls-cert", "--tls-key", "--tls-client-ca")}
    tls = TlsFiles(mounted["--tls-cert"], mounted["--tls-key"], mounted["--tls-client-ca"])
    scaled = next(d for d in yaml.safe_load_all((chart.EXAMPLES / "scaledobject.yaml").read_text())
                  if d and d["kind"] == "ScaledObject")
    host = scaled["spec"]["triggers"][0]["metadata"]["scalerAddress"].rsplit(":", 1)[0]
    options = [("grpc.ssl_target_name_override", host)]
    with serving(settings(tls=tls), redis.url, directory / "redis-client") as running:
        keda = grpc.ssl_channel_credentials(root_certificates=client["ca.crt"].read_bytes(),
                                            private_key=client["tls.key"].read_bytes(),
                                            certificate_chain=client["tls.crt"].read_bytes())
        with grpc.secure_channel(running.address, keda, options=options) as channel:
            spec = stub(channel).GetMetricSpec(ref("default", {"workload": "qwen3"}), timeout=30)
            assert spec.metricSpecs[0].targetSize == 1
        anonymous = grpc.ssl_channel_credentials(root_certificates=client["ca.crt"].read_bytes())
        with grpc.secure_channel(running.address, anonymous, options=options) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                stub(channel).GetMetricSpec(ref("default", {"workload": "qwen3"}), timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
