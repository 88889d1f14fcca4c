"""Every rendered vLLM command line against the real vLLM 0.32 (the CPU build in the cached venv).

tests/vllm_checks.py runs under that venv's Python (the project venv has no vllm) and puts each command
line through the real argument parser, validate_parsed_serve_args, the quantization/reasoning/tool-parser
registries, SpeculativeConfig, and the whole VllmConfig built on a weightless copy of the checkpoint's
config.json, which applies --hf-overrides the way vLLM does; then it builds the rotary embedding vLLM
uses for Qwen3 from the result. Specs the planner refuses are rendered anyway, to show vLLM refuses
them too. Without the venv the tests skip, or fail when QWEN_REQUIRE_REAL_PARTS is set (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qwen_devtools.vllm_env import TOOL_ENV, vllm_python
from qwen_operator import versions
from qwen_operator.api.catalog import DEFAULT_ENGINE_IMAGE, NATIVE_CONTEXT, VLLM_VERSION
from qwen_operator.api.engine import (
    ENGINE_COMMAND,
    OWNED_FLAGS,
    REFUSED_FLAGS,
    check_extra_args,
    command_line,
)
from qwen_operator.api.plan import make_plan
from qwen_operator.api.review import review
from qwen_operator.api.spec import parse
from support import EXAMPLES, REPO, example, load

CHECKS = Path(__file__).with_name("vllm_checks.py")
#: vLLM 0.32 serves AWQ checkpoints with its AutoAWQ method on GPUs, whichever AWQ name was asked for.
ENGINE_QUANTIZATION = {"awq": "auto_awq", "awq_marlin": "auto_awq"}


def _variant(base: str, **changes: Any) -> dict[str, Any]:
    body = example(base)
    for section, value in changes.items():
        if isinstance(value, dict) and isinstance(body["spec"].get(section), dict):
            body["spec"][section] |= value
        else:
            body["spec"][section] = value
    return body


#: Valid resources beyond the examples, for code paths the examples do not take.
VARIANTS: dict[str, dict[str, Any]] = {
    "yarn-factor-2": _variant("h100-80gb-tp2-fp8-128k", engine={"maxModelLen": 65_536, "speculative": None}),
    "yarn-100k-factor-4": _variant("h100-80gb-tp2-fp8-128k", engine={"maxModelLen": 100_000}),
    "online-fp8-per-tensor": _variant("a100-80gb-tp2-bf16", engine={"quantization": "fp8_per_tensor"}),
    "online-fp8-per-block": _variant("a100-80gb-tp2-bf16", engine={"quantization": "fp8_per_block"}),
    "no-yarn-at-40960": _variant(
        "h100-80gb-tp2-fp8-128k", engine={"maxModelLen": 40_960, "speculative": None}
    ),
    "awq-default-quantization": _variant(
        "l40s-48gb-tp1-awq", engine={"maxModelLen": 16_384, "maxNumSeqs": 32}
    ),
    "draft-model": _variant(
        "a100-80gb-tp2-bf16",
        engine={
            "speculative": {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "numSpeculativeTokens": 3}
        },
    ),
    # the smaller Qwen3 sizes: one GPU by default, YaRN where Qwen documents it, AWQ at TP 2
    "qwen3-8b-tp1": _variant("a100-80gb-tp2-bf16", model={"name": "Qwen/Qwen3-8B"}),
    "qwen3-4b-yarn": _variant(
        "a100-80gb-tp2-bf16", model={"name": "Qwen/Qwen3-4B"}, engine={"maxModelLen": 65_536}
    ),
    "qwen3-14b-awq-tp2": _variant(
        "l40s-48gb-tp1-awq", model={"name": "Qwen/Qwen3-14B-AWQ"}, parallelism={"tensor": 2}
    ),
    # TP 16 over 8 KV heads: each KV head on two GPUs (vLLM accepts it; so does the planner)
    "qwen3-32b-tp16": _variant(
        "a100-80gb-tp2-bf16", gpu={"gpusPerNode": 16}, parallelism={"tensor": 16}
    ),
    "eagle3": _variant(
        "h100-80gb-tp2-fp8-128k",
        engine={"speculative": {"method": "eagle3", "model": "org/qwen3-32b-eagle3"}},
    ),
    "parsers-off-chunked-prefill-off": _variant(
        "a100-80gb-tp2-bf16",
        engine={
            "maxModelLen": 16_384,
            "maxNumBatchedTokens": 16_384,
            "enableChunkedPrefill": False,
            "enablePrefixCaching": False,
            "reasoning": {"enabled": False},
            "toolCalling": {"enabled": False},
        },
    ),
    "lora": _variant(
        "a100-80gb-tp2-bf16",
        lora={
            "maxLoras": 4,
            "maxLoraRank": 64,
            "maxCpuLoras": 8,
            "adapters": [
                {"name": "sql", "source": {"huggingFace": {"repo": "my-org/sql-lora", "revision": "0" * 40}}}
            ],
        },
    ),
    "extra-args": _variant(
        "a100-80gb-tp2-bf16",
        model={"revision": "main", "servedModelName": "qwen3"},
        parallelism={"tensor": 4, "pipeline": 2},
        engine={
            "gpuMemoryUtilization": 0.85,
            "extraArgs": [
                "--enforce-eager",
                "--seed",
                "7",
                "--max_logprobs",
                "5",
                "--long-prefill-token-threshold",
                "2048",
                "--compilation-config.cudagraph_mode",
                "PIECEWISE",
            ],
        },
    ),
}  # fmt: skip
del VARIANTS["awq-default-quantization"]["spec"]["engine"]["quantization"]
for _name in ("qwen3-8b-tp1", "qwen3-4b-yarn"):  # tensor parallel size unset: the model's default, 1
    del VARIANTS[_name]["spec"]["parallelism"]

#: Resources the planner refuses, rendered anyway: vLLM's own configuration must refuse them too.
REFUSED_BY_BOTH: dict[str, tuple[dict[str, Any], str]] = {
    "tp-3": (
        _variant("h100-80gb-tp2-fp8-128k", parallelism={"tensor": 3}),
        "divisible by tensor parallel size",
    ),
    "chunked-prefill-off-short-budget": (
        _variant("a100-80gb-tp2-bf16", engine={"enableChunkedPrefill": False, "maxNumBatchedTokens": 8192}),
        "max_model_len",
    ),
    "budget-below-max-num-seqs": (
        _variant("a100-80gb-tp2-bf16", engine={"maxNumSeqs": 512, "maxNumBatchedTokens": 256}),
        "max_num_seqs",
    ),
    "qwen3-14b-tp16": (
        _variant(
            "a100-80gb-tp2-bf16",
            model={"name": "Qwen/Qwen3-14B"},
            gpu={"gpusPerNode": 16},
            parallelism={"tensor": 16},
        ),
        "divisible by tensor parallel size",
    ),
    "context-over-131072": (
        _variant("h100-80gb-tp2-fp8-128k", engine={"maxModelLen": 262_144}),
        "greater than the derived max_model_len",
    ),
}

#: extraArgs the offline check (vllm_flags.json) accepts and refuses as not flags: the real parser agrees.
EXTRA_ARGS_ACCEPT = [
    ["--enforce-eager"],
    ["--no-enforce-eager"],
    ["--seed", "-1"],
    ["--max_logprobs=5"],
    ["--compilation-config", '{"cudagraph_mode": "PIECEWISE"}'],
    ["--compilation-config.cudagraph_mode", "PIECEWISE"],
    ["-cc.mode=3"],
    ["-O3"],
    ["-O", "2"],
    ["-ep"],
    ["-asc", "2"],
    ["--async-scheduling"],
    ["--limit-mm-per-prompt", '{"image": 0}'],
]
EXTRA_ARGS_REJECT = [
    ["--enforce-eagr"],
    ["--rope-scaling", "{}"],
    ["--speculative-model", "Qwen/Qwen3-0.6B"],
    ["--use-v2-block-manager"],
    ["--seed"],
    ["--enforce-eager=true"],
]


def _case(name: str, body: dict[str, Any], *, require_fit: bool = True) -> dict[str, Any]:
    spec = parse(body).spec
    plan = make_plan(spec)
    assert plan.fits == require_fit, (name, plan.errors)
    command = command_line(spec, plan)
    assert command[:2] == list(ENGINE_COMMAND)
    return {"name": name, "argv": command[2:]}


def _cases() -> list[dict[str, Any]]:
    cases = [_case(path.stem, load(path)) for path in EXAMPLES]
    cases += [_case(name, body) for name, body in VARIANTS.items()]
    cases += [_case(name, body, require_fit=False) for name, (body, _) in REFUSED_BY_BOTH.items()]
    return cases


def _run(python: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    # -I: neither tests/ nor the current directory on sys.path, so nothing here shadows vLLM's imports
    return subprocess.run(
        [str(python), "-I", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **TOOL_ENV},
    )


@pytest.fixture(scope="module")
def vllm_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = vllm_python()  # skips, or fails under QWEN_REQUIRE_REAL_PARTS, when the venv is missing
    work = tmp_path_factory.mktemp("vllm-checks")
    request = {
        "vllm": VLLM_VERSION,
        "command": list(ENGINE_COMMAND),
        "cases": _cases(),
        "base_argv": ["Qwen/Qwen3-32B"],
        "extra_args": {"accept": EXTRA_ARGS_ACCEPT, "reject": EXTRA_ARGS_REJECT},
    }
    (work / "request.json").write_text(json.dumps(request))
    done = _run(python, str(CHECKS), str(work / "request.json"), str(work / "result.json"))
    assert done.returncode == 0, f"vllm_checks.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    result: dict[str, Any] = json.loads((work / "result.json").read_text())
    return result


def test_pinned_version_is_the_installed_one(vllm_result: dict[str, Any]) -> None:
    assert vllm_result["vllm"] == VLLM_VERSION == versions.VLLM
    assert DEFAULT_ENGINE_IMAGE.endswith(f":v{vllm_result['vllm']}")


def test_engine_command_is_vllm_serve(vllm_result: dict[str, Any]) -> None:
    """`vllm` is the package's console script and `serve` one of its subcommands: the command lines
    above were parsed by that very subcommand's parser."""
    assert vllm_result["command"] == {"console_script": "vllm.entrypoints.cli.main:main", "serve": True}


def _expected(body: dict[str, Any]) -> dict[str, Any]:
    r = review(body)
    spec, plan = r.resource.spec, r.plan
    return {
        "max_model_len": spec.engine.max_model_len,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "pipeline_parallel_size": plan.pipeline_parallel_size,
        "quantization": ENGINE_QUANTIZATION.get(str(plan.quantization), plan.quantization),
        "kv_cache_dtype": spec.engine.kv_cache_dtype,
        "max_num_seqs": spec.engine.max_num_seqs,
        "max_num_batched_tokens": spec.engine.max_num_batched_tokens,
        "chunked_prefill": spec.engine.enable_chunked_prefill,
        "prefix_caching": spec.engine.enable_prefix_caching,
        "yarn_factor": plan.yarn.factor if plan.yarn else None,
        "speculative": spec.engine.speculative,
        "reasoning": spec.engine.reasoning.parser if spec.engine.reasoning.enabled else None,
        "tools": spec.engine.tool_calling.parser if spec.engine.tool_calling.enabled else None,
        "lora": spec.lora,
    }


VALID = {path.stem: load(path) for path in EXAMPLES} | VARIANTS


@pytest.mark.parametrize("name", list(VALID))
def test_vllm_accepts_the_command_line(name: str, vllm_result: dict[str, Any]) -> None:
    case = vllm_result["cases"][name]
    assert case["problems"] == []
    expected = _expected(VALID[name])
    engine = case["facts"]["engine"]
    for key in (
        "max_model_len",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "quantization",
        "max_num_seqs",
        "max_num_batched_tokens",
        "chunked_prefill",
        "prefix_caching",
    ):
        assert engine[key] == expected[key], key
    assert engine["kv_cache_dtype"] == expected["kv_cache_dtype"]

    rope, rotary = engine["rope_parameters"], case["facts"]["rotary_embedding"]
    assert rope["rope_theta"] == 1_000_000
    assert rotary["base"] == 1_000_000
    if expected["yarn_factor"]:
        factor = expected["yarn_factor"]
        assert rope["rope_type"] == "yarn"
        assert rope["factor"] == factor
        assert rope["original_max_position_embeddings"] == NATIVE_CONTEXT
        assert engine["max_position_embeddings"] == factor * NATIVE_CONTEXT >= expected["max_model_len"]
        assert rotary["class"] == "YaRNScalingRotaryEmbedding"
        assert rotary["scaling_factor"] == factor
    else:
        assert rope["rope_type"] == "default"
        assert engine["max_position_embeddings"] == 40_960  # the checkpoint's own
        assert rotary["class"] == "RotaryEmbedding"

    speculative = expected["speculative"]
    if speculative is None:
        assert engine["speculative_method"] is None
    elif "speculative_skipped" not in case["facts"]:
        assert engine["speculative_method"] == speculative.method
        assert engine["num_speculative_tokens"] == speculative.num_speculative_tokens
    lora = expected["lora"]
    if lora is None:
        assert engine["lora"] is None
    else:  # the slots vLLM sizes are the spec's, in the model's dtype (api/lora.py counts 2 B)
        assert engine["lora"] == {
            "max_loras": lora.max_loras,
            "max_lora_rank": lora.max_lora_rank,
            "max_cpu_loras": lora.effective_max_cpu_loras,
            "lora_dtype": "torch.bfloat16",
        }
    parsed = case["facts"]["parsed"]
    assert (parsed["reasoning_parser"] or None) == expected["reasoning"]
    assert (parsed["tool_call_parser"] or None) == expected["tools"]
    assert parsed["enable_auto_tool_choice"] == bool(expected["tools"])
    if expected["reasoning"] == "qwen3":
        assert case["facts"]["reasoning_parser_class"].startswith("Qwen3")
    if expected["tools"] == "hermes":
        assert case["facts"]["tool_parser_class"] == "Hermes2ProToolParser"


def test_examples_cover_yarn_quantization_and_speculation(vllm_result: dict[str, Any]) -> None:
    engines = [vllm_result["cases"][path.stem]["facts"]["engine"] for path in EXAMPLES]
    assert {e["rope_parameters"]["rope_type"] for e in engines} == {"default", "yarn"}
    assert {e["quantization"] for e in engines} == {None, "fp8", "auto_awq"}
    assert "ngram" in {e["speculative_method"] for e in engines}


@pytest.mark.parametrize("name", list(REFUSED_BY_BOTH))
def test_vllm_refuses_what_the_planner_refuses(name: str, vllm_result: dict[str, Any]) -> None:
    substring = REFUSED_BY_BOTH[name][1]
    problems = vllm_result["cases"][name]["problems"]
    assert any("vLLM refused the engine config" in p and substring in p for p in problems), problems


def test_extra_args_check_agrees_with_the_parser(vllm_result: dict[str, Any]) -> None:
    for sample in vllm_result["extra_args"]["accept"]:
        assert check_extra_args(sample["args"]) == [], sample["args"]
        assert sample["refusal"] == "", sample
    for sample in vllm_result["extra_args"]["reject"]:
        assert check_extra_args(sample["args"]), sample["args"]
        assert sample["refusal"], f"vLLM accepts {sample['args']}"


def test_every_spelling_of_an_owned_flag_is_owned(vllm_result: dict[str, Any]) -> None:
    aliases = vllm_result["aliases"]
    for flag in OWNED_FLAGS:
        missing = [a for a in aliases[flag] if a not in OWNED_FLAGS]
        assert not missing, f"{flag} is owned but its aliases {missing} are not"
    for flag in REFUSED_FLAGS:
        # Every spelling of a refused flag is refused; its negation (--no-X, vLLM's default) is not.
        spellings = [
            a for a in aliases[flag] if not (a.startswith("--no-") and f"--{a[5:]}" in aliases[flag])
        ]
        assert all(a in REFUSED_FLAGS for a in spellings), (flag, aliases[flag])


if __name__ == "__main__":  # print the request, for running vllm_checks.py by hand
    json.dump({"cases": _cases()}, sys.stdout, indent=1)
