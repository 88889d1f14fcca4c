"""A QwenDeployment really served on the dev cluster's real node: images, operator, model cache, keys.

`make demo` and the real-node e2e tests use the same steps, in this order:
  load_images        the images built here (operator, gateway, CPU engine, exporters) into containerd
  install_operator   the chart with its default image: the operator runs as a pod on the real node
  prepare_namespace  Pod Security for the engines' namespace (baseline enforced, restricted warned)
  model_cache        a local PV + PVC holding a Hugging Face cache with the tiny model as Qwen/Qwen3-32B
  api_key_secret     the gateway's API keys
  apply, wait_serving, chat
Nothing here is simulated: Ready comes from the engine's real readiness probe, the answer from vLLM.
"""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from .cache import cache_dir
from .devcluster.cluster import Cluster
from .devcluster.components import POD_CIDR, SERVICE_CIDR
from .model import build_tiny_model, write_hf_cache
from .net import check_destination, http_get
from .repo import REPO
from .wait import wait_until

CHART = REPO / "charts" / "qwen-operator"
OPERATOR_NAMESPACE = "qwen-operator-system"
RELEASE = "qwen-operator"
#: The dev QwenDeployment: the CPU engine image, the real node's pool, sizes for this machine.
DEV_CR = REPO / "examples" / "dev" / "cpu-real-node.yaml"
#: Where the engine's model cache PV points on the node (shared by every dev cluster, read-only use).
MODEL_CACHE_DIR = "hf-cache-tiny-qwen3"
SERVING_TIMEOUT = 600.0  # image already loaded; a TP-2 CPU engine needs about 100 s on 2 cores
#: Where tests and the demo send traffic: the cluster's pods and Services (the host reaches both).
CLUSTER_NETWORKS = (POD_CIDR, SERVICE_CIDR)


def log(message: str) -> None:
    print(f"[serving] {message}", flush=True)


def dev_qwendeployment(name: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    """A fresh copy of the dev QwenDeployment, renamed and moved when asked."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(DEV_CR.read_text()))
    if name:
        body["metadata"]["name"] = name
        body["spec"]["gateway"]["apiKeysSecret"] = f"{name}-api-keys"
    if namespace:
        body["metadata"]["namespace"] = namespace
    return body


def install_operator(cluster: Cluster, release: str = RELEASE, namespace: str = OPERATOR_NAMESPACE) -> None:
    """The chart as a user installs it, default image included, into a namespace enforcing restricted,
    with the dev cluster's Prometheus (monitoringstack.NAMESPACE) as the engines' one scraper."""
    from .monitoringstack import NAMESPACE as MONITORING

    scrapers = [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    _namespace(cluster, namespace, enforce="restricted")
    log(f"helm install {release} into {namespace} (the operator runs as a pod from its image)")
    started = time.monotonic()
    subprocess.run(
        [
            str(cluster.bin("helm")), "upgrade", "--install", release, str(CHART),
            "--namespace", namespace, "--kubeconfig", str(cluster.kubeconfig),
            "--wait", "--timeout", "5m",
            "--set-json", f"engineNetworkPolicy.scrapers={json.dumps(scrapers)}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )  # fmt: skip
    log(f"operator pod ready ({time.monotonic() - started:.0f}s)")


def uninstall_operator(cluster: Cluster, release: str = RELEASE, namespace: str = OPERATOR_NAMESPACE) -> None:
    subprocess.run(
        [
            str(cluster.bin("helm")), "uninstall", release, "--namespace", namespace,
            "--kubeconfig", str(cluster.kubeconfig), "--wait",
        ],
        check=False,
        capture_output=True,
    )  # fmt: skip


def load_images(cluster_name: str) -> None:
    """Build (once, cached by content) and load the images a served QwenDeployment runs (images.SERVING)
    into the real node; the monitoring stack loads its own (monitoringstack.load_images)."""
    from . import images  # podman is only needed here
    from .devcluster import realnode

    for image in images.ensure_serving():
        started = time.monotonic()
        if realnode.load_image(cluster_name, image.archive, image.ref):
            log(f"loaded {image.ref} into the real node ({time.monotonic() - started:.0f}s)")


def prepare_namespace(cluster: Cluster, namespace: str) -> None:
    """The engines' namespace: baseline enforced, restricted warned and audited.

    The gateway pods meet restricted; the engine pods need baseline because the vLLM image runs as
    root (vllm/vllm-openai has no non-root user) with a writable root filesystem (torch.compile and
    Triton caches); they need no host namespaces, privileges or capabilities, which baseline forbids.
    """
    _namespace(cluster, namespace, enforce="baseline", warn="restricted")


def _namespace(cluster: Cluster, name: str, enforce: str, warn: str | None = None) -> None:
    cluster.kubectl("create", "namespace", name, check=False)
    labels = [f"pod-security.kubernetes.io/enforce={enforce}"]
    labels += [f"pod-security.kubernetes.io/{mode}={warn or enforce}" for mode in ("warn", "audit")]
    cluster.kubectl("label", "--overwrite", "namespace", name, *labels)


def model_cache(cluster: Cluster, namespace: str, claim: str) -> Path:
    """A PV on the node's disk holding the Hugging Face cache of the tiny model, bound to PVC `claim`.

    The engine reads it the way it reads a user's weights: HF_HOME on the cache volume and
    HF_HUB_OFFLINE from `model.offline`, resolving Qwen/Qwen3-32B to the snapshot in it.
    """
    root = cache_dir() / MODEL_CACHE_DIR
    if not (root / "hub").is_dir():
        log("building the tiny random Qwen3 model and its Hugging Face cache (once)")
        model = build_tiny_model(cache_dir() / "tiny-qwen3-model")
        write_hf_cache(root, model)
    pv = f"{namespace}-{claim}"
    objects = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv, "labels": {"qwenops.dev/dev-model-cache": "true"}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(root), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    wait_until(
        lambda: (
            cluster.kubectl("-n", namespace, "get", "pvc", claim, "-o", "jsonpath={.status.phase}").stdout
            == "Bound"
        ),
        30,
        f"PVC {namespace}/{claim} bound",
    )
    return root


def api_key_secret(cluster: Cluster, namespace: str, secret: str, key_id: str = "demo") -> str:
    """A Secret with one API key (file `key_id` holds the key, as the gateway reads it); the key."""
    key = f"sk-{secrets.token_urlsafe(24)}"
    cluster.kubectl("-n", namespace, "delete", "secret", secret, "--ignore-not-found")
    cluster.kubectl("-n", namespace, "create", "secret", "generic", secret, f"--from-literal={key_id}={key}")
    return key


def apply(cluster: Cluster, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def get_json(cluster: Cluster, *args: str) -> Any:
    result = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def wait_serving(
    cluster: Cluster, namespace: str, name: str, timeout: float = SERVING_TIMEOUT
) -> dict[str, Any]:
    """Wait until the QwenDeployment is Ready (a real engine passed readiness), printing progress."""
    started = time.monotonic()
    last = ""
    while True:
        qwd = get_json(cluster, "-n", namespace, "get", "qwd", name) or {}
        conditions = {c["type"]: c for c in qwd.get("status", {}).get("conditions", [])}
        ready = conditions.get("Ready", {})
        if ready.get("status") == "True" and qwd["status"].get("observedGeneration") == qwd["metadata"].get(
            "generation"
        ):
            log(f"{namespace}/{name} Ready after {time.monotonic() - started:.0f}s: {ready.get('message')}")
            return dict(qwd)
        line = f"{ready.get('reason', 'no status yet')}: {_pods_summary(cluster, namespace, name)}"
        if line != last:
            log(f"{time.monotonic() - started:4.0f}s {line}")
            last = line
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{namespace}/{name} not Ready after {timeout:.0f}s: {line}")
        time.sleep(3)


def _pods_summary(cluster: Cluster, namespace: str, name: str) -> str:
    pods = get_json(cluster, "-n", namespace, "get", "pods", "-l", f"app.kubernetes.io/instance={name}")
    parts = []
    for pod in (pods or {}).get("items", []):
        component = pod["metadata"]["labels"].get("app.kubernetes.io/component", "?")
        statuses = pod.get("status", {}).get("containerStatuses", [])
        ready = sum(1 for s in statuses if s.get("ready"))
        waiting = [
            s["state"]["waiting"].get("reason", "") for s in statuses if "waiting" in s.get("state", {})
        ]
        phase = pod.get("status", {}).get("phase", "?")
        parts.append(f"{component} {phase} {ready}/{len(statuses)}" + (f" ({waiting[0]})" if waiting else ""))
    return ", ".join(parts) or "no pods yet"


def service_url(cluster: Cluster, namespace: str, service: str) -> str:
    """http://CLUSTER-IP:PORT of a Service; kube-proxy on the node forwards the host's traffic to it."""
    svc = get_json(cluster, "-n", namespace, "get", "service", service)
    port = svc["spec"]["ports"][0]["port"]
    return f"http://{svc['spec']['clusterIP']}:{port}"


def chat(
    url: str,
    key: str,
    prompt: str,
    max_tokens: int = 16,
    timeout: float = 60,
    model: str = "Qwen/Qwen3-32B",
    **extra: Any,
) -> tuple[int, Any]:
    """POST one chat completion to the gateway at `url` with API key `key`: (status, JSON body, or the
    error body's text). `model` may name a LoRA adapter; `extra` adds request fields (temperature...)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        **extra,
    }
    check_destination(url, CLUSTER_NETWORKS)
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")


def timestamp(value: str) -> float:
    """Epoch seconds of an RFC 3339 time of the API (a condition's lastTransitionTime)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pod_condition_time(pod: dict[str, Any], kind: str) -> float | None:
    """When a pod's condition `kind` (PodScheduled, Ready) last became True; None while it is not."""
    c = next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), None)
    return timestamp(c["lastTransitionTime"]) if c and c["status"] == "True" else None


def pod_get(url: str, timeout: float = 5) -> tuple[int, str]:
    """GET on a pod or Service address of the dev cluster (e.g. an engine's /metrics)."""
    return http_get(url, timeout=timeout, networks=CLUSTER_NETWORKS)


def curl_command(url: str, key: str) -> str:
    """The chat completion as a command a user can repeat."""
    body = json.dumps({"model": "Qwen/Qwen3-32B", "messages": [{"role": "user", "content": "Hello!"}]})
    return (
        f"curl -s {url}/v1/chat/completions -H 'Authorization: Bearer {key}' "
        f"-H 'Content-Type: application/json' -d '{body}'"
    )
