"""`helm install` of the chart into the dev cluster, namespaced scope, then a QwenDeployment Ready.

The release goes into a namespace that enforces the restricted Pod Security Standard, so the real
API server admits (or refuses) the operator pod. kwok pods run no containers, so the reconciling is
done by the operator as a local process authenticated as the chart's ServiceAccount, watching one
namespace: a permission the chart's Role or ClusterRole lacks fails here as it would in a cluster.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.fixtures import wait_until
from operator_proc import free_port

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "qwen-operator"
EXAMPLE = REPO / "examples" / "a100-80gb-tp2-bf16.yaml"
RELEASE = "qwen-e2e"
ACCOUNT = f"{RELEASE}-qwen-operator"  # the chart's full name for a release not named qwen-operator
CRD = "qwendeployments.inference.qwenops.dev"


def helm(cluster: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(cluster.bin("helm")), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def kubectl_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


@pytest.fixture
def release(cluster: Any, namespace: str) -> Iterator[str]:
    """The chart installed into a restricted namespace of its own, watching `namespace` only."""
    operator_ns = f"e2e-helm-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", operator_ns)
    cluster.kubectl("label", "namespace", operator_ns, "pod-security.kubernetes.io/enforce=restricted")
    helm(
        cluster, "install", RELEASE, str(CHART), "--namespace", operator_ns,
        "--set", "operator.scope=namespaced", "--set", f"operator.watchNamespaces={{{namespace}}}",
        # Another test or an earlier run may have created the CRD: adopt it (crds.keep keeps it after).
        "--take-ownership", "--wait", "--timeout", "3m",
    )  # fmt: skip
    yield operator_ns
    helm(cluster, "uninstall", RELEASE, "--namespace", operator_ns, "--wait", check=False)
    cluster.kubectl("delete", "namespace", operator_ns, "--wait=false", check=False)


def service_account_kubeconfig(cluster: Any, operator_ns: str, path: Path) -> Path:
    token = cluster.kubectl("-n", operator_ns, "create", "token", ACCOUNT, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = admin["contexts"][0]["context"]
    server = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [server],
                "users": [{"name": ACCOUNT, "user": {"token": token}}],
                "contexts": [
                    {"name": "chart-account", "context": {"cluster": server["name"], "user": ACCOUNT}}
                ],
                "current-context": "chart-account",
            }
        )
    )
    return path


@pytest.fixture
def operator_process(
    cluster: Any, release: str, namespace: str, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`qwen-operator run --namespace <namespace>` as the chart's ServiceAccount."""
    kubeconfig = service_account_kubeconfig(cluster, release, tmp_path / "kubeconfig")
    port = free_port()
    log_path = tmp_path / "operator.log"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env |= {"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": release}
    exe = Path(sys.executable).with_name("qwen-operator")
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [str(exe), "run", "--namespace", namespace, "--metrics-port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        wait_until(lambda: _healthy(proc, port), 60, "operator /healthz")
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        tail = log_path.read_text(errors="replace").splitlines()[-60:]
        print("\n--- operator log (tail) ---\n" + "\n".join(tail))


def _healthy(proc: subprocess.Popen[bytes], port: int) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"operator exited with {proc.returncode}")
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).status == 200
    except OSError:
        return False


def _can_i(cluster: Any, operator_ns: str, *args: str) -> bool:
    account = f"system:serviceaccount:{operator_ns}:{ACCOUNT}"
    result = cluster.kubectl("auth", "can-i", *args, "--as", account, check=False)
    return result.stdout.strip() == "yes"


def _ready(cluster: Any, namespace: str, name: str) -> dict[str, Any] | None:
    obj = kubectl_json(cluster, "-n", namespace, "get", "qwd", name)
    conditions = obj.get("status", {}).get("conditions", [])
    return obj if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None


def test_chart_installs_in_a_restricted_namespace(cluster: Any, release: str) -> None:
    deployment = kubectl_json(cluster, "-n", release, "get", "deployment", ACCOUNT)
    assert deployment["status"].get("availableReplicas") == 1, "the restricted namespace refused the pod"
    crd = kubectl_json(cluster, "get", "crd", CRD)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_namespaced_rbac_is_scoped_to_the_watched_namespace(
    cluster: Any, release: str, namespace: str
) -> None:
    assert _can_i(cluster, release, "patch", "qwendeployments.inference.qwenops.dev/status", "-n", namespace)
    assert _can_i(cluster, release, "create", "deployments.apps", "-n", namespace)
    assert _can_i(cluster, release, "list", "nodes")
    assert not _can_i(cluster, release, "create", "deployments.apps", "-n", "default")
    assert not _can_i(cluster, release, "list", "qwendeployments.inference.qwenops.dev", "--all-namespaces")
    assert not _can_i(cluster, release, "get", "secrets", "-n", namespace)


def test_qwendeployment_becomes_ready_and_stays_as_applied(
    cluster: Any, release: str, namespace: str, operator_process: subprocess.Popen[bytes]
) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = namespace
    name = body["metadata"]["name"]
    keys = body["spec"]["gateway"]["apiKeysSecret"]
    cluster.kubectl("-n", namespace, "create", "secret", "generic", keys, "--from-literal=team-a=sk-e2e")
    cluster.kubectl("apply", "--server-side", "--field-manager=gitops", "-f", "-", input=yaml.safe_dump(body))

    obj = wait_until(lambda: _ready(cluster, namespace, name), 180, f"{name} Ready=True")

    # What a GitOps tool compares: the operator changed nothing but status.
    assert obj["spec"] == body["spec"]
    assert not obj["metadata"].get("annotations")
    assert not obj["metadata"].get("finalizers")
    assert obj["metadata"].get("labels", {}) == body["metadata"].get("labels", {})
    fields = kubectl_json(cluster, "-n", namespace, "get", "qwd", name, "--show-managed-fields")
    managers = {(m["manager"], m.get("subresource", "")) for m in fields["metadata"]["managedFields"]}
    assert {m for m, sub in managers if sub != "status"} == {"gitops"}, managers


def test_uninstall_keeps_the_crd(cluster: Any, release: str) -> None:
    helm(cluster, "uninstall", RELEASE, "--namespace", release, "--wait")
    assert kubectl_json(cluster, "get", "crd", CRD)["metadata"]["name"] == CRD
    time.sleep(0.5)
    leftover = cluster.kubectl("get", "clusterrole", f"{ACCOUNT}-cluster-reads", check=False)
    assert leftover.returncode != 0, "the release's ClusterRole outlived the uninstall"
