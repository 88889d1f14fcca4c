"""The memory model against public vLLM start-up logs (tools/measure/vllm-kv-datapoints.json, a copy of
the project's shared data file with the quoted log lines).

Every point the catalog can express is planned with its own GPU memory (a Custom GPU of the logged or
stated total), utilization, TP/PP and limits, then put in that version's accounting: the terms the
logged version charged differently from vLLM 0.32, each from that version's source (Setup.accounting
says which; the plan itself is 0.32's). The table printed (pytest -s) shows the 0.32 plan, the plan in
the point's accounting, and the logged KV GiB per GPU and KV tokens per replica. "Comparable" points
(V1 engine, vLLM 0.19 or newer, KV logged, GPU memory known) must be within -10%..+3% of the log in
their version's accounting (above it, the plan promises requests vLLM then refuses); a refusal must be
refused. A comparable point the source-derived terms cannot reach fails that rule as an expected
failure, with the term that is missing (UNEXPLAINED); nothing is fitted to it. Expected figures are
the logs' own; nothing here is computed by running the planner ahead of time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest

from qwen_operator.api.catalog import GIB, MODELS
from qwen_operator.api.plan import CUBLAS_WORKSPACE_BYTES, NON_TORCH_BYTES, Plan, kv_tokens, make_plan
from qwen_operator.api.spec import parse
from support import REPO

DATA = json.loads((REPO / "tools" / "measure" / "vllm-kv-datapoints.json").read_text())
POINTS = {p["id"]: p for p in DATA["points"]}
VOCAB = 151_936
HIDDEN = 5_120
#: The V1 model runner's dummy sampler pass (two passes: float32 copy, probabilities, exponential
#: noise), measured 14.07 bytes per row per vocabulary entry; its sort-based top-k/top-p fallback of
#: older versions 38.09 (tools/measure/activation_peak.out.txt).
V1_SAMPLER_BYTES_PER_LOGIT = 14.07
SORT_SAMPLER_BYTES_PER_LOGIT = 38.09
#: The rule on comparable points: planned KV per GPU within this band around the logged one.
BELOW, ABOVE = -0.10, 0.03
#: Model Runner V2 in vLLM 0.24 and 0.27.1 (v1/worker/gpu/model_runner.py profile_cudagraph_memory,
#: lines 684-686 and 749-751) returns 0: CUDA graphs are captured after the KV cache, outside the budget.
V2_WITHOUT_GRAPH_ESTIMATE = (
    "Model Runner V2 (Qwen3ForCausalLM is a default V2 architecture, config/vllm.py); its "
    "profile_cudagraph_memory returns 0 (v1/worker/gpu/model_runner.py:{line}): CUDA graphs outside "
    "the budget"
)


@dataclass(frozen=True)
class Setup:
    """What the planner is given for one point: the source's figures, and that version's defaults for
    the ones it left at default (vllm/engine/arg_utils.py: 8192 batched tokens and 1024 sequences on
    H100-class GPUs of 70 GiB or more, else 2048 and 256; V0 without chunked prefill profiles
    max(max_model_len, 2048) tokens)."""

    model: str
    compute_capability: str
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    utilization: float | None = None  # None: the point's own
    chunked_prefill: bool = True
    assumed: str = ""  # what the table must say was assumed
    accounting: str = ""  # what that version does differently from vLLM 0.32
    cuda_graphs_outside_budget: bool = False  # V1 runner before 0.21, Model Runner V2 before 0.32
    v1_runner: bool = False  # the V1 model runner: its sampler pass, no V2 sampler state
    sort_sampler: bool = False  # vLLM before the Triton top-k/top-p kernel (V1 runner)


SETUPS: dict[str, Setup] = {
    "LLMD-SNAP-H100": Setup(
        "Qwen/Qwen3-32B",
        "9.0",
        8192,
        8192,
        1024,
        accounting="KV inferred from the sleep-mode 'discarded' figure, not logged; 0.26 runs Model Runner "
        "V2 (its loading line is V2's), assumed without a graph estimate as in 0.24 and 0.27.1",
        cuda_graphs_outside_budget=True,
    ),
    "LMCACHE-FAQ-TP2-H100": Setup(
        "Qwen/Qwen3-32B",
        "9.0",
        40960,
        8192,
        1024,
        utilization=0.9,
        assumed="utilization 0.9, version ~0.10/0.11",
        accounting="~0.11: V1 runner, CUDA graphs outside the budget; sort-based sampler over 1024 rows",
        cuda_graphs_outside_budget=True,
        v1_runner=True,
        sort_sampler=True,
    ),
    "VLLM-15815": Setup(
        "Qwen/Qwen3-32B",
        "8.9",
        10000,
        10000,
        256,
        chunked_prefill=False,
        accounting="V0 0.7.1: own profile (logged activation 1.26 GiB, non-torch 0.30 GiB), graphs "
        "outside the budget; Qwen2.5-32B weights 30.71 GiB/GPU vs 30.51",
        cuda_graphs_outside_budget=True,
        v1_runner=True,
    ),
    "RAGPI-AWQ-TP2-5090": Setup(
        "Qwen/Qwen3-32B-AWQ",
        "12.0",
        32768,
        2048,
        256,
        assumed="GPU total 31.84 GiB is the nominal 32,607 MiB (CUDA may report ~0.5 GiB less)",
        accounting="0.11: V1 runner, CUDA graphs outside the budget; sampler over 256 rows",
        cuda_graphs_outside_budget=True,
        v1_runner=True,
    ),
    "NIMBUS-TP1-v019": Setup(
        "Qwen/Qwen3-32B",
        "12.0",
        40960,
        8192,
        128,
        assumed="GPU total 95.01 GiB (RTX PRO 6000, not named in the source)",
        accounting="0.19: V1 runner (envs.py:1605, VLLM_USE_V2_MODEL_RUNNER=0), graph estimate off "
        "(envs.py:1654, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0): CUDA graphs outside the budget",
        cuda_graphs_outside_budget=True,
        v1_runner=True,
    ),
    "ASCEND-1249-TP4": Setup(
        "Qwen/Qwen3-32B",
        "8.0",
        40960,
        2048,
        256,
        accounting="not CUDA (Ascend 910B4, vllm-ascend 0.9): ~2.7 GB held at idle, own graph capture",
        cuda_graphs_outside_budget=True,
        v1_runner=True,
    ),
    "PPU-R1D-TP2": Setup(
        "Qwen/Qwen3-32B",
        "8.0",
        131072,
        2048,
        256,
        accounting="not NVIDIA (T-Head PPU), V0 profile (logged activation 1.41, non-torch 0.74 GiB)",
        cuda_graphs_outside_budget=True,
        v1_runner=True,
    ),
    "H100NVL-TABLE": Setup(
        "Qwen/Qwen3-32B",
        "9.0",
        40960,
        4096,
        1024,
        utilization=0.9,
        assumed="utilization 0.9, GPU total the catalog's 93.00 GiB; version not stated (0.32's accounting)",
        accounting="version unknown: graphs inside or outside the budget",
    ),
    # vLLM 0.27.1 on RTX PRO 6000 Blackwell (95.01 GiB, >= 70 GiB and not A100: 8192 batched tokens and
    # 1024 sequences by default, engine/arg_utils.py get_batch_defaults).
    **{
        pid: Setup(
            "Qwen/Qwen3-32B",
            "12.0",
            32768,
            8192,
            1024,
            accounting="0.27.1: " + V2_WITHOUT_GRAPH_ESTIMATE.format(line="749-751"),
            cuda_graphs_outside_budget=True,
        )
        for pid in ("BLOG-TP2-PRO6000", "BLOG-PP2-PRO6000")
    },
    "BLOG-TP1-PRO6000-REFUSED": Setup(
        "Qwen/Qwen3-32B",
        "12.0",
        32768,
        8192,
        1024,
        accounting="0.27.1: " + V2_WITHOUT_GRAPH_ESTIMATE.format(line="749-751") + "; vLLM refused to "
        "start: planned is the budget before clamping (the plan refuses too)",
        cuda_graphs_outside_budget=True,
    ),
    **{
        pid: Setup(
            "Qwen/Qwen3-32B",
            "9.0",
            16000,
            8192,
            1024,
            accounting="0.11: V1 runner, CUDA graphs outside the budget; sort-based sampler over 1024 rows "
            "(the logged activation, 5.64 GiB at TP 1 and 2, is that sampler: 5.52 GiB measured + hidden "
            "states)",
            cuda_graphs_outside_budget=True,
            v1_runner=True,
            sort_sampler=True,
        )
        for pid in ("LLMD-0.11-TP1-H100", "LLMD-0.11-TP2-H100")
    },
    # Run here with the operator's own engine command (tools/measure/gpu/): vLLM 0.32, the pinned version,
    # so its accounting is the plan's; every limit is the rendered command's.
    "QWENOPS-H100-V032-BF16-16K": Setup(
        "Qwen/Qwen3-32B",
        "9.0",
        16384,
        8192,
        256,
        accounting="0.32.0, the pinned version: the plan's own accounting",
    ),
    "KR-TP2-PRO6000-V024": Setup(
        "Qwen/Qwen3-32B",
        "12.0",
        32768,
        8192,
        1024,
        assumed="GPU total 95.01 GiB (the RTX PRO 6000 Blackwell of the BLOG points; not logged)",
        accounting="0.24.0: " + V2_WITHOUT_GRAPH_ESTIMATE.format(line="684-686"),
        cuda_graphs_outside_budget=True,
    ),
}

#: Points the catalog cannot express, and why (they stay in the table).
NOT_EXPRESSIBLE = {
    "VLLM-16301": "GPU and utilization not stated",
    "VLLM-17822": "GPU not stated",
    "VLLM-12865": "GPU and utilization not stated",
    "VLLM-15015": "GGUF q4_k_m checkpoint (not in the catalog); utilization not captured",
    "VLLM-14452": "bitsandbytes 4-bit checkpoint (not in the catalog); utilization not stated",
    "DL-TP2": "utilization and maxModelLen not stated",
    "DL-TP1": "utilization and maxModelLen not stated",
    "LMCACHE-1241": "utilization not stated; Qwen2.5 FP8 checkpoint",
    "2080TI-AWQ-TP4": "utilization 0.99 (above the CRD's 0.98) and maxModelLen 212,992 (YaRN 6.5)",
}

#: Comparable points the source-derived terms do not reach: the rule fails on them (an expected failure,
#: strict, so that reaching them shows), and test_full_width_surplus pins the missing amount.
UNEXPLAINED = {
    "BLOG-PP2-PRO6000": "the first stage logged 3.03 GiB besides weights and KV where the terms give 1.51 "
    "(forward 1.41, workspaces, non-torch; no sampler there): 1.52 GiB that no term of vLLM's source "
    "accounts for; the same post's TP 1 run shows a like surplus (1.72 GiB), its TP 2 run none (0.03 "
    "GiB), and the logged tokens hold the last stage, as wide, to 0.75 GiB at most above its terms: a "
    "profile peak of the stage that embeds at TP 1 (the size of its embedding table, 1.45 GiB, but "
    "no copy of the table is made in the load, the lookup or the compile: docs); the plan's last stage "
    "(2.30 GiB) puts KV 10.8 % above the log",
}

#: Points measured on a GPU with the operator's own engine command (tools/measure/gpu/, issue 42): the
#: band is tighter, KV tokens -3 % .. +1 % of the log (a little low, never high). A point outside it is a
#: planner term to fix from vLLM's source, never a constant fitted to it; until then an expected
#: failure (strict) saying which logged terms differ from the plan's.
MEASURED_BELOW, MEASURED_ABOVE = -0.03, 0.01
MEASURED_HERE = {
    "QWENOPS-H100-V032-BF16-16K": "plan 27,472 tokens, log 28,864 (-4.8 %), with terms off both ways. CUDA "
    "graphs: the plan's 1.86 GiB (a 0.26 log's capture) against the 1.17 GiB estimate 0.32 charges "
    "(requested 71.26 - non-KV 63.04 - available 7.05): 0.69 over. The forward: the plan's 1.41 GiB "
    "(184,328 B per token, the eager rebuild) against the log's torch peak increase of 1.61, which is "
    "what tools/measure/first_stage.py measured for the forward split at attention as vLLM compiles it "
    "(210,944 B per token, 1.609 GiB): 0.20 under. Persistent beyond weights (total consumed 61.48 - "
    "61.03): 0.45 logged against the plan's 0.26 (sampler state, cuBLAS workspaces, non-torch), 0.19 "
    "under, of which 0.05 are allocations during the profile (torch peak increase 1.61 - transient "
    "headroom 1.56) and 0.14 not attributed (candidate: the compiled graph's Triton kernel modules, "
    "non-torch). The first two fixes alone put the plan 2 % high; the runs at maxNumBatchedTokens 2048 "
    "and 16384 and at maxNumSeqs 64 (tools/measure/gpu/runs.yaml) separate the terms.",
}

CATALOG_GPU_GIB = {"H100NVL-TABLE": 93.00}


def version_of(text: str) -> tuple[int, int] | None:
    match = re.search(r"v?(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def comparable(point: dict[str, Any]) -> bool:
    version = version_of(point["vllm_version"])
    logged = point["logged"]
    return (
        point["engine"] == "V1"
        and version is not None
        and version >= (0, 19)
        and (logged["kv_cache_gib"] is not None or logged["kv_cache_tokens"] is not None)
        and point["gpu_total_mem_gib"] is not None
    )


def logged_kv(point: dict[str, Any]) -> tuple[float | None, int | None]:
    """KV GiB per GPU and KV tokens per replica the source gives (logged, else derived from the other)."""
    logged, derived = point["logged"], point["derived"]
    gib = logged["kv_cache_gib"] or derived.get("kv_gib_implied_by_tokens")
    tokens = logged["kv_cache_tokens"] or derived.get("tokens_implied_by_kv_gib")
    if gib is None and point["id"] == "LLMD-SNAP-H100":  # inferred from the sleep-mode log line
        gib = 8.52
    return gib, tokens


def plan_point(point: dict[str, Any], setup: Setup) -> Plan:
    memory = CATALOG_GPU_GIB.get(point["id"], point["gpu_total_mem_gib"])
    utilization = setup.utilization if setup.utilization is not None else point["gpu_memory_utilization"]
    spec = {
        "model": {"name": setup.model},
        "gpu": {
            "type": "Custom",
            "gpusPerNode": 8,
            "custom": {
                "name": point["id"],
                "memory": f"{memory}Gi",
                "computeCapability": setup.compute_capability,
                "productLabels": ["calibration"],
            },
        },
        "parallelism": {"tensor": point["tp"], "pipeline": point["pp"]},
        "engine": {
            "maxModelLen": setup.max_model_len,
            "maxNumBatchedTokens": setup.max_num_batched_tokens,
            "maxNumSeqs": setup.max_num_seqs,
            "gpuMemoryUtilization": utilization,
            "enableChunkedPrefill": setup.chunked_prefill,
        },
    }
    body = {
        "apiVersion": "inference.qwenops.dev/v1alpha1",
        "kind": "QwenDeployment",
        "metadata": {"name": "c"},
    }
    return make_plan(parse({**body, "spec": spec}).spec)


def usable_bytes(point: dict[str, Any], setup: Setup) -> float:
    memory = CATALOG_GPU_GIB.get(point["id"], point["gpu_total_mem_gib"])
    utilization = setup.utilization if setup.utilization is not None else point["gpu_memory_utilization"]
    return memory * utilization * GIB


def version_budget(point: dict[str, Any], setup: Setup, plan: Plan) -> float:
    """The plan's KV budget per GPU (before clamping: negative means refused) in the point's version's
    accounting: CUDA graphs left out where that version captured them after sizing the KV cache, and the
    V1 model runner's sampler pass in place of Model Runner V2's logits and sampler state."""
    runtime = plan.runtime
    assert runtime is not None
    charged = runtime.total_bytes
    if setup.cuda_graphs_outside_budget:
        charged -= runtime.cuda_graph_bytes
    if setup.v1_runner:
        rows = min(setup.max_num_seqs, setup.max_num_batched_tokens)
        per_logit = SORT_SAMPLER_BYTES_PER_LOGIT if setup.sort_sampler else V1_SAMPLER_BYTES_PER_LOGIT
        v1_sampler = int(per_logit * rows * VOCAB) + setup.max_num_batched_tokens * HIDDEN * 2
        charged += max(runtime.forward_bytes, v1_sampler) - runtime.profile_peak_bytes
        charged -= runtime.sampler_state_bytes
    return usable_bytes(point, setup) - plan.weights_bytes_per_gpu - charged


def version_tokens(point: dict[str, Any], setup: Setup, plan: Plan) -> int:
    model = MODELS[setup.model]
    shards = model.kv_shards(plan.tensor_parallel_size) * plan.pipeline_parallel_size
    return kv_tokens(int(version_budget(point, setup, plan)), shards, plan.kv_bytes_per_token)


def error(planned: float, logged: float | None) -> str:
    return "" if not logged else f"{(planned - logged) / logged:+.1%}"


def table() -> list[dict[str, Any]]:
    rows = []
    for pid, point in POINTS.items():
        gib, tokens = logged_kv(point)
        row = {
            "id": pid,
            "version": point["vllm_version"],
            "comparable": comparable(point),
            "logged_gib": gib,
            "logged_tokens": tokens,
        }
        setup = SETUPS.get(pid)
        if setup is None:
            row["note"] = NOT_EXPRESSIBLE[pid]
        else:
            plan = plan_point(point, setup)
            row.update(
                plan_gib=plan.kv_budget_bytes_per_gpu / GIB,
                version_gib=version_budget(point, setup, plan) / GIB,
                version_tokens=version_tokens(point, setup, plan),
                note="; ".join(
                    x
                    for x in (
                        setup.accounting,
                        setup.assumed and f"assumed: {setup.assumed}",
                        pid in UNEXPLAINED and f"not reached: {UNEXPLAINED[pid]}",
                    )
                    if x
                ),
            )
        rows.append(row)
    return rows


def test_every_point_is_planned_or_explained() -> None:
    assert set(SETUPS) | set(NOT_EXPRESSIBLE) == set(POINTS)
    assert not set(SETUPS) & set(NOT_EXPRESSIBLE)
    assert set(UNEXPLAINED) <= {pid for pid, p in POINTS.items() if comparable(p)}


def test_calibration_table(capsys: pytest.CaptureFixture[str]) -> None:
    rows = table()
    lines = [
        "| point | vLLM | comparable | logged KV GiB/GPU | plan (0.32) | in its version's accounting | error "
        "| logged tokens | planned tokens | error | what differs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "version_gib" not in r:
            lines.append(
                f"| {r['id']} | {r['version']} | no | {r['logged_gib'] or ''} | - | - | | "
                f"{r['logged_tokens'] or ''} | - | | not expressible: {r['note']} |"
            )
            continue
        lg = r["logged_gib"]
        lines.append(
            f"| {r['id']} | {r['version']} | {'yes' if r['comparable'] else 'no'} | {lg or ''} "
            f"| {r['plan_gib']:.2f} | {r['version_gib']:.2f} | {error(r['version_gib'], lg)} "
            f"| {r['logged_tokens'] or ''} | {r['version_tokens']} "
            f"| {error(r['version_tokens'], r['logged_tokens'])} | {r['note']} |"
        )
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert any(r["comparable"] for r in rows)


def comparable_case(pid: str) -> Any:
    reason = UNEXPLAINED.get(pid)
    return pytest.param(pid, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else pid


@pytest.mark.parametrize("pid", [comparable_case(pid) for pid, p in POINTS.items() if comparable(p)])
def test_comparable_points_within_the_band(pid: str) -> None:
    point, setup = POINTS[pid], SETUPS[pid]
    plan = plan_point(point, setup)
    gib, tokens = logged_kv(point)
    if gib is not None and gib < 0:  # vLLM refused to start: the plan must refuse too
        assert not plan.fits and version_budget(point, setup, plan) < 0
        return
    if gib is not None:
        assert BELOW <= (version_budget(point, setup, plan) / GIB - gib) / gib <= ABOVE
    if tokens is not None:
        assert BELOW <= (version_tokens(point, setup, plan) - tokens) / tokens <= ABOVE


def measured_case(pid: str) -> Any:
    reason = MEASURED_HERE[pid]
    return pytest.param(pid, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else pid


@pytest.mark.parametrize("pid", [measured_case(pid) for pid in MEASURED_HERE])
def test_points_measured_here_within_the_tight_band(pid: str) -> None:
    point, setup = POINTS[pid], SETUPS[pid]
    assert not setup.cuda_graphs_outside_budget and not setup.v1_runner  # the plan's own accounting
    _, tokens = logged_kv(point)
    assert tokens is not None
    planned = version_tokens(point, setup, plan_point(point, setup))
    assert MEASURED_BELOW <= (planned - tokens) / tokens <= MEASURED_ABOVE, (planned, tokens)


def test_the_measured_points_terms_are_the_logs() -> None:
    """The figures MEASURED_HERE's reason states, from the plan and the log, so that it stays true."""
    point, setup = POINTS["QWENOPS-H100-V032-BF16-16K"], SETUPS["QWENOPS-H100-V032-BF16-16K"]
    plan = plan_point(point, setup)
    runtime = plan.runtime
    assert runtime is not None
    logged, derived = point["logged"], point["derived"]
    assert runtime.cuda_graph_bytes / GIB - logged["cuda_graph_gib"] == pytest.approx(0.69, abs=0.01)
    split_forward = 210_944 * setup.max_num_batched_tokens / GIB  # first_stage.out.txt, TP 1
    assert logged["activation_peak_gib"] == pytest.approx(split_forward, abs=0.01)
    assert logged["activation_peak_gib"] - runtime.profile_peak_bytes / GIB == pytest.approx(0.20, abs=0.01)
    persistent = (runtime.sampler_state_bytes + runtime.persistent_bytes + runtime.non_torch_bytes) / GIB
    logged_persistent = derived["persistent_beyond_weights_gib (total consumed - weights)"]
    assert logged_persistent - persistent == pytest.approx(0.19, abs=0.01)
    fixed = version_budget(point, setup, plan) / GIB + 0.69 - 0.20
    assert (fixed - logged["kv_cache_gib"]) / logged["kv_cache_gib"] == pytest.approx(0.02, abs=0.005)


def logged_runtime_gib(pid: str) -> float:
    """What the log leaves per GPU besides weights and KV cache (the first stage's, with PP)."""
    point = POINTS[pid]
    return (
        point["gpu_total_mem_gib"] * point["gpu_memory_utilization"]
        - point["logged"]["model_loading_gib"]
        - point["logged"]["kv_cache_gib"]
    )


def test_full_width_surplus() -> None:
    # vLLM 0.27.1 (one post, one machine): at TP 2 the source terms (forward, sampler state, workspaces,
    # non-torch) give what the log left within 0.05 GiB; at TP 1, and on PP 2's first stage (which runs
    # no sampler), the log leaves 1.5-1.75 GiB more than the terms, which no term of the source accounts
    # for (UNEXPLAINED). PP 2's last stage runs as many layers as wide, yet the logged tokens (the
    # smallest stage's, kv_cache_utils.py:2210-2218 in 0.27.1) hold it to at most 0.8 GiB above its
    # terms: the surplus is not a full-width term of the forward but belongs to the first stage.
    model = MODELS["Qwen/Qwen3-32B"]
    tp2 = plan_point(POINTS["BLOG-TP2-PRO6000"], SETUPS["BLOG-TP2-PRO6000"]).runtime
    tp1 = plan_point(POINTS["BLOG-TP1-PRO6000-REFUSED"], SETUPS["BLOG-TP1-PRO6000-REFUSED"]).runtime
    assert tp2 is not None and tp1 is not None
    first_stage = 8192 * dict(model.activation_bytes_per_token)[1] + CUBLAS_WORKSPACE_BYTES + NON_TORCH_BYTES
    surplus = {
        "TP 2": logged_runtime_gib("BLOG-TP2-PRO6000") - (tp2.total_bytes - tp2.cuda_graph_bytes) / GIB,
        "TP 1": logged_runtime_gib("BLOG-TP1-PRO6000-REFUSED")
        - (tp1.total_bytes - tp1.cuda_graph_bytes) / GIB,
        "PP 2, first stage": logged_runtime_gib("BLOG-PP2-PRO6000") - first_stage / GIB,
    }
    pp = POINTS["BLOG-PP2-PRO6000"]
    last_stage = plan_point(pp, SETUPS["BLOG-PP2-PRO6000"]).runtime  # the plan's binding stage: the last
    assert last_stage is not None
    last_stage_at_most = (
        pp["gpu_total_mem_gib"] * pp["gpu_memory_utilization"]
        - pp["logged"]["model_loading_gib"]
        - pp["logged"]["kv_cache_tokens"] * pp["derived"]["kv_bytes_per_token_per_gpu"] / GIB
    )
    surplus["PP 2, last stage, at most"] = (
        last_stage_at_most - (last_stage.total_bytes - last_stage.cuda_graph_bytes) / GIB
    )
    assert abs(surplus["TP 2"]) < 0.05, surplus
    assert 1.5 < surplus["PP 2, first stage"] < 1.75 and 1.5 < surplus["TP 1"] < 1.75, surplus
    assert surplus["PP 2, last stage, at most"] < 0.8, surplus


def test_older_versions_within_ten_percent() -> None:
    # In their version's accounting the NVIDIA points of versions before the comparable range fit too:
    # the rest of the model (weights, measured activations and sampler, non-torch) explains them.
    older = ("LMCACHE-FAQ-TP2-H100", "VLLM-15815", "RAGPI-AWQ-TP2-5090", "LLMD-0.11-TP1-H100")
    for pid in (*older, "LLMD-0.11-TP2-H100"):
        point, setup = POINTS[pid], SETUPS[pid]
        gib, _ = logged_kv(point)
        assert version_budget(point, setup, plan_point(point, setup)) / GIB == pytest.approx(gib, rel=0.10), (
            pid
        )
