"""Measure, on one GPU in plain PyTorch, the runtime terms of vLLM 0.32's KV budget that do not need vLLM.

vLLM (gpu_worker.determine_available_memory, utils/mem_utils.memory_profiling) charges, after its init
snapshot (taken once NCCL and the custom all-reduce are set up): the drop in free memory (weights,
persistent torch allocations, the non-torch increase) plus the transient torch peak. This script
measures, the way MemorySnapshot does (free from cudaMemGetInfo, torch = memory_reserved, non-torch =
used - torch):

1. cuBLAS / cuBLASLt workspaces: torch allocations that stay after the first bf16 GEMMs (persistent).
2. The non-torch increase over a profile-like pass (cuBLAS handles, lazily loaded kernel modules).
3. The sampler pass at TP 2 with the logits all-gather (tensor_model_parallel_all_gather: a gathered
   buffer, then a permuted copy) in front of _dummy_sampler_run's two passes, at max_num_seqs rows.
4. The SM count, which sizes the Triton top-k/top-p buffer vLLM keeps (topk_topp_triton.py:
   min(next_pow2(rows), num_sm) x vocab x 4 B, cached for the process).

Run: python3 tools/measure/runtime_terms.py > tools/measure/runtime_terms.out.txt
"""

from __future__ import annotations

import sys

import torch
from activation_peak import DT, GIB, HIDDEN, VOCAB, Shard, sampler_pass, transient_peak

MIB = 2**20


def snapshot() -> dict[str, int]:
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    return {
        "used": total - free,
        "reserved": reserved,
        "allocated": torch.cuda.memory_allocated(),
        "non_torch": total - free - reserved,
    }


def gathered_sampler(shard: Shard, hidden: torch.Tensor, tp: int) -> None:
    """lm_head shard, all-gather to the whole vocabulary as vLLM's all_gather does, then the sampler."""
    local = torch.rand_like(hidden) @ shard.lm_head.T  # [rows, V/TP]
    out = torch.empty((tp, *local.shape), dtype=DT, device="cuda")
    out.copy_(local.expand((tp, *local.shape)))  # stands in for the NCCL all-gather into its buffer
    del local
    logits = out.movedim(0, 1).reshape(hidden.shape[0], -1)  # permuted copy: [rows, V]
    del out
    l32 = None
    for _ in range(2):
        l32 = logits.to(torch.float32)
        l32.div_(0.5)
        probs = l32.softmax(dim=-1, dtype=torch.float32)
        q = torch.empty_like(probs).exponential_()
        probs.div_(q).argmax(dim=-1)
        del l32, probs, q


def main() -> None:
    torch.zeros(1, device="cuda")  # CUDA context, as vLLM has before its snapshot
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(0)
    print("device:", props.name, "SMs", props.multi_processor_count, "torch", torch.__version__)
    base = snapshot()
    print("after context:", {k: f"{v / MIB:.1f} MiB" for k, v in base.items()})

    a = torch.randn(512, HIDDEN, dtype=DT, device="cuda")
    b = torch.randn(HIDDEN, HIDDEN, dtype=DT, device="cuda")
    inputs = torch.cuda.memory_allocated()
    c = a @ b
    d = torch.nn.functional.linear(a, b, torch.zeros(HIDDEN, dtype=DT, device="cuda"))  # cuBLASLt path
    del c, d
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after_gemm = snapshot()
    ws = torch.cuda.memory_allocated() - inputs - HIDDEN * 2
    print(f"1. torch memory kept after the first GEMMs (cuBLAS/cuBLASLt workspaces): {ws / MIB:.1f} MiB")
    gemm_non_torch = after_gemm["non_torch"] - base["non_torch"]
    print(f"   non-torch increase from the GEMMs: {gemm_non_torch / MIB:.1f} MiB")
    del a, b

    shard = Shard(2)
    ids = torch.randint(0, VOCAB, (8192,), device="cuda")
    hidden = torch.randn(1024, HIDDEN, dtype=DT, device="cuda")
    shard.forward(ids)
    sampler_pass(shard, hidden, sort_fallback=False)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after_pass = snapshot()
    pass_non_torch = after_pass["non_torch"] - base["non_torch"]
    print(
        "2. non-torch increase over a profile-like pass (forward of 8192 tokens at TP 2, sampler over 1024"
        f" rows), from the snapshot after the context: {pass_non_torch / MIB:.1f} MiB"
    )
    for rows in (256, 1024):
        h = torch.randn(rows, HIDDEN, dtype=DT, device="cuda")
        peak = transient_peak(lambda h=h: gathered_sampler(shard, h, 2))
        print(
            f"3. sampler with the TP 2 all-gather, {rows} rows: transient peak {peak / GIB:.3f} GiB = "
            f"{peak / (rows * VOCAB):.2f} B per row x vocab"
        )
    sms = props.multi_processor_count
    buffer = sms * VOCAB * 4
    print(f"4. Triton top-k/top-p buffer at 1024 rows: {sms} x {VOCAB} x 4 B = {buffer / MIB:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
