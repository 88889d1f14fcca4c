"""vllm-router's command line: routing policy, engine discovery, admission, retries, health checks."""

from __future__ import annotations

from .. import names
from ..api.engine import ENGINE_PORT
from ..api.review import Review
from .limits import Limits
from .wiring import POD, Wiring


def balance_abs_threshold(review: Review) -> int:
    """In-flight difference between engines above which cache_aware stops following prefixes.

    vllm-router's default (64) is a quarter of vLLM's default batch (256 sequences); keep that ratio
    for the engine's real batch size, so small batches do not pile onto one engine.
    """
    return max(2, review.resource.spec.engine.max_num_seqs // 4)


#: The environment variables of the engine keys vllm-router sends itself (`--api-key`, expanded from
#: `$(NAME)` by the kubelet): on the routes it forwards by its transparent proxy (/v1/responses,
#: /v1/messages, /v1/messages/count_tokens) vllm-router 0.1.17 passes on none of the request's own
#: headers, so not the engine key nginx sets either (measured: only Content-Type, Accept, Host and
#: Content-Length arrive). Chat and completions keep nginx's Authorization.
ENGINE_KEY_ENV = "QWEN_ENGINE_API_KEY"


def tier_engine_key_env(i: int) -> str:
    """The variable of spec.gateway.tiers[i]'s engine key (its Secret is optional: no key, no variable)."""
    return f"QWEN_TIER{i}_ENGINE_API_KEY"


#: vllm-router's log filter (tracing's EnvFilter syntax): info, but its policies only from warn up, as
#: consistent_hash and power_of_two log every request's routing key and choice at info.
ROUTER_LOG_FILTER = "info,vllm_router_rs::policies=warn"


def router_env() -> dict[str, str]:
    """Environment of the vllm-router process (whatever the resource: the log filter above)."""
    return {"RUST_LOG": ROUTER_LOG_FILTER}


def router_args(review: Review, wiring: Wiring = POD, limits: Limits | None = None) -> list[str]:
    """vllm-router's command line (after the program name): the router of this deployment's engines."""
    qd = review.resource
    limits = limits or Limits.of(review)
    return _args(
        review,
        port=wiring.router_port,
        metrics_port=wiring.router_metrics_port,
        wiring=wiring,
        worker_urls=wiring.worker_urls,
        engines=qd.metadata.name,
        admission=(limits.max_concurrent, limits.queue_size),
        engine_key_env=ENGINE_KEY_ENV if names.engine_key(qd) else None,
    )


def tier_router_args(review: Review, i: int, wiring: Wiring = POD) -> list[str]:
    """The command line of the router of spec.gateway.tiers[i]: the tier's engine pods (discovered by
    their labels, like this deployment's), its own admission limits, whose refusal is its saturation."""
    tier = review.resource.spec.gateway.tiers[i]
    return _args(
        review,
        port=wiring.tier_router_port(i),
        metrics_port=wiring.tier_metrics_port(i),
        wiring=wiring,
        worker_urls=wiring.tier_worker_urls[i] if wiring.tier_worker_urls else (),
        engines=tier.deployment_ref.name,
        admission=(tier.max_concurrent_requests, tier.queue_size),
        engine_key_env=tier_engine_key_env(i),
    )


def _args(
    review: Review,
    *,
    port: int,
    metrics_port: int,
    wiring: Wiring,
    worker_urls: tuple[str, ...],
    engines: str,
    admission: tuple[int, int],
    engine_key_env: str | None,
) -> list[str]:
    qd = review.resource
    g = qd.spec.gateway
    max_concurrent, queue_size = admission
    args = [
        "--host", wiring.router_host,
        "--port", str(port),
        "--policy", g.policy,
    ]  # fmt: skip
    if worker_urls:
        args += ["--worker-urls", *worker_urls]
    elif wiring.discover_engines:
        args += [
            "--service-discovery",
            "--selector", *(f"{k}={v}" for k, v in names.selector_of(engines, "engine").items()),
            "--service-discovery-namespace", qd.metadata.namespace,
            "--service-discovery-port", str(ENGINE_PORT),
        ]  # fmt: skip
    args += [
        "--prometheus-host", wiring.bind_host or "0.0.0.0",
        "--prometheus-port", str(metrics_port),
        # Long generations are not cut short; nginx uses the same budget.
        "--request-timeout-secs", str(review.plan.request_timeout_seconds),
        # Admission: a token bucket of this pod's share of the slots, then a bounded wait queue.
        "--max-concurrent-requests", str(max_concurrent),
        "--queue-size", str(queue_size),
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
    if engine_key_env:
        # One argument with `=`: a key may begin with "-" (a generated one does, one time in 32), which
        # argparse would take for an option after a separate --api-key.
        args.append(f"--api-key=$({engine_key_env})")
    return args
