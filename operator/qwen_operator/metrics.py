"""The operator's own Prometheus metrics (served by `runtime`)."""

from __future__ import annotations

import contextlib

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
#: Gauges with a label set per QwenDeployment: dropped with it (`forget`).
PER_OBJECT = (MANAGED_OBJECTS, DEPLOYMENTS_READY)


def forget(namespace: str, name: str) -> None:
    """The QwenDeployment is gone: stop exporting its series, or /metrics would keep its last values for
    the life of the process (and an alert on deployment_ready would fire for an object that no longer
    exists). An absent label set is no error."""
    for gauge in PER_OBJECT:
        with contextlib.suppress(KeyError):  # raised for an absent set before late 2024 (the pin allows 0.20)
            gauge.remove(namespace, name)
