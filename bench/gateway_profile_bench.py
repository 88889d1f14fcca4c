"""Where the gateway's time goes: the gateway as rendered against the same gateway with one setting changed,
one variant at a time, plus vllm-router alone and direct engine access, on simulated engines
(llm-d-inference-sim with the cited H100 timings: they hardly use the CPU, so the proxies' own cost
shows alone).

Each variant starts its own gateway from the rendered files with one edit (VARIANTS below); rounds are
interleaved (every variant once per concurrency level, the order rotating), throughput and TTFT are
given as ratios to the gateway as rendered, and the CPU time of each of the gateway's processes (nginx's
master and workers, vllm-router, the log exporter, the stub_status exporter) per finished request is read
from /proc around each run: on a busy node that CPU is what the gateway takes from everything else.
docs/gateway.md ("What the gateway costs") has the table of a run.

Not a pass/fail test. Usage: .venv/bin/python bench/gateway_profile_bench.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gateway_bench import (
    API_KEY,
    SERVED,
    WORDS,
    _chat_body,
    _cr,
    _nginx_headers,
    _round_robin,
    _spawn_engines,
)

from qwen_devtools.net import LOOPBACK, metric_sum
from qwen_devtools.procs import tree_cpu_seconds, wait_ready
from qwen_devtools.realparts.benchmodel import bench_model
from qwen_devtools.realparts.compare import THROUGHPUT, Comparison, repeat_rounds, ttft_ms, write_report
from qwen_devtools.realparts.engine import ENGINE_START_SECONDS, SERVED_MODEL
from qwen_devtools.realparts.gateway import GatewayStack, start_gateway
from qwen_devtools.realparts.load import Body, Target, closed_loop, token_ids
from qwen_devtools.realparts.sim import H100_32B, SIM_VERSION, start_sims
from qwen_operator.api.review import review
from qwen_operator.versions import VLLM_ROUTER

SCENARIO = "gateway profile"
STREAMS = (16, 64)
MAX_NUM_SEQS = 32

#: (file name, text) -> text: one change of the rendered gateway.
Edit = Callable[[str, str], str]


def _nginx(pattern: str, repl: str) -> Edit:
    """A substitution in nginx.conf only; it must match."""

    def edit(name: str, text: str) -> str:
        if name != "nginx.conf":
            return text
        new, count = re.subn(pattern, repl, text, flags=re.M)
        assert count, pattern
        return new

    return edit


def _syslog_feed(name: str, text: str) -> str:
    """How the access log reached the exporter before: one syslog datagram per request over loopback."""
    syslog = f"{LOOPBACK}:{_SYSLOG_PORT}"
    if name == "nginx.conf":
        line = f"access_log syslog:server={syslog},tag=qwen_gateway gateway;"
        return re.sub(r"access_log \S+/access\.log gateway .*;", line, text)
    if name == "nginxlog-exporter.yml":
        indent = " " * 8
        source = f"syslog:\n{indent}listen_address: udp://{syslog}\n{indent}format: rfc3164\n"
        source += f"{indent}tags:\n{indent}- qwen_gateway\n"
        return re.sub(r"files:\n\s+- \S+\n", source, text)
    return text


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


_SYSLOG_PORT = _free_udp_port()

#: Each a gateway as rendered but for one change (None: as rendered).
VARIANTS: dict[str, Edit | None] = {
    "gateway": None,
    "unbuffered stdout log": _nginx(r"(access_log /dev/stdout gateway) buffer=\S+ flush=\S+;", r"\1;"),
    "syslog feed": _syslog_feed,
    "no access logs": _nginx(r"^(\s*)access_log (/|syslog).*$", r"\1access_log off;"),
    "2 nginx workers": _nginx(r"^worker_processes \d+;", "worker_processes 2;"),
    "no body maps": _nginx(r"map \$request_body \$(\w+) \{", r"map $request_id $\1 {"),
    "no upstream keepalive": _nginx(r"^\s*keepalive(_timeout)? .*$", ""),
    "no queue-timeout filter": _nginx(r"^\s*js_(header|body)_filter errors\.\w+;$", ""),
    "no key check, no limits": lambda n, t: _nginx(r"^\s*(limit_req|limit_conn) .*$", "")(
        n, re.sub(r'if \(\$key_id = ""\) \{.*?\}\n', "", t, flags=re.S)
    ),
}


def _with_lora() -> dict[str, Any]:
    """The bench's QwenDeployment with LoRA adapters: nginx.conf then routes on the body's model name (the
    map that hashes an adapter's requests on its name; the requests here name the base model)."""
    body = _cr()
    revision = "0123456789abcdef0123456789abcdef01234567"
    adapters = [{"name": f"lora-{n}", "source": {"huggingFace": {"repo": f"org/a{n}", "revision": revision}}}
                for n in range(2)]  # fmt: skip
    body["spec"]["lora"] = {"maxLoras": 2, "adapters": adapters}
    return body


def _limited_key() -> dict[str, Any]:
    """With the bench's key limited to the base model (spec.gateway.modelAccess): every request is read
    by njs (JSON.parse of the body, after a mirror subrequest) and routed on the model it names."""
    body = _with_lora()
    body["spec"]["gateway"]["modelAccess"] = [{"apiKeys": ["bench"], "models": [SERVED_MODEL]}]
    return body


#: Each a gateway rendered from another QwenDeployment: the model-name routing that LoRA adapters (and
#: tiers) use, priced against the gateway as rendered for the bench's QwenDeployment.
CR_VARIANTS: dict[str, Callable[[], dict[str, Any]]] = {
    "LoRA model map": _with_lora,
    "key limited to models (njs)": _limited_key,
}


@contextlib.contextmanager
def _gateways(urls: Sequence[str], only: Sequence[str]) -> Iterator[dict[str, GatewayStack]]:
    rev = review(_cr())
    chosen = [name for name in (*VARIANTS, *CR_VARIANTS) if name == "gateway" or not only or name in only]
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(
                start_gateway(review(CR_VARIANTS[name]()), urls, {"bench": API_KEY})
                if name in CR_VARIANTS
                else start_gateway(rev, urls, {"bench": API_KEY}, edit=VARIANTS[name])
            )
            for name in chosen
        }


@contextlib.asynccontextmanager
async def _engines(args: argparse.Namespace, logs: Path) -> AsyncIterator[tuple[list[str], Body]]:
    """Two simulated engines, or with --cpu two vLLM CPU engines as gateway_bench starts them."""
    if not args.cpu:
        with start_sims(2, 4096, MAX_NUM_SEQS, 4096, H100_32B, logs) as sims:
            yield [s.url for s in sims], _chat_body(None)
        return
    engines = _spawn_engines(bench_model(256, 4), review(_cr()), 2, logs)
    try:
        for engine in engines:
            wait_ready(engine, "/health", ENGINE_START_SECONDS)
        urls = [e.url for e in engines]
        yield urls, _chat_body(sorted(set(await token_ids(urls[0], SERVED_MODEL, WORDS))))
    finally:
        for engine in engines:
            engine.stop()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="qwen-gateway-profile-"))
    part = "cpu" if args.cpu else "sim"
    async with _engines(args, logs) as (urls, body):
        with _gateways(urls, args.variants) as stacks:
            auth = {"Authorization": f"Bearer {API_KEY}"}
            targets: dict[str, Target] = {
                n: _round_robin([s.url], lambda: dict(auth)) for n, s in stacks.items()
            }
            targets["vllm-router"] = _round_robin([stacks["gateway"].router_url], _nginx_headers)
            targets["direct"] = _round_robin(urls)
            procs = {n: dict(s.procs) for n, s in stacks.items()}
            procs["vllm-router"] = {"router": stacks["gateway"].procs["router"]}
            procs["direct"] = {}
            names = list(targets)
            measures = [ttft_ms(50, "streamed TTFT"), THROUGHPUT]
            comparisons = {n: Comparison(f"{n} streams ({part})", names, measures) for n in STREAMS}
            cpu = {n: dict.fromkeys(procs[n], 0.0) for n in names}
            finished = dict.fromkeys(names, 0)
            served = {n: [0.0] * len(urls) for n in names}

            def counts() -> list[float]:
                return [metric_sum(f"{url}/metrics", SERVED) for url in urls]

            async def one_round(round_no: int) -> None:
                order = names[round_no % len(names) :] + names[: round_no % len(names)]
                for streams in STREAMS:
                    for name in order:
                        before, cpu_before = (
                            counts(),
                            {p: tree_cpu_seconds(q.pid) for p, q in procs[name].items()},
                        )
                        run = await closed_loop(targets[name], body, streams, args.seconds, ramp=args.ramp)
                        for p, q in procs[name].items():
                            cpu[name][p] += tree_cpu_seconds(q.pid) - cpu_before[p]
                        served[name] = [
                            t + a - b for t, a, b in zip(served[name], counts(), before, strict=True)
                        ]
                        finished[name] += len(run.ok())
                        comparisons[streams].record(name, run)

            for name in names:
                await closed_loop(targets[name], body, 4, 1.0)
            why = await repeat_rounds(
                one_round, list(comparisons.values()), args.min_rounds, args.max_rounds, args.budget
            )
    per_request = {n: {p: s * 1000 / max(1, finished[n]) for p, s in cpu[n].items()} for n in names}
    total = {n: sum(per_request[n].values()) for n in names}
    rows = [
        {"measure": f"proxy CPU per request ({part})", "variant": n, "value": round(total[n], 3),
         "unit": "ms",
         "baseline": None if n == "gateway" else "gateway",
         "ratio": None if n == "gateway" or not total["gateway"] else round(total[n] / total["gateway"], 3),
         "spread": None}
        for n in names
        if n != "direct"
    ]  # fmt: skip
    engines = (
        f"2 vLLM CPU engines as in the gateway scenario, maxNumSeqs {MAX_NUM_SEQS}"
        if args.cpu
        else f"2 llm-d-inference-sim {SIM_VERSION} replicas, maxNumSeqs {MAX_NUM_SEQS}; {H100_32B.cite()}"
    )
    notes = [
        engines,
        f"gateway: nginx + vllm-router {VLLM_ROUTER} as rendered (default policy, API key); every other "
        "gateway variant differs from it by one change; vllm-router: alone, sent nginx's two headers",
        f"{why}; requests finished per engine: "
        + "; ".join(f"{n} {'/'.join(str(int(c)) for c in v)}" for n, v in served.items()),
        "CPU ms per finished request, by process: "
        + "; ".join(
            f"{n}: " + ", ".join(f"{p} {ms:.3f}" for p, ms in per_request[n].items() if ms)
            for n in names
            if n != "direct"
        ),
    ]
    for comparison in comparisons.values():
        comparison.print()
    for note in notes:
        print("   -", note)
    title = "Gateway profile: one setting at a time"
    seconds = time.monotonic() - started
    # The table keeps throughput at 64 streams (every other ratio is in the printed tables above).
    comparisons[64].measures = [THROUGHPUT]
    report = write_report(None, SCENARIO, title, seconds, [comparisons[64]], notes)
    report["rows"] += rows
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (about two minutes)")
    parser.add_argument("--json", type=Path, help="write the scenario's JSON (bench suite contract) here")
    parser.add_argument(
        "--cpu", action="store_true", help="on two vLLM CPU engines instead of simulated ones"
    )
    parser.add_argument("--variants", nargs="*", default=(), help="these variants only (and the gateway)")
    args = parser.parse_args()
    args.seconds = 2.0 if args.quick else 4.0
    args.ramp = 0.5
    args.min_rounds, args.max_rounds = (1, 1) if args.quick else (2, 4)
    args.budget = 60.0 if args.quick else 400.0
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
