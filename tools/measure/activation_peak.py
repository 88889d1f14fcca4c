# ruff: noqa: B007, B023, F821  (loop-local lambdas run at once; kept as run for the raw output beside it)
"""Measure the memory vLLM's start-up profile run takes for Qwen3-32B, per GPU, at TP 1, 2 and 4.

vLLM (0.32, gpu_worker.determine_available_memory) runs one dummy forward of max_num_batched_tokens
tokens and a dummy sampler pass of max_num_seqs rows, and takes the torch peak above what stays
allocated afterwards ("transient peak headroom") out of the KV cache budget. This script rebuilds
that pass for one tensor-parallel shard of the real shapes (hidden 5120, 64 q / 8 kv heads of 128,
intermediate 25600, vocabulary 151936, bf16, random weights) in plain PyTorch on one GPU:

- forward: embedding shard, two decoder layers (activations are freed between layers, so the peak
  is one layer's), final norm, the lm_head on the last max_num_seqs rows. The ops follow vLLM's
  Qwen3 layer (fused add+RMSNorm in place, out-of-place q/k norms, SiluAndMul producing a new
  tensor, out-of-place all-reduce outputs simulated with a copy at TP > 1). Attention is skipped as
  vLLM skips it in the profile run (attn_metadata is None: the output buffer is allocated only).
  Fused element-wise kernels are emulated in row chunks so no full-size fp32 temporary appears.
- sampler: logits gathered to the whole vocabulary, two passes as _dummy_sampler_run does (float32
  copy, temperature, softmax probabilities, exponential noise), plus the sort-based top-k/top-p
  fallback as an upper bound.
- prefill time: one layer shard with real causal attention (SDPA), timed, for the achieved TFLOP/s.

Run: python3 tools/measure/activation_peak.py > tools/measure/activation_peak.out.txt
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 5120, 64, 8, 128, 25600, 151936
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


def rope_(x: torch.Tensor, heads: int) -> None:
    """Neox-style rotary embedding in place (positions arbitrary: only memory matters)."""
    for i in range(0, x.shape[0], CHUNK):
        v = x[i : i + CHUNK].view(-1, heads, HEAD_DIM)
        a, b = v[..., : HEAD_DIM // 2], v[..., HEAD_DIM // 2 :]
        ra, rb = a * 0.5 - b * 0.5, b * 0.5 + a * 0.5
        a.copy_(ra)
        b.copy_(rb)


class Shard:
    """Weights of one TP shard: embedding, layers, final norm, lm_head."""

    def __init__(self, tp: int, layers: int = 2) -> None:
        self.tp = tp
        self.q, self.kv = HEADS // tp, KV_HEADS // tp
        r = lambda *s: torch.randn(*s, dtype=DT, device=DEV) * 0.02  # noqa: E731
        self.embed = r(VOCAB // tp, HIDDEN)
        self.lm_head = r(VOCAB // tp, HIDDEN)
        self.final_norm = torch.ones(HIDDEN, dtype=DT, device=DEV)
        self.layers = [
            dict(
                ln1=torch.ones(HIDDEN, dtype=DT, device=DEV),
                ln2=torch.ones(HIDDEN, dtype=DT, device=DEV),
                qkv=r((self.q + 2 * self.kv) * HEAD_DIM, HIDDEN),
                qn=torch.ones(HEAD_DIM, dtype=DT, device=DEV),
                kn=torch.ones(HEAD_DIM, dtype=DT, device=DEV),
                o=r(HIDDEN, self.q * HEAD_DIM),
                gate_up=r(2 * INTER // tp, HIDDEN),
                down=r(HIDDEN, INTER // tp),
            )
            for _ in range(layers)
        ]

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        # vLLM's tensor_model_parallel_all_reduce is out-of-place: a new tensor of the same shape.
        return x.clone() if self.tp > 1 else x

    def attention(self, L: dict, x: torch.Tensor, real: bool) -> torch.Tensor:
        n = x.shape[0]
        qkv = x @ L["qkv"].T
        q, k, v = qkv.split([self.q * HEAD_DIM, self.kv * HEAD_DIM, self.kv * HEAD_DIM], dim=-1)
        # Qwen3's per-head q/k RMSNorm: out-of-place on a per-head view of the fused qkv output.
        q = rms_norm_into(
            q.view(n, self.q, HEAD_DIM), L["qn"], torch.empty(n, self.q, HEAD_DIM, dtype=DT, device=DEV)
        )
        k = rms_norm_into(
            k.view(n, self.kv, HEAD_DIM), L["kn"], torch.empty(n, self.kv, HEAD_DIM, dtype=DT, device=DEV)
        )
        q, k = q.view(n, -1), k.view(n, -1)
        rope_(q, self.q)
        rope_(k, self.kv)
        if real:
            group = self.q // self.kv  # GQA: repeat the KV heads so the flash kernel applies
            kk = k.view(1, n, self.kv, HEAD_DIM).transpose(1, 2).repeat_interleave(group, dim=1)
            vv = v.view(1, n, self.kv, HEAD_DIM).transpose(1, 2).repeat_interleave(group, dim=1)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(
                    q.view(1, n, self.q, HEAD_DIM).transpose(1, 2), kk, vv, is_causal=True
                )
            attn = o.transpose(1, 2).reshape(n, self.q * HEAD_DIM)
        else:  # profile run: attention backend returns its (allocated) output buffer untouched
            attn = torch.empty(n, self.q * HEAD_DIM, dtype=DT, device=DEV)
        out = attn @ L["o"].T
        return self.all_reduce(out)

    def mlp(self, L: dict, x: torch.Tensor) -> torch.Tensor:
        gate_up = x @ L["gate_up"].T
        act = silu_and_mul(gate_up)
        down = act @ L["down"].T
        return self.all_reduce(down)

    def forward(self, ids: torch.Tensor, real_attention: bool = False) -> torch.Tensor:
        local = (ids % (VOCAB // self.tp)).clamp_(0, VOCAB // self.tp - 1)
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


if __name__ == "__main__":
    sys.exit(main())
