"""The vLLM engine Deployment and its headless Service."""

from __future__ import annotations

import math
from typing import Any

from .. import names, versions
from ..api.catalog import DEFAULT_ENGINE_IMAGE
from ..api.coldstart import startup_budget_seconds
from ..api.drains import ENGINE_PRESTOP_SECONDS, engine_hung_grace_seconds
from ..api.engine import ENGINE_COMMAND, ENGINE_PORT, engine_args
from ..api.lorafile import SIDECAR_PORT
from ..api.pool import NodePool
from ..api.quantity import canonical, quantity_bytes
from ..api.review import Review
from ..api.rollout import ROLLOUT_ANNOTATION, Rollout
from .lora import PORT_NAME as LORA_PORT
from .lora import lora_sidecar, lora_volume
from .meta import metadata

MODEL_CACHE_PATH = "/models"
HEALTH_PATH = "/health"
STARTUP_PROBE_PERIOD = 10
#: Node disk an engine writes besides an emptyDir model cache: torch.compile, Triton and FlashInfer
#: caches under $HOME/.cache, logs and the container's writable layer.
SCRATCH_GIB = 10


def startup_seconds(review: Review) -> int:
    """The startup probe's budget (api/coldstart.py)."""
    return startup_budget_seconds(review.resource.spec, review.plan)


def _env(review: Review) -> list[dict[str, Any]]:
    spec = review.resource.spec
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": MODEL_CACHE_PATH},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DO_NOT_TRACK", "value": "1"},
    ]
    if spec.model.offline:
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    if spec.model.hf_token_secret:
        ref = spec.model.hf_token_secret
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    key = names.engine_key(review.resource)
    if key:
        env.append(
            {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": key.name, "key": key.key}}}
        )
    if spec.lora:
        # /v1/load_lora_adapter and /v1/unload_lora_adapter, through which the operator changes the
        # adapters without a restart; the gateway never forwards them (only the OpenAI routes).
        env.append({"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"})
    return env + list(spec.engine.env)


def cache_size_limit(review: Review) -> str | None:
    """sizeLimit of the emptyDir model cache (the spec's, else the checkpoint files plus 20%: what is
    downloaded, which can exceed what the GPUs hold, e.g. a bf16 checkpoint served as FP8, or a tied
    lm_head stored twice); None with a PVC."""
    cache = review.resource.spec.model.cache
    if cache.claim_name:
        return None
    files_gib = math.ceil(review.plan.download_bytes * 1.2 / 2**30)
    return canonical(cache.size_limit or f"{files_gib}Gi")


def ephemeral_storage(review: Review) -> str:
    """The engine container's ephemeral-storage request and limit: the spec's, else the emptyDir cache
    (its usage counts against the pod's) plus SCRATCH_GIB for compile caches, logs and writable layer."""
    override = review.resource.spec.engine.resources.ephemeral_storage
    if override:
        return canonical(override)
    cache = cache_size_limit(review)
    cache_bytes = quantity_bytes(cache) if cache else 0
    return canonical(f"{math.ceil(cache_bytes / 2**30) + SCRATCH_GIB}Gi")


def _volumes(review: Review) -> list[dict[str, Any]]:
    spec = review.resource.spec
    cache = spec.model.cache
    if cache.claim_name:
        model_volume: dict[str, Any] = {"persistentVolumeClaim": {"claimName": cache.claim_name}}
    else:
        model_volume = {"emptyDir": {"sizeLimit": cache_size_limit(review)}}
    volumes = [
        {"name": "model-cache", **model_volume},
        {
            "name": "dshm",
            "emptyDir": {"medium": "Memory", "sizeLimit": canonical(spec.engine.resources.shm_size)},
        },
    ]
    return volumes + ([lora_volume(review)] if spec.lora else [])


def _liveness_probe(review: Review, probe: dict[str, Any]) -> dict[str, Any]:
    """Restart an engine that has not answered /health for 90 s; killed sooner than a drain (api/drains)."""
    liveness = {**probe, "periodSeconds": 15, "failureThreshold": 6, "timeoutSeconds": 10}
    grace = engine_hung_grace_seconds(review.resource.spec)
    return liveness if grace is None else {**liveness, "terminationGracePeriodSeconds": grace}


def _container(review: Review) -> dict[str, Any]:
    spec = review.resource.spec
    e = spec.engine
    gpus = review.plan.gpus_per_replica
    startup = startup_seconds(review)
    # As the API server stores them, so that the Deployment read back matches (api/quantity.py).
    cpu, memory = canonical(e.resources.cpu), canonical(e.resources.memory)
    disk = ephemeral_storage(review)
    probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}}
    return {
        "name": "vllm",
        "image": e.image or DEFAULT_ENGINE_IMAGE,
        "command": list(ENGINE_COMMAND),
        "args": engine_args(spec, review.plan),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "env": _env(review),
        "resources": {
            "requests": {
                "cpu": cpu,
                "memory": memory,
                spec.gpu.resource_name: str(gpus),
                "ephemeral-storage": disk,
            },
            "limits": {"memory": memory, spec.gpu.resource_name: str(gpus), "ephemeral-storage": disk},
        },
        "volumeMounts": [
            {"name": "model-cache", "mountPath": MODEL_CACHE_PATH},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "startupProbe": {
            **probe,
            "periodSeconds": STARTUP_PROBE_PERIOD,
            "failureThreshold": math.ceil(startup / STARTUP_PROBE_PERIOD),
            "timeoutSeconds": 5,
        },
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5},
        "livenessProbe": _liveness_probe(review, probe),
        # Leave the gateway time to stop routing here before vLLM starts refusing requests.
        "lifecycle": {"preStop": {"sleep": {"seconds": ENGINE_PRESTOP_SECONDS}}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }


def build_engine_deployment(
    review: Review, rollout: Rollout, operator_image: str = versions.OPERATOR_IMAGE
) -> dict[str, Any]:
    """The engine Deployment; `operator_image` runs the lora-sync sidecar (spec.lora)."""
    qd = review.resource
    spec = qd.spec
    engine = _container(review)
    containers = [engine]
    if spec.lora:  # loads the adapters of the lora ConfigMap into the running engine (manifests/lora.py)
        containers.append(lora_sidecar(review, engine["env"], engine["volumeMounts"][0], operator_image))
    pod_spec: dict[str, Any] = {
        "containers": containers,
        "volumes": _volumes(review),
        "terminationGracePeriodSeconds": spec.engine.termination_grace_period_seconds,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # The restricted Pod Security Standard but for one rule, runAsNonRoot: vllm/vllm-openai has no
        # USER and is built for root; vLLM, Triton and FlashInfer write their caches under $HOME/.cache,
        # and another uid (no passwd entry in the image) gets HOME=/, which it cannot write. Baseline
        # admits this pod (docs/security.md).
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        **NodePool.of(spec.gpu).pod_scheduling(),
    }
    if spec.engine.priority_class_name:
        pod_spec["priorityClassName"] = spec.engine.priority_class_name
    if spec.gpu.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.gpu.runtime_class_name
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(qd, names.engine(qd), "engine"),
        "spec": {
            "selector": {"matchLabels": names.selector(qd, "engine")},
            "strategy": rollout.strategy(),
            # A 32B model takes minutes to become ready; do not call the rollout stuck before that.
            "progressDeadlineSeconds": startup_seconds(review) + 600,
            "template": {
                "metadata": {"labels": names.labels(qd, "engine")},
                "spec": pod_spec,
            },
        },
    }
    annotations = body["metadata"]["annotations"] = {ROLLOUT_ANNOTATION: rollout.describe()}
    if spec.autoscaling is None:
        body["spec"]["replicas"] = spec.effective_replicas
    else:  # the HPA owns replicas: never write the field (reconcile.py hands it over first)
        annotations[names.REPLICAS_OWNER_ANNOTATION] = "autoscaler"
    return body


def hands_replicas_over(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """True when applying `desired` (an engine Deployment) would drop a spec.replicas the operator set
    itself: autoscaling was just turned on (or the Deployment predates the annotation)."""
    if live is None or desired["kind"] != "Deployment" or "replicas" in desired["spec"]:
        return False
    if desired["metadata"].get("annotations", {}).get(names.REPLICAS_OWNER_ANNOTATION) != "autoscaler":
        return False
    owner = (live["metadata"].get("annotations") or {}).get(names.REPLICAS_OWNER_ANNOTATION)
    return owner != "autoscaler" and live.get("spec", {}).get("replicas") is not None


def replicas_floor(review: Review, desired: dict[str, Any], live: dict[str, Any] | None) -> int | None:
    """The replicas an engine Deployment at zero must be lifted to before its HPA can scale it, else None.

    Kubernetes' HPA does nothing while its target has 0 replicas (ScalingActive False, ScalingDisabled),
    and 0 is where KEDA leaves the engines of a deployment at zero. So when the spec moves from KEDA at
    zero to the HPA driver, nothing but the operator would ever start an engine. KEDA itself lifts a
    target below its minReplicaCount, so only the HPA driver needs this.
    """
    a = review.resource.spec.autoscaling
    if a is None or a.driver != "hpa" or live is None or desired["kind"] != "Deployment":
        return None
    if desired["metadata"]["name"] != names.engine(review.resource):
        return None
    return a.min_replicas if live.get("spec", {}).get("replicas") == 0 else None


def build_engine_service(review: Review) -> dict[str, Any]:
    """Headless Service: per-pod DNS for discovery, and the scrape target for engine metrics and, with
    spec.lora, for the lora-sync sidecars' (a ServiceMonitor endpoint names a port of the Service)."""
    qd = review.resource
    ports = [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}]
    if qd.spec.lora:
        ports.append({"name": LORA_PORT, "port": SIDECAR_PORT, "targetPort": LORA_PORT, "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(qd, names.engine(qd), "engine"),
        "spec": {"clusterIP": "None", "selector": names.selector(qd, "engine"), "ports": ports},
    }
