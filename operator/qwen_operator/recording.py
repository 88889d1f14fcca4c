"""The recorded series every consumer reads (dashboard, alerts, prometheus-adapter, KEDA) and the one
place that names the vLLM series behind them: a vLLM metric rename is fixed here and nowhere else.

The engine ServiceMonitor (manifests/monitoring.py) copies the engine pod's label
`app.kubernetes.io/instance` onto every scraped series as `qwendeployment`; the rules below select on
it. Naming follows Prometheus' `level:metric:operations` convention.
"""

from __future__ import annotations

import re
from typing import Any

from .clientapis import TRAFFIC_ROUTES

#: vLLM 0.32 series read by the rules (the only place they are named for alerts, adapter and KEDA).
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
VLLM_TTFT = "vllm:time_to_first_token_seconds"

#: Series of the lora-sync sidecar beside each engine with spec.lora (lorasync.py, scraped by the engine
#: ServiceMonitor's second endpoint): per adapter (label `adapter`), 1 when the engine's /v1/models lists
#: it, and its failed loads; per pod, 1 when the sidecar's last round reached the engine.
LORA_ADAPTER_LOADED = "qwen_lora_adapter_loaded"
LORA_LOAD_FAILURES = "qwen_lora_adapter_load_failures_total"
LORA_ENGINE_REACHABLE = "qwen_lora_sync_engine_reachable"
#: The window over which new load failures count: the sidecar retries a failing adapter within 5 minutes
#: (lorasync.BACKOFF_MAX) plus one load attempt, so one that keeps failing fails again in every window.
LORA_FAILURE_WINDOW = "10m"

#: The label naming the QwenDeployment on engine series, and the pod label it is copied from.
DEPLOYMENT_LABEL = "qwendeployment"
DEPLOYMENT_POD_LABEL = "app.kubernetes.io/instance"

#: Per engine pod (labels namespace, qwendeployment, pod): requests waiting for a batch slot.
ENGINE_QUEUE_DEPTH = "qwen_engine:queue_depth"
#: Per engine pod: fraction of the KV cache in use (0..1).
ENGINE_KV_CACHE_USAGE = "qwen_engine:kv_cache_usage"
#: Per QwenDeployment (labels namespace, qwendeployment): requests waiting in all its engines.
DEPLOYMENT_QUEUE_DEPTH = "qwen_deployment:queue_depth:sum"
#: Per QwenDeployment: the fullest engine's KV cache (one saturated engine is the problem, an average
#: over the others would hide it).
DEPLOYMENT_KV_CACHE_USAGE = "qwen_deployment:kv_cache_usage:max"
#: Per QwenDeployment: time to first token p99 over 5 minutes, from the histogram's rate.
DEPLOYMENT_TTFT_P99 = "qwen_deployment:ttft_seconds:p99"
TTFT_WINDOW = "5m"

#: The pods custom metric prometheus-adapter serves from ENGINE_QUEUE_DEPTH (what the HPA reads).
ADAPTER_METRIC = "qwen_queue_depth"

RECORDED = (
    ENGINE_QUEUE_DEPTH,
    ENGINE_KV_CACHE_USAGE,
    DEPLOYMENT_QUEUE_DEPTH,
    DEPLOYMENT_KV_CACHE_USAGE,
    DEPLOYMENT_TTFT_P99,
)


def scope(namespace: str | None = None, deployment: str | None = None) -> str:
    """Label matchers of one QwenDeployment's series, or of every QwenDeployment's (no arguments)."""
    if namespace is None or deployment is None:
        return f'{DEPLOYMENT_LABEL}!=""'
    return f'namespace="{namespace}",{DEPLOYMENT_LABEL}="{deployment}"'


def recording_rules(namespace: str | None = None, deployment: str | None = None) -> list[dict[str, Any]]:
    """The recording rules, fleet-wide (the chart) or for one QwenDeployment (its PrometheusRule).

    In rule order: a group evaluates its rules in sequence, so the deployment-level ones read the
    engine-level results of the same evaluation.
    """
    m = scope(namespace, deployment)
    engine_by = f"namespace, {DEPLOYMENT_LABEL}, pod"
    deployment_by = f"namespace, {DEPLOYMENT_LABEL}"
    return [
        # sum: an engine pod with data parallelism exports one series per engine core
        {"record": ENGINE_QUEUE_DEPTH, "expr": f"sum by ({engine_by}) ({VLLM_WAITING}{{{m}}})"},
        {"record": ENGINE_KV_CACHE_USAGE, "expr": f"max by ({engine_by}) ({VLLM_KV_CACHE_USAGE}{{{m}}})"},
        {"record": DEPLOYMENT_QUEUE_DEPTH, "expr": f"sum by ({deployment_by}) ({ENGINE_QUEUE_DEPTH}{{{m}}})"},
        {
            "record": DEPLOYMENT_KV_CACHE_USAGE,
            "expr": f"max by ({deployment_by}) ({ENGINE_KV_CACHE_USAGE}{{{m}}})",
        },
        {
            "record": DEPLOYMENT_TTFT_P99,
            "expr": f"histogram_quantile(0.99, sum by ({deployment_by}, le) "
            f"(rate({VLLM_TTFT}_bucket{{{m}}}[{TTFT_WINDOW}])))",
        },
    ]


#: The gateway's held requests (its activator, autoscaling.minReplicas 0) and its requests by route.
GATEWAY_HELD = "qwen_gateway_held_requests"
GATEWAY_RESPONSES = "qwen_gateway_http_response_count_total"
#: The `error` label (nginx.conf's $gateway_error) of answers to requests the gateway admitted: past the
#: API key, the key's model access and its rate limit, passed to vllm-router. Only these count as
#: traffic: a 401, 403 or 429, and nginx's own 4xx (which it answers before the key is looked at: 413,
#: 414, a malformed request), must never wake or keep a GPU replica. A value not named here counts as
#: refused; tests/test_scale_to_zero.py checks that every value the map writes is in one of the two.
ADMITTED_ERRORS = ("", "no_engine", "overloaded", "queue_timeout", "router_unavailable", "server_error")
REFUSED_ERRORS = ("unauthorized", "model_not_allowed", "rate_limited", "unknown_route", "request_error")


def gateway_held_query(namespace: str, deployment: str) -> str:
    """Requests the whole gateway of one QwenDeployment holds for want of a ready engine (KEDA's wake)."""
    return f"sum({GATEWAY_HELD}{{{scope(namespace, deployment)}}})"


def gateway_traffic_query(namespace: str, deployment: str, window: str) -> str:
    """Above zero while the gateway of one QwenDeployment answered a completion it admitted within
    `window` (KEDA's idleness; ADMITTED_ERRORS): the counters' increase, plus every counter born within
    the window. A gateway pod's counter of a route and status appears with its first answer, already
    above zero, so rate() and increase(), which need two samples, never see the answers that created it
    (a wake's whole burst)."""
    routes, admitted = "|".join(TRAFFIC_ROUTES), "|".join(ADMITTED_ERRORS)
    matchers = f'{scope(namespace, deployment)},route=~"{routes}",error=~"{admitted}"'
    series = f"{GATEWAY_RESPONSES}{{{matchers}}}"
    return (
        f"(sum(increase({series}[{window}])) or vector(0))"
        f" + (sum({series} unless {series} offset {window}) or vector(0))"
    )


def deployment_queue_query(namespace: str, deployment: str) -> str:
    """The queue depth of one QwenDeployment as one PromQL query (KEDA's Prometheus trigger)."""
    return f"sum({ENGINE_QUEUE_DEPTH}{{{scope(namespace, deployment)}}})"


def adapter_rules() -> list[dict[str, Any]]:
    """prometheus-adapter rules: ENGINE_QUEUE_DEPTH served as the pods custom metric ADAPTER_METRIC."""
    return [
        {
            "seriesQuery": f'{ENGINE_QUEUE_DEPTH}{{namespace!="",pod!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
            "name": {"matches": f"^{re.escape(ENGINE_QUEUE_DEPTH)}$", "as": ADAPTER_METRIC},
            "metricsQuery": "sum by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})",
        }
    ]


def adapter_config() -> dict[str, Any]:
    """prometheus-adapter's --config file."""
    return {"rules": adapter_rules()}


def adapter_chart_values() -> dict[str, Any]:
    """Values of the prometheus-community/prometheus-adapter chart adding the rules to its own."""
    return {"rules": {"custom": adapter_rules()}}
