"""The vLLM command line rendered from a QwenDeployment, and the offline checks of engine.extraArgs.

The same command lines are parsed by the real vLLM 0.32 in test_real_parser.py; here they are pinned
flag by flag, without vLLM installed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from qwen_operator.api.catalog import DEFAULT_ENGINE_IMAGE, VLLM_VERSION
from qwen_operator.api.engine import (
    ENGINE_COMMAND,
    OWNED_FLAGS,
    REFUSED_FLAGS,
    REFUSED_VALUES,
    check_extra_args,
    command_line,
    engine_args,
    vllm_flags,
)
from qwen_operator.api.plan import make_plan
from qwen_operator.api.review import review
from qwen_operator.api.spec import QwenDeploymentSpec, parse
from support import EXAMPLES, example, load


def spec_of(**engine: Any) -> QwenDeploymentSpec:
    body = example("a100-80gb-tp2-bf16")
    body["spec"]["engine"] = engine
    return parse(body).spec


def args_of(spec: QwenDeploymentSpec) -> list[str]:
    return engine_args(spec, make_plan(spec))


def value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


def test_a100_example_command_line_in_full() -> None:
    spec = parse(example("a100-80gb-tp2-bf16")).spec
    assert command_line(spec, make_plan(spec)) == [
        "vllm", "serve",
        "Qwen/Qwen3-32B",
        "--served-model-name", "Qwen/Qwen3-32B",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--tensor-parallel-size", "2",
        "--pipeline-parallel-size", "1",
        "--max-model-len", "32768",
        "--max-num-seqs", "128",
        "--max-num-batched-tokens", "8192",
        "--gpu-memory-utilization", "0.9",
        "--enable-chunked-prefill",
        "--enable-prefix-caching",
        "--kv-cache-dtype", "auto",
        "--shutdown-timeout", "105",  # the 120 s grace period less the 10 s preStop and 5 s to exit
        "--reasoning-parser", "qwen3",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
    ]  # fmt: skip


def test_h100_example_yarn_and_speculation() -> None:
    spec = parse(example("h100-80gb-tp2-fp8-128k")).spec
    args = args_of(spec)
    assert value(args, "--quantization") == "fp8"
    assert value(args, "--kv-cache-dtype") == "fp8"
    assert value(args, "--max-model-len") == "131072"
    assert json.loads(value(args, "--hf-overrides")) == {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "rope_theta": 1_000_000.0,
        },
        "max_position_embeddings": 131072,
    }
    assert json.loads(value(args, "--speculative-config")) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }


@pytest.mark.parametrize(("length", "factor"), [(40_961, 2.0), (65_536, 2.0), (100_000, 4.0), (131_072, 4.0)])
def test_yarn_overrides_are_consistent(length: int, factor: float) -> None:
    overrides = json.loads(value(args_of(spec_of(maxModelLen=length)), "--hf-overrides"))
    assert overrides["rope_parameters"]["factor"] == factor
    # transformers checks max_position_embeddings / original == factor; vLLM 0.32 reads
    # max_position_embeddings as the scaled window and refuses a --max-model-len above it.
    assert overrides["max_position_embeddings"] == int(factor * 32_768) >= length


@pytest.mark.parametrize("length", [32_768, 40_000, 40_960])
def test_no_yarn_up_to_the_config_window(length: int) -> None:
    # Qwen3-32B's config.json has max_position_embeddings 40960: vLLM takes that length as is.
    assert "--hf-overrides" not in args_of(spec_of(maxModelLen=length))


@pytest.mark.parametrize("method", ["fp8_per_tensor", "fp8_per_block"])
def test_online_fp8_is_passed_by_its_vllm_name(method: str) -> None:
    # vLLM 0.32 names: vllm/model_executor/layers/quantization/__init__.py QuantizationMethods and
    # vllm/config/quantization.py _ONLINE_SHORTHANDS (`--quantization fp8` on bf16 is deprecated there).
    assert value(args_of(spec_of(quantization=method)), "--quantization") == method


def test_each_field_maps_to_its_flag() -> None:
    body = example("a100-80gb-tp2-bf16")
    body["spec"]["model"] |= {"revision": "abc123", "servedModelName": "qwen3"}
    body["spec"]["parallelism"] = {"tensor": 4, "pipeline": 2}
    body["spec"]["engine"] = {
        "maxModelLen": 16_384,
        "maxNumSeqs": 32,
        "maxNumBatchedTokens": 16_384,
        "enableChunkedPrefill": False,
        "enablePrefixCaching": False,
        "gpuMemoryUtilization": 0.85,
        "quantization": "fp8_per_tensor",
        "reasoning": {"enabled": False},
        "toolCalling": {"parser": "qwen3_xml"},
        "extraArgs": ["--enforce-eager", "--seed", "7"],
    }
    spec = parse(body).spec
    args = args_of(spec)
    assert value(args, "--revision") == "abc123"
    assert value(args, "--served-model-name") == "qwen3"
    assert value(args, "--tensor-parallel-size") == "4"
    assert value(args, "--pipeline-parallel-size") == "2"
    assert value(args, "--max-model-len") == "16384"
    assert value(args, "--max-num-seqs") == "32"
    assert value(args, "--max-num-batched-tokens") == "16384"
    assert value(args, "--gpu-memory-utilization") == "0.85"
    assert value(args, "--quantization") == "fp8_per_tensor"
    assert value(args, "--tool-call-parser") == "qwen3_xml"
    assert "--no-enable-chunked-prefill" in args and "--enable-chunked-prefill" not in args
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args
    assert "--reasoning-parser" not in args
    assert args[-3:] == ["--enforce-eager", "--seed", "7"]  # extraArgs last, unchanged


def test_tool_calling_off() -> None:
    args = args_of(spec_of(toolCalling={"enabled": False}))
    assert "--enable-auto-tool-choice" not in args and "--tool-call-parser" not in args


def test_no_api_key_on_the_command_line() -> None:
    # The key comes from the VLLM_API_KEY env var (a Secret), never from argv where `ps` shows it.
    args = args_of(spec_of(apiKeySecret={"name": "engine-key"}))
    assert "--api-key" not in args


@pytest.mark.parametrize(
    ("speculative", "config"),
    [
        ({"method": "ngram"}, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                               "prompt_lookup_min": 2}),
        ({"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "numSpeculativeTokens": 5},
         {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 5}),
        ({"method": "eagle3", "model": "org/qwen3-32b-eagle3"},
         {"method": "eagle3", "model": "org/qwen3-32b-eagle3", "num_speculative_tokens": 3}),
    ],
)  # fmt: skip
def test_speculative_config(speculative: dict[str, Any], config: dict[str, Any]) -> None:
    assert json.loads(value(args_of(spec_of(speculative=speculative)), "--speculative-config")) == config


def test_quantization_defaults_to_the_checkpoint() -> None:
    awq = example("l40s-48gb-tp1-awq")
    del awq["spec"]["engine"]["quantization"]
    assert value(args_of(parse(awq).spec), "--quantization") == "awq"
    assert "--quantization" not in args_of(spec_of(quantization="none"))


def test_every_rendered_flag_is_in_the_pinned_flag_table() -> None:
    known = vllm_flags()
    for path in EXAMPLES:
        r = review(load(path))
        assert r.command[:2] == list(ENGINE_COMMAND)
        for arg in r.command[2:]:
            if arg.startswith("--"):
                assert arg in known, f"{path.name}: {arg}"


def test_default_image_is_the_pinned_vllm_version() -> None:
    assert f"vllm/vllm-openai:v{VLLM_VERSION}" == DEFAULT_ENGINE_IMAGE
    from importlib import resources

    table = json.loads(resources.files("qwen_operator.api").joinpath("vllm_flags.json").read_text())
    assert table["vllm"] == VLLM_VERSION


def test_owned_flags_exist_in_vllm() -> None:
    known = vllm_flags()
    assert set(OWNED_FLAGS) <= set(known)
    assert set(REFUSED_FLAGS) <= set(known)
    assert {flag for flag, _ in REFUSED_VALUES} <= {f for f, takes_value in known.items() if takes_value}


def test_every_flag_the_operator_renders_is_owned() -> None:
    # Each flag of the rendered command line is one extraArgs may not set again (an alias spelling too).
    spec = parse(load(next(p for p in EXAMPLES if "128k" in p.name))).spec  # YaRN, speculation, fp8
    rendered = {a for a in engine_args(spec, make_plan(spec)) if a.startswith("--")}
    assert rendered <= set(OWNED_FLAGS)


@pytest.mark.parametrize("flag", sorted(REFUSED_FLAGS))
def test_every_refused_flag_says_what_to_do(flag: str) -> None:
    args = [flag, "x"] if vllm_flags()[flag] else [flag]
    (problem,) = check_extra_args(args)
    assert problem[0] == "spec.engine.extraArgs[0]"
    assert problem[1].startswith(f"{flag} is refused: ")
    assert problem[1].endswith(("; remove it", "put the flags themselves in extraArgs"))


@pytest.mark.parametrize("flag", sorted(OWNED_FLAGS))
def test_every_owned_flag_names_its_field_or_says_it_has_none(flag: str) -> None:
    args = [flag, "x"] if vllm_flags()[flag] else [flag]
    (problem,) = check_extra_args(args)
    owned = OWNED_FLAGS[flag]
    if owned.field is None:
        assert problem[1] == f"{flag} is set by the operator ({owned.why}); remove it"
    else:
        assert problem[1].startswith(f"{flag} is set by the operator from {owned.field}; use that field")


# --- extraArgs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--enforce-eager"],
        ["--no-enforce-eager"],
        ["--seed", "-1"],
        ["--seed=7"],
        ["--long-prefill-token-threshold", "2048", "--async-scheduling"],
        ["--max_logprobs", "5"],  # underscores, as vLLM's parser accepts them
        ["--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'],
        ["--compilation-config.cudagraph_mode", "FULL_AND_PIECEWISE"],  # one key of a JSON flag
        ["-cc.mode=3"],
        ["-O3"],
        ["-O", "2"],
        ["-ep"],  # short forms longer than one letter
        ["-asc", "2"],
        ["--limit-mm-per-prompt", '{"image": 0}'],
        ["--load-format", "safetensors"],  # only dummy (random weights) is refused
        ["--load-format=runai_streamer"],
        ["--no-trust-remote-code"],  # the default
        # Decided on purpose (engine.REFUSED_FLAGS says why): inert without --allowed-origins, the KV
        # events the gateway's kv_aware policy reads, the owner's choice of request logging.
        ["--allow-credentials", "--allowed-methods", '["POST"]', "--allowed-headers", '["*"]'],
        ["--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "zmq"}'],
        ["--enable-log-requests", "--enable-log-outputs", "--max-log-len", "100"],
    ],
)
def test_extra_args_accepted(args: list[str]) -> None:
    assert check_extra_args(args) == []


@pytest.mark.parametrize(
    ("args", "index", "message"),
    [
        (["--max-model-len", "65536"], 0, "--max-model-len is set by the operator from spec.engine.maxMod"),
        (["--max_model_len=65536"], 0, "--max-model-len is set by the operator from spec.engine.maxModelLen"),
        (["--enforce-eager", "-tp", "4"], 1, "-tp is set by the operator from spec.parallelism.tensor"),
        (["-q", "awq"], 0, "-q is set by the operator from spec.engine.quantization"),
        (["--speculative-config.method", "ngram"], 0, "--speculative-config is set by the operator"),
        (["-sc.num_speculative_tokens=2"], 0, "-sc is set by the operator from spec.engine.speculative"),
        (["--spec-method", "ngram"], 0, "--spec-method is set by the operator from spec.engine.speculative"),
        (["--device-memory-utilization", "0.9"], 0, "by the operator from spec.engine.gpuMemoryUtilization"),
        (["--no-enable-auto-tool-choice"], 0, "set by the operator from spec.engine.toolCalling"),
        (["--hf-overrides", "{}"], 0, "--hf-overrides is set by the operator from spec.engine.maxModelLen"),
        (["--api-key", "k"], 0, "--api-key is set by the operator from spec.engine.apiKeySecret"),
        (["--port", "9000"], 0,
         "--port is set by the operator (the engine listens on 8000 for the gateway and probes); remove it"),
        (["--host=::"], 0, "--host is set by the operator (the engine listens on all pod addresses"),
        (["--hf-token", "hf_x"], 0, "--hf-token is set by the operator from spec.model.hfTokenSecret"),
        (["-dp", "2"], 0, "-dp is set by the operator from spec.replicas; use that field (one engine pod"),
        (["--config", "/etc/vllm.yaml"], 0, "--config is refused: a config file could set the flags"),
        (["--help"], 0, "--help is refused"),
        (["--model", "Qwen/Qwen3-8B"], 0, "--model is set by the operator from spec.model.name"),
        (["--revision", "v2"], 0, "--revision is set by the operator from spec.model.revision"),
        (["--tokenizer=Qwen/Qwen3-8B"], 0, "--tokenizer is refused: the tokenizer is the checkpoint's own"),
        (["--tokenizer-revision", "v2"], 0, "the tokenizer follows the checkpoint's revision"),
        (["--hf-config-path", "/cfg"], 0, "it replaces the checkpoint's config.json"),
        (["--trust_remote_code"], 0, "--trust-remote-code is refused: it runs Python code"),
        (["--dtype", "float32"], 0, "--dtype is refused: the capacity plan counts the weights"),
        (["--runner", "pooling"], 0, "--runner is refused: the operator serves Qwen3-32B as a generative"),
        (["--grpc"], 0, "--grpc is refused: it serves gRPC instead of the HTTP OpenAI API on port 8000"),
        (["--grpc-port", "50051"], 0, "outside the gateway's keys and rate limits"),
        (["--ssl-keyfile", "/k"], 0, "--ssl-keyfile is refused: TLS ends at the gateway's Ingress"),
        (["--allowed-origins", '["*"]'], 0, "--allowed-origins is refused: it lets web pages"),
        (["--disable-log-stats"], 0, "--disable-log-stats is refused: it also stops vLLM's Prometheus"),
        (["--headless"], 0, "--headless is refused: it starts no API server"),
        (["--nnodes", "2"], 0, "--nnodes is refused: a replica is one pod on one node"),
        (["--data-parallel-address", "h"], 0, "--data-parallel-address is refused: a replica is one pod"),
        (["--load-format", "dummy"], 1, "--load-format dummy is refused: it serves random weights"),
        (["--load-format=dummy"], 0, "--load-format dummy is refused: it serves random weights"),
        (["--enforce-eagr"], 0, "--enforce-eagr is not a flag of vLLM 0.32.0 (did you mean --enforce-eager"),
        (["--rope-scaling", "{}"], 0, "--rope-scaling is not a flag of vLLM 0.32.0"),
        (["--speculative-model", "x"], 0, "--speculative-model is not a flag of vLLM 0.32.0"),
        (["--max-model", "4096"], 0, "--max-model is not a flag"),  # vLLM would read it as --max-model-len
        (["8"], 0, "'8' is not a flag and follows no flag that takes a value"),
        (["--enforce-eager", "true"], 1, "'true' is not a flag and follows no flag that takes a value"),
        (["--enforce-eager=true"], 0, "--enforce-eager takes no value"),
        (["--enforce-eager.x", "1"], 0, "--enforce-eager takes no value, so it has no keys to set"),
        (["--seed"], 0, "--seed needs a value"),
        (["--seed", "--enforce-eager"], 0, "--seed needs a value"),
        (["--enforce-eager", "Qwen/Qwen3-8B"], 1, "'Qwen/Qwen3-8B' is not a flag"),  # the positional model
    ],
)  # fmt: skip
def test_extra_args_refused(args: list[str], index: int, message: str) -> None:
    found = check_extra_args(args)
    assert any(path == f"spec.engine.extraArgs[{index}]" and message in text for path, text in found), found


def test_an_unknown_flag_with_a_value_is_one_problem() -> None:
    assert len(check_extra_args(["--no-such-flag", "3"])) == 1


def test_extra_args_problems_make_the_plan_fail() -> None:
    body = example("a100-80gb-tp2-bf16")
    body["spec"]["engine"] = {"extraArgs": ["--enforce-eager", "--max-num-seqs", "4"]}
    r = review(body)
    assert not r.ok and r.command == []
    assert (
        r.plan.errors
        == r.plan.config_errors
        == [
            (
                "spec.engine.extraArgs[1]",
                "--max-num-seqs is set by the operator from spec.engine.maxNumSeqs; use that field",
            )
        ]
    )
    assert r.plan.capacity_errors == []  # a refused flag is a spec problem, not a capacity one


# --- LoRA: slot flags only ------------------------------------------------------------------------

LORA_SOURCE = {"huggingFace": {"repo": "my-org/qwen3-32b-sql-lora", "revision": "0123456789" * 4}}


def lora_spec(**lora: Any) -> QwenDeploymentSpec:
    body = example("a100-80gb-tp2-bf16")
    body["spec"]["lora"] = lora
    return parse(body).spec


def test_lora_renders_the_slot_flags_and_not_the_adapters() -> None:
    spec = lora_spec(
        maxLoras=4, maxLoraRank=64, maxCpuLoras=8, adapters=[{"name": "sql", "source": LORA_SOURCE}]
    )
    args = args_of(spec)
    assert args[args.index("--enable-lora") :] == [
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--max-cpu-loras", "8",
    ]  # fmt: skip
    # the adapters are loaded at runtime: nothing of them on the command line
    assert "--lora-modules" not in args and not [a for a in args if "sql" in a]


def test_lora_defaults_are_rendered_explicitly() -> None:
    args = args_of(lora_spec())
    assert (value(args, "--max-loras"), value(args, "--max-lora-rank"), value(args, "--max-cpu-loras")) == (
        "1",
        "16",
        "1",  # maxCpuLoras defaults to maxLoras, as in vLLM
    )
    assert "--enable-lora" not in args_of(spec_of())


def test_extra_args_come_after_the_lora_flags() -> None:
    body = example("a100-80gb-tp2-bf16")
    body["spec"]["lora"] = {}
    body["spec"]["engine"]["extraArgs"] = ["--fully-sharded-loras"]
    args = args_of(parse(body).spec)
    assert args[-1] == "--fully-sharded-loras" and args[-3:-1] == ["--max-cpu-loras", "1"]
    assert check_extra_args(["--fully-sharded-loras", "--lora-target-modules", "o_proj"]) == []


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("--enable-lora", "spec.lora"),
        ("--no-enable-lora", "spec.lora"),
        ("--max-loras", "spec.lora.maxLoras"),
        ("--max-lora-rank", "spec.lora.maxLoraRank"),
        ("--max-cpu-loras", "spec.lora.maxCpuLoras"),
        ("--lora-modules", "spec.lora.adapters"),
    ],
)
def test_lora_flags_in_extra_args_are_owned(flag: str, field: str) -> None:
    takes_value = vllm_flags()[flag]
    ((path, message),) = check_extra_args([flag, "4"] if takes_value else [flag])
    assert path == "spec.engine.extraArgs[0]"
    assert message.startswith(f"{flag} is set by the operator from {field}; use that field")
