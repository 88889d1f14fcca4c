"""Queue-depth autoscaling of the engine Deployment: an HPA, or a KEDA ScaledObject."""

from __future__ import annotations

from typing import Any

from .. import names
from ..api.review import Review
from .meta import metadata

#: Per-pod gauge of requests waiting for a batch slot; the HPA reads it through a custom metrics adapter.
QUEUE_METRIC = "vllm:num_requests_waiting"


def _behavior(review: Review) -> dict[str, Any]:
    b = review.resource.spec.autoscaling.behavior  # type: ignore[union-attr]
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": b.scale_up_stabilization_seconds,
            "policies": [{"type": "Pods", "value": b.scale_up_pods, "periodSeconds": 60}],
            "selectPolicy": "Max",
        },
        "scaleDown": {
            "stabilizationWindowSeconds": b.scale_down_stabilization_seconds,
            "policies": [{"type": "Pods", "value": b.scale_down_pods, "periodSeconds": 60}],
            "selectPolicy": "Max",
        },
    }


def build_hpa(review: Review) -> dict[str, Any]:
    qd = review.resource
    a = qd.spec.autoscaling
    assert a is not None
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(qd, names.engine(qd), "engine"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": names.engine(qd)},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(a.target_queue_depth)},
                    },
                }
            ],
            "behavior": _behavior(review),
        },
    }


def queue_query(review: Review) -> str:
    qd = review.resource
    return f'sum({QUEUE_METRIC}{{namespace="{qd.metadata.namespace}",service="{names.engine(qd)}"}})'


def build_scaled_object(review: Review) -> dict[str, Any]:
    qd = review.resource
    a = qd.spec.autoscaling
    assert a is not None
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(qd, names.engine(qd), "engine"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": names.engine(qd)},
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(review)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": a.prometheus_address,
                        "query": queue_query(review),
                        "threshold": str(a.target_queue_depth),
                    },
                }
            ],
        },
    }
