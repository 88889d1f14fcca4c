"""Checks of rendered vLLM command lines with the real vLLM package; run by test_real_parser.py.

Runs under the Python of the cached vLLM CPU venv (tools/vllm-env.sh), never under the project venv:
    python -I tests/vllm_checks.py REQUEST.json RESULT.json

REQUEST: {"vllm": "0.32.0", "command": ["vllm", "serve"], "cases": [{"name", "argv", "expect": {...}}],
          "extra_args": {"accept": [[...], ...], "reject": [[...], ...]}, "base_argv": [...]}
Each case's argv (the arguments after `vllm serve`) goes through what `vllm serve` does before loading
weights: the `serve` subcommand's own parser, its model-tag handling and validation
(validate_parsed_serve_args), EngineArgs, and the whole VllmConfig
(model, cache, scheduler, parallel, speculative and reasoning configs). The model is swapped for a tiny
local checkpoint with the real checkpoint's config.json (architecture, quantization_config) and a small
tokenizer with Qwen3's special tokens, so nothing is downloaded. RESULT gets per case the problems found
and the facts vLLM derived (quantization, rope parameters, ...), for the test to compare with the plan.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import sys
import tempfile
import traceback
import warnings
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, get_args

# Qwen3's special tokens, from the tooling's one statement of them (a module without imports: this
# script runs isolated, under the vLLM venv's Python).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from qwen_devtools.qwen3_tokens import SPECIAL_TOKENS

QWEN3_32B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 25600,
    "max_position_embeddings": 40960,
    "max_window_layers": 64,
    "model_type": "qwen3",
    "num_attention_heads": 64,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
AWQ_CONFIG = {
    "bits": 4,
    "group_size": 128,
    "modules_to_not_convert": None,
    "quant_method": "awq",
    "version": "gemm",
    "zero_point": True,
}


def qwen3_config(hidden: int, intermediate: int, layers: int, heads: int, tied: bool) -> dict[str, Any]:
    """config.json of a smaller Qwen3 size: the 32B's with its shape (api/catalog.py SHAPES)."""
    return QWEN3_32B_CONFIG | {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "max_window_layers": layers,
        "num_attention_heads": heads,
        "tie_word_embeddings": tied,
    }


#: config.json of each checkpoint: the bf16 one plus the published quantization_config.
CHECKPOINTS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-32B": QWEN3_32B_CONFIG,
    "Qwen/Qwen3-32B-FP8": QWEN3_32B_CONFIG
    | {
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        }
    },
    "Qwen/Qwen3-32B-AWQ": QWEN3_32B_CONFIG | {"torch_dtype": "float16", "quantization_config": AWQ_CONFIG},
    # a draft model for speculative decoding (same tokenizer and vocabulary)
    "Qwen/Qwen3-0.6B": qwen3_config(1024, 3072, 28, 16, tied=True),
    # the smaller sizes served on their own
    "Qwen/Qwen3-4B": qwen3_config(2560, 9728, 36, 32, tied=True),
    "Qwen/Qwen3-8B": qwen3_config(4096, 12288, 36, 32, tied=False),
    "Qwen/Qwen3-14B": qwen3_config(5120, 17408, 40, 40, tied=False),
    "Qwen/Qwen3-14B-AWQ": qwen3_config(5120, 17408, 40, 40, tied=False)
    | {"torch_dtype": "float16", "quantization_config": AWQ_CONFIG},
}
#: Quantization methods whose GPU kernels vLLM picks only on CUDA (on a CPU build it skips the upgrade
#: of an AWQ checkpoint to its kernel, so --quantization awq_marlin would look like a mismatch).
GPU_ONLY_OVERRIDES = {"awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq"}


def write_checkpoint(root: Path, name: str) -> Path:
    """A weightless local checkpoint: the real config.json and a tokenizer with Qwen3's special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    directory = root / name.replace("/", "--")
    if directory.exists():
        return directory
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(CHECKPOINTS[name], indent=1))
    vocab = {token: i for i, token in enumerate(["[UNK]", *SPECIAL_TOKENS, "hello", "world"])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 131072,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return directory


class Collect(logging.Handler):
    """Keeps warning records of a logger (transformers reports RoPE inconsistencies as warnings)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def serve_parser() -> Any:
    """The `vllm` CLI's parser with its `serve` subcommand, built as vllm.entrypoints.cli.main does."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    return parser


def parse(parser: Any, argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    """`vllm serve ARGV` parsed (the model tag applied as ServeSubcommand.cmd does), or None and what
    argparse printed when it refused the arguments."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(["serve", *argv])
    except SystemExit:
        return None, err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "exit"
    if getattr(ns, "model_tag", None) is not None:
        ns.model = ns.model_tag
    return ns, ""


def check_case(case: dict[str, Any], parser: Any, root: Path) -> dict[str, Any]:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.model_executor.layers.quantization import DEPRECATED_QUANTIZATION_METHODS, QUANTIZATION_METHODS
    from vllm.platforms import current_platform
    from vllm.reasoning import ReasoningParserManager
    from vllm.tokenizers import cached_tokenizer_from_config
    from vllm.tool_parsers import ToolParserManager

    problems: list[str] = []
    facts: dict[str, Any] = {}
    ns, refusal = parse(parser, case["argv"])
    if ns is None:
        return {"problems": [f"the vLLM argument parser refused the command line: {refusal}"], "facts": facts}
    try:
        validate_parsed_serve_args(ns)
    except Exception as exc:
        problems.append(f"validate_parsed_serve_args: {exc}")
    facts["parsed"] = {
        "model": ns.model,
        "quantization": ns.quantization,
        "kv_cache_dtype": ns.kv_cache_dtype,
        "max_model_len": ns.max_model_len,
        "reasoning_parser": ns.reasoning_parser,
        "tool_call_parser": ns.tool_call_parser,
        "enable_auto_tool_choice": ns.enable_auto_tool_choice,
        "hf_overrides": ns.hf_overrides,
        "speculative_config": ns.speculative_config,
    }

    # Names vLLM resolves through registries, beyond what argparse validates.
    if ns.quantization is not None:
        if ns.quantization not in QUANTIZATION_METHODS:
            problems.append(f"quantization {ns.quantization!r} is not in vllm's QUANTIZATION_METHODS")
        if ns.quantization in DEPRECATED_QUANTIZATION_METHODS:
            problems.append(f"quantization {ns.quantization!r} is deprecated in vLLM")
    if ns.reasoning_parser and ns.reasoning_parser not in ReasoningParserManager.list_registered():
        problems.append(f"reasoning parser {ns.reasoning_parser!r} is not registered")
    if ns.tool_call_parser and ns.tool_call_parser not in ToolParserManager.list_registered():
        problems.append(f"tool-call parser {ns.tool_call_parser!r} is not registered")
    speculative = dict(ns.speculative_config or {})
    if speculative:
        problems += check_speculative_keys(speculative)

    # The whole engine configuration, on a weightless copy of the checkpoint.
    served = ns.model
    if served not in CHECKPOINTS:
        return {"problems": [*problems, f"no local config for checkpoint {served!r}"], "facts": facts}
    ns.model = str(write_checkpoint(root, served))
    if speculative.get("model") in CHECKPOINTS:
        ns.speculative_config = speculative | {"model": str(write_checkpoint(root, speculative["model"]))}
    elif speculative.get("model"):
        ns.speculative_config = None  # a draft head we have no config for: checked by keys only
        facts["speculative_skipped"] = speculative["model"]
    quant_cfg = CHECKPOINTS[served].get("quantization_config", {})
    emulate_gpu = {quant_cfg.get("quant_method"), ns.quantization} & GPU_ONLY_OVERRIDES
    rope_warnings = Collect()
    logging.getLogger("transformers").addHandler(rope_warnings)
    try:
        engine_args = EngineArgs.from_cli_args(ns)
        gpu = contextlib.nullcontext()
        if emulate_gpu:
            from unittest import mock

            gpu = mock.patch.object(current_platform, "is_cpu", lambda: False)  # type: ignore[assignment]
        with gpu:
            config = engine_args.create_engine_config()
    except Exception as exc:
        message = str(exc).replace("\n", " ")
        return {"problems": [*problems, f"vLLM refused the engine config: {message}"], "facts": facts}
    finally:
        logging.getLogger("transformers").removeHandler(rope_warnings)

    model_config = config.model_config
    text_config = model_config.hf_text_config
    facts["engine"] = {
        "max_model_len": model_config.max_model_len,
        "quantization": model_config.quantization,
        "dtype": str(model_config.dtype),
        "kv_cache_dtype": str(config.cache_config.cache_dtype),
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "pipeline_parallel_size": config.parallel_config.pipeline_parallel_size,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "chunked_prefill": config.scheduler_config.enable_chunked_prefill,
        "prefix_caching": config.cache_config.enable_prefix_caching,
        "max_position_embeddings": text_config.max_position_embeddings,
        "rope_parameters": dict(text_config.rope_parameters or {}),
        "speculative_method": config.speculative_config.method if config.speculative_config else None,
        "num_speculative_tokens": (
            config.speculative_config.num_speculative_tokens if config.speculative_config else None
        ),
        "reasoning_parser": config.structured_outputs_config.reasoning_parser or None,
        "lora": (
            None
            if config.lora_config is None
            else {
                "max_loras": config.lora_config.max_loras,
                "max_lora_rank": config.lora_config.max_lora_rank,
                "max_cpu_loras": config.lora_config.max_cpu_loras,
                "lora_dtype": str(config.lora_config.lora_dtype),
            }
        ),
    }
    problems += check_rope(config, rope_warnings.messages, facts)

    # The parsers are built on a tokenizer per request; build them once here.
    tokenizer = cached_tokenizer_from_config(model_config=model_config)
    if ns.reasoning_parser:
        facts["reasoning_parser_class"] = type(
            ReasoningParserManager.get_reasoning_parser(ns.reasoning_parser)(tokenizer)
        ).__name__
    if ns.tool_call_parser:
        facts["tool_parser_class"] = type(
            ToolParserManager.get_tool_parser(ns.tool_call_parser)(tokenizer)
        ).__name__
    return {"problems": problems, "facts": facts}


def check_speculative_keys(speculative: dict[str, Any]) -> list[str]:
    from vllm.config import SpeculativeConfig
    from vllm.config.speculative import SpeculativeMethod

    problems = []
    if speculative.get("method") not in get_args(SpeculativeMethod):
        problems.append(f"speculative method {speculative.get('method')!r} is not one of vLLM's")
    fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    unknown = sorted(set(speculative) - fields)
    if unknown:
        problems.append(f"speculative config keys unknown to SpeculativeConfig: {unknown}")
    return problems


def check_rope(config: Any, transformer_warnings: list[str], facts: dict[str, Any]) -> list[str]:
    """The rotary embedding vLLM builds for Qwen3 from the (overridden) config, and transformers' checks."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    text_config = config.model_config.hf_text_config
    problems = [f"transformers: {m}" for m in transformer_warnings if "rope" in m.lower()]
    params = dict(text_config.rope_parameters)
    with set_current_vllm_config(config):  # as when vLLM builds the model (Qwen3Attention calls get_rope)
        rope = get_rope(
            head_size=text_config.head_dim,
            max_position=text_config.max_position_embeddings,
            is_neox_style=True,
            rope_parameters=params,
            dtype=torch.float32,
        )
    facts["rotary_embedding"] = {
        "class": type(rope).__name__,
        "base": float(getattr(rope, "base", 0.0)),
        "scaling_factor": getattr(rope, "scaling_factor", None),
        "original_max_position": getattr(rope, "max_position_embeddings", None),
    }
    if params.get("rope_type") == "yarn":
        # the same consistency check transformers runs when it standardizes a config (vLLM skips it for
        # dict-valued overrides): max_position_embeddings / original_max_position_embeddings == factor
        implicit = text_config.max_position_embeddings / params["original_max_position_embeddings"]
        if implicit != params["factor"]:
            problems.append(
                f"max_position_embeddings {text_config.max_position_embeddings} / original "
                f"{params['original_max_position_embeddings']} = {implicit:g}, but the YaRN factor is "
                f"{params['factor']:g}"
            )
    return problems


def owned_aliases(parser: Any) -> dict[str, list[str]]:
    """Every option string -> all option strings of the same argparse action (its aliases)."""
    out: dict[str, list[str]] = {}
    for action in parser._actions:
        for option in action.option_strings:
            out[option] = list(action.option_strings)
    return out


def main() -> None:
    request = json.loads(Path(sys.argv[1]).read_text())
    warnings.simplefilter("ignore", DeprecationWarning)
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    result: dict[str, Any] = {"vllm": vllm.__version__, "cases": {}, "extra_args": {}}
    program, subcommand = request["command"]
    scripts = {e.name: e.value for e in entry_points(group="console_scripts") if e.name == program}
    parser = serve_parser()
    result["command"] = {
        "console_script": scripts.get(program),
        "serve": subcommand in parser._subparsers._group_actions[0].choices,
    }
    # the aliases of every flag, from the serve subcommand's own parser
    result["aliases"] = owned_aliases(make_arg_parser(FlexibleArgumentParser()))
    with tempfile.TemporaryDirectory(prefix="qwen-vllm-checks-") as tmp:
        for case in request["cases"]:
            try:
                result["cases"][case["name"]] = check_case(case, parser, Path(tmp))
            except Exception:
                result["cases"][case["name"]] = {"problems": [traceback.format_exc()], "facts": {}}
    for verdict, samples in request["extra_args"].items():
        result["extra_args"][verdict] = [
            {"args": args, "refusal": parse(parser, [*request["base_argv"], *args])[1]} for args in samples
        ]
    Path(sys.argv[2]).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
