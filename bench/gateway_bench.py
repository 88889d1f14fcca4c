"""Gateway overhead: what the project's gateway adds to streamed requests, against direct engine access,
vllm-router alone and the LiteLLM proxy, at 1, 16 and 64 concurrent streams. Prints ratios to direct.

Two real vLLM CPU engines serve a small random Qwen3 model with the engine flags the operator renders
(plus --enforce-eager, which only skips the torch.compile warm-up).
Streamed chat completions with short prompts (8 tokens generated), closed loop, to four variants:
  direct       the engines themselves, client-side round robin (a plain Service, minus kube-proxy)
  gateway      nginx + vllm-router exactly as the operator renders them (start_gateway), with an API key
               and the default routing policy
  vllm-router  the same router process and arguments, called on its own port (no nginx: no auth, no
               rate limit, no access log)
  litellm      the LiteLLM proxy (PyPI litellm, its own venv) with both engines as one load-balanced
               model list and a master key, so that it checks a key on every request as the gateway does
Within a round each concurrency level runs every variant in turn, the order rotating from round to round;
rounds repeat until the ratios settle or the time budget is spent. TTFT is the time to the first chunk
with generated text. Everything shares the machine's 2 cores, as a gateway shares a node.

Not a pass/fail test. Usage: .venv/bin/python bench/gateway_bench.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from qwen_devtools.procs import Proc, wait_ready
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
from qwen_devtools.realparts.gateway import start_gateway
from qwen_devtools.realparts.load import Body, Target, closed_loop, token_ids
from qwen_operator.api.review import Review, review
from qwen_operator.versions import VLLM, VLLM_ROUTER

SCENARIO = "gateway overhead"
API_KEY = "sk-bench-0123456789abcdef"
LITELLM_KEY = "sk-litellm-bench-0123456789abcdef"
STREAMS = (1, 16, 64)
GENERATED_TOKENS = 8
#: Engine batch per replica: 64 streams fit in two engines, so TTFT shows routing, not engine queueing.
MAX_NUM_SEQS = 32
WORDS = "The quick brown fox jumps over the lazy dog."  # what the model may say (allowed_token_ids)


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


def _chat_body(allowed_tokens: list[int]) -> Body:
    """Short streamed chat completions, each prompt distinct. ignore_eos makes every answer equally long;
    allowed_token_ids (plain words) makes every token a chunk with text, so that TTFT is the first token's
    time whatever the random model picks (a lone byte of a UTF-8 character would give no text yet)."""
    serial = itertools.count()
    return lambda: {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": f"Hello there, request {next(serial)}"}],
        "max_tokens": GENERATED_TOKENS,
        "ignore_eos": True,
        "allowed_token_ids": allowed_tokens,
        "stream": True,
    }


def _round_robin(base_urls: Sequence[str], headers: dict[str, str] | None = None) -> Target:
    cycle = itertools.cycle(f"{url}/v1/chat/completions" for url in base_urls)
    return lambda: (next(cycle), headers or {})


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


async def _measure(
    targets: dict[str, Target], body: Body, args: argparse.Namespace
) -> tuple[list[Comparison], str]:
    names = list(targets)
    measures = [ttft_ms(50, "streamed TTFT"), ttft_ms(99, "streamed TTFT"), THROUGHPUT]
    comparisons = {n: Comparison(f"{n} stream{'s' if n > 1 else ''}", names, measures) for n in STREAMS}

    async def one_round(round_no: int) -> None:
        order = names[round_no % len(names) :] + names[: round_no % len(names)]
        for streams in STREAMS:
            for name in order:
                run = await closed_loop(targets[name], body, streams, args.seconds, ramp=args.ramp)
                comparisons[streams].record(name, run)

    for name in names:  # first requests pay for connection set-up and lazy initialisation
        await closed_loop(targets[name], body, 4, 1.0)
    why = await repeat_rounds(
        one_round, list(comparisons.values()), args.min_rounds, args.max_rounds, args.budget
    )
    return list(comparisons.values()), why


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="qwen-gateway-bench-"))
    print(f"[bench] {SCENARIO}: engine and proxy logs under {work}", flush=True)
    model = bench_model(args.hidden, args.layers)
    rev = review(_cr())
    notes: list[str] = []
    with _stopping(_spawn_engines(model, rev, 2, work / "logs")) as engines:
        urls = [e.url for e in engines]
        proc = _spawn_litellm(urls, work / "logs", notes)  # starts while the engines load
        with _stopping([proc] if proc else []):
            print("[bench] starting 2 engines and LiteLLM (about a minute and a half)", flush=True)
            for engine in engines:
                wait_ready(engine, "/health", ENGINE_START_SECONDS)
            proxy = _wait_litellm(proc, notes)
            print(f"[bench] engines ready at {time.monotonic() - started:.0f} s", flush=True)
            with start_gateway(rev, urls, {"bench": API_KEY}) as stack:
                targets = {
                    "direct": _round_robin(urls),
                    "gateway": _round_robin([stack.url], {"Authorization": f"Bearer {API_KEY}"}),
                    "vllm-router": _round_robin([stack.router_url]),
                }
                if proxy:
                    targets["litellm"] = _round_robin([proxy.url], {"Authorization": f"Bearer {LITELLM_KEY}"})
                body = _chat_body(sorted(set(await token_ids(urls[0], SERVED_MODEL, WORDS))))
                comparisons, why = await _measure(targets, body, args)
    seconds = time.monotonic() - started
    notes = [*_notes(rev, args, comparisons, why), *notes]
    print(f"\n{SCENARIO}: streamed chat completions, ratios to direct (client-side round robin)")
    for comparison in comparisons:
        comparison.print()
    for note in notes:
        print(f"   - {note}")
    title = "Gateway overhead: streamed TTFT and throughput, gateway vs direct vs vllm-router vs LiteLLM"
    return write_report(args.json, SCENARIO, title, seconds, comparisons, notes)


def _notes(rev: Review, args: argparse.Namespace, comparisons: list[Comparison], why: str) -> list[str]:
    errors = {v: sum(c.pooled(v).errors for c in comparisons) for v in comparisons[0].variants}
    chunks = {v: round(statistics.mean(c.pooled(v).mean_chunks for c in comparisons), 1) for v in errors}
    return [
        f"2 vLLM CPU engines (vllm-cpu {VLLM}), random Qwen3 (hidden {args.hidden}, {args.layers} layers) "
        f"served as {SERVED_MODEL}, engine flags as rendered for maxNumSeqs {MAX_NUM_SEQS}, plus "
        "--enforce-eager; one unbound thread each",
        f"streamed chat completions, ~10-token prompts, {GENERATED_TOKENS} tokens generated (ignore_eos); "
        f"per variant and level: closed loop, clients started over {args.ramp:g} s, then {args.seconds:g} s",
        f"gateway: nginx + vllm-router {VLLM_ROUTER} as rendered, policy {rev.resource.spec.gateway.policy} "
        "(the default), API key checked by nginx; vllm-router: the same process on its own port",
        f"litellm: LiteLLM proxy {litellm.LITELLM_VERSION}, 1 worker, simple-shuffle over both engines, "
        "master key, no database",
        f"{why}; errors per variant {errors}; chunks with text per stream {chunks} (of "
        f"{GENERATED_TOKENS} tokens: vLLM merges tokens into one chunk when the reader lags)",
        "2 shared cores: engines, gateway, proxy and the load client compete for them, so a gateway's CPU "
        "cost also slows the engines (as on a shared node); ratios, not absolute numbers, carry over",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of the scenario (a couple of minutes)"
    )
    parser.add_argument("--json", type=Path, help="write the scenario's JSON (bench suite contract) here")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the random model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the random model")
    args = parser.parse_args()
    args.seconds = 2.0 if args.quick else 4.0
    args.ramp = 0.5
    args.min_rounds, args.max_rounds = (1, 1) if args.quick else (3, 6)
    args.budget = 60.0 if args.quick else 220.0  # measuring only; engines and proxy start in ~1.5 min
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
