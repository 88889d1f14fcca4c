"""Client load for the benchmarks against the real parts: streamed OpenAI requests timed to the first
generated text, closed-loop users and open-loop (Poisson) arrivals, and percentiles of what came back."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

#: -> (URL of the endpoint, headers) for the next request: how a variant spreads requests.
Target = Callable[[], tuple[str, dict[str, str]]]
Body = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Sample:
    """One request: whether it finished ([DONE] after a 200), when it started (perf_counter), its
    latency and time to first generated text (seconds), how many chunks carried text, and the name of
    the request stream it belongs to (open_loop)."""

    ok: bool
    started: float
    latency: float
    ttft: float | None = None
    chunks: int = 0
    tag: str = ""


@dataclass
class Run:
    """Samples of one measurement and the wall time they cover."""

    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0

    def merged(self, other: Run) -> Run:
        return Run(self.samples + other.samples, self.seconds + other.seconds)

    def only(self, tag: str) -> Run:
        """The samples of one request stream (same wall time)."""
        return Run([s for s in self.samples if s.tag == tag], self.seconds)

    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    def ttft(self, q: float) -> float:
        """The q-th percentile of the time to first text, in seconds."""
        return percentile([s.ttft for s in self.ok() if s.ttft is not None], q)

    @property
    def throughput(self) -> float:
        """Finished requests per second."""
        return len(self.ok()) / self.seconds if self.seconds else 0.0

    @property
    def errors(self) -> int:
        return sum(not s.ok for s in self.samples)

    @property
    def mean_chunks(self) -> float:
        ok = self.ok()
        return sum(s.chunks for s in ok) / len(ok) if ok else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (nan when empty)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def _has_text(event: dict[str, Any]) -> bool:
    """Whether a streamed chunk carries generated text (a chat delta, reasoning included, or completion)."""
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if (
            choice.get("text")
            or delta.get("content")
            or delta.get("reasoning_content")
            or delta.get("reasoning")
        ):
            return True
    return False


async def stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], tag: str = ""
) -> Sample:
    """POST a streamed request; time its first chunk with text and count the chunks with text."""
    start = time.perf_counter()
    ttft = None
    chunks = 0
    done = False
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                await response.read()
                return Sample(False, start, time.perf_counter() - start, tag=tag)
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: {") and _has_text(json.loads(line[6:])):
                    chunks += 1
                    ttft = ttft or time.perf_counter() - start
    except (TimeoutError, aiohttp.ClientError):
        return Sample(False, start, time.perf_counter() - start, tag=tag)
    return Sample(done, start, time.perf_counter() - start, ttft, chunks, tag)


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)
    )


async def closed_loop(
    target: Target,
    body: Body,
    users: int,
    seconds: float,
    ramp: float = 0.0,
    tag: Callable[[dict[str, Any]], str] | None = None,
) -> Run:
    """`users` clients, started evenly over `ramp` seconds (no burst of simultaneous first requests),
    each sending its next request when the last one finished, until `ramp` + `seconds`. Every request
    started by then counts, and the run lasts until the last one finished: a slow variant still gives
    one sample per client, and its throughput is what it completed over the time it took. `tag(body)`
    names the kind of each request in a mixed stream (Run.only)."""
    samples: list[Sample] = []

    async def user(session: aiohttp.ClientSession, delay: float, deadline: float) -> None:
        await asyncio.sleep(delay)
        while time.perf_counter() < deadline:
            url, headers = target()
            sent = body()
            samples.append(await stream(session, url, sent, headers, tag(sent) if tag else ""))

    async with _session() as session:
        start = time.perf_counter()
        deadline = start + ramp + seconds
        await asyncio.gather(*(user(session, ramp * i / users, deadline) for i in range(users)))
        return Run(samples, time.perf_counter() - start)


async def send_all(target: Target, bodies: Sequence[dict[str, Any]]) -> Run:
    """Send every body at once and wait for all (e.g. to fill a prefix cache before a timed run)."""
    async with _session() as session:
        start = time.perf_counter()
        requests = []
        for body in bodies:
            url, headers = target()
            requests.append(stream(session, url, body, headers))
        samples = list(await asyncio.gather(*requests))
        return Run(samples, time.perf_counter() - start)


async def token_ids(base_url: str, model: str, text: str) -> list[int]:
    """The engine's token ids of `text` (vLLM's /tokenize)."""
    async with aiohttp.ClientSession() as session:
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        async with session.post(f"{base_url}/tokenize", json=body) as response:
            response.raise_for_status()
            return list((await response.json())["tokens"])


#: What the benchmarks' prompts are made of: plain sentences that tokenize alike on every engine.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Qwen3 serves chat completions on vLLM.",
    "Kubernetes operators reconcile desired state.",
    "Hello, world! 0123456789 {}[]():;,.",
)


async def chars_per_token(base_url: str, model: str) -> float:
    """The engine's characters per prompt token for SENTENCES (from a completion's usage): how long a
    text of N tokens is."""
    text = " ".join(SENTENCES * 20)
    async with aiohttp.ClientSession() as session:
        body = {"model": model, "prompt": text, "max_tokens": 1}
        async with session.post(f"{base_url}/v1/completions", json=body) as response:
            usage = (await response.json())["usage"]
    return len(text) / float(usage["prompt_tokens"])


async def open_loop(streams: Mapping[str, tuple[float, Target, Body]], seconds: float, seed: int) -> Run:
    """Poisson arrivals for `seconds` on each named stream of (rate per second, target, body), whatever
    the latency (no coordinated omission); the same seed gives the same arrival times. Each sample is
    tagged with its stream's name (Run.only)."""
    rng = random.Random(seed)
    arrivals = sorted(
        (at, name) for name, (rate, _, _) in streams.items() for at in _poisson(rng, rate, seconds)
    )
    tasks: list[asyncio.Future[Sample]] = []
    async with _session() as session:
        start = time.perf_counter()
        for at, name in arrivals:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            _, target, body = streams[name]
            url, headers = target()
            tasks.append(asyncio.ensure_future(stream(session, url, body(), headers, name)))
        samples = list(await asyncio.gather(*tasks))
        return Run(samples, time.perf_counter() - start)


def _poisson(rng: random.Random, rate: float, seconds: float) -> list[float]:
    times: list[float] = []
    at = rng.expovariate(rate)
    while at < seconds:
        times.append(at)
        at += rng.expovariate(rate)
    return times
