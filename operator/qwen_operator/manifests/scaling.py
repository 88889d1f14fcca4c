"""Queue-depth autoscaling of the engine Deployment: an HPA, or a KEDA ScaledObject.

Both read the engines' own waiting count. The gateway passes the engines everything they can run or
queue (gateway/limits.py), so a growing queue shows up there and nowhere else first.
"""

from __future__ import annotations

import math
from typing import Any

from .. import names, recording
from ..api.coldstart import HELD_TRIGGER_INDEX
from ..api.queueing import HPA_METRIC as HPA_METRIC  # the metric the HPA reads, named once there
from ..api.queueing import QUEUE_METRIC as QUEUE_METRIC  # its source, vLLM's waiting count
from ..api.queueing import keda_query
from ..api.review import Review
from .engine import startup_seconds
from .meta import metadata

#: Limits of autoscaling/v2 behaviour fields.
HPA_MAX_PERIOD = 1800
HPA_MAX_WINDOW = 3600
#: Shortest default scale-down window, for engines whose start-up budget is small.
MIN_SCALE_DOWN_WINDOW = 300


def target_queue_depth(review: Review) -> int:
    """The spec's targetQueueDepth, else the plan's default (api/queueing.py)."""
    target = review.queueing.target_queue_depth
    assert target is not None, "only autoscaled specs have a target"
    return target


def scale_up_period(review: Review) -> int:
    """Pods added within one period are sized on a queue they have not yet drained: wait about as long
    as a new engine takes to start before adding more."""
    b = review.resource.spec.autoscaling.behavior  # type: ignore[union-attr]
    return b.scale_up_period_seconds or min(HPA_MAX_PERIOD, startup_seconds(review))


def scale_down_window(review: Review) -> int:
    """A removed replica takes a start-up to get back: remove one only after the queue stayed low that
    long."""
    b = review.resource.spec.autoscaling.behavior  # type: ignore[union-attr]
    if b.scale_down_stabilization_seconds is not None:
        return b.scale_down_stabilization_seconds
    return min(HPA_MAX_WINDOW, max(MIN_SCALE_DOWN_WINDOW, startup_seconds(review)))


def _behavior(review: Review) -> dict[str, Any]:
    b = review.resource.spec.autoscaling.behavior  # type: ignore[union-attr]
    up = scale_up_period(review)
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": b.scale_up_stabilization_seconds,
            "policies": [
                {"type": "Pods", "value": b.scale_up_pods, "periodSeconds": up},
                {"type": "Percent", "value": 100, "periodSeconds": up},
            ],
            "selectPolicy": "Max",
        },
        "scaleDown": {
            "stabilizationWindowSeconds": scale_down_window(review),
            "policies": [
                {"type": "Pods", "value": b.scale_down_pods, "periodSeconds": b.scale_down_period_seconds}
            ],
            "selectPolicy": "Min",
        },
    }


def min_replicas(review: Review, gateway_holds: bool) -> int:
    """autoscaling.minReplicas, but 1 while minReplicas 0 waits for the gateway: at zero every request
    must reach a gateway pod that holds it (the activator), so the engines go to zero only once the
    gateway's rollout with the activator is over (the reconcile sees its pods)."""
    a = review.resource.spec.autoscaling
    assert a is not None
    return a.min_replicas if a.min_replicas > 0 or gateway_holds else 1


def build_hpa(review: Review, gateway_holds: bool = True) -> dict[str, Any]:
    qd = review.resource
    a = qd.spec.autoscaling
    assert a is not None
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(qd, names.engine(qd), "engine"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": names.engine(qd)},
            "minReplicas": min_replicas(review, gateway_holds),
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": HPA_METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(target_queue_depth(review))},
                    },
                }
            ],
            "behavior": _behavior(review),
        },
    }


def queue_query(review: Review) -> str:
    """Requests waiting in all engines of the deployment; KEDA divides it by the threshold per replica."""
    qd = review.resource
    return keda_query(qd.metadata.namespace, qd.metadata.name)


#: KEDA's polling interval at zero replicas: how soon it sees the first held request once Prometheus has
#: scraped it (KEDA's default, 30 s, would add that much to every wake).
WAKE_POLL_SECONDS = 10
#: The shortest window of the gateway-traffic trigger, seconds.
MIN_TRAFFIC_WINDOW_SECONDS = 60


def traffic_window(review: Review) -> str:
    """The window of the gateway-traffic trigger: the engines stay up while any completion was answered in
    it. Four scrape intervals (Prometheus's advice for increase() and rate(), so a window always holds
    samples enough), at least a minute: 1m at the default 15 s interval."""
    interval = _seconds(review.resource.spec.monitoring.interval)
    return f"{max(MIN_TRAFFIC_WINDOW_SECONDS, math.ceil(4 * interval))}s"


def _seconds(duration: str) -> float:
    """A scrape interval as the spec allows it (`15s`, `500ms`, `1m`), in seconds."""
    for unit, seconds in (("ms", 0.001), ("s", 1), ("m", 60)):  # "ms" before "s", which it ends with
        if duration.endswith(unit):
            return int(duration.removesuffix(unit)) * seconds
    raise ValueError(f"not a scrape interval: {duration!r}")


#: A threshold no value reaches: the trigger only activates (0 -> 1) and never adds replicas itself.
ACTIVATION_ONLY = 1_000_000_000


def _wake_triggers(review: Review, server: str | None) -> list[dict[str, Any]]:
    """autoscaling.minReplicas 0: the gateway's held requests wake the engines (0 -> 1; their threshold,
    the most the gateway holds, keeps them from asking for more than one replica, so a burst during a
    cold start is one scale-up), and its traffic keeps them up: KEDA goes to zero once no trigger has been
    active for cooldownPeriod (idleSeconds). The engines' queue says nothing at zero, where they export
    nothing, and little at low load, where nothing waits."""
    qd = review.resource
    h = review.holding
    assert h is not None
    ns, name = qd.metadata.namespace, qd.metadata.name
    return [
        {
            "type": "prometheus",
            "name": "held-requests",
            "metadata": {
                "serverAddress": server,
                "query": recording.gateway_held_query(ns, name),
                "threshold": str(h.max_held_requests),
                "activationThreshold": "0",
            },
        },
        {
            "type": "prometheus",
            "name": "gateway-traffic",
            "metadata": {
                "serverAddress": server,
                "query": recording.gateway_traffic_query(ns, name, traffic_window(review)),
                "threshold": str(ACTIVATION_ONLY),
                "activationThreshold": "0",
            },
        },
    ]


def build_scaled_object(review: Review, gateway_holds: bool = True) -> dict[str, Any]:
    qd = review.resource
    a = qd.spec.autoscaling
    assert a is not None
    triggers = [
        {
            "type": "prometheus",
            "metadata": {
                "serverAddress": a.prometheus_address,
                "query": queue_query(review),
                "threshold": str(target_queue_depth(review)),
            },
        },
        *(_wake_triggers(review, a.prometheus_address) if a.min_replicas == 0 else []),
    ]
    # the status finds the held requests in KEDA's HPA by this trigger's place (api/coldstart.py)
    assert a.min_replicas > 0 or triggers[HELD_TRIGGER_INDEX]["name"] == "held-requests"
    to_zero: dict[str, int] = {}
    if a.min_replicas == 0:
        to_zero = {"pollingInterval": WAKE_POLL_SECONDS, "cooldownPeriod": a.scale_to_zero.idle_seconds}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(qd, names.engine(qd), "engine"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": names.engine(qd)},
            "minReplicaCount": min_replicas(review, gateway_holds),
            "maxReplicaCount": a.max_replicas,
            **to_zero,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(review)}},
            "triggers": triggers,
        },
    }


def keda_hpa_name(review: Review) -> str:
    """The HPA KEDA creates for the ScaledObject (its default name), which the status reads."""
    return f"keda-hpa-{names.engine(review.resource)}"
