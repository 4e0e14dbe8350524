"""Every long-running process's ``/metrics``, scraped from the real process (tests/metrics_world.py).

* ``promtool check metrics`` (Prometheus's own linter: names, units, suffixes, help) accepts each;
* ``Content-Type`` is the text format's, with ``charset`` once;
* ``extender_build_info`` names the command on every process;
* labelled series exist before their first event (an alert has a series to compare);
* the probes of ``--metrics-bind`` answer;
* docs/monitoring.md lists exactly the ``extender_*`` families each process serves, and every
  metric any page of docs/ names is served by some process.

No promtool is a failure of the install step, not a skip: ``scripts/test`` installs Debian's
``prometheus`` package, which carries it.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator

import pytest

from tests.metrics_world import PROCESSES, ROOT, Process, Scrape, get, running_processes, scrape_all
from tests.prometheus_tools import prometheus_tool

DOCS = ROOT / "docs"
MONITORING = DOCS / "monitoring.md"
#: ``## Metrics of `extender serve``` opens a process's table in docs/monitoring.md.
SECTION = re.compile(r"^## Metrics of `extender ([a-z-]+)`", re.M)
ROW = re.compile(r"^\| `(extender_[a-z0-9_]+)` \|", re.M)
#: A metric named in backticks anywhere in docs/, with or without a label selector.
MENTION = re.compile(r"`(extender_[a-z0-9_]+)(?:\{[^`]*\})?`")


def promtool() -> str:
    return prometheus_tool("promtool")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Process], dict[str, Scrape]]]:
    with running_processes(tmp_path_factory.mktemp("metrics-world")) as processes:
        yield processes, scrape_all(processes)


@pytest.fixture(scope="module")
def scrapes(world: tuple[dict[str, Process], dict[str, Scrape]]) -> dict[str, Scrape]:
    return world[1]


def documented() -> dict[str, set[str]]:
    """Process -> the metric names of its table in docs/monitoring.md."""
    text = MONITORING.read_text()
    marks = list(SECTION.finditer(text))
    out: dict[str, set[str]] = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out[mark.group(1)] = set(ROW.findall(text, mark.end(), end))
    return out


def served_extender(scrape: Scrape) -> set[str]:
    return {name for name in scrape.families() if name.startswith("extender_")}


@pytest.mark.integration
@pytest.mark.parametrize("process", PROCESSES)
def test_promtool_accepts_the_exposition(scrapes: dict[str, Scrape], process: str) -> None:
    done = subprocess.run([promtool(), "check", "metrics"], input=scrapes[process].text, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@pytest.mark.integration
@pytest.mark.parametrize("process", PROCESSES)
def test_content_type_is_the_text_format_with_one_charset(scrapes: dict[str, Scrape], process: str) -> None:
    content_type = scrapes[process].content_type
    assert content_type.startswith("text/plain; version=")
    assert content_type.count("charset") == 1


@pytest.mark.integration
@pytest.mark.parametrize("process", PROCESSES)
def test_build_info_names_the_command(scrapes: dict[str, Scrape], process: str) -> None:
    assert scrapes[process].value("extender_build_info", command=process) == 1.0


#: (name, process, sample, labels): a series that exists at start although its event may never have happened.
SERIES_AT_START = [
    ("fail-open-stale", "serve", "extender_fail_open_total", {"verb": "filter", "reason": "stale_snapshot"}),
    ("request-error", "serve", "extender_requests_total", {"verb": "prioritize", "outcome": "error"}),
    ("refresh-bad-record", "serve", "extender_snapshot_refresh_errors_total", {"reason": "bad_record"}),
    ("warm-job-failed", "scale", "extender_warm_jobs_finished_total", {"kind": "weights", "outcome": "failed"}),
    ("warm-error-create", "scale", "extender_warm_errors_total", {"operation": "create-job"}),
    ("below-reserve", "scale", "extender_warm_nodes_below_nvme_reserve", {"node_class": "h100"}),
    ("decision-forecast-up", "scale", "extender_scaler_decisions_total",
     {"workload": "llama", "action": "scale-up", "driver": "forecast"}),
    ("workload-errors", "scale", "extender_scaler_workload_errors_total", {"workload": "llama"}),
    ("served-undecided", "scale", "extender_served_values_total",
     {"api": "external-metrics", "workload": "llama", "state": "undecided"}),
    ("agent-failed-report", "agent", "extender_agent_reports_total", {"result": "failed"}),
    ("agent-adapter-bytes", "agent", "extender_agent_cache_bytes", {"kind": "adapter"}),
    ("sync-relist", "sync", "extender_sync_relists_total", {"resource": "pods"}),
    ("sync-failed-write", "sync", "extender_sync_writes_total", {"result": "failed"}),
    ("startup-histogram", "sync", "extender_replica_startup_seconds_count",
     {"workload": "qwen3", "node_class": "a10g"}),
    ("estimate-ratio", "sync", "extender_replica_startup_estimate_ratio_count",
     {"workload": "llama", "node_class": "a10g"}),
    ("keda-not-found", "keda-scaler", "extender_keda_requests_total", {"method": "GetMetrics", "code": "NOT_FOUND"}),
    ("keda-served-undecided", "keda-scaler", "extender_served_values_total",
     {"api": "keda", "workload": "llama", "state": "undecided"}),
]


@pytest.mark.integration
@pytest.mark.parametrize(("process", "sample", "labels"), [r[1:] for r in SERIES_AT_START],
                         ids=[r[0] for r in SERIES_AT_START])
def test_labelled_series_exist_before_their_first_event(scrapes: dict[str, Scrape], process: str, sample: str,
                                                        labels: dict[str, str]) -> None:
    assert scrapes[process].value(sample, **labels) is not None


@pytest.mark.integration
def test_the_scaler_reports_its_loop(scrapes: dict[str, Scrape]) -> None:
    scale = scrapes["scale"]
    assert scale.value("extender_scaler_leader") == 1.0
    assert scale.value("extender_scaler_desired_replicas", workload="qwen3") == 1.0
    assert scale.value("extender_scaler_decision_driver", workload="qwen3", driver="unobserved") is not None
    assert (scale.value("extender_scaler_horizon_seconds", workload="qwen3") or 0.0) > 0
    assert scale.value("extender_scaler_inventory_nodes", freshness="fresh") == 1.0


@pytest.mark.integration
def test_the_agent_measures_its_cache(scrapes: dict[str, Scrape]) -> None:
    agent = scrapes["agent"]
    assert (agent.value("extender_agent_scan_duration_seconds_count") or 0.0) >= 1
    assert (agent.value("extender_agent_nvme_capacity_bytes") or 0.0) > 0


@pytest.mark.integration
def test_the_sync_counts_its_lists_and_writes(scrapes: dict[str, Scrape]) -> None:
    sync = scrapes["sync"]
    assert sync.value("extender_sync_lists_total", resource="nodes") == 1.0
    assert sync.value("extender_sync_nodes") == 1.0
    assert (sync.value("extender_sync_writes_total", result="ok") or 0.0) >= 1


#: (name, process, path, code): the probes of the processes --metrics-bind serves.
PROBES = [
    ("agent-healthz", "agent", "/healthz", 200),
    ("agent-readyz", "agent", "/readyz", 200),
    ("sync-healthz", "sync", "/healthz", 200),
    ("sync-readyz", "sync", "/readyz", 200),
    ("keda-readyz", "keda-scaler", "/readyz", 200),
    ("agent-unknown-path", "agent", "/nothing", 404),
]


@pytest.mark.integration
@pytest.mark.parametrize(("process", "path", "code"), [p[1:] for p in PROBES], ids=[p[0] for p in PROBES])
def test_the_probes_answer(world: tuple[dict[str, Process], dict[str, Scrape]], process: str, path: str,
                           code: int) -> None:
    url = world[0][process].metrics_url.removesuffix("/metrics") + path
    status, body, content_type = get(url)
    assert (status, content_type) == (code, "application/json")
    assert isinstance(json.loads(body), dict)


@pytest.mark.integration
def test_the_extender_masters_endpoint_serves_every_workers_families(
        world: tuple[dict[str, Process], dict[str, Scrape]]) -> None:
    status, body, content_type = get(world[0]["serve"].master_url)
    assert status == 200
    master = Scrape("serve", body.decode(), content_type)
    assert served_extender(master) == served_extender(world[1]["serve"])
    done = subprocess.run([promtool(), "check", "metrics"], input=master.text, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@pytest.mark.integration
@pytest.mark.parametrize("process", PROCESSES)
def test_the_docs_table_lists_what_the_process_serves(scrapes: dict[str, Scrape], process: str) -> None:
    tables = documented()
    assert process in tables, f"docs/monitoring.md has no '## Metrics of `extender {process}`' section"
    served = served_extender(scrapes[process])
    assert {"documented, not served": sorted(tables[process] - served),
            "served, not documented": sorted(served - tables[process])} == {
        "documented, not served": [], "served, not documented": []}


@pytest.mark.integration
def test_every_metric_the_docs_name_is_served(scrapes: dict[str, Scrape]) -> None:
    served = set().union(*(s.sample_names() | set(s.families()) for s in scrapes.values()))
    named: dict[str, list[str]] = {}
    for page in sorted(DOCS.glob("*.md")):
        for name in MENTION.findall(page.read_text()):
            named.setdefault(name, []).append(page.name)
    unknown = {name: pages for name, pages in named.items() if name not in served}
    assert unknown == {}


#: (page, process, prefix): a page of docs/ whose metric list must name every family of ``process``
#: that starts with ``prefix``, and nothing else with it.
PAGE_LISTS = [
    ("extender.md", "serve", "extender_"),
    ("warming.md", "scale", "extender_warm_"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("page", "process", "prefix"), PAGE_LISTS, ids=[p[0] for p in PAGE_LISTS])
def test_the_metric_lists_of_other_pages_are_complete(scrapes: dict[str, Scrape], page: str, process: str,
                                                      prefix: str) -> None:
    named = {n for n in MENTION.findall((DOCS / page).read_text()) if n.startswith(prefix)}
    served = {n for n in served_extender(scrapes[process]) if n.startswith(prefix)}
    assert sorted(served - named) == []
    assert sorted(named - served) == []


def test_docs_tables_parse() -> None:
    """The section and row patterns find every process (a broken heading would make the comparison vacuous)."""
    tables = documented()
    assert sorted(tables) == sorted(PROCESSES)
    assert all(tables.values())


def test_metric_names_follow_the_conventions() -> None:
    """The unit is last and in base units in every documented name (promtool checks the served ones)."""
    names = set().union(*documented().values())
    bad = sorted(n for n in names if re.search(r"_(ms|milliseconds|minutes|hours|kb|mb|gb|mib|gib|percent)(_|$)", n)
                 or re.search(r"_seconds_(?!total$|bucket$|count$|sum$)[a-z]", n))
    assert bad == []
