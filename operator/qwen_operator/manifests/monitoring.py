"""Prometheus Operator objects: scrape configs for engines and gateway, and per-deployment rules."""

from __future__ import annotations

import re
from typing import Any

from .. import names, recording
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
            "endpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": qd.spec.monitoring.interval,
                    "relabelings": [_deployment_relabeling()],
                }
            ],
        },
    }


def _deployment_relabeling() -> dict[str, Any]:
    """Every engine series gets its QwenDeployment as `qwendeployment`: the recording rules select on it."""
    pod_label = re.sub(r"[^A-Za-z0-9_]", "_", recording.DEPLOYMENT_POD_LABEL)
    return {
        "action": "replace",
        "sourceLabels": [f"__meta_kubernetes_pod_label_{pod_label}"],
        "targetLabel": recording.DEPLOYMENT_LABEL,
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
    """This deployment's recording rules and alerts (the chart ships the same rules fleet-wide).

    One group: Prometheus evaluates its rules in order, so the alerts read this evaluation's recorded
    series. The engine targets are selected by their Service, not by `qwendeployment`, so a missing
    relabeling shows up as QwenDeploymentQueueMetricAbsent instead of silence.
    """
    qd = review.resource
    ns, name, svc = qd.metadata.namespace, qd.metadata.name, names.engine(qd)
    up = f'up{{namespace="{ns}",service="{svc}"}}'
    scope = recording.scope(ns, name)
    labels = {recording.DEPLOYMENT_LABEL: name}
    max_replicas = qd.spec.autoscaling.max_replicas if qd.spec.autoscaling else qd.spec.effective_replicas
    alerts = [
        {
            "alert": "QwenDeploymentNoReadyEngines",
            "expr": f"sum({up}) == 0 or absent({up})",
            "for": "10m",
            "labels": {**labels, "severity": "critical"},
            "annotations": {"summary": f"{ns}/{name}: no engine is scraped as up for 10 minutes"},
        },
        {
            "alert": "QwenDeploymentQueueAtCapacity",
            "expr": f"{recording.DEPLOYMENT_QUEUE_DEPTH}{{{scope}}} > 0"
            f" and on () count({up} == 1) >= {max_replicas}",
            "for": "15m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {"summary": f"{ns}/{name}: requests queue at {max_replicas} replicas"},
        },
        {
            "alert": "QwenDeploymentKVCacheSaturated",
            "expr": f"{recording.DEPLOYMENT_KV_CACHE_USAGE}{{{scope}}} > 0.95",
            "for": "10m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {"summary": f"{ns}/{name}: KV cache above 95% (preemptions likely)"},
        },
        {
            "alert": "QwenDeploymentQueueMetricAbsent",
            "expr": f"count({up} == 1) and on () absent({recording.ENGINE_QUEUE_DEPTH}{{{scope}}})",
            "for": "10m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {
                "summary": f"{ns}/{name}: engines are up but {recording.ENGINE_QUEUE_DEPTH} is absent: "
                "autoscaling, dashboard and alerts see no queue (vLLM metric renamed, or the "
                f"ServiceMonitor lost its {recording.DEPLOYMENT_LABEL} label)"
            },
        },
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta(review, name, "engine"),
        "spec": {
            "groups": [{"name": f"qwen-{ns}-{name}", "rules": recording.recording_rules(ns, name) + alerts}]
        },
    }
