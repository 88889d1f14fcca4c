"""Tiers and aliases (spec.gateway.tiers, spec.gateway.aliases) as nginx routes them.

A request's model (read from its body by njs, as for modelAccess) picks its target: the base model and
the adapters go to this deployment's router as before; a tier's name goes to that tier's server, an
nginx server on a Unix socket in the pod that applies the tier's per-key limit, sets the tier's engine
key, rewrites `model` when it differs (an alias, a spill-over) and proxies to the tier's own vllm-router;
an alias picks one of those by its rules. A tier with spillTo has its target's server as a `backup`
upstream: nginx tries it only when the tier's router answers 503 (no ready engine) or 429 (its admission
is full), which is the tier's saturation. A key limited (spec.gateway.modelAccess) to models without the
spill target gets an upstream without the backup instead, so the tier's own refusal; the tier server
passes the key id on, so that the spill target's per-key limit counts what spills there. The server
`self` does the same for the base model (and adapters) when an alias or a spill-over picks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.review import Review
from ..api.spec import QwenDeploymentSpec
from .access import access_groups
from .errors import GatewayError
from .limits import rate_share
from .wiring import Wiring

#: The target of requests for the base model or an adapter that need their `model` rewritten.
SELF = "self"


@dataclass(frozen=True)
class TierRoute:
    """One target of nginx.conf's tier servers: a tier (t0, t1, ...) or this deployment (self)."""

    id: str
    model: str  # the name requests are rewritten to
    router: str  # host:port of its vllm-router
    spill: str | None  # id of the target tried when this one is saturated
    #: Access groups (gateway/access.py) whose keys may not use the spill target: never spilled.
    spill_denied: tuple[str, ...]
    #: Per-pod share of the tier's per-key rate limit: (requests per minute, burst); None: none.
    rate: tuple[int, int] | None
    rate_limited: GatewayError | None
    engine_key_file: str | None  # the tier's engine key; None: the base's, already set


def target_of(spec: QwenDeploymentSpec, model: str) -> str:
    """The target id of a model name an alias or a spill-over picks."""
    for i, tier in enumerate(spec.gateway.tiers):
        if tier.name == model:
            return f"t{i}"
    return SELF


def tier_routes(review: Review, wiring: Wiring) -> list[TierRoute]:
    """The tier servers of nginx.conf: one per tier, then `self`; none without tiers and aliases."""
    spec = review.resource.spec
    g = spec.gateway
    if not g.tiers and not g.aliases:
        return []
    groups = access_groups(spec)
    routes = []
    for i, tier in enumerate(g.tiers):
        rate = None
        limited = None
        if tier.rate_limit is not None:
            per_minute = rate_share(tier.rate_limit.requests_per_minute, g.replicas)
            at_once = rate_share(tier.rate_limit.burst + 1, g.replicas)
            rate = (per_minute, at_once - 1)
            limited = GatewayError(
                429,
                429,
                "rate_limit_exceeded",
                f"Rate limit reached for this API key on {tier.name} ({tier.rate_limit.requests_per_minute} "
                f"requests per minute, {per_minute} in this gateway pod).",
                type="requests",
            )
        routes.append(
            TierRoute(
                id=f"t{i}",
                model=tier.name,
                router=f"{wiring.router_host}:{wiring.tier_router_port(i)}",
                spill=target_of(spec, tier.spill_to) if tier.spill_to else None,
                spill_denied=tuple(a.id for a in groups if tier.spill_to and tier.spill_to not in a.models),
                rate=rate,
                rate_limited=limited,
                engine_key_file=wiring.tier_engine_key_file(i),
            )
        )
    routes.append(
        TierRoute(
            id=SELF,
            model=spec.served_model_name,
            router=f"{wiring.router_host}:{wiring.router_port}",
            spill=None,
            spill_denied=(),
            rate=None,
            rate_limited=None,
            engine_key_file=None,
        )
    )
    return routes


def routing_data(spec: QwenDeploymentSpec) -> dict[str, Any]:
    """What model-access.js needs to pick a request's target: the tiers' ids by name, and the aliases."""
    return {
        "tiers": {tier.name: f"t{i}" for i, tier in enumerate(spec.gateway.tiers)},
        "aliases": {
            alias.name: {
                "rules": [
                    {
                        "model": rule.model,
                        "maxBytes": rule.max_prompt_bytes,
                        "header": rule.header.name.lower() if rule.header else None,
                        "value": rule.header.value if rule.header else None,
                        "tools": rule.tools,
                        "images": rule.images,
                        "keys": rule.api_keys or None,
                    }
                    for rule in alias.rules
                ],
                "default": alias.default,
            }
            for alias in spec.gateway.aliases
        },
        "cards": [*spec.tier_names, *spec.alias_names],
    }
