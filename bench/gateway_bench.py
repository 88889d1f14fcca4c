"""Gateway overhead: what the project's gateway costs streamed requests against direct engine access,
vllm-router alone with the same routing policy and spread of load, and the LiteLLM proxy, at 1, 16 and 64
concurrent streams. Prints ratios to direct, and the gateway's ratio to vllm-router alone.

Three parts, each with two engines:
  sim  llm-d-inference-sim replicas with the cited H100 timings of Qwen3-32B (qwen_devtools/realparts/sim.py):
       the engines hardly use the CPU, so what the gateway costs shows alone, and TTFT is tight enough
       to tell a few per cent;
  cpu  real vLLM CPU engines serving a small random Qwen3 with the engine flags the operator renders
       (plus --enforce-eager, which only skips the torch.compile warm-up): the gateway's CPU is taken from
       the engines', as on a node that runs both;
  cpu apart  the same engines bound to half the cores, the gateway and the load client to the other half
       (direct too): the gateway on cores of its own, as the operator places it (gateway pods prefer
       nodes without GPUs), so a hop waits for no engine's core.
Streamed chat completions with short prompts (8 tokens generated), closed loop, to these variants:
  direct              the engines themselves, client-side round robin (a plain Service, minus kube-proxy)
  gateway             nginx + vllm-router exactly as the operator renders them (start_gateway), with an
                      API key and the default routing policy
  vllm-router         the same router process and arguments on its own port (no nginx: no key, no rate
                      limit, no access log), sent the two headers nginx adds (a request id and the
                      conversation's bucket), so its policy spreads load as it does behind nginx
  vllm-router, bare   (cpu) the same without those headers: consistent_hash then sends every request
                      to one engine, which is how a run of 2026-12-03 saw the router alone at 1.8x direct
  litellm             (cpu) the LiteLLM proxy (PyPI litellm, its own venv) over both engines, with a master
                      key, so that it checks a key on every request as the gateway does
Within a round each concurrency level runs every variant in turn, the order rotating from round to round;
rounds repeat until the ratios settle or the time budget is spent. TTFT is the time to the first chunk
with generated text. Per variant the report also gives each engine's share of the requests (from the
engines' own counters) and the proxy processes' CPU time per request (from /proc).

Not a pass/fail test. Usage: .venv/bin/python bench/gateway_bench.py [--quick] [--only sim|cpu] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen_devtools.net import metric_sum
from qwen_devtools.procs import Proc, pin_threads, pin_tree, tree_cpu_seconds, wait_ready
from qwen_devtools.realparts import litellm
from qwen_devtools.realparts.benchmodel import bench_model
from qwen_devtools.realparts.compare import THROUGHPUT, Comparison, repeat_rounds, ttft_ms, write_report
from qwen_devtools.realparts.engine import (
    ENGINE_START_SECONDS,
    SERVED_MODEL,
    cpu_qwendeployment,
    spawn_engine,
    test_engine_args,
)
from qwen_devtools.realparts.gateway import GatewayStack, start_gateway
from qwen_devtools.realparts.load import Body, Target, closed_loop, token_ids
from qwen_devtools.realparts.sim import H100_32B, SIM_VERSION, start_sims
from qwen_operator.api.review import Review, review
from qwen_operator.gateway.nginx import SESSION_BUCKETS
from qwen_operator.versions import VLLM, VLLM_ROUTER

SCENARIO = "gateway overhead"
API_KEY = "sk-bench-0123456789abcdef"
LITELLM_KEY = "sk-litellm-bench-0123456789abcdef"
STREAMS = (1, 16, 64)
GENERATED_TOKENS = 8
#: Engine batch per replica: 64 streams fit in two engines, so TTFT shows routing, not engine queueing.
MAX_NUM_SEQS = 32
WORDS = "The quick brown fox jumps over the lazy dog."  # what the model may say (allowed_token_ids)
#: Counter of finished requests that vLLM and llm-d-inference-sim both export.
SERVED = "vllm:request_success_total"
#: The gateway's ratio to vllm-router alone, besides every variant's ratio to direct.
PAIRS = (("gateway", "vllm-router"),)


def _cr() -> dict[str, Any]:
    """The benchmark's QwenDeployment: engine and gateway as the operator renders them (default policy);
    admission limits far above the load so that the gateway never queues or refuses."""
    gateway = {
        "apiKeysSecret": "bench-keys",
        "replicas": 1,
        "rateLimit": {"requestsPerMinute": 1_000_000, "burst": 100_000},
        "maxConcurrentRequests": 512,
        "queueSize": 256,
    }
    engine = {"maxNumSeqs": MAX_NUM_SEQS}
    return cpu_qwendeployment(engine, gateway, replicas=2, name="bench", namespace="bench")


def _chat_body(allowed_tokens: list[int] | None) -> Body:
    """Short streamed chat completions, each prompt distinct. ignore_eos makes every answer equally long;
    allowed_token_ids (plain words; CPU engines) makes every token a chunk with text, so that TTFT is the
    first token's time whatever the random model picks (a lone byte of a UTF-8 character gives no text)."""
    serial = itertools.count()
    extra = {"allowed_token_ids": allowed_tokens} if allowed_tokens else {}
    return lambda: {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": f"Hello there, request {next(serial)}"}],
        "max_tokens": GENERATED_TOKENS,
        "ignore_eos": True,
        "stream": True,
        **extra,
    }


def _round_robin(base_urls: Sequence[str], headers: Callable[[], dict[str, str]] = dict) -> Target:
    cycle = itertools.cycle(f"{url}/v1/chat/completions" for url in base_urls)
    return lambda: (next(cycle), headers())


def _nginx_headers() -> dict[str, str]:
    """What nginx adds for vllm-router: a request id and the conversation's bucket. Every prompt here is a
    conversation of its own, whose bucket (a hash of its first message) is as good as drawn at random."""
    return {
        "X-Request-Id": f"{random.getrandbits(128):032x}",
        "X-Session-Id": f"c{random.randrange(SESSION_BUCKETS)}",
    }


def _spawn_engines(model: Path, rev: Review, count: int, log_dir: Path) -> list[Proc]:
    # No torch.compile warm-up (an engine starts in about a minute instead of two or three on 2 cores).
    extra = [*test_engine_args(rev.command), "--enforce-eager"]
    # One thread each, unbound: the two share the cores with the gateway and the client as the OS sees fit.
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return [spawn_engine(model, extra_args=extra, env=env, log_dir=log_dir) for _ in range(count)]


@contextlib.contextmanager
def _stopping(procs: list[Proc]) -> Iterator[list[Proc]]:
    try:
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def _spawn_litellm(urls: Sequence[str], log_dir: Path, notes: list[str]) -> Proc | None:
    """LiteLLM started (installed first if needed), or None with the reason in the notes."""
    try:
        return litellm.spawn_litellm(urls, LITELLM_KEY, log_dir)
    except (subprocess.CalledProcessError, OSError) as error:
        notes.append(f"LiteLLM {litellm.LITELLM_VERSION} could not be installed ({error}): variant left out")
        return None


def _wait_litellm(proc: Proc | None, notes: list[str]) -> Proc | None:
    if proc is None:
        return None
    try:
        wait_ready(proc, litellm.HEALTH_PATH, litellm.START_SECONDS)
    except RuntimeError as error:
        notes.append(f"LiteLLM did not start ({str(error).splitlines()[0]}): variant left out")
        return None
    return proc


@dataclass
class Part:
    """One set of engines and the variants in front of them."""

    name: str  # sim or cpu
    engine_urls: list[str]
    targets: dict[str, Target]
    #: Proxy processes charged to each variant (none for direct).
    proxies: dict[str, dict[str, Proc]]
    body: Body
    comparisons: list[Comparison] = field(default_factory=list)
    why: str = ""
    #: Per variant: requests each engine finished, and CPU seconds of each proxy process.
    served: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)

    def label(self, streams: int) -> str:
        return f"{streams} stream{'s' if streams > 1 else ''} ({self.name})"


def _variants(
    part_name: str, urls: list[str], stack: GatewayStack, proxy: Proc | None
) -> tuple[dict[str, Target], dict[str, dict[str, Proc]]]:
    router = {"router": stack.procs["router"]}
    targets = {
        "direct": _round_robin(urls),
        "gateway": _round_robin([stack.url], lambda: {"Authorization": f"Bearer {API_KEY}"}),
        "vllm-router": _round_robin([stack.router_url], _nginx_headers),
    }
    proxies = {"direct": {}, "gateway": dict(stack.procs), "vllm-router": router}
    if part_name == "cpu":
        targets["vllm-router, bare"] = _round_robin([stack.router_url])
        proxies["vllm-router, bare"] = router
        if proxy:
            targets["litellm"] = _round_robin([proxy.url], lambda: {"Authorization": f"Bearer {LITELLM_KEY}"})
            proxies["litellm"] = {"litellm": proxy}
    return targets, proxies


async def _measure(part: Part, args: argparse.Namespace, budget: float) -> None:
    names = list(part.targets)
    measures = [ttft_ms(50, "streamed TTFT"), ttft_ms(99, "streamed TTFT"), THROUGHPUT]
    comparisons = {n: Comparison(part.label(n), names, measures, PAIRS) for n in STREAMS}
    part.served = {n: [0.0] * len(part.engine_urls) for n in names}
    part.cpu = {n: {p: 0.0 for p in part.proxies[n]} for n in names}
    part.finished = dict.fromkeys(names, 0)

    def served() -> list[float]:
        return [metric_sum(f"{url}/metrics", SERVED) for url in part.engine_urls]

    async def one_round(round_no: int) -> None:
        order = names[round_no % len(names) :] + names[: round_no % len(names)]
        for streams in STREAMS:
            for name in order:
                before = served()
                cpu_before = {p: tree_cpu_seconds(proc.pid) for p, proc in part.proxies[name].items()}
                run = await closed_loop(part.targets[name], part.body, streams, args.seconds, ramp=args.ramp)
                for p, proc in part.proxies[name].items():
                    part.cpu[name][p] += tree_cpu_seconds(proc.pid) - cpu_before[p]
                part.served[name] = [
                    t + a - b for t, a, b in zip(part.served[name], served(), before, strict=True)
                ]
                part.finished[name] += len(run.ok())
                comparisons[streams].record(name, run)

    for name in names:  # first requests pay for connection set-up and lazy initialisation
        await closed_loop(part.targets[name], part.body, 4, 1.0)
    part.why = await repeat_rounds(
        one_round, list(comparisons.values()), args.min_rounds, args.max_rounds, budget
    )
    part.comparisons = list(comparisons.values())


def _extra_rows(part: Part) -> list[dict[str, Any]]:
    """Each variant's busiest engine share, and the proxies' CPU per finished request."""
    rows: list[dict[str, Any]] = []
    for name, counts in part.served.items():
        share = max(counts) / sum(counts) * 100 if sum(counts) else None
        rows.append(
            {"measure": f"busiest engine's share of requests ({part.name})", "variant": name,
             "value": share and round(share, 1), "unit": "%", "baseline": None, "ratio": None,
             "spread": None}
        )  # fmt: skip
    per_request = {
        name: sum(cpu.values()) * 1000 / max(1, part.finished[name]) for name, cpu in part.cpu.items() if cpu
    }
    for name, ms in per_request.items():
        peer = "vllm-router" if name == "gateway" else None
        rows.append(
            {"measure": f"proxy CPU per request ({part.name})", "variant": name, "value": round(ms, 3),
             "unit": "ms", "baseline": peer, "ratio": peer and round(ms / per_request[peer], 3),
             "spread": None}
        )  # fmt: skip
    return rows


def _part_notes(part: Part) -> list[str]:
    spread = "; ".join(f"{n} {'/'.join(str(int(c)) for c in counts)}" for n, counts in part.served.items())
    cpu = "; ".join(
        f"{n}: " + ", ".join(f"{p} {s * 1000 / max(1, part.finished[n]):.3f}" for p, s in procs.items())
        for n, procs in part.cpu.items()
        if procs
    )
    errors = {v: sum(c.pooled(v).errors for c in part.comparisons) for v in part.targets}
    chunks = {v: round(statistics.mean(c.pooled(v).mean_chunks for c in part.comparisons), 1) for v in errors}
    return [
        f"{part.name}: {part.why}; errors per variant {errors}; chunks with text per stream {chunks}",
        f"{part.name}: requests finished by each engine, per variant: {spread}",
        f"{part.name}: CPU ms per finished request of each proxy process: {cpu}",
    ]


async def _sim_part(args: argparse.Namespace, rev: Review, logs: Path) -> Part:
    with start_sims(2, 4096, MAX_NUM_SEQS, 4096, H100_32B, logs) as sims:
        urls = [s.url for s in sims]
        with start_gateway(rev, urls, {"bench": API_KEY}) as stack:
            targets, proxies = _variants("sim", urls, stack, None)
            part = Part("sim", urls, targets, proxies, _chat_body(None))
            await _measure(part, args, args.sim_budget)
    return part


async def _cpu_parts(args: argparse.Namespace, rev: Review, logs: Path, notes: list[str]) -> list[Part]:
    """The CPU engines with everything sharing the cores, then apart (the same engines and gateway)."""
    started = time.monotonic()
    model = bench_model(args.hidden, args.layers)
    with _stopping(_spawn_engines(model, rev, 2, logs)) as engines:
        urls = [e.url for e in engines]
        proc = _spawn_litellm(urls, logs, notes)  # starts while the engines load
        with _stopping([proc] if proc else []):
            print("[bench] starting 2 engines and LiteLLM (about a minute and a half)", flush=True)
            for engine in engines:
                wait_ready(engine, "/health", ENGINE_START_SECONDS)
            proxy = _wait_litellm(proc, notes)
            print(f"[bench] engines ready in {time.monotonic() - started:.0f} s", flush=True)
            with start_gateway(rev, urls, {"bench": API_KEY}) as stack:
                targets, proxies = _variants("cpu", urls, stack, proxy)
                body = _chat_body(sorted(set(await token_ids(urls[0], SERVED_MODEL, WORDS))))
                shared = Part("cpu", urls, targets, proxies, body)
                await _measure(shared, args, args.budget)
                parts = [shared]
                with _apart(engines, stack, notes) as apart:
                    if apart:
                        names = ("direct", "gateway", "vllm-router")
                        part = Part("cpu apart", urls, {n: targets[n] for n in names},
                                    {n: proxies[n] for n in names}, body)  # fmt: skip
                        await _measure(part, args, args.apart_budget)
                        parts.append(part)
    return parts


@contextlib.contextmanager
def _apart(engines: Sequence[Proc], stack: GatewayStack, notes: list[str]) -> Iterator[bool]:
    """Engines bound to the first half of this process's cores, the gateway and this process (the load
    client) to the rest; everything unbound again afterwards. False where there is one core only."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        notes.append("cpu apart: left out (one core)")
        yield False
        return
    engine_cores, client_cores = set(cores[: len(cores) // 2]), set(cores[len(cores) // 2 :])
    gateway = list(stack.procs.values())
    for engine in engines:
        pin_tree(engine.pid, engine_cores)
    for proc in gateway:
        pin_tree(proc.pid, client_cores)
    pin_threads(os.getpid(), client_cores)  # not its children: the engines
    notes.append(
        f"cpu apart: engines bound to cores {sorted(engine_cores)}, gateway, vllm-router and the load "
        f"client to {sorted(client_cores)} (direct too)"
    )
    try:
        yield True
    finally:
        for proc in [*engines, *gateway]:
            if proc.alive():
                pin_tree(proc.pid, set(cores))
        pin_threads(os.getpid(), set(cores))


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="qwen-gateway-bench-"))
    print(f"[bench] {SCENARIO}: engine and proxy logs under {work}", flush=True)
    rev = review(_cr())
    notes: list[str] = []
    parts = []
    if args.only in (None, "sim"):
        parts.append(await _sim_part(args, rev, work / "logs"))
    if args.only in (None, "cpu"):
        parts += await _cpu_parts(args, rev, work / "logs", notes)
    seconds = time.monotonic() - started
    notes = [*_notes(rev, args), *(n for part in parts for n in _part_notes(part)), *notes]
    print(f"\n{SCENARIO}: streamed chat completions, ratios to direct (client-side round robin)")
    comparisons = [c for part in parts for c in part.comparisons]
    for comparison in comparisons:
        comparison.print()
    for note in notes:
        print(f"   - {note}")
    title = "Gateway overhead: streamed TTFT and throughput, gateway vs direct vs vllm-router vs LiteLLM"
    report = write_report(None, SCENARIO, title, seconds, comparisons, notes)
    report["rows"] += [row for part in parts for row in _extra_rows(part)]
    for row in report["rows"][-len(parts) * 8 :]:
        print(f"   {row['measure']:45} {row['variant']:20} {row['value']} {row['unit']}"
              + (f"  {row['ratio']}x {row['baseline']}" if row.get("ratio") else ""))  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


def _notes(rev: Review, args: argparse.Namespace) -> list[str]:
    return [
        f"sim: 2 llm-d-inference-sim {SIM_VERSION} replicas, maxNumSeqs {MAX_NUM_SEQS}; {H100_32B.cite()}",
        f"cpu: 2 vLLM CPU engines (vllm-cpu {VLLM}), random Qwen3 (hidden {args.hidden}, {args.layers} "
        f"layers) served as {SERVED_MODEL}, engine flags as rendered for maxNumSeqs {MAX_NUM_SEQS}, plus "
        "--enforce-eager; one unbound thread each",
        f"streamed chat completions, ~10-token prompts, {GENERATED_TOKENS} tokens generated (ignore_eos); "
        f"per variant and level: closed loop, clients started over {args.ramp:g} s, then {args.seconds:g} s",
        f"gateway: nginx + vllm-router {VLLM_ROUTER} as rendered, policy {rev.resource.spec.gateway.policy} "
        "(the default), API key checked by nginx; vllm-router: the same process on its own port, sent "
        "nginx's request id and conversation bucket headers (bare: without them)",
        f"litellm: LiteLLM proxy {litellm.LITELLM_VERSION}, 1 worker, simple-shuffle over both engines, "
        "master key, no database",
        "cpu: 2 shared cores: engines, gateway, proxy and the load client compete for them, so a proxy's "
        "CPU cost also slows the CPU engines (as on a shared node); ratios, not absolute numbers, carry over",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of the scenario (a couple of minutes)"
    )
    parser.add_argument("--only", choices=("sim", "cpu"), help="one part only")
    parser.add_argument("--json", type=Path, help="write the scenario's JSON (bench suite contract) here")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the random model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random model")
    args = parser.parse_args()
    args.seconds = 2.0 if args.quick else 4.0
    args.ramp = 0.5
    args.min_rounds, args.max_rounds = (1, 1) if args.quick else (3, 6)
    args.budget = 60.0 if args.quick else 240.0  # measuring only; engines and proxy start in ~1.5 min
    args.apart_budget = 30.0 if args.quick else 160.0
    args.sim_budget = 40.0 if args.quick else 180.0
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
