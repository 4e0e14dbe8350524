"""The chart's ``values.schema.json``: Helm checks the values against it at install, upgrade, lint and
template, so a value its containers (or kube-scheduler, or Kubernetes) would refuse at start is
refused before anything is installed, with the key named.

* the schema has exactly the keys values.yaml has, and the templates read exactly those: a typo'd
  key is refused rather than ignored (``additionalProperties: false``), and no key the templates
  read is refused;
* its unit and name patterns are the binaries' own (extender/core/units.py, extender/core/k8snames.py,
  extender/arguments.py), and on a table of spellings its verdict is the command's: each value is
  rendered by Helm (from a values file, where numbers are floats, and from ``--set``) with the
  schema skipped, and the rendered command lines go through the real parser and the command's own
  pre-start checks (tests/test_rendered_commands.py);
* the defaults and every helm command line of the docs pass; each bad value of the table fails, naming
  its key.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from extender import cli
from extender.arguments import REDIS_SCHEMES, flag_problem
from extender.core.errors import InvalidValueError
from extender.core.images import check_reference
from extender.core.k8snames import DNS_LABEL, DNS_SUBDOMAIN_PATTERN
from extender.core.policy import _NAME as PROFILE_NAME
from extender.core.units import DURATION_PATTERN, QUANTITY_PATTERN
from tests import chart

SCHEMA_PATH = chart.CHART / "values.schema.json"
VALUES_PATH = chart.CHART / "values.yaml"
#: What Helm prints when the values fail the schema (and only then).
SCHEMA_FAILED = "values don't meet the specifications of the schema"
#: Pages whose command lines and ``--set`` assignments are checked against the schema.
DOC_PAGES = [chart.ROOT / "README.md", *sorted((chart.ROOT / "docs").glob("*.md"))]


@functools.cache
def schema() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return doc


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """``node``, or the definition its ``$ref`` names."""
    while "$ref" in node:
        node = schema()["definitions"][node["$ref"].removeprefix("#/definitions/")]
    return node


def chart_objects(node: dict[str, Any] | None = None, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object of the chart's own (written inline, not a shared definition) with its dotted path."""
    node = schema() if node is None else node
    if "$ref" in node or "properties" not in node:
        return
    yield path, node
    for name, child in node["properties"].items():
        yield from chart_objects(child, f"{path}.{name}".lstrip("."))


def leaves() -> set[str]:
    """The dotted path of every value the chart's own objects hold (a shared definition is one value)."""
    objects = dict(chart_objects())
    return {f"{path}.{name}".lstrip(".") for path, node in objects.items() for name in node["properties"]
            if f"{path}.{name}".lstrip(".") not in objects and name != "global"}


def subschema(dotted: str) -> dict[str, Any] | None:
    """The schema of the value at ``dotted`` (list indexes dropped), or ``None`` when the schema has no such key."""
    node = schema()
    for part in re.sub(r"\[\d+\]", "", dotted).split("."):
        node = resolve(node)
        if part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return resolve(node)


# ---- the schema, values.yaml and the templates agree --------------------------------------------


def test_the_schema_is_a_draft_07_schema_every_helm_reads() -> None:
    # draft-07: Helm 4 reads later drafts too, Helm 3 before 3.18 only up to draft-07
    assert schema()["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema())


def test_the_defaults_pass_python_and_helm() -> None:
    defaults = yaml.safe_load(VALUES_PATH.read_text())
    errors = [e.message for e in jsonschema.Draft7Validator(schema()).iter_errors(defaults)]
    assert errors == []
    out = chart.run([chart.helm(), "lint", "--strict", chart.CHART]).stdout
    assert "0 chart(s) failed" in out
    assert chart.helm_template({}).returncode == 0


def test_every_object_of_the_chart_refuses_unknown_keys() -> None:
    for path, node in chart_objects():
        assert node.get("additionalProperties") is False, path or "(top)"


def test_the_schema_has_exactly_the_keys_values_yaml_has() -> None:
    values = yaml.safe_load(VALUES_PATH.read_text())
    for path, node in chart_objects():
        doc = values
        for part in filter(None, path.split(".")):
            doc = doc[part]
        listed = set(node["properties"]) - {"global"}
        assert set(doc) == listed, (path or "(top)", set(doc) ^ listed)


#: ``.Values.a.b`` in a template; ``$x := .Values.a.b`` (then ``$x``, ``$x.c``) names it once more.
READ = re.compile(r"\.Values((?:\.[A-Za-z0-9_]+)+)")
ALIAS = re.compile(r"(\$[A-Za-z0-9_]+)\s*:=\s*\.Values((?:\.[A-Za-z0-9_]+)+)\s*}}")


def template_reads() -> set[str]:
    """Every values path a template reads, aliases followed."""
    out: set[str] = set()
    for path in sorted((chart.CHART / "templates").iterdir()):
        text = path.read_text()
        aliases = {name: target.lstrip(".") for name, target in ALIAS.findall(text)}
        text = ALIAS.sub("}}", text)  # the assignment itself reads nothing: its uses do
        out |= {m.lstrip(".") for m in READ.findall(text)}
        for name, target in aliases.items():
            for rest in re.findall(re.escape(name) + r"((?:\.[A-Za-z0-9_]+)*)\b", text):
                out.add(target + rest)
    return out


def test_the_templates_read_every_key_the_schema_lists_and_no_other() -> None:
    reads, listed = template_reads(), leaves()

    def covers(read: str, leaf: str) -> bool:  # a value read whole, or a part of a value
        return read == leaf or read.startswith(leaf + ".") or leaf.startswith(read + ".")

    assert {r for r in reads if not any(covers(r, leaf) for leaf in listed)} == set(), "read, not in the schema"
    assert {leaf for leaf in listed if not any(covers(r, leaf) for r in reads)} == set(), "in the schema, never read"


def test_the_patterns_are_the_binaries_own() -> None:
    definitions = schema()["definitions"]
    duration_text = definitions["duration"]["anyOf"][1]
    assert duration_text["pattern"] == DURATION_PATTERN
    assert definitions["quantity"]["anyOf"][1]["pattern"] == QUANTITY_PATTERN
    assert resolve(schema()["properties"]["redis"]["properties"]["storage"])["pattern"] == QUANTITY_PATTERN
    assert definitions["dnsSubdomain"]["pattern"] == DNS_SUBDOMAIN_PATTERN
    assert definitions["dnsLabel"]["pattern"] == DNS_LABEL.pattern
    # a standby workload is a profile: the policy's name rule
    assert definitions["standbyWorkload"]["properties"]["name"]["pattern"] == f"^{PROFILE_NAME.pattern}$"
    schemes = "|".join(re.escape(s) for s in REDIS_SCHEMES)
    assert schema()["properties"]["redis"]["properties"]["url"]["pattern"] == f"^$|^({schemes})://.+$"


@pytest.mark.parametrize("name", [
    "nginx", "ghcr.io/example/extender", "localhost:5000/a/b", "Registry.Example.COM/x__y/z--w",
    "vllm/Serve", "a//b", "-a", "ghcr.io/ex/extender x", "caf\u00e9/x", "r.io/a.",
])
def test_the_image_repository_pattern_is_the_policys_reference_check(name: str) -> None:
    # the repository (no tag, no digest) as the policy's image references are checked (extender.core.images)
    try:
        check_reference(name)
        takes = True
    except InvalidValueError:
        takes = False
    pattern = schema()["properties"]["image"]["properties"]["repository"]["pattern"]
    assert (re.search(pattern, name) is not None) == takes


# ---- the schema's verdict is the command's ------------------------------------------------------


def command_verdict(values_file: Path | None, sets: dict[str, str]) -> str | None:
    """Why a container the chart renders with these values (the schema skipped) would not start, or ``None``."""
    flags: list[str | Path] = ["--skip-schema-validation"]
    if values_file is not None:
        flags += ["-f", values_file]
    done = chart.helm_template(sets, check=False, flags=flags)
    if done.returncode != 0:
        return done.stderr.strip()
    for command in chart.containers("chart", [doc for doc, _ in chart.chunks(done.stdout)]):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args: argparse.Namespace = cli.build_parser().parse_args(list(command.args))
        except SystemExit:
            return f"{command.where}: {err.getvalue().strip().splitlines()[-1]}"
        if problem := flag_problem(args, command.environ):
            return f"{command.where}: {problem}"
    return None


def schema_verdict(values_file: Path | None, sets: dict[str, str]) -> str | None:
    """Helm's refusal of these values by the schema, or ``None`` (a refusal for another reason fails the test)."""
    done = chart.helm_template(sets, check=False, flags=["-f", values_file] if values_file else [])
    assert done.returncode == 0 or SCHEMA_FAILED in done.stderr, done.stderr
    return None if done.returncode == 0 else done.stderr.strip()


#: (key, value as YAML, accepted): each value is given from a values file (YAML: numbers are floats)
#: and with ``--set`` (numbers are whole numbers or text).
SPELLINGS: list[Any] = [
    # durations: --max-snapshot-age, --request-budget, --interval, --ttl (arguments.duration: > 0)
    pytest.param("agent.interval", "15", True, id="duration-plain-seconds"),
    pytest.param("agent.interval", "'15s'", True, id="duration-seconds"),
    pytest.param("agent.ttl", "'1h30m'", True, id="duration-compound"),
    pytest.param("agent.ttl", "'1h 30m'", True, id="duration-compound-spaced"),
    pytest.param("extender.requestBudget", "0.5", True, id="duration-fraction"),
    pytest.param("extender.requestBudget", "'250ms'", True, id="duration-milliseconds"),
    pytest.param("extender.maxSnapshotAge", "'2d'", True, id="duration-days"),
    pytest.param("extender.maxSnapshotAge", "999999", True, id="duration-below-a-million"),
    pytest.param("extender.maxSnapshotAge", "0", False, id="duration-zero"),
    pytest.param("extender.maxSnapshotAge", "'0s'", False, id="duration-zero-with-unit"),
    pytest.param("extender.maxSnapshotAge", "'0m0.0s'", False, id="duration-zero-compound"),
    pytest.param("agent.interval", "-5", False, id="duration-negative"),
    pytest.param("agent.interval", "'-5s'", False, id="duration-negative-with-unit"),
    pytest.param("agent.interval", "'5M'", False, id="duration-months-or-minutes"),
    pytest.param("agent.interval", "'1e3'", False, id="duration-exponent"),
    pytest.param("agent.interval", "'NaN'", False, id="duration-nan"),
    pytest.param("agent.interval", "'inf'", False, id="duration-inf"),
    pytest.param("agent.interval", "''", False, id="duration-empty"),
    pytest.param("agent.interval", "'fast'", False, id="duration-word"),
    # workers, threads (arguments.workers, arguments.threads: 1 to 64, 1 to 256)
    pytest.param("extender.workers", "4", True, id="count"),
    pytest.param("extender.workers", "64", True, id="workers-at-the-bound"),
    pytest.param("extender.workers", "65", False, id="workers-past-the-bound"),
    pytest.param("extender.threads", "256", True, id="threads-at-the-bound"),
    pytest.param("extender.threads", "257", False, id="threads-past-the-bound"),
    pytest.param("extender.threads", "0", False, id="count-zero"),
    pytest.param("extender.threads", "-1", False, id="count-negative"),
    pytest.param("extender.workers", "2.5", False, id="count-fraction"),
    pytest.param("extender.workers", "'two'", False, id="count-word"),
    # ports of --bind, --metrics-bind, --listen, --health-listen (arguments.bind_address: 1-65535)
    pytest.param("monitoring.ports.agent", "1", True, id="port-lowest"),
    pytest.param("monitoring.ports.sync", "65535", True, id="port-highest"),
    pytest.param("monitoring.ports.agent", "0", False, id="port-zero"),
    pytest.param("monitoring.ports.sync", "65536", False, id="port-past-the-highest"),
    pytest.param("monitoring.ports.agent", "9465.5", False, id="port-fraction"),
]


def values_file(directory: Path, key: str, text: str) -> Path:
    """A values file setting the dotted ``key`` to ``text``, written as it is (Helm reads the YAML, not us)."""
    *parents, last = key.split(".")
    lines = [f"{'  ' * depth}{part}:" for depth, part in enumerate(parents)]
    path = directory / "values.yaml"
    path.write_text("\n".join([*lines, f"{'  ' * len(parents)}{last}: {text}"]) + "\n")
    return path


@pytest.mark.parametrize(("key", "text", "accepted"), SPELLINGS)
@pytest.mark.parametrize("source", ["values-file", "set"])
def test_the_schema_refuses_what_the_command_refuses(key: str, text: str, accepted: bool, source: str,
                                                     tmp_path: Path) -> None:
    if source == "values-file":
        file: Path | None = values_file(tmp_path, key, text)
        sets: dict[str, str] = {}
    else:
        file, sets = None, {key: str(yaml.safe_load(text))}
    command, checked = command_verdict(file, sets), schema_verdict(file, sets)
    assert (command is None) == accepted, command
    assert (checked is None) == accepted, checked
    if not accepted:
        assert f"at '/{key.replace('.', '/')}'" in str(checked)


#: Values the schema refuses on purpose, and what the command would make of them: Helm's spelling
#: of the number (which no flag parses), or ``None`` (it would start: the schema is stricter there).
STRICTER: list[Any] = [
    # Helm writes a number of a values file from a million up as 1e+06; from --set the same number
    # is printed whole. One schema for both sources: a unit says it shorter ("12d").
    pytest.param("agent.ttl", "1000000", "values-file", "1e+06", id="duration-a-million-from-a-file"),
    pytest.param("agent.ttl", "1000000", "set", None, id="duration-a-million-from-set"),
    # ... and below 0.0001 as 1e-05
    pytest.param("extender.requestBudget", "0.00001", "values-file", "1e-05", id="duration-below-0.0001-from-a-file"),
    # a whole number written as text: the template prints it as it is
    pytest.param("extender.workers", "'4'", "values-file", None, id="count-as-text"),
]


@pytest.mark.parametrize(("key", "text", "source", "spelling"), STRICTER)
def test_what_the_schema_refuses_on_purpose(key: str, text: str, source: str, spelling: str | None,
                                            tmp_path: Path) -> None:
    file, sets = (values_file(tmp_path, key, text), {}) if source == "values-file" else (None, {key: text})
    assert schema_verdict(file, sets) is not None
    rendered = command_verdict(file, sets)
    if spelling is None:
        assert rendered is None
    else:
        assert rendered is not None and spelling in rendered, rendered


# ---- bad values are refused, naming the key -----------------------------------------------------

BAD: list[Any] = [
    # flags the binaries refuse (exit 2): a crash-looping pod
    pytest.param({"extender.maxSnapshotAge": "0"}, "/extender/maxSnapshotAge", id="max-snapshot-age-zero"),
    pytest.param({"extender.requestBudget": "half"}, "/extender/requestBudget", id="request-budget-word"),
    pytest.param({"agent.interval": "-5"}, "/agent/interval", id="agent-interval-negative"),
    pytest.param({"agent.ttl": "0s"}, "/agent/ttl", id="agent-ttl-zero"),
    pytest.param({"extender.workers": "0"}, "/extender/workers", id="workers-zero"),
    pytest.param({"extender.threads": "1.5"}, "/extender/threads", id="threads-fraction"),
    pytest.param({"extender.port": "0"}, "/extender/port", id="extender-port-zero"),
    pytest.param({"monitoring.ports.extender": "65536"}, "/monitoring/ports/extender", id="metrics-port-too-high"),
    # the extender runs as user 65532 without capabilities, on the node's network (self-managed): the
    # kernel refuses it a port below 1024 (net.ipv4.ip_unprivileged_port_start), and serve exits
    pytest.param({"extender.port": "443"}, "/extender/port", id="extender-port-privileged"),
    pytest.param({"monitoring.ports.extender": "80"}, "/monitoring/ports/extender",
                 id="extender-metrics-port-privileged"),
    pytest.param({"metrics.keda.port": "-1"}, "/metrics/keda/port", id="keda-port-negative"),
    pytest.param({"metrics.keda.healthPort": "70000"}, "/metrics/keda/healthPort", id="keda-health-port-too-high"),
    pytest.param({"agent.cachePath": "mnt/nvme"}, "/agent/cachePath", id="cache-path-relative"),
    pytest.param({"agent.cachePathType": "File"}, "/agent/cachePathType", id="cache-path-type-not-a-directory"),
    pytest.param({"agent.hubCaches": "{hf-hub}"}, "/agent/hubCaches/0", id="hub-cache-relative"),
    pytest.param({"agent.criSocket": "containerd.sock"}, "/agent/criSocket", id="cri-socket-relative"),
    pytest.param({"agent.criSocket": "/run/containerd/"}, "/agent/criSocket", id="cri-socket-a-directory"),
    # crictl's spelling: the agent takes it, but the chart mounts the path's directory
    pytest.param({"agent.criSocket": "unix:///run/containerd/containerd.sock"}, "/agent/criSocket",
                 id="cri-socket-an-endpoint"),
    pytest.param({"redis.url": "http://redis:6379"}, "/redis/url", id="redis-url-scheme"),
    # fixed sets the templates choose among
    pytest.param({"mode": "managed"}, "/mode", id="mode"),
    pytest.param({"extender.listen": "0.0.0.0"}, "/extender/listen", id="listen"),
    pytest.param({"metrics.mode": "prometheus"}, "/metrics/mode", id="metrics-mode"),
    pytest.param({"metrics.externalMetrics.certificates": "self-signed"}, "/metrics/externalMetrics/certificates",
                 id="external-metrics-certificates"),
    pytest.param({"metrics.keda.certificates": "none"}, "/metrics/keda/certificates", id="keda-certificates"),
    pytest.param({"redis.mode": "cluster"}, "/redis/mode", id="redis-mode"),
    pytest.param({"image.pullPolicy": "always"}, "/image/pullPolicy", id="pull-policy-case"),
    # what kube-scheduler refuses in its configuration
    pytest.param({"scheduler.weight": "0"}, "/scheduler/weight", id="scheduler-weight-zero"),
    pytest.param({"scheduler.percentageOfNodesToScore": "101"}, "/scheduler/percentageOfNodesToScore",
                 id="percentage-of-nodes-past-100"),
    pytest.param({"scheduler.httpTimeout": "2"}, "/scheduler/httpTimeout", id="http-timeout-without-unit"),
    pytest.param({"scheduler.httpTimeout": "2 s"}, "/scheduler/httpTimeout", id="http-timeout-spaced"),
    pytest.param({"scheduler.gpuResource": "gpu"}, "/scheduler/gpuResource", id="gpu-resource-unqualified"),
    pytest.param({"scheduler.gpuResource": "kubernetes.io/gpu"}, "/scheduler/gpuResource",
                 id="gpu-resource-kubernetes-io"),
    # what Kubernetes refuses, or takes differently from what was meant
    pytest.param({"warmer.namespace": "Extender_Warm"}, "/warmer/namespace", id="namespace-name"),
    pytest.param({"scheduler.schedulerName": "Extender Scheduler"}, "/scheduler/schedulerName", id="scheduler-name"),
    # the cluster's own scheduler's name: both schedulers would take every pod that names none
    pytest.param({"scheduler.schedulerName": "default-scheduler"}, "/scheduler/schedulerName",
                 id="scheduler-name-of-the-cluster"),
    pytest.param({"extender.tls.secretName": "TLS"}, "/extender/tls/secretName", id="secret-name"),
    pytest.param({"redis.storage": "10GB"}, "/redis/storage", id="storage-not-a-quantity"),
    pytest.param({"redis.storage": "0Gi"}, "/redis/storage", id="storage-zero"),
    pytest.param({"extender.resources.requests.cpu": "lots"}, "/extender/resources/requests/cpu",
                 id="cpu-not-a-quantity"),
    pytest.param({"extender.resources.request.cpu": "1"}, "/extender/resources", id="resources-typo"),
    pytest.param({"agent.tolerations[0].efect": "NoSchedule"}, "/agent/tolerations/0", id="toleration-typo"),
    pytest.param({"agent.tolerations[0].effect": "NoSchedul"}, "/agent/tolerations/0/effect", id="toleration-effect"),
    pytest.param({"agent.nodeSelector.gpu": "true"}, "/agent/nodeSelector/gpu", id="node-selector-boolean"),
    pytest.param({"image.repository": "registry.example.com/extender:0.2.0"}, "/image/repository",
                 id="repository-with-tag"),
    pytest.param({"image.tag": "2"}, "/image/tag", id="tag-as-number"),
    pytest.param({"image.digest": "abc123"}, "/image/digest", id="digest"),
    pytest.param({"monitoring.interval": "30"}, "/monitoring/interval", id="scrape-interval-number"),
    pytest.param({"monitoring.runbookBaseUrl": "docs/runbook.md"}, "/monitoring/runbookBaseUrl", id="runbook-url"),
    pytest.param({"metrics.externalMetrics.caBundle": "not base64!"}, "/metrics/externalMetrics/caBundle",
                 id="ca-bundle-not-base64"),
    # standby placeholders (the template checks one value against another: tests/test_chart_standby.py)
    pytest.param({"standby.workloads[0].name": "Qwen3"}, "/standby/workloads/0/name", id="standby-name-uppercase"),
    pytest.param({"standby.workloads[0].name": "a" * 56}, "/standby/workloads/0/name",
                 id="standby-name-past-55-characters"),
    pytest.param({"standby.workloads[0].gpus": "0"}, "/standby/workloads/0/gpus", id="standby-gpus-zero"),
    pytest.param({"standby.workloads[0].gpus": "1.5"}, "/standby/workloads/0/gpus", id="standby-gpus-fraction"),
    pytest.param({"standby.workloads[0].minReplicas": "-1"}, "/standby/workloads/0/minReplicas",
                 id="standby-min-negative"),
    pytest.param({"standby.workloads[0].maxReplicas": "0"}, "/standby/workloads/0/maxReplicas", id="standby-max-zero"),
    pytest.param({"standby.workloads[0].namespace": "LLM"}, "/standby/workloads/0/namespace",
                 id="standby-namespace-name"),
    pytest.param({"standby.workloads[0].replicas": "2"}, "/standby/workloads/0", id="standby-workload-typo"),
    pytest.param({"standby.workloads[0].resources.limit.cpu": "1"}, "/standby/workloads/0/resources",
                 id="standby-resources-typo"),
    # not below every real pod (0): a replica could not preempt a placeholder
    pytest.param({"standby.priorityClass.value": "0"}, "/standby/priorityClass/value", id="standby-priority-zero"),
    pytest.param({"standby.image": "pause 3.10"}, "/standby/image", id="standby-image"),
    pytest.param({"standby.kedaAuthentication.kind": "Secret"}, "/standby/kedaAuthentication/kind",
                 id="standby-keda-authentication-kind"),
    pytest.param({"standby.enabled": "yes"}, "/standby/enabled", id="standby-enabled-text"),
    pytest.param({"standby.behavior.scaleDown.stabilizationWindowSeconds": "7200"},
                 "/standby/behavior/scaleDown/stabilizationWindowSeconds", id="standby-window-past-an-hour"),
    pytest.param({"standby.behavior.scaleUp.policies[0].type": "Replicas"},
                 "/standby/behavior/scaleUp/policies/0/type", id="standby-policy-type"),
    pytest.param({"standby.behavior.scaleUp.stabilisationWindowSeconds": "0"}, "/standby/behavior/scaleUp",
                 id="standby-behavior-typo"),
    # a text where a boolean belongs is always true in a template ("false" too)
    pytest.param({"agent.labelNodes": "yes"}, "/agent/labelNodes", id="label-nodes-text"),
    # keys the chart would otherwise ignore
    pytest.param({"extender.maxSnapshotAg": "30s"}, "/extender", id="typo-in-extender"),
    pytest.param({"sync.replicas": "2"}, "/sync", id="sync-has-no-replicas"),
    pytest.param({"agents.interval": "30s"}, "", id="typo-at-the-top"),
]


@pytest.mark.parametrize(("values", "where"), BAD)
def test_bad_values_are_refused_naming_the_key(values: dict[str, str], where: str) -> None:
    """Helm names the value's place (``at '/agent/interval'``); a key it does not know, by its name
    under its parent (``at '/sync': additional properties 'replicas' not allowed``)."""
    done = chart.helm_template(values, check=False)
    assert done.returncode != 0 and SCHEMA_FAILED in done.stderr, done.stderr
    assert f"at '{where}'" in done.stderr, done.stderr
    (name,) = values
    dotted, parent = re.sub(r"\[(\d+)\]", r".\1", name), where.lstrip("/").replace("/", ".")
    if not parent or dotted.startswith(parent + "."):  # a key refused under its parent: named too
        wrong = dotted.removeprefix(parent).lstrip(".").split(".")[0]
        assert f"'{wrong}'" in done.stderr, done.stderr


@pytest.mark.parametrize("values", [{"agent.labelNodes": "false"}, {"helmLabels": "false"}],
                         ids=["label-nodes", "helm-labels"])
def test_a_boolean_given_as_text_is_refused(values: dict[str, str]) -> None:
    (name, value), = values.items()
    done = chart.run([chart.helm(), "template", "x", chart.CHART, "--set-string", f"{name}={value}"], check=False)
    assert done.returncode != 0 and "want boolean" in done.stderr, done.stderr


# ---- what the docs tell people to run ----------------------------------------------------------


def doc_commands() -> list[tuple[str, list[str]]]:
    """Every ``helm install|upgrade|template`` of the docs' shell blocks, as ``helm template`` arguments."""
    out: list[tuple[str, list[str]]] = []
    for page in DOC_PAGES:
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words[:1] != ["helm"] or words[1:2] not in (["install"], ["upgrade"], ["template"]):
                    continue
                args: list[str] = []
                for i, word in enumerate(words):
                    if word in ("--set", "--set-string"):
                        args += [word, words[i + 1]]
                    elif word == "--set-file":  # the doc's own policy file: the chart's example
                        args += [word, f"policy={chart.CHART / 'policy.yaml'}"]
                out.append((f"{page.name}: {line.strip()[:60]}", args))
    return out


DOC_COMMANDS = doc_commands()


def test_the_docs_have_helm_commands() -> None:
    assert len(DOC_COMMANDS) >= 4


@pytest.mark.parametrize("args", [a for _, a in DOC_COMMANDS], ids=[n for n, _ in DOC_COMMANDS])
def test_every_helm_command_of_the_docs_passes(args: list[str]) -> None:
    chart.run([chart.helm(), "template", "extender", chart.CHART, "--namespace", chart.NAMESPACE, *args])


#: ``--set NAME=VALUE`` and ``--set-string NAME=VALUE`` anywhere in the docs or the chart's comments,
#: and ```NAME=VALUE``` of a value in backquotes.
ASSIGNMENT = re.compile(r"--set(-string)? ([A-Za-z][\w.\[\]]*)=([^\s`]*)|`([a-z][A-Za-z]*(?:\.[A-Za-z]+)+)=([^`\s]+)`")


def doc_assignments() -> list[tuple[str, str, bool]]:
    """``(name, value, as a string)`` of every assignment, once; ``value`` ``None`` for a placeholder."""
    out: dict[tuple[str, str, bool], None] = {}
    for page in [*DOC_PAGES, VALUES_PATH]:
        for m in ASSIGNMENT.finditer(page.read_text()):
            string, name, value = bool(m[1]), m[2] or m[4], m[3] if m[2] else m[5]
            out[(name, value if "..." not in value and "$(" not in value else "", string)] = None
    return list(out)


DOC_ASSIGNMENTS = doc_assignments()


@pytest.mark.parametrize(("name", "value", "string"), DOC_ASSIGNMENTS,
                         ids=[f"{n}={v or 'PLACEHOLDER'}" for n, v, _ in DOC_ASSIGNMENTS])
def test_every_value_the_docs_set_is_a_key_of_the_schema_with_a_valid_value(name: str, value: str,
                                                                               string: bool) -> None:
    assert subschema(name) is not None, f"{name}: no such value in the chart"
    if value:
        done = chart.run([chart.helm(), "template", "x", chart.CHART, "--set-string" if string else "--set",
                          f"{name}={value}"], check=False)
        assert SCHEMA_FAILED not in done.stderr, done.stderr
