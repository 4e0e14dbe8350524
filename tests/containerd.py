"""A real containerd (Debian's package) for the agent's CRI tests, on its own directories and socket.

:class:`Containerd` runs ``containerd`` as root with a configuration of its own: root and state
under a temporary directory, its gRPC socket there too (so nothing touches /run/containerd or
another containerd on the machine), the CRI plugin on with the ``native`` snapshotter, no CNI
(listing images needs none). :func:`oci_archive` writes an OCI image layout tarball (index,
manifests, configs, one small layer each) that ``ctr images import`` puts into the CRI plugin's
``k8s.io`` namespace, where ``ListImages`` finds it. Nothing is pulled: the machine reaches no
registry.

scripts/test installs the package when it runs as root; elsewhere the fixture skips, saying why
(containerd needs root), and as root without the package the test fails with the install command.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from extender.cri import ImageListError
from extender.cri.images import list_images

#: Seconds containerd has to answer ListImages after it was started (a setup bound, not an assertion).
START_TIMEOUT_S = 30.0
INSTALL = ("run scripts/test as root (it installs Debian's containerd package), or: "
           "apt-get update && apt-get install -y containerd")

CONFIG = """\
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.6"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{cni}"
"""


def binaries() -> tuple[str, str]:
    """``(containerd, ctr)``: skip unless root (containerd needs it), fail with the install command when
    they are missing."""
    if os.geteuid() != 0:
        pytest.skip("containerd runs as root only; these tests start a real one (scripts/test as root does)")
    found = shutil.which("containerd"), shutil.which("ctr")
    if found[0] is None or found[1] is None:
        pytest.fail(f"containerd or ctr is not installed; {INSTALL}")
    return found[0], found[1]


@dataclass
class Containerd:
    """One containerd process on directories below ``directory`` and a socket there (short: a unix
    socket path is at most 107 bytes). ``cri``: with the CRI plugin (else it serves no ``runtime.v1``)."""

    directory: Path
    cri: bool = True
    process: subprocess.Popen[bytes] | None = None
    executables: tuple[str, str] = field(default_factory=binaries)

    @property
    def socket(self) -> Path:
        return self.directory / "containerd.sock"

    @property
    def log(self) -> Path:
        return self.directory / "containerd.log"

    def start(self) -> None:
        """Start (again) and wait until it lists images over CRI (or, without CRI, answers at all)."""
        config = self.directory / "config.toml"
        disabled = "" if self.cri else '"io.containerd.grpc.v1.cri"'
        (self.directory / "cni").mkdir(exist_ok=True)
        config.write_text(CONFIG.format(root=self.directory / "root", state=self.directory / "state",
                                        socket=self.socket, opt=self.directory / "opt", cni=self.directory / "cni",
                                        disabled=disabled))
        with self.log.open("ab") as log:
            self.process = subprocess.Popen([self.executables[0], "--config", str(config)],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if self._answers():
                return
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"containerd did not start: {self.log.read_text(errors='replace')[-3000:]}")

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            list_images(self.socket, 1.0)
        except ImageListError as exc:
            return not self.cri and exc.reason == "unimplemented"
        return True

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; always reaped. Its directories stay (a restart keeps its images)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """SIGSTOP for the ``with`` block, SIGCONT after: its socket still takes connections (the kernel's
        backlog) but nothing answers, as a runtime stuck in a syscall or a lock."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)

    def import_images(self, archive: Path) -> None:
        """``ctr images import`` an OCI archive into the CRI plugin's namespace (not unpacked: listing needs no
        snapshot)."""
        done = subprocess.run([self.executables[1], "--address", str(self.socket), "--namespace", "k8s.io",
                               "images", "import", "--no-unpack", str(archive)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr

    def tag(self, source: str, target: str) -> None:
        """``ctr images tag``: another name for an image (a ``repo@sha256:...`` name is a repo digest to CRI)."""
        done = subprocess.run([self.executables[1], "--address", str(self.socket), "--namespace", "k8s.io",
                               "images", "tag", source, target],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr


@contextmanager
def containerd(*, cri: bool = True) -> Iterator[Containerd]:
    """A started :class:`Containerd` on a fresh short directory, stopped and removed after the block."""
    executables = binaries()
    directory = Path(tempfile.mkdtemp(prefix="ctd-", dir="/tmp"))
    runtime = Containerd(directory, cri=cri, executables=executables)
    try:
        runtime.start()
        yield runtime
    finally:
        runtime.stop()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class TestImage:
    """An image to put into an archive: its name, and the bytes of its one layer's one file (its size)."""

    name: str
    layer_bytes: int = 0

    __test__ = False  # not a pytest test class


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_archive(path: Path, images: Sequence[TestImage]) -> dict[str, str]:
    """Write an OCI image layout tarball holding ``images``; their manifest digests by name.

    Each image: one uncompressed layer with one file of ``layer_bytes`` zero bytes (so images differ in
    size, and in digest), a config naming that layer, a manifest, and an index entry with the name
    (``org.opencontainers.image.ref.name`` and ``io.containerd.image.name``, which ``ctr`` reads).
    """
    blobs: dict[str, bytes] = {}
    entries: list[dict[str, object]] = []
    digests: dict[str, str] = {}
    for image in images:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as layer_tar:
            info = tarfile.TarInfo("data")
            info.size = image.layer_bytes
            info.mtime = 0
            layer_tar.addfile(info, io.BytesIO(bytes(image.layer_bytes)))
        layer = buf.getvalue()
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                             "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]}}).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(config),
                       "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _digest(layer),
                        "size": len(layer)}],
        }).encode()
        for blob in (layer, config, manifest):
            blobs[_digest(blob)] = blob
        digests[image.name] = _digest(manifest)
        entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(manifest),
                        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": image.name,
                                                               "io.containerd.image.name": image.name}})
    index = json.dumps({"schemaVersion": 2, "manifests": entries}).encode()
    with tarfile.open(path, "w") as out:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add("index.json", index)
        for digest, blob in blobs.items():
            add("blobs/sha256/" + digest.removeprefix("sha256:"), blob)
    return digests
