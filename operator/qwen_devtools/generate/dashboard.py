"""The Grafana dashboard "Qwen serving", built from a compact panel list (`make generate` writes the JSON).

Queue depth, KV cache usage and TTFT p99 (and the variables) read the recorded series of
qwen_operator.recording, as the alerts, prometheus-adapter and KEDA do, so a vLLM metric rename is fixed
there; they need the recording rules (the chart's prometheusRule) and select by `qwendeployment`. The
other queries select engine pods by name (<QwenDeployment>-engine-<hash>-<hash>) and gateway pods
likewise, so they work with any scrape config that keeps `namespace` and `pod`. Replica counts come
from kube-state-metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qwen_operator import recording

ENGINE = 'namespace=~"$namespace", pod=~"$deployment-engine-.+"'
RECORDED = f'namespace=~"$namespace", {recording.DEPLOYMENT_LABEL}=~"$deployment"'
GATEWAY = 'namespace=~"$namespace", pod=~"$deployment-gateway-.+"'
ENGINE_DEPLOYMENT = 'namespace=~"$namespace", deployment=~"$deployment-engine"'
ENGINE_HPA = 'namespace=~"$namespace", horizontalpodautoscaler=~"(keda-hpa-)?$deployment-engine"'
RATE = "$__rate_interval"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass
class Panel:
    """One panel: a title, its queries as (PromQL, legend) pairs, a unit and a kind."""

    title: str
    queries: list[tuple[str, str]]
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)


def _quantiles(
    metric: str, selector: str, quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)
) -> list[tuple[str, str]]:
    series = f"{metric}_bucket{{{selector}}}" if selector else f"{metric}_bucket"
    return [
        (f"histogram_quantile({q}, sum by (le) (rate({series}[{RATE}])))", f"p{round(q * 100)}")
        for q in quantiles
    ]


def _rows() -> list[tuple[str, list[Panel]]]:
    return [
        ("Overview", _overview()),
        ("Queue and load", _load()),
        ("Latency", _latency()),
        ("Throughput", _throughput()),
        ("Gateway", _gateway()),
        ("Replicas and restarts", _replicas()),
        ("Operator", _operator()),
    ]


def _overview() -> list[Panel]:
    return [
        Panel(
            "Engine replicas ready / desired",
            [
                (f"sum(kube_deployment_status_replicas_available{{{ENGINE_DEPLOYMENT}}})", "ready"),
                (f"sum(kube_deployment_spec_replicas{{{ENGINE_DEPLOYMENT}}})", "desired"),
            ],
            kind="stat",
        ),
        Panel("Requests running", [(f"sum(vllm:num_requests_running{{{ENGINE}}})", "running")], kind="stat"),
        Panel(
            "Requests waiting",
            [(f"sum({recording.DEPLOYMENT_QUEUE_DEPTH}{{{RECORDED}}})", "waiting")],
            kind="stat",
        ),
        Panel(
            "KV cache usage (fullest pod)",
            [(f"max({recording.DEPLOYMENT_KV_CACHE_USAGE}{{{RECORDED}}})", "max")],
            unit="percentunit",
            kind="stat",
        ),
        Panel(
            "Generated tokens/s",
            [(f"sum(rate(vllm:generation_tokens_total{{{ENGINE}}}[{RATE}]))", "tokens/s")],
            kind="stat",
        ),
        Panel(
            "Time to first token p99",
            [(f"max({recording.DEPLOYMENT_TTFT_P99}{{{RECORDED}}})", "p99")],
            description="Over 5 minutes (the recorded qwen_deployment:ttft_seconds:p99).",
            unit="s",
            kind="stat",
        ),
    ]


def _load() -> list[Panel]:
    return [
        Panel(
            "Waiting requests per engine pod",
            [(f"sum by (pod) ({recording.ENGINE_QUEUE_DEPTH}{{{RECORDED}}})", "{{pod}}")],
            description="The autoscaling signal (qwen_engine:queue_depth, served to the HPA as "
            "qwen_queue_depth): the HPA aims for targetQueueDepth per pod.",
        ),
        Panel(
            "Running requests per engine pod",
            [(f"sum by (pod) (vllm:num_requests_running{{{ENGINE}}})", "{{pod}}")],
            description="Bounded by spec.engine.maxNumSeqs.",
        ),
        Panel(
            "KV cache usage per engine pod",
            [(f"max by (pod) ({recording.ENGINE_KV_CACHE_USAGE}{{{RECORDED}}})", "{{pod}}")],
            unit="percentunit",
        ),
        Panel(
            "Preemptions/s per engine pod",
            [(f"sum by (pod) (rate(vllm:num_preemptions_total{{{ENGINE}}}[{RATE}]))", "{{pod}}")],
            description="Requests evicted from the KV cache and recomputed later: a sign of KV pressure.",
        ),
    ]


def _latency() -> list[Panel]:
    return [
        Panel("Time to first token", _quantiles("vllm:time_to_first_token_seconds", ENGINE), unit="s"),
        Panel("Inter-token latency", _quantiles("vllm:inter_token_latency_seconds", ENGINE), unit="s"),
        Panel("End-to-end request latency", _quantiles("vllm:e2e_request_latency_seconds", ENGINE), unit="s"),
        Panel("Time queued in the engine", _quantiles("vllm:request_queue_time_seconds", ENGINE), unit="s"),
    ]


def _throughput() -> list[Panel]:
    hits = f"sum(rate(vllm:prefix_cache_hits_total{{{ENGINE}}}[{RATE}]))"
    queries = f"sum(rate(vllm:prefix_cache_queries_total{{{ENGINE}}}[{RATE}]))"
    return [
        Panel(
            "Tokens/s",
            [
                (f"sum(rate(vllm:prompt_tokens_total{{{ENGINE}}}[{RATE}]))", "prompt"),
                (f"sum(rate(vllm:generation_tokens_total{{{ENGINE}}}[{RATE}]))", "generated"),
            ],
        ),
        Panel(
            "Finished requests/s by reason",
            [
                (
                    f"sum by (finished_reason) (rate(vllm:request_success_total{{{ENGINE}}}[{RATE}]))",
                    "{{finished_reason}}",
                )
            ],
            unit="reqps",
        ),
        Panel("Prefix cache hit rate", [(f"{hits} / {queries}", "hit rate")], unit="percentunit"),
    ]


def _gateway() -> list[Panel]:
    """nginx (per-key metrics from its access log, in-flight from stub_status) and vllm-router."""
    responses = "qwen_gateway_http_response_count_total"
    failed = f'{GATEWAY}, error!="", error!="rate_limited"'
    return [
        Panel(
            "Gateway requests/s by API key",
            [(f"sum by (key_id) (rate({responses}{{{GATEWAY}}}[{RATE}]))", "{{key_id}}")],
            unit="reqps",
        ),
        Panel(
            "Rate-limited requests/s by API key (429)",
            [
                (
                    f'sum by (key_id) (rate({responses}{{{GATEWAY}, error="rate_limited"}}[{RATE}]))',
                    "{{key_id}}",
                )
            ],
            unit="reqps",
            description="Requests over the key's rate and burst (spec.gateway.rateLimit).",
        ),
        Panel(
            "Gateway errors/s by cause",
            [(f"sum by (error) (rate({responses}{{{failed}}}[{RATE}]))", "{{error}}")],
            unit="reqps",
            description="overloaded and queue_timeout: load shed by the gateway; no_engine: no ready "
            "replica; unauthorized: bad or missing API key.",
        ),
        Panel(
            "Gateway latency (successful requests)",
            _quantiles("qwen_gateway_http_response_time_seconds_hist", f'{GATEWAY}, error=""', (0.5, 0.99)),
            unit="s",
        ),
        Panel(
            "Requests in flight per gateway pod",
            [(f"sum by (pod) (nginx_connections_writing{{{GATEWAY}}} - 1)", "{{pod}}")],
            description="nginx connections with a request in progress, minus the scrape itself.",
        ),
        Panel(
            "Engines the router sees healthy",
            [(f"sum by (pod) (vllm_router_worker_health{{{GATEWAY}}})", "{{pod}}")],
        ),
    ]


def _replicas() -> list[Panel]:
    return [
        Panel(
            "Engine replicas",
            [
                (f"sum(kube_deployment_status_replicas_available{{{ENGINE_DEPLOYMENT}}})", "available"),
                (f"sum(kube_deployment_spec_replicas{{{ENGINE_DEPLOYMENT}}})", "desired (Deployment)"),
                (
                    f"sum(kube_horizontalpodautoscaler_status_desired_replicas{{{ENGINE_HPA}}})",
                    "desired (HPA)",
                ),
                (f"sum(kube_horizontalpodautoscaler_spec_max_replicas{{{ENGINE_HPA}}})", "max (HPA)"),
            ],
        ),
        Panel(
            "Engine container restarts (1h)",
            [
                (
                    f"sum by (pod) (increase(kube_pod_container_status_restarts_total{{{ENGINE}}}[1h]))",
                    "{{pod}}",
                )
            ],
        ),
    ]


def _operator() -> list[Panel]:
    """The operator's own metrics (chart value serviceMonitor.enabled; honorLabels keeps `namespace`)."""
    return [
        Panel(
            "QwenDeployments Ready",
            [
                (
                    'sum by (namespace, name) (qwen_operator_deployment_ready{namespace=~"$namespace", '
                    'name=~"$deployment"})',
                    "{{namespace}}/{{name}}",
                )
            ],
            description="1 when the Ready condition is True.",
        ),
        Panel(
            "Reconciles/s by result",
            [(f"sum by (result) (rate(qwen_operator_reconciles_total[{RATE}]))", "{{result}}")],
            unit="ops",
        ),
        Panel(
            "Reconcile duration p99",
            _quantiles("qwen_operator_reconcile_duration_seconds", "", (0.99,)),
            unit="s",
        ),
    ]


def _panel_json(panel: Panel, panel_id: int, grid: dict[str, int]) -> dict[str, Any]:
    targets = [
        {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
        for i, (expr, legend) in enumerate(panel.queries)
    ]
    options: dict[str, Any] = (
        {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value"}
        if panel.kind == "stat"
        else {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    )
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": options | panel.options,
    }


def _layout() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row in _rows():
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        y += 1
        width, height = (4, 4) if row[0].kind == "stat" else (12, 8)
        for i, panel in enumerate(row):
            x = (i * width) % 24
            if i and x == 0:
                y += height
            panels.append(_panel_json(panel, len(panels) + 1, {"h": height, "w": width, "x": x, "y": y}))
        y += height
    return panels


def _variable(name: str, label: str, query: str, regex: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-query"},
        "definition": query,
        "regex": regex,
        "refresh": 2,
        "includeAll": True,
        "allValue": ".+",
        "multi": True,
        "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def dashboard() -> dict[str, Any]:
    """The dashboard model Grafana imports."""
    datasource = {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
    }
    return {
        "uid": "qwen-serving",
        "title": "Qwen serving",
        "description": "Qwen3-32B on vLLM, per QwenDeployment: queue, KV cache, latency, throughput, "
        "gateway and replicas. Shipped by the qwen-operator chart (dashboards.enabled).",
        "tags": ["qwen", "vllm", "llm", "qwen-operator"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                datasource,
                _variable(
                    "namespace", "Namespace", f"label_values({recording.ENGINE_QUEUE_DEPTH}, namespace)"
                ),
                _variable(
                    "deployment",
                    "QwenDeployment",
                    f'label_values({recording.ENGINE_QUEUE_DEPTH}{{namespace=~"$namespace"}}, '
                    f"{recording.DEPLOYMENT_LABEL})",
                ),
            ]
        },
        "annotations": {"list": []},
        "panels": _layout(),
    }
