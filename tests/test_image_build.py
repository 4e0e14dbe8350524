"""The Containerfile, built for real with Debian's buildah, and the image it makes, run.

No registry image can be pulled on this project's machines, so the base (``PYTHON_BASE``) is a
Debian 12 root made by ``debootstrap`` with Debian's Python 3.11 and committed as
``localhost/extender-test-base:bookworm`` (made once, kept in buildah's storage). The locked wheels
are downloaded by the host's pip and served on loopback (``PIP_NO_INDEX`` and ``PIP_FIND_LINKS``
build arguments): the build checks every hash of the locks. Then the image runs, as its own user:
``extender --version``, and every command line the chart's manifests give a container, parsed by the
installed parser.

What this does not cover: the official python image of ``PYTHON_BASE``'s default (its Python is
built from source in /usr/local; Debian's is 3.11.2), and pushing to a registry.

``scripts/test`` installs buildah and debootstrap (Debian packages) when they are missing and it
runs as root; elsewhere this test fails with the install command rather than skipping.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from extender import __version__
from tests.test_image import LOCKS, PARSE, manifest_commands, warm_job_commands

pytestmark = [pytest.mark.integration, pytest.mark.image]

ROOT = Path(__file__).resolve().parent.parent
BASE = "localhost/extender-test-base:bookworm"
IMAGE = f"localhost/extender:{__version__}-test"
#: Every buildah call uses these: vfs storage works on any kernel and filesystem, chroot isolation
#: needs no OCI runtime.
BUILDAH = ["buildah", "--storage-driver", "vfs"]
TIMEOUT_S = 1200


def buildah(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*BUILDAH, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
    return done


def base_image() -> None:
    """Make :data:`BASE` from a debootstrap root unless buildah's storage has it."""
    if buildah("images", "--quiet", BASE, check=False).returncode == 0:
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                        "bookworm", str(root), "http://deb.debian.org/debian"],
                       check=True, capture_output=True, timeout=TIMEOUT_S)
        container = buildah("from", "--quiet", "scratch").stdout.strip()
        try:
            mount = buildah("mount", container).stdout.strip()
            subprocess.run(f"tar -C {root} --exclude=./proc --exclude=./sys --exclude=./dev "
                           f"--exclude=./var/cache/apt/archives -cf - . | tar -C {mount} -xf -",
                           shell=True, check=True, timeout=TIMEOUT_S)
            buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", container)
            buildah("commit", "--quiet", container, BASE)
        finally:
            buildah("rm", container, check=False)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: apt-get install -y --no-install-recommends buildah debootstrap "
                    "(scripts/test does it when run as root)")
    base_image()
    wheels = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp",
                    "--abi", "cp311", "--abi", "abi3", "--abi", "none", "--require-hashes", "-d", str(wheels),
                    "-r", str(LOCKS["runtime"]), "-r", str(LOCKS["build"])], check=True, timeout=TIMEOUT_S)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(wheels)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        buildah("bud", "--isolation", "chroot", "--layers=false", "--build-arg", f"PYTHON_BASE={BASE}",
                "--build-arg", "PIP_NO_INDEX=1",
                "--build-arg", f"PIP_FIND_LINKS=http://127.0.0.1:{server.server_address[1]}/",
                "--tag", IMAGE, "--file", str(ROOT / "Containerfile"), str(ROOT))
    finally:
        server.shutdown()
        server.server_close()
    try:
        yield IMAGE
    finally:
        buildah("rmi", IMAGE, check=False)


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    """One working container of the image (with vfs storage each one is a full copy: made once)."""
    name = buildah("from", "--quiet", image).stdout.strip()
    try:
        yield name
    finally:
        buildah("rm", name, check=False)


def run_in(container: str, *command: str) -> str:
    """The command's output. Debian's buildah 1.28 with chroot isolation now and then loses the
    output of a short command (seen here with `sh -c 'id -u'`: exit 0, nothing printed), so an
    empty answer is asked again, at most three times; a command that never answers still fails."""
    for _ in range(3):
        out = buildah("run", "--isolation", "chroot", container, "--", *command).stdout
        if out.strip():
            return out
    return out


def test_the_image_runs_as_its_user_and_knows_its_version(image: str, container: str) -> None:
    assert run_in(container, "id", "-u").strip() == "65532"
    assert run_in(container, "extender", "--version").strip() == f"extender {__version__}"
    config = json.loads(buildah("inspect", "--type", "image", image).stdout)["OCIv1"]["config"]
    assert config["User"] == "65532:65532"


def test_every_command_the_manifests_run_parses_in_the_image(container: str) -> None:
    commands = {**manifest_commands(), **warm_job_commands()}
    script = PARSE.replace("json.load(sys.stdin)", "json.loads(sys.argv[1])")
    parsed: dict[str, str] = json.loads(run_in(container, "python3", "-c", script, json.dumps(commands)))
    unregistered = {commands[w][0] for w, c in parsed.items() if c == "unregistered"}
    assert unregistered <= {"keda-scaler"}, unregistered  # see tests/test_image.py
    assert {c for c in parsed.values() if c != "unregistered"} >= {"serve", "agent", "sync", "scale", "warm"}
