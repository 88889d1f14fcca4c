"""Run the real operator as a local process against the dev cluster, under the install's ServiceAccount.

Simulated (kwok) pods do not execute containers, so the operator Deployment from install.yaml cannot
do the work there. The process here uses a token of the very ServiceAccount that install.yaml binds,
so a permission the manifests forgot fails the tests exactly as it would fail in a real cluster.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from .net import LOOPBACK, free_port, http_get
from .procs import clean_env, stop_group, tail
from .repo import REPO
from .wait import Timeout, wait_until

INSTALL_YAML = REPO / "manifests" / "install.yaml"
OPERATOR_NAMESPACE = "qwen-operator-system"
OPERATOR_ACCOUNT = "qwen-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"
START_SECONDS = 60.0


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

    @property
    def url(self) -> str:
        """The operator's metrics and health endpoint."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> OperatorProcess:
        """Start the operator and wait until /healthz answers; RuntimeError with its log otherwise."""
        env = clean_env(
            {"KUBECONFIG": str(self.kubeconfig), "QWEN_OPERATOR_RESYNC_SECONDS": str(self.resync_seconds)}
        )
        exe = Path(sys.executable).with_name("qwen-operator")
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                [str(exe), "run", *self.scope, "--metrics-port", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.proc = proc

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"operator exited with {proc.returncode}:\n{self.tail()}")
            return http_get(f"{self.url}/healthz", timeout=1)[0] == 200

        try:
            wait_until(healthy, START_SECONDS, "the operator's /healthz", interval=0.3)
        except Timeout:
            raise RuntimeError(f"operator not healthy after {START_SECONDS:.0f} s:\n{self.tail()}") from None
        return self

    def metric(self, name: str) -> float:
        """Sum of all samples of one metric from the operator's /metrics."""
        status, text = http_get(f"{self.url}/metrics", timeout=5)
        if status != 200:
            raise RuntimeError(f"operator /metrics answered {status}:\n{self.tail()}")
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)

    def stop(self) -> None:
        """SIGTERM the operator's process group, SIGKILL it after 20 s."""
        if self.proc:
            stop_group(self.proc, timeout=20)
