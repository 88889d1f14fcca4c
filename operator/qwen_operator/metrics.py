"""The operator's own Prometheus metrics (served by `runtime`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("qwen_operator_reconciles_total", "Reconciles run, by result.", ["result"])
RECONCILE_SECONDS = Histogram(
    "qwen_operator_reconcile_duration_seconds",
    "Duration of one reconcile.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_WRITES = Counter("qwen_operator_api_writes_total", "Write requests sent to the API server.", ["method"])
MANAGED_OBJECTS = Gauge(
    "qwen_operator_managed_objects", "Child objects per QwenDeployment.", ["namespace", "name"]
)
DEPLOYMENTS_READY = Gauge(
    "qwen_operator_deployment_ready", "1 when the QwenDeployment is Ready.", ["namespace", "name"]
)
FAILING_OBJECTS = Gauge(
    "qwen_operator_failing_objects", "QwenDeployments whose last reconcile failed (retried with backoff)."
)
RETRIES = Counter("qwen_operator_reconcile_retries_total", "Reconciles run again after a failure.")
