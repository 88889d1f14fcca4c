"""One level-based reconcile for a QwenDeployment: the same code for create, update, resume and drift.

Order: review the spec (nothing is created for a spec that is invalid or does not fit), apply the
children that differ from the cluster, delete children the spec no longer wants, read back what runs,
compute the status, and write it (with an Event per changed condition) only when it changed.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import urllib.request
from dataclasses import dataclass, field
from secrets import token_urlsafe
from typing import Any

from . import adapters, names, versions
from .api.queueing import METRICS_API_SERVICE
from .api.review import Review, review
from .api.rollout import Rollout
from .api.spec import SpecError
from .k8s import ApiException, Cluster
from .manifests import ClusterFacts, build_children, node_pool, scaling, upgrade
from .manifests.engine import hands_replicas_over, replicas_floor
from .manifests.gateway import (
    ACTIVATOR,
    GENERATED_KEY_ID,
    generated_api_keys_secret,
    generated_engine_key_secret,
)
from .manifests.lora import OPERATOR_IMAGE_ENV
from .manifests.policy import OPERATOR_PEER_ENV, SCRAPERS_ENV, parse_operator_peer, parse_scrapers
from .metrics import DEPLOYMENTS_READY, MANAGED_OBJECTS, RECONCILE_SECONDS, RECONCILES
from .status import Observed, TierObservation, compute_status, events, merge_patch

log = logging.getLogger(__name__)


@dataclass
class Result:
    status: dict[str, Any]
    writes: list[str] = field(default_factory=list)  # "applied Deployment x", "deleted Service y"
    #: Try again later although nothing raised (a child name taken by a foreign object).
    retry: bool = False
    #: Look again after this many seconds (a pod is Pending; see WAITING_POLL_SECONDS).
    requeue_after: float | None = None


def reconcile_and_report(cluster: Cluster, body: dict[str, Any]) -> Result | None:
    """Reconcile one QwenDeployment body, then write its status and Events when they changed."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return None
    result = reconcile(cluster, body)
    _write_status(cluster, body, result.status)
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")["status"] == "True"
    DEPLOYMENTS_READY.labels(meta["namespace"], meta["name"]).set(1 if ready else 0)
    for write in result.writes:
        log.info("%s/%s: %s", meta["namespace"], meta["name"], write)
    return result


def report_failure(cluster: Cluster, body: dict[str, Any], failure: tuple[str, str]) -> None:
    """Best effort: the previous status with condition Synced=False carrying the failure (the API
    server may be what failed, so this may fail too; the retry follows either way)."""
    previous = body.get("status") or {}
    obs = Observed(generation=body["metadata"].get("generation"), failure=failure)
    synced = next(c for c in compute_status(obs, previous)["conditions"] if c["type"] == "Synced")
    conditions = [c for c in previous.get("conditions", []) if c.get("type") != "Synced"] + [synced]
    try:
        _write_status(cluster, body, {**previous, "conditions": conditions})
    except Exception as exc:  # the failure being reported may be the API server's
        why = (
            f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}"
        )
        log.warning("%s/%s: could not write the failure to the status: %s", *_key_of(body), why)


def _key_of(body: dict[str, Any]) -> tuple[str, str]:
    return body["metadata"]["namespace"], body["metadata"]["name"]


def _write_status(cluster: Cluster, body: dict[str, Any], status: dict[str, Any]) -> None:
    """Make the stored status exactly `status`: a merge patch of what differs, nulls for what no longer
    applies, nothing at all when nothing changed."""
    old = body.get("status")
    patch = merge_patch(old, status)
    if patch:
        cluster.patch_status(*_key_of(body), patch)
        for event in events(old, status):
            try:
                cluster.post_event(body, event.type, event.reason, event.message)
            except ApiException as exc:  # the status already says it; a terminating namespace refuses
                log.info("%s/%s: Event %s not posted: %s", *_key_of(body), event.reason, exc.reason)


@functools.cache
def engine_scrapers() -> tuple[dict[str, Any], ...]:
    """Who may reach the engines besides their gateway: the operator's setting (env, read once)."""
    return parse_scrapers(os.environ.get(SCRAPERS_ENV))


@functools.cache
def operator_image() -> str:
    """The operator's own image, which its sidecars run (env, read once; the chart sets it)."""
    return os.environ.get(OPERATOR_IMAGE_ENV) or versions.OPERATOR_IMAGE


@functools.cache
def operator_peer() -> dict[str, Any] | None:
    """The operator's own pods as a NetworkPolicy peer (env, read once): they read the lora sidecars."""
    return parse_operator_peer(os.environ.get(OPERATOR_PEER_ENV))


def reconcile(cluster: Cluster, body: dict[str, Any]) -> Result:
    started = time.monotonic()
    try:
        result = _reconcile(cluster, body)
    except Exception:
        RECONCILES.labels(result="error").inc()
        raise
    RECONCILES.labels(result="ok").inc()
    RECONCILE_SECONDS.observe(time.monotonic() - started)
    return result


def _reconcile(cluster: Cluster, body: dict[str, Any]) -> Result:
    meta = body["metadata"]
    obs = Observed(generation=meta.get("generation"))
    previous = body.get("status")
    try:
        rev = review(body)
    except SpecError as exc:
        obs.spec_errors = [f"{p}: {m}" for p, m in exc.problems]
        _observe_refused(cluster, obs, meta)
        return Result(compute_status(obs, previous))
    _describe(obs, rev)
    if not rev.ok:
        _observe_refused(cluster, obs, meta)
        return Result(compute_status(obs, previous))
    free_by_node = cluster.free_gpus_by_node(node_pool(rev))
    facts = ClusterFacts(
        free_gpus=None if free_by_node is None else sum(free_by_node.values()),
        missing_crds=cluster.missing_crds(),
        rollout_under_way=_rollout_under_way(cluster, rev, free_by_node),
        scrapers=engine_scrapers(),
        operator=operator_peer(),
        gateway_holds=_gateway_holds(cluster, rev),
        operator_image=operator_image(),
    )
    obs.gateway_holds = facts.gateway_holds
    children = build_children(rev, facts)
    obs.rollout = children.rollout
    obs.skipped = children.skipped
    live = cluster.children(meta["namespace"], names.owner_labels(meta["name"]))
    obs.foreign = _foreign(cluster, children.objects, live)
    if obs.foreign:  # nothing is written while a child's name is taken
        _observe(cluster, obs, rev)
        return Result(compute_status(obs, previous), retry=True)
    _hold_engine_template(obs, children.objects, live, body)
    writes = _announce_in_place(cluster, body, children.objects, live, children.rollout)
    writes += _generated_secrets(cluster, rev, live)
    # An autoscaler the spec no longer wants goes before its successor is applied: two never scale the
    # engines at once, and KEDA's admission webhook refuses a ScaledObject whose target an HPA scales.
    writes += _prune(cluster, children.objects, live, meta["uid"], kinds=AUTOSCALER_KINDS)
    for obj in children.objects:
        current = live.get(_key(obj))
        if hands_replicas_over(obj, current):
            assert current is not None
            if cluster.hand_over_replicas(current):
                writes.append(f"handed {obj['kind']} {obj['metadata']['name']} replicas to the autoscaler")
        floor = replicas_floor(rev, obj, current)
        if floor is not None:
            assert current is not None
            if cluster.hand_over_replicas(current, lift_to=floor):
                writes.append(f"lifted {obj['kind']} {obj['metadata']['name']} from 0 to {floor} replicas")
        if cluster.apply(obj, current):
            writes.append(f"applied {obj['kind']} {obj['metadata']['name']}")
    writes += _prune(cluster, children.objects, live, meta["uid"])
    MANAGED_OBJECTS.labels(meta["namespace"], meta["name"]).set(len(children.objects))
    _observe(cluster, obs, rev)
    pending = any(p.get("status", {}).get("phase") == "Pending" for p in obs.pods + obs.gateway_pods)
    status = compute_status(obs, previous)
    loading = any(
        c["type"] == "AdaptersLoaded" and c["reason"] in ("Loading", "LoadFailed", "Unloading")
        for c in status["conditions"]
    )
    # The tiers' deployments are not watched from here: their state is read again on this poll.
    tiers = bool(rev.resource.spec.gateway.tiers)
    requeue = (
        WAITING_POLL_SECONDS
        if pending
        else ADAPTER_POLL_SECONDS
        if loading
        else WAITING_POLL_SECONDS
        if tiers
        else None
    )
    return Result(status, writes, requeue_after=requeue)


def _hold_engine_template(
    obs: Observed,
    objects: list[dict[str, Any]],
    live: dict[tuple[str, str, str], Any],
    body: dict[str, Any],
) -> None:
    """Keep the engine pod that runs when only this operator's defaults changed (manifests/upgrade.py)."""
    meta, spec = body["metadata"], obs.review.resource.spec if obs.review else None
    assert spec is not None
    for i, obj in enumerate(objects):
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == names.engine_of(meta["name"]):
            reconciled = (body.get("status") or {}).get("observedGeneration")
            held = upgrade.hold_engine_template(
                obj, live.get(_key(obj)), meta.get("generation"), reconciled, spec.engine.upgrade_policy
            )
            objects[i] = held.deployment
            if held.changes:
                obs.engine_update = upgrade.describe(held.changes, meta.get("generation"))
                obs.held_security = held.security


def _announce_in_place(
    cluster: Cluster,
    body: dict[str, Any],
    objects: list[dict[str, Any]],
    live: dict[tuple[str, str, str], Any],
    rollout: Rollout,
) -> list[str]:
    """An InPlace rollout stops an engine before its replacement serves: status.rolloutStrategy says so
    before the engine Deployment is written, so `kubectl get qwd -o yaml` shows it before any engine
    goes (the rest of the status follows after the writes, as always)."""
    meta = body["metadata"]
    if rollout.mode != "InPlace":
        return []
    engine = next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == names.engine_of(meta["name"])
    )
    current = live.get(_key(engine))
    if current is None or not upgrade.replaces_pods(engine, current):
        return []  # nothing runs yet, or the pod does not change: no engine is replaced
    text = rollout.describe()
    if (body.get("status") or {}).get("rolloutStrategy") == text:
        return []
    cluster.patch_status(meta["namespace"], meta["name"], {"rolloutStrategy": text})
    return [f"announced the rollout: {text}"]


def _rollout_under_way(cluster: Cluster, rev: Review, free_by_node: dict[str, int] | None) -> Rollout | None:
    ns, name = rev.resource.metadata.namespace, rev.resource.metadata.name
    engine = cluster.get_named("apps/v1", "Deployment", ns, names.engine_of(name))
    if engine is None:
        return None
    pods = cluster.pods(ns, name, names.selector_of(name, "engine"))
    return Rollout.kept(engine, unschedulable=surge_stuck(pods, free_by_node, rev))


def surge_stuck(pods: list[dict[str, Any]], free_by_node: dict[str, int] | None, rev: Review) -> bool:
    """An engine pod cannot be scheduled for want of what someone else took, so a Surge rollout would
    wait forever. Not so while another engine pod of the deployment terminates: each surge step after
    the first scales an old pod down and a new one up at once, and the new one waits for the old one's
    GPUs (for the engine's whole shutdown timeout). Nor when a node of the pool has a replica's GPUs
    free again and GPUs were all the pod lacked: the scheduler places it on its next try (GPUs free
    only spread over nodes place nothing)."""
    running = _running(pods)
    waiting = [p for p in running if _unschedulable(p)]
    if not waiting or len(running) < len(pods):
        return False
    if free_by_node is None or max(free_by_node.values(), default=0) < rev.plan.gpus_per_replica:
        return True
    lacking = f"Insufficient {node_pool(rev).resource}"
    return not all(lacking in _scheduling_message(p) for p in waiting)


def _gateway_holds(cluster: Cluster, rev: Review) -> bool:
    """False while a gateway pod of a deployment that scales to zero runs without the activator (the
    rollout after the edit to minReplicas 0): such a pod answers 503 at once at zero. A rollout whose pods
    all hold (a key rotation at zero), or no pod at all, wakes no engine."""
    if rev.holding is None:
        return True
    ns, name = rev.resource.metadata.namespace, rev.resource.metadata.name
    pods = _running(cluster.pods(ns, name, names.selector_of(name, "gateway")))
    return all(ACTIVATOR in {c["name"] for c in p["spec"]["containers"]} for p in pods)


def _pod_scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's PodScheduled condition ({} before the scheduler has looked at it)."""
    conditions = pod.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


def _unschedulable(pod: dict[str, Any]) -> bool:
    condition = _pod_scheduled(pod)
    return condition.get("status") == "False" and condition.get("reason") == "Unschedulable"


def _scheduling_message(pod: dict[str, Any]) -> str:
    """The scheduler's message on why the pod is not scheduled ("0/7 nodes are available: 1 Insufficient
    nvidia.com/gpu, ...")."""
    return str(_pod_scheduled(pod).get("message", ""))


#: How often a deployment with a Pending pod is looked at again (not a failure: no backoff): why a pod
#: waits (unschedulable, a missing Secret or volume) shows in pod status and events, which trigger no
#: reconcile.
WAITING_POLL_SECONDS = 15.0

#: How often a deployment whose adapters are still loading (or failing) is looked at again: the sidecars
#: load them on their own; this only brings status.lora and AdaptersLoaded up to date.
ADAPTER_POLL_SECONDS = 5.0


def _generated_secrets(
    cluster: Cluster, rev: Review, live: dict[tuple[str, str, str], dict[str, Any]]
) -> list[str]:
    """Create the gateway's API-key Secret and the engine-key Secret, each with a random key, when the
    spec names none (create-only).

    The operator may not read Secrets, so whether one exists is learned from the children: once the
    gateway Deployment mounts it, it was created before that Deployment was written (here, earlier),
    and it is created again only while a pod of the deployment waits to start (a deleted Secret keeps
    pods waiting; AlreadyExists otherwise). So a restarted operator's first resync writes nothing. What
    this process created or found is not asked again unless a pod waits: a Secret deleted since then is
    created again as soon as a pod waits for it, not after the operator's next restart.
    """
    qd = rev.resource
    gateway = live.get(("apps/v1", "Deployment", names.gateway(qd)))
    mounted = {
        v["secret"]["secretName"]
        for v in (gateway or {}).get("spec", {}).get("template", {}).get("spec", {}).get("volumes", [])
        if "secret" in v
    }
    if mounted:
        name, ns = qd.metadata.name, qd.metadata.namespace
        pods = [
            *cluster.pods(ns, name, names.selector_of(name, "engine")),
            *cluster.pods(ns, name, names.selector_of(name, "gateway")),
        ]
        if _waiting_to_start(_running(pods)):
            mounted = set()
            uid = str(qd.metadata.uid)
            known_secrets = cluster.created_secrets
            for known in [k for k in known_secrets if k[0] == ns and k[2] == uid]:
                known_secrets.discard(known)
    said = []
    for secret, what in (
        (generated_api_keys_secret(rev, token_urlsafe(32)), f"a random API key, id {GENERATED_KEY_ID}"),
        (
            generated_engine_key_secret(rev, token_urlsafe(32)),
            "the engines' random key, mounted by the gateway only",
        ),
    ):
        if secret is None or secret["metadata"]["name"] in mounted:
            continue
        meta = secret["metadata"]
        known = (meta["namespace"], meta["name"], str(rev.resource.metadata.uid))
        if known in cluster.created_secrets:
            continue
        created = cluster.create_if_absent(secret)
        cluster.created_secrets.add(known)
        if created:
            said.append(f"created Secret {meta['name']} ({what})")
    return said


def _describe(obs: Observed, rev: Review) -> None:
    qd = rev.resource
    obs.review = rev
    obs.selector = ",".join(f"{k}={v}" for k, v in names.selector(qd, "engine").items())
    obs.endpoint = names.endpoint(qd, qd.spec.gateway.service.port)


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def _foreign(
    cluster: Cluster, objects: list[dict[str, Any]], live: dict[tuple[str, str, str], Any]
) -> list[str]:
    """Children whose name is taken by an object this deployment does not own, checked for every child
    before any is written, so that a taken name leaves nothing half-made. A child missing from `live`
    (not labelled as ours) is read by name; one owned by this deployment but relabelled is kept in
    `live`, to be applied over."""
    taken = []
    for obj in objects:
        if _key(obj) in live:
            continue
        current = cluster.get_like(obj)
        if current is None:
            continue
        if _owned_by(current, obj):
            live[_key(obj)] = current
            continue
        meta = current["metadata"]
        owners = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in meta.get("ownerReferences", []))
        taken.append(
            f"{obj['kind']} {meta['namespace']}/{meta['name']} exists and is not owned by this "
            f"QwenDeployment ({'owned by ' + owners if owners else 'no owner'}): delete it, or rename "
            "the QwenDeployment"
        )
    return taken


def _owned_by(live: dict[str, Any], desired: dict[str, Any]) -> bool:
    want = {r.get("uid") for r in desired["metadata"].get("ownerReferences", [])}
    return any(r.get("uid") in want for r in live["metadata"].get("ownerReferences", []))


#: The kinds that scale the engine Deployment (pruned ahead of the other children's apply).
AUTOSCALER_KINDS = frozenset({"HorizontalPodAutoscaler", "ScaledObject"})


def _prune(
    cluster: Cluster,
    objects: list[dict[str, Any]],
    live: dict[tuple[str, str, str], Any],
    uid: str,
    kinds: frozenset[str] | None = None,
) -> list[str]:
    """Delete the children of this QwenDeployment (of `kinds`, else every kind) it no longer wants."""
    wanted = {_key(o) for o in objects}
    writes = []
    for key, obj in live.items():
        owners = {r.get("uid") for r in obj["metadata"].get("ownerReferences", [])}
        if kinds is not None and obj.get("kind") not in kinds:
            continue
        if key not in wanted and uid in owners and cluster.delete(obj):
            writes.append(f"deleted {key[1]} {key[2]}")
    return writes


def _observe(cluster: Cluster, obs: Observed, rev: Review) -> None:
    qd = rev.resource
    ns = qd.metadata.namespace
    _observe_deployments(cluster, obs, ns, qd.metadata.name, qd.spec.gateway.enabled)
    if _waiting_to_start(obs.pods + obs.gateway_pods):
        ours = {p["metadata"]["name"] for p in obs.pods + obs.gateway_pods}
        obs.mount_events = [
            e for e in cluster.pod_events(ns, "FailedMount") if e["involvedObject"].get("name") in ours
        ]
    if qd.spec.autoscaling:
        _observe_scaling(cluster, obs, rev)
    if qd.spec.lora is not None:
        obs.lora = adapters.observe(obs.pods, [a.name for a in qd.spec.lora.adapters], _sidecar_status)
    if qd.spec.gateway.tiers:
        obs.tiers = [
            TierObservation(
                t.name,
                t.deployment_ref.name,
                cluster.get_qwendeployment(ns, t.deployment_ref.name),
                t.spill_to,
            )
            for t in qd.spec.gateway.tiers
        ]


#: Seconds one lora-sync sidecar may take to answer before its pod counts as not reporting.
SIDECAR_TIMEOUT_SECONDS = 2.0
#: The most of a sidecar's /status answer that is read: a report of a few hundred adapters is tens of
#: kilobytes; a pod that answers more (any pod can carry the engine labels) is not reporting.
SIDECAR_ANSWER_BYTES = 1 << 20


def _sidecar_status(url: str) -> Any:
    """GET a lora-sync sidecar's /status (a pod IP, plain HTTP inside the cluster); its JSON as sent,
    which adapters.parse_report checks."""
    with urllib.request.urlopen(url, timeout=SIDECAR_TIMEOUT_SECONDS) as response:
        body = response.read(SIDECAR_ANSWER_BYTES + 1)
    if len(body) > SIDECAR_ANSWER_BYTES:
        raise ValueError(f"an answer over {SIDECAR_ANSWER_BYTES} bytes")
    return json.loads(body)


def _observe_refused(cluster: Cluster, obs: Observed, meta: dict[str, Any]) -> None:
    """What the previous spec runs, after a refused update (nothing is written for a refused spec)."""
    _observe_deployments(cluster, obs, meta["namespace"], meta["name"], gateway=True)


def _observe_deployments(cluster: Cluster, obs: Observed, ns: str, name: str, gateway: bool) -> None:
    obs.engine = cluster.get_named("apps/v1", "Deployment", ns, names.engine_of(name))
    obs.pods = _running(cluster.pods(ns, name, names.selector_of(name, "engine")))
    if gateway:
        obs.gateway = cluster.get_named("apps/v1", "Deployment", ns, names.gateway_of(name))
        obs.gateway_pods = _running(cluster.pods(ns, name, names.selector_of(name, "gateway")))


def _running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _waiting_to_start(pods: list[dict[str, Any]]) -> bool:
    """A pod scheduled whose containers are not all started yet (volumes may be failing to mount)."""
    return any(
        p.get("spec", {}).get("nodeName")
        and not all(
            c.get("state", {}).get("running") for c in p.get("status", {}).get("containerStatuses") or [{}]
        )
        for p in pods
    )


def _observe_scaling(cluster: Cluster, obs: Observed, rev: Review) -> None:
    """The HPA (KEDA's own with driver keda), the metrics API it reads through and, for the HPA driver,
    the metric itself as the custom metrics API serves it."""
    qd = rev.resource
    ns, driver = qd.metadata.namespace, qd.spec.autoscaling.driver  # type: ignore[union-attr]
    hpa_name = names.engine(qd) if driver == "hpa" else scaling.keda_hpa_name(rev)
    obs.hpa = cluster.get_named(
        "autoscaling/v2", "HorizontalPodAutoscaler", ns, hpa_name, ours=driver == "hpa"
    )
    obs.metrics_api_read, obs.metrics_api = cluster.api_service(METRICS_API_SERVICE[driver])
    if (
        driver == "hpa"
        and (obs.metrics_api is not None or not obs.metrics_api_read)
        and not _reads_metric(obs.hpa)
    ):
        obs.queue_metric_answered, obs.queue_metric = cluster.pods_custom_metric(
            ns, scaling.HPA_METRIC, names.selector(qd, "engine")
        )


def _reads_metric(hpa: dict[str, Any] | None) -> bool:
    """The HPA says it reads its metric (ScalingActive, a current value): no need to ask the metrics API
    (which would be a request per reconcile in steady state)."""
    status = (hpa or {}).get("status", {})
    active = any(
        c.get("type") == "ScalingActive" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    return active and bool(status.get("currentMetrics"))
