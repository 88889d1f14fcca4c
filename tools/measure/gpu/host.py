"""On the GPU host: receive the carried parts, install vLLM's CUDA build, run the rendered engines.

  host.py receive        move the carried build/gpu/parts/p* and runs.json to /tmp/qgpu
  host.py install        join the parts, install the wheels into /tmp/qgpu/site
  host.py check          torch, CUDA, NCCL and vLLM import and run
  host.py serve NAME...  each run: start the engine as rendered, time its start, run load.py, stop it;
                         the log and results go to $OUT/NAME

The engine command is the operator's (runs.json, from `qwen-operator render`) with two changes only: the
model argument names a directory holding Qwen3-32B's config.json and a small tokenizer, and
`--load-format dummy` fills the weights with random values (no checkpoint travels). Memory, kernels,
CUDA graphs and step times are those of the real model's shapes; the tokens are meaningless.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = Path("/tmp/qgpu")
SITE = STATE / "site"
MODEL = STATE / "qwen3-32b"
OUT = Path(os.environ.get("OUT", "/tmp/qgpu/out"))
PORT = 8000
READY_SECONDS = 900

ENV = {
    # The host has no NVLink multicast to offer (KINDS.md); a single GPU needs none.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
    # flashinfer is not carried (its cubins are 1 GB): vLLM's own sampler kernels instead.
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    # torch 2.13 is built against cuDNN 9.20, the host has 9.19 (minor versions are backwards compatible
    # only; vLLM's Qwen3 path calls no cuDNN kernel).
    "PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK": "1",
    # The profile's breakdown (torch peak, non-torch, CUDA-graph estimate) is logged at DEBUG.
    "VLLM_LOGGING_LEVEL": "DEBUG",
}


def receive() -> None:
    for sub in ("parts",):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    carried = Path("build/gpu")
    for part in sorted((carried / "parts").glob("p*")) if (carried / "parts").exists() else []:
        shutil.move(str(part), STATE / "parts" / part.name)
    if (carried / "runs.json").exists():
        shutil.copy(carried / "runs.json", STATE / "runs.json")
    have = sorted(p.name for p in (STATE / "parts").iterdir())
    print(
        "parts on the host:",
        " ".join(have),
        f"({sum(p.stat().st_size for p in (STATE / 'parts').iterdir()) / 2**20:.0f} MiB)",
    )


def install() -> None:
    bundle = STATE / "bundle.tar"
    with bundle.open("wb") as out:
        for part in sorted((STATE / "parts").glob("p*")):
            out.write(part.read_bytes())
    with tarfile.open(bundle) as tar:
        tar.extractall(STATE, filter="data")
    bundle.unlink()
    wheels = sorted(str(p) for p in (STATE / "wheels").glob("*.whl"))
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         "--no-cache-dir", "--target", str(SITE), *wheels],
        check=True,
    )  # fmt: skip
    print(f"installed {len(wheels)} wheels into {SITE} in {time.monotonic() - t0:.0f} s")


def env() -> dict[str, str]:
    return {**os.environ, **ENV, "PYTHONPATH": str(SITE)}


def check() -> None:
    code = (
        "import torch, vllm; x = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16); "
        "torch.cuda.synchronize(); print('torch', torch.__version__, 'cuda', torch.version.cuda, "
        "'nccl', torch.cuda.nccl.version(), 'vllm', vllm.__version__, torch.cuda.get_device_name(), "
        "round(torch.cuda.mem_get_info()[1] / 2**30, 2), 'GiB', float((x @ x).float().abs().mean()) > 0)"
    )
    subprocess.run([sys.executable, "-c", code], env=env(), check=True)


def model_dir() -> Path:
    MODEL.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "qwen3-32b-config.json", MODEL / "config.json")
    if not (MODEL / "tokenizer.json").exists():
        subprocess.run([sys.executable, str(HERE / "tok.py"), str(MODEL)], env=env(), check=True)
    return MODEL


def engine_command(run: dict) -> list[str]:
    """The rendered command, run from the carried site: `vllm serve <model> ...` with the model argument
    replaced by the local directory and `--load-format dummy` added."""
    command = list(run["command"])
    assert command[:2] == ["vllm", "serve"], command
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(model_dir()),
        *command[3:],
        "--load-format",
        "dummy",
    ]


def healthy() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def gpu_memory_used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.split(",")[0])


def serve(name: str, runs: dict[str, dict]) -> None:
    run = runs[name]
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    command = engine_command(run)
    (out / "command.txt").write_text(" ".join(command) + "\n")
    log = (out / "serve.log").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        command,
        env={**env(), **run["env"], "HF_HOME": str(STATE / "hf")},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    ready = None
    while time.monotonic() - t0 < READY_SECONDS:
        if proc.poll() is not None:
            break
        if healthy():
            ready = time.monotonic() - t0
            break
        time.sleep(1)
    result: dict = {"name": name, "ready_seconds": round(ready, 1) if ready else None, "exit": proc.poll()}
    print(
        f"{name}: ready after {result['ready_seconds']} s"
        if ready
        else f"{name}: NOT READY, exit {proc.poll()}"
    )
    if ready:
        result["gpu_memory_used_mib"] = gpu_memory_used_mib()
        if not run["serve_only"]:
            load = subprocess.run(
                [sys.executable, str(HERE / "load.py"), f"http://127.0.0.1:{PORT}", run["command"][2]],
                env=env(), capture_output=True, text=True, timeout=400,
            )  # fmt: skip
            (out / "load.jsonl").write_text(load.stdout)
            print(load.stdout, load.stderr[-2000:], end="")
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    (out / "result.json").write_text(json.dumps(result, indent=1))
    if not ready:
        print((out / "serve.log").read_text()[-4000:])


def main() -> None:
    step = sys.argv[1]
    if step == "receive":
        receive()
    elif step == "install":
        install()
    elif step == "check":
        check()
    elif step == "serve":
        runs = {r["name"]: r for r in json.loads((STATE / "runs.json").read_text())}
        for name in sys.argv[2:]:
            serve(name, runs)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
