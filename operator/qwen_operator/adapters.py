"""Where each LoRA adapter is loaded: the lora-sync sidecars' /status, read from every ready engine pod.

The operator calls no engine (it holds no engine key and reads no Secret); each engine pod's sidecar
(`qwen-operator lora-sync`, manifests/lora.py) reports what its engine has loaded, from the engine's own
/v1/models, and why an adapter failed to load. One short GET per ready pod and reconcile, only for
deployments with spec.lora.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .api.lorafile import SIDECAR_PORT

#: GET a sidecar's /status URL and return its JSON; raises OSError or ValueError when there is no answer
#: (reconcile.py passes the HTTP call; this module stays pure).
Fetch = Callable[[str], dict[str, Any]]


@dataclass
class AdapterState:
    """One desired adapter across the ready engine pods."""

    loaded: int = 0
    #: "pod: message" for each pod whose sidecar reports a load error for it.
    errors: list[str] = field(default_factory=list)


@dataclass
class LoraObservation:
    """What the sidecars of the ready engine pods said."""

    pods: int  # ready engine pods
    adapters: dict[str, AdapterState]
    #: "pod: why" for each ready pod whose sidecar did not answer (not counted as loaded anywhere).
    silent: list[str] = field(default_factory=list)
    #: Adapters no longer desired but still loaded (the sidecar has yet to see the new list): pods each.
    unloading: dict[str, int] = field(default_factory=dict)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return bool(pod.get("status", {}).get("podIP")) and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def observe(pods: list[dict[str, Any]], desired: list[str], fetch: Fetch) -> LoraObservation:
    """Ask the sidecar of every ready pod; count, per desired adapter, the pods that have it loaded."""
    ready = [p for p in pods if _ready(p)]
    seen = LoraObservation(pods=len(ready), adapters={name: AdapterState() for name in desired})
    for pod in ready:
        name = pod["metadata"]["name"]
        url = f"http://{pod['status']['podIP']}:{SIDECAR_PORT}/status"
        try:
            report = fetch(url)
        except (OSError, ValueError) as error:  # urllib's URLError is an OSError
            seen.silent.append(f"{name}: {error}")
            continue
        states = report.get("adapters") or {}
        for adapter, mine in states.items():
            if adapter not in seen.adapters and (mine or {}).get("loaded"):
                seen.unloading[adapter] = seen.unloading.get(adapter, 0) + 1
        for adapter, state in seen.adapters.items():
            mine = states.get(adapter) or {}
            if mine.get("loaded"):
                state.loaded += 1
            elif mine.get("error"):
                state.errors.append(f"{name}: {mine['error']}")
    return seen
