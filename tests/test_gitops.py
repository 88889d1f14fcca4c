"""GitOps support: the Argo CD health check (run in Lua 5.1, the dialect of Argo CD's gopher-lua) on
statuses the operator's own status function computes, and the Argo CD and Flux examples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.require import missing
from qwen_operator.api.review import review
from qwen_operator.status import Observed, compute_status
from support import example
from test_chart import CHART, render

REPO = Path(__file__).resolve().parents[1]
GITOPS = REPO / "gitops"
HEALTH_LUA = GITOPS / "argocd" / "health-qwendeployment.lua"
HEALTH_KEY = "resource.customizations.health.inference.qwenops.dev_QwenDeployment"


def argocd_health(obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) that Argo CD would show for `obj`."""
    try:
        from lupa.lua51 import LuaRuntime
    except ImportError:
        missing("lupa (Lua for Python)", "pip install lupa into .venv")
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(HEALTH_LUA.read_text())
    return str(result["status"]), str(result["message"])


def resource(status: dict[str, Any] | None, generation: int = 3) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "inference.qwenops.dev/v1alpha1",
        "kind": "QwenDeployment",
        "metadata": {"name": "chat", "namespace": "llm", "generation": generation},
        "spec": {"model": {"name": "Qwen/Qwen3-32B"}, "gpu": {"type": "A100-80GB"}},
    }
    if status is not None:
        body["status"] = status
    return body


def conditions(**statuses: str) -> dict[str, Any]:
    return {
        "observedGeneration": 3,
        "conditions": [
            {"type": kind, "status": value, "reason": f"{kind}Reason", "message": f"{kind} says {value}"}
            for kind, value in statuses.items()
        ],
    }


# --- hand-written statuses -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected", "message"),
    [
        (conditions(Ready="True", ConfigValid="True", Progressing="False"), "Healthy", "Ready says True"),
        (conditions(Ready="False", Progressing="True"), "Progressing", "Ready says False"),
        (conditions(Ready="True", Progressing="True"), "Progressing", "Serving while rolling out"),
        (conditions(Ready="False", ConfigValid="False"), "Degraded", "ConfigValid: ConfigValid says False"),
        (conditions(Ready="False", CapacityFit="False"), "Degraded", "CapacityFit: CapacityFit says False"),
        (conditions(Ready="False", Scheduled="False"), "Degraded", "Scheduled: Scheduled says False"),
        (conditions(Ready="True", ScalingReady="False"), "Degraded", "Autoscaling cannot work"),
        (conditions(Ready="True", MonitoringReady="False"), "Healthy", "Ready says True"),
        (None, "Progressing", "Waiting for the operator to report status"),
        ({"observedGeneration": 3}, "Progressing", "Waiting for the operator to report status"),
    ],
)
def test_health_from_conditions(status: dict[str, Any] | None, expected: str, message: str) -> None:
    health, text = argocd_health(resource(status))
    assert health == expected
    assert message in text


def test_a_new_generation_is_progressing_until_observed() -> None:
    health, text = argocd_health(resource(conditions(Ready="True", Progressing="False"), generation=4))
    assert (health, text) == ("Progressing", "Waiting for the operator to observe generation 4")


def test_stuck_rollout_is_degraded() -> None:
    status = conditions(Ready="True")
    status["conditions"].append(
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "stuck"}
    )
    assert argocd_health(resource(status)) == ("Degraded", "Rollout stuck: stuck")


# --- statuses the operator computes ----------------------------------------------------------------


def _engine(ready: int, desired: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": 1,
            "replicas": desired,
            "updatedReplicas": desired,
            "readyReplicas": ready,
        },
    }


def _pod(scheduled: bool) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "True" if scheduled else "False"}
    if not scheduled:
        condition |= {"reason": "Unschedulable", "message": "0/3 nodes have 2 free nvidia.com/gpu"}
    return {"metadata": {"name": "chat-engine-6d4b9c7f8-abcde"}, "status": {"conditions": [condition]}}


def _too_small() -> dict[str, Any]:
    """bf16 weights on one A100-40GB: the plan does not fit."""
    body = example("a100-80gb-tp2-bf16")
    body["spec"] |= {"gpu": {"type": "A100-40GB"}, "parallelism": {"tensor": 1}}
    return body


OBSERVED = {
    "serving": (Observed(generation=3, engine=_engine(1), gateway={"status": {"readyReplicas": 2}},
                         pods=[_pod(True)]), "Healthy"),
    "loading": (Observed(generation=3, engine=_engine(0), gateway={"status": {"readyReplicas": 2}},
                         pods=[_pod(True)]), "Progressing"),
    "unschedulable": (Observed(generation=3, engine=_engine(0), pods=[_pod(False)]), "Degraded"),
    "invalid": (Observed(generation=3, spec_errors=["spec.parallelism.tensor: must divide 8"]), "Degraded"),
    "does-not-fit": (Observed(generation=3, review=review(_too_small())), "Degraded"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(OBSERVED))
def test_health_of_statuses_the_operator_writes(case: str) -> None:
    observed, expected = OBSERVED[case]
    status = compute_status(observed, previous=None)
    assert argocd_health(resource(status))[0] == expected


# --- manifests -------------------------------------------------------------------------------------


def test_argocd_cm_patch_inlines_the_health_check() -> None:
    patch = yaml.safe_load((GITOPS / "argocd" / "argocd-cm-patch.yaml").read_text())
    assert patch["data"][HEALTH_KEY] == HEALTH_LUA.read_text()


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_argocd_applications_install_the_chart_with_valid_values(tmp_path: Path) -> None:
    chart_app, workloads = _documents(GITOPS / "argocd" / "application.yaml")
    source = chart_app["spec"]["source"]
    assert (REPO / source["path"]) == CHART
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(source["helm"]["valuesObject"]))
    kinds = {o["kind"] for o in render(values)}
    assert {"ServiceMonitor", "PrometheusRule", "Deployment"} <= kinds
    assert "ServerSideApply=true" in chart_app["spec"]["syncPolicy"]["syncOptions"]
    include = workloads["spec"]["source"]["directory"]["include"]
    assert (REPO / workloads["spec"]["source"]["path"] / include).is_file()


def test_flux_example_installs_the_chart_with_valid_values(tmp_path: Path) -> None:
    docs = {d["kind"]: d for d in _documents(GITOPS / "flux" / "qwen-operator.yaml")}
    assert set(docs) == {"GitRepository", "HelmRelease", "Kustomization"}
    release = docs["HelmRelease"]["spec"]
    assert (REPO / release["chart"]["spec"]["chart"]).resolve() == CHART
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(release["values"]))
    assert render(values)
    check = docs["Kustomization"]["spec"]["healthCheckExprs"][0]
    assert (check["apiVersion"], check["kind"]) == ("inference.qwenops.dev/v1alpha1", "QwenDeployment")
    assert {"inProgress", "failed", "current"} <= set(check)
