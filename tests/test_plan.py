"""The capacity planner against numbers computed by hand (bytes, not rounded GiB, wherever possible).

Constants used below (catalog.py):
    GiB = 1024**3 = 1,073,741,824 B; MiB = 1,048,576 B; runtime overhead = 5.5 GiB = 5,905,580,032 B.
    Qwen3-32B: 64 layers, 64 query heads, 8 KV heads, head_dim 128; bf16 weights 65,530,000,000 B,
    FP8 checkpoint 34,350,000,000 B, AWQ checkpoint 19,340,000,000 B.
    GPU memory as the driver reports it: A100-80GB 81,920 MiB, A100-40GB 40,960 MiB,
    H100-80GB 81,559 MiB, L40S-48GB 46,068 MiB.
"""

from __future__ import annotations

from typing import Any

import pytest

from qwen_operator.api.catalog import GIB, MODELS
from qwen_operator.api.plan import RUNTIME_OVERHEAD_BYTES, Plan, make_plan, yarn_for
from qwen_operator.api.spec import QwenDeploymentSpec, parse
from support import example


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Deep merge; a value None deletes the key."""
    out = dict(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def spec_of(spec: dict[str, Any]) -> QwenDeploymentSpec:
    body = {"apiVersion": "inference.qwenops.dev/v1alpha1", "kind": "QwenDeployment"}
    return parse({**body, "metadata": {"name": "t"}, "spec": spec}).spec


def plan_for(**spec: Any) -> Plan:
    """Plan of a spec: bf16 Qwen3-32B on A100-80GB with TP 2, changed by the keyword arguments."""
    base = {"model": {"name": "Qwen/Qwen3-32B"}, "gpu": {"type": "A100-80GB"}, "parallelism": {"tensor": 2}}
    return make_plan(spec_of(merge(base, spec)))


def errors_at(plan: Plan, path: str) -> list[str]:
    return [message for p, message in plan.errors if p == path]


def warnings_at(plan: Plan, path: str) -> list[str]:
    return [message for p, message in plan.warnings if p == path]


# --- KV cache bytes per token ----------------------------------------------------------------------


def test_kv_bytes_per_token_bf16_and_fp8() -> None:
    model = MODELS["Qwen/Qwen3-32B"]
    # K and V x 64 layers x 8 KV heads x 128 head_dim x 2 bytes = 262,144 B = 256 KiB.
    assert model.kv_bytes_per_token(2) == 2 * 64 * 8 * 128 * 2 == 262_144
    assert model.kv_bytes_per_token(1) == 131_072
    # One full 32K sequence is 8 GiB of KV cache; one 128K sequence 32 GiB.
    assert 8 * GIB == 32_768 * 262_144
    assert 32 * GIB == 131_072 * 262_144


def test_all_three_checkpoints_share_the_architecture() -> None:
    for model in MODELS.values():
        assert (model.num_layers, model.num_attention_heads, model.num_kv_heads, model.head_dim) == (
            64,
            64,
            8,
            128,
        )


# --- the three examples, by hand -------------------------------------------------------------------


def test_a100_80gb_tp2_bf16_example_by_hand() -> None:
    plan = make_plan(parse(example("a100-80gb-tp2-bf16")).spec)
    # weights per GPU: 65,530,000,000 B / TP 2 = 32,765,000,000 B = 30.51 GiB
    assert plan.weights_bytes_per_gpu == 32_765_000_000
    assert round(plan.weights_bytes_per_gpu / GIB, 2) == 30.51
    # usable per GPU: 81,920 MiB x 0.90 = 73,728 MiB = 72 GiB = 77,309,411,328 B
    # KV budget per GPU: 77,309,411,328 - 32,765,000,000 - 5,905,580,032 (5.5 GiB overhead)
    #                  = 38,638,831,296 B (35.99 GiB)
    assert RUNTIME_OVERHEAD_BYTES == 5_905_580_032
    assert plan.kv_budget_bytes_per_gpu == 38_638_831_296
    # KV per token: 2 x 64 x 8 x 128 x 2 = 262,144 B; each GPU holds 1/2 of the KV heads, so
    # tokens per replica = budget x 2 / 262,144 = 294,790.9 -> 294,790
    assert plan.kv_bytes_per_token == 262_144
    assert plan.kv_tokens_per_replica == 294_790
    # full 32,768-token requests at once: 294,790 // 32,768 = 8 (8.996)
    assert plan.max_concurrent_at_max_model_len == 8
    assert (plan.tensor_parallel_size, plan.gpus_per_replica, plan.max_model_len) == (2, 2, 32_768)
    assert plan.yarn is None and plan.quantization is None
    assert plan.fits and plan.warnings == []


def test_h100_fp8_128k_example_by_hand() -> None:
    plan = make_plan(parse(example("h100-80gb-tp2-fp8-128k")).spec)
    # weights per GPU: 34,350,000,000 / 2 = 17,175,000,000 B (16.00 GiB)
    assert plan.weights_bytes_per_gpu == 17_175_000_000
    # usable: 81,559 MiB = 85,520,809,984 B x 0.9 = 76,968,728,985 B (71.68 GiB)
    # budget: 76,968,728,985 - 17,175,000,000 - 5,905,580,032 = 53,888,148,953 B (50.19 GiB)
    assert plan.kv_budget_bytes_per_gpu == 53_888_148_953
    # fp8 KV: 131,072 B per token; tokens = 53,888,148,953 x 2 / 131,072 = 822,267.9 -> 822,267
    assert plan.kv_bytes_per_token == 131_072
    assert plan.kv_tokens_per_replica == 822_267
    # 822,267 // 131,072 = 6 full-length requests
    assert plan.max_concurrent_at_max_model_len == 6
    # 131,072 > 32,768: YaRN, factor 4 (131,072 / 32,768), original window 32,768
    assert plan.yarn is not None
    assert (plan.yarn.factor, plan.yarn.original_max_position_embeddings) == (4.0, 32_768)
    assert plan.quantization == "fp8" and plan.fits
    assert [p for p, _ in plan.warnings] == ["spec.engine.maxModelLen"]  # the YaRN quality note only


def test_l40s_awq_example_by_hand() -> None:
    plan = make_plan(parse(example("l40s-48gb-tp1-awq")).spec)
    # AWQ weights on one GPU: 19,340,000,000 B (18.01 GiB)
    assert plan.weights_bytes_per_gpu == 19_340_000_000
    # usable: 46,068 MiB = 48,305,799,168 B x 0.9 = 43,475,219,251 B
    # budget: 43,475,219,251 - 19,340,000,000 - 5,905,580,032 = 18,229,639,219 B (16.98 GiB)
    assert plan.kv_budget_bytes_per_gpu == 18_229_639_219
    # tokens: 18,229,639,219 / 262,144 = 69,540.6 -> 69,540; 69,540 // 32,768 = 2
    assert plan.kv_tokens_per_replica == 69_540
    assert plan.max_concurrent_at_max_model_len == 2
    assert plan.quantization == "awq_marlin" and plan.fits


# --- memory fit ------------------------------------------------------------------------------------


def test_bf16_on_two_a100_40gb_does_not_fit() -> None:
    plan = plan_for(gpu={"type": "A100-40GB"})
    # usable: 40,960 MiB x 0.9 = 36 GiB; needed: 30.51 GiB weights + 5.5 GiB = 36.01 GiB > 36.00 GiB
    assert not plan.fits
    (message,) = errors_at(plan, "spec.gpu.type")
    assert "weights need 30.51 GiB per GPU plus 5.50 GiB runtime = 36.01 GiB" in message
    assert "A100-40GB offers 36.00 GiB at gpuMemoryUtilization 0.9" in message
    assert plan.kv_budget_bytes_per_gpu == 0 and plan.kv_tokens_per_replica == 0


def test_bf16_on_four_a100_40gb_fits() -> None:
    plan = plan_for(gpu={"type": "A100-40GB"}, parallelism={"tensor": 4})
    # weights 65.53e9 / 4 = 16,382,500,000 B; budget 38,654,705,664 - 16,382,500,000 - 5,905,580,032
    # = 16,366,625,632 B; tokens = x 4 / 262,144 = 249,734.9 -> 249,734; // 32,768 = 7
    assert plan.kv_budget_bytes_per_gpu == 16_366_625_632
    assert plan.kv_tokens_per_replica == 249_734
    assert plan.max_concurrent_at_max_model_len == 7
    assert plan.fits


def test_bf16_tp1_on_a100_80gb_cannot_hold_one_full_sequence() -> None:
    plan = plan_for(parallelism={"tensor": 1})
    # budget: 77,309,411,328 - 65,530,000,000 - 5,905,580,032 = 5,873,831,296 B (5.47 GiB)
    # tokens: 5,873,831,296 / 262,144 = 22,406.9 -> 22,406 < 32,768 (one sequence needs 8 GiB)
    assert plan.kv_tokens_per_replica == 22_406
    (message,) = errors_at(plan, "spec.engine.maxModelLen")
    assert (
        "one 32768-token sequence needs 8.00 GiB of KV cache but a replica has 5.47 GiB (22406 tokens)"
        in message
    )


def test_one_full_request_fits_but_warns() -> None:
    plan = plan_for(parallelism={"tensor": 1}, engine={"maxModelLen": 16_384})
    # 22,406 // 16,384 = 1 request at full length: allowed, with a warning
    assert plan.fits and plan.max_concurrent_at_max_model_len == 1
    assert any(
        "only 1 request(s) of 16384 tokens fit at once" in w
        for w in warnings_at(plan, "spec.engine.maxModelLen")
    )


def test_fp8_kv_cache_doubles_tokens() -> None:
    bf16 = plan_for(gpu={"type": "H100-80GB"})
    fp8 = plan_for(gpu={"type": "H100-80GB"}, engine={"kvCacheDtype": "fp8"})
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.kv_budget_bytes_per_gpu == bf16.kv_budget_bytes_per_gpu
    assert fp8.kv_tokens_per_replica in (2 * bf16.kv_tokens_per_replica, 2 * bf16.kv_tokens_per_replica + 1)


def test_gpu_memory_utilization_changes_the_budget() -> None:
    plan = plan_for(engine={"gpuMemoryUtilization": 0.8})
    # usable: 85,899,345,920 x 0.8 = 68,719,476,736 (64 GiB); budget = 68,719,476,736 - 32,765,000,000
    # - 5,905,580,032 = 30,048,896,704; tokens = x 2 / 262,144 = 229,254.9 -> 229,254
    assert plan.kv_budget_bytes_per_gpu == 30_048_896_704
    assert plan.kv_tokens_per_replica == 229_254


def test_pipeline_parallelism_splits_weights_and_layers() -> None:
    plan = plan_for(parallelism={"tensor": 2, "pipeline": 2})
    # 4 GPUs: weights 65,530,000,000 / 4 = 16,382,500,000 B each; KV budget per GPU
    # 77,309,411,328 - 16,382,500,000 - 5,905,580,032 = 55,021,331,296; each GPU holds 1/2 of the KV
    # heads of 1/2 of the layers: tokens = 55,021,331,296 x 4 / 262,144 = 839,558.9 -> 839,558
    assert plan.gpus_per_replica == 4
    assert plan.weights_bytes_per_gpu == 16_382_500_000
    assert plan.kv_tokens_per_replica == 839_558


def test_draft_model_weights_count() -> None:
    plan = plan_for(engine={"speculative": {"method": "draft_model", "model": "Qwen/Qwen3-0.6B"}})
    # (65,530,000,000 + 1,500,000,000) / 2 = 33,515,000,000 B per GPU
    assert plan.weights_bytes_per_gpu == 33_515_000_000
    assert plan.fits and plan.warnings == []


def test_unknown_draft_model_is_a_warning() -> None:
    plan = plan_for(engine={"speculative": {"method": "draft_model", "model": "someone/tiny-draft"}})
    assert plan.fits
    assert plan.weights_bytes_per_gpu == 32_765_000_000
    assert any("not in the catalog" in w for w in warnings_at(plan, "spec.engine.speculative.model"))


def test_eagle3_head_outside_the_catalog_is_a_warning() -> None:
    plan = plan_for(engine={"speculative": {"method": "eagle3", "model": "org/qwen3-32b-eagle3"}})
    assert plan.fits
    (warning,) = warnings_at(plan, "spec.engine.speculative.model")
    assert "eagle3 head 'org/qwen3-32b-eagle3' is not in the catalog" in warning


def test_ngram_needs_no_memory() -> None:
    plan = plan_for(engine={"speculative": {"method": "ngram"}})
    assert plan.weights_bytes_per_gpu == 32_765_000_000 and plan.warnings == []


# --- tensor parallelism against the head counts ----------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_valid_tensor_parallel_sizes(tp: int) -> None:
    plan = plan_for(gpu={"type": "H100-80GB"}, parallelism={"tensor": tp})
    assert not errors_at(plan, "spec.parallelism.tensor")


@pytest.mark.parametrize("tp", [3, 5, 6, 7, 16])
def test_invalid_tensor_parallel_sizes(tp: int) -> None:
    plan = plan_for(gpu={"type": "H100-80GB", "gpusPerNode": 16}, parallelism={"tensor": tp})
    (message,) = errors_at(plan, "spec.parallelism.tensor")
    assert f"tensor parallel size {tp} must divide the model's 64 attention heads and 8 KV heads" in message
    assert message.endswith("valid sizes: 1, 2, 4, 8")
    assert plan.kv_tokens_per_replica == 0  # no memory plan for an impossible layout


def test_replica_must_fit_on_one_node() -> None:
    plan = plan_for(gpu={"gpusPerNode": 4}, parallelism={"tensor": 4, "pipeline": 2})
    (message,) = errors_at(plan, "spec.parallelism")
    assert "a replica needs 8 GPUs (tensor 4 x pipeline 2) but a node of the pool has 4" in message
    assert plan_for(gpu={"gpusPerNode": 8}, parallelism={"tensor": 4, "pipeline": 2}).fits


# --- context length and YaRN -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "factor"),
    [(256, None), (32_768, None), (32_769, 2.0), (40_960, 2.0), (65_536, 2.0), (65_537, 4.0), (131_072, 4.0)],
)
def test_yarn_factor_is_the_smallest_that_covers(length: int, factor: float | None) -> None:
    yarn = yarn_for(length)
    assert (yarn.factor if yarn else None) == factor
    if yarn:
        assert yarn.original_max_position_embeddings == 32_768
        assert yarn.factor * 32_768 >= length


def test_yarn_is_applied_and_warned_about() -> None:
    plan = plan_for(gpu={"type": "H100-80GB"}, engine={"maxModelLen": 65_536})
    assert plan.yarn is not None and plan.yarn.factor == 2.0
    assert plan.fits
    assert any("YaRN factor 2" in w for w in warnings_at(plan, "spec.engine.maxModelLen"))


@pytest.mark.parametrize("length", [131_073, 262_144])
def test_context_over_131072_is_refused(length: int) -> None:
    plan = plan_for(gpu={"type": "H100-80GB"}, engine={"maxModelLen": length})
    assert any(f"{length} exceeds 131072" in m for m in errors_at(plan, "spec.engine.maxModelLen"))
    assert plan.yarn is None


# --- quantization per GPU --------------------------------------------------------------------------


def test_fp8_on_a100_is_weight_only_a_warning_not_an_error() -> None:
    plan = plan_for(engine={"quantization": "fp8"})
    assert plan.fits and plan.quantization == "fp8"
    (warning,) = warnings_at(plan, "spec.engine.quantization")
    assert "A100-80GB (Ampere) has no FP8 tensor cores: FP8 runs weight-only" in warning
    # bf16 weights quantized at load: 65,530,000,000 x (34,350,000,000 / 65,530,000,000) / 2 = 17,175,000,000
    assert plan.weights_bytes_per_gpu == 17_175_000_000


def test_fp8_checkpoint_on_a10_warns_as_well() -> None:
    plan = plan_for(model={"name": "Qwen/Qwen3-32B-FP8"}, gpu={"type": "A10-24GB"}, parallelism={"tensor": 4})
    assert not errors_at(plan, "spec.engine.quantization")
    assert warnings_at(plan, "spec.engine.quantization")


@pytest.mark.parametrize("gpu", ["L4-24GB", "L40S-48GB", "H100-80GB", "H200-141GB"])
def test_fp8_on_fp8_hardware_has_no_warning(gpu: str) -> None:
    plan = plan_for(model={"name": "Qwen/Qwen3-32B-FP8"}, gpu={"type": gpu}, parallelism={"tensor": 4})
    assert not warnings_at(plan, "spec.engine.quantization")


def test_fp8_kv_cache_needs_fp8_hardware() -> None:
    plan = plan_for(engine={"kvCacheDtype": "fp8"})
    (message,) = errors_at(plan, "spec.engine.kvCacheDtype")
    assert "fp8 KV cache needs FP8 hardware (Ada or Hopper); A100-80GB is Ampere" in message
    assert plan_for(gpu={"type": "L40S-48GB"}, engine={"kvCacheDtype": "fp8"}).fits


@pytest.mark.parametrize(
    ("model", "quantization", "expected"),
    [
        ("Qwen/Qwen3-32B", None, None),
        ("Qwen/Qwen3-32B", "none", None),
        ("Qwen/Qwen3-32B", "fp8", "fp8"),
        ("Qwen/Qwen3-32B-FP8", None, "fp8"),
        ("Qwen/Qwen3-32B-AWQ", None, "awq"),
        ("Qwen/Qwen3-32B-AWQ", "awq_marlin", "awq_marlin"),
    ],
)
def test_served_quantization(model: str, quantization: str | None, expected: str | None) -> None:
    engine = {"quantization": quantization} if quantization else {}
    plan = plan_for(model={"name": model}, gpu={"type": "H100-80GB"}, engine=engine)
    assert plan.quantization == expected
    assert not errors_at(plan, "spec.engine.quantization")


@pytest.mark.parametrize(
    ("model", "quantization", "stored"),
    [
        ("Qwen/Qwen3-32B", "awq", "bf16"),
        ("Qwen/Qwen3-32B", "gptq", "bf16"),
        ("Qwen/Qwen3-32B-FP8", "none", "fp8"),
        ("Qwen/Qwen3-32B-FP8", "awq", "fp8"),
        ("Qwen/Qwen3-32B-AWQ", "fp8", "awq"),
    ],
)
def test_quantization_must_match_the_checkpoint(model: str, quantization: str, stored: str) -> None:
    plan = plan_for(model={"name": model}, gpu={"type": "H100-80GB"}, engine={"quantization": quantization})
    (message,) = errors_at(plan, "spec.engine.quantization")
    assert f"{model} is stored as {stored}" in message
    assert f"not {quantization}" in message


def test_unknown_model_is_refused_before_anything_else() -> None:
    plan = plan_for(model={"name": "Qwen/Qwen3-32B-Instruct"}, parallelism={"tensor": 3})
    (message,) = errors_at(plan, "spec.model.name")
    assert "supported: Qwen/Qwen3-32B, Qwen/Qwen3-32B-FP8, Qwen/Qwen3-32B-AWQ" in message
    assert len(plan.errors) == 1


# --- batching --------------------------------------------------------------------------------------


def test_chunked_prefill_off_needs_a_budget_of_max_model_len() -> None:
    plan = plan_for(engine={"enableChunkedPrefill": False, "maxNumBatchedTokens": 32_767})
    (message,) = errors_at(plan, "spec.engine.maxNumBatchedTokens")
    assert "32767 is below maxModelLen 32768 with chunked prefill off" in message
    assert plan_for(engine={"enableChunkedPrefill": False, "maxNumBatchedTokens": 32_768}).fits


def test_chunked_prefill_on_allows_a_small_budget() -> None:
    assert plan_for(engine={"maxNumBatchedTokens": 2048, "maxNumSeqs": 64}).fits


def test_budget_must_cover_one_token_per_running_request() -> None:
    plan = plan_for(engine={"maxNumSeqs": 512, "maxNumBatchedTokens": 256})
    (message,) = errors_at(plan, "spec.engine.maxNumBatchedTokens")
    assert "256 is below maxNumSeqs 512" in message


def test_every_error_is_reported_not_only_the_first() -> None:
    plan = plan_for(
        gpu={"type": "A100-80GB"},
        engine={
            "kvCacheDtype": "fp8",
            "quantization": "awq",
            "maxModelLen": 200_000,
            "enableChunkedPrefill": False,
        },
    )
    paths = {p for p, _ in plan.errors}
    assert {"spec.engine.kvCacheDtype", "spec.engine.quantization", "spec.engine.maxModelLen"} <= paths
    assert "spec.engine.maxNumBatchedTokens" in paths
