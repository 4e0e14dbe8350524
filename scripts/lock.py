"""Write the locks in requirements/:

* runtime.lock: the runtime dependencies of pyproject.toml, resolved by pip and pinned with the
  sha256 of every wheel the container image may install (CPython 3.11 on Linux, x86_64 and
  aarch64). The image installs it with `pip install --require-hashes`, so a rebuild gets exactly
  these files or fails. build.lock: what builds the wheel, the same way.
* test.lock: every package `.venv` holds (the runtime, the `dev`, `plots` and `embedded` extras,
  what builds the editable install, pip itself), resolved for the interpreter running this script.
  scripts/_venv.sh installs under it as pip constraints, so a fresh clone tests with exactly the
  versions the last lock chose: a new release upstream (a newly typed module makes a `type: ignore`
  unused) changes nothing until someone runs this script and the tests.

    scripts/lock          resolve again (newest versions within pyproject's bounds) and rewrite

tests/test_image.py checks that the locks satisfy pyproject.toml, that the test lock and the
runtime lock agree, and that the runtime lock installs into a clean venv.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "runtime.lock"
#: What builds the wheel (pyproject's build-system), pinned the same way.
BUILD_LOCK = ROOT / "requirements" / "build.lock"
#: What .venv holds, as pip constraints (no hashes: pip refuses hashes in a constraints file).
TEST_LOCK = ROOT / "requirements" / "test.lock"
#: The extras scripts/_venv.sh installs.
TEST_EXTRAS = ("dev", "plots", "embedded")
PYTHON = "3.11"
#: Wanted by a dependency only on some Python releases, which pip judges by the interpreter running
#: it, not by --python-version: redis needs async-timeout below Python 3.11.3 (Debian 12 has 3.11.2,
#: the test build's base). Locked always; on a newer Python it is one small unused package.
MARKER_DEPENDENCIES = ["async-timeout>=4.0.3"]
PLATFORMS = {
    "x86_64": ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"],
    "aarch64": ["manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"],
}


def resolve(requirements: Path, platforms: list[str], report: Path) -> dict[str, tuple[str, set[str]]]:
    """``{name: (version, {sha256})}`` as pip resolves ``requirements`` for one platform."""
    tags = [a for p in platforms for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), "--only-binary=:all:", *tags, "--python-version", PYTHON,
                    "--implementation", "cp", "--abi", f"cp{PYTHON.replace('.', '')}", "--abi", "abi3",
                    "--abi", "none", "-r", str(requirements)], check=True)
    out: dict[str, tuple[str, set[str]]] = {}
    for item in json.loads(report.read_text())["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
        out[name] = (item["metadata"]["version"], {digest})
    return out


def lock(requirements: list[str], path: Path, what: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        listed = Path(tmp) / "requirements.in"
        listed.write_text("\n".join(requirements) + "\n")
        merged: dict[str, tuple[str, set[str]]] = {}
        for arch, platforms in PLATFORMS.items():
            for name, (version, digests) in resolve(listed, platforms, Path(tmp) / f"{arch}.json").items():
                if name in merged and merged[name][0] != version:
                    raise SystemExit(f"{name}: {merged[name][0]} on one platform, {version} on {arch}")
                merged.setdefault(name, (version, set()))[1].update(digests)
    lines = [f"# {what} of pyproject.toml, pinned with hashes (CPython 3.11, Linux x86_64 and aarch64).",
             "# Written by scripts/lock; the Containerfile installs it with --require-hashes.", ""]
    for name in sorted(merged):
        version, digests = merged[name]
        lines.append(f"{name}=={version} \\")
        lines += [f"    --hash=sha256:{d}" + (" \\" if i < len(digests) - 1 else "")
                  for i, d in enumerate(sorted(digests))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"{path.relative_to(ROOT)}: {len(merged)} packages")


def lock_test(requirements: list[str], path: Path) -> None:
    """Pin ``requirements`` as pip resolves them for this interpreter, one ``name==version`` a line."""
    with tempfile.TemporaryDirectory() as tmp:
        listed, report = Path(tmp) / "requirements.in", Path(tmp) / "report.json"
        listed.write_text("\n".join(requirements) + "\n")
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", str(report), "-r", str(listed)], check=True)
        pinned = sorted((item["metadata"]["name"].lower().replace("_", "-"), item["metadata"]["version"])
                        for item in json.loads(report.read_text())["install"])
    python = ".".join(map(str, sys.version_info[:3]))
    lines = ["# Every package the test environment (.venv) holds, pinned (CPython "
             f"{python}, {platform.machine()}).",
             "# Written by scripts/lock; scripts/_venv.sh installs with it as pip constraints.", "",
             *(f"{name}=={version}" for name, version in pinned)]
    path.write_text("\n".join(lines) + "\n")
    print(f"{path.relative_to(ROOT)}: {len(pinned)} packages")


def main() -> int:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = [*pyproject["project"]["dependencies"], *MARKER_DEPENDENCIES]
    build = pyproject["build-system"]["requires"]
    extras = [r for extra in TEST_EXTRAS for r in pyproject["project"]["optional-dependencies"][extra]]
    lock(runtime, LOCK, "The runtime dependencies")
    lock(build, BUILD_LOCK, "The build requirements")
    lock_test([*runtime, *extras, *build, "pip"], TEST_LOCK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
