"""What one gateway pod enforces: the spec's gateway-wide limits split per pod, and the pass-through
limit that follows the engines' capacity so their queue, the autoscaler's signal, stays visible."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..api.review import Review


def _per_pod(total: int, replicas: int) -> int:
    """Each gateway pod enforces its share, so the whole gateway never admits more than the spec says."""
    return math.ceil(total / replicas)


def rate_share(total: int, replicas: int) -> int:
    """A pod's share of a key's rate, rounded down so that the pods together never admit more than the
    key's limit; at least 1 (a key limited below one request per minute per pod is not served at all)."""
    return max(1, total // replicas)


def pass_through(review: Review) -> int:
    """Requests one gateway pod passes to the engines at once (vllm-router --max-concurrent-requests).

    Default: the engines' capacity at their largest replica count, not split across gateway pods: a pod
    cannot know what its peers pass, and a share would hold back clients whose connections land on one
    pod. With autoscaling an explicit gateway.maxConcurrentRequests may raise it, never lower it (the
    review warns); with fixed replicas it applies as set, split like every other limit.
    """
    spec = review.resource.spec
    g = spec.gateway
    capacity = max(1, review.queueing.engine_capacity)
    if g.max_concurrent_requests is None:
        return capacity
    share = _per_pod(g.max_concurrent_requests, g.replicas)
    return max(share, capacity) if spec.autoscaling is not None else share


@dataclass(frozen=True)
class Limits:
    """The limits one gateway pod enforces."""

    #: This pod's share of each key's requests per minute, and the key's whole limit.
    rate_per_minute: int
    key_rate_per_minute: int
    gateway_pods: int
    #: nginx's limit_req burst: it admits burst + 1 requests at once (the first is not counted).
    burst: int
    retry_after: int
    #: Requests passed to the engines at once; overload protection (queue, then 503) applies above it.
    max_concurrent: int
    queue_size: int
    in_flight: int

    @staticmethod
    def of(review: Review) -> Limits:
        g = review.resource.spec.gateway
        rate = rate_share(g.rate_limit.requests_per_minute, g.replicas)
        # A key may send its burst above the rate at once, so burst + 1 requests (one at the rate); each
        # pod admits its share of those, so the pods together admit no more than one pod would.
        at_once = rate_share(g.rate_limit.burst + 1, g.replicas)
        concurrent = pass_through(review)
        queue = _per_pod(g.queue_size, g.replicas)
        # The tiers' requests pass the same in-flight cap: each tier's router admits its own share.
        tiers = sum(t.max_concurrent_requests + t.queue_size for t in g.tiers)
        return Limits(
            rate_per_minute=rate,
            key_rate_per_minute=g.rate_limit.requests_per_minute,
            gateway_pods=g.replicas,
            burst=at_once - 1,
            retry_after=max(1, math.ceil(60 / rate)),  # time for one request's worth to refill in this pod
            max_concurrent=concurrent,
            queue_size=queue,
            in_flight=concurrent + queue + tiers,
        )

    def rate_limited_message(self) -> str:
        """The 429's message: what this pod admits, since a client's keepalive connection stays on one."""
        key, pod, retry = self.key_rate_per_minute, self.rate_per_minute, f"retry after {self.retry_after} s."
        if self.gateway_pods == 1:
            return f"Rate limit reached for this API key ({key} requests per minute); {retry}"
        return (
            f"Rate limit reached for this API key: this gateway pod admits {pod} requests per "
            f"minute of the key limit of {key} ({key} split across {self.gateway_pods} gateway pods); {retry}"
        )
