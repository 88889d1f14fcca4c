"""Everything one gateway runs with, rendered once: the builders and the tests take it from here."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..api.review import Review
from .exporters import log_exporter_config, nginx_exporter_args
from .holding import activator_args
from .limits import Limits
from .nginx import errors_script, model_access_script, nginx_conf, run_nginx_script
from .router import router_args, tier_router_args
from .wiring import POD, Wiring

#: File names in the gateway's ConfigMap (mounted at wiring.config_dir).
NGINX_CONF = "nginx.conf"
RUN_NGINX = "run-nginx.sh"
LOG_EXPORTER_CONF = "nginxlog-exporter.yml"
#: njs modules of nginx.conf: the queue timeout's body; the model rules (spec.gateway.modelAccess, tiers,
#: aliases only).
ERRORS_JS = "errors.js"
MODEL_ACCESS_JS = "model-access.js"


@dataclass(frozen=True)
class GatewayConfig:
    """The gateway's configuration for one reviewed resource and one wiring."""

    wiring: Wiring
    limits: Limits
    #: ConfigMap files: nginx.conf, the nginx entry script, the log exporter's config.
    files: dict[str, str]
    router_args: list[str]
    #: The command line of each tier's router (spec.gateway.tiers, in order).
    tier_router_args: list[list[str]]
    nginx_exporter_args: list[str]
    #: `qwen-operator activator ...` (autoscaling.minReplicas 0), else None: no activator container.
    activator_args: list[str] | None

    @staticmethod
    def of(review: Review, wiring: Wiring = POD) -> GatewayConfig:
        limits = Limits.of(review)
        files = {
            NGINX_CONF: nginx_conf(review, wiring, limits),
            RUN_NGINX: run_nginx_script(review, wiring, limits),
            LOG_EXPORTER_CONF: log_exporter_config(wiring),
            ERRORS_JS: errors_script(review, wiring, limits),
        }
        g = review.resource.spec.gateway
        if g.model_access or g.tiers or g.aliases:
            files[MODEL_ACCESS_JS] = model_access_script(review, wiring, limits)
        return GatewayConfig(
            wiring=wiring,
            limits=limits,
            files=files,
            router_args=router_args(review, wiring, limits),
            tier_router_args=[tier_router_args(review, i, wiring) for i in range(len(g.tiers))],
            nginx_exporter_args=nginx_exporter_args(wiring),
            activator_args=activator_args(review, wiring),
        )

    @property
    def hash(self) -> str:
        """Changes with the ConfigMap, so a new configuration rolls the gateway pods."""
        return hashlib.sha256(json.dumps(self.files, sort_keys=True).encode()).hexdigest()[:16]


def config_files(review: Review, wiring: Wiring = POD) -> dict[str, str]:
    """The ConfigMap's files for `wiring` (tests render them for loopback)."""
    return GatewayConfig.of(review, wiring).files
