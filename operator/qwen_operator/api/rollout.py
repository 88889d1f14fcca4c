"""How the engine Deployment replaces pods: chosen from the free GPUs in its pool when a rollout starts,
and kept until it completes (the surge pod itself takes the free GPUs it was chosen for: chosen again
mid-rollout, the answer would turn to InPlace and an old engine would be stopped while the new one
still loads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rollout:
    """Surge when a whole extra replica fits on free GPUs, else replace pods one at a time."""

    mode: str  # "Surge" or "InPlace"
    reason: str

    @staticmethod
    def choose(free_gpus: int | None, gpus_per_replica: int) -> Rollout:
        """The reason names the threshold, not the count: the count changes with every pod and node of
        the pool, and a status that followed it would be rewritten for every QwenDeployment each time."""
        if free_gpus is None:
            return Rollout("InPlace", "free GPUs in the pool unknown: replacing pods one at a time")
        if free_gpus >= gpus_per_replica:
            return Rollout("Surge", f"the pool has the {gpus_per_replica} free GPUs of a surge replica")
        return Rollout(
            "InPlace",
            f"fewer free GPUs in the pool than the {gpus_per_replica} of a surge replica: "
            "replacing pods one at a time",
        )

    @staticmethod
    def kept(deployment: dict[str, Any] | None, unschedulable: bool = False) -> Rollout | None:
        """The strategy of the rollout the engine Deployment is in the middle of (as the annotation
        ROLLOUT_ANNOTATION of the operator's last apply says), None when none is under way. Surge is
        given up only when a pod cannot be scheduled (the free GPUs went to someone else): without that,
        the surge pod would wait for GPUs forever."""
        if deployment is None or rollout_complete(deployment):
            return None
        text = (deployment["metadata"].get("annotations") or {}).get(ROLLOUT_ANNOTATION, "")
        mode, _, reason = text.partition(": ")
        if mode not in ("Surge", "InPlace"):  # a Deployment of an operator before the annotation
            surge = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate", {})
            mode = "Surge" if str(surge.get("maxSurge", "")) == "1" else "InPlace"
            reason = "the strategy the rollout started with"
        if mode == "Surge" and unschedulable:
            return Rollout(
                "InPlace",
                "the surge pod cannot be scheduled (its free GPUs are gone): replacing pods one at a time",
            )
        return Rollout(mode, reason)

    def strategy(self) -> dict[str, Any]:
        """The Deployment's `spec.strategy`."""
        surge, unavailable = (1, 0) if self.mode == "Surge" else (0, 1)
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}

    def describe(self) -> str:
        """As published in `status.rolloutStrategy`."""
        return f"{self.mode}: {self.reason}"


#: Annotation of the engine Deployment: the rollout strategy it was last applied with (`describe()`).
ROLLOUT_ANNOTATION = "qwenops.dev/rollout-strategy"


def rollout_complete(deployment: dict[str, Any]) -> bool:
    """The Deployment controller has seen the latest spec and every replica runs it and is available
    (what `kubectl rollout status` waits for)."""
    meta, spec, st = deployment["metadata"], deployment.get("spec") or {}, deployment.get("status") or {}
    desired = spec.get("replicas", 1)
    return (
        st.get("observedGeneration", 0) >= meta.get("generation", 0)
        and st.get("updatedReplicas", 0) >= desired
        and st.get("replicas", 0) == st.get("updatedReplicas", 0)
        and st.get("availableReplicas", 0) >= desired
    )
