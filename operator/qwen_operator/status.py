"""The status of a QwenDeployment, computed by one pure function from what the reconciler observed.

Conditions (all always present, so `kubectl wait --for=condition=X` works):
  ConfigValid     the spec parses and breaks no rule of the model, vLLM or the operator (extraArgs included)
  CapacityFit     the valid spec fits its GPU pool (memory for one maxModelLen sequence, GPUs per node)
  Scheduled       every engine pod has a node; False carries the scheduler's reason
  Progressing     a rollout is under way (False once complete or when stuck)
  ScalingReady    the HPA reads the queue-depth metric (or replicas are fixed); False names the break:
                  metrics API missing or unavailable, metric absent, the HPA failing to read it
  MonitoringReady the requested monitoring objects exist (False: CRDNotInstalled)
  ExposureReady   the client Service and the requested Ingress/HTTPRoute exist (False: CRDNotInstalled)
  ReferencesResolved  no pod reports a missing Secret or PersistentVolumeClaim the spec names (read from
                  the pods' waiting reasons, the scheduler's message and FailedMount events: the
                  operator never reads Secrets)
  Synced          the last reconcile wrote what the spec asks; False carries the error (API conflict,
                  throttling, server error, timeout, a child name taken by a foreign object) and the retry
  Ready           at least one engine replica and the gateway serve (after a refused update: what still
                  serves, with reason ServingPreviousSpec)
  AdaptersLoaded  only with spec.lora: every adapter is loaded on every ready engine pod and no removed one
                  still is (False: Loading, LoadFailed with the engine's error, Unloading), from the engine
                  pods' lora-sync sidecars
  ScaledToZero    only with autoscaling.minReplicas 0: True (Idle) while no engine runs; False from the
                  wake (Waking: replicas asked for, none ready; its lastTransitionTime is when the wake
                  began) through Serving. Ready is then False with reason ScaledToZero, not NoReadyReplicas
  TiersReady      only with spec.gateway.tiers: every tier's QwenDeployment exists, serves the tier's model
                  name and has a ready engine replica (False names each tier that does not: reasons
                  DeploymentNotFound, ModelNameMismatch, NoReadyReplicas, TierScalesToZero); status.tiers
                  has each tier's state
  SecurityUpdateHeld  only while the engines run a pod an earlier operator version rendered whose security
                  settings this version renders otherwise (manifests/upgrade.py SECURITY_FIELDS, Secret-fed
                  variables): True, reason HeldUntilEdit, naming them; status.engineUpdate has every change

Each optional child kind is reported by the condition `qwen_operator.kinds` assigns it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import names
from .adapters import LoraObservation
from .api import quantity
from .api.coldstart import KEDA_HELD_METRIC, Holding
from .api.queueing import HPA_METRIC, METRICS_API_SERVICE, keda_query
from .api.review import Review
from .api.rollout import Rollout
from .api.spec import QwenDeployment
from .kinds import EXPOSURE, MONITORING, SCALING, Skipped

CONDITION_TYPES = (
    "Ready",
    "ConfigValid",
    "CapacityFit",
    "Scheduled",
    "Progressing",
    "ScalingReady",
    "MonitoringReady",
    "ExposureReady",
    "ReferencesResolved",
    "Synced",
)
#: Conditions a status has only when the spec asks for what they report (AdaptersLoaded: spec.lora;
#: ScaledToZero: autoscaling.minReplicas 0; TiersReady: spec.gateway.tiers; SecurityUpdateHeld: a held
#: engine pod without this version's security settings).
OPTIONAL_CONDITION_TYPES = ("AdaptersLoaded", "ScaledToZero", "TiersReady", "SecurityUpdateHeld")

#: The most characters of any text in the status (a condition's reason or message, an adapter's error, a
#: tier's message) and of an Event's message: texts from outside the operator (the sidecars' and the
#: engines' errors, the pods' and the autoscaler's messages, the API server's errors, other
#: QwenDeployments' names) can be of any size, and the whole object must stay small (etcd refuses
#: objects over 1.5 MiB; a failed status write is retried forever).
TEXT_LIMIT = 1024


def bounded(text: str, limit: int = TEXT_LIMIT) -> str:
    """`text` cut to `limit` characters, the cut marked with an ellipsis: every text from outside the
    operator goes through this on its way into the status."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


@dataclass(frozen=True)
class TierObservation:
    """What the reconciler saw of one tier's QwenDeployment (spec.gateway.tiers[i])."""

    name: str  # the tier's model name
    deployment: str
    #: The QwenDeployment as read; None: not found in the namespace.
    body: dict[str, Any] | None
    #: The tier's spillTo: where its requests go while it cannot take them (None: a JSON 503).
    spill_to: str | None = None

    @property
    def fallback(self) -> str:
        """What a client's request for the tier gets while the tier cannot serve it."""
        return f"its requests go to {self.spill_to}" if self.spill_to else "its requests get a JSON 503"

    @property
    def served_name(self) -> str | None:
        """The model name its engines serve (its spec.model.servedModelName, else spec.model.name)."""
        model = (self.body or {}).get("spec", {}).get("model", {})
        return model.get("servedModelName") or model.get("name")

    @property
    def ready_replicas(self) -> int:
        return int((self.body or {}).get("status", {}).get("readyReplicas", 0) or 0)

    def state(self) -> tuple[bool, str, str]:
        """(ready, reason, message) of the tier."""
        if self.body is None:
            return (
                False,
                "DeploymentNotFound",
                f"QwenDeployment {self.deployment} not found in this namespace",
            )
        if self.served_name != self.name:
            return (
                False,
                "ModelNameMismatch",
                f"{self.deployment} serves {self.served_name!r}, not {self.name!r}: set its "
                "spec.model.servedModelName or the tier's name",
            )
        if ((self.body or {}).get("spec", {}).get("autoscaling") or {}).get("minReplicas") == 0:
            # KEDA keeps it up on its own gateway's admitted traffic and wakes it on its own gateway's
            # held requests; requests through this gateway are neither (they carry this deployment's
            # label, and are not held): it would go to zero mid-traffic and stay there.
            return (
                False,
                "TierScalesToZero",
                f"{self.deployment} scales to zero (autoscaling.minReplicas 0), and its requests through "
                "this gateway neither wake it nor keep it up: give it minReplicas 1 or more",
            )
        if self.ready_replicas < 1:
            return False, "NoReadyReplicas", f"{self.deployment} has no ready engine replica"
        return True, "Ready", f"{self.deployment}: {self.ready_replicas} ready engine replica(s)"


@dataclass
class Observed:
    """What the reconciler saw; every field optional so invalid specs can still report."""

    generation: int | None = None
    spec_errors: list[str] = field(default_factory=list)  # parse errors (ConfigValid)
    #: The parsed resource with its capacity plan; None when the spec does not parse.
    review: Review | None = None
    endpoint: str | None = None
    selector: str | None = None
    rollout: Rollout | None = None
    engine: dict[str, Any] | None = None  # the engine Deployment as read back
    gateway: dict[str, Any] | None = None  # the gateway Deployment as read back
    pods: list[dict[str, Any]] = field(default_factory=list)  # engine pods
    hpa: dict[str, Any] | None = None  # the HPA (KEDA's own with driver keda)
    #: The APIService the autoscaler's metric comes through, as read; None: absent, or not readable
    #: (metrics_api_read False: no permission to read APIServices, nothing is concluded).
    metrics_api: dict[str, Any] | None = None
    metrics_api_read: bool = False
    #: The HPA's metric for the engine pods from the custom metrics API (a MetricValueList); None:
    #: unknown to the API, or no answer (queue_metric_answered False: nothing is concluded).
    queue_metric: dict[str, Any] | None = None
    queue_metric_answered: bool = False
    skipped: list[Skipped] = field(default_factory=list)  # optional children without their CRD
    gateway_pods: list[dict[str, Any]] = field(default_factory=list)
    #: FailedMount events about pods of this deployment (read only while a pod waits to start).
    mount_events: list[dict[str, Any]] = field(default_factory=list)
    #: Children whose names are taken by objects this deployment does not own: nothing was written.
    foreign: list[str] = field(default_factory=list)
    #: (reason, message) of the last failed reconcile; None after a good one.
    failure: tuple[str, str] | None = None
    #: status.engineUpdate while the engines run a pod an earlier operator version rendered (upgrade.py).
    engine_update: dict[str, Any] | None = None
    #: The security settings among its changes (upgrade.security_changes): condition SecurityUpdateHeld.
    held_security: list[str] = field(default_factory=list)
    #: Where each LoRA adapter is loaded, from the engine pods' lora-sync sidecars (adapters.py).
    lora: LoraObservation | None = None
    #: The QwenDeployments of spec.gateway.tiers, in order; None: not observed (no tiers).
    tiers: list[TierObservation] | None = None
    #: False while a gateway pod cannot hold requests yet (minReplicas 0 rolling out): one engine stays.
    gateway_holds: bool = True

    @property
    def plan_errors(self) -> list[str]:
        """Why the plan does not fit (CapacityFit); empty when it fits or there is no plan."""
        if self.review is None or self.review.ok:
            return []
        return [f"{path}: {message}" for path, message in self.review.plan.errors]

    @property
    def gateway_enabled(self) -> bool:
        return self.review is None or self.review.resource.spec.gateway.enabled

    @property
    def autoscaling(self) -> bool:
        return self.review is not None and self.review.resource.spec.autoscaling is not None

    @property
    def monitoring_requested(self) -> bool:
        m = self.review.resource.spec.monitoring if self.review else None
        return m is not None and (m.service_monitor or m.prometheus_rule)

    def skipped_for(self, condition: str) -> list[Skipped]:
        return [s for s in self.skipped if s.condition == condition]


def _cond(ctype: str, ok: bool | None, reason: str, message: str = "") -> dict[str, Any]:
    """A condition; its reason and message may carry texts from outside (bounded)."""
    status = "Unknown" if ok is None else ("True" if ok else "False")
    return {"type": ctype, "status": status, "reason": bounded(reason), "message": bounded(message)}


def _pending_reason(pods: list[dict[str, Any]]) -> tuple[bool | None, str, str]:
    if not pods:
        return None, "NoPods", "no engine pods yet"
    for pod in pods:
        for c in pod.get("status", {}).get("conditions", []):
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                name = pod["metadata"]["name"]
                return (
                    False,
                    c.get("reason") or "Unschedulable",
                    f"pod {name}: {c.get('message', '')}".strip(),
                )
    return True, "AllPodsScheduled", f"{len(pods)} engine pod(s) placed on nodes"


def _deployment_condition(dep: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in dep.get("status", {}).get("conditions", []) if c.get("type") == ctype), {})


def _progressing(engine: dict[str, Any] | None, desired: int) -> dict[str, Any]:
    if engine is None:
        return _cond("Progressing", True, "Creating", "engine Deployment being created")
    st = engine.get("status", {})
    progress = _deployment_condition(engine, "Progressing")
    if progress.get("reason") == "ProgressDeadlineExceeded":
        return _cond("Progressing", False, "ProgressDeadlineExceeded", progress.get("message", ""))
    gen_seen = st.get("observedGeneration", 0) >= engine.get("metadata", {}).get("generation", 0)
    updated, ready = st.get("updatedReplicas", 0), st.get("readyReplicas", 0)
    total = st.get("replicas", 0)
    if gen_seen and updated >= desired and ready >= desired and total == updated:
        return _cond("Progressing", False, "RolloutComplete", f"{ready}/{desired} replicas updated and ready")
    return _cond("Progressing", True, "RollingOut", f"{updated} updated, {ready} ready of {desired} replicas")


def _scaling(obs: Observed) -> dict[str, Any]:
    if not obs.autoscaling:
        return _cond("ScalingReady", True, "FixedReplicas", "replicas set in spec")
    driver = obs.review.resource.spec.autoscaling.driver  # type: ignore[union-attr]
    if obs.skipped_for(SCALING):
        return _cond("ScalingReady", False, "CRDNotInstalled", "KEDA is not installed")
    broken = _metrics_api_problem(obs, driver)
    if broken:
        return broken
    if obs.hpa is None:
        return _cond("ScalingReady", None, "NoAutoscalerStatus", "autoscaler not observed yet")
    if driver == "hpa" and obs.queue_metric_answered and not (obs.queue_metric or {}).get("items"):
        if not (obs.engine or {}).get("status", {}).get("readyReplicas"):
            return _cond(
                "ScalingReady", None, "MetricPending", f"no engine pod is ready to report {HPA_METRIC} yet"
            )
        return _cond(
            "ScalingReady",
            False,
            "MetricAbsent",
            f"the custom metrics API serves no {HPA_METRIC} for the engine pods: check the adapter's rule "
            "and that Prometheus scrapes the engines (docs/autoscaling.md)",
        )
    for c in obs.hpa.get("status", {}).get("conditions", []):
        if c.get("type") in ("ScalingActive", "AbleToScale") and c.get("status") == "False":
            return _cond(
                "ScalingReady",
                False,
                c.get("reason", "ScalingInactive"),
                f"the queue-depth metric cannot drive scaling: {c.get('message', '')}",
            )
    if not obs.hpa.get("status", {}).get("conditions"):
        return _cond("ScalingReady", None, "NoAutoscalerStatus", "the HPA has not evaluated its metric yet")
    current = _current_queue_depth(obs.hpa)
    reading = "" if current is None else f": {current:g} waiting per pod"
    return _cond("ScalingReady", True, "MetricAvailable", f"the HPA reads the queue-depth metric{reading}")


def _metrics_api_problem(obs: Observed, driver: str) -> dict[str, Any] | None:
    """False when the aggregated API the metric comes through is missing or not Available."""
    if not obs.metrics_api_read:
        return None
    name = METRICS_API_SERVICE[driver]
    if obs.metrics_api is None:
        needed = (
            f"install prometheus-adapter with the rule serving {HPA_METRIC} (docs/autoscaling.md)"
            if driver == "hpa"
            else "install KEDA (its metrics server serves the trigger to the HPA)"
        )
        return _cond(
            "ScalingReady", False, "MetricsAPIMissing", f"APIService {name} does not exist: {needed}"
        )
    conditions = obs.metrics_api.get("status", {}).get("conditions", [])
    available: dict[str, Any] = next((c for c in conditions if c.get("type") == "Available"), {})
    if available.get("status") != "True":
        why = available.get("message") or available.get("reason") or "no Available condition yet"
        return _cond(
            "ScalingReady", False, "MetricsAPIUnavailable", f"APIService {name} is not available: {why}"
        )
    return None


def _current_queue_depth(hpa: dict[str, Any] | None) -> float | None:
    """The average queue depth per pod the HPA last read (status.currentMetrics), Pods or External."""
    for m in (hpa or {}).get("status", {}).get("currentMetrics") or []:
        source = m.get("pods") or m.get("external") or {}
        value = source.get("current", {}).get("averageValue")
        if value is not None:
            return _quantity(str(value))
    return None


def _quantity(text: str) -> float:
    """A Kubernetes quantity ("1500m", "2", "3k") as a number, rounded to 3 decimals."""
    return round(float(quantity.value(text)), 3)


def _autoscaling_status(obs: Observed) -> dict[str, Any] | None:
    """What the autoscaler aims for and what it last read, for status.autoscaling."""
    if not obs.autoscaling or obs.review is None or not obs.review.ok:
        return None
    qd = obs.review.resource
    a = qd.spec.autoscaling
    assert a is not None
    q = obs.review.queueing
    return {
        "driver": a.driver,
        "metric": HPA_METRIC if a.driver == "hpa" else keda_query(qd.metadata.namespace, qd.metadata.name),
        "targetQueueDepth": q.target_queue_depth,
        "targetQueueDepthSource": q.target_queue_depth_source,
        "concurrencyPerReplica": q.concurrency_per_replica,
        "currentQueueDepth": _current_queue_depth(obs.hpa),
    }


def _monitoring(obs: Observed) -> dict[str, Any]:
    missing = obs.skipped_for(MONITORING)
    if missing:
        return _cond("MonitoringReady", False, "CRDNotInstalled", _skipped_message(missing))
    if not obs.monitoring_requested:
        return _cond("MonitoringReady", True, "Disabled", "no monitoring objects requested")
    return _cond("MonitoringReady", True, "Configured", "monitoring objects applied")


def _exposure(obs: Observed) -> dict[str, Any]:
    if obs.review is None or obs.plan_errors:
        return _cond("ExposureReady", None, "Blocked", "nothing is exposed until the spec is fixed")
    missing = obs.skipped_for(EXPOSURE)
    if missing:
        return _cond("ExposureReady", False, "CRDNotInstalled", _skipped_message(missing))
    g = obs.review.resource.spec.gateway
    routes = [kind for kind, wanted in (("Ingress", g.ingress), ("HTTPRoute", g.http_route)) if wanted]
    open_to_all = (
        "; no authentication: spec.gateway.auth is none"
        if g.enabled and g.auth == "none"
        else "; no authentication: spec.gateway.enabled is false, clients reach the engines"
        if not g.enabled
        else ""
    )
    if g.enabled and routes:
        message = f"{' and '.join(routes)} applied for {obs.endpoint}{open_to_all}"
        return _cond("ExposureReady", True, "Configured", message)
    message = f"clients reach the Service at {obs.endpoint}{open_to_all}"
    return _cond("ExposureReady", True, "ServiceOnly", message)


_MISSING_SECRET = re.compile(r'secret "([^"]+)" not found')
_MISSING_KEY = re.compile(r"couldn't find key (\S+) in Secret [^/\s]+/([^\s,;]+)")
_MISSING_CLAIM = re.compile(r'persistentvolumeclaim "([^"]+)" not found')


def references(qd: QwenDeployment) -> dict[tuple[str, str], str]:
    """The Secrets and PersistentVolumeClaims the pods need, (kind, name) -> the spec field naming it."""
    spec = qd.spec
    refs: dict[tuple[str, str], str] = {}
    keys = names.api_keys_secret(qd) if spec.gateway.enabled else None
    if keys:
        refs[("Secret", keys)] = (
            "spec.gateway.apiKeysSecret"
            if spec.gateway.api_keys_secret
            else "generated by the operator for spec.gateway.auth apiKeys"
        )
    engine_key = names.engine_key(qd)
    for ref, path in (
        (
            engine_key,
            "spec.engine.apiKeySecret"
            if spec.engine.api_key_secret
            else "generated by the operator for the engines' key",
        ),
        (spec.model.hf_token_secret, "spec.model.hfTokenSecret"),
    ):
        if ref:
            refs.setdefault(("Secret", ref.name), path)
    if spec.model.cache.claim_name:
        refs[("PersistentVolumeClaim", spec.model.cache.claim_name)] = "spec.model.cache.claimName"
    return refs


def _evidence(obs: Observed) -> list[str]:
    """What the pods say about missing references: waiting reasons, scheduler messages, mount failures."""
    texts = []
    for pod in [*obs.pods, *obs.gateway_pods]:
        st = pod.get("status", {})
        for c in st.get("conditions", []):
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                texts.append(c.get("message", ""))
        for cs in [*st.get("initContainerStatuses", []), *st.get("containerStatuses", [])]:
            waiting = cs.get("state", {}).get("waiting") or {}
            if waiting.get("reason") == "CreateContainerConfigError":
                texts.append(waiting.get("message", ""))
    texts += [e.get("message", "") for e in obs.mount_events]
    return texts


def _missing_references(obs: Observed) -> list[str]:
    if obs.review is None:
        return []
    qd = obs.review.resource
    ns = qd.metadata.namespace
    refs = references(qd)
    missing: dict[str, str] = {}
    for text in _evidence(obs):
        for name in _MISSING_SECRET.findall(text):
            path = refs.get(("Secret", name), "a Secret the pod names")
            missing[name] = f"Secret {ns}/{name} ({path}) does not exist: create it"
        for key, name in _MISSING_KEY.findall(text):
            path = refs.get(("Secret", name), "a Secret the pod names")
            missing[f"{name}/{key}"] = f"Secret {ns}/{name} ({path}) has no key {key}: add it or set .key"
        for name in _MISSING_CLAIM.findall(text):
            path = refs.get(("PersistentVolumeClaim", name), "a claim the pod names")
            missing[f"pvc/{name}"] = f"PersistentVolumeClaim {ns}/{name} ({path}) does not exist: create it"
    return sorted(missing.values())


def _references_condition(obs: Observed, missing: list[str]) -> dict[str, Any]:
    if obs.review is None:
        return _cond("ReferencesResolved", None, "InvalidSpec", "no references checked for an invalid spec")
    if missing:
        return _cond("ReferencesResolved", False, "MissingReference", "; ".join(missing))
    refs = references(obs.review.resource)
    if not refs:
        return _cond("ReferencesResolved", True, "NoReferences", "the spec names no Secret or claim")
    listed = ", ".join(f"{kind} {name}" for kind, name in sorted(refs))
    return _cond("ReferencesResolved", True, "NoneMissing", f"no pod reports a missing reference ({listed})")


def _synced(obs: Observed) -> dict[str, Any]:
    if obs.foreign:
        return _cond(
            "Synced",
            False,
            "ForeignObject",
            "nothing was written: " + "; ".join(obs.foreign) + " (retried with backoff)",
        )
    if obs.failure:
        return _cond("Synced", False, *obs.failure)
    if obs.review is None or not obs.review.ok:
        return _cond("Synced", True, "NothingApplied", "the spec is refused: nothing was written for it")
    return _cond("Synced", True, "ReconcileSucceeded", "the children match the spec")


def _gateway_status(obs: Observed) -> dict[str, Any] | None:
    if obs.review is None or not obs.gateway_enabled:
        return None
    qd = obs.review.resource
    keys = names.api_keys_secret(qd)
    return {
        "auth": qd.spec.gateway.auth,
        "apiKeysSecret": keys,
        "apiKeysSecretGenerated": keys is not None and not qd.spec.gateway.api_keys_secret,
    }


def _lora_status(seen: LoraObservation | None) -> dict[str, Any] | None:
    """Per desired adapter: on how many of the ready engine pods it is loaded, and why not elsewhere."""
    if seen is None:
        return None
    return {
        "adapters": [
            {
                "name": name,
                "loaded": f"{state.loaded}/{seen.pods}",
                "error": bounded("; ".join(state.errors)) or None,
            }
            for name, state in seen.adapters.items()
        ]
    }


def _adapters_loaded(seen: LoraObservation | None) -> dict[str, Any]:
    """AdaptersLoaded: every desired adapter loaded on every ready engine pod, or why not."""
    if seen is None or seen.pods == 0:
        return _cond("AdaptersLoaded", None, "NoReadyEngine", "no engine pod is ready to load adapters")
    failed = [f"{n} ({'; '.join(s.errors)})" for n, s in seen.adapters.items() if s.errors]
    if failed:
        # Pods are ready despite it (lorasync.py /ready): they serve the base model and the other adapters.
        serving = "the pods serve the base model and the other adapters, and a 404 for it while retried"
        return _cond(
            "AdaptersLoaded", False, "LoadFailed", f"failed to load ({serving}): " + ", ".join(failed)
        )
    missing = [f"{n} {s.loaded}/{seen.pods}" for n, s in seen.adapters.items() if s.loaded < seen.pods]
    if seen.silent:
        missing.append("no usable answer from the lora-sync sidecar of " + "; ".join(seen.silent))
    if missing:
        return _cond("AdaptersLoaded", False, "Loading", "loading: " + ", ".join(missing))
    if seen.unloading:
        removed = ", ".join(f"{n} on {count}/{seen.pods}" for n, count in sorted(seen.unloading.items()))
        return _cond("AdaptersLoaded", False, "Unloading", f"removed from the spec, still loaded: {removed}")
    return _cond(
        "AdaptersLoaded", True, "Loaded", f"{len(seen.adapters)} adapters on {seen.pods} engine pods"
    )


def _tiers_status(tiers: list[TierObservation] | None) -> list[dict[str, Any]] | None:
    if not tiers:
        return None
    entries = []
    for tier in tiers:
        ready, reason, message = tier.state()
        entries.append(
            {
                "name": tier.name,
                "deployment": tier.deployment,
                "ready": ready,
                "readyReplicas": tier.ready_replicas,
                "reason": reason,
                "message": bounded(message),
            }
        )
    return entries


def _tiers_ready(tiers: list[TierObservation] | None) -> dict[str, Any]:
    """TiersReady: every tier serves, or which do not and why (the first such tier's reason)."""
    if tiers is None:
        return _cond("TiersReady", None, "NotObserved", "the tiers' deployments were not read")
    problems = [(tier, *tier.state()[1:]) for tier in tiers if not tier.state()[0]]
    if not problems:
        return _cond("TiersReady", True, "Ready", f"{len(tiers)} tier(s) serve")
    message = "; ".join(f"tier {tier.name}: {message} ({tier.fallback})" for tier, _, message in problems)
    return _cond("TiersReady", False, problems[0][1], message)


def _skipped_message(skipped: list[Skipped]) -> str:
    return "skipped: " + "; ".join(s.describe() for s in skipped)


def _ready(obs: Observed, conds: dict[str, dict[str, Any]], ready_replicas: int) -> dict[str, Any]:
    gateway_ready = (obs.gateway or {}).get("status", {}).get("readyReplicas", 0) >= 1
    if obs.spec_errors or obs.plan_errors:
        refused = "ConfigValid" if conds["ConfigValid"]["status"] == "False" else "CapacityFit"
        if ready_replicas >= 1 and (gateway_ready or obs.gateway is None):
            # A refused update changes nothing: what the previous spec created still serves.
            return _cond(
                "Ready",
                True,
                "ServingPreviousSpec",
                f"generation {obs.generation} is refused ({refused}: {conds[refused]['message']}); "
                f"{ready_replicas} engine replica(s) of the previous spec still serve",
            )
        reason = "InvalidSpec" if refused == "ConfigValid" else "DoesNotFit"
        return _cond("Ready", False, reason, conds[refused]["message"])
    if conds["ReferencesResolved"]["status"] == "False" and (ready_replicas < 1 or not gateway_ready):
        return _cond("Ready", False, "MissingReference", conds["ReferencesResolved"]["message"])
    if obs.foreign and ready_replicas < 1:
        return _cond("Ready", False, "ForeignObject", conds["Synced"]["message"])
    if ready_replicas < 1:
        if conds.get("ScaledToZero", {}).get("status") == "True":
            return _cond("Ready", False, "ScaledToZero", conds["ScaledToZero"]["message"])
        if conds["Scheduled"]["status"] == "False":
            return _cond("Ready", False, "Unschedulable", conds["Scheduled"]["message"])
        return _cond("Ready", False, "NoReadyReplicas", "no engine replica is ready yet")
    if obs.gateway_enabled and not gateway_ready:
        return _cond("Ready", False, "GatewayNotReady", "engines ready, no gateway pod ready yet")
    return _cond("Ready", True, "Serving", f"{ready_replicas} engine replica(s) ready at {obs.endpoint}")


def _held_requests(hpa: dict[str, Any] | None) -> int:
    """The requests the gateway held when KEDA's HPA last read its held-requests trigger (0: none, or
    not read since the wake: at zero replicas the HPA reads nothing)."""
    status = (hpa or {}).get("status", {})
    for m in status.get("currentMetrics") or []:
        external = m.get("external") or {}
        value = external.get("current", {}).get("averageValue")
        if external.get("metric", {}).get("name") == KEDA_HELD_METRIC and value is not None:
            # an AverageValue target: the HPA divides the query's sum by its current replicas
            return round(_quantity(str(value)) * max(1, status.get("currentReplicas") or 0))
    return 0


def _scaled_to_zero(
    h: Holding, desired: int, ready: int, pods: bool, held: int = 0, gateway_holds: bool = True
) -> dict[str, Any]:
    """autoscaling.minReplicas 0: True while no engine runs; False from the wake (its lastTransitionTime
    says since when) through serving. `held`: the gateway's held requests as KEDA's HPA last read them.
    `gateway_holds` False: a gateway pod without the activator still runs, so one engine stays."""
    wait = f"the first answer takes about {h.expected_cold_start_seconds} s"
    if desired == 0 and not pods:
        return _cond(
            "ScaledToZero",
            True,
            "Idle",
            f"no engine runs after {h.idle_seconds} s without completions; a request wakes one and waits in "
            f"the gateway (at most {h.hold_seconds} s): {wait}",
        )
    if ready == 0:
        waiting = f"{held} request(s) wait" if held else "requests wait"
        return _cond(
            "ScaledToZero",
            False,
            "Waking",
            f"{desired} engine replica(s) asked for, none ready yet; {wait}, {waiting} in the gateway "
            f"(at most {h.hold_seconds} s)",
        )
    after = f"back to zero after {h.idle_seconds} s without completions"
    if not gateway_holds:
        after = f"one stays until every gateway pod can hold requests (rolling out), then {after}"
    return _cond("ScaledToZero", False, "Serving", f"{ready} engine replica(s) ready; {after}")


def compute_status(
    obs: Observed, previous: dict[str, Any] | None, now: datetime | None = None
) -> dict[str, Any]:
    """The full status object; lastTransitionTime carried over from `previous` when a status holds."""
    engine_status = (obs.engine or {}).get("status", {})
    desired = (obs.engine or {}).get("spec", {}).get("replicas", 0) if obs.engine else 0
    ready = engine_status.get("readyReplicas", 0)
    conds: dict[str, dict[str, Any]] = {}
    # A spec that breaks a rule (it does not parse, or the review refuses it whatever the GPUs) is a
    # config problem; a valid spec too large for its GPU pool is a capacity one: the fixes differ.
    invalid = obs.spec_errors or (obs.review.config_problems if obs.review else [])
    too_large = obs.review.capacity_problems if obs.review else []
    conds["ConfigValid"] = (
        _cond("ConfigValid", False, "InvalidSpec", "; ".join(invalid))
        if invalid
        else _cond("ConfigValid", True, "Valid", "spec is valid")
    )
    if too_large:
        conds["CapacityFit"] = _cond("CapacityFit", False, "DoesNotFit", "; ".join(too_large))
    elif invalid:
        conds["CapacityFit"] = _cond("CapacityFit", None, "InvalidSpec", "no plan for an invalid spec")
    elif obs.review is not None:
        p = obs.review.plan
        conds["CapacityFit"] = _cond(
            "CapacityFit",
            True,
            "Fits",
            f"{p.kv_tokens_per_replica} KV tokens per replica, "
            f"{p.max_concurrent_at_max_model_len} x {p.max_model_len}-token requests",
        )
    else:
        conds["CapacityFit"] = _cond("CapacityFit", None, "NoPlan", "no plan observed")
    ok, reason, message = _pending_reason(obs.pods)
    conds["Scheduled"] = _cond("Scheduled", ok, reason, message)
    conds["Progressing"] = (
        _progressing(obs.engine, desired)
        if not (obs.spec_errors or obs.plan_errors)
        else _cond("Progressing", False, "Blocked", "nothing is rolled out until the spec is fixed")
    )
    conds["ScalingReady"] = _scaling(obs)
    conds["MonitoringReady"] = _monitoring(obs)
    conds["ExposureReady"] = _exposure(obs)
    conds["ReferencesResolved"] = _references_condition(obs, _missing_references(obs))
    conds["Synced"] = _synced(obs)
    holding = obs.review.holding if obs.review is not None and not invalid else None
    if holding is not None:
        held = _held_requests(obs.hpa)
        conds["ScaledToZero"] = _scaled_to_zero(
            holding, desired, ready, bool(obs.pods), held, obs.gateway_holds
        )
    conds["Ready"] = _ready(obs, conds, ready)
    types = list(CONDITION_TYPES)
    if obs.review is not None and obs.review.resource.spec.lora is not None:
        conds["AdaptersLoaded"] = _adapters_loaded(obs.lora)
        types.append("AdaptersLoaded")
    if "ScaledToZero" in conds:
        types.append("ScaledToZero")
    if obs.review is not None and obs.review.resource.spec.gateway.tiers:
        conds["TiersReady"] = _tiers_ready(obs.tiers)
        types.append("TiersReady")
    if obs.held_security:
        shown = ", ".join(obs.held_security[:6]) + (", ..." if len(obs.held_security) > 6 else "")
        conds["SecurityUpdateHeld"] = _cond(
            "SecurityUpdateHeld",
            True,
            "HeldUntilEdit",
            f"the engines run without this operator version's security settings ({shown}): they roll "
            "out at the next edit of the spec, or at once with spec.engine.upgradePolicy: Immediate",
        )
        types.append("SecurityUpdateHeld")
    status: dict[str, Any] = {
        "observedGeneration": obs.generation,
        "phase": _phase(conds),
        "replicas": engine_status.get("replicas", 0),
        "readyReplicas": ready,
        "desiredReplicas": desired,
        "replicasSummary": f"{ready}/{desired}",
        "conditions": _stamp([conds[t] for t in types], previous, obs.generation, now),
    }
    plan = obs.review.plan if obs.review else None
    optional = {
        "selector": obs.selector,
        "gpu": plan.gpu if plan else None,
        "tensorParallelSize": plan.tensor_parallel_size if plan else None,
        "maxModelLen": plan.max_model_len if plan else None,
        "endpoint": obs.endpoint,
        "rolloutStrategy": obs.rollout.describe() if obs.rollout else None,
        "plan": obs.review.plan_dict() if obs.review else None,
        "autoscaling": _autoscaling_status(obs),
        "gateway": _gateway_status(obs),
        "engineUpdate": obs.engine_update,
        "lora": _lora_status(obs.lora),
        "tiers": _tiers_status(obs.tiers),
    }
    status.update({k: v for k, v in optional.items() if v is not None})
    return _without_nulls(status)


def _without_nulls(value: Any) -> Any:
    """Drop None values: a merge patch deletes them, so a stored status never contains them."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def merge_patch(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: changed and added keys, None (null)
    for every key `new` no longer has, lists whole. Empty when nothing changed: no write at all. A key
    that stops applying (plan.yarnFactor after maxModelLen drops below 40960) is removed, not kept."""
    old = old or {}
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            if nested := merge_patch(before, value):
                patch[key] = nested
        elif value != before or key not in old:
            patch[key] = value
    return patch


def _phase(conds: dict[str, dict[str, Any]]) -> str:
    if conds["ConfigValid"]["status"] == "False" or conds["CapacityFit"]["status"] == "False":
        return "Invalid"
    if conds["Ready"]["status"] == "True":
        return "Progressing" if conds["Progressing"]["status"] == "True" else "Ready"
    if (
        conds["Scheduled"]["status"] == "False"
        or conds["Progressing"]["reason"] == "ProgressDeadlineExceeded"
    ):
        return "Degraded"
    return "Progressing"


def _stamp(
    conds: list[dict[str, Any]], previous: dict[str, Any] | None, generation: int | None, now: datetime | None
) -> list[dict[str, Any]]:
    before = {c["type"]: c for c in (previous or {}).get("conditions", [])}
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for c in conds:
        old = before.get(c["type"])
        held = old is not None and old.get("status") == c["status"]
        out.append(
            {
                **c,
                "observedGeneration": generation,
                "lastTransitionTime": old.get("lastTransitionTime", stamp) if held and old else stamp,
            }
        )
    return out


def transitions(previous: dict[str, Any] | None, current: dict[str, Any]) -> list[dict[str, Any]]:
    """Conditions whose status changed (or that are new)."""
    before = {c["type"]: c.get("status") for c in (previous or {}).get("conditions", [])}
    return [c for c in current["conditions"] if before.get(c["type"]) != c["status"]]


#: Ready=False reasons that only say pods are starting (a Warning when no rollout is in progress).
WAITING_REASONS = frozenset({"NoReadyReplicas", "GatewayNotReady"})


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the QwenDeployment: `kubectl describe qwd` and `kubectl get events`."""

    type: str  # Normal or Warning
    reason: str
    message: str


def events(previous: dict[str, Any] | None, current: dict[str, Any]) -> list[Event]:
    """The Events a status change is worth: every change of a condition that had a status, and a
    condition that appears in a bad state (a Warning; not being Ready while a rollout starts the pods
    is Normal). A condition's first good value (the conditions of a new QwenDeployment that is fine)
    is in the status only: a burst of new QwenDeployments would otherwise post about ten Events each
    before anything happened. Unknown is never posted."""
    had = {c["type"] for c in (previous or {}).get("conditions", []) if c.get("status") != "Unknown"}
    rolling = any(c["type"] == "Progressing" and c["status"] == "True" for c in current["conditions"])
    out = []
    for cond in transitions(previous, current):
        if cond["status"] == "Unknown":
            continue
        good = (cond["status"] == "True") != (cond["type"] == "Progressing")
        # not ready because engines or gateways are still starting, during a rollout: no Warning
        waiting = rolling and cond["type"] == "Ready" and cond["reason"] in WAITING_REASONS
        kind = "Normal" if good or waiting or cond["type"] == "Progressing" else "Warning"
        if kind == "Normal" and cond["type"] not in had:
            continue
        message = bounded(f"{cond['type']}={cond['status']}: {cond['message']}")
        out.append(Event(kind, cond["reason"], message))
    return out
