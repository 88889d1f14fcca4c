"""The only code that talks to the Kubernetes API.

Children are written with server-side apply under one field manager, and only when they differ from
what the cluster already has: a resync that changes nothing issues no write at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import kubernetes
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException

from .metrics import API_WRITES

log = logging.getLogger(__name__)

FIELD_MANAGER = "qwen-operator"
HASH_ANNOTATION = "qwenops.dev/applied-hash"
REQUEST_TIMEOUT = 30


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    crd: str | None = None  # name of the CRD that must exist, for optional kinds

    def collection(self, namespace: str) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{base}/namespaces/{namespace}/{self.plural}"


KINDS: dict[tuple[str, str], Kind] = {
    (k.api_version, k.kind): k
    for k in (
        Kind("v1", "ServiceAccount", "serviceaccounts"),
        Kind("v1", "ConfigMap", "configmaps"),
        Kind("v1", "Service", "services"),
        Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
        Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
        Kind("apps/v1", "Deployment", "deployments"),
        Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
        Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
        Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
        Kind("networking.k8s.io/v1", "Ingress", "ingresses"),
        Kind(
            "gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", "httproutes.gateway.networking.k8s.io"
        ),
        Kind(
            "monitoring.coreos.com/v1",
            "ServiceMonitor",
            "servicemonitors",
            "servicemonitors.monitoring.coreos.com",
        ),
        Kind("monitoring.coreos.com/v1", "PodMonitor", "podmonitors", "podmonitors.monitoring.coreos.com"),
        Kind(
            "monitoring.coreos.com/v1",
            "PrometheusRule",
            "prometheusrules",
            "prometheusrules.monitoring.coreos.com",
        ),
        Kind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects", "scaledobjects.keda.sh"),
    )
}


def kind_of(obj: dict[str, Any]) -> Kind:
    return KINDS[(obj["apiVersion"], obj["kind"])]


def content_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def contains(live: Any, want: Any) -> bool:
    """True when every field of `want` is in `live` with the same value (the server may add more)."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(map(contains, live, want))
    return bool(live == want or str(live) == str(want))


class Cluster:
    """Typed access to the API server for the reconciler."""

    def __init__(self, api: ApiClient | None = None):
        self.api = api or kubernetes.client.ApiClient()
        self._crd_cache: dict[str, tuple[float, bool]] = {}

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
            raise ApiException(status=resp.status, reason=resp.reason, body=data.decode(errors="replace"))
        return json.loads(data) if data else None

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_items(
        self, path: str, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = [
            (k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        ]
        return list(self._call("GET", path, query=query).get("items", []))

    # --- children --------------------------------------------------------------------------------
    def has_crd(self, name: str, ttl: float = 60.0) -> bool:
        cached = self._crd_cache.get(name)
        if cached and time.monotonic() - cached[0] < ttl:
            return cached[1]
        found = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") is not None
        self._crd_cache[name] = (time.monotonic(), found)
        return found

    def kind_available(self, kind: Kind) -> bool:
        return kind.crd is None or self.has_crd(kind.crd)

    def children(self, namespace: str, labels: dict[str, str]) -> dict[tuple[str, str, str], dict[str, Any]]:
        """Objects of managed kinds carrying `labels`, keyed by (apiVersion, kind, name)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        found = {}
        for kind in KINDS.values():
            if not self.kind_available(kind):
                continue
            for item in self.list_items(kind.collection(namespace), label_selector=selector):
                item |= {"apiVersion": kind.api_version, "kind": kind.kind}  # list items omit them
                found[(kind.api_version, kind.kind, item["metadata"]["name"])] = item
        return found

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
        meta = obj["metadata"]
        path = f"{kind_of(obj).collection(meta['namespace'])}/{meta['name']}"
        self._call(
            "PATCH",
            path,
            body=body,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )
        log.info("applied %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
        return True

    def delete(self, obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        path = f"{KINDS[(obj['apiVersion'], obj['kind'])].collection(meta['namespace'])}/{meta['name']}"
        try:
            self._call("DELETE", path, body={"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        log.info("deleted %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
        return True

    # --- observation -----------------------------------------------------------------------------
    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        return self.list_items(
            f"/api/v1/namespaces/{namespace}/pods",
            label_selector=",".join(f"{k}={v}" for k, v in selector.items()),
        )

    def free_gpus(self, resource: str, node_matches: Any) -> int | None:
        """Allocatable minus requested `resource` on nodes accepted by `node_matches(node)`.

        None when nodes or cluster-wide pods cannot be read (namespaced installs without those rights).
        """
        try:
            nodes = [n for n in self.list_items("/api/v1/nodes") if node_matches(n)]
            free = 0
            for node in nodes:
                if node.get("spec", {}).get("unschedulable"):
                    continue
                alloc = int(node.get("status", {}).get("allocatable", {}).get(resource, 0))
                pods = self.list_items(
                    "/api/v1/pods",
                    field_selector=f"spec.nodeName={node['metadata']['name']},"
                    "status.phase!=Succeeded,status.phase!=Failed",
                )
                used = sum(_requested(p, resource) for p in pods)
                free += max(alloc - used, 0)
            return free
        except ApiException as exc:
            if exc.status == 403:
                return None
            raise

    def patch_status(
        self, namespace: str, name: str, plural: str, group_version: str, status: dict[str, Any]
    ) -> None:
        path = f"/apis/{group_version}/namespaces/{namespace}/{plural}/{name}/status"
        self._call("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")


def _requested(pod: dict[str, Any], resource: str) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers", []):
        total += int(c.get("resources", {}).get("requests", {}).get(resource, 0))
    return total
