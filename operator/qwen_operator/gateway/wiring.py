"""Ports and paths that connect the gateway's processes: the pod's, or free loopback ones in tests."""

from __future__ import annotations

from dataclasses import dataclass

#: Where Kubernetes clients (vllm-router's kube-rs) look for the in-cluster credentials.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Named container ports Prometheus scrapes (the PodMonitor lists them): log exporter, router, nginx.
GATEWAY_METRICS_PORTS = ("metrics", "router-metrics", "nginx-metrics")
#: The activator's named port (/metrics, /scale), in the pod only with autoscaling.minReplicas 0.
ACTIVATOR_METRICS_PORT = "activator"
#: Ports of the tiers' routers in the pod (spec.gateway.tiers[i]: + i), loopback only, and their metrics.
TIER_ROUTER_PORT = 8100
TIER_METRICS_PORT = 29010


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
    log_metrics_port: int = 4040
    nginx_metrics_port: int = 9113
    #: The activator (autoscaling.minReplicas 0): held requests from nginx on loopback, and its /metrics
    #: and /scale (KEDA's metrics-api scaler) on the pod's address.
    activator_port: int = 8092
    activator_metrics_port: int = 9114
    config_dir: str = "/etc/qwen-gateway"
    api_keys_dir: str = "/var/run/secrets/qwen-gateway/api-keys"
    engine_key_file: str = "/var/run/secrets/qwen-gateway/engine-key/token"
    state_dir: str = "/var/run/qwen-gateway"
    temp_dir: str = "/tmp/nginx"
    #: nginx writes the log exporter's copy of the access log here; the exporter tails it.
    log_dir: str = "/var/log/qwen-gateway"
    #: Engines to route to; empty means Kubernetes discovery of the engine pods (the in-cluster case).
    worker_urls: tuple[str, ...] = ()
    #: False (tests): no discovery either; engines join through the router's add_worker, as discovery
    #: would add them (vllm-router waits at start-up for every static engine, so one that starts later
    #: cannot be static).
    discover_engines: bool = True

    #: Per tier (spec.gateway.tiers, in order): its router's port and metrics port; empty: the pod's,
    #: TIER_ROUTER_PORT + i and TIER_METRICS_PORT + i.
    tier_router_ports: tuple[int, ...] = ()
    tier_metrics_ports: tuple[int, ...] = ()
    #: Per tier: static engine URLs (tests); empty: Kubernetes discovery of the tier's engine pods.
    tier_worker_urls: tuple[tuple[str, ...], ...] = ()

    def tier_router_port(self, i: int) -> int:
        return self.tier_router_ports[i] if self.tier_router_ports else TIER_ROUTER_PORT + i

    def tier_metrics_port(self, i: int) -> int:
        return self.tier_metrics_ports[i] if self.tier_metrics_ports else TIER_METRICS_PORT + i

    def tier_engine_key_file(self, i: int) -> str:
        """Where tier i's engine key is mounted (spec.gateway.tiers[i].engineKeySecret)."""
        return f"{self.engine_key_dir.rsplit('/', 1)[0]}/tier-{i}-engine-key/token"

    @property
    def access_log(self) -> str:
        """The access log the log exporter reads (rotated by run-nginx.sh)."""
        return f"{self.log_dir}/access.log"

    @property
    def engine_key_dir(self) -> str:
        return self.engine_key_file.rsplit("/", 1)[0]

    @property
    def engine_key_name(self) -> str:
        return self.engine_key_file.rsplit("/", 1)[1]


#: The wiring inside the gateway pod.
POD = Wiring()
