"""How the engine Deployment replaces pods, chosen from the free GPUs in its pool."""

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

    def strategy(self) -> dict[str, Any]:
        """The Deployment's `spec.strategy`."""
        surge, unavailable = (1, 0) if self.mode == "Surge" else (0, 1)
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}

    def describe(self) -> str:
        """As published in `status.rolloutStrategy`."""
        return f"{self.mode}: {self.reason}"
