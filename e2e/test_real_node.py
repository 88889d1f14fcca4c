"""The dev cluster's real node: pods of the local pause image really run on ``qwen-real-0``, reach the
API server and cluster DNS, sit behind Services, are held to NetworkPolicy, are placed by their GPU
requests, and ``down`` leaves nothing of the node on the host.

The in-pod checks use ``probe`` (images/pause): it prints one JSON line per check, read from the pod log.
The test marked stops_real_cluster stops the session's real-node cluster; conftest runs it after every
other test (the fixture's own teardown is then a no-op).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster import hostclean, network, nodebuild, realnode
from qwen_devtools.devcluster.nodecomponents import KUBELET_SYSCTLS, NODE_NAME
from qwen_devtools.devcluster.state import state_dir
from qwen_devtools.wait import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.real_node]

REAL_NODE_SELECTOR = {"qwenops.dev/real-node": "true"}
#: Host sysctls kubelet or the CNI bridge plugin would change if they could.
WATCHED_SYSCTLS = (*KUBELET_SYSCTLS, "net/ipv4/ip_forward")
HOST_SYSCTLS = {name: Path("/proc/sys", name).read_text() for name in WATCHED_SYSCTLS}
VETHS_BEFORE = {path.name for path in Path("/sys/class/net").glob("veth*")}


def _pod(name: str, args: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod of the pause image (``args`` run /probe instead of /pause)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": nodebuild.pause_image().ref,
        "imagePullPolicy": "Never",
    }
    if args is not None:
        container |= {"command": ["/probe"], "args": args}
    labels = {"app": name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1, **spec},
    }


def _server(name: str) -> dict[str, Any]:
    """A probe HTTP server on :8080 with a readiness probe (kubelet reaching the pod)."""
    pod = _pod(name, ["-serve", ":8080"])
    pod["spec"]["containers"][0] |= {
        "ports": [{"containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
    }
    return pod


def _service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def _read_pod(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    pod = core.read_namespaced_pod(name, namespace)
    return dict(core.api_client.sanitize_for_serialization(pod))


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _wait_ready(core: client.CoreV1Api, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = _read_pod(core, namespace, name)
        return pod if _ready(pod) else None

    return wait_until(ready, timeout, f"pod {name} Ready", interval=0.25)


def _wait_finished(core: client.CoreV1Api, namespace: str, name: str, timeout: float = 90) -> str:
    def finished() -> str | None:
        phase = _read_pod(core, namespace, name).get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    return wait_until(finished, timeout, f"pod {name} to finish", interval=0.25)


def _probe_results(core: client.CoreV1Api, namespace: str, name: str) -> list[dict[str, Any]]:
    log = core.read_namespaced_pod_log(name, namespace)
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def _wait_endpoints(api: client.ApiClient, namespace: str, service: str) -> None:
    discovery = client.DiscoveryV1Api(api)

    def ready() -> bool:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={service}"
        )
        return any((e.conditions and e.conditions.ready) for s in slices.items for e in s.endpoints or [])

    wait_until(ready, 30, f"a ready endpoint of Service {service}", interval=0.25)


def test_pod_runs_on_the_real_node(real_api_client: client.ApiClient, real_namespace: str) -> None:
    """No nodeSelector, no toleration: the only node it may use is the real one (kwok nodes are tainted)."""
    core = client.CoreV1Api(real_api_client)
    core.create_namespaced_pod(real_namespace, _pod("pause"))
    pod = _wait_ready(core, real_namespace, "pause")
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["phase"] == "Running"
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(network.NODE_SUBNET)
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0


def test_node_is_labelled_untainted_and_simulated_cpu_node_tainted(real_api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(real_api_client)
    node = core.read_node(NODE_NAME)
    labels = node.metadata.labels or {}
    assert labels["qwenops.dev/real-node"] == "true"
    assert labels["nvidia.com/gpu.product"] == "QWEN-DEV-CPU"
    assert not node.spec.taints
    assert node.status.capacity["nvidia.com/gpu"] == node.status.allocatable["nvidia.com/gpu"] == "8"
    address = {a.type: a.address for a in node.status.addresses}["InternalIP"]
    assert address == network.BRIDGE_ADDRESS
    products = {n.metadata.labels.get("nvidia.com/gpu.product") for n in core.list_node().items}
    assert sorted(p for p in products if p and "QWEN" in p) == ["QWEN-DEV-CPU"]
    cpu = core.read_node("cpu-0")
    assert [(t.key, t.effect) for t in cpu.spec.taints] == [("qwenops.dev/simulated", "NoSchedule")]


def test_kubelet_is_its_node_confined_by_the_node_authorizer_and_node_restriction(
    real_cluster: devcluster.Cluster, real_namespace: str
) -> None:
    """kubelet (and the keeper, its stand-in device plugin) authenticate as system:node:qwen-real-0, not
    as the admin: the Node authorizer limits them to their own Node and the objects of pods bound to it,
    and NodeRestriction keeps them off the labels a node may not set on itself."""
    statuses = _audit(real_cluster, resource="nodes", name=NODE_NAME, subresource="status")
    assert statuses and {e["user"]["username"] for e in statuses} == {f"system:node:{NODE_NAME}"}
    other = next(
        n["metadata"]["name"]
        for n in json.loads(real_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        if n["metadata"]["name"] != NODE_NAME
    )
    real_cluster.kubectl(
        "-n", real_namespace, "create", "secret", "generic", "stranger", "--from-literal=k=v"
    )
    as_node = ["label", "--overwrite", "node"]
    refusals = {
        "another node": _as_kubelet(real_cluster, *as_node, other, "qwenops.dev/touched=yes"),
        "a restricted label": _as_kubelet(
            real_cluster, *as_node, NODE_NAME, "node-restriction.kubernetes.io/pool=mine"
        ),
        "a Secret of no pod of its": _as_kubelet(
            real_cluster, "-n", real_namespace, "get", "secret", "stranger"
        ),
    }
    for what, result in refusals.items():
        assert result.returncode != 0 and "Forbidden" in result.stderr, (what, result.stderr)
    assert "is not allowed to modify labels" in refusals["a restricted label"].stderr
    allowed = _as_kubelet(real_cluster, *as_node, NODE_NAME, "qwenops.dev/kubelet-may-label=yes")
    assert allowed.returncode == 0, allowed.stderr
    real_cluster.kubectl("label", "node", NODE_NAME, "qwenops.dev/kubelet-may-label-")


def _as_kubelet(cluster: devcluster.Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = state_dir(cluster.name) / "kubelet.kubeconfig"
    argv = [str(cluster.bin("kubectl")), f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _audit(cluster: devcluster.Cluster, **ref: str) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in (cluster.kubeconfig.parent / "audit.log").read_text().splitlines()]
    return [e for e in events if all(e.get("objectRef", {}).get(k) == v for k, v in ref.items())]


def test_pod_reaches_api_server_and_cluster_dns(
    real_api_client: client.ApiClient, real_namespace: str
) -> None:
    core, rbac = client.CoreV1Api(real_api_client), client.RbacAuthorizationV1Api(real_api_client)
    ns = real_namespace
    core.create_namespaced_service_account(ns, {"metadata": {"name": "prober"}})
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    rbac.create_namespaced_role(ns, {"metadata": {"name": "pod-reader"}, "rules": [rule]})
    binding = {
        "metadata": {"name": "prober-reads-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prober", "namespace": ns}],
    }
    rbac.create_namespaced_role_binding(ns, binding)
    core.create_namespaced_pod(ns, _server("web"))
    web = core.create_namespaced_service(ns, _service("web"))
    _wait_ready(core, ns, "web")
    _wait_endpoints(real_api_client, ns, "web")

    api = "https://kubernetes.default.svc"
    args = [
        *("-lookup", "kubernetes.default.svc"),
        *("-lookup", "web"),
        *("-lookup", f"web.{ns}.svc.cluster.local"),
        *("-lookup", "registry.invalid"),
        *("-get", f"{api}/api/v1/namespaces/{ns}/pods"),
        *("-get", f"{api}/api/v1/namespaces/{ns}/secrets"),
        *("-get", "http://web/"),
    ]
    core.create_namespaced_pod(ns, _pod("probe", args, serviceAccountName="prober", restartPolicy="Never"))
    _wait_finished(core, ns, "probe")
    results = _probe_results(core, ns, "probe")
    print("\n".join(json.dumps(r) for r in results))
    lookups = {r["lookup"]: r for r in results if "lookup" in r}
    gets = {r["get"]: r for r in results if "get" in r}
    assert lookups["kubernetes.default.svc"]["addresses"] == ["10.96.0.1"]
    assert lookups["web"]["addresses"] == [web.spec.cluster_ip]
    assert lookups[f"web.{ns}.svc.cluster.local"]["addresses"] == [web.spec.cluster_ip]
    # names outside the cluster are answered NXDOMAIN by CoreDNS (never forwarded off the machine)
    assert "no such host" in lookups["registry.invalid"]["error"]
    assert gets[f"{api}/api/v1/namespaces/{ns}/pods"]["status"] == 200
    assert gets[f"{api}/api/v1/namespaces/{ns}/secrets"]["status"] == 403
    # pod -> Service -> pod: routed back into the bridge (forwarding on qwen0 only)
    assert gets["http://web/"]["status"] == 200


def test_service_cluster_ip_reaches_pod_from_host(
    real_api_client: client.ApiClient, real_namespace: str
) -> None:
    core = client.CoreV1Api(real_api_client)
    core.create_namespaced_pod(real_namespace, _server("hello"))
    service = core.create_namespaced_service(real_namespace, _service("hello"))
    _wait_ready(core, real_namespace, "hello")
    _wait_endpoints(real_api_client, real_namespace, "hello")
    cluster_ip = service.spec.cluster_ip
    # traffic into the pod's network namespace through kube-proxy's nftables rules; never a proxy
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def answer() -> str | None:
        try:
            with opener.open(f"http://{cluster_ip}/", timeout=2) as response:
                return str(response.read().decode())
        except OSError:
            return None

    assert wait_until(answer, 30, f"http://{cluster_ip}/ to answer").strip() == "probe hello"


def test_network_policy_is_enforced_between_pods(
    real_api_client: client.ApiClient, real_namespace: str
) -> None:
    """kube-network-policies decides each new pod connection: a NetworkPolicy that admits only pods
    labelled ``role=friend`` lets the friend through and drops the stranger's connection (no answer at
    all: the probe times out), while the node itself (kubelet's readiness probe) still gets in."""
    core = client.CoreV1Api(real_api_client)
    networking = client.NetworkingV1Api(real_api_client)
    core.create_namespaced_pod(real_namespace, _server("guarded"))
    web = _wait_ready(core, real_namespace, "guarded")
    policy = {
        "metadata": {"name": "friends-only"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "guarded"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}]}],
        },
    }
    networking.create_namespaced_network_policy(real_namespace, policy)
    url = f"http://{web['status']['podIP']}:8080/"
    for name, labels in (("friend", {"role": "friend"}), ("stranger", {"role": "stranger"})):
        pod = _pod(name, ["-get", url], restartPolicy="Never")
        pod["metadata"]["labels"] |= labels
        core.create_namespaced_pod(real_namespace, pod)
    results = {}
    for name in ("friend", "stranger"):
        _wait_finished(core, real_namespace, name)
        results[name] = _probe_results(core, real_namespace, name)[0]
    print(json.dumps(results))
    assert results["friend"].get("status") == 200, results
    assert "status" not in results["stranger"] and "Timeout" in results["stranger"]["error"], results
    assert _ready(_read_pod(core, real_namespace, "guarded"))


def test_scheduler_places_gpu_pods_by_the_patched_capacity(
    real_api_client: client.ApiClient, real_namespace: str
) -> None:
    core = client.CoreV1Api(real_api_client)

    def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
        pod = _pod(name, nodeSelector=REAL_NODE_SELECTOR)
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        return pod

    core.create_namespaced_pod(real_namespace, gpu_pod("two-gpus", 2))
    core.create_namespaced_pod(real_namespace, gpu_pod("nine-gpus", 9))
    placed = _wait_ready(core, real_namespace, "two-gpus")
    assert placed["spec"]["nodeName"] == NODE_NAME

    def unschedulable() -> dict[str, Any] | None:
        conditions = _read_pod(core, real_namespace, "nine-gpus").get("status", {}).get("conditions") or []
        scheduled = next((c for c in conditions if c["type"] == "PodScheduled"), None)
        return scheduled if scheduled and scheduled.get("reason") == "Unschedulable" else None

    condition = wait_until(unschedulable, 30, "the 9-GPU pod to be Unschedulable")
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    assert not _read_pod(core, real_namespace, "nine-gpus")["spec"].get("nodeName")


def test_image_pulls_stay_on_the_machine(real_api_client: client.ApiClient, real_namespace: str) -> None:
    """containerd maps every registry to a closed loopback port: a missing image fails, nothing leaves."""
    core = client.CoreV1Api(real_api_client)
    pod = _pod("missing", nodeSelector=REAL_NODE_SELECTOR)
    pod["spec"]["containers"][0] |= {"image": "docker.io/library/not-here:1", "imagePullPolicy": "Always"}
    core.create_namespaced_pod(real_namespace, pod)

    def pull_failed() -> dict[str, Any] | None:
        statuses = _read_pod(core, real_namespace, "missing").get("status", {}).get("containerStatuses") or []
        waiting = (statuses[0].get("state") or {}).get("waiting") if statuses else None
        return waiting if waiting and waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    waiting = wait_until(pull_failed, 60, "the pull of a missing image to fail")
    events = core.list_namespaced_event(real_namespace, field_selector="involvedObject.name=missing").items
    messages = " ".join([waiting.get("message") or "", *(e.message or "" for e in events)])
    assert "127.0.0.1:9" in messages


def test_no_host_sysctl_changed(real_cluster: devcluster.Cluster) -> None:
    """kubelet and the CNI plugin would set these; the first six are faked in the node's mount namespace."""
    assert {name: Path("/proc/sys", name).read_text() for name in WATCHED_SYSCTLS} == HOST_SYSCTLS
    assert Path("/proc/sys/net/ipv4/conf", network.BRIDGE, "forwarding").read_text().strip() == "1"


def _nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


@pytest.mark.stops_real_cluster
def test_down_leaves_nothing_on_the_host(
    real_cluster: devcluster.Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stops the session's real-node cluster, so it runs after every other test (see conftest)."""
    if os.environ.get("QWEN_E2E_KEEP") == "1":
        pytest.skip("QWEN_E2E_KEEP=1 keeps the cluster")
    assert real_cluster.name is not None
    assert realnode.holder() == real_cluster.name
    assert network.bridge_exists() and network.table_exists() and network.policies_enforced()
    started = time.monotonic()
    devcluster.down(real_cluster.name)
    down_seconds = time.monotonic() - started
    with capsys.disabled():
        print(f"\n[real node] down of {real_cluster.name!r}: {down_seconds:.1f} s")
    assert not network.bridge_exists()
    assert not network.policies_enforced() and not network.policy_queue_bound()
    assert {path.name for path in Path("/sys/class/net").glob("veth*")} <= VETHS_BEFORE
    mounts = Path("/proc/self/mountinfo").read_text()
    assert "kubelet" not in mounts and "qwen-devcluster" not in mounts
    tables = _nft_tables()
    assert network.NFT_TABLE not in tables and "kube-proxy" not in tables
    assert hostclean.kubepods_cgroups() == []
    assert realnode.holder() is None
    assert {name: Path("/proc/sys", name).read_text() for name in WATCHED_SYSCTLS} == HOST_SYSCTLS
