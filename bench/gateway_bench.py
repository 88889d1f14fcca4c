"""Gateway benchmark: what the gateway costs, and what cache-aware routing buys. Prints ratios.

Two real vLLM CPU engines serve a small random Qwen3 model; the gateway runs exactly as the operator
renders it (nginx.conf, run-nginx.sh, vllm-router's command line). Everything is measured in one run on
the same engines, with the compared variants interleaved, so machine noise hits both sides alike:

1. Latency added by the gateway: small completions one at a time (p50, p99) and the time to first
   token of streamed ones (p50, p99), calling engine A directly against the gateway routing to A alone
   (requests alternate between the variants, so both see the engine equally warm); then throughput at
   16 concurrent requests over both engines, direct (client-side round robin) against the gateway.
   The gateway runs with cache_aware (the default) and with round_robin: cache_aware costs one extra
   call to an engine per request (see docs/gateway.md).
2. Routing policy near saturation: requests that share long prompt prefixes (24 "system prompts"),
   arriving as a Poisson stream at 90% of the measured capacity; TTFT p50/p99 of cache_aware against
   round_robin. The engines' KV cache holds about half the prefixes plus a full batch, so prefixes stay
   cached only if each engine sees about half of them.

Not a pass/fail test. Usage: .venv/bin/python bench/gateway_bench.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from qwen_devtools.model import build_tiny_model
from qwen_devtools.net import http_get
from qwen_devtools.procs import Proc, wait_ready
from qwen_devtools.realparts.engine import ENGINE_START_SECONDS, SERVED_MODEL, spawn_engine, test_engine_args
from qwen_devtools.realparts.gateway import start_gateway
from qwen_operator.api.review import Review, review

MODEL = SERVED_MODEL
API_KEY = "sk-bench-0123456789abcdef"
#: Engine KV cache in blocks of 128 tokens (the CPU backend's size): about half the prefixes (12 x 3
#: full blocks) plus a full batch (8 x 4 blocks); all 24 prefixes and a batch would need 104.
KV_BLOCKS = 72
PREFIX_GROUPS = 24
PREFIX_TOKENS = 480
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Qwen3 serves chat completions on vLLM.",
    "Kubernetes operators reconcile desired state.",
    "Hello, world! 0123456789 {}[]():;,.",
]


def _cr(policy: str, max_num_seqs: int = 8) -> dict[str, Any]:
    """The benchmark's QwenDeployment. max_num_seqs also sets the router's balance threshold (a quarter of
    it): 256 renders vllm-router's own default of 64, for comparison; the engines always run 8."""
    return {
        "apiVersion": "inference.qwenops.dev/v1alpha1",
        "kind": "QwenDeployment",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": {
            "model": {"name": MODEL},
            "gpu": {"type": "A100-80GB"},
            "parallelism": {"tensor": 2},
            "engine": {"maxModelLen": 1024, "maxNumSeqs": max_num_seqs, "maxNumBatchedTokens": 2048},
            "replicas": 2,
            "gateway": {
                "apiKeysSecret": "bench-keys",
                "replicas": 1,
                "policy": policy,
                "rateLimit": {"requestsPerMinute": 1_000_000, "burst": 100_000},
                "maxConcurrentRequests": 512,
                "queueSize": 256,
            },
        },
    }


# --- measurements ----------------------------------------------------------------------------------


@dataclass
class Sample:
    ok: bool
    latency: float
    ttft: float | None = None


@dataclass
class Run:
    label: str
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0

    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    def pct(self, q: float, ttft: bool = False) -> float:
        picked = [s.ttft if ttft else s.latency for s in self.ok()]
        values = sorted(v for v in picked if v is not None)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q / 100 * len(values)))]

    @property
    def throughput(self) -> float:
        return len(self.ok()) / self.seconds if self.seconds else 0.0

    @property
    def errors(self) -> int:
        return sum(not s.ok for s in self.samples)


async def _request(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> Sample:
    start = time.perf_counter()
    ttft = None
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                await response.read()
                return Sample(False, time.perf_counter() - start)
            if body.get("stream"):
                async for line in response.content:
                    if ttft is None and line.startswith(b"data: {"):
                        ttft = time.perf_counter() - start
            else:
                await response.read()
    except aiohttp.ClientError:
        return Sample(False, time.perf_counter() - start)
    return Sample(True, time.perf_counter() - start, ttft)


Target = Callable[[], tuple[str, dict[str, str]]]  # -> (base URL, headers) for the next request


def _direct(engines: Sequence[str]) -> Target:
    cycle = itertools.cycle(engines)
    return lambda: (next(cycle), {})


def _gateway(url: str) -> Target:
    return lambda: (url, {"Authorization": f"Bearer {API_KEY}"})


async def _sequential(label: str, target: Target, body: dict[str, Any], count: int) -> Run:
    run = Run(label)
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        for _ in range(count):
            base, headers = target()
            run.samples.append(await _request(session, f"{base}/v1/completions", body, headers))
        run.seconds = time.perf_counter() - start
    return run


async def _closed_loop(label: str, target: Target, make_body: Callable[[], dict[str, Any]], users: int,
                       seconds: float) -> Run:  # fmt: skip
    run = Run(label)
    deadline = time.perf_counter() + seconds

    async def user(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            base, headers = target()
            run.samples.append(await _request(session, f"{base}/v1/completions", make_body(), headers))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(user(session) for _ in range(users)))
        run.seconds = time.perf_counter() - start
    return run


async def _open_loop(label: str, target: Target, make_body: Callable[[], dict[str, Any]], rate: float,
                     seconds: float) -> Run:  # fmt: skip
    """Poisson arrivals at `rate` per second for `seconds`, whatever the latency (no coordinated omission)."""
    run = Run(label)
    arrivals = random.Random(11)  # the same arrival times in every run
    tasks: list[Awaitable[Sample]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        next_at = start
        while next_at < start + seconds:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            base, headers = target()
            tasks.append(
                asyncio.ensure_future(_request(session, f"{base}/v1/completions", make_body(), headers))
            )
            next_at += arrivals.expovariate(rate)
        run.samples = list(await asyncio.gather(*tasks))
        run.seconds = time.perf_counter() - start
    return run


# --- the shared-prefix workload ------------------------------------------------------------------------


class PrefixWorkload:
    """Requests on PREFIX_GROUPS long prompts; each run gets new prefixes so no cache carries over."""

    def __init__(self, chars_per_token: float, rng: random.Random) -> None:
        self.rng = rng
        self.chars = int(PREFIX_TOKENS * chars_per_token)
        self.serial = 0
        self.prefixes: list[str] = []

    def fresh(self, tag: str) -> None:
        self.prefixes = []
        for group in range(PREFIX_GROUPS):
            words = f"[{tag} system prompt {group}]"
            while len(words) < self.chars:
                words += " " + self.rng.choice(SENTENCES)
            self.prefixes.append(words[: self.chars])

    def body(self) -> dict[str, Any]:
        self.serial += 1
        prefix = self.rng.choice(self.prefixes)
        prompt = f"{prefix}\nQuestion {self.serial}: what next?"
        return {"model": MODEL, "prompt": prompt, "max_tokens": 16, "ignore_eos": True, "stream": True}


async def _chars_per_token(engine: str) -> float:
    text = " ".join(SENTENCES * 20)
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": text, "max_tokens": 1}
        async with session.post(f"{engine}/v1/completions", json=body) as response:
            usage = (await response.json())["usage"]
    return len(text) / usage["prompt_tokens"]


def _prefix_hits(engines: Sequence[str]) -> tuple[float, float]:
    hits = sum(_metric(e, "vllm:prefix_cache_hits_total") for e in engines)
    queries = sum(_metric(e, "vllm:prefix_cache_queries_total") for e in engines)
    return hits, queries


def _metric(engine: str, name: str) -> float:
    text = http_get(f"{engine}/metrics", timeout=5)[1]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


# --- orchestration ---------------------------------------------------------------------------------


def _start_engines(model: Path, rev: Review, count: int, log_dir: Path) -> list[Proc]:
    extra = [*test_engine_args(rev.command), "--num-gpu-blocks-override", str(KV_BLOCKS)]
    # One core per engine, as each replica would have its own GPU.
    engines = []
    for i in range(count):
        env = {"VLLM_CPU_OMP_THREADS_BIND": str(i % 2)}
        engines.append(spawn_engine(model, extra_args=extra, env=env, log_dir=log_dir))
    try:
        for engine in engines:
            wait_ready(engine, "/health", ENGINE_START_SECONDS)
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    return engines


async def _alternating(targets: dict[str, Target], body: dict[str, Any], count: int) -> dict[str, Run]:
    """`count` requests per target, one at a time, taking the targets in turn."""
    runs = {name: Run(name) for name in targets}
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            names = list(targets)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                base, headers = targets[name]()
                runs[name].samples.append(await _request(session, f"{base}/v1/completions", body, headers))
    return runs


async def _overhead(single: dict[str, Target], both: dict[str, Target], args: argparse.Namespace) -> Table:
    small = {"model": MODEL, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True}
    stream = {**small, "max_tokens": 16, "stream": True}
    latency = await _alternating(single, small, args.count)
    ttft = await _alternating(single, stream, args.count)
    throughput: dict[str, Run] = {name: Run(name) for name in both}
    for round_no in range(args.rounds):
        names = list(both) if round_no % 2 == 0 else list(reversed(both))
        for name in names:
            run = await _closed_loop(name, both[name], lambda: small, users=16, seconds=args.c16_seconds)
            throughput[name].samples += run.samples
            throughput[name].seconds += run.seconds
    table = Table(list(single))
    table.row("completion p50", [latency[n].pct(50) for n in single])
    table.row("completion p99", [latency[n].pct(99) for n in single])
    table.row("stream TTFT p50", [ttft[n].pct(50, ttft=True) for n in single])
    table.row("stream TTFT p99", [ttft[n].pct(99, ttft=True) for n in single])
    table.row("throughput, 16 at once", [throughput[n].throughput for n in both], unit="r/s")
    errors = sum(r.errors for group in (latency, ttft, throughput) for r in group.values())
    table.note = f"errors: {errors}"
    return table


class Table:
    """Rows of values per variant, printed with ratios against the first variant."""

    def __init__(self, columns: list[str]) -> None:
        self.columns = columns
        self.rows: list[tuple[str, list[float], str]] = []
        self.note = ""

    def row(self, label: str, values: list[float], unit: str = "ms") -> None:
        self.rows.append((label, values, unit))

    def print(self) -> None:
        width = 26
        print("   " + " " * 24 + "".join(f"{c:>{width}}" for c in self.columns))
        for label, values, unit in self.rows:
            cells = []
            for i, value in enumerate(values):
                if unit == "ms":
                    shown = f"{value * 1000:.1f} ms"
                elif unit == "%":
                    shown = f"{value * 100:.0f} %"
                else:
                    shown = f"{value:.1f} {unit}"
                if i:
                    shown += f" ({value / values[0]:.2f}x)" if values[0] else ""
                cells.append(shown)
            print(f"   {label:24}" + "".join(f"{c:>{width}}" for c in cells))
        if self.note:
            print(f"   {self.note}")

    def ratios(self) -> dict[str, dict[str, float]]:
        return {
            label: {c: v / values[0] for c, v in zip(self.columns[1:], values[1:], strict=True) if values[0]}
            for label, values, _ in self.rows
        }


async def _policies(engines: Sequence[str], args: argparse.Namespace, workload: PrefixWorkload) -> Table:
    keys = {"bench": API_KEY}
    with start_gateway(review(_cr("round_robin")), engines, keys) as stack:  # the baseline
        workload.fresh("capacity")
        cap = await _closed_loop("capacity", _gateway(stack.url), workload.body, 16, args.capacity_seconds)
    rate = 0.9 * cap.throughput
    print(f"\n2. Routing policy near saturation: {PREFIX_GROUPS} shared prefixes of ~{PREFIX_TOKENS} tokens,")
    print(f"   16-token streamed answers; capacity with round_robin {cap.throughput:.1f} req/s; Poisson")
    print(f"   arrivals at {rate:.1f} req/s (90%), {args.policy_seconds:.0f} s per run, {args.rounds} rounds")
    variants = {
        "round_robin": _cr("round_robin"),
        "cache_aware": _cr("cache_aware"),  # as rendered: balance threshold maxNumSeqs / 4 = 2
        "cache_aware balance 64": _cr("cache_aware", max_num_seqs=256),  # vllm-router's default
    }
    names = list(variants)
    runs = {n: Run(n) for n in names}
    hits = {n: [0.0, 0.0] for n in names}
    routing: dict[str, dict[str, float]] = {n: {} for n in names}
    for round_no in range(args.rounds):
        for name in names[round_no % len(names) :] + names[: round_no % len(names)]:
            with start_gateway(review(variants[name]), engines, keys) as stack:
                workload.fresh(f"{name}-{round_no}")  # new prefixes: nothing cached yet
                before = _prefix_hits(engines)
                run = await _open_loop(name, _gateway(stack.url), workload.body, rate, args.policy_seconds)
                after = _prefix_hits(engines)
                for metric, value in _router_routing(stack.router_metrics_url).items():
                    routing[name][metric] = routing[name].get(metric, 0.0) + value
            runs[name].samples += run.samples
            runs[name].seconds += run.seconds
            hits[name] = [hits[name][0] + after[0] - before[0], hits[name][1] + after[1] - before[1]]
    table = Table(names)
    for label, q in (("TTFT p50", 50), ("TTFT p90", 90), ("TTFT p99", 99)):
        table.row(label, [runs[n].pct(q, ttft=True) for n in names])
    table.row("latency p99", [runs[n].pct(99) for n in names])
    table.row("throughput", [runs[n].throughput for n in names], unit="r/s")
    table.row("prefix cache hit rate", [h / q if q else 0.0 for h, q in hits.values()], unit="%")
    table.note = f"errors: {[runs[n].errors for n in names]}; router: {routing}"
    return table


def _router_routing(url: str) -> dict[str, float]:
    """Cache-aware routing outcomes from vllm-router's metrics (empty for other policies)."""
    text = http_get(url, timeout=5)[1]
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("vllm_router_cache_hits_total", "vllm_router_cache_misses_total",
                     "vllm_router_load_balancing_events_total"):  # fmt: skip
            if line.startswith(name):
                key = name.removeprefix("vllm_router_").removesuffix("_total")
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="qwen-gateway-bench-"))
    print(f"[bench] model, engines and logs under {work}", flush=True)
    model = build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers)
    t0 = time.monotonic()
    engines = _start_engines(model, review(_cr("cache_aware")), 2, work / "logs")
    print(f"[bench] 2 engines ready in {time.monotonic() - t0:.0f} s", flush=True)
    urls = [e.url for e in engines]
    a = urls[0]
    keys = {"bench": API_KEY}
    try:
        with (
            start_gateway(review(_cr("cache_aware")), [a], keys) as ca_a,
            start_gateway(review(_cr("round_robin")), [a], keys) as rr_a,
            start_gateway(review(_cr("cache_aware")), urls, keys) as ca_ab,
            start_gateway(review(_cr("round_robin")), urls, keys) as rr_ab,
        ):
            single = {
                "direct": _direct([a]),
                "cache_aware": _gateway(ca_a.url),
                "round_robin": _gateway(rr_a.url),
            }
            both = {
                "direct": _direct(urls),
                "cache_aware": _gateway(ca_ab.url),
                "round_robin": _gateway(rr_ab.url),
            }
            warm = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            await _alternating(single | {f"{k} ab": v for k, v in both.items()}, warm, 10)
            overhead = await _overhead(single, both, args)
        print("\n1. Latency added by the gateway (nginx + vllm-router), as rendered, same engines")
        print("   (first four rows: one engine, requests alternating; throughput: both engines)")
        overhead.print()
        workload = PrefixWorkload(await _chars_per_token(a), random.Random(7))
        policies = await _policies(urls, args, workload)
        policies.print()
    finally:
        for engine in engines:
            engine.stop()
    return {"overhead": overhead.ratios(), "policies": policies.ratios(), "model": vars(args)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the bench)")
    parser.add_argument("--json", type=Path, help="also write the ratios to this file")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size of the random model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random model")
    args = parser.parse_args()
    args.rounds = 1 if args.quick else 2
    args.count = 20 if args.quick else 100
    args.c16_seconds = 4.0 if args.quick else 8.0
    args.capacity_seconds = 5.0 if args.quick else 12.0
    args.policy_seconds = 8.0 if args.quick else 30.0
    result = asyncio.run(main_async(args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
    print(f"\n[bench] ratios: {json.dumps(result, default=str)}")


if __name__ == "__main__":
    main()
