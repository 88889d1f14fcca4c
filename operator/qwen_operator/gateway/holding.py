"""The activator's command line: the sidecar that holds requests while no engine is ready
(autoscaling.minReplicas 0; qwen_operator.activator runs it, api/coldstart.py sizes its bounds)."""

from __future__ import annotations

from ..api.review import Review
from .wiring import POD, Wiring

#: Seconds between SSE comments to a held stream: below the idle timeouts of common proxies and load
#: balancers (60 s and more) by a wide margin.
KEEPALIVE_SECONDS = 5
#: Seconds between the activator's looks at the router's /readiness while requests wait.
POLL_SECONDS = 1


def activator_args(review: Review, wiring: Wiring = POD) -> list[str] | None:
    """`qwen-operator activator ...` after the program name; None when the engines never go to zero."""
    h = review.holding
    if h is None:
        return None
    return [
        "activator",
        "--router", f"http://{wiring.router_host}:{wiring.router_port}",
        "--hold-seconds", str(h.hold_seconds),
        "--max-held", str(h.max_held_per_pod),
        "--retry-after", str(h.retry_after_seconds),
        "--keepalive-seconds", str(KEEPALIVE_SECONDS),
        "--poll-seconds", str(POLL_SECONDS),
        "--host", "127.0.0.1",
        "--port", str(wiring.activator_port),
        "--metrics-host", wiring.bind_host or "0.0.0.0",
        "--metrics-port", str(wiring.activator_metrics_port),
    ]  # fmt: skip


def hold_read_timeout(review: Review) -> int:
    """nginx's read timeout towards the activator: the longest hold, then the longest request."""
    h = review.holding
    return review.plan.request_timeout_seconds + (h.hold_seconds if h else 0)
