"""Faults the real API server and the operating system produce, survived by the operator: SIGKILL in the
middle of a burst, the API server stopped (SIGSTOP) and restarted, children edited or deleted by hand, a
QwenDeployment deleted mid-reconcile or while the operator is down, a namespace deleted under it.

The operator runs as a process under install.yaml's ServiceAccount, without leader election, on a kwok
dev cluster of this module's own (its API server is stopped and restarted here, which must not hit
other tests). Its resync period is left at 300 s, so whatever converges within a test converged through
the watches. Faults a real server will not produce on demand (409, 429, 5xx, 410) are in
test_api_faults.py; failover between replicas in test_leader.py.

Engine and gateway pods here are SIMULATED (kwok nodes run no containers): a Ready status in these
tests is kwok's, not a real engine's (e2e/test_real_journey.py serves for real).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster import components, procs
from qwen_devtools.devcluster.state import State
from qwen_devtools.operator_proc import (
    OPERATOR_USER,
    OperatorProcess,
    audit_time,
    audit_writes,
    install,
    service_account_kubeconfig,
)
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review
from qwen_operator.kinds import MANAGED, optional
from qwen_operator.manifests import ClusterFacts, build_children
from qwen_operator.names import LABEL_PREFIX

pytestmark = pytest.mark.cluster

BURST = 30
#: GPU pools of the burst: AWQ on one GPU fits each, and 16 + 16 GPUs hold 30 engine pods.
BURST_POOLS = ("H100-80GB", "A100-80GB")
OWNER_LABEL = f"{LABEL_PREFIX}/deployment"
#: Children of built-in kinds (the dev cluster has none of the optional CRDs).
BUILT_IN_KINDS = ",".join(f"{k.plural}.{k.group}" if k.group else k.plural for k in MANAGED if not k.crd)
NO_OPTIONAL_CRDS = ClusterFacts(free_gpus=None, missing_crds=frozenset(k.crd for k in optional() if k.crd))


@pytest.fixture(scope="module")
def operator(
    own_cluster: devcluster.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    install(own_cluster)
    tmp = tmp_path_factory.mktemp("operator")
    kubeconfig = service_account_kubeconfig(own_cluster, tmp / "kubeconfig")
    proc = OperatorProcess(kubeconfig, tmp / "operator.log").start()
    yield proc
    proc.stop()
    print(f"\n--- operator log (tail) ---\n{proc.tail(40)}")


def _namespace_with_keys(cluster: devcluster.Cluster, prefix: str) -> str:
    """A fresh namespace with the gateways' API key Secret `keys`."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("-n", name, "create", "secret", "generic", "keys", "--from-literal=team=sk-test")
    return name


@pytest.fixture
def namespace(own_cluster: devcluster.Cluster) -> Iterator[str]:
    """A fresh namespace with the gateways' API key Secret `keys`, deleted afterwards."""
    name = _namespace_with_keys(own_cluster, "faults")
    yield name
    # Awaited, so that its clean-up does not load the next test.
    own_cluster.kubectl("delete", "namespace", name, "--timeout=180s", check=False, timeout=190)


@pytest.fixture
def burst_namespace(own_cluster: devcluster.Cluster) -> Iterator[str]:
    """`namespace` for the burst test, the module's last: its deletion is not awaited (the cluster goes)."""
    name = _namespace_with_keys(own_cluster, "burst")
    yield name
    own_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


# --- helpers ---------------------------------------------------------------------------------------


def qwendeployment(namespace: str, name: str, gpu: str = "A100-40GB", gateway: bool = True) -> dict[str, Any]:
    """AWQ on one GPU per replica, with one gateway pod (or none)."""
    return {
        "apiVersion": "inference.qwenops.dev/v1alpha1",
        "kind": "QwenDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen3-32B-AWQ"},
            "gpu": {"type": gpu},
            "parallelism": {"tensor": 1},
            "engine": {"maxModelLen": 8192},
            "gateway": {"apiKeysSecret": "keys", "replicas": 1} if gateway else {"enabled": False},
        },
    }


def apply(cluster: devcluster.Cluster, *bodies: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(bodies))


def kubectl_json(cluster: devcluster.Cluster, *args: str) -> Any:
    out = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    found = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == ctype]
    return found[0] if found else {}


def converged(obj: dict[str, Any]) -> bool:
    """The status is of the current generation, Ready and Synced."""
    current = obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
    return current and all(condition(obj, c).get("status") == "True" for c in ("Ready", "Synced"))


def qwds(cluster: devcluster.Cluster, namespace: str) -> list[dict[str, Any]]:
    return list(kubectl_json(cluster, "-n", namespace, "get", "qwd")["items"])


def wait_all_converged(
    cluster: devcluster.Cluster, namespace: str, count: int, timeout: float, only: str | None = None
) -> list[dict]:
    """The `count` QwenDeployments of `namespace` once all (or the one named `only`) converged."""

    def check() -> list[dict[str, Any]] | None:
        items = qwds(cluster, namespace)
        judged = [o for o in items if only in (None, o["metadata"]["name"])]
        return items if len(items) == count and all(map(converged, judged)) else None

    try:
        return wait_until(
            check, timeout, f"{count} QwenDeployments in {namespace} Ready and Synced", interval=1
        )
    except AssertionError:
        for obj in qwds(cluster, namespace):
            if not converged(obj):
                print(obj["metadata"]["name"], json.dumps(obj.get("status", {}).get("conditions"), indent=1))
        print(cluster.kubectl("get", "nodes", check=False).stdout)
        print(cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False).stdout)
        raise


def nodes_back(cluster: devcluster.Cluster, since: float) -> None:
    """Wait until kwok renewed every node's Lease after `since` (epoch s) and the node lifecycle controller
    had a period (5 s) to see it. After a long outage it may first mark nodes and their pods NotReady,
    and kwok never marks those pods ready again: only pods started after this stay ready."""

    def renewed() -> bool:
        leases = kubectl_json(cluster, "-n", "kube-node-lease", "get", "leases")["items"]
        stamps = [audit_time(lease["spec"]["renewTime"]) for lease in leases]
        return bool(stamps) and min(stamps) > since

    wait_until(renewed, 60, "kwok to renew the node Leases", interval=1)
    time.sleep(5)


def no_failing_objects(proc: OperatorProcess) -> None:
    """Wait for `qwen_operator_failing_objects` 0: an object deleted while failing is dropped by its
    next retry (at most RETRY_MAX_SECONDS and its jitter, a quarter more, after the last failure), not
    by the delete event."""
    wait_until(
        lambda: proc.metric("qwen_operator_failing_objects") == 0, 80, "no failing objects", interval=1
    )


def children(cluster: devcluster.Cluster, namespace: str) -> dict[str, set[tuple[str, str]]]:
    """(kind, name) of every labelled child in `namespace`, by owning QwenDeployment."""
    items = kubectl_json(cluster, "-n", namespace, "get", BUILT_IN_KINDS, "-l", OWNER_LABEL)["items"]
    found: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    for item in items:
        found[item["metadata"]["labels"][OWNER_LABEL]].add((item["kind"], item["metadata"]["name"]))
    return dict(found)


def rendered(obj: dict[str, Any]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in build_children(review(obj), NO_OPTIONAL_CRDS).objects}


def log_offset(proc: OperatorProcess) -> int:
    return proc.log_path.stat().st_size


def log_problems(proc: OperatorProcess, offset: int, text: str = "") -> list[str]:
    """WARNING and ERROR lines of the operator's log written after `offset`, containing `text`."""
    with proc.log_path.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    problems = []
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("level") in ("WARNING", "ERROR") and text in line:
                problems.append(entry["msg"])
    return problems


def quiet_after(proc: OperatorProcess, text: str, settle: float = 3, window: float = 8) -> list[str]:
    """Warnings about `text` in a `window` s that starts `settle` s from now: a failure retried with
    backoff (1, 2, 4, 8 s ...) logs again within it, a last one while things went away does not."""
    time.sleep(settle)
    offset = log_offset(proc)
    time.sleep(window)
    return log_problems(proc, offset, text)


def apiserver_pid(cluster: devcluster.Cluster) -> int:
    state = State.load(str(cluster.name))
    assert state is not None, f"no state of dev cluster {cluster.name}"
    return state.pids["kube-apiserver"]


def restart_apiserver(cluster: devcluster.Cluster) -> float:
    """Stop the API server (SIGTERM), start it again with the same flags, wait until ready; returns the
    seconds it was away. The new pid is recorded, so `down` stops it."""
    state = State.load(str(cluster.name))
    assert state is not None
    exe, layout = state.executables["kube-apiserver"], state.layout()
    stopped = time.monotonic()
    procs.stop(state.pids["kube-apiserver"], exe)
    pid = procs.start("kube-apiserver", components.argv("kube-apiserver", layout), state.dir / "logs")
    state.pids["kube-apiserver"] = pid
    state.save()
    probe = components.probe("kube-apiserver", layout)
    procs.wait_healthy("kube-apiserver", pid, exe, probe, state.log_file("kube-apiserver"), 90)
    return time.monotonic() - stopped


def figure(line: str) -> None:
    print(f"\n[figure] {line}")


# --- the faults ------------------------------------------------------------------------------------


def test_api_server_stopped_45_s(
    own_cluster: devcluster.Cluster, operator: OperatorProcess, namespace: str
) -> None:
    def stop_45_s() -> str:
        pid = apiserver_pid(own_cluster)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(45)
            assert operator.alive(), operator.tail()
        finally:
            os.kill(pid, signal.SIGCONT)
        return "API server stopped 45 s (SIGSTOP)"

    outage_survived(own_cluster, operator, namespace, stop_45_s, nodes_stale=True)


def test_api_server_restarted(
    own_cluster: devcluster.Cluster, operator: OperatorProcess, namespace: str
) -> None:
    outage_survived(
        own_cluster,
        operator,
        namespace,
        lambda: f"API server restarted ({restart_apiserver(own_cluster):.1f} s away)",
    )


def outage_survived(
    cluster: devcluster.Cluster,
    operator: OperatorProcess,
    namespace: str,
    outage: Callable[[], str],
    nodes_stale: bool = False,
) -> None:
    """Across `outage`: the operator keeps running, its watches of children and of QwenDeployments
    resume (a hand edit is reverted, a new CR converges), and the status of the CR from before still
    tells the truth about its engine. `nodes_stale`: the outage outlasted the node Leases' grace
    period, so the new CR waits for `nodes_back`."""
    apply(cluster, qwendeployment(namespace, "before"))
    wait_all_converged(cluster, namespace, 1, timeout=90)
    what = outage()
    back, back_at = time.monotonic(), time.time()
    assert operator.alive(), operator.tail()
    image = engine_image(cluster, namespace, "before")
    edit = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil:latest"}]
    cluster.kubectl(
        "-n", namespace, "patch", "deployment", "before-engine", "--type=json", "-p", json.dumps(edit)
    )
    wait_until(lambda: engine_image(cluster, namespace, "before") == image, 60, "the hand edit reverted")
    reverted = time.monotonic() - back
    if nodes_stale:
        nodes_back(cluster, since=back_at)
    apply(cluster, qwendeployment(namespace, "after"))
    wait_all_converged(cluster, namespace, 2, timeout=90, only="after")
    figure(
        f"{what}: operator alive; a child edit reverted {reverted:.1f} s after, a new CR Ready and Synced "
        f"{time.monotonic() - back:.1f} s after (watches, no resync)"
    )
    wait_until(
        lambda: tells_the_truth(cluster, namespace, "before"),
        60,
        "the old CR's status to be true",
        interval=2,
    )
    assert operator.alive(), operator.tail()


def engine_image(cluster: devcluster.Cluster, namespace: str, name: str) -> str:
    dep = kubectl_json(cluster, "-n", namespace, "get", "deployment", f"{name}-engine")
    return str(dep["spec"]["template"]["spec"]["containers"][0]["image"])


def qwd(cluster: devcluster.Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(kubectl_json(cluster, "-n", namespace, "get", "qwd", name))


def tells_the_truth(cluster: devcluster.Cluster, namespace: str, name: str) -> bool:
    """Synced, of the current generation, its ready replicas those of the engine Deployment, and Ready
    exactly when an engine and a gateway pod are ready. (After a long outage the node lifecycle
    controller marks pods NotReady and kwok, unlike a kubelet, never marks them ready again: Ready=False
    is then the truth about simulated pods.)"""
    obj = qwd(cluster, namespace, name)
    ready = {
        part: (kubectl_json(cluster, "-n", namespace, "get", "deployment", f"{name}-{part}") or {})
        .get("status", {})
        .get("readyReplicas", 0)
        for part in ("engine", "gateway")
    }
    status = obj.get("status", {})
    serving = "True" if ready["engine"] and ready["gateway"] else "False"
    truth = (
        status.get("observedGeneration") == obj["metadata"]["generation"]
        and status.get("readyReplicas") == ready["engine"]
        and condition(obj, "Ready").get("status") == serving
        and condition(obj, "Synced").get("status") == "True"
    )
    if not truth:
        conditions = {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}
        print(f"{name}: ready pods {ready}, status readyReplicas {status.get('readyReplicas')}, {conditions}")
    return truth


def test_children_edited_or_deleted_by_hand_are_reverted(
    own_cluster: devcluster.Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply(own_cluster, qwendeployment(namespace, "hand"))
    (obj,) = wait_all_converged(own_cluster, namespace, 1, timeout=90)
    want = {
        (o["kind"], o["metadata"]["name"]): o for o in build_children(review(obj), NO_OPTIONAL_CRDS).objects
    }
    ns = ("-n", namespace)

    def gets(kind: str, name: str) -> Any:
        return kubectl_json(own_cluster, *ns, "get", kind, name)

    engine_uid = gets("deployment", "hand-engine")["metadata"]["uid"]
    want_selector = want[("Service", "hand")]["spec"]["selector"]
    selector = {k: "elsewhere" for k in want_selector}
    gateway_config = want[("ConfigMap", "hand-gateway")]["data"]
    key = sorted(gateway_config)[0]
    faults = {
        "engine Deployment deleted": (
            lambda: own_cluster.kubectl(*ns, "delete", "deployment", "hand-engine", "--wait=false"),
            lambda: (
                (gets("deployment", "hand-engine") or {}).get("metadata", {}).get("uid")
                not in (None, engine_uid)
            ),
        ),
        "gateway ConfigMap edited": (
            lambda: own_cluster.kubectl(
                *ns,
                "patch",
                "configmap",
                "hand-gateway",
                "--type=merge",
                "-p",
                json.dumps({"data": {key: "x"}}),
            ),
            lambda: (gets("configmap", "hand-gateway") or {}).get("data", {}).get(key) == gateway_config[key],
        ),
        "client Service selector edited": (
            lambda: own_cluster.kubectl(
                *ns,
                "patch",
                "service",
                "hand",
                "--type=merge",
                "-p",
                json.dumps({"spec": {"selector": selector}}),
            ),
            lambda: (gets("service", "hand") or {}).get("spec", {}).get("selector") == want_selector,
        ),
        "PodDisruptionBudget deleted": (
            lambda: own_cluster.kubectl(*ns, "delete", "pdb", "hand-engine"),
            lambda: gets("pdb", "hand-engine") is not None,
        ),
    }
    for fault, (inject, repaired) in faults.items():
        started = time.monotonic()
        inject()
        wait_until(repaired, 30, f"the operator to repair: {fault}", interval=0.2)
        figure(f"{fault}: repaired in {time.monotonic() - started:.1f} s")
    wait_all_converged(own_cluster, namespace, 1, timeout=90)
    assert children(own_cluster, namespace)["hand"] == set(want)


def test_deleted_mid_reconcile_leaves_nothing(
    own_cluster: devcluster.Cluster, operator: OperatorProcess, namespace: str
) -> None:
    offset = log_offset(operator)
    apply(own_cluster, qwendeployment(namespace, "brief"))
    wait_until(lambda: children(own_cluster, namespace).get("brief"), 30, "the first child", interval=0.05)
    own_cluster.kubectl("-n", namespace, "delete", "qwd", "brief", "--wait=false")
    deleted = time.monotonic()
    wait_until(lambda: not children(own_cluster, namespace), 60, "the children to be garbage-collected")
    gone = time.monotonic() - deleted
    later = quiet_after(operator, namespace)
    figure(
        f"CR deleted mid-reconcile: children gone {gone:.1f} s later;"
        f" warnings meanwhile: {log_problems(operator, offset, namespace)}"
    )
    assert not children(own_cluster, namespace), "a child came back after the deletion"
    assert later == [], later
    no_failing_objects(operator)


def test_deleted_while_the_operator_is_down_is_not_recreated(
    own_cluster: devcluster.Cluster, operator: OperatorProcess, namespace: str
) -> None:
    doomed = (qwendeployment(namespace, "one"), qwendeployment(namespace, "two", gateway=False))
    apply(own_cluster, *doomed, qwendeployment(namespace, "stays", gateway=False))
    wait_all_converged(own_cluster, namespace, 3, timeout=90)
    operator.stop()
    try:
        own_cluster.kubectl("-n", namespace, "delete", "qwd", "one", "two", "--wait=true", "--timeout=30s")
        stopped = time.monotonic()
        wait_until(lambda: set(children(own_cluster, namespace)) == {"stays"}, 60, "the children collected")
        collected = time.monotonic() - stopped
    finally:
        operator.start()
    restarted = time.time()
    # The restarted operator has listed what exists once it has reconciled the one that stays.
    wait_until(lambda: operator.metric("qwen_operator_reconciles_total") >= 1, 30, "the first reconcile")
    time.sleep(3)
    writes = [
        w
        for w in audit_writes(own_cluster, [OPERATOR_USER], restarted)
        if w["objectRef"].get("namespace") == namespace
        and w["objectRef"].get("name", "").startswith(("one", "two"))
    ]
    figure(
        f"CRs deleted with the operator down: children collected in {collected:.1f} s;"
        f" {len(writes)} writes for them after the restart"
    )
    assert set(children(own_cluster, namespace)) == {"stays"}
    assert writes == [], [f"{w['verb']} {w['requestURI']}" for w in writes]


def test_namespace_deleted_with_deployments_in_it(
    own_cluster: devcluster.Cluster, operator: OperatorProcess
) -> None:
    name = f"doomed-{secrets.token_hex(3)}"
    own_cluster.kubectl("create", "namespace", name)
    own_cluster.kubectl("-n", name, "create", "secret", "generic", "keys", "--from-literal=team=sk-test")
    apply(own_cluster, *(qwendeployment(name, f"d{i}") for i in range(3)))
    wait_all_converged(own_cluster, name, 3, timeout=90)
    offset = log_offset(operator)
    started = time.monotonic()
    own_cluster.kubectl("delete", "namespace", name, "--wait=true", "--timeout=120s", timeout=130)
    gone = time.monotonic() - started
    later = quiet_after(operator, name)
    during = log_problems(operator, offset, name)
    figure(
        f"namespace with 3 deployments deleted: gone in {gone:.1f} s; {len(during)} warnings meanwhile,"
        f" {len(later)} in 8 s from 3 s after: {during}"
    )
    assert later == [], later
    no_failing_objects(operator)
    assert operator.alive()


def test_a_service_port_edited_by_hand_is_reverted(
    own_cluster: devcluster.Cluster, operator: OperatorProcess, namespace: str
) -> None:
    apply(own_cluster, qwendeployment(namespace, "port", gateway=False))
    (obj,) = wait_all_converged(own_cluster, namespace, 1, timeout=90)
    want = next(o for o in build_children(review(obj), NO_OPTIONAL_CRDS).objects if o["kind"] == "Service")
    name, ports = want["metadata"]["name"], want["spec"]["ports"]
    edit = [{"op": "replace", "path": "/spec/ports/0/port", "value": ports[0]["port"] + 1}]
    started = time.monotonic()
    own_cluster.kubectl("-n", namespace, "patch", "service", name, "--type=json", "-p", json.dumps(edit))

    def reverted() -> bool:
        live = kubectl_json(own_cluster, "-n", namespace, "get", "service", name)
        return [p["port"] for p in live["spec"]["ports"]] == [p["port"] for p in ports]

    try:
        wait_until(reverted, 30, f"Service {name} back to ports {ports}", interval=0.2)
    finally:
        live = kubectl_json(own_cluster, "-n", namespace, "get", "service", name)
        print(f"\nService {name} ports: {live['spec']['ports']}")
        print(json.dumps(condition(qwds(own_cluster, namespace)[0], "Synced"), indent=1))
    figure(f"Service port edited by hand: reverted in {time.monotonic() - started:.1f} s")
    wait_all_converged(own_cluster, namespace, 1, timeout=30)


# Last in the module: its 30 deployments are left to the cluster's teardown.
def test_sigkill_in_the_middle_of_a_burst_then_restart(
    own_cluster: devcluster.Cluster, operator: OperatorProcess, burst_namespace: str
) -> None:
    namespace = burst_namespace
    bodies = [qwendeployment(namespace, f"burst-{i:02d}", BURST_POOLS[i % 2]) for i in range(BURST)]
    apply(own_cluster, *bodies)
    wait_until(
        lambda: len(children(own_cluster, namespace)) >= 3,
        60,
        "the operator to start on the burst",
        interval=0.1,
    )
    operator.kill()
    killed = time.monotonic()
    statuses = sum(1 for o in qwds(own_cluster, namespace) if o.get("status"))
    started_on = len(children(own_cluster, namespace))
    assert started_on < BURST, "the burst was done before the kill: nothing was interrupted"

    operator.start()
    items = wait_all_converged(own_cluster, namespace, BURST, timeout=180)
    figure(
        f"SIGKILL mid-burst: {started_on}/{BURST} CRs had children and {statuses} a status at the kill; "
        f"all {BURST} Ready and Synced {time.monotonic() - killed:.1f} s after the kill (restart included)"
    )
    live = children(own_cluster, namespace)
    for obj in items:
        name = obj["metadata"]["name"]
        assert live.get(name) == rendered(obj), f"{name}: children differ from the render"
        assert obj["status"]["endpoint"].startswith(f"http://{name}.{namespace}.svc")
        assert obj["status"]["plan"]["fits"] is True
        assert condition(obj, "Synced")["reason"] == "ReconcileSucceeded"
    deployments = {n for kinds in live.values() for k, n in kinds if k == "Deployment"}
    replica_sets = kubectl_json(own_cluster, "-n", namespace, "get", "replicasets")["items"]
    per_deployment = collections.Counter(r["metadata"]["ownerReferences"][0]["name"] for r in replica_sets)
    assert per_deployment == collections.Counter(deployments), "a Deployment with more than one ReplicaSet"
    services = {
        s["metadata"]["name"] for s in kubectl_json(own_cluster, "-n", namespace, "get", "services")["items"]
    }
    assert services == {n for kinds in live.values() for k, n in kinds if k == "Service"}
    pods = kubectl_json(own_cluster, "-n", namespace, "get", "pods")["items"]
    assert len(pods) == 2 * BURST, f"{len(pods)} pods for {BURST} engines and {BURST} gateways"
