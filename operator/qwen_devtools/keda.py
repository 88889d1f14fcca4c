"""KEDA for the dev cluster: its operator (`keda`, cmd/operator), metrics API server (`keda-adapter`,
cmd/adapter) and admission webhooks (`keda-admission-webhooks`, cmd/webhooks) built from the Go module
github.com/kedacore/keda/v2 at the pinned tag, and the test-only images at the upstream paths
(images/keda, images/keda-metrics-apiserver, images/keda-admission-webhooks) for the real node.

    python -m qwen_devtools.keda build                # programs, images, roles, eventing CRDs (cached)
    python -m qwen_devtools.keda programs             # only the programs; prints their paths
    python -m qwen_devtools.keda generate             # only the roles, eventing CRDs, webhook config
    python -m qwen_devtools.keda load --name NAME     # the images into a dev cluster's real node
    python -m qwen_devtools.keda up --name NAME       # KEDA running on the real node (needs the real node)
    python -m qwen_devtools.keda down --name NAME

The programs are static (CGO off) and stamped as KEDA's Makefile stamps a release (`version.Version`
without the tag's "v", `version.GitCommit`); the keda.sh CRDs come from qwen_devtools.monitoringstack.
The operator's ClusterRole and Role are generated from the `+kubebuilder:rbac` markers of that Go
source, and the eventing.keda.sh CRDs the operator also watches from its API types. `up` runs all three
as pods on the real node in namespace `keda`, as KEDA's own config/ (kustomize) deploys them: the operator,
the metrics API server and the admission webhooks under the ServiceAccount keda-operator, the metrics API
server's RBAC (delegated authentication, the HPA controller reading external metrics), the APIService
v1beta1.external.metrics.k8s.io and the ValidatingWebhookConfiguration keda-admission (the module's
config/webhooks file, as KEDA's chart installs it by default: a ScaledObject whose target another HPA or
ScaledObject scales is refused). The TLS between the API server, the metrics API server, the webhooks and
the operator's gRPC metrics service uses a throw-away CA made here (Secret kedaorg-certs, the APIService's
and the webhooks' caBundle) instead of the operator's --enable-cert-rotation, which waits for the kubelet
to sync the Secret it writes into its own volume (a minute or more) and restarts itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from qwen_operator.versions import (
    CONTROLLER_TOOLS,
    KEDA,
    KEDA_IMAGE,
    KEDA_METRICS_APISERVER_IMAGE,
    KEDA_MODULE,
    KEDA_WEBHOOKS_IMAGE,
)

from .cache import cache_dir
from .gotools import GoMissing, find_go, go_program, module_source, writable_copy

if TYPE_CHECKING:  # devcluster imports the image specs, which import this module
    from .devcluster.cluster import Cluster

#: The cache directory's name: ``<cache>/keda-<tag>/{keda,keda-adapter}``.
CACHE_NAME = "keda"
#: Upstream's binaries and their main packages (KEDA's Makefile: `make manager`, `make adapter`).
OPERATOR_BINARY = "keda"
ADAPTER_BINARY = "keda-adapter"
WEBHOOKS_BINARY = "keda-admission-webhooks"
PROGRAMS = {
    OPERATOR_BINARY: "./cmd/operator",
    ADAPTER_BINARY: "./cmd/adapter",
    WEBHOOKS_BINARY: "./cmd/webhooks",  # `make webhooks`
}
#: The images (qwen_devtools.images names), the operator's first.
IMAGES = ("keda", "keda-metrics-apiserver", "keda-admission-webhooks")
#: The operator's roles as KEDA's `make manifests` generates them (its CONTROLLER_GEN_PATHS), and its
#: eventing CRDs with the options of that target.
OPERATOR_ROLE = "keda-operator"
RBAC_PATHS = ("./apis/...", "./controllers/...", "./pkg/...")
EVENTING_APIS = "./apis/eventing/v1alpha1/."
EVENTING_CRD_OPTIONS = "crd:crdVersions=v1,generateEmbeddedObjectMeta=true"
#: The admission webhooks' ValidatingWebhookConfiguration as the module ships it (not Go: copied, not
#: generated), and the name it is kept under.
WEBHOOK_CONFIG_SOURCE = "config/webhooks/validation_webhooks.yaml"
WEBHOOK_CONFIG_FILE = "validation_webhooks.yaml"
#: Bump when the generation changes in a way the versions do not show.
GENERATED_RECIPE = 2


def log(message: str) -> None:
    print(f"[keda] {message}", flush=True)


def version_stamp() -> str:
    """The -X flags of KEDA's Makefile (GO_LDFLAGS) for the pinned release.

    Its release workflow sets VERSION to the tag without its "v" (what `KEDA Version:` logs and the
    `keda_build_info` metric report). GitCommit is the tag itself: the module zip carries no commit.
    """
    values = {"GitCommit": KEDA, "Version": KEDA.removeprefix("v")}
    return " ".join(f"-X={KEDA_MODULE}/version.{k}={v}" for k, v in values.items())


def _program(binary: str) -> Path:
    """One of KEDA's programs, built once: both took 20 minutes here on 2 shared cores, the operator
    first (gotools checks that this Go is at least the release KEDA's go.mod asks for, `go 1.26.0`)."""
    return go_program(
        KEDA_MODULE,
        KEDA,
        CACHE_NAME,
        binary,
        package=PROGRAMS[binary],
        ldflags=f"-s -w {version_stamp()}",
    )


def operator_bin() -> Path:
    """KEDA's operator, `keda` (cmd/operator): controllers, scalers, the metrics gRPC server."""
    return _program(OPERATOR_BINARY)


def metrics_apiserver_bin() -> Path:
    """KEDA's metrics API server, `keda-adapter` (cmd/adapter): serves external.metrics.k8s.io."""
    return _program(ADAPTER_BINARY)


def webhooks_bin() -> Path:
    """KEDA's admission webhooks, `keda-admission-webhooks` (cmd/webhooks): validate keda.sh objects."""
    return _program(WEBHOOKS_BINARY)


def generated_dir() -> Path:
    """Where the roles and CRDs generated for the pinned versions are (a MANIFEST file marks them done)."""
    return cache_dir() / f"keda-generated-{KEDA}-cg{CONTROLLER_TOOLS}-r{GENERATED_RECIPE}"


def generate() -> Path:
    """What KEDA's `make manifests` generates with controller-gen from its Go source and the keda.sh CRDs
    of qwen_devtools.monitoringstack leave out, once (about 10 s; cached):

    - ``role.yaml``: the operator's ClusterRole `keda-operator` and its Role in namespace `keda` (leases,
      Secrets), from the `+kubebuilder:rbac` markers (``rbac:roleName=keda-operator`` over
      CONTROLLER_GEN_PATHS; the same file as the module's config/rbac/role.yaml);
    - the eventing.keda.sh CRDs (CloudEventSource, ClusterCloudEventSource) of ./apis/eventing/v1alpha1:
      the operator starts their controllers unconditionally, so a cluster that runs it needs them;
    - ``validation_webhooks.yaml``: the module's ValidatingWebhookConfiguration, copied as it is.
    """
    out = generated_dir()
    if (out / "MANIFEST").is_file():
        return out
    go = find_go()
    if not go:
        raise GoMissing("Go (to generate KEDA's roles and eventing CRDs)")
    from .monitoringstack import controller_gen_bin  # the CRDs' controller-gen, built once

    controller_gen = str(controller_gen_bin())
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(go).parent), os.environ.get("PATH", "")]),  # go/packages runs go
        "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -mod=mod".strip(),
        "CGO_ENABLED": "0",
        "GOWORK": "off",
    }
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = writable_copy(module_source(go, KEDA_MODULE, KEDA), Path(tmp) / "src")
        for argv in (
            [
                f"rbac:roleName={OPERATOR_ROLE}",
                *(f"paths={p}" for p in RBAC_PATHS),
                f"output:rbac:dir={partial}",
            ],
            [EVENTING_CRD_OPTIONS, f"paths={EVENTING_APIS}", f"output:crd:dir={partial}"],
        ):
            subprocess.run([controller_gen, *argv], cwd=work, check=True, env=env)
        shutil.copyfile(work / WEBHOOK_CONFIG_SOURCE, partial / WEBHOOK_CONFIG_FILE)
    files = sorted(path.name for path in partial.glob("*.yaml"))
    manifest = {"keda": KEDA, "controller-tools": CONTROLLER_TOOLS, "files": files}
    (partial / "MANIFEST").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    log(f"roles and eventing CRDs generated from KEDA's Go source: {out}")
    return out


def operator_roles() -> list[dict[str, Any]]:
    """The generated ClusterRole `keda-operator` and the Role of the same name in namespace `keda`."""
    return [dict(doc) for doc in yaml.safe_load_all((generate() / "role.yaml").read_text()) if doc]


def eventing_crd_files() -> list[Path]:
    """The generated eventing.keda.sh CRDs (`<group>_<plural>.yaml`, as controller-gen names them)."""
    return sorted(generate().glob("eventing.keda.sh_*.yaml"))


def webhook_configuration() -> dict[str, Any]:
    """The module's ValidatingWebhookConfiguration `keda-admission` (Service keda-admission-webhooks)."""
    return dict(yaml.safe_load((generate() / WEBHOOK_CONFIG_FILE).read_text()))


def build() -> None:
    """The three programs and images, the operator's roles, the eventing CRDs and the webhooks'
    configuration, built once (cached)."""
    from . import images  # podman is only needed here

    started = time.monotonic()
    for name in IMAGES:
        images.ensure_image(name)
    generate()
    log(f"built ({time.monotonic() - started:.0f}s)")


def load_images(cluster_name: str) -> None:
    """KEDA's images into the real node's containerd (built first when needed)."""
    from . import images
    from .devcluster import realnode

    for name in IMAGES:
        image = images.ensure_image(name)
        realnode.load_image(cluster_name, image.archive, image.ref)


# --- running KEDA in the dev cluster ---------------------------------------------------------------------

#: KEDA's namespace, Secret, Services and APIService as its config/ names them (the operator's defaults).
NAMESPACE = "keda"
ACCOUNT = OPERATOR_ROLE
OPERATOR = "keda-operator"
METRICS_APISERVER = "keda-metrics-apiserver"
WEBHOOKS = "keda-admission-webhooks"
WEBHOOK_CONFIGURATION = "keda-admission"
CERT_SECRET = "kedaorg-certs"
EXTERNAL_METRICS_GROUP = "external.metrics.k8s.io"
API_SERVICE = f"v1beta1.{EXTERNAL_METRICS_GROUP}"
#: The user KEDA's operator writes as: it scales targets from zero and back to zero itself (the HPA it
#: creates takes over from one replica up).
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
#: On every object `up` applies (what `down` deletes cluster-scoped objects by).
STACK_LABELS = {"qwenops.dev/keda-stack": "true"}
STACK_TIMEOUT = 180.0
_REAL_NODE_SELECTOR = {"qwenops.dev/real-node": "true"}
_RESTRICTED_CONTAINER = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _meta(name: str, namespace: str | None = NAMESPACE, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {**STACK_LABELS, **labels}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _binding(kind: str, name: str, role_kind: str, role: str, namespace: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": _meta(name, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
    }


def rbac_objects() -> list[dict[str, Any]]:
    """The ServiceAccount both run as, the generated roles bound to it (config/rbac), and the metrics API
    server's own (config/metrics-server: delegated authentication; the HPA controller, which the dev
    cluster runs under its ServiceAccount, reading external metrics)."""
    roles = []
    for role in operator_roles():
        role["metadata"] = _meta(role["metadata"]["name"], role["metadata"].get("namespace"))
        roles.append(role)
    reader = "keda-external-metrics-reader"
    hpa_binding = _binding(
        "ClusterRoleBinding", "keda-hpa-controller-external-metrics", "ClusterRole", reader
    )
    hpa_binding["subjects"] = [
        {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ACCOUNT)},
        *roles,
        _binding("ClusterRoleBinding", OPERATOR_ROLE, "ClusterRole", OPERATOR_ROLE),
        _binding("RoleBinding", OPERATOR_ROLE, "Role", OPERATOR_ROLE, NAMESPACE),
        _binding("ClusterRoleBinding", "keda-system-auth-delegator", "ClusterRole", "system:auth-delegator"),
        _binding(
            "RoleBinding",
            "keda-auth-reader",
            "Role",
            "extension-apiserver-authentication-reader",
            "kube-system",
        ),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(reader, None),
            "rules": [{"apiGroups": [EXTERNAL_METRICS_GROUP], "resources": ["*"], "verbs": ["*"]}],
        },
        hpa_binding,
    ]


def _deployment(
    name: str, image: str, args: list[str], probe: dict[str, Any], ports: list[int]
) -> dict[str, Any]:
    """One of KEDA's two Deployments as config/ has it, on the real node, from the image loaded there."""
    labels = {"app": name}
    container = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": [
            {"name": "WATCH_NAMESPACE", "value": ""},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "ports": [{"containerPort": port} for port in ports],
        # config/ waits 20 s before the first probe; polled every 2 s here, the install is seconds
        "readinessProbe": {**probe, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1000Mi"}},
        "securityContext": _RESTRICTED_CONTAINER,
        "volumeMounts": [
            {"name": "certificates", "mountPath": "/certs", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, app=name),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": {**STACK_LABELS, **labels}},
                "spec": {
                    "serviceAccountName": ACCOUNT,
                    "nodeSelector": _REAL_NODE_SELECTOR,
                    "securityContext": {"runAsNonRoot": True},
                    "terminationGracePeriodSeconds": 10,
                    "containers": [container],
                    "volumes": [
                        {"name": "certificates", "secret": {"secretName": CERT_SECRET}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def _service(name: str, ports: dict[str, tuple[int, int]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name),
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": n, "port": p, "targetPort": t} for n, (p, t) in ports.items()],
        },
    }


def webhook_objects(ca: bytes) -> list[dict[str, Any]]:
    """The webhooks' ValidatingWebhookConfiguration with this CA as every webhook's caBundle (what KEDA's
    certificate rotation patches in), labelled as the stack's."""
    import base64

    config = webhook_configuration()
    if config["metadata"]["name"] != WEBHOOK_CONFIGURATION:
        raise RuntimeError(f"KEDA {KEDA} renamed its webhook configuration: {config['metadata']['name']}")
    config["metadata"] = _meta(WEBHOOK_CONFIGURATION, None, **config["metadata"].get("labels", {}))
    for webhook in config["webhooks"]:
        if webhook["clientConfig"]["service"]["name"] != WEBHOOKS:
            raise RuntimeError(f"KEDA {KEDA}'s webhook {webhook['name']} calls another Service")
        webhook["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
    return [config]


def dns_names(service: str) -> list[str]:
    """A Service's names as KEDA's certificate manager lists them (pkg/certificates)."""
    return [service, *(f"{service}.{NAMESPACE}{suffix}" for suffix in ("", ".svc", ".svc.cluster.local"))]


def stack_objects(tls: dict[str, bytes]) -> list[dict[str, Any]]:
    """Everything `up` applies after the CRDs, in order; ``tls`` from pki.service_tls."""
    import base64

    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(CERT_SECRET),
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in tls.items()},
    }
    operator = _deployment(
        OPERATOR,
        KEDA_IMAGE,
        ["--leader-elect", "--zap-time-encoding=rfc3339", "--enable-cert-rotation=false"],
        {"httpGet": {"path": "/readyz", "port": 8081}},
        [8080, 8081, 9666],
    )
    metrics_apiserver = _deployment(
        METRICS_APISERVER,
        KEDA_METRICS_APISERVER_IMAGE,
        [
            "--client-ca-file=/certs/ca.crt",
            "--tls-cert-file=/certs/tls.crt",
            "--tls-private-key-file=/certs/tls.key",
            "--cert-dir=/certs",
        ],
        {"httpGet": {"path": "/readyz", "port": 6443, "scheme": "HTTPS"}},
        [6443, 8080],
    )
    webhooks = _deployment(
        WEBHOOKS,
        KEDA_WEBHOOKS_IMAGE,
        ["--zap-time-encoding=rfc3339"],
        {"httpGet": {"path": "/readyz", "port": 8081}},
        [9443, 8080, 8081],
    )
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": _meta(API_SERVICE, None),
        "spec": {
            "service": {"name": METRICS_APISERVER, "namespace": NAMESPACE, "port": 443},
            "group": EXTERNAL_METRICS_GROUP,
            "version": "v1beta1",
            "caBundle": base64.b64encode(tls["ca.crt"]).decode(),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    restricted = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(NAMESPACE, None, **restricted)},
        *rbac_objects(),
        secret,
        _service(OPERATOR, {"metricsservice": (9666, 9666), "metrics": (8080, 8080)}),
        _service(METRICS_APISERVER, {"https": (443, 6443), "metrics": (8080, 8080)}),
        _service(WEBHOOKS, {"https": (443, 9443), "metrics": (8080, 8080)}),
        operator,
        metrics_apiserver,
        webhooks,
        api_service,
        *webhook_objects(tls["ca.crt"]),
    ]


def _kubectl_json(cluster: Cluster, *args: str) -> Any:
    result = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _available(cluster: Cluster) -> bool:
    service = _kubectl_json(cluster, "get", "apiservice", API_SERVICE) or {}
    conditions = service.get("status", {}).get("conditions", [])
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


#: KEDA's Deployments and the images they run.
DEPLOYMENTS = {
    OPERATOR: KEDA_IMAGE,
    METRICS_APISERVER: KEDA_METRICS_APISERVER_IMAGE,
    WEBHOOKS: KEDA_WEBHOOKS_IMAGE,
}


def is_up(cluster: Cluster) -> bool:
    """Every Deployment is available with this version's image, the APIService serves and the webhooks
    are configured."""
    if _kubectl_json(cluster, "get", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION) is None:
        return False
    for name, image in DEPLOYMENTS.items():
        dep = _kubectl_json(cluster, "-n", NAMESPACE, "get", "deployment", name)
        if not dep or dep["spec"]["template"]["spec"]["containers"][0]["image"] != image:
            return False
        if dep.get("status", {}).get("availableReplicas", 0) < 1:
            return False
    return _available(cluster)


def up(cluster: Cluster, timeout: float = STACK_TIMEOUT) -> None:
    """KEDA running on the real node and serving external metrics; seconds when already up (its Secret
    and CA are then kept). The keda.sh CRDs come with the monitoring stack's (installed here too)."""
    from . import monitoringstack
    from .devcluster import pki

    started = time.monotonic()
    if is_up(cluster):
        log("KEDA already runs")
        return
    if not cluster.name:
        raise RuntimeError(
            "KEDA runs on a dev cluster's real node: `python -m qwen_devtools.devcluster up --real-node`"
        )
    load_images(cluster.name)
    keda_crds = [n for n in monitoringstack.crd_files() if n.endswith(".keda.sh")]
    monitoringstack.install_crds(cluster, keda_crds)
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=qwen-keda-stack",
        *(f"--filename={path}" for path in eventing_crd_files()), timeout=120,
    )  # fmt: skip
    names = [name for service in DEPLOYMENTS for name in dns_names(service)]
    tls = pki.service_tls("qwen-devcluster-keda", names)
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=qwen-keda-stack", "-f", "-",
        input=yaml.safe_dump_all(stack_objects(tls)), timeout=120,
    )  # fmt: skip
    log("applied KEDA's operator, metrics API server and admission webhooks; waiting for them")
    for name in DEPLOYMENTS:
        cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", f"deployment/{name}", f"--timeout={timeout:.0f}s",
            timeout=timeout + 10,
        )  # fmt: skip
    from .wait import wait_until

    wait_until(lambda: _available(cluster), timeout, f"APIService {API_SERVICE} Available", interval=1)
    log(f"KEDA {KEDA} up in namespace {NAMESPACE} ({time.monotonic() - started:.0f}s)")


def down(cluster: Cluster, crds: bool = False) -> None:
    """Remove what `up` applied (the webhooks' configuration and the APIService first: a webhook without
    its pod costs every keda.sh write a failed call, an unavailable aggregated API slows discovery for
    every client); with ``crds`` the eventing.keda.sh CRDs `up` installed too (the keda.sh ones are the
    monitoring stack's: its `down --crds`). Delete ScaledObjects before: KEDA removes their finalizer;
    any left with it afterwards lose it (release_finalized)."""
    cluster.kubectl(
        "delete", "validatingwebhookconfiguration", "--ignore-not-found", WEBHOOK_CONFIGURATION, check=False
    )  # fmt: skip
    cluster.kubectl("delete", "apiservice", "--ignore-not-found", API_SERVICE, check=False)
    from . import monitoringstack

    monitoringstack.remove_labelled(cluster, NAMESPACE, STACK_LABELS)
    release_finalized(cluster)
    if crds:
        names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in eventing_crd_files()]
        cluster.kubectl("delete", "crd", "--ignore-not-found", *names, check=False, timeout=120)
    log("KEDA removed")


#: The kinds KEDA puts its finalizer on (controllers/keda/*_finalizer.go).
FINALIZED_KINDS = (
    "scaledobjects.keda.sh",
    "scaledjobs.keda.sh",
    "triggerauthentications.keda.sh",
    "clustertriggerauthentications.keda.sh",  # cluster-scoped
)


def release_finalized(cluster: Cluster) -> list[str]:
    """With KEDA gone nothing removes its finalizer: an object that still carries it (one that a
    controller re-created after the caller's delete, say) would never go, nor its namespace, nor the
    keda.sh CRDs. Drop the finalizer from every such object; returns them ("namespace/kind/name", or
    "kind/name" for a cluster-scoped one)."""
    released = []
    for kind in FINALIZED_KINDS:
        found = cluster.kubectl("get", kind, "--all-namespaces", "-o", "json", check=False)
        if found.returncode:
            continue  # no such CRD (any more)
        for item in json.loads(found.stdout)["items"]:
            meta = item["metadata"]
            if not meta.get("finalizers"):
                continue
            where = ["-n", meta["namespace"]] if "namespace" in meta else []
            cluster.kubectl(
                *where, "patch", kind, meta["name"], "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip
            released.append("/".join([*where[1:], kind, meta["name"]]))
    if released:
        log(f"KEDA is gone: finalizer dropped from {', '.join(released)}")
    return released


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qwen_devtools.keda",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "build", help="the three Go programs, their images, the roles, eventing CRDs, webhook config (cached)"
    )
    commands.add_parser("programs", help="only the three Go programs (cached); prints their paths")
    commands.add_parser(
        "generate", help="only the operator's roles, the eventing CRDs and the webhook config (cached)"
    )
    from .devcluster.cluster import add_cluster_commands  # not at import: see the cycle above

    subs = add_cluster_commands(
        commands,
        {
            "load": "import the images into a dev cluster's real node",
            "up": "run KEDA on a dev cluster's real node (images, CRDs, RBAC, Deployments, APIService, "
            "webhooks)",
            "down": "remove KEDA from a dev cluster",
        },
    )
    subs["down"].add_argument("--crds", action="store_true", help="also delete the eventing.keda.sh CRDs")
    args = parser.parse_args(argv)
    try:
        if args.command == "programs":
            print(operator_bin())
            print(metrics_apiserver_bin())
            print(webhooks_bin())
        elif args.command == "generate":
            print(generate())
        elif args.command == "build":
            build()
        elif args.command == "load":
            load_images(args.name)
        else:
            from .devcluster.cluster import running_cluster

            handle = running_cluster(args.name, "keda")
            if handle is None:
                return 1
            if args.command == "up":
                up(handle)
            else:
                down(handle, crds=args.crds)
    except RuntimeError as error:  # GoMissing, PodmanMissing
        print(f"[keda] {error}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as error:
        print(
            f"[keda] {error.cmd[0]} failed with exit status {error.returncode} (output above)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
