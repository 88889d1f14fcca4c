"""Facts about the models and GPUs the operator plans for.

Architecture numbers come from each checkpoint's config.json; weight sizes are the bytes of the
published safetensors. GPU memory is the total the CUDA runtime reports (torch.cuda.mem_get_info, which
vLLM multiplies by gpu_memory_utilization), a little below nvidia-smi's "Total" and well below the
marketing figure, because the KV budget is computed from it. docs/gpus-and-quantization.md cites each.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import versions

GIB = 1024**3
MIB = 1024**2

#: Version of vLLM whose argument parser the tests use; the default engine image carries the same tag.
VLLM_VERSION = versions.VLLM
DEFAULT_ENGINE_IMAGE = versions.ENGINE_IMAGE

#: Qwen3's native context window (YaRN's original_max_position_embeddings) and the longest window
#: YaRN rope scaling is validated for.
NATIVE_CONTEXT = 32_768
MAX_CONTEXT = 131_072
#: max_position_embeddings of Qwen3-32B's config.json: vLLM accepts a maxModelLen up to this without
#: rope scaling, so YaRN is applied only above it.
CONFIG_MAX_POSITIONS = 40_960


@dataclass(frozen=True)
class ModelInfo:
    """One checkpoint: architecture numbers, the weight bytes it loads, and its own quantization."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    weight_bytes: int
    checkpoint_quantization: str | None  # quantization the checkpoint is stored in (None: bf16)
    parameters: float

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        """K and V for every layer and KV head of one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes


def qwen3_32b_checkpoint(name: str, weight_bytes: int, checkpoint_quantization: str | None) -> ModelInfo:
    """A Qwen3-32B checkpoint: same architecture, different storage (a community one included)."""
    return ModelInfo(
        name=name,
        hidden_size=5120,
        num_layers=64,
        num_attention_heads=64,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=151_936,
        weight_bytes=weight_bytes,
        checkpoint_quantization=checkpoint_quantization,
        parameters=32.8e9,
    )


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        qwen3_32b_checkpoint("Qwen/Qwen3-32B", 65_530_000_000, None),  # 32.76e9 parameters in bf16
        # Linear layers in FP8 (block scales), embeddings and lm_head kept in bf16.
        qwen3_32b_checkpoint("Qwen/Qwen3-32B-FP8", 34_350_000_000, "fp8"),
        # 4-bit AWQ, group size 128, embeddings and lm_head in fp16.
        qwen3_32b_checkpoint("Qwen/Qwen3-32B-AWQ", 19_340_000_000, "awq"),
    )
}

#: Draft models for speculative decoding whose weights the planner knows (bf16 bytes).
DRAFT_MODEL_BYTES: dict[str, int] = {
    "Qwen/Qwen3-0.6B": 1_500_000_000,
    "Qwen/Qwen3-1.7B": 4_060_000_000,
    "Qwen/Qwen3-4B": 8_050_000_000,
}

#: Layers of each draft model (config.json num_hidden_layers; all three have 8 KV heads of 128): vLLM
#: puts the drafter's attention layers in the same KV pool as the target's, so every cached token
#: also holds the drafter's K and V: 2 x layers x 8 x 128 x 2 B = 112 KiB (0.6B, 1.7B), 144 KiB (4B).
DRAFT_MODEL_LAYERS: dict[str, int] = {"Qwen/Qwen3-0.6B": 28, "Qwen/Qwen3-1.7B": 28, "Qwen/Qwen3-4B": 36}
DRAFT_MODEL_KV_HEADS, DRAFT_MODEL_HEAD_DIM = 8, 128
#: max_position_embeddings of the draft models' config.json; they carry no rope scaling.
DRAFT_MODEL_MAX_POSITIONS = 40_960

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

#: Bytes per weight parameter after loading, per serving quantization (used for on-the-fly FP8): the
#: linear layers in FP8, embeddings and lm_head in bf16, as in the FP8 checkpoint.
ONLINE_FP8_RATIO = 34_350_000_000 / 65_530_000_000


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
