"""Capacity planning: will this spec start on this GPU pool, and how much KV cache does a replica get?

Memory model per GPU, term by term as vLLM 0.32 budgets it at start-up (v1/worker/gpu_worker.py,
determine_available_memory; docs/capacity-planning.md gives the sources and the calibration):
    usable = GPU memory (CUDA's total) x gpuMemoryUtilization
    KV budget = usable - weights / (TP x PP) - LoRA slots - profile peak - sampler state - workspaces
                - non-torch memory - CUDA-graph estimate
vLLM 0.32 runs Qwen3 on its Model Runner V2 (v1/worker/gpu/model_runner.py). The profile peak is the
larger of the dummy forward of maxNumBatchedTokens tokens (measured: tools/measure/activation_peak.py)
and the dummy sampler pass over maxNumSeqs rows, which under V2 is the logits and their all-gather
only (measured: tools/measure/compiled_forward.py); the sampler's per-request state is allocated once
for maxNumSeqs requests. With pipeline parallelism the last stage, which samples, holds the most.
A replica's KV tokens are the KV budget of its GPUs divided by the KV bytes of one token (each GPU
holds 1/TP of the KV heads; a draft model's layers share the pool). vLLM refuses to start when one
sequence of maxModelLen does not fit, so that is the fit criterion; everything that cannot start is an
error here, before any object exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import drains
from .catalog import (
    COMPATIBLE_QUANTIZATION,
    FP8_METHODS,
    GIB,
    MODELS,
    NATIVE_CONTEXT,
    ONLINE_FP8,
    GpuInfo,
    ModelInfo,
    checkpoint,
    online_fp8_bytes,
    same_size,
)
from .lora import LoraMemory, LoraShapes, lora_memory, slot_bytes
from .spec import QwenDeploymentSpec

# --- Runtime memory per GPU besides weights and KV cache (docs/capacity-planning.md) ---------------
#: The transient peak of vLLM's profile forward per batched token is measured per model size and tensor
#: parallel size (catalog.Shape.activation_bytes_per_token, tools/measure/activation_peak.py).
#: Bytes of one logit: the lm_head runs in the model's dtype (logits_processor.py _apply_head).
LOGIT_BYTES = 2
#: The V2 Sampler's Gumbel-max kernel keeps an int64 and a float32 value per row and per block of this
#: many vocabulary entries (v1/worker/gpu/sample/gumbel.py gumbel_sample).
GUMBEL_BLOCK = 1024
#: Per request slot (maxNumSeqs of them), the V2 Sampler's 4-byte state besides the vocabulary-sized rows
#: (penalties.py output_bin_counts: one per vocabulary entry; prompt_bin_mask and structured_outputs.py
#: grammar_bitmask: one per 32 entries each): logit_bias.py's allowed token ids, bias token ids and
#: biases (3 x 1,024) and stop token ids (128), bad_words.py's token ids and offsets (1,024 + 129),
#: logprob.py's requested token ids (128) and the structured-output logits index (1).
SAMPLER_STATE_SLOT_INTS = 3 * 1024 + 128 + 1024 + 129 + 128 + 1
#: The cuBLAS/cuBLASLt workspaces, persistent torch allocations made by the profile's first GEMMs:
#: 33 MiB measured on the H200 (tools/measure/runtime_terms.py).
CUBLAS_WORKSPACE_BYTES = 33 * 2**20
#: What vLLM charges besides the transient peak is what the profile leaves behind after its init
#: snapshot (v1/worker/gpu_worker.py init_device takes that snapshot after NCCL and the custom all-reduce
#: are set up, so their buffers come out of the (1 - gpuMemoryUtilization) headroom, not the budget).
#: The non-torch increase over the profile pass (cuBLAS handles, lazily loaded kernel modules): 68 MiB
#: measured on the H200 from a snapshot after the CUDA context (tools/measure/runtime_terms.py); the
#: Inductor-compiled forward adds none (tools/measure/compiled_forward.py).
NON_TORCH_BYTES = 68 * 2**20
#: CUDA-graph memory vLLM 0.32 takes out of the KV budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, the
#: default): Model Runner V2 captures every PIECEWISE graph and two FULL ones into a throwaway pool and
#: extrapolates (v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory). 1.86 GiB is what a vLLM 0.26
#: log shows the capture of Qwen3-32B at TP 1 took with the default capture sizes (largest 512). Zero
#: with --enforce-eager. Taken for every size: no log of a smaller one was found, and its graphs hold
#: smaller activations (an overestimate there).
CUDA_GRAPH_BYTES = int(1.86 * GIB)
#: vLLM allocates the KV cache in blocks of 16 tokens.
KV_BLOCK_TOKENS = 16

# --- Prefill step time (docs/capacity-planning.md) ------------------------------------------------
#: Dense bf16 tensor-core peak of each catalog GPU, TFLOP/s (vendor data sheets, without sparsity).
BF16_DENSE_TFLOPS: dict[str, float] = {
    "A10-24GB": 125,
    "L4-24GB": 121,
    "RTX-4090-24GB": 165,
    "L40S-48GB": 362,
    "RTX-6000-Ada-48GB": 364,
    "A100-40GB": 312,
    "A100-80GB": 312,
    "H100-80GB": 989,
    "H100-NVL-94GB": 835,
    "H200-141GB": 989,
    "H200-NVL-141GB": 835,
    "RTX-PRO-6000-Blackwell-96GB": 500,
    "B200-180GB": 2250,
}
#: Share of that peak a prefill step reaches. Linear layers: cuBLAS bf16 GEMMs, 792 of 989 TFLOP/s
#: (0.80) on a square 8192 product on an H200 (tools/measure/activation_peak.py), less on the model's
#: skinnier shapes. Attention: 0.32 was measured there with PyTorch's FlashAttention 2 kernel, which
#: is not tuned for Hopper; vLLM runs FlashAttention 3 on Hopper (0.6-0.75 of peak in its paper) and
#: FlashAttention 2 reaches 0.5-0.7 on Ampere; 0.5 sits between.
LINEAR_EFFICIENCY = 0.7
ATTENTION_EFFICIENCY = 0.5
#: A scheduler step longer than this freezes every running stream for that long: the plan warns.
PREFILL_STEP_WARN_SECONDS = 10.0
#: Without a TFLOP/s figure for the GPU, the plan warns above this maxNumBatchedTokens instead.
LARGE_BATCHED_TOKENS = 32_768
#: Requests at full context below which the plan warns that long prompts will queue.
LOW_CONCURRENCY = 2
#: Decode pace of one stream assumed when deriving the gateway's request timeout: a conservative figure
#: for Qwen3-32B (a 32K-token reasoning output takes 15-25 minutes at one stream's pace, 22-36 tokens/s),
#: so a request that generates up to maxModelLen tokens is not cut by the gateway.
CONSERVATIVE_DECODE_TOKENS_PER_SECOND = 20
#: Added to the decode time for queueing and the prefill of a long prompt.
REQUEST_TIMEOUT_MARGIN_SECONDS = 120


@dataclass(frozen=True)
class Yarn:
    """Rope scaling needed for a context longer than the native window."""

    factor: float
    original_max_position_embeddings: int
    rope_theta: float  # the model's, restated: an hf_overrides dict replaces rope_parameters whole


@dataclass(frozen=True)
class RuntimeMemory:
    """What vLLM takes per GPU besides weights and KV cache, term by term (bytes): on the last pipeline
    stage, which holds the most (the engine sizes every stage's KV cache to the smallest budget)."""

    forward_bytes: int  # dummy forward of maxNumBatchedTokens tokens
    sampler_bytes: int  # dummy sampler pass over maxNumSeqs rows (plus the forward's hidden states)
    sampler_state_bytes: int  # the sampler's state for maxNumSeqs requests, allocated once
    persistent_bytes: int  # other torch allocations after the snapshot: workspaces, PP receive buffers
    non_torch_bytes: int
    cuda_graph_bytes: int

    @property
    def profile_peak_bytes(self) -> int:
        # The sampler runs after the forward's activations are freed: the larger one is the peak.
        return max(self.forward_bytes, self.sampler_bytes)

    @property
    def total_bytes(self) -> int:
        return (
            self.profile_peak_bytes
            + self.sampler_state_bytes
            + self.persistent_bytes
            + self.non_torch_bytes
            + self.cuda_graph_bytes
        )


@dataclass
class Plan:
    """The capacity plan of one QwenDeployment; no `errors` means it starts and fits.

    Errors come in two kinds the status keeps apart: a spec that breaks a rule of the model, vLLM or
    the operator whatever the hardware (ConfigValid), and one that is valid but does not fit the GPU
    pool (CapacityFit): the fix differs, editing the spec or choosing more or larger GPUs.
    """

    model: str
    gpu: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpus_per_replica: int
    quantization: str | None
    kv_cache_dtype: str
    max_model_len: int
    weights_bytes_per_gpu: int = 0
    download_bytes: int = 0  # the checkpoint files (and the draft's) the model cache holds
    kv_bytes_per_token: int = 0
    kv_budget_bytes_per_gpu: int = 0
    draft_kv_bytes_per_token: int = 0  # included in kv_bytes_per_token
    runtime: RuntimeMemory | None = None
    lora: LoraMemory | None = None  # spec.lora's slots and buffers (None: LoRA off)
    kv_tokens_per_replica: int = 0
    max_concurrent_at_max_model_len: int = 0
    prefill_step_seconds: float | None = None  # the longest scheduler step: a full-budget prefill chunk
    yarn: Yarn | None = None
    request_timeout_seconds: int = 0  # the gateway's request timeout: the spec's, or derived
    #: How long a terminating pod keeps serving what it has in flight (drains.py says how).
    engine_drain_seconds: int = 0
    gateway_drain_seconds: int = 0
    warnings: list[tuple[str, str]] = field(default_factory=list)
    config_errors: list[tuple[str, str]] = field(default_factory=list)  # rules broken (ConfigValid)
    capacity_errors: list[tuple[str, str]] = field(default_factory=list)  # GPU pool too small (CapacityFit)

    @property
    def errors(self) -> list[tuple[str, str]]:
        """Every reason it cannot start: the spec's rule errors, then its capacity errors."""
        return self.config_errors + self.capacity_errors

    @property
    def fits(self) -> bool:
        return not self.errors

    def invalid(self, path: str, message: str) -> None:
        """The spec breaks a rule that no GPU pool would change."""
        self.config_errors.append((path, message))

    def does_not_fit(self, path: str, message: str) -> None:
        """The spec is valid but needs more GPU memory or GPUs per node than the pool has."""
        self.capacity_errors.append((path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append((path, message))


def gib(n: float) -> str:
    # Two decimals: one hides real differences (36.01 GiB needed would read as the 36.0 GiB available).
    return f"{n / GIB:.2f} GiB"


#: Tensor parallel size of a spec that leaves it unset and names no model the catalog knows.
FALLBACK_TENSOR_PARALLEL = 2


def make_plan(spec: QwenDeploymentSpec) -> Plan:
    """Validate the spec against the model and GPU catalogs and compute the capacity plan."""
    engine, par = spec.engine, spec.parallelism
    gpu = spec.gpu.info()
    plan = Plan(
        model=spec.model.name,
        gpu=gpu.type,
        tensor_parallel_size=par.tensor or FALLBACK_TENSOR_PARALLEL,
        pipeline_parallel_size=par.pipeline,
        gpus_per_replica=(par.tensor or FALLBACK_TENSOR_PARALLEL) * par.pipeline,
        quantization=None,
        kv_cache_dtype=engine.kv_cache_dtype,
        max_model_len=engine.max_model_len,
    )
    plan.request_timeout_seconds = request_timeout_seconds(spec)
    plan.engine_drain_seconds = drains.engine_drain_seconds(spec)
    plan.gateway_drain_seconds = drains.gateway_drain_seconds(spec, plan.request_timeout_seconds)
    model = _model_of(plan, spec)
    if model is None:
        return plan
    tp = par.tensor or model.default_tensor_parallel
    plan.tensor_parallel_size, plan.gpus_per_replica = tp, tp * par.pipeline
    plan.quantization = served_quantization(spec, model)
    draft = _draft_of(spec)
    plan.download_bytes = model.download_bytes + (draft.download_bytes if draft else 0)
    _check_parallelism(plan, spec, model)
    _check_quantization(plan, spec, model, gpu)
    _check_context(plan, spec, model)
    _check_batching(plan, spec)
    _compute_memory(plan, spec, model, gpu)
    _check_prefill(plan, spec, model, gpu)
    _check_speculative(plan, spec)
    _check_lora(plan, spec, model)
    return plan


def _model_of(plan: Plan, spec: QwenDeploymentSpec) -> ModelInfo | None:
    """The catalog's model, or the community checkpoint the spec declares (Qwen3-32B's architecture)."""
    source = spec.model
    if source.checkpoint is None:
        model = MODELS.get(source.name)
        if model is None:
            plan.invalid(
                "spec.model.name",
                f"unknown model {source.name!r}; supported: {', '.join(MODELS)}, or declare a community "
                "Qwen3-32B checkpoint in spec.model.checkpoint (quantization, weightSize)",
            )
        return model
    if source.name in MODELS:
        plan.invalid(
            "spec.model.checkpoint",
            f"{source.name} is in the catalog, which knows its storage and size; remove checkpoint",
        )
        return None
    stored = source.checkpoint.quantization
    return checkpoint(
        source.name, "32B", source.checkpoint.weight_bytes, None if stored == "bf16" else stored
    )


def request_timeout_seconds(spec: QwenDeploymentSpec) -> int:
    """The gateway's request timeout: the spec's, else long enough to generate maxModelLen tokens at
    CONSERVATIVE_DECODE_TOKENS_PER_SECOND plus REQUEST_TIMEOUT_MARGIN_SECONDS, in whole minutes."""
    if spec.gateway.request_timeout_seconds is not None:
        return spec.gateway.request_timeout_seconds
    seconds = (
        spec.engine.max_model_len / CONSERVATIVE_DECODE_TOKENS_PER_SECOND + REQUEST_TIMEOUT_MARGIN_SECONDS
    )
    return -(-int(seconds) // 60) * 60


#: Most GPUs of a replica's tensor parallel group (spec.parallelism.tensor's maximum).
MAX_TENSOR_PARALLEL = 16
#: Block (FP8) or group (AWQ, GPTQ: Marlin's min_thread_k) width of the quantized checkpoints: each
#: GPU's slice of a quantized linear layer must hold whole blocks (vLLM 0.32,
#: model_executor/layers/quantization/utils/fp8_utils.py validate_fp8_block_shape,
#: utils/marlin_utils.py verify_marlin_supports_shape).
QUANTIZATION_BLOCK = {"fp8": 128, "awq": 128, "awq_marlin": 128, "gptq": 128, "gptq_marlin": 128}


def served_quantization(spec: QwenDeploymentSpec, model: ModelInfo) -> str | None:
    """The --quantization the engine runs with: the spec's, else the checkpoint's own."""
    wanted = spec.engine.quantization
    return model.checkpoint_quantization if wanted is None else (None if wanted == "none" else wanted)


def valid_tensor_parallel_sizes(model: ModelInfo, quantization: str | None) -> list[int]:
    block = QUANTIZATION_BLOCK.get(quantization or "")
    return [n for n in range(1, MAX_TENSOR_PARALLEL + 1) if model.tensor_parallel_problem(n, block) is None]


def _check_parallelism(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo) -> None:
    tp, pp = plan.tensor_parallel_size, plan.pipeline_parallel_size
    block = QUANTIZATION_BLOCK.get(plan.quantization or "")
    problem = model.tensor_parallel_problem(tp, block)
    if problem:
        valid = valid_tensor_parallel_sizes(model, plan.quantization)
        plan.invalid(
            "spec.parallelism.tensor",
            f"tensor parallel size {tp} does not fit {model.name}: {problem} (vLLM 0.32's rule); "
            f"valid sizes: {', '.join(map(str, valid))}",
        )
    if pp > model.num_layers:
        plan.invalid("spec.parallelism.pipeline", f"{pp} stages exceed the model's {model.num_layers} layers")
    if tp * pp > spec.gpu.gpus_per_node:
        plan.does_not_fit(
            "spec.parallelism",
            f"a replica needs {tp * pp} GPUs (tensor {tp} x pipeline {pp}) but a node of the pool has "
            f"{spec.gpu.gpus_per_node} (spec.gpu.gpusPerNode)",
        )


def _check_quantization(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo, gpu: GpuInfo) -> None:
    stored, quant = model.checkpoint_quantization, plan.quantization
    if quant not in COMPATIBLE_QUANTIZATION[stored]:
        plan.invalid("spec.engine.quantization", _quantization_mismatch(model, stored, quant))
    if quant in FP8_METHODS and not gpu.fp8_compute:
        plan.warn(
            "spec.engine.quantization",
            f"{gpu.type} ({gpu.architecture}) has no FP8 tensor cores: FP8 runs weight-only (Marlin), "
            "saving memory but usually slower than bf16",
        )
    backend = gpu.fp8_kv_backend
    if spec.engine.kv_cache_dtype == "fp8" and backend is not None:
        # vllm/v1/attention/backends/fa_utils.py: FlashAttention stores fp8 KV only on sm90/sm100;
        # vllm/model_executor/layers/quantization/kv_cache.py: no k/v scales in the checkpoint -> 1.0.
        cc = ".".join(map(str, gpu.compute_capability))
        plan.warn(
            "spec.engine.kvCacheDtype",
            f"fp8 KV cache on {gpu.type} ({gpu.architecture}, sm {cc}): FlashAttention takes it only on "
            f"Hopper or B200, so vLLM uses {backend}; the checkpoint has no calibrated k/v scales, so "
            "they are 1.0 (values beyond FP8's range saturate): check output quality on your prompts",
        )


def _quantization_mismatch(model: ModelInfo, stored: str | None, quant: str | None) -> str:
    allowed = ", ".join(sorted(q or "none" for q in COMPATIBLE_QUANTIZATION[stored]))
    served = quant or "none"
    head = f"{model.name} is stored as {stored or 'bf16'}; it can be served with {allowed}, not {served}"
    if quant in ("gptq", "gptq_marlin"):
        declare = (
            "name a community one in spec.model.name and declare it in spec.model.checkpoint "
            "(quantization: gptq, weightSize)"
            if model.size == "32B"
            else "spec.model.checkpoint declares Qwen3-32B checkpoints only"
        )
        return (
            f"{head}: {quant} needs a GPTQ checkpoint and the catalog has none (Qwen publishes no "
            f"Qwen3-{model.size} GPTQ); {declare}"
        )
    fp8 = same_size(model, "fp8")
    if quant == "fp8" and stored is None and fp8 is not None:
        return (
            f"{head}: fp8 serves a checkpoint stored in FP8 ({fp8.name}); to quantize this one "
            f"at load use {' or '.join(ONLINE_FP8)} (vLLM 0.32 deprecates --quantization fp8 for that)"
        )
    awq = same_size(model, "awq")
    if awq is None:
        return f"{head} (use the matching checkpoint; Qwen publishes no Qwen3-{model.size} AWQ)"
    return f"{head} (use the matching checkpoint, e.g. {awq.name} for awq)"


def yarn_for(max_model_len: int, model: ModelInfo) -> Yarn | None:
    """The smallest YaRN factor (2 or 4) covering max_model_len over the 32,768-token native window, or
    None up to the config's max_position_embeddings (40,960), which vLLM accepts without rope scaling."""
    if max_model_len <= model.max_position_embeddings:
        return None
    factor = 2.0 if max_model_len <= 2 * NATIVE_CONTEXT else 4.0
    return Yarn(factor, original_max_position_embeddings=NATIVE_CONTEXT, rope_theta=model.rope_theta)


def _check_context(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo) -> None:
    length, positions = spec.engine.max_model_len, model.max_position_embeddings
    if length > model.max_context:
        why = (
            f"the longest context Qwen3-{model.size} supports (YaRN factor 4)"
            if model.yarn
            else f"the positions of Qwen3-{model.size}'s config.json: its model card states 32768 tokens "
            "and Qwen documents YaRN for Qwen3-4B and larger only"
        )
        plan.invalid("spec.engine.maxModelLen", f"{length} exceeds {model.max_context}, {why}")
        return
    plan.yarn = yarn_for(length, model)
    if plan.yarn:
        plan.warn(
            "spec.engine.maxModelLen",
            f"{length} > {positions}: YaRN factor {plan.yarn.factor:g} is applied to every "
            f"request, which can lower quality on short texts; keep {positions} or less unless long "
            "inputs are needed",
        )


def _check_batching(plan: Plan, spec: QwenDeploymentSpec) -> None:
    e = spec.engine
    if not e.enable_chunked_prefill:
        # vllm/engine/arg_utils.py, _set_default_chunked_prefill_and_prefix_caching_args: vLLM 0.32 logs
        # the same for a generate model whose config supports chunked prefill.
        plan.warn(
            "spec.engine.enableChunkedPrefill",
            "chunked prefill is off: vLLM 0.32 says this model does not officially support disabling it "
            "and that the engine may crash or produce incorrect outputs; every prompt is then prefilled "
            "in one step, stalling running streams; keep it on outside benchmarks",
        )
    if not e.enable_chunked_prefill and e.max_num_batched_tokens < e.max_model_len:
        plan.invalid(
            "spec.engine.maxNumBatchedTokens",
            f"{e.max_num_batched_tokens} is below maxModelLen {e.max_model_len} with chunked prefill off: "
            "a full-length prompt could never be scheduled; raise it or enable chunked prefill",
        )
    if e.max_num_batched_tokens < e.max_num_seqs:
        plan.invalid(
            "spec.engine.maxNumBatchedTokens",
            f"{e.max_num_batched_tokens} is below maxNumSeqs {e.max_num_seqs}: every running request needs "
            "at least one token per step",
        )


def _weight_bytes(model: ModelInfo, quant: str | None) -> int:
    if model.checkpoint_quantization is None and quant in ONLINE_FP8:
        return online_fp8_bytes(model)
    return model.weight_bytes


def activation_bytes_per_token(model: ModelInfo, tp: int) -> int:
    """The profile forward's transient peak per batched token on one GPU, as measured for the model's
    size at every tensor parallel size vLLM accepts (TP 1's, the largest, for any other)."""
    measured = model.activation_per_token(tp)
    return measured if measured is not None else dict(model.activation_bytes_per_token)[1]


def sampler_pass_bytes(model: ModelInfo, tp: int, max_num_batched_tokens: int, rows: int) -> int:
    """The V2 dummy sampler pass (v1/worker/gpu/model_runner.py _dummy_sampler_run) on one GPU: the
    dummy requests need no logits processing, so the Sampler makes no float32 copy and applies no
    top-k/top-p; the peak is compute_logits'. At TP > 1 every rank all-gathers the logits shards
    (use_all_gather is true on CUDA): the shard, the gathered buffer and its permuted copy
    (device_communicators/cuda_communicator.py all_gather) are alive at once, 1/TP + 2 times the logits.
    The forward's hidden states and the rows picked from them stay alive meanwhile (profile_run)."""
    logits = rows * model.vocab_size * LOGIT_BYTES
    gathered = logits if tp == 1 else logits // tp + 2 * logits
    gumbel = rows * -(-model.vocab_size // GUMBEL_BLOCK) * (8 + 4)
    hidden = (max_num_batched_tokens + rows) * model.hidden_size * 2
    return gathered + gumbel + hidden


def sampler_state_bytes(model: ModelInfo, max_num_seqs: int) -> int:
    """The V2 Sampler's per-request state, allocated on the GPU for maxNumSeqs requests when the model
    loads (after vLLM's snapshot and outside "Model loading took"): 4 bytes per vocabulary entry for the
    output-token counts of penalties, two bitmasks of the vocabulary, SAMPLER_STATE_SLOT_INTS more."""
    bitmask = -(-model.vocab_size // 32)
    return max_num_seqs * 4 * (model.vocab_size + 2 * bitmask + SAMPLER_STATE_SLOT_INTS)


def runtime_memory(
    model: ModelInfo,
    tp: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    cuda_graphs: bool = True,
    pp: int = 1,
) -> RuntimeMemory:
    """vLLM 0.32's non-weight, non-KV memory on one GPU of a replica's last pipeline stage
    (docs/capacity-planning.md)."""
    rows = min(max_num_seqs, max_num_batched_tokens)  # _dummy_run samples at most one row per token
    # Stages after the first receive hidden states and residual into persistent buffers of
    # maxNumBatchedTokens rows (model_runner.py load_model, make_empty_intermediate_tensors).
    receive_buffers = 2 * max_num_batched_tokens * model.hidden_size * 2 if pp > 1 else 0
    return RuntimeMemory(
        forward_bytes=max_num_batched_tokens * activation_bytes_per_token(model, tp),
        sampler_bytes=sampler_pass_bytes(model, tp, max_num_batched_tokens, rows),
        sampler_state_bytes=sampler_state_bytes(model, max_num_seqs),
        persistent_bytes=CUBLAS_WORKSPACE_BYTES + receive_buffers,
        non_torch_bytes=NON_TORCH_BYTES,
        cuda_graph_bytes=CUDA_GRAPH_BYTES if cuda_graphs else 0,
    )


def kv_tokens(budget_bytes_per_gpu: int, gpus: int, kv_bytes_per_token: int) -> int:
    """Tokens the KV pool of a replica holds, in whole 16-token blocks as vLLM allocates them."""
    blocks = max(budget_bytes_per_gpu, 0) * gpus // (kv_bytes_per_token * KV_BLOCK_TOKENS)
    return blocks * KV_BLOCK_TOKENS


def _compute_memory(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo, gpu: GpuInfo) -> None:
    tp, pp = plan.tensor_parallel_size, plan.pipeline_parallel_size
    if plan.errors and any(p.startswith("spec.parallelism") for p, _ in plan.errors):
        return
    e = spec.engine
    draft = _draft_of(spec)
    draft_bytes = draft.weight_bytes if draft else 0
    plan.weights_bytes_per_gpu = (_weight_bytes(model, plan.quantization) + draft_bytes) // (tp * pp)
    kv_dtype_bytes = 1 if plan.kv_cache_dtype == "fp8" else 2
    plan.draft_kv_bytes_per_token = _draft_kv_bytes_per_token(spec, kv_dtype_bytes)
    plan.kv_bytes_per_token = model.kv_bytes_per_token(kv_dtype_bytes) + plan.draft_kv_bytes_per_token
    cuda_graphs = "--enforce-eager" not in e.extra_args
    runtime = runtime_memory(model, tp, e.max_num_batched_tokens, e.max_num_seqs, cuda_graphs, pp)
    plan.runtime = runtime
    if spec.lora is not None:
        plan.lora = lora_memory(
            model,
            tp,
            pp,
            spec.lora.max_loras,
            spec.lora.max_lora_rank,
            e.max_num_batched_tokens,
            e.max_num_seqs,
            cuda_graphs,
        )
    lora_bytes = plan.lora.total_bytes if plan.lora else 0
    usable = int(gpu.memory_bytes * e.gpu_memory_utilization)
    budget = usable - plan.weights_bytes_per_gpu - lora_bytes - runtime.total_bytes
    plan.kv_budget_bytes_per_gpu = max(budget, 0)
    # Each GPU holds 1/TP of the KV heads (one replicated head beyond them) and 1/PP of the layers.
    plan.kv_tokens_per_replica = kv_tokens(budget, model.kv_shards(tp) * pp, plan.kv_bytes_per_token)
    plan.max_concurrent_at_max_model_len = plan.kv_tokens_per_replica // plan.max_model_len
    needed = plan.weights_bytes_per_gpu + lora_bytes + runtime.total_bytes
    lora_term = f" plus {gib(lora_bytes)} for LoRA (spec.lora)" if plan.lora else ""
    fewer_slots = ", fewer LoRA slots or a lower maxLoraRank" if plan.lora else ""
    if budget <= 0:
        plan.does_not_fit(
            "spec.gpu.type",
            f"weights need {gib(plan.weights_bytes_per_gpu)} per GPU{lora_term} plus "
            f"{gib(runtime.total_bytes)} runtime "
            f"({_runtime_terms(runtime, e.max_num_batched_tokens, e.max_num_seqs)}) = "
            f"{gib(needed)}, but {gpu.type} offers {gib(usable)} at gpuMemoryUtilization "
            f"{e.gpu_memory_utilization}; use more GPUs (spec.parallelism.tensor), a quantized "
            f"checkpoint, a larger GPU or a smaller maxNumBatchedTokens{fewer_slots}",
        )
    elif plan.max_concurrent_at_max_model_len < 1:
        seq = plan.max_model_len * plan.kv_bytes_per_token
        plan.does_not_fit(
            "spec.engine.maxModelLen",
            f"one {plan.max_model_len}-token sequence needs {gib(seq)} of KV cache but a replica has "
            f"{gib(plan.kv_budget_bytes_per_gpu * tp * pp)} ({plan.kv_tokens_per_replica} tokens) after "
            f"{gib(plan.weights_bytes_per_gpu)} of weights{lora_term} and {gib(runtime.total_bytes)} runtime "
            f"({_runtime_terms(runtime, e.max_num_batched_tokens, e.max_num_seqs)}) per GPU; lower "
            "maxModelLen or maxNumBatchedTokens, use kvCacheDtype fp8, more GPUs or a quantized "
            f"checkpoint{fewer_slots}",
        )
    elif plan.max_concurrent_at_max_model_len < LOW_CONCURRENCY:
        plan.warn(
            "spec.engine.maxModelLen",
            f"only {plan.max_concurrent_at_max_model_len} request(s) of {plan.max_model_len} tokens fit at "
            "once; long prompts will queue",
        )


def _runtime_terms(runtime: RuntimeMemory, batched_tokens: int, seqs: int) -> str:
    peak = (
        f"activations of {batched_tokens} batched tokens {gib(runtime.forward_bytes)}"
        if runtime.forward_bytes >= runtime.sampler_bytes
        else f"sampler over {seqs} sequences {gib(runtime.sampler_bytes)}"
    )
    return (
        f"{peak}, sampler state {gib(runtime.sampler_state_bytes)}, workspaces "
        f"{gib(runtime.persistent_bytes)}, non-torch {gib(runtime.non_torch_bytes)}, "
        f"CUDA graphs {gib(runtime.cuda_graph_bytes)}"
    )


def prefill_step_flops(model: ModelInfo, chunk_tokens: int, context_tokens: int) -> tuple[float, float]:
    """FLOPs (linear layers, attention) of one prefill chunk of chunk_tokens ending at position
    context_tokens, whole model: 2 per weight per token on the linear layers (embeddings and lm_head
    aside), and causal attention's QK^T and PV over the prefix, 2 x 2 x heads x head_dim per pair."""
    linear_params = model.parameters - model.embedding_parameters
    pairs = chunk_tokens * (context_tokens - chunk_tokens / 2)
    attention = 4 * model.num_layers * model.num_attention_heads * model.head_dim * pairs
    return 2 * linear_params * chunk_tokens, attention


def prefill_step_seconds(
    model: ModelInfo, gpu_type: str, tp: int, chunk_tokens: int, context_tokens: int
) -> float | None:
    """Expected duration of that step on a replica: each GPU does 1/TP of it; pipeline stages run it
    one after another, so PP does not shorten a step. None when the GPU's TFLOP/s are unknown."""
    peak = BF16_DENSE_TFLOPS.get(gpu_type)
    if peak is None:
        return None
    linear, attention = prefill_step_flops(model, chunk_tokens, context_tokens)
    rate = peak * 1e12
    return (linear / (LINEAR_EFFICIENCY * rate) + attention / (ATTENTION_EFFICIENCY * rate)) / tp


def _check_prefill(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo, gpu: GpuInfo) -> None:
    """The longest step: a chunk of maxNumBatchedTokens at the end of a maxModelLen prompt."""
    e = spec.engine
    chunk = min(e.max_num_batched_tokens, e.max_model_len)
    plan.prefill_step_seconds = prefill_step_seconds(
        model, gpu.type, plan.tensor_parallel_size, chunk, e.max_model_len
    )
    stall = "every running stream waits for that step, so inter-token latency spikes to match"
    if plan.prefill_step_seconds is not None and plan.prefill_step_seconds > PREFILL_STEP_WARN_SECONDS:
        plan.warn(
            "spec.engine.maxNumBatchedTokens",
            f"a {chunk}-token prefill step at {e.max_model_len} tokens of context takes about "
            f"{plan.prefill_step_seconds:.0f} s on {plan.tensor_parallel_size} x {gpu.type} "
            f"(above {PREFILL_STEP_WARN_SECONDS:g} s): {stall}; lower maxNumBatchedTokens (8192 or less)",
        )
    elif plan.prefill_step_seconds is None and e.max_num_batched_tokens > LARGE_BATCHED_TOKENS:
        plan.warn(
            "spec.engine.maxNumBatchedTokens",
            f"{e.max_num_batched_tokens} tokens per step (above {LARGE_BATCHED_TOKENS}): a long prompt "
            f"is prefilled in few huge steps and {stall}; lower maxNumBatchedTokens (8192 or less)",
        )


def _draft_of(spec: QwenDeploymentSpec) -> ModelInfo | None:
    """The catalog's checkpoint the speculative settings load beside the target, if any."""
    spec_dec = spec.engine.speculative
    if spec_dec is None or spec_dec.method == "ngram":
        return None
    return MODELS.get(spec_dec.model)


def _draft_kv_bytes_per_token(spec: QwenDeploymentSpec, kv_dtype_bytes: int) -> int:
    """K and V of a draft model's layers for one token: vLLM keeps them in the target's KV pool."""
    spec_dec, draft = spec.engine.speculative, _draft_of(spec)
    if spec_dec is None or spec_dec.method != "draft_model" or draft is None:
        return 0
    return draft.kv_bytes_per_token(kv_dtype_bytes)


def _check_speculative(plan: Plan, spec: QwenDeploymentSpec) -> None:
    spec_dec = spec.engine.speculative
    if spec_dec is None or spec_dec.method == "ngram":
        return
    draft = _draft_of(spec)
    if draft is None:  # draft models and EAGLE-3 heads alike hold GPU memory
        kind = "draft model" if spec_dec.method == "draft_model" else f"{spec_dec.method} head"
        plan.warn(
            "spec.engine.speculative.model",
            f"{kind} {spec_dec.model!r} is not in the catalog: its weights and KV cache are not in this plan",
        )
        return
    positions = draft.max_position_embeddings
    if spec_dec.method == "draft_model" and plan.max_model_len > positions:
        # vllm/config/speculative.py: the draft keeps its own config (max_position_embeddings 40,960,
        # no rope scaling) while the proposer feeds it positions up to the target's max_model_len; only
        # EAGLE drafts get their rotary cache raised to the target's length (vLLM #48894).
        plan.invalid(
            "spec.engine.speculative.model",
            f"draft model {spec_dec.model} has {positions} positions and no YaRN, but "
            f"maxModelLen {plan.max_model_len} feeds it positions up to that: vLLM 0.32 raises the rotary "
            "table only for EAGLE drafts, so long requests would index past it; keep maxModelLen at "
            f"{positions} or less with a draft model, or use ngram speculation",
        )


def _check_lora(plan: Plan, spec: QwenDeploymentSpec, model: ModelInfo) -> None:
    lora = spec.lora
    if lora is None:
        return
    adapters, slots = len(lora.adapters), lora.max_loras
    if adapters > slots:
        per_slot = slot_bytes(
            LoraShapes.of(model),
            plan.tensor_parallel_size,
            plan.pipeline_parallel_size,
            1,
            lora.max_lora_rank,
        )
        plan.warn(
            "spec.lora.maxLoras",
            f"{adapters} adapters share {slots} GPU slot(s): a batch holds requests for at most {slots} "
            "adapter(s), and vLLM's scheduler holds back requests for any other until a running one "
            f"finishes, so adapters used at the same time take turns; maxLoras {adapters} would cost "
            f"{gib((adapters - slots) * per_slot)} more per GPU",
        )
    cpu = lora.effective_max_cpu_loras
    if adapters > cpu:
        plan.warn(
            "spec.lora.maxCpuLoras",
            f"{adapters} adapters but maxCpuLoras {cpu}"
            + (" (default: maxLoras)" if lora.max_cpu_loras is None else "")
            + ": each engine keeps the most recently used in host memory and reads an evicted one from "
            f"its files again on its next request; set maxCpuLoras to {adapters} to keep them all loaded",
        )
    if slots > spec.engine.max_num_seqs:
        plan.warn(
            "spec.lora.maxLoras",
            f"{slots} slots but maxNumSeqs {spec.engine.max_num_seqs}: a batch never holds more requests "
            "than that, so the extra slots only take GPU memory",
        )
    servers = _api_server_count(spec.engine.extra_args)
    if servers is not None and servers[1] > 1:
        # vllm/entrypoints/cli/serve.py refuses the pair at start-up.
        plan.invalid(
            f"spec.engine.extraArgs[{servers[0]}]",
            f"--api-server-count {servers[1]} cannot be combined with spec.lora: vLLM 0.32 loads adapters "
            "at runtime (VLLM_ALLOW_RUNTIME_LORA_UPDATING) only with one API server",
        )


def _api_server_count(args: list[str]) -> tuple[int, int] | None:
    """(index, value) of --api-server-count (or -asc) in extraArgs, when its value is an integer."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name.replace("_", "-") in ("--api-server-count", "-asc"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            return (i, int(value)) if value.lstrip("-").isdigit() else None
    return None
