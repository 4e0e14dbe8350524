"""The warm executor's pure parts: Job objects, templates, the node-side steps, and the inventory checks.

The test policy (also used by the other ``test_warm_*`` files): one node class ``gpu`` and one
workload ``llm`` with a compile key, weights staged by an object-store sync, compile caches fetched
and published through the registry. Job and Event behaviour against the API double is in
tests/test_warm_executor.py; the end-to-end warm-then-schedule run is tests/test_warm_e2e.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from extender.agent.scan import WeightsEntry, scan_cache
from extender.core.caches import CacheKind, cache_id, compile_key
from extender.core.errors import PolicyError
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy, parse_policy
from extender.core.warming import MAX_EVICTIONS, Action, Eviction
from extender.layout import COMPLETE, MANIFEST, weights_dir, write_manifest
from extender.warm.checks import node_warm, present, unsafe_evictions
from extender.warm.executor import retry_delay
from extender.warm.jobspec import (
    ACTION_ANNOTATION,
    PLACEHOLDER_HELPER_IMAGE,
    SELECTOR,
    JobView,
    Publish,
    action_job,
    event,
    job_name,
    publish_job,
    publish_job_name,
    read_job,
)
from extender.warm.loop import WarmLoop
from extender.warm.publish import candidates, unpublished
from extender.warm.steps import (
    NAME_MAX,
    TOMB,
    StepError,
    cache_path,
    evict,
    finish,
    prepare,
    staging_name,
    staging_path,
    tomb_name,
)
from extender.warm.templates import env_name, render
from tests.gpu_policy import GPU_LLM_POLICY
from tests.test_agent_scan import fifo_after_listing, sparse, without_hanging

GB = 10**9
NOW = 1_700_000_000.0
POLICY = GPU_LLM_POLICY + """\
  - name: old
    match: {labels: {app: old}}
    image: {reference: "example.com/old:1", size: 10GB}
    weights: {source: "s3://models/old/", version: v0, bytes: 400GB}
    parallelism: {tensor: 8}
warming:
  enabled: true
  registry: s3://compile-cache/prod
  evictAfterIdle: 10m
  templates:
    weights:
      image: amazon/aws-cli:2
      command: [aws, s3, sync, --only-show-errors, "{{source}}", "{{ staging }}"]
      envFromSecrets: [object-store]
    compile:
      image: amazon/aws-cli:2
      command: [sh, -c, 'aws s3 cp "{{registry}}/{{key}}.tar" - | tar -x -C "$WARM_STAGING"']
    publishCompile:
      image: amazon/aws-cli:2
      command: [sh, -c, 'tar -C "{{dir}}" -c . | aws s3 cp - "{{registry}}/{{key}}.tar"']
"""


def load(text: str = POLICY, **warming: Any) -> Policy:
    """The test policy, with warming knobs replaced (camelCase, as in a file)."""
    policy = parse_policy(text)
    if not warming:
        return policy
    data = policy.warming.model_dump(by_alias=True, exclude_unset=True)
    data.update(warming)
    return policy.model_copy(update={"warming": type(policy.warming).model_validate(data)})


BASE = load()


def _llm_key() -> str:
    key = compile_key(BASE.profile("llm"), BASE.node_class("gpu"))
    assert key is not None
    return key


#: llm's compile-cache key on class gpu.
LLM_KEY = _llm_key()


def node(name: str, *, now: float = NOW, **fields: Any) -> NodeState:
    """A fresh gpu node, empty unless ``fields`` (camelCase NodeState fields) say otherwise."""
    doc: dict[str, Any] = {"name": name, "labels": {"pool": "gpu"}, "gpus": 8, "gpusFree": 8,
                           "nvmeTotal": 1000 * GB, "nvmeFree": 900 * GB, "heartbeat": now - 1}
    doc.update(fields)
    return NodeState.model_validate(doc)


def action(kind: CacheKind = "weights", node_name: str = "gpu-a", *, evictions: tuple[Eviction, ...] = (),
           workload: str = "llm") -> Action:
    cache = {"image": "image:example.com/llm:1", "weights": "weights:llm/v1", "compile": f"compile:{LLM_KEY}",
             "snapshot": "snapshot:llm/v1"}[kind]
    return Action(node=node_name, workload=workload, kind=kind, cache=cache, bytes=100 * GB, nvme_bytes=100 * GB,
                  duration_s=10.0, deadline=NOW + 600, saved_s=5.0, purpose="demand", evictions=evictions)


# ---------------------------------------------------------------------------------------------
# Job names
# ---------------------------------------------------------------------------------------------


class NameCase(NamedTuple):
    id: str
    kind: str
    node: str
    cache: str


NAME_CASES = [
    NameCase("plain", "weights", "gpu-a", "weights:llm/v1"),
    NameCase("dots and capitals in the node name", "image", "ip-10-0-1-2.EC2.internal", "image:example.com/llm:1"),
    NameCase("a node name longer than the Job name allows", "snapshot", "n" * 250, "snapshot:llm/v1"),
    NameCase("a node name of symbols only", "compile", "...", f"compile:{LLM_KEY}"),
]


@pytest.mark.parametrize("case", NAME_CASES, ids=[c.id for c in NAME_CASES])
def test_job_names_are_stable_valid_and_at_most_63_characters(case: NameCase) -> None:
    name = job_name(case.kind, case.node, case.cache)
    assert name == job_name(case.kind, case.node, case.cache)  # re-planning names the same Job
    assert len(name) <= 63
    assert name.startswith(f"warm-{case.kind}-")
    assert all((c.isalnum() and c.islower()) or c.isdigit() or c == "-" for c in name)
    assert not name.endswith("-")


def test_job_names_differ_by_node_and_by_cache() -> None:
    names = {job_name("weights", n, c) for n in ("gpu-a", "gpu-b") for c in ("weights:llm/v1", "weights:llm/v2")}
    assert len(names) == 4
    # two nodes whose names only differ beyond the shortened part still get distinct names
    assert job_name("image", "n" * 100 + "a", "image:x") != job_name("image", "n" * 100 + "b", "image:x")
    assert publish_job_name("k1") != publish_job_name("k2")


# ---------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------


def test_render_fills_placeholders_and_leaves_shell_variables_alone() -> None:
    values = {"source": "s3://m/", "staging": "/cache/weights/llm/.v1.warming"}
    assert render('aws s3 sync {{source}} "{{ staging }}" && echo ${HOME} $X', values) == \
        'aws s3 sync s3://m/ "/cache/weights/llm/.v1.warming" && echo ${HOME} $X'
    assert env_name("cacheRoot") == "WARM_CACHE_ROOT"
    assert env_name("node") == "WARM_NODE"


#: Values that a shell would take for syntax if they were pasted into a script as text.
HOSTILE_VALUES = [
    ("quote and semicolon", "x'; touch pwned; echo '"),
    ("double quote and semicolon", 'x"; touch pwned; echo "'),
    ("command substitution", "$(touch pwned)"),
    ("backticks", "`touch pwned`"),
    ("variable", "${HOME}"),
    ("glob", "*"),
    ("spaces", "a  b   c"),
    ("trailing backslash", "x\\"),
    ("newline", "line1\ntouch pwned"),
    ("plain", "s3://models/llm/"),
]
#: A shell script in every quoting context a placeholder can stand in.
SCRIPTS = [
    ("unquoted", "printf %s {{source}} > out"),
    ("double quoted", 'printf %s "{{source}}" > out'),
    ("single quoted", "printf %s '{{source}}' > out"),
    ("inside a longer word", 'printf %s "[{{source}}]"/{{source}} > out'),
]


@pytest.mark.parametrize("value", [v for _, v in HOSTILE_VALUES], ids=[i for i, _ in HOSTILE_VALUES])
@pytest.mark.parametrize("script", [s for _, s in SCRIPTS], ids=[i for i, _ in SCRIPTS])
@pytest.mark.parametrize("shape", ["command", "args", "bash -ec"])
def test_a_shell_script_gets_each_value_as_data_never_as_code(tmp_path: Path, value: str, script: str,
                                                             shape: str) -> None:
    from extender.core.policy import StepTemplate
    from extender.warm.templates import container

    if shape == "command":
        template = StepTemplate(image="x", command=("sh", "-c", script))
    elif shape == "args":
        template = StepTemplate(image="x", command=("/bin/sh",), args=("-c", script))
    else:
        template = StepTemplate(image="x", command=("bash", "-ec", script))
    spec = container("fetch", template, {"source": value, "staging": "/cache/s"})
    argv = [*spec["command"], *spec.get("args", [])]
    env = {"PATH": os.environ["PATH"], **{e["name"]: e["value"] for e in spec["env"]}}
    subprocess.run(argv, cwd=tmp_path, env=env, check=True, timeout=30)
    expected = script.replace("printf %s ", "").replace(" > out", "").replace("'", "").replace('"', "")
    assert (tmp_path / "out").read_text() == expected.replace("{{source}}", value)
    assert not (tmp_path / "pwned").exists()


def test_an_exec_form_command_gets_each_value_as_one_argument() -> None:
    from extender.core.policy import StepTemplate
    from extender.warm.templates import container

    template = StepTemplate(image="x", command=("aws", "s3", "sync", "{{source}}", "{{staging}}/"))
    spec = container("fetch", template, {"source": "a b'c", "staging": "/cache/s"})
    assert spec["command"] == ["aws", "s3", "sync", "a b'c", "/cache/s/"]


class BadTemplate(NamedTuple):
    id: str
    template: str
    path: str
    message: str


BAD_TEMPLATES = [
    BadTemplate("unknown name", 'weights: {image: x, command: [cp, "{{srce}}", "{{staging}}"]}',
                "warming.templates.weights.command[1]", "unknown placeholder(s) srce"),
    BadTemplate("a name of another kind", 'compile: {image: x, command: [get, "{{source}}"]}',
                "warming.templates.compile.command[1]", "unknown placeholder(s) source"),
    BadTemplate("in the image", 'weights: {image: "{{tag}}", command: [x]}',
                "warming.templates.weights.image", "unknown placeholder(s) tag"),
    BadTemplate("in env", 'publishCompile: {image: x, command: [x], env: {DEST: "{{staging}}"}}',
                "warming.templates.publishCompile.env.DEST", "unknown placeholder(s) staging"),
    BadTemplate("a brace that is not a placeholder", 'weights: {image: x, command: ["{{ 1 }}"]}',
                "warming.templates.weights.command[0]", "not a {{name}} placeholder"),
    BadTemplate("a here-document before a placeholder", 'weights: {image: x, command: [sh, -c, '
                '"cat <<EOF\\nit\'s\\nEOF\\naws s3 sync {{source}} {{staging}}"]}',
                "warming.templates.weights.command[2]", "a here-document (<<) in a shell script"),
    BadTemplate("a here-document in args", 'weights: {image: x, command: [bash], args: [-ec, '
                '"cat > f <<-X\\n{{source}}\\nX"]}', "warming.templates.weights.args[1]", "here-document"),
    BadTemplate("a here-document after arithmetic", 'weights: {image: x, command: [sh, -c, '
                '"echo $((1+(2))); cat <<EOF\\n{{source}}\\nEOF"]}', "warming.templates.weights.command[2]",
                "here-document"),
]


class Commented(NamedTuple):
    id: str
    script: str
    printed: str


#: Scripts whose comments hold quotes: a comment opens no quote, so the placeholders after it are still data.
COMMENTED = [
    Commented("an apostrophe in a comment line", "# don't touch\nprintf '<%s>' {{source}}", "<x y'z>"),
    Commented("a double quote in a trailing comment", 'true # say "hi\nprintf \'<%s>\' "{{source}}"', "<x y'z>"),
    Commented("a placeholder inside a comment", "# {{source}} it's\nprintf '<%s>' {{source}}", "<x y'z>"),
    Commented("a # inside a word is no comment", "printf '<%s>' a#'{{source}}'", "<a#x y'z>"),
]


#: Arithmetic expansions: their ``<<`` is a shift, not a here-document, and the script is accepted.
ARITHMETIC = [
    Commented("a shift", "printf '<%s>' $((1<<2)) {{source}}", "<4><x y'z>"),
    Commented("a shift in double quotes", "printf '<%s>' \"$((1<<2))\" {{source}}", "<4><x y'z>"),
    Commented("nested parentheses", "printf '<%s>' $(((1+1)<<2)) {{source}}", "<8><x y'z>"),
]


@pytest.mark.parametrize("case", ARITHMETIC, ids=[c.id for c in ARITHMETIC])
def test_a_shift_in_arithmetic_is_no_here_document(case: Commented) -> None:
    text = POLICY.split("warming:", maxsplit=1)[0] + "warming:\n  templates:\n    weights: " + json.dumps(
        {"image": "x", "command": ["sh", "-c", case.script]}) + "\n"
    assert parse_policy(text).warming.templates.weights is not None


@pytest.mark.parametrize("case", COMMENTED + ARITHMETIC, ids=[c.id for c in COMMENTED + ARITHMETIC])
def test_quotes_in_comments_do_not_change_the_quoting_of_placeholders(tmp_path: Path, case: Commented) -> None:
    from extender.warm.templates import render_argv

    argv = render_argv(["sh", "-c", case.script], {"source": "x y'z"})
    out = subprocess.run(argv, env={**os.environ, "WARM_SOURCE": "x y'z"}, capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout == case.printed


@pytest.mark.parametrize("case", BAD_TEMPLATES, ids=[c.id for c in BAD_TEMPLATES])
def test_template_placeholders_are_checked_when_the_policy_loads(case: BadTemplate) -> None:
    text = POLICY.split("warming:", maxsplit=1)[0] + "warming:\n  templates:\n    " + case.template + "\n"
    with pytest.raises(PolicyError) as excinfo:
        parse_policy(text)
    (problem,) = excinfo.value.problems
    assert problem.path == case.path
    assert case.message in problem.message


def test_published_snapshots_must_name_a_profile_with_a_snapshot_and_a_class() -> None:
    text = POLICY + "  publishedSnapshots: [{workload: llm, nodeClass: gpu}, {workload: nope, nodeClass: cpu}]\n"
    with pytest.raises(PolicyError) as excinfo:
        parse_policy(text)
    assert {(p.path, p.message) for p in excinfo.value.problems} == {
        ("warming.publishedSnapshots[0].workload", "profile 'llm' declares no snapshot"),
        ("warming.publishedSnapshots[1].workload", "no profile 'nope'"),
        ("warming.publishedSnapshots[1].nodeClass", "no node class 'cpu'"),
    }


def test_a_snapshot_published_for_a_class_its_profile_does_not_run_on_is_an_error() -> None:
    path = Path(__file__).resolve().parents[1] / "scenarios/flagship-policy.yaml"
    good = "    - {workload: gemma2-27b, nodeClass: g6e-4}\n"
    text = path.read_text()
    assert good in text
    with pytest.raises(PolicyError) as excinfo:
        parse_policy(text.replace(good, "    - {workload: gemma2-27b, nodeClass: l4-1}\n"), "flagship-policy.yaml")
    (problem,) = excinfo.value.problems
    # the thirteenth entry: three each for the four models that run on every class come first
    assert (problem.line, problem.path) == (text[:text.index(good)].count("\n") + 1,
                                            "warming.publishedSnapshots[12].nodeClass")
    assert problem.message == "profile 'gemma2-27b' does not run on node class 'l4-1' (its nodeClasses)"


# ---------------------------------------------------------------------------------------------
# Job objects
# ---------------------------------------------------------------------------------------------


def _containers(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    pod = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


class HelperRow(NamedTuple):
    id: str
    policy: str | None  # warming.helperImage
    flag: str | None  # extender scale --warm-helper-image
    image: str  # what the Job's prepare and finish steps run


HELPER_ROWS = [
    HelperRow("the-flag-fills-an-unset-policy", None, "registry.example.com/extender:0.2.0",
              "registry.example.com/extender:0.2.0"),
    HelperRow("the-policy-wins", "mirror.example.com/extender:0.1.9", "registry.example.com/extender:0.2.0",
              "mirror.example.com/extender:0.1.9"),
    HelperRow("the-policy-alone", "mirror.example.com/extender:0.1.9", None, "mirror.example.com/extender:0.1.9"),
    HelperRow("neither-the-placeholder", None, None, PLACEHOLDER_HELPER_IMAGE),
]


@pytest.mark.parametrize("row", HELPER_ROWS, ids=[r.id for r in HELPER_ROWS])
def test_the_helper_image_comes_from_the_policy_else_the_scaler(row: HelperRow,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    policy = load(helperImage=row.policy, enabled=True)
    loop = WarmLoop(policy, None, None, helper_image=row.flag)
    loop.set_policy(load(helperImage=row.policy, enabled=True, namespace="other"))  # a reload is completed too
    job = action_job(loop.policy, action("weights"), attempt=1, node_class="gpu")
    assert loop.policy.warming.namespace == "other"
    assert {c["image"] for n, c in _containers(job).items() if n != "fetch"} == {row.image}
    told = [r for r in caplog.records if "placeholder" in r.getMessage()]
    assert len(told) == (1 if row.image == PLACEHOLDER_HELPER_IMAGE else 0)  # once, not on every reload


def test_a_weights_job_is_pinned_low_priority_tolerant_limited_and_expires() -> None:
    victim = Eviction(node="gpu-a", cache="weights:old/v0", bytes=400 * GB, last_used=NOW - 7200)
    a = action("weights", evictions=(victim,))
    job = action_job(BASE, a, attempt=3, node_class="gpu")
    meta, spec = job["metadata"], job["spec"]
    pod = spec["template"]["spec"]
    assert meta["name"] == job_name("weights", "gpu-a", "weights:llm/v1")
    assert meta["namespace"] == "extender-warm"
    assert meta["labels"] == {"app.kubernetes.io/managed-by": "extender-warmer", "extender.io/warm-kind": "weights",
                              "extender.io/warm-workload": "llm"}
    assert SELECTOR == "app.kubernetes.io/managed-by=extender-warmer"
    assert Action.model_validate_json(meta["annotations"][ACTION_ANNOTATION]) == a
    assert meta["annotations"]["extender.io/warm-attempt"] == "3"
    # the Job: bounded retries and runtime, cleaned up after it finishes
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (1, 7200, 3600)
    # the pod: through the scheduler, on exactly this node
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]}]}
    assert "nodeName" not in pod
    assert pod["priorityClassName"] == "extender-warm"
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "extender.io/warming", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}  # not unconfined
    assert pod["volumes"] == [{"name": "cache", "hostPath": {"path": "/mnt/nvme/extender-cache", "type": "Directory"}}]
    containers = _containers(job)
    assert list(containers) == ["prepare", "fetch", "finish"]  # init: prepare, fetch; then finish
    for c in containers.values():
        assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                  "limits": {"cpu": "2", "memory": "4Gi"}}
        assert c["volumeMounts"] == [{"name": "cache", "mountPath": "/cache"}]
    assert containers["prepare"]["image"] == containers["finish"]["image"] == "ghcr.io/example/extender:0.1.0"
    # only flags every release's helper knows (warming.helperImage may pin an older one); the bound on
    # abandoned staging directories, activeDeadline 2h + retry.max 30m, travels in the environment
    assert containers["prepare"]["command"] == ["extender", "warm", "prepare", "--root", "/cache",
                                                "--cache", "weights:llm/v1", "--evict", "weights:old/v0"]
    assert containers["prepare"]["env"] == [{"name": "WARM_ABANDONED_AFTER", "value": "9000"}]
    assert containers["finish"]["command"] == ["extender", "warm", "finish", "--root", "/cache",
                                               "--cache", "weights:llm/v1", "--source", "s3://models/llm/"]
    fetch = containers["fetch"]
    assert fetch["image"] == "amazon/aws-cli:2"
    assert fetch["command"] == ["aws", "s3", "sync", "--only-show-errors", "s3://models/llm/",
                                "/cache/weights/llm/.v1.warming"]
    assert fetch["envFrom"] == [{"secretRef": {"name": "object-store"}}]
    env = {e["name"]: e["value"] for e in fetch["env"]}
    assert env["WARM_STAGING"] == "/cache/weights/llm/.v1.warming"
    assert env["WARM_DEST"] == "/cache/weights/llm/v1"
    assert env["WARM_NODE_CLASS"] == "gpu"
    assert env["WARM_VERSION"] == "v1"


def test_an_image_job_runs_the_workloads_own_image_with_a_no_op() -> None:
    job = action_job(BASE, action("image"))
    pod = job["spec"]["template"]["spec"]
    assert "initContainers" not in pod and "volumes" not in pod
    (pull,) = pod["containers"]
    assert (pull["image"], pull["imagePullPolicy"], pull["command"]) == ("example.com/llm:1", "IfNotPresent", ["true"])
    assert pull["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}


def expand(container: dict[str, Any], script: str) -> str:
    """What the shell makes of the ``${WARM_...}`` references a rendered script holds."""
    env = {e["name"]: e["value"] for e in container["env"]}
    return re.sub(r"\$\{(WARM_[A-Z_]+)\}", lambda m: env[m.group(1)], script)


def test_a_compile_job_fetches_the_key_from_the_registry() -> None:
    fetch = _containers(action_job(BASE, action("compile"), node_class="gpu"))["fetch"]
    assert fetch["command"][:2] == ["sh", "-c"]
    assert expand(fetch, fetch["command"][2]) == \
        f'aws s3 cp "s3://compile-cache/prod/{LLM_KEY}.tar" - | tar -x -C "$WARM_STAGING"'


def test_a_snapshot_job_fetches_the_weights_version_s_snapshot() -> None:
    text = POLICY + """\
    snapshot:
      image: amazon/aws-cli:2
      command: [aws, s3, sync, "{{registry}}/snapshots/{{nodeClass}}/{{workload}}/{{version}}/", "{{staging}}"]
"""
    fetch = _containers(action_job(load(text), action("snapshot"), node_class="gpu"))["fetch"]
    assert fetch["command"] == ["aws", "s3", "sync", "s3://compile-cache/prod/snapshots/gpu/llm/v1/",
                                "/cache/snapshots/llm/.v1.warming"]
    env = {e["name"]: e["value"] for e in fetch["env"]}
    assert (env["WARM_VERSION"], env["WARM_DEST"]) == ("v1", "/cache/snapshots/llm/v1")


def test_a_kind_without_a_template_has_no_job() -> None:
    with pytest.raises(ValueError, match="snapshot"):
        action_job(BASE, action("snapshot"))


def test_knobs_reach_the_job() -> None:
    policy = load(priorityClassName=None, serviceAccountName="warm-s3", namespace="caches",
                  tolerations=[{"operator": "Exists"}], resources={"requests": {"cpu": "1"}, "limits": {}},
                  ttlAfterFinished="10m", activeDeadline="30m", retry={"podRetries": 0},
                  imagePullCommand=["/bin/sh", "-c", "exit 0"], newNodes={"taint": {"key": "x/warm"}})
    job = action_job(policy, action("image"))
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == "caches"
    assert "priorityClassName" not in pod and pod["serviceAccountName"] == "warm-s3"
    assert pod["tolerations"] == [{"operator": "Exists"}, {"key": "x/warm", "operator": "Exists",
                                                           "effect": "NoSchedule"}]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "1"}, "limits": {}}
    assert pod["containers"][0]["command"] == ["/bin/sh", "-c", "exit 0"]
    assert (job["spec"]["ttlSecondsAfterFinished"], job["spec"]["activeDeadlineSeconds"],
            job["spec"]["backoffLimit"]) == (600, 1800, 0)


def test_a_publish_job_mounts_the_cache_read_only() -> None:
    p = Publish(key=LLM_KEY, node="gpu-b", workload="llm", node_class="gpu", bytes=GB)
    job = publish_job(BASE, p, attempt=2)
    (upload,) = job["spec"]["template"]["spec"]["containers"]
    assert job["metadata"]["name"] == publish_job_name(LLM_KEY)
    assert upload["volumeMounts"] == [{"name": "cache", "mountPath": "/cache", "readOnly": True}]
    assert expand(upload, upload["command"][-1]) == f'tar -C "/cache/compile/{LLM_KEY}" -c . | aws s3 cp - ' \
                                                   f'"s3://compile-cache/prod/{LLM_KEY}.tar"'
    view = read_job({**job, "metadata": {**job["metadata"], "uid": "u"}})
    assert view is not None and view.publish == p and view.attempt == 2 and view.kind == "publish"


# ---------------------------------------------------------------------------------------------
# Reading Jobs back
# ---------------------------------------------------------------------------------------------


def _with_status(job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {**job, "metadata": {**job["metadata"], "uid": "0123456789abcdef"}, "status": status}


STATES = [
    ("no status yet", {}, "active", None, ""),
    ("running", {"active": 1}, "active", None, ""),
    ("complete", {"succeeded": 1, "completionTime": "2023-11-14T22:13:30Z",
                  "conditions": [{"type": "Complete", "status": "True"}]}, "succeeded", 1_700_000_010.0, ""),
    ("failed", {"failed": 2, "conditions": [
        {"type": "FailureTarget", "status": "True", "lastTransitionTime": "2023-11-14T22:13:25Z"},
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the "
         "specified backoff limit", "lastTransitionTime": "2023-11-14T22:13:30Z"}]},
     "failed", 1_700_000_010.0, "BackoffLimitExceeded"),
    ("a condition that is not true does not count", {"conditions": [{"type": "Failed", "status": "False"}]},
     "active", None, ""),
]


@pytest.mark.parametrize(("status", "state", "finished", "reason"), [s[1:] for s in STATES],
                         ids=[s[0] for s in STATES])
def test_read_job(status: dict[str, Any], state: str, finished: float | None, reason: str) -> None:
    a = action("weights")
    view = read_job(_with_status(action_job(BASE, a), status))
    assert view is not None
    assert (view.state, view.finished_at, view.reason) == (state, finished, reason)
    assert view.action == a and view.key == ("gpu-a", "weights:llm/v1") and view.node == "gpu-a"


def test_a_job_without_our_annotations_is_not_read() -> None:
    job = action_job(BASE, action("image"))
    job["metadata"]["annotations"][ACTION_ANNOTATION] = "{not json"
    assert read_job(job) is None
    del job["metadata"]["annotations"][ACTION_ANNOTATION]
    assert read_job(job) is None


@pytest.mark.parametrize("attempt", [
    pytest.param("x", id="a-word"),
    # Python's int() read these as attempts; the warmer writes ASCII digits
    pytest.param("1_0", id="an-underscore"),
    pytest.param("\u0663", id="arabic-indic-digit"),
    pytest.param("\uff13", id="full-width-digit"),
])
def test_a_job_whose_attempt_is_no_number_is_not_read(attempt: str) -> None:
    job = action_job(BASE, action("image"), attempt=3)
    assert read_job(job) is not None
    job["metadata"]["annotations"]["extender.io/warm-attempt"] = attempt
    assert read_job(job) is None


def test_one_event_name_per_failed_job_and_reason() -> None:
    view = read_job(_with_status(action_job(BASE, action()), {}))
    assert isinstance(view, JobView)
    e = event(view, reason="WarmJobFailed", message="x" * 5000, now=NOW, instance="scaler-0")
    assert e["metadata"]["name"] == f"{view.name}.01234567.warmjobfailed"
    assert e["involvedObject"] == {"apiVersion": "batch/v1", "kind": "Job", "name": view.name,
                                   "namespace": "extender-warm", "uid": "0123456789abcdef"}
    assert (e["type"], e["reason"], len(e["message"])) == ("Warning", "WarmJobFailed", 1024)
    assert e["firstTimestamp"] == "2023-11-14T22:13:20Z"


# retry after initial * 2**(attempt-1), capped: 30, 60, 120, ... 1800
@pytest.mark.parametrize(("attempt", "delay"), [(1, 30.0), (2, 60.0), (3, 120.0), (7, 1800.0), (500, 1800.0)])
def test_retry_delay_doubles_up_to_the_cap(attempt: int, delay: float) -> None:
    assert retry_delay(BASE.warming.retry, attempt) == delay


# ---------------------------------------------------------------------------------------------
# The steps a Job runs on its node
# ---------------------------------------------------------------------------------------------


def test_weights_land_whole_or_not_at_all(tmp_path: Path) -> None:
    staging = prepare(tmp_path, "weights:llm/v1")
    assert staging == staging_path(tmp_path, "weights:llm/v1") == tmp_path / "weights" / "llm" / ".v1.warming"
    for i in range(3):
        sparse(staging / f"model-{i}.safetensors", GB)
    assert scan_cache(tmp_path).weights == ()  # staging is invisible to the agent
    dest = finish(tmp_path, "weights:llm/v1", source="s3://models/llm/")
    assert dest == weights_dir(tmp_path, "llm", "v1") and not staging.exists()
    (entry,) = scan_cache(tmp_path).weights
    assert (entry.key, entry.bytes, entry.complete) == ("llm/v1", 3 * GB, True)


def test_a_partial_download_is_resumed_not_fetched_again(tmp_path: Path) -> None:
    dest = weights_dir(tmp_path, "llm", "v1")
    sparse(dest / "a.safetensors", 100)
    (dest / MANIFEST).write_bytes(b"{}")  # a stale manifest (without .complete, nothing serves it)
    staging = prepare(tmp_path, "weights:llm/v1")
    assert (staging / "a.safetensors").stat().st_size == 100
    assert not (staging / COMPLETE).exists() and not (staging / MANIFEST).exists()
    assert prepare(tmp_path, "weights:llm/v1") == staging  # a second attempt resumes the same staging
    sparse(staging / "b.safetensors", 50)
    finish(tmp_path, "weights:llm/v1")
    (entry,) = scan_cache(tmp_path).weights
    assert (entry.bytes, entry.complete) == (150, True)


def _no_marker(at: Path) -> None:
    pass


def _dangling_link(at: Path) -> None:
    at.symlink_to(at.parent / "absent")


def _link_to_a_file(at: Path) -> None:
    (at.parent.parent / "elsewhere").write_bytes(b"")
    at.symlink_to(at.parent.parent / "elsewhere")


MARKERS = [
    pytest.param(lambda at: at.write_bytes(b""), True, id="a regular .complete: left in service"),
    pytest.param(_no_marker, False, id="no .complete: moved into staging"),
    # prepare judged the marker by lstat alone, so each of these kept an entry the agent calls
    # partial in place, and the fetch started over in an empty staging directory
    pytest.param(lambda at: at.mkdir(), False, id="a directory .complete: moved into staging"),
    pytest.param(_dangling_link, False, id="a dangling link .complete: moved into staging"),
    pytest.param(_link_to_a_file, False, id="a link to a file .complete: moved into staging"),
    pytest.param(os.mkfifo, False, id="a FIFO .complete: moved into staging"),
]


@pytest.mark.parametrize(("make", "marked"), MARKERS)
def test_a_complete_weights_entry_stays_in_service_while_it_is_fetched_again(
        tmp_path: Path, make: Callable[[Path], object], marked: bool) -> None:
    """prepare moved a complete entry into staging too, taking it away for the whole fetch. What is
    complete is what the agent says is: the two read the marker alike."""
    dest = weights_dir(tmp_path, "llm", "v1")
    sparse(dest / "a.safetensors", 100)
    write_manifest(dest, [("a.safetensors", 100)])
    make(dest / COMPLETE)
    assert [w.complete for w in scan_cache(tmp_path).weights] == [marked]
    staging = prepare(tmp_path, "weights:llm/v1")
    assert (dest / "a.safetensors").exists() is marked
    assert sorted(p.name for p in staging.iterdir()) == ([] if marked else ["a.safetensors"])
    sparse(staging / "b.safetensors", 50)
    finish(tmp_path, "weights:llm/v1")
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [COMPLETE, MANIFEST, "b.safetensors"] + ([] if marked else ["a.safetensors"]))
    assert (dest / COMPLETE).is_file() and not (dest / COMPLETE).is_symlink()


def test_evictions_happen_before_staging_and_are_atomic(tmp_path: Path) -> None:
    old = weights_dir(tmp_path, "old", "v0")
    sparse(old / "x", 10)
    sparse(cache_path(tmp_path, f"compile:{LLM_KEY}") / "k", 10)
    prepare(tmp_path, "snapshot:llm/v1", ["weights:old/v0", "snapshot:absent/v1"])
    assert not old.exists()
    assert [p.name for p in (tmp_path / "weights" / "old").iterdir()] == []  # no tombstone left behind
    assert evict(tmp_path, f"compile:{LLM_KEY}") is True
    assert evict(tmp_path, f"compile:{LLM_KEY}") is False


def test_compile_and_snapshot_entries(tmp_path: Path) -> None:
    sparse(prepare(tmp_path, f"compile:{LLM_KEY}") / "inductor" / "a.py", 10)
    finish(tmp_path, f"compile:{LLM_KEY}")
    sparse(prepare(tmp_path, "snapshot:llm/v1") / "pages.img", 10)
    finish(tmp_path, "snapshot:llm/v1")
    result = scan_cache(tmp_path)
    assert (result.compile_keys, result.snapshots) == ((LLM_KEY,), ("llm/v1",))


# A step killed halfway through deleting an evicted tree (preempted: warm Jobs are the first to go)
# leaves its tomb. The next ``prepare`` on the node deletes every tomb, and an eviction of an entry
# whose earlier tomb is still there works: the step runs as PID 1 of its container every time, so
# the old helper named both tombs ``.<name>.evicting-1`` and the rename failed at every retry.
KILL_MID_EVICTION = """
import os, sys
from extender.warm.steps import prepare
real_unlink, deleted = os.unlink, []
def unlink(*args, **kwargs):
    if len(deleted) == 5:
        os._exit(137)  # killed: no finally, no cleanup
    deleted.append(args)
    real_unlink(*args, **kwargs)
os.unlink = unlink
prepare(__import__("pathlib").Path(sys.argv[1]), "snapshot:llm/v1", ["weights:old/v0"])
"""


class Tomb(NamedTuple):
    id: str
    tomb: str  # below the cache root: what a killed eviction left ("" when a real kill makes it)
    evict: tuple[str, ...]  # what the next prepare evicts
    recreate: str = ""  # an entry fetched again meanwhile, below the cache root


TOMBS = [
    Tomb("a step killed while deleting (a real process)", "", ()),
    Tomb("left by the old helper as PID 1", "weights/old/.v0.evicting-1", ()),
    Tomb("the next eviction of the same entry, by the same PID", f"weights/old/.v0.evicting-{os.getpid()}",
         ("weights:old/v0",), recreate="weights/old/v0"),
    Tomb("a compile key's", f"compile/.{LLM_KEY}.evicting-7-0a1b2c3d", ()),
    Tomb("a snapshot's", "snapshots/llm/.v0.evicting-1-ff", ()),
    Tomb("an adapter's", "adapters/llm/.sql.evicting-12", ()),
]


@pytest.mark.parametrize("case", TOMBS, ids=[c.id for c in TOMBS])
def test_a_killed_eviction_leaves_no_tomb_after_the_next_prepare(tmp_path: Path, case: Tomb) -> None:
    kept = {"weights/llm/v1/a": 10, "weights/llm/.v2.warming/b": 10, f"compile/{LLM_KEY}/c": 10}
    for name, size in kept.items():  # an entry and another Job's staging are not tombs
        sparse(tmp_path / name, size)
    if case.tomb:
        for i in range(3):
            sparse(tmp_path / case.tomb / "sub" / f"f{i}", 10)
    else:
        for i in range(20):
            sparse(tmp_path / "weights" / "old" / "v0" / f"f{i}", 10)
        done = subprocess.run([sys.executable, "-c", KILL_MID_EVICTION, str(tmp_path)], check=False)
        assert done.returncode == 137
        (tomb,) = (tmp_path / "weights" / "old").iterdir()
        assert tomb.name.startswith(".v0.evicting-") and any(tomb.iterdir())  # the kill left it half deleted
    if case.recreate:
        sparse(tmp_path / case.recreate / "g", 10)
    prepare(tmp_path, "snapshot:llm/v3", list(case.evict))
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(kept)
    assert not any(".evicting" in p.name for p in tmp_path.rglob("*"))


class Staged(NamedTuple):
    id: str
    staging: str  # below the cache root: a staging directory an earlier Job left
    age_s: float  # since a prepare last stamped it
    abandoned_after: float | None  # prepare's --abandoned-after
    swept: bool
    cache: str = "snapshot:llm/v3"  # what the new Job prepares
    cli: bool = False  # run `extender warm prepare` with the bound in $WARM_ABANDONED_AFTER, as the Job does


STAGED = [
    Staged("weights of a version no longer planned", "weights/llm/.v1.warming", 9001, 9000, True),
    Staged("a compile key's, abandoned", f"compile/.{LLM_KEY}.warming", 9001, 9000, True),
    Staged("an adapter's, abandoned, the bound from the Job's environment", "adapters/llm/.sql.warming", 9001,
           9000, True, cli=True),
    Staged("another Job may still write or resume it", "weights/llm/.v1.warming", 8000, 9000, False),
    Staged("the Job's own, old: resumed", "snapshots/llm/.v3.warming", 99999, 9000, False),
    Staged("no --abandoned-after (an older warmer's Job)", "weights/llm/.v1.warming", 99999, None, False),
]


@pytest.mark.parametrize("case", STAGED, ids=[c.id for c in STAGED])
def test_a_staging_directory_no_job_can_resume_is_deleted(tmp_path: Path, case: Staged,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A Job that failed for good, or whose action is no longer planned, leaves its staging
    directory, which the agent never reports: nothing else would ever free its bytes."""
    staging = tmp_path / case.staging
    sparse(staging / "part-1.safetensors", 10)
    stamped = time.time() - case.age_s
    os.utime(staging, (stamped, stamped))
    if case.cli:
        from extender.cli import main

        if case.abandoned_after is not None:
            monkeypatch.setenv("WARM_ABANDONED_AFTER", f"{case.abandoned_after:g}")
        assert main(["warm", "prepare", "--root", str(tmp_path), "--cache", case.cache]) == 0
        ours = staging_path(tmp_path, case.cache)
    else:
        ours = prepare(tmp_path, case.cache, abandoned_after=case.abandoned_after)
    assert ours.is_dir() and ours.stat().st_mtime > stamped  # stamped: in use from now on
    assert staging.exists() is not case.swept
    assert not any(".evicting" in p.name for p in tmp_path.rglob("*"))  # deleted, not left as a tomb


class LinkedKind(NamedTuple):
    links: tuple[str, ...]  # below the cache root, each pointing at the outside directory
    outside: tuple[str, ...]  # below the outside directory: what the sweep would delete there


LINKED_KINDS = [
    pytest.param(LinkedKind(("compile",), (".db.evicting-1/data", ".old.warming/f")), id="a kind directory"),
    pytest.param(LinkedKind(("compile", "snapshots"), (".db.evicting-1/data", ".old.warming/f")),
                 id="two kinds to one place"),
    pytest.param(LinkedKind(("weights/llm",), (".v0.evicting-1/data", ".v1.warming/f")),
                 id="a workload directory below a kind"),
]


@pytest.mark.parametrize("case", LINKED_KINDS)
def test_the_sweep_never_enters_a_linked_directory(tmp_path: Path, case: LinkedKind,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Tombs and abandoned staging directories are deleted only below the cache root: a pod that
    links a kind's directory elsewhere must not make every prepare delete there."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "weights").mkdir(parents=True)
    for name in case.outside:
        (outside / name).parent.mkdir(parents=True, exist_ok=True)
        (outside / name).write_text("IMPORTANT")
    os.utime(outside / Path(case.outside[-1]).parent, (0, 0))  # abandoned long ago, were it ours
    for link in case.links:
        (root / link).parent.mkdir(parents=True, exist_ok=True)
        (root / link).symlink_to(outside, target_is_directory=True)
    with caplog.at_level("WARNING"):
        prepare(root, "weights:other/v1", abandoned_after=3600)
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*") if p.is_file()) == \
        sorted(case.outside)
    if len(Path(case.links[0]).parts) == 1:  # a kind directory: said once, in one line
        told = [r.getMessage() for r in caplog.records]
        assert any("is a symbolic link" in m and "not swept" in m for m in told), told


class Swapped(NamedTuple):
    step: str  # evict, prepare (evicting the entry) or finish
    cache: str
    swapped: str  # the directory below the root swapped for a link once the step's check passed


SWAPPED = [
    pytest.param(Swapped("evict", f"compile:{LLM_KEY}", "compile"), id="evict: the kind directory"),
    pytest.param(Swapped("evict", "weights:llm/v1", "weights/llm"), id="evict: the workload directory"),
    pytest.param(Swapped("prepare", f"compile:{LLM_KEY}", "compile"), id="prepare's eviction"),
    pytest.param(Swapped("finish", f"compile:{LLM_KEY}", "compile"), id="finish: the kind directory"),
    pytest.param(Swapped("finish", "weights:llm/v1", "weights/llm"), id="finish: the workload directory"),
]


def _tree(top: Path) -> dict[str, str]:
    return {p.relative_to(top).as_posix(): p.read_text() if p.is_file() else "/" for p in sorted(top.rglob("*"))}


@pytest.mark.parametrize("case", SWAPPED)
def test_a_directory_swapped_for_a_link_after_the_check_is_never_followed(
        tmp_path: Path, case: Swapped, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod that swaps a directory of the path for a link between the step's check and its rename
    or deletion (a rename-exchange loop wins that race) must not make the step act outside the root."""
    from extender.warm import steps

    root, outside = tmp_path / "root", tmp_path / "outside"
    dest, staging = cache_path(outside, case.cache), staging_path(outside, case.cache)
    for d in (dest, staging):  # what the link will show: an entry and its staging, both someone else's
        d.mkdir(parents=True)
        (d / "theirs").write_text("IMPORTANT")
    (outside / case.swapped / ".keep").write_text("x")
    before = _tree(outside)
    (cache_path(root, case.cache) / "ours").parent.mkdir(parents=True)
    (cache_path(root, case.cache) / "ours").write_text("ours")
    (staging_path(root, case.cache) / "ours").parent.mkdir(parents=True)
    (staging_path(root, case.cache) / "ours").write_text("ours")
    real_check = steps.on_node

    def check_then_swap(root_: Path, cache_id: str) -> Path:
        checked = real_check(root_, cache_id)
        if cache_id == case.cache and not (root / case.swapped).is_symlink():
            os.rename(root / case.swapped, root / f".moved-{Path(case.swapped).name}")
            (root / case.swapped).symlink_to(outside / case.swapped, target_is_directory=True)
        return checked

    monkeypatch.setattr(steps, "on_node", check_then_swap)
    run: Callable[[], object] = {"evict": lambda: steps.evict(root, case.cache),
           "prepare": lambda: steps.prepare(root, "snapshot:other/v1", [case.cache]),
           "finish": lambda: steps.finish(root, case.cache)}[case.step]
    with pytest.raises(StepError, match="is a symbolic link"):
        run()
    assert _tree(outside) == before


class FileAt(NamedTuple):
    file: str  # a regular file below the root, where a directory of ours goes
    step: str  # evict, prepare or finish (after a prepare and a fetch)


FILES_AT = [
    pytest.param(FileAt(f"compile/{LLM_KEY}", "evict"), id="evict: the entry"),
    pytest.param(FileAt(f"compile/{LLM_KEY}", "finish"), id="finish: the destination"),
    pytest.param(FileAt(f"compile/.{LLM_KEY}.evicting-1-ab", "prepare"), id="a tomb that is a file"),
    pytest.param(FileAt(f"compile/.{LLM_KEY}.warming", "prepare"), id="prepare: the staging name"),
]


@pytest.mark.parametrize("case", FILES_AT)
def test_a_file_where_a_directory_goes_is_removed_not_left(tmp_path: Path, case: FileAt) -> None:
    """A file at an entry's name failed (Not a directory) and left a tomb file no sweep freed; one at
    the staging name (ours alone) failed every retry with File exists."""
    (tmp_path / case.file).parent.mkdir(parents=True)
    (tmp_path / case.file).write_text("x")
    cache = f"compile:{LLM_KEY}"
    if case.step == "evict":
        assert evict(tmp_path, cache) is True
    elif case.step == "prepare":
        assert prepare(tmp_path, cache).is_dir()
    else:
        (prepare(tmp_path, cache) / "k").write_text("kernel")
        assert (finish(tmp_path, cache) / "k").read_text() == "kernel"
    left = sorted(p.name for p in (tmp_path / "compile").iterdir())
    assert left == {"evict": [], "finish": [LLM_KEY]}.get(case.step, [f".{LLM_KEY}.warming"])


class Linked(NamedTuple):
    id: str
    link: str  # below the cache root, pointing outside it
    cache: str
    refused: bool  # prepare refuses (else: the link, ours, is replaced by a directory)


LINKED = [
    Linked("the weights entry itself", "weights/llm/v1", "weights:llm/v1", True),
    Linked("a compile entry itself", f"compile/{LLM_KEY}", f"compile:{LLM_KEY}", True),
    Linked("the weights staging directory", "weights/llm/.v1.warming", "weights:llm/v1", False),
    Linked("the compile staging directory", f"compile/.{LLM_KEY}.warming", f"compile:{LLM_KEY}", False),
]


@pytest.mark.parametrize("case", LINKED, ids=[c.id for c in LINKED])
def test_a_symbolic_link_at_the_entry_or_its_staging_is_never_followed(tmp_path: Path, case: Linked) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (outside / COMPLETE).write_text("theirs")
    link = root / case.link
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    if case.refused:
        with pytest.raises(StepError, match="is a symbolic link"):
            prepare(root, case.cache)
        with pytest.raises(StepError, match="is a symbolic link"):
            evict(root, case.cache)
    else:
        staging = prepare(root, case.cache)
        assert not staging.is_symlink() and staging.is_dir()
        (staging / "f").write_text("x")
        finish(root, case.cache)
    assert sorted(p.name for p in outside.iterdir()) == [COMPLETE]  # nothing outside was written or removed


class Planted(NamedTuple):
    cache: str
    name: str  # planted in the staging directory before finish, by whoever else writes the cache root
    link: bool = True  # a link to a file outside the entry; else an empty directory


PLANTED = [
    pytest.param(Planted("weights:llm/v1", "..manifest.json.tmp"), id="weights: the manifest's temporary"),
    pytest.param(Planted("weights:llm/v1", "..complete.tmp"), id="weights: the marker's temporary"),
    pytest.param(Planted("snapshot:llm/v1", "..complete.tmp"), id="a snapshot's marker's temporary"),
    pytest.param(Planted("adapter:llm/sql", "..complete.tmp"), id="an adapter's marker's temporary"),
    pytest.param(Planted("weights:llm/v1", "..manifest.json.tmp", link=False),
                 id="a directory at the manifest's temporary"),
]


@pytest.mark.parametrize("case", PLANTED)
def test_finish_writes_its_markers_never_through_a_planted_link(tmp_path: Path, case: Planted) -> None:
    """The serving pods can write the cache root: a link at the name finish writes a marker under
    first made it overwrite the file it points to (another entry's weights) with the manifest."""
    root, other = tmp_path / "root", tmp_path / "root" / "weights" / "other" / "v2" / "model.safetensors"
    other.parent.mkdir(parents=True)
    other.write_text("REAL")
    staging = prepare(root, case.cache)
    (staging / "a.bin").write_text("part")
    if case.link:
        (staging / case.name).symlink_to(other)
    else:
        (staging / case.name / "sub").mkdir(parents=True)
    dest = finish(root, case.cache)
    assert other.read_text() == "REAL"
    assert not (dest / case.name).exists() and not (dest / case.name).is_symlink()
    assert (dest / COMPLETE).is_file() and not (dest / COMPLETE).is_symlink()


def test_finish_refuses_a_staging_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "f").parent.mkdir()
    (outside / "f").write_text("x")
    staging = staging_path(tmp_path / "root", "weights:llm/v1")
    staging.parent.mkdir(parents=True)
    staging.symlink_to(outside)
    with pytest.raises(StepError, match="is a symbolic link"):
        finish(tmp_path / "root", "weights:llm/v1")
    assert sorted(p.name for p in outside.iterdir()) == ["f"]


def test_finish_refuses_an_empty_fetch(tmp_path: Path) -> None:
    prepare(tmp_path, f"compile:{LLM_KEY}")
    with pytest.raises(StepError, match="no files"):
        finish(tmp_path, f"compile:{LLM_KEY}")
    assert scan_cache(tmp_path).compile_keys == ()


@pytest.mark.parametrize("kind", ["weights", "snapshot"])
def test_finish_does_not_hang_on_a_directory_swapped_for_a_fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                kind: CacheKind) -> None:
    """The look for any fetched file walked with ``os.fwalk``, which opened each directory with plain
    O_RDONLY: a FIFO put in place of the only directory after the listing blocked the Job until its
    deadline. Now that directory is skipped, as one that vanished, and nothing was fetched."""
    ident = "weights:llm/v1" if kind == "weights" else "snapshot:llm/v1"
    staging = prepare(tmp_path, ident)
    sparse(staging / "shards" / "a.safetensors", 100)
    fifo = fifo_after_listing(monkeypatch, staging, "shards")
    with pytest.raises(StepError, match="the fetch step left no files"):
        without_hanging(lambda: finish(tmp_path, ident), fifo)


def test_finish_refuses_weights_that_are_only_a_manifest(tmp_path: Path) -> None:
    """A fetch that copied a bucket's manifest alone passed the any-file check, and finish sealed an
    empty manifest with its marker: whole weights of 0 bytes to the agent."""
    staging = prepare(tmp_path, "weights:llm/v1")
    (staging / MANIFEST).write_text('{"files": [{"path": "a.safetensors", "size": 100}]}')
    with pytest.raises(StepError, match="holds no file to list"):
        finish(tmp_path, "weights:llm/v1")
    assert not (staging / COMPLETE).exists() and not weights_dir(tmp_path, "llm", "v1").exists()
    assert scan_cache(tmp_path).weights == ()


@pytest.mark.parametrize("bad", ["weights:../etc/v1", "weights:llm", "weights:llm/.hidden", "compile:a/b",
                                 "snapshot:", "snapshot:llm", "image:nginx", "model:llm", "weights"])
def test_cache_ids_that_would_leave_the_cache_root_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(StepError):
        prepare(tmp_path, "snapshot:llm/v1", [bad])
    assert not (tmp_path / "snapshots").exists()  # nothing was done


def _bytes(name: str) -> int:
    return len(os.fsencode(name))


class LongName(NamedTuple):
    kind: CacheKind
    name: str  # the entry's last part: a weights or snapshot version, an adapter's name
    whole: bool  # its staging name is still ``.<name>.warming``, as every release wrote it


LONG_NAMES = [
    pytest.param(LongName("weights", "v", True), id="1 byte"),
    pytest.param(LongName("weights", "v" * 200, True), id="200 bytes"),
    pytest.param(LongName("weights", "v" * 230, True), id="230 bytes: its tomb did not fit with a pid of 5 digits"),
    pytest.param(LongName("weights", "v" * 240, True), id="240 bytes: its tomb never fit"),
    pytest.param(LongName("weights", "v" * 246, True), id="246 bytes: the longest whose whole staging name fits"),
    pytest.param(LongName("weights", "v" * 247, False), id="247 bytes: the first shortened staging name"),
    pytest.param(LongName("weights", "v" * 255, False), id="255 bytes: the longest name the check takes"),
    pytest.param(LongName("weights", "é" * 120, True), id="120 two-byte characters: 240 bytes"),
    pytest.param(LongName("weights", "é" * 127, False), id="127 two-byte characters: 254 bytes"),
    pytest.param(LongName("weights", "€" * 85, False), id="85 three-byte characters: 255 bytes"),
    pytest.param(LongName("weights", "a" + "\N{GRINNING FACE}" * 63, False),
                 id="four-byte characters: 253 bytes, cut where a character would be split"),
    pytest.param(LongName("snapshot", "快照" * 42 + "-v1", False), id="a snapshot: 255 bytes of CJK and ASCII"),
    pytest.param(LongName("adapter", "s" * 255, False), id="an adapter: 255 bytes"),
]


@pytest.mark.parametrize("case", LONG_NAMES)
def test_every_name_the_check_takes_is_staged_finished_evicted_and_swept(tmp_path: Path, case: LongName) -> None:
    """A name of up to 255 bytes passed the check, but its tomb ``.<name>.evicting-<pid>-<hex>`` (about
    25 bytes longer) and its staging name (9 longer) did not fit a directory entry: such an entry,
    left by an older release or another tool, could never be evicted, and a staging directory of a
    246-byte name made every later sweep fail on its tomb."""
    cache = f"{case.kind}:llm/{case.name}"
    dest = cache_path(tmp_path, cache)
    if case.kind == "weights":
        sparse(dest / "a.bin", 10)  # a partial entry already on disk
    staging = prepare(tmp_path, cache)
    assert staging.name.startswith(".") and staging.name.endswith(".warming") and _bytes(staging.name) <= NAME_MAX
    assert (staging.name == f".{case.name}.warming") is case.whole
    assert staging == staging_path(tmp_path, cache) and prepare(tmp_path, cache) == staging  # resumed
    assert not dest.exists() and sorted(p.name for p in staging.iterdir()) == (["a.bin"] if case.kind == "weights"
                                                                              else [])
    sparse(staging / "b.bin", 5)
    hidden = scan_cache(tmp_path)
    assert (hidden.weights, hidden.snapshots, hidden.adapters) == ((), (), ())  # staging: seen by nobody
    assert finish(tmp_path, cache) == dest
    found = scan_cache(tmp_path)
    match case.kind:
        case "weights":
            assert [(w.version, w.bytes, w.complete) for w in found.weights] == [(case.name, 15, True)]
        case "snapshot":
            assert found.snapshots == (f"llm/{case.name}",)
        case _:
            assert found.adapters == (f"llm/{case.name}",)
    assert evict(tmp_path, cache) is True
    assert list(dest.parent.iterdir()) == []
    # what killed and abandoned steps leave for this name, in every form: all swept by the next prepare
    stale = prepare(tmp_path, cache)
    sparse(stale / "c.bin", 1)
    os.utime(stale, (0, 0))  # stamped long ago
    assert prepare(tmp_path, cache, abandoned_after=3600) == stale  # its own Job's: kept, resumed
    assert (stale / "c.bin").is_file()
    os.utime(stale, (0, 0))  # and now abandoned
    tombs = {tomb_name(case.name), tomb_name(stale.name)}  # an eviction's, a sweep's
    tombs |= {t for t in (f".{case.name}.evicting-1", f".{case.name}.evicting-1-0a1b2c3d") if _bytes(t) <= NAME_MAX}
    for tomb in tombs:
        assert TOMB.fullmatch(tomb) and _bytes(tomb) <= NAME_MAX
        sparse(dest.parent / tomb / "sub" / "f", 1)
    prepare(tmp_path, f"{case.kind}:llm/other", abandoned_after=3600)
    assert [p.name for p in dest.parent.iterdir()] == [staging_name("other")]


def test_long_names_that_share_their_start_keep_their_own_staging(tmp_path: Path) -> None:
    """A shortened staging name carries a digest of the whole name: two entries are never fetched
    into one directory. Its ``..`` start keeps it apart from every whole one (an entry's name never
    starts with ``.``)."""
    first, second = "v" * 250 + "-a", "v" * 250 + "-b"
    staged = {name: prepare(tmp_path, f"weights:llm/{name}") for name in (first, second)}
    assert staged[first] != staged[second]
    for name, staging in staged.items():
        (staging / "f").write_text(name)
    for name in staged:
        assert (finish(tmp_path, f"weights:llm/{name}") / "f").read_text() == name
    short = staging_name(first)
    assert short.startswith("..")
    with pytest.raises(StepError, match="not a plain directory name"):  # the one name whose whole form it is
        cache_path(tmp_path, f"weights:llm/{short[1:-len('.warming')]}")


@pytest.mark.parametrize(("name", "said"), [
    pytest.param("v" * 256, "'vvv", id="256 bytes"),
    pytest.param("é" * 128, "takes 256 bytes: a directory name takes at most 255",
                 id="128 two-byte characters: 256 bytes, which the old check counted as 128"),
    pytest.param("\N{GRINNING FACE}" * 64, "takes 256 bytes", id="64 four-byte characters"),
    pytest.param("v\ud800", "cannot be encoded", id="a lone surrogate: no file name at all"),
])
def test_a_name_longer_than_a_directory_entry_takes_is_refused_before_anything_is_done(
        tmp_path: Path, name: str, said: str) -> None:
    with pytest.raises(StepError, match=re.escape(said)) as refused:
        prepare(tmp_path, "snapshot:llm/v1", [f"weights:llm/{name}"])
    assert "\n" not in str(refused.value) and "version" in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # nothing was done


class FetchedLink(NamedTuple):
    at: str  # below the staging directory
    target: str  # what the link points to ({outside}: a directory beside the cache root); "": a FIFO
    said: str


FETCHED_LINKS = [
    pytest.param(FetchedLink("secret", "{outside}/secret", "is a symbolic link"), id="to a file outside the entry"),
    pytest.param(FetchedLink("gone", "{outside}/absent", "is a symbolic link"), id="dangling"),
    pytest.param(FetchedLink("models", "{outside}", "is a symbolic link (to a directory)"), id="to a directory"),
    pytest.param(FetchedLink("sub/deeper/secret", "{outside}/secret", "is a symbolic link"), id="nested"),
    pytest.param(FetchedLink("alias.bin", "a.bin", "is a symbolic link"), id="to a file inside the entry"),
    pytest.param(FetchedLink("pipe", "", "is not a regular file"), id="a FIFO"),
]


@pytest.mark.parametrize("case", FETCHED_LINKS)
def test_finish_refuses_weights_holding_a_link_and_names_it(tmp_path: Path, case: FetchedLink) -> None:
    """The manifest recorded the size of whatever a link pointed to (``/etc/shadow``, a huge file
    elsewhere), and the agent, which neither follows nor counts a link, then found the entry short of
    that file at every scan: never complete. Refused now, naming the file; nothing is sealed and
    nothing is lost, and the fetch fixed seals."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    sparse(outside / "secret", 5 * GB)
    root.mkdir()
    staging = prepare(root, "weights:llm/v1")
    sparse(staging / "a.bin", 10)
    where = staging / case.at
    where.parent.mkdir(parents=True, exist_ok=True)
    if case.target:
        where.symlink_to(case.target.format(outside=outside))
    else:
        os.mkfifo(where)
    with pytest.raises(StepError) as refused:
        finish(root, "weights:llm/v1")
    assert str(refused.value).startswith(f"{where} {case.said}: a weights directory holds regular files")
    assert "\n" not in str(refused.value)
    assert not weights_dir(root, "llm", "v1").exists() and scan_cache(root).weights == ()
    assert (staging / "a.bin").is_file() and (where.is_symlink() or where.exists())  # kept, to be resumed
    assert not (staging / MANIFEST).exists() and not (staging / COMPLETE).exists()
    assert (outside / "secret").stat().st_size == 5 * GB
    where.unlink()
    finish(root, "weights:llm/v1")
    assert scan_cache(root).weights == (WeightsEntry("llm", "v1", 10, True, 10),)


# ---------------------------------------------------------------------------------------------
# What the inventory says
# ---------------------------------------------------------------------------------------------


def test_present_reads_the_cache_as_the_planner_does() -> None:
    records = [node("full", images=["docker.io/other:1", "example.com/llm:1"], weights={"llm/v1": 100 * GB},
                    compileKeys=[LLM_KEY]),
               node("partial", weights={"llm/v1": 100 * GB - 1}),
               node("stale", weights={"llm/v1": 100 * GB}, heartbeat=NOW - 3600)]
    snap = InventorySnapshot.build(BASE, records)
    assert [present(BASE, snap, action(k, "full"), NOW) for k in ("image", "weights", "compile", "snapshot")] == \
        [True, True, True, False]
    assert present(BASE, snap, action("weights", "partial"), NOW) is False
    assert present(BASE, snap, action("weights", "stale"), NOW) is None
    assert present(BASE, snap, action("weights", "unknown"), NOW) is None


def test_an_eviction_a_pod_now_needs_is_unsafe() -> None:
    cls = BASE.node_class("gpu")
    victims = (Eviction(node="a", cache="weights:old/v0", bytes=1, last_used=0),
               Eviction(node="a", cache="snapshot:old/v0", bytes=1, last_used=0),
               Eviction(node="a", cache=f"compile:{LLM_KEY}", bytes=1, last_used=0))
    idle = node("a", weights={"old/v0": 1})
    assert unsafe_evictions(BASE, idle, cls, victims) == []
    busy_old = node("a", weights={"old/v0": 1}, snapshots=["old/v0"], podWorkloads=["old"])
    assert unsafe_evictions(BASE, busy_old, cls, victims) == ["weights:old/v0", "snapshot:old/v0"]
    busy_llm = node("a", podWorkloads=["llm"], inUse=["snapshot:old/v0"])
    assert unsafe_evictions(BASE, busy_llm, cls, victims) == ["snapshot:old/v0", f"compile:{LLM_KEY}"]
    assert len(unsafe_evictions(BASE, None, cls, victims)) == 3  # the node's record is gone: evict nothing


def test_a_node_is_warm_when_it_holds_every_keep_warm_cache_it_can_get() -> None:
    policy = load(keepWarm=["llm"])
    image = ["example.com/llm:1"]
    cases = {
        "cold": (node("n"), False),
        "image only": (node("n", images=image), False),
        "image and weights, key not in the registry": (node("n", images=image, weights={"llm/v1": 100 * GB}), True),
        "stale": (node("n", images=image, weights={"llm/v1": 100 * GB}, heartbeat=NOW - 3600), False),
    }
    for name, (record, warm) in cases.items():
        snap = InventorySnapshot.build(policy, [record])
        assert node_warm(policy, snap, 0, NOW, ()) is warm, name
    # with the key in the registry, the compile cache is something the node can get
    snap = InventorySnapshot.build(policy, [cases["image and weights, key not in the registry"][0]], registry=[LLM_KEY])
    assert node_warm(policy, snap, 0, NOW, ()) is False
    # no keep-warm workload: nothing to wait for
    assert node_warm(BASE, InventorySnapshot.build(BASE, [node("n")]), 0, NOW, ()) is True


def test_publish_candidates_wait_for_the_cache_to_settle_and_pick_one_node() -> None:
    snap = InventorySnapshot.build(BASE, [
        node("gpu-b", compileKeys=[LLM_KEY, "unknown-key"], cacheBytes={cache_id("compile", LLM_KEY): 3 * GB}),
        node("gpu-a", compileKeys=[LLM_KEY]),
        node("gpu-c", compileKeys=[LLM_KEY], heartbeat=NOW - 3600),
    ])
    holders = unpublished(BASE, snap, NOW)
    assert list(holders) == [LLM_KEY]  # a key no profile computes is nothing anyone would fetch
    assert [h.node for h in holders[LLM_KEY]] == ["gpu-a", "gpu-b"]  # fresh nodes only, by name
    seen = {LLM_KEY: NOW - 60}
    assert candidates(BASE, holders, seen, NOW, busy=(), limit=4) == []  # 60 s < publishAfter 120 s
    (p,) = candidates(BASE, holders, seen, NOW + 60, busy=(), limit=4)
    assert (p.key, p.node, p.workload, p.node_class, p.bytes) == (LLM_KEY, "gpu-a", "llm", "gpu", GB)
    assert candidates(BASE, holders, seen, NOW + 60, busy={LLM_KEY}, limit=4) == []
    assert candidates(BASE, holders, seen, NOW + 60, busy=(), limit=0) == []
    registered = InventorySnapshot.build(BASE, snap.nodes, registry=[LLM_KEY])
    assert unpublished(BASE, registered, NOW) == {}


class PublishCap(NamedTuple):
    id: str
    per_node: int
    running: dict[str, int]  # warm Jobs per node, running or started this tick
    budget: float | None
    node: str | None  # the holder that publishes, or None: nothing starts


PUBLISH_CAPS = [
    PublishCap("the first holder by name", 1, {}, None, "gpu-a"),
    PublishCap("the first holder is busy: the next one", 1, {"gpu-a": 1}, None, "gpu-b"),
    PublishCap("every holder at maxConcurrentPerNode", 1, {"gpu-a": 1, "gpu-b": 1}, None, None),
    PublishCap("a second slot on the node", 2, {"gpu-a": 1}, None, "gpu-a"),
    PublishCap("the bytes the actions left are too few", 1, {}, 0.5 * GB, None),
    PublishCap("the bytes the actions left suffice", 1, {}, 1.0 * GB, "gpu-a"),
]


@pytest.mark.parametrize("case", PUBLISH_CAPS, ids=[c.id for c in PUBLISH_CAPS])
def test_publish_jobs_count_against_the_node_cap_and_the_byte_budget(case: PublishCap) -> None:
    policy = load(maxConcurrentPerNode=case.per_node)
    snap = InventorySnapshot.build(policy, [node("gpu-b", compileKeys=[LLM_KEY]), node("gpu-a", compileKeys=[LLM_KEY])])
    holders = unpublished(policy, snap, NOW)
    got = candidates(policy, holders, {LLM_KEY: NOW - 600}, NOW, busy=(), limit=4, running=case.running,
                     budget=case.budget)
    assert [p.node for p in got] == ([case.node] if case.node else [])


def test_a_job_with_the_most_evictions_allowed_stays_under_the_annotation_limit() -> None:
    # the longest names the layout allows: a 253-character node, adapter ids of two 255-character parts
    node_name = "n" * 253
    victims = tuple(Eviction(node=node_name, cache=f"adapter:{'w' * 255}/{i:0>255}", bytes=10**15,
                             last_used=NOW - 86_400.123456) for i in range(MAX_EVICTIONS))
    job = action_job(BASE, action("weights", node_name, evictions=victims), node_class="gpu")
    size = sum(len(k) + len(v) for k, v in job["metadata"]["annotations"].items())
    assert size < 256 * 1024 // 2  # Kubernetes refuses more than 256 KiB; half leaves room


def test_usage_times_come_from_the_files(tmp_path: Path) -> None:
    """The agent's eviction inputs: last use from file times, never from its own reading."""
    d = weights_dir(tmp_path, "llm", "v1")
    sparse(d / "a", 10)
    old = time.time() - 86_400
    os.utime(d / "a", (old, old))
    result = scan_cache(tmp_path)
    # the copy tool set an old mtime, but the file landed now: its change time says so
    assert result.last_used[cache_id("weights", "llm/v1")] >= old + 80_000
