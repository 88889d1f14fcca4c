"""Prometheus Operator objects: scrape configs for engines and gateway, and per-deployment alerts."""

from __future__ import annotations

from typing import Any

from .. import names
from ..api.review import Review
from .meta import metadata


def _meta(review: Review, name: str, component: str) -> dict[str, Any]:
    meta = metadata(review.resource, name, component)
    meta["labels"] = {**meta["labels"], **review.resource.spec.monitoring.labels}
    return meta


def build_engine_service_monitor(review: Review) -> dict[str, Any]:
    qd = review.resource
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(review, names.engine(qd), "engine"),
        "spec": {
            "selector": {"matchLabels": names.selector(qd, "engine")},
            "namespaceSelector": {"matchNames": [qd.metadata.namespace]},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": qd.spec.monitoring.interval}],
        },
    }


def build_gateway_pod_monitor(review: Review, ports: list[str]) -> dict[str, Any]:
    qd = review.resource
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(review, names.gateway(qd), "gateway"),
        "spec": {
            "selector": {"matchLabels": names.selector(qd, "gateway")},
            "namespaceSelector": {"matchNames": [qd.metadata.namespace]},
            "podMetricsEndpoints": [
                {"port": port, "path": "/metrics", "interval": qd.spec.monitoring.interval} for port in ports
            ],
        },
    }


def build_prometheus_rule(review: Review) -> dict[str, Any]:
    """Alerts scoped to this deployment's engine pods (the chart ships fleet-wide rules too)."""
    qd = review.resource
    ns, svc = qd.metadata.namespace, names.engine(qd)
    sel = f'namespace="{ns}",service="{svc}"'
    labels = {"qwen_deployment": qd.metadata.name}
    max_replicas = qd.spec.autoscaling.max_replicas if qd.spec.autoscaling else qd.spec.effective_replicas
    rules = [
        {
            "alert": "QwenDeploymentNoReadyEngines",
            "expr": f"sum(up{{{sel}}}) == 0 or absent(up{{{sel}}})",
            "for": "10m",
            "labels": {**labels, "severity": "critical"},
            "annotations": {"summary": f"{ns}/{qd.metadata.name}: no engine is scraped as up for 10 minutes"},
        },
        {
            "alert": "QwenDeploymentQueueAtCapacity",
            "expr": f"sum(vllm:num_requests_waiting{{{sel}}}) > 0"
            f" and count(up{{{sel}}} == 1) >= {max_replicas}",
            "for": "15m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {"summary": f"{ns}/{qd.metadata.name}: requests queue at {max_replicas} replicas"},
        },
        {
            "alert": "QwenDeploymentKVCacheSaturated",
            "expr": f"max(vllm:kv_cache_usage_perc{{{sel}}}) > 0.95",
            "for": "10m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {"summary": f"{ns}/{qd.metadata.name}: KV cache above 95% (preemptions likely)"},
        },
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta(review, qd.metadata.name, "engine"),
        "spec": {"groups": [{"name": f"qwen-{ns}-{qd.metadata.name}", "rules": rules}]},
    }
