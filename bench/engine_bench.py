"""Engine settings: relative effects of the QwenDeployment engine fields on the real vLLM CPU engine.

Every engine runs the flags the operator renders for a spec (review() and test_engine_args, as the
real-process tests do), differing only in the field under test; each has one unbound thread and they are
measured one after another, interleaved round by round, with the same arrivals for every variant:
  1. enableChunkedPrefill and maxNumBatchedTokens: short streamed requests (Poisson) while long prompts
     (~800 tokens, Poisson at about half of one engine's prefill capacity) arrive; TTFT of the short ones
     (p50, p99) and of the long ones (p50), for chunked prefill at 2048 tokens (the baseline), chunked
     prefill off at 2048, and chunked prefill at 256.
  2. enablePrefixCaching: a shared-prefix workload (8 prompts of ~600 tokens, new ones every run, each
     sent once first, then each request one of them and a new question), 4 clients in a closed loop;
     TTFT p50/p99 and throughput with prefix caching on (the baseline) and off.
At most three engines run at once: the first comparison's three, then the baseline and the one without
prefix caching. Only ratios carry over to GPUs; the absolute numbers are a random model on one CPU core.

Not a pass/fail test. Usage: .venv/bin/python bench/engine_bench.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from qwen_devtools.realparts.load import (
    SENTENCES,
    Body,
    Target,
    chars_per_token,
    closed_loop,
    open_loop,
    send_all,
    token_ids,
)
from qwen_operator.api.review import review
from qwen_operator.versions import VLLM

SCENARIO = "engine settings"
LONG_TOKENS = 800  # within the engines' 1024-token context with the answer, whatever the estimate
PREFIX_TOKENS = 600
PREFIXES = 8
PREFIX_CLIENTS = 4
LONG_LOAD = 0.5  # long-prompt arrivals as a share of one engine's prefill capacity
SHORT_RATE = 8.0  # short requests per second
#: Added to the rendered flags, like the context length: no torch.compile warm-up (an engine starts in
#: about a minute instead of two or three on 2 cores); the settings under test are the scheduler's.
MACHINE_ARGS = ["--enforce-eager"]


@dataclass(frozen=True)
class Setting:
    """Engine fields of one variant."""

    chunked_prefill: bool = True
    batched_tokens: int = 2048
    prefix_caching: bool = True


BASELINE = Setting()
CHUNKING = {
    "chunked 2048": BASELINE,
    "unchunked 2048": Setting(chunked_prefill=False),
    "chunked 256": Setting(batched_tokens=256),
}
CACHING = {"prefix cache on": BASELINE, "prefix cache off": Setting(prefix_caching=False)}


def engine_args(setting: Setting) -> list[str]:
    """The engine flags the operator renders for a QwenDeployment with these fields (machine flags off)."""
    engine = {
        "maxNumBatchedTokens": setting.batched_tokens,
        "enableChunkedPrefill": setting.chunked_prefill,
        "enablePrefixCaching": setting.prefix_caching,
    }
    body = cpu_qwendeployment(engine, name="bench", namespace="bench")
    rev = review(body)
    if not rev.plan.fits:
        raise SystemExit(f"the bench's QwenDeployment does not fit: {rev.plan}")
    return test_engine_args(rev.command)


def _spawn(model: Path, setting: Setting, log_dir: Path) -> Proc:
    # Unbound (one thread each): engines starting side by side spread over the cores, and the variants,
    # measured one at a time, each get whichever core is free.
    return spawn_engine(
        model,
        extra_args=[*engine_args(setting), *MACHINE_ARGS],
        env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
        log_dir=log_dir,
    )


def _ready(procs: Sequence[Proc]) -> None:
    for proc in procs:  # three starting side by side on 2 cores take longer than one alone
        wait_ready(proc, "/health", 2 * ENGINE_START_SECONDS)


def _target(engine: Proc) -> Target:
    return lambda: (f"{engine.url}/v1/completions", {})


class Prompts:
    """Request bodies: prompts of a given token length built from the tokenizer's own sentences, each one
    unique from its first token (tag first) so that no run reuses another's cached prefix; answers of
    plain words (allowed_token_ids), so that every token is a chunk with text and TTFT is the first
    token's time, and ignore_eos, so that every answer is equally long."""

    def __init__(self, chars_per_token: float, allowed_tokens: list[int]) -> None:
        self.chars_per_token = chars_per_token
        self.allowed_tokens = allowed_tokens
        self.rng = random.Random(7)
        self.serial = itertools.count()

    def text(self, tokens: int, tag: str) -> str:
        words = f"[{tag} {next(self.serial)}]"
        while len(words) < tokens * self.chars_per_token:
            words += " " + self.rng.choice(SENTENCES)
        return words[: int(tokens * self.chars_per_token)]

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        return {
            "model": SERVED_MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "allowed_token_ids": self.allowed_tokens,
            "stream": True,
        }

    def long(self) -> Body:
        return lambda: self.body(self.text(LONG_TOKENS, "long"), 8)

    def short(self) -> Body:
        serial = itertools.count()
        return lambda: self.body(f"Hello there, request {next(serial)}", 4)

    def shared_prefix(self, tag: str) -> tuple[list[dict[str, Any]], Body]:
        """One request per new prefix (to send first: the steady state of a shared system prompt is that
        it was seen before), and the workload: a random prefix and a new question."""
        prefixes = [self.text(PREFIX_TOKENS, f"{tag} system prompt {i}") for i in range(PREFIXES)]
        serial = itertools.count()

        def body(prefix: str | None = None) -> dict[str, Any]:
            prefix = prefix or self.rng.choice(prefixes)
            return self.body(f"{prefix}\nQuestion {next(serial)}: what next?", 8)

        return [body(prefix) for prefix in prefixes], body


async def _prefill_seconds(engine: Proc, prompts: Prompts) -> float:
    """Median time to first token of a long prompt alone on the baseline engine."""
    run = await closed_loop(_target(engine), prompts.long(), users=1, seconds=3.0)
    return statistics.median(s.ttft for s in run.ok() if s.ttft is not None)


async def _chunking(
    engines: dict[str, Proc], prompts: Prompts, args: argparse.Namespace
) -> tuple[Comparison, str]:
    prefill = await _prefill_seconds(engines["chunked 2048"], prompts)
    long_rate = LONG_LOAD / prefill
    args.notes.append(
        f"chunked prefill: a long prompt's prefill alone takes {prefill * 1000:.0f} ms on the baseline; long "
        f"prompts arrive at {long_rate:.1f}/s ({LONG_LOAD:.0%} of that), short ones (4 tokens) at "
        f"{SHORT_RATE:g}/s, {args.chunk_seconds:g} s per variant and round"
    )
    print(
        f"[bench] 1. chunked prefill: long prompts at {long_rate:.1f}/s, short at {SHORT_RATE:g}/s",
        flush=True,
    )
    measures = [
        ttft_ms(50, "short TTFT", tag="short"),
        ttft_ms(99, "short TTFT", tag="short"),
        ttft_ms(50, "long-prompt TTFT", tag="long"),
    ]
    comparison = Comparison("while long prompts arrive", list(engines), measures)

    async def one_round(round_no: int) -> None:
        for name in _rotated(list(engines), round_no):
            target = _target(engines[name])
            streams = {
                "long": (long_rate, target, prompts.long()),
                "short": (SHORT_RATE, target, prompts.short()),
            }
            comparison.record(name, await open_loop(streams, args.chunk_seconds, seed=round_no))

    why = await repeat_rounds(one_round, [comparison], args.min_rounds, args.max_rounds, args.chunk_budget)
    return comparison, why


async def _caching(
    engines: dict[str, Proc], prompts: Prompts, args: argparse.Namespace
) -> tuple[Comparison, str]:
    print(f"[bench] 2. prefix caching: {PREFIXES} shared prefixes, {PREFIX_CLIENTS} clients", flush=True)
    args.notes.append(
        f"prefix caching: {PREFIXES} prefixes of ~{PREFIX_TOKENS} tokens, new for every run and each sent "
        f"once before it (untimed), 8 tokens generated; {PREFIX_CLIENTS} clients in a closed loop, "
        f"{args.prefix_seconds:g} s per variant and round"
    )
    comparison = Comparison("shared prefixes", list(engines), [ttft_ms(50), ttft_ms(99), THROUGHPUT])

    async def one_round(round_no: int) -> None:
        for name in _rotated(list(engines), round_no):
            first, body = prompts.shared_prefix(f"{name} {round_no}")
            await send_all(_target(engines[name]), first)
            run = await closed_loop(
                _target(engines[name]), body, PREFIX_CLIENTS, args.prefix_seconds, ramp=0.5
            )
            comparison.record(name, run)

    why = await repeat_rounds(one_round, [comparison], args.min_rounds, args.max_rounds, args.prefix_budget)
    return comparison, why


def _rotated(names: list[str], round_no: int) -> list[str]:
    """The variants in a round's order: each goes first in turn."""
    return names[round_no % len(names) :] + names[: round_no % len(names)]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="qwen-engine-bench-"))
    logs = work / "logs"
    print(f"[bench] {SCENARIO}: engine logs under {work}", flush=True)
    model = bench_model(args.hidden, args.layers)
    args.notes = [
        f"vLLM CPU engine (vllm-cpu {VLLM}), random Qwen3 (hidden {args.hidden}, {args.layers} layers), "
        f"maxModelLen 1024, maxNumSeqs 8, one thread; flags as rendered (plus {' '.join(MACHINE_ARGS)}), "
        "e.g. the baseline: " + " ".join(engine_args(BASELINE))
    ]
    engines = {name: _spawn(model, setting, logs) for name, setting in CHUNKING.items()}
    try:
        print(f"[bench] starting {len(engines)} engines (a minute or two)", flush=True)
        _ready(list(engines.values()))
        print(f"[bench] engines ready at {time.monotonic() - started:.0f} s", flush=True)
        baseline = engines["chunked 2048"]
        words = sorted(set(await token_ids(baseline.url, SERVED_MODEL, SENTENCES[0])))
        prompts = Prompts(await chars_per_token(baseline.url, SERVED_MODEL), words)
        chunking, chunking_why = await _chunking(engines, prompts, args)
        for name in list(CHUNKING)[1:]:  # at most three engines at once
            engines.pop(name).stop()
        engines |= {"prefix cache off": _spawn(model, CACHING["prefix cache off"], logs)}
        print("[bench] starting the engine without prefix caching", flush=True)
        _ready(list(engines.values()))
        print(f"[bench] engine ready at {time.monotonic() - started:.0f} s", flush=True)
        cached = {"prefix cache on": engines["chunked 2048"], "prefix cache off": engines["prefix cache off"]}
        caching, caching_why = await _caching(cached, prompts, args)
    finally:
        for engine in engines.values():
            engine.stop()
    comparisons = [chunking, caching]
    notes = [
        *args.notes,
        f"chunked prefill: {chunking_why}; prefix caching: {caching_why}",
        *_error_notes(comparisons),
    ]
    print(f"\n{SCENARIO}: ratios to chunked prefill at 2048 batched tokens with prefix caching")
    for comparison in comparisons:
        comparison.print()
    for note in notes:
        print(f"   - {note}")
    title = "Engine settings: chunked prefill and maxNumBatchedTokens, prefix caching (relative effects, CPU)"
    return write_report(args.json, SCENARIO, title, time.monotonic() - started, comparisons, notes)


def _error_notes(comparisons: Sequence[Comparison]) -> list[str]:
    errors = {v: c.pooled(v).errors for c in comparisons for v in c.variants}
    return [f"failed requests per variant: {json.dumps(errors)}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of the scenario (engine starts included)"
    )
    parser.add_argument("--json", type=Path, help="write the scenario's JSON (bench suite contract) here")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the random model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random model")
    args = parser.parse_args()
    args.chunk_seconds = 4.0 if args.quick else 8.0
    args.prefix_seconds = 3.0 if args.quick else 6.0
    args.min_rounds, args.max_rounds = (1, 1) if args.quick else (3, 5)
    args.chunk_budget = 30.0 if args.quick else 90.0
    args.prefix_budget = 20.0 if args.quick else 60.0
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
