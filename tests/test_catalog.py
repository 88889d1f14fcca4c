"""The model catalog: every dense Qwen3 checkpoint's facts, recounted, planned and rendered.

Shapes are those of each size's config.json (https://huggingface.co/Qwen/Qwen3-<size>/blob/main/
config.json; api/catalog.py names the stored copies read, docs/models.md has the table). Weight bytes
are recounted here from the shapes and each checkpoint's quantization_config, and checked against the
sizes the Files pages publish where those were seen.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import yaml

from qwen_operator.api.catalog import MODELS, SHAPES, ModelInfo, Shape
from qwen_operator.api.engine import command_line
from qwen_operator.api.plan import make_plan
from qwen_operator.api.review import review
from qwen_operator.manifests import build_all
from qwen_operator.manifests.engine import cache_size_limit
from support import cli_in_process
from test_plan import errors_at, plan_for, warnings_at

# (layers, hidden, intermediate, attention heads, KV heads, head_dim, vocab, max_position_embeddings,
#  tie_word_embeddings), as config.json states them; rope_theta 1,000,000 and rope_scaling null in all.
CONFIG_JSON = {
    "0.6B": (28, 1024, 3072, 16, 8, 128, 151_936, 40_960, True),
    "1.7B": (28, 2048, 6144, 16, 8, 128, 151_936, 40_960, True),
    "4B": (36, 2560, 9728, 32, 8, 128, 151_936, 40_960, True),
    "8B": (36, 4096, 12288, 32, 8, 128, 151_936, 40_960, False),
    "14B": (40, 5120, 17408, 40, 8, 128, 151_936, 40_960, False),
    "32B": (64, 5120, 25600, 64, 8, 128, 151_936, 40_960, False),
}
#: The checkpoints Qwen publishes of each size, as the catalog names them (FP8 for every size, AWQ from 4B).
PUBLISHED = {
    size: [f"Qwen/Qwen3-{size}", f"Qwen/Qwen3-{size}-FP8"]
    + ([f"Qwen/Qwen3-{size}-AWQ"] if size[0] != "0" and size != "1.7B" else [])
    for size in CONFIG_JSON
}


def test_the_catalog_is_the_published_family() -> None:
    assert list(SHAPES) == list(CONFIG_JSON)
    assert list(MODELS) == [name for names in PUBLISHED.values() for name in names]


@pytest.mark.parametrize("name", list(MODELS))
def test_shape_facts_are_config_json(name: str) -> None:
    m = MODELS[name]
    assert (
        m.num_layers, m.hidden_size, m.intermediate_size, m.num_attention_heads, m.num_kv_heads,
        m.head_dim, m.vocab_size, m.max_position_embeddings, m.tie_word_embeddings,
    ) == CONFIG_JSON[m.size]  # fmt: skip
    assert m.rope_theta == 1_000_000.0
    assert name.removeprefix("Qwen/Qwen3-").split("-")[0] == m.size


def test_kv_bytes_per_token_of_each_size() -> None:
    # 2 (K, V) x layers x 8 KV heads x 128 x 2 B (bf16)
    assert {s: SHAPES[s].kv_bytes_per_token(2) for s in SHAPES} == {
        "0.6B": 114_688,  # 2 x 28 x 8 x 128 x 2 = 112 KiB
        "1.7B": 114_688,
        "4B": 147_456,  # 36 layers: 144 KiB
        "8B": 147_456,
        "14B": 163_840,  # 40 layers: 160 KiB
        "32B": 262_144,  # 64 layers: 256 KiB
    }


def test_context_limits_follow_the_model_cards() -> None:
    # Qwen3-0.6B and 1.7B cards: "Context Length: 32,768"; 4B and larger: "32,768 natively and 131,072
    # tokens with YaRN". vLLM accepts the config's 40,960 positions without rope scaling.
    assert {s: (SHAPES[s].max_context, SHAPES[s].yarn) for s in SHAPES} == {
        "0.6B": (40_960, False),
        "1.7B": (40_960, False),
        "4B": (131_072, True),
        "8B": (131_072, True),
        "14B": (131_072, True),
        "32B": (131_072, True),
    }


# --- weight bytes, recounted ---------------------------------------------------------------------


def _linear_parameters(s: Shape) -> int:
    q, kv = s.num_attention_heads * s.head_dim, s.num_kv_heads * s.head_dim
    attention = s.hidden_size * (q + 2 * kv) + q * s.hidden_size
    return s.num_layers * (attention + 3 * s.hidden_size * s.intermediate_size)


def _other_parameters(s: Shape) -> int:
    """Norms (two per layer, q/k norms, the final one) and embeddings (lm_head once when tied)."""
    return s.num_layers * (2 * s.hidden_size + 2 * s.head_dim) + s.hidden_size + s.embedding_parameters


def _fp8_scales(s: Shape) -> int:
    """One float32 scale per 128 x 128 block of every linear weight."""
    blocks = lambda rows, cols: math.ceil(rows / 128) * math.ceil(cols / 128)  # noqa: E731
    q, kv, h, i = (
        s.num_attention_heads * s.head_dim,
        s.num_kv_heads * s.head_dim,
        s.hidden_size,
        s.intermediate_size,
    )
    per_layer = blocks(q, h) + 2 * blocks(kv, h) + blocks(h, q) + 2 * blocks(i, h) + blocks(h, i)
    return s.num_layers * per_layer


def recount(m: ModelInfo) -> int:
    linear, other = _linear_parameters(m), _other_parameters(m)
    if m.checkpoint_quantization is None:  # bf16
        return 2 * (linear + other)
    if m.checkpoint_quantization == "fp8":  # 1 B per linear weight + float32 block scales; rest bf16
        return linear + 4 * _fp8_scales(m) + 2 * other
    # AWQ: 4-bit weights, per group of 128 an fp16 scale and a 4-bit zero point; rest fp16
    return linear // 2 + linear // 64 + linear // 256 + 2 * other


@pytest.mark.parametrize("name", [n for n in MODELS if "32B" not in n])
def test_weight_bytes_are_recounted_from_the_shapes(name: str) -> None:
    assert MODELS[name].weight_bytes == recount(MODELS[name])


@pytest.mark.parametrize("name", ["Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8", "Qwen/Qwen3-32B-AWQ"])
def test_the_32b_published_sizes_agree_with_the_recount(name: str) -> None:
    """The 32B keeps the Files pages' figures (65.53, 34.35, 19.34 GB): within 0.15% of the recount."""
    assert MODELS[name].weight_bytes == pytest.approx(recount(MODELS[name]), rel=1.5e-3)


def test_bf16_parameter_counts_match_the_model_cards() -> None:
    # "Number of Parameters: 0.6B / 1.7B / 4.0B / 8.2B / 14.8B / 32.8B", non-embedding 0.44B / 1.4B /
    # 3.6B / 6.95B / 13.2B / 31.2B
    for size, (total, non_embedding) in {
        "0.6B": (0.6, 0.44), "1.7B": (1.7, 1.4), "4B": (4.0, 3.6),
        "8B": (8.2, 6.95), "14B": (14.8, 13.2), "32B": (32.8, 31.2),
    }.items():  # fmt: skip
        s = SHAPES[size]
        assert round((_linear_parameters(s) + _other_parameters(s)) / 1e9, 1) == round(total, 1)
        assert abs(_linear_parameters(s) / 1e9 - non_embedding) <= 0.05  # cards round to 0.1B
        assert s.parameters == pytest.approx(total * 1e9)


def test_tied_checkpoints_that_store_lm_head_download_more_than_they_load() -> None:
    # Qwen3-0.6B: model.safetensors 1.5 GB (Files page) = 751,632,384 parameters x 2 B: lm_head.weight is
    # stored beside embed_tokens; vLLM ties them (qwen3.py), so the GPUs hold 596,049,920 x 2 B.
    tied = MODELS["Qwen/Qwen3-0.6B"]
    lm_head = 2 * tied.vocab_size * tied.hidden_size  # 311,164,928 B
    assert tied.weight_bytes == 1_192_099_840 and tied.download_bytes == tied.weight_bytes + lm_head
    # Qwen3-4B-FP8's Files page: 4.41 GB + a 778 MB second file, the bf16 lm_head (777,912,320 B)
    fp8 = MODELS["Qwen/Qwen3-4B-FP8"]
    assert fp8.download_bytes - fp8.weight_bytes == 2 * 151_936 * 2560 == 777_912_320
    assert round(fp8.weight_bytes / 1e9, 2) == 4.41
    # untied sizes store what they load: Qwen3-8B 16.4 GB
    assert MODELS["Qwen/Qwen3-8B"].download_bytes == MODELS["Qwen/Qwen3-8B"].weight_bytes == 16_381_470_720


# --- planning and rendering every checkpoint ------------------------------------------------------


def _typical(name: str) -> dict[str, Any]:
    """One replica on A100-80GB at the model's default tensor parallel size (32B: 2, others 1)."""
    return {
        "apiVersion": "inference.qwenops.dev/v1alpha1",
        "kind": "QwenDeployment",
        "metadata": {"name": "chat", "namespace": "ai", "uid": "0b1c2d3e-0000-4000-8000-000000000001"},
        "spec": {"model": {"name": name}, "gpu": {"type": "A100-80GB"}},
    }


@pytest.mark.parametrize("name", list(MODELS))
def test_every_checkpoint_plans_and_renders(name: str) -> None:
    model = MODELS[name]
    rev = review(_typical(name))
    plan = rev.plan
    assert plan.fits, plan.errors
    assert plan.tensor_parallel_size == (2 if model.size == "32B" else 1)
    assert plan.kv_bytes_per_token == model.kv_bytes_per_token(2)
    assert plan.max_concurrent_at_max_model_len >= 2
    engine = next(
        o for o in build_all(rev) if o["kind"] == "Deployment" and o["metadata"]["name"] == "chat-engine"
    )
    container = engine["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == name
    tp = container["args"][container["args"].index("--tensor-parallel-size") + 1]
    assert tp == str(plan.tensor_parallel_size) == container["resources"]["limits"]["nvidia.com/gpu"]
    if model.checkpoint_quantization:
        assert (
            container["args"][container["args"].index("--quantization") + 1] == model.checkpoint_quantization
        )


def test_qwen3_8b_on_one_a100_80gb_by_hand() -> None:
    plan = plan_for(model={"name": "Qwen/Qwen3-8B"}, parallelism=None)
    # tensor parallel size unset: Qwen3-8B's default, 1
    assert (plan.tensor_parallel_size, plan.gpus_per_replica) == (1, 1)
    # weights 8,190,735,360 parameters x 2 B = 16,381,470,720 B on the one GPU
    assert plan.weights_bytes_per_gpu == 16_381_470_720
    # runtime: forward 8,192 x 98,312 (measured, TP 1) = 805,371,904 B, the peak (sampler pass 256 x
    # 151,936 x 2 + 256 x 149 x 12 + (8,192 + 256) x 4,096 x 2 = 147,454,976 B); sampler state 256 x 4
    # x 165,914 = 169,895,936 (the vocabulary's, not the size's); workspaces 34,603,008; non-torch
    # 71,303,168; CUDA graphs 1,997,159,792: 3,078,333,808 B
    assert plan.runtime is not None and plan.runtime.total_bytes == 3_078_333_808
    # budget: 84,975,927,951 x 0.9 = 76,478,335,155 - 16,381,470,720 - 3,078,333,808 = 57,018,530,627 B
    assert plan.kv_budget_bytes_per_gpu == 57_018_530_627
    # KV per token 2 x 36 x 8 x 128 x 2 = 147,456 B; 57,018,530,627 / 147,456 = 386,681 -> 386,672
    # (16-token blocks); 386,672 // 32,768 = 11 full-length requests at once
    assert plan.kv_tokens_per_replica == 386_672 and plan.max_concurrent_at_max_model_len == 11
    assert plan.fits and plan.warnings == []


def test_qwen3_8b_plan_and_render_through_the_cli() -> None:
    body = yaml.safe_dump(_typical("Qwen/Qwen3-8B"))
    planned = cli_in_process("plan", "-f", "-", "-o", "json", stdin=body)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert (plan["model"], plan["tensorParallelSize"], plan["kvTokensPerReplica"]) == (
        "Qwen/Qwen3-8B",
        1,
        386_672,
    )
    rendered = cli_in_process("render", "-f", "-", stdin=body)
    assert rendered.returncode == 0, rendered.stderr
    engine = next(
        d
        for d in yaml.safe_load_all(rendered.stdout)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "chat-engine"
    )
    assert engine["spec"]["template"]["spec"]["containers"][0]["args"][0] == "Qwen/Qwen3-8B"


def test_online_fp8_keeps_the_embeddings_of_each_size_in_bf16() -> None:
    # bf16 x (FP8 checkpoint / bf16 checkpoint) of the same size: Qwen3-8B 16,381,470,720 x 9,437,399,040
    # / 16,381,470,720 = 9,437,399,040 B; the model cache still holds the bf16 files
    plan = plan_for(
        model={"name": "Qwen/Qwen3-8B"}, parallelism=None, engine={"quantization": "fp8_per_tensor"}
    )
    assert plan.weights_bytes_per_gpu == 9_437_399_040
    assert plan.download_bytes == 16_381_470_720


def test_yarn_follows_the_model() -> None:
    # 4B: YaRN x2 above 40,960, rope_theta restated from its config
    body = _typical("Qwen/Qwen3-4B")
    body["spec"]["engine"] = {"maxModelLen": 65_536}
    spec = review(body).resource.spec
    plan = make_plan(spec)
    assert plan.fits and plan.yarn is not None and plan.yarn.factor == 2.0
    args = command_line(spec, plan)
    overrides = json.loads(args[args.index("--hf-overrides") + 1])
    assert overrides["rope_parameters"]["rope_theta"] == 1_000_000.0
    assert overrides["max_position_embeddings"] == 65_536
    # 0.6B: no YaRN documented; the config's 40,960 positions are the limit
    small = plan_for(model={"name": "Qwen/Qwen3-0.6B"}, parallelism=None, engine={"maxModelLen": 65_536})
    (message,) = errors_at(small, "spec.engine.maxModelLen")
    assert "65536 exceeds 40960" in message and "Qwen documents YaRN for Qwen3-4B and larger only" in message
    assert plan_for(model={"name": "Qwen/Qwen3-0.6B"}, parallelism=None, engine={"maxModelLen": 40_960}).fits


def test_tensor_parallel_sizes_follow_the_heads() -> None:
    # Qwen3-14B: 40 attention heads, 8 KV heads: 5 divides 40 but not 8, 16 does not divide 40
    for tp, reason in (
        (5, "it must divide the 8 KV heads or be a multiple of them"),
        (16, "40 attention heads"),
    ):
        plan = plan_for(
            model={"name": "Qwen/Qwen3-14B"},
            gpu={"type": "H100-80GB", "gpusPerNode": 16},
            parallelism={"tensor": tp},
        )
        (message,) = errors_at(plan, "spec.parallelism.tensor")
        assert reason in message and message.endswith("valid sizes: 1, 2, 4, 8")


def test_a_small_draft_model_is_a_catalog_model() -> None:
    plan = plan_for(engine={"speculative": {"method": "draft_model", "model": "Qwen/Qwen3-1.7B-FP8"}})
    # the draft's weights (2,032,207,872 B) and its 28 layers of KV (112 KiB per token) share the GPUs
    assert plan.weights_bytes_per_gpu == (65_530_000_000 + 2_032_207_872) // 2
    assert plan.draft_kv_bytes_per_token == 2 * 28 * 8 * 128 * 2
    assert plan.fits and not warnings_at(plan, "spec.engine.speculative.model")


def test_the_model_cache_holds_the_files_not_the_gpu_weights() -> None:
    # online FP8 of the bf16 32B: 34.35 GB on the GPUs, 65.53 GB downloaded: ceil(65.53e9 x 1.2 / 2^30)
    # = ceil(73.24) = 74Gi (it was 39Gi, the FP8 weights plus 20%, which the download would overflow)
    body = _typical("Qwen/Qwen3-32B")
    body["spec"]["engine"] = {"quantization": "fp8_per_block"}
    assert cache_size_limit(review(body)) == "74Gi"
    # Qwen3-0.6B: 1.19 GB on the GPU, its 1.50 GB file cached: ceil(1,503,264,768 x 1.2 / 2^30) = 2Gi
    assert cache_size_limit(review(_typical("Qwen/Qwen3-0.6B"))) == "2Gi"
