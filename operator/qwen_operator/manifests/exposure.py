"""How clients reach a QwenDeployment: the client Service (the gateway, or the engines when the gateway
is off), and the optional Ingress and Gateway API HTTPRoute in front of it."""

from __future__ import annotations

from typing import Any

from .. import names
from ..api.review import Review
from .meta import metadata


def build_ingress(review: Review) -> dict[str, Any]:
    qd = review.resource
    ing = qd.spec.gateway.ingress
    assert ing is not None
    meta = metadata(qd, names.gateway(qd), "gateway")
    if ing.annotations:
        meta["annotations"] = dict(ing.annotations)
    spec: dict[str, Any] = {
        "rules": [
            {
                "host": ing.host,
                "http": {
                    "paths": [
                        {
                            "path": "/v1",
                            "pathType": "Prefix",
                            "backend": {
                                "service": {"name": names.client_service(qd), "port": {"name": "http"}}
                            },
                        }
                    ]
                },
            }
        ]
    }
    if ing.class_name:
        spec["ingressClassName"] = ing.class_name
    if ing.tls_secret_name:
        spec["tls"] = [{"hosts": [ing.host], "secretName": ing.tls_secret_name}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": spec}


def build_http_route(review: Review) -> dict[str, Any]:
    qd = review.resource
    g = qd.spec.gateway
    route = g.http_route
    assert route is not None
    spec: dict[str, Any] = {
        "parentRefs": list(route.parent_refs),
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                "backendRefs": [{"name": names.client_service(qd), "port": g.service.port}],
                # Gateway implementations default to short timeouts; streams may run this long.
                "timeouts": {"request": f"{review.plan.request_timeout_seconds}s"},
            }
        ],
    }
    if route.hostnames:
        spec["hostnames"] = list(route.hostnames)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata(qd, names.gateway(qd), "gateway"),
        "spec": spec,
    }


def build_routes(review: Review) -> list[dict[str, Any]]:
    """The Ingress and HTTPRoute the spec asks for, in apply order (only with the gateway on)."""
    g = review.resource.spec.gateway
    if not g.enabled:
        return []
    return [
        *([build_ingress(review)] if g.ingress else []),
        *([build_http_route(review)] if g.http_route else []),
    ]


def build_client_service(review: Review) -> dict[str, Any]:
    """The Service clients call (named like the resource): the gateway pods, or the engines when off."""
    qd = review.resource
    g = qd.spec.gateway
    component = "gateway" if g.enabled else "engine"
    meta = metadata(qd, names.client_service(qd), component)
    if g.service.annotations:
        meta["annotations"] = dict(g.service.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": g.service.type,
            "selector": names.selector(qd, component),
            # Both the gateway's nginx and the engine name their serving port "http".
            "ports": [{"name": "http", "port": g.service.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
