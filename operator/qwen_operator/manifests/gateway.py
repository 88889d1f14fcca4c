"""The gateway pod and what it needs to run: ServiceAccount, Role and RoleBinding (vllm-router watches
the engine pods), the ConfigMap with its configuration, and the Deployment.

The configuration itself (nginx.conf, router arguments, exporter configs) comes from one
`GatewayConfig` in `qwen_operator.gateway`; the containers take their ports and paths from the same
wiring, so what the pod mounts and exposes is what the configuration listens on.
"""

from __future__ import annotations

from typing import Any

from .. import names, versions
from ..api.drains import gateway_grace_seconds
from ..api.review import Review
from ..gateway import (
    ACCESS_LOG_SIZE_LIMIT,
    ACTIVATOR_METRICS_PORT,
    GATEWAY_METRICS_PORTS,
    SERVICE_ACCOUNT_DIR,
    GatewayConfig,
    router_env,
)
from ..gateway.config import LOG_EXPORTER_CONF, RUN_NGINX
from ..gateway.router import ENGINE_KEY_ENV, tier_engine_key_env
from .meta import metadata

RUN_AS = 10001  # the gateway image's user; the exporters run as it too
#: Time for the Service to stop sending new connections to a terminating pod before nginx drains.
DRAIN_DELAY_SECONDS = 5

__all__ = ["GATEWAY_METRICS_PORTS", "build_gateway", "tier_metrics_port_name"]


def gateway_image(review: Review) -> str:
    return review.resource.spec.gateway.image or versions.GATEWAY_IMAGE


def _restricted() -> dict[str, Any]:
    """Container securityContext of the restricted Pod Security Standard, with a read-only root."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _resources(cpu: str, memory: str, memory_limit: str) -> dict[str, Any]:
    # No CPU limit: throttling a proxy adds latency to every request.
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory_limit}}


def _nginx_container(review: Review, config: GatewayConfig) -> dict[str, Any]:
    w = config.wiring
    mounts = [
        {"name": "config", "mountPath": w.config_dir, "readOnly": True},
        {"name": "state", "mountPath": w.state_dir},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "access-log", "mountPath": w.log_dir},
    ]
    if names.api_keys_secret(review.resource):
        mounts.append({"name": "api-keys", "mountPath": w.api_keys_dir, "readOnly": True})
    if names.engine_key(review.resource):
        mounts.append({"name": "engine-key", "mountPath": w.engine_key_dir, "readOnly": True})
    for i in range(len(review.resource.spec.gateway.tiers)):
        directory = w.tier_engine_key_file(i).rsplit("/", 1)[0]
        mounts.append({"name": f"tier{i}-engine-key", "mountPath": directory, "readOnly": True})
    return {
        "name": "nginx",
        "image": gateway_image(review),
        "command": ["/bin/sh", f"{w.config_dir}/{RUN_NGINX}"],
        "ports": [
            {"name": "http", "containerPort": w.http_port, "protocol": "TCP"},
            {"name": "status", "containerPort": w.status_port, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "status"},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "status"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        # Let the Service drop this pod before nginx stops accepting; then SIGTERM drains in-flight.
        "lifecycle": {"preStop": {"sleep": {"seconds": DRAIN_DELAY_SECONDS}}},
        "resources": _resources("100m", "64Mi", "512Mi"),
        "securityContext": _restricted(),
        "volumeMounts": mounts,
    }


def tier_metrics_port_name(tier: int) -> str:
    """The container port of spec.gateway.tiers[tier]'s vllm-router metrics (the PodMonitor names it)."""
    return f"tier{tier}-metrics"


def _router_engine_key(review: Review, tier: int | None) -> list[dict[str, Any]]:
    """The engine key vllm-router sends itself on the routes it forwards without nginx's headers
    (gateway/router.py, ENGINE_KEY_ENV), from the Secret nginx reads it from; read at start, as the
    engines read theirs."""
    qd = review.resource
    if tier is None:
        ref = names.engine_key(qd)
        if ref is None:
            return []
        return [{"name": ENGINE_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]
    ref = names.tier_engine_key(qd.spec.gateway.tiers[tier])
    # A tier whose engines require no key has no such Secret.
    optional = {"name": ref.name, "key": ref.key, "optional": True}
    return [{"name": tier_engine_key_env(tier), "valueFrom": {"secretKeyRef": optional}}]


def _router_container(review: Review, config: GatewayConfig, tier: int | None = None) -> dict[str, Any]:
    """The router of this deployment's engines, or (tier i) of spec.gateway.tiers[i]'s."""
    w = config.wiring
    timeout = review.plan.gateway_drain_seconds + DRAIN_DELAY_SECONDS
    # Keep routing until nginx has drained its in-flight streams (nginx removes its pid file on exit).
    wait_for_nginx = (
        "import os, time\n"
        f"deadline = time.monotonic() + {timeout}\n"
        f"while os.path.exists('{w.state_dir}/nginx.pid') and time.monotonic() < deadline:\n"
        "    time.sleep(1)\n"
    )
    port_name = "router-metrics" if tier is None else tier_metrics_port_name(tier)
    port = w.router_metrics_port if tier is None else w.tier_metrics_port(tier)
    return {
        "name": "router" if tier is None else f"router-tier{tier}",
        "image": gateway_image(review),
        "command": ["vllm-router"],
        "args": config.router_args if tier is None else config.tier_router_args[tier],
        "env": [
            {"name": "NO_COLOR", "value": "1"},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            *({"name": k, "value": v} for k, v in router_env().items()),
            *_router_engine_key(review, tier),
        ],
        "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
        "livenessProbe": {
            "tcpSocket": {"port": port_name},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", wait_for_nginx]}}},
        "resources": _resources("200m", "256Mi", "1Gi"),
        "securityContext": _restricted(),
        "volumeMounts": [
            {"name": "state", "mountPath": w.state_dir, "readOnly": True},
            # Only this container gets API credentials: it lists and watches the engine pods.
            {"name": "kube-api-access", "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True},
        ],
    }


def _exporter_containers(config: GatewayConfig) -> list[dict[str, Any]]:
    w = config.wiring
    probe = {"periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3}
    return [
        {
            "name": "log-exporter",
            "image": versions.LOG_EXPORTER_IMAGE,
            "args": ["-config-file", f"{w.config_dir}/{LOG_EXPORTER_CONF}"],
            "ports": [{"name": "metrics", "containerPort": w.log_metrics_port, "protocol": "TCP"}],
            "livenessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"}, **probe},
            "resources": _resources("20m", "32Mi", "256Mi"),
            "securityContext": _restricted(),
            "volumeMounts": [
                {"name": "config", "mountPath": w.config_dir, "readOnly": True},
                {"name": "access-log", "mountPath": w.log_dir, "readOnly": True},
            ],
        },
        {
            "name": "nginx-exporter",
            "image": versions.NGINX_EXPORTER_IMAGE,
            "args": config.nginx_exporter_args,
            "ports": [{"name": "nginx-metrics", "containerPort": w.nginx_metrics_port, "protocol": "TCP"}],
            "livenessProbe": {"httpGet": {"path": "/metrics", "port": "nginx-metrics"}, **probe},
            "resources": _resources("10m", "16Mi", "64Mi"),
            "securityContext": _restricted(),
        },
    ]


#: The gateway container that holds requests at zero; the reconcile looks for it in the gateway's pods.
ACTIVATOR = "activator"


def _activator_containers(config: GatewayConfig, operator_image: str) -> list[dict[str, Any]]:
    """`qwen-operator activator` (the operator's image), only with autoscaling.minReplicas 0: holds the
    requests that arrive while no engine is ready. No volume, no credentials: nginx and the router are
    on loopback."""
    if config.activator_args is None:
        return []
    w = config.wiring
    return [
        {
            "name": ACTIVATOR,
            "image": operator_image,
            "command": ["qwen-operator"],
            "args": config.activator_args,
            "ports": [
                {"name": ACTIVATOR_METRICS_PORT, "containerPort": w.activator_metrics_port, "protocol": "TCP"}
            ],
            "livenessProbe": {
                "httpGet": {"path": "/healthz", "port": ACTIVATOR_METRICS_PORT},
                "periodSeconds": 20,
                "timeoutSeconds": 5,
                "failureThreshold": 3,
            },
            "resources": _resources("20m", "64Mi", "256Mi"),
            "securityContext": _restricted(),
        }
    ]


def _volumes(review: Review, config: GatewayConfig) -> list[dict[str, Any]]:
    qd = review.resource
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.gateway(qd), "defaultMode": 0o444}},
        {"name": "state", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        # The exporter's access log: at most two files of ACCESS_LOG_ROTATE_BYTES and what one check
        # interval adds.
        {"name": "access-log", "emptyDir": {"sizeLimit": ACCESS_LOG_SIZE_LIMIT}},
        {
            "name": "kube-api-access",
            "projected": {
                "defaultMode": 0o444,
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                        }
                    },
                ],
            },
        },
    ]
    keys = names.api_keys_secret(qd)
    if keys:
        # Mounted as files (not env) so that kubelet updates them in place and nginx reloads.
        volumes.append({"name": "api-keys", "secret": {"secretName": keys, "defaultMode": 0o440}})
    ref = names.engine_key(qd)
    if ref:
        volumes.append(
            {
                "name": "engine-key",
                "secret": {
                    "secretName": ref.name,
                    "items": [{"key": ref.key, "path": config.wiring.engine_key_name}],
                    "defaultMode": 0o440,
                },
            }
        )
    for i, tier in enumerate(qd.spec.gateway.tiers):
        tier_key = names.tier_engine_key(tier)
        volumes.append(
            {
                "name": f"tier{i}-engine-key",
                "secret": {
                    "secretName": tier_key.name,
                    "items": [{"key": tier_key.key, "path": "token"}],
                    "defaultMode": 0o440,
                    # A tier whose engines require no key has no such Secret.
                    "optional": True,
                },
            }
        )
    return volumes


def _affinity(review: Review) -> dict[str, Any]:
    qd = review.resource
    return {
        # Gateway pods on different nodes, so one node failure leaves the endpoint up.
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": names.selector(qd, "gateway")},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        },
        # A proxy needs no GPU: prefer nodes without one, keeping GPU nodes for engines.
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "preference": {
                        "matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]
                    },
                }
            ]
        },
    }


def build_gateway_deployment(
    review: Review, config: GatewayConfig, operator_image: str = versions.OPERATOR_IMAGE
) -> dict[str, Any]:
    qd = review.resource
    g = qd.spec.gateway
    pod_spec: dict[str, Any] = {
        "serviceAccountName": names.gateway(qd),
        "automountServiceAccountToken": False,  # mounted into the router container only
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # Streams in flight run for the drain time after nginx stops accepting (api/drains.py).
        "terminationGracePeriodSeconds": gateway_grace_seconds(qd.spec, review.plan.request_timeout_seconds),
        "affinity": _affinity(review),
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": names.selector(qd, "gateway")},
            }
        ],
        "containers": [
            _nginx_container(review, config),
            _router_container(review, config),
            *(_router_container(review, config, i) for i in range(len(g.tiers))),
            *_exporter_containers(config),
            *_activator_containers(config, operator_image),
        ],
        "volumes": _volumes(review, config),
    }
    if qd.spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in qd.spec.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(qd, names.gateway(qd), "gateway"),
        "spec": {
            "replicas": g.replicas,
            "selector": {"matchLabels": names.selector(qd, "gateway")},
            # Gateway pods are cheap: add the new one before removing an old one.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": {**names.labels(qd, "gateway"), **names.fronting_labels(qd)},
                    "annotations": {f"{names.LABEL_PREFIX}/config-hash": config.hash},
                },
                "spec": pod_spec,
            },
        },
    }


def build_gateway_rbac(review: Review) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding: vllm-router lists and watches pods in this namespace."""
    qd = review.resource
    name = names.gateway(qd)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(qd, name, "gateway"),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(qd, name, "gateway"),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(qd, name, "gateway"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": qd.metadata.namespace}],
        },
    ]


def build_gateway_config_map(review: Review, config: GatewayConfig) -> dict[str, Any]:
    qd = review.resource
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(qd, names.gateway(qd), "gateway"),
        "data": dict(config.files),
    }


def build_gateway(
    review: Review, config: GatewayConfig | None = None, operator_image: str = versions.OPERATOR_IMAGE
) -> list[dict[str, Any]]:
    """The gateway pod's objects in apply order; [] when the gateway is off.

    `config` is the pod's GatewayConfig when the caller already rendered it (one render per reconcile);
    `operator_image` runs the activator (autoscaling.minReplicas 0).
    """
    if not review.resource.spec.gateway.enabled:
        return []
    config = config or GatewayConfig.of(review)
    return [
        *build_gateway_rbac(review),
        build_gateway_config_map(review, config),
        build_gateway_deployment(review, config, operator_image),
    ]


#: The key id in a generated API-key Secret (its file name in the gateway; the access log's key_id).
GENERATED_KEY_ID = "default"


def generated_engine_key_secret(review: Review, key: str) -> dict[str, Any] | None:
    """The engine-key Secret the operator creates once when the gateway is on and the spec names none;
    else None. Created like the API-key Secret (never applied, never overwritten, owned by the
    QwenDeployment): the engines require the key and only the gateway pods mount it, so a pod that
    reaches an engine some other way still gets 401 on the OpenAI routes (the NetworkPolicy is the guard
    of the rest: docs/security.md)."""
    qd = review.resource
    if qd.spec.engine.api_key_secret or not qd.spec.gateway.enabled:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(qd, names.generated_engine_key(qd), "engine"),
        "type": "Opaque",
        "stringData": {names.GENERATED_ENGINE_KEY: key},
    }


def generated_api_keys_secret(review: Review, key: str) -> dict[str, Any] | None:
    """The API-key Secret the operator creates once, when auth is on and no Secret is named; else None.

    Created (never applied, never overwritten) with a random `key` the caller draws: owned by the
    QwenDeployment, so it goes with it; a user may edit or replace its keys, the operator never reads it.
    """
    qd = review.resource
    g = qd.spec.gateway
    if not g.enabled or g.auth == "none" or g.api_keys_secret:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(qd, names.generated_api_keys(qd), "gateway"),
        "type": "Opaque",
        "stringData": {GENERATED_KEY_ID: key},
    }
