"""The operator reads from its watch-fed caches: in steady state a reconcile sends the API server
nothing but its writes, however many nodes and pods the cluster has; a resync costs one LIST of
QwenDeployments (its safety net against a watch that stalls without closing), whatever the numbers.

Counted from the API server's own audit log (devcluster/audit-policy.yaml records every read of the
operator's ServiceAccount), never from the operator's counters; the operator's reconcile counter only
proves that reconciles ran in the window. Engine and gateway pods here are SIMULATED (kwok): their
readiness is kwok's. bench/operator_bench.py measures the same at 10 to 1,000 nodes and 1 to 500 CRs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from qwen_devtools.devcluster.nodes import POOLS, node_body
from qwen_devtools.operator_proc import (
    OPERATOR_USER,
    READ_VERBS,
    WRITE_VERBS,
    OperatorProcess,
    audit_requests,
    installed_operator,
)
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until
from qwen_operator.names import LABEL_PREFIX, MANAGED_BY

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "examples" / "a100-80gb-tp2-bf16.yaml"
RESYNC_SECONDS = 4


@pytest.fixture(scope="module")
def operator(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    work = tmp_path_factory.mktemp("operator")
    with installed_operator(cluster, work, log_lines=40, resync_seconds=RESYNC_SECONDS) as proc:
        yield proc


def requests(
    cluster: Any, verbs: frozenset[str], since: float, until: float, namespace: str | None = None
) -> Counter[str]:
    """The operator's requests in [since, until), by verb and resource; in `namespace` only when given."""
    events = audit_requests(cluster, [OPERATOR_USER], verbs, since, until)
    if namespace is not None:
        events = [e for e in events if e["objectRef"].get("namespace") == namespace]
    return Counter(f"{e['verb']} {e['objectRef'].get('resource', e['requestURI'])}" for e in events)


RESYNC_LIST = "list qwendeployments"


def reconcile_reads(reads: Counter[str], seconds: float) -> Counter[str]:
    """The reads other than the resyncs' LISTs (at most one per resync period begun in the window)."""
    assert reads[RESYNC_LIST] <= seconds / RESYNC_SECONDS + 1, reads
    return reads - Counter({RESYNC_LIST: reads[RESYNC_LIST]})


def settle(cluster: Any) -> None:
    """Wait until the operator has written nothing for two resync periods."""
    quiet = 2 * RESYNC_SECONDS + 1
    wait_until(
        lambda: not requests(cluster, WRITE_VERBS, time.time() - quiet, time.time()), 90, "writes to stop"
    )


def window(
    cluster: Any, operator: OperatorProcess, seconds: float
) -> tuple[Counter[str], Counter[str], float]:
    """(reads, writes, reconciles) of the operator during the next `seconds`."""
    before, since = operator.metric("qwen_operator_reconciles_total"), time.time()
    time.sleep(seconds)
    until = time.time()
    time.sleep(1.5)  # the audit log is written when a request completes
    reads = requests(cluster, READ_VERBS, since, until)
    writes = requests(cluster, WRITE_VERBS, since, until)
    return reads, writes, operator.metric("qwen_operator_reconciles_total") - before


def deploy(cluster: Any, namespace: str) -> str:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = namespace
    body["spec"]["gateway"].pop("apiKeysSecret", None)  # a generated key: no Secret to prepare
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
    name = str(body["metadata"]["name"])
    wait_until(lambda: ready(cluster, namespace, name), 120, f"{name} Ready")
    return name


def ready(cluster: Any, namespace: str, name: str) -> bool:
    jsonpath = "{.status.conditions[?(@.type=='Ready')].status}"
    out = cluster.kubectl("-n", namespace, "get", "qwd", name, "-o", f"jsonpath={jsonpath}", check=False)
    return out.stdout.strip() == "True"


def test_a_resync_in_steady_state_reads_and_writes_nothing(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    deploy(cluster, namespace)
    settle(cluster)
    reads, writes, reconciles = window(cluster, operator, 3 * RESYNC_SECONDS)
    seconds = 3 * RESYNC_SECONDS
    print(f"\n[cache] {reconciles:.0f} reconciles in {seconds} s: reads {dict(reads)}, writes {dict(writes)}")
    assert reconciles >= 2, "the resync did not run"
    assert reads[RESYNC_LIST] >= 2, reads
    assert reconcile_reads(reads, seconds) == Counter(), reads
    assert writes == Counter(), writes


def test_more_nodes_cost_no_reads(cluster: Any, operator: OperatorProcess, namespace: str) -> None:
    """20 more GPU nodes (and the free-GPU count the rollout strategy depends on) change nothing in
    what a reconcile sends: the nodes come through the watch."""
    deploy(cluster, namespace)
    pool = next(p for p in POOLS if p.name == "a100-80gb")  # the example's pool
    bodies = [node_body(pool, index) for index in range(100, 120)]
    names = [b["metadata"]["name"] for b in bodies]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(bodies))
    try:
        settle(cluster)
        reads, writes, reconciles = window(cluster, operator, 3 * RESYNC_SECONDS)
        print(f"\n[cache] with {len(names)} more nodes: {reconciles:.0f} reconciles, reads {dict(reads)}")
        assert reconciles >= 2 and reconcile_reads(reads, 3 * RESYNC_SECONDS) == Counter(), reads
        assert writes == Counter(), writes
    finally:
        cluster.kubectl("delete", "node", *names, "--wait=false", check=False)


def test_a_hand_edit_is_reverted_from_the_watch_without_a_read(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    name = deploy(cluster, namespace)
    settle(cluster)
    since = time.time()
    service = f"{name}-engine"
    cluster.kubectl(
        "-n", namespace, "annotate", "service", service, "qwenops.dev/applied-hash=edited", "--overwrite"
    )
    jsonpath = "{.metadata.annotations.qwenops\\.dev/applied-hash}"

    def reverted() -> bool:
        out = cluster.kubectl("-n", namespace, "get", "service", service, "-o", f"jsonpath={jsonpath}")
        return out.stdout.strip() not in ("", "edited")

    wait_until(reverted, 30, "the edit to be reverted")
    time.sleep(1.5)
    reads = requests(cluster, READ_VERBS, since, time.time())
    writes = requests(cluster, WRITE_VERBS, since, time.time())
    print(f"\n[cache] hand edit reverted: reads {dict(reads)}, writes {dict(writes)}")
    assert writes["patch services"] == 1, writes
    assert reconcile_reads(reads, time.time() - since) == Counter(), reads


def test_objects_of_a_qwendeployment_that_does_not_exist_cost_no_read(
    cluster: Any, operator: OperatorProcess, namespace: str
) -> None:
    """A ConfigMap labelled as a child of `ghost`, a QwenDeployment that does not exist (what the
    children of a deleted one look like while the garbage collector removes them), edited five times:
    the informer hears every edit, and the operator reads nothing for it (it used to GET the
    QwenDeployment on every event: 163 GETs in 20 s in the operator bench, from the peer's objects)."""
    labels = {"app.kubernetes.io/managed-by": MANAGED_BY, f"{LABEL_PREFIX}/deployment": "ghost"}
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ghost", "labels": labels}}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(body))
    settle(cluster)
    since = time.time()
    for edit in range(5):
        cluster.kubectl("-n", namespace, "annotate", "configmap", "ghost", f"edit={edit}", "--overwrite")
        time.sleep(0.5)
    time.sleep(2)  # the informer's events, and any reconcile they would start
    until = time.time()
    time.sleep(1.5)
    reads = requests(cluster, READ_VERBS, since, until, namespace)
    # This namespace's requests only: a previous test's deployment, its namespace terminating, may
    # still be retried meanwhile (make test of 2026-12-07: its Events and a status patch counted here).
    writes = requests(cluster, WRITE_VERBS, since, until, namespace)
    print(f"\n[cache] 5 edits of a ghost's ConfigMap: reads {dict(reads)}, writes {dict(writes)}")
    assert reads["get qwendeployments"] == 0, reads
    assert reconcile_reads(reads, until - since) == Counter(), reads
    assert writes == Counter(), writes
