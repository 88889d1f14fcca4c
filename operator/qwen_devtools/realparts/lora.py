"""Tiny random LoRA adapters for the tiny Qwen3 model, in PEFT's format (adapter_config.json and
adapter_model.safetensors), as vLLM loads them.

Both A and B are random (PEFT's own init leaves B at zero, which would change nothing), so that each
adapter changes the model's output and two seeds change it differently. The tensors are written by the
vLLM venv's Python (torch and safetensors; the project venv has neither); the shapes and names are
worked out here from the model's config.json.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..vllm_env import TOOL_ENV, vllm_python

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ALL_MODULES = ATTENTION + MLP


def module_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """{module: (in_features, out_features)} of one Qwen3 decoder layer, from the model's config.json."""
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    head_dim = int(config.get("head_dim") or hidden // int(config["num_attention_heads"]))
    q = int(config["num_attention_heads"]) * head_dim
    kv = int(config.get("num_key_value_heads") or config["num_attention_heads"]) * head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def tensor_shapes(
    config: Mapping[str, Any], rank: int, modules: Sequence[str] = ALL_MODULES
) -> dict[str, tuple[int, int]]:
    """{tensor name: shape} of an adapter: `base_model.model.model.layers.N.<self_attn|mlp>.<module>.
    lora_A.weight` (rank x in) and `.lora_B.weight` (out x rank), the names PEFT saves and vLLM 0.32
    parses (vllm/lora/utils.py parse_fine_tuned_lora_name)."""
    shapes = module_shapes(config)
    unknown = set(modules) - set(shapes)
    if unknown:
        raise ValueError(f"not a module of a Qwen3 layer: {sorted(unknown)}")
    out: dict[str, tuple[int, int]] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for module in modules:
            block = "self_attn" if module in ATTENTION else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            fan_in, fan_out = shapes[module]
            out[f"{prefix}.lora_A.weight"] = (rank, fan_in)
            out[f"{prefix}.lora_B.weight"] = (fan_out, rank)
    return out


def adapter_config(rank: int, modules: Sequence[str], scale: float, base_model: str) -> dict[str, Any]:
    """PEFT's adapter_config.json; lora_alpha = scale x rank, so that vLLM scales B·A by `scale`."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": scale * rank,
        "lora_dropout": 0.0,
        "target_modules": list(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
    }


#: Run by the vLLM venv's Python: argv = output file, JSON {name: shape}, seed. Each entry has variance
#: 1/columns: A (rank x in) 1/in, B (out x rank) 1/rank, so that B·A has entries of spread 1/sqrt(in),
#: several times the tiny model's random weights (std 0.02): enough to change greedy completions.
_TENSORS_SCRIPT = r"""
import json, sys
import torch
from safetensors.torch import save_file
out, shapes, seed = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
gen = torch.Generator().manual_seed(seed)
tensors = {}
for name, (rows, cols) in sorted(shapes.items()):
    tensors[name] = (torch.randn(rows, cols, generator=gen) / cols ** 0.5).to(torch.bfloat16).contiguous()
save_file(tensors, out, metadata={"format": "pt"})
"""


def write_random_lora(
    dest: Path,
    model_dir: Path,
    rank: int = 8,
    modules: Sequence[str] = ALL_MODULES,
    seed: int = 0,
    scale: float = 1.0,
) -> Path:
    """Write a random LoRA adapter for the model in model_dir (its config.json gives the shapes) into
    dest: adapter_config.json and adapter_model.safetensors (bfloat16). Returns dest."""
    config = json.loads((model_dir / "config.json").read_text())
    shapes = tensor_shapes(config, rank, modules)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "adapter_config.json").write_text(
        json.dumps(adapter_config(rank, modules, scale, str(model_dir)), indent=2) + "\n"
    )
    subprocess.run(
        [str(vllm_python()), "-c", _TENSORS_SCRIPT, str(dest / "adapter_model.safetensors"),
         json.dumps(shapes), str(seed)],
        check=True,
        capture_output=True,
        env={**os.environ, **TOOL_ENV},
    )  # fmt: skip
    return dest
