"""KEDA built from its Go module (qwen_devtools.keda): the release stamp, the roles and CRDs generated
from its Go source, and the Go release check its go.mod needs (qwen_devtools.gotools). Its images'
specs are checked with the others in tests/test_images.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools import gotools, keda
from qwen_devtools.require import missing
from qwen_operator import versions


def test_keda_programs_are_stamped_as_a_release_of_the_pin() -> None:
    stamp = keda.version_stamp().split()
    module = versions.KEDA_MODULE
    assert stamp == [f"-X={module}/version.GitCommit={versions.KEDA}", f"-X={module}/version.Version=2.21.0"]
    assert versions.KEDA_MODULE == "github.com/kedacore/keda/v2" and versions.KEDA.startswith("v2.")


def test_the_generated_files_are_keyed_by_the_versions_they_come_from() -> None:
    name = keda.generated_dir().name
    assert name == f"keda-generated-{versions.KEDA}-cg{versions.CONTROLLER_TOOLS}-r{keda.GENERATED_RECIPE}"
    # KEDA's own `make manifests` paths and CRD options
    assert keda.RBAC_PATHS == ("./apis/...", "./controllers/...", "./pkg/...")
    assert keda.EVENTING_CRD_OPTIONS == "crd:crdVersions=v1,generateEmbeddedObjectMeta=true"


def _generated() -> Path:
    out = keda.generated_dir()
    # `make setup` generates them (`keda build`): CI fails here, a dev machine skips
    if not (out / "MANIFEST").is_file():
        missing(f"KEDA's generated roles and CRDs ({out})", "run python -m qwen_devtools.keda generate")
    return out


def _grants(rules: list[dict[str, list[str]]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_the_operators_roles_let_it_scale_workloads_and_keep_its_leases() -> None:
    _generated()
    roles = {role["kind"]: role for role in keda.operator_roles()}
    assert sorted(roles) == ["ClusterRole", "Role"]
    assert {role["metadata"]["name"] for role in roles.values()} == {keda.OPERATOR_ROLE}
    cluster = roles["ClusterRole"]["rules"]
    assert _grants(cluster, "*", "*/scale", "update")  # the scale subresource of a ScaledObject's target
    assert _grants(cluster, "keda.sh", "scaledobjects", "watch")
    assert _grants(cluster, "keda.sh", "scaledobjects/status", "update")
    assert _grants(cluster, "autoscaling", "horizontalpodautoscalers", "create")
    assert _grants(cluster, "apiregistration.k8s.io", "apiservices", "patch")  # its CA bundle
    namespaced = roles["Role"]
    assert namespaced["metadata"]["namespace"] == "keda"  # the markers' namespace: bind it where KEDA runs
    assert _grants(namespaced["rules"], "coordination.k8s.io", "leases", "create")
    assert _grants(namespaced["rules"], "", "secrets", "create")  # its certificates' Secret


def test_the_eventing_crds_the_operator_watches_are_generated() -> None:
    _generated()
    names = []
    for path in keda.eventing_crd_files():
        (crd,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert crd["kind"] == "CustomResourceDefinition"
        annotation = crd["metadata"]["annotations"]["controller-gen.kubebuilder.io/version"]
        assert annotation == versions.CONTROLLER_TOOLS
        names.append(crd["metadata"]["name"])
    assert names == ["cloudeventsources.eventing.keda.sh", "clustercloudeventsources.eventing.keda.sh"]


# --- the Go release a module asks for ---------------------------------------------------------------------


def _fake_go(tmp_path: Path, version: str, toolchain: str = "local") -> str:
    """A `go` whose `go env GOVERSION GOTOOLCHAIN` answers as a Go of ``version`` would."""
    go = tmp_path / "go"
    go.write_text(f"#!/bin/sh\nprintf '%s\\n%s\\n' {version} {toolchain}\n")
    go.chmod(0o755)
    return str(go)


def test_a_go_older_than_the_modules_go_line_is_refused_with_the_release_to_install(tmp_path: Path) -> None:
    module = tmp_path / "module"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/m\n\ngo 1.26.0\n\nrequire example.com/x v1.0.0\n")
    assert gotools.go_directive((module / "go.mod").read_text()) == "1.26.0"
    gotools.require_go(_fake_go(tmp_path, "go1.26.8"), module, "m")
    gotools.require_go(_fake_go(tmp_path, "go1.26rc1"), module, "m")  # a pre-release counts as 1.26
    with pytest.raises(gotools.GoTooOld, match=r"Go 1\.26\.0 or newer \(to build m; .* is go1\.25\.9\)"):
        gotools.require_go(_fake_go(tmp_path, "go1.25.9"), module, "m")
    assert issubclass(gotools.GoTooOld, gotools.GoMissing)  # callers that skip without Go skip too
    # with GOTOOLCHAIN=auto the go command fetches the release itself
    gotools.require_go(_fake_go(tmp_path, "go1.25.9", "auto"), module, "m")
    (module / "go.mod").write_text("module example.com/m\n\ngo 1.27\n")
    with pytest.raises(gotools.GoTooOld):
        gotools.require_go(_fake_go(tmp_path, "go1.26.8"), module, "m")


def test_the_dev_cluster_install_binds_the_roles_and_trusts_one_ca_for_every_service() -> None:
    """What `keda up` applies (qwen_devtools.keda.stack_objects): the generated roles bound to the one
    ServiceAccount the three programs run as, the three Deployments on the real node from the pinned
    images, and one certificate, signed by the CA the APIService and every admission webhook trust, for
    the three Services' names (the metrics API server serves with it and presents it to the operator's
    gRPC service; the webhooks serve with it). Run for real: e2e/test_real_journey.py."""
    import base64

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    from qwen_devtools.devcluster import pki

    _generated()
    names = [name for service in keda.DEPLOYMENTS for name in keda.dns_names(service)]
    objects = keda.stack_objects(pki.service_tls("test-ca", names))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    roles = {(r["kind"], r["metadata"]["name"]) for r in by_kind["ClusterRole"] + by_kind["Role"]}
    for binding in by_kind["ClusterRoleBinding"] + by_kind["RoleBinding"]:
        ref = binding["roleRef"]
        builtin = ref["name"] in ("system:auth-delegator", "extension-apiserver-authentication-reader")
        assert builtin or (ref["kind"], ref["name"]) in roles, binding
    deployments = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in by_kind["Deployment"]}
    assert {n: s["containers"][0]["image"] for n, s in deployments.items()} == {
        keda.OPERATOR: versions.KEDA_IMAGE,
        keda.METRICS_APISERVER: versions.KEDA_METRICS_APISERVER_IMAGE,
        keda.WEBHOOKS: versions.KEDA_WEBHOOKS_IMAGE,
    }
    assert all(s["serviceAccountName"] == keda.ACCOUNT for s in deployments.values())
    assert all(s["nodeSelector"] == {"qwenops.dev/real-node": "true"} for s in deployments.values())
    assert "--enable-cert-rotation=false" in deployments[keda.OPERATOR]["containers"][0]["args"]
    (secret,) = by_kind["Secret"]
    tls = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    (service,) = by_kind["APIService"]
    assert base64.b64decode(service["spec"]["caBundle"]) == tls["ca.crt"]
    # KEDA's chart's default: the webhooks on, each calling the webhooks' Service with the same CA
    (config,) = by_kind["ValidatingWebhookConfiguration"]
    hooks = {w["name"]: w["clientConfig"] for w in config["webhooks"]}
    assert "vscaledobject.kb.io" in hooks, sorted(hooks)
    assert {c["service"]["name"] for c in hooks.values()} == {keda.WEBHOOKS}
    assert {base64.b64decode(c["caBundle"]) for c in hooks.values()} == {tls["ca.crt"]}
    (webhook_service,) = [s for s in by_kind["Service"] if s["metadata"]["name"] == keda.WEBHOOKS]
    assert {p["port"]: p["targetPort"] for p in webhook_service["spec"]["ports"]}[443] == 9443
    ca, cert = x509.load_pem_x509_certificate(tls["ca.crt"]), x509.load_pem_x509_certificate(tls["tls.crt"])
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == set(names)
    assert "keda-operator.keda.svc.cluster.local" in names  # the adapter's --metrics-service-address
    assert f"{keda.METRICS_APISERVER}.keda.svc" in names  # the aggregator's name for the APIService
    assert f"{keda.WEBHOOKS}.keda.svc" in names  # the name the API server calls a webhook Service by
