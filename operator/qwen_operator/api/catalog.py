"""Facts about the models and GPUs the operator plans for.

Architecture numbers come from each checkpoint's config.json; weight sizes are the bytes of the
published safetensors. GPU memory is what the driver reports (nvidia-smi "Total"), not the marketing
figure, because the KV budget is computed from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import versions

GIB = 1024**3
MIB = 1024**2

#: Version of vLLM whose argument parser the tests use; the default engine image carries the same tag.
VLLM_VERSION = versions.VLLM
DEFAULT_ENGINE_IMAGE = versions.ENGINE_IMAGE

#: Qwen3's native context window and the longest window YaRN rope scaling is validated for.
NATIVE_CONTEXT = 32_768
MAX_CONTEXT = 131_072


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


def _qwen3_32b(name: str, weight_bytes: int, checkpoint_quantization: str | None) -> ModelInfo:
    """A Qwen3-32B checkpoint: same architecture, different storage."""
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
        _qwen3_32b("Qwen/Qwen3-32B", 65_530_000_000, None),  # 32.76e9 parameters in bf16
        # Linear layers in FP8 (block scales), embeddings and lm_head kept in bf16.
        _qwen3_32b("Qwen/Qwen3-32B-FP8", 34_350_000_000, "fp8"),
        # 4-bit AWQ, group size 128, embeddings and lm_head in fp16.
        _qwen3_32b("Qwen/Qwen3-32B-AWQ", 19_340_000_000, "awq"),
    )
}

#: Draft models for speculative decoding whose weights the planner knows (bf16 bytes).
DRAFT_MODEL_BYTES: dict[str, int] = {
    "Qwen/Qwen3-0.6B": 1_500_000_000,
    "Qwen/Qwen3-1.7B": 4_060_000_000,
    "Qwen/Qwen3-4B": 8_050_000_000,
}

#: Quantization methods a checkpoint stored one way can be served with.
COMPATIBLE_QUANTIZATION: dict[str | None, set[str | None]] = {
    None: {None, "fp8"},  # bf16 weights, or FP8 quantized on the fly at load time
    "fp8": {"fp8"},
    "awq": {"awq", "awq_marlin"},
    "gptq": {"gptq", "gptq_marlin"},
}

#: Bytes per weight parameter after loading, per serving quantization (used for on-the-fly FP8).
ONLINE_FP8_RATIO = 34_350_000_000 / 65_530_000_000


@dataclass(frozen=True)
class GpuInfo:
    """One GPU type: memory the driver reports, FP8 tensor cores, usual node labels."""

    type: str
    memory_bytes: int
    fp8_compute: bool
    architecture: str
    product_labels: tuple[str, ...]  # values of nvidia.com/gpu.product from GPU feature discovery


GPUS: dict[str, GpuInfo] = {
    g.type: g
    for g in (
        GpuInfo("A10-24GB", 23_028 * MIB, False, "Ampere", ("NVIDIA-A10",)),
        GpuInfo("L4-24GB", 23_034 * MIB, True, "Ada", ("NVIDIA-L4",)),
        GpuInfo("L40S-48GB", 46_068 * MIB, True, "Ada", ("NVIDIA-L40S",)),
        GpuInfo(
            "A100-40GB", 40_960 * MIB, False, "Ampere", ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB")
        ),
        GpuInfo(
            "A100-80GB", 81_920 * MIB, False, "Ampere", ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe")
        ),
        GpuInfo("H100-80GB", 81_559 * MIB, True, "Hopper", ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe")),
        GpuInfo("H200-141GB", 143_771 * MIB, True, "Hopper", ("NVIDIA-H200",)),
    )
}

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
