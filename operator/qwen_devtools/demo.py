"""`make demo`: a dev cluster with simulated GPU pools, the operator installed with its Helm chart, and
an example QwenDeployment planned, applied and reported.

Simulated (kwok) pods run no containers, so the chart's operator pod is scaled to zero and the same
operator runs here as a local process, authenticated as the chart's ServiceAccount (its RBAC applies).
    python -m qwen_devtools.demo up | down
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import yaml

from .devcluster import cluster as devcluster
from .operator_proc import OPERATOR_NAMESPACE, OperatorProcess, service_account_kubeconfig
from .repo import REPO

DESCRIPTION = "A dev cluster with simulated GPU pools, the operator installed with its chart, an example CR."
NAME = "demo"
EXAMPLE = REPO / "examples" / "h100-80gb-tp2-fp8-128k.yaml"
STATE = REPO / ".devcluster" / NAME


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def up() -> int:
    step("starting the dev cluster (the first run builds Kubernetes from source: about 10 minutes)")
    handle = devcluster.up(NAME)
    helm = str(handle.bin("helm"))
    step("installing the operator with Helm (CRD, RBAC, ServiceAccount)")
    subprocess.run(
        [
            helm,
            "upgrade",
            "--install",
            "qwen-operator",
            str(REPO / "charts" / "qwen-operator"),
            "--namespace",
            OPERATOR_NAMESPACE,
            "--create-namespace",
            "--set",
            "replicaCount=0",
            "--kubeconfig",
            str(handle.kubeconfig),
            "--wait",
        ],
        check=True,
    )
    step("starting the operator as the chart's ServiceAccount")
    _stop_operator()
    STATE.mkdir(parents=True, exist_ok=True)
    kubeconfig = service_account_kubeconfig(handle, STATE / "operator.kubeconfig")
    proc = OperatorProcess(kubeconfig, STATE / "operator.log").start()
    assert proc.proc is not None
    (STATE / "operator.pid").write_text(str(proc.proc.pid))
    print(f"operator pid {proc.proc.pid}, log {STATE / 'operator.log'}")
    print(f"operator metrics: http://127.0.0.1:{proc.port}/metrics")

    step(f"capacity plan of {EXAMPLE.relative_to(REPO)} (qwen-operator plan, offline)")
    subprocess.run([sys.executable, "-m", "qwen_operator.cli", "plan", "-f", str(EXAMPLE)], check=True)
    body = yaml.safe_load(EXAMPLE.read_text())
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    step(f"applying it to namespace {ns}")
    handle.kubectl("create", "namespace", ns, check=False)
    keys = body["spec"]["gateway"]["apiKeysSecret"]
    handle.kubectl(
        "-n", ns, "create", "secret", "generic", keys, "--from-literal=demo=sk-demo-key", check=False
    )
    handle.kubectl("apply", "-f", str(EXAMPLE))
    handle.kubectl("-n", ns, "wait", f"qwd/{name}", "--for=condition=Ready", "--timeout=180s")
    step("GPU node pools")
    print(
        handle.kubectl(
            "get",
            "nodes",
            "-L",
            "nvidia.com/gpu.product",
            "-o",
            "custom-columns=NAME:.metadata.name,PRODUCT:.metadata.labels.nvidia\\.com/gpu\\.product,"
            "GPUS:.status.capacity.nvidia\\.com/gpu",
        ).stdout
    )
    step("kubectl get qwd -A -o wide")
    print(handle.kubectl("get", "qwd", "-A", "-o", "wide").stdout)
    step("engine pods and where they run")
    print(handle.kubectl("-n", ns, "get", "pods", "-o", "wide").stdout)
    endpoint = handle.kubectl("-n", ns, "get", "qwd", name, "-o", "jsonpath={.status.endpoint}").stdout
    print(f"Endpoint (in cluster): {endpoint}")
    print(f"\nexport KUBECONFIG={handle.kubeconfig}\nStop everything with: make demo-down")
    return 0


def _stop_operator() -> None:
    pid_file = STATE / "operator.pid"
    if pid_file.exists():
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
            time.sleep(1)
        except (ProcessLookupError, ValueError):
            pass
        pid_file.unlink()


def down() -> int:
    _stop_operator()
    devcluster.down(NAME)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m qwen_devtools.demo", description=DESCRIPTION)
    parser.add_argument("command", choices=["up", "down"])
    return up() if parser.parse_args().command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
