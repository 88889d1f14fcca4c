"""The gateway's process configuration: what nginx, vllm-router and the two exporters run with.

One gateway pod runs four containers and no code of this project in the request path:
  nginx            API keys from a Secret (reloaded gracefully on change), per-key limit_req, a hard
                   in-flight cap, the OpenAI and Anthropic routes only (errors in each API's shape),
                   unbuffered streaming, JSON access logs;
  vllm-router      on loopback: routing policy, Kubernetes discovery of the engine pods, retries before
                   the first byte, circuit breaker, health checks, bounded admission queue;
  log exporter     prometheus-nginxlog-exporter turns the access log (a file it tails) into per-key
                   request, error, throttle and latency metrics;
  nginx exporter   nginx-prometheus-exporter: connections and in-flight requests from stub_status;
  activator        only with autoscaling.minReplicas 0: holds the requests the router answers 503 for
                   want of a ready engine, until one is ready (qwen_operator.activator; the operator's
                   image). While engines serve, no request reaches it.

Everything here is a pure function of the reviewed resource and a `Wiring` (ports and paths), so tests
run the very same nginx.conf, entry script and router command line on loopback. The pod that runs it
is built in `qwen_operator.manifests.gateway` from one `GatewayConfig`.
"""

from .config import GatewayConfig, config_files
from .exporters import LATENCY_BUCKETS, LOG_METRICS_NAMESPACE, log_exporter_config, nginx_exporter_args
from .holding import activator_args
from .limits import Limits
from .nginx import ACCESS_LOG_SIZE_LIMIT, nginx_conf, run_nginx_script
from .router import balance_abs_threshold, router_args, router_env, tier_router_args
from .wiring import ACTIVATOR_METRICS_PORT, GATEWAY_METRICS_PORTS, POD, SERVICE_ACCOUNT_DIR, Wiring

__all__ = [
    "ACCESS_LOG_SIZE_LIMIT",
    "ACTIVATOR_METRICS_PORT",
    "GATEWAY_METRICS_PORTS",
    "LATENCY_BUCKETS",
    "LOG_METRICS_NAMESPACE",
    "POD",
    "SERVICE_ACCOUNT_DIR",
    "GatewayConfig",
    "Limits",
    "Wiring",
    "activator_args",
    "balance_abs_threshold",
    "config_files",
    "log_exporter_config",
    "nginx_conf",
    "nginx_exporter_args",
    "router_args",
    "router_env",
    "run_nginx_script",
    "tier_router_args",
]
