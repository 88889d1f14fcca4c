"""Where requests wait and how the autoscaler sees it: what one engine replica runs at once, the queue
depth the autoscaler aims for, how many requests the gateway must pass to the engines so their queue
stays visible, and the names of the metric along the way.

The autoscaler's signal is the engines' own waiting count (`vllm:num_requests_waiting`). A gateway
that holds requests back before the engines could queue them hides that signal: the wait moves into
the router, the engines report no queue and no replica is added. So the gateway's pass-through limit
follows the engines' capacity at their largest replica count (a full batch running and a waiting room
per replica); the gateway's own queue and 503s (overload protection) apply only above it. A routing
policy that keeps the replicas the autoscaler adds from getting requests is warned about too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import recording
from .plan import Plan
from .spec import QwenDeploymentSpec

# The metric's names along the way are defined once, with the recording rules (recording.py): vLLM's
# waiting count, the per-pod recorded series, the label naming the QwenDeployment, the adapter's metric.
QUEUE_METRIC = recording.VLLM_WAITING
QUEUE_RECORDING = recording.ENGINE_QUEUE_DEPTH
DEPLOYMENT_LABEL = recording.DEPLOYMENT_LABEL
HPA_METRIC = recording.ADAPTER_METRIC
#: The aggregated API each driver's metric comes through: prometheus-adapter's custom metrics for the
#: HPA, KEDA's metrics server (external metrics) for its own HPA.
METRICS_API_SERVICE = {
    "hpa": "v1beta1.custom.metrics.k8s.io",
    "keda": "v1beta1.external.metrics.k8s.io",
}


def keda_query(namespace: str, name: str) -> str:
    """PromQL for the requests waiting in all engines of a QwenDeployment (KEDA's trigger)."""
    return recording.deployment_queue_query(namespace, name)


#: Prompt plus output tokens of a typical chat request, for how many requests the KV cache runs at once.
TYPICAL_REQUEST_TOKENS = 4096
#: Default target queue depth as a share of the requests a replica runs at once. With continuous
#: batching a waiting request gets the next free slot, so q waiting behind c running wait about q/c of
#: one request's duration: a tenth keeps the added wait near 10% before a replica is added.
TARGET_QUEUE_SHARE = 0.1


@dataclass(frozen=True)
class Queueing:
    """The queueing numbers of one spec and its plan."""

    #: Requests one replica runs at once: maxNumSeqs, or fewer typical requests when the KV cache is smaller.
    concurrency_per_replica: int
    #: Average waiting requests per engine pod the autoscaler aims for (None without autoscaling).
    target_queue_depth: int | None
    #: "spec" (autoscaling.targetQueueDepth) or "plan" (derived here); None without autoscaling.
    target_queue_depth_source: str | None
    #: Engine replicas at most: autoscaling.maxReplicas, else replicas.
    max_replicas: int
    #: maxNumSeqs: requests one replica batches at most.
    batch: int
    #: Requests one replica may hold waiting: a full batch again, at least twice the target queue depth.
    waiting_room_per_replica: int

    @property
    def engine_capacity(self) -> int:
        """Requests the engines can hold at max_replicas (running plus waiting): the pass-through floor."""
        return self.max_replicas * (self.batch + self.waiting_room_per_replica)


def queueing(spec: QwenDeploymentSpec, plan: Plan) -> Queueing:
    """The numbers for `spec` with its capacity plan (zeros in a failed plan give the smallest values)."""
    seqs = spec.engine.max_num_seqs
    typical = min(plan.max_model_len, TYPICAL_REQUEST_TOKENS)
    concurrency = min(seqs, max(1, plan.kv_tokens_per_replica // typical))
    a = spec.autoscaling
    target: int | None = None
    source: str | None = None
    if a is not None:
        if a.target_queue_depth is not None:
            target, source = a.target_queue_depth, "spec"
        else:
            target, source = max(1, math.ceil(concurrency * TARGET_QUEUE_SHARE)), "plan"
    return Queueing(
        concurrency_per_replica=concurrency,
        target_queue_depth=target,
        target_queue_depth_source=source,
        max_replicas=a.max_replicas if a is not None else spec.effective_replicas,
        batch=seqs,
        waiting_room_per_replica=max(seqs, 2 * (target or 0)),
    )


def check_pass_through(spec: QwenDeploymentSpec, plan: Plan) -> None:
    """Warn when gateway.maxConcurrentRequests is below what the engines can run or queue."""
    g = spec.gateway
    if not g.enabled or g.max_concurrent_requests is None:
        return
    q = queueing(spec, plan)
    share = math.ceil(g.max_concurrent_requests / g.replicas)
    path = "spec.gateway.maxConcurrentRequests"
    if spec.autoscaling is not None and share < q.engine_capacity:
        plan.warn(
            path,
            f"each gateway pod passes {q.engine_capacity} requests (maxReplicas {q.max_replicas} x "
            f"(maxNumSeqs {q.batch} + {q.waiting_room_per_replica} waiting)), not the {share} asked for: "
            "a lower limit would keep the queue in the gateway, where the autoscaler does not see it",
        )
    elif spec.autoscaling is None and g.max_concurrent_requests < q.max_replicas * q.batch:
        plan.warn(
            path,
            f"{g.max_concurrent_requests} is below replicas x maxNumSeqs ({q.max_replicas * q.batch}): "
            "engines stay partly idle while requests wait in the gateway",
        )


def check_routing(spec: QwenDeploymentSpec, plan: Plan) -> None:
    """Warn where sticky_least_loaded's per-pod table of conversations works against the deployment."""
    g = spec.gateway
    if not g.enabled or g.policy != "sticky_least_loaded":
        return
    path = "spec.gateway.policy"
    if spec.autoscaling is not None:
        plan.warn(
            path,
            "sticky_least_loaded with autoscaling: once the gateway has seen each of nginx's conversation "
            "buckets (minutes of traffic), every bucket stays on the engine it was first given for 2 hours "
            "after its last request, so replicas the autoscaler adds get almost no requests; "
            "consistent_hash moves a share of the buckets to them (docs/gateway.md#routing-policies)",
        )
    if g.replicas > 1:
        plan.warn(
            path,
            f"sticky_least_loaded keeps its table in each of the {g.replicas} gateway pods: a conversation "
            "whose requests reach two pods can be placed on two engines, each caching its prefix; with "
            "consistent_hash every pod computes the same engine",
        )


def check_rate_split(spec: QwenDeploymentSpec, plan: Plan) -> None:
    """Warn where the per-pod shares of a key's limit cannot add up to it: each pod admits at least one
    request per minute and one at once (gateway/limits.py), so below one per pod the pods admit more."""
    g = spec.gateway
    if not g.enabled:
        return
    limit = g.rate_limit
    if limit.requests_per_minute < g.replicas:
        plan.warn(
            "spec.gateway.rateLimit.requestsPerMinute",
            f"{limit.requests_per_minute} is below the {g.replicas} gateway pods that share it: each pod "
            f"admits 1 per minute per key, so the gateway admits {g.replicas}",
        )
    if limit.burst + 1 < g.replicas:
        plan.warn(
            "spec.gateway.rateLimit.burst",
            f"{limit.burst} + 1 requests at once is below the {g.replicas} gateway pods that share it: each "
            f"pod admits 1 at once per key, so the gateway admits {g.replicas}",
        )
