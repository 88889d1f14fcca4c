"""The table of generated files: each one's path and how to make it, building them all into a staging
tree, and the comparison of that tree with the checkout (`--check`).

Every file is made under a staging copy of the chart first, so manifests/install.yaml is rendered from
the chart's freshly generated templates, and `--check` writes nothing into the checkout.

Two files need the vLLM CPU venv (the flag table of its parser, the gateway image's requirements).
Without it they are skipped with the command that makes it, or, with QWEN_REQUIRE_REAL_PARTS set (CI),
the run fails: the same rule as the tests' real parts.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from qwen_devtools.helm import HOW_TO_GET_HELM, helm_path
from qwen_devtools.repo import REPO
from qwen_devtools.vllm_env import TOOL_ENV, vllm_venv
from qwen_operator import recording
from qwen_operator.api.crd import crd
from qwen_operator.api.spec import GROUP, KIND
from qwen_operator.versions import KUBERNETES, VLLM, VLLM_ROUTER

from . import chart_values, crd_docs, dashboard, image_requirements, images, rbac
from .header import notice, yaml_comment

HERE = Path(__file__).resolve().parent
CHART = Path("charts/qwen-operator")
RELEASE = "qwen-operator"
NAMESPACE = "qwen-operator-system"
CRD_FILE = Path("crds/inference.qwenops.dev_qwendeployments.yaml")
CHART_CRD = CHART / "templates/crd-qwendeployments.yaml"
RECORDING_RULES = CHART / "rules/qwen-recording.rules.yaml"
ADAPTER_VALUES = CHART / "adapter/prometheus-adapter-values.yaml"
ARGOCD_LUA = Path("gitops/argocd/health-qwendeployment.lua")
VLLM_FLAGS = Path("operator/qwen_operator/api/vllm_flags.json")
HOW_TO_GET_VLLM = "run `make setup`, or only the venv: `.venv/bin/python -m qwen_devtools.vllm_env`"


class MissingPart(Exception):
    """A file cannot be made on this machine: a part it is made from is not installed."""


@dataclass(frozen=True)
class Target:
    """One generated file: its path in the repository and how to make its text from the staging tree."""

    path: Path
    make: Callable[[Path], str]


def helm_binary() -> str:
    """QWEN_HELM, else the helm the dev cluster build caches (the same pinned version everywhere)."""
    helm = helm_path()
    if not helm.is_file():
        sys.exit(f"helm not found at {helm}: {HOW_TO_GET_HELM}")
    return str(helm)


def vllm_python() -> Path:
    """The Python of the cached vLLM CPU venv; MissingPart when the venv is not (completely) made."""
    venv = vllm_venv()
    python = venv / "bin" / "python"
    if not (venv / "READY").exists() or not python.exists():
        raise MissingPart(f"the vLLM CPU venv {venv} is missing; {HOW_TO_GET_VLLM}")
    return python


def _run_in_vllm_venv(script: str, *args: str, timeout: float = 300) -> str:
    # -I: neither the checkout nor this package on sys.path, so nothing here shadows vLLM's imports
    command = [str(vllm_python()), "-I", str(HERE / script), *args]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **TOOL_ENV}
    )
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-5000:]}")
    return result.stdout


def _yaml(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False)


def crd_file(_stage: Path | None = None) -> str:
    return yaml_comment("operator/qwen_operator/api (crd())") + _yaml(crd())


def chart_crd_template(_stage: Path | None = None) -> str:
    """The CRD as a chart template, switched by crds.enabled and kept on uninstall by crds.keep."""
    body = crd()
    spec = _yaml({"spec": body["spec"]})
    if "{{" in spec:
        raise ValueError("the CRD contains '{{', which helm would read as a template action")
    return (
        yaml_comment("operator/qwen_operator/api (crd())")
        + "{{- if .Values.crds.enabled }}\n"
        + f"apiVersion: {body['apiVersion']}\nkind: {body['kind']}\nmetadata:\n"
        + f"  name: {body['metadata']['name']}\n"
        + '  labels:\n    {{- include "qwen-operator.labels" . | nindent 4 }}\n'
        + "  {{- if .Values.crds.keep }}\n  annotations:\n    helm.sh/resource-policy: keep\n"
        + "    argocd.argoproj.io/sync-options: Prune=false,Delete=false\n  {{- end }}\n"
        + spec
        + "{{- end }}\n"
    )


def render_chart(chart_dir: Path) -> str:
    """manifests/install.yaml: the operator's Namespace, then the chart rendered with default values."""
    command = [helm_binary(), "template", RELEASE, str(chart_dir), "--namespace", NAMESPACE]
    command += ["--kube-version", KUBERNETES]  # helm's built-in default depends on how it was built
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr}")
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": NAMESPACE,
            "labels": {
                "app.kubernetes.io/part-of": "qwen-operator",
                "pod-security.kubernetes.io/enforce": "restricted",
            },
        },
    }
    header = yaml_comment(f"{CHART} (helm template {RELEASE} --namespace {NAMESPACE})")
    header += "# Install: kubectl apply --server-side -f manifests/install.yaml\n"
    return header + "---\n" + _yaml(namespace) + result.stdout


def argocd_cm_patch(_stage: Path | None = None) -> str:
    """A patch of Argo CD's argocd-cm adding the QwenDeployment health check (the .lua file, inlined)."""
    lua = (REPO / ARGOCD_LUA).read_text()
    body = "".join(f"    {line}\n" if line else "\n" for line in lua.splitlines())
    return (
        yaml_comment(str(ARGOCD_LUA))
        + "# kubectl -n argocd patch configmap argocd-cm --patch-file gitops/argocd/argocd-cm-patch.yaml\n"
        + "# (argo-cd Helm chart: put the same key under configs.cm)\n"
        + "data:\n"
        + f"  resource.customizations.health.{GROUP}_{KIND}: |\n"
        + body
    )


def values_schema_json(stage: Path) -> str:
    schema = chart_values.values_schema(stage / CHART / "values.yaml")
    # "$comment" is JSON Schema's own keyword for notes to readers; validators ignore it
    stamped = {"$schema": schema.pop("$schema"), "$comment": notice("values.yaml"), **schema}
    return json.dumps(stamped, indent=2) + "\n"


def chart_readme(stage: Path) -> str:
    schema = chart_values.values_schema(stage / CHART / "values.yaml")
    return chart_values.values_readme(stage / CHART, schema)


def dashboard_json(_stage: Path | None = None) -> str:
    model = dashboard.dashboard()
    # Grafana shows the description in the dashboard's settings and keeps it on import
    model["description"] += " " + notice("operator/qwen_devtools/generate/dashboard.py")
    return json.dumps(model, indent=2) + "\n"


def recording_rules_file(_stage: Path | None = None) -> str:
    """The fleet-wide recording rules as a plain Prometheus rule file for the chart's PrometheusRule."""
    return (
        yaml_comment("operator/qwen_operator/recording.py (recording_rules())")
        + "# Recording rules every QwenDeployment's dashboard, alerts, prometheus-adapter and KEDA read\n"
        + "# (docs/monitoring.md#recorded-series). The chart wraps them in its PrometheusRule\n"
        + "# (prometheusRule.enabled, prometheusRule.recordingRules).\n"
        + _yaml({"groups": [{"name": "qwen-recording", "rules": recording.recording_rules()}]})
    )


def adapter_values_file(_stage: Path | None = None) -> str:
    """Values for the prometheus-community/prometheus-adapter chart serving the HPA's queue metric."""
    return (
        yaml_comment("operator/qwen_operator/recording.py (adapter_chart_values())")
        + f"# prometheus-adapter rules serving {recording.ENGINE_QUEUE_DEPTH} as the pods custom metric\n"
        + f"# {recording.ADAPTER_METRIC} that the engine HPA reads (docs/monitoring.md#autoscaling-signal):\n"
        + "#   helm upgrade --install prometheus-adapter prometheus-community/prometheus-adapter \\\n"
        + "#     -f charts/qwen-operator/adapter/prometheus-adapter-values.yaml --set prometheus.url=...\n"
        + "# or copy the list under rules.custom into your own values. The adapter's --config file with\n"
        + "# the same rules: the chart's prometheusAdapter.configMap.\n"
        + _yaml(recording.adapter_chart_values())
    )


def vllm_flags_json(_stage: Path | None = None) -> str:
    """The flag table of vLLM's own parser; engine.vllm_flags() reads `flags` and `vllm` only."""
    table = json.loads(_run_in_vllm_venv("gen_vllm_flags.py"))
    source = f"the argument parser of vLLM {VLLM} in the vLLM CPU venv (gen_vllm_flags.py)"
    return json.dumps({"_generated": notice(source), **table}, indent=1) + "\n"


def operator_requirements(_stage: Path | None = None) -> str:
    return (
        yaml_comment("pyproject.toml's dependencies as installed in the test venv")
        + "# Runtime dependencies of the operator image, pinned to the versions the tests ran with.\n"
        + image_requirements.requirements_text(image_requirements.runtime_closure())
    )


def gateway_requirements(_stage: Path | None = None) -> str:
    return (
        yaml_comment("vllm-router as installed in the vLLM CPU venv")
        + "# vllm-router and its dependency closure, pinned to the versions the tests run with\n"
        + "# (the cached venv made by tools/vllm-env.sh). "
        + "vllm-router's Python part only launches its Rust core.\n"
        + _run_in_vllm_venv("image_requirements.py", f"vllm-router=={VLLM_ROUTER}")
    )


def images_readme(_stage: Path | None = None) -> str:
    return images.images_readme()


#: Every generated file, in the order they are made: the chart's own files before install.yaml, which
#: is rendered from the staged chart.
TARGETS: tuple[Target, ...] = (
    Target(Path(rbac.TEMPLATE), lambda _stage: rbac.managed_kinds_template()),
    Target(CHART_CRD, chart_crd_template),
    Target(CHART / "values.schema.json", values_schema_json),
    Target(CHART / "README.md", chart_readme),
    Target(CHART / "dashboards/qwen-serving.json", dashboard_json),
    Target(RECORDING_RULES, recording_rules_file),
    Target(ADAPTER_VALUES, adapter_values_file),
    Target(CRD_FILE, crd_file),
    Target(Path("docs/crd-reference.md"), lambda _stage: crd_docs.crd_reference()),
    Target(Path("gitops/argocd/argocd-cm-patch.yaml"), argocd_cm_patch),
    Target(Path("manifests/install.yaml"), lambda stage: render_chart(stage / CHART)),
    Target(VLLM_FLAGS, vllm_flags_json),
    Target(Path("images/operator/requirements.txt"), operator_requirements),
    Target(Path("images/gateway/requirements.txt"), gateway_requirements),
    Target(Path("images/README.md"), images_readme),
)


@dataclass
class Built:
    """What a build made under the staging tree, and what it could not make here (path -> why)."""

    written: list[Path]
    skipped: dict[Path, str]


def stage_tree(tmp: Path) -> Path:
    """A staging tree under `tmp` holding a copy of the chart sources."""
    stage = tmp / "tree"
    shutil.copytree(REPO / CHART, stage / CHART)
    return stage


def build(stage: Path, targets: tuple[Target, ...] = TARGETS) -> Built:
    """Write every generated file (or only `targets`) under `stage` (see stage_tree)."""
    built = Built([], {})
    for target in targets:
        try:
            text = target.make(stage)
        except MissingPart as part:
            built.skipped[target.path] = str(part)
            continue
        write(stage / target.path, text)
        built.written.append(target.path)
    return built


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def stale(stage: Path, files: list[Path], repo: Path = REPO) -> list[Path]:
    """The files whose text in the checkout `repo` differs from the staged one; prints the start of each
    diff."""
    found = []
    for rel in files:
        current = repo / rel
        fresh = (stage / rel).read_text()
        if not current.exists() or current.read_text() != fresh:
            found.append(rel)
            old = current.read_text().splitlines() if current.exists() else []
            diff = difflib.unified_diff(old, fresh.splitlines(), str(rel), f"{rel} (fresh)", lineterm="", n=1)
            print("\n".join(list(diff)[:40]), file=sys.stderr)
    return found
