"""Checks of the dev cluster itself: real scheduler, controllers and RBAC, kwok-simulated GPU nodes."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from kubernetes import client

from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster.cluster import Cluster
from qwen_devtools.devcluster.state import State
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until
from qwen_operator.versions import KUBERNETES

pytestmark = pytest.mark.cluster

H100 = "NVIDIA-H100-80GB-HBM3"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _deployment(name: str, replicas: int = 1, gpus: int = 0, product: str | None = None) -> dict[str, Any]:
    """A Deployment of a placeholder container; with ``gpus``, it tolerates and requests GPUs."""
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/placeholder:1"}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        pod_spec["tolerations"] = [GPU_TOLERATION]
    if product:
        term = {
            "matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [product]}]
        }
        required = {"nodeSelectorTerms": [term]}
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def _pods(core: client.CoreV1Api, namespace: str, app: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(namespace, label_selector=f"app={app}").items


def _condition(pod: client.V1Pod, kind: str) -> client.V1PodCondition | None:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def test_server_reports_pinned_version(cluster: Cluster, api_client: client.ApiClient) -> None:
    assert client.VersionApi(api_client).get_code().git_version == KUBERNETES
    assert f"Server Version: {KUBERNETES}" in cluster.kubectl("version").stdout


def test_up_refuses_a_cluster_another_checkout_started(cluster: Cluster) -> None:
    """`up` of a running cluster whose state names another checkout raises instead of reporting it:
    that checkout holds its kubeconfig, and its tests may be using (and will stop) the cluster."""
    state = State.load(cluster.name) if cluster.name else None
    if state is None or cluster.name is None:
        pytest.skip("an external cluster (QWEN_E2E_KUBECONFIG): no dev-cluster state to check")
    assert state.checkout == str(REPO), state
    assert devcluster.up(cluster.name).kubeconfig == cluster.kubeconfig  # this checkout's: reported
    elsewhere = dataclasses.replace(state, checkout="/elsewhere/qwen-operator")
    elsewhere.save()
    try:
        with pytest.raises(
            devcluster.StartedElsewhere, match="another checkout \\(/elsewhere/qwen-operator\\)"
        ):
            devcluster.up(cluster.name)
    finally:
        state.save()
    assert devcluster.is_up(cluster.name)


def test_rbac_denies_service_account_without_permissions(
    cluster: Cluster, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=["https://kubernetes.default.svc.cluster.local"])
    )
    token = core.create_namespaced_service_account_token("nobody", namespace, request).status.token
    configuration = copy.copy(api_client.configuration)
    configuration.api_key = {"BearerToken": f"Bearer {token}"}
    configuration.refresh_api_key_hook = None  # the kubeconfig loader's hook would restore the admin token
    with client.ApiClient(configuration) as as_nobody, pytest.raises(client.ApiException) as denied:
        client.CoreV1Api(as_nobody).list_namespaced_pod(namespace)
    assert denied.value.status == 403
    assert f"system:serviceaccount:{namespace}:nobody" in denied.value.body
    kubectl = cluster.kubectl("--token", token, "get", "pods", "-n", namespace, check=False)
    assert kubectl.returncode != 0
    assert "Forbidden" in kubectl.stderr


def test_gpu_deployment_lands_on_h100_and_becomes_ready(api_client: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, _deployment("engine", gpus=2, product=H100))

    def ready_pod() -> client.V1Pod | None:
        pods = _pods(core, namespace, "engine")
        ready = [p for p in pods if (c := _condition(p, "Ready")) is not None and c.status == "True"]
        return ready[0] if ready else None

    pod = wait_until(ready_pod, 60, "a Ready engine pod")
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == H100
    assert node.metadata.labels["qwenops.dev/pool"] == "h100-80gb"
    assert pod.status.phase == "Running"
    wait_until(
        lambda: apps.read_namespaced_deployment(name="engine", namespace=namespace).status.ready_replicas
    )


def test_deleting_deployment_garbage_collects_replicasets_and_pods(
    api_client: client.ApiClient, namespace: str
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, _deployment("web", replicas=2))
    wait_until(lambda: len(_pods(core, namespace, "web")) == 2, 60, "2 web pods")
    assert apps.list_namespaced_replica_set(namespace, label_selector="app=web").items

    apps.delete_namespaced_deployment("web", namespace, propagation_policy="Background")

    def dependents_gone() -> bool:
        replica_sets = apps.list_namespaced_replica_set(namespace, label_selector="app=web").items
        return not replica_sets and not _pods(core, namespace, "web")

    wait_until(dependents_gone, 60, "ReplicaSets and Pods of the deleted Deployment to be collected")


def test_deleting_owner_configmap_garbage_collects_dependent(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "dependent", "ownerReferences": [reference]}}
    )

    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        return not core.list_namespaced_config_map(namespace, field_selector="metadata.name=dependent").items

    wait_until(dependent_gone, 60, "the dependent ConfigMap to be collected")


def test_oversized_gpu_request_stays_pending_with_scheduler_reason(
    api_client: client.ApiClient, namespace: str
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, _deployment("huge", gpus=16))

    def unschedulable() -> client.V1PodCondition | None:
        pods = _pods(core, namespace, "huge")
        condition = _condition(pods[0], "PodScheduled") if pods else None
        return condition if condition is not None and condition.reason == "Unschedulable" else None

    condition = wait_until(unschedulable, 60, "the scheduler to mark the pod Unschedulable")
    assert condition.status == "False"
    assert "Insufficient nvidia.com/gpu" in condition.message
    (pod,) = _pods(core, namespace, "huge")
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_hpa_controller_evaluates_within_sync_period(api_client: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(api_client)
    autoscaling = client.AutoscalingV2Api(api_client)
    apps.create_namespaced_deployment(namespace, _deployment("scaled"))
    metric = {
        "metric": {"name": "vllm_num_requests_waiting"},
        "target": {"type": "AverageValue", "averageValue": "5"},
    }
    hpa = {
        "metadata": {"name": "scaled"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "scaled"},
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [{"type": "Pods", "pods": metric}],
        },
    }
    autoscaling.create_namespaced_horizontal_pod_autoscaler(namespace, hpa)

    def scaling_active() -> client.V2HorizontalPodAutoscalerCondition | None:
        status = autoscaling.read_namespaced_horizontal_pod_autoscaler("scaled", namespace).status
        return next((c for c in status.conditions or [] if c.type == "ScalingActive"), None)

    condition = wait_until(scaling_active, 30, "the HPA controller to evaluate the HPA")
    # No custom metrics API is registered, so the real controller reports that it cannot get the metric.
    assert condition.status == "False"
    assert condition.reason == "FailedGetPodsMetric"
