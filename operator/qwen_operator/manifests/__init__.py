"""Pure builders: a reviewed QwenDeployment in, the child objects it needs out (plain dicts).

The operator applies exactly these objects; `qwen-operator render` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import versions
from ..api.pool import NodePool
from ..api.review import Review
from ..api.rollout import Rollout
from ..gateway import ACTIVATOR_METRICS_PORT, GATEWAY_METRICS_PORTS, GatewayConfig
from ..kinds import Skipped, kind_of
from .engine import build_engine_deployment, build_engine_service
from .exposure import build_client_service, build_routes
from .gateway import build_gateway, tier_metrics_port_name
from .lora import build_lora_config_map
from .monitoring import build_engine_service_monitor, build_gateway_pod_monitor, build_prometheus_rule
from .policy import DEFAULT_SCRAPERS, build_engine_network_policy, build_pdb
from .scaling import build_hpa, build_scaled_object


@dataclass(frozen=True)
class ClusterFacts:
    """What the builders need to know about the cluster; offline renders assume everything is there."""

    free_gpus: int | None = None  # allocatable minus requested GPUs on nodes of the pool
    missing_crds: frozenset[str] = field(default_factory=frozenset)
    #: The strategy of the engine rollout under way (Rollout.kept), which is not chosen again.
    rollout_under_way: Rollout | None = None
    #: Who may reach the engines besides their gateway (the operator's setting, policy.parse_scrapers).
    scrapers: tuple[dict[str, Any], ...] = DEFAULT_SCRAPERS
    #: The operator's own pods (policy.parse_operator_peer), admitted to the lora-sync sidecars.
    operator: dict[str, Any] | None = None
    #: No live gateway pod runs without the activator (autoscaling.minReplicas 0): until then the
    #: autoscaler keeps one engine, or the requests of a pod that cannot hold would get a 503 at zero.
    gateway_holds: bool = True
    #: The operator's own image, which its sidecars run (lora-sync, the activator): the chart's.
    operator_image: str = versions.OPERATOR_IMAGE


@dataclass
class Children:
    """The objects to apply, and the optional ones skipped because their CRD is missing."""

    objects: list[dict[str, Any]]
    rollout: Rollout
    skipped: list[Skipped]


def build_children(review: Review, facts: ClusterFacts | None = None) -> Children:
    """Every child object of a valid QwenDeployment, in apply order."""
    facts = facts or ClusterFacts()
    spec = review.resource.spec
    rollout = facts.rollout_under_way or Rollout.choose(facts.free_gpus, review.plan.gpus_per_replica)
    objects = [
        *build_gateway(review, GatewayConfig.of(review), facts.operator_image),
        *build_routes(review),
        build_engine_service(review),
        build_client_service(review),
        *([build_lora_config_map(review)] if spec.lora else []),
        build_engine_deployment(review, rollout, facts.operator_image),
        build_pdb(review, "engine"),
    ]
    if spec.gateway.enabled:
        objects += [
            build_pdb(review, "gateway"),
            build_engine_network_policy(review, facts.scrapers, facts.operator),
        ]
    if spec.autoscaling:
        build = build_hpa if spec.autoscaling.driver == "hpa" else build_scaled_object
        objects.append(build(review, facts.gateway_holds))
    if spec.monitoring.service_monitor:
        objects.append(build_engine_service_monitor(review))
        if spec.gateway.enabled:
            # The activator's endpoint whenever KEDA scales (its port exists only at minReplicas 0): the
            # scrape job is then in place before an edit to zero, whose first wake would otherwise wait
            # for prometheus-operator's new configuration to reach Prometheus (up to a minute).
            keda = spec.autoscaling is not None and spec.autoscaling.driver == "keda"
            ports = [*GATEWAY_METRICS_PORTS, *([ACTIVATOR_METRICS_PORT] if keda or review.holding else [])]
            tiers = [(tier_metrics_port_name(i), t.name) for i, t in enumerate(spec.gateway.tiers)]
            objects.append(build_gateway_pod_monitor(review, ports, tiers))
    if spec.monitoring.prometheus_rule:
        objects.append(build_prometheus_rule(review))
    kept, skipped = [], []
    for obj in objects:
        kind = kind_of(obj["apiVersion"], obj["kind"])
        if kind.crd in facts.missing_crds:
            skipped.append(Skipped(kind, obj["metadata"]["name"]))
        else:
            kept.append(obj)
    return Children(objects=kept, rollout=rollout, skipped=skipped)


def build_all(review: Review, facts: ClusterFacts | None = None) -> list[dict[str, Any]]:
    return build_children(review, facts).objects


def node_pool(review: Review) -> NodePool:
    """The nodes engine pods may run on; the reconciler counts free GPUs on exactly these."""
    return NodePool.of(review.resource.spec.gpu)
