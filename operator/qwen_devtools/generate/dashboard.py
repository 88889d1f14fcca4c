"""The Grafana dashboard "Qwen serving", built from a compact panel list (`make generate` writes the JSON).

Queue depth, KV cache usage and TTFT p99 (and the variables) read the recorded series of
qwen_operator.recording, as the alerts, prometheus-adapter and KEDA do, so a vLLM metric rename is fixed
there; they need the recording rules (the chart's prometheusRule) and select by `qwendeployment`. The
other queries select engine pods by name (<QwenDeployment>-engine-<hash>-<hash>) and gateway pods
likewise, so they work with any scrape config that keeps `namespace` and `pod`; so do the LoRA panels,
which read the lora-sync sidecars in the engine pods (the adapters each engine's /v1/models lists) and
vLLM's `vllm:lora_requests_info`. Replica counts come from kube-state-metrics.
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
    """One panel: a title, its queries as (PromQL, legend) pairs, a unit and a kind.

    A table shows the queries' current values (instant queries) with their labels as columns, which is
    how series whose information is in their labels (`vllm:lora_requests_info`) can be read at all;
    `transformations` shape those columns.
    """

    title: str
    queries: list[tuple[str, str]]
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    transformations: list[dict[str, Any]] = field(default_factory=list)
    mappings: list[dict[str, Any]] = field(default_factory=list)


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
        ("LoRA adapters", _lora()),
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
            [(f'sum by (pod) (vllm_router_worker_health{{{GATEWAY}, tier=""}})', "{{pod}}")],
        ),
        Panel(
            "Requests held for an engine (scale to zero)",
            [
                (f"sum(qwen_gateway_held_requests{{{GATEWAY}}})", "held now"),
                (f"sum(rate(qwen_gateway_hold_timeouts_total{{{GATEWAY}}}[{RATE}]))", "timed out /s"),
                (f"sum(rate(qwen_gateway_hold_rejected_total{{{GATEWAY}}}[{RATE}]))", "refused (full) /s"),
            ],
            description="autoscaling.minReplicas 0: requests the gateway's activator holds while no engine "
            "is ready (they wake the engines through KEDA), those that reached holdSeconds (503) and "
            "those refused beyond maxHeldRequests. Empty for deployments that never go to zero.",
        ),
        Panel(
            "Wait for an engine after scale to zero",
            _quantiles("qwen_gateway_hold_wait_seconds", GATEWAY, (0.5, 0.99)),
            unit="s",
            description="How long held requests waited for a ready engine: a cold start, seen by clients.",
        ),
    ]


def _columns(names: dict[str, str]) -> list[dict[str, Any]]:
    """Table transformations keeping only these columns (label or field name -> header), in order."""
    return [
        {"id": "filterFieldsByName", "options": {"include": {"names": list(names)}}},
        {
            "id": "organize",
            "options": {"renameByName": names, "indexByName": {n: i for i, n in enumerate(names)}},
        },
    ]


def _lora() -> list[Panel]:
    """Which adapters each engine has loaded (its lora-sync sidecar reads the engine's /v1/models), load
    failures, what vLLM says about adapters in its batches, and requests per model name at the gateway."""
    loaded = f"{recording.LORA_ADAPTER_LOADED}{{{ENGINE}}}"
    # vLLM sets the gauge to the time of its update, in a series per label set, and never drops an old
    # label set: each pod's newest series is the current one.
    info = f"vllm:lora_requests_info{{{ENGINE}}}"
    current = f"{info} == on (namespace, pod) group_left () max by (namespace, pod) ({info})"
    responses = "qwen_gateway_http_response_count_total"
    return [
        Panel(
            "Adapters: engine pods with each loaded",
            [
                (f"sum by (adapter) ({loaded})", "loaded"),
                (f"count by (adapter) ({loaded})", "pods"),
            ],
            kind="table",
            description="Per adapter, on how many engine pods the engine lists it in /v1/models, of the "
            "engine pods whose lora-sync sidecar reports it (every pod with the adapter in its desired "
            "list). Fewer: see the AdaptersLoaded condition (`kubectl describe qwd`).",
            transformations=[
                {"id": "merge", "options": {}},
                *_columns({"adapter": "adapter", "Value #A": "loaded on", "Value #B": "engine pods"}),
            ],
        ),
        Panel(
            "Adapters loaded per engine pod",
            [(f"max by (pod, adapter) ({loaded})", "")],
            kind="table",
            description="Rows: engine pods; columns: adapters; from each pod's lora-sync sidecar, which "
            "reads what the engine lists in /v1/models.",
            transformations=[
                {
                    "id": "groupingToMatrix",
                    "options": {"rowField": "pod", "columnField": "adapter", "valueField": "Value"},
                }
            ],
            mappings=[
                {
                    "type": "value",
                    "options": {
                        "0": {"text": "not loaded", "color": "red", "index": 0},
                        "1": {"text": "loaded", "color": "green", "index": 1},
                    },
                }
            ],
        ),
        Panel(
            f"Adapter load failures by adapter (per {recording.LORA_FAILURE_WINDOW})",
            [
                (
                    f"sum by (adapter) (increase({recording.LORA_LOAD_FAILURES}{{{ENGINE}}}"
                    f"[{recording.LORA_FAILURE_WINDOW}]))",
                    "{{adapter}}",
                )
            ],
            description="Failed loads and Hub downloads, over all engine pods; retried with backoff up to "
            "5 minutes. QwenLoraAdapterLoadFailed fires when they continue while the adapter is missing "
            "from a pod.",
        ),
        Panel(
            "Adapters with requests in each engine (vllm:lora_requests_info)",
            [(f"time() - ({current})", "")],
            kind="table",
            unit="s",
            description="vLLM 0.32 exports no request count per adapter, only which adapters have "
            "requests in the engine: it puts every adapter with a request in the engine, running or "
            "waiting, into both labels running_lora_adapters and waiting_lora_adapters (comma-joined), "
            "so they are the same list, shown once. Empty: no adapter request in flight at the last "
            "update; the age is the time since that update (vLLM updates it on engine steps only). "
            "Per-adapter request rates: the gateway panel beside this one.",
            transformations=_columns(
                {
                    "pod": "engine pod",
                    "running_lora_adapters": "adapters with requests (running or waiting)",
                    "max_lora": "maxLoras",
                    "Value": "updated (ago)",
                }
            ),
        ),
        Panel(
            "Gateway requests/s by model",
            [(f"sum by (model) (rate({responses}{{{GATEWAY}}}[{RATE}]))", "{{model}}")],
            unit="reqps",
            description="The model a request names: the base model's served name, an adapter's name, or "
            "other (any other name, so the label stays bounded). From the gateway's access log.",
        ),
        Panel(
            "lora-sync reaches its engine, per engine pod",
            [(f"min by (pod) ({recording.LORA_ENGINE_REACHABLE}{{{ENGINE}}})", "{{pod}}")],
            description="0: the sidecar's last round could not list the engine's models, so it loads and "
            "unloads nothing (normal while the engine starts; QwenLoraSyncEngineUnreachable fires when "
            "it lasts while the engine is scraped).",
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


_GRAPH_OPTIONS = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
_KIND_OPTIONS: dict[str, dict[str, Any]] = {
    "stat": {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "value",
    },
    "table": {"showHeader": True, "cellHeight": "sm"},
}


def _panel_json(panel: Panel, panel_id: int, grid: dict[str, int]) -> dict[str, Any]:
    targets: list[dict[str, Any]] = [
        {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE}
        for i, (expr, legend) in enumerate(panel.queries)
    ]
    if panel.kind == "table":
        targets = [t | {"format": "table", "instant": True} for t in targets]
    options = _KIND_OPTIONS.get(panel.kind, _GRAPH_OPTIONS)
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.mappings:
        defaults["mappings"] = panel.mappings
    body: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options | panel.options,
    }
    if panel.transformations:
        body["transformations"] = panel.transformations
    return body


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
        "gateway, LoRA adapters and replicas. Shipped by the qwen-operator chart (dashboards.enabled).",
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
