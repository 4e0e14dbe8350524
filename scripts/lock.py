"""Write requirements/runtime.lock: the runtime dependencies of pyproject.toml, resolved by pip and
pinned with the sha256 of every wheel the container image may install (CPython 3.11 on Linux,
x86_64 and aarch64). The image installs it with `pip install --require-hashes`, so a rebuild gets
exactly these files or fails.

    scripts/lock          resolve again (newest versions within pyproject's bounds) and rewrite

tests/test_image.py checks that the locks satisfy pyproject.toml and install into a clean venv.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "runtime.lock"
#: What builds the wheel (pyproject's build-system), pinned the same way.
BUILD_LOCK = ROOT / "requirements" / "build.lock"
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


def main() -> int:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lock([*pyproject["project"]["dependencies"], *MARKER_DEPENDENCIES], LOCK, "The runtime dependencies")
    lock(pyproject["build-system"]["requires"], BUILD_LOCK, "The build requirements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
