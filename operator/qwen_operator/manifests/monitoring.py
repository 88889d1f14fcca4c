"""Prometheus Operator objects: scrape configs for engines and gateway, and per-deployment rules."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .. import names, recording
from ..api.review import Review
from .lora import PORT_NAME as LORA_PORT
from .meta import metadata


def _meta(review: Review, name: str, component: str) -> dict[str, Any]:
    meta = metadata(review.resource, name, component)
    meta["labels"] = {**meta["labels"], **review.resource.spec.monitoring.labels}
    return meta


def build_engine_service_monitor(review: Review) -> dict[str, Any]:
    """The engines' /metrics and, with spec.lora, their lora-sync sidecars' (the adapters each engine has
    loaded, and its failed loads): both through the engine Service, both labelled `qwendeployment`."""
    qd = review.resource
    ports = ["http", LORA_PORT] if qd.spec.lora else ["http"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(review, names.engine(qd), "engine"),
        "spec": {
            "selector": {"matchLabels": names.selector(qd, "engine")},
            "namespaceSelector": {"matchNames": [qd.metadata.namespace]},
            "endpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": qd.spec.monitoring.interval,
                    "relabelings": [_deployment_relabeling()],
                }
                for port in ports
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


def build_gateway_pod_monitor(
    review: Review, ports: Sequence[str], tier_ports: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    """The gateway pods' metrics ports; `tier_ports`: (port, tier name) of each tier's vllm-router, whose
    series also get the label `tier` (the tier's model name), so that they never add to this
    deployment's own router series."""
    qd = review.resource

    def endpoint(port: str, tier: str | None = None) -> dict[str, Any]:
        relabelings = [_deployment_relabeling()]
        if tier is not None:
            relabelings.append({"action": "replace", "targetLabel": "tier", "replacement": tier})
        return {
            "port": port,
            "path": "/metrics",
            "interval": qd.spec.monitoring.interval,
            "relabelings": relabelings,
        }

    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(review, names.gateway(qd), "gateway"),
        "spec": {
            "selector": {"matchLabels": names.selector(qd, "gateway")},
            "namespaceSelector": {"matchNames": [qd.metadata.namespace]},
            # `qwendeployment` on every gateway series too: the scale-to-zero triggers select on it.
            "podMetricsEndpoints": [
                *(endpoint(port) for port in ports),
                *(endpoint(port, tier) for port, tier in tier_ports),
            ],
        },
    }


def build_prometheus_rule(review: Review) -> dict[str, Any]:
    """This deployment's recording rules and alerts (the chart ships the same rules fleet-wide).

    One group: Prometheus evaluates its rules in order, so the alerts read this evaluation's recorded
    series. The engine targets are selected by their Service, not by `qwendeployment`, so a missing
    relabeling shows up as QwenDeploymentQueueMetricAbsent instead of silence; the Service's lora-sync
    targets are left out of `up`, or a pod whose sidecar answers would count as an engine up.
    """
    qd = review.resource
    ns, name, svc = qd.metadata.namespace, qd.metadata.name, names.engine(qd)
    up = f'up{{namespace="{ns}",service="{svc}",endpoint!="{LORA_PORT}"}}'
    scope = recording.scope(ns, name)
    labels = {recording.DEPLOYMENT_LABEL: name}
    max_replicas = qd.spec.autoscaling.max_replicas if qd.spec.autoscaling else qd.spec.effective_replicas
    no_engine = f"(sum({up}) == 0 or absent({up}))"
    summary = f"{ns}/{name}: no engine is scraped as up for 10 minutes"
    if review.holding is not None:
        # minReplicas 0: no engine is the idle state; a request held all that time is a wake that failed.
        no_engine += f" and on () {recording.gateway_held_query(ns, name)} > 0"
        summary += " while the gateway holds requests (the wake from zero failed: see condition ScaledToZero)"
    alerts = [
        {
            "alert": "QwenDeploymentNoReadyEngines",
            "expr": no_engine,
            "for": "10m",
            "labels": {**labels, "severity": "critical"},
            "annotations": {"summary": summary},
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
    if qd.spec.lora:
        alerts += _lora_alerts(ns, name)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta(review, name, "engine"),
        "spec": {
            "groups": [{"name": f"qwen-{ns}-{name}", "rules": recording.recording_rules(ns, name) + alerts}]
        },
    }


def _lora_alerts(ns: str, name: str) -> list[dict[str, Any]]:
    """The alerts on the lora-sync sidecars' series, which exist only with spec.lora.

    A failed load alone is not enough (the sidecar retries, and a file copied into the cache meanwhile
    makes the next try succeed): the adapter must also still be missing from that pod's engine. The
    unreachable alert requires the engine to be scraped meanwhile, so an engine still loading its weights,
    which answers neither, does not fire it; an engine that serves but refuses its own sidecar (another
    API key) would leave every adapter unloaded without a single failed load.
    """
    scope = recording.scope(ns, name)
    pod = "{{ $labels.pod }}"
    adapter = "{{ $labels.adapter }}"
    describe = f"`kubectl describe qwd -n {ns} {name}`"
    failures = f"increase({recording.LORA_LOAD_FAILURES}{{{scope}}}[{recording.LORA_FAILURE_WINDOW}])"
    labels = {recording.DEPLOYMENT_LABEL: name}
    return [
        {
            "alert": "QwenDeploymentLoraAdapterLoadFailed",
            "expr": f"max by (namespace, pod, adapter) ({failures}) > 0"
            f" and on (namespace, pod, adapter) {recording.LORA_ADAPTER_LOADED}{{{scope}}} == 0",
            "for": "5m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {
                "summary": f"{ns}/{name}: LoRA adapter {adapter} fails to load on {pod}",
                "description": f"The lora-sync sidecar of {pod} failed to load adapter {adapter} in the "
                f"last {recording.LORA_FAILURE_WINDOW} and its engine does not list it, so requests for "
                f"{adapter} that reach {pod} fail. {describe}: the AdaptersLoaded condition and "
                "status.lora name the engine's error (bad source, rank above maxLoraRank, download "
                "error).",
            },
        },
        {
            "alert": "QwenDeploymentLoraSyncEngineUnreachable",
            "expr": f"max by (namespace, pod) ({recording.LORA_ENGINE_REACHABLE}{{{scope}}}) == 0"
            f" and on (namespace, pod) {recording.ENGINE_QUEUE_DEPTH}{{{scope}}}",
            "for": "10m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {
                "summary": f"{ns}/{name}: the lora-sync sidecar of {pod} cannot reach its serving engine",
                "description": f"For 10 minutes the lora-sync sidecar of {pod} could not list its "
                "engine's models while Prometheus scraped the engine: no adapter is loaded or unloaded "
                f"there. `kubectl logs -n {ns} {pod} -c lora-sync` has the error (HTTP 401: its "
                f"VLLM_API_KEY is not the engine's); {describe} shows AdaptersLoaded.",
            },
        },
    ]
