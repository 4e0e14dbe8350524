"""Every command line the deployment renders is one its command accepts: parsed by the real
``extender`` parser and put through the same checks the command runs before it starts.

Sources: ``helm template`` of the chart for every variant and extra value set (tests/test_packaging.py:
both overlays, both Redis modes, the External Metrics API and KEDA each with both certificate
paths, mutual TLS for the extender, hub caches, ...), the shipped kustomize overlays built by
``kubectl kustomize``, and the helper steps of a warm Job. For each container that runs
``extender``:

* the arguments parse (argparse would exit 2 naming the flag);
* :func:`extender.arguments.flag_problem` finds nothing: it runs the check the command registered,
  the one its handler runs first (``--tls-cert`` without ``--tls-key``, keda-scaler without TLS or
  ``--plaintext``, an agent without a node name, ...), with the container's environment (a variable
  set from a Secret or the downward API counts as set);
* every file or directory a flag names lies under one of the container's volume mounts, so the
  process does not start on a path that cannot exist in its image.

The same checks refuse bad command lines (the table at the end): they can fail, and the command
exits 2 on them with the same words.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import PurePosixPath
from typing import Any

import pytest

from extender import cli
from extender.arguments import flag_problem
from tests import chart
from tests.test_image import warm_job
from tests.test_packaging import RENDERS

#: Flags whose value is a file or directory the process opens.
PATH_FLAGS = ("--policy", "--tls-cert", "--tls-key", "--tls-client-ca", "--tls-front-proxy-ca", "--kubeconfig",
              "--cache-root", "--hub-cache")
def kustomize_overlays() -> list[tuple[str, list[dict[str, Any]]]]:
    return [(f"kustomize/{overlay}", list(chart.kustomize_build(chart.KUSTOMIZE / "overlays" / overlay).values()))
            for overlay in chart.OVERLAYS]


def every_command() -> list[chart.Command]:
    sources = [(f"helm/{name}", docs) for name, docs in RENDERS] + kustomize_overlays()
    out = [c for source, docs in sources for c in chart.containers(source, docs)]
    out += chart.containers("warm-job", [warm_job()])  # the helper steps of a weights Job, as the warmer makes it
    return out


COMMANDS = every_command()


def parse(args: tuple[str, ...]) -> argparse.Namespace:
    """The real parser's reading of ``args``; an argparse refusal fails the test with its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return cli.build_parser().parse_args(list(args))
    except SystemExit:
        raise AssertionError(f"{' '.join(args)}: refused by the parser: {err.getvalue().strip()}") from None


def paths_given(args: tuple[str, ...]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in PATH_FLAGS:
            out.append((flag, value if eq else args[i + 1]))
    return out


def test_every_source_and_command_is_covered() -> None:
    sources = {"/".join(c.where.split("/")[:2]) for c in COMMANDS}
    assert sources >= {f"helm/{name}" for name, _ in RENDERS} | {f"kustomize/{o}" for o in chart.OVERLAYS}
    commands = {c.args[0] for c in COMMANDS}
    assert commands >= {"serve", "agent", "sync", "scale", "keda-scaler", "warm"}
    keda = [c for c in COMMANDS if c.args[0] == "keda-scaler"]
    # both certificate paths of KEDA mode, from helm and from the kustomize variants
    assert any("keda-cert-manager" in c.where for c in keda) and any("keda-secret" in c.where for c in keda)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_the_command_would_start_with_what_is_rendered(command: chart.Command) -> None:
    args = parse(command.args)
    assert args.command == command.args[0]
    assert flag_problem(args, command.environ) is None, command.args
    for flag, value in paths_given(command.args):
        path = PurePosixPath(value)
        assert path.is_absolute(), (flag, value)
        assert any(path == PurePosixPath(m) or PurePosixPath(m) in path.parents for m in command.mounts), (
            f"{flag}={value} is on no volume mount of {command.where} ({command.mounts})")


# ---- the checks can fail: what they refuse, and the command refuses the same way ------------------

REFUSED: list[tuple[str, list[str], dict[str, str], str]] = [
    # the chart's keda-scaler before this check existed: it would exit 2 at once
    ("keda-without-tls-choice", ["keda-scaler", "--policy=/etc/extender/policy.yaml", "--listen=0.0.0.0:9090"], {},
     "or --plaintext"),
    ("keda-key-missing", ["keda-scaler", "--policy=p.yaml", "--tls-cert=/t/tls.crt"], {}, "go together"),
    ("keda-client-ca-alone", ["keda-scaler", "--policy=p.yaml", "--plaintext", "--tls-client-ca=/t/ca.crt"], {},
     "--tls-client-ca needs --tls-cert"),
    ("keda-health-on-its-port", ["keda-scaler", "--policy=p.yaml", "--plaintext", "--listen=:9090",
                                 "--health-listen=0.0.0.0:9090"], {}, "--health-listen must differ"),
    ("keda-metrics-on-its-health-port", ["keda-scaler", "--policy=p.yaml", "--plaintext", "--health-listen=:9091",
                                         "--metrics-bind=0.0.0.0:9091"], {}, "--metrics-bind must differ"),
    ("serve-cert-alone", ["serve", "--policy=p.yaml", "--tls-cert=/t/tls.crt"], {}, "go together"),
    ("serve-client-ca-alone", ["serve", "--policy=p.yaml", "--tls-client-ca=/t/ca.crt"], {},
     "--tls-client-ca needs --tls-cert"),
    ("scale-api-without-tls", ["scale", "--policy=p.yaml"], {}, "served over TLS"),
    ("scale-two-modes", ["scale", "--policy=p.yaml", "--once", "--no-loop"], {}, "exclude each other"),
    ("scale-client-ca-alone", ["scale", "--policy=p.yaml", "--no-metrics-api", "--tls-client-ca=/t/ca.crt"], {},
     "--tls-client-ca needs --tls-cert"),
    ("agent-without-node", ["agent", "--cache-root=/var/cache/extender"], {}, "--node-name or set $NODE_NAME"),
]


@pytest.mark.parametrize(("argv", "environ", "words"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_the_checks_refuse_what_the_command_refuses(argv: list[str], environ: dict[str, str], words: str,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    problem = flag_problem(parse(tuple(argv)), environ)
    assert problem is not None and words in problem
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert cli.main(argv) == 2
    assert problem in capsys.readouterr().err


def test_the_agent_takes_its_node_from_the_environment_it_is_given() -> None:
    args = parse(("agent", "--cache-root=/var/cache/extender"))
    assert flag_problem(args, {"NODE_NAME": "gpu-a"}) is None
