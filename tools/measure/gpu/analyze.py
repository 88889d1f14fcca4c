"""Read the GPU host's outputs (host.py serve) and print the plan against vLLM's log, the load results and
the start-up phases, as the markdown tables docs/capacity-planning.md and docs/gpu-performance.md quote.

  .venv/bin/python tools/measure/gpu/analyze.py tools/measure/gpu/results/2026-12-07-h100 > .../summary.md

Each run directory holds command.txt, serve.log (vLLM's start-up log at DEBUG), result.json (ready
seconds, nvidia-smi memory) and load.jsonl (load.py's rounds); runs.json (prepare.py) holds the plan.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

#: (key, pattern): the first match of each in a run's serve.log; GiB unless the name says otherwise.
PATTERNS = {
    "weights": r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds",
    "non_kv": r"Total non KV cache memory: ([\d.]+)GiB",
    "torch_peak_increase": r"torch peak memory increase: ([\d.]+)GiB",
    "total_consumed": r"total consumed \(from mem_get_info\): ([\d.]+)GiB",
    "profile_seconds": r"Memory profiling takes ([\d.]+) seconds",
    "cuda_graph_estimate": r"Estimated CUDA graph memory: ([\d.]+) GiB total",
    "available_kv": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_tokens": r"KV cache size: ([\d,]+) tokens",
    "compile_seconds": r"torch.compile took ([\d.]+) s in total",
    "graph_capture": r"Graph capturing finished in ([\d.]+) secs, took ([\d.-]+) GiB",
    "init_engine_seconds": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)",
    "total_memory": r"total_memory=([\d.]+)GiB",
    "requested": r"Requested memory: ([\d.]+) \(util\), ([\d.]+) GiB",
}


def parse_log(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, pattern in PATTERNS.items():
        m = re.search(pattern, text)
        if not m:
            continue
        values = [float(g.replace(",", "")) for g in m.groups()]
        if key == "weights":
            found["weights"], found["load_seconds"] = values
        elif key == "graph_capture":
            found["graph_capture_seconds"], found["graph_capture_gib"] = values
        elif key == "requested":
            found["utilization"], found["requested"] = values
        else:
            found[key] = values[0]
    # vLLM 0.32 logs no figure for the CUDA-graph estimate it charges, only the budget without it: what
    # the requested memory lost beyond the non-KV total is that estimate (gpu_worker.py
    # determine_available_memory: requested - non-KV - estimate = available KV).
    if "cuda_graph_estimate" not in found and {"requested", "non_kv", "available_kv"} <= set(found):
        found["cuda_graph_estimate"] = round(found["requested"] - found["non_kv"] - found["available_kv"], 2)
    return found


def pct(planned: float, logged: float | None) -> str:
    return f"{(planned - logged) / logged * 100:+.1f} %" if logged else "n/a"


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def memory_table(runs: list[dict], logs: dict[str, dict]) -> list[str]:
    rows = [
        "| run | weights log / plan | profile peak log / plan "
        "| CUDA graphs estimate log / plan (capture took) | non-KV total log / plan "
        "| available KV log / plan (GiB) | KV tokens log / plan | plan vs log |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        log, t = logs[run["name"]], run["terms_gib"]
        plan_non_kv = t["weights"] + t["profile_peak"] + t["sampler_state"] + t["persistent"] + t["non_torch"]
        rows.append(
            f"| {run['name']} | {fmt(log.get('weights'))} / {t['weights']:.2f} "
            f"| {fmt(log.get('torch_peak_increase'))} / {t['profile_peak']:.2f} "
            f"| {fmt(log.get('cuda_graph_estimate'))} / {t['cuda_graphs']:.2f} "
            f"({fmt(log.get('graph_capture_gib'))}) "
            f"| {fmt(log.get('non_kv'))} / {plan_non_kv:.2f} "
            f"| {fmt(log.get('available_kv'))} / {t['kv_budget']:.2f} "
            f"| {fmt(log.get('kv_tokens'), 0)} / {run['plan']['kvTokensPerReplica']:,} "
            f"| {pct(run['plan']['kvTokensPerReplica'], log.get('kv_tokens'))} |"
        )
    return rows


def load_table(runs: list[dict], out: Path) -> list[str]:
    rows = [
        "| run | streams | output tok/s median (min-max of rounds) | TTFT p50 / p99 s "
        "| inter-token p50 / p99 ms |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        path = out / run["name"] / "load.jsonl"
        if not path.exists():
            continue
        rounds = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
        for conc in sorted({r["concurrency"] for r in rounds}):
            rs = [r for r in rounds if r["concurrency"] == conc]
            tps = [r["output_tokens_per_s"] for r in rs]

            def med(key: str, rs: list[dict] = rs) -> float:
                return statistics.median(r[key] for r in rs)

            rows.append(
                f"| {run['name']} | {conc} | {statistics.median(tps):,.0f} ({min(tps):,.0f}-{max(tps):,.0f}) "
                f"| {med('ttft_p50_s'):.3f} / {med('ttft_p99_s'):.3f} "
                f"| {med('itl_p50_s') * 1000:.1f} / {med('itl_p99_s') * 1000:.1f} |"
            )
    return rows


def startup_table(runs: list[dict], logs: dict[str, dict], out: Path) -> list[str]:
    rows = [
        "| run | ready after (s) | dummy weights (s) | torch.compile (s) | memory profile (s) "
        "| graph capture (s) | init engine total (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        log = logs[run["name"]]
        result = json.loads((out / run["name"] / "result.json").read_text())
        rows.append(
            f"| {run['name']} | {fmt(result['ready_seconds'], 0)} | {fmt(log.get('load_seconds'), 1)} "
            f"| {fmt(log.get('compile_seconds'), 1)} | {fmt(log.get('profile_seconds'), 1)} "
            f"| {fmt(log.get('graph_capture_seconds'), 0)} | {fmt(log.get('init_engine_seconds'), 1)} |"
        )
    return rows


def main() -> None:
    out = Path(sys.argv[1])
    runs = [
        r for r in json.loads((out / "runs.json").read_text()) if (out / r["name"] / "serve.log").exists()
    ]
    logs = {r["name"]: parse_log((out / r["name"] / "serve.log").read_text(errors="replace")) for r in runs}
    print(f"# GPU runs in {out.name}\n")
    print("## Memory per GPU: vLLM's log against the plan\n")
    print("\n".join(memory_table(runs, logs)), "\n")
    print("## Load (load.py: 1,000-token prompts, 256 output tokens, ignore_eos, 3 rounds)\n")
    print("\n".join(load_table(runs, out)), "\n")
    print("## Start-up phases\n")
    print("\n".join(startup_table(runs, logs, out)))
    print("\n```json")
    print(json.dumps(logs, indent=1))
    print("```")


if __name__ == "__main__":
    main()
