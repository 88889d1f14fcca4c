"""Pure builders: a reviewed QwenDeployment in, the child objects it needs out (plain dicts).

The operator applies exactly these objects; `qwen-operator render` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.review import Review
from .engine import Rollout, build_engine_deployment, build_engine_service


@dataclass(frozen=True)
class ClusterFacts:
    """What the builders need to know about the cluster; offline renders use the defaults."""

    free_gpus: int | None = None  # allocatable minus requested GPUs on nodes of the pool
    monitoring_crds: bool = True  # ServiceMonitor / PrometheusRule CRDs installed
    keda_crds: bool = True


def build_all(review: Review, facts: ClusterFacts | None = None) -> list[dict[str, Any]]:
    """Every child object of a valid QwenDeployment, in apply order."""
    facts = facts or ClusterFacts()
    rollout = rollout_for(review, facts)
    return [
        build_engine_service(review),
        build_engine_deployment(review, rollout),
    ]


def rollout_for(review: Review, facts: ClusterFacts) -> Rollout:
    return Rollout.choose(facts.free_gpus, review.plan.gpus_per_replica)
