"""One level-based reconcile for a QwenDeployment: the same code for create, update, resume and drift.

Order: review the spec (nothing is created for a spec that is invalid or does not fit), apply the
children that differ from the cluster, delete children the spec no longer wants, then read back what
runs and compute the status. Returns the status; the caller writes it only when it changed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .api.catalog import GPU_PRODUCT_LABEL, GPUS
from .api.review import Review, review
from .api.spec import SpecError
from .k8s import Cluster, kind_of
from .manifests import CRD_OF_KIND, ClusterFacts, build_children, names
from .metrics import MANAGED_OBJECTS, RECONCILE_SECONDS, RECONCILES
from .status import Observed, compute_status

log = logging.getLogger(__name__)


@dataclass
class Result:
    status: dict[str, Any]
    writes: list[str] = field(default_factory=list)  # "applied Deployment x", "deleted Service y"


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
        obs.plan_errors = [f"{p}: {m}" for p, m in rev.plan.errors]
        return Result(compute_status(obs, previous))
    facts = ClusterFacts(
        free_gpus=_free_gpus(cluster, rev),
        missing_crds=frozenset(c for c in CRD_OF_KIND.values() if not cluster.has_crd(c)),
    )
    children = build_children(rev, facts)
    obs.rollout = f"{children.rollout.mode}: {children.rollout.reason}"
    obs.skipped = children.skipped
    live = cluster.children(meta["namespace"], names.owner_labels(meta["name"]))
    writes = _apply(cluster, children.objects, live)
    writes += _prune(cluster, children.objects, live, meta["uid"])
    MANAGED_OBJECTS.labels(meta["namespace"], meta["name"]).set(len(children.objects))
    _observe(cluster, obs, rev)
    return Result(compute_status(obs, previous), writes)


def _describe(obs: Observed, rev: Review) -> None:
    qd = rev.resource
    obs.plan = rev.plan_dict()
    obs.gpu = rev.plan.gpu
    obs.tensor_parallel_size = rev.plan.tensor_parallel_size
    obs.max_model_len = rev.plan.max_model_len
    obs.gateway_enabled = qd.spec.gateway.enabled
    obs.autoscaling = qd.spec.autoscaling is not None
    obs.monitoring_requested = qd.spec.monitoring.service_monitor or qd.spec.monitoring.prometheus_rule
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
            current = cluster.get(
                f"{kind_of(obj).collection(obj['metadata']['namespace'])}/{obj['metadata']['name']}"
            )
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


def _free_gpus(cluster: Cluster, rev: Review) -> int | None:
    gpu = rev.resource.spec.gpu
    selector = gpu.node_selector
    products = set(GPUS[gpu.type].product_labels)

    def matches(node: dict[str, Any]) -> bool:
        labels = node["metadata"].get("labels", {})
        if selector is not None:
            return all(labels.get(k) == v for k, v in selector.items())
        return labels.get(GPU_PRODUCT_LABEL) in products

    return cluster.free_gpus(gpu.resource_name, matches)


def _observe(cluster: Cluster, obs: Observed, rev: Review) -> None:
    qd = rev.resource
    ns = qd.metadata.namespace
    obs.engine = cluster.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{names.engine(qd)}")
    if qd.spec.gateway.enabled:
        obs.gateway = cluster.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{names.gateway(qd)}")
    obs.pods = [
        p
        for p in cluster.pods(ns, names.selector(qd, "engine"))
        if not p["metadata"].get("deletionTimestamp")
    ]
    if qd.spec.autoscaling and qd.spec.autoscaling.driver == "hpa":
        obs.hpa = cluster.get(
            f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{names.engine(qd)}"
        )
