"""Cost of one agent scan of a cache root holding 100,000 files, against a bare directory walk.

What runs (in one process, on one tree, page cache warm after a first untimed pass):

* the tree: a real directory tree of empty files in a temporary directory (file sizes do not
  change the cost of ``lstat``, so the files are empty; the manifests list them as written);
* **baseline**: the cheapest walk that learns every file's size: recursive ``os.scandir`` plus one
  ``DirEntry.stat(follow_symlinks=False)`` per file, nothing else;
* **first scan**: :func:`extender.agent.scan.scan_cache` with no manifest cache (every manifest
  parsed and checked; completeness, partial bytes, compile keys, snapshots): what the agent pays
  once, after it starts;
* **steady scan**: the same with the agent's :class:`~extender.agent.scan.ManifestCache` warm (a
  manifest is re-parsed only when its file changed): what every later scan costs.

The three are timed in turn within each round (medians of ``--repeat`` rounds), so all see the
same machine noise. Two layouts of 100,000 files each:

* ``weights``: every file below ``weights/`` (100 version directories of 1,000 files, half complete
  with a manifest and marker, a quarter partial with a manifest, a quarter without one), the
  scanner's worst case: it must ``lstat`` every file;
* ``mixed``: 20,000 weights files and 80,000 small files in 200 compile-cache directories (Triton
  caches look like this); the scanner stops at the first file of each cache directory, so this is
  what a real node costs.

Run (from the repository root)::

    .venv/bin/python bench/bench_agent_scan.py
    .venv/bin/python bench/bench_agent_scan.py --files 100000 --repeat 7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.timing import interleaved  # noqa: E402
from extender.agent.scan import ManifestCache, scan_cache  # noqa: E402
from extender.layout import compile_dir, mark_complete, weights_dir, write_manifest  # noqa: E402


def touch_many(directory: Path, names: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).touch()


def build_weights(root: Path, files: int, per_dir: int = 1000) -> None:
    """``files`` files in version directories of ``per_dir``; a mix of complete, partial and unlisted."""
    dirs = max(1, files // per_dir)
    for d in range(dirs):
        directory = weights_dir(root, f"model-{d // 4}", f"rev-{d % 4}")
        names = [f"shard-{i:05d}.safetensors" for i in range(per_dir)]
        touch_many(directory, names)
        kind = d % 4
        if kind in (0, 1):  # complete
            write_manifest(directory, [(n, 0) for n in names])
            mark_complete(directory)
        elif kind == 2:  # partial download: the manifest lists more than is there
            write_manifest(directory, [(n, 0) for n in names] + [("still-coming.safetensors", 10)])


def build_compile(root: Path, files: int, per_dir: int = 400) -> None:
    for d in range(max(1, files // per_dir)):
        base = compile_dir(root, f"ck1-{d:032x}")
        # Triton-like: many subdirectories holding a few files each
        for sub in range(per_dir // 4):
            touch_many(base / "triton" / f"{sub:04x}", ["k.cubin", "k.json", "k.ptx", "k.ttir"])


def bare_walk(root: Path) -> int:
    """The baseline: size of every file by scandir + lstat, nothing more."""
    total = 0
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def count_files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    results: dict[str, Any] = {"files": args.files, "repeat": args.repeat, "python": platform.python_version(),
                               "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "layouts": {}}
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-scan-"))
    try:
        def mixed(r: Path) -> None:
            build_weights(r, args.files // 5)
            build_compile(r, args.files - args.files // 5)

        layouts: dict[str, Callable[[Path], None]] = {"weights": lambda r: build_weights(r, args.files),
                                                      "mixed": mixed}
        print(f"{'layout':<8} {'files':>8} {'baseline ms':>12} {'first ms':>9} {'ratio':>6} "
              f"{'steady ms':>10} {'ratio':>6} {'us/file':>8}")
        for name, build in layouts.items():
            root = tmp / name
            build(root)
            n = count_files(root)
            cache = ManifestCache()
            medians = interleaved({
                "baseline": partial(bare_walk, root),
                "first": partial(scan_cache, root),
                "steady": partial(scan_cache, root, manifests=cache),
            }, args.repeat)
            base, first, steady = medians["baseline"], medians["first"], medians["steady"]
            result = scan_cache(root)
            assert not [p for p in result.problems if p.kind != "inconsistent"], result.problems[:3]
            results["layouts"][name] = {
                "files": n, "baseline_s": base, "first_scan_s": first, "first_ratio": first / base,
                "steady_scan_s": steady, "steady_ratio": steady / base, "weights_dirs": len(result.weights),
                "compile_keys": len(result.compile_keys), "files_statted_by_scan": result.files,
            }
            print(f"{name:<8} {n:>8} {base * 1e3:>12.1f} {first * 1e3:>9.1f} {first / base:>6.2f} "
                  f"{steady * 1e3:>10.1f} {steady / base:>6.2f} {steady / n * 1e6:>8.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
