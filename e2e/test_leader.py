"""Leader election against a real API server: the election rules with electors in this process, then two
operator replicas failing over (SIGKILL, SIGTERM, the API server stopped), with the audit log as the
proof that only the leader writes.

The module runs on a kwok dev cluster of its own: it stops that cluster's API server, and an operator
of another test module (or of another session sharing the `test` cluster) would write to the same
objects and blur the audit log.

Engine and gateway pods here are SIMULATED (kwok nodes run no containers): a Ready status in these
tests is kwok's, not a real engine's (e2e/test_real_journey.py serves for real).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CoordinationV1Api, CoreV1Api, V1Namespace, V1ObjectMeta

from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster.state import State
from qwen_devtools.operator_proc import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    audit_writes,
    install,
    service_account_kubeconfig,
    service_account_like_operator,
)
from qwen_devtools.wait import wait_until
from qwen_operator.k8s import Leases
from qwen_operator.leader import Attempt, Election, Elector
from qwen_operator.lease import LEASE_SECONDS, LOST_EXIT_CODE, RENEW_DEADLINE_SECONDS, RETRY_SECONDS, Timing

pytestmark = pytest.mark.cluster

#: What a step may take beyond the durations it is bound by (threads, kubectl, a loaded 2-core machine).
SLACK = 3.0
READY_SECONDS = 90.0
#: A follower may lead this long after a stopped API server resumes. A renewal the server had received
#: before it stopped is applied when it resumes (the leader gave up waiting, the server does not know),
#: so the Lease may look fresh for one more lease duration.
AFTER_OUTAGE_SECONDS = LEASE_SECONDS + 2 * RETRY_SECONDS + SLACK


@pytest.fixture(scope="module")
def coordination(own_cluster: devcluster.Cluster) -> Iterator[CoordinationV1Api]:
    with own_cluster.api_client() as api:
        yield CoordinationV1Api(api)


@pytest.fixture
def lease_namespace(own_cluster: devcluster.Cluster) -> Iterator[str]:
    """A fresh namespace for the Leases of one test."""
    name = f"lease-{secrets.token_hex(3)}"
    with own_cluster.api_client() as api:
        CoreV1Api(api).create_namespace(V1Namespace(metadata=V1ObjectMeta(name=name)))
        yield name
        CoreV1Api(api).delete_namespace(name)


@contextlib.contextmanager
def apiserver_stopped(cluster: devcluster.Cluster) -> Iterator[None]:
    """The cluster's kube-apiserver frozen with SIGSTOP (connections open, no answers) until SIGCONT."""
    state = State.load(str(cluster.name))
    assert state is not None, f"no state of dev cluster {cluster.name}"
    pid = state.pids["kube-apiserver"]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def electors(api: CoordinationV1Api, namespace: str, *identities: str) -> list[Elector]:
    """Candidates for one Lease with the shipped timing."""
    return [Elector(Leases(api), Election(namespace, "test", identity=i)) for i in identities]


def lease_spec(api: CoordinationV1Api, namespace: str, name: str = "test") -> Any:
    return api.read_namespaced_lease(name, namespace).spec


def test_one_wins_the_other_takes_over_only_after_the_lease_duration(
    coordination: CoordinationV1Api, lease_namespace: str
) -> None:
    a, b = electors(coordination, lease_namespace, "a", "b")
    assert a.try_acquire_or_renew() is Attempt.HELD  # creates the Lease
    for _ in range(3):  # a renews; b sees every renewal and keeps waiting
        assert b.try_acquire_or_renew() is Attempt.TAKEN
        time.sleep(1)
        assert a.try_acquire_or_renew() is Attempt.HELD
    last_renewal = time.monotonic()
    assert a.try_acquire_or_renew() is Attempt.HELD  # a's last renewal: then it stops, as if killed

    asyncio.run(asyncio.wait_for(b.acquire(), LEASE_SECONDS + 2 * RETRY_SECONDS + SLACK))
    took = time.monotonic() - last_renewal
    print(f"\n[figure] follower took over {took:.1f} s after the leader's last renewal")
    assert took >= LEASE_SECONDS, "taken before the lease duration had passed on the follower's clock"
    spec = lease_spec(coordination, lease_namespace)
    assert (spec.holder_identity, spec.lease_transitions) == ("b", 1)
    assert spec.lease_duration_seconds == LEASE_SECONDS
    assert a.try_acquire_or_renew() is Attempt.TAKEN  # the old leader, back, is a follower now


def test_a_leader_that_sees_another_holder_stops_at_its_next_renewal(
    own_cluster: devcluster.Cluster, coordination: CoordinationV1Api, lease_namespace: str
) -> None:
    (a,) = electors(coordination, lease_namespace, "a")

    async def scenario() -> float:
        await a.acquire()
        holding = asyncio.create_task(a.hold())
        await asyncio.sleep(2 * RETRY_SECONDS)
        assert not holding.done(), "the leader stopped while nobody else held the Lease"
        stolen = time.monotonic()  # e.g. a partitioned replica whose Lease expired for the others
        patch = '{"spec":{"holderIdentity":"intruder"}}'
        await asyncio.to_thread(
            own_cluster.kubectl, "-n", lease_namespace, "patch", "lease", "test", "-p", patch
        )
        await asyncio.wait_for(holding, RETRY_SECONDS + SLACK)
        return time.monotonic() - stolen

    print(f"\n[figure] leader noticed another holder after {asyncio.run(scenario()):.1f} s")


def test_a_released_lease_is_taken_at_the_next_attempt(
    coordination: CoordinationV1Api, lease_namespace: str
) -> None:
    a, b = electors(coordination, lease_namespace, "a", "b")
    assert a.try_acquire_or_renew() is Attempt.HELD
    assert b.try_acquire_or_renew() is Attempt.TAKEN
    assert a.release()
    assert lease_spec(coordination, lease_namespace).holder_identity is None
    assert b.try_acquire_or_renew() is Attempt.HELD
    assert not a.release(), "released a Lease it no longer holds"
    assert lease_spec(coordination, lease_namespace).holder_identity == "b"


@pytest.mark.parametrize("lease", ["absent", "expired"])
def test_racing_candidates_elect_exactly_one(
    coordination: CoordinationV1Api, lease_namespace: str, lease: str
) -> None:
    candidates = electors(coordination, lease_namespace, *(f"c{i}" for i in range(6)))
    if lease == "expired":
        short = Election(lease_namespace, "test", identity="old", timing=Timing(lease=1.0))
        assert Elector(Leases(coordination), short).try_acquire_or_renew() is Attempt.HELD
        assert all(c.try_acquire_or_renew() is Attempt.TAKEN for c in candidates)  # each sees it once
        time.sleep(1.5)  # ... and then it expires on every candidate's clock
    barrier = threading.Barrier(len(candidates))
    outcomes: dict[str, Attempt] = {}

    def contend(elector: Elector) -> None:
        barrier.wait()
        outcomes[elector.identity] = elector.try_acquire_or_renew()

    threads = [threading.Thread(target=contend, args=(c,)) for c in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [who for who, outcome in outcomes.items() if outcome is Attempt.HELD]
    assert len(winners) == 1, outcomes
    assert lease_spec(coordination, lease_namespace).holder_identity == winners[0]


def test_a_leader_cut_off_from_the_api_server_gives_up_at_the_renew_deadline(
    own_cluster: devcluster.Cluster, coordination: CoordinationV1Api, lease_namespace: str
) -> None:
    a, b = electors(coordination, lease_namespace, "a", "b")

    async def scenario() -> tuple[float, float]:
        await a.acquire()
        holding = asyncio.create_task(a.hold())
        following = asyncio.create_task(b.acquire())
        await asyncio.sleep(RETRY_SECONDS + 1)  # a renewed at least once, b saw it
        assert not following.done(), "the follower took a Lease being renewed"
        with apiserver_stopped(own_cluster):
            stopped = time.monotonic()
            await asyncio.wait_for(holding, RENEW_DEADLINE_SECONDS + SLACK)
            gave_up = time.monotonic() - stopped
            await asyncio.sleep(LEASE_SECONDS + 1 - gave_up)  # the Lease expires meanwhile
        resumed = time.monotonic()
        await asyncio.wait_for(following, AFTER_OUTAGE_SECONDS)
        return gave_up, time.monotonic() - resumed

    gave_up, taken = asyncio.run(scenario())
    print(
        f"\n[figure] API server stopped: leader gave up after {gave_up:.1f} s;"
        f" follower leader {taken:.1f} s after SIGCONT"
    )
    # The deadline counts from the last renewal, up to a retry period before the stop.
    assert RENEW_DEADLINE_SECONDS - RETRY_SECONDS - 1 <= gave_up <= RENEW_DEADLINE_SECONDS + 1
    assert lease_spec(coordination, lease_namespace).holder_identity == "b"


def test_leader_election_flags_are_checked(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("qwen-operator")
    env = {k: v for k, v in os.environ.items() if k not in ("POD_NAMESPACE", "KUBERNETES_SERVICE_HOST")}
    cases = {
        ("--leader-elect",): "leader election needs the operator's namespace",
        (
            "--leader-elect",
            "--leader-elect-resource-namespace=x",
            "--leader-elect-renew-deadline=20",
        ): "lease duration 15 s must exceed the renew deadline",
    }
    for args, message in cases.items():
        done = subprocess.run([str(exe), "run", *args], capture_output=True, text=True, env=env, timeout=60)
        assert (done.returncode, message in done.stderr) == (2, True), done.stderr


# --- two operator replicas -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicas(own_cluster: devcluster.Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two ServiceAccounts like the operator's (distinct users in the audit log), each with a kubeconfig;
    the Lease rights come from install.yaml, or from a Role made here while the chart lacks them."""
    install(own_cluster)
    tmp = tmp_path_factory.mktemp("replicas")
    found: dict[str, Any] = {}
    for replica in ("replica-a", "replica-b"):
        user = service_account_like_operator(own_cluster, replica)
        kubeconfig = service_account_kubeconfig(own_cluster, tmp / f"{replica}.kubeconfig", account=replica)
        found[replica] = {"user": user, "kubeconfig": kubeconfig, "logs": tmp}
    _grant_leases_unless_installed(own_cluster, [r["user"] for r in found.values()])
    return found


def _grant_leases_unless_installed(cluster: devcluster.Cluster, users: list[str]) -> None:
    can = cluster.kubectl(
        "auth", "can-i", "update", "leases", "-n", OPERATOR_NAMESPACE, f"--as={users[0]}", check=False
    )
    if can.stdout.strip() == "yes":
        return
    print(
        f"\n[note] install.yaml grants no Lease rights in {OPERATOR_NAMESPACE}: a Role is added by the test"
    )
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "e2e-leader-election", "namespace": OPERATOR_NAMESPACE},
        "rules": [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "e2e-leader-election", "namespace": OPERATOR_NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "e2e-leader-election"},
        "subjects": [
            {"kind": "ServiceAccount", "name": u.rsplit(":", 1)[1], "namespace": OPERATOR_NAMESPACE}
            for u in users
        ],
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([role, binding]))


def start_replica(replicas: dict[str, Any], name: str, log_suffix: str = "") -> OperatorProcess:
    """`qwen-operator run --leader-elect` as `name` (its ServiceAccount, and its identity as POD_NAME)."""
    r = replicas[name]
    return OperatorProcess(
        r["kubeconfig"],
        r["logs"] / f"{name}{log_suffix}.log",
        args=("--leader-elect", f"--leader-elect-resource-namespace={OPERATOR_NAMESPACE}"),
        env={"POD_NAME": name},
    ).start()


def is_leader(proc: OperatorProcess) -> bool:
    return proc.metric("qwen_operator_leader") == 1


@contextlib.contextmanager
def running(*procs_: OperatorProcess) -> Iterator[None]:
    try:
        yield
    finally:
        for p in procs_:
            p.stop()
            print(f"\n--- {p.log_path.name} (tail) ---\n{p.tail(25)}")


@pytest.fixture
def crs_namespace(own_cluster: devcluster.Cluster) -> Iterator[str]:
    name = f"failover-{secrets.token_hex(3)}"
    own_cluster.kubectl("create", "namespace", name)
    yield name
    own_cluster.kubectl("delete", "namespace", name, "--timeout=120s", check=False, timeout=130)


def qwendeployment(namespace: str, name: str) -> dict[str, Any]:
    """A small QwenDeployment that fits one H100 (a single engine pod, no gateway)."""
    return {
        "apiVersion": "inference.qwenops.dev/v1alpha1",
        "kind": "QwenDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen3-32B-AWQ"},
            "gpu": {"type": "H100-80GB"},
            "parallelism": {"tensor": 1},
            "engine": {"maxModelLen": 8192},
            "gateway": {"enabled": False},
        },
    }


def create(cluster: devcluster.Cluster, namespace: str, *names: str) -> None:
    docs = [qwendeployment(namespace, n) for n in names]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def wait_ready(cluster: devcluster.Cluster, namespace: str, name: str) -> None:
    cluster.kubectl(
        "-n",
        namespace,
        "wait",
        "qwd",
        name,
        "--for=condition=Ready",
        f"--timeout={READY_SECONDS:.0f}s",
        timeout=READY_SECONDS + 10,
    )


def writes_by_resource(cluster: devcluster.Cluster, user: str, since: float) -> Counter[str]:
    return Counter(f"{w['verb']} {w['objectRef']['resource']}" for w in audit_writes(cluster, [user], since))


def test_failover_the_follower_writes_nothing_and_the_new_leader_converges(
    own_cluster: devcluster.Cluster, replicas: dict[str, Any], crs_namespace: str
) -> None:
    users = {name: r["user"] for name, r in replicas.items()}
    began = time.time()
    a = start_replica(replicas, "replica-a")
    wait_until(lambda: is_leader(a), LEASE_SECONDS + SLACK, "replica-a to lead")
    b = start_replica(replicas, "replica-b")
    with running(a, b):
        assert not is_leader(b), "two leaders"
        create(own_cluster, crs_namespace, "before-1", "before-2", "before-3")
        for name in ("before-1", "before-2", "before-3"):
            wait_ready(own_cluster, crs_namespace, name)
        assert b.metric("qwen_operator_reconciles_total") == 0

        a.kill()
        killed = time.time()
        create(own_cluster, crs_namespace, "after-kill")
        wait_until(lambda: is_leader(b), LEASE_SECONDS + 2 * RETRY_SECONDS + SLACK, "replica-b to lead")
        failover = time.time() - killed
        wait_ready(own_cluster, crs_namespace, "after-kill")
        converged = time.time() - killed

        writes_a = audit_writes(own_cluster, [users["replica-a"]], began)
        writes_b = audit_writes(own_cluster, [users["replica-b"]], began)
        by_a = dict(writes_by_resource(own_cluster, users["replica-a"], began))
        by_b = dict(writes_by_resource(own_cluster, users["replica-b"], began))
        print(
            f"\n[figure] SIGKILLed leader: follower leader after {failover:.1f} s, new CR Ready "
            f"{converged:.1f} s after the kill"
            f"\n[figure] writes of replica-a (leader until killed): {by_a}"
            f"\n[figure] writes of replica-b (follower, then leader): {by_b}"
        )
        assert writes_a and all(w["time"] <= killed for w in writes_a)
        assert writes_b, "the new leader wrote nothing"
        first_b = min(writes_b, key=lambda w: w["time"])
        assert first_b["objectRef"]["resource"] == "leases", "replica-b wrote before it held the Lease"
        assert first_b["time"] >= killed
        assert max(w["time"] for w in writes_a) < first_b["time"], "both replicas wrote in the same period"
        touched_b = {w["objectRef"].get("name") for w in writes_b if w["objectRef"]["resource"] != "leases"}
        assert "after-kill-engine" in touched_b, touched_b

        # A stopped (SIGTERM) leader releases the Lease: the follower leads at its next attempt.
        a.start()
        assert not is_leader(a)
        b.stop()
        stopped = time.time()
        assert b.proc is not None and b.proc.returncode == 0, b.tail()
        wait_until(lambda: is_leader(a), 2 * RETRY_SECONDS + SLACK, "replica-a to lead after the release")
        handover = time.time() - stopped
        print(f"\n[figure] SIGTERMed leader released the Lease: follower leader after {handover:.1f} s")
        create(own_cluster, crs_namespace, "after-release")
        wait_ready(own_cluster, crs_namespace, "after-release")
        late_b = audit_writes(own_cluster, [users["replica-b"]], stopped)
        assert late_b == [], [f"{w['verb']} {w['requestURI']}" for w in late_b]


def test_api_server_stopped_the_leader_exits_and_the_follower_takes_over(
    own_cluster: devcluster.Cluster, replicas: dict[str, Any], crs_namespace: str
) -> None:
    a = start_replica(replicas, "replica-a", "-outage")
    wait_until(lambda: is_leader(a), LEASE_SECONDS + 2 * RETRY_SECONDS + SLACK, "replica-a to lead")
    b = start_replica(replicas, "replica-b", "-outage")
    with running(a, b):
        assert not is_leader(b)
        with apiserver_stopped(own_cluster):
            stopped = time.monotonic()
            status = a.wait_exit(RENEW_DEADLINE_SECONDS + RETRY_SECONDS + SLACK)
            exited = time.monotonic() - stopped
            assert b.alive(), b.tail()
            time.sleep(max(0.0, 20 - exited))
        resumed = time.time()
        wait_until(lambda: is_leader(b), AFTER_OUTAGE_SECONDS, "replica-b to lead after SIGCONT")
        took = time.time() - resumed
        create(own_cluster, crs_namespace, "after-outage")
        wait_ready(own_cluster, crs_namespace, "after-outage")
        converged = time.time() - resumed
        print(
            f"\n[figure] API server stopped 20 s: leader exited with {status} after {exited:.1f} s; follower "
            f"leader {took:.1f} s after SIGCONT, new CR Ready {converged:.1f} s after SIGCONT"
        )
        assert status == LOST_EXIT_CODE, a.tail()
        assert "leadership lost" in a.tail()
