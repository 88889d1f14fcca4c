"""The real vLLM engine for CPUs, serving a model as Qwen/Qwen3-32B on loopback, started from the
operator's rendered engine flags minus the ones that describe the machine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from qwen_operator.api.engine import ENGINE_COMMAND

from ..net import LOOPBACK, free_port
from ..procs import Proc, running, spawn, temp_log_dir, wait_ready
from ..vllm_env import vllm_python

#: The model name clients send; the tiny model is served under the real one.
SERVED_MODEL = "Qwen/Qwen3-32B"
ENGINE_START_SECONDS = 300.0  # 45-75 s alone on 2 cores; more when engines start side by side


def at_zero(body: dict[str, Any], hold_seconds: int, max_held: int, max_replicas: int) -> dict[str, Any]:
    """`body` scaled to zero by KEDA (autoscaling.minReplicas 0) in place of its fixed replicas, the
    gateway holding at most `max_held` requests for `hold_seconds`; returns `body`."""
    del body["spec"]["replicas"]
    body["spec"]["autoscaling"] = {
        "minReplicas": 0,
        "maxReplicas": max_replicas,
        "driver": "keda",
        "prometheusAddress": "http://127.0.0.1:9090",
        "scaleToZero": {"holdSeconds": hold_seconds, "maxHeldRequests": max_held},
    }
    return body


def cpu_qwendeployment(
    engine: Mapping[str, Any] | None = None,
    gateway: Mapping[str, Any] | None = None,
    replicas: int = 1,
    gpu: str = "A100-80GB",
    name: str = "chat",
    namespace: str = "llm",
) -> dict[str, Any]:
    """A QwenDeployment whose engine flags suit the CPU test engine (context 1024, batch 8, 2048 batched
    tokens), planned for a real GPU pool at TP 2 so that the rendered command line is the production one;
    `engine` and `gateway` fields are added or override, as given."""
    spec: dict[str, Any] = {
        "model": {"name": SERVED_MODEL},
        "gpu": {"type": gpu},
        "parallelism": {"tensor": 2},
        "engine": {"maxModelLen": 1024, "maxNumSeqs": 8, "maxNumBatchedTokens": 2048, **(engine or {})},
        "replicas": replicas,
    }
    if gateway is not None:
        spec["gateway"] = dict(gateway)
    return {
        "apiVersion": "inference.qwenops.dev/v1alpha1",
        "kind": "QwenDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


#: Flags whose values depend on the machine, not on the QwenDeployment: replaced for the CPU test engine.
_MACHINE_FLAGS = {
    "--model",
    "--host",
    "--port",
    "--max-model-len",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--gpu-memory-utilization",
    "--served-model-name",
}


def test_engine_args(rendered_args: Sequence[str]) -> list[str]:
    """The operator's rendered engine arguments minus the machine-specific flags (parsers etc. kept).

    Pass the result as `extra_args` to start_engine, which adds the tiny model's --model, --port and
    --max-model-len (and --max-num-seqs 8 unless the arguments set it).
    """
    args = list(rendered_args)
    if args[:2] == list(ENGINE_COMMAND):
        args = args[3:]  # `vllm serve MODEL`: the tiny model replaces the model tag
    out: list[str] = []
    skip_value = False
    for i, arg in enumerate(args):
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in _MACHINE_FLAGS:
            # a flag with a separate value is followed by something that is not a flag
            skip_value = "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(arg)
    return out


test_engine_args.__test__ = False  # type: ignore[attr-defined]  # not a test, despite the name


def engine_argv(
    model: Path, port: int, extra_args: Sequence[str] = (), served_model: str = SERVED_MODEL
) -> list[str]:
    """The engine's command line: the tiny model on loopback under `served_model`, a 1024-token context,
    then extra_args."""
    return [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--served-model-name", served_model,
        "--host", LOOPBACK,
        "--port", str(port),
        "--max-model-len", "1024",
        *([] if "--max-num-seqs" in extra_args else ["--max-num-seqs", "8"]),
        *extra_args,
    ]  # fmt: skip


ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # keep two or three engines from each grabbing every core of a shared 2-core machine
    "OMP_NUM_THREADS": "1",
}


def spawn_engine(
    model: Path,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    served_model: str = SERVED_MODEL,
) -> Proc:
    """Start an engine without waiting; pair with wait_ready(proc, "/health", ...) and proc.stop()."""
    port = port or free_port()
    return spawn(
        f"engine-{port}",
        engine_argv(model, port, extra_args, served_model),
        log_dir or temp_log_dir(),
        env={**ENGINE_ENV, **(env or {})},
        port=port,
    )


@contextlib.contextmanager
def start_engine(
    model: Path,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = ENGINE_START_SECONDS,
) -> Iterator[Proc]:
    """A real vLLM CPU engine serving `model` as Qwen/Qwen3-32B on 127.0.0.1, ready (/health 200).

    extra_args are appended to the engine command line (e.g. test_engine_args(review.command)). The
    process group is killed on exit, also when start-up fails.
    """
    proc = spawn_engine(model, port, extra_args, env)
    with running(proc):
        wait_ready(proc, "/health", timeout)
        yield proc
