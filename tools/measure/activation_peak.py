# ruff: noqa: B007, B023, F821  (loop-local lambdas run at once; kept as run for the raw output beside it)
"""Measure the memory vLLM's start-up profile run takes for a Qwen3 shape, per GPU, by tensor parallel size.

vLLM (0.32, gpu_worker.determine_available_memory) runs one dummy forward of max_num_batched_tokens
tokens and a dummy sampler pass of max_num_seqs rows, and takes the torch peak above what stays
allocated afterwards ("transient peak headroom") out of the KV cache budget. This script rebuilds
that pass for one tensor-parallel shard of a real shape (Qwen3-32B by default: hidden 5120, 64 q / 8 kv
heads of 128, intermediate 25600, vocabulary 151936, bf16, random weights) in plain PyTorch on one GPU:

- forward: embedding shard, two decoder layers (activations are freed between layers, so the peak
  is one layer's), final norm, the lm_head on the last max_num_seqs rows. The ops follow vLLM's
  Qwen3 layer (fused add+RMSNorm in place, out-of-place q/k norms, SiluAndMul producing a new
  tensor, out-of-place all-reduce outputs simulated with a copy at TP > 1). Attention is skipped as
  vLLM skips it in the profile run (attn_metadata is None: the output buffer is allocated only).
  Fused element-wise kernels are emulated in row chunks so no full-size fp32 temporary appears.
  Above 8 KV heads per model, TP shards them; beyond, each GPU holds one replicated KV head, as vLLM's
  QKVParallelLinear does.
- sampler: logits gathered to the whole vocabulary, two passes as _dummy_sampler_run does (float32
  copy, temperature, softmax probabilities, exponential noise), plus the sort-based top-k/top-p
  fallback as an upper bound.
- prefill time: one layer shard with real causal attention (SDPA), timed, for the achieved TFLOP/s.

Run (the 32B's full measurement, as recorded):
    python3 tools/measure/activation_peak.py > tools/measure/activation_peak.out.txt
Every size of the catalog (operator/qwen_operator/api/catalog.py SHAPES), the forward only, at every
tensor parallel size vLLM accepts for it up to 16:
    python3 tools/measure/activation_peak.py --family > tools/measure/activation_peak.family.out.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclass(frozen=True)
class Dims:
    """The shapes the pass depends on (config.json names in the comments)."""

    hidden: int  # hidden_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int
    inter: int  # intermediate_size
    vocab: int  # vocab_size


QWEN3_32B = Dims(hidden=5120, heads=64, kv_heads=8, head_dim=128, inter=25600, vocab=151936)
#: The 32B's dimensions as module names (runtime_terms.py imports them; main() measures the 32B).
HIDDEN, HEADS, KV_HEADS = QWEN3_32B.hidden, QWEN3_32B.heads, QWEN3_32B.kv_heads
HEAD_DIM, INTER, VOCAB = QWEN3_32B.head_dim, QWEN3_32B.inter, QWEN3_32B.vocab
DT = torch.bfloat16
DEV = "cuda"
CHUNK = 1024  # rows per chunk for emulated fused element-wise kernels
GIB = 1024**3


def rms_norm_into(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    for i in range(0, x.shape[0], CHUNK):
        xs = x[i : i + CHUNK].float()
        out[i : i + CHUNK] = (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6)).to(DT) * w
    return out


def fused_add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> None:
    for i in range(0, x.shape[0], CHUNK):
        residual[i : i + CHUNK] += x[i : i + CHUNK]
        xs = residual[i : i + CHUNK].float()
        x[i : i + CHUNK] = (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6)).to(DT) * w


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    d = gate_up.shape[1] // 2
    out = torch.empty(gate_up.shape[0], d, dtype=DT, device=DEV)
    for i in range(0, gate_up.shape[0], CHUNK):
        g = gate_up[i : i + CHUNK]
        out[i : i + CHUNK] = F.silu(g[:, :d]) * g[:, d:]
    return out


def rope_(x: torch.Tensor, heads: int, head_dim: int = HEAD_DIM) -> None:
    """Neox-style rotary embedding in place (positions arbitrary: only memory matters)."""
    for i in range(0, x.shape[0], CHUNK):
        v = x[i : i + CHUNK].view(-1, heads, head_dim)
        a, b = v[..., : head_dim // 2], v[..., head_dim // 2 :]
        ra, rb = a * 0.5 - b * 0.5, b * 0.5 + a * 0.5
        a.copy_(ra)
        b.copy_(rb)


class Shard:
    """Weights of one TP shard: embedding, layers, final norm, lm_head."""

    def __init__(self, tp: int, layers: int = 2, dims: Dims = QWEN3_32B) -> None:
        self.tp, self.d = tp, dims
        hidden, hd, vocab = dims.hidden, dims.head_dim, dims.vocab
        # Beyond the KV heads vLLM replicates them: one per GPU (QKVParallelLinear).
        self.q, self.kv = dims.heads // tp, max(1, dims.kv_heads // tp)
        r = lambda *s: torch.randn(*s, dtype=DT, device=DEV) * 0.02  # noqa: E731
        self.embed = r(vocab // tp, hidden)
        self.lm_head = r(vocab // tp, hidden)
        self.final_norm = torch.ones(hidden, dtype=DT, device=DEV)
        self.layers = [
            dict(
                ln1=torch.ones(hidden, dtype=DT, device=DEV),
                ln2=torch.ones(hidden, dtype=DT, device=DEV),
                qkv=r((self.q + 2 * self.kv) * hd, hidden),
                qn=torch.ones(hd, dtype=DT, device=DEV),
                kn=torch.ones(hd, dtype=DT, device=DEV),
                o=r(hidden, self.q * hd),
                gate_up=r(2 * dims.inter // tp, hidden),
                down=r(hidden, dims.inter // tp),
            )
            for _ in range(layers)
        ]

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        # vLLM's tensor_model_parallel_all_reduce is out-of-place: a new tensor of the same shape.
        return x.clone() if self.tp > 1 else x

    def attention(self, L: dict, x: torch.Tensor, real: bool) -> torch.Tensor:
        n, hd = x.shape[0], self.d.head_dim
        qkv = x @ L["qkv"].T
        q, k, v = qkv.split([self.q * hd, self.kv * hd, self.kv * hd], dim=-1)
        # Qwen3's per-head q/k RMSNorm: out-of-place on a per-head view of the fused qkv output.
        q = rms_norm_into(q.view(n, self.q, hd), L["qn"], torch.empty(n, self.q, hd, dtype=DT, device=DEV))
        k = rms_norm_into(k.view(n, self.kv, hd), L["kn"], torch.empty(n, self.kv, hd, dtype=DT, device=DEV))
        q, k = q.view(n, -1), k.view(n, -1)
        rope_(q, self.q, hd)
        rope_(k, self.kv, hd)
        if real:
            group = self.q // self.kv  # GQA: repeat the KV heads so the flash kernel applies
            kk = k.view(1, n, self.kv, hd).transpose(1, 2).repeat_interleave(group, dim=1)
            vv = v.view(1, n, self.kv, hd).transpose(1, 2).repeat_interleave(group, dim=1)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(
                    q.view(1, n, self.q, hd).transpose(1, 2), kk, vv, is_causal=True
                )
            attn = o.transpose(1, 2).reshape(n, self.q * hd)
        else:  # profile run: attention backend returns its (allocated) output buffer untouched
            attn = torch.empty(n, self.q * hd, dtype=DT, device=DEV)
        out = attn @ L["o"].T
        return self.all_reduce(out)

    def mlp(self, L: dict, x: torch.Tensor) -> torch.Tensor:
        gate_up = x @ L["gate_up"].T
        act = silu_and_mul(gate_up)
        down = act @ L["down"].T
        return self.all_reduce(down)

    def forward(self, ids: torch.Tensor, real_attention: bool = False) -> torch.Tensor:
        shard_vocab = self.d.vocab // self.tp
        local = (ids % shard_vocab).clamp_(0, shard_vocab - 1)
        hidden = self.all_reduce(F.embedding(local, self.embed))
        residual = None
        for L in self.layers:
            if residual is None:
                residual = hidden
                hidden = rms_norm_into(hidden, L["ln1"], torch.empty_like(hidden))
            else:
                fused_add_rms_norm_(hidden, residual, L["ln1"])
            hidden = self.attention(L, hidden, real_attention)
            fused_add_rms_norm_(hidden, residual, L["ln2"])
            hidden = self.mlp(L, hidden)
        fused_add_rms_norm_(hidden, residual, self.final_norm)
        return hidden


def sampler_pass(shard: Shard, last_hidden: torch.Tensor, sort_fallback: bool) -> None:
    """vLLM's _dummy_sampler_run: logits for max_num_seqs rows, then two sampler passes."""
    h = torch.rand_like(last_hidden)
    logits = h @ shard.lm_head.T  # [S, V/TP] bf16
    if shard.tp > 1:  # gather to the whole vocabulary on the first rank
        logits = torch.cat([logits] * shard.tp, dim=1)
    for generators in (False, True):
        l32 = logits.to(torch.float32)
        l32.argmax(dim=-1)  # greedy sample
        l32.div_(0.5)  # temperature, in place
        if sort_fallback:
            srt, idx = l32.sort(dim=-1)
            probs_sort = srt.softmax(dim=-1)
            torch.cumsum(probs_sort, dim=-1, out=probs_sort)
            mask = probs_sort <= 0.1
            srt.masked_fill_(mask, -float("inf"))
            l32.scatter_(dim=-1, index=idx, src=srt)
            del srt, idx, probs_sort, mask
        probs = l32.softmax(dim=-1, dtype=torch.float32)
        q = torch.empty_like(probs).exponential_()
        probs.div_(q).argmax(dim=-1)
        del l32, probs, q
    del logits


def transient_peak(fn) -> int:
    """Peak allocated during fn above what was allocated before it (what vLLM charges)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def slope(points: list[tuple[int, int]]) -> float:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def main() -> None:
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    _free, total = torch.cuda.mem_get_info()
    print(f"cudaMemGetInfo total {total} B = {total / 2**20:.0f} MiB = {total / GIB:.3f} GiB")
    results: dict = {"forward": {}, "sampler": {}, "prefill_timing": {}}
    for tp in (1, 2, 4):
        shard = Shard(tp)
        pts = []
        for n in (2048, 8192, 32768, 65536, 131072):
            ids = torch.randint(0, VOCAB, (n,), device=DEV)
            try:
                peak = transient_peak(lambda: shard.forward(ids))
            except torch.OutOfMemoryError:
                print(f"TP {tp} N {n}: OOM")
                continue
            pts.append((n, peak))
            print(f"forward TP {tp} N {n:>6}: transient peak {peak / GIB:7.3f} GiB = {peak / n:9.0f} B/token")
            del ids
        s = slope(pts)
        results["forward"][tp] = {"points": pts, "slope_bytes_per_token": s}
        print(f"forward TP {tp}: least-squares slope {s:.0f} B/token = {s / 1024:.1f} KiB/token")
        for seqs in (128, 256, 512, 1024):
            hidden = torch.randn(seqs, HIDDEN, dtype=DT, device=DEV)
            fast = transient_peak(lambda: sampler_pass(shard, hidden, sort_fallback=False))
            srt = transient_peak(lambda: sampler_pass(shard, hidden, sort_fallback=True))
            results["sampler"].setdefault(tp, []).append((seqs, fast, srt))
            print(
                f"sampler TP {tp} max_num_seqs {seqs:>4}: {fast / GIB:6.3f} GiB "
                f"({fast / (seqs * VOCAB):.2f} B per row x vocab); sort fallback {srt / GIB:6.3f} GiB "
                f"({srt / (seqs * VOCAB):.2f} B)"
            )
        del shard
        torch.cuda.empty_cache()
    # Prefill step time of one whole-model step, from one layer with real causal attention.
    shard = Shard(1, layers=1)
    peak_tflops = None
    a = torch.randn(8192, 8192, dtype=DT, device=DEV)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    peak_tflops = 10 * 2 * 8192**3 / (time.perf_counter() - t) / 1e12
    del a
    print(f"bf16 8192^3 matmul: {peak_tflops:.0f} TFLOP/s")
    for n in (8192, 32768, 131072):
        ids = torch.randint(0, VOCAB, (n,), device=DEV)
        hidden = F.embedding(ids, shard.embed)
        L = shard.layers[0]

        def layer() -> None:
            x = shard.attention(L, hidden, real=True)
            shard.mlp(L, x)

        try:
            layer()
        except Exception as exc:  # report and go on: the memory figures above are the main result
            print(f"prefill TP 1 N {n}: {type(exc).__name__}: {exc}")
            continue
        torch.cuda.synchronize()
        t = time.perf_counter()
        reps = 3
        for _ in range(reps):
            layer()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) / reps
        linear = (
            2
            * n
            * (HIDDEN * (HEADS + 2 * KV_HEADS) * HEAD_DIM + HEADS * HEAD_DIM * HIDDEN + 3 * HIDDEN * INTER)
        )
        attn = 2 * 2 * HEADS * HEAD_DIM * n * n / 2  # QK^T and PV, causal half
        flops = linear + attn
        results["prefill_timing"][n] = {"layer_s": dt, "layer_flop": flops, "tflops": flops / dt / 1e12}
        print(
            f"prefill TP 1 one layer N {n:>6}: {dt * 1e3:8.1f} ms, {flops / 1e12:7.1f} TFLOP, "
            f"{flops / dt / 1e12:5.0f} TFLOP/s ({flops / dt / 1e12 / peak_tflops:.0%} of the matmul rate); "
            f"x64 layers = {dt * 64:.2f} s"
        )
        del ids, hidden
    print("JSON", json.dumps(results))


def valid_tensor_parallel_sizes(d: Dims, limit: int = 16) -> list[int]:
    """vLLM 0.32's rule (config/model.py, model_executor/layers/linear.py): tp divides the attention
    heads and the intermediate size, and the KV heads divide by tp or tp by them (replication)."""
    kv_ok = lambda tp: d.kv_heads % tp == 0 if tp <= d.kv_heads else tp % d.kv_heads == 0  # noqa: E731
    return [tp for tp in range(1, limit + 1) if d.heads % tp == 0 and d.inter % tp == 0 and kv_ok(tp)]


def catalog_dims() -> dict[str, Dims]:
    """Every size of the operator's catalog (the single source of the shapes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator"))
    from qwen_operator.api.catalog import SHAPES

    return {
        f"Qwen3-{s.size}": Dims(
            hidden=s.hidden_size,
            heads=s.num_attention_heads,
            kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            inter=s.intermediate_size,
            vocab=s.vocab_size,
        )
        for s in SHAPES.values()
    }


def family() -> None:
    """The forward's transient peak for every catalog size at every tensor parallel size vLLM accepts."""
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    results: dict = {}
    for name, d in catalog_dims().items():
        print(f"{name}: {d}")
        for tp in valid_tensor_parallel_sizes(d):
            shard = Shard(tp, dims=d)
            pts = []
            for n in (8192, 32768, 131072):
                ids = torch.randint(0, d.vocab, (n,), device=DEV)
                peak = transient_peak(lambda: shard.forward(ids))
                pts.append((n, peak))
                print(
                    f"forward {name} TP {tp:>2} N {n:>6}: transient peak {peak / GIB:7.3f} GiB = "
                    f"{peak / n:10.1f} B/token"
                )
                del ids
            results.setdefault(name, {})[tp] = pts
            del shard
            torch.cuda.empty_cache()
    print("JSON", json.dumps(results))


if __name__ == "__main__":
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--family", action="store_true", help="every catalog size, the forward only")
    sys.exit(family() if parser.parse_args().family else main())
