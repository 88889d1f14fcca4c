"""LoRA adapter affinity: twice as many adapters in the mix as GPU slots (2 x maxLoras), through the gateway
as rendered (each adapter's requests hashed on its name, so each keeps to one engine) against the same
gateway with that one rule removed (adapters' requests spread over the engines like any other).

Real parts: two vLLM CPU engines (a small random Qwen3, `--enable-lora --max-loras 2 --max-lora-rank 8
--max-cpu-loras 4`, the flags the operator renders for that spec.lora) serving four tiny random adapters
(random A and B), behind nginx + vllm-router as rendered. With affinity each engine sees about two of the
four adapters, within its two slots; spread, every engine sees all four, so a batch can hold requests of
at most two of them and the others wait for a later step (vLLM's scheduler admits a request only while
its adapter fits the batch's slots). The measure is what that costs: throughput and streamed TTFT, in
rounds interleaved between the two gateways. Adapters are loaded at start (--lora-modules) in both,
since what is compared is the routing, not the loading (the lora-sync sidecar's load is timed in
tests/test_engine_live.py and the e2e LoRA test).

Not a pass/fail test. Usage: .venv/bin/python bench/lora_affinity_bench.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests
from gateway_bench import API_KEY, GENERATED_TOKENS, SERVED, WORDS, _round_robin, _stopping

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
from qwen_devtools.realparts.load import Body, closed_loop, token_ids
from qwen_devtools.realparts.lora import write_random_lora
from qwen_operator.api.review import Review, review

SCENARIO = "lora_affinity"
MAX_LORAS = 2
ADAPTERS = [f"adapter-{i}" for i in range(2 * MAX_LORAS)]
STREAMS = (8, 16)
MAX_NUM_SEQS = 16
HTTP = requests.Session()
HTTP.trust_env = False  # everything is on 127.0.0.1


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def _cr(policy: str = "consistent_hash") -> dict[str, Any]:
    """Two replicas with LoRA slots for two adapters of rank 8, all four held in host memory; admission
    limits far above the load."""
    gateway = {
        "policy": policy,
        "apiKeysSecret": "bench-keys",
        "replicas": 1,
        "rateLimit": {"requestsPerMinute": 1_000_000, "burst": 100_000},
        "maxConcurrentRequests": 512,
    }
    body = cpu_qwendeployment(
        {"maxNumSeqs": MAX_NUM_SEQS}, gateway, replicas=2, name="bench", namespace="bench"
    )
    revision = "0123456789abcdef0123456789abcdef01234567"
    body["spec"]["lora"] = {
        "maxLoras": MAX_LORAS,
        "maxLoraRank": 8,
        "maxCpuLoras": len(ADAPTERS),
        "adapters": [
            {"name": n, "source": {"huggingFace": {"repo": f"bench/{n}", "revision": revision}}}
            for n in ADAPTERS
        ],
    }
    return body


def _spread(name: str, text: str) -> str:
    """The rendered gateway without adapter affinity: an adapter's request is hashed like any other."""
    if name != "nginx.conf":
        return text
    new, count = re.subn(r'default "lora-\$request_model";', "default $conversation_session;", text)
    assert count == 1, "the adapter-affinity rule is not in nginx.conf"
    return new


#: (file name, text) -> text: one change of the rendered gateway.
Edit = Callable[[str, str], str]
#: name -> (routing policy, edit of the rendered gateway)
VARIANTS: dict[str, tuple[str, Edit | None]] = {
    "affinity": ("consistent_hash", None),
    "affinity, sticky_least_loaded": ("sticky_least_loaded", None),
    "spread": ("consistent_hash", _spread),
}
AFFINITY = [name for name, (_, edit) in VARIANTS.items() if edit is None]


def _engines(rev: Review, model: Path, adapters: Path, logs: Path) -> list[Proc]:
    modules = [f"{n}={adapters / n}" for n in ADAPTERS]
    extra = [*test_engine_args(rev.command), "--enforce-eager", "--lora-modules", *modules]
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return [spawn_engine(model, extra_args=extra, env=env, log_dir=logs) for _ in range(2)]


def _body(allowed_tokens: list[int]) -> Body:
    """Streamed chats cycling through the adapters, each prompt distinct (no shared prefix to cache)."""
    serial = itertools.count()

    def body() -> dict[str, Any]:
        n = next(serial)
        return {
            "model": ADAPTERS[n % len(ADAPTERS)],
            "messages": [{"role": "user", "content": f"Hello there, request {n}"}],
            "max_tokens": GENERATED_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "allowed_token_ids": allowed_tokens,
        }

    return body


@contextlib.contextmanager
def _gateways(urls: list[str]) -> Iterator[dict[str, GatewayStack]]:
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(start_gateway(review(_cr(policy)), urls, {"bench": API_KEY}, edit=edit))
            for name, (policy, edit) in VARIANTS.items()
        }


def _placement(gateway: GatewayStack, urls: list[str]) -> dict[str, int]:
    """Which engine a gateway with affinity sends each adapter to: one request each, and the engine whose
    request counter moved."""
    placement = {}
    for adapter in ADAPTERS:
        before = [metric_sum(f"{url}/metrics", SERVED) for url in urls]
        body = {"model": adapter, "prompt": "Hello", "max_tokens": 1}
        answer = HTTP.post(f"{gateway.url}/v1/completions", json=body, headers=_auth(), timeout=60)
        assert answer.status_code == 200, answer.text
        after = [metric_sum(f"{url}/metrics", SERVED) for url in urls]
        (placement[adapter],) = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
    return placement


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="qwen-lora-affinity-"))
    rev = review(_cr())
    assert rev.plan.fits, rev.plan.errors
    model = bench_model(256, 4)
    for seed, name in enumerate(ADAPTERS):
        write_random_lora(logs / "adapters" / name, model, rank=8, seed=seed + 1)
    engines = _engines(rev, model, logs / "adapters", logs)
    with _stopping(engines):
        for engine in engines:
            wait_ready(engine, "/health", ENGINE_START_SECONDS)
        urls = [e.url for e in engines]
        body = _body(sorted(set(await token_ids(urls[0], SERVED_MODEL, WORDS))))
        with _gateways(urls) as stacks:
            targets = {n: _round_robin([s.url], _auth) for n, s in stacks.items()}
            names = list(targets)
            measures = [ttft_ms(50, "streamed TTFT"), ttft_ms(90, "streamed TTFT"), THROUGHPUT]
            comparisons = {
                n: Comparison(f"{n} streams, {len(ADAPTERS)} adapters", names, measures) for n in STREAMS
            }

            async def one_round(round_no: int) -> None:
                order = names[round_no % len(names) :] + names[: round_no % len(names)]
                for streams in STREAMS:
                    for name in order:
                        run = await closed_loop(targets[name], body, streams, args.seconds, ramp=args.ramp)
                        comparisons[streams].record(name, run)

            placement = {name: _placement(stacks[name], urls) for name in AFFINITY}
            for name in names:
                await closed_loop(targets[name], body, 4, 2.0)  # every adapter used once on every engine
            why = await repeat_rounds(
                one_round, list(comparisons.values()), args.min_rounds, args.max_rounds, args.budget
            )
    notes = [
        f"2 vLLM CPU engines (bench model h256 l4), --max-loras {MAX_LORAS} --max-lora-rank 8 "
        f"--max-cpu-loras {len(ADAPTERS)}, {len(ADAPTERS)} random rank-8 adapters in turn, "
        f"{GENERATED_TOKENS} tokens per answer",
        "affinity: the gateway as rendered (an adapter's requests hashed on its name; the default policy "
        "consistent_hash, or sticky_least_loaded: a new adapter to the engine holding the fewest); spread: "
        "the same gateway without the adapter rule",
        why,
        *(
            f"{name}: each adapter's engine (from the engines' own request counters): "
            + ", ".join(f"{a} -> engine {e}" for a, e in placement[name].items())
            for name in AFFINITY
        ),
    ]
    for comparison in comparisons.values():
        comparison.print()
    for note in notes:
        print("   -", note)
    report = write_report(
        None, SCENARIO, "LoRA adapter affinity", time.monotonic() - started, list(comparisons.values()), notes
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (a few minutes)")
    parser.add_argument("--json", type=Path, help="write the scenario's JSON (bench suite contract) here")
    args = parser.parse_args()
    args.seconds = 3.0 if args.quick else 8.0
    args.ramp = 0.5
    args.min_rounds, args.max_rounds = (1, 1) if args.quick else (2, 4)
    args.budget = 90.0 if args.quick else 480.0
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
