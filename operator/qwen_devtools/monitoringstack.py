"""The dev cluster's monitoring stack, every part real and built here from Go modules: the
monitoring.coreos.com and keda.sh CRDs generated with controller-gen from the projects' own Go types,
prometheus-operator and its config reloader driving a Prometheus that scrapes what the operator's
ServiceMonitors and PodMonitors select, and prometheus-adapter serving custom.metrics.k8s.io to the HPA
controller.

    python -m qwen_devtools.monitoringstack build                # controller-gen, CRDs, Go programs, images
    python -m qwen_devtools.monitoringstack crds --name NAME     # only the CRDs (any dev cluster)
    python -m qwen_devtools.monitoringstack up --name NAME       # the whole stack (needs the real node)
    python -m qwen_devtools.monitoringstack down --name NAME [--crds]

Pods run on the real node (nodeSelector `qwenops.dev/real-node=true`) from images loaded into its
containerd; nothing is pulled. Every build is cached by version under the cache directory.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from qwen_operator import names, recording
from qwen_operator.versions import (
    CONTROLLER_TOOLS,
    KEDA,
    KEDA_MODULE,
    PROMETHEUS,
    PROMETHEUS_ADAPTER,
    PROMETHEUS_ADAPTER_IMAGE,
    PROMETHEUS_ADAPTER_MODULE,
    PROMETHEUS_CONFIG_RELOADER_IMAGE,
    PROMETHEUS_IMAGE,
    PROMETHEUS_MODULE,
    PROMETHEUS_MODULE_VERSION,
    PROMETHEUS_OPERATOR,
    PROMETHEUS_OPERATOR_IMAGE,
    PROMETHEUS_OPERATOR_MODULE,
)

from .cache import cache_dir
from .devcluster.cluster import Cluster, add_cluster_commands, running_cluster
from .gotools import GoMissing, find_go, go_program, module_source, writable_copy
from .wait import wait_until

NAMESPACE = "qwen-monitoring"
#: The Prometheus custom resource; its StatefulSet and pod are prometheus-<name>(-0).
PROMETHEUS_NAME = "qwen"
#: The Service prometheus-operator creates in front of every Prometheus it runs.
PROMETHEUS_SERVICE = "prometheus-operated"
ADAPTER = "prometheus-adapter"
OPERATOR = "prometheus-operator"
REAL_NODE_SELECTOR = {"qwenops.dev/real-node": "true"}
#: On every object of the stack (what `down` deletes by).
STACK_LABELS = {"qwenops.dev/monitoring-stack": "true"}
#: The group/versions prometheus-adapter serves (the HPA controller prefers v1beta2, the issue names v1beta1).
CUSTOM_METRICS_VERSIONS = ("v1beta1", "v1beta2")
CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"
#: The queue depth: a recording rule per engine pod, served to the HPA under the pods metric's name.
QUEUE_RECORD = recording.ENGINE_QUEUE_DEPTH
QUEUE_CUSTOM_METRIC = recording.ADAPTER_METRIC
#: How often the stack scrapes and evaluates (short: tests wait on it), and the adapter relists series.
SCRAPE_INTERVAL = "5s"
ADAPTER_RELIST = "10s"
STACK_TIMEOUT = 300.0

PROMETHEUS_OPERATOR_APIS = f"{PROMETHEUS_OPERATOR_MODULE}/pkg/apis/monitoring"
#: prometheus-operator's go.mod points its nested API and client modules at local directories, which
#: its module zip leaves out: they are built at the published versions of the same tag instead.
_OPERATOR_NESTED = (PROMETHEUS_OPERATOR_APIS, f"{PROMETHEUS_OPERATOR_MODULE}/pkg/client")
#: The Go toolchain's (and controller-gen's) module mode for copies whose go.sum may lack lines.
_MOD_MODE = "-mod=mod"
#: Bump when the CRD generation below changes in a way the versions do not show.
CRD_RECIPE = 1


def log(message: str) -> None:
    print(f"[monitoring] {message}", flush=True)


# --- the Go programs -------------------------------------------------------------------------------------


def _version_stamp() -> str:
    values = {
        "Version": PROMETHEUS_OPERATOR.removeprefix("v"),
        "Revision": PROMETHEUS_OPERATOR,
        "Branch": "HEAD",
    }
    return " ".join(f"-X github.com/prometheus/common/version.{k}={v}" for k, v in values.items())


def _operator_program(binary: str) -> Path:
    return go_program(
        PROMETHEUS_OPERATOR_MODULE,
        PROMETHEUS_OPERATOR,
        "prometheus-operator",
        binary,
        package=f"./cmd/{binary}",
        ldflags=f"-s -w {_version_stamp()}",
        drop_replace=_OPERATOR_NESTED,
    )


def prometheus_operator_bin() -> Path:
    """prometheus-operator's `operator` (cmd/operator), stamped with its version."""
    return _operator_program("operator")


def config_reloader_bin() -> Path:
    """prometheus-config-reloader (cmd/prometheus-config-reloader), the sidecar the operator adds."""
    return _operator_program("prometheus-config-reloader")


def prometheus_bin() -> Path:
    """Prometheus (cmd/prometheus) with Kubernetes service discovery only (its build tags leave the
    other discovery plugins out: less to compile) and without the web UI's assets (the API is served)."""
    values = {"Version": PROMETHEUS, "Revision": PROMETHEUS_MODULE_VERSION, "Branch": "HEAD"}
    stamp = " ".join(f"-X github.com/prometheus/common/version.{k}={v}" for k, v in values.items())
    return go_program(
        PROMETHEUS_MODULE,
        PROMETHEUS_MODULE_VERSION,
        "prometheus",
        "prometheus",
        package="./cmd/prometheus",
        ldflags=f"-s -w {stamp}",
        tags="remove_all_sd,enable_kubernetes_sd",
    )


def adapter_bin() -> Path:
    """prometheus-adapter (cmd/adapter)."""
    return go_program(
        PROMETHEUS_ADAPTER_MODULE,
        PROMETHEUS_ADAPTER,
        "prometheus-adapter",
        "adapter",
        package="./cmd/adapter",
    )


def controller_gen_bin() -> Path:
    """controller-gen of sigs.k8s.io/controller-tools."""
    return go_program(
        "sigs.k8s.io/controller-tools",
        CONTROLLER_TOOLS,
        "controller-gen",
        "controller-gen",
        package="./cmd/controller-gen",
        # the version it writes into every CRD's controller-gen.kubebuilder.io/version annotation
        ldflags=f"-s -w -X sigs.k8s.io/controller-tools/pkg/version.version={CONTROLLER_TOOLS}",
    )


# --- the CRDs ---------------------------------------------------------------------------------------------


def crds_dir() -> Path:
    """Where the generated CRDs of the pinned versions are (a MANIFEST file marks a complete set)."""
    return cache_dir() / (
        f"monitoring-crds-po{PROMETHEUS_OPERATOR}-keda{KEDA}-cg{CONTROLLER_TOOLS}-r{CRD_RECIPE}"
    )


def generate_crds() -> Path:
    """The CRDs, generated once with controller-gen from the Go API types (cached).

    monitoring.coreos.com: ``crd:crdVersions=v1`` over ./v1 and ./v1alpha1 of
    github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring, as prometheus-operator's own
    `make generate-crds` writes its example/prometheus-operator-crd; keda.sh: KEDA's
    ``crd:crdVersions=v1,generateEmbeddedObjectMeta=true`` over its ./apis/keda/v1alpha1.
    """
    out = crds_dir()
    if (out / "MANIFEST").is_file():
        return out
    go = find_go()
    if not go:
        raise GoMissing("Go (to generate the monitoring and KEDA CRDs)")
    controller_gen = controller_gen_bin()
    partial = out.with_name(out.name + ".partial")
    subprocess.run(["rm", "-rf", str(partial)], check=True)
    partial.mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(go).parent), os.environ.get("PATH", "")]),  # go/packages runs go
        "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} {_MOD_MODE}".strip(),
        "CGO_ENABLED": "0",
    }
    sources = (
        (PROMETHEUS_OPERATOR_APIS, PROMETHEUS_OPERATOR, "crd:crdVersions=v1", ("./v1/.", "./v1alpha1/.")),
        (
            KEDA_MODULE,
            KEDA,
            "crd:crdVersions=v1,generateEmbeddedObjectMeta=true",
            ("./apis/keda/v1alpha1/.",),
        ),
    )
    with tempfile.TemporaryDirectory() as tmp:
        for module, version, options, paths in sources:
            started = time.monotonic()
            log(f"controller-gen {options} on {module}@{version}")
            work = writable_copy(module_source(go, module, version), Path(tmp) / module.replace("/", "_"))
            subprocess.run(
                [str(controller_gen), options, *(f"paths={p}" for p in paths), f"output:crd:dir={partial}"],
                cwd=work,
                check=True,
                env=env,
            )
            log(f"CRDs of {module} generated ({time.monotonic() - started:.0f}s)")
    # KEDA's duck type, not a kind (KEDA's own `make manifests` deletes it too)
    (partial / "keda.sh_withtriggers.yaml").unlink(missing_ok=True)
    files = sorted(p.name for p in partial.glob("*.yaml"))
    (partial / "MANIFEST").write_text(
        json.dumps(
            {
                "prometheus-operator": PROMETHEUS_OPERATOR,
                "keda": KEDA,
                "controller-tools": CONTROLLER_TOOLS,
                "files": files,
            },
            indent=1,
        )
    )
    subprocess.run(["rm", "-rf", str(out)], check=True)
    partial.rename(out)
    return out


class _CRDLoader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):  # type: ignore[misc]
    """libyaml's safe loader (5 MB of CRDs: 1.6 s, the pure-Python one 10 s) without YAML 1.1's `=` tag: the
    CRDs have enums with the plain scalar `=` (a relabeling action), which PyYAML refuses to construct."""


_CRDLoader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:value"]
    for first, resolvers in _CRDLoader.yaml_implicit_resolvers.items()
}


def crd_files() -> dict[str, Path]:
    """CRD name -> its generated file (controller-gen names them `<group>_<plural>.yaml`)."""
    files = {}
    for path in sorted(generate_crds().glob("*.yaml")):
        group, _, plural = path.stem.partition("_")
        files[f"{plural}.{group}"] = path
    return files


@functools.cache
def _parse(path: Path, mtime: float) -> tuple[dict[str, Any], ...]:
    return tuple(d for d in yaml.load_all(path.read_text(), Loader=_CRDLoader) if d)


def crd_documents(only: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The generated CRDs (``only``: those of these names), parsed."""
    files = _selected(only)
    return [doc for path in files.values() for doc in _parse(path, path.stat().st_mtime)]


def _selected(only: Iterable[str] | None) -> dict[str, Path]:
    files = crd_files()
    if only is None:
        return files
    wanted = set(only)
    if wanted - set(files):
        raise ValueError(f"no generated CRD named {', '.join(sorted(wanted - set(files)))}")
    return {name: path for name, path in files.items() if name in wanted}


def install_crds(cluster: Cluster, only: Iterable[str] | None = None) -> list[str]:
    """Server-side apply the generated CRDs (``only``: those of these names) and wait until each is
    Established; their names. The whole set is 5 MB; the four the operator's children need, 0.2 MB."""
    files = _selected(only)
    started = time.monotonic()
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=qwen-monitoring-stack",
        *(f"--filename={path}" for path in files.values()), timeout=300,
    )  # fmt: skip
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=120s", *(f"crd/{n}" for n in files), timeout=150
    )
    log(f"{len(files)} CRDs installed and established ({time.monotonic() - started:.0f}s)")
    return list(files)


def uninstall_crds(cluster: Cluster, timeout: float = 120) -> None:
    """Delete the generated CRDs (and so every object of their kinds) and wait until they are gone."""
    cluster.kubectl("delete", "crd", "--ignore-not-found", "--wait=true", *crd_files(), timeout=timeout)


# --- prometheus-adapter's rules ---------------------------------------------------------------------------


def adapter_config() -> dict[str, Any]:
    """prometheus-adapter's configuration: the operator's own rules (recording.py), which the chart ships."""
    return recording.adapter_config()


def _records(groups: Iterable[dict[str, Any]]) -> set[str]:
    return {rule["record"] for group in groups for rule in group.get("rules", []) if "record" in rule}


def stack_rules(rendered_rule: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The PrometheusRule this stack adds so that `qwen_engine:queue_depth` exists, or None when the
    operator's rendered PrometheusRule (``rendered_rule``) already records it (recording the same
    series twice would make the two rules' samples collide).

    The operator's fleet-wide recording rules (`qwen_operator.recording.recording_rules()`, what the
    chart ships).
    """
    if rendered_rule and QUEUE_RECORD in _records(rendered_rule["spec"]["groups"]):
        return None
    rules = list(recording.recording_rules())
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "qwen-recording", "namespace": NAMESPACE, "labels": _rule_labels()},
        "spec": {"groups": [{"name": "qwen-recording", "rules": rules}]},
    }


def _rule_labels() -> dict[str, str]:
    """Rules this stack's Prometheus loads: the operator's children and the stack's own carry it."""
    return {"app.kubernetes.io/part-of": "qwen-operator", **STACK_LABELS}


# --- the objects -------------------------------------------------------------------------------------------


def _meta(name: str, namespace: str | None = NAMESPACE, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {**STACK_LABELS, "app.kubernetes.io/name": name.replace(":", "-"), **labels},
    }
    if namespace:
        meta["namespace"] = namespace
    return meta


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


_READ = ["get", "list", "watch"]
_RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
_RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}}


def _service_account_rbac(name: str, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ServiceAccount in the stack's namespace with a ClusterRole of ``rules`` bound to it."""
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(f"qwen-monitoring:{name}", None),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(f"qwen-monitoring:{name}", None),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"qwen-monitoring:{name}",
            },
            "subjects": subject,
        },
    ]


def _deployment(
    name: str, container: dict[str, Any], volumes: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**STACK_LABELS, **labels}},
                "spec": {
                    "serviceAccountName": name,
                    "nodeSelector": REAL_NODE_SELECTOR,
                    "securityContext": _RESTRICTED_POD,
                    "containers": [
                        {
                            "imagePullPolicy": "IfNotPresent",
                            "securityContext": _RESTRICTED_CONTAINER,
                            **container,
                        }
                    ],
                    "volumes": list(volumes),
                },
            },
        },
    }


def namespace_object() -> dict[str, Any]:
    """The stack's namespace; every pod in it meets Pod Security restricted."""
    labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(NAMESPACE, None, **labels)}


def operator_objects() -> list[dict[str, Any]]:
    """prometheus-operator: its ServiceAccount, ClusterRole (the permissions its own example RBAC
    grants) and Deployment, watching every namespace."""
    group = ["monitoring.coreos.com"]
    kinds = [
        "alertmanagers", "alertmanagerconfigs", "podmonitors", "probes", "prometheusagents", "prometheuses",
        "prometheusrules", "servicemonitors", "scrapeconfigs", "thanosrulers",
    ]  # fmt: skip
    rules = [
        _rule(group, kinds, _READ),
        _rule(group, [f"{k}/finalizers" for k in kinds], ["patch", "update"]),
        _rule(group, [f"{k}/status" for k in kinds], ["create", "update", "patch", "delete"]),
        _rule(group, ["alertmanagers", "prometheusagents", "prometheuses", "thanosrulers"], ["patch"]),
        _rule(["apps"], ["statefulsets"], [*_READ, "create", "update", "patch", "delete"]),
        _rule([""], ["configmaps", "secrets"], [*_READ, "create", "update", "delete"]),
        _rule([""], ["pods"], ["list", "delete"]),
        _rule([""], ["services", "services/finalizers", "endpoints"], ["get", "create", "update", "delete"]),
        _rule([""], ["nodes"], ["list", "watch"]),
        _rule([""], ["namespaces"], _READ),
        _rule(["", "events.k8s.io"], ["events"], ["create", "patch"]),
        _rule(["networking.k8s.io"], ["ingresses"], _READ),
        _rule(["storage.k8s.io"], ["storageclasses"], ["get"]),
        _rule(["discovery.k8s.io"], ["endpointslices"], [*_READ, "create", "update", "delete"]),
    ]
    container = {
        "name": OPERATOR,
        "image": PROMETHEUS_OPERATOR_IMAGE,
        "args": [
            f"--prometheus-config-reloader={PROMETHEUS_CONFIG_RELOADER_IMAGE}",
            "--log-level=info",
            "--web.listen-address=:8080",
        ],
        "ports": [{"name": "http", "containerPort": 8080}],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
    }
    return [*_service_account_rbac(OPERATOR, rules), _deployment(OPERATOR, container)]


def prometheus_objects() -> list[dict[str, Any]]:
    """The Prometheus the operator runs: Prometheus 3 on the real node, loading exactly the
    ServiceMonitors and PodMonitors the qwen-operator manages (label app.kubernetes.io/managed-by) and
    the rules of the qwen-operator (app.kubernetes.io/part-of), from every namespace."""
    managed = {"matchLabels": {"app.kubernetes.io/managed-by": names.MANAGED_BY}}
    rules = [
        _rule([""], ["nodes", "services", "endpoints", "pods"], _READ),
        _rule(["discovery.k8s.io"], ["endpointslices"], _READ),
        _rule([""], ["configmaps"], ["get"]),
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
    ]
    prometheus = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": _meta(PROMETHEUS_NAME),
        "spec": {
            "version": f"v{PROMETHEUS}",
            "image": PROMETHEUS_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "replicas": 1,
            "serviceAccountName": "prometheus",
            "nodeSelector": REAL_NODE_SELECTOR,
            "scrapeInterval": SCRAPE_INTERVAL,
            "evaluationInterval": SCRAPE_INTERVAL,
            "retention": "2h",
            # Prometheus stops in seconds; the default (600 s) would hold `down` up on a stuck pod
            "terminationGracePeriodSeconds": 30,
            "serviceMonitorSelector": managed,
            "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": managed,
            "podMonitorNamespaceSelector": {},
            "ruleSelector": {"matchLabels": {"app.kubernetes.io/part-of": "qwen-operator"}},
            "ruleNamespaceSelector": {},
            "resources": {"requests": {"cpu": "50m", "memory": "200Mi"}},
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "runAsGroup": 65534,
                "fsGroup": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        },
    }
    return [*_service_account_rbac("prometheus", rules), prometheus]


def adapter_objects() -> list[dict[str, Any]]:
    """prometheus-adapter: its configuration, RBAC (resource lookups, delegated authentication and
    authorization), Deployment, Service and the APIServices of custom.metrics.k8s.io."""
    prometheus_url = f"http://{PROMETHEUS_SERVICE}.{NAMESPACE}.svc:9090/"
    rules = [
        _rule([""], ["pods", "nodes", "namespaces", "services"], _READ),
        _rule(["flowcontrol.apiserver.k8s.io"], ["flowschemas", "prioritylevelconfigurations"], _READ),
    ]
    objects = _service_account_rbac(ADAPTER, rules)
    objects += [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta("qwen-monitoring:prometheus-adapter:auth-delegator", None),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": [{"kind": "ServiceAccount", "name": ADAPTER, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta("qwen-monitoring:prometheus-adapter:auth-reader", "kube-system"),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": ADAPTER, "namespace": NAMESPACE}],
        },
        # The HPA controller reads the custom metrics (the dev cluster's controller manager uses its own
        # credentials; a kubeadm cluster's uses this ServiceAccount).
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta("qwen-monitoring:custom-metrics-reader", None),
            "rules": [_rule([CUSTOM_METRICS_GROUP], ["*"], ["get", "list", "watch"])],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta("qwen-monitoring:custom-metrics-reader", None),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "qwen-monitoring:custom-metrics-reader",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"},
                {
                    "kind": "User",
                    "name": "system:kube-controller-manager",
                    "apiGroup": "rbac.authorization.k8s.io",
                },
            ],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(ADAPTER),
            "data": {"config.yaml": yaml.safe_dump(adapter_config(), sort_keys=False)},
        },
        _deployment(
            ADAPTER,
            {
                "name": ADAPTER,
                "image": PROMETHEUS_ADAPTER_IMAGE,
                "args": [
                    "--secure-port=6443",
                    "--cert-dir=/var/run/serving-cert",
                    "--config=/etc/adapter/config.yaml",
                    f"--prometheus-url={prometheus_url}",
                    f"--metrics-relist-interval={ADAPTER_RELIST}",
                    "--v=2",
                ],
                "ports": [{"name": "https", "containerPort": 6443}],
                "readinessProbe": {
                    "httpGet": {"path": "/readyz", "port": "https", "scheme": "HTTPS"},
                    "periodSeconds": 5,
                },
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/adapter", "readOnly": True},
                    {"name": "serving-cert", "mountPath": "/var/run/serving-cert"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            },
            [
                {"name": "config", "configMap": {"name": ADAPTER}},
                {"name": "serving-cert", "emptyDir": {}},
                {"name": "tmp", "emptyDir": {}},
            ],
        ),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(ADAPTER),
            "spec": {
                "selector": {"app.kubernetes.io/name": ADAPTER},
                "ports": [{"name": "https", "port": 443, "targetPort": "https"}],
            },
        },
    ]
    objects += [api_service(version) for version in CUSTOM_METRICS_VERSIONS]
    return objects


def api_service(version: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": _meta(f"{version}.{CUSTOM_METRICS_GROUP}", None),
        "spec": {
            "service": {"name": ADAPTER, "namespace": NAMESPACE, "port": 443},
            "group": CUSTOM_METRICS_GROUP,
            "version": version,
            # the adapter serves a self-signed certificate it makes at start (--cert-dir)
            "insecureSkipTLSVerify": True,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }


def stack_objects(rendered_rule: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Everything `up` applies after the CRDs, in order."""
    rule = stack_rules(rendered_rule)
    return [
        namespace_object(),
        *operator_objects(),
        *prometheus_objects(),
        *([rule] if rule else []),
        *adapter_objects(),
    ]


# --- install, wait, uninstall ----------------------------------------------------------------------------


#: The stack's images (qwen_devtools.images names).
IMAGES = ("prometheus-server", "prometheus-operator", "prometheus-config-reloader", "prometheus-adapter")


def build() -> None:
    """Everything the stack is made of, built once (cached): the CRDs and the four images."""
    from . import images  # podman is only needed here

    started = time.monotonic()
    generate_crds()
    for name in IMAGES:
        images.ensure_image(name)
    log(f"built ({time.monotonic() - started:.0f}s)")


def load_images(cluster_name: str) -> None:
    """The stack's images into the real node's containerd (built first when needed)."""
    from . import images
    from .devcluster import realnode

    for name in IMAGES:
        image = images.ensure_image(name)
        realnode.load_image(cluster_name, image.archive, image.ref)


def apply(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=qwen-monitoring-stack", "-f", "-",
        input=yaml.safe_dump_all(objects), timeout=180,
    )  # fmt: skip


def up(cluster: Cluster, rendered_rule: dict[str, Any] | None = None, timeout: float = STACK_TIMEOUT) -> None:
    """Install the whole stack into a cluster with the real node and wait until it serves: the
    Prometheus pod Ready, the adapter Ready and its APIServices Available. Progress is printed."""
    from .devcluster.nodecomponents import NODE_NAME

    node = _get(cluster, "get", "node", NODE_NAME)
    if not cluster.name or not _condition(node, "Ready"):
        raise RuntimeError(
            f"the monitoring stack runs on the real node {NODE_NAME}, which this cluster has not (Ready):"
            " start it with `python -m qwen_devtools.devcluster up --real-node`"
        )
    started = time.monotonic()
    load_images(cluster.name)
    install_crds(cluster)
    apply(cluster, stack_objects(rendered_rule))
    log("applied prometheus-operator, Prometheus and prometheus-adapter; waiting for them")
    _wait_rollout(cluster, OPERATOR, timeout)
    wait_until(
        lambda: _get(cluster, "-n", NAMESPACE, "get", "statefulset", f"prometheus-{PROMETHEUS_NAME}"),
        timeout,
        f"prometheus-operator to create statefulset prometheus-{PROMETHEUS_NAME}",
        interval=1,
    )
    _wait_pod_ready(cluster, f"prometheus-{PROMETHEUS_NAME}-0", timeout)
    _wait_rollout(cluster, ADAPTER, timeout)
    for version in CUSTOM_METRICS_VERSIONS:
        service = f"{version}.{CUSTOM_METRICS_GROUP}"
        wait_until(_available(cluster, service), timeout, f"APIService {service} Available", interval=1)
    log(f"monitoring stack up in namespace {NAMESPACE} ({time.monotonic() - started:.0f}s)")


def down(cluster: Cluster, crds: bool = False) -> None:
    """Remove the stack: the APIServices first (an unavailable aggregated API slows discovery for
    every client), the namespace, the cluster-scoped RBAC; the CRDs too with ``crds``."""
    for version in CUSTOM_METRICS_VERSIONS:
        cluster.kubectl(
            "delete", "apiservice", "--ignore-not-found", f"{version}.{CUSTOM_METRICS_GROUP}", check=False
        )
    remove_labelled(cluster, NAMESPACE, STACK_LABELS)
    if crds:
        uninstall_crds(cluster)
    log("monitoring stack removed")


def remove_labelled(cluster: Cluster, namespace: str, labels: dict[str, str]) -> None:
    """Delete a stack's cluster-scoped RBAC and kube-system RoleBindings (those carrying `labels`), then
    its namespace and everything in it."""
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    cluster.kubectl(
        "delete", "clusterrolebinding,clusterrole", "-l", selector, "--ignore-not-found", check=False
    )
    cluster.kubectl(
        "-n", "kube-system", "delete", "rolebinding", "-l", selector, "--ignore-not-found", check=False
    )
    cluster.kubectl(
        "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", check=False, timeout=180
    )


def _available(cluster: Cluster, api_service: str) -> Callable[[], bool]:
    return lambda: _condition(_get(cluster, "get", "apiservice", api_service), "Available")


def _get(cluster: Cluster, *args: str) -> Any:
    result = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _condition(obj: dict[str, Any] | None, ctype: str) -> bool:
    return any(
        c["type"] == ctype and c["status"] == "True"
        for c in (obj or {}).get("status", {}).get("conditions", [])
    )


def _wait_rollout(cluster: Cluster, deployment: str, timeout: float) -> None:
    started = time.monotonic()
    _wait_pod_ready(cluster, None, timeout, selector=f"app.kubernetes.io/name={deployment}")
    log(f"{deployment} ready ({time.monotonic() - started:.0f}s)")


def _wait_pod_ready(
    cluster: Cluster, pod: str | None, timeout: float, selector: str | None = None
) -> dict[str, Any]:
    """Wait for a pod (by name, or the first matching ``selector``) to be Ready, printing its changes."""
    what = pod or selector
    last = ""
    started = time.monotonic()

    def ready() -> dict[str, Any] | None:
        nonlocal last
        if pod:
            found = [_get(cluster, "-n", NAMESPACE, "get", "pod", pod)]
        else:
            found = (_get(cluster, "-n", NAMESPACE, "get", "pods", "-l", str(selector)) or {}).get(
                "items", []
            )
        found = [p for p in found if p and not p["metadata"].get("deletionTimestamp")]
        state = _pod_state(found[0]) if found else "no pod yet"
        if state != last:
            log(f"{time.monotonic() - started:4.0f}s {what}: {state}")
            last = state
        return next((p for p in found if _condition(p, "Ready")), None)

    return wait_until(ready, timeout, f"pod {what} Ready", interval=1)


def _pod_state(pod: dict[str, Any]) -> str:
    statuses = pod.get("status", {}).get("initContainerStatuses", []) + pod.get("status", {}).get(
        "containerStatuses", []
    )
    parts = []
    for s in statuses:
        state = next(iter(s.get("state", {})), "?")
        reason = s.get("state", {}).get(state, {}).get("reason", "")
        parts.append(
            f"{s['name']}={state}{f'({reason})' if reason else ''}{'+ready' if s.get('ready') else ''}"
        )
    node = pod.get("spec", {}).get("nodeName", "unscheduled")
    return f"{pod.get('status', {}).get('phase', '?')} on {node}: {' '.join(parts)}"


# --- queries -----------------------------------------------------------------------------------------


#: Prometheus's HTTP API through the API server's service proxy (no port-forward, no host route needed).
_PROMETHEUS_PROXY = f"/api/v1/namespaces/{NAMESPACE}/services/{PROMETHEUS_SERVICE}:web/proxy"


def custom_metric(
    cluster: Cluster, namespace: str, metric: str = QUEUE_CUSTOM_METRIC
) -> dict[str, Any] | None:
    """`kubectl get --raw` of the pods metric ``metric`` of every pod in ``namespace`` (None: not served)."""
    path = f"/apis/{CUSTOM_METRICS_GROUP}/v1beta1/namespaces/{namespace}/pods/*/{metric}"
    result = cluster.kubectl("get", "--raw", path, check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def prometheus_query(cluster: Cluster, query: str) -> list[dict[str, Any]]:
    """An instant query, sent through the API server's service proxy to the Prometheus Service."""
    from urllib.parse import quote

    path = f"{_PROMETHEUS_PROXY}/api/v1/query?query={quote(query)}"
    result = cluster.kubectl("get", "--raw", path)
    return list(json.loads(result.stdout)["data"]["result"])


def prometheus_targets(cluster: Cluster) -> list[dict[str, Any]]:
    """The active scrape targets of the stack's Prometheus."""
    path = f"{_PROMETHEUS_PROXY}/api/v1/targets?state=active"
    result = cluster.kubectl("get", "--raw", path)
    return list(json.loads(result.stdout)["data"]["activeTargets"])


# --- command line ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qwen_devtools.monitoringstack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="controller-gen, the CRDs, the Go programs and the images (cached)")
    subs = add_cluster_commands(
        commands,
        {
            "crds": "install the generated CRDs into a dev cluster",
            "up": "install the whole stack into a dev cluster with the real node",
            "down": "remove the stack from a dev cluster",
        },
    )
    subs["down"].add_argument("--crds", action="store_true", help="also delete the CRDs")
    args = parser.parse_args(argv)
    if args.command == "build":
        build()
        print(crds_dir())
        return 0
    handle = running_cluster(args.name, "monitoring")
    if handle is None:
        return 1
    actions: dict[str, Callable[[], object]] = {
        "crds": lambda: install_crds(handle),
        "up": lambda: up(handle),
        "down": lambda: down(handle, crds=args.crds),
    }
    actions[args.command]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
