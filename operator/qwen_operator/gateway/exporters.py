"""Configuration of the two metric exporters beside nginx: per-key metrics from the access log, and
connections/in-flight requests from nginx's stub_status."""

from __future__ import annotations

import yaml

from .wiring import Wiring

#: Prefix of the per-key metrics made from the access log.
LOG_METRICS_NAMESPACE = "qwen_gateway"
LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]


def log_exporter_config(wiring: Wiring) -> str:
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
                # Tailed (polled every 250 ms, reopened when run-nginx.sh rotates it).
                "source": {"files": [wiring.access_log]},
                # Bounded label values: key ids come from the Secret, routes and errors from nginx maps.
                "relabel_configs": [
                    {"target_label": "key_id", "from": "key_id"},
                    {"target_label": "route", "from": "route"},
                    {"target_label": "error", "from": "error"},
                    # the base model, an adapter or `other` (nginx.conf's $model_label)
                    {"target_label": "model", "from": "model_label"},
                ],
                "histogram_buckets": LATENCY_BUCKETS,
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def nginx_exporter_args(wiring: Wiring) -> list[str]:
    """nginx-prometheus-exporter's command line."""
    return [
        f"--nginx.scrape-uri=http://127.0.0.1:{wiring.status_port}/stub_status",
        f"--web.listen-address={wiring.bind_host}:{wiring.nginx_metrics_port}",
    ]
