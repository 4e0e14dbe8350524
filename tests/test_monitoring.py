"""The alert rules, their unit tests, the runbook, the dashboard and the monitoring manifests.

* ``promtool check rules`` accepts the rules and ``promtool test rules`` passes their unit tests
  (deploy/monitoring/rules-test.yaml), which hold, for every alert, a case where it fires and one
  where it stays quiet;
* every alert links its section of docs/runbook.md, and every section there belongs to an alert;
* every metric the rules and the dashboard's queries name is one the code registers (the PromQL is
  parsed with ``promql-parser``, not searched with a pattern);
* deploy/monitoring's PodMonitors and PrometheusRule are the chart's rendering, which carries the
  rule file unchanged; ``monitoring.enabled`` is off by default.

No promtool is a failure of the install step: ``scripts/test`` installs Debian's ``prometheus``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import chart
from tests.metrics_catalog import metric_names, registered
from tests.prometheus_tools import prometheus_tool

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "deploy" / "monitoring"
RULES = chart.CHART / "monitoring" / "rules.yaml"
RULE_TESTS = MONITORING / "rules-test.yaml"
DASHBOARD = MONITORING / "dashboard.json"
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_BASE = "https://github.com/extender-project/extender/blob/main/docs/runbook.md"


def promtool() -> str:
    return prometheus_tool("promtool")


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable of the dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    out: list[tuple[str, str]] = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            # Grafana's label_values(METRIC, LABEL) is no PromQL: its first argument is a selector
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            out.append((f"variable {variable['name']}", found.group(1) if found else query))
    return out


ALERT_NAMES = [a["alert"] for a in alerts()]


# ---- promtool ---------------------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    done = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], cwd=MONITORING, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_rule_tests_read_the_charts_rule_file() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert [(MONITORING / f).resolve() for f in doc["rule_files"]] == [RULES.resolve()]


@pytest.mark.parametrize("alert", ALERT_NAMES)
def test_every_alert_has_a_firing_and_a_quiet_case(alert: str) -> None:
    cases = [c for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for c in test.get("alert_rule_test", []) if c["alertname"] == alert]
    assert any(c["exp_alerts"] for c in cases), f"no test where {alert} fires"
    assert any(not c["exp_alerts"] for c in cases), f"no test where {alert} stays quiet"


def test_the_alerts_an_on_call_needs_are_there() -> None:
    wanted = {"ExtenderFailingOpen", "ExtenderInventoryStale", "ExtenderNoScalerLeader", "ExtenderForecastErrorHigh",
              "ExtenderForecastUpperUndercovers", "ExtenderWarmJobsFailing", "ExtenderNvmeReserveBreached"}
    assert wanted <= set(ALERT_NAMES)


# ---- runbook ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("alert", ALERT_NAMES)
def test_every_alert_links_its_runbook_section(alert: str) -> None:
    (rule,) = [a for a in alerts() if a["alert"] == alert]
    assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#{alert.lower()}"
    assert {"summary", "description"} <= rule["annotations"].keys()
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}


def test_every_runbook_section_belongs_to_an_alert() -> None:
    sections = re.findall(r"^## (\S+)$", RUNBOOK.read_text(), re.M)
    assert sorted(sections) == sorted(ALERT_NAMES)


# ---- the metrics the rules and the dashboard read ---------------------------------------------------


@pytest.mark.parametrize("rule", [r.get("alert") or r.get("record") for r in rules()])
def test_every_metric_a_rule_reads_is_registered(rule: str) -> None:
    (found,) = [r for r in rules() if (r.get("alert") or r.get("record")) == rule]
    names = metric_names(found["expr"])
    assert names, "a rule that reads no metric"
    assert sorted(names - registered()) == []


def test_the_dashboard_has_panels_with_queries() -> None:
    doc = json.loads(DASHBOARD.read_text())
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len(panels) >= 20
    assert all(p.get("targets") for p in panels)
    assert {v["name"] for v in doc["templating"]["list"]} == {"DS_PROMETHEUS", "workload"}


@pytest.mark.parametrize(("where", "expr"), dashboard_queries(), ids=[w for w, _ in dashboard_queries()])
def test_every_dashboard_query_names_only_registered_metrics(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where} reads no metric"
    assert sorted(names - registered()) == []


def test_the_query_check_would_catch_a_wrong_name() -> None:
    """The parser sees through functions, aggregations and joins: a typo anywhere is found."""
    expr = ('histogram_quantile(0.9, sum by (le) (rate(extender_request_duration_seconds_bucket[5m]))) '
            '/ on() group_left max(extender_scaler_leaderr)')
    assert metric_names(expr) - registered() == {"extender_scaler_leaderr"}


# ---- the manifests ----------------------------------------------------------------------------------


def test_deploy_monitoring_is_the_charts_rendering() -> None:
    stale = [str(p.relative_to(ROOT)) for p, text in chart.monitoring_files().items()
             if not p.exists() or p.read_text() != text]
    assert stale == [], "run scripts/render-kustomize"


def test_the_prometheus_rule_carries_the_rule_file() -> None:
    (rule,) = [d for d in yaml.safe_load_all((MONITORING / "prometheusrule.yaml").read_text()) if d]
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_monitoring_is_off_by_default() -> None:
    kinds = {d["kind"] for d in chart.rendered()}
    assert not kinds & {"PodMonitor", "PrometheusRule", "ServiceMonitor"}


def test_monitoring_on_renders_a_pod_monitor_per_component_and_the_runbook_base() -> None:
    docs = chart.rendered(monitoring__enabled="true", monitoring__runbookBaseUrl="https://docs.example/runbook",
                          monitoring__labels__release="prom")
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    workloads = {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
                 for d in docs if d["kind"] in {"Deployment", "DaemonSet"}} - {"extender-redis"}
    selected = {m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] for m in monitors.values()}
    assert workloads <= selected
    assert all(m["metadata"]["labels"]["release"] == "prom" for m in monitors.values())
    rule = chart.one(docs, "PrometheusRule")
    urls = {r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert urls == {f"https://docs.example/runbook#{a.lower()}" for a in ALERT_NAMES}


#: (name, Deployment or DaemonSet, container, values): every process serves a port named metrics.
METRICS_PORTS = [
    ("extender", "scheduler-extender", "extender", {}),
    ("agent", "extender-agent", "agent", {}),
    ("sync", "extender-sync", "sync", {}),
    ("keda-scaler", "extender-keda-scaler", "keda-scaler", {"metrics__mode": "keda"}),
    ("scaler-without-api", "extender-scaler", "scaler", {"metrics__mode": "keda"}),
]


@pytest.mark.parametrize(("workload", "container", "values"), [m[1:] for m in METRICS_PORTS],
                         ids=[m[0] for m in METRICS_PORTS])
def test_every_process_serves_a_metrics_port(workload: str, container: str, values: dict[str, str]) -> None:
    docs = chart.rendered(**values)
    (found,) = [d for d in docs if d["kind"] in {"Deployment", "DaemonSet"} and d["metadata"]["name"] == workload]
    c = chart.container(found, container)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--metrics-bind=0.0.0.0:{ports['metrics']}" in c["args"]


# ---- what the docs tell an operator to reach ---------------------------------------------------------


#: Pages that tell an operator to reach a process: `curl http://HOST:PORT/...` and `kubectl port-forward`.
REACHING_PAGES = ["runbook.md", "troubleshooting.md", "extender.md", "monitoring.md", "agent-and-sync.md",
                  "scaler.md", "install.md"]
#: kubectl's short names of the kinds a port-forward may name.
KIND_NAMES = {"deploy": "Deployment", "deployment": "Deployment", "ds": "DaemonSet", "daemonset": "DaemonSet",
              "svc": "Service", "service": "Service", "sts": "StatefulSet", "statefulset": "StatefulSet"}


def _served_ports(docs: list[dict[str, Any]]) -> dict[tuple[str, str], set[int]]:
    """``(kind, name)`` of every workload and Service the chart renders, with the ports it serves."""
    out: dict[tuple[str, str], set[int]] = {}
    for d in docs:
        ports: set[int] = set()
        if d["kind"] == "Service":
            ports = {int(p["port"]) for p in d["spec"]["ports"]}  # a named targetPort is the workload's
        elif d["kind"] in {"Deployment", "DaemonSet", "StatefulSet"}:
            for c in d["spec"]["template"]["spec"]["containers"]:
                ports |= {int(p["containerPort"]) for p in c.get("ports", [])}
                ports |= {int(m) for a in c.get("args", []) for m in re.findall(r"^--[a-z-]+=[\d.]*:(\d+)$", a)}
        else:
            continue
        out.setdefault((d["kind"], d["metadata"]["name"]), set()).update(ports)
    return out


@pytest.mark.parametrize("page", REACHING_PAGES)
def test_the_ports_and_objects_the_docs_send_an_operator_to_are_rendered(page: str) -> None:
    """Ports, objects, namespaces (the chart's, installed in kube-system as docs/install.md does, and
    the ScaledObjects' ``default`` of its KEDA example) and ``app.kubernetes.io/name`` labels."""
    served: dict[tuple[str, str], set[int]] = {}
    namespaces, names = {chart.NAMESPACE, "default"}, set()
    for values in ({}, {"mode": "second-scheduler"}, {"metrics__mode": "keda"}, {"extender__listen": "tls"}):
        docs = chart.rendered(**values)
        for key, ports in _served_ports(docs).items():
            served.setdefault(key, set()).update(ports)
        namespaces |= {d["metadata"].get("namespace") or d["metadata"]["name"] for d in docs
                       if d["metadata"].get("namespace") or d["kind"] == "Namespace"}
        names |= {d["metadata"].get("labels", {}).get("app.kubernetes.io/name") for d in docs}
    every_port = set().union(*served.values())
    text = (ROOT / "docs" / page).read_text()
    wrong = [f"kubectl -n {ns}: the chart puts nothing there" for ns in re.findall(r"kubectl -n ([\w-]+)", text)
             if ns not in namespaces]
    wrong += [f"-l app.kubernetes.io/name={name}: no object carries it"
              for name in re.findall(r"-l app\.kubernetes\.io/name=([\w-]+)", text) if name not in names]
    for port in re.findall(r"curl (?:-\S+ )*https?://[A-Z_]+:(\d+)/", text):
        if int(port) not in every_port:
            wrong.append(f"curl to port {port}: no container serves it")
    for kind, name, port in re.findall(r"port-forward (\w+)/([\w-]+) (\d+)", text):
        key = (KIND_NAMES.get(kind, kind), name)
        if key not in served:
            wrong.append(f"port-forward {kind}/{name}: the chart renders no {key[0]} {name}")
        elif int(port) not in served[key]:
            wrong.append(f"port-forward {kind}/{name} {port}: it serves {sorted(served[key])}")
    assert wrong == []


def _warm_event_reasons() -> set[str]:
    """The ``reason=`` string literals the warmer passes: the reasons of the Events it writes."""
    import ast

    reasons: set[str] = set()
    for path in (ROOT / "extender" / "warm").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "reason" and isinstance(node.value, ast.Constant) \
                    and isinstance(node.value.value, str) and node.value.value.startswith("Warm"):
                reasons.add(node.value.value)
    return reasons


def test_the_event_reasons_the_docs_name_are_the_warmers() -> None:
    """An on-call filters Events by the reason the runbook names (``--field-selector reason=...``)."""
    emitted = _warm_event_reasons()
    assert {"WarmJobFailed", "WarmNotConfirmed"} <= emitted  # the scan finds the literals
    named = {page: set(re.findall(r"`(Warm[A-Za-z]*(?:Failed|Confirmed))`", (ROOT / "docs" / page).read_text()))
             for page in ("runbook.md", "troubleshooting.md", "warming.md")}
    assert {page: sorted(names - emitted) for page, names in named.items()} == \
           {page: [] for page in named}
    assert sorted(emitted - named["warming.md"]) == []  # the warming page names every one
