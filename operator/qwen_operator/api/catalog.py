"""Facts about the models and GPUs the operator plans for.

Architecture numbers come from each checkpoint's config.json; weight sizes are the bytes of the
published safetensors. GPU memory is the total the CUDA runtime reports (torch.cuda.mem_get_info, which
vLLM multiplies by gpu_memory_utilization), a little below nvidia-smi's "Total" and well below the
marketing figure, because the KV budget is computed from it. docs/gpus-and-quantization.md cites each.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .. import versions

GIB = 1024**3
MIB = 1024**2

#: Version of vLLM whose argument parser the tests use; the default engine image carries the same tag.
VLLM_VERSION = versions.VLLM
DEFAULT_ENGINE_IMAGE = versions.ENGINE_IMAGE

#: Qwen3's native context window: YaRN's original_max_position_embeddings for every size.
NATIVE_CONTEXT = 32_768
#: The longest context Qwen documents, with YaRN factor 4, for the sizes it documents YaRN for.
MAX_CONTEXT = 131_072


@dataclass(frozen=True)
class Shape:
    """One Qwen3 size as its config.json describes it; every checkpoint of the size shares it.

    Sources: config.json of each bf16 checkpoint, https://huggingface.co/Qwen/Qwen3-<size>/blob/main/
    config.json, read in stored copies: 4B, 8B, 14B and 32B verbatim in github.com/citsjtu2020/LLM-Prof
    sglang/Model_Config.md; 0.6B as transformers' AutoConfig prints it in
    kiraa-blog.vercel.app/post/learning-qwen3-0.6b/ (and tests/vllm_checks.py); 1.7B re-saved in float16
    in github.com/mephisto1484/Neko-LoRA-Build-Your-AI-Catgirl Qwen3-1.7B/config.json. All six: head_dim 128,
    8 KV heads, vocabulary 151,936, max_position_embeddings 40,960, rope_theta 1,000,000, rope_scaling
    null. docs/models.md has the table and the model cards' context lengths.
    """

    size: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    #: max_position_embeddings of config.json: vLLM accepts a maxModelLen up to it without rope scaling.
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_theta: float
    #: Longest context the model card documents: 131,072 with YaRN (4B and larger), or the config's
    #: positions where the card states 32,768 and no YaRN (0.6B, 1.7B).
    max_context: int
    #: Parameters as the model card states them (used for the prefill time estimate only).
    parameters: float
    #: The profile forward's transient peak per batched token on one GPU, by tensor parallel size:
    #: measured by tools/measure/activation_peak.py on an H200 (raw output beside it).
    activation_bytes_per_token: tuple[tuple[int, int], ...]
    #: Tensor parallel size when spec.parallelism.tensor is unset: the 32B's 65.5 GB of bf16 weights
    #: leave less than one 32,768-token sequence on an 80 GB GPU; every smaller size fits on one.
    default_tensor_parallel: int

    @property
    def yarn(self) -> bool:
        """Qwen documents YaRN rope scaling for this size (contexts above max_position_embeddings)."""
        return self.max_context > self.max_position_embeddings

    @property
    def embedding_parameters(self) -> int:
        """embed_tokens, plus lm_head when it is not tied to it."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        """K and V for every layer and KV head of one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def activation_per_token(self, tp: int) -> int | None:
        """The measured transient peak per batched token at tensor parallel size tp, if measured."""
        return dict(self.activation_bytes_per_token).get(tp)

    def tensor_parallel_problem(self, tp: int, block: int | None = None) -> str | None:
        """Why vLLM 0.32 refuses tensor parallel size tp for this shape, or None.

        config/model.py verify_with_parallel_config: the attention heads must divide evenly;
        model_executor/layers/linear.py QKVParallelLinear: the KV heads must too, or, when tp exceeds
        them, tp must be a multiple of them (each KV head is then replicated on tp / kv GPUs);
        MergedColumnParallelLinear divides intermediate_size by tp. `block`: the width of a quantized
        checkpoint's blocks or groups, which each GPU's slice of intermediate_size must hold whole
        (heads are 128 wide, so the attention slices always do).
        """
        heads, kv, inter = self.num_attention_heads, self.num_kv_heads, self.intermediate_size
        if heads % tp:
            return f"it must divide the {heads} attention heads"
        if kv % tp if tp <= kv else tp % kv:
            return f"it must divide the {kv} KV heads or be a multiple of them"
        if inter % tp:
            return f"it must divide the intermediate size {inter}"
        if block and tp > 1 and (inter // tp) % block:
            return (
                f"each GPU's slice of the intermediate size ({inter} / {tp} = {inter // tp}) must be a "
                f"multiple of the checkpoint's {block}-wide quantization blocks"
            )
        return None

    def kv_shards(self, tp: int) -> int:
        """GPUs among which one token's KV cache is split: tp, or the KV heads when tp exceeds them
        (vLLM then replicates each KV head, so GPUs beyond the KV heads add no KV capacity)."""
        return min(tp, self.num_kv_heads)


def _shape(size: str, hidden: int, intermediate: int, layers: int, heads: int, **facts: Any) -> Shape:
    common: dict[str, Any] = {
        "num_kv_heads": 8,
        "head_dim": 128,
        "vocab_size": 151_936,
        "max_position_embeddings": 40_960,
        "rope_theta": 1_000_000.0,
        "max_context": MAX_CONTEXT,
        "default_tensor_parallel": 1,
    }
    return Shape(
        size=size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_attention_heads=heads,
        **(common | facts),
    )


#: The dense Qwen3 sizes. Activation per batched token, measured on an H200: tools/measure/
#: activation_peak.out.txt (32B at TP 1, 2, 4) and activation_peak.family.out.txt (every size at every
#: tensor parallel size vLLM accepts, up to 16; the 32B's TP 8 figure, 60,168 B, was the form of its
#: TP 2 and 4 figures before and is now measured). The peak is one layer's MLP: gate_up
#: (2 x intermediate/TP), SiluAndMul's output (intermediate/TP), hidden and residual streams and, at
#: TP > 1, the all-reduce output, in bf16: 6 x intermediate/TP + 6 (TP 1) or 8 x hidden + 8 bytes;
#: only Qwen3-0.6B at TP 16 peaks in attention instead (hidden, residual, o_proj and all-reduce
#: outputs beside q, k, v and their norms: 9,736 B).
SHAPES: dict[str, Shape] = {
    s.size: s
    for s in (
        _shape(
            "0.6B", 1024, 3072, 28, 16,
            tie_word_embeddings=True, max_context=40_960, parameters=0.6e9,
            activation_bytes_per_token=((1, 24_584), (2, 17_416), (4, 12_808), (8, 10_504), (16, 9_736)),
        ),
        _shape(
            "1.7B", 2048, 6144, 28, 16,
            tie_word_embeddings=True, max_context=40_960, parameters=1.7e9,
            activation_bytes_per_token=((1, 49_160), (2, 34_824), (4, 25_608), (8, 21_000), (16, 18_696)),
        ),
        _shape(
            "4B", 2560, 9728, 36, 32,
            tie_word_embeddings=True, parameters=4.0e9,
            activation_bytes_per_token=((1, 73_736), (2, 49_672), (4, 35_080), (8, 27_784), (16, 24_136)),
        ),
        _shape(
            "8B", 4096, 12288, 36, 32,
            tie_word_embeddings=False, parameters=8.2e9,
            activation_bytes_per_token=((1, 98_312), (2, 69_640), (4, 51_208), (8, 41_992), (16, 37_384)),
        ),
        _shape(
            "14B", 5120, 17408, 40, 40,
            tie_word_embeddings=False, parameters=14.8e9,
            activation_bytes_per_token=((1, 135_176), (2, 93_192), (4, 67_080), (8, 54_024)),
        ),
        _shape(
            "32B", 5120, 25600, 64, 64,
            tie_word_embeddings=False, parameters=32.8e9, default_tensor_parallel=2,
            activation_bytes_per_token=(
                (1, 184_328), (2, 117_768), (4, 79_368), (8, 60_168), (16, 50_568)
            ),
        ),
    )
}  # fmt: skip


@dataclass(frozen=True)
class ModelInfo(Shape):
    """One checkpoint: its size's shape, the bytes its weights take on the GPUs once vLLM has loaded
    them, the bytes of its files, and the quantization it is stored in."""

    name: str
    weight_bytes: int  # on the GPUs after loading (a tied lm_head counts once)
    checkpoint_quantization: str | None  # quantization the checkpoint is stored in (None: bf16)
    download_bytes: int  # the *.safetensors files (the model cache must hold them)


def checkpoint(
    name: str,
    size: str,
    weight_bytes: int,
    checkpoint_quantization: str | None = None,
    download_bytes: int | None = None,
) -> ModelInfo:
    """A checkpoint of one Qwen3 size (a community one included)."""
    shape = {f.name: getattr(SHAPES[size], f.name) for f in fields(Shape)}
    return ModelInfo(
        name=name,
        weight_bytes=weight_bytes,
        checkpoint_quantization=checkpoint_quantization,
        download_bytes=weight_bytes if download_bytes is None else download_bytes,
        **shape,
    )


# Weight bytes. 32B: the published safetensors (Files pages). Other sizes: counted from config.json's
# shapes, which the Files pages confirm where stored copies show them (0.6B 1.5 GB, 8B 16.4 GB, 4B-FP8
# 4.41 GB + 778 MB): bf16 2 B per parameter; FP8 (quantization_config fp8, 128x128 blocks) 1 B per
# linear weight plus a float32 scale per block, embeddings and norms in bf16; AWQ (4 bits, group 128,
# zero points) 0.5 B per linear weight plus an fp16 scale and a 4-bit zero point per group of 128,
# embeddings in fp16. tests/test_catalog.py recounts every figure. Tied checkpoints (0.6B, 1.7B, 4B) may
# store lm_head.weight too (0.6B, 1.7B and 4B-FP8 do): vLLM ties it to embed_tokens
# (model_executor/models/qwen3.py, tie_weights), so it is in download_bytes, not in weight_bytes; where
# no file listing was seen, download_bytes assumes that copy (an upper bound for the model cache).
MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        checkpoint("Qwen/Qwen3-0.6B", "0.6B", 1_192_099_840, download_bytes=1_503_264_768),
        checkpoint("Qwen/Qwen3-0.6B-FP8", "0.6B", 751_805_440, "fp8", download_bytes=1_062_970_368),
        checkpoint("Qwen/Qwen3-1.7B", "1.7B", 3_441_149_952, download_bytes=4_063_479_808),
        checkpoint("Qwen/Qwen3-1.7B-FP8", "1.7B", 2_032_207_872, "fp8", download_bytes=2_654_537_728),
        checkpoint("Qwen/Qwen3-4B", "4B", 8_044_936_192),
        checkpoint("Qwen/Qwen3-4B-FP8", "4B", 4_412_507_392, "fp8", download_bytes=5_190_419_712),
        checkpoint("Qwen/Qwen3-4B-AWQ", "4B", 2_665_925_632, "awq", download_bytes=3_443_837_952),
        checkpoint("Qwen/Qwen3-8B", "8B", 16_381_470_720),
        checkpoint("Qwen/Qwen3-8B-FP8", "8B", 9_437_399_040, "fp8"),
        checkpoint("Qwen/Qwen3-8B-AWQ", "8B", 6_098_479_104, "awq"),
        checkpoint("Qwen/Qwen3-14B", "14B", 29_536_614_400),
        checkpoint("Qwen/Qwen3-14B-FP8", "14B", 16_327_782_400, "fp8"),
        checkpoint("Qwen/Qwen3-14B-AWQ", "14B", 9_976_576_000, "awq"),
        checkpoint("Qwen/Qwen3-32B", "32B", 65_530_000_000),  # 32.76e9 parameters in bf16
        # Linear layers in FP8 (block scales), embeddings and lm_head kept in bf16.
        checkpoint("Qwen/Qwen3-32B-FP8", "32B", 34_350_000_000, "fp8"),
        # 4-bit AWQ, group size 128, embeddings and lm_head in fp16.
        checkpoint("Qwen/Qwen3-32B-AWQ", "32B", 19_340_000_000, "awq"),
    )
}


def same_size(model: ModelInfo, stored: str | None) -> ModelInfo | None:
    """The catalog's checkpoint of model's size stored as `stored` (None: bf16), if there is one."""
    return next(
        (m for m in MODELS.values() if m.size == model.size and m.checkpoint_quantization == stored), None
    )


def online_fp8_bytes(model: ModelInfo) -> int:
    """Weight bytes of a 16-bit checkpoint quantized to FP8 at load: its bytes scaled by the ratio of
    the size's FP8 checkpoint to its bf16 one (the linear layers in FP8 with their scales, embeddings
    and lm_head kept in bf16, a tied lm_head once), so a community checkpoint of the size scales alike."""
    fp8, bf16 = same_size(model, "fp8"), same_size(model, None)
    assert fp8 is not None and bf16 is not None, f"the catalog has FP8 and bf16 Qwen3-{model.size}"
    return int(model.weight_bytes * (fp8.weight_bytes / bf16.weight_bytes))


#: Online FP8 of a 16-bit checkpoint in vLLM 0.32 (vllm/config/quantization.py `_ONLINE_SHORTHANDS`):
#: per-tensor or 128x128-block weight scales. `--quantization fp8` on a 16-bit checkpoint is deprecated
#: there (vllm/model_executor/model_loader/weight_utils.py maps it to fp8_per_tensor with a warning), so
#: `fp8` stays the method of a checkpoint stored in FP8.
ONLINE_FP8 = ("fp8_per_tensor", "fp8_per_block")
FP8_METHODS = frozenset({"fp8", *ONLINE_FP8})

#: Quantization methods a checkpoint stored one way can be served with.
COMPATIBLE_QUANTIZATION: dict[str | None, set[str | None]] = {
    None: {None, *ONLINE_FP8},  # bf16 weights, or FP8 quantized on the fly at load time
    "fp8": {"fp8"},
    "awq": {"awq", "awq_marlin"},
    "gptq": {"gptq", "gptq_marlin"},
}


@dataclass(frozen=True)
class GpuInfo:
    """One GPU type: memory as CUDA reports it, FP8 tensor cores, usual node labels."""

    type: str
    memory_bytes: int  # total memory the CUDA runtime reports (what vLLM budgets from)
    fp8_compute: bool  # FP8 tensor cores (W8A8); without them FP8 weights run weight-only (Marlin)
    architecture: str
    product_labels: tuple[str, ...]  # values of nvidia.com/gpu.product from GPU feature discovery
    compute_capability: tuple[int, int] = (0, 0)

    @property
    def fp8_kv_backend(self) -> str | None:
        """The attention backend vLLM 0.32 serves an fp8 KV cache with, when FlashAttention cannot.

        FlashAttention takes an fp8 KV cache only as FA3 on sm90 or FA4 on sm100
        (vllm/v1/attention/backends/fa_utils.py, flash_attn_supports_kv_cache_dtype); elsewhere the
        CUDA platform's next choice is FlashInfer (sm80 to sm121, flashinfer.py
        supports_compute_capability), then Triton (any capability) when FlashInfer is missing
        (vllm/platforms/cuda.py, the backend priority list). None: FlashAttention serves it.
        """
        if self.compute_capability[0] in (9, 10):
            return None
        if self.compute_capability < (8, 0):
            return "Triton"
        return "FlashInfer (or Triton without FlashInfer)"


def _gib(n: float) -> int:
    return int(n * GIB)


# Memory: the CUDA runtime's total (torch "total capacity" in an out-of-memory message, or
# cudaMemGetInfo), from public logs where one exists; docs/gpus-and-quantization.md names each source.
# ECC-on datacenter defaults (an RTX 6000 Ada with ECC off shows about 3 GiB more).
GPUS: dict[str, GpuInfo] = {
    g.type: g
    for g in (
        GpuInfo("A10-24GB", _gib(21.99), False, "Ampere", ("NVIDIA-A10",), (8, 6)),
        GpuInfo("A10G-24GB", _gib(21.99), False, "Ampere", ("NVIDIA-A10G",), (8, 6)),
        GpuInfo("L4-24GB", _gib(21.99), True, "Ada", ("NVIDIA-L4",), (8, 9)),
        GpuInfo("RTX-4090-24GB", _gib(23.65), True, "Ada", ("NVIDIA-GeForce-RTX-4090",), (8, 9)),
        GpuInfo("L40S-48GB", _gib(44.42), True, "Ada", ("NVIDIA-L40S",), (8, 9)),
        GpuInfo("RTX-6000-Ada-48GB", _gib(44.43), True, "Ada", ("NVIDIA-RTX-6000-Ada-Generation",), (8, 9)),
        GpuInfo(
            "A100-40GB",
            _gib(39.50),
            False,
            "Ampere",
            ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
            (8, 0),
        ),
        GpuInfo(
            "A100-80GB",
            _gib(79.14),
            False,
            "Ampere",
            ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
            (8, 0),
        ),
        GpuInfo(
            "H100-80GB", _gib(79.11), True, "Hopper", ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"), (9, 0)
        ),
        GpuInfo("H100-NVL-94GB", _gib(93.00), True, "Hopper", ("NVIDIA-H100-NVL",), (9, 0)),
        GpuInfo("H200-141GB", 143_156 * MIB, True, "Hopper", ("NVIDIA-H200",), (9, 0)),
        GpuInfo("H200-NVL-141GB", 143_156 * MIB, True, "Hopper", ("NVIDIA-H200-NVL",), (9, 0)),
        GpuInfo(
            "RTX-PRO-6000-Blackwell-96GB",
            _gib(94.97),
            True,
            "Blackwell",
            (
                "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
                "NVIDIA-RTX-PRO-6000-Blackwell-Workstation-Edition",
                "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition",
            ),
            (12, 0),
        ),
        GpuInfo("B200-180GB", _gib(178.35), True, "Blackwell", ("NVIDIA-B200",), (10, 0)),
    )
}

#: Architecture by compute capability major version (a GPU declared in the resource names only that).
ARCHITECTURES = {7: "Turing/Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}


def architecture_of(capability: tuple[int, int]) -> str:
    if capability == (8, 9):
        return "Ada"
    return ARCHITECTURES.get(capability[0], f"sm{capability[0]}{capability[1]}")


GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"

#: GKE's accelerator label values of the catalog's GPUs that GKE offers (GKE sets the label on every
#: GPU node; GPU feature discovery is not installed there by default).
GKE_ACCELERATORS: dict[str, tuple[str, ...]] = {
    "L4-24GB": ("nvidia-l4",),
    "A100-40GB": ("nvidia-tesla-a100",),
    "A100-80GB": ("nvidia-a100-80gb",),
    "H100-80GB": ("nvidia-h100-80gb", "nvidia-h100-mega-80gb"),
    "H200-141GB": ("nvidia-h200-141gb",),
    "B200-180GB": ("nvidia-b200",),
    "RTX-PRO-6000-Blackwell-96GB": ("nvidia-rtx-pro-6000",),
}

#: EKS: Karpenter's and EKS Auto Mode's GPU name labels, set from EC2's instance type data (lower case).
KARPENTER_GPU_NAME_LABEL = "karpenter.k8s.aws/instance-gpu-name"
EKS_AUTO_GPU_NAME_LABEL = "eks.amazonaws.com/instance-gpu-name"
#: Their values for the catalog's GPUs on EC2. A100 is left out: p4d (40 GB) and p4de (80 GB) share
#: "a100", which only the instance-gpu-memory label tells apart (a nodeSelector with both does).
EC2_GPU_NAMES: dict[str, tuple[str, ...]] = {
    "A10G-24GB": ("a10g",),
    "L4-24GB": ("l4",),
    "L40S-48GB": ("l40s",),
    "H100-80GB": ("h100",),
    "H200-141GB": ("h200",),
    "B200-180GB": ("b200",),
}


def node_label_values(key: str, gpu: GpuInfo) -> tuple[str, ...]:
    """The values of node label `key` that name `gpu`, where the catalog knows them; () otherwise."""
    if key == GPU_PRODUCT_LABEL:
        return gpu.product_labels
    if key == GKE_ACCELERATOR_LABEL:
        return GKE_ACCELERATORS.get(gpu.type, ())
    if key in (KARPENTER_GPU_NAME_LABEL, EKS_AUTO_GPU_NAME_LABEL):
        return EC2_GPU_NAMES.get(gpu.type, ())
    return ()


#: The node labels whose values the catalog knows, for messages and docs.
KNOWN_NODE_LABELS = (
    GPU_PRODUCT_LABEL,
    GKE_ACCELERATOR_LABEL,
    KARPENTER_GPU_NAME_LABEL,
    EKS_AUTO_GPU_NAME_LABEL,
)
