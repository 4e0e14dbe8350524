"""Throw-away certificate authorities for TLS tests, made with the ``openssl`` command line.

(The ``cryptography`` package is not a dependency; ``openssl`` is on every machine that has Python's
``ssl`` module.) Three CAs, as an aggregated API server sees them in a cluster:

* ``server``: signs the serving certificate (SAN ``127.0.0.1``, ``localhost``);
* ``front_proxy``: the request-header CA, signing ``front-proxy-client`` (kube-apiserver's
  ``--proxy-client-cert-file``);
* ``client``: the cluster's client CA, signing a user certificate ``CN=jane, O=team-a``.

Plus ``rogue``: a self-signed client certificate no CA vouches for. EC P-256 keys: quick to make.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path

    def pem(self) -> str:
        return self.cert.read_text()


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {done.stderr}")


def make_ca(directory: Path, name: str, common_name: str) -> Pair:
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(pair.key), "-out", str(pair.cert), "-days", "2", "-subj", f"/CN={common_name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=directory)
    return pair


def make_cert(directory: Path, name: str, ca: Pair | None, subject: str, *, server: bool = False,
              dns: tuple[str, ...] = ()) -> Pair:
    """A leaf signed by ``ca`` (self-signed when ``ca`` is None); ``subject`` like ``/CN=jane/O=team-a``;
    a server certificate names ``127.0.0.1``, ``localhost`` and the ``dns`` names."""
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    ext = directory / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
             f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}"]
    if server:
        lines.append("subjectAltName=" + ",".join(["IP:127.0.0.1", "DNS:localhost", *(f"DNS:{n}" for n in dns)]))
    ext.write_text("\n".join(lines) + "\n")
    if ca is None:
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(pair.key), "-out", str(pair.cert), "-days", "2", "-subj", subject,
                 "-extensions", "v3_req", "-addext", f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}",
                 cwd=directory)
        return pair
    csr = directory / f"{name}.csr"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(pair.key),
             "-out", str(csr), "-subj", subject, cwd=directory)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
             "-out", str(pair.cert), "-days", "2", "-extfile", str(ext), cwd=directory)
    return pair


@dataclass(frozen=True)
class Pki:
    directory: Path
    server_ca: Pair
    server: Pair
    front_proxy_ca: Pair
    front_proxy: Pair
    client_ca: Pair
    client: Pair
    rogue: Pair


def make_pki(directory: Path) -> Pki:
    """Every CA and certificate of the module docstring, in ``directory``."""
    if shutil.which("openssl") is None:
        pytest.fail("these tests need the openssl command line (Debian: apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    server_ca = make_ca(directory, "server-ca", "extender-test-server-ca")
    front_proxy_ca = make_ca(directory, "front-proxy-ca", "front-proxy-ca")
    client_ca = make_ca(directory, "client-ca", "kubernetes")
    return Pki(
        directory=directory,
        server_ca=server_ca,
        server=make_cert(directory, "server", server_ca, "/CN=extender-scaler.kube-system.svc", server=True),
        front_proxy_ca=front_proxy_ca,
        front_proxy=make_cert(directory, "front-proxy-client", front_proxy_ca, "/CN=front-proxy-client"),
        client_ca=client_ca,
        client=make_cert(directory, "jane", client_ca, "/CN=jane/O=team-a"),
        rogue=make_cert(directory, "rogue", None, "/CN=front-proxy-client"),
    )
