"""Security of what the operator installs and renders.

RBAC: the operator's effective grants (every rule of every role bound to its ServiceAccount, resolved
through the bindings) in both install modes of the chart and in manifests/install.yaml, compared with
the explicit table below, so that a new grant is a deliberate edit here and in docs/security.md. No
wildcard, no Secret verb but `create`, no cluster-wide grant in namespaced mode but cluster-scoped reads.

Pod Security: a checker of the `restricted` Pod Security Standard (the rules of Kubernetes' Pod Security
admission, by its check ids) over the operator pod (chart, install.yaml) and the gateway and engine pods
`build_children` renders for every example and golden input. The engine's one exception is named;
e2e/test_security.py shows the real admission agrees.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.devcluster.build import K8S_VERSION
from qwen_devtools.helm import HOW_TO_GET_HELM, helm_path
from qwen_devtools.require import missing
from qwen_operator import names
from qwen_operator.api.queueing import METRICS_API_SERVICE
from qwen_operator.api.review import Review, review
from qwen_operator.kinds import MANAGED
from qwen_operator.manifests import ClusterFacts, build_children
from qwen_operator.manifests.gateway import generated_engine_key_secret
from qwen_operator.manifests.policy import DEFAULT_SCRAPERS, build_engine_network_policy, parse_scrapers
from qwen_operator.recording import ADAPTER_METRIC
from support import EXAMPLES, GOLDEN, REPO, load

CHART = REPO / "charts" / "qwen-operator"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
NAMESPACED_VALUES = CHART / "ci" / "namespaced-values.yaml"
INSTALL_YAML = REPO / "manifests" / "install.yaml"
RELEASE_NAMESPACE = "qwen-operator-system"
ACCOUNT = (RELEASE_NAMESPACE, "qwen-operator")
#: The namespaces ci/namespaced-values.yaml watches.
WATCHED = ("llm", "team-a")

# --- the expected grants (docs/security.md gives the reason for each) ------------------------------

#: In every namespace the operator manages (cluster-wide in cluster scope): (apiGroup, resource) -> verbs.
MANAGED_NAMESPACE: dict[tuple[str, str], tuple[str, ...]] = {
    ("inference.qwenops.dev", "qwendeployments"): ("get", "list", "watch"),
    ("inference.qwenops.dev", "qwendeployments/status"): ("patch",),
    ("inference.qwenops.dev", "qwendeployments/finalizers"): ("update",),
    ("", "pods"): ("get", "list", "watch"),
    ("", "events"): ("create", "patch", "list", "watch"),
    ("", "secrets"): ("create",),
    ("custom.metrics.k8s.io", f"pods/{ADAPTER_METRIC}"): ("get",),
}
#: The child kinds, listed here (not read from kinds.MANAGED) so that a new kind is a deliberate edit.
CHILD_KINDS = {
    ("", "configmaps"),
    ("", "serviceaccounts"),
    ("", "services"),
    ("apps", "deployments"),
    ("autoscaling", "horizontalpodautoscalers"),
    ("gateway.networking.k8s.io", "httproutes"),
    ("keda.sh", "scaledobjects"),
    ("monitoring.coreos.com", "podmonitors"),
    ("monitoring.coreos.com", "prometheusrules"),
    ("monitoring.coreos.com", "servicemonitors"),
    ("networking.k8s.io", "ingresses"),
    ("networking.k8s.io", "networkpolicies"),
    ("policy", "poddisruptionbudgets"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("rbac.authorization.k8s.io", "roles"),
}
CHILD_VERBS = ("get", "list", "watch", "create", "patch", "update", "delete")
#: Cluster-scoped reads in both scopes: (apiGroup, resource, resourceName or "" for all) -> verbs.
CLUSTER_READS: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions", ""): ("get", "list", "watch"),
    **{
        ("apiregistration.k8s.io", "apiservices", name): ("get", "list", "watch")
        for name in sorted(METRICS_API_SERVICE.values())
    },
}
#: Cluster scope only: nodes, for free GPUs (counted with the cluster-wide pod watch).
CLUSTER_SCOPE_READS = {("", "nodes", ""): ("list", "watch")}
#: Namespaced scope only: kopf's observer of the watched namespaces.
NAMESPACED_SCOPE_READS = {("", "namespaces", ""): ("list", "watch")}
#: In the operator's own namespace: its leader-election Lease.
OWN_NAMESPACE = {("coordination.k8s.io", "leases", ""): ("get", "create", "update")}
#: Resources that exist outside namespaces (the only ones a namespaced install may hold cluster-wide).
CLUSTER_SCOPED = {"customresourcedefinitions", "apiservices", "namespaces", "nodes"}


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource: cluster-wide ("*", a ClusterRoleBinding) or in one namespace."""

    where: str
    group: str
    resource: str
    verb: str
    name: str = ""  # a resourceNames entry; "" for every object


def _table(where: str, rules: Mapping[tuple[str, str, str], tuple[str, ...]]) -> set[Grant]:
    return {Grant(where, g, r, v, n) for (g, r, n), verbs in rules.items() for v in verbs}


def _namespace_rules() -> dict[tuple[str, str, str], tuple[str, ...]]:
    children = {(g, r, ""): CHILD_VERBS for g, r in CHILD_KINDS}
    return {(g, r, ""): verbs for (g, r), verbs in MANAGED_NAMESPACE.items()} | children


def expected_grants(watched: tuple[str, ...] | None) -> set[Grant]:
    """The operator's grants in cluster scope (watched None) or in namespaced scope over `watched`."""
    own = _table(RELEASE_NAMESPACE, OWN_NAMESPACE)
    if watched is None:
        return own | _table("*", _namespace_rules() | CLUSTER_READS | CLUSTER_SCOPE_READS)
    per_namespace = set().union(*(_table(ns, _namespace_rules()) for ns in watched))
    return own | per_namespace | _table("*", CLUSTER_READS | NAMESPACED_SCOPE_READS)


# --- rendering and resolving -------------------------------------------------------------------------


@cache
def _render(values: Path | None, *sets: str) -> tuple[dict[str, Any], ...]:
    """The chart rendered with a values file and `--set` items (cached: rendering takes a second)."""
    helm = helm_path()
    if not helm.is_file():
        missing(f"helm ({helm})", HOW_TO_GET_HELM)
    args = [str(helm), "template", "qwen-operator", str(CHART), "--namespace", RELEASE_NAMESPACE]
    args += ["--kube-version", K8S_VERSION, *(["-f", str(values)] if values else [])]
    args += [arg for item in sets for arg in ("--set", item)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def install_yaml() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(INSTALL_YAML.read_text()) if d]


#: The three installs: chart in cluster scope, chart in namespaced scope, install.yaml.
INSTALLS = {
    "chart-cluster": (lambda: list(_render(None)), None),
    "chart-namespaced": (lambda: list(_render(NAMESPACED_VALUES)), WATCHED),
    "install-yaml": (install_yaml, None),
}


def _is_operator(subject: dict[str, Any]) -> bool:
    return (subject.get("kind"), subject.get("namespace"), subject.get("name")) == (
        "ServiceAccount",
        *ACCOUNT,
    )


def _rules_grants(where: str, rules: list[dict[str, Any]]) -> set[Grant]:
    out = set()
    for rule in rules:
        assert "nonResourceURLs" not in rule, rule
        names = rule.get("resourceNames") or [""]
        for g, r, v, n in product(rule["apiGroups"], rule["resources"], rule["verbs"], names):
            out.add(Grant(where, g, r, v, n))
    return out


def operator_grants(objects: list[dict[str, Any]]) -> set[Grant]:
    """Every grant of every role bound to the operator's ServiceAccount, where the binding puts it."""
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o.get("rules", [])
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    grants: set[Grant] = set()
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(_is_operator(s) for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        key = (ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])
        assert key in roles, f"{binding['kind']} {binding['metadata']['name']} binds a role not installed"
        where = "*" if binding["kind"] == "ClusterRoleBinding" else namespace
        grants |= _rules_grants(where, roles[key])
    return grants


# --- RBAC --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_operator_grants_are_exactly_the_table(install: str) -> None:
    objects, watched = INSTALLS[install]
    granted, expected = operator_grants(objects()), expected_grants(watched)
    assert sorted(granted - expected) == [], "granted but not in the table: a deliberate edit needs both"
    assert sorted(expected - granted) == [], "in the table but not granted"


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_secrets_can_only_be_created(install: str) -> None:
    objects, _ = INSTALLS[install]
    verbs = {g.verb for g in operator_grants(objects()) if (g.group, g.resource) == ("", "secrets")}
    assert verbs == {"create"}  # the generated API-key Secret; never get, list, watch or overwrite


@pytest.mark.parametrize("install", sorted(INSTALLS))
def test_no_escalation_verbs(install: str) -> None:
    objects, _ = INSTALLS[install]
    assert not {"bind", "escalate", "impersonate"} & {g.verb for g in operator_grants(objects())}


def test_namespaced_scope_holds_only_cluster_scoped_reads_cluster_wide() -> None:
    cluster_wide = {g for g in operator_grants(list(_render(NAMESPACED_VALUES))) if g.where == "*"}
    assert cluster_wide, "the CRD and APIService reads are cluster-wide"
    assert {g.resource for g in cluster_wide} <= CLUSTER_SCOPED
    assert {g.verb for g in cluster_wide} <= {"get", "list", "watch"}
    assert "nodes" not in {g.resource for g in cluster_wide}  # free GPUs need cluster-wide pods too
    namespaces = {g.where for g in operator_grants(list(_render(NAMESPACED_VALUES))) if g.where != "*"}
    assert namespaces == {*WATCHED, RELEASE_NAMESPACE}


def test_no_lease_grant_without_leader_election() -> None:
    objects = list(_render(None, "leaderElection.enabled=false", "replicaCount=1"))
    assert operator_grants(objects) == expected_grants(None) - _table(RELEASE_NAMESPACE, OWN_NAMESPACE)


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.stem)
def test_no_wildcard_in_any_rule(values: Path) -> None:
    for obj in _render(values):
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in obj["rules"]:
            fields = ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs")
            values_ = [v for f in fields for v in rule.get(f, [])]
            assert not [v for v in values_ if "*" in v], f"{obj['metadata']['name']}: {rule}"


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.stem)
def test_every_role_is_the_operators_or_aggregated_for_users(values: Path) -> None:
    """No role lies about: each is bound to the operator, or is an aggregated QwenDeployment role."""
    objects = list(_render(values))
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in objects
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(_is_operator(s) for s in b["subjects"])
    }
    for role in (o for o in objects if o["kind"] in ("Role", "ClusterRole")):
        if (role["kind"], role["metadata"]["name"]) in bound:
            continue
        labels = role["metadata"].get("labels", {})
        assert any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in labels), role["metadata"]
        for rule in role["rules"]:  # users' QwenDeployment rights only
            assert rule["apiGroups"] == ["inference.qwenops.dev"]
            assert all(r.startswith("qwendeployments") for r in rule["resources"])


def test_the_child_kind_table_is_kinds_managed() -> None:
    """The table above is the list the chart's child rules are generated from (and the one the operator's
    informers watch: a Secret there would be watched, i.e. read)."""
    assert {(k.group, k.plural) for k in MANAGED} == CHILD_KINDS


# --- Pod Security: the restricted standard -----------------------------------------------------------

#: Volume types the restricted standard allows.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
#: The engine pod's only restricted violation (see build_engine_deployment and docs/security.md).
ENGINE_EXCEPTIONS = ["runAsNonRoot"]
#: With spec.lora, the lora-sync sidecar runs as root as well (it writes Hub downloads into the engine's
#: root-owned model cache): runAsUser 0, forced because the operator image's user is not root.
LORA_EXCEPTIONS = ["runAsNonRoot", "runAsUser"]


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod.get("containers", []), *pod.get("ephemeralContainers", [])]


def _every(pod: dict[str, Any], field: str, ok: Any) -> bool:
    """A pod-level security field, overridable per container, is `ok` for every container."""
    pod_value = pod.get("securityContext", {}).get(field)
    values = [c.get("securityContext", {}).get(field, pod_value) for c in _containers(pod)]
    return all(ok(v) for v in values)


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """The checks of the baseline standard that `pod` (a pod spec) fails, by Pod Security check id."""
    ctx = pod.get("securityContext", {})
    contexts = [ctx, *(c.get("securityContext", {}) for c in _containers(pod))]
    failed = {
        "hostNamespaces": any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")),
        "privileged": any(c.get("securityContext", {}).get("privileged") for c in _containers(pod)),
        "capabilities_baseline": any(
            set(c.get("securityContext", {}).get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
            for c in _containers(pod)
        ),
        "hostPathVolumes": any("hostPath" in v for v in pod.get("volumes", [])),
        "hostPorts": any(p.get("hostPort") for c in _containers(pod) for p in c.get("ports", [])),
        "appArmorProfile": any(
            c.get("appArmorProfile", {}).get("type", "RuntimeDefault") not in ("RuntimeDefault", "Localhost")
            for c in contexts
        ),
        "seLinuxOptions": any(
            c.get("seLinuxOptions", {}).get("type", "") not in SELINUX_TYPES
            or {"user", "role"} & set(c.get("seLinuxOptions", {}))
            for c in contexts
        ),
        "procMount": any(c.get("procMount", "Default") != "Default" for c in contexts),
        "seccompProfile_baseline": any(
            c.get("seccompProfile", {}).get("type") == "Unconfined" for c in contexts
        ),
        "sysctls": any(s["name"] not in SAFE_SYSCTLS for s in ctx.get("sysctls", [])),
        "windowsHostProcess": any(c.get("windowsOptions", {}).get("hostProcess") for c in contexts),
    }
    return [check for check, bad in failed.items() if bad]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The checks of the restricted standard (baseline's included) that `pod` fails."""
    failed = {
        "restrictedVolumes": any(not set(v) - {"name"} <= RESTRICTED_VOLUMES for v in pod.get("volumes", [])),
        "allowPrivilegeEscalation": not all(
            c.get("securityContext", {}).get("allowPrivilegeEscalation") is False for c in _containers(pod)
        ),
        "runAsNonRoot": not _every(pod, "runAsNonRoot", lambda v: v is True),
        "runAsUser": not _every(pod, "runAsUser", lambda v: v != 0),
        "seccompProfile_restricted": not _every(
            pod, "seccompProfile", lambda v: (v or {}).get("type") in ("RuntimeDefault", "Localhost")
        ),
        "capabilities_restricted": not all(
            c.get("securityContext", {}).get("capabilities", {}).get("drop") == ["ALL"]
            and set(c.get("securityContext", {}).get("capabilities", {}).get("add", []))
            <= {"NET_BIND_SERVICE"}
            for c in _containers(pod)
        ),
    }
    return baseline_violations(pod) + [check for check, bad in failed.items() if bad]


def _restricted_pod() -> dict[str, Any]:
    """A minimal pod that meets the restricted standard, for the checker's own tests."""
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{"name": "c", "image": "x:1", "securityContext": copy.deepcopy(restricted)}],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }


#: A value for _set: remove the field.
DELETE = object()
#: check id -> a change that makes the restricted pod fail it, and every check that change fails (as Pod
#: Security admission reports them: a hostPath volume is also not a restricted volume type, and so on).
BREAKS: dict[str, tuple[str, Any, list[str]]] = {
    "hostNamespaces": ("hostPID", True, ["hostNamespaces"]),
    "privileged": ("containers/0/securityContext/privileged", True, ["privileged"]),
    "capabilities_baseline": (
        "containers/0/securityContext/capabilities/add",
        ["SYS_ADMIN"],
        ["capabilities_baseline", "capabilities_restricted"],
    ),
    "hostPathVolumes": (
        "volumes/0",
        {"name": "tmp", "hostPath": {"path": "/"}},
        ["hostPathVolumes", "restrictedVolumes"],
    ),
    "hostPorts": ("containers/0/ports", [{"containerPort": 80, "hostPort": 80}], ["hostPorts"]),
    "appArmorProfile": (
        "containers/0/securityContext/appArmorProfile",
        {"type": "Unconfined"},
        ["appArmorProfile"],
    ),
    "seLinuxOptions": ("securityContext/seLinuxOptions", {"type": "spc_t"}, ["seLinuxOptions"]),
    "procMount": ("containers/0/securityContext/procMount", "Unmasked", ["procMount"]),
    "sysctls": ("securityContext/sysctls", [{"name": "kernel.msgmax", "value": "1"}], ["sysctls"]),
    "windowsHostProcess": ("securityContext/windowsOptions", {"hostProcess": True}, ["windowsHostProcess"]),
    "seccompProfile_baseline": (
        "containers/0/securityContext/seccompProfile",
        {"type": "Unconfined"},
        ["seccompProfile_baseline", "seccompProfile_restricted"],
    ),
    "restrictedVolumes": (
        "volumes/0",
        {"name": "tmp", "nfs": {"server": "x", "path": "/"}},
        ["restrictedVolumes"],
    ),
    "allowPrivilegeEscalation": (
        "containers/0/securityContext/allowPrivilegeEscalation",
        True,
        ["allowPrivilegeEscalation"],
    ),
    "runAsNonRoot": ("containers/0/securityContext/runAsNonRoot", False, ["runAsNonRoot"]),
    "runAsUser": ("securityContext/runAsUser", 0, ["runAsUser"]),
    "seccompProfile_restricted": ("securityContext/seccompProfile", DELETE, ["seccompProfile_restricted"]),
    "capabilities_restricted": (
        "containers/0/securityContext/capabilities",
        {"drop": ["NET_RAW"]},
        ["capabilities_restricted"],
    ),
}


def _set(pod: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`pod` with the field at `path` (slash-separated, list indexes as numbers) set to `value`."""
    *parents, last = path.split("/")
    node: Any = pod
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if value is DELETE:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return pod


def test_the_checker_passes_a_restricted_pod() -> None:
    assert restricted_violations(_restricted_pod()) == []


@pytest.mark.parametrize("check", sorted(BREAKS))
def test_the_checker_catches_each_rule(check: str) -> None:
    path, value, fails = BREAKS[check]
    assert restricted_violations(_set(_restricted_pod(), path, value)) == fails


def _operator_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize("values", SCENARIOS, ids=lambda p: p.stem)
def test_operator_pod_is_restricted(values: Path) -> None:
    assert restricted_violations(_operator_pod(list(_render(values)))) == []


def test_install_yaml_runs_the_operator_restricted_in_a_restricted_namespace() -> None:
    objects = install_yaml()
    assert restricted_violations(_operator_pod(objects)) == []
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


#: Every QwenDeployment the builders are tested on: the examples (dev included) and the golden inputs.
SOURCES = sorted(
    [*EXAMPLES, *(REPO / "examples" / "dev").glob("*.yaml"), *(GOLDEN / "inputs").glob("*.yaml")]
)


def _pods(source: Path) -> dict[str, dict[str, Any]]:
    """component (engine, gateway) -> pod spec of its Deployment, as build_children renders them."""
    objects = build_children(review(load(source))).objects
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] == "Deployment"
    }


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_gateway_pod_is_restricted(source: Path) -> None:
    pods = _pods(source)
    if "gateway" not in pods:
        assert load(source)["spec"]["gateway"]["enabled"] is False
        return
    assert restricted_violations(pods["gateway"]) == []


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_engine_pod_is_restricted_but_for_running_as_root(source: Path) -> None:
    engine = _pods(source)["engine"]
    lora = "lora" in load(source)["spec"]
    assert restricted_violations(engine) == (LORA_EXCEPTIONS if lora else ENGINE_EXCEPTIONS)
    assert baseline_violations(engine) == []
    for container in engine["containers"][1:]:  # the sidecar: root, but nothing else
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsUser": 0,
        }
    # Root, but without its capabilities, a way to gain more, or unfiltered system calls.
    assert "runAsUser" not in engine.get("securityContext", {})  # the image's user (root), not forced
    assert engine["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


# --- who reaches the engines -------------------------------------------------------------------------


def _children(source: Path, **facts: Any) -> list[dict[str, Any]]:
    return list(build_children(review(load(source)), ClusterFacts(**facts)).objects)


def _one(objects: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    (obj,) = [
        o
        for o in objects
        if o["kind"] == kind and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return obj


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_only_the_gateway_and_the_named_scrapers_reach_the_engines(source: Path) -> None:
    """Before: any pod labelled app.kubernetes.io/name=prometheus, in any namespace (namespaceSelector {})."""
    objects = _children(source)
    if not load(source)["spec"].get("gateway", {}).get("enabled", True):
        assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
        return
    policy = _one(objects, "NetworkPolicy", "engine")
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    gateway = _one(objects, "Deployment", "gateway")["spec"]["template"]["metadata"]["labels"]
    assert peers[0] == {
        "podSelector": {"matchLabels": names.selector(review(load(source)).resource, "gateway")}
    }
    assert set(peers[0]["podSelector"]["matchLabels"].items()) <= set(gateway.items())
    # the gateways that serve this deployment as a tier (test_a_fronting_gateway_reaches_its_tiers_engines)
    assert peers[1] == {
        "podSelector": {
            "matchLabels": names.fronted_by(policy["metadata"]["labels"]["app.kubernetes.io/instance"])
        }
    }
    engine_port = [
        peer
        for rule in policy["spec"]["ingress"]
        if rule["ports"][0]["port"] == 8000
        for peer in rule["from"]
    ]
    assert engine_port[2:] == list(DEFAULT_SCRAPERS)
    for peer in peers:
        assert all(selector for selector in peer.values()), peer  # no empty selector: that is "everything"
    mine = (
        {"namespaceSelector": {"matchLabels": {"team": "obs"}}, "podSelector": {"matchLabels": {"a": "b"}}},
    )
    policy = _one(_children(source, scrapers=mine), "NetworkPolicy", "engine")
    assert [peer for rule in policy["spec"]["ingress"][:2] for peer in rule["from"]][2:] == list(mine)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return set(selector["matchLabels"].items()) <= set(labels.items())


def test_a_fronting_gateway_reaches_its_tiers_engines_and_no_other_gateway_does() -> None:
    """spec.gateway.tiers: the fronting gateway's routers connect to the tier's engine pods, so the tier's
    engine NetworkPolicy must admit its pods (same namespace, by their labels), and only such pods."""

    def deployment(name: str, tiers: list[str]) -> Review:
        body = copy.deepcopy(load(EXAMPLES[0]))
        body["metadata"]["name"] = name
        body["spec"].setdefault("gateway", {})["tiers"] = [
            {"name": f"model-of-{t}", "deploymentRef": {"name": t}} for t in tiers
        ]
        return review(body)

    def gateway_pod_labels(rev: Review) -> dict[str, str]:
        objects = build_children(rev, ClusterFacts()).objects
        template = _one(objects, "Deployment", "gateway")["spec"]["template"]
        return dict(template["metadata"]["labels"])

    def admits(policy_of: Review, labels: dict[str, str]) -> bool:
        policy = build_engine_network_policy(policy_of)
        return any(
            "namespaceSelector" not in peer and _matches(peer["podSelector"], labels)
            for rule in policy["spec"]["ingress"]
            if rule["ports"][0]["port"] == 8000
            for peer in rule["from"]
        )

    small, large = deployment("small", []), deployment("large", ["small"])
    other = deployment("other", [])
    assert admits(small, gateway_pod_labels(large)), "the fronting gateway cannot reach its tier"
    assert admits(small, gateway_pod_labels(small)), "the tier's own gateway"
    assert not admits(small, gateway_pod_labels(other)), "a gateway that does not front it"
    assert not admits(large, gateway_pod_labels(small)), "the tier's gateway reaching the fronting engines"
    assert not admits(other, gateway_pod_labels(large)), "a fronting gateway reaching what it does not front"


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("[{}]", "exactly namespaceSelector and podSelector"),
        (
            '[{"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "b"}}}]',
            ".namespaceSelector: a label",
        ),
        ('[{"namespaceSelector": {"matchLabels": {"a": "b"}}, "podSelector": {}}]', ".podSelector: a label"),
        ('[{"podSelector": {"matchLabels": {"a": "b"}}}]', "exactly namespaceSelector and podSelector"),
        ('{"namespaceSelector": {}}', "a JSON list"),
        ("not json", "is not JSON"),
    ],
)
def test_a_scraper_setting_that_would_open_the_engines_is_refused(setting: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_scrapers(setting)
    assert parse_scrapers(None) == parse_scrapers("") == DEFAULT_SCRAPERS
    assert parse_scrapers("[]") == ()  # nobody but the gateway


def test_the_operator_refuses_to_start_on_an_open_scraper_setting() -> None:
    env = {**os.environ, "QWEN_OPERATOR_ENGINE_SCRAPERS": '[{"namespaceSelector": {}, "podSelector": {}}]'}
    done = subprocess.run(
        [sys.executable, "-m", "qwen_operator.cli", "run", "--no-leader-elect"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "QWEN_OPERATOR_ENGINE_SCRAPERS[0].namespaceSelector" in done.stderr, done.stderr


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_engines_require_a_key_only_the_gateway_holds(source: Path) -> None:
    """Before: no engine key unless spec.engine.apiKeySecret named one."""
    body = load(source)
    qd = review(body).resource
    objects = _children(source)
    engine = _one(objects, "Deployment", "engine")["spec"]["template"]["spec"]
    env = {e["name"]: e for c in engine["containers"] for e in c.get("env", [])}
    expected = names.engine_key(qd)
    if expected is None:  # the gateway is off: clients call the engines, a key is theirs to set
        assert not qd.spec.gateway.enabled and "VLLM_API_KEY" not in env
        return
    ref = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (expected.name, expected.key)
    if not qd.spec.engine.api_key_secret:
        assert expected.name == f"{qd.metadata.name}-engine-key"
        secret = generated_engine_key_secret(review(body), "k" * 43)
        assert (
            secret
            and secret["metadata"]["name"] == expected.name
            and secret["stringData"] == {"token": "k" * 43}
        )
    gateway = _one(objects, "Deployment", "gateway")["spec"]["template"]["spec"]
    mounted = [v for v in gateway["volumes"] if v.get("secret", {}).get("secretName") == expected.name]
    assert len(mounted) == 1
    # no other pod template mounts it or reads it from the environment
    for obj in objects:
        template = obj.get("spec", {}).get("template", {}).get("spec")
        if template is None or obj is _one(objects, "Deployment", "gateway"):
            continue
        assert expected.name not in str(template.get("volumes", [])), obj["metadata"]["name"]


def test_no_generated_engine_key_when_the_spec_names_one_or_the_gateway_is_off() -> None:
    body = load(REPO / "examples" / "a100-80gb-tp2-bf16.yaml")
    body["spec"].setdefault("engine", {})["apiKeySecret"] = {"name": "mine", "key": "k"}
    assert generated_engine_key_secret(review(body), "x") is None
    body = load(REPO / "examples" / "a100-80gb-tp2-bf16.yaml")
    body["spec"].setdefault("gateway", {})["enabled"] = False
    assert generated_engine_key_secret(review(body), "x") is None
    assert names.engine_key(review(body).resource) is None
