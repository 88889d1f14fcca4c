"""Prepare, on a machine with PyPI, what the GPU host needs to run vLLM's CUDA build (README.md here).

1. Downloads the wheels of wheels.txt (vLLM 0.32.0, the torch, Triton, torchvision and NCCL it pins, and
   the pure dependencies the host lacks) into build/gpu/wheels, checked against wheels.sha256 when that
   file lists them.
2. Packs them into one tar and splits it into parts of at most PART_BYTES (the device tool carries at
   most 64 MiB per call, the working tree included): build/gpu/parts/pNN.
3. Renders each run of runs.yaml with `qwen-operator render` and writes build/gpu/runs.json: the engine
   container's command, arguments and plain environment exactly as the operator renders them, and the
   plan's terms (`qwen-operator plan -o json`) to compare with vLLM's log.

Run from the repository root: .venv/bin/python tools/measure/gpu/prepare.py
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BUILD = REPO / "build" / "gpu"
PART_BYTES = 58 * 2**20
#: The host's glibc is 2.39 (Ubuntu 24.04): every manylinux tag up to it.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64", "any"
]  # fmt: skip
CLI = [str(REPO / ".venv" / "bin" / "qwen-operator")]


def download(wheels: Path) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    pins = [line.strip() for line in (HERE / "wheels.txt").read_text().splitlines() if line.strip()]
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platform_args, "-d", str(wheels), *pins],
        check=True,
    )  # fmt: skip
    files = sorted(wheels.glob("*.whl"))
    sums = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    known = HERE / "wheels.sha256"
    if known.exists():
        expected = dict(line.split()[::-1] for line in known.read_text().splitlines() if line.strip())
        bad = [name for name, digest in sums.items() if name in expected and expected[name] != digest]
        if bad:
            raise SystemExit(f"sha256 mismatch: {bad}")
    else:
        known.write_text("".join(f"{digest}  {name}\n" for name, digest in sums.items()))
    return files


def pack(files: list[Path]) -> list[Path]:
    parts_dir = BUILD / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    for old in parts_dir.glob("p*"):
        old.unlink()
    bundle = BUILD / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for f in files:
            tar.add(f, arcname=f"wheels/{f.name}")
    parts = []
    with bundle.open("rb") as src:
        for index in range(10_000):
            chunk = src.read(PART_BYTES)
            if not chunk:
                break
            part = parts_dir / f"p{index:02d}"
            part.write_bytes(chunk)
            parts.append(part)
    bundle.unlink()
    return parts


def runtime_terms(cr: dict) -> dict[str, float]:
    """The plan's runtime memory per GPU, term by term (GiB), for the table against vLLM's log."""
    from qwen_operator.api.catalog import GIB
    from qwen_operator.api.plan import make_plan
    from qwen_operator.api.spec import parse

    plan = make_plan(parse(cr).spec)
    r = plan.runtime
    assert r is not None, plan.errors
    terms = {
        "forward": r.forward_bytes,
        "sampler": r.sampler_bytes,
        "profile_peak": r.profile_peak_bytes,
        "sampler_state": r.sampler_state_bytes,
        "persistent": r.persistent_bytes,
        "non_torch": r.non_torch_bytes,
        "cuda_graphs": r.cuda_graph_bytes,
        "weights": plan.weights_bytes_per_gpu,
        "kv_budget": plan.kv_budget_bytes_per_gpu,
    }
    return {name: round(value / GIB, 3) for name, value in terms.items()}


def render_runs() -> Path:
    runs = yaml.safe_load((HERE / "runs.yaml").read_text())
    out = []
    for run in runs["runs"]:
        cr = {
            "apiVersion": "inference.qwenops.dev/v1alpha1",
            "kind": "QwenDeployment",
            "metadata": {"name": run["name"], "namespace": "gpu"},
            "spec": run["spec"],
        }
        text = yaml.safe_dump(cr)
        rendered = subprocess.run(
            [*CLI, "render", "-f", "-"], input=text, capture_output=True, text=True, check=True
        )
        plan = subprocess.run(
            [*CLI, "plan", "-f", "-", "-o", "json"], input=text, capture_output=True, text=True, check=True
        )
        engine = next(
            d
            for d in yaml.safe_load_all(rendered.stdout)
            if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-engine")
        )
        container = next(c for c in engine["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        out.append(
            {
                "name": run["name"],
                "gpu": run["gpu"],
                "serve_only": bool(run.get("serve_only")),
                "command": container["command"] + container["args"],
                "env": env,
                "plan": json.loads(plan.stdout),
                "terms_gib": runtime_terms(cr),
            }
        )
    path = BUILD / "runs.json"
    path.write_text(json.dumps(out, indent=1))
    return path


def main() -> None:
    BUILD.mkdir(parents=True, exist_ok=True)
    runs = render_runs()
    parts = [] if "--runs-only" in sys.argv else pack(download(BUILD / "wheels"))
    print(f"{runs.relative_to(REPO)}: {len(json.loads(runs.read_text()))} runs")
    for part in parts:
        print(f"carry {part.relative_to(REPO)} ({part.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
