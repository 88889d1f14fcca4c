"""LoRA adapters without engine restarts: the ConfigMap of desired adapters and the `lora-sync` sidecar.

The engine pod template holds only the slot settings (engine flags) and this sidecar, never the adapter
list: the list lives in the ConfigMap, which kubelet updates in place in the mounted volume, and the
sidecar (`qwen-operator lora-sync`, the operator's own image) loads and unloads adapters through the
engine's runtime routes on loopback with the engine's key. The operator reads no Secret and calls no
engine; it counts where each adapter is loaded from the sidecars' /status (status.py).
"""

from __future__ import annotations

from typing import Any

from .. import names
from ..api.lorafile import FILE_NAME, MOUNT_DIR, SIDECAR_PORT, Adapter, HubSource, render
from ..api.review import Review
from .meta import metadata

#: The operator's own image, which the sidecar and the activator run: the chart passes the image it
#: installed (read once by the reconciler, ClusterFacts.operator_image).
OPERATOR_IMAGE_ENV = "QWEN_OPERATOR_IMAGE"
#: Named container port of the sidecar (/status, /metrics, /ready, /healthz).
PORT_NAME = "lora-sync"
#: Seconds between the sidecar's readiness probes: the pod is routed to at most this long after its
#: adapters are loaded (a cold start at zero waits for it), and a probe costs a dict read.
READY_PROBE_PERIOD = 2
VOLUME = "lora-adapters"


def desired_adapters(review: Review) -> list[Adapter]:
    lora = review.resource.spec.lora
    assert lora is not None
    adapters = []
    for a in lora.adapters:
        hub = a.source.hugging_face
        source = HubSource(hub.repo, hub.revision) if hub else None
        adapters.append(Adapter(a.name, path=a.source.path, hub=source))
    return adapters


def build_lora_config_map(review: Review) -> dict[str, Any]:
    """The desired adapters, read by every engine pod's sidecar."""
    qd = review.resource
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(qd, names.lora(qd), "engine"),
        "data": {FILE_NAME: render(desired_adapters(review))},
    }


def lora_volume(review: Review) -> dict[str, Any]:
    return {"name": VOLUME, "configMap": {"name": names.lora(review.resource), "defaultMode": 0o444}}


def lora_sidecar(
    review: Review, env: list[dict[str, Any]], cache_mount: dict[str, Any], image: str
) -> dict[str, Any]:
    """`qwen-operator lora-sync` beside the engine: the engine's key and model cache, the desired file.

    Its readiness probe is /ready, so that the pod (ready when every container is) is routed to only
    once the adapters wanted at its start are loaded or have failed (lorasync.py). It needs no startup
    budget: a failing readiness probe restarts nothing, and the engine's startupProbe covers the
    engine's start."""
    keep = {"HF_HOME", "HF_TOKEN", "HF_HUB_OFFLINE", "VLLM_API_KEY"}
    probe = {"httpGet": {"path": "/healthz", "port": PORT_NAME}, "periodSeconds": 20, "timeoutSeconds": 5}
    ready = {"httpGet": {"path": "/ready", "port": PORT_NAME}, "periodSeconds": READY_PROBE_PERIOD,
             "timeoutSeconds": 2, "failureThreshold": 3}  # fmt: skip
    return {
        "name": "lora-sync",
        "image": image,
        "command": ["qwen-operator", "lora-sync"],
        "args": ["--model-cache", cache_mount["mountPath"], "--port", str(SIDECAR_PORT)],
        "ports": [{"name": PORT_NAME, "containerPort": SIDECAR_PORT, "protocol": "TCP"}],
        "env": [e for e in env if e["name"] in keep],
        "readinessProbe": ready,
        "livenessProbe": {**probe, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [{**cache_mount}, {"name": VOLUME, "mountPath": MOUNT_DIR, "readOnly": True}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            # As the engine (manifests/engine.py): the model cache is root's, and Hub downloads go there.
            "runAsUser": 0,
        },
    }
