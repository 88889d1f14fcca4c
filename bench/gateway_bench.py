"""Gateway benchmark: what the gateway costs, and what cache-aware routing buys. Prints ratios.

Two real vLLM CPU engines serve a small random Qwen3 model; the gateway runs exactly as the operator
renders it (nginx.conf, run-nginx.sh, vllm-router's command line). Everything is measured in one run on
the same engines, with the compared variants interleaved, so machine noise hits both sides alike:

1. Latency added by the gateway: small completions one at a time (p50, p99), time to first token of
   streamed completions (p50, p99), and throughput at 16 concurrent requests, gateway against calling
   the engines directly (client-side round robin).
2. Routing policy near saturation: requests that share long prompt prefixes (a dozen "system prompts"),
   arriving as a Poisson stream at 90% of the measured capacity; TTFT p50/p99 of cache_aware (the
   default) against round_robin. The engines' KV cache is sized so that all prefixes fit on one engine
   only if each engine sees about half of them.

Not a pass/fail test. Usage: .venv/bin/python bench/gateway_bench.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import realparts  # noqa: E402  (the tests' real-process helpers)
from qwen_operator.api.review import Review, review  # noqa: E402

MODEL = realparts.SERVED_MODEL
API_KEY = "sk-bench-0123456789abcdef"
#: Engine KV cache in 16-token blocks: room for the running batch plus about half the prefixes.
KV_BLOCKS = 448
PREFIX_GROUPS = 12
PREFIX_TOKENS = 480
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Qwen3 serves chat completions on vLLM.",
    "Kubernetes operators reconcile desired state.",
    "Hello, world! 0123456789 {}[]():;,.",
]


def _cr(policy: str) -> dict[str, Any]:
    return {
        "apiVersion": "inference.qwenops.dev/v1alpha1",
        "kind": "QwenDeployment",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": {
            "model": {"name": MODEL},
            "gpu": {"type": "A100-80GB"},
            "parallelism": {"tensor": 2},
            "engine": {"maxModelLen": 1024, "maxNumSeqs": 8, "maxNumBatchedTokens": 2048},
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
        values = sorted(s.ttft if ttft else s.latency for s in self.ok() if not ttft or s.ttft is not None)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q / 100 * len(values)))]  # type: ignore[return-value]

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
                     seconds: float, rng: random.Random) -> Run:  # fmt: skip
    """Poisson arrivals at `rate` per second for `seconds`, whatever the latency (no coordinated omission)."""
    run = Run(label)
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
            next_at += rng.expovariate(rate)
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
    text = realparts.http_get(f"{engine}/metrics", timeout=5)[1]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


# --- orchestration ---------------------------------------------------------------------------------


def _start_engines(model: Path, rev: Review, count: int, log_dir: Path) -> list[realparts.Proc]:
    extra = [*realparts.test_engine_args(rev.command), "--num-gpu-blocks-override", str(KV_BLOCKS)]
    # One core per engine, as each replica would have its own GPU.
    engines = [
        realparts.spawn_engine(
            model, extra_args=extra, env={"VLLM_CPU_OMP_THREADS_BIND": str(i % 2)}, log_dir=log_dir
        )  # fmt: skip
        for i in range(count)
    ]
    try:
        for engine in engines:
            realparts.wait_ready(engine, "/health", realparts.ENGINE_START_SECONDS)
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    return engines


def _fmt(value: float, unit: str = "ms") -> str:
    return f"{value * 1000:8.1f} {unit}" if unit == "ms" else f"{value:8.1f} {unit}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:6.2f}x" if b else "   n/a"


async def _overhead(engines: Sequence[str], gateway_url: str, rounds: int, count: int) -> dict[str, Run]:
    small = {"model": MODEL, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True}
    stream = {**small, "max_tokens": 16, "stream": True}
    runs: dict[str, Run] = {}
    targets = {"direct": _direct(engines), "gateway": _gateway(gateway_url)}
    for _ in range(rounds):
        for name, target in targets.items():
            for kind, body in (("latency", small), ("ttft", stream)):
                run = await _sequential(name, target, body, count)
                runs.setdefault(f"{name}/{kind}", Run(name)).samples += run.samples
            run = await _closed_loop(name, target, lambda: small, users=16, seconds=6)
            merged = runs.setdefault(f"{name}/c16", Run(name))
            merged.samples += run.samples
            merged.seconds += run.seconds
    return runs


def _print_overhead(runs: dict[str, Run]) -> dict[str, float]:
    d, g = runs["direct/latency"], runs["gateway/latency"]
    dt, gt = runs["direct/ttft"], runs["gateway/ttft"]
    dc, gc = runs["direct/c16"], runs["gateway/c16"]
    print("\n1. Latency added by the gateway (nginx + vllm-router), same engines, interleaved rounds")
    print(f"   {'':24} {'direct':>11} {'gateway':>11} {'ratio':>8} {'added':>10}")
    rows = [
        ("completion p50", d.pct(50), g.pct(50)),
        ("completion p99", d.pct(99), g.pct(99)),
        ("stream TTFT p50", dt.pct(50, ttft=True), gt.pct(50, ttft=True)),
        ("stream TTFT p99", dt.pct(99, ttft=True), gt.pct(99, ttft=True)),
    ]
    out: dict[str, float] = {}
    for name, a, b in rows:
        print(f"   {name:24} {_fmt(a)} {_fmt(b)} {_ratio(b, a)} {_fmt(b - a)}")
        out[name] = b / a if a else float("nan")
    print(
        f"   {'throughput, 16 at once':24} {_fmt(dc.throughput, 'r/s')} {_fmt(gc.throughput, 'r/s')}"
        f" {_ratio(gc.throughput, dc.throughput)}"
    )
    out["throughput c16"] = gc.throughput / dc.throughput if dc.throughput else float("nan")
    errors = {k: r.errors for k, r in runs.items() if r.errors}
    if errors:
        print(f"   errors: {errors}")
    return out


async def _policies(engines: Sequence[str], model_rev: Any, args: argparse.Namespace,
                    workload: PrefixWorkload, rng: random.Random) -> dict[str, Any]:  # fmt: skip
    # Capacity with the baseline policy, on fresh prefixes.
    with realparts.start_gateway(review(_cr("round_robin")), engines, {"bench": API_KEY}) as stack:
        workload.fresh("capacity")
        cap = await _closed_loop(
            "capacity", _gateway(stack.url), workload.body, users=16, seconds=args.capacity_seconds
        )
    rate = 0.9 * cap.throughput
    print(f"\n2. Routing policy near saturation: {PREFIX_GROUPS} shared prefixes of ~{PREFIX_TOKENS} tokens,")
    print(f"   16-token answers; capacity with round_robin {cap.throughput:.1f} req/s, Poisson arrivals at")
    print(
        f"   {rate:.1f} req/s (90%) for {args.policy_seconds:.0f} s per run, {args.rounds} interleaved rounds"
    )
    runs: dict[str, Run] = {}
    hits: dict[str, list[float]] = {}
    for round_no in range(args.rounds):
        for policy in ("round_robin", "cache_aware"):
            with realparts.start_gateway(review(_cr(policy)), engines, {"bench": API_KEY}) as stack:
                workload.fresh(f"{policy}-{round_no}")
                before = _prefix_hits(engines)
                run = await _open_loop(
                    policy, _gateway(stack.url), workload.body, rate, args.policy_seconds, rng
                )
                after = _prefix_hits(engines)
            merged = runs.setdefault(policy, Run(policy))
            merged.samples += run.samples
            merged.seconds += run.seconds
            h = hits.setdefault(policy, [0.0, 0.0])
            h[0] += after[0] - before[0]
            h[1] += after[1] - before[1]
    rr, ca = runs["round_robin"], runs["cache_aware"]
    print(f"   {'':24} {'round_robin':>11} {'cache_aware':>11} {'ratio':>8}")
    out: dict[str, Any] = {"capacity_rps": cap.throughput, "rate_rps": rate}
    for name, q in (("TTFT p50", 50), ("TTFT p90", 90), ("TTFT p99", 99)):
        a, b = rr.pct(q, ttft=True), ca.pct(q, ttft=True)
        print(f"   {name:24} {_fmt(a)} {_fmt(b)} {_ratio(b, a)}")
        out[name] = b / a if a else float("nan")
    for name, q in (("latency p99", 99),):
        a, b = rr.pct(q), ca.pct(q)
        print(f"   {name:24} {_fmt(a)} {_fmt(b)} {_ratio(b, a)}")
    print(f"   {'throughput':24} {_fmt(rr.throughput, 'r/s')} {_fmt(ca.throughput, 'r/s')}")
    rates = {p: (h[0] / h[1] if h[1] else 0.0) for p, h in hits.items()}
    print(f"   {'prefix cache hit rate':24} {rates['round_robin']:10.0%} {rates['cache_aware']:11.0%}")
    print(f"   {'errors':24} {rr.errors:11d} {ca.errors:11d}")
    out["prefix_hit_rate"] = rates
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(7)
    work = Path(tempfile.mkdtemp(prefix="qwen-gateway-bench-"))
    print(f"[bench] model, engines and logs under {work}", flush=True)
    model = realparts.build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers)
    rev = review(_cr("cache_aware"))
    t0 = time.monotonic()
    engines = _start_engines(model, rev, 2, work / "logs")
    print(f"[bench] 2 engines ready in {time.monotonic() - t0:.0f} s", flush=True)
    urls = [e.url for e in engines]
    try:
        with realparts.start_gateway(rev, urls, {"bench": API_KEY}) as stack:
            # Warm up both paths (connections, tokenizer caches).
            await _sequential("warm", _direct(urls), {"model": MODEL, "prompt": "hi", "max_tokens": 2}, 20)
            await _sequential(
                "warm", _gateway(stack.url), {"model": MODEL, "prompt": "hi", "max_tokens": 2}, 20
            )
            overhead = _print_overhead(await _overhead(urls, stack.url, args.rounds, args.count))
        workload = PrefixWorkload(await _chars_per_token(urls[0]), rng)
        policies = await _policies(urls, rev, args, workload, rng)
    finally:
        for engine in engines:
            engine.stop()
    return {
        "overhead_ratios": overhead,
        "policies": policies,
        "model": {"hidden": args.hidden, "layers": args.layers},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the bench)")
    parser.add_argument("--json", type=Path, help="also write the ratios to this file")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size of the random model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random model")
    args = parser.parse_args()
    args.rounds = 1 if args.quick else 2
    args.count = 20 if args.quick else 60
    args.capacity_seconds = 5.0 if args.quick else 12.0
    args.policy_seconds = 8.0 if args.quick else 30.0
    result = asyncio.run(main_async(args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    print(f"\n[bench] ratios: {json.dumps(result)}")


if __name__ == "__main__":
    main()
