"""Capacity planning: will this spec start on this GPU pool, and how much KV cache does a replica get?

First-order memory model per GPU, as vLLM allocates it at start-up:
    usable = GPU memory x gpuMemoryUtilization
    KV budget = usable - weights / TP - runtime overhead (activations, CUDA graphs, NCCL buffers)
A replica's KV tokens are the KV budget of its GPUs divided by the KV bytes of one token (each GPU
holds 1/TP of the KV heads). vLLM refuses to start when one sequence of maxModelLen does not fit,
so that is the fit criterion; everything that cannot start is an error here, before any object exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .catalog import (
    COMPATIBLE_QUANTIZATION,
    DRAFT_MODEL_BYTES,
    GIB,
    GPUS,
    MAX_CONTEXT,
    MODELS,
    NATIVE_CONTEXT,
    ONLINE_FP8_RATIO,
    GpuInfo,
    ModelInfo,
)
from .spec import QwenDeploymentSpec

#: Activation peak, CUDA graphs, NCCL and allocator slack per GPU for a 32B dense model.
RUNTIME_OVERHEAD_BYTES = int(5.5 * GIB)
#: Requests at full context below which the plan warns that long prompts will queue.
LOW_CONCURRENCY = 2


@dataclass(frozen=True)
class Yarn:
    """Rope scaling needed for a context longer than the native window."""

    factor: float
    original_max_position_embeddings: int


@dataclass
class Plan:
    """The capacity plan of one QwenDeployment; `errors` empty means it starts and fits."""

    model: str
    gpu: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpus_per_replica: int
    quantization: str | None
    kv_cache_dtype: str
    max_model_len: int
    weights_bytes_per_gpu: int = 0
    kv_bytes_per_token: int = 0
    kv_budget_bytes_per_gpu: int = 0
    kv_tokens_per_replica: int = 0
    max_concurrent_at_max_model_len: int = 0
    yarn: Yarn | None = None
    warnings: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.errors

    def error(self, path: str, message: str) -> None:
        self.errors.append((path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append((path, message))


def gib(n: float) -> str:
    # Two decimals: one hides real differences (36.01 GiB needed would read as the 36.0 GiB available).
    return f"{n / GIB:.2f} GiB"


def make_plan(spec: QwenDeploymentSpec) -> Plan:
    """Validate the spec against the model and GPU catalogs and compute the capacity plan."""
    engine, par = spec.engine, spec.parallelism
    gpu = GPUS[spec.gpu.type]
    plan = Plan(
        model=spec.model.name,
        gpu=gpu.type,
        tensor_parallel_size=par.tensor,
        pipeline_parallel_size=par.pipeline,
        gpus_per_replica=par.tensor * par.pipeline,
        quantization=None,
        kv_cache_dtype=engine.kv_cache_dtype,
        max_model_len=engine.max_model_len,
    )
    model = MODELS.get(spec.model.name)
    if model is None:
        plan.error("spec.model.name", f"unknown model {spec.model.name!r}; supported: {', '.join(MODELS)}")
        return plan
    _check_parallelism(plan, spec, model)
    _check_quantization(plan, spec, model, gpu)
    _check_context(plan, spec)
    _check_batching(plan, spec)
    _compute_memory(plan, spec, model, gpu)
    _check_speculative(plan, spec)
    return plan


def _check_parallelism(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo) -> None:
    tp, pp = spec.parallelism.tensor, spec.parallelism.pipeline
    heads, kv_heads = model.num_attention_heads, model.num_kv_heads
    if heads % tp or kv_heads % tp:
        valid = [n for n in range(1, kv_heads + 1) if heads % n == 0 and kv_heads % n == 0]
        plan.error(
            "spec.parallelism.tensor",
            f"tensor parallel size {tp} must divide the model's {heads} attention heads and {kv_heads} "
            f"KV heads; valid sizes: {', '.join(map(str, valid))}",
        )
    if pp > model.num_layers:
        plan.error("spec.parallelism.pipeline", f"{pp} stages exceed the model's {model.num_layers} layers")
    if tp * pp > spec.gpu.gpus_per_node:
        plan.error(
            "spec.parallelism",
            f"a replica needs {tp * pp} GPUs (tensor {tp} x pipeline {pp}) but a node of the pool has "
            f"{spec.gpu.gpus_per_node} (spec.gpu.gpusPerNode)",
        )


def _check_quantization(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo, gpu: GpuInfo) -> None:
    wanted = spec.engine.quantization
    stored = model.checkpoint_quantization
    quant = stored if wanted is None else (None if wanted == "none" else wanted)
    plan.quantization = quant
    if quant not in COMPATIBLE_QUANTIZATION[stored]:
        allowed = sorted(q or "none" for q in COMPATIBLE_QUANTIZATION[stored])
        plan.error(
            "spec.engine.quantization",
            f"{model.name} is stored as {stored or 'bf16'}; it can be served with {', '.join(allowed)}, "
            f"not {quant or 'none'} (use the matching checkpoint, e.g. Qwen/Qwen3-32B-AWQ for awq)",
        )
    if quant == "fp8" and not gpu.fp8_compute:
        plan.warn(
            "spec.engine.quantization",
            f"{gpu.type} ({gpu.architecture}) has no FP8 tensor cores: FP8 runs weight-only (Marlin), "
            "saving memory but usually slower than bf16",
        )
    if spec.engine.kv_cache_dtype == "fp8" and not gpu.fp8_compute:
        plan.error(
            "spec.engine.kvCacheDtype",
            f"fp8 KV cache needs FP8 hardware (Ada or Hopper); {gpu.type} is {gpu.architecture}: "
            "use auto, or an L40S/H100/H200 pool",
        )


def yarn_for(max_model_len: int) -> Yarn | None:
    """The smallest YaRN factor (2 or 4) covering max_model_len, or None within the native window."""
    if max_model_len <= NATIVE_CONTEXT:
        return None
    factor = 2.0 if max_model_len <= 2 * NATIVE_CONTEXT else 4.0
    return Yarn(factor=factor, original_max_position_embeddings=NATIVE_CONTEXT)


def _check_context(plan: Plan, spec: QwenDeploymentSpec) -> None:
    length = spec.engine.max_model_len
    if length > MAX_CONTEXT:
        plan.error(
            "spec.engine.maxModelLen",
            f"{length} exceeds {MAX_CONTEXT}, the longest context Qwen3 supports (YaRN factor 4)",
        )
        return
    plan.yarn = yarn_for(length)
    if plan.yarn:
        plan.warn(
            "spec.engine.maxModelLen",
            f"{length} > {NATIVE_CONTEXT}: YaRN factor {plan.yarn.factor:g} is applied to every request, "
            "which can lower quality on short texts; keep 32768 unless long inputs are needed",
        )


def _check_batching(plan: Plan, spec: QwenDeploymentSpec) -> None:
    e = spec.engine
    if not e.enable_chunked_prefill and e.max_num_batched_tokens < e.max_model_len:
        plan.error(
            "spec.engine.maxNumBatchedTokens",
            f"{e.max_num_batched_tokens} is below maxModelLen {e.max_model_len} with chunked prefill off: "
            "a full-length prompt could never be scheduled; raise it or enable chunked prefill",
        )
    if e.max_num_batched_tokens < e.max_num_seqs:
        plan.error(
            "spec.engine.maxNumBatchedTokens",
            f"{e.max_num_batched_tokens} is below maxNumSeqs {e.max_num_seqs}: every running request needs "
            "at least one token per step",
        )


def _weight_bytes(model: ModelInfo, quant: str | None) -> int:
    if model.checkpoint_quantization is None and quant == "fp8":
        return int(model.weight_bytes * ONLINE_FP8_RATIO)
    return model.weight_bytes


def _compute_memory(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo, gpu: GpuInfo) -> None:
    tp, pp = plan.tensor_parallel_size, plan.pipeline_parallel_size
    if plan.errors and any(p.startswith("spec.parallelism") for p, _ in plan.errors):
        return
    draft = _draft_bytes(spec)
    plan.weights_bytes_per_gpu = (_weight_bytes(model, plan.quantization) + draft) // (tp * pp)
    plan.kv_bytes_per_token = model.kv_bytes_per_token(1 if plan.kv_cache_dtype == "fp8" else 2)
    usable = int(gpu.memory_bytes * spec.engine.gpu_memory_utilization)
    budget = usable - plan.weights_bytes_per_gpu - RUNTIME_OVERHEAD_BYTES
    plan.kv_budget_bytes_per_gpu = max(budget, 0)
    # Each GPU holds 1/TP of the KV heads and 1/PP of the layers of every token.
    plan.kv_tokens_per_replica = plan.kv_budget_bytes_per_gpu * tp * pp // plan.kv_bytes_per_token
    plan.max_concurrent_at_max_model_len = plan.kv_tokens_per_replica // plan.max_model_len
    needed = plan.weights_bytes_per_gpu + RUNTIME_OVERHEAD_BYTES
    if budget <= 0:
        plan.error(
            "spec.gpu.type",
            f"weights need {gib(plan.weights_bytes_per_gpu)} per GPU plus {gib(RUNTIME_OVERHEAD_BYTES)} "
            f"runtime = {gib(needed)}, but {gpu.type} offers {gib(usable)} at gpuMemoryUtilization "
            f"{spec.engine.gpu_memory_utilization}; use more GPUs (spec.parallelism.tensor), a quantized "
            "checkpoint or a larger GPU",
        )
    elif plan.max_concurrent_at_max_model_len < 1:
        seq = plan.max_model_len * plan.kv_bytes_per_token
        plan.error(
            "spec.engine.maxModelLen",
            f"one {plan.max_model_len}-token sequence needs {gib(seq)} of KV cache but a replica has "
            f"{gib(plan.kv_budget_bytes_per_gpu * tp * pp)} ({plan.kv_tokens_per_replica} tokens) after "
            f"{gib(plan.weights_bytes_per_gpu)} of weights per GPU; lower maxModelLen, use kvCacheDtype fp8, "
            "more GPUs or a quantized checkpoint",
        )
    elif plan.max_concurrent_at_max_model_len < LOW_CONCURRENCY:
        plan.warn(
            "spec.engine.maxModelLen",
            f"only {plan.max_concurrent_at_max_model_len} request(s) of {plan.max_model_len} tokens fit at "
            "once; long prompts will queue",
        )


def _draft_bytes(spec: QwenDeploymentSpec) -> int:
    spec_dec = spec.engine.speculative
    if spec_dec is None or spec_dec.method == "ngram":
        return 0
    return DRAFT_MODEL_BYTES.get(spec_dec.model, 0)


def _check_speculative(plan: Plan, spec: QwenDeploymentSpec) -> None:
    spec_dec = spec.engine.speculative
    if spec_dec is None or spec_dec.method == "ngram":
        return
    if spec_dec.model not in DRAFT_MODEL_BYTES:  # draft models and EAGLE-3 heads alike hold GPU memory
        kind = "draft model" if spec_dec.method == "draft_model" else f"{spec_dec.method} head"
        plan.warn(
            "spec.engine.speculative.model",
            f"{kind} {spec_dec.model!r} is not in the catalog: its memory is not in this plan",
        )
