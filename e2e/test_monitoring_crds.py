"""The monitoring objects the operator renders against the real CRDs: ServiceMonitor, PodMonitor and
PrometheusRule generated with controller-gen from prometheus-operator's Go types, ScaledObject from
KEDA's (qwen_devtools.monitoringstack), installed into the session's dev cluster.

Every monitor, rule and ScaledObject rendered from examples/*.yaml and the golden "everything" input is
accepted by the real API server's schema (server-side dry-run apply, strict field validation), and the
operator, run as in test_operator.py, reports MonitoringReady=True once the CRDs exist. The CRDs are
deleted at the end of the module: the other e2e modules expect a cluster without them. Simulated nodes
only: nothing here needs a pod to run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools import keda, monitoringstack
from qwen_devtools.gotools import GoMissing
from qwen_devtools.operator_proc import (
    OPERATOR_USER,
    OperatorProcess,
    audit_writes,
    install,
    service_account_kubeconfig,
)
from qwen_devtools.repo import REPO
from qwen_devtools.require import missing
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review
from qwen_operator.manifests import ClusterFacts, build_children
from qwen_operator.versions import CONTROLLER_TOOLS, KEDA, PROMETHEUS_OPERATOR

pytestmark = pytest.mark.cluster

INPUTS = [
    *sorted((REPO / "examples").glob("*.yaml")),
    REPO / "tests" / "golden" / "inputs" / "everything.yaml",
]
CHECKED_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject"}
NEEDED_CRDS = {
    "servicemonitors.monitoring.coreos.com",
    "podmonitors.monitoring.coreos.com",
    "prometheusrules.monitoring.coreos.com",
    "scaledobjects.keda.sh",
}


@pytest.fixture(scope="module")
def crds(cluster: Any) -> Iterator[list[str]]:
    try:
        monitoringstack.generate_crds()
    except GoMissing as error:
        missing(str(error), "install Go 1.26 (the CRDs are generated from Go types with controller-gen)")
    names = monitoringstack.install_crds(cluster, only=NEEDED_CRDS)
    yield names
    monitoringstack.uninstall_crds(cluster)


def rendered(path: Path, namespace: str) -> list[dict[str, Any]]:
    """The optional monitoring and scaling children of one input, every optional CRD present."""
    body = yaml.safe_load(path.read_text())
    body["metadata"]["namespace"] = namespace
    children = build_children(review(body), ClusterFacts()).objects
    return [c for c in children if c["kind"] in CHECKED_KINDS]


def server_dry_run(cluster: Any, objects: list[dict[str, Any]]) -> Any:
    return cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "--validate=strict", "--field-manager=qwen-operator",
        "-f", "-", "-o", "json", input=yaml.safe_dump_all(objects), check=False,
    )  # fmt: skip


def test_crds_are_generated_from_the_go_types(crds: list[str]) -> None:
    assert set(crds) >= NEEDED_CRDS
    manifest = json.loads((monitoringstack.crds_dir() / "MANIFEST").read_text())
    assert (manifest["prometheus-operator"], manifest["keda"], manifest["controller-tools"]) == (
        PROMETHEUS_OPERATOR,
        KEDA,
        CONTROLLER_TOOLS,
    )
    docs = monitoringstack.crd_documents()
    assert {d["metadata"]["name"] for d in docs} >= NEEDED_CRDS | {"prometheuses.monitoring.coreos.com"}
    for doc in docs:
        assert doc["metadata"]["annotations"]["controller-gen.kubebuilder.io/version"] == CONTROLLER_TOOLS


@pytest.mark.parametrize("path", INPUTS, ids=[p.stem for p in INPUTS])
def test_rendered_monitors_rules_and_scaled_objects_pass_the_real_schema(
    cluster: Any, crds: list[str], namespace: str, path: Path
) -> None:
    objects = rendered(path, namespace)
    assert objects, f"{path.name} renders no monitoring or scaling object"
    result = server_dry_run(cluster, objects)
    assert result.returncode == 0, result.stderr
    assert "unknown field" not in result.stderr and "Warning" not in result.stderr, result.stderr


def test_scaled_objects_keda_can_no_longer_finalize_are_released(
    cluster: Any, crds: list[str], namespace: str
) -> None:
    """keda.down's release_finalized: no KEDA runs here, as after `keda down`; a ScaledObject that
    carries KEDA's finalizer stays, deleted, until it is dropped (a test teardown timed out on one)."""
    scaled = next(o for o in rendered(INPUTS[-1], namespace) if o["kind"] == "ScaledObject")
    scaled["metadata"]["finalizers"] = ["finalizer.keda.sh"]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(scaled))
    name = scaled["metadata"]["name"]
    cluster.kubectl("-n", namespace, "delete", "scaledobject", name, "--wait=false")
    stuck = json.loads(cluster.kubectl("-n", namespace, "get", "scaledobject", name, "-o", "json").stdout)
    assert stuck["metadata"]["deletionTimestamp"], "deleted, held by the finalizer"
    assert f"{namespace}/scaledobjects.keda.sh/{name}" in keda.release_finalized(cluster)

    def gone() -> bool:
        found = cluster.kubectl("-n", namespace, "get", "scaledobject", name, check=False)
        return found.returncode != 0 and "NotFound" in found.stderr

    wait_until(gone, 30, f"ScaledObject {name} gone", interval=0.5)
    assert keda.release_finalized(cluster) == []


def test_every_checked_kind_is_rendered_by_some_input() -> None:
    kinds = {obj["kind"] for path in INPUTS for obj in rendered(path, "ns")}
    assert kinds == CHECKED_KINDS


def test_the_schema_is_enforced(cluster: Any, crds: list[str], namespace: str) -> None:
    """The same dry run refuses what the Go types do not allow, so the acceptance above means something."""
    monitor = next(o for o in rendered(INPUTS[0], namespace) if o["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["scrapeEvery"] = "15s"  # no such field
    result = server_dry_run(cluster, [monitor])
    assert result.returncode != 0 and "scrapeEvery" in result.stderr, result.stderr
    monitor["spec"]["endpoints"][0].pop("scrapeEvery")
    monitor["spec"]["endpoints"][0]["interval"] = "every 15 seconds"  # the type's pattern refuses it
    result = server_dry_run(cluster, [monitor])
    assert result.returncode != 0 and "interval" in result.stderr, result.stderr


@pytest.fixture(scope="module")
def operator(cluster: Any, crds: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    install(cluster)
    tmp = tmp_path_factory.mktemp("operator")
    proc = OperatorProcess(
        service_account_kubeconfig(cluster, tmp / "kubeconfig"), tmp / "operator.log"
    ).start()
    yield
    proc.stop()
    print(f"\n--- operator log (tail) ---\n{proc.tail(60)}")


def test_operator_creates_the_monitors_and_reports_monitoring_ready(
    cluster: Any, operator: None, namespace: str
) -> None:
    body = yaml.safe_load(INPUTS[0].read_text())
    body["metadata"]["namespace"] = namespace
    body["spec"]["monitoring"] = {"serviceMonitor": True, "prometheusRule": True}
    name = body["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))

    def monitoring_ready() -> dict[str, Any] | None:
        obj = json.loads(cluster.kubectl("-n", namespace, "get", "qwd", name, "-o", "json").stdout)
        found = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == "MonitoringReady"]
        return found[0] if found and found[0]["status"] == "True" else None

    try:
        ready = wait_until(monitoring_ready, 120, f"{name} MonitoringReady=True", interval=1)
    except AssertionError:
        print(cluster.kubectl("-n", namespace, "get", "qwd", name, "-o", "yaml").stdout)
        raise
    assert ready["status"] == "True"
    for kind in ("servicemonitor", "podmonitor", "prometheusrule"):
        items = json.loads(cluster.kubectl("-n", namespace, "get", kind, "-o", "json").stdout)["items"]
        assert items, f"the operator created no {kind}"
        assert all(i["metadata"]["ownerReferences"][0]["name"] == name for i in items)


def test_hpa_to_keda_removes_the_hpa_before_the_scaled_object_is_applied(
    cluster: Any, operator: None, namespace: str
) -> None:
    """KEDA's admission webhook (on by default in KEDA's chart) refuses a ScaledObject whose target an
    HPA already scales: applied before the operator's HPA was pruned, the switch would fail on every
    reconcile. The operator prunes an autoscaler the spec no longer wants before applying its successor.
    No KEDA runs here: the order is read from the API server's audit log (the real-node journey runs
    KEDA's webhook and checks its refusal, e2e/test_real_journey.py)."""
    body = yaml.safe_load(INPUTS[0].read_text())
    body["metadata"]["namespace"] = namespace
    body["spec"].pop("replicas", None)
    body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    name = body["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))

    def get(kind: str) -> list[dict[str, Any]]:
        out = cluster.kubectl("-n", namespace, "get", kind, "-o", "json").stdout
        return list(json.loads(out)["items"])

    wait_until(lambda: get("hpa"), 60, "the operator's HPA")
    since = time.time()
    autoscaling = {"driver": "keda", "prometheusAddress": "http://prometheus.monitoring:9090"}
    patch = json.dumps({"spec": {"autoscaling": autoscaling}})
    cluster.kubectl("-n", namespace, "patch", "qwd", name, "--type=merge", "-p", patch)
    wait_until(lambda: get("scaledobject") and not get("hpa"), 60, "the ScaledObject, no HPA")
    writes = [
        (w["verb"], w["objectRef"].get("resource"))
        for w in audit_writes(cluster, [OPERATOR_USER], since)
        if w.get("objectRef", {}).get("namespace") == namespace
    ]
    deleted = writes.index(("delete", "horizontalpodautoscalers"))
    applied = writes.index(("patch", "scaledobjects"))
    assert deleted < applied, writes
