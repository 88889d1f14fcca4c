"""GPU memory vLLM 0.32 reserves for LoRA adapters on one GPU, term by term (docs/capacity-planning.md).

vLLM allocates every slot at start-up (vllm/lora/model_manager.py `LoRAModelManager._create_lora_modules`,
called from `GPUModelRunner.load_model` through `load_lora_model`, so it is counted with the weights,
before the KV cache is sized): for each of maxLoras slots, an A and a B matrix of maxLoraRank in every
module it targets, in the model's dtype, whatever rank the adapters loaded later have.

Targets with no --lora-target-modules (vllm/lora/utils.py `get_supported_lora_modules`): every linear
layer (qkv_proj, o_proj, gate_up_proj, down_proj) plus the model class's `embedding_modules`, which for
Qwen3ForCausalLM are embed_tokens and lm_head (model_executor/models/qwen3.py). Shapes per GPU at tensor
parallel size TP, without --fully-sharded-loras (vllm/lora/layers/):
    column-parallel (qkv_proj: 3 slices, gate_up_proj: 2), base_linear.py / column_parallel_linear.py:
        A = rank x hidden per slice, on every GPU;  B = (its output / TP) x rank
    row-parallel (o_proj, down_proj), row_parallel_linear.py:
        A = rank x (its input / TP);  B = hidden x rank, on every GPU
    embed_tokens (vocab_parallel_embedding.py):  A = vocab x rank, B = hidden x rank, on every GPU
    lm_head (logits_processor.py, LogitsProcessorWithLoRA): A = rank x hidden, B = vocab x rank, every GPU
Measured on the real package (tools/measure/lora_slots.py): the sum matches at TP 1 and TP 2.
"""

from __future__ import annotations

from dataclasses import dataclass

from .catalog import ModelInfo

#: LoRA weights are in the model's dtype (config/lora.py `verify_with_model_config`, lora_dtype "auto"):
#: bfloat16, float16 for AWQ; --lora-dtype allows only those two and --dtype is refused.
LORA_DTYPE_BYTES = 2
#: With LoRA on, vLLM captures each CUDA graph with and without adapters (v1/cudagraph_dispatcher.py
#: `_get_lora_cases`: [0, maxLoras + 1] with cudagraph_specialize_lora, the default), so its estimate
#: grows by at least its 1 MiB floor per graph (gpu_model_runner.py `profile_cudagraph_memory`) for the
#: 51 PIECEWISE + 51 FULL graphs of the default capture sizes. A lower bound: the per-graph figure of a
#: LoRA capture of this model is not measured.
EXTRA_CUDA_GRAPHS = 102
CUDA_GRAPH_FLOOR_BYTES = 2**20
#: vLLM pads the vocabulary to a multiple of 64 (model_executor/layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64


@dataclass(frozen=True)
class LoraShapes:
    """The sizes of Qwen3's layers that LoRA slots take their shapes from."""

    hidden: int
    intermediate: int
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, model: ModelInfo) -> LoraShapes:
        return cls(
            hidden=model.hidden_size,
            intermediate=model.intermediate_size,
            layers=model.num_layers,
            attention_heads=model.num_attention_heads,
            kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            vocab=model.vocab_size,
        )

    def layer_elements(self, tp: int) -> int:
        """Elements of one slot of rank 1 in one decoder layer, on one GPU."""
        h, i = self.hidden, self.intermediate
        q = self.attention_heads // tp * self.head_dim
        kv = max(1, self.kv_heads // tp) * self.head_dim  # fewer KV heads than GPUs: replicated
        qkv = 3 * h + (q + 2 * kv)
        o_proj = q + h
        gate_up = 2 * h + 2 * i // tp
        down = i // tp + h
        return qkv + o_proj + gate_up + down

    def vocab_elements(self) -> int:
        """Elements of one slot of rank 1 in embed_tokens, or in lm_head: unsharded on every GPU."""
        return self.vocab + self.hidden


@dataclass(frozen=True)
class LoraMemory:
    """What LoRA takes on the GPU of a replica that holds the most of it (bytes)."""

    slot_bytes: int  # A and B of maxLoras slots at maxLoraRank in every targeted module
    index_bytes: int  # the punica wrapper's index buffers, sized by the batch
    shrink_buffer_bytes: int  # float32 rank-wide buffer of a LoRA linear during the profile forward
    cuda_graph_bytes: int  # the graphs captured a second time with adapters (a lower bound)

    @property
    def total_bytes(self) -> int:
        return self.slot_bytes + self.index_bytes + self.shrink_buffer_bytes + self.cuda_graph_bytes


def slot_bytes(shapes: LoraShapes, tp: int, pp: int, max_loras: int, max_lora_rank: int) -> int:
    """A and B of every slot on the GPU that holds the most: a pipeline stage has ceil(layers / PP)
    decoder layers, and embed_tokens (first stage) and lm_head (last stage) are on the same stage only
    without PP."""
    stage_layers = -(-shapes.layers // pp)
    vocab_modules = 2 if pp == 1 else 1
    elements = stage_layers * shapes.layer_elements(tp) + vocab_modules * shapes.vocab_elements()
    return max_loras * max_lora_rank * elements * LORA_DTYPE_BYTES


def index_bytes(shapes: LoraShapes, tp: int, max_loras: int, batched_tokens: int, max_num_seqs: int) -> int:
    """Index tensors of lora/punica_wrapper/punica_base.py (four int64 per batched token, three per
    sequence) and punica_gpu.py (two LoRAKernelMeta: two int32 per batched token, three per slot), and
    at TP > 1 lm_head's int64 map from the gathered vocabulary to token ids (logits_processor.py)."""
    base = 4 * batched_tokens * 8 + 3 * max_num_seqs * 8
    kernel_meta = 2 * (2 * batched_tokens * 4 + (3 * max_loras + 4) * 4)
    padded_vocab = -(-shapes.vocab // VOCAB_PADDING) * VOCAB_PADDING
    return base + kernel_meta + (padded_vocab * 8 if tp > 1 else 0)


def lora_memory(
    model: ModelInfo,
    tp: int,
    pp: int,
    max_loras: int,
    max_lora_rank: int,
    batched_tokens: int,
    max_num_seqs: int,
    cuda_graphs: bool = True,
) -> LoraMemory:
    """LoRA's memory on one GPU of a replica. The shrink buffer: each LoRA linear allocates a float32
    (slices x tokens x rank) buffer per call (punica_gpu.py `add_lora_linear`), even with no adapter
    active, so the profile forward of maxNumBatchedTokens tokens has one alive; only down_proj's (one
    slice) is at the forward's peak, and at TP > 1 it is freed before the larger all-reduce output, so
    this counts it whether or not it raises the peak (it is at most 2 KiB per batched token)."""
    shapes = LoraShapes.of(model)
    return LoraMemory(
        slot_bytes=slot_bytes(shapes, tp, pp, max_loras, max_lora_rank),
        index_bytes=index_bytes(shapes, tp, max_loras, batched_tokens, max_num_seqs),
        shrink_buffer_bytes=batched_tokens * max_lora_rank * 4,
        cuda_graph_bytes=EXTRA_CUDA_GRAPHS * CUDA_GRAPH_FLOOR_BYTES if cuda_graphs else 0,
    )
