"""How long a terminating engine or gateway pod keeps serving what it has in flight.

A pod terminates on every rollout, scale-in, eviction and node drain. Kubernetes runs its preStop hook,
sends SIGTERM, and kills it `terminationGracePeriodSeconds` after the hook began. Each pod here drains
inside that bound, so a drain never holds a node longer than the pod spec says:

engine
    preStop sleeps ENGINE_PRESTOP_SECONDS while the router, which drops a pod as soon as it is deleted,
    stops sending it requests. Then SIGTERM: vLLM 0.32 stops taking requests and lets the running ones
    finish for `--shutdown-timeout` seconds (its default, 0, aborts them all at once), which is the grace
    period less the preStop and EXIT_MARGIN_SECONDS to exit. A request still running then is aborted.
gateway
    preStop sleeps (manifests/gateway.py DRAIN_DELAY_SECONDS) while the Service drops the pod; then
    nginx stops accepting and finishes its streams. The grace period is the drain time plus those
    seconds; the drain time is `spec.gateway.terminationGracePeriodSeconds` less them, by default the
    request timeout capped at GATEWAY_DRAIN_CAP_SECONDS, so that one gateway pod cannot hold a node drain
    for the two hours a 128K-token request may take.

A hung engine is different: the kubelet kills it once its liveness probe has failed, and a process that
answers nothing drains nothing. That kill waits ENGINE_HUNG_GRACE_SECONDS (the liveness probe's own
terminationGracePeriodSeconds), not the drain's grace period, so that a wedged engine gives its GPUs back
in seconds.

Requests that arrive at a draining pod are not lost: the router retries a request another engine can
take before its response starts, and clients reach other gateway pods through the Service.
"""

from __future__ import annotations

from .spec import QwenDeploymentSpec

#: The engine's preStop sleep: time for the router to drop a deleted pod before vLLM stops.
ENGINE_PRESTOP_SECONDS = 10
#: Left of the engine's grace period after vLLM's drain, for it to exit before SIGKILL.
EXIT_MARGIN_SECONDS = 5
#: How long the kubelet waits to kill an engine whose liveness probe failed: the preStop sleep, then SIGTERM,
#: then SIGKILL after the rest (the liveness probe's terminationGracePeriodSeconds; never longer than the
#: pod's own grace period).
ENGINE_HUNG_GRACE_SECONDS = 30
#: The gateway's preStop sleep (the Service drops the pod) plus the time nginx and the router take to exit.
GATEWAY_STOP_SECONDS = 15
#: The default gateway drain: the request timeout, at most this.
GATEWAY_DRAIN_CAP_SECONDS = 600


def engine_drain_seconds(spec: QwenDeploymentSpec) -> int:
    """vLLM's --shutdown-timeout: what the engine's grace period leaves after preStop and exit."""
    grace = spec.engine.termination_grace_period_seconds
    return max(0, grace - ENGINE_PRESTOP_SECONDS - EXIT_MARGIN_SECONDS)


def engine_hung_grace_seconds(spec: QwenDeploymentSpec) -> int | None:
    """The liveness probe's terminationGracePeriodSeconds; None (the pod's) when that is no longer."""
    grace = spec.engine.termination_grace_period_seconds
    return ENGINE_HUNG_GRACE_SECONDS if grace > ENGINE_HUNG_GRACE_SECONDS else None


def gateway_grace_seconds(spec: QwenDeploymentSpec, request_timeout: int) -> int:
    """The gateway pods' terminationGracePeriodSeconds: the spec's, else the capped drain plus stop time."""
    if spec.gateway.termination_grace_period_seconds is not None:
        return spec.gateway.termination_grace_period_seconds
    return min(request_timeout, GATEWAY_DRAIN_CAP_SECONDS) + GATEWAY_STOP_SECONDS


def gateway_drain_seconds(spec: QwenDeploymentSpec, request_timeout: int) -> int:
    """How long a terminating gateway pod finishes its streams (never longer than the request timeout)."""
    return min(request_timeout, max(0, gateway_grace_seconds(spec, request_timeout) - GATEWAY_STOP_SECONDS))
