"""Operator upgrades never restart engines on their own.

The engine pod is rendered from the spec and from defaults in the operator's code (the engine image,
flags, the pod's security settings). A new operator version that renders another pod for a spec nobody
edited would roll every engine of the cluster at once, each of them minutes of reload on GPUs. So the
pod template that runs is held until the QwenDeployment's spec is next edited (any edit: a changed
default applies to new and to edited QwenDeployments), or at once under spec.engine.upgradePolicy
Immediate; meanwhile status.engineUpdate says what a rollout to the new form would change.

What the engine runs is read from the engine Deployment itself, nothing is written to the user's
object: ENGINE_GENERATION records the spec generation its pod template was rendered for, and
ENGINE_TEMPLATE the hash of the template as rendered then. A Deployment of a release before these
annotations (v0.1.0) was rendered for the generation its QwenDeployment's status.observedGeneration
names: the generation the old operator last reconciled.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ..names import LABEL_PREFIX
from ..objects import changed_paths, contains, content_hash

ENGINE_GENERATION = f"{LABEL_PREFIX}/engine-generation"
ENGINE_TEMPLATE = f"{LABEL_PREFIX}/engine-template"
#: ENGINE_TEMPLATE of a held template whose rendering an earlier release did not record.
UNRECORDED = "unrecorded"


#: Fields of the pod (and of its containers) whose operator defaults docs/security.md says are in force.
#: A held change of one of them, or of a variable fed from a Secret (the engine API key), is not only
#: in status.engineUpdate but also the condition SecurityUpdateHeld: the engines then run with less than
#: this version's guards until the spec is edited (or at once under upgradePolicy Immediate).
SECURITY_FIELDS = (
    "securityContext",
    "automountServiceAccountToken",
    "serviceAccountName",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "hostUsers",
)


@dataclass(frozen=True)
class Held:
    """The engine Deployment to apply, and what the held template differs in from the new rendering
    (empty: nothing held); `security`: those of the changes that are security settings."""

    deployment: dict[str, Any]
    changes: list[str] = field(default_factory=list)
    security: list[str] = field(default_factory=list)


def security_changes(held: dict[str, Any], rendered: dict[str, Any]) -> list[str]:
    """The security settings (SECURITY_FIELDS, and variables fed from Secrets) the rendered pod template
    has otherwise than the held one."""
    paths = [p for p in changed_paths(held, rendered) if any(f".{name}" in p for name in SECURITY_FIELDS)]
    held_containers = {c["name"]: c for c in held.get("spec", {}).get("containers", [])}
    for container in rendered.get("spec", {}).get("containers", []):
        before = _secret_env(held_containers.get(container["name"], {}))
        after = _secret_env(container)
        paths += [
            f".spec.containers[{container['name']}].env[{name}]"
            for name in sorted(set(before) | set(after))
            if before.get(name) != after.get(name)
        ]
    return paths


def _secret_env(container: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container.get("env") or []
        if (e.get("valueFrom") or {}).get("secretKeyRef")
    }


def hold_engine_template(
    desired: dict[str, Any],
    live: dict[str, Any] | None,
    generation: int | None,
    reconciled_generation: int | None,
    policy: str,
) -> Held:
    """`desired` (the engine Deployment as this operator renders it) with the live pod template kept when
    the spec did not change since that template was rendered; `reconciled_generation`: the
    QwenDeployment's status.observedGeneration (for Deployments of earlier releases)."""
    out = copy.deepcopy(desired)
    annotations = out["metadata"].setdefault("annotations", {})
    rendered = content_hash(desired["spec"]["template"])
    annotations[ENGINE_GENERATION] = str(generation)
    live_annotations = ((live or {}).get("metadata") or {}).get("annotations") or {}
    made_for = live_annotations.get(ENGINE_GENERATION, _str(reconciled_generation))
    if live is None or policy == "Immediate" or generation is None or made_for != str(generation):
        annotations[ENGINE_TEMPLATE] = rendered
        return Held(out)
    template = _template_as_applied(live["spec"]["template"])
    recorded = live_annotations.get(ENGINE_TEMPLATE)
    if recorded is None:  # an earlier release's Deployment: its rendering is what runs
        recorded = rendered if contains(template, desired["spec"]["template"]) else UNRECORDED
    annotations[ENGINE_TEMPLATE] = recorded
    if recorded == rendered:  # the same rendering: applied as such (a hand edit is reverted)
        return Held(out)
    out["spec"]["template"] = template
    return Held(
        out,
        changed_paths(template, desired["spec"]["template"]) or ["the pod template"],
        security_changes(template, desired["spec"]["template"]),
    )


def replaces_pods(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    """Whether applying `desired` (as hold_engine_template returned it) changes the pod template that
    runs: a held template is the live one; otherwise the recorded renderings are compared."""
    if desired["spec"]["template"] == _template_as_applied(live["spec"]["template"]):
        return False
    recorded = ((live.get("metadata") or {}).get("annotations") or {}).get(ENGINE_TEMPLATE)
    return bool(recorded != desired["metadata"].get("annotations", {}).get(ENGINE_TEMPLATE))


def _str(value: int | None) -> str | None:
    return None if value is None else str(value)


def _template_as_applied(template: dict[str, Any]) -> dict[str, Any]:
    """The live pod template as an apply body (the server's `creationTimestamp: null` left out)."""
    template = copy.deepcopy(template)
    (template.get("metadata") or {}).pop("creationTimestamp", None)
    return template


def describe(changes: list[str], generation: int | None) -> dict[str, Any]:
    """status.engineUpdate: what a rollout to this operator's rendering would change, and how to take it."""
    shown = changes[:8] + ([f"{len(changes) - 8} more"] if len(changes) > 8 else [])
    return {
        "available": True,
        "changes": shown,
        "message": (
            f"the engines run the pod rendered for generation {generation} by an earlier operator version; "
            f"this version renders it otherwise ({', '.join(shown)}). It rolls out at the next edit of the "
            "spec, or at once with spec.engine.upgradePolicy: Immediate"
        ),
    }
