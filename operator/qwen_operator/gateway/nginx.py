"""nginx.conf and the nginx container's entry script, rendered from the Jinja templates beside it."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import jinja2

from .. import names
from ..api.review import Review
from ..clientapis import APIS, ROUTES
from .access import BODY_BUFFER, UNREAD_BODY, AccessGroup, access_groups
from .errors import (
    ACTIVATOR_UNAVAILABLE,
    INVALID_API_KEY,
    NO_ENGINE,
    OVERLOADED,
    ROUTER_BODY_ERRORS,
    ROUTER_UNAVAILABLE,
    STORED_RESPONSE_FIELDS,
    STORED_RESPONSE_ROUTE,
    TIER_NO_ENGINE,
    UNKNOWN_URL,
    UNSUPPORTED_MEDIA_TYPE,
    GatewayError,
    nginx_errors,
    queue_timeout,
    stored_response_refusal,
)
from .holding import hold_read_timeout, models_at_zero
from .limits import Limits
from .tiers import routing_data, tier_routes
from .wiring import POD, Wiring

#: One event loop proxies thousands of requests per second, far more than a gateway pod's engines serve;
#: a second one made no difference on simulated engines and was behind where cores were scarce
#: (bench/gateway_profile_bench.py --cpu; docs/gateway.md "What the gateway costs").
NGINX_WORKERS = 1
#: Access-log writes: a block of lines at a time, never held longer than the flush time.
LOG_BUFFER = "16k"
LOG_FLUSH = "1s"
#: run-nginx.sh rotates the exporter's access log above this size (one old file kept until the next).
ACCESS_LOG_ROTATE_BYTES = 32 * 1024 * 1024
#: sizeLimit of its emptyDir: two files of that size and what one check interval adds.
ACCESS_LOG_SIZE_LIMIT = "96Mi"
#: Debian's libnginx-mod-http-js (njs): the queue timeout's body, and spec.gateway.modelAccess's rules.
NJS_MODULE = "/usr/lib/nginx/modules/ngx_http_js_module.so"
#: Retry-After of a queue timeout, seconds: the queue was full for queueTimeoutSeconds already, so a
#: retry at once would most likely wait again; as the overloaded 503's.
QUEUE_TIMEOUT_RETRY_AFTER = 1
MAX_BODY = "16m"
#: MAX_BODY for people, in the 413 error.
MAX_BODY_TEXT = "16 MiB"
RELOAD_INTERVAL_SECONDS = 5
#: Buckets of conversation names (nginx split_clients, in steps of 0.1%): enough that engines get even
#: shares of them, few enough to keep nginx.conf small.
SESSION_BUCKETS = 1000


def map_key(value: str) -> str:
    """`value` as a literal source value of an nginx map, inside double quotes: backslashes and quotes
    escaped, and a leading `~` (a regular expression) or a special parameter name escaped with a backslash."""
    text = value.replace("\\", "\\\\").replace('"', '\\"')
    if text.startswith("~") or text in ("default", "hostnames", "include", "volatile"):
        text = "\\" + text
    return text


def map_regex(pattern: str) -> str:
    """`pattern` as a regular expression of an nginx map inside double quotes, after its `~`."""
    return pattern.replace("\\", "\\\\").replace('"', '\\"')


#: Model names used as they are for the `model` label of the gateway's metrics (nginx would expand a `$`).
_PLAIN_LABEL = re.compile(r"^[A-Za-z0-9._:/@+-]{1,128}$")


def model_label(name: str) -> str:
    """The `model` label of requests for `name` (a served name outside _PLAIN_LABEL is labeled `base`;
    adapter names always qualify)."""
    return name if _PLAIN_LABEL.match(name) else "base"


#: nginx's default map_hash_bucket_size, its CPU's cache line.
_MAP_BUCKET = 64


def map_hash_bucket_size(keys: list[str]) -> int | None:
    """map_hash_bucket_size for maps keyed by these strings (model names, key ids), None where nginx's
    default fits: a bucket must hold the longest key's element (a pointer, then its length and bytes
    aligned to a pointer: ngx_hash.h NGX_HASH_ELT_SIZE) and an end pointer; past 46 bytes nginx refuses
    the configuration. Above it, room for two such keys, in whole cache lines."""
    longest = max((len(k.encode()) for k in keys), default=0)
    element = 8 + -(-(longest + 2) // 8) * 8
    if element + 8 <= _MAP_BUCKET:
        return None
    return -(-(2 * element + 8) // _MAP_BUCKET) * _MAP_BUCKET


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("qwen_operator.gateway", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # nginx and shell text, not HTML
    )


#: nginx.conf's proxy target of this deployment's router, the request's URI kept.
_ROUTER = "vllm_router$uri$is_args$args"


def _access_values(access: list[AccessGroup]) -> list[dict[str, Any]]:
    """nginx.conf's view of spec.gateway.modelAccess: each access group's keys, the map entries of its
    allowed `<group>|<model>` pairs (an empty model is the base model's), and its 403."""
    groups = []
    for group in access:
        allowed = [*group.models, *([""] if group.base_allowed else [])]
        groups.append(
            {
                "id": group.id,
                "api_keys": [map_key(k) for k in group.keys],
                "allowed": [map_regex(f"^{re.escape(group.id + '|' + m)}$") for m in allowed],
                "denied": group.denied(),
            }
        )
    return groups


def _template_values(review: Review, wiring: Wiring, limits: Limits) -> dict[str, Any]:
    qd = review.resource
    g = qd.spec.gateway
    own_errors = nginx_errors(MAX_BODY_TEXT)
    access = access_groups(qd.spec)
    tiers = tier_routes(review, wiring)
    rate_limited = GatewayError(
        429, 429, "rate_limit_exceeded", limits.rate_limited_message(), type="requests"
    )
    return {
        "deployment": f"{qd.metadata.namespace}/{qd.metadata.name}",
        "auth": names.api_keys_secret(qd) is not None,
        "engine_key": names.engine_key(qd) is not None,
        "lora": qd.spec.lora is not None,
        "served_model": map_key(qd.spec.served_model_name),
        "model_labels": [(map_key(m), model_label(m)) for m in qd.spec.routable_names],
        "map_hash_bucket_size": map_hash_bucket_size(
            [*qd.spec.routable_names, *(k for group in access for k in group.keys)]
        ),
        "access_groups": _access_values(access),
        # The request's model is read from its body (njs): for limited keys, tiers and aliases.
        "body_routing": bool(access or tiers),
        "tier_routes": tiers,
        "aliases": bool(g.aliases),
        # A limited key's request allowed by its model: then by the model its alias picked, if any.
        "allowed_target": "$picked_model_target" if g.aliases else "$routed_target" if tiers else _ROUTER,
        "routed_target": "$routed_target" if tiers else _ROUTER,
        "tier_limits": any(t.rate for t in tiers),
        "tier_and_alias_names": [map_key(n) for n in (*qd.spec.tier_names, *qd.spec.alias_names)],
        "routing_json": json.dumps(routing_data(qd.spec), sort_keys=True),
        # An engine's refused request is asked again where it went first (a tier's, too).
        "replay_target": "$model_target" if tiers else _ROUTER,
        "access_models_json": json.dumps({g.id: g.models for g in access}, sort_keys=True),
        "unread_body": UNREAD_BODY,
        "njs_module": NJS_MODULE,
        # a JavaScript string literal (templates/errors.js)
        "queue_timeout_json": json.dumps(
            {api: queue_timeout(g.queue_timeout_seconds).text(api) for api in APIS}, sort_keys=True
        ),
        "stored_response_fields_json": json.dumps(list(STORED_RESPONSE_FIELDS)),
        "queue_timeout_retry_after": QUEUE_TIMEOUT_RETRY_AFTER,
        "worker_processes": NGINX_WORKERS,
        # each proxied request holds a client and an upstream connection
        "worker_connections": max(4096, 4 * limits.in_flight),
        "request_timeout": review.plan.request_timeout_seconds,
        "hold": qd.spec.scales_to_zero,
        "hold_read_timeout": hold_read_timeout(review),
        "models_at_zero": models_at_zero(review) if qd.spec.scales_to_zero else None,
        "drain": review.plan.gateway_drain_seconds,
        "connect_timeout": g.connect_timeout_seconds,
        "rate_per_minute": limits.rate_per_minute,
        "burst": limits.burst,
        "retry_after": limits.retry_after,
        "in_flight": limits.in_flight,
        "routes": ROUTES,
        "apis": APIS,
        # The errors nginx answers itself, by name ($error_<name>), each in both APIs' shapes.
        "error_maps": {
            **{f"status_{e.status}": e for e in own_errors},
            "invalid_api_key": INVALID_API_KEY,
            "unknown_url": UNKNOWN_URL,
            "invalid_json": ROUTER_BODY_ERRORS[0],
            "invalid_request_body": ROUTER_BODY_ERRORS[1],
            "unsupported_media_type": UNSUPPORTED_MEDIA_TYPE,
            "rate_limited": rate_limited,
            "overloaded": OVERLOADED,
            "no_engine": TIER_NO_ENGINE if tiers else NO_ENGINE,
            **({"activator_unavailable": ACTIVATOR_UNAVAILABLE} if qd.spec.scales_to_zero else {}),
            "router_unavailable": ROUTER_UNAVAILABLE,
            "stored_response_route": STORED_RESPONSE_ROUTE,
        },
        "stored_response_refusals": {f: stored_response_refusal(f) for f in STORED_RESPONSE_FIELDS},
        # Where a completion goes: by its model where keys are limited or tiers route, else the router.
        "completion_target": "$model_target" if access or tiers else _ROUTER,
        "max_body": MAX_BODY,
        "body_buffer": BODY_BUFFER,
        "log_buffer": LOG_BUFFER,
        "log_flush": LOG_FLUSH,
        "log_rotate_bytes": ACCESS_LOG_ROTATE_BYTES,
        "reload_interval": RELOAD_INTERVAL_SECONDS,
        "session_buckets": SESSION_BUCKETS,
        "session_bucket_percent": f"{100 / SESSION_BUCKETS:g}",
        "nginx_errors": own_errors,
    }


def _render(template: str, review: Review, wiring: Wiring, limits: Limits | None) -> str:
    values = _template_values(review, wiring, limits or Limits.of(review))
    return _templates().get_template(template).render(c=values, w=wiring)


def nginx_conf(review: Review, wiring: Wiring = POD, limits: Limits | None = None) -> str:
    """nginx.conf of the gateway."""
    return _render("nginx.conf.j2", review, wiring, limits)


def run_nginx_script(review: Review, wiring: Wiring = POD, limits: Limits | None = None) -> str:
    """Entry point of the nginx container: renders keys, runs nginx, reloads it when a Secret changes."""
    return _render("run-nginx.sh.j2", review, wiring, limits)


def errors_script(review: Review, wiring: Wiring = POD, limits: Limits | None = None) -> str:
    """njs module of nginx.conf: the body of vllm-router's queue timeout (its 408 has none)."""
    return _render("errors.js.j2", review, wiring, limits)


def model_access_script(review: Review, wiring: Wiring = POD, limits: Limits | None = None) -> str:
    """njs module of nginx.conf: a limited API key's requested model, and its /v1/models list."""
    return _render("model-access.js.j2", review, wiring, limits)
