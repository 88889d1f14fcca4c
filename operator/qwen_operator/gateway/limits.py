"""What one gateway pod enforces: the spec's gateway-wide limits split per pod, and the pass-through
limit that follows the engines' capacity so their queue, the autoscaler's signal, stays visible."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..api.queueing import queueing
from ..api.review import Review


def _per_pod(total: int, replicas: int) -> int:
    """Each gateway pod enforces its share, so the whole gateway never admits more than the spec says."""
    return math.ceil(total / replicas)


def pass_through(review: Review) -> int:
    """Requests one gateway pod passes to the engines at once (vllm-router --max-concurrent-requests).

    Default: the engines' capacity at their largest replica count, not split across gateway pods: a pod
    cannot know what its peers pass, and a share would hold back clients whose connections land on one
    pod. With autoscaling an explicit gateway.maxConcurrentRequests may raise it, never lower it (the
    review warns); with fixed replicas it applies as set, split like every other limit.
    """
    spec = review.resource.spec
    g = spec.gateway
    capacity = max(1, queueing(spec, review.plan).engine_capacity)
    if g.max_concurrent_requests is None:
        return capacity
    share = _per_pod(g.max_concurrent_requests, g.replicas)
    return max(share, capacity) if spec.autoscaling is not None else share


@dataclass(frozen=True)
class Limits:
    """The limits one gateway pod enforces."""

    rate_per_minute: int
    burst: int
    retry_after: int
    #: Requests passed to the engines at once; overload protection (queue, then 503) applies above it.
    max_concurrent: int
    queue_size: int
    in_flight: int

    @staticmethod
    def of(review: Review) -> Limits:
        g = review.resource.spec.gateway
        rate = _per_pod(g.rate_limit.requests_per_minute, g.replicas)
        concurrent = pass_through(review)
        queue = _per_pod(g.queue_size, g.replicas)
        return Limits(
            rate_per_minute=rate,
            burst=_per_pod(g.rate_limit.burst, g.replicas),
            retry_after=max(1, math.ceil(60 / rate)),  # time for one request's worth to refill
            max_concurrent=concurrent,
            queue_size=queue,
            in_flight=concurrent + queue,
        )
