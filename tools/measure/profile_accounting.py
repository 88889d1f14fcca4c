"""vLLM 0.27.1's own arithmetic around a fresh first-stage profile forward (issue 28, third pass).

vLLM 0.27.1 does not charge the torch peak plus a non-torch increase: it charges the drop in free device
memory since its init snapshot plus the torch peak above what stays allocated
(utils/mem_utils.py:314-325, total_consumed + transient_peak_headroom), and "Model loading took" is
torch's allocated bytes (platforms/cuda.py:351-356). Reserved memory the caching allocator cannot give
back after the profile (a segment pinned by an allocation that persists, e.g. the cuBLAS workspace made
by the process's first GEMM inside the profile) is charged besides the peak. compiled_forward.py and
first_stage.py measured the peak in a warm process (cuBLAS set up by the eager call). This runs, in a
fresh process per TP size, what the first PP stage does: weights loaded under max_split_size_mb 20
(v1/worker/gpu_worker.py:280-301, 435-442), then the first-ever forward (compile included) of the
first stage (embedding shard at vocab/TP, two decoder layers, no final norm) of 8,192 tokens under
inference mode, and prints vLLM's terms.

Run: python3 tools/measure/profile_accounting.py > tools/measure/profile_accounting.out.txt
"""

from __future__ import annotations

import gc
import subprocess
import sys

import torch

sys.path.insert(0, "tools/measure")

GIB = 2**30


def snapshot() -> dict[str, int]:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    stats = torch.cuda.memory_stats()
    return {
        "free": free,
        "peak": stats.get("allocated_bytes.all.peak", 0),
        "allocated": stats.get("allocated_bytes.all.current", 0),
        "reserved": torch.cuda.memory_reserved(),
        "cuda": total - free,
    }


def one(tp: int, loaded_layers: int) -> None:
    import compiled_forward as cf
    import first_stage
    import torch._inductor.config as inductor_config

    inductor_config.combo_kernels = True  # vLLM's defaults (config/compilation.py:976-986 in 0.27.1)
    inductor_config.benchmark_combo_kernel = True
    cf.attention = torch.compiler.disable(lambda q, k, v, out: None)  # split at attention

    torch.zeros(1, device="cuda")  # the CUDA context, before vLLM's init snapshot
    gc.collect()
    torch.cuda.empty_cache()
    init = snapshot()
    torch.cuda.memory._set_allocator_settings("max_split_size_mb:20")
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before_load = torch.cuda.max_memory_allocated()
    cf.Model.forward = first_stage.first_stage_forward
    model = cf.Model(tp)
    # The stage's other layers, loaded as the real loader loads them (tensor by tensor, same split
    # setting) but not run: the forward's peak is one layer's, the load's fragmentation is all of them.
    model.idle = torch.nn.ModuleList(cf.Layer(tp) for _ in range(loaded_layers - len(model.layers)))
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    weights = torch.cuda.max_memory_allocated() - before_load
    torch.cuda.memory._set_allocator_settings("max_split_size_mb:" + str((2**64 - 1) // 2**20))
    with torch.inference_mode():
        ids = torch.zeros(cf.TOKENS, dtype=torch.int64, device="cuda")
        positions = torch.arange(cf.TOKENS, device="cuda") % cf.POSITIONS
        compiled = torch.compile(model, dynamic=True)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = snapshot()
        out = compiled(ids, positions)
        torch.cuda.synchronize()
        del out
    gc.collect()
    torch.cuda.empty_cache()
    after = snapshot()
    total_consumed = init["free"] - after["free"]
    headroom = after["peak"] - after["allocated"]
    charged = total_consumed + headroom - weights
    g = lambda b: f"{b / GIB:.3f} GiB"  # noqa: E731
    print(f"TP {tp}, first stage with {loaded_layers} layers loaded, {cf.TOKENS} tokens, fresh process, "
          "first forward compiled:")
    print(f"  weights (allocated, 'Model loading took'): {g(weights)}")
    print(f"  total_consumed (free-memory drop since init): {g(total_consumed)}")
    print(f"  transient_peak_headroom (peak - allocated after): {g(headroom)}")
    print(f"  charged besides weights (total_consumed + headroom - weights): {g(charged)}")
    print(f"  torch allocated since the forward began: {g(after['allocated'] - before['allocated'])}")
    print(f"  of which reserved - allocated after empty_cache: {g(after['reserved'] - after['allocated'])}")
    nt_init = init["cuda"] - init["reserved"]
    print(f"  of which non-torch increase: {g(after['cuda'] - after['reserved'] - nt_init)}")
    print(f"  torch peak above the weights during the forward: {g(after['peak'] - before['allocated'])}")


def main() -> None:
    if len(sys.argv) > 2:
        one(int(sys.argv[1]), int(sys.argv[2]))
        return
    print("device:", torch.cuda.get_device_properties(0).name, "torch", torch.__version__)
    # 2 layers: the forward's own; 32 at TP 1: the PP 2 first stage; 64: the whole model at TP 1 and 2.
    for tp, layers in ((1, 2), (1, 32), (1, 64), (2, 2), (2, 64)):
        sys.stdout.flush()
        subprocess.run([sys.executable, __file__, str(tp), str(layers)], check=True)


if __name__ == "__main__":
    sys.exit(main())
