"""How long an engine takes to start, two ways: the startup probe's budget (a ceiling, so that a slow
disk or registry never kills a pod mid-load) and the expected cold start (what the first request after
scale-to-zero waits), and the request-holding bounds of autoscaling.minReplicas 0 derived from them.

expected cold start = ENGINE_START_SECONDS + checkpoint files / MODEL_CACHE_READ_BYTES_PER_SECOND
    the weights are read from the model cache (already downloaded: a scale-up from zero reuses the
    cache's volume), then CUDA and NCCL initialise, torch.compile runs (its cache is lost with the pod),
    CUDA graphs are captured and the engine warms up. Pod scheduling and image pulls are not included:
    the image is assumed on the node, which a node that served the engine before keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .plan import Plan
from .spec import QwenDeploymentSpec

#: Start-up budget of the startup probe: fixed time for the image, CUDA graphs and warm-up, plus time per
#: GB of checkpoint files to download (about 100 MB/s) and load; a slow registry or disk should not kill
#: a pod mid-load.
STARTUP_BASE_SECONDS = 600
STARTUP_SECONDS_PER_GB = 10
#: A network-attached volume's sequential read (about 500 MB/s: cloud SSD persistent disks and NFS
#: caches); local NVMe reads several times faster, so this errs long.
MODEL_CACHE_READ_BYTES_PER_SECOND = 500e6
#: vLLM's start-up besides reading the weights, measured: vLLM 0.32 with the operator's engine command for
#: Qwen3-32B at TP 1 on an H100 80GB (tools/measure/gpu/results/2026-12-07-h100, dummy weights loaded
#: in 3.5 s) answered /health 174 s after the process started: 52 s of process start, imports and the
#: API server, then init engine 118 s (torch.compile without a cache 69 s, the rest of the memory
#: profile 3 s, KV cache and CUDA graph capture with its estimate's capture 21 s, warm-up). Weight reads
#: come on top (MODEL_CACHE_READ_BYTES_PER_SECOND, an estimate); TP 2 adds NCCL's set-up (not measured).
ENGINE_START_SECONDS = 170
#: The default hold bound is this many expected cold starts: a start slower than twice the estimate is
#: stuck or loading from a much slower cache, and the client is better told so (503, Retry-After).
HOLD_COLD_STARTS = 2
#: Retry-After of the activator's 503s: a retry this much later meets a waking engine sooner or later,
#: and OpenAI client libraries back off on their own as well.
HOLD_RETRY_AFTER_SECONDS = 10
#: The held-requests trigger's place among the ScaledObject's triggers (after the queue's). KEDA names the
#: external metric of trigger i `s<i>-<type>` in the HPA it makes, where the status reads the held count.
HELD_TRIGGER_INDEX = 1
KEDA_HELD_METRIC = f"s{HELD_TRIGGER_INDEX}-prometheus"


def startup_budget_seconds(spec: QwenDeploymentSpec, plan: Plan) -> int:
    """The startup probe's budget: engine.probes.startupSeconds, else from the checkpoint's size."""
    override = spec.engine.probes.startup_seconds
    if override:
        return override
    files_gb = plan.download_bytes / 1e9
    return STARTUP_BASE_SECONDS + math.ceil(files_gb * STARTUP_SECONDS_PER_GB)


def expected_cold_start_seconds(spec: QwenDeploymentSpec, plan: Plan) -> int:
    """What a replica started from zero takes to serve (module docstring), at most the probe budget."""
    load = plan.download_bytes / MODEL_CACHE_READ_BYTES_PER_SECOND
    return min(startup_budget_seconds(spec, plan), ENGINE_START_SECONDS + math.ceil(load))


@dataclass(frozen=True)
class Holding:
    """The bounds of the requests a scaled-to-zero deployment's gateway holds, with their defaults applied."""

    idle_seconds: int
    expected_cold_start_seconds: int
    #: Longest wait of one request for a ready engine.
    hold_seconds: int
    #: Requests the whole gateway holds at once, and one gateway pod's share of them.
    max_held_requests: int
    max_held_per_pod: int
    retry_after_seconds: int = HOLD_RETRY_AFTER_SECONDS

    def as_dict(self) -> dict[str, int]:
        return {
            "idleSeconds": self.idle_seconds,
            "expectedColdStartSeconds": self.expected_cold_start_seconds,
            "holdSeconds": self.hold_seconds,
            "maxHeldRequests": self.max_held_requests,
            "maxHeldPerGatewayPod": self.max_held_per_pod,
        }


def holding(spec: QwenDeploymentSpec, plan: Plan) -> Holding | None:
    """The holding bounds of autoscaling.minReplicas 0; None when the engines never go to zero."""
    if spec.autoscaling is None or not spec.scales_to_zero:
        return None
    z = spec.autoscaling.scale_to_zero
    cold = expected_cold_start_seconds(spec, plan)
    hold = z.hold_seconds
    if hold is None:
        hold = min(startup_budget_seconds(spec, plan), -(-HOLD_COLD_STARTS * cold // 60) * 60)
    held = z.max_held_requests or 2 * spec.engine.max_num_seqs
    return Holding(
        idle_seconds=z.idle_seconds,
        expected_cold_start_seconds=cold,
        hold_seconds=hold,
        max_held_requests=held,
        # Rounded up: a pod holds at least one request; the pods together may hold a few more than asked.
        max_held_per_pod=-(-held // spec.gateway.replicas),
    )


def check_scale_to_zero(spec: QwenDeploymentSpec, plan: Plan) -> None:
    """The plan's warning that the first request after an idle period waits a cold start."""
    h = holding(spec, plan)
    if h is None:
        return
    plan.warn(
        "spec.autoscaling.minReplicas",
        f"0: after {h.idle_seconds} s without requests no engine runs, and the first request waits about "
        f"{h.expected_cold_start_seconds} s for one to start (weights read from the model cache at "
        f"{MODEL_CACHE_READ_BYTES_PER_SECOND / 1e6:g} MB/s plus {ENGINE_START_SECONDS} s of engine start-up, "
        f"plus the scaler's reaction and pod scheduling); the gateway holds up to {h.max_held_requests} "
        f"requests for at most {h.hold_seconds} s each, then answers 503",
    )
    if h.hold_seconds < h.expected_cold_start_seconds:
        plan.warn(
            "spec.autoscaling.scaleToZero.holdSeconds",
            f"{h.hold_seconds} s is shorter than the expected cold start "
            f"({h.expected_cold_start_seconds} s): requests that arrive while no engine runs get 503 "
            "before one is ready",
        )
