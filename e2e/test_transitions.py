"""Day 2 on the dev cluster: every edit of a QwenDeployment that serves, as a user makes it.

Each test edits a QwenDeployment that is Ready and asserts what the issue calls safe:
* capacity: the engine Deployment's available replicas and the engine Service's ready endpoints,
  from WATCH EVENTS of both (qwen_devtools.capacity), never below what the change allows (the replicas
  of the spec, kept during a Surge rollout);
* the status is exactly the computed one: fields that no longer apply are gone, every condition's
  observedGeneration follows the spec;
* the first resync after the change writes nothing (the API server's audit log, the operator's user).

The engine and gateway pods here are SIMULATED (kwok nodes run no containers; "ready" is kwok's): these
rows are about scheduling, ownership and status. The rows where a request must not fail run on the real
node (e2e/test_real_journey.py: the autoscaling hand-off and key rotation under traffic). The matrix
with each row's result is in docs/reliability.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.capacity import CapacityWatch
from qwen_devtools.operator_proc import OPERATOR_USER, OperatorProcess, audit_writes, installed_operator
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until
from qwen_operator.api.quantity import canonical
from qwen_operator.names import HANDOVER_FIELD_MANAGER

pytestmark = pytest.mark.cluster

#: Short, so that "the first resync after the change writes nothing" is seconds of test time.
RESYNC_SECONDS = 6


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    env = {"QWEN_OPERATOR_RETRY_MAX_SECONDS": "4"}
    work = tmp_path_factory.mktemp("transitions")
    with installed_operator(cluster, work, env=env, resync_seconds=RESYNC_SECONDS) as proc:
        yield proc


def example(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
    body["metadata"]["namespace"] = namespace
    for key, value in spec.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    return body


def kubectl_json(cluster: Any, *args: str) -> Any:
    out = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def create(cluster: Any, body: dict[str, Any], secret: bool = True) -> str:
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    keys = body["spec"].get("gateway", {}).get("apiKeysSecret")
    if keys and secret:
        cluster.kubectl("-n", ns, "create", "secret", "generic", keys, "--from-literal=team-a=sk-test-a")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    return str(name)


def patch(cluster: Any, ns: str, name: str, spec: dict[str, Any]) -> None:
    cluster.kubectl("-n", ns, "patch", "qwd", name, "--type=merge", "-p", json.dumps({"spec": spec}))


def qwd(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    return kubectl_json(cluster, "-n", ns, "get", "qwd", name)  # type: ignore[no-any-return]


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == ctype), {})


def engine(cluster: Any, ns: str, name: str, *flags: str) -> dict[str, Any]:
    return kubectl_json(cluster, "-n", ns, "get", "deployment", f"{name}-engine", *flags)  # type: ignore[no-any-return]


def engine_pods(cluster: Any, ns: str, name: str) -> set[str]:
    pods = kubectl_json(
        cluster,
        "-n",
        ns,
        "get",
        "pods",
        "-l",
        f"app.kubernetes.io/instance={name},app.kubernetes.io/component=engine",
    )
    return {p["metadata"]["uid"] for p in pods["items"] if not p["metadata"].get("deletionTimestamp")}


def settled(cluster: Any, ns: str, name: str, ready: str = "True", timeout: float = 120) -> dict[str, Any]:
    """The status of the current generation, every condition of it too, Ready as asked, no rollout."""

    def check() -> dict[str, Any] | None:
        obj = qwd(cluster, ns, name)
        status, generation = obj.get("status", {}), obj["metadata"]["generation"]
        current = status.get("observedGeneration") == generation and all(
            c.get("observedGeneration") == generation for c in status.get("conditions", [])
        )
        rolled = condition(obj, "Progressing").get("status") in ("False", None)
        return obj if current and rolled and condition(obj, "Ready").get("status") == ready else None

    try:
        return wait_until(check, timeout, f"{name}: status of its generation, Ready={ready}, rolled out")
    except AssertionError:
        print(json.dumps(qwd(cluster, ns, name).get("status"), indent=1))
        raise


def writes_in(cluster: Any, ns: str, since: float) -> list[str]:
    if not (Path(cluster.kubeconfig).parent / "audit.log").exists():
        pytest.skip("this cluster keeps no audit log (only the dev cluster does)")
    return [
        f"{w['verb']} {w['requestURI']}"
        for w in audit_writes(cluster, [OPERATOR_USER], since)
        if w.get("objectRef", {}).get("namespace") == ns
    ]


def assert_resync_writes_nothing(cluster: Any, operator: OperatorProcess, ns: str) -> None:
    """Once the operator stopped writing to `ns`, the next two resyncs (every object reconciled twice)
    write nothing there."""
    wait_until(lambda: not writes_in(cluster, ns, time.time() - 3), 60, "the operator's writes to stop")
    since, reconciles = time.time(), operator.metric("qwen_operator_reconciles_total")
    time.sleep(2 * RESYNC_SECONDS + 1)
    time.sleep(1.5)  # the audit log is written when a request completes
    assert operator.metric("qwen_operator_reconciles_total") > reconciles, "no resync ran"
    written = writes_in(cluster, ns, since)
    assert written == [], "a resync with nothing to do wrote:\n" + "\n".join(written)


def watch_engine(cluster: Any, ns: str, name: str) -> CapacityWatch:
    return CapacityWatch(cluster.api_client(), ns, f"{name}-engine", f"{name}-engine")


def replicas_owners(dep: dict[str, Any]) -> set[str]:
    return {
        m["manager"]
        for m in dep["metadata"].get("managedFields", [])
        if "f:replicas" in (m.get("fieldsV1", {}).get("f:spec") or {})
    }


# --- rows ----------------------------------------------------------------------------------------------


def test_replicas_to_autoscaling_and_back_never_drops_an_engine(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    name = create(cluster, example("a100-80gb-tp2-bf16", namespace, replicas=3))
    settled(cluster, namespace, name)
    with watch_engine(cluster, namespace, name) as seen:
        start = time.time()
        patch(
            cluster, namespace, name, {"replicas": None, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}
        )
        wait_until(lambda: kubectl_json(cluster, "-n", namespace, "get", "hpa", f"{name}-engine"), 30, "HPA")
        obj = settled(cluster, namespace, name)
        time.sleep(2)  # the HPA's first look (it reads no metric on this cluster: it keeps replicas)
        # Before the hand-off the field went from the operator's apply to nobody: defaulted to 1.
        assert min(r or 0 for r in seen.replicas_seen(start)) >= 3, seen.replicas_seen(start)
        assert seen.lowest(start) >= (3, 3), seen.lowest(start)
    assert "autoscaling" in obj["status"]
    dep = engine(cluster, namespace, name, "--show-managed-fields")
    owners = replicas_owners(dep)
    assert "qwen-operator" not in owners and owners & {HANDOVER_FIELD_MANAGER, "kube-controller-manager"}, (
        owners
    )
    assert_resync_writes_nothing(cluster, operator, namespace)

    with watch_engine(cluster, namespace, name) as seen:
        start = time.time()
        patch(cluster, namespace, name, {"autoscaling": None, "replicas": 2})
        wait_until(
            lambda: not kubectl_json(cluster, "-n", namespace, "get", "hpa", f"{name}-engine"), 30, "no HPA"
        )
        obj = settled(cluster, namespace, name)
        assert seen.replicas_seen(start)[-1] == 2 and min(r or 0 for r in seen.replicas_seen(start)) == 2
        assert seen.lowest(start)[0] >= 2
    assert "autoscaling" not in obj["status"], obj["status"]["autoscaling"]
    assert condition(obj, "ScalingReady")["reason"] == "FixedReplicas"
    assert "qwen-operator" in replicas_owners(engine(cluster, namespace, name, "--show-managed-fields"))
    assert_resync_writes_nothing(cluster, operator, namespace)


KEDA_TO_ZERO = {
    "minReplicas": 0,
    "maxReplicas": 2,
    "driver": "keda",
    "prometheusAddress": "http://prometheus.monitoring:9090",
}


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param({"autoscaling": {"minReplicas": 1, "maxReplicas": 2, "driver": "hpa"}}, id="to-hpa"),
        pytest.param({"autoscaling": None, "replicas": 2}, id="to-fixed-replicas"),
    ],
)
def test_engines_left_at_zero_by_keda_serve_again_under_the_next_driver(
    cluster: Any, operator: OperatorProcess, namespace: str, edit: dict[str, Any]
) -> None:
    """KEDA leaves the engines at 0 replicas; an HPA does nothing while its target is at 0 (its
    ScalingActive is False), so after an edit to the HPA driver only the operator can start an engine:
    it lifts the Deployment to minReplicas (as the hand-off manager); an edit to fixed replicas applies
    them. KEDA's CRDs are absent here, so KEDA's part, scaling to zero, is done by hand through the
    scale subresource, as KEDA's HPA does."""
    name = create(cluster, example("a100-80gb-tp2-bf16", namespace, replicas=None, autoscaling=KEDA_TO_ZERO))
    settled(cluster, namespace, name)
    cluster.kubectl("-n", namespace, "scale", "deployment", f"{name}-engine", "--replicas=0")
    wait_until(lambda: engine(cluster, namespace, name)["status"].get("replicas", 0) == 0, 60, "at zero")
    spec = dict(edit)
    if spec.get("autoscaling"):
        spec["autoscaling"] = {**spec["autoscaling"], "prometheusAddress": None}
    patch(cluster, namespace, name, spec)
    want = 1 if edit.get("autoscaling") else 2
    wait_until(lambda: engine(cluster, namespace, name)["spec"]["replicas"] == want, 60, f"{want} replicas")
    obj = settled(cluster, namespace, name)
    assert obj["status"]["readyReplicas"] == want, obj["status"]["replicasSummary"]
    assert "ScaledToZero" not in {c["type"] for c in obj["status"]["conditions"]}
    if edit.get("autoscaling"):
        assert kubectl_json(cluster, "-n", namespace, "get", "hpa", f"{name}-engine")
        owners = replicas_owners(engine(cluster, namespace, name, "--show-managed-fields"))
        assert "qwen-operator" not in owners, owners
    assert_resync_writes_nothing(cluster, operator, namespace)


def test_context_across_the_yarn_threshold_leaves_no_stale_plan(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    body = example("h100-80gb-tp2-fp8-128k", namespace, autoscaling=None, replicas=2)
    name = create(cluster, body)
    obj = settled(cluster, namespace, name)
    assert obj["status"]["plan"]["yarnFactor"] == 4 and obj["status"]["maxModelLen"] == 131072
    before = engine_pods(cluster, namespace, name)
    with watch_engine(cluster, namespace, name) as seen:
        start = time.time()
        patch(cluster, namespace, name, {"engine": {"maxModelLen": 32768}})
        obj = settled(cluster, namespace, name)
        wait_until(lambda: not engine_pods(cluster, namespace, name) & before, 60, "old engine pods gone")
        assert obj["status"]["rolloutStrategy"].startswith("Surge"), obj["status"]["rolloutStrategy"]
        assert seen.lowest(start)[0] >= 2, "a Surge rollout keeps every replica available"
        assert len({json.dumps(s) for s in seen.strategies_seen(start)}) == 1, seen.strategies_seen(start)
    assert "yarnFactor" not in obj["status"]["plan"], obj["status"]["plan"]
    assert obj["status"]["maxModelLen"] == 32768
    assert_resync_writes_nothing(cluster, operator, namespace)
    patch(cluster, namespace, name, {"engine": {"maxModelLen": 65536, "kvCacheDtype": "auto"}})

    def yarn_again() -> dict[str, Any] | None:
        obj = settled(cluster, namespace, name)
        return obj if obj["status"]["plan"].get("yarnFactor") == 2 else None

    wait_until(yarn_again, 120, "YaRN factor 2")
    args = engine(cluster, namespace, name)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--kv-cache-dtype") + 1] == "auto"
    assert_resync_writes_nothing(cluster, operator, namespace)


def test_engine_edits_roll_out_keeping_capacity_and_the_strategy(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    """TP, quantization, image and extraArgs: each a new engine pod, rolled out with surge (the KV dtype
    edit is in the YaRN row: FP8 KV needs an H100)."""
    name = create(cluster, example("a100-80gb-tp2-bf16", namespace, replicas=2))
    settled(cluster, namespace, name)
    edits = [
        ({"parallelism": {"tensor": 4}}, lambda a, p: a[a.index("--tensor-parallel-size") + 1] == "4"),
        ({"engine": {"quantization": "fp8_per_tensor"}}, lambda a, p: "--quantization" in a),
        ({"engine": {"extraArgs": ["--seed", "7"]}}, lambda a, p: a[-2:] == ["--seed", "7"]),
        (
            {"engine": {"image": "vllm/vllm-openai:v0.32.1"}},
            lambda a, p: p["image"] == "vllm/vllm-openai:v0.32.1",
        ),
    ]
    for edit, rolled in edits:
        before = engine_pods(cluster, namespace, name)
        with watch_engine(cluster, namespace, name) as seen:
            start = time.time()
            patch(cluster, namespace, name, edit)
            obj = settled(cluster, namespace, name)
            gone = lambda old=before: not engine_pods(cluster, namespace, name) & old  # noqa: E731
            wait_until(gone, 60, f"{edit}: rolled")
            container = engine(cluster, namespace, name)["spec"]["template"]["spec"]["containers"][0]
            assert rolled(container["args"], container), f"{edit}: not in the pod"
            assert obj["status"]["rolloutStrategy"].startswith("Surge")
            assert seen.lowest(start)[0] >= 2, f"{edit}: capacity dropped: {seen.lowest(start)}"
            assert len({json.dumps(s) for s in seen.strategies_seen(start)}) == 1, seen.strategies_seen(start)
    gpus = container["resources"]["requests"]["nvidia.com/gpu"]
    assert gpus == "4", "GPUs requested follow the tensor parallel size"
    assert_resync_writes_nothing(cluster, operator, namespace)


def _l40s_gpus_used(cluster: Any) -> tuple[int, bool]:
    """GPUs requested by the pods on the L40S pool, and whether any of those pods is terminating."""
    pods = kubectl_json(
        cluster, "get", "pods", "-A", "--field-selector", "status.phase!=Succeeded,status.phase!=Failed"
    )
    nodes = kubectl_json(cluster, "get", "nodes", "-l", "qwenops.dev/pool=l40s-48gb")
    names = {n["metadata"]["name"] for n in nodes["items"]}
    on_pool = [p for p in pods["items"] if p["spec"].get("nodeName") in names]
    used = sum(
        int(c.get("resources", {}).get("requests", {}).get("nvidia.com/gpu", 0))
        for p in on_pool
        for c in p["spec"]["containers"]
    )
    return used, any(p["metadata"].get("deletionTimestamp") for p in on_pool)


def _free_l40s_gpus(cluster: Any, at_least: int = 2) -> int:
    """Free GPUs of the 4 in the L40S pool, once the pods of an earlier test's namespace are gone: none
    terminating (a terminating pod's GPUs, freed after the count, would change the strategy chosen)."""

    def settled_free() -> int | None:
        used, terminating = _l40s_gpus_used(cluster)
        return None if terminating or 4 - used < at_least else 4 - used

    try:
        return wait_until(settled_free, 120, "free L40S GPUs, no pod of the pool terminating")
    except AssertionError:
        pytest.skip(f"fewer than {at_least} free L40S GPUs on this cluster after 120 s")


def test_a_surge_rollout_keeps_surge_once_its_pod_takes_the_last_free_gpu(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    """The L40S pool has 4 GPUs; at TP 1 with 3 replicas one is free: Surge. Its surge pod takes it, and
    a strategy chosen again would be InPlace (an old engine stopped while the new one loads)."""
    free = _free_l40s_gpus(cluster)
    replicas = free - 1
    name = create(cluster, example("l40s-48gb-tp1-awq", namespace, replicas=replicas))
    settled(cluster, namespace, name)
    with watch_engine(cluster, namespace, name) as seen:
        start = time.time()
        patch(cluster, namespace, name, {"engine": {"maxNumSeqs": 32}})
        obj = settled(cluster, namespace, name)
        strategies = seen.strategies_seen(start)
        assert obj["status"]["rolloutStrategy"].startswith("Surge"), obj["status"]["rolloutStrategy"]
        assert all(s and s["rollingUpdate"]["maxUnavailable"] == 0 for s in strategies), strategies
        assert seen.lowest(start)[0] >= replicas
    assert_resync_writes_nothing(cluster, operator, namespace)


def test_on_a_full_pool_the_status_says_in_place_before_any_engine_is_replaced(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    """Every L40S GPU taken by this deployment: an engine edit can only replace pods one at a time, one
    replica down meanwhile. status.rolloutStrategy says so before the engine Deployment is written (the
    audit log's order), and capacity drops by exactly that replica."""
    free = _free_l40s_gpus(cluster)
    name = create(cluster, example("l40s-48gb-tp1-awq", namespace, replicas=free))
    said_before = settled(cluster, namespace, name)["status"]["rolloutStrategy"]
    with watch_engine(cluster, namespace, name) as seen:
        start = time.time()
        patch(cluster, namespace, name, {"engine": {"maxNumSeqs": 32}})
        obj = settled(cluster, namespace, name)
        assert obj["status"]["rolloutStrategy"].startswith("InPlace"), obj["status"]["rolloutStrategy"]
        assert seen.lowest(start)[0] >= free - 1, f"{seen.lowest(start)}: InPlace takes one replica down"
    time.sleep(1.5)
    order = [
        (w["objectRef"].get("resource"), w["objectRef"].get("subresource"), w["objectRef"].get("name"))
        for w in audit_writes(cluster, [OPERATOR_USER], start)
        if w.get("objectRef", {}).get("namespace") == namespace
    ]
    # Either the status already said InPlace (the pool is full since the pods took it) or it is
    # patched before the engine Deployment.
    if not said_before.startswith("InPlace"):
        announced = order.index(("qwendeployments", "status", name))
        assert announced < order.index(("deployments", None, f"{name}-engine")), order
    assert_resync_writes_nothing(cluster, operator, namespace)


def test_an_invalid_edit_and_its_revert_restart_nothing(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    name = create(cluster, example("a100-80gb-tp2-bf16", namespace))
    settled(cluster, namespace, name)
    pods = engine_pods(cluster, namespace, name)
    patch(cluster, namespace, name, {"parallelism": {"tensor": 3}})
    obj = settled(cluster, namespace, name)
    assert condition(obj, "ConfigValid")["status"] == "False"
    assert condition(obj, "Ready")["reason"] == "ServingPreviousSpec"
    assert_resync_writes_nothing(cluster, operator, namespace)
    patch(cluster, namespace, name, {"parallelism": {"tensor": 2}})
    obj = settled(cluster, namespace, name)
    assert (
        condition(obj, "Ready")["reason"] == "Serving" and condition(obj, "ConfigValid")["status"] == "True"
    )
    assert engine_pods(cluster, namespace, name) == pods, "an edit and its revert replaced engine pods"
    assert_resync_writes_nothing(cluster, operator, namespace)


def test_gateway_auth_and_monitoring_switched_leave_an_exact_status(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    name = create(cluster, example("a100-80gb-tp2-bf16", namespace))
    obj = settled(cluster, namespace, name)
    assert obj["status"]["gateway"]["apiKeysSecret"] == f"{name}-api-keys"
    pods = engine_pods(cluster, namespace, name)

    patch(cluster, namespace, name, {"gateway": {"auth": "none", "apiKeysSecret": None}})
    obj = settled(cluster, namespace, name)
    assert obj["status"]["gateway"] == {"auth": "none", "apiKeysSecretGenerated": False}, obj["status"][
        "gateway"
    ]
    assert engine_pods(cluster, namespace, name) == pods, "the gateway's auth edit restarted engines"

    patch(cluster, namespace, name, {"gateway": {"enabled": False}})
    obj = settled(cluster, namespace, name)
    assert "gateway" not in obj["status"], obj["status"]["gateway"]
    wait_until(
        lambda: not kubectl_json(cluster, "-n", namespace, "get", "deployment", f"{name}-gateway"),
        30,
        "no gateway",
    )
    patch(cluster, namespace, name, {"gateway": {"enabled": True, "auth": "apiKeys"}})
    obj = settled(cluster, namespace, name)
    assert obj["status"]["gateway"] == {
        "auth": "apiKeys",
        "apiKeysSecret": f"{name}-gateway-api-keys",
        "apiKeysSecretGenerated": True,
    }, obj["status"]["gateway"]
    # The engines' generated key goes with the gateway (clients call the engines while it is off), so
    # turning it off and on rolled them; what follows must not.
    pods = wait_until(lambda: engine_pods(cluster, namespace, name) or None, 60, "the engine pods")

    patch(cluster, namespace, name, {"monitoring": {"serviceMonitor": True, "prometheusRule": True}})
    settled(cluster, namespace, name)
    patch(cluster, namespace, name, {"monitoring": {"serviceMonitor": False, "prometheusRule": False}})
    obj = settled(cluster, namespace, name)
    assert condition(obj, "MonitoringReady")["reason"] == "Disabled"
    assert engine_pods(cluster, namespace, name) == pods, "monitoring edits restarted engines"
    assert_resync_writes_nothing(cluster, operator, namespace)


def test_delete_and_recreate_with_the_same_name(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    body = example("a100-80gb-tp2-bf16", namespace)
    name = create(cluster, body)
    first = settled(cluster, namespace, name)
    cluster.kubectl("-n", namespace, "delete", "qwd", name, "--wait=true", "--timeout=30s")
    create(cluster, body, secret=False)
    obj = settled(cluster, namespace, name)
    uid = obj["metadata"]["uid"]
    assert uid != first["metadata"]["uid"] and obj["status"]["observedGeneration"] == 1

    def owned_by_the_new_one() -> bool:
        dep = engine(cluster, namespace, name)
        return bool(dep) and [r["uid"] for r in dep["metadata"]["ownerReferences"]] == [uid]

    wait_until(owned_by_the_new_one, 60, "the engine Deployment of the new QwenDeployment")
    assert_resync_writes_nothing(cluster, operator, namespace)


def test_a_resync_writes_nothing_in_any_state(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    """Serving with quantities as users write them, refused for a foreign Service, waiting for missing
    Secrets (kwok runs no kubelet: the pods run regardless, so it serves), refused as too large."""
    quantities = {"cpu": "0.5", "memory": "65536Mi", "shmSize": "1024Mi"}
    serving = example("a100-80gb-tp2-bf16", namespace)
    serving["spec"]["engine"]["resources"] = quantities
    create(cluster, serving)
    taken = example("a100-80gb-tp2-bf16", namespace)
    taken["metadata"]["name"] = "taken"
    taken["spec"]["gateway"]["apiKeysSecret"] = "taken-keys"
    cluster.kubectl("-n", namespace, "create", "service", "clusterip", "taken-engine", "--tcp=8000:8000")
    create(cluster, taken)
    missing = example("l40s-48gb-tp1-awq", namespace, replicas=1)
    missing["spec"]["engine"]["apiKeySecret"] = {"name": "nowhere"}
    create(cluster, missing, secret=False)
    too_large = example("a100-80gb-tp2-bf16", namespace)
    too_large["metadata"]["name"] = "too-large"
    too_large["spec"]["gpu"] = {"type": "A100-40GB"}
    too_large["spec"]["parallelism"] = {"tensor": 1}  # 64 GB of bf16 weights on one 40 GB GPU
    create(cluster, too_large, secret=False)

    settled(cluster, namespace, serving["metadata"]["name"])
    wait_until(
        lambda: condition(qwd(cluster, namespace, "taken"), "Synced").get("reason") == "ForeignObject",
        60,
        "taken",
    )
    settled(cluster, namespace, missing["metadata"]["name"], ready="True")
    wait_until(
        lambda: condition(qwd(cluster, namespace, "too-large"), "CapacityFit").get("status") == "False",
        60,
        "refused",
    )
    dep = engine(cluster, namespace, serving["metadata"]["name"])
    resources = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == canonical("0.5") == "500m"
    assert resources["requests"]["memory"] == "64Gi"
    assert_resync_writes_nothing(cluster, operator, namespace)


def test_events_are_one_per_condition_change(cluster: Any, operator: OperatorProcess, namespace: str) -> None:
    name = create(cluster, example("a100-80gb-tp2-bf16", namespace))
    settled(cluster, namespace, name)
    for tensor in (3, 2, 3, 2):  # refused, accepted, refused, accepted
        patch(cluster, namespace, name, {"parallelism": {"tensor": tensor}})
        settled(cluster, namespace, name)
    time.sleep(1.5)
    posted = [
        w
        for w in audit_writes(cluster, [OPERATOR_USER], 0)
        if w.get("objectRef", {}).get("namespace") == namespace and w["objectRef"].get("resource") == "events"
    ]
    events = kubectl_json(
        cluster, "-n", namespace, "get", "events", "--field-selector", f"involvedObject.name={name}"
    )
    reasons = [e["reason"] for e in sorted(events["items"], key=lambda e: e["metadata"]["creationTimestamp"])]
    # Two refusals and two recoveries: ConfigValid False (Warning) and True (Normal) twice each; Ready
    # stays True (ServingPreviousSpec), which is no change of that condition.
    assert reasons.count("InvalidSpec") == 2 and reasons.count("Valid") == 2, reasons
    assert len(posted) == len(events["items"]), "every Event the operator posted is one of those"
