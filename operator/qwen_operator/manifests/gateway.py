"""The client-facing gateway: nginx (API keys, per-key limits, logs) in front of vllm-router (routing).

One gateway pod runs four containers and no code of this project in the request path:
  nginx            API keys from a Secret (reloaded gracefully on change), per-key limit_req, a hard
                   in-flight cap, OpenAI routes only, unbuffered streaming, JSON access logs;
  vllm-router      on loopback: routing policy, Kubernetes discovery of the engine pods, retries before
                   the first byte, circuit breaker, health checks, bounded admission queue;
  log exporter     prometheus-nginxlog-exporter turns the access log (loopback syslog) into per-key
                   request, error, throttle and latency metrics;
  nginx exporter   nginx-prometheus-exporter: connections and in-flight requests from stub_status.

Every piece of configuration is a pure function of the reviewed resource and a `Wiring` (ports and
paths), so tests run the very same nginx.conf, entry script and router command line on loopback.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2
import yaml

from ..api.engine import ENGINE_PORT
from ..api.review import Review
from ..api.spec import QwenDeployment
from . import names
from .meta import metadata

ROUTER_VERSION = "0.1.17"
NGINX_VERSION = "1.22.1"
#: nginx and vllm-router in one image (images/gateway/Dockerfile), the versions the tests run.
DEFAULT_GATEWAY_IMAGE = f"ghcr.io/qwenops/qwen-gateway:{ROUTER_VERSION}-nginx{NGINX_VERSION}"
LOG_EXPORTER_IMAGE = "quay.io/martinhelmich/prometheus-nginxlog-exporter:v1.11.0"
NGINX_EXPORTER_IMAGE = "docker.io/nginx/nginx-prometheus-exporter:1.4.0"

#: Routes clients may call; everything else (engine admin routes included) gets a JSON 404.
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models")
#: Named container ports Prometheus scrapes (the PodMonitor lists them).
GATEWAY_METRICS_PORTS = ("metrics", "router-metrics", "nginx-metrics")
#: Prefix of the per-key metrics made from the access log.
LOG_METRICS_NAMESPACE = "qwen_gateway"
SYSLOG_TAG = "qwen_gateway"
RUN_AS = 10001  # the gateway image's user; the exporters run as it too
MAX_BODY = "16m"
BODY_BUFFER = "1m"
RELOAD_INTERVAL_SECONDS = 5
#: Time for the Service to stop sending new connections to a terminating pod before nginx drains.
DRAIN_DELAY_SECONDS = 5
#: Where Kubernetes clients (vllm-router's kube-rs) look for the in-cluster credentials.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]


@dataclass(frozen=True)
class Wiring:
    """Ports and paths of the gateway's parts. Defaults are the pod's; tests pass free loopback ports,
    temporary directories and static engine URLs (instead of Kubernetes discovery)."""

    #: Address of every listener reached from outside the pod (client port, probes, metrics); empty
    #: means all IPv4 addresses. The router itself always listens on loopback only.
    bind_host: str = ""
    http_port: int = 8080
    status_port: int = 8081
    router_host: str = "127.0.0.1"
    router_port: int = 8090
    router_metrics_port: int = 29000
    syslog_port: int = 5531
    log_metrics_port: int = 4040
    nginx_metrics_port: int = 9113
    config_dir: str = "/etc/qwen-gateway"
    api_keys_dir: str = "/var/run/secrets/qwen-gateway/api-keys"
    engine_key_file: str = "/var/run/secrets/qwen-gateway/engine-key/token"
    state_dir: str = "/var/run/qwen-gateway"
    temp_dir: str = "/tmp/nginx"
    #: Engines to route to; empty means Kubernetes discovery of the engine pods (the in-cluster case).
    worker_urls: tuple[str, ...] = ()


POD = Wiring()


# --- limits ----------------------------------------------------------------------------------------


def _per_pod(total: int, replicas: int) -> int:
    """Each gateway pod enforces its share, so the whole gateway never admits more than the spec says."""
    return math.ceil(total / replicas)


@dataclass(frozen=True)
class Limits:
    """The spec's gateway-wide limits as one pod enforces them."""

    rate_per_minute: int
    burst: int
    retry_after: int
    max_concurrent: int
    queue_size: int
    in_flight: int

    @staticmethod
    def of(review: Review) -> Limits:
        g = review.resource.spec.gateway
        rate = _per_pod(g.rate_limit.requests_per_minute, g.replicas)
        concurrent = _per_pod(g.max_concurrent_requests, g.replicas)
        queue = _per_pod(g.queue_size, g.replicas)
        return Limits(
            rate_per_minute=rate,
            burst=_per_pod(g.rate_limit.burst, g.replicas),
            retry_after=max(1, math.ceil(60 / rate)),  # time for one request's worth to refill
            max_concurrent=concurrent,
            queue_size=queue,
            in_flight=concurrent + queue,
        )


# --- vllm-router -----------------------------------------------------------------------------------


def balance_abs_threshold(review: Review) -> int:
    """In-flight difference between engines above which cache_aware stops following prefixes.

    vllm-router's default (64) is a quarter of vLLM's default batch (256 sequences); keep that ratio
    for the engine's real batch size, so small batches do not pile onto one engine.
    """
    return max(2, review.resource.spec.engine.max_num_seqs // 4)


def router_args(review: Review, wiring: Wiring = POD) -> list[str]:
    """vllm-router's command line (after the program name)."""
    qd = review.resource
    g = qd.spec.gateway
    limits = Limits.of(review)
    args = [
        "--host", wiring.router_host,
        "--port", str(wiring.router_port),
        "--policy", g.policy,
    ]  # fmt: skip
    if wiring.worker_urls:
        args += ["--worker-urls", *wiring.worker_urls]
    else:
        args += [
            "--service-discovery",
            "--selector", *(f"{k}={v}" for k, v in names.selector(qd, "engine").items()),
            "--service-discovery-namespace", qd.metadata.namespace,
            "--service-discovery-port", str(ENGINE_PORT),
        ]  # fmt: skip
    args += [
        "--prometheus-host", wiring.bind_host or "0.0.0.0",
        "--prometheus-port", str(wiring.router_metrics_port),
        # Long generations are not cut short; nginx uses the same budget.
        "--request-timeout-secs", str(g.request_timeout_seconds),
        # Admission: a token bucket of this pod's share of the slots, then a bounded wait queue.
        "--max-concurrent-requests", str(limits.max_concurrent),
        "--queue-size", str(limits.queue_size),
        "--queue-timeout-secs", str(g.queue_timeout_seconds),
        # A failed attempt (refused, reset, 5xx before any byte) moves to another engine.
        "--retry-max-retries", "3",
        "--retry-initial-backoff-ms", "50",
        "--retry-max-backoff-ms", "1000",
        # An engine that fails three times in a row gets no traffic for 10 s, then one probe request.
        "--cb-failure-threshold", "3",
        "--cb-success-threshold", "1",
        "--cb-timeout-duration-secs", "10",
        # Health checks catch engines that stop answering without failing requests first.
        "--health-check-interval-secs", "5",
        "--health-check-timeout-secs", "5",
        "--health-failure-threshold", "2",
        "--health-success-threshold", "1",
        "--balance-abs-threshold", str(balance_abs_threshold(review)),
        # Prefix tree budget per engine (characters); bounds router memory with many engines.
        "--max-tree-size", str(8 * 1024 * 1024),
        "--request-id-headers", "x-request-id",
        "--log-level", "info",
    ]  # fmt: skip
    return args


# --- nginx and its entry script ----------------------------------------------------------------------


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("qwen_operator.manifests", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # nginx and shell text, not HTML
    )


def _template_values(review: Review) -> dict[str, Any]:
    qd = review.resource
    g = qd.spec.gateway
    limits = Limits.of(review)
    return {
        "deployment": f"{qd.metadata.namespace}/{qd.metadata.name}",
        "auth": g.api_keys_secret is not None,
        "engine_key": qd.spec.engine.api_key_secret is not None,
        "worker_processes": 2,
        # each proxied request holds a client and an upstream connection
        "worker_connections": max(4096, 4 * limits.in_flight),
        "request_timeout": g.request_timeout_seconds,
        "connect_timeout": g.connect_timeout_seconds,
        "rate_per_minute": limits.rate_per_minute,
        "spec_rate_per_minute": g.rate_limit.requests_per_minute,
        "burst": limits.burst,
        "retry_after": limits.retry_after,
        "in_flight": limits.in_flight,
        "routes": OPENAI_ROUTES,
        "max_body": MAX_BODY,
        "body_buffer": BODY_BUFFER,
        "syslog_tag": SYSLOG_TAG,
        "reload_interval": RELOAD_INTERVAL_SECONDS,
    }


def nginx_conf(review: Review, wiring: Wiring = POD) -> str:
    """nginx.conf of the gateway pod."""
    return _templates().get_template("nginx.conf.j2").render(c=_template_values(review), w=wiring)


def run_nginx_script(review: Review, wiring: Wiring = POD) -> str:
    """Entry point of the nginx container: renders keys, runs nginx, reloads it when a Secret changes."""
    return _templates().get_template("run-nginx.sh.j2").render(c=_template_values(review), w=wiring)


def log_exporter_config(review: Review, wiring: Wiring = POD) -> str:
    """prometheus-nginxlog-exporter's configuration: per-key metrics from the JSON access log."""
    config = {
        "listen": {
            "address": wiring.bind_host or "0.0.0.0",
            "port": wiring.log_metrics_port,
            "metrics_endpoint": "/metrics",
        },
        "namespaces": [
            {
                "name": LOG_METRICS_NAMESPACE,
                "parser": "json",
                "source": {
                    "syslog": {
                        "listen_address": f"udp://127.0.0.1:{wiring.syslog_port}",
                        "format": "rfc3164",
                        "tags": [SYSLOG_TAG],
                    }
                },
                # Bounded label values: key ids come from the Secret, routes and errors from nginx maps.
                "relabel_configs": [
                    {"target_label": "key_id", "from": "key_id"},
                    {"target_label": "route", "from": "route"},
                    {"target_label": "error", "from": "error"},
                ],
                "histogram_buckets": LATENCY_BUCKETS,
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def nginx_exporter_args(wiring: Wiring = POD) -> list[str]:
    return [
        f"--nginx.scrape-uri=http://127.0.0.1:{wiring.status_port}/stub_status",
        f"--web.listen-address={wiring.bind_host}:{wiring.nginx_metrics_port}",
    ]


def config_files(review: Review, wiring: Wiring = POD) -> dict[str, str]:
    """The ConfigMap's files (mounted at wiring.config_dir)."""
    return {
        "nginx.conf": nginx_conf(review, wiring),
        "run-nginx.sh": run_nginx_script(review, wiring),
        "nginxlog-exporter.yml": log_exporter_config(review, wiring),
    }


# --- Kubernetes objects ------------------------------------------------------------------------------


def gateway_image(review: Review) -> str:
    return review.resource.spec.gateway.image or DEFAULT_GATEWAY_IMAGE


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


def _nginx_container(review: Review) -> dict[str, Any]:
    w = POD
    mounts = [
        {"name": "config", "mountPath": w.config_dir, "readOnly": True},
        {"name": "state", "mountPath": w.state_dir},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if review.resource.spec.gateway.api_keys_secret:
        mounts.append({"name": "api-keys", "mountPath": w.api_keys_dir, "readOnly": True})
    if review.resource.spec.engine.api_key_secret:
        mounts.append({"name": "engine-key", "mountPath": _dirname(w.engine_key_file), "readOnly": True})
    return {
        "name": "nginx",
        "image": gateway_image(review),
        "command": ["/bin/sh", f"{w.config_dir}/run-nginx.sh"],
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


def _router_container(review: Review) -> dict[str, Any]:
    w = POD
    timeout = review.resource.spec.gateway.request_timeout_seconds + DRAIN_DELAY_SECONDS
    # Keep routing until nginx has drained its in-flight streams (nginx removes its pid file on exit).
    wait_for_nginx = (
        "import os, time\n"
        f"deadline = time.monotonic() + {timeout}\n"
        f"while os.path.exists('{w.state_dir}/nginx.pid') and time.monotonic() < deadline:\n"
        "    time.sleep(1)\n"
    )
    return {
        "name": "router",
        "image": gateway_image(review),
        "command": ["vllm-router"],
        "args": router_args(review),
        "env": [{"name": "NO_COLOR", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "ports": [{"name": "router-metrics", "containerPort": w.router_metrics_port, "protocol": "TCP"}],
        "livenessProbe": {
            "tcpSocket": {"port": "router-metrics"},
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


def _exporter_containers() -> list[dict[str, Any]]:
    w = POD
    probe = {"periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3}
    return [
        {
            "name": "log-exporter",
            "image": LOG_EXPORTER_IMAGE,
            "args": ["-config-file", f"{w.config_dir}/nginxlog-exporter.yml"],
            "ports": [{"name": "metrics", "containerPort": w.log_metrics_port, "protocol": "TCP"}],
            "livenessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"}, **probe},
            "resources": _resources("20m", "32Mi", "256Mi"),
            "securityContext": _restricted(),
            "volumeMounts": [{"name": "config", "mountPath": w.config_dir, "readOnly": True}],
        },
        {
            "name": "nginx-exporter",
            "image": NGINX_EXPORTER_IMAGE,
            "args": nginx_exporter_args(w),
            "ports": [{"name": "nginx-metrics", "containerPort": w.nginx_metrics_port, "protocol": "TCP"}],
            "livenessProbe": {"httpGet": {"path": "/metrics", "port": "nginx-metrics"}, **probe},
            "resources": _resources("10m", "16Mi", "64Mi"),
            "securityContext": _restricted(),
        },
    ]


def _dirname(path: str) -> str:
    return path.rsplit("/", 1)[0]


def _volumes(review: Review) -> list[dict[str, Any]]:
    qd = review.resource
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": names.gateway(qd), "defaultMode": 0o444}},
        {"name": "state", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
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
    if qd.spec.gateway.api_keys_secret:
        # Mounted as files (not env) so that kubelet updates them in place and nginx reloads.
        volumes.append(
            {
                "name": "api-keys",
                "secret": {"secretName": qd.spec.gateway.api_keys_secret, "defaultMode": 0o440},
            }
        )
    ref = qd.spec.engine.api_key_secret
    if ref:
        volumes.append(
            {
                "name": "engine-key",
                "secret": {
                    "secretName": ref.name,
                    "items": [{"key": ref.key, "path": POD.engine_key_file.rsplit("/", 1)[1]}],
                    "defaultMode": 0o440,
                },
            }
        )
    return volumes


def _item(key: str) -> dict[str, str]:
    return {"key": key, "path": key}


def _affinity(qd: QwenDeployment) -> dict[str, Any]:
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


def config_hash(review: Review) -> str:
    """Changes with the ConfigMap, so a new configuration rolls the gateway pods."""
    data = json.dumps(config_files(review), sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def build_gateway_deployment(review: Review) -> dict[str, Any]:
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
        # Streams in flight may run up to the request timeout after nginx stops accepting.
        "terminationGracePeriodSeconds": g.request_timeout_seconds + DRAIN_DELAY_SECONDS + 10,
        "affinity": _affinity(qd),
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": names.selector(qd, "gateway")},
            }
        ],
        "containers": [_nginx_container(review), _router_container(review), *_exporter_containers()],
        "volumes": _volumes(review),
    }
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
                    "labels": names.labels(qd, "gateway"),
                    "annotations": {f"{names.LABEL_PREFIX}/config-hash": config_hash(review)},
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


def build_gateway_config_map(review: Review) -> dict[str, Any]:
    qd = review.resource
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(qd, names.gateway(qd), "gateway"),
        "data": config_files(review),
    }


def build_ingress(review: Review) -> dict[str, Any]:
    qd = review.resource
    ing = qd.spec.gateway.ingress
    assert ing is not None
    meta = metadata(qd, names.gateway(qd), "gateway")
    if ing.annotations:
        meta["annotations"] = dict(ing.annotations)
    spec: dict[str, Any] = {
        "rules": [
            {
                "host": ing.host,
                "http": {
                    "paths": [
                        {
                            "path": "/v1",
                            "pathType": "Prefix",
                            "backend": {
                                "service": {"name": names.client_service(qd), "port": {"name": "http"}}
                            },
                        }
                    ]
                },
            }
        ]
    }
    if ing.class_name:
        spec["ingressClassName"] = ing.class_name
    if ing.tls_secret_name:
        spec["tls"] = [{"hosts": [ing.host], "secretName": ing.tls_secret_name}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": spec}


def build_http_route(review: Review) -> dict[str, Any]:
    qd = review.resource
    g = qd.spec.gateway
    route = g.http_route
    assert route is not None
    spec: dict[str, Any] = {
        "parentRefs": list(route.parent_refs),
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                "backendRefs": [{"name": names.client_service(qd), "port": g.service.port}],
                # Gateway implementations default to short timeouts; streams may run this long.
                "timeouts": {"request": f"{g.request_timeout_seconds}s"},
            }
        ],
    }
    if route.hostnames:
        spec["hostnames"] = list(route.hostnames)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": metadata(qd, names.gateway(qd), "gateway"),
        "spec": spec,
    }


def build_gateway(review: Review) -> list[dict[str, Any]]:
    """The gateway's objects in apply order (the client Service is build_client_service); [] when off."""
    g = review.resource.spec.gateway
    if not g.enabled:
        return []
    objects = [
        *build_gateway_rbac(review),
        build_gateway_config_map(review),
        build_gateway_deployment(review),
    ]
    if g.ingress:
        objects.append(build_ingress(review))
    if g.http_route:
        objects.append(build_http_route(review))
    return objects


def build_client_service(review: Review) -> dict[str, Any]:
    """The Service clients call (named like the resource): the gateway pods, or the engines when off."""
    qd = review.resource
    g = qd.spec.gateway
    component = "gateway" if g.enabled else "engine"
    meta = metadata(qd, names.client_service(qd), component)
    if g.service.annotations:
        meta["annotations"] = dict(g.service.annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": g.service.type,
            "selector": names.selector(qd, component),
            # Both the gateway's nginx and the engine name their serving port "http".
            "ports": [{"name": "http", "port": g.service.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
