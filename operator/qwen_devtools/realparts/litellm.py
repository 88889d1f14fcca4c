"""The LiteLLM proxy (PyPI `litellm`), the Python gateway users would otherwise put in front of vLLM: a
pinned version in its own cached venv (made on first use, never in the project's venv), serving running
engines on loopback as one load-balanced model behind a master key."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from qwen_operator import versions

from ..cache import cache_dir
from ..net import LOOPBACK, free_port
from ..procs import Proc, running, spawn, temp_log_dir, wait_ready
from .engine import SERVED_MODEL

LITELLM_VERSION = versions.LITELLM
HEALTH_PATH = "/health/liveliness"  # answers without calling the engines
START_SECONDS = 120.0  # the proxy imports a lot: 20-50 s on 2 busy cores
#: Offline and quiet: the model cost map ships in the package (no fetch at start), no telemetry.
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MODE": "PRODUCTION",  # no .env loading
    "NO_PROXY": "*",
}


def litellm_venv() -> Path:
    """The venv's directory (it may not exist yet)."""
    return cache_dir() / f"litellm-venv-{LITELLM_VERSION}"


def ensure_litellm(progress: Callable[[str], None] = print) -> Path:
    """The `litellm` proxy program, installing the pinned version into its venv first if needed.

    Raises subprocess.CalledProcessError when pip cannot install it (the caller decides what to skip).
    """
    venv = litellm_venv()
    program = venv / "bin" / "litellm"
    if (venv / "READY").exists() and program.exists():
        return program
    progress(f"[litellm] installing litellm[proxy]=={LITELLM_VERSION} into {venv} (once; a minute or two)")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "venv", str(venv)], check=True
    )  # built in place: scripts keep paths
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
    (venv / "READY").touch()
    progress(f"[litellm] ready: {program}")
    return program


def proxy_config(worker_urls: Sequence[str], master_key: str, model: str = SERVED_MODEL) -> dict[str, Any]:
    """A LiteLLM config: every engine as one deployment of `model` (its router balances between them,
    with its default strategy), the master key required on every request, no database."""
    deployments = [
        {
            "model_name": model,
            "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": f"{url}/v1", "api_key": "none"},
        }
        for url in worker_urls
    ]
    return {
        "model_list": deployments,
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 0},
        "litellm_settings": {"drop_params": True, "request_timeout": 600},
        "general_settings": {"master_key": master_key},
    }


def spawn_litellm(worker_urls: Sequence[str], master_key: str, log_dir: Path | None = None) -> Proc:
    """Start the proxy (one worker) on 127.0.0.1 without waiting; pair with wait_ready(proc,
    HEALTH_PATH, START_SECONDS) and proc.stop(). Installs it first if needed."""
    program = ensure_litellm()
    log_dir = log_dir or temp_log_dir()
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = log_dir / f"litellm-{port}.yaml"
    config.write_text(json.dumps(proxy_config(worker_urls, master_key), indent=2))  # JSON is YAML
    argv = [
        str(program),
        "--config",
        str(config),
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    return spawn(f"litellm-{port}", argv, log_dir, env=LITELLM_ENV, port=port)


@contextlib.contextmanager
def start_litellm(
    worker_urls: Sequence[str], master_key: str, log_dir: Path | None = None, timeout: float = START_SECONDS
) -> Iterator[Proc]:
    """A ready LiteLLM proxy in front of running engines; stopped on exit, also when start-up fails."""
    proc = spawn_litellm(worker_urls, master_key, log_dir)
    with running(proc):
        wait_ready(proc, HEALTH_PATH, timeout)
        yield proc


if __name__ == "__main__":
    try:
        print(ensure_litellm())  # `python -m qwen_devtools.realparts.litellm`: install it ahead of a bench
    except subprocess.CalledProcessError as error:
        sys.exit(f"[litellm] pip failed with exit status {error.returncode} (output above)")
