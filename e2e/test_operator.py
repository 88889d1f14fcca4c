"""The operator end to end on the dev cluster: children, scheduling, status, drift, HPA, GC, zero writes.

The operator runs as a local process under the ServiceAccount and RBAC of manifests/install.yaml.
The engine and gateway pods here are SIMULATED (kwok nodes run no containers): "Ready" below means
kwok marked them ready; tests of a really serving stack are in e2e/test_real_journey.py.
"""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.operator_proc import (
    OPERATOR_USER,
    OperatorProcess,
    assert_settled_writes_nothing,
    audit_writes,
    installed_operator,
)
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review
from qwen_operator.api.rollout import ROLLOUT_ANNOTATION
from qwen_operator.k8s import contains
from qwen_operator.kinds import optional
from qwen_operator.manifests import ClusterFacts, build_children

pytestmark = pytest.mark.cluster

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
GPU_PRODUCT = {
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "L40S-48GB": "NVIDIA-L40S",
}


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    # Failing objects are retried after 1, 2, 4 s ... capped at 4 s here (60 s by default): short tests.
    env = {"QWEN_OPERATOR_RETRY_MAX_SECONDS": "4"}
    with installed_operator(cluster, tmp_path_factory.mktemp("operator"), env=env) as proc:
        yield proc


def load_example(path: Path, namespace: str) -> dict[str, Any]:
    body = yaml.safe_load(path.read_text())
    body["metadata"]["namespace"] = namespace
    return body


def kubectl_json(cluster: Any, *args: str) -> Any:
    out = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def apply(cluster: Any, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def patch_qwd(cluster: Any, ns: str, name: str, patch: str) -> None:
    cluster.kubectl("-n", ns, "patch", "qwd", name, "--type=merge", "-p", patch)


def get_qwd(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    return kubectl_json(cluster, "-n", ns, "get", "qwd", name)  # type: ignore[no-any-return]


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == ctype:
            return c  # type: ignore[no-any-return]
    return {}


def wait_condition(cluster: Any, ns: str, name: str, ctype: str, status: str, timeout: float = 90) -> dict:
    def check() -> dict[str, Any] | None:
        obj = get_qwd(cluster, ns, name)
        return obj if condition(obj, ctype).get("status") == status else None

    try:
        return wait_until(check, timeout, f"{name} {ctype}={status}")
    except AssertionError:
        print(json.dumps(get_qwd(cluster, ns, name).get("status"), indent=1))
        raise


def secrets_for(cluster: Any, body: dict[str, Any]) -> None:
    keys = body["spec"].get("gateway", {}).get("apiKeysSecret")
    if keys:
        cluster.kubectl(
            "-n",
            body["metadata"]["namespace"],
            "create",
            "secret",
            "generic",
            keys,
            "--from-literal=team-a=sk-test-a",
        )


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_becomes_ready(
    cluster: Any, operator: OperatorProcess, namespace: str, example: Path
) -> None:
    body = load_example(example, namespace)
    name = body["metadata"]["name"]
    secrets_for(cluster, body)
    apply(cluster, body)
    obj = wait_condition(cluster, namespace, name, "Ready", "True", timeout=120)
    status = obj["status"]
    assert status["endpoint"].startswith(f"http://{name}.{namespace}.svc")
    assert status["plan"]["fits"] is True and status["plan"]["kvTokensPerReplica"] > 0
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert not obj["metadata"].get("finalizers"), "the operator must not add finalizers"
    assert not [a for a in obj["metadata"].get("annotations", {}) if "kopf" in a]

    gpu_type = body["spec"]["gpu"]["type"]
    pods = kubectl_json(
        cluster,
        "-n",
        namespace,
        "get",
        "pods",
        "-l",
        f"app.kubernetes.io/instance={name},app.kubernetes.io/component=engine",
    )["items"]
    assert pods, "no engine pods"
    for pod in pods:
        node = kubectl_json(cluster, "get", "node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == GPU_PRODUCT[gpu_type]
        gpus = pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert int(gpus) == status["plan"]["gpusPerReplica"]

    table = cluster.kubectl("-n", namespace, "get", "qwd", name).stdout.splitlines()
    assert table[0].split()[:6] == ["NAME", "READY", "REPLICAS", "GPU", "TP", "CONTEXT"]
    row = table[1].split()
    assert row[1] == "True" and row[3] == gpu_type
    assert row[4] == str(status["tensorParallelSize"]) and row[5] == str(status["maxModelLen"])

    for kind, child in (
        ("deployment", f"{name}-engine"),
        ("deployment", f"{name}-gateway"),
        ("service", name),
        ("service", f"{name}-engine"),
        ("pdb", f"{name}-engine"),
        ("networkpolicy", f"{name}-engine"),
        ("serviceaccount", f"{name}-gateway"),
        ("role", f"{name}-gateway"),
        ("rolebinding", f"{name}-gateway"),
        ("configmap", f"{name}-gateway"),
    ):
        assert kubectl_json(cluster, "-n", namespace, "get", kind, child), f"{kind} {child} missing"
    # The gateway's ServiceAccount may discover engine pods, and nothing more.
    account = f"system:serviceaccount:{namespace}:{name}-gateway"
    can = [
        cluster.kubectl("auth", "can-i", verb, "pods", "-n", namespace, f"--as={account}", check=False)
        for verb in ("watch", "delete")
    ]
    assert [c.stdout.strip() for c in can] == ["yes", "no"]
    monitoring = condition(obj, "MonitoringReady")
    assert (monitoring["status"], monitoring["reason"]) == ("False", "CRDNotInstalled")


def test_render_matches_what_the_operator_created(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    body = load_example(EXAMPLES[0], namespace)
    secrets_for(cluster, body)
    apply(cluster, body)
    obj = wait_condition(cluster, namespace, body["metadata"]["name"], "Ready", "True")
    rev = review(obj)
    missing = frozenset(k.crd for k in optional() if k.crd)  # the dev cluster has none of the optional CRDs
    rendered = build_children(rev, ClusterFacts(free_gpus=None, missing_crds=missing)).objects
    for want in rendered:
        live = kubectl_json(
            cluster, "-n", namespace, "get", f"{want['kind']}.{_group(want)}", want["metadata"]["name"]
        )
        assert live is not None, f"{want['kind']} {want['metadata']['name']} not created"
        want = copy.deepcopy(want)
        if want["kind"] == "Deployment":  # rollout mode depends on the free GPUs the operator saw
            want["spec"].pop("strategy")
            want["metadata"].get("annotations", {}).pop(ROLLOUT_ANNOTATION, None)
        assert contains(live, want), f"{want['kind']} {want['metadata']['name']} differs from render"


def _group(obj: dict[str, Any]) -> str:
    group = obj["apiVersion"].rpartition("/")[0]
    return group or ""


def test_more_gpus_than_the_pool_has_is_unschedulable(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    body = load_example(EXAMPLES[0], namespace)
    body["metadata"]["name"] = "too-big"
    body["spec"]["gpu"]["gpusPerNode"] = 16
    body["spec"]["parallelism"] = {"tensor": 8, "pipeline": 2}
    body["spec"]["gateway"] = {"enabled": False}
    apply(cluster, body)
    obj = wait_condition(cluster, namespace, "too-big", "Scheduled", "False")
    assert "Insufficient nvidia.com/gpu" in condition(obj, "Scheduled")["message"]
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Unschedulable")


def test_invalid_spec_creates_nothing(cluster: Any, operator: OperatorProcess, namespace: str) -> None:
    body = load_example(EXAMPLES[0], namespace)
    body["metadata"]["name"] = "no-fit"
    body["spec"]["gpu"]["type"] = "A100-40GB"
    apply(cluster, body)
    obj = wait_condition(cluster, namespace, "no-fit", "CapacityFit", "False")
    # bf16 weights fit on 2 x A100-40GB, but not one 32K sequence of KV cache beside them
    assert "spec.engine.maxModelLen: one 32768-token sequence" in condition(obj, "CapacityFit")["message"]
    assert condition(obj, "Ready")["reason"] == "DoesNotFit"
    left = kubectl_json(
        cluster, "-n", namespace, "get", "deploy,svc,cm,sa", "-l", "qwenops.dev/deployment=no-fit"
    )
    assert left["items"] == []
    events = kubectl_json(
        cluster, "-n", namespace, "get", "events", "--field-selector", "involvedObject.name=no-fit"
    )["items"]
    assert any(e["reason"] == "DoesNotFit" and e["type"] == "Warning" for e in events)


def _engine(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    return kubectl_json(cluster, "-n", ns, "get", "deployment", f"{name}-engine")  # type: ignore[no-any-return]


def test_drift_is_reverted_and_edits_roll_out(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    body = load_example(EXAMPLES[0], namespace)
    name = body["metadata"]["name"]
    secrets_for(cluster, body)
    apply(cluster, body)
    wait_condition(cluster, namespace, name, "Ready", "True")

    # A hand edit of an owned field is reverted.
    cluster.kubectl(
        "-n",
        namespace,
        "patch",
        "deployment",
        f"{name}-engine",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"evil:latest"}]',
    )
    wait_until(
        lambda: (
            _engine(cluster, namespace, name)["spec"]["template"]["spec"]["containers"][0]["image"]
            != "evil:latest"
        ),
        30,
        "image reverted",
    )

    # A deleted child is recreated.
    cluster.kubectl("-n", namespace, "delete", "service", f"{name}-engine", "--wait=true")
    wait_until(
        lambda: kubectl_json(cluster, "-n", namespace, "get", "service", f"{name}-engine"),
        30,
        "engine Service recreated",
    )

    # Editing the CR rolls the Deployment with the new flag.
    generation = _engine(cluster, namespace, name)["metadata"]["generation"]
    patch_qwd(cluster, namespace, name, '{"spec":{"engine":{"maxModelLen":16384}}}')

    def rolled() -> bool:
        dep = _engine(cluster, namespace, name)
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        return (
            dep["metadata"]["generation"] > generation and args[args.index("--max-model-len") + 1] == "16384"
        )

    wait_until(rolled, 30, "engine Deployment rolled with --max-model-len 16384")

    def observed() -> dict[str, Any] | None:
        obj = get_qwd(cluster, namespace, name)
        current = obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and condition(obj, "Ready")["status"] == "True" else None

    obj = wait_until(observed, 60, "status of the new generation, Ready")
    assert obj["status"]["maxModelLen"] == 16384


def test_hpa_owns_replicas(cluster: Any, operator: OperatorProcess, namespace: str) -> None:
    body = load_example(next(p for p in EXAMPLES if "h100" in p.name), namespace)
    name = body["metadata"]["name"]
    secrets_for(cluster, body)
    apply(cluster, body)
    wait_condition(cluster, namespace, name, "Ready", "True")
    hpa = kubectl_json(cluster, "-n", namespace, "get", "hpa", f"{name}-engine")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "qwen_queue_depth"
    dep = kubectl_json(
        cluster, "-n", namespace, "get", "deployment", f"{name}-engine", "--show-managed-fields"
    )
    managers = [m for m in dep["metadata"]["managedFields"] if m["manager"] == "qwen-operator"]
    assert managers, "the operator must write with its field manager"
    assert all("f:replicas" not in json.dumps(m.get("fieldsV1", {}).get("f:spec", {})) for m in managers)

    # This (kwok) dev cluster serves no custom metrics API: the status must say so, before the HPA's own
    # FailedGetPodsMetric (e2e/test_real_journey.py runs the real adapter).
    scaling = condition(wait_condition(cluster, namespace, name, "ScalingReady", "False"), "ScalingReady")
    assert scaling["reason"] == "MetricsAPIMissing", scaling
    assert "v1beta1.custom.metrics.k8s.io" in scaling["message"], scaling

    cluster.kubectl("-n", namespace, "scale", "deployment", f"{name}-engine", "--replicas=2")
    # Trigger a reconcile through the CR, then check the operator left replicas alone.
    cluster.kubectl("-n", namespace, "annotate", "qwd", name, "example.com/touch=1", "--overwrite")
    wait_until(
        lambda: get_qwd(cluster, namespace, name)["status"].get("desiredReplicas") == 2,
        30,
        "status desiredReplicas=2",
    )
    assert _engine(cluster, namespace, name)["spec"]["replicas"] == 2

    # Back to fixed replicas: the HPA the spec no longer wants is deleted, replicas written again.
    patch_qwd(cluster, namespace, name, '{"spec":{"autoscaling":null,"replicas":1}}')
    wait_until(
        lambda: kubectl_json(cluster, "-n", namespace, "get", "hpa", f"{name}-engine") is None,
        30,
        "HPA deleted",
    )
    wait_until(lambda: _engine(cluster, namespace, name)["spec"]["replicas"] == 1, 30, "replicas back to 1")


def test_delete_garbage_collects_everything(cluster: Any, operator: OperatorProcess, namespace: str) -> None:
    body = load_example(EXAMPLES[0], namespace)
    name = body["metadata"]["name"]
    secrets_for(cluster, body)
    apply(cluster, body)
    wait_condition(cluster, namespace, name, "Ready", "True")
    cluster.kubectl("-n", namespace, "delete", "qwd", name, "--wait=true", "--timeout=30s")

    def gone() -> bool:
        left = kubectl_json(
            cluster,
            "-n",
            namespace,
            "get",
            "deploy,svc,cm,sa,role,rolebinding,pdb,networkpolicy,hpa",
            "-l",
            f"qwenops.dev/deployment={name}",
        )
        return left is not None and left["items"] == []

    wait_until(gone, 60, "children garbage-collected")


def _audit_writes(cluster: Any, since: float) -> list[dict[str, Any]]:
    if not (Path(cluster.kubeconfig).parent / "audit.log").exists():
        pytest.skip("this cluster keeps no audit log (only the dev cluster does)")
    return audit_writes(cluster, [OPERATOR_USER], since)


def test_noop_resync_writes_nothing(
    cluster: Any, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> None:
    for example in EXAMPLES:
        body = load_example(example, namespace)
        secrets_for(cluster, body)
        apply(cluster, body)
    for example in EXAMPLES:
        name = yaml.safe_load(example.read_text())["metadata"]["name"]
        wait_condition(cluster, namespace, name, "Ready", "True")
        wait_condition(cluster, namespace, name, "Progressing", "False")
    # Settled: the running operator has had nothing to write for a few seconds.
    wait_until(lambda: not _audit_writes(cluster, time.time() - 4), 60, "operator writes to stop")

    # A restart re-lists every object (resume); a short resync period exercises the timer path too.
    operator.stop()
    since = time.time() + 1
    restarted = OperatorProcess(operator.kubeconfig, tmp_path / "restarted.log", resync_seconds=5).start()
    try:
        time.sleep(15)
        writes = _audit_writes(cluster, since)
        reconciles = restarted.metric("qwen_operator_reconciles_total")
    finally:
        restarted.stop()
        operator.start()
    assert reconciles >= 2 * len(EXAMPLES), f"only {reconciles} reconciles ran"
    assert writes == [], "writes after restart:\n" + "\n".join(
        f"{w['verb']} {w['requestURI']}" for w in writes
    )


# --- nothing half-made, failures in the status ---------------------------------------------------------


def events_about(cluster: Any, ns: str, name: str) -> list[dict[str, Any]]:
    found = kubectl_json(
        cluster, "-n", ns, "get", "events", "--field-selector", f"involvedObject.name={name}"
    )
    return list(found["items"])


def test_a_taken_child_name_creates_nothing_and_says_so(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    body = load_example(EXAMPLES[0], namespace)
    body["metadata"]["name"] = "stranger"
    secrets_for(cluster, body)
    cluster.kubectl("-n", namespace, "create", "service", "clusterip", "stranger", "--tcp=80:80")
    apply(cluster, body)
    obj = wait_condition(cluster, namespace, "stranger", "Synced", "False")
    synced = condition(obj, "Synced")
    assert synced["reason"] == "ForeignObject", synced
    assert f"Service {namespace}/stranger exists and is not owned by this QwenDeployment" in synced["message"]
    assert "delete it, or rename the QwenDeployment" in synced["message"]
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ForeignObject"), ready
    children = kubectl_json(
        cluster, "-n", namespace, "get", "deploy,svc,cm,sa,pdb", "-l", "qwenops.dev/deployment=stranger"
    )
    assert children["items"] == [], [c["metadata"]["name"] for c in children["items"]]
    assert any(
        e["reason"] == "ForeignObject" and e["type"] == "Warning"
        for e in events_about(cluster, namespace, "stranger")
    )
    # The stranger goes: the retry (backoff capped at 4 s here) creates everything.
    cluster.kubectl("-n", namespace, "delete", "service", "stranger")
    obj = wait_condition(cluster, namespace, "stranger", "Ready", "True", timeout=120)
    assert condition(obj, "Synced")["reason"] == "ReconcileSucceeded"
    owners = kubectl_json(cluster, "-n", namespace, "get", "service", "stranger")["metadata"][
        "ownerReferences"
    ]
    assert owners[0]["uid"] == obj["metadata"]["uid"]


def test_without_a_named_key_secret_one_is_generated_and_never_overwritten(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    body = load_example(EXAMPLES[0], namespace)
    body["metadata"]["name"] = "keyless"
    body["spec"]["gateway"].pop("apiKeysSecret", None)
    apply(cluster, body)
    obj = wait_condition(cluster, namespace, "keyless", "Ready", "True")
    generated = "keyless-gateway-api-keys"
    assert obj["status"]["gateway"] == {
        "auth": "apiKeys",
        "apiKeysSecret": generated,
        "apiKeysSecretGenerated": True,
    }
    secret = kubectl_json(cluster, "-n", namespace, "get", "secret", generated)
    (key,) = secret["data"].values()
    assert len(key) >= 40  # 32 random bytes, url-safe base64, then base64 again
    assert secret["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    volumes = kubectl_json(cluster, "-n", namespace, "get", "deployment", "keyless-gateway")["spec"][
        "template"
    ]
    assert {"name": "api-keys", "secret": {"secretName": generated, "defaultMode": 0o440}} in volumes["spec"][
        "volumes"
    ]
    # A key the user sets stays: the operator only ever creates the Secret.
    cluster.kubectl("-n", namespace, "create", "secret", "generic", "mine", "--from-literal=default=sk-mine")
    mine = kubectl_json(cluster, "-n", namespace, "get", "secret", "mine")["data"]
    cluster.kubectl(
        "-n", namespace, "patch", "secret", generated, "--type=merge", "-p", json.dumps({"data": mine})
    )
    patch_qwd(cluster, namespace, "keyless", '{"spec":{"gateway":{"replicas":3}}}')  # a reconcile after it
    wait_until(
        lambda: (
            kubectl_json(cluster, "-n", namespace, "get", "deployment", "keyless-gateway")["spec"]["replicas"]
            == 3
        ),
        60,
        "the gateway scaled to 3",
    )
    assert kubectl_json(cluster, "-n", namespace, "get", "secret", generated)["data"] == mine
    assert base64.b64decode(key).decode() not in operator.log_path.read_text()
    # auth none is an explicit choice: no key volume, no generated Secret for a new deployment.
    open_body = load_example(EXAMPLES[0], namespace)
    open_body["metadata"]["name"] = "open"
    open_body["spec"]["gateway"] = {"auth": "none"}
    apply(cluster, open_body)
    obj = wait_condition(cluster, namespace, "open", "Ready", "True")
    assert obj["status"]["gateway"] == {"auth": "none", "apiKeysSecretGenerated": False}
    assert kubectl_json(cluster, "-n", namespace, "get", "secret", "open-gateway-api-keys") is None


def test_a_refused_update_says_so_while_the_previous_spec_serves(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    body = load_example(EXAMPLES[0], namespace)
    name = body["metadata"]["name"]
    secrets_for(cluster, body)
    apply(cluster, body)
    before = wait_condition(cluster, namespace, name, "Ready", "True")
    template = _engine(cluster, namespace, name)["spec"]["template"]
    patch_qwd(cluster, namespace, name, '{"spec":{"parallelism":{"tensor":3}}}')
    obj = wait_condition(cluster, namespace, name, "ConfigValid", "False")
    assert (
        obj["status"]["observedGeneration"]
        == obj["metadata"]["generation"]
        > before["metadata"]["generation"]
    )
    assert "spec.parallelism.tensor" in condition(obj, "ConfigValid")["message"]
    ready = condition(obj, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "ServingPreviousSpec"), ready
    assert f"generation {obj['metadata']['generation']} is refused" in ready["message"]
    assert obj["status"]["replicasSummary"] == before["status"]["replicasSummary"] != "0/0"
    assert _engine(cluster, namespace, name)["spec"]["template"] == template  # nothing rolled out


# --- tiers: status from the tiers' deployments, on a real API server -----------------------------------


def _tiers(cluster: Any, ns: str, name: str) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
    obj = get_qwd(cluster, ns, name)
    return obj.get("status", {}).get("tiers"), condition(obj, "TiersReady")


def _settled_without_writes(cluster: Any, seconds: float, namespace: str) -> None:
    """No operator write in `namespace` for `seconds`. Other namespaces are not this test's: an earlier
    test's namespace, still terminating, gets status patches and events while the operator retries its
    deployment (a make test of 2026-12-05 saw one land in this window)."""
    _audit_writes(cluster, time.time())  # skips where the cluster keeps no audit log
    assert_settled_writes_nothing(cluster, [OPERATOR_USER], namespace, quiet=4, window=seconds)


def test_a_tier_is_reported_from_its_deployment_and_removed_without_a_trace(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    """`chat` fronts `small` (served as qwen3-8b) as a tier: status.tiers and TiersReady from small's own
    status, the gateway pods labelled so that small's engine NetworkPolicy admits them, and the 15-s poll
    of the tiers writes nothing while nothing changes. small deleted: DeploymentNotFound. The tiers
    removed: no status.tiers, no TiersReady, nothing written afterwards."""
    example = EXAMPLES[0]
    small = load_example(example, namespace)
    small["metadata"]["name"] = "small"
    small["spec"]["model"]["servedModelName"] = "qwen3-8b"
    chat = load_example(example, namespace)
    chat["metadata"]["name"] = "chat"
    small["spec"]["gateway"]["apiKeysSecret"] = chat["spec"]["gateway"]["apiKeysSecret"]
    chat["spec"]["gateway"]["tiers"] = [{"name": "qwen3-8b", "deploymentRef": {"name": "small"}}]
    chat["spec"]["gateway"]["aliases"] = [
        {
            "name": "auto",
            "rules": [{"model": "qwen3-8b", "maxPromptBytes": 4000}],
            "default": "Qwen/Qwen3-32B",
        }
    ]
    secrets_for(cluster, chat)
    apply(cluster, small)
    wait_condition(cluster, namespace, "small", "Ready", "True", timeout=120)
    apply(cluster, chat)
    ready = wait_condition(cluster, namespace, "chat", "TiersReady", "True", timeout=120)
    assert condition(ready, "TiersReady")["message"] == "1 tier(s) serve"
    assert ready["status"]["tiers"] == [
        {"name": "qwen3-8b", "deployment": "small", "ready": True, "readyReplicas": 1, "reason": "Ready",
         "message": "small: 1 ready engine replica(s)"}
    ]  # fmt: skip
    # small's engine NetworkPolicy admits chat's gateway pods (a peer selecting exactly their labels).
    labels = kubectl_json(cluster, "-n", namespace, "get", "deployment", "chat-gateway")["spec"]["template"][
        "metadata"
    ]["labels"]
    assert labels["fronts.qwenops.dev/small"] == "gateway"
    policy = kubectl_json(cluster, "-n", namespace, "get", "networkpolicy", "small-engine")
    peers = [p for rule in policy["spec"]["ingress"] for p in rule.get("from", [])]
    fronting = [p["podSelector"]["matchLabels"] for p in peers if "namespaceSelector" not in p]
    assert any(
        selector.get("fronts.qwenops.dev/small") == "gateway" and selector.items() <= labels.items()
        for selector in fronting
    ), peers
    _settled_without_writes(cluster, 20, namespace)  # more than one 15-s poll of the tiers

    cluster.kubectl("-n", namespace, "delete", "qwd", "small", "--wait=false")
    gone = "QwenDeployment small not found in this namespace"
    want = [{"name": "qwen3-8b", "deployment": "small", "ready": False, "readyReplicas": 0,
             "reason": "DeploymentNotFound", "message": gone}]  # fmt: skip
    wait_until(lambda: _tiers(cluster, namespace, "chat")[0] == want, 60, "status.tiers DeploymentNotFound")
    missing = _tiers(cluster, namespace, "chat")[1]
    assert (missing["status"], missing["reason"]) == ("False", "DeploymentNotFound"), missing
    assert missing["message"] == f"tier qwen3-8b: {gone} (its requests get a JSON 503)"

    patch_qwd(cluster, namespace, "chat", json.dumps({"spec": {"gateway": {"tiers": None, "aliases": None}}}))
    wait_until(lambda: _tiers(cluster, namespace, "chat") == (None, {}), 60, "no status.tiers, no TiersReady")
    wait_condition(cluster, namespace, "chat", "Ready", "True")
    gateway = kubectl_json(cluster, "-n", namespace, "get", "deployment", "chat-gateway")
    assert "fronts.qwenops.dev/small" not in gateway["spec"]["template"]["metadata"]["labels"]
    _settled_without_writes(cluster, 20, namespace)
