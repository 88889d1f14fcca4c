"""Disruption budgets and the NetworkPolicy that keeps engine pods reachable only through the gateway."""

from __future__ import annotations

import copy
import json
from typing import Any

from .. import names
from ..api.engine import ENGINE_PORT
from ..api.lorafile import SIDECAR_PORT
from ..api.review import Review
from .meta import metadata

#: Who may connect to the engines besides their own gateway pods, unless the operator is told otherwise
#: (the chart's `engineNetworkPolicy.scrapers`, env QWEN_OPERATOR_ENGINE_SCRAPERS): Prometheus pods of
#: the namespace `monitoring`. NetworkPolicy peers: each names the namespaces and the pods in them.
DEFAULT_SCRAPERS: tuple[dict[str, Any], ...] = (
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    },
)
SCRAPERS_ENV = "QWEN_OPERATOR_ENGINE_SCRAPERS"
_SELECTOR_KEYS = {"matchLabels", "matchExpressions"}


def parse_scrapers(text: str | None) -> tuple[dict[str, Any], ...]:
    """The scrapers setting (a JSON list of NetworkPolicy peers); DEFAULT_SCRAPERS when unset.

    Each peer must name both a namespaceSelector and a podSelector that select something: an empty
    selector matches every namespace (or every pod), which would let any pod that carries a label reach
    the engines around the gateway. ValueError names the entry and what is wrong with it.
    """
    if text is None or not text.strip():
        return DEFAULT_SCRAPERS
    try:
        peers = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{SCRAPERS_ENV} is not JSON: {error}") from None
    if not isinstance(peers, list):
        raise ValueError(f"{SCRAPERS_ENV} must be a JSON list of NetworkPolicy peers")
    for i, peer in enumerate(peers):
        where = f"{SCRAPERS_ENV}[{i}]"
        if not isinstance(peer, dict) or set(peer) != {"namespaceSelector", "podSelector"}:
            raise ValueError(f"{where}: exactly namespaceSelector and podSelector, got {peer!r}")
        for key, selector in peer.items():
            if not isinstance(selector, dict) or not selector or set(selector) - _SELECTOR_KEYS:
                raise ValueError(
                    f"{where}.{key}: a label selector (matchLabels, matchExpressions) that is not empty:"
                    " an empty one selects everything"
                )
    return tuple(peers)


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


OPERATOR_PEER_ENV = "QWEN_OPERATOR_PEER"


def parse_operator_peer(text: str | None) -> dict[str, Any] | None:
    """The operator's own pods as a NetworkPolicy peer (the chart's QWEN_OPERATOR_PEER), or None where
    the operator runs outside the cluster (a developer's `qwen-operator run`: no pod to admit)."""
    if not text or not text.strip():
        return None
    (peer,) = parse_scrapers(f"[{text}]")
    return peer


def build_engine_network_policy(
    review: Review,
    scrapers: tuple[dict[str, Any], ...] = DEFAULT_SCRAPERS,
    operator: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The engines' guard: vLLM's --api-key covers /v1 only (/invocations, /tokenize, /pooling answer
    without it), so no pod but this deployment's gateway, the gateways that serve it as a tier (in its
    namespace) and the named scrapers may connect at all.
    With LoRA, the lora-sync sidecar's port (/status, /metrics) admits the scrapers and the operator."""
    qd = review.resource
    port = [{"protocol": "TCP", "port": ENGINE_PORT}]
    ingress = [
        {
            "from": [
                {"podSelector": {"matchLabels": names.selector(qd, "gateway")}},
                # the gateways of the deployments that serve this one as a tier (spec.gateway.tiers)
                {"podSelector": {"matchLabels": names.fronted_by(qd.metadata.name)}},
            ],
            "ports": port,
        },
        {"from": [copy.deepcopy(peer) for peer in scrapers], "ports": port},
    ]
    if qd.spec.lora:
        peers = [copy.deepcopy(peer) for peer in (*scrapers, *([operator] if operator else []))]
        ingress.append({"from": peers, "ports": [{"protocol": "TCP", "port": SIDECAR_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(qd, names.engine(qd), "engine"),
        "spec": {
            "podSelector": {"matchLabels": names.selector(qd, "engine")},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
