"""Fault suite, authored-files part: hypothesis mutations of the files a platform team writes.

The policies, scenarios and traces bundled with the project are the seeds. Each example damages one
of them the way a hand edit or a bad export does: a key dropped or added at any depth, a value
replaced by another type, NaN, infinity, a negative, a huge or a tiny number, an empty or exotic
string, a list or null; a line deleted, doubled or re-indented, a control character, a byte-order
mark or CRLF line ends in the text; for a trace, rows missing or adding cells, odd cells, blank and
padded lines, unsorted and repeated times, other separators.

The property holds for every example: the file loads, or its own error (``PolicyError``,
``ScenarioError``, ``TraceError``) lists problems that each name the file and a place (a line, a
field path or both), one line each. And what loads makes sense downstream: every estimate is a
finite number of seconds >= 0, ``policy show``'s normalised form loads back to the same policy, a
scenario runs a short simulation to finite figures, a trace gives sorted, finite arrivals.

Rows of :data:`FOUND` are the minimal inputs of the defects this fuzzing found, each checked to fail
without its fix.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context, event

from extender.core.errors import DocumentError, PolicyError
from extender.core.estimate import breakdown, estimate_pairs
from extender.core.policy import Policy, parse_policy
from extender.sim.errors import TraceError
from extender.sim.report import build, to_json
from extender.sim.scenario import TraceSpec, load_scenario
from extender.sim.simulation import prepare, simulate
from extender.sim.traces import RequestTrace, arrivals_from, read_trace

ROOT = Path(__file__).resolve().parent.parent
POLICY_FILES = sorted([*(ROOT / "policies").glob("*.yaml"), *(ROOT / "scenarios").glob("*-policy.yaml"),
                       ROOT / "deploy/helm/extender/policy.yaml"])
SCENARIO_FILES = sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if not p.name.endswith("-policy.yaml"))

#: Examples per property: each policy example is a parse and an estimate (tens of ms), each scenario
#: example that loads a run of minutes of simulated time on a few nodes; the file stays within ~30 s.
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
SCENARIO_FUZZ = settings(FUZZ, max_examples=25)

# ---- structural mutations of a parsed document ----------------------------------------------------

#: Values a field may be given by mistake.
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 0.5, -0.0, float("nan"), float("inf"), float("-inf"), 1e308, 5e-324, 1e-300,
    10**15, 10**16, 2**64, -(10**20), "", " ", "\t", "x" * 300, "é✓\u202e", "\U0001f600", "0", "-5s", "1e400",
    "nan", "inf", ".inf", "1e-300B/s", "0.001B/s", "1EiB", "1024PiB", "0s", "1ms", "12h", "999999999d", [], {},
    [1, 2], {"a": 1}, [None],
]
UNKNOWN_KEYS = ["xUnknown", "Name", "name ", "NAME", "", "1", "extra.field"]

Path_ = tuple[str | int, ...]


def paths(value: Any, at: Path_ = ()) -> list[Path_]:
    """Every place in a document (the root first)."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*at, i))
    return out


def _get(value: Any, at: Path_) -> Any:
    for part in at:
        value = value[part]
    return value


#: Every kind of edit; :data:`SCALING` keeps most files valid, so what loads is exercised downstream.
EDITS = ("drop", "add", "replace", "replace", "scale", "wrap", "repeat")
SCALING = ("scale",)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Any], edits: tuple[str, ...] = EDITS,
            keys: frozenset[str] = frozenset()) -> Any:
    """One of ``seeds`` with one to three structural edits (module docstring); given ``keys``, only at
    those keys or below them."""
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 3))):
        places = paths(doc)[1:]
        if keys:
            places = [p for p in places if keys.intersection(str(part) for part in p)]
        if edits == SCALING:
            places = [p for p in places if isinstance(_get(doc, p), int | float | str)
                      and not isinstance(_get(doc, p), bool)]
        if not places:
            break
        at = places[draw(st.integers(0, len(places) - 1))]
        parent, key, current = _get(doc, at[:-1]), at[-1], _get(doc, at)
        edit = draw(st.sampled_from(edits))
        if edit == "drop":
            del parent[key]
        elif edit == "add" and isinstance(current, dict):
            current[draw(st.sampled_from(UNKNOWN_KEYS))] = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
        elif edit == "scale" and isinstance(current, int | float) and not isinstance(current, bool):
            parent[key] = current * draw(st.sampled_from([-1, 0, 1e-9, 1e-3, 1e3, 1e9, 1e15]))
        elif edit == "scale" and isinstance(current, str):
            unit = current.lstrip("0123456789.")
            parent[key] = draw(st.sampled_from([current * 2, current + "0", "0" + current, current[:-1],
                                                current.upper(), "1e9" + unit, "0.000001" + unit, "1e-3" + unit,
                                                "1e15" + unit]))
        elif edit == "wrap":
            parent[key] = [current]
        elif edit == "repeat" and isinstance(current, list) and current:
            current.append(copy.deepcopy(current[draw(st.integers(0, len(current) - 1))]))
        else:
            parent[key] = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
    return doc


def note(outcome: str) -> None:
    """Count an outcome in hypothesis's statistics (``--hypothesis-show-statistics``)."""
    if currently_in_test_context():
        event(outcome)


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


#: Damage to the text itself.
ODD_CHARACTERS = ["\x00", "\x01", "\x1b", "\x7f", "\x85", "\u2028", "\ufeff", "\ufffe", "\t", "\r", "\n", ":", "-",
                  "&a ", "*a", "!!python/object ", "<<: ", "{", "[", '"', "'", "#", "%", "@", "`", "é", "\U0001f600"]


@st.composite
def damaged_text(draw: st.DrawFn, texts: list[str]) -> str:
    """One of ``texts`` with one to three edits of its characters and lines."""
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 3))):
        lines = text.split("\n")
        j = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["insert", "insert", "cut", "delete line", "double line", "indent", "crlf",
                                     "bom", "second document"]))
        if edit == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(ODD_CHARACTERS)) * draw(st.sampled_from([1, 2, 40])) + text[at:]
        elif edit == "cut":
            text = text[:draw(st.integers(0, len(text)))]
        elif edit == "delete line":
            text = "\n".join(lines[:j] + lines[j + 1:])
        elif edit == "double line":
            text = "\n".join(lines[:j + 1] + lines[j:])
        elif edit == "indent":
            text = "\n".join([*lines[:j], draw(st.sampled_from(["  ", "\t", " "])) + lines[j], *lines[j + 1:]])
        elif edit == "crlf":
            text = text.replace("\n", "\r\n")
        elif edit == "bom":
            text = "\ufeff" + text
        else:
            text = text + "\n---\n" + text
    return text


def assert_located(error: DocumentError, source: str) -> None:
    """Every problem names ``source`` and a place (a line, a field path) on one line."""
    assert error.problems, "an error without problems"
    for problem in error.problems:
        shown = str(problem)
        assert problem.source == source, shown
        assert problem.message, shown
        assert "\n" not in shown and "\r" not in shown, shown
        # only a file with no place in it (empty, of no encoding we read, too large) has neither
        assert problem.line is not None or problem.path or "must be a mapping" in problem.message, shown


# ---- policies --------------------------------------------------------------------------------------

POLICY_DOCS = [yaml.safe_load(p.read_text()) for p in POLICY_FILES]
POLICY_TEXTS = [p.read_text() for p in POLICY_FILES]


def assert_sensible(policy: Policy) -> None:
    """What a policy that loads gives downstream: estimates that are seconds, and a normalised form
    (``extender policy show``) that loads back to the same policy."""
    for workload, node_class in estimate_pairs(policy, None, None):
        table = breakdown(policy.profile(workload), policy.node_class(node_class))
        for state, row in table.items():
            for phase, seconds in row.items():
                assert math.isfinite(seconds) and seconds >= 0, (workload, node_class, state, phase, seconds)
    shown = yaml.safe_dump(policy.model_dump(mode="json", by_alias=True), sort_keys=False)
    assert parse_policy(shown, "shown.yaml") == policy


def check_policy_text(text: str) -> None:
    try:
        policy = parse_policy(text, "policy.yaml")
    except PolicyError as exc:
        assert_located(exc, "policy.yaml")
        note("refused")
        return
    note("loaded")
    assert_sensible(policy)


def test_the_bundled_policies_are_the_seeds() -> None:
    assert len(POLICY_DOCS) >= 5
    for text in POLICY_TEXTS:
        assert_sensible(parse_policy(text, "policy.yaml"))


@FUZZ
@given(doc=st.one_of(mutated(POLICY_DOCS), mutated(POLICY_DOCS, SCALING)))
def test_a_mutated_policy_loads_and_makes_sense_or_says_where(doc: Any) -> None:
    check_policy_text(dump(doc))


@FUZZ
@given(text=damaged_text(POLICY_TEXTS))
def test_a_damaged_policy_text_loads_or_says_where(text: str) -> None:
    check_policy_text(text)


def _typo_in_nodeclasses_of_a_published_profile(text: str) -> str:
    """gemma2-27b (the fifth profile) runs on [g6e-4, h100-8] and has snapshots published for both."""
    line = "    nodeClasses: [g6e-4, h100-8]\n"
    start = text.index(line, text.index("  - name: gemma2-27b\n"))
    return text[:start] + line.replace("h100-8", "h100-9") + text[start + len(line):]


FLAGSHIP_POLICY = ROOT / "scenarios/flagship-policy.yaml"

#: The minimal inputs of the policy defects found here: (edit of a bundled policy, the place of the
#: problem it must be reported at, words of its message).
FOUND: list[Any] = [
    # the published-snapshot check looked the class up and raised UnknownNameError: `policy check` said
    # "extender: no node class 'h100-9' (known: ...)" with no file, line or field, and no other problem
    pytest.param(FLAGSHIP_POLICY, _typo_in_nodeclasses_of_a_published_profile, "profiles[4].nodeClasses[1]",
                 "no node class 'h100-9'", id="a typo in the nodeClasses of a profile with a published snapshot"),
]


@pytest.mark.parametrize(("seed", "edit", "where", "words"), FOUND)
def test_found_policy_defects_are_located_problems(seed: Path, edit: Callable[[str], str], where: str,
                                                   words: str) -> None:
    text = edit(seed.read_text())
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "policy.yaml")
    assert_located(info.value, "policy.yaml")
    assert any(p.path == where and words in p.message for p in info.value.problems), str(info.value)


# ---- scenarios -------------------------------------------------------------------------------------

#: Simulated time of a fuzzed run: a few dozen ticks.
SHORT = "20m"


def _small(path: Path) -> dict[str, Any]:
    """A bundled scenario cut to a short run on a few nodes, its paths made absolute."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["policy"] = str(path.parent / doc["policy"])
    doc["duration"] = SHORT
    doc.pop("history", None)
    doc["strategies"] = list(doc.get("strategies", ["default", "predictive"]))[:2]
    doc["workloads"] = doc["workloads"][:3]
    kept = {w["name"] for w in doc["workloads"]}
    for group in doc["cluster"]["nodes"]:
        group["count"] = min(group["count"], 2)
        if "maxCount" in group:
            group["maxCount"] = min(group["maxCount"], 4)
        if "minCount" in group:  # kept (a pool above it may drain), within the count cut above
            group["minCount"] = min(group["minCount"], group["count"])
        group["warm"] = [{**w, **({"nodes": [0]} if "nodes" in w else {})}
                         for w in group.get("warm", []) if w["workload"] in kept]
    doc["rollouts"] = [r for r in doc.get("rollouts", []) if r["workload"] in kept]
    for w in doc["workloads"]:
        demand = w["demand"]
        if "synthetic" in demand:
            demand["synthetic"]["duration"] = SHORT
        else:
            demand["trace"]["path"] = str(path.parent / demand["trace"]["path"])
    return doc


SCENARIO_DOCS = [_small(p) for p in SCENARIO_FILES]


def run_short(path: Path) -> None:
    """Load the scenario at ``path``; when it loads, run it (if short) and check the figures."""
    try:
        loaded = load_scenario(path)
        prepared = prepare(loaded)  # reads the traces
    except DocumentError as exc:
        for problem in exc.problems:  # in the scenario, or in the policy or a trace it names, at their lines
            assert problem.source == str(path) or Path(problem.source).parent == ROOT / "scenarios", str(problem)
            assert_located(DocumentError([problem]), problem.source)
        note("refused")
        return
    if prepared.n_ticks > 200 or sum(s.max_replicas for s in prepared.workloads) > 2000:
        note("loaded, not run: long or large")
        return  # valid, and long or large: the loading was the test
    note("ran")
    runs = simulate(prepared, list(loaded.scenario.strategies))
    report = build("fuzz", loaded.scenario.slo.queue_delay, prepared.duration_s, runs,
                   quantile=prepared.policy.scaling.quantile)
    figures = json.loads(to_json(report))  # strict: NaN or infinity would be refused as JSON
    assert figures


def test_the_short_scenarios_run(tmp_path: Path) -> None:
    for i, doc in enumerate(SCENARIO_DOCS):
        path = tmp_path / f"s{i}.yaml"
        path.write_text(dump(doc))
        run_short(path)


@SCENARIO_FUZZ
@given(doc=st.one_of(mutated(SCENARIO_DOCS), mutated(SCENARIO_DOCS, SCALING)))
def test_a_mutated_scenario_runs_or_says_where(tmp_path: Path, doc: Any) -> None:
    if isinstance(doc, dict) and "duration" in doc:
        doc["duration"] = SHORT  # a run of 366 days would be the test's whole budget
    path = tmp_path / "s.yaml"
    path.write_text(dump(doc))
    run_short(path)


#: What a pool's and a workload's consolidation read (docs/simulator.md, "Consolidation of under-used nodes").
CONSOLIDATION_KEYS = frozenset({"consolidationPolicy", "doNotDisrupt", "consolidateAfter", "minCount"})


def test_a_seed_drains_under_used_nodes_in_its_short_run(tmp_path: Path) -> None:
    """The fuzz reaches the drain: a seed (scenarios/consolidation.yaml) asks for it and a workload that
    is not to be disrupted, and its short cut drains a node under every strategy it keeps."""
    draining = [d for d in SCENARIO_DOCS
                if any(g.get("consolidationPolicy") == "WhenEmptyOrUnderutilized" for g in d["cluster"]["nodes"])
                and any(w.get("doNotDisrupt") for w in d["workloads"])]
    assert draining
    path = tmp_path / "s.yaml"
    path.write_text(dump(draining[0]))
    loaded = load_scenario(path)
    runs = simulate(prepare(loaded), list(loaded.scenario.strategies))
    assert all(run.nodes_consolidated > 0 for run in runs), [run.nodes_consolidated for run in runs]


@SCENARIO_FUZZ
@given(doc=mutated(SCENARIO_DOCS, keys=CONSOLIDATION_KEYS))
def test_a_mutated_consolidation_field_runs_or_says_where(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(dump(doc))
    run_short(path)


#: Scenarios asking for many more replicas than their nodes hold (the minimal input first): each
#: tick scored every pending pod, 10,000 of them 40 times in a 10-minute run, more than 2 CPU-minutes.
CROWDED = [
    pytest.param(2, 10_000, "10m", id="10,000 replicas asked of 2 one-GPU nodes"),
    pytest.param(3, 2_000, "30m", id="2,000 replicas asked of 3 nodes for 30 minutes"),
]


@pytest.mark.parametrize(("nodes", "replicas", "duration"), CROWDED)
def test_pending_pods_cost_a_scoring_per_workload_and_placement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                nodes: int, replicas: int, duration: str) -> None:
    """Each scheduling pass scores a workload once, and once more after each placement: a pending pod
    of a workload that found no node is not scored again until a pod is placed. Counted, not timed."""
    from extender.sim.cluster import Cluster
    from extender.sim.simulation import Run

    counts = {"scores": 0, "passes": 0, "placed": 0}

    def counting(name: str, cls: type, key: str) -> None:
        original = getattr(cls, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(cls, name, wrapper)

    counting("_scores", Run, "scores")
    counting("_place_pending", Run, "passes")
    counting("place", Cluster, "placed")
    path = tmp_path / "s.yaml"
    path.write_text(dump({
        "apiVersion": "extender.io/v1alpha1", "kind": "Scenario", "duration": duration,
        "policy": str(ROOT / "scenarios/mixed-fleet-policy.yaml"), "slo": {"queueDelay": "10s"},
        "cluster": {"nodes": [{"nodeClass": "g5.xlarge", "count": nodes}]},
        "workloads": [{"name": "llama3-8b", "capacity": 0.001, "maxReplicas": replicas,
                       "demand": {"synthetic": {"duration": duration, "base": 1e9}}}],
        "strategies": ["default"]}))
    prepared = prepare(load_scenario(path))
    (run,) = simulate(prepared, ["default"])
    assert counts["passes"] >= prepared.n_ticks and counts["placed"] >= nodes
    workloads = len(prepared.workloads)
    assert counts["scores"] <= counts["placed"] + (counts["passes"] + 1) * workloads, counts
    assert run.workloads[0].served > 0


# ---- traces ----------------------------------------------------------------------------------------

HEADERS = [["timestamp", "rate"], ["t", "rate"], ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], ["time"],
           ["ts", "rps", "x"], ["t", "count"], ["a", "b"], ["t;rate"], ["\ufefft", "rate"], ['"t"', '"rate"'],
           ["t", "rate", ""], [" t ", " rate "]]
ODD_CELLS = ["", " ", "x", "nan", "NaN", "inf", "-inf", "-1", "1e308", "-1e308", "1e400", "1_000", "１", "٣",
             "0x10", "+3", '"1"', '"a,b"', '"', "\x00", "é", "1;2", "9999-01-01", "1500-01-01",
             "2023-11-16 18:17:03.9799600", "2023-11-16T18:17:03Z", "99999999999999999999999"]


@st.composite
def csv_trace(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    """A CSV trace (header, rows, line ends, blank and comment lines) and the spec it is read with."""
    header = draw(st.sampled_from(HEADERS))
    start = draw(st.sampled_from([0.0, 1.7e9]))
    step = draw(st.sampled_from([1.0, 300.0, 0.001]))
    rows = []
    for j in range(draw(st.integers(0, 12))):
        when = start + draw(st.sampled_from([j * step] * 6 + [-j * step, (j // 2) * step, 0.0]))
        cells = [repr(when) if k == 0 else repr(draw(st.sampled_from([0.0, 0.5, 3.0, 1e9])))
                 for k in range(len(header))]
        if draw(st.integers(0, 15)) == 0:
            cells[draw(st.integers(0, len(header) - 1))] = draw(st.sampled_from(ODD_CELLS))
        shape = draw(st.sampled_from(["row"] * 20 + ["extra", "short", "blank", "padded", "comment"]))
        rows.append({"row": ",".join(cells), "extra": ",".join([*cells, "1"]), "short": ",".join(cells[:-1]),
                     "blank": "", "padded": draw(st.sampled_from([" ", "\t", "   "])),
                     "comment": draw(st.sampled_from(["# note", "  # note"]))}[shape])
    end = draw(st.sampled_from(["\n"] * 5 + ["\r\n", "\r"]))
    text = ",".join(header) + end + end.join(rows) + draw(st.sampled_from(["", end]))
    if draw(st.integers(0, 9)) == 0:
        text = text.replace(",", draw(st.sampled_from([";", "\t"])), draw(st.integers(1, 3)))
    data = text.encode("utf-8")
    if draw(st.integers(0, 9)) == 0:
        data = data[: len(data) // 2] + b"\xff" + data[len(data) // 2:]
    spec = draw(st.just({}) | st.fixed_dictionaries({}, optional={
        "format": st.sampled_from(["requests", "rate"]), "loadScale": st.sampled_from([0.5, 2.5, 1e-9, 1e9]),
        "timeScale": st.sampled_from([0.001, 1000.0, 1e-9]), "rateColumn": st.sampled_from(["rate", "x", "b"]),
        "timeColumn": st.sampled_from(["t", "ts", "a"])}))
    return data, spec


@FUZZ
@given(case=csv_trace())
def test_a_trace_loads_to_sorted_finite_arrivals_or_says_where(tmp_path: Path, case: tuple[bytes, dict[str, Any]]
                                                               ) -> None:
    data, fields = case
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    spec = TraceSpec.model_validate({"path": str(path), **fields})
    try:
        trace = read_trace(path, spec)
    except TraceError as exc:
        for problem in exc.problems:
            shown = str(problem)
            assert problem.source == str(path) and "\n" not in shown and "\r" not in shown, shown
            # a file with no rows, or a scale that multiplies them past a bound, has no line to name
            assert problem.line is not None or problem.path or "no rows" in shown or "is empty" in shown, shown
        note("refused")
        return
    note("loaded")
    rng = np.random.default_rng(0)
    scaled = trace.scaled(spec, rng) if isinstance(trace, RequestTrace) else trace.scaled(spec)
    arrivals = arrivals_from(scaled, bin_s=5.0)
    assert np.all(np.isfinite(arrivals.times)) and np.all(np.diff(arrivals.times) >= 0)
    assert len(arrivals.times) == 0 or arrivals.times[0] >= 0
    assert np.all(np.isfinite(arrivals.weights)) and np.all(arrivals.weights >= 0)
    assert math.isfinite(arrivals.span_s) and arrivals.span_s >= 0
