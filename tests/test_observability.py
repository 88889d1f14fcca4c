"""Alert rules and the Grafana dashboard the chart ships.

promtool (Debian's prometheus package) checks the rule file and the PrometheusRule the chart renders,
and runs the unit tests in tests/promtool/ on synthetic series. Every metric name the rules and the
dashboard use must exist: vLLM's from the vLLM 0.32 package itself (its metric loggers), the router's
from the vllm-router 0.1.17 extension, the gateway's from docs/gateway.md, kube-state-metrics' from
the list below, the operator's from its own registry.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from qwen_devtools.generate.files import dashboard_json
from qwen_devtools.require import missing
from qwen_devtools.vllm_env import vllm_venv
from qwen_operator import metrics as operator_metrics
from test_chart import CHART, one, render

REPO = Path(__file__).resolve().parents[1]
RULES = CHART / "rules" / "qwen-serving.rules.yaml"
DASHBOARD = CHART / "dashboards" / "qwen-serving.json"
GATEWAY_DOC = REPO / "docs" / "gateway.md"
MONITORING_DOC = REPO / "docs" / "monitoring.md"
UNIT_TESTS = sorted((REPO / "tests" / "promtool").glob("*.yaml"))
ALERTS = {
    "QwenNoReadyReplicas",
    "QwenQueueGrowingAtMaxReplicas",
    "QwenKVCacheSaturated",
    "QwenHighTTFTP99",
    "QwenScalingMetricAbsent",
    "QwenEngineRestarts",
}
#: kube-state-metrics v2 series the rules and the dashboard read (stable metrics of its docs).
KUBE_STATE_METRICS = {
    "kube_deployment_spec_replicas",
    "kube_deployment_status_replicas_available",
    "kube_horizontalpodautoscaler_spec_max_replicas",
    "kube_horizontalpodautoscaler_status_desired_replicas",
    "kube_horizontalpodautoscaler_status_condition",
    "kube_pod_container_status_restarts_total",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "inf", "nan",
}  # fmt: skip
GRAFANA_VARS = {"$namespace": ".+", "$deployment": ".+", "$__rate_interval": "5m"}


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        missing("promtool", "run `make setup` (tools/system-packages.sh installs Debian's prometheus)")
    return str(found)


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def rule_file() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in rule_file()["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p["targets"]]


# --- metric names ----------------------------------------------------------------------------------


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (label names, functions and keywords removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:$.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", text):
        name = match.group(1)
        if name.lower() not in PROMQL_WORDS:
            names.add(name)
    return names


def _vllm_loggers() -> Path:
    found = sorted(vllm_venv().glob("lib/python3*/site-packages/vllm/v1/metrics/loggers.py"))
    if not found:
        missing(f"the vLLM CPU venv {vllm_venv()}", "run `make setup` (tools/vllm-env.sh)")
    return found[0]


def vllm_metrics() -> set[str]:
    """Series names vLLM 0.32 exposes, read from the metric definitions in the package."""
    text = _vllm_loggers().read_text()
    names: set[str] = set()
    for kind, name in re.findall(r'self\._(gauge|counter|histogram)_cls\(\s*name="(vllm:\w+)"', text):
        if kind == "counter":
            names.add(f"{name}_total")  # prometheus_client appends _total to counters
        elif kind == "histogram":
            names |= {name + suffix for suffix in HISTOGRAM_SUFFIXES}
        else:
            names.add(name)
    return names


def router_metrics() -> set[str]:
    """Series names vllm-router 0.1.17 can expose, read from its compiled extension."""
    found = sorted(vllm_venv().glob("lib/python3*/site-packages/vllm_router_rs*.so"))
    if not found:
        missing("vllm-router", "run `make setup` (tools/vllm-env.sh installs vllm-router)")
    raw = set(re.findall(rb"vllm_router_[a-z_]+?(?=vllm_router_|[^a-z_])", found[0].read_bytes()))
    names = {n.decode() for n in raw}
    return names | {n + suffix for n in names for suffix in HISTOGRAM_SUFFIXES}


def gateway_doc_metrics() -> set[str]:
    """Metric names docs/gateway.md documents (in backticks, optionally with labels)."""
    assert GATEWAY_DOC.exists(), "docs/gateway.md (the gateway's metric reference) is missing"
    names = set(re.findall(r"`([a-z_][a-z0-9_:]*)(?:\{[^`]*\})?`", GATEWAY_DOC.read_text()))
    return {n for n in names if "_" in n} | {n + s for n in names for s in HISTOGRAM_SUFFIXES}


def operator_metric_names() -> set[str]:
    names = set()
    for collector in vars(operator_metrics).values():
        if isinstance(collector, MetricWrapperBase):
            for family in collector.describe():
                names |= set(_sample_names(family.name, family.type))
    return names


def _sample_names(name: str, kind: str) -> Iterator[str]:
    if kind == "counter":
        yield f"{name}_total"
    elif kind == "histogram":
        yield from (name + suffix for suffix in HISTOGRAM_SUFFIXES)
    else:
        yield name


def test_metric_name_extraction() -> None:
    expr = 'sum by (pod) (rate(vllm:x_total{pod=~"a-.+"}[5m])) / on (pod) group_left max(kube_y) > bool 0'
    assert metric_names(expr) == {"vllm:x_total", "kube_y"}


def test_allow_list_comes_from_the_real_packages() -> None:
    vllm = vllm_metrics()
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:num_preemptions_total",
    } <= vllm
    assert "vllm:gpu_cache_usage_perc" not in vllm  # removed before 0.32; peers still query it
    assert {"vllm_router_requests_total", "vllm_router_worker_health"} <= router_metrics()
    assert "qwen_operator_reconciles_total" in operator_metric_names()


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_name_exists(source: str) -> None:
    exprs = [r["expr"] for r in alert_rules()] if source == "rules" else dashboard_exprs()
    used = set().union(*(metric_names(e) for e in exprs))
    allowed = vllm_metrics() | router_metrics() | KUBE_STATE_METRICS | operator_metric_names()
    gateway_used = {n for n in used if n.startswith(("vllm_router_", "qwen_gateway_", "nginx"))}
    if gateway_used:
        allowed |= gateway_doc_metrics()
    unknown = sorted(used - allowed)
    assert not unknown, f"{source} use metric names no component exposes: {unknown}"


def test_gateway_metrics_are_the_documented_ones() -> None:
    used = set().union(*(metric_names(e) for e in dashboard_exprs()))
    gateway_used = {n for n in used if not n.startswith(("vllm:", "kube_", "qwen_operator_"))}
    assert gateway_used, "the dashboard shows no gateway metric"
    undocumented = sorted(gateway_used - gateway_doc_metrics())
    assert not undocumented, f"not in docs/gateway.md: {undocumented}"


# --- rules -----------------------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_the_rendered_prometheusrule_is_the_rule_file(tmp_path: Path) -> None:
    rule = one(render(None, "prometheusRule.enabled=true"), "PrometheusRule")
    assert rule["spec"] == rule_file()
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("unit_test", UNIT_TESTS, ids=lambda p: p.stem)
def test_promtool_unit_tests(unit_test: Path) -> None:
    result = run_promtool("test", "rules", unit_test.name, cwd=unit_test.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_tests_cover_every_alert_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    assert firing == ALERTS
    assert silent == ALERTS


def test_alerts_are_the_documented_set_with_runbooks() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == ALERTS
    doc = MONITORING_DOC.read_text()
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[-1]
        assert anchor == rule["alert"].lower()
        assert f"### {rule['alert']}" in doc, f"docs/monitoring.md has no runbook for {rule['alert']}"


# --- dashboard -------------------------------------------------------------------------------------


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    exprs = dashboard_exprs()
    for placeholder, value in GRAFANA_VARS.items():
        exprs = [e.replace(placeholder, value) for e in exprs]
    assert not [e for e in exprs if "$" in e.replace('"$1"', "")], "unknown dashboard variable"
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_covers_what_operators_watch() -> None:
    text = " ".join(dashboard_exprs())
    for needle in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket",
        "rate(vllm:generation_tokens_total",
        "kube_deployment_status_replicas_available",
        "kube_horizontalpodautoscaler_status_desired_replicas",
    ):
        assert needle in text, f"no panel queries {needle}"
    titles = " ".join(p["title"].lower() for p in dashboard_panels())
    assert "error" in titles and "rate-limited" in titles


def test_dashboard_is_well_formed() -> None:
    model = dashboard()
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in model["templating"]["list"]}
    assert variables == {"datasource", "namespace", "deployment"}
    for panel in dashboard_panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"1", "__rate_interval"}
            assert used <= variables, f"{panel['title']}: {used - variables}"


def test_dashboard_json_is_generated() -> None:
    assert dashboard() == json.loads(dashboard_json()), "stale: run `make generate`"
