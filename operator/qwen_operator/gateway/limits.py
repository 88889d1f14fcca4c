"""The spec's gateway-wide limits split into what one gateway pod enforces."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..api.review import Review


def _per_pod(total: int, replicas: int) -> int:
    """Each gateway pod enforces its share, so the whole gateway never admits more than the spec says."""
    return math.ceil(total / replicas)


@dataclass(frozen=True)
class Limits:
    """The spec's gateway-wide limits as one pod enforces them."""

    rate_per_minute: int
    burst: int
    retry_after: int
    max_concurrent: int
    queue_size: int
    in_flight: int

    @staticmethod
    def of(review: Review) -> Limits:
        g = review.resource.spec.gateway
        rate = _per_pod(g.rate_limit.requests_per_minute, g.replicas)
        concurrent = _per_pod(g.max_concurrent_requests, g.replicas)
        queue = _per_pod(g.queue_size, g.replicas)
        return Limits(
            rate_per_minute=rate,
            burst=_per_pod(g.rate_limit.burst, g.replicas),
            retry_after=max(1, math.ceil(60 / rate)),  # time for one request's worth to refill
            max_concurrent=concurrent,
            queue_size=queue,
            in_flight=concurrent + queue,
        )
