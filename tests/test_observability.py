"""Recording rules, alert rules, the prometheus-adapter rules and the Grafana dashboard.

promtool (Debian's prometheus package) checks the rule files and the PrometheusRules the chart and the
operator render, and runs the unit tests in tests/promtool/ on synthetic series, with the rule files
made fresh beside them from their sources (qwen_operator.recording, the chart's alert file, the
operator's builder). Every metric name the rules and the dashboard use must exist: vLLM's from the vLLM
0.32 package itself (its metric loggers), the router's from the vllm-router 0.1.17 extension, the
gateway's from docs/gateway.md, kube-state-metrics' from the list below, the operator's from its own
registry, the lora-sync sidecar's from its collector, the recorded ones from qwen_operator.recording.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from qwen_devtools.generate.files import (
    RECORDING_RULES,
    adapter_values_file,
    dashboard_json,
    recording_rules_file,
)
from qwen_devtools.require import missing
from qwen_devtools.vllm_env import vllm_venv
from qwen_operator import activator, lorasync, names, recording
from qwen_operator import metrics as operator_metrics
from qwen_operator.api.review import review
from qwen_operator.manifests.monitoring import build_engine_service_monitor, build_prometheus_rule
from support import EXAMPLES, example, load
from test_chart import CHART, one, render

REPO = Path(__file__).resolve().parents[1]
RULES = CHART / "rules" / "qwen-serving.rules.yaml"
RECORDING = REPO / RECORDING_RULES
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
    "QwenQueueMetricAbsent",
    "QwenEngineRestarts",
    "QwenLoraAdapterLoadFailed",
    "QwenLoraSyncEngineUnreachable",
}
LORA_DEPLOYMENT_ALERTS = {"QwenDeploymentLoraAdapterLoadFailed", "QwenDeploymentLoraSyncEngineUnreachable"}
DEPLOYMENT_ALERTS = {
    "QwenDeploymentNoReadyEngines",
    "QwenDeploymentQueueAtCapacity",
    "QwenDeploymentKVCacheSaturated",
    "QwenDeploymentQueueMetricAbsent",
    *LORA_DEPLOYMENT_ALERTS,
}
#: Prometheus' own series (every target's `up`).
PROMETHEUS_SERIES = {"up"}
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


def recording_file() -> dict[str, Any]:
    """The chart's recording rules, made fresh from qwen_operator.recording."""
    return yaml.safe_load(recording_rules_file())


def deployment_body(lora: bool = True) -> dict[str, Any]:
    """tests/promtool/qwen-deployment.test.yaml's CR: llm/chat, 2 replicas, one adapter (or no spec.lora)."""
    body = example("a100-80gb-tp2-bf16")
    body["metadata"].update(name="chat", namespace="llm", uid="0b1c2d3e-0000-4000-8000-000000000001")
    body["spec"]["replicas"] = 2
    body["spec"]["monitoring"] = {"prometheusRule": True, "serviceMonitor": True}
    if lora:
        hub = {"repo": "org/support-lora", "revision": "0123456789abcdef0123456789abcdef01234567"}
        body["spec"]["lora"] = {"adapters": [{"name": "support", "source": {"huggingFace": hub}}]}
    return body


def deployment_rule(lora: bool = True) -> dict[str, Any]:
    """The PrometheusRule the operator renders for tests/promtool/qwen-deployment.test.yaml's CR."""
    return build_prometheus_rule(review(deployment_body(lora)))


def stage_unit_test(unit_test: Path, tmp: Path) -> Path:
    """A copy of a promtool test file beside the rule files it names, each made from its source."""
    sources: dict[str, Callable[[], str]] = {
        "qwen-recording.rules.yaml": recording_rules_file,
        "qwen-serving.rules.yaml": RULES.read_text,
        "qwen-deployment.rules.yaml": lambda: yaml.safe_dump(deployment_rule()["spec"]),
    }
    for name in yaml.safe_load(unit_test.read_text())["rule_files"]:
        (tmp / name).write_text(sources[name]())
    staged = tmp / unit_test.name
    staged.write_text(unit_test.read_text())
    return staged


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


def lora_sync_metric_names() -> set[str]:
    """Series names the lora-sync sidecar exposes, from its collector on a report with one adapter."""
    adapter = lorasync.AdapterReport(loaded=False, error="HTTP 400: rank 64 > 16", load_failures=1)
    report = lorasync.Report({"support": adapter}, engine_reachable=True, last_sync=1.0)
    collector = lorasync.ReportCollector(lambda: report)
    return {sample.name for family in collector.collect() for sample in family.samples}


def activator_metric_names() -> set[str]:
    """Series names the activator exposes, from its registry (every labelled series given a value)."""
    metrics = activator.Metrics()
    metrics.wait.labels(outcome="forwarded").observe(1.0)
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


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
    assert {"qwen_lora_adapter_loaded", "qwen_lora_adapter_load_failures_total"} <= lora_sync_metric_names()


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_name_exists(source: str) -> None:
    if source == "rules":
        recorded = [r for g in recording_file()["groups"] for r in g["rules"]]
        deployment = deployment_rule()["spec"]["groups"][0]["rules"]
        exprs = [r["expr"] for r in alert_rules() + recorded + deployment]
    else:
        exprs = dashboard_exprs()
    used = set().union(*(metric_names(e) for e in exprs))
    allowed = vllm_metrics() | router_metrics() | KUBE_STATE_METRICS | operator_metric_names()
    allowed |= set(recording.RECORDED) | PROMETHEUS_SERIES | lora_sync_metric_names()
    allowed |= activator_metric_names()
    gateway_used = {n for n in used if n.startswith(("vllm_router_", "qwen_gateway_", "nginx"))}
    if gateway_used:
        allowed |= gateway_doc_metrics()
    unknown = sorted(used - allowed)
    assert not unknown, f"{source} use metric names no component exposes: {unknown}"


def test_gateway_metrics_are_the_documented_ones() -> None:
    used = set().union(*(metric_names(e) for e in dashboard_exprs()))
    others = set(recording.RECORDED) | lora_sync_metric_names()
    gateway_used = {n for n in used - others if not n.startswith(("vllm:", "kube_", "qwen_operator_"))}
    assert gateway_used, "the dashboard shows no gateway metric"
    undocumented = sorted(gateway_used - gateway_doc_metrics())
    assert not undocumented, f"not in docs/gateway.md: {undocumented}"


# --- rules -----------------------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", str(RULES), str(RECORDING))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout
    assert f"SUCCESS: {len(recording.RECORDED)} rules found" in result.stdout


@pytest.mark.parametrize(
    ("sets", "groups"),
    [
        ((), ["qwen-recording", "qwen-serving"]),
        (("prometheusRule.recordingRules=false",), ["qwen-serving"]),
        (("prometheusRule.alerts=false",), ["qwen-recording"]),
    ],
)
def test_the_rendered_prometheusrule_is_the_rule_files(
    tmp_path: Path, sets: tuple[str, ...], groups: list[str]
) -> None:
    rule = one(render(None, "prometheusRule.enabled=true", *sets), "PrometheusRule")
    files = {g["name"]: g for f in (recording_file(), rule_file()) for g in f["groups"]}
    assert rule["spec"] == {"groups": [files[name] for name in groups]}
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_disabled_alerts_can_name_every_alert() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    rule_values = schema["properties"]["prometheusRule"]["properties"]
    assert set(rule_values["disabledAlerts"]["items"]["enum"]) == ALERTS


def test_no_prometheusrule_without_rules() -> None:
    objects = render(
        None,
        "prometheusRule.enabled=true",
        "prometheusRule.alerts=false",
        "prometheusRule.recordingRules=false",
    )
    assert "PrometheusRule" not in {o["kind"] for o in objects}


@pytest.mark.parametrize("unit_test", UNIT_TESTS, ids=lambda p: p.stem)
def test_promtool_unit_tests(unit_test: Path, tmp_path: Path) -> None:
    staged = stage_unit_test(unit_test, tmp_path)
    result = run_promtool("test", "rules", staged.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_tests_cover_every_alert_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    recorded: set[str] = set()
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else silent).add(case["alertname"])
            recorded |= {n for case in test.get("promql_expr_test", []) for n in metric_names(case["expr"])}
    assert firing == silent == ALERTS | DEPLOYMENT_ALERTS
    assert recorded == set(recording.RECORDED)


def test_alerts_read_no_vllm_series() -> None:
    """A vLLM rename is fixed in qwen_operator.recording alone: alerts read only recorded series."""
    for rule in alert_rules() + deployment_rule()["spec"]["groups"][0]["rules"]:
        if "alert" in rule:
            assert not [n for n in metric_names(rule["expr"]) if n.startswith("vllm:")], rule["alert"]


def test_recording_rules_read_the_vllm_names_of_recording_py() -> None:
    vllm = {
        n
        for g in recording_file()["groups"]
        for r in g["rules"]
        for n in metric_names(r["expr"])
        if n.startswith("vllm:")
    }
    assert vllm == {recording.VLLM_WAITING, recording.VLLM_KV_CACHE_USAGE, recording.VLLM_TTFT + "_bucket"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_deployment_rule_passes_promtool(path: Path, tmp_path: Path) -> None:
    body = load(path)
    body["metadata"]["uid"] = "0b1c2d3e-0000-4000-8000-000000000001"
    body["spec"]["monitoring"] = {"prometheusRule": True}
    spec = build_prometheus_rule(review(body))["spec"]
    rules = tmp_path / "deployment.rules.yaml"
    rules.write_text(yaml.safe_dump(spec))
    result = run_promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = [r["record"] for r in spec["groups"][0]["rules"] if "record" in r]
    assert recorded == list(recording.RECORDED)


def test_the_engine_service_monitor_labels_series_with_the_deployment() -> None:
    body = example("a100-80gb-tp2-bf16")
    body["metadata"]["uid"] = "0b1c2d3e-0000-4000-8000-000000000001"
    rev = review(body)
    (endpoint,) = build_engine_service_monitor(rev)["spec"]["endpoints"]
    (relabel,) = endpoint["relabelings"]
    assert relabel["targetLabel"] == recording.DEPLOYMENT_LABEL
    # the pod label the relabeling reads carries the QwenDeployment's name
    assert (
        names.selector(rev.resource, "engine")[recording.DEPLOYMENT_POD_LABEL] == rev.resource.metadata.name
    )
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"]


def test_the_lora_alerts_come_with_spec_lora_only() -> None:
    def alerts(rule: dict[str, Any]) -> set[str]:
        return {r["alert"] for r in rule["spec"]["groups"][0]["rules"] if "alert" in r}

    assert alerts(deployment_rule(lora=True)) == DEPLOYMENT_ALERTS
    assert alerts(deployment_rule(lora=False)) == DEPLOYMENT_ALERTS - LORA_DEPLOYMENT_ALERTS


def test_a_failing_adapter_fails_again_within_the_alert_window() -> None:
    """The load-failure alerts need a new failure in every window while an adapter keeps failing: the
    sidecar's longest backoff, one round (its --interval, 2 s) and one load attempt must fit in it."""
    match = re.fullmatch(r"(\d+)m", recording.LORA_FAILURE_WINDOW)
    assert match, recording.LORA_FAILURE_WINDOW
    retry = lorasync.BACKOFF_MAX + 2.0 + sum(lorasync.TIMEOUT)
    assert retry < int(match.group(1)) * 60
    assert f"[{recording.LORA_FAILURE_WINDOW}]" in json.dumps(alert_rules())


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


# --- the autoscaling signal: prometheus-adapter and KEDA ---------------------------------------------


def test_the_adapter_values_are_the_adapters_rules() -> None:
    """(The generated files' freshness is `make verify`'s drift check.)"""
    assert yaml.safe_load(adapter_values_file()) == {"rules": {"custom": recording.adapter_rules()}}


@pytest.mark.parametrize("namespace", ["", "monitoring"])
def test_the_adapter_configmap_is_the_adapter_config(namespace: str) -> None:
    sets = ["prometheusAdapter.configMap.enabled=true"]
    if namespace:
        sets.append(f"prometheusAdapter.configMap.namespace={namespace}")
    config_map = one(render(None, *sets), "ConfigMap", "qwen-operator-prometheus-adapter")
    assert config_map["metadata"]["namespace"] == (namespace or "qwen-operator-system")
    assert yaml.safe_load(config_map["data"]["config.yaml"]) == recording.adapter_config()


def _adapter_query(rule: dict[str, Any], matchers: str, group_by: str) -> str:
    """The query prometheus-adapter makes of a rule's metricsQuery template for one request."""
    series = rule["seriesQuery"].split("{", 1)[0]
    template = rule["metricsQuery"]
    return (
        template.replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", group_by)
    )


def test_adapter_and_keda_queries_read_the_engine_queue(tmp_path: Path) -> None:
    """The HPA's per-pod value (the adapter's query) and KEDA's total, from vLLM series, in promtool."""
    (rule,) = recording.adapter_rules()
    assert rule["name"]["as"] == recording.ADAPTER_METRIC
    assert re.fullmatch(rule["name"]["matches"], recording.ENGINE_QUEUE_DEPTH)
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    pods = ["chat-engine-6d4b9c7f8-abcde", "chat-engine-6d4b9c7f8-fghij"]
    labels = f'namespace="llm",{recording.DEPLOYMENT_LABEL}="chat",engine="0"'
    series = [
        {"series": f'{recording.VLLM_WAITING}{{{labels},pod="{pod}"}}', "values": f"{n}x10"}
        for pod, n in zip(pods, (3, 5), strict=True)
    ]
    matchers = f'namespace="llm",pod=~"{"|".join(pods)}"'
    test = {
        "rule_files": ["qwen-recording.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": _adapter_query(rule, matchers, "pod"),
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": f'{{pod="{p}"}}', "value": v}
                            for p, v in zip(pods, (3, 5), strict=True)
                        ],
                    },
                    {
                        "expr": recording.deployment_queue_query("llm", "chat"),
                        "eval_time": "5m",
                        "exp_samples": [{"labels": "{}", "value": 8}],
                    },
                ],
            }
        ],
    }
    (tmp_path / "qwen-recording.rules.yaml").write_text(recording_rules_file())
    (tmp_path / "adapter.test.yaml").write_text(yaml.safe_dump(test))
    result = run_promtool("test", "rules", "adapter.test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_scaling_builders_read_the_recorded_names() -> None:
    """The HPA's metric and KEDA's query (api/queueing.py) name what recording.py records and serves."""
    queueing = pytest.importorskip("qwen_operator.api.queueing")
    assert queueing.QUEUE_METRIC == recording.VLLM_WAITING
    assert queueing.QUEUE_RECORDING == recording.ENGINE_QUEUE_DEPTH
    assert queueing.DEPLOYMENT_LABEL == recording.DEPLOYMENT_LABEL
    assert queueing.HPA_METRIC == recording.ADAPTER_METRIC
    assert queueing.keda_query("llm", "chat") == recording.deployment_queue_query("llm", "chat")


def test_the_documented_autoscaling_signal_is_the_generated_one() -> None:
    doc = MONITORING_DOC.read_text()
    assert "\n## Autoscaling signal\n" in doc
    section = doc.split("\n## Autoscaling signal\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert yaml.safe_load(blocks[0]) == recording.adapter_chart_values()
    assert recording.deployment_queue_query("<namespace>", "<name>") in section
    for name in (recording.ENGINE_QUEUE_DEPTH, recording.ADAPTER_METRIC, recording.VLLM_WAITING):
        assert f"`{name}`" in section


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
        "qwen_deployment:queue_depth:sum",
        "qwen_engine:queue_depth",
        "vllm:num_requests_running",
        "qwen_deployment:kv_cache_usage:max",
        "qwen_engine:kv_cache_usage",
        "qwen_deployment:ttft_seconds:p99",
        "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket",
        "rate(vllm:generation_tokens_total",
        "kube_deployment_status_replicas_available",
        "kube_horizontalpodautoscaler_status_desired_replicas",
    ):
        assert needle in text, f"no panel queries {needle}"
    titles = " ".join(p["title"].lower() for p in dashboard_panels())
    assert "error" in titles and "rate-limited" in titles


def dashboard_rows() -> dict[str, list[dict[str, Any]]]:
    """Row title -> the panels under it."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], [])
        else:
            current.append(panel)
    return rows


def test_dashboard_shows_the_lora_adapters() -> None:
    """Where each adapter is loaded (from the sidecars, which read the engines' /v1/models), load
    failures, vLLM's adapters in flight, and requests per model name at the gateway."""
    panels = dashboard_rows()["LoRA adapters"]
    exprs = {t["expr"]: p for p in panels for t in p["targets"]}
    text = " ".join(exprs)
    for needle in (
        f"sum by (adapter) ({recording.LORA_ADAPTER_LOADED}{{",
        f"count by (adapter) ({recording.LORA_ADAPTER_LOADED}{{",
        f"max by (pod, adapter) ({recording.LORA_ADAPTER_LOADED}{{",
        f"sum by (adapter) (increase({recording.LORA_LOAD_FAILURES}{{",
        "group_left () max by (namespace, pod) (vllm:lora_requests_info{",
        "sum by (model) (rate(qwen_gateway_http_response_count_total{",
        f"min by (pod) ({recording.LORA_ENGINE_REACHABLE}{{",
    ):
        assert needle in text, f"no LoRA panel queries {needle}"
    info = next(p for e, p in exprs.items() if "vllm:lora_requests_info" in e)
    assert info["type"] == "table"
    assert all(t["format"] == "table" and t["instant"] for t in info["targets"])
    shown = info["transformations"][0]["options"]["include"]["names"]
    assert {"pod", "running_lora_adapters", "max_lora"} <= set(shown)


def test_lora_requests_info_means_what_the_dashboard_says() -> None:
    """The dashboard shows vllm:lora_requests_info as one list of adapters with requests in the engine,
    and its value as the time of the update. In vLLM 0.32 both labels list every adapter with a
    request in the engine, running or waiting (one loop fills both dicts, counts included), and the
    gauge is set to the current time. A vLLM that splits them needs another panel."""
    stats = _vllm_loggers().with_name("stats.py").read_text()
    loop = re.search(r"for lora_name, stats in self\.requests\.items\(\):\n((?:\s{12}.*\n)+)", stats)
    assert loop, "vLLM's LoRARequestStates.update_scheduler_stats changed"
    assert "waiting_lora_adapters[lora_name] = len(stats.waiting)" in loop.group(1)
    assert "running_lora_adapters[lora_name] = len(stats.running)" in loop.group(1)
    assert ".labels(**lora_info_labels).set_to_current_time()" in _vllm_loggers().read_text()


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
