"""The monitoring files (deploy/prometheus, deploy/grafana), checked with Prometheus' own promtool.

The alert rules and the scrape config pass ``promtool check``, the rules' unit tests pass ``promtool
test rules`` and cover every alert, every rule names its severity and a runbook section that exists in
docs/operations.md, and every series a rule or a dashboard panel queries is one the product defines
(app/core/metrics.py, app/ops/metrics.py) or Prometheus adds (``up``), each panel's query being valid
PromQL. A metric renamed in the code fails here, not on a blank dashboard in production.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import app.core.metrics as core_metrics
from app.ops.metrics import state_metrics
from app.ops.pipeline_state import PipelineState

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"
MISSING = "Debian's prometheus package is not installed: run `make prometheus`"
# Series Prometheus writes itself for each target.
SCRAPE_SERIES = {"up"}
SEVERITIES = {"critical", "warning"}


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(MISSING, pytrace=False)
    return subprocess.run([path, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target."""
    return [
        (f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


# --- the names a query uses ----------------------------------------------------------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}
_KEYWORDS |= {"inf", "nan"}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w$.:])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects: not functions, keywords, labels or durations."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = _GROUPING.sub(" ", text)  # label lists
    names = set()
    for match in _NAME.finditer(text):
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, provider) (rate(webhook_pipeline_seconds_bucket{provider=~"$p"}'
        '[$__rate_interval]))) > 60 or on () absent(up{job="worker"}) and count(up offset 1h) * 2e3'
        " unless min_over_time(timestamp(max by (cron) (cron_period_seconds))[15d:5m])"
    )
    assert metric_names(expr) == {"webhook_pipeline_seconds_bucket", "up", "cron_period_seconds"}


def defined_series() -> dict[str, str]:
    """Every series name the product exposes -> its metric family."""
    families = [
        family
        for metric in vars(core_metrics).values()
        if isinstance(metric, MetricWrapperBase)
        for family in metric.describe()
    ]
    families += list(state_metrics(PipelineState()))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    series = {family.name + suffix: family.name for family in families for suffix in suffixes.get(family.type, ("",))}
    assert {"webhook_deliveries_total", "webhook_pipeline_seconds_bucket", "workers_alive"} <= set(series)
    return series


# --- promtool ----------------------------------------------------------------------------------------


def test_alert_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_alert_rules_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_prometheus_config_passes_promtool_check(tmp_path: Path) -> None:
    """The shipped file with its container paths (rules, token file) pointed into a copy."""
    config = yaml.safe_load(CONFIG.read_text())
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    config["rule_files"] = ["alerts.yml"]
    token = tmp_path / "metrics_token"
    token.write_text("")  # no METRICS_TOKEN: an empty file
    for job in config["scrape_configs"]:
        assert job["authorization"]["credentials_file"] == "/run/secrets/metrics_token", job["job_name"]
        job["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


# --- the alert rules ---------------------------------------------------------------------------------


def headings_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings."""
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            title = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            anchors.add(title.replace(" ", "-"))
    return anchors


def test_every_alert_waits_names_its_severity_and_points_at_its_runbook() -> None:
    anchors = headings_anchors(OPERATIONS.read_text())
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), "alert names must be unique"
    for rule in rules():
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no `for:` duration"
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations["summary"] and len(annotations["description"]) > 80, name
        document, _, anchor = annotations["runbook"].partition("#")
        assert document == "docs/operations.md", name
        assert anchor in anchors, f"{name}: docs/operations.md has no section #{anchor}"


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else silent).add(check["alertname"])
    names = {rule["alert"] for rule in rules()}
    assert not names - fired, f"never shown firing in alerts_test.yml: {sorted(names - fired)}"
    must_stay_silent = names - {"ApiMetricsDown", "WorkerMetricsDown"}  # plain `up == 0`
    assert not must_stay_silent - silent, f"never shown silent: {sorted(must_stay_silent - silent)}"


def test_alert_rules_query_only_defined_series() -> None:
    defined = set(defined_series()) | SCRAPE_SERIES
    for rule in rules():
        used = metric_names(rule["expr"])
        assert used, f"{rule['alert']}: no series found in its expression"
        unknown = used - defined
        assert not unknown, f"{rule['alert']} queries series nothing defines: {sorted(unknown)}"


_UNDER_MAX = re.compile(r"(?:\bmax\s*(?:by\s*\([^)]*\)\s*)?|\babsent\s*)\($")


def test_scrape_time_gauges_are_taken_the_max_of_never_summed() -> None:
    """Every API instance shows the same values: a sum would count them once per instance."""
    gauges = {name for name, family in defined_series().items() if name == family}
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [rule["expr"] for rule in rules()] + [expr for _, expr in panel_queries(dashboard)]
    checked = 0
    for expr in expressions:
        for gauge in gauges & metric_names(expr):
            for match in re.finditer(rf"(?<![\w:]){gauge}(?![\w:])", expr):
                assert _UNDER_MAX.search(expr[: match.start()].rstrip()), f"{gauge} not under max(): {expr}"
                checked += 1
    assert checked >= 10


# --- the dashboard -----------------------------------------------------------------------------------


def test_dashboard_is_grafana_json_with_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    every = panels(dashboard)
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    taken: set[tuple[int, int]] = set()
    for panel in every:
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(position["x"], position["x"] + position["w"])
            for y in range(position["y"], position["y"] + position["h"])
        }
        assert not cells & taken, f"{panel['title']!r} overlaps another panel"
        taken |= cells
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"], panel["title"]


def test_dashboard_queries_only_defined_series_and_shows_every_one() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    defined = defined_series()
    shown = set()
    for where, expr in panel_queries(dashboard):
        used = metric_names(expr)
        assert used, f"{where}: no series in {expr}"
        unknown = used - set(defined) - SCRAPE_SERIES
        assert not unknown, f"{where} queries series nothing defines: {sorted(unknown)}"
        shown |= {defined[name] for name in used if name in defined}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"])
            assert match and match[1] in defined, variable["name"]
    missing = set(defined.values()) - shown
    assert not missing, f"metrics without a panel: {sorted(missing)}"


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Each query as a recording rule, so promtool parses it; Grafana's variables as Prometheus sees them."""
    dashboard = json.loads(DASHBOARD.read_text())
    recorded = []
    for index, (_, expr) in enumerate(panel_queries(dashboard)):
        concrete = expr.replace("$__rate_interval", "1m").replace("$provider", ".*")
        assert "$" not in concrete, f"a Grafana variable this test does not know: {expr}"
        recorded.append({"record": f"dashboard:query_{index}", "expr": concrete})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
