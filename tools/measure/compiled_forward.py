"""Measure, on one GPU in plain PyTorch, the profile-run terms of vLLM's Model Runner V2 (issue 28).

vLLM 0.32 (and 0.27) run Qwen3 on Model Runner V2 (config/vllm.py use_v2_model_runner). Its profile
run (v1/worker/gpu/model_runner.py profile_run) is one forward of max_num_batched_tokens tokens through
the torch.compile'd model (compiled during that very run, so Inductor's first call is what
memory_profiling sees), then _dummy_sampler_run: compute_logits (lm_head shard, all-gather to the
whole vocabulary on every TP rank) and the V2 Sampler, which for the dummy requests does no float32
copy and no top-k/top-p (nothing needs logits processing), only the Gumbel-max Triton kernel.

This script measures, as memory_profiling charges it (torch peak above what stays allocated):
1. the forward of two Qwen3-32B decoder layers of one TP shard (8,192 tokens), eager and compiled
   with Inductor (first call, which compiles and autotunes, and second call), at TP 1 and TP 2;
   ops as vLLM runs them with its custom ops off under Inductor (native RMSNorm, SiluAndMul, neox
   RoPE), attention an opaque op that only has its output buffer (skipped in the profile run), the
   TP all-reduce an opaque out-of-place op;
2. the V2 dummy sampler pass over max_num_seqs rows: logits shard, the all-gather's output buffer
   and its permuted copy (device_communicators/cuda_communicator.py all_gather), the Gumbel kernel's
   two small per-block buffers.

3. the non-torch memory the compiled calls add (Inductor's Triton kernels loaded as modules).

Run: python3 tools/measure/compiled_forward.py > tools/measure/compiled_forward.out.txt
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.library import custom_op

GIB = 2**30
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 5120, 64, 8, 128, 25600, 151936
POSITIONS = 40960
DT = torch.bfloat16
TOKENS, ROWS = 8192, 1024


@custom_op("measure::attention", mutates_args=("out",))
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """vLLM's profile run skips attention (attn_metadata is None): only the output buffer exists."""


@attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    return None


@custom_op("measure::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Out of place, as vLLM's pynccl all-reduce (a fresh output tensor)."""
    return x.clone()


@all_reduce.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + 1e-6)).to(x.dtype) * w


def rope(positions: torch.Tensor, x: torch.Tensor, cache: torch.Tensor, heads: int) -> torch.Tensor:
    cos, sin = cache[positions].chunk(2, dim=-1)
    x = x.view(-1, heads, HEAD_DIM)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(1)


def weight(*shape: int) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(*shape, dtype=DT, device="cuda") * 0.02, requires_grad=False)


class Layer(torch.nn.Module):
    def __init__(self, tp: int) -> None:
        super().__init__()
        self.tp, self.heads, self.kv, self.inter = tp, HEADS // tp, KV_HEADS // tp, INTER // tp
        self.qkv = weight((self.heads + 2 * self.kv) * HEAD_DIM, HIDDEN)
        self.o = weight(HIDDEN, self.heads * HEAD_DIM)
        self.gate_up = weight(2 * self.inter, HIDDEN)
        self.down = weight(HIDDEN, self.inter)
        self.norm1, self.norm2 = weight(HIDDEN), weight(HIDDEN)
        self.q_norm, self.k_norm = weight(HEAD_DIM), weight(HEAD_DIM)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(x) if self.tp > 1 else x

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None, cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x if residual is None else x + residual
        h = rms(residual, self.norm1)
        q, k, v = (h @ self.qkv.T).split([self.heads * HEAD_DIM, self.kv * HEAD_DIM, self.kv * HEAD_DIM], -1)
        q = rms(q.reshape(-1, self.heads, HEAD_DIM), self.q_norm).flatten(1)
        k = rms(k.reshape(-1, self.kv, HEAD_DIM), self.k_norm).flatten(1)
        q, k = rope(positions, q, cache, self.heads), rope(positions, k, cache, self.kv)
        out = torch.empty(x.shape[0], self.heads * HEAD_DIM, dtype=DT, device=x.device)
        attention(q, k, v.contiguous(), out)
        residual = self.reduce(out @ self.o.T) + residual
        gate_up = rms(residual, self.norm2) @ self.gate_up.T
        y = F.silu(gate_up[:, : self.inter]) * gate_up[:, self.inter :]
        return self.reduce(y @ self.down.T), residual


class Model(torch.nn.Module):
    """Embedding shard, two decoder layers (the peak is one layer's), final norm."""

    def __init__(self, tp: int) -> None:
        super().__init__()
        self.tp = tp
        self.embed = weight(VOCAB // tp, HIDDEN)
        self.layers = torch.nn.ModuleList(Layer(tp) for _ in range(2))
        self.norm = weight(HIDDEN)
        self.register_buffer("cache", torch.randn(POSITIONS, HEAD_DIM, dtype=DT, device="cuda"))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids % (VOCAB // self.tp), self.embed)
        x = all_reduce(x) if self.tp > 1 else x
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, self.cache)
        return rms(x + residual, self.norm)


def transient_peak(fn) -> int:  # type: ignore[no-untyped-def]
    """What memory_profiling charges for fn: torch's peak above what stays allocated after it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()


def non_torch() -> int:
    """Device memory in use that torch's allocator does not hold (kernel modules, handles)."""
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def forward_peaks(tp: int) -> None:
    model = Model(tp)
    ids = torch.randint(0, VOCAB, (TOKENS,), device="cuda")
    positions = torch.arange(TOKENS, device="cuda") % POSITIONS
    eager = transient_peak(lambda: model(ids, positions))
    before = non_torch()
    compiled = torch.compile(model, dynamic=True)
    first = transient_peak(lambda: compiled(ids, positions))
    second = transient_peak(lambda: compiled(ids, positions))
    print(f"non-torch increase over the compiled calls, TP {tp}: {(non_torch() - before) / 2**20:.1f} MiB")
    for name, peak in (("eager", eager), ("compiled, 1st call", first), ("compiled, 2nd call", second)):
        print(
            f"forward TP {tp}, {TOKENS} tokens, {name}: {peak / GIB:.3f} GiB = "
            f"{peak / TOKENS:,.0f} B per token"
        )


def v2_sampler_pass(tp: int, hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """compute_logits (all-gather into a [tp x rows, V/tp] buffer, then the permuted copy), then
    gumbel_sample's int64 and float32 [rows, ceil(V/1024)] buffers (v1/worker/gpu/sample/gumbel.py)."""
    rows = hidden.shape[0]
    logits = hidden @ lm_head.T
    if tp > 1:  # the shard stays referenced by the caller until all_gather returns
        gathered = torch.empty((tp * rows, logits.shape[1]), dtype=DT, device="cuda")
        for rank in range(tp):  # stands in for all_gather_into_tensor
            gathered[rank * rows : (rank + 1) * rows].copy_(logits)
        logits = gathered.reshape(tp, rows, -1).movedim(0, 1).reshape(rows, -1)
        del gathered
    blocks = -(-VOCAB // 1024)
    local_argmax = logits.new_empty(rows, blocks, dtype=torch.int64)
    local_max = logits.new_empty(rows, blocks, dtype=torch.float32)
    values, index = logits.max(-1)  # the kernel's per-block maxima, reduced at once here
    local_max[:, 0], local_argmax[:, 0] = values.float(), index
    return local_argmax.gather(-1, local_max.argmax(-1, keepdim=True))


def sampler_peaks(tp: int) -> None:
    lm_head = torch.randn(VOCAB // tp, HIDDEN, dtype=DT, device="cuda")
    hidden = torch.randn(ROWS, HIDDEN, dtype=DT, device="cuda")
    peak = transient_peak(lambda: v2_sampler_pass(tp, hidden, lm_head))
    rows_vocab = ROWS * VOCAB
    print(
        f"V2 sampler pass TP {tp}, {ROWS} rows: {peak / GIB:.3f} GiB = {peak / rows_vocab:.3f} B per row "
        f"per vocabulary entry (source: 2 x (1/TP + 2) = {2 * (1 / tp + 2):.3f} at TP > 1, 2 at TP 1)"
    )


def main() -> None:
    props = torch.cuda.get_device_properties(0)
    print("device:", props.name, "torch", torch.__version__)
    for tp in (1, 2):
        sampler_peaks(tp)
    for tp in (1, 2):
        forward_peaks(tp)  # its model is freed on return
        torch._dynamo.reset()


if __name__ == "__main__":
    sys.exit(main())
