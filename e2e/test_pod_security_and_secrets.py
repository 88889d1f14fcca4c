"""Security end to end on the dev cluster: the real API server's Pod Security admission, least-privilege
RBAC in use, and Secrets that never leave their Secret.

The operator runs as a local process under the ServiceAccount and RBAC of manifests/install.yaml, with
leader election on (the Lease Role) and debug logging (the most it ever says). Pods are SIMULATED
(kwok nodes run no containers), but admission is the API server's own: a ReplicaSet whose pod Pod
Security refuses records a FailedCreate event with the rules the pod broke.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.net import http_get
from qwen_devtools.operator_proc import (
    OPERATOR_NAMESPACE,
    OPERATOR_USER,
    OperatorProcess,
    audit_writes,
    installed_operator,
)
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until

pytestmark = pytest.mark.cluster

#: 2 replicas of 1 L40S (the Pod Security cases); 1 replica of 2 A100s (the Secrets case: that pool
#: has 16 GPUs, room beside pods of earlier tests that are still terminating).
L40S = REPO / "examples" / "l40s-48gb-tp1-awq.yaml"
A100 = REPO / "examples" / "a100-80gb-tp2-bf16.yaml"
#: Autoscaled (HPA): the operator also reads the metrics APIService and the queue-depth metric.
H100 = REPO / "examples" / "h100-80gb-tp2-fp8-128k.yaml"
#: Pod Security admission's words for each check (k8s.io/pod-security-admission/policy), as they appear
#: in a refusal: 'violates PodSecurity "restricted:latest": runAsNonRoot != true (...)'.
REFUSAL_WORDS = {
    "allowPrivilegeEscalation": "allowPrivilegeEscalation != false",
    "capabilities_restricted": "unrestricted capabilities",
    "capabilities_baseline": "non-default capabilities",
    "hostNamespaces": "host namespaces",
    "hostPathVolumes": "hostPath volumes",
    "hostPorts": "hostPort",
    "privileged": "privileged",
    "restrictedVolumes": "restricted volume types",
    "runAsNonRoot": "runAsNonRoot != true",
    "runAsUser": "runAsUser=0",
    "seccompProfile": "seccompProfile",
    "procMount": "procMount",
    "sysctls": "forbidden sysctls",
    "seLinuxOptions": "seLinuxOptions",
    "appArmorProfile": "AppArmor",
    "windowsHostProcess": "hostProcess",
}
#: The engine pod's only restricted violation (tests/test_security.py ENGINE_EXCEPTIONS says why).
ENGINE_EXCEPTIONS = ["runAsNonRoot"]
#: What the operator's log says of a request that RBAC refused ('User "system:serviceaccount:..." cannot
#: list resource ...', quotes escaped in the JSON log), and kopf's warning when it lacks a right. (A 403
#: for a namespace being deleted is no permission problem.)
PERMISSION_REFUSED = re.compile(r'User \\*"system:serviceaccount:\S+ cannot \w+|Not enough permissions')
#: The scan must have read at least this much (the YAML of two deployments' objects alone is more).
MIN_SCANNED_BYTES = 100_000


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    env = {"POD_NAMESPACE": OPERATOR_NAMESPACE, "POD_NAME": "security-e2e"}
    args = ("--leader-elect", "--log-level=debug")
    with installed_operator(cluster, tmp_path_factory.mktemp("operator"), args=args, env=env) as proc:
        wait_until(lambda: proc.metric("qwen_operator_leader") == 1, 60, "the operator holds the Lease")
        yield proc


def kubectl_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def apply(cluster: Any, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def deployment(example: Path, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    """An example QwenDeployment as `name` in `namespace`, with spec fields (section__field) replaced."""
    body = yaml.safe_load(example.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    for path, value in spec.items():
        section, _, field = path.partition("__")
        body["spec"].setdefault(section, {})[field] = value
    return body


def key_secret(cluster: Any, namespace: str, name: str, data: dict[str, str]) -> None:
    literals = [f"--from-literal={key}={value}" for key, value in data.items()]
    cluster.kubectl("-n", namespace, "create", "secret", "generic", name, *literals)


def wait_ready(cluster: Any, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj = kubectl_json(cluster, "-n", namespace, "get", "qwd", name)
        conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
        return obj if conditions.get("Ready") == "True" else None

    try:
        return wait_until(ready, timeout, f"{namespace}/{name} Ready=True")
    except AssertionError:
        print(json.dumps(kubectl_json(cluster, "-n", namespace, "get", "qwd", name).get("status"), indent=1))
        raise


def label_pod_security(cluster: Any, namespace: str, **modes: str) -> None:
    """Pod Security labels, e.g. enforce="restricted", warn="restricted" (each at version latest)."""
    labels = [f"pod-security.kubernetes.io/{mode}={level}" for mode, level in modes.items()]
    labels += [f"pod-security.kubernetes.io/{mode}-version=latest" for mode in modes]
    cluster.kubectl("label", "namespace", namespace, "--overwrite", *labels)


def failed_creates(cluster: Any, namespace: str) -> dict[str, list[str]]:
    """ReplicaSet name -> messages of its FailedCreate events (Pod Security refusals among them)."""
    events = kubectl_json(cluster, "-n", namespace, "get", "events", "--field-selector=reason=FailedCreate")
    found: dict[str, list[str]] = {}
    for event in events["items"]:
        found.setdefault(event["involvedObject"]["name"], []).append(event["message"])
    return found


def pods(cluster: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(kubectl_json(cluster, "-n", namespace, "get", "pods", "-l", selector)["items"])


def component(name: str, part: str) -> str:
    return f"app.kubernetes.io/instance={name},app.kubernetes.io/component={part}"


def broken_rules(refusal: str, level: str) -> list[str]:
    """The checks a Pod Security refusal names, by check id."""
    match = re.search(rf'violates PodSecurity "{level}:latest": (.*)$', refusal)
    assert match, refusal
    return [check for check, words in REFUSAL_WORDS.items() if words in match.group(1)]


# --- OwnerReferencesPermissionEnforcement -----------------------------------------------------------


def test_owner_references_need_the_finalizers_grant_the_operators_rbac_holds(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    """The dev cluster's API server runs OwnerReferencesPermissionEnforcement (OpenShift's default): an
    owner reference with blockOwnerDeletion, as every child of a QwenDeployment has, is refused to anyone
    who may not update the owner's finalizers. A ServiceAccount that may create ConfigMaps but lacks that
    grant is refused; the operator's own account (manifests/install.yaml's RBAC) is not, and its children
    exist (the deployment below is reconciled under the plugin)."""
    apply(cluster, deployment(L40S, namespace, "chat-owner"))

    def gateway() -> dict[str, Any] | None:
        got = cluster.kubectl(
            "-n", namespace, "get", "deployment", "chat-owner-gateway", "-o", "json", check=False
        )
        return json.loads(got.stdout) if got.returncode == 0 else None

    owner = wait_until(gateway, 60, "the operator's children, created under the admission plugin")
    (reference,) = owner["metadata"]["ownerReferences"]
    assert reference["kind"] == "QwenDeployment" and reference["blockOwnerDeletion"] is True
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "no-finalizers")
    cluster.kubectl(
        "-n", namespace, "create", "role", "configmaps-only", "--verb=create,get", "--resource=configmaps",
    )  # fmt: skip
    cluster.kubectl(
        "-n", namespace, "create", "rolebinding", "configmaps-only", "--role=configmaps-only",
        f"--serviceaccount={namespace}:no-finalizers",
    )  # fmt: skip

    def create_as(user: str, name: str) -> subprocess.CompletedProcess[str]:
        child = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "ownerReferences": [reference]},
        }
        return cluster.kubectl("create", f"--as={user}", "-f", "-", input=json.dumps(child), check=False)

    refused = create_as(f"system:serviceaccount:{namespace}:no-finalizers", "refused-child")
    assert refused.returncode != 0
    assert (
        "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on"
        in (refused.stderr)
    ), refused.stderr
    allowed = create_as(OPERATOR_USER, "operator-child")
    assert allowed.returncode == 0, allowed.stderr


# --- Pod Security admission --------------------------------------------------------------------------


def test_operator_pods_are_admitted_in_their_restricted_namespace(
    cluster: Any, operator: OperatorProcess
) -> None:
    labels = kubectl_json(cluster, "get", "namespace", OPERATOR_NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    selector = "app.kubernetes.io/name=qwen-operator"
    want = kubectl_json(cluster, "-n", OPERATOR_NAMESPACE, "get", "deployment", "qwen-operator")["spec"][
        "replicas"
    ]
    wait_until(lambda: len(pods(cluster, OPERATOR_NAMESPACE, selector)) == want, 60, "the operator's pods")
    assert failed_creates(cluster, OPERATOR_NAMESPACE) == {}


def test_restricted_namespace_admits_the_gateway_and_refuses_only_the_engines_root(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    label_pod_security(cluster, namespace, enforce="restricted")
    key_secret(cluster, namespace, "chat-l40s-api-keys", {"team-a": "sk-psa-test-0123456789abcdef"})
    apply(cluster, deployment(L40S, namespace, "chat-l40s", gateway__apiKeysSecret="chat-l40s-api-keys"))

    def refused_engine() -> list[str] | None:
        refusals = failed_creates(cluster, namespace)
        return next((m for rs, m in refusals.items() if rs.startswith("chat-l40s-engine-")), None)

    engine_refusals = wait_until(refused_engine, 90, "the engine ReplicaSet's FailedCreate")
    for refusal in engine_refusals:
        assert broken_rules(refusal, "restricted") == ENGINE_EXCEPTIONS, refusal
    assert pods(cluster, namespace, component("chat-l40s", "engine")) == []
    gateway = kubectl_json(cluster, "-n", namespace, "get", "deployment", "chat-l40s-gateway")
    want = gateway["spec"]["replicas"]
    wait_until(
        lambda: len(pods(cluster, namespace, component("chat-l40s", "gateway"))) == want, 60, "gateway pods"
    )
    assert not [rs for rs in failed_creates(cluster, namespace) if rs.startswith("chat-l40s-gateway-")]


def test_baseline_namespace_admits_every_pod(cluster: Any, operator: OperatorProcess, namespace: str) -> None:
    """Where engines run: enforce baseline, and warn and audit at restricted (the engine's one exception)."""
    label_pod_security(cluster, namespace, enforce="baseline", warn="restricted", audit="restricted")
    key_secret(cluster, namespace, "chat-l40s-api-keys", {"team-a": "sk-psa-test-0123456789abcdef"})
    apply(cluster, deployment(L40S, namespace, "chat-l40s", gateway__apiKeysSecret="chat-l40s-api-keys"))
    obj = wait_ready(cluster, namespace, "chat-l40s")
    assert obj["status"]["replicas"] == 2
    assert len(pods(cluster, namespace, component("chat-l40s", "engine"))) == 2
    gateway = kubectl_json(cluster, "-n", namespace, "get", "deployment", "chat-l40s-gateway")
    assert len(pods(cluster, namespace, component("chat-l40s", "gateway"))) == gateway["spec"]["replicas"]
    assert failed_creates(cluster, namespace) == {}


# --- Secrets stay in their Secrets -------------------------------------------------------------------


def canaries(cluster: Any, namespace: str) -> dict[str, str]:
    """'<secret>/<key>' -> value of every Secret in the namespace (read as admin: the operator cannot)."""
    found = {}
    for secret in kubectl_json(cluster, "-n", namespace, "get", "secrets")["items"]:
        for key, encoded in (secret.get("data") or {}).items():
            found[f"{secret['metadata']['name']}/{key}"] = base64.b64decode(encoded).decode()
    return found


def namespace_objects(cluster: Any, namespace: str) -> str:
    """Every object of every listable namespaced kind in `namespace` but Secrets, as YAML."""
    kinds = cluster.kubectl("api-resources", "--namespaced=true", "--verbs=list", "-o", "name").stdout.split()
    kinds = [k for k in kinds if k.split(".")[0] != "secrets"]
    return str(cluster.kubectl("-n", namespace, "get", ",".join(kinds), "-o", "yaml").stdout)


def scanned_sources(cluster: Any, operator: OperatorProcess, namespace: str) -> dict[str, str]:
    """Everything the operator and the cluster said: log, metrics, Events, objects, the operator's writes."""
    status, metrics = http_get(f"{operator.url}/metrics", timeout=5)
    assert status == 200
    writes = audit_writes(cluster, [OPERATOR_USER])
    return {
        "operator log": operator.log_path.read_text(),
        "operator metrics": metrics,
        "events (all namespaces)": cluster.kubectl("get", "events", "-A", "-o", "yaml").stdout,
        f"objects in {namespace} but Secrets": namespace_objects(cluster, namespace),
        "operator's writes (audit log)": "\n".join(json.dumps(w) for w in writes),
    }


def test_secret_values_appear_nowhere(cluster: Any, operator: OperatorProcess, namespace: str) -> None:
    """Canary values in the HF token, API-key and engine-key Secrets (and the operator's generated key)
    must not appear in the operator's log or metrics, any Event, any object's spec, status, annotations,
    env or command line, or the operator's requests."""
    planted = {
        "canary-hf-token": {"token": f"hf_canary{secrets.token_hex(16)}"},
        "canary-api-keys": {"team-a": f"sk-canary-{secrets.token_hex(16)}"},
        "canary-engine-key": {"token": f"ek-canary-{secrets.token_hex(16)}"},
    }
    for name, data in planted.items():
        key_secret(cluster, namespace, name, data)
    apply(
        cluster,
        deployment(
            A100,
            namespace,
            "canary",
            model__hfTokenSecret={"name": "canary-hf-token", "key": "token"},
            engine__apiKeySecret={"name": "canary-engine-key", "key": "token"},
            gateway__apiKeysSecret="canary-api-keys",
        ),
    )
    keyless = deployment(A100, namespace, "keyless")  # no apiKeysSecret: the operator generates one
    keyless["spec"]["gateway"].pop("apiKeysSecret", None)
    apply(cluster, keyless)
    key_secret(cluster, namespace, "scaled-api-keys", {"team-a": f"sk-canary-{secrets.token_hex(16)}"})
    apply(cluster, deployment(H100, namespace, "scaled", gateway__apiKeysSecret="scaled-api-keys"))
    for name in ("canary", "keyless", "scaled"):
        wait_ready(cluster, namespace, name)
    # More to say: a change, and a child deleted by hand that the operator recreates.
    cluster.kubectl(
        "-n", namespace, "patch", "qwd", "canary", "--type=merge", "-p", '{"spec":{"replicas":2}}'
    )
    cluster.kubectl("-n", namespace, "delete", "service", "canary-engine")
    wait_until(
        lambda: (
            cluster.kubectl("-n", namespace, "get", "service", "canary-engine", check=False).returncode == 0
        ),
        60,
        "the engine Service recreated",
    )
    wait_until(
        lambda: wait_ready(cluster, namespace, "canary")["status"]["replicas"] == 2, 60, "2 engine replicas"
    )

    values = canaries(cluster, namespace)
    assert {f"{n}/{k}" for n, data in planted.items() for k in data} <= set(values)
    sources = scanned_sources(cluster, operator, namespace)
    for source, text in sources.items():
        assert text.strip(), f"scanned nothing from {source}"
    objects = sources[f"objects in {namespace} but Secrets"]
    for kind in (
        "QwenDeployment",
        "Pod",
        "Deployment",
        "ReplicaSet",
        "ConfigMap",
        "Service",
        "HorizontalPodAutoscaler",
    ):
        assert f"kind: {kind}\n" in objects, f"no {kind} scanned"
    for name in planted:  # the pods reference each Secret by name: their env and volumes were scanned
        assert name in objects
    scanned = sum(len(text) for text in sources.values())
    assert scanned > MIN_SCANNED_BYTES, f"only {scanned} bytes scanned"
    leaks = [
        f"{secret} ({form}) in {source}"
        for secret, value in values.items()
        for form, needle in (("plain", value), ("base64", base64.b64encode(value.encode()).decode()))
        for source, text in sources.items()
        if needle in text
    ]
    assert leaks == [], leaks
    print(f"\n[secrets] {len(values)} Secret values, {scanned} bytes in {len(sources)} sources: no leak")


def as_operator(
    cluster: Any, operator: OperatorProcess, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl as the operator's ServiceAccount (its kubeconfig), never raising."""
    argv = [str(cluster.bin("kubectl")), f"--kubeconfig={operator.kubeconfig}", *args]
    return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=60)


def can_i(cluster: Any, operator: OperatorProcess, verb: str, what: str, namespace: str = "") -> bool:
    """The API server's own answer (a SelfSubjectAccessReview as the operator's account) for `verb` on
    `what`, written resource[.group][/subresource][:name] (no discovery: an API not served is fine)."""
    what, _, name = what.partition(":")
    resource, _, subresource = what.partition("/")
    resource, _, group = resource.partition(".")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": resource,
                "subresource": subresource,
                "name": name,
                "namespace": namespace,
            }
        },
    }
    answer = as_operator(cluster, operator, "create", "-f", "-", "-o", "json", input=json.dumps(review))
    assert answer.returncode == 0, answer.stderr
    return bool(json.loads(answer.stdout)["status"]["allowed"])


#: (verb, resource[.group][/subresource][:name], namespace: "" cluster-wide, "own" the operator's,
#: "managed" a namespace of QwenDeployments) -> allowed. The live counterpart of tests/test_security.py.
ACCESS = {
    ("create", "secrets", "managed"): True,  # the generated API-key Secret
    ("get", "secrets", "managed"): False,
    ("list", "secrets", "managed"): False,
    ("watch", "secrets", "managed"): False,
    ("update", "secrets", "managed"): False,
    ("get", "persistentvolumeclaims", "managed"): False,
    ("list", "persistentvolumeclaims", "managed"): False,
    ("list", "events", "managed"): True,
    ("get", "pods.custom.metrics.k8s.io/qwen_queue_depth:*", "managed"): True,
    ("get", "pods.custom.metrics.k8s.io/other_metric:*", "managed"): False,
    ("update", "qwendeployments.inference.qwenops.dev", "managed"): False,
    ("patch", "qwendeployments.inference.qwenops.dev/status", "managed"): True,
    ("update", "leases.coordination.k8s.io", "own"): True,
    ("update", "leases.coordination.k8s.io", "managed"): False,
    ("list", "nodes", ""): True,
    ("get", "nodes", ""): False,
    ("list", "namespaces", ""): False,
    ("get", "apiservices.apiregistration.k8s.io:v1beta1.custom.metrics.k8s.io", ""): True,
    ("get", "apiservices.apiregistration.k8s.io:v1.apps", ""): False,
}


@pytest.mark.parametrize(("verb", "what", "where"), sorted(ACCESS), ids=" ".join)
def test_the_api_server_grants_the_operator_exactly_this(
    cluster: Any, operator: OperatorProcess, verb: str, what: str, where: str
) -> None:
    # Cluster scope: any namespace is managed, and an access review needs no namespace to exist.
    ns = {"own": OPERATOR_NAMESPACE, "managed": "any-managed-namespace"}.get(where, "")
    assert can_i(cluster, operator, verb, what, ns) is ACCESS[(verb, what, where)]


def test_a_refused_request_reads_as_the_log_check_expects(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    """The check below is calibrated on a real refusal: the operator's account reading Secrets."""
    refused = as_operator(cluster, operator, "-n", namespace, "get", "secrets")
    assert refused.returncode != 0
    assert PERMISSION_REFUSED.search(refused.stderr), refused.stderr


def test_the_operator_never_lacked_a_permission(operator: OperatorProcess) -> None:
    """Least privilege is enough: after every test above, nothing in the log was refused."""
    log = operator.log_path.read_text()
    assert log.strip()
    refused = [line for line in log.splitlines() if PERMISSION_REFUSED.search(line)]
    assert refused == [], "\n".join(refused[:20])
