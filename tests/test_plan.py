"""The capacity planner against numbers computed by hand (bytes, not rounded GiB, wherever possible).

Constants used below (catalog.py, plan.py):
    GiB = 1024**3 = 1,073,741,824 B; MiB = 1,048,576 B.
    Qwen3-32B: 64 layers, 64 query heads, 8 KV heads, head_dim 128, hidden 5120, vocabulary 151,936;
    bf16 weights 65,530,000,000 B, FP8 checkpoint 34,350,000,000 B, AWQ checkpoint 19,340,000,000 B.
    GPU memory as CUDA reports it: A100-80GB int(79.14 GiB) = 84,975,927,951 B, A100-40GB int(39.50 GiB)
    = 42,412,802,048 B, H100-80GB int(79.11 GiB) = 84,943,715,696 B, L40S-48GB int(44.42 GiB)
    = 47,695,611,822 B, H200 143,156 MiB = 150,109,945,856 B.
    Runtime per GPU (measured by tools/measure/activation_peak.py, see docs/capacity-planning.md):
    forward 184,328 / 117,768 / 79,368 B per batched token at TP 1 / 2 / 4; sampler 14.07 B x rows x
    151,936 + 10,240 B x batched tokens (hidden states); non-torch int(0.15 GiB) = 161,061,273 B plus
    as much per TP peer; CUDA graphs int(1.86 GiB) = 1,997,159,792 B. KV tokens in 16-token blocks.
"""

from __future__ import annotations

from typing import Any

import pytest

from qwen_operator.api.catalog import GIB, GPUS, MODELS
from qwen_operator.api.plan import (
    CUDA_GRAPH_BYTES,
    Plan,
    activation_bytes_per_token,
    make_plan,
    prefill_step_flops,
    runtime_memory,
    yarn_for,
)
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


def test_the_three_32b_checkpoints_share_the_architecture() -> None:
    for name in ("Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8", "Qwen/Qwen3-32B-AWQ"):
        model = MODELS[name]
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
    # usable per GPU: 84,975,927,951 x 0.90 = 76,478,335,155 B
    # runtime: forward 8,192 x 117,768 = 964,755,456 B; sampler pass over 128 rows: logits 128 x 151,936
    # x 2 = 38,895,616 B, alive 1/2 + 2 times with the all-gather = 97,239,040, Gumbel buffers 128 x 149
    # x 12 = 228,864, hidden states (8,192 + 128) x 5,120 x 2 = 85,196,800: 182,664,704 B (the forward is
    # the peak); sampler state 128 x 4 x (151,936 + 2 x 4,748 + 4,482) = 84,947,968 B; workspaces 33 MiB
    # = 34,603,008 B; non-torch 68 MiB = 71,303,168 B; CUDA graphs 1,997,159,792 B; in all
    # 3,152,769,392 B (2.94 GiB)
    assert plan.runtime is not None and plan.runtime.total_bytes == 3_152_769_392
    # KV budget per GPU: 76,478,335,155 - 32,765,000,000 - 3,152,769,392 = 40,560,565,763 B (37.77 GiB)
    assert plan.kv_budget_bytes_per_gpu == 40_560_565_763
    # KV per token: 2 x 64 x 8 x 128 x 2 = 262,144 B; each GPU holds 1/2 of the KV heads, so
    # tokens per replica = budget x 2 / 262,144 = 309,453.0 -> 19,340 blocks of 16 = 309,440
    assert plan.kv_bytes_per_token == 262_144
    assert plan.kv_tokens_per_replica == 309_440
    # full 32,768-token requests at once: 309,440 // 32,768 = 9 (9.44)
    assert plan.max_concurrent_at_max_model_len == 9
    assert (plan.tensor_parallel_size, plan.gpus_per_replica, plan.max_model_len) == (2, 2, 32_768)
    assert plan.yarn is None and plan.quantization is None
    assert plan.fits and plan.warnings == []


def test_h100_fp8_128k_example_by_hand() -> None:
    plan = make_plan(parse(example("h100-80gb-tp2-fp8-128k")).spec)
    # weights per GPU: 34,350,000,000 / 2 = 17,175,000,000 B (16.00 GiB)
    assert plan.weights_bytes_per_gpu == 17_175_000_000
    # usable: 84,943,715,696 x 0.9 = 76,449,344,126 B (71.20 GiB)
    # runtime: forward 16,384 x 117,768 = 1,929,510,912 B + sampler state 64 x 4 x 165,914 = 42,473,984
    # + workspaces 34,603,008 + non-torch 71,303,168 + CUDA graphs 1,997,159,792 = 4,075,050,864 B
    # budget: 76,449,344,126 - 17,175,000,000 - 4,075,050,864 = 55,199,293,262 B (51.41 GiB)
    assert plan.kv_budget_bytes_per_gpu == 55_199_293_262
    # fp8 KV: 131,072 B per token; tokens = 55,199,293,262 x 2 / 131,072 = 842,274 -> 842,272 (blocks)
    assert plan.kv_bytes_per_token == 131_072
    assert plan.kv_tokens_per_replica == 842_272
    # 842,272 // 131,072 = 6 full-length requests
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
    # usable: 47,695,611,822 x 0.9 = 42,926,050,639 B
    # runtime at TP 1, 8,192 batched tokens (the default): forward 8,192 x 184,328 = 1,510,014,976 B
    # + the 64-request sampler state 42,473,984 + workspaces 34,603,008 + non-torch 71,303,168 + CUDA
    # graphs 1,997,159,792 = 3,655,554,928 B (3.40 GiB)
    # budget: 42,926,050,639 - 19,340,000,000 - 3,655,554,928 = 19,930,495,711 B (18.56 GiB)
    assert plan.kv_budget_bytes_per_gpu == 19_930_495_711
    # tokens: 19,930,495,711 / 262,144 = 76,028.9 -> 76,016 (blocks); 76,016 // 32,768 = 2
    assert plan.kv_tokens_per_replica == 76_016
    assert plan.max_concurrent_at_max_model_len == 2
    assert plan.quantization == "awq_marlin" and plan.fits


# --- memory fit ------------------------------------------------------------------------------------


def test_bf16_on_two_a100_40gb_does_not_fit() -> None:
    plan = plan_for(gpu={"type": "A100-40GB"})
    # usable: 42,412,802,048 x 0.9 = 38,171,521,843 B (35.55 GiB); weights 30.51 GiB + runtime 3.02 GiB
    # (the sampler state of 256 requests: 0.16 GiB) leave 2,168,804,483 B (2.02 GiB): 16,544 tokens,
    # less than one 32,768-token sequence (8 GiB)
    assert not plan.fits
    assert plan.kv_tokens_per_replica == 16_544
    (message,) = errors_at(plan, "spec.engine.maxModelLen")
    assert "one 32768-token sequence needs 8.00 GiB of KV cache but a replica has 4.04 GiB" in message
    assert "after 30.51 GiB of weights and 3.02 GiB runtime" in message


def test_no_room_for_the_weights_is_a_gpu_error_naming_the_runtime_terms() -> None:
    plan = plan_for(gpu={"type": "A100-40GB"}, engine={"gpuMemoryUtilization": 0.8})
    # usable: 42,412,802,048 x 0.8 = 33,930,241,638 B (31.60 GiB) < 30.51 GiB weights + 3.02 GiB runtime
    (message,) = errors_at(plan, "spec.gpu.type")
    assert (
        "weights need 30.51 GiB per GPU plus 3.02 GiB runtime (activations of 8192 batched tokens" in message
    )
    assert "sampler state 0.16 GiB, workspaces 0.03 GiB, non-torch 0.07 GiB, CUDA graphs 1.86 GiB" in message
    assert "A100-40GB offers 31.60 GiB at gpuMemoryUtilization 0.8" in message
    assert plan.kv_budget_bytes_per_gpu == 0 and plan.kv_tokens_per_replica == 0


def test_bf16_on_four_a100_40gb_fits() -> None:
    plan = plan_for(gpu={"type": "A100-40GB"}, parallelism={"tensor": 4})
    # weights 65.53e9 / 4 = 16,382,500,000 B; runtime: forward 8,192 x 79,368 = 650,182,656 B, sampler
    # pass over 256 rows (256 x 151,936 x 2 x (1/4 + 2) = 175,042,560 with the all-gather + 457,728 +
    # (8,192 + 256) x 10,240 = 261,995,520 B, smaller), sampler state 256 x 4 x 165,914 = 169,895,936,
    # workspaces 34,603,008, non-torch 71,303,168 (the same at every TP: NCCL is set up before vLLM's
    # snapshot), CUDA graphs 1,997,159,792 B: 2,923,144,560 B
    # budget 38,171,521,843 - 16,382,500,000 - 2,923,144,560 = 18,865,877,283 B
    # tokens = x 4 / 262,144 = 287,870 -> 287,856 (blocks); // 32,768 = 8
    assert plan.kv_budget_bytes_per_gpu == 18_865_877_283
    assert plan.kv_tokens_per_replica == 287_856
    assert plan.max_concurrent_at_max_model_len == 8
    assert plan.fits


def test_bf16_tp1_on_a100_80gb_cannot_hold_one_full_sequence() -> None:
    plan = plan_for(parallelism={"tensor": 1})
    # runtime: forward 1,510,014,976 + sampler state 169,895,936 + workspaces 34,603,008 + non-torch
    # 71,303,168 + CUDA graphs 1,997,159,792 = 3,782,976,880 B
    # budget: 76,478,335,155 - 65,530,000,000 - 3,782,976,880 = 7,165,358,275 B (6.67 GiB)
    # tokens: 7,165,358,275 / 262,144 = 27,333.7 -> 27,328 < 32,768 (one sequence needs 8 GiB)
    assert plan.kv_tokens_per_replica == 27_328
    (message,) = errors_at(plan, "spec.engine.maxModelLen")
    assert (
        "one 32768-token sequence needs 8.00 GiB of KV cache but a replica has 6.67 GiB (27328 tokens)"
        in message
    )


def test_one_full_request_fits_but_warns() -> None:
    plan = plan_for(parallelism={"tensor": 1}, engine={"maxModelLen": 16_384})
    # 27,328 // 16,384 = 1 request at full length: allowed, with a warning
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


def test_fp8_kv_cache_on_a100_doubles_full_context_requests_at_128k() -> None:
    """vLLM 0.32 runs an fp8 KV cache on Ampere (FlashInfer or Triton attention): half the bytes per
    token, so about twice the 131,072-token requests at once on the same budget."""
    long = {"gpu": {"type": "A100-80GB"}, "engine": {"maxModelLen": 131_072}}
    bf16 = plan_for(**long)
    fp8 = plan_for(**merge(long, {"engine": {"kvCacheDtype": "fp8"}}))
    assert not fp8.errors and bf16.max_concurrent_at_max_model_len >= 1
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.max_concurrent_at_max_model_len in (
        2 * bf16.max_concurrent_at_max_model_len,
        2 * bf16.max_concurrent_at_max_model_len + 1,
    )


# The pools users and the seeds name (issue 12): GPU feature discovery's nvidia.com/gpu.product value
# (the marketing name with spaces as dashes) and whether the GPU has FP8 tensor cores (Ada, Hopper and
# Blackwell do; Ampere does not), from NVIDIA's product pages, not from the catalog.
NAMED_POOLS = {
    "RTX-4090-24GB": ("NVIDIA-GeForce-RTX-4090", True, "Ada"),
    "RTX-6000-Ada-48GB": ("NVIDIA-RTX-6000-Ada-Generation", True, "Ada"),
    "RTX-PRO-6000-Blackwell-96GB": ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", True, "Blackwell"),
    "A10G-24GB": ("NVIDIA-A10G", False, "Ampere"),
    "H100-NVL-94GB": ("NVIDIA-H100-NVL", True, "Hopper"),
    "H200-NVL-141GB": ("NVIDIA-H200-NVL", True, "Hopper"),
    "B200-180GB": ("NVIDIA-B200", True, "Blackwell"),
}


@pytest.mark.parametrize("gpu", sorted(NAMED_POOLS))
def test_the_catalog_has_the_pools_users_name(gpu: str) -> None:
    label, fp8, architecture = NAMED_POOLS[gpu]
    info = GPUS[gpu]
    assert label in info.product_labels
    assert info.fp8_compute is fp8 and info.architecture == architecture


def test_gpu_memory_is_what_cuda_reports() -> None:
    """Below nvidia-smi's figure: A100-80GB about 79.1-79.25 GiB in public logs, H200 143,156 MiB
    measured (torch.cuda.mem_get_info total on the project's H200)."""
    assert 79.1 * GIB <= GPUS["A100-80GB"].memory_bytes <= 79.25 * GIB
    assert GPUS["H200-141GB"].memory_bytes == 143_156 * 2**20


def test_gpu_memory_utilization_changes_the_budget() -> None:
    plan = plan_for(engine={"gpuMemoryUtilization": 0.8})
    # usable: 84,975,927,951 x 0.8 = 67,980,742,360; budget = 67,980,742,360 - 32,765,000,000
    # - 3,237,717,360 (runtime at TP 2, 256 seqs) = 31,978,025,000; tokens = x 2 / 262,144 = 243,973
    # -> 243,968 (blocks)
    assert plan.kv_budget_bytes_per_gpu == 31_978_025_000
    assert plan.kv_tokens_per_replica == 243_968


def test_pipeline_parallelism_splits_weights_and_layers() -> None:
    plan = plan_for(parallelism={"tensor": 2, "pipeline": 2})
    # 4 GPUs: weights 65,530,000,000 / 4 = 16,382,500,000 B each; runtime of the last stage (each stage
    # runs all batched tokens through its layers; the last one samples, and vLLM sizes every stage to
    # the smallest budget): TP 2's 3,237,717,360 B + the buffers it receives hidden states and residual
    # into, 2 x 8,192 x 5,120 x 2 = 167,772,160 B: 3,405,489,520 B; KV budget per GPU 76,478,335,155
    # - 16,382,500,000 - 3,405,489,520 = 56,690,345,635; each GPU holds 1/2 of the KV heads of 1/2 of the
    # layers: tokens = 56,690,345,635 x 4 / 262,144 = 865,026 -> 865,024 (blocks)
    assert plan.gpus_per_replica == 4
    assert plan.weights_bytes_per_gpu == 16_382_500_000
    assert plan.runtime is not None and plan.runtime.total_bytes == 3_405_489_520
    assert plan.kv_tokens_per_replica == 865_024


def test_draft_model_weights_count() -> None:
    plan = plan_for(engine={"speculative": {"method": "draft_model", "model": "Qwen/Qwen3-0.6B"}})
    # Qwen3-0.6B ties lm_head to embed_tokens: vLLM holds 596,049,920 parameters x 2 B = 1,192,099,840 B
    # (its 1.5 GB file also stores lm_head.weight, which vLLM does not keep):
    # (65,530,000,000 + 1,192,099,840) / 2 = 33,361,049,920 B per GPU
    assert plan.weights_bytes_per_gpu == 33_361_049_920
    # the model cache holds both checkpoints' files: 65,530,000,000 + 1,503,264,768
    assert plan.download_bytes == 67_033_264_768
    assert plan.fits and plan.warnings == []


@pytest.mark.parametrize(
    ("draft", "layers", "kib"),
    [("Qwen/Qwen3-0.6B", 28, 112), ("Qwen/Qwen3-1.7B", 28, 112), ("Qwen/Qwen3-4B", 36, 144)],
)
def test_draft_model_kv_cache_shares_the_pool(draft: str, layers: int, kib: int) -> None:
    plan = plan_for(engine={"speculative": {"method": "draft_model", "model": draft}})
    # the drafter's layers (config.json: 28 or 36 layers, 8 KV heads of 128) hold K and V of every token
    # in the same pool: 2 x layers x 8 x 128 x 2 B
    assert plan.draft_kv_bytes_per_token == 2 * layers * 8 * 128 * 2 == kib * 1024
    assert plan.kv_bytes_per_token == 262_144 + kib * 1024


def test_draft_model_kv_cache_lowers_the_tokens() -> None:
    plan = plan_for(engine={"speculative": {"method": "draft_model", "model": "Qwen/Qwen3-0.6B"}})
    # budget: 76,478,335,155 - 33,361,049,920 - 3,237,717,360 (runtime at TP 2, 256 seqs: the forward
    # 964,755,456 is still the peak) = 39,879,567,875 B; tokens = x 2 / (262,144 + 114,688)
    # = 211,660.6 -> 211,648 (blocks), 6 full 32K requests instead of 9 without the draft
    assert plan.kv_budget_bytes_per_gpu == 39_879_567_875
    assert plan.kv_tokens_per_replica == 211_648
    assert plan.max_concurrent_at_max_model_len == 6


def test_fp8_kv_cache_halves_the_draft_model_kv_too() -> None:
    plan = plan_for(
        gpu={"type": "H100-80GB"},
        engine={"kvCacheDtype": "fp8", "speculative": {"method": "draft_model", "model": "Qwen/Qwen3-4B"}},
    )
    assert plan.draft_kv_bytes_per_token == 2 * 36 * 8 * 128 * 1


def test_draft_model_with_yarn_context_is_refused() -> None:
    plan = plan_for(
        gpu={"type": "H100-80GB"},
        engine={"maxModelLen": 65_536, "speculative": {"method": "draft_model", "model": "Qwen/Qwen3-1.7B"}},
    )
    # Qwen3-1.7B's config.json: max_position_embeddings 40,960, no rope scaling; vLLM 0.32 raises the
    # rotary table to the target's length only for EAGLE drafts (config/speculative.py)
    (message,) = errors_at(plan, "spec.engine.speculative.model")
    assert "draft model Qwen/Qwen3-1.7B has 40960 positions and no YaRN" in message
    assert "maxModelLen 65536" in message
    ok = plan_for(
        engine={"maxModelLen": 40_960, "speculative": {"method": "draft_model", "model": "Qwen/Qwen3-1.7B"}}
    )
    assert not errors_at(ok, "spec.engine.speculative.model")


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


# --- runtime memory: activations, sampler, non-torch, CUDA graphs ----------------------------------


def test_activation_per_batched_token_is_the_measured_one() -> None:
    # tools/measure/activation_peak.out.txt: steady-state transient peak per token at TP 1, 2, 4;
    # activation_peak.family.out.txt: TP 8 (the form 6 x 25,600 / 8 + 40,968 the TP 2 and 4 figures
    # take, which the catalog used before it was measured) and TP 16
    model = MODELS["Qwen/Qwen3-32B"]
    measured = {1: 184_328, 2: 117_768, 4: 79_368, 8: 60_168, 16: 50_568}
    for tp, per_token in measured.items():
        assert activation_bytes_per_token(model, tp) == per_token
    assert measured[8] == 6 * 25_600 // 8 + 40_968


def test_runtime_grows_with_max_num_batched_tokens() -> None:
    model = MODELS["Qwen/Qwen3-32B"]
    small, large = runtime_memory(model, 2, 8_192, 256), runtime_memory(model, 2, 131_072, 256)
    # 131,072 x 117,768 B = 15,436,087,296 B (14.38 GiB) against 0.90 GiB at 8,192
    assert large.forward_bytes == 15_436_087_296
    assert large.total_bytes - small.total_bytes == (131_072 - 8_192) * 117_768


def test_sampler_pass_is_the_peak_with_many_sequences_and_a_small_batch() -> None:
    model = MODELS["Qwen/Qwen3-32B"]
    runtime = runtime_memory(model, 2, 2_048, 1_024)
    # sampler: logits 1,024 x 151,936 x 2 = 311,164,928 B, alive 1/2 + 2 times with the TP 2 all-gather
    # = 777,912,320, Gumbel buffers 1,024 x 149 x 12 = 1,830,912, hidden states (2,048 + 1,024) x 10,240
    # = 31,457,280: 811,200,512 B > forward 2,048 x 117,768 = 241,188,864 B
    assert runtime.sampler_bytes == 811_200_512
    assert runtime.profile_peak_bytes == runtime.sampler_bytes > runtime.forward_bytes


def test_enforce_eager_drops_the_cuda_graph_estimate() -> None:
    graphs, eager = plan_for(), plan_for(engine={"extraArgs": ["--enforce-eager"]})
    assert graphs.runtime is not None and eager.runtime is not None
    assert graphs.runtime.cuda_graph_bytes == CUDA_GRAPH_BYTES and eager.runtime.cuda_graph_bytes == 0
    assert eager.kv_budget_bytes_per_gpu - graphs.kv_budget_bytes_per_gpu == CUDA_GRAPH_BYTES


def test_h200_tp1_128k_with_a_128k_batch_is_refused() -> None:
    # issue 12: the old fixed 5.5 GiB overhead said 187,562 tokens; with the measured activations:
    # usable 150,109,945,856 x 0.8 = 120,087,956,684 B; weights 65,530,000,000; forward
    # 131,072 x 184,328 = 24,160,239,616 B; sampler state 169,895,936; workspaces 34,603,008; non-torch
    # 71,303,168; CUDA graphs 1,997,159,792; budget 28,124,755,164 B -> 107,280 tokens, less than one
    # 131,072-token request
    plan = plan_for(
        gpu={"type": "H200-141GB"},
        parallelism={"tensor": 1},
        engine={"maxModelLen": 131_072, "maxNumBatchedTokens": 131_072, "gpuMemoryUtilization": 0.8},
    )
    assert plan.kv_budget_bytes_per_gpu == 28_124_755_164
    assert plan.kv_tokens_per_replica == 107_280
    (message,) = errors_at(plan, "spec.engine.maxModelLen")
    assert "activations of 131072 batched tokens 22.50 GiB" in message


# --- prefill step time ------------------------------------------------------------------------------


def test_prefill_flops_of_a_whole_128k_prompt() -> None:
    model = MODELS["Qwen/Qwen3-32B"]
    linear, attention = prefill_step_flops(model, 131_072, 131_072)
    # linear: 2 x (32.8e9 - 2 x 151,936 x 5,120) x 131,072 = 8.19e15; attention: 4 x 64 layers x 64 heads
    # x 128 x 131,072 x 65,536 (causal half) = 1.80e16; about 26 PFLOP in all (issue 12: "about 27")
    assert linear == pytest.approx(2 * (32.8e9 - 2 * 151_936 * 5_120) * 131_072)
    assert attention == pytest.approx(4 * 64 * 64 * 128 * 131_072 * 65_536)
    assert 25e15 < linear + attention < 27e15


def test_a_128k_batch_warns_about_a_minute_long_step() -> None:
    plan = plan_for(
        parallelism={"tensor": 4},
        engine={"maxModelLen": 131_072, "maxNumBatchedTokens": 131_072},
    )
    # 2.62e16 FLOP / 4 GPUs on A100 (312 TFLOP/s dense bf16 at 0.7 linear, 0.5 attention): about 38 s
    assert plan.prefill_step_seconds == pytest.approx(38.2, abs=0.5)
    (warning,) = warnings_at(plan, "spec.engine.maxNumBatchedTokens")
    assert "a 131072-token prefill step at 131072 tokens of context takes about 38 s" in warning


def test_default_batch_has_a_short_step_and_no_warning() -> None:
    plan = plan_for()
    # 8,192 tokens at 32,768 of context on 2 x A100: (5.12e14 / 218.4e12 + 4.93e14 / 156e12) / 2
    assert plan.prefill_step_seconds == pytest.approx(2.75, abs=0.05)
    assert not warnings_at(plan, "spec.engine.maxNumBatchedTokens")


# --- tensor parallelism against the head counts ----------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_valid_tensor_parallel_sizes(tp: int) -> None:
    plan = plan_for(gpu={"type": "H100-80GB", "gpusPerNode": 16}, parallelism={"tensor": tp})
    assert not errors_at(plan, "spec.parallelism.tensor")


@pytest.mark.parametrize("tp", [3, 5, 6, 7, 12])
def test_invalid_tensor_parallel_sizes(tp: int) -> None:
    plan = plan_for(gpu={"type": "H100-80GB", "gpusPerNode": 16}, parallelism={"tensor": tp})
    (message,) = errors_at(plan, "spec.parallelism.tensor")
    assert (
        f"tensor parallel size {tp} does not fit Qwen/Qwen3-32B: it must divide the 64 attention heads"
        in message
    )
    assert message.endswith("valid sizes: 1, 2, 4, 8, 16")
    assert plan.kv_tokens_per_replica == 0  # no memory plan for an impossible layout


def test_tp16_replicates_the_kv_heads() -> None:
    """vLLM 0.32 accepts TP 16 for 8 KV heads (QKVParallelLinear: tp a multiple of the KV heads): each
    GPU holds one KV head, each head on 2 GPUs, so the KV cache is split 8 ways, not 16."""
    plan = plan_for(gpu={"type": "H100-80GB", "gpusPerNode": 16}, parallelism={"tensor": 16})
    # weights 65,530,000,000 / 16 = 4,095,625,000 B; runtime: forward 8,192 x 50,568 (measured at TP 16)
    # = 414,253,056 B > the sampler pass's 247,409,664 B (256 rows), sampler state 169,895,936,
    # workspaces 34,603,008, non-torch 71,303,168, CUDA graphs 1,997,159,792; budget 76,449,344,126
    # - 4,095,625,000 - 2,687,214,960 = 69,666,504,166 B per GPU; tokens = x 8 KV shards / 262,144
    # = 2,126,053 -> 2,126,048
    assert plan.fits and plan.weights_bytes_per_gpu == 4_095_625_000
    assert plan.kv_budget_bytes_per_gpu == 69_666_504_166
    assert plan.kv_tokens_per_replica == 2_126_048


@pytest.mark.parametrize(
    ("model", "tp", "valid"),
    [
        # FP8 checkpoints: 128 x 128 weight blocks; each GPU's slice of intermediate_size must hold whole
        # blocks (fp8_utils.py validate_fp8_block_shape): 25,600 / 16 = 1,600 is 12.5 blocks
        ("Qwen/Qwen3-32B-FP8", 16, "1, 2, 4, 8"),
        # AWQ through Marlin: input slices of 128 (marlin_utils.py, min_thread_k): 1,600 again
        ("Qwen/Qwen3-32B-AWQ", 16, "1, 2, 4, 8"),
        # Qwen3-4B: 9,728 / 8 = 1,216 is 9.5 blocks
        ("Qwen/Qwen3-4B-FP8", 8, "1, 2, 4"),
        ("Qwen/Qwen3-4B-AWQ", 8, "1, 2, 4"),
    ],
)
def test_quantized_checkpoints_need_whole_blocks_per_gpu(model: str, tp: int, valid: str) -> None:
    plan = plan_for(
        model={"name": model}, gpu={"type": "H100-80GB", "gpusPerNode": 16}, parallelism={"tensor": tp}
    )
    (message,) = errors_at(plan, "spec.parallelism.tensor")
    assert "must be a multiple of the checkpoint's 128-wide quantization blocks" in message
    assert message.endswith(f"valid sizes: {valid}")


def test_replica_must_fit_on_one_node() -> None:
    plan = plan_for(gpu={"gpusPerNode": 4}, parallelism={"tensor": 4, "pipeline": 2})
    (message,) = errors_at(plan, "spec.parallelism")
    assert "a replica needs 8 GPUs (tensor 4 x pipeline 2) but a node of the pool has 4" in message
    assert plan_for(gpu={"gpusPerNode": 8}, parallelism={"tensor": 4, "pipeline": 2}).fits


# --- context length and YaRN -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "factor"),
    [
        (256, None),
        (32_768, None),
        (32_769, None),
        (40_960, None),  # Qwen3-32B's config.json: max_position_embeddings 40960, accepted without YaRN
        (40_961, 2.0),
        (65_536, 2.0),
        (65_537, 4.0),
        (131_072, 4.0),
    ],
)
def test_yarn_factor_is_the_smallest_that_covers(length: int, factor: float | None) -> None:
    yarn = yarn_for(length, MODELS["Qwen/Qwen3-32B"])
    assert (yarn.factor if yarn else None) == factor
    if yarn:
        assert yarn.original_max_position_embeddings == 32_768
        assert yarn.factor * 32_768 >= length


def test_no_yarn_and_no_warning_up_to_the_config_window() -> None:
    plan = plan_for(gpu={"type": "H100-80GB"}, engine={"maxModelLen": 40_960})
    assert plan.yarn is None
    assert not any("YaRN" in w for w in warnings_at(plan, "spec.engine.maxModelLen"))


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


@pytest.mark.parametrize("method", ["fp8_per_tensor", "fp8_per_block"])
def test_online_fp8_on_a100_is_weight_only_a_warning_not_an_error(method: str) -> None:
    plan = plan_for(engine={"quantization": method})
    assert not errors_at(plan, "spec.engine.quantization") and plan.quantization == method
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


@pytest.mark.parametrize(
    ("gpu", "architecture", "sm"),
    [
        ("A100-80GB", "Ampere", "8.0"),
        ("A10-24GB", "Ampere", "8.6"),
        ("L40S-48GB", "Ada", "8.9"),
        ("RTX-4090-24GB", "Ada", "8.9"),
        ("RTX-PRO-6000-Blackwell-96GB", "Blackwell", "12.0"),
    ],
)
def test_fp8_kv_cache_without_flash_attention_is_a_warning(gpu: str, architecture: str, sm: str) -> None:
    # vLLM 0.32: FlashAttention stores an fp8 KV cache only on sm90 (FA3) or sm100 (FA4)
    # (vllm/v1/attention/backends/fa_utils.py); elsewhere FlashInfer (sm80-sm121) or Triton serve it,
    # with k/v scales of 1.0 when the checkpoint has none (model_executor/layers/quantization/kv_cache.py).
    plan = plan_for(
        model={"name": "Qwen/Qwen3-32B-AWQ"},
        gpu={"type": gpu},
        parallelism={"tensor": 2},
        engine={"kvCacheDtype": "fp8"},
    )
    assert not errors_at(plan, "spec.engine.kvCacheDtype")
    (warning,) = warnings_at(plan, "spec.engine.kvCacheDtype")
    assert f"fp8 KV cache on {gpu} ({architecture}, sm {sm})" in warning
    assert "FlashInfer (or Triton without FlashInfer)" in warning
    assert "they are 1.0" in warning
    assert plan.kv_bytes_per_token == 131_072


@pytest.mark.parametrize("gpu", ["H100-80GB", "H100-NVL-94GB", "H200-141GB", "B200-180GB"])
def test_fp8_kv_cache_on_flash_attention_gpus_has_no_warning(gpu: str) -> None:
    plan = plan_for(gpu={"type": gpu}, engine={"kvCacheDtype": "fp8"})
    assert not warnings_at(plan, "spec.engine.kvCacheDtype")


@pytest.mark.parametrize(
    ("model", "quantization", "expected"),
    [
        ("Qwen/Qwen3-32B", None, None),
        ("Qwen/Qwen3-32B", "none", None),
        ("Qwen/Qwen3-32B", "fp8_per_tensor", "fp8_per_tensor"),
        ("Qwen/Qwen3-32B", "fp8_per_block", "fp8_per_block"),
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
        ("Qwen/Qwen3-32B", "gptq_marlin", "bf16"),
        ("Qwen/Qwen3-32B", "fp8", "bf16"),
        ("Qwen/Qwen3-32B-FP8", "none", "fp8"),
        ("Qwen/Qwen3-32B-FP8", "fp8_per_tensor", "fp8"),
        ("Qwen/Qwen3-32B-FP8", "awq", "fp8"),
        ("Qwen/Qwen3-32B-AWQ", "fp8", "awq"),
    ],
)
def test_quantization_must_match_the_checkpoint(model: str, quantization: str, stored: str) -> None:
    plan = plan_for(model={"name": model}, gpu={"type": "H100-80GB"}, engine={"quantization": quantization})
    (message,) = errors_at(plan, "spec.engine.quantization")
    assert f"{model} is stored as {stored}" in message
    assert f"not {quantization}" in message


def test_fp8_on_the_bf16_checkpoint_names_the_online_methods() -> None:
    plan = plan_for(gpu={"type": "H100-80GB"}, engine={"quantization": "fp8"})
    (message,) = errors_at(plan, "spec.engine.quantization")
    assert "fp8 serves a checkpoint stored in FP8 (Qwen/Qwen3-32B-FP8)" in message
    assert "use fp8_per_tensor or fp8_per_block" in message


@pytest.mark.parametrize("method", ["gptq", "gptq_marlin"])
def test_gptq_without_a_declared_checkpoint_says_how_to_declare_one(method: str) -> None:
    plan = plan_for(gpu={"type": "H100-80GB"}, engine={"quantization": method})
    (message,) = errors_at(plan, "spec.engine.quantization")
    assert f"{method} needs a GPTQ checkpoint and the catalog has none" in message
    assert "spec.model.checkpoint (quantization: gptq, weightSize)" in message


def test_unknown_model_is_refused_before_anything_else() -> None:
    plan = plan_for(model={"name": "Qwen/Qwen3-32B-Instruct"}, parallelism={"tensor": 3})
    (message,) = errors_at(plan, "spec.model.name")
    assert "supported: Qwen/Qwen3-0.6B, Qwen/Qwen3-0.6B-FP8, Qwen/Qwen3-1.7B" in message
    assert "Qwen/Qwen3-32B, Qwen/Qwen3-32B-FP8, Qwen/Qwen3-32B-AWQ" in message
    assert "declare a community Qwen3-32B checkpoint in spec.model.checkpoint" in message
    assert len(plan.errors) == 1


# --- community checkpoints -------------------------------------------------------------------------

GPTQ = {"name": "someone/Qwen3-32B-GPTQ-Int4", "checkpoint": {"quantization": "gptq", "weightSize": "19.5G"}}


@pytest.mark.parametrize(
    ("quantization", "served"), [(None, "gptq"), ("gptq", "gptq"), ("gptq_marlin", "gptq_marlin")]
)
def test_a_declared_gptq_checkpoint_is_planned_like_a_catalog_model(
    quantization: str | None, served: str
) -> None:
    engine = {"quantization": quantization} if quantization else {}
    plan = plan_for(model=GPTQ, gpu={"type": "L40S-48GB"}, parallelism={"tensor": 1}, engine=engine)
    assert not errors_at(plan, "spec.engine.quantization") and not errors_at(plan, "spec.model.name")
    assert plan.quantization == served
    # the declared size: 19.5G = 19,500,000,000 B on one GPU; KV per token as for any Qwen3-32B
    assert plan.weights_bytes_per_gpu == 19_500_000_000
    assert plan.kv_bytes_per_token == 262_144


def test_a_declared_checkpoint_is_checked_against_its_own_storage() -> None:
    plan = plan_for(model=GPTQ, gpu={"type": "H100-80GB"}, engine={"quantization": "awq"})
    (message,) = errors_at(plan, "spec.engine.quantization")
    assert (
        "someone/Qwen3-32B-GPTQ-Int4 is stored as gptq; it can be served with gptq, gptq_marlin, not awq"
        in message
    )


def test_a_declared_bf16_checkpoint_takes_online_fp8() -> None:
    model = {
        "name": "someone/Qwen3-32B-abliterated",
        "checkpoint": {"quantization": "bf16", "weightSize": "65.53G"},
    }
    plan = plan_for(model=model, gpu={"type": "H100-80GB"}, engine={"quantization": "fp8_per_block"})
    assert not errors_at(plan, "spec.engine.quantization")
    # online FP8 keeps the FP8 checkpoint's ratio: 65,530,000,000 x 34.35/65.53 / 2 = 17,175,000,000
    assert plan.weights_bytes_per_gpu == 17_175_000_000


def test_a_catalog_model_cannot_be_redeclared() -> None:
    model = {"name": "Qwen/Qwen3-32B", "checkpoint": {"quantization": "gptq", "weightSize": "19G"}}
    plan = plan_for(model=model)
    (message,) = errors_at(plan, "spec.model.checkpoint")
    assert "Qwen/Qwen3-32B is in the catalog" in message
    assert len(plan.errors) == 1


# --- a GPU the catalog lacks -----------------------------------------------------------------------

GH200 = {
    "type": "Custom",
    "custom": {
        "name": "GH200-96GB",
        "memory": "94.5Gi",
        "computeCapability": "9.0",
        "productLabels": ["NVIDIA-GH200-480GB"],
    },
}


def test_a_declared_gpu_is_planned_from_its_declared_facts() -> None:
    spec = spec_of(
        {
            "model": {"name": "Qwen/Qwen3-32B-FP8"},
            "gpu": GH200,
            "parallelism": {"tensor": 1},
            "engine": {"kvCacheDtype": "fp8"},
        }
    )
    gpu = spec.gpu.info()
    # 94.5 Gi = 94.5 x 1,073,741,824 = 101,468,602,368 B; sm 9.0: FP8 tensor cores, FlashAttention 3 fp8 KV
    assert gpu.memory_bytes == 101_468_602_368
    assert gpu.fp8_compute and gpu.architecture == "Hopper" and gpu.fp8_kv_backend is None
    plan = make_plan(spec)
    assert plan.gpu == "GH200-96GB"
    assert not warnings_at(plan, "spec.engine.quantization") and not warnings_at(
        plan, "spec.engine.kvCacheDtype"
    )


def test_a_declared_ampere_gpu_gets_the_ampere_checks() -> None:
    a6000 = {
        "name": "RTX-A6000",
        "memory": "47.4Gi",
        "computeCapability": "8.6",
        "productLabels": ["NVIDIA-RTX-A6000"],
    }
    plan = plan_for(
        model={"name": "Qwen/Qwen3-32B-FP8"},
        gpu={"type": "Custom", "custom": a6000},
        engine={"kvCacheDtype": "fp8"},
    )
    assert "RTX-A6000 (Ampere) has no FP8 tensor cores" in warnings_at(plan, "spec.engine.quantization")[0]
    assert "fp8 KV cache on RTX-A6000 (Ampere, sm 8.6)" in warnings_at(plan, "spec.engine.kvCacheDtype")[0]


def test_fp8_compute_can_be_declared_against_the_capability_default() -> None:
    custom = {**GH200["custom"], "computeCapability": "8.0", "fp8Compute": True}
    assert (
        spec_of({"model": {"name": "Qwen/Qwen3-32B"}, "gpu": {"type": "Custom", "custom": custom}})
        .gpu.info()
        .fp8_compute
    )


# --- batching --------------------------------------------------------------------------------------


def test_chunked_prefill_off_needs_a_budget_of_max_model_len() -> None:
    plan = plan_for(engine={"enableChunkedPrefill": False, "maxNumBatchedTokens": 32_767})
    (message,) = errors_at(plan, "spec.engine.maxNumBatchedTokens")
    assert "32767 is below maxModelLen 32768 with chunked prefill off" in message
    assert plan_for(engine={"enableChunkedPrefill": False, "maxNumBatchedTokens": 32_768}).fits


def test_chunked_prefill_off_is_allowed_with_a_loud_warning() -> None:
    # vllm/engine/arg_utils.py: "This model does not officially support disabling chunked prefill.
    # Disabling this manually may cause the engine to crash or produce incorrect outputs."
    plan = plan_for(engine={"enableChunkedPrefill": False, "maxNumBatchedTokens": 32_768})
    assert plan.fits
    (warning,) = warnings_at(plan, "spec.engine.enableChunkedPrefill")
    assert "may crash or produce incorrect outputs" in warning
    assert not warnings_at(plan_for(), "spec.engine.enableChunkedPrefill")


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
            "quantization": "awq",
            "maxModelLen": 200_000,
            "enableChunkedPrefill": False,
        },
    )
    paths = {p for p, _ in plan.errors}
    assert {"spec.engine.quantization", "spec.engine.maxModelLen"} <= paths
    assert "spec.engine.maxNumBatchedTokens" in paths


# --- the gateway's request timeout -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_model_len", "seconds"),
    [
        # maxModelLen / 20 tokens/s + 120 s, rounded up to whole minutes:
        (32_768, 1_800),  # 1,638.4 + 120 = 1,758.4 -> 1,800 (30 min: a 32K reasoning output at 22-36 tok/s)
        (131_072, 6_720),  # 6,553.6 + 120 = 6,673.6 -> 6,720
        (1_024, 180),  # 51.2 + 120 = 171.2 -> 180
    ],
)
def test_request_timeout_default_covers_a_full_length_generation(max_model_len: int, seconds: int) -> None:
    plan = plan_for(gpu={"type": "H100-80GB"}, engine={"maxModelLen": max_model_len})
    assert plan.request_timeout_seconds == seconds


def test_request_timeout_set_by_the_user_is_kept() -> None:
    assert plan_for(gateway={"requestTimeoutSeconds": 600}).request_timeout_seconds == 600


# --- LoRA slots (api/lora.py, docs/capacity-planning.md) -------------------------------------------
# One slot of rank 1, per decoder layer, on one GPU at TP t (vLLM 0.32 without --fully-sharded-loras):
#   qkv_proj     A 3 x 5,120 (every GPU)           B (64 x 128 + 2 x 8 x 128) / t
#   o_proj       A 64 x 128 / t                     B 5,120 (every GPU)
#   gate_up_proj A 2 x 5,120 (every GPU)            B 2 x 25,600 / t
#   down_proj    A 25,600 / t                       B 5,120 (every GPU)
# TP 2: 15,360 + 5,120 + 4,096 + 5,120 + 10,240 + 25,600 + 12,800 + 5,120 = 83,456 elements;
# TP 1: 15,360 + 10,240 + 8,192 + 5,120 + 10,240 + 51,200 + 25,600 + 5,120 = 131,072.
# embed_tokens and lm_head, each on every GPU: 151,936 + 5,120 = 157,056 elements. All in bf16 (2 B).

SQL = {"name": "sql", "source": {"huggingFace": {"repo": "o/sql", "revision": "0" * 40}}}


def adapters(n: int) -> list[dict[str, Any]]:
    return [SQL | {"name": f"a{i}"} for i in range(n)]


def test_lora_worked_example_by_hand() -> None:
    """docs/capacity-planning.md and docs/lora.md: Qwen3-32B, TP 2, maxLoras 4, maxLoraRank 64."""
    plan = plan_for(lora={"maxLoras": 4, "maxLoraRank": 64})
    assert plan.lora is not None
    # slots: 4 x 64 x (64 layers x 83,456 + 2 x 157,056 = 5,655,296) x 2 B = 2,895,511,552 B (2.70 GiB)
    assert plan.lora.slot_bytes == 2_895_511_552
    # index buffers: 4 x 8,192 x 8 + 3 x 256 x 8 (punica_base) + 2 x (2 x 8,192 x 4 + (3 x 4 + 4) x 4)
    # (two LoRAKernelMeta) + 151,936 x 8 (lm_head's map of the gathered vocabulary, TP > 1)
    # = 268,288 + 131,200 + 1,215,488 = 1,614,976 B
    assert plan.lora.index_bytes == 1_614_976
    # shrink buffer: 8,192 tokens x rank 64 x 4 B = 2,097,152 B; CUDA graphs: 102 x 1 MiB = 106,954,752 B
    assert (plan.lora.shrink_buffer_bytes, plan.lora.cuda_graph_bytes) == (2_097_152, 106_954_752)
    # in all 3,006,178,432 B = 2.80 GiB per GPU
    assert plan.lora.total_bytes == 3_006_178_432
    # KV budget: the A100 example's 40,560,565,763 B (test_a100_80gb_tp2_bf16_example_by_hand) less the
    # sampler state of 128 more requests at 256 sequences (128 x 4 x 165,914 = 84,947,968 B)
    # = 40,475,617,795 B without LoRA; with it 40,475,617,795 - 3,006,178,432 = 37,469,439,363 B
    assert plan.kv_budget_bytes_per_gpu == 37_469_439_363
    # tokens = x 2 / 262,144 = 285,869.4 -> 285,856 (blocks): 22,944 fewer than 308,800 without LoRA,
    # and 8 full 32K requests at once instead of 9
    assert plan.kv_tokens_per_replica == 285_856
    assert plan_for().kv_tokens_per_replica == 308_800
    assert plan.max_concurrent_at_max_model_len == 8
    assert plan.fits and plan.warnings == []


def test_lora_slots_at_tp1_and_with_pipeline_stages() -> None:
    tp1 = plan_for(parallelism={"tensor": 1}, gpu={"type": "H200-141GB"}, lora={})
    # defaults maxLoras 1, rank 16: 16 x (64 x 131,072 + 2 x 157,056) x 2 B = 278,487,040 B
    assert tp1.lora is not None and tp1.lora.slot_bytes == 278_487_040
    assert tp1.lora.index_bytes == 4 * 8192 * 8 + 3 * 256 * 8 + 2 * (2 * 8192 * 4 + 7 * 4)  # no vocab map
    staged = plan_for(parallelism={"tensor": 2, "pipeline": 2}, lora={"maxLoras": 4, "maxLoraRank": 64})
    # a stage holds 32 layers and one of embed_tokens (first) and lm_head (last):
    # 4 x 64 x (32 x 83,456 + 157,056) x 2 B = 1,447,755,776 B
    assert staged.lora is not None and staged.lora.slot_bytes == 1_447_755_776


def test_lora_slots_grow_with_slots_and_rank_not_with_adapters() -> None:
    def slots(**lora: Any) -> int:
        plan = plan_for(lora=lora)
        assert plan.lora is not None
        return plan.lora.slot_bytes

    base = slots(maxLoras=1, maxLoraRank=16)
    assert slots(maxLoras=4, maxLoraRank=16) == 4 * base
    assert slots(maxLoras=1, maxLoraRank=64) == 4 * base
    assert slots(maxLoras=1, maxLoraRank=16, adapters=adapters(3)) == base  # sized by slots, not the list


def test_without_lora_the_plan_has_no_lora_term() -> None:
    plan = plan_for()
    assert plan.lora is None and plan.kv_budget_bytes_per_gpu == 40_475_617_795


def test_enforce_eager_captures_no_extra_cuda_graphs() -> None:
    plan = plan_for(lora={}, engine={"extraArgs": ["--enforce-eager"]})
    assert plan.lora is not None and plan.lora.cuda_graph_bytes == 0


def test_more_adapters_than_slots_warns_that_they_take_turns() -> None:
    plan = plan_for(lora={"adapters": adapters(3), "maxCpuLoras": 3})
    (warning,) = warnings_at(plan, "spec.lora.maxLoras")
    # two more slots of rank 16: 2 x 16 x 5,655,296 x 2 B = 361,938,944 B = 0.34 GiB
    assert warning.startswith("3 adapters share 1 GPU slot(s): a batch holds requests for at most 1")
    assert warning.endswith("maxLoras 3 would cost 0.34 GiB more per GPU")
    assert not warnings_at(plan_for(lora={"adapters": adapters(3), "maxLoras": 3}), "spec.lora.maxLoras")


def test_more_adapters_than_the_cpu_cache_warns_that_they_are_reloaded() -> None:
    plan = plan_for(lora={"adapters": adapters(3), "maxLoras": 2})
    (warning,) = warnings_at(plan, "spec.lora.maxCpuLoras")
    assert warning.startswith("3 adapters but maxCpuLoras 2 (default: maxLoras): each engine keeps")
    assert "reads an evicted one from its files again on its next request" in warning
    assert not warnings_at(plan_for(lora={"adapters": adapters(3), "maxLoras": 2, "maxCpuLoras": 3}),
                           "spec.lora.maxCpuLoras")  # fmt: skip


def test_more_slots_than_sequences_warns() -> None:
    plan = plan_for(lora={"maxLoras": 8}, engine={"maxNumSeqs": 4, "maxNumBatchedTokens": 8192})
    (warning,) = warnings_at(plan, "spec.lora.maxLoras")
    assert warning.startswith("8 slots but maxNumSeqs 4")


@pytest.mark.parametrize(
    ("args", "path"),
    [
        (["--api-server-count", "2"], "spec.engine.extraArgs[0]"),
        (["--seed", "1", "-asc=4"], "spec.engine.extraArgs[2]"),
    ],
)
def test_runtime_adapter_loading_needs_one_api_server(args: list[str], path: str) -> None:
    (error,) = errors_at(plan_for(lora={}, engine={"extraArgs": args}), path)
    assert "cannot be combined with spec.lora" in error
    assert not errors_at(plan_for(engine={"extraArgs": args}), path)  # without LoRA, several are fine
    assert not plan_for(lora={}, engine={"extraArgs": ["--api-server-count", "1"]}).errors


def test_a_lora_plan_that_does_not_fit_names_the_lora_term() -> None:
    # 10 slots of rank 256: 10 x 256 x 5,655,296 x 2 B = 28,955,115,520 B of slots (26.97 GiB) leave 86,992
    # tokens, less than one 131,072-token request
    plan = plan_for(lora={"maxLoras": 10, "maxLoraRank": 256}, engine={"maxModelLen": 131_072})
    (message,) = errors_at(plan, "spec.engine.maxModelLen")
    assert "after 30.51 GiB of weights plus 27.08 GiB for LoRA (spec.lora) and 3.02 GiB runtime" in message
    assert message.endswith("a quantized checkpoint, fewer LoRA slots or a lower maxLoraRank")
    # two A100-40GB: 30.51 GiB of weights + 2.80 GiB for LoRA + 3.02 GiB runtime > 35.55 GiB usable
    (message,) = errors_at(
        plan_for(gpu={"type": "A100-40GB"}, lora={"maxLoras": 4, "maxLoraRank": 64}), "spec.gpu.type"
    )
    assert (
        "weights need 30.51 GiB per GPU plus 2.80 GiB for LoRA (spec.lora) plus 3.02 GiB runtime" in message
    )
    assert message.endswith("a smaller maxNumBatchedTokens, fewer LoRA slots or a lower maxLoraRank")
