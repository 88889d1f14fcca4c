"""Does the first PP stage's (or a TP 1) compiled profile forward peak above the plan's? (issue 28)

vLLM 0.27.1's BLOG-PP2 first stage and its TP 1 run spend 1.5-1.7 GiB per GPU more than the plan's
terms; its TP 2 run does not. This reruns compiled_forward.py's forward (embedding shard, two decoder
layers of one TP shard, 8,192 tokens) the way vLLM's compile differs from that script's:
- Inductor with vLLM's defaults on torch >= 2.9: combo_kernels and benchmark_combo_kernel
  (config/compilation.py:976-986 in 0.27.1);
- split at attention into separately compiled pieces (vLLM's piecewise backend, splitting_ops), here
  by a graph break at the attention call;
- first PP stage: no final norm, the stage returns hidden states and residual (qwen2.py:424-427).
It prints the transient peak of the first (compiling, autotuning) and second call, per token.

Run: python3 tools/measure/first_stage.py > tools/measure/first_stage.out.txt
(The output's sha256 is of this file as first committed; since then only lines were rewrapped for ruff.)
"""

from __future__ import annotations

import sys

import torch
import torch._inductor.config as inductor_config

sys.path.insert(0, "tools/measure")
import compiled_forward as cf


def first_stage_forward(self, ids, positions):  # type: ignore[no-untyped-def]
    x = torch.nn.functional.embedding(ids % (cf.VOCAB // self.tp), self.embed)
    x = cf.all_reduce(x) if self.tp > 1 else x
    residual = None
    for layer in self.layers:
        x, residual = layer(positions, x, residual, self.cache)
    return x, residual


def main() -> None:
    inductor_config.combo_kernels = True
    inductor_config.benchmark_combo_kernel = True
    print("device:", torch.cuda.get_device_properties(0).name, "torch", torch.__version__)
    print("inductor: combo_kernels, benchmark_combo_kernel on")
    for variant in (
        "whole graph, last stage",
        "split at attention, last stage",
        "split at attention, first stage",
    ):
        print(f"-- {variant}")
        if "split" in variant:
            cf.attention = torch.compiler.disable(lambda q, k, v, out: None)
        if "first" in variant:
            cf.Model.forward = first_stage_forward
        for tp in (1, 2):
            cf.forward_peaks(tp)
            torch._dynamo.reset()


if __name__ == "__main__":
    sys.exit(main())
