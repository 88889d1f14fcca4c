"""Disruption budgets and the NetworkPolicy that keeps engine pods reachable only through the gateway."""

from __future__ import annotations

from typing import Any

from .. import names
from ..api.engine import ENGINE_PORT
from ..api.review import Review
from .meta import metadata

#: Pods allowed to scrape engine metrics directly, in any namespace.
SCRAPER_LABELS = {"app.kubernetes.io/name": "prometheus"}


def build_pdb(review: Review, component: str) -> dict[str, Any]:
    """At most one pod of the component voluntarily evicted at a time (node drains, upgrades)."""
    qd = review.resource
    name = names.engine(qd) if component == "engine" else names.gateway(qd)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(qd, name, component),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(qd, component)}},
    }


def build_engine_network_policy(review: Review) -> dict[str, Any]:
    """vLLM leaves some routes open even with an API key, so only the gateway and scrapers may connect."""
    qd = review.resource
    port = [{"protocol": "TCP", "port": ENGINE_PORT}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(qd, names.engine(qd), "engine"),
        "spec": {
            "podSelector": {"matchLabels": names.selector(qd, "engine")},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": names.selector(qd, "gateway")}}], "ports": port},
                {
                    "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": SCRAPER_LABELS}}],
                    "ports": port,
                },
            ],
        },
    }
