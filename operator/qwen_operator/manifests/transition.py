"""What an edit of a QwenDeployment does to the engines that serve: `qwen-operator plan -f new --from old`.

The same builders and the same rollout choice as the reconciler: whether the engine pods are replaced
(their template changes), how (Surge when the pool has a replica's GPUs free, else InPlace), and how many
engine replicas serve at the worst moment of the change. Zero downtime is that number staying at one or
more; keeping full capacity is it staying at the replicas before the edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import names
from ..api.review import Review
from ..objects import changed_paths
from . import ClusterFacts, build_children


@dataclass(frozen=True)
class EditImpact:
    restarts_engines: bool
    changes: list[str]  # paths of the engine pod template that change
    replicas_before: int  # fixed replicas, or the autoscaler's minimum
    replicas_after: int
    autoscaled_after: bool
    strategy: str  # as status.rolloutStrategy says it
    #: Engine replicas that serve at the worst moment of the change (maxUnavailable 0 under Surge).
    lowest_serving: int

    @property
    def zero_downtime(self) -> bool:
        return self.lowest_serving >= min(1, self.replicas_before)

    def as_dict(self) -> dict[str, Any]:
        return {
            "restartsEngines": self.restarts_engines,
            "changes": self.changes,
            "replicasBefore": self.replicas_before,
            "replicasAfter": self.replicas_after,
            "rolloutStrategy": self.strategy,
            "lowestServingReplicas": self.lowest_serving,
            "zeroDowntime": self.zero_downtime,
        }

    def lines(self) -> list[str]:
        what = (
            f"replaced ({', '.join(self.changes[:6])}{', ...' if len(self.changes) > 6 else ''})"
            if self.restarts_engines
            else "kept (the engine pod does not change)"
        )
        scale = f"{self.replicas_before} -> {self.replicas_after}" + (
            " (the autoscaler's minimum; replicas pass to it at their value)" if self.autoscaled_after else ""
        )
        return [
            f"Engine pods          {what}",
            f"Replicas             {scale}",
            f"Rollout              {self.strategy}" if self.restarts_engines else "Rollout              none",
            f"Serving at worst     {self.lowest_serving} of {self.replicas_before} replica(s)"
            + ("" if self.zero_downtime else ": DOWNTIME while the new engine starts"),
        ]


def _engine(review: Review, facts: ClusterFacts) -> tuple[dict[str, Any], str]:
    children = build_children(review, facts)
    name = names.engine(review.resource)
    dep = next(o for o in children.objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name)
    return dep, children.rollout.describe()


def _replicas(review: Review) -> int:
    spec = review.resource.spec
    return spec.autoscaling.min_replicas if spec.autoscaling else spec.effective_replicas


def edit_impact(old: Review, new: Review, free_gpus: int | None) -> EditImpact:
    """What applying `new` over a running `old` does, with `free_gpus` free in the new spec's pool
    (None: unknown, as for an operator that may not read nodes: InPlace)."""
    before, _ = _engine(old, ClusterFacts(free_gpus=free_gpus))
    after, strategy = _engine(new, ClusterFacts(free_gpus=free_gpus))
    old_template, new_template = before["spec"]["template"], after["spec"]["template"]
    changes = changed_paths(old_template, new_template) if old_template != new_template else []
    if old_template != new_template and not changes:
        changes = ["fields removed from the pod template"]
    replicas_before, replicas_after = _replicas(old), _replicas(new)
    autoscaled = new.resource.spec.autoscaling is not None
    if autoscaled:
        # The hand-off keeps what runs; the HPA then moves within its bounds.
        replicas_after = max(replicas_before, replicas_after)
    lowest = min(replicas_before, replicas_after)
    if changes and strategy.startswith("InPlace"):
        lowest = max(min(replicas_before, replicas_after) - 1, 0)
    return EditImpact(
        restarts_engines=bool(changes),
        changes=changes,
        replicas_before=replicas_before,
        replicas_after=replicas_after,
        autoscaled_after=autoscaled,
        strategy=strategy,
        lowest_serving=lowest,
    )
