"""Closed-loop load on one engine: at each concurrency, ROUNDS rounds of that many streamed completions
started together, each a fixed prompt of about PROMPT_WORDS tokens (a unique prefix per request, so the
prefix cache saves nothing) and exactly OUTPUT_TOKENS output tokens (ignore_eos).

Prints one JSON line per round: output tokens/s (from the usage the engine reports), TTFT p50/p99 and
inter-token latency p50/p99 (the gaps between a stream's chunks). Runs on the GPU host (host.py serve).

  python3 load.py http://127.0.0.1:8000 MODEL [CONCURRENCY ...]
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time

import aiohttp

ROUNDS = 3
PROMPT_WORDS = 1000
OUTPUT_TOKENS = 256
CONCURRENCY = (1, 16, 64)
WORDS = ("the quick brown fox jumps over the lazy dog " * (PROMPT_WORDS // 9 + 1)).split()[:PROMPT_WORDS]


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


async def one(session: aiohttp.ClientSession, url: str, model: str, prefix: str) -> dict:
    body = {
        "model": model,
        "prompt": f"{prefix} " + " ".join(WORDS),
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    stamps: list[float] = []
    usage = None
    async with session.post(f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices"):
                stamps.append(time.perf_counter() - t0)
    return {
        "ttft": stamps[0] if stamps else None,
        "gaps": [b - a for a, b in itertools.pairwise(stamps)],
        "usage": usage,
    }


async def round_of(url: str, model: str, concurrency: int, index: int) -> dict:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(one(session, url, model, f"round {index} request {k}") for k in range(concurrency))
        )
        wall = time.perf_counter() - t0
    out_tokens = sum(r["usage"]["completion_tokens"] for r in results)
    gaps = [g for r in results for g in r["gaps"]]
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    return {
        "concurrency": concurrency,
        "round": index,
        "requests": len(results),
        "prompt_tokens": results[0]["usage"]["prompt_tokens"],
        "output_tokens": out_tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(out_tokens / wall, 1),
        "ttft_p50_s": quantile(ttfts, 0.5),
        "ttft_p99_s": quantile(ttfts, 0.99),
        "itl_p50_s": quantile(gaps, 0.5),
        "itl_p99_s": quantile(gaps, 0.99),
    }


def main() -> None:
    url, model = sys.argv[1], sys.argv[2]
    levels = [int(x) for x in sys.argv[3:]] or list(CONCURRENCY)
    asyncio.run(
        round_of(url, model, 1, -1)
    )  # warm-up: the first request compiles nothing, but pays first-use costs
    for concurrency in levels:
        for index in range(ROUNDS):
            print(json.dumps(asyncio.run(round_of(url, model, concurrency, index))), flush=True)


if __name__ == "__main__":
    main()
