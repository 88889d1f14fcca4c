"""Run the real operator as a local process against the dev cluster, under the install's ServiceAccount.

Simulated (kwok) pods do not execute containers, so the operator Deployment from install.yaml cannot
do the work there. The process here uses a token of the very ServiceAccount that install.yaml binds,
so a permission the manifests forgot fails the tests exactly as it would fail in a real cluster.
Replicas that must be told apart in the API server's audit log (leader election) each get a
ServiceAccount of their own with the same bindings (`service_account_like_operator`).
"""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
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
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
READ_VERBS = frozenset({"get", "list"})  # a watch is a long-lived stream, counted apart


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


def service_account_like_operator(cluster: Any, account: str) -> str:
    """A ServiceAccount `account` beside the install's, bound to every Role and ClusterRole that
    install.yaml binds to the operator's account; returns its user name (as the audit log records it)."""
    cluster.kubectl("apply", "-f", "-", input=_account_yaml(account))
    for kind, scope in (("clusterrolebinding", ()), ("rolebinding", ("--all-namespaces",))):
        found = json.loads(cluster.kubectl("get", kind, *scope, "-o", "json").stdout)["items"]
        copies = [_binding_copy(b, account) for b in found if _binds_operator(b)]
        if copies:
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(copies))
    return f"system:serviceaccount:{OPERATOR_NAMESPACE}:{account}"


def _account_yaml(account: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": OPERATOR_NAMESPACE},
        }
    )


def _binds_operator(binding: dict[str, Any]) -> bool:
    return any(
        s.get("kind") == "ServiceAccount"
        and s.get("name") == OPERATOR_ACCOUNT
        and s.get("namespace") == OPERATOR_NAMESPACE
        for s in binding.get("subjects") or []
    )


def _binding_copy(binding: dict[str, Any], account: str) -> dict[str, Any]:
    """The same (Cluster)RoleBinding for `account`, named after it."""
    meta = binding["metadata"]
    copy_meta = {"name": f"{meta['name']}-{account}"}
    if meta.get("namespace"):
        copy_meta["namespace"] = meta["namespace"]
    return {
        "apiVersion": binding["apiVersion"],
        "kind": binding["kind"],
        "metadata": copy_meta,
        "roleRef": binding["roleRef"],
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": OPERATOR_NAMESPACE}],
    }


def audit_writes(cluster: Any, users: Iterable[str], since: float = 0.0) -> list[dict[str, Any]]:
    """Writes (create, update, patch, delete) of `users` that the dev cluster's apiserver audited at or
    after `since` (epoch seconds); each event gains `time`, its epoch seconds. The dev cluster logs the
    metadata of every write (devcluster/audit-policy.yaml); FileNotFoundError elsewhere."""
    return audit_requests(cluster, users, WRITE_VERBS, since)


def audit_requests(
    cluster: Any, users: Iterable[str], verbs: Iterable[str], since: float = 0.0, until: float = float("inf")
) -> list[dict[str, Any]]:
    """Requests with one of `verbs` by `users` received in [since, until), one event each (a watch is
    logged when it starts and when it ends: counted once). Reads are logged for the operator's
    ServiceAccount only (OPERATOR_USER, devcluster/audit-policy.yaml)."""
    wanted, verbs = set(users), frozenset(verbs)
    path = Path(cluster.kubeconfig).parent / "audit.log"
    found: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # the apiserver is writing this line right now
            continue
        if event["user"].get("username") not in wanted or event["verb"] not in verbs:
            continue
        event["time"] = audit_time(event["requestReceivedTimestamp"])
        if since <= event["time"] < until:
            found.setdefault(event["auditID"], event)
    return sorted(found.values(), key=lambda e: e["time"])


def audit_time(stamp: str) -> float:
    """Epoch seconds of a UTC time as the audit log and Leases write it: 2026-12-01T10:00:00.123456Z."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or 0}")


def deployment_writes(cluster: Any, namespace: str, name: str, since: float = 0.0) -> list[dict[str, Any]]:
    """Every update or patch of Deployment `namespace/name` and of its subresources (scale, status), by
    anyone, audited at or after `since`, oldest first; each event gains `time` (see audit_writes)."""
    path = Path(cluster.kubeconfig).parent / "audit.log"
    found: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if name not in line:
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # the apiserver is writing this line right now
            continue
        ref = event.get("objectRef", {})
        if (ref.get("resource"), ref.get("namespace"), ref.get("name")) != ("deployments", namespace, name):
            continue
        if event["verb"] not in ("update", "patch"):
            continue
        event["time"] = audit_time(event["requestReceivedTimestamp"])
        if event["time"] >= since:
            found.setdefault(event["auditID"], event)
    return sorted(found.values(), key=lambda e: e["time"])


def assert_settled_writes_nothing(
    cluster: Any, users: Iterable[str], namespace: str | None = None, quiet: float = 6, window: float = 16
) -> None:
    """Once `users` stopped writing (nothing for `quiet` seconds), they write nothing for `window` seconds
    more (their reconciles of their own status writes, the watches, their timers): no status flapping.
    Writes to Leases (leader election renewals) are not counted; `namespace` limits the writes looked at."""
    users = list(users)

    def writes(since: float) -> list[dict[str, Any]]:
        return [
            w
            for w in audit_writes(cluster, users, since)
            if w.get("objectRef", {}).get("resource") != "leases"
            and (namespace is None or w.get("objectRef", {}).get("namespace") == namespace)
        ]

    wait_until(lambda: not writes(time.time() - quiet), 120, "the writes to stop")
    since = time.time()
    time.sleep(window)
    written = "\n".join(f"{w['verb']} {w['requestURI']}" for w in writes(since))
    assert not written, f"writes while settled:\n{written}"


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
        args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ):
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.resync_seconds = resync_seconds
        self.scope = scope  # --all-namespaces, or --namespace NS [--namespace NS2 ...]
        self.args = args  # more flags of `qwen-operator run`, e.g. --leader-elect
        self.env = dict(env or {})  # e.g. POD_NAME, the identity in leader election
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The operator's metrics and health endpoint."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> OperatorProcess:
        """Start the operator and wait until /healthz answers; RuntimeError with its log otherwise."""
        env = clean_env(
            {
                "KUBECONFIG": str(self.kubeconfig),
                "QWEN_OPERATOR_RESYNC_SECONDS": str(self.resync_seconds),
                **self.env,
            }
        )
        exe = Path(sys.executable).with_name("qwen-operator")
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                [str(exe), "run", *self.scope, "--metrics-port", str(self.port), *self.args],
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

    def kill(self) -> None:
        """SIGKILL the operator's process group at once (a crash: no clean-up, no Lease release)."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int:
        """The exit status once the process ends by itself; subprocess.TimeoutExpired after `timeout` s."""
        assert self.proc is not None, "not started"
        return self.proc.wait(timeout)


@contextlib.contextmanager
def installed_operator(
    cluster: Any, work: Path, log_lines: int = 80, **settings: Any
) -> Iterator[OperatorProcess]:
    """install.yaml applied, then the operator running under its ServiceAccount (kubeconfig and log in
    `work`; `settings` as OperatorProcess takes them); stopped at the end, its log's tail printed."""
    install(cluster)
    kubeconfig = service_account_kubeconfig(cluster, work / "kubeconfig")
    proc = OperatorProcess(kubeconfig, work / "operator.log", **settings).start()
    try:
        yield proc
    finally:
        proc.stop()
        print(f"\n--- operator log (tail) ---\n{proc.tail(log_lines)}")
