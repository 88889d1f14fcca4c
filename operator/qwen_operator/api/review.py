"""One entry point for everything offline: parse, plan, check extraArgs, render the command line.

The CLI (`plan`, `render`) and the operator call the same function, so a resource that passes
`qwen-operator plan` in CI is exactly one the operator will accept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .catalog import GIB
from .coldstart import Holding, check_scale_to_zero, holding
from .engine import check_extra_args, command_line
from .plan import Plan, make_plan
from .pool import NodePool
from .queueing import Queueing, check_pass_through, check_rate_split, check_routing, queueing
from .spec import QwenDeployment, parse


@dataclass
class Review:
    """A parsed resource, its capacity plan and, when it fits, its engine command line."""

    resource: QwenDeployment
    plan: Plan
    command: list[str]

    @property
    def ok(self) -> bool:
        return self.plan.fits

    @property
    def config_problems(self) -> list[str]:
        """`path: message` of each rule the spec breaks (ConfigValid=False)."""
        return [f"{path}: {message}" for path, message in self.plan.config_errors]

    @property
    def capacity_problems(self) -> list[str]:
        """`path: message` of each way the spec does not fit its GPU pool (CapacityFit=False)."""
        return [f"{path}: {message}" for path, message in self.plan.capacity_errors]

    # Values derived from the spec and the plan, computed once per review: every reader gets the same.
    @cached_property
    def holding(self) -> Holding | None:
        """The request-holding bounds of autoscaling.minReplicas 0 (None above 0)."""
        return holding(self.resource.spec, self.plan)

    @cached_property
    def queueing(self) -> Queueing:
        """Where requests wait: the engines' batch and waiting room, the target queue depth."""
        return queueing(self.resource.spec, self.plan)

    def plan_dict(self) -> dict[str, Any]:
        """The plan as published in `status.plan` and printed by `qwen-operator plan -o json`."""
        p = self.plan
        return {
            "fits": p.fits,
            "model": p.model,
            "gpu": p.gpu,
            "nodeSelection": NodePool.of(self.resource.spec.gpu).selection,
            "tensorParallelSize": p.tensor_parallel_size,
            "pipelineParallelSize": p.pipeline_parallel_size,
            "gpusPerReplica": p.gpus_per_replica,
            "quantization": p.quantization or "none",
            "kvCacheDtype": p.kv_cache_dtype,
            "weightsGiBPerGpu": round(p.weights_bytes_per_gpu / GIB, 2),
            "kvCacheGiBPerGpu": round(p.kv_budget_bytes_per_gpu / GIB, 2),
            "runtimeGiBPerGpu": round(p.runtime.total_bytes / GIB, 2) if p.runtime else None,
            "loraGiBPerGpu": round(p.lora.total_bytes / GIB, 2) if p.lora else None,
            "kvBytesPerToken": p.kv_bytes_per_token,
            "kvTokensPerReplica": p.kv_tokens_per_replica,
            "maxModelLen": p.max_model_len,
            "maxConcurrentAtMaxModelLen": p.max_concurrent_at_max_model_len,
            "yarnFactor": p.yarn.factor if p.yarn else None,
            "prefillStepSeconds": (
                None if p.prefill_step_seconds is None else round(p.prefill_step_seconds, 2)
            ),
            "requestTimeoutSeconds": p.request_timeout_seconds,
            "drainSeconds": {"engine": p.engine_drain_seconds, "gateway": p.gateway_drain_seconds},
            **({"scaleToZero": h.as_dict()} if (h := self.holding) else {}),
            "engineArgs": self.command,
            "warnings": [f"{path}: {msg}" for path, msg in p.warnings],
            "errors": [f"{path}: {msg}" for path, msg in p.errors],
        }


def review(body: dict[str, Any]) -> Review:
    """Parse and plan a QwenDeployment body; raises SpecError when it does not parse."""
    resource = parse(body)
    plan = make_plan(resource.spec)
    check_pass_through(resource.spec, plan)
    check_routing(resource.spec, plan)
    check_rate_split(resource.spec, plan)
    check_scale_to_zero(resource.spec, plan)
    for path, message in check_extra_args(resource.spec.engine.extra_args):
        plan.invalid(path, message)
    command = command_line(resource.spec, plan) if plan.fits else []
    return Review(resource=resource, plan=plan, command=command)
