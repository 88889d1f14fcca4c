"""The activator's command line: the sidecar that holds requests while no engine is ready
(autoscaling.minReplicas 0; qwen_operator.activator runs it, api/coldstart.py sizes its bounds)."""

from __future__ import annotations

import json

from ..api.review import Review
from .access import access_groups
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


def _model_list(review: Review, names: list[str]) -> str:
    spec = review.resource.spec
    base = spec.served_model_name
    routed = {*spec.tier_names, *spec.alias_names}
    cards = [
        # a tier's or an alias's card as the gateway adds it to the engines' list (model-access.js)
        {"id": name, "object": "model", "created": 0, "owned_by": "qwen-gateway"}
        if name in routed
        else {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "parent": None if name == base else base,
            "max_model_len": review.plan.max_model_len,
        }
        for name in names
    ]
    return json.dumps({"object": "list", "data": cards}, separators=(",", ":"))


def models_at_zero(review: Review) -> dict[str, str] | None:
    """What GET /v1/models answers while no engine is ready, by access group ("": keys not limited),
    in the shape of vLLM's list: every key sees the names it may use, no engine wakes. None (the
    listing gets 503) when a name would need escaping in nginx.conf's single-quoted text."""
    spec = review.resource.spec
    lists = {"": _model_list(review, spec.routable_names)}
    for group in access_groups(spec):
        lists[group.id] = _model_list(review, [m for m in spec.routable_names if m in group.models])
    if any(set("$'\\") & set(text) for text in lists.values()):
        return None
    return lists
