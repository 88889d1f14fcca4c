"""Which nodes belong to a QwenDeployment's GPU pool: one definition for scheduling and for counting.

The engine pod's scheduling terms (tolerations, nodeSelector, required node affinity) are built here,
and the free-GPU count that decides the rollout strategy evaluates the very same terms against each
node the way the scheduler does, so the two cannot disagree (a user's `gpu.affinity` included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .spec import GpuPool

#: Taint effects that keep a pod off a node unless it tolerates them.
_REPELLING = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class NodePool:
    """The engine pods' node constraints and the extended resource they request."""

    resource: str
    tolerations: list[dict[str, Any]]
    node_selector: dict[str, str] | None = None
    affinity: dict[str, Any] | None = None
    #: nodeSelectorTerms of the required node affinity (ORed), [] when none restricts.
    required_terms: list[dict[str, Any]] = field(default_factory=list)
    #: What selects the pool's nodes, in words (status.plan.nodeSelection).
    selection: str = ""

    @staticmethod
    def of(gpu: GpuPool) -> NodePool:
        tolerations = (
            list(gpu.tolerations)
            if gpu.tolerations is not None
            else [{"key": gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}]
        )
        affinity = gpu.affinity
        if gpu.affinity is not None:
            selection = "spec.gpu.affinity"
        elif gpu.node_selector is not None:
            selection = "spec.gpu.nodeSelector " + ", ".join(f"{k}={v}" for k, v in gpu.node_selector.items())
        else:
            # Default pool: every node labelled with one of the GPU type's names (GPU feature
            # discovery's product label, or the one spec.gpu.nodeLabel names).
            values = list(gpu.node_label_values())
            selection = f"{gpu.node_label_key()} in ({', '.join(values)})"
            term = {"key": gpu.node_label_key(), "operator": "In", "values": values}
            affinity = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [term]}]
                    }
                }
            }
        required = ((affinity or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        return NodePool(
            resource=gpu.resource_name,
            tolerations=tolerations,
            node_selector=gpu.node_selector,
            affinity=affinity,
            required_terms=list(required.get("nodeSelectorTerms") or []),
            selection=selection,
        )

    def pod_scheduling(self) -> dict[str, Any]:
        """The pod spec fields that place engine pods on this pool."""
        out: dict[str, Any] = {"tolerations": self.tolerations}
        if self.node_selector is not None:
            out["nodeSelector"] = self.node_selector
        if self.affinity is not None:
            out["affinity"] = self.affinity
        return out

    def admits(self, node: dict[str, Any]) -> bool:
        """Whether the scheduler may place an engine pod on `node` (labels, affinity, taints)."""
        meta = node.get("metadata", {})
        labels = meta.get("labels") or {}
        if self.node_selector and any(labels.get(k) != v for k, v in self.node_selector.items()):
            return False
        if self.required_terms and not any(_term_matches(t, labels, meta) for t in self.required_terms):
            return False
        taints = (node.get("spec") or {}).get("taints") or []
        return all(
            t.get("effect") not in _REPELLING or any(_tolerates(tol, t) for tol in self.tolerations)
            for t in taints
        )


def _term_matches(term: dict[str, Any], labels: dict[str, str], meta: dict[str, Any]) -> bool:
    """A nodeSelectorTerm: all its expressions hold (an empty term matches no node, as in Kubernetes)."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    node_fields = {"metadata.name": meta.get("name")}
    return all(_requirement(e, labels) for e in expressions) and all(
        _requirement(f, {k: v for k, v in node_fields.items() if v is not None}) for f in fields
    )


def _requirement(expr: dict[str, Any], values: dict[str, str]) -> bool:
    key, op, wanted = expr.get("key", ""), expr.get("operator"), list(expr.get("values") or [])
    present = key in values
    if op == "In":
        return present and values[key] in wanted
    if op == "NotIn":
        return not present or values[key] not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' toleration matching: empty effect tolerates every effect, empty key with Exists all."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", "")
