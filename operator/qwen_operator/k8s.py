"""The only code that talks to the Kubernetes API (with watchcache.py, its informers): every path the
operator reads or writes is built here.

Children are written with server-side apply under one field manager, and only when they differ from
what the cluster already has: a resync that changes nothing issues no write at all. With `Caches`
(what `qwen-operator run` uses), reads come from watch-fed memory: in steady state a reconcile sends
the API server nothing but its writes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
import urllib3
from kubernetes.client import ApiClient, Configuration, CoordinationV1Api, V1Lease
from kubernetes.client.rest import ApiException

from .api.pool import NodePool
from .api.queueing import METRICS_API_SERVICE
from .api.spec import API_VERSION, KIND, PLURAL
from .kinds import MANAGED, NODE, POD, SECRET, Kind, kind_of
from .metrics import API_WRITES
from .names import FIELD_MANAGER, HANDOVER_FIELD_MANAGER, LABEL_PREFIX, MANAGED_BY, MANAGED_SELECTOR
from .objects import contains, content_hash
from .watchcache import Informer, Obj, Store, wait_synced

log = logging.getLogger(__name__)

HASH_ANNOTATION = f"{LABEL_PREFIX}/applied-hash"
REQUEST_TIMEOUT = 30
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
APISERVICE_API = "/apis/apiregistration.k8s.io/v1/apiservices"
CUSTOM_METRICS_API = "/apis/custom.metrics.k8s.io/v1beta1"
API_SERVICES = tuple(sorted(set(METRICS_API_SERVICE.values())))


def collection(kind: Kind, namespace: str | None = None) -> str:
    """Path of a kind's collection, in one namespace or (None) across all of them."""
    base = "/api/v1" if kind.api_version == "v1" else f"/apis/{kind.api_version}"
    return f"{base}/namespaces/{namespace}/{kind.plural}" if namespace else f"{base}/{kind.plural}"


def _qwd_collection(namespace: str | None = None) -> str:
    base = f"/apis/{API_VERSION}"
    return f"{base}/namespaces/{namespace}/{PLURAL}" if namespace else f"{base}/{PLURAL}"


def _object_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{collection(kind_of(obj['apiVersion'], obj['kind']), meta['namespace'])}/{meta['name']}"


def _owner(obj: Obj) -> list[tuple[str, str]]:
    """Index value of a child or pod: (namespace, the QwenDeployment its label names)."""
    owner = (obj["metadata"].get("labels") or {}).get(f"{LABEL_PREFIX}/deployment")
    return [(obj["metadata"].get("namespace", ""), owner)] if owner else []


def _without_managed_fields(obj: Obj) -> Obj:
    """The object less metadata.managedFields: for a server-side-applied child about as large as the
    rest of it, and never read (whether a child changed is its content hash and `contains`); what
    client-go's TransformStripManagedFields does for controllers."""
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _slim_node(node: Obj) -> Obj:
    """What free_gpus_by_node and NodePool.admits read of a node."""
    meta, spec = node["metadata"], node.get("spec") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "labels", "resourceVersion") if k in meta},
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": {"allocatable": (node.get("status") or {}).get("allocatable", {})},
    }


def _slim_pod(pod: Obj) -> Obj:
    """What free_gpus_by_node reads of a pod on a node: its node and its containers' resource requests."""
    meta = pod["metadata"]
    containers = [
        {"resources": {"requests": (c.get("resources") or {}).get("requests", {})}}
        for c in (pod.get("spec") or {}).get("containers", [])
    ]
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName"), "containers": containers},
    }


class Caches:
    """The informers a running operator reads from: its children and their pods in the watched
    namespaces (by label), every node and every scheduled, unfinished pod cluster-wide (slimmed: the
    free-GPU count), CRDs (metadata only), the metrics APIServices by name, and QwenDeployments (fed by
    kopf's watch of them, see handlers.py). Memory: about the size of the objects themselves, children
    and own pods in full but for their managedFields, about 0.5 KiB per node and 0.3 KiB per pod
    elsewhere (docs/architecture.md).

    `on_change(namespace, owner)` hears of every change to a child or a pod of a QwenDeployment.
    """

    def __init__(self, namespaces: list[str], on_change: Callable[[str, str], Any] | None = None) -> None:
        config = kubernetes.client.Configuration.get_default_copy()
        config.connection_pool_maxsize = 64  # a connection per watch, and the reconciles' requests
        self.api = ApiClient(config)
        self.namespaces: list[str | None] = list(namespaces) or [None]
        self.on_change = on_change
        self.qwd = Store(transform=_without_managed_fields)
        self.children: dict[tuple[str, str | None], Informer] = {}  # (plural, namespace)
        self.own_pods: dict[str | None, Informer] = {}
        for ns in self.namespaces:
            for kind in MANAGED:
                self.children[(kind.plural, ns)] = self._informer(collection(kind, ns), MANAGED_SELECTOR)
            self.own_pods[ns] = self._informer(collection(POD, ns), MANAGED_SELECTOR)
        self.nodes = Informer(self.api, collection(NODE), Store(transform=_slim_node), name="nodes")
        self.gpu_pods = Informer(
            self.api,
            collection(POD),
            Store(transform=_slim_pod, indexes={"node": lambda p: [p["spec"]["nodeName"]]}),
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
            name="pods on nodes",
        )
        self.crds = Informer(
            self.api, CRD_API, Store(), metadata_only=True, on_event=self._crd_event, name="CRDs"
        )
        self.api_services = {
            name: Informer(
                self.api, APISERVICE_API, Store(), field_selector=f"metadata.name={name}", name=name
            )
            for name in API_SERVICES
        }

    def _informer(self, path: str, selector: str) -> Informer:
        return Informer(
            self.api,
            path,
            Store(transform=_without_managed_fields, indexes={"owner": _owner}),
            label_selector=selector,
            on_event=self._child_event,
        )

    def all(self) -> list[Informer]:
        return [
            *self.children.values(),
            *self.own_pods.values(),
            self.nodes,
            self.gpu_pods,
            self.crds,
            *self.api_services.values(),
        ]

    def start(self, timeout: float = 300.0) -> None:
        """Start every informer and wait for their first LISTs (progress in the log meanwhile)."""
        started = time.monotonic()
        for informer in self.all():
            informer.start()
        if not wait_synced(self.all(), timeout, log.info):
            raise TimeoutError(f"the caches were not filled within {timeout:.0f} s")
        sizes = {
            "children": sum(len(i.store) for i in self.children.values()),
            "nodes": len(self.nodes.store),
            "pods on nodes": len(self.gpu_pods.store),
        }
        log.info("caches filled in %.1f s: %s", time.monotonic() - started, sizes)

    def stop(self) -> None:
        for informer in self.all():
            informer.stop()

    def _child_event(self, _type: str, obj: Obj) -> None:
        """Only for an owner kopf's watch has brought: the children of a deleted QwenDeployment (the
        garbage collector is removing them) and objects that merely carry the labels would otherwise
        cost a GET per event. A QwenDeployment the watch brings later is reconciled on that event."""
        for ns, owner in _owner(obj):
            if self.on_change is not None and self.qwd.get(ns, owner) is not None:
                self.on_change(ns, owner)

    def _crd_event(self, type_: str, crd: Obj) -> None:
        """An optional kind's CRD installed after the start: begin caching that kind. Any news of the CRD
        but its deletion will do: a watch's ADDED, a re-LIST's MODIFIED (the CRD came while the watch was
        away: a re-LIST reports only MODIFIED and DELETED), or the MODIFIED of its status turning
        Established (an informer started on the ADDED may have found the kind not served yet: absent)."""
        if type_ == "DELETED":
            return
        for kind in MANAGED:
            if kind.crd != crd["metadata"]["name"]:
                continue
            for ns in self.namespaces:
                old = self.children[(kind.plural, ns)]
                if old.absent:
                    self.children[(kind.plural, ns)] = self._informer(old.path, MANAGED_SELECTOR).start()

    def child_store(self, kind: Kind, namespace: str) -> Informer:
        return self.children[(kind.plural, namespace if namespace in self.namespaces else None)]


def load_config() -> None:
    """In-cluster credentials when running in a pod, else the local kubeconfig."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


class Cluster:
    """Typed access to the API server for the reconciler."""

    def __init__(self, api: ApiClient | None = None, caches: Caches | None = None):
        """Without `caches` every read is a request (the CLI's and the tests' direct use)."""
        self.api = api or (caches.api if caches else kubernetes.client.ApiClient())
        self.caches = caches
        self._crd_cache: dict[str, tuple[float, bool]] = {}
        #: Generated Secrets known to exist, by (namespace, name, owner uid): created (or found) once per
        #: process (reconcile._generated_secrets), forgotten when a pod waits for one.
        self.created_secrets: set[tuple[str, str, str]] = set()

    # --- raw calls -------------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        if method != "GET":
            API_WRITES.labels(method=method).inc()
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, _, _ = self.api.param_serialize(
            method, path, query_params=query or [], header_params=headers, auth_settings=["BearerToken"]
        )
        resp = self.api.call_api(
            method, url, header_params=headers, body=body, _request_timeout=REQUEST_TIMEOUT
        )
        data = resp.read()
        if resp.status >= 400:
            error = ApiException(status=resp.status, reason=resp.reason, body=data.decode(errors="replace"))
            error.headers = resp.getheaders()  # Retry-After of a 429
            raise error
        return json.loads(data) if data else None

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _list(
        self, path: str, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = [
            (k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        ]
        return list(self._call("GET", path, query=query).get("items", []))

    # --- QwenDeployments -------------------------------------------------------------------------
    def get_qwendeployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The newest version seen by kopf's watch (a GET when the watch has not brought it yet)."""
        if self.caches is not None and (cached := self.caches.qwd.get(namespace, name)) is not None:
            return cached
        return self._get(f"{_qwd_collection(namespace)}/{name}")

    def seen_qwendeployment(self, body: dict[str, Any], deleted: bool = False) -> None:
        """A QwenDeployment as a watch event brought it (kopf's, see handlers.py)."""
        if self.caches is not None:
            if deleted:
                self.caches.qwd.remove((body["metadata"]["namespace"], body["metadata"]["name"]))
            else:
                self.caches.qwd.put(body)

    def list_qwendeployments(self, namespaces: list[str]) -> list[dict[str, Any]]:
        """Every QwenDeployment in `namespaces`, or in the whole cluster when the list is empty.

        Always one LIST per namespace (the resync's, the safety net for a watch that stalls without
        closing): with the cache, what it brings goes into the cache unless the cache has a newer
        version, objects it lacks that are older than the LIST leave the cache, and the cache's newest
        versions are returned."""
        if self.caches is None:
            paths = [_qwd_collection(ns) for ns in namespaces] or [_qwd_collection()]
            return [item for path in paths for item in self._list(path)]
        found: list[dict[str, Any]] = []
        scopes: list[str | None] = list(namespaces) or [None]
        for namespace in scopes:
            page = self._call("GET", _qwd_collection(namespace))
            found += self._refresh_qwds(page, namespace)
        return found

    def _refresh_qwds(self, page: dict[str, Any], namespace: str | None) -> list[dict[str, Any]]:
        """Bring a LIST of QwenDeployments into the cache; returns their newest versions."""
        assert self.caches is not None
        listed = int(page.get("metadata", {}).get("resourceVersion") or 0)
        here = set()
        for item in page.get("items", []):
            self.caches.qwd.put(item)
            here.add((item["metadata"]["namespace"], item["metadata"]["name"]))
        for cached in self.caches.qwd.items():
            meta = cached["metadata"]
            key = (meta["namespace"], meta["name"])
            older = int(meta.get("resourceVersion") or 0) < listed
            if key not in here and namespace in (None, meta["namespace"]) and older:
                self.caches.qwd.remove(key)  # deleted, and the watch missed it
        return [obj for key in sorted(here) if (obj := self.caches.qwd.get(*key))]

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch the status subresource (`patch` as status.merge_patch makes it: nulls remove)."""
        path = f"{_qwd_collection(namespace)}/{name}/status"
        answer = self._call(
            "PATCH", path, body={"status": patch}, content_type="application/merge-patch+json"
        )
        self.seen_qwendeployment(answer)

    def post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about the QwenDeployment `body` (what `kubectl describe qwd` shows)."""
        meta = body["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": MANAGED_BY},
            "reportingComponent": MANAGED_BY,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=event)

    # --- children --------------------------------------------------------------------------------
    def has_crd(self, name: str, ttl: float = 60.0) -> bool:
        if self.caches is not None and not self.caches.crds.forbidden:
            return self.caches.crds.store.get("", name) is not None
        cached = self._crd_cache.get(name)
        if cached and time.monotonic() - cached[0] < ttl:
            return cached[1]
        found = self._get(f"{CRD_API}/{name}") is not None
        self._crd_cache[name] = (time.monotonic(), found)
        return found

    def missing_crds(self) -> frozenset[str]:
        """CRDs of optional kinds that this cluster does not have."""
        return frozenset(k.crd for k in MANAGED if k.crd and not self.has_crd(k.crd))

    def children(self, namespace: str, labels: dict[str, str]) -> dict[tuple[str, str, str], dict[str, Any]]:
        """Objects of managed kinds carrying `labels`, keyed by (apiVersion, kind, name)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        found = {}
        for kind in MANAGED:
            if kind.crd and not self.has_crd(kind.crd):
                continue
            if self.caches is not None:
                owner = labels.get(f"{LABEL_PREFIX}/deployment")
                for item in self.caches.child_store(kind, namespace).store.by("owner", (namespace, owner)):
                    if _has_labels(item, labels):
                        found[(kind.api_version, kind.kind, item["metadata"]["name"])] = item
                continue
            for item in self._list(collection(kind, namespace), label_selector=selector):
                item |= {"apiVersion": kind.api_version, "kind": kind.kind}  # list items omit them
                found[(kind.api_version, kind.kind, item["metadata"]["name"])] = item
        return found

    def get_like(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The live object with the kind, namespace and name of `obj`, whoever owns it."""
        return self._get(_object_path(obj))

    def apply(self, obj: dict[str, Any], live: dict[str, Any] | None) -> bool:
        """Server-side apply `obj` unless `live` already matches it; returns whether it wrote."""
        digest = content_hash(obj)
        if (
            live is not None
            and live["metadata"].get("annotations", {}).get(HASH_ANNOTATION) == digest
            and contains(live, obj)
        ):
            return False
        body = json.loads(json.dumps(obj))
        body["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = digest
        try:
            answer = self._server_side_apply(body)
        except ApiException as exc:
            if not (exc.status == 422 and obj["kind"] == "Service" and live is not None):
                raise
            # A port edited by hand is a new entry of the list keyed by (port, protocol), owned by the
            # editor: apply cannot take it over, and adding ours back beside it duplicates the port name.
            # Replace the list (a merge patch replaces lists whole), then apply again.
            log.info("Service %s: ports edited by hand, replacing them", obj["metadata"]["name"])
            ports = {"spec": {"ports": obj["spec"]["ports"]}}
            self._call("PATCH", _object_path(obj), body=ports, content_type="application/merge-patch+json")
            answer = self._server_side_apply(body)
        if self.caches is not None and answer:
            self.caches.child_store(
                kind_of(obj["apiVersion"], obj["kind"]), obj["metadata"]["namespace"]
            ).store.put(answer)
        meta = obj["metadata"]
        log.info("applied %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
        return True

    def hand_over_replicas(self, live: dict[str, Any], lift_to: int | None = None) -> bool:
        """Step one of the documented hand-off of a Deployment's spec.replicas to an autoscaler: a
        second field manager applies the field at its live value (the operator's apply then leaves it
        out, and the field stays, owned by the second manager until the HPA writes it). Without force:
        a conflict means another manager (the HPA) owns it already, at another value, which is the goal.

        `lift_to`: the field at that value instead, forced (manifests.engine.replicas_floor: an HPA whose
        target is at 0 never writes it, so no manager can be overruled that would move it). Returns
        whether it wrote."""
        meta = live["metadata"]
        replicas = live["spec"]["replicas"] if lift_to is None else lift_to
        body = {
            "apiVersion": live.get("apiVersion", "apps/v1"),
            "kind": live.get("kind", "Deployment"),
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "spec": {"replicas": replicas},
        }
        query = [("fieldManager", HANDOVER_FIELD_MANAGER)]
        if lift_to is not None:
            query.append(("force", "true"))
        try:
            self._call(
                "PATCH",
                _object_path(body),
                body=body,
                content_type="application/apply-patch+yaml",
                query=query,
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            log.info("Deployment %s/%s: replicas already owned by another manager", *_ns_name(meta))
            return False
        log.info("Deployment %s/%s: replicas %s handed over", *_ns_name(meta), replicas)
        return True

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        """Create the Secret `obj` unless one of that name exists (never read, never overwritten);
        returns whether it created it: what needs only the `create` right."""
        meta = obj["metadata"]
        assert (obj["apiVersion"], obj["kind"]) == (SECRET.api_version, SECRET.kind), obj["kind"]
        path = collection(SECRET, meta["namespace"])
        try:
            self._call("POST", path, body=obj, query=[("fieldManager", FIELD_MANAGER)])
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        log.info("created %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
        return True

    def _server_side_apply(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return self._call(
            "PATCH",
            _object_path(body),
            body=body,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    def delete(self, obj: dict[str, Any]) -> bool:
        try:
            self._call("DELETE", _object_path(obj), body={"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        meta = obj["metadata"]
        log.info("deleted %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
        return True

    # --- observation -----------------------------------------------------------------------------
    def get_named(
        self, api_version: str, kind: str, namespace: str, name: str, ours: bool = True
    ) -> dict[str, Any] | None:
        """One object of a managed kind, by name (e.g. the engine Deployment read back); `ours`: one of
        this operator's children (in the cache), else read (KEDA's HPA)."""
        if self.caches is not None and ours:
            return self.caches.child_store(kind_of(api_version, kind), namespace).store.get(namespace, name)
        return self._get(f"{collection(kind_of(api_version, kind), namespace)}/{name}")

    def pods(self, namespace: str, owner: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        """The pods of QwenDeployment `owner` that carry `selector`."""
        if self.caches is not None:
            informer = self.caches.own_pods[namespace if namespace in self.caches.namespaces else None]
            return [p for p in informer.store.by("owner", (namespace, owner)) if _has_labels(p, selector)]
        return self._list(
            collection(POD, namespace), label_selector=",".join(f"{k}={v}" for k, v in selector.items())
        )

    def pod_events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        """Events of `reason` about pods in `namespace` (e.g. FailedMount); [] without the right to list."""
        try:
            return self._list(
                f"/api/v1/namespaces/{namespace}/events",
                field_selector=f"involvedObject.kind=Pod,reason={reason}",
            )
        except ApiException as exc:
            if exc.status == 403:
                return []
            raise

    def api_service(self, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(readable, the APIService) for an aggregated API such as v1beta1.custom.metrics.k8s.io.

        Not readable (False, None) when the operator may not read APIServices.
        """
        if self.caches is not None and name in self.caches.api_services:
            informer = self.caches.api_services[name]
            return (False, None) if informer.forbidden else (True, informer.store.get("", name))
        try:
            return True, self._get(f"{APISERVICE_API}/{name}")
        except ApiException as exc:
            if exc.status == 403:
                return False, None
            raise

    def pods_custom_metric(
        self, namespace: str, metric: str, selector: dict[str, str]
    ) -> tuple[bool, dict[str, Any] | None]:
        """(answered, the MetricValueList) of a per-pod custom metric for the pods matching `selector`.

        (True, None): the custom metrics API does not know the metric. (False, None): no answer (API not
        served or unavailable, no permission), so nothing can be said about the metric.
        """
        path = f"{CUSTOM_METRICS_API}/namespaces/{namespace}/pods/*/{metric}"
        labels = ",".join(f"{k}={v}" for k, v in selector.items())
        try:
            return True, self._call("GET", path, query=[("labelSelector", labels)])
        except ApiException as exc:
            return (True, None) if exc.status == 404 and _metric_not_found(exc) else (False, None)

    def free_gpus_by_node(self, pool: NodePool) -> dict[str, int] | None:
        """Allocatable minus requested GPUs on each schedulable node of `pool` (a replica's GPUs must all
        be on one node).

        None when nodes or cluster-wide pods cannot be read (namespaced installs without those rights).
        """
        if self.caches is not None and (self.caches.nodes.forbidden or self.caches.gpu_pods.forbidden):
            return None
        try:
            free: dict[str, int] = {}
            for node in self._nodes():
                if node.get("spec", {}).get("unschedulable") or not pool.admits(node):
                    continue
                alloc = int(node.get("status", {}).get("allocatable", {}).get(pool.resource, 0))
                used = sum(_requested(p, pool.resource) for p in self._pods_on(node))
                free[node["metadata"]["name"]] = max(alloc - used, 0)
            return free
        except ApiException as exc:
            if exc.status == 403:
                return None
            raise

    def _nodes(self) -> list[dict[str, Any]]:
        return self.caches.nodes.store.items() if self.caches else self._list(collection(NODE))

    def _pods_on(self, node: dict[str, Any]) -> list[dict[str, Any]]:
        """Pods scheduled on `node` that have not finished (they hold their requests)."""
        name = node["metadata"]["name"]
        if self.caches is not None:
            return self.caches.gpu_pods.store.by("node", name)
        return self._list(
            collection(POD),
            field_selector=f"spec.nodeName={name},status.phase!=Succeeded,status.phase!=Failed",
        )


def _ns_name(meta: dict[str, Any]) -> tuple[str, str]:
    return meta["namespace"], meta["name"]


def _has_labels(obj: dict[str, Any], labels: dict[str, str]) -> bool:
    have = obj["metadata"].get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def _requested(pod: dict[str, Any], resource: str) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers", []):
        total += int(c.get("resources", {}).get("requests", {}).get(resource, 0))
    return total


def _metric_not_found(exc: ApiException) -> bool:
    """A 404 from the custom metrics API itself (a Status naming the metric), not from a missing API."""
    try:
        body = json.loads(exc.body or "")
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("kind") == "Status" and "metric" in body.get("message", "")


@dataclass(frozen=True)
class Failure:
    """Why a reconcile failed, for the status (condition Synced) and the retry."""

    reason: str  # Conflict, Throttled, ApiServerError, ApiTimeout, ApiError, ReconcileError
    message: str
    retry_after: float = 0.0  # at least this long before the next try (a 429's Retry-After)


def describe_failure(exc: BaseException) -> Failure:
    """The condition reason and message of an exception raised by a reconcile."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        detail = _status_message(exc)
        if status == 409:
            return Failure("Conflict", f"409 Conflict from the API server: {detail}")
        if status == 429:
            return Failure("Throttled", f"429 Too Many Requests: {detail}", _retry_after(exc))
        if status >= 500 or status == 0:
            return Failure("ApiServerError", f"{status or 'no'} answer from the API server: {detail}")
        return Failure("ApiError", f"{status} {exc.reason}: {detail}")
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        return Failure("ApiTimeout", f"the API server did not answer: {type(exc).__name__}: {exc}"[:400])
    return Failure("ReconcileError", f"{type(exc).__name__}: {exc}"[:400])


def _status_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except ValueError:
        return str(exc.reason or "")[:300]
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or "")[:300]


def _retry_after(exc: ApiException) -> float:
    value = (exc.headers or {}).get("Retry-After", "")
    try:
        return max(float(value), 0.0)
    except ValueError:
        return 1.0


class Leases:
    """The leader-election Lease's reads and writes (coordination.k8s.io/v1; leader.py decides). One
    call is one request within its timeout: no urllib3 retries, which would outlast the renew deadline.
    Errors are raised (ApiException, urllib3 and OS errors) for the elector to judge."""

    def __init__(self, api: CoordinationV1Api | None = None) -> None:
        if api is None:
            config = Configuration.get_default_copy()  # the loaded credentials
            config.retries = False
            api = CoordinationV1Api(ApiClient(config))
        self._api = api

    def read(self, namespace: str, name: str, timeout: float) -> V1Lease:
        return self._api.read_namespaced_lease(name, namespace, _request_timeout=timeout)

    def create(self, namespace: str, lease: V1Lease, timeout: float) -> V1Lease:
        return self._api.create_namespaced_lease(namespace, lease, _request_timeout=timeout)

    def replace(self, namespace: str, name: str, lease: V1Lease, timeout: float) -> V1Lease:
        """The lease as read, changed: its resourceVersion makes a write by anyone in between a 409."""
        return self._api.replace_namespaced_lease(name, namespace, lease, _request_timeout=timeout)
