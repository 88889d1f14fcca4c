"""The benchmarks' random Qwen3 model at a fixed path in the cache, built once per size.

vLLM keys its torch.compile cache directory by the engine's configuration, the model path included: a
model in a fresh temporary directory starts every engine with an empty inductor cache, while at a fixed
path engines of later runs with the same flags reuse the kernels compiled before (about half the warm-up
on 2 cores; vLLM 0.32's CPU build cannot load the whole compiled model back: "no attribute
'finalize_loading'", so some compiling remains).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..cache import cache_dir
from ..model import build_tiny_model


def bench_model(hidden_size: int, num_layers: int) -> Path:
    """The model directory for this size, built (atomically, so no run sees half a model) if missing."""
    path = cache_dir() / f"bench-model-h{hidden_size}-l{num_layers}"
    if (path / "config.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    build_tiny_model(staging / "model", hidden_size=hidden_size, num_layers=num_layers)
    try:
        os.rename(staging / "model", path)  # a run building the same size at once may win: fine
    except OSError:
        if not (path / "config.json").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
