"""The Helm chart: lint, every ci/ scenario rendered and validated against the Kubernetes 1.36 schemas,
the RBAC objects per scope (their grants, against the table of every grant: tests/test_security.py),
the restricted Pod Security Standard, the strict values schema, manifests/install.yaml's shape, and
the generated files: the notice each carries, and that `python -m qwen_devtools.generate --check` fails
on a stale one. Whether the checked-in ones are fresh is `make verify`'s check, run once per `make test`.

Uses the helm the dev cluster build caches (or QWEN_HELM); rendering pins --kube-version.
"""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from qwen_devtools.devcluster.build import K8S_VERSION
from qwen_devtools.generate import files as generated
from qwen_devtools.generate.__main__ import main as generate
from qwen_devtools.helm import HOW_TO_GET_HELM, helm_path
from qwen_devtools.require import missing
from qwen_operator import cli
from qwen_operator.api.crd import crd

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "qwen-operator"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
INSTALL_YAML = REPO / "manifests" / "install.yaml"
SCHEMA_VERSION = ".".join(K8S_VERSION.lstrip("v").split(".")[:2]) + ".0"
#: Kinds whose CRDs kubernetes-validate does not know: checked by the shape tests below instead.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
#: The operator's ServiceAccount as a binding subject.
OPERATOR_SUBJECT = {"kind": "ServiceAccount", "name": "qwen-operator", "namespace": "qwen-operator-system"}


def helm() -> str:
    path = helm_path()
    if not path.is_file():
        missing(f"helm ({path})", HOW_TO_GET_HELM)
    return str(path)


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120)


@cache
def _render(values: tuple[str, ...], sets: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    args = ["template", "qwen-operator", str(CHART), "--namespace", "qwen-operator-system"]
    args += ["--kube-version", K8S_VERSION]
    for path in values:
        args += ["-f", path]
    for item in sets:
        args += ["--set", item]
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def render(values: Path | None = None, *sets: str) -> list[dict[str, Any]]:
    return list(_render((str(values),) if values else (), sets))


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


# --- lint and schema validation of every scenario --------------------------------------------------


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.stem)
def test_helm_lint_strict(values: Path) -> None:
    result = run_helm("lint", str(CHART), "--strict", "--kube-version", K8S_VERSION, "-f", str(values))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.stem)
def test_every_rendered_object_passes_kubernetes_schema(values: Path) -> None:
    objects = render(values)
    assert objects
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {error.message} at {list(error.path)}")


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.stem)
def test_custom_kinds_have_the_expected_shape(values: Path) -> None:
    for obj in render(values):
        if obj["kind"] == "ServiceMonitor":
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            assert set(obj["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
            for endpoint in obj["spec"]["endpoints"]:
                assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels"}
        elif obj["kind"] == "PrometheusRule":
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            for group in obj["spec"]["groups"]:
                assert set(group) == {"name", "rules"}
                for rule in group["rules"]:
                    assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations"}


# --- the operator Deployment -----------------------------------------------------------------------


LEADER_FLAGS = [
    "--leader-elect",
    "--leader-elect-lease-duration=15",
    "--leader-elect-renew-deadline=10",
    "--leader-elect-retry-period=2",
]


def test_operator_deployment_defaults() -> None:
    objects = render()
    deployment = one(objects, "Deployment", "qwen-operator")
    assert deployment["spec"]["replicas"] == 2  # a leader and a standby (docs/reliability.md)
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    main = container(objects)
    assert main["image"] == "ghcr.io/qwenops/qwen-operator:0.1.0"
    assert main["command"] == ["qwen-operator"]
    assert main["args"] == ["run", "--all-namespaces", "--metrics-port=8080", *LEADER_FLAGS]
    env = {e["name"]: e for e in main["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["QWEN_OPERATOR_RESYNC_SECONDS"]["value"] == "300"
    for probe in ("livenessProbe", "readinessProbe"):
        assert main[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert main["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]


def test_restricted_pod_security_standard() -> None:
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all("hostPath" not in v for v in pod.get("volumes", []))
    ctx = pod["containers"][0]["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in ctx and "add" not in ctx["capabilities"]
    assert {"name": "tmp", "mountPath": "/tmp"} in pod["containers"][0]["volumeMounts"]


def test_namespaced_scope_watches_listed_namespaces_only() -> None:
    main = container(render(CHART / "ci" / "namespaced-values.yaml"))
    assert main["args"] == [
        "run",
        "--namespace=llm",
        "--namespace=team-a",
        "--metrics-port=8080",
        *LEADER_FLAGS,
        "--log-level=debug",
    ]
    args = cli.parser().parse_args(main["args"])  # the operator's own parser accepts them
    assert (args.namespace, args.log_level) == (["llm", "team-a"], "debug")


def test_image_by_digest_ignores_the_tag() -> None:
    main = container(render(CHART / "ci" / "digest-values.yaml", "image.tag=9.9.9"))
    digest = "sha256:4f2a3c1d5e6b7a8f9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b"
    assert main["image"] == f"registry.example.com/mirror/qwen-operator@{digest}"
    assert container(render(None, "image.tag=0.2.0"))["image"] == "ghcr.io/qwenops/qwen-operator:0.2.0"


def test_extra_args_and_env_are_appended() -> None:
    main = container(
        render(
            None,
            "operator.extraArgs[0]=--log-level=warning",
            "operator.extraEnv[0].name=X",
            "operator.extraEnv[0].value=one",
        )
    )
    assert main["args"][-1] == "--log-level=warning"
    assert main["env"][-1] == {"name": "X", "value": "one"}


# --- RBAC (what each role grants: tests/test_security.py) -------------------------------------------


def _roles(objects: list[dict[str, Any]]) -> set[tuple[str, str | None, str]]:
    return {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }


def _bound_to_operator(
    objects: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None
) -> None:
    binding = one([o for o in objects if o["metadata"].get("namespace") == namespace], kind, name)
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [OPERATOR_SUBJECT]


def test_cluster_scope_binds_cluster_roles_and_the_lease_role() -> None:
    objects = render()
    assert _roles(objects) == {
        ("ClusterRole", None, "qwen-operator"),
        ("ClusterRole", None, "qwen-operator-cluster-reads"),
        ("ClusterRole", None, "qwen-operator-edit"),
        ("ClusterRole", None, "qwen-operator-view"),
        ("Role", "qwen-operator-system", "qwen-operator-leader-election"),
    }
    for name in ("qwen-operator", "qwen-operator-cluster-reads"):
        _bound_to_operator(objects, "ClusterRoleBinding", name)
    _bound_to_operator(objects, "RoleBinding", "qwen-operator-leader-election", "qwen-operator-system")


def test_namespaced_scope_has_the_same_role_in_each_watched_namespace() -> None:
    objects = render(CHART / "ci" / "namespaced-values.yaml")
    assert _roles(objects) == {
        ("ClusterRole", None, "qwen-operator-cluster-reads"),
        ("Role", "llm", "qwen-operator"),
        ("Role", "team-a", "qwen-operator"),
        ("Role", "qwen-operator-system", "qwen-operator-leader-election"),
    }
    cluster_wide = one(render(), "ClusterRole", "qwen-operator")["rules"]
    for namespace in ("llm", "team-a"):
        role = one([o for o in objects if o["metadata"].get("namespace") == namespace], "Role")
        assert role["rules"] == cluster_wide  # the same namespaced rules, granted per namespace
        _bound_to_operator(objects, "RoleBinding", "qwen-operator", namespace)
    _bound_to_operator(objects, "ClusterRoleBinding", "qwen-operator-cluster-reads")
    assert not [
        o for o in objects if o["kind"] == "ClusterRoleBinding" and o["metadata"]["name"] == "qwen-operator"
    ]


def test_no_rbac_objects_without_rbac_create() -> None:
    kinds = {o["kind"] for o in render(None, "rbac.create=false")}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


def test_aggregated_roles_let_editors_manage_qwendeployments() -> None:
    objects = render()
    labels = one(objects, "ClusterRole", "qwen-operator-edit")["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert (
        one(objects, "ClusterRole", "qwen-operator-view")["metadata"]["labels"][
            "rbac.authorization.k8s.io/aggregate-to-view"
        ]
        == "true"
    )
    names = {o["metadata"]["name"] for o in render(CHART / "ci" / "namespaced-values.yaml")}
    assert "qwen-operator-edit" not in names


def test_service_account_token_is_mounted_only_into_the_operator_pod() -> None:
    objects = render()
    assert one(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


# --- the CRD ---------------------------------------------------------------------------------------


def test_chart_crd_is_the_generated_crd_and_kept_on_uninstall() -> None:
    rendered = one(render(), "CustomResourceDefinition")
    assert rendered["spec"] == crd()["spec"]
    assert rendered["metadata"]["annotations"] == {
        "helm.sh/resource-policy": "keep",  # helm uninstall and Flux
        "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",  # Argo CD ignores helm's
    }
    not_kept = one(render(None, "crds.keep=false"), "CustomResourceDefinition")
    assert "annotations" not in not_kept["metadata"]


def test_crds_can_be_left_out() -> None:
    assert not [
        o for o in render(CHART / "ci" / "no-crds-values.yaml") if o["kind"] == "CustomResourceDefinition"
    ]


# --- values schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("operater.scope=cluster", "additional properties 'operater' not allowed"),
        ("image.tagg=1.0", "additional properties 'tagg' not allowed"),
        ("serviceMonitor.enable=true", "additional properties 'enable' not allowed"),
        ("tolerations[0].operater=Exists", "additional properties 'operater' not allowed"),
        ("securityContext.runAsUsr=0", "additional properties 'runAsUsr' not allowed"),
        ("operator.scope=everywhere", "operator/scope"),
        ("operator.scope=namespaced", "minItems"),
        ("replicaCount=2,leaderElection.enabled=false", "replicaCount"),
        ("image.digest=sha256:abc", "image/digest"),
        ("prometheusRule.disabledAlerts[0]=QwenTypo", "disabledAlerts"),
    ],
)
def test_values_schema_rejects_mistakes(setting: str, complaint: str) -> None:
    result = run_helm("template", "x", str(CHART), "--kube-version", K8S_VERSION, "--set", setting)
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr


def test_every_described_object_in_the_values_schema_is_closed() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("additionalProperties") is False, f"{where} accepts unknown keys"
            for key, sub in node.items():
                if key not in ("if", "then", "else"):  # conditions on a closed object, not objects
                    walk(sub, f"{where}/{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{where}/{i}")

    walk(schema, "#")


def test_every_value_is_documented_in_the_readme() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def leaves(node: dict[str, Any], prefix: str) -> list[str]:
        out = []
        for key, sub in node["properties"].items():
            path = f"{prefix}{key}"
            out += leaves(sub, f"{path}.") if "properties" in sub else [path]
        return out

    keys = leaves(schema, "")
    assert {k.split(".")[0] for k in keys} == set(values)
    for key in keys:
        assert f"| `{key}` |" in readme, f"{key} missing from the chart README"


# --- monitoring objects ----------------------------------------------------------------------------


def test_monitoring_objects_are_off_by_default() -> None:
    kinds = {o["kind"] for o in render()}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "ConfigMap"}


def test_monitoring_scenario_objects() -> None:
    objects = render(CHART / "ci" / "monitoring-values.yaml")
    service = one(objects, "Service", "qwen-operator-metrics")
    monitor = one(objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    rule = one(objects, "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert "QwenHighTTFTP99" not in {a["alert"] for a in alerts}
    assert all(a["labels"]["team"] == "ml-platform" and a["labels"]["severity"] for a in alerts)
    dashboards = one(objects, "ConfigMap")
    assert dashboards["metadata"]["namespace"] == "monitoring"
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboards["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
    shipped = json.loads((CHART / "dashboards" / "qwen-serving.json").read_text())
    assert json.loads(dashboards["data"]["qwen-serving.json"]) == shipped


# --- generated files -------------------------------------------------------------------------------


def test_install_yaml_starts_with_the_namespace_and_holds_what_e2e_expects() -> None:
    objects = [d for d in yaml.safe_load_all(INSTALL_YAML.read_text()) if d]
    assert objects[0]["kind"] == "Namespace"
    assert objects[0]["metadata"]["name"] == "qwen-operator-system"
    assert objects[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    account = one(objects, "ServiceAccount")
    assert (account["metadata"]["name"], account["metadata"]["namespace"]) == (
        "qwen-operator",
        "qwen-operator-system",
    )
    assert {o["kind"] for o in objects} >= {"CustomResourceDefinition", "ClusterRole", "Deployment"}


def test_check_fails_on_a_stale_or_missing_file_and_names_only_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--check` against a checkout written by the generator itself, then edited: two targets that need
    neither helm nor the vLLM venv stand for the table (the real checkout is `make verify`'s)."""
    checkout = tmp_path / "checkout"
    rules, adapter = generated.RECORDING_RULES, generated.ADAPTER_VALUES
    targets = tuple(t for t in generated.TARGETS if t.path in (rules, adapter))
    assert len(targets) == 2
    assert generate(["--out-dir", str(checkout)], targets=targets) == 0
    assert generate(["--check"], repo=checkout, targets=targets) == 0, "what it wrote is fresh"
    capsys.readouterr()

    edited = (checkout / rules).read_text() + "# edited by hand\n"
    (checkout / rules).write_text(edited)
    assert generate(["--check"], repo=checkout, targets=targets) == 1
    err = capsys.readouterr().err
    assert f"stale: {rules}\n" in err and str(adapter) not in err
    assert "+# edited by hand" not in err and "-# edited by hand" in err  # the diff, checkout to fresh
    assert (checkout / rules).read_text() == edited, "--check writes nothing"

    (checkout / adapter).unlink()
    assert generate(["--check"], repo=checkout, targets=targets) == 1
    assert f"stale: {adapter}\n" in capsys.readouterr().err


#: Where each kind of generated file says that it is generated: a comment, or a field its reader ignores.
JSON_NOTICE_FIELD = {
    "values.schema.json": "$comment",  # JSON Schema's keyword for notes
    "qwen-serving.json": "description",  # Grafana's dashboard description
    "vllm_flags.json": "_generated",  # engine.vllm_flags() reads "flags" and "vllm" only
}
COMMENT_OPENERS = {".yaml": "# ", ".txt": "# ", ".sh": "# ", ".md": "<!-- ", ".tpl": "{{/* "}


@pytest.mark.parametrize("target", generated.TARGETS, ids=lambda t: str(t.path))
def test_every_generated_file_says_so(target: generated.Target) -> None:
    text = (REPO / target.path).read_text()
    if target.path.suffix == ".json":
        field = json.loads(text)[JSON_NOTICE_FIELD[target.path.name]]
        assert "Generated by `make generate` (python -m qwen_devtools.generate)" in field
        assert field.endswith("; do not edit.")
        return
    opener = COMMENT_OPENERS[target.path.suffix]
    head = text.splitlines()[:3]  # a Markdown page keeps its title above the notice
    notices = [line for line in head if line.startswith(f"{opener}Generated by `make generate`")]
    assert notices, f"{target.path} does not start with the generated-file notice:\n" + "\n".join(head)
    assert "(python -m qwen_devtools.generate)" in notices[0] and "; do not edit." in notices[0]
