"""Run the real operator as a local process against the dev cluster, under the install's ServiceAccount.

Simulated (kwok) pods do not execute containers, so the operator Deployment from install.yaml cannot
do the work there. The process here uses a token of the very ServiceAccount that install.yaml binds,
so a permission the manifests forgot fails the tests exactly as it would fail in a real cluster.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
INSTALL_YAML = REPO / "manifests" / "install.yaml"
OPERATOR_NAMESPACE = "qwen-operator-system"
OPERATOR_ACCOUNT = "qwen-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def service_account_kubeconfig(
    cluster: Any, path: Path, namespace: str = OPERATOR_NAMESPACE, account: str = OPERATOR_ACCOUNT
) -> Path:
    """A kubeconfig for the ServiceAccount `namespace/account`, with a fresh bound token."""
    token = cluster.kubectl("-n", namespace, "create", "token", account, "--duration=6h").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ctx = admin["contexts"][0]["context"]
    server = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [server],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {
                "name": "qwen-devcluster-operator",
                "context": {"cluster": ctx["cluster"], "user": account},
            }
        ],
        "current-context": "qwen-devcluster-operator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def install(cluster: Any) -> None:
    """Apply install.yaml (CRD, namespace, RBAC, operator Deployment) with server-side apply."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(INSTALL_YAML))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/qwendeployments.inference.qwenops.dev"
    )


class OperatorProcess:
    """`qwen-operator run` in its own process group, logs in a file."""

    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        resync_seconds: float = 300,
        scope: tuple[str, ...] = ("--all-namespaces",),
    ):
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.resync_seconds = resync_seconds
        self.scope = scope  # --all-namespaces, or --namespace NS [--namespace NS2 ...]
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env |= {"KUBECONFIG": str(self.kubeconfig), "QWEN_OPERATOR_RESYNC_SECONDS": str(self.resync_seconds)}
        exe = Path(sys.executable).with_name("qwen-operator")
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(exe), "run", *self.scope, "--metrics-port", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1)
                return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"operator not healthy after 60 s:\n{self.tail()}")

    def metric(self, name: str) -> float:
        """Sum of all samples of one metric from the operator's /metrics."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def decode_secret(data: dict[str, str]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in data.items()}
