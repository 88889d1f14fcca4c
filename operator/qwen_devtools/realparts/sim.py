"""llm-d-inference-sim, the vLLM stand-in that llm-d uses for routing and autoscaling tests, as many engine
replicas with GPU-like timings: built from its Go module into the cache, started on loopback.

It builds here with CGO_ENABLED=0 and no build tags (its tokenizer is either a vLLM render service over
HTTP or an in-process regex tokenizer; nothing is linked in C). It serves vLLM's OpenAI routes, /health
and /metrics, queues requests beyond --max-num-seqs, and with --enable-kvcache keeps a prefix cache of
--kv-cache-size blocks (LRU eviction): cached prompt tokens are not prefilled again, so time to first
token depends on where a request is routed, as on a GPU.

``python -m qwen_devtools.realparts.sim`` builds it (about 10 minutes on 2 cores the first time) and prints
its path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from qwen_operator import versions

from ..gotools import GoMissing, go_program
from ..net import free_ports
from ..procs import Proc, spawn, temp_log_dir, wait_ready
from ..require import missing
from .engine import SERVED_MODEL

SIM_MODULE = versions.INFERENCE_SIM_MODULE
SIM_VERSION = versions.INFERENCE_SIM


@dataclass(frozen=True)
class GpuTimings:
    """Per-request timings of one model size on one GPU, fixed from published figures before any run.

    Source of both instances below: llm-d-inference-sim v0.10.2, docs/latency-profiles.md, "Reference
    Tables" (compiled there from public vLLM, MLPerf and GPU vendor benchmarks; BF16, batch 1), column
    H100, the midpoint of each range. Jitter: the same page puts inter-token std-dev at 5-15% of the mean
    (10% taken) and its per-token profile uses a 5 ms prefill std-dev; time-factor-under-load 2.0 is its
    "realistic for latency-optimized deployments" value (that of its balanced H100 profile). Only cached
    prompt tokens skip prefill (the per-token calculator).
    """

    prefill_overhead_ms: float = 65.0
    prefill_per_token_ms: float = 0.40
    prefill_std_dev_ms: float = 5.0
    inter_token_ms: float = 25.0
    inter_token_std_dev_ms: float = 2.5
    load_factor: float = 2.0
    block_size: int = 16  # vLLM's default KV block on GPUs
    #: The row of the page's tables these numbers come from (for the notes).
    row: str = "30-34B (TP=2)"

    def args(self) -> list[str]:
        return [
            "--latency-calculator", "per-token",
            "--prefill-overhead", f"{self.prefill_overhead_ms:g}ms",
            "--prefill-time-per-token", f"{self.prefill_per_token_ms * 1000:g}us",
            "--prefill-time-std-dev", f"{self.prefill_std_dev_ms:g}ms",
            "--inter-token-latency", f"{self.inter_token_ms:g}ms",
            "--inter-token-latency-std-dev", f"{self.inter_token_std_dev_ms * 1000:g}us",
            "--time-factor-under-load", f"{self.load_factor:g}",
            "--block-size", str(self.block_size),
        ]  # fmt: skip

    def cite(self) -> str:
        """One line for a benchmark's notes."""
        return (
            f"simulated engines: prefill {self.prefill_overhead_ms:g} ms + {self.prefill_per_token_ms:g} ms "
            f"per uncached prompt token, {self.inter_token_ms:g} ms per output token, x{self.load_factor:g} "
            f"when full (llm-d-inference-sim {SIM_VERSION} docs/latency-profiles.md, row {self.row} on H100, "
            "midpoints; fixed before the run)"
        )


#: Qwen3-32B: row "30-34B (TP=2)": time to first token 160-280 ms for a 256-token prompt, inter-token
#: latency 20-30 ms, prefill-overhead 50-80 ms, prefill-time-per-token 0.30-0.50 ms; 65 + 256 x 0.40 =
#: 167 ms, inside the TTFT row.
H100_32B = GpuTimings()
#: Qwen3-8B, the small tier (on one H100; the page has no 4B row): row "7-8B": time to first token
#: 60-120 ms for a 256-token prompt, inter-token latency 10-15 ms (std-dev "1-3 ms for the 8B/H100
#: row"), prefill-overhead 25-40 ms, prefill-time-per-token 0.15-0.30 ms; 32.5 + 256 x 0.225 = 90 ms,
#: inside the TTFT row (the page's own sanity check takes 30 + 256 x 0.25 = 94 ms).
H100_8B = GpuTimings(
    prefill_overhead_ms=32.5,
    prefill_per_token_ms=0.225,
    inter_token_ms=12.5,
    inter_token_std_dev_ms=1.25,
    row="7-8B",
)


def fixed_pace(inter_token_ms: float) -> GpuTimings:
    """Timings for tests of what stands in front of the engines, not of the engines: a 2 ms prefill and
    `inter_token_ms` per output token, without jitter or slow-down when full, so that a stream lasts as
    long as a test needs (short for speed, long for a stream still running at a given moment)."""
    return GpuTimings(
        prefill_overhead_ms=2.0,
        prefill_per_token_ms=0.0,
        prefill_std_dev_ms=0.0,
        inter_token_ms=inter_token_ms,
        inter_token_std_dev_ms=0.0,
        load_factor=1.0,
        row=f"none: a fixed pace of {inter_token_ms:g} ms per token for tests",
    )


def sim_bin() -> Path:
    """The simulator's binary, built from its module into the cache on first use."""
    try:
        return go_program(
            SIM_MODULE, SIM_VERSION, "llm-d-inference-sim", "llm-d-inference-sim",
            package="./cmd/llm-d-inference-sim",
        )  # fmt: skip
    except GoMissing as error:
        missing(str(error), "install Go 1.25 or newer")


def sim_argv(
    port: int,
    kv_blocks: int,
    max_num_seqs: int,
    max_model_len: int,
    timings: GpuTimings,
    model: str = SERVED_MODEL,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """One replica serving `model` on loopback with the in-process tokenizer and a prefix cache, then
    `extra_args` (e.g. --log-http: every request's headers and body in its log)."""
    return [
        str(sim_bin()),
        "--model", model,
        "--port", str(port),
        "--force-dummy-tokenizer",  # no render service: tokens are words, hashed
        "--enable-kvcache",
        "--kv-cache-size", str(kv_blocks),
        "--zmq-endpoint", "",  # KV events go nowhere: no subscriber here
        "--max-num-seqs", str(max_num_seqs),
        "--max-model-len", str(max_model_len),
        "--mode", "random",
        "--seed", str(port),
        *timings.args(),
        *extra_args,
    ]  # fmt: skip


@contextlib.contextmanager
def start_sims(
    count: int,
    kv_blocks: int,
    max_num_seqs: int,
    max_model_len: int,
    timings: GpuTimings = H100_32B,
    log_dir: Path | None = None,
    model: str = SERVED_MODEL,
    extra_args: Sequence[str] = (),
) -> Iterator[list[Proc]]:
    """`count` simulated engines serving `model`, ready (/health 200); all stopped when the block ends,
    however it ends. `extra_args` go to each one's command line (see sim_argv)."""
    log_dir = log_dir or temp_log_dir()
    procs: list[Proc] = []
    try:
        for port in free_ports(count):
            argv = sim_argv(port, kv_blocks, max_num_seqs, max_model_len, timings, model, extra_args)
            # POD_IP names the replica in its KV event topic; --enable-kvcache refuses to start without it.
            procs.append(spawn(f"sim-{port}", argv, log_dir, env={"POD_IP": "127.0.0.1"}, port=port))
        for proc in procs:
            wait_ready(proc, "/health", 30)
        yield procs
    finally:
        for proc in procs:
            proc.stop()


if __name__ == "__main__":
    print(sim_bin())
