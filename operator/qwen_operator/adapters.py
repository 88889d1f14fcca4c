"""Where each LoRA adapter is loaded: the lora-sync sidecars' /status, read from every ready engine pod.

The operator calls no engine (it holds no engine key and reads no Secret); each engine pod's sidecar
(`qwen-operator lora-sync`, manifests/lora.py) reports what its engine has loaded, from the engine's own
/v1/models, and why an adapter failed to load. One short GET per ready pod and reconcile, only for
deployments with spec.lora.

Any pod with the engine labels answers here, so an answer is parsed as untrusted: whatever is not the
sidecar's /status shape makes that pod's report unknown, with a short reason, and never raises. The
strings taken from it are cut where they enter the status (status.bounded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .api.lorafile import SIDECAR_PORT

#: GET a sidecar's /status URL and return its JSON, whatever it is (reconcile.py passes the HTTP call;
#: this module stays pure). Whatever it raises means no usable answer from that pod: urllib's errors
#: are OSErrors, a broken HTTP answer (cut short, a bad status line) is http.client's HTTPException,
#: a body that is not JSON (or not UTF-8) a ValueError, JSON nested too deep a RecursionError.
Fetch = Callable[[str], Any]


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
    #: "pod: why" for each ready pod whose sidecar did not answer, or not as a sidecar does (not counted
    #: as loaded anywhere).
    silent: list[str] = field(default_factory=list)
    #: Adapters no longer desired but still loaded (the sidecar has yet to see the new list): pods each.
    unloading: dict[str, int] = field(default_factory=dict)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return bool(pod.get("status", {}).get("podIP")) and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


@dataclass(frozen=True)
class PodAdapter:
    """One adapter as one sidecar reports it."""

    loaded: bool
    error: str | None


def parse_report(answer: Any) -> dict[str, PodAdapter]:
    """{adapter: its state} from a sidecar's /status answer (lorasync.Report.status); ValueError with a
    short reason for anything else."""
    if not isinstance(answer, Mapping):
        raise ValueError(f"/status answered {_kind(answer)}, not an object")
    states = answer.get("adapters")
    if not isinstance(states, Mapping):
        raise ValueError(f"/status answered adapters as {_kind(states)}, not an object")
    parsed: dict[str, PodAdapter] = {}
    for adapter, state in states.items():
        if not isinstance(state, Mapping):
            raise ValueError(f"/status answered an adapter's state as {_kind(state)}, not an object")
        loaded, error = state.get("loaded"), state.get("error")
        if not isinstance(loaded, bool) or not (error is None or isinstance(error, str)):
            raise ValueError("/status answered an adapter's loaded or error of the wrong type")
        parsed[adapter] = PodAdapter(loaded, error)
    return parsed


def _kind(value: Any) -> str:
    """What a JSON value is, in a few words (never the value: it may be anything, of any size)."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


def observe(pods: list[dict[str, Any]], desired: list[str], fetch: Fetch) -> LoraObservation:
    """Ask the sidecar of every ready pod; count, per desired adapter, the pods that have it loaded."""
    ready = [p for p in pods if _ready(p)]
    seen = LoraObservation(pods=len(ready), adapters={name: AdapterState() for name in desired})
    for pod in ready:
        name = pod["metadata"]["name"]
        url = f"http://{pod['status']['podIP']}:{SIDECAR_PORT}/status"
        try:
            states = parse_report(fetch(url))
        except Exception as error:  # one pod's answer never fails the reconcile (Fetch says what comes)
            seen.silent.append(f"{name}: {str(error) or type(error).__name__}")
            continue
        for adapter, mine in states.items():
            if adapter not in seen.adapters and mine.loaded:
                seen.unloading[adapter] = seen.unloading.get(adapter, 0) + 1
        for adapter, state in seen.adapters.items():
            reported = states.get(adapter)
            if reported is not None and reported.loaded:
                state.loaded += 1
            elif reported is not None and reported.error:
                state.errors.append(f"{name}: {reported.error}")
    return seen
