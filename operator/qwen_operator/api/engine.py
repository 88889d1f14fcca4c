"""The vLLM command line for a QwenDeployment, and the checks of `engine.extraArgs`.

extraArgs are checked offline against the flag table of the pinned vLLM parser (vllm_flags.json,
generated from the real parser by `make generate` and drift-tested), so a typo is refused at plan
time instead of crash-looping a pod that took ten minutes to schedule and pull.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .plan import Plan
from .spec import QwenDeploymentSpec

ENGINE_PORT = 8000
#: What vllm/vllm-openai runs (its entrypoint); `python -m vllm.entrypoints.openai.api_server` is
#: deprecated in 0.32. The model follows as the positional model tag.
ENGINE_COMMAND = ("vllm", "serve")


@dataclass(frozen=True)
class Owned:
    """A flag the operator sets itself: from a spec field (`field`, a real path), or from nothing the
    spec can change (`field` None, `why` says what it is set to and why)."""

    field: str | None
    why: str = ""

    def message(self, flag: str) -> str:
        if self.field is None:
            return f"{flag} is set by the operator ({self.why}); remove it"
        because = f" ({self.why})" if self.why else ""
        return f"{flag} is set by the operator from {self.field}; use that field{because}"


_SECRET_ON_ARGV = "a secret on the command line shows in the pod spec and in `ps`"
_PLAN_MEMORY = "it replaces the memory accounting the capacity plan is built on"
#: Flags the operator sets itself (engine_args), and every other spelling vLLM reads for them.
OWNED_FLAGS: dict[str, Owned] = {
    "--model": Owned("spec.model.name"),
    "--revision": Owned("spec.model.revision"),
    "--served-model-name": Owned("spec.model.servedModelName"),
    "--tensor-parallel-size": Owned("spec.parallelism.tensor"),
    "-tp": Owned("spec.parallelism.tensor"),
    "--pipeline-parallel-size": Owned("spec.parallelism.pipeline"),
    "-pp": Owned("spec.parallelism.pipeline"),
    "--data-parallel-size": Owned("spec.replicas", "one engine pod per replica, or spec.autoscaling"),
    "-dp": Owned("spec.replicas", "one engine pod per replica, or spec.autoscaling"),
    "--port": Owned(None, f"the engine listens on {ENGINE_PORT} for the gateway and probes"),
    "--host": Owned(None, "the engine listens on all pod addresses, where the gateway and probes reach it"),
    "--api-key": Owned("spec.engine.apiKeySecret", _SECRET_ON_ARGV),
    "--hf-token": Owned("spec.model.hfTokenSecret", _SECRET_ON_ARGV),
    "--max-model-len": Owned("spec.engine.maxModelLen"),
    "--max-num-seqs": Owned("spec.engine.maxNumSeqs"),
    "--max-num-batched-tokens": Owned("spec.engine.maxNumBatchedTokens"),
    "--enable-chunked-prefill": Owned("spec.engine.enableChunkedPrefill"),
    "--no-enable-chunked-prefill": Owned("spec.engine.enableChunkedPrefill"),
    "--enable-prefix-caching": Owned("spec.engine.enablePrefixCaching"),
    "--no-enable-prefix-caching": Owned("spec.engine.enablePrefixCaching"),
    "--gpu-memory-utilization": Owned("spec.engine.gpuMemoryUtilization"),
    "--device-memory-utilization": Owned("spec.engine.gpuMemoryUtilization"),
    "--quantization": Owned("spec.engine.quantization"),
    "-q": Owned("spec.engine.quantization"),
    "--kv-cache-dtype": Owned("spec.engine.kvCacheDtype"),
    "--speculative-config": Owned("spec.engine.speculative"),
    "-sc": Owned("spec.engine.speculative"),
    "--spec-method": Owned("spec.engine.speculative"),
    "--spec-model": Owned("spec.engine.speculative"),
    "--spec-tokens": Owned("spec.engine.speculative"),
    "--hf-overrides": Owned(
        "spec.engine.maxModelLen",
        "the operator passes YaRN's rope scaling in it above the config's max_position_embeddings; "
        "other overrides would change the model the capacity plan is made for",
    ),
    "--reasoning-parser": Owned("spec.engine.reasoning"),
    "--enable-auto-tool-choice": Owned("spec.engine.toolCalling"),
    "--no-enable-auto-tool-choice": Owned("spec.engine.toolCalling"),
    "--tool-call-parser": Owned("spec.engine.toolCalling"),
    "--download-dir": Owned("spec.model.cache"),
    "--shutdown-timeout": Owned(
        "spec.engine.terminationGracePeriodSeconds",
        "vLLM drains running requests for the grace period less the preStop and 5 s to exit",
    ),
    "--kv-cache-memory-bytes": Owned("spec.engine.gpuMemoryUtilization", _PLAN_MEMORY),
    "--enable-lora": Owned("spec.lora"),
    "--no-enable-lora": Owned("spec.lora"),
    "--max-loras": Owned("spec.lora.maxLoras"),
    "--max-lora-rank": Owned("spec.lora.maxLoraRank"),
    "--max-cpu-loras": Owned("spec.lora.maxCpuLoras"),
    "--lora-modules": Owned(
        "spec.lora.adapters",
        "the adapters are kept out of the engine pod, so that adding or removing one restarts no engine",
    ),
    "--num-gpu-blocks-override": Owned("spec.engine.gpuMemoryUtilization", _PLAN_MEMORY),
}

_ONE_POD = (
    "a replica is one pod on one node: its GPUs come from spec.parallelism and the number of replicas "
    "from spec.replicas or spec.autoscaling; remove it"
)
#: Multi-node and data-parallel flags (long and short spellings): a replica never spans pods.
_MULTI_POD_FLAGS = (
    "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port",
    "--data-parallel-rank", "-dpn", "--data-parallel-start-rank", "-dpr",
    "--data-parallel-size-local", "-dpl", "--data-parallel-address", "-dpa",
    "--data-parallel-rpc-port", "-dpp", "--data-parallel-backend", "-dpb",
    "--data-parallel-hybrid-lb", "-dph", "--data-parallel-external-lb", "-dpe",
    "--data-parallel-multi-port-external-lb", "-dpm",
)  # fmt: skip
_TLS = (
    "TLS ends at the gateway's Ingress (spec.gateway.ingress.tlsSecretName) or HTTPRoute; the gateway "
    "and the probes speak plain HTTP to the engine; remove it"
)
_GENERATION = (
    "the operator serves Qwen3-32B as a generative chat model, which the capacity plan and the "
    "gateway's routes assume; remove it"
)
#: Flags refused in extraArgs although the operator does not set them: they would open the engine to
#: the network beside the gateway, break what the gateway and probes connect to, change the model
#: served, or turn off what the operator relies on. Deliberately accepted, though they look related:
#: --allow-credentials, --allowed-methods and --allowed-headers (no effect without --allowed-origins),
#: --kv-events-config (the gateway's kv_aware policy needs the engines' KV events), and
#: --enable-log-requests / --enable-log-outputs (prompts in the engine's log are the owner's choice).
REFUSED_FLAGS: dict[str, str] = {
    "--config": "a config file could set the flags the operator owns; put the flags themselves in extraArgs",
    "--help": "it prints the help and exits instead of serving; remove it",
    "-h": "it prints the help and exits instead of serving; remove it",
    "--tokenizer": "the tokenizer is the checkpoint's own (spec.model.name); another one would encode "
    "prompts in a vocabulary the model was not trained on; remove it",
    "--tokenizer-revision": "the tokenizer follows the checkpoint's revision (spec.model.revision); "
    "remove it",
    "--hf-config-path": "it replaces the checkpoint's config.json, from which the capacity plan and "
    "YaRN are computed; remove it",
    "--trust-remote-code": "it runs Python code from the model repository; Qwen3 is built into vLLM "
    "and needs none; remove it",
    "--code-revision": "it pins remote code, which is never run (--trust-remote-code is refused); remove it",
    "--dtype": "the capacity plan counts the weights in the checkpoint's dtype (vLLM itself casts "
    "bfloat16 to float16 on GPUs without bfloat16); float32 would double them and float16 can "
    "overflow Qwen3's activations; remove it",
    "--runner": _GENERATION,
    "--convert": _GENERATION,
    "--uds": f"the engine would listen on a Unix socket instead of port {ENGINE_PORT}, where the "
    "gateway and probes connect; remove it",
    "--grpc": f"it serves gRPC instead of the HTTP OpenAI API on port {ENGINE_PORT}, which the gateway "
    "and probes call; remove it",
    "--grpc-port": "it opens a second port (gRPC inference and control services) beside the API, "
    "outside the gateway's keys and rate limits; remove it",
    "--ssl-keyfile": _TLS,
    "--ssl-certfile": _TLS,
    "--allowed-origins": "it lets web pages on those origins call the engine from their visitors' "
    "browsers (vLLM 0.32 allows none), reaching it with the visitors' network access; remove it",
    "--disable-log-stats": "it also stops vLLM's Prometheus metrics, which the queue-depth autoscaler "
    "(vllm:num_requests_waiting), the alerts and the ServiceMonitor read; remove it",
    "--headless": "it starts no API server, and the gateway and probes need one; remove it",
    **dict.fromkeys(_MULTI_POD_FLAGS, _ONE_POD),
}

#: Values refused for a flag that is fine otherwise: (flag, value) -> why.
REFUSED_VALUES: dict[tuple[str, str], str] = {
    ("--load-format", "dummy"): "it serves random weights instead of the checkpoint's; remove it",
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
    pending: tuple[str, str] | None = None  # (argument, flag) of a flag still waiting for its value
    after_unknown = False  # the previous argument is an unknown flag: a value may follow (no second error)
    for i, arg in enumerate(args):
        path = f"spec.engine.extraArgs[{i}]"
        if not arg.startswith("-") or _is_number(arg):
            if pending is None and not after_unknown:
                problems.append((path, f"{arg!r} is not a flag and follows no flag that takes a value"))
            elif pending is not None and (pending[1], arg) in REFUSED_VALUES:
                problems.append((path, _value_refusal(pending[1], arg)))
            pending, after_unknown = None, False
            continue
        if pending is not None:
            problems.append((f"spec.engine.extraArgs[{i - 1}]", f"{pending[0]} needs a value"))
        flag, inline_value, dotted = _flag_name(arg)
        problem = _flag_problem(flag, inline_value, dotted, known)
        if problem:
            problems.append((path, problem))
        takes_value = known.get(flag, False) or dotted
        pending = (arg, flag) if takes_value and inline_value is None and flag in known else None
        after_unknown = flag not in known and inline_value is None
    if pending is not None:
        problems.append((f"spec.engine.extraArgs[{len(args) - 1}]", f"{pending[0]} needs a value"))
    return problems


def _flag_problem(flag: str, inline_value: str | None, dotted: bool, known: dict[str, bool]) -> str | None:
    """Why one flag (canonical name) may not be in extraArgs, or None."""
    if flag in OWNED_FLAGS:
        return OWNED_FLAGS[flag].message(flag)
    if flag in REFUSED_FLAGS:
        return f"{flag} is refused: {REFUSED_FLAGS[flag]}"
    if flag not in known:
        hint = _closest(flag, known)
        return f"{flag} is not a flag of vLLM {_version()}" + (f" (did you mean {hint}?)" if hint else "")
    if dotted and not known[flag]:
        return f"{flag} takes no value, so it has no keys to set"
    if inline_value is not None and not known[flag]:
        return f"{flag} takes no value (write {flag} or its --no- form)"
    if inline_value is not None and (flag, inline_value) in REFUSED_VALUES:
        return _value_refusal(flag, inline_value)
    return None


def _value_refusal(flag: str, value: str) -> str:
    return f"{flag} {value} is refused: {REFUSED_VALUES[(flag, value)]}"


def _flag_name(arg: str) -> tuple[str, str | None, bool]:
    """(canonical flag, its inline `=value` or None, is a dotted `--flag.key`) of one argument."""
    if arg.startswith("-O") and not arg.startswith("--") and arg != "-O":
        return "--optimization-level", arg[2:].removeprefix("="), False  # -O3, -O=3
    if arg == "-O":
        return "--optimization-level", None, False
    name, eq, value = arg.partition("=")
    name, dot, _ = name.partition(".")
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name, value if eq else None, bool(dot)


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
        # vLLM's default (0) aborts every running request on SIGTERM: drain them instead (drains.py).
        "--shutdown-timeout", str(plan.engine_drain_seconds),
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
    if spec.lora:
        # Slot settings only: the adapters themselves are loaded at runtime (never --lora-modules), so
        # that the pod template, and the engines, do not change with the list.
        args += [
            "--enable-lora",
            "--max-loras", str(spec.lora.max_loras),
            "--max-lora-rank", str(spec.lora.max_lora_rank),
            "--max-cpu-loras", str(spec.lora.effective_max_cpu_loras),
        ]  # fmt: skip
    return args + list(e.extra_args)


def _yarn_overrides(plan: Plan) -> dict[str, Any]:
    assert plan.yarn
    original = plan.yarn.original_max_position_embeddings
    return {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": plan.yarn.factor,
            "original_max_position_embeddings": original,
            "rope_theta": plan.yarn.rope_theta,
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
