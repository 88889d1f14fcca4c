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
        if free_gpus is None:
            return Rollout("InPlace", "free GPUs in the pool unknown: replacing pods one at a time")
        if free_gpus >= gpus_per_replica:
            return Rollout(
                "Surge", f"{free_gpus} free GPUs in the pool fit a surge replica ({gpus_per_replica} GPUs)"
            )
        return Rollout(
            "InPlace",
            f"{free_gpus} free GPUs in the pool, a surge replica needs "
            f"{gpus_per_replica}: replacing pods one at a time",
        )

    def strategy(self) -> dict[str, Any]:
        """The Deployment's `spec.strategy`."""
        surge, unavailable = (1, 0) if self.mode == "Surge" else (0, 1)
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}

    def describe(self) -> str:
        """As published in `status.rolloutStrategy`."""
        return f"{self.mode}: {self.reason}"
