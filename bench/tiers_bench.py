"""Tiered serving (docs/gateway.md, "Tiers"): a mixed stream of short and long requests sent as `model:
auto` through the gateway, whose alias sends the short ones (maxPromptBytes) to a small Qwen3 tier and the
rest to the 32B, against the same requests all sent to the 32B through the same gateway. Reports the
short requests' streamed TTFT (p50, p99), the long ones' TTFT p50 (what tiering costs them) and the
throughput of the whole, tiered vs all on the 32B, and which engine answered (each engine's own
vllm:request_success_total).

The gateway is the one the operator renders for two QwenDeployments: `chat` (Qwen/Qwen3-32B, whose
gateway has the tier qwen3-8b -> QwenDeployment `small` and the alias auto) and `small` (Qwen/Qwen3-8B
served as qwen3-8b), run on loopback with the tier's own vllm-router (qwen_devtools.realparts.gateway).
Both variants have two engines: tiered, one small and one 32B; all-32B, two 32B (the same number of
engine pods; on GPUs the tiered pair is also the cheaper, an 8B on one H100 against the 32B's two).
Each variant has its own gateway process set with the same rendered configuration, differing only in
the engines its main router fronts.

Two parts:
  sim  SIMULATED engines (llm-d-inference-sim): the 32B with H100_32B, the small tier with H100_8B
       (qwen_devtools/realparts/sim.py: both cited from the simulator's docs/latency-profiles.md, H100
       column, rows 30-34B TP=2 and 7-8B, fixed before the run). Its tokens are words.
  cpu  real vLLM CPU engines, the 32B a bigger random Qwen3 than the small tier (hidden 1024, 8 layers
       against 256, 4 by default), with the engine flags each CR renders (plus --enforce-eager): the
       difference in speed is the machine's, measured before the rounds (each engine alone, one request
       at a time) and printed.
Workload: closed loop, each request short (70 %: a one-sentence prompt, 8 tokens generated) or long (a
prompt of many sentences, more tokens generated), short and long in the same seeded order for both
variants, every prompt distinct (a serial first: no prefix-cache hit in either); streamed chat
completions, ignore_eos. Rounds interleave the two variants (order alternating) until the
ratios settle or the budget is spent.

Not a pass/fail test. Usage: .venv/bin/python bench/tiers_bench.py [--quick] [--only sim|cpu] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway_bench import API_KEY, SERVED, WORDS, _round_robin, _stopping

from qwen_devtools.net import metric_sum
from qwen_devtools.procs import Proc, wait_ready
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
from qwen_devtools.realparts.load import SENTENCES, Body, Run, closed_loop, token_ids
from qwen_devtools.realparts.sim import H100_8B, H100_32B, SIM_VERSION, start_sims
from qwen_operator.api.review import Review, review
from qwen_operator.versions import VLLM, VLLM_ROUTER

SCENARIO = "tiers"
SMALL = "qwen3-8b"  # the small tier's served model name
ALIAS = "auto"
SHORT_SHARE = 0.7
#: The alias rule: a body of at most this many bytes goes to the small tier. Short bodies here are about
#: 250 bytes, long ones above 1,500.
MAX_PROMPT_BYTES = 1000
SHORT_TOKENS = 8
#: Variants, the baseline first: ratios are tiered / all-32B.
VARIANTS = ("all-32B", "tiered")
MAX_NUM_SEQS = {"sim": 32, "cpu": 8}


def _chat_cr(max_num_seqs: int) -> dict[str, Any]:
    """`chat`: Qwen3-32B whose gateway fronts `small` as the tier qwen3-8b and routes `auto` by size;
    admission limits far above the load, so that the gateway never queues, refuses or spills."""
    gateway = {
        "apiKeysSecret": "bench-keys",
        "replicas": 1,
        "rateLimit": {"requestsPerMinute": 1_000_000, "burst": 100_000},
        "maxConcurrentRequests": 512,
        "queueSize": 256,
        "tiers": [
            {
                "name": SMALL,
                "deploymentRef": {"name": "small"},
                "maxConcurrentRequests": 512,
                "queueSize": 256,
            }
        ],
        "aliases": [
            {
                "name": ALIAS,
                "rules": [{"model": SMALL, "maxPromptBytes": MAX_PROMPT_BYTES}],
                "default": SERVED_MODEL,
            }
        ],
    }
    return cpu_qwendeployment(
        {"maxNumSeqs": max_num_seqs}, gateway, replicas=2, gpu="H100-80GB", name="chat", namespace="bench"
    )


def _small_cr(max_num_seqs: int) -> dict[str, Any]:
    """`small`: Qwen3-8B served as qwen3-8b on one H100 (its own gateway, as in docs/gateway.md)."""
    body = cpu_qwendeployment(
        {"maxNumSeqs": max_num_seqs}, {"replicas": 1}, gpu="H100-80GB", name="small", namespace="bench"
    )
    body["spec"]["model"] = {"name": "Qwen/Qwen3-8B", "servedModelName": SMALL}
    body["spec"]["parallelism"] = {"tensor": 1}
    return body


#: Every prompt's serial, across variants, rounds and parts.
_SERIALS = itertools.count()


@dataclass(frozen=True)
class Workload:
    """The mixed stream: how long a long prompt is (sentences) and how many tokens it gets."""

    long_sentences: int
    long_tokens: int
    allowed_tokens: list[int] | None = None  # cpu: plain words only, so every token is a chunk with text

    def prompt(self, serial: int, long: bool) -> str:
        # A serial unique in the run, first: no two prompts share a prefix block, so no prefix cache helps
        # either variant (the same serial again, in a later round or the other variant, would be cached).
        body = " ".join(itertools.islice(itertools.cycle(SENTENCES), self.long_sentences if long else 1))
        return f"Request {serial}: {body}"

    def body(self, model: str, seed: int) -> Body:
        """Bodies in the same seeded order of short and long, whatever the model asked for; every prompt
        distinct."""
        rng = random.Random(seed)
        serial = _SERIALS
        extra = {"allowed_token_ids": self.allowed_tokens} if self.allowed_tokens else {}

        def body() -> dict[str, Any]:
            long = rng.random() >= SHORT_SHARE
            return {
                "model": model,
                "messages": [{"role": "user", "content": self.prompt(next(serial), long)}],
                "max_tokens": self.long_tokens if long else SHORT_TOKENS,
                "ignore_eos": True,
                "stream": True,
                **extra,
            }

        return body

    def check(self) -> None:
        """The alias rule must tell the two kinds apart by size (the body as the client serialises it)."""
        sizes: dict[str, int] = {}
        make = self.body(ALIAS, seed=0)
        while len(sizes) < 2:
            sent = make()
            sizes[_kind(sent)] = len(json.dumps(sent).encode())
        assert sizes["short"] <= MAX_PROMPT_BYTES < sizes["long"], sizes


def _kind(body: dict[str, Any]) -> str:
    return "short" if body["max_tokens"] == SHORT_TOKENS else "long"


@dataclass
class Part:
    """One set of engines (small tier, 32B, 32B) and the two gateways in front of them."""

    name: str  # sim or cpu
    engines: dict[str, str]  # label -> URL
    gateways: dict[str, GatewayStack]  # variant -> its gateway
    workload: Workload
    users: int
    comparison: Comparison | None = None
    why: str = ""
    #: Per variant: requests each engine finished (its own counter), and short requests sent.
    answered: dict[str, dict[str, float]] = field(default_factory=dict)
    sent_short: dict[str, int] = field(default_factory=dict)
    #: The engines alone, one request at a time: median latency in ms by (kind, engine label).
    alone: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workload.check()

    def model(self, variant: str) -> str:
        return ALIAS if variant == "tiered" else SERVED_MODEL

    def counts(self) -> dict[str, float]:
        return {label: metric_sum(f"{url}/metrics", SERVED) for label, url in self.engines.items()}


async def _alone(part: Part, seconds: float) -> None:
    """Each kind of request on the small engine and on a 32B engine alone, one at a time: how much slower
    the 32B is per request here (on the simulated engines: what the cited timings make it)."""
    for kind, (label, url) in itertools.product(("short", "long"), list(part.engines.items())[:2]):
        model = SMALL if label.startswith(SMALL) else SERVED_MODEL
        make = part.workload.body(model, seed=1)

        def body(make: Body = make, kind: str = kind) -> dict[str, Any]:
            while _kind(sent := make()) != kind:
                pass
            return sent

        run = await closed_loop(_round_robin([url]), body, 1, seconds)
        part.alone[(kind, label)] = statistics.median(s.latency for s in run.ok()) * 1000


async def _measure(part: Part, args: argparse.Namespace) -> None:
    measures = [
        ttft_ms(50, "short TTFT", "short"),
        ttft_ms(99, "short TTFT", "short"),
        ttft_ms(50, "long TTFT", "long"),
        THROUGHPUT,
    ]
    comparison = Comparison(f"{part.users} streams ({part.name})", VARIANTS, measures)
    targets = {
        v: _round_robin([part.gateways[v].url], lambda: {"Authorization": f"Bearer {API_KEY}"})
        for v in VARIANTS
    }
    part.answered = {v: dict.fromkeys(part.engines, 0.0) for v in VARIANTS}
    part.sent_short = dict.fromkeys(VARIANTS, 0)

    async def one_round(round_no: int) -> None:
        order = VARIANTS if round_no % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            before = part.counts()
            body = part.workload.body(part.model(variant), seed=round_no)
            run = await closed_loop(targets[variant], body, part.users, args.seconds, args.ramp, _kind)
            after = part.counts()
            for label in part.engines:
                part.answered[variant][label] += after[label] - before[label]
            part.sent_short[variant] += len(run.only("short").samples)
            comparison.record(variant, run)

    for variant in VARIANTS:  # connections, lazy initialisation, the routers' first health checks
        await closed_loop(targets[variant], part.workload.body(part.model(variant), seed=-1), 2, 1.0)
    budget = args.sim_budget if part.name == "sim" else args.budget
    part.why = await repeat_rounds(one_round, [comparison], args.min_rounds, args.max_rounds, budget)
    part.comparison = comparison


@contextlib.contextmanager
def _gateways(chat: Review, small_url: str, large_urls: list[str]) -> Iterator[dict[str, GatewayStack]]:
    """The same rendered gateway twice: tiered in front of the small engine and one 32B; all-32B in front
    of both 32B engines (its tier router fronts the small engine too, which no request reaches)."""
    keys = {"bench": API_KEY}
    with (
        start_gateway(chat, large_urls[:1], keys, tier_worker_urls=[[small_url]]) as tiered,
        start_gateway(chat, large_urls, keys, tier_worker_urls=[[small_url]]) as all_large,
    ):
        yield {"tiered": tiered, "all-32B": all_large}


def _labels() -> list[str]:
    return [f"{SMALL} #0", "32B #0", "32B #1"]


async def _sim_part(args: argparse.Namespace, logs: Path) -> Part:
    seqs = MAX_NUM_SEQS["sim"]
    with (
        start_sims(1, 4096, seqs, 4096, H100_8B, logs, model=SMALL) as small,
        start_sims(2, 4096, seqs, 4096, H100_32B, logs) as large,
    ):
        urls = [small[0].url, *(s.url for s in large)]
        with _gateways(review(_chat_cr(seqs)), urls[0], urls[1:]) as stacks:
            part = Part(
                "sim", dict(zip(_labels(), urls, strict=True)), stacks, Workload(40, 64), args.sim_users
            )
            await _alone(part, args.alone_seconds)
            await _measure(part, args)
    return part


def _engine(rev: Review, model: Path, logs: Path, served: str) -> Proc:
    extra = [*test_engine_args(rev.command), "--enforce-eager"]
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return spawn_engine(model, extra_args=extra, env=env, log_dir=logs, served_model=served)


async def _cpu_part(args: argparse.Namespace, logs: Path) -> Part:
    started = time.monotonic()
    seqs = MAX_NUM_SEQS["cpu"]
    chat, small = review(_chat_cr(seqs)), review(_small_cr(seqs))
    assert small.plan.fits, small.plan.errors
    small_model, large_model = bench_model(*args.small), bench_model(*args.large)
    engines = [
        _engine(small, small_model, logs, SMALL),
        *(_engine(chat, large_model, logs, SERVED_MODEL) for _ in range(2)),
    ]
    with _stopping(engines):
        print("[bench] starting 3 vLLM CPU engines (a few minutes on 2 cores)", flush=True)
        for engine in engines:
            wait_ready(engine, "/health", ENGINE_START_SECONDS)
        print(f"[bench] engines ready in {time.monotonic() - started:.0f} s", flush=True)
        urls = [e.url for e in engines]
        allowed = sorted(set(await token_ids(urls[0], SMALL, WORDS)))
        with _gateways(chat, urls[0], urls[1:]) as stacks:
            workload = Workload(30, 32, allowed)
            part = Part("cpu", dict(zip(_labels(), urls, strict=True)), stacks, workload, args.cpu_users)
            await _alone(part, args.alone_seconds * 2)
            await _measure(part, args)
    return part


def _alone_rows(part: Part) -> list[dict[str, Any]]:
    """Per kind: the 32B's latency alone over the small tier's (the baseline)."""
    rows = []
    small, large = _labels()[:2]
    for kind in ("short", "long"):
        base = part.alone[(kind, small)]
        for label in (small, large):
            value = part.alone[(kind, label)]
            rows.append(
                {"measure": f"{kind} request alone, latency ({part.name})", "variant": label,
                 "value": round(value, 1), "unit": "ms", "baseline": None if label == small else small,
                 "ratio": None if label == small else round(value / base, 3), "spread": None}
            )  # fmt: skip
    return rows


def _part_notes(part: Part) -> list[str]:
    assert part.comparison is not None
    answered = "; ".join(
        f"{v}: "
        + ", ".join(f"{label} {int(n)}" for label, n in part.answered[v].items())
        + f" (short requests sent {part.sent_short[v]})"
        for v in VARIANTS
    )
    pooled: dict[str, Run] = {v: part.comparison.pooled(v) for v in VARIANTS}
    errors = {v: run.errors for v, run in pooled.items()}
    small, large = _labels()[:2]
    alone = ", ".join(
        f"{kind} {part.alone[(kind, large)]:.0f} ms on the 32B vs {part.alone[(kind, small)]:.0f} ms on "
        f"{SMALL} ({part.alone[(kind, large)] / part.alone[(kind, small)]:.2f}x)"
        for kind in ("short", "long")
    )
    return [
        f"{part.name}: {part.why}; {part.users} closed-loop streams; errors per variant {errors}",
        f"{part.name}: requests each engine answered (its own {SERVED}), per variant: {answered}",
        f"{part.name}: each engine alone, median latency of one request at a time: {alone}",
    ]


def _notes(args: argparse.Namespace, parts: list[Part]) -> list[str]:
    names = [p.name for p in parts]
    notes = [
        f"gateway: nginx + vllm-router {VLLM_ROUTER} as rendered for QwenDeployment chat (Qwen3-32B) with "
        f"tier {SMALL} (QwenDeployment small, Qwen3-8B) and alias {ALIAS}: body <= {MAX_PROMPT_BYTES} bytes "
        f"-> {SMALL}, else Qwen/Qwen3-32B; tiered: model {ALIAS}, engines {SMALL} + 1 x 32B; all-32B: model "
        "Qwen/Qwen3-32B, engines 2 x 32B (same engine count; on GPUs 3 H100s against 4)",
        f"workload: closed loop, {SHORT_SHARE:.0%} short (1 sentence, {SHORT_TOKENS} tokens generated), the "
        "rest long (sim: 40 sentences, 64 tokens; cpu: 30 sentences, 32 tokens), in the same seeded order "
        "per variant and round, every prompt distinct (no prefix-cache hit); per variant and round "
        f"{args.seconds:g} s after a {args.ramp:g} s ramp",
    ]
    if "sim" in names:
        notes += [
            f"sim: SIMULATED engines, llm-d-inference-sim {SIM_VERSION}, maxNumSeqs {MAX_NUM_SEQS['sim']}; "
            f"32B: {H100_32B.cite()}",
            f"sim: {SMALL}: {H100_8B.cite()}",
        ]
    if "cpu" in names:
        notes.append(
            f"cpu: real vLLM CPU engines (vllm-cpu {VLLM}), random Qwen3: {SMALL} hidden {args.small[0]}, "
            f"{args.small[1]} layers; 32B hidden {args.large[0]}, {args.large[1]} layers; flags as rendered "
            f"for each CR (maxNumSeqs {MAX_NUM_SEQS['cpu']}) plus --enforce-eager; one unbound thread each"
        )
    notes.append(
        "2 shared cores, other work running on the machine: ratios of variants interleaved in the same "
        "run, not absolute numbers, carry over"
    )
    return notes + [n for p in parts for n in _part_notes(p)]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="qwen-tiers-bench-"))
    print(f"[bench] {SCENARIO}: engine and gateway logs under {logs}", flush=True)
    parts = []
    if args.only in (None, "sim"):
        parts.append(await _sim_part(args, logs))
    if args.only in (None, "cpu"):
        parts.append(await _cpu_part(args, logs))
    notes = _notes(args, parts)
    print(f"\n{SCENARIO}: tiered (model {ALIAS}) vs all on the 32B, ratios tiered / all-32B")
    comparisons = [p.comparison for p in parts if p.comparison is not None]
    for comparison in comparisons:
        comparison.print()
    for note in notes:
        print(f"   - {note}")
    title = "Tiered serving: short requests' TTFT and throughput, tiered (model auto) vs all on the 32B"
    report = write_report(None, SCENARIO, title, time.monotonic() - started, comparisons, notes)
    report["rows"] += [row for p in parts for row in _alone_rows(p)]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of the scenario (a few minutes)")
    parser.add_argument("--only", choices=("sim", "cpu"), help="one part only")
    parser.add_argument("--json", type=Path, help="write the scenario's JSON (bench suite contract) here")
    parser.add_argument("--small", type=int, nargs=2, default=(256, 4), help="small tier: hidden, layers")
    parser.add_argument("--large", type=int, nargs=2, default=(1024, 8), help="32B tier: hidden, layers")
    args = parser.parse_args()
    args.seconds = 3.0 if args.quick else 8.0
    args.ramp = 0.5
    args.alone_seconds = 1.0 if args.quick else 3.0
    args.sim_users, args.cpu_users = 16, 4
    args.min_rounds, args.max_rounds = (1, 1) if args.quick else (3, 6)
    args.sim_budget = 30.0 if args.quick else 150.0
    args.budget = 60.0 if args.quick else 300.0
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
