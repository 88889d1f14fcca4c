"""`helm install` of the chart into the dev cluster, namespaced scope, then a QwenDeployment Ready.

The release goes into a namespace that enforces the restricted Pod Security Standard, so the real
API server admits (or refuses) the operator pod. kwok pods run no containers, so the reconciling is
done by the operator as a local process authenticated as the chart's ServiceAccount, watching one
namespace: a permission the chart's Role or ClusterRole lacks fails here as it would in a cluster.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.operator_proc import OperatorProcess, service_account_kubeconfig
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until

pytestmark = pytest.mark.cluster

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


@pytest.fixture
def operator_process(cluster: Any, release: str, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """`qwen-operator run --namespace <namespace>` as the chart's ServiceAccount."""
    kubeconfig = service_account_kubeconfig(
        cluster, tmp_path / "kubeconfig", namespace=release, account=ACCOUNT
    )
    proc = OperatorProcess(kubeconfig, tmp_path / "operator.log", scope=("--namespace", namespace)).start()
    try:
        yield proc
    finally:
        proc.stop()
        print("\n--- operator log (tail) ---\n" + proc.tail())


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
    replicas = deployment["spec"]["replicas"]
    assert deployment["status"].get("availableReplicas") == replicas, "the restricted namespace refused a pod"
    crd = kubectl_json(cluster, "get", "crd", CRD)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_namespaced_rbac_is_scoped_to_the_watched_namespace(
    cluster: Any, release: str, namespace: str
) -> None:
    qwd = "qwendeployments.inference.qwenops.dev"
    assert _can_i(cluster, release, "patch", qwd, "--subresource=status", "-n", namespace)
    assert not _can_i(cluster, release, "patch", qwd, "-n", namespace)  # only its status
    assert _can_i(cluster, release, "create", "deployments.apps", "-n", namespace)
    assert not _can_i(cluster, release, "list", "nodes")  # free GPUs need cluster-wide pods: cluster scope
    assert not _can_i(cluster, release, "create", "deployments.apps", "-n", "default")
    assert not _can_i(cluster, release, "list", "qwendeployments.inference.qwenops.dev", "--all-namespaces")
    assert not _can_i(cluster, release, "get", "secrets", "-n", namespace)


def test_qwendeployment_becomes_ready_and_stays_as_applied(
    cluster: Any, release: str, namespace: str, operator_process: OperatorProcess
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
