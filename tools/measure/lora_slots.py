"""Measure the LoRA slots vLLM 0.32 allocates on each worker, against the formula of api/lora.py.

Starts the real vLLM (the CPU build in the cached venv: the same LoRA layers as the GPU build) on the
tiny random Qwen3ForCausalLM the tests serve, with --enable-lora, once per layout (TP 1, TP 2, PP 2),
and sums the bytes of every lora_a_stacked / lora_b_stacked tensor on each worker, listing the modules
that have them. Then prints what operator/qwen_operator/api/lora.py computes for the same shapes.

Run with the vLLM venv's Python (about a minute on two cores):
    python tools/measure/lora_slots.py ~/.cache/qwen-operator/tiny-qwen3-model \
        > tools/measure/lora_slots.out.txt
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MAX_LORAS, MAX_LORA_RANK = 2, 8
LAYOUTS = ((1, 1), (2, 1), (1, 2))  # (tensor parallel, pipeline parallel)


def lora_tensors(worker: Any) -> dict[str, tuple[list[list[int]], int]]:
    """Runs on each worker: module name -> (shapes, bytes) of its LoRA slot tensors."""
    found = {}
    for name, module in worker.model_runner.model.named_modules():
        for attr in ("lora_a_stacked", "lora_b_stacked"):
            value = getattr(module, attr, None)
            if value is None:
                continue
            tensors = value if isinstance(value, tuple | list) else (value,)
            size = sum(t.numel() * t.element_size() for t in tensors)
            found[f"{name}.{attr}"] = ([list(t.shape) for t in tensors], size)
    return found


def measure(model: str, tp: int, pp: int) -> list[dict[str, Any]]:
    from vllm import LLM

    llm = LLM(
        model=model,
        enable_lora=True,
        max_loras=MAX_LORAS,
        max_lora_rank=MAX_LORA_RANK,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=512,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        enforce_eager=True,
        dtype="bfloat16",
        gpu_memory_utilization=0.1,  # of host memory, on the CPU backend
    )
    ranks = llm.collective_rpc(lora_tensors)
    del llm
    return ranks


def main() -> None:
    model = sys.argv[1]
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc of a function
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs to stdout, where the results go
    sys.path.insert(0, str(REPO / "operator"))
    from qwen_operator.api.lora import LoraShapes, slot_bytes

    config = json.loads((Path(model) / "config.json").read_text())
    shapes = LoraShapes(
        hidden=config["hidden_size"],
        intermediate=config["intermediate_size"],
        layers=config["num_hidden_layers"],
        attention_heads=config["num_attention_heads"],
        kv_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        vocab=config["vocab_size"],
    )
    import vllm

    print(f"vLLM {vllm.__version__}, model {config['architectures'][0]}: {shapes}")
    print(f"maxLoras {MAX_LORAS}, maxLoraRank {MAX_LORA_RANK}, dtype bfloat16")
    for tp, pp in LAYOUTS:
        if tp * pp > 1:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp * pp))
        ranks = measure(model, tp, pp)
        formula = slot_bytes(shapes, tp, pp, MAX_LORAS, MAX_LORA_RANK)
        print(f"\nTP {tp}, PP {pp}: api/lora.py slot_bytes = {formula:,} B (the rank that holds the most)")
        for rank, tensors in enumerate(ranks):
            total = sum(size for _, size in tensors.values())
            print(f"  worker {rank}: {total:,} B in {len(tensors)} tensors")
            for name, (shape, size) in tensors.items():
                if ".layers." not in name or ".layers.0." in name or f".layers.{shapes.layers - 1}." in name:
                    print(f"    {name}: {shape} = {size:,} B")
        assert max(sum(size for _, size in t.values()) for t in ranks) == formula, "formula disagrees"
    print("\nformula agrees with every layout")


if __name__ == "__main__":
    main()
