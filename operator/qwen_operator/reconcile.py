"""One level-based reconcile for a QwenDeployment: the same code for create, update, resume and drift.

Order: review the spec (nothing is created for a spec that is invalid or does not fit), apply the
children that differ from the cluster, delete children the spec no longer wants, read back what runs,
compute the status, and write it (with an Event per changed condition) only when it changed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from . import names
from .api.queueing import METRICS_API_SERVICE
from .api.review import Review, review
from .api.spec import SpecError
from .k8s import Cluster
from .manifests import ClusterFacts, build_children, node_pool, scaling
from .metrics import DEPLOYMENTS_READY, MANAGED_OBJECTS, RECONCILE_SECONDS, RECONCILES
from .status import Observed, compute_status, transitions

log = logging.getLogger(__name__)


@dataclass
class Result:
    status: dict[str, Any]
    writes: list[str] = field(default_factory=list)  # "applied Deployment x", "deleted Service y"


def reconcile_and_report(cluster: Cluster, body: dict[str, Any]) -> Result | None:
    """Reconcile one QwenDeployment body, then write its status and Events when they changed."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return None
    result = reconcile(cluster, body)
    old = body.get("status")
    if old != result.status:
        cluster.patch_status(meta["namespace"], meta["name"], result.status)
        for cond in transitions(old, result.status):
            _event(cluster, body, cond)
    ready = next(c for c in result.status["conditions"] if c["type"] == "Ready")["status"] == "True"
    DEPLOYMENTS_READY.labels(meta["namespace"], meta["name"]).set(1 if ready else 0)
    for write in result.writes:
        log.info("%s/%s: %s", meta["namespace"], meta["name"], write)
    return result


def _event(cluster: Cluster, body: dict[str, Any], cond: dict[str, Any]) -> None:
    if cond["status"] == "Unknown":
        return
    good = (cond["status"] == "True") != (cond["type"] == "Progressing")
    kind = "Normal" if good or cond["type"] == "Progressing" else "Warning"
    cluster.post_event(body, kind, cond["reason"], f"{cond['type']}={cond['status']}: {cond['message']}")


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
        return Result(compute_status(obs, previous))
    _describe(obs, rev)
    if not rev.ok:
        return Result(compute_status(obs, previous))
    facts = ClusterFacts(free_gpus=cluster.free_gpus(node_pool(rev)), missing_crds=cluster.missing_crds())
    children = build_children(rev, facts)
    obs.rollout = children.rollout
    obs.skipped = children.skipped
    live = cluster.children(meta["namespace"], names.owner_labels(meta["name"]))
    writes = _apply(cluster, children.objects, live)
    writes += _prune(cluster, children.objects, live, meta["uid"])
    MANAGED_OBJECTS.labels(meta["namespace"], meta["name"]).set(len(children.objects))
    _observe(cluster, obs, rev)
    return Result(compute_status(obs, previous), writes)


def _describe(obs: Observed, rev: Review) -> None:
    qd = rev.resource
    obs.review = rev
    obs.selector = ",".join(f"{k}={v}" for k, v in names.selector(qd, "engine").items())
    obs.endpoint = names.endpoint(qd, qd.spec.gateway.service.port)


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def _apply(
    cluster: Cluster, objects: list[dict[str, Any]], live: dict[tuple[str, str, str], Any]
) -> list[str]:
    writes = []
    for obj in objects:
        current = live.get(_key(obj))
        if current is None:  # not labelled as ours (or absent): read it, never adopt a stranger
            current = cluster.get_like(obj)
            if current is not None and not _owned_by(current, obj):
                raise RuntimeError(
                    f"{obj['kind']} {obj['metadata']['name']} exists and is not owned by this "
                    "QwenDeployment; rename or delete it"
                )
        if cluster.apply(obj, current):
            writes.append(f"applied {obj['kind']} {obj['metadata']['name']}")
    return writes


def _owned_by(live: dict[str, Any], desired: dict[str, Any]) -> bool:
    want = {r.get("uid") for r in desired["metadata"].get("ownerReferences", [])}
    return any(r.get("uid") in want for r in live["metadata"].get("ownerReferences", []))


def _prune(
    cluster: Cluster, objects: list[dict[str, Any]], live: dict[tuple[str, str, str], Any], uid: str
) -> list[str]:
    wanted = {_key(o) for o in objects}
    writes = []
    for key, obj in live.items():
        owners = {r.get("uid") for r in obj["metadata"].get("ownerReferences", [])}
        if key not in wanted and uid in owners and cluster.delete(obj):
            writes.append(f"deleted {key[1]} {key[2]}")
    return writes


def _observe(cluster: Cluster, obs: Observed, rev: Review) -> None:
    qd = rev.resource
    ns = qd.metadata.namespace
    obs.engine = cluster.get_named("apps/v1", "Deployment", ns, names.engine(qd))
    if qd.spec.gateway.enabled:
        obs.gateway = cluster.get_named("apps/v1", "Deployment", ns, names.gateway(qd))
    obs.pods = [
        p
        for p in cluster.pods(ns, names.selector(qd, "engine"))
        if not p["metadata"].get("deletionTimestamp")
    ]
    if qd.spec.autoscaling:
        _observe_scaling(cluster, obs, rev)


def _observe_scaling(cluster: Cluster, obs: Observed, rev: Review) -> None:
    """The HPA (KEDA's own with driver keda), the metrics API it reads through and, for the HPA driver,
    the metric itself as the custom metrics API serves it."""
    qd = rev.resource
    ns, driver = qd.metadata.namespace, qd.spec.autoscaling.driver  # type: ignore[union-attr]
    hpa_name = names.engine(qd) if driver == "hpa" else scaling.keda_hpa_name(rev)
    obs.hpa = cluster.get_named("autoscaling/v2", "HorizontalPodAutoscaler", ns, hpa_name)
    obs.metrics_api_read, obs.metrics_api = cluster.api_service(METRICS_API_SERVICE[driver])
    if driver == "hpa" and (obs.metrics_api is not None or not obs.metrics_api_read):
        obs.queue_metric_answered, obs.queue_metric = cluster.pods_custom_metric(
            ns, scaling.HPA_METRIC, names.selector(qd, "engine")
        )
