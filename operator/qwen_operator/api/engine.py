"""The vLLM command line for a QwenDeployment, and the checks of `engine.extraArgs`.

extraArgs are checked offline against the flag table of the pinned vLLM parser (vllm_flags.json,
generated from the real parser by `make generate` and drift-tested), so a typo is refused at plan
time instead of crash-looping a pod that took ten minutes to schedule and pull.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from .plan import Plan
from .spec import QwenDeploymentSpec

ENGINE_PORT = 8000
#: What vllm/vllm-openai runs (its entrypoint); `python -m vllm.entrypoints.openai.api_server` is
#: deprecated in 0.32. The model follows as the positional model tag.
ENGINE_COMMAND = ("vllm", "serve")
#: rope_theta of Qwen3-32B; restated because an hf_overrides dict replaces rope_parameters whole.
QWEN3_ROPE_THETA = 1_000_000.0

#: Flags the operator sets itself, with the field that controls each.
OWNED_FLAGS: dict[str, str] = {
    "--model": "spec.model.name",
    "--revision": "spec.model.revision",
    "--served-model-name": "spec.model.servedModelName",
    "--tensor-parallel-size": "spec.parallelism.tensor",
    "-tp": "spec.parallelism.tensor",
    "--pipeline-parallel-size": "spec.parallelism.pipeline",
    "-pp": "spec.parallelism.pipeline",
    "--data-parallel-size": "spec.replicas",
    "-dp": "spec.replicas",
    "--port": "(operator: the engine port is fixed)",
    "--host": "(operator: the engine listens on all pod addresses)",
    "--api-key": "spec.engine.apiKeySecret",
    "--max-model-len": "spec.engine.maxModelLen",
    "--max-num-seqs": "spec.engine.maxNumSeqs",
    "--max-num-batched-tokens": "spec.engine.maxNumBatchedTokens",
    "--enable-chunked-prefill": "spec.engine.enableChunkedPrefill",
    "--no-enable-chunked-prefill": "spec.engine.enableChunkedPrefill",
    "--enable-prefix-caching": "spec.engine.enablePrefixCaching",
    "--no-enable-prefix-caching": "spec.engine.enablePrefixCaching",
    "--gpu-memory-utilization": "spec.engine.gpuMemoryUtilization",
    "--device-memory-utilization": "spec.engine.gpuMemoryUtilization",
    "--quantization": "spec.engine.quantization",
    "-q": "spec.engine.quantization",
    "--kv-cache-dtype": "spec.engine.kvCacheDtype",
    "--speculative-config": "spec.engine.speculative",
    "-sc": "spec.engine.speculative",
    "--spec-method": "spec.engine.speculative",
    "--spec-model": "spec.engine.speculative",
    "--spec-tokens": "spec.engine.speculative",
    "--hf-overrides": "spec.engine.maxModelLen (YaRN)",
    "--reasoning-parser": "spec.engine.reasoning",
    "--enable-auto-tool-choice": "spec.engine.toolCalling",
    "--no-enable-auto-tool-choice": "spec.engine.toolCalling",
    "--tool-call-parser": "spec.engine.toolCalling",
    "--download-dir": "spec.model.cache",
    # These replace the memory accounting the capacity plan is built on.
    "--kv-cache-memory-bytes": "spec.engine.gpuMemoryUtilization (the capacity plan)",
    "--num-gpu-blocks-override": "spec.engine.gpuMemoryUtilization (the capacity plan)",
}

#: Flags refused in extraArgs for another reason than a field owning them.
REFUSED_FLAGS: dict[str, str] = {
    "--config": "a config file could set the flags the operator owns; put the flags themselves in extraArgs",
    "--help": "prints the help and exits",
    "-h": "prints the help and exits",
}


@cache
def vllm_flags() -> dict[str, bool]:
    """Every option of the pinned vLLM server parser -> whether it takes a value."""
    data = json.loads(resources.files(__package__).joinpath("vllm_flags.json").read_text())
    return dict(data["flags"])


def check_extra_args(args: list[str]) -> list[tuple[str, str]]:
    """Problems with extraArgs as (field path, message) pairs.

    Reads the arguments the way vLLM's FlexibleArgumentParser does: `--a_b` is `--a-b`, `--flag=value`,
    `--json-flag.key value` sets one key of a JSON flag, `-O3` is `--optimization-level 3`.
    """
    problems = []
    known = vllm_flags()
    pending: str | None = None  # a flag still waiting for its value
    after_unknown = False  # the previous argument is an unknown flag: a value may follow (no second error)
    for i, arg in enumerate(args):
        path = f"spec.engine.extraArgs[{i}]"
        if not arg.startswith("-") or _is_number(arg):
            if pending is None and not after_unknown:
                problems.append((path, f"{arg!r} is not a flag and follows no flag that takes a value"))
            pending, after_unknown = None, False
            continue
        if pending is not None:
            problems.append((f"spec.engine.extraArgs[{i - 1}]", f"{pending} needs a value"))
        flag, inline_value, dotted = _flag_name(arg)
        takes_value = known.get(flag, False) or dotted
        if flag in OWNED_FLAGS:
            problems.append((path, f"{flag} is set by the operator from {OWNED_FLAGS[flag]}; use that field"))
        elif flag in REFUSED_FLAGS:
            problems.append((path, f"{flag} is refused: {REFUSED_FLAGS[flag]}"))
        elif flag not in known:
            hint = _closest(flag, known)
            problems.append(
                (
                    path,
                    f"{flag} is not a flag of vLLM {_version()}"
                    + (f" (did you mean {hint}?)" if hint else ""),
                )
            )
        elif dotted and not known[flag]:
            problems.append((path, f"{flag} takes no value, so it has no keys to set"))
        elif inline_value and not takes_value:
            problems.append((path, f"{flag} takes no value (write {flag} or its --no- form)"))
        pending = arg if takes_value and not inline_value and flag in known else None
        after_unknown = flag not in known and not inline_value
    if pending is not None:
        problems.append((f"spec.engine.extraArgs[{len(args) - 1}]", f"{pending} needs a value"))
    return problems


def _flag_name(arg: str) -> tuple[str, bool, bool]:
    """(canonical flag, has an inline `=value`, is a dotted `--flag.key`) of one argument."""
    if arg.startswith("-O") and not arg.startswith("--") and arg != "-O":
        return "--optimization-level", True, False  # -O3, -O=3
    if arg == "-O":
        return "--optimization-level", False, False
    name, eq, _ = arg.partition("=")
    name, dot, _ = name.partition(".")
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name, bool(eq), bool(dot)


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True


def _closest(flag: str, known: dict[str, bool]) -> str | None:
    import difflib

    match = difflib.get_close_matches(flag, list(known), n=1, cutoff=0.8)
    return match[0] if match else None


@cache
def _version() -> str:
    return str(json.loads(resources.files(__package__).joinpath("vllm_flags.json").read_text())["vllm"])


def engine_args(spec: QwenDeploymentSpec, plan: Plan) -> list[str]:
    """The engine's arguments after `vllm serve`: the model tag, then flags (no API key: it comes from
    VLLM_API_KEY)."""
    e, m = spec.engine, spec.model
    args = [
        m.name,
        "--served-model-name", m.served_model_name or m.name,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--tensor-parallel-size", str(plan.tensor_parallel_size),
        "--pipeline-parallel-size", str(plan.pipeline_parallel_size),
        "--max-model-len", str(e.max_model_len),
        "--max-num-seqs", str(e.max_num_seqs),
        "--max-num-batched-tokens", str(e.max_num_batched_tokens),
        "--gpu-memory-utilization", str(e.gpu_memory_utilization),
        "--enable-chunked-prefill" if e.enable_chunked_prefill else "--no-enable-chunked-prefill",
        "--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching",
        "--kv-cache-dtype", e.kv_cache_dtype,
    ]  # fmt: skip
    if m.revision:
        args += ["--revision", m.revision]
    if plan.quantization:
        args += ["--quantization", plan.quantization]
    if plan.yarn:
        args += ["--hf-overrides", _json(_yarn_overrides(plan))]
    if e.speculative:
        args += ["--speculative-config", _json(speculative_config(spec))]
    if e.reasoning.enabled:
        args += ["--reasoning-parser", e.reasoning.parser]
    if e.tool_calling.enabled:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", e.tool_calling.parser]
    return args + list(e.extra_args)


def _yarn_overrides(plan: Plan) -> dict[str, Any]:
    assert plan.yarn
    original = plan.yarn.original_max_position_embeddings
    return {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": plan.yarn.factor,
            "original_max_position_embeddings": original,
            "rope_theta": QWEN3_ROPE_THETA,
        },
        # vLLM 0.32 takes a YaRN model's max_position_embeddings as already scaled (it is also its
        # limit for --max-model-len), and transformers checks it equals factor x original.
        "max_position_embeddings": int(plan.yarn.factor * original),
    }


def speculative_config(spec: QwenDeploymentSpec) -> dict[str, Any]:
    """vLLM's --speculative-config object for the typed speculative settings."""
    s = spec.engine.speculative
    assert s is not None
    config: dict[str, Any] = {"method": s.method, "num_speculative_tokens": s.num_speculative_tokens}
    if s.method == "ngram":
        config |= {"prompt_lookup_max": s.prompt_lookup_max, "prompt_lookup_min": s.prompt_lookup_min}
    else:
        config["model"] = s.model
    return config


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def command_line(spec: QwenDeploymentSpec, plan: Plan) -> list[str]:
    """The full engine command, as the container runs it."""
    return [*ENGINE_COMMAND, *engine_args(spec, plan)]
