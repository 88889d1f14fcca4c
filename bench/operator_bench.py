"""Operator scenario: what the operator costs the API server as the cluster grows, and how fast it
converges a burst of QwenDeployments, against the lower bound of one API round trip per object written.

On a dev cluster of its own (real etcd, apiserver, controller-manager, scheduler; SIMULATED kwok nodes
and pods: nothing runs in them, which is what makes 1,000 GPU nodes cheap here), the operator runs as a
local process under install.yaml's ServiceAccount. Every request count comes from the apiserver's audit
log, which records every read and write of that ServiceAccount (devcluster/audit-policy.yaml); the
operator's own reconcile counter is only the denominator of "per reconcile".

1. Steady state at 1 QwenDeployment with 10, 100 and 1,000 GPU nodes in its pool: reads and writes per
   reconcile, and per resync (every QwenDeployment once), in a window with nothing to do.
2. 200 QwenDeployments applied at once (one `kubectl apply`): seconds until every child exists and every
   status is written; the peer is the same children server-side applied by a client at the operator's
   concurrency (4), one request each, into another namespace (Deployments at 0 replicas, so no pods):
   the least any controller could spend writing them.
3. Steady state at 50 and 250 QwenDeployments (1,000 nodes), then the operator's RSS at 50 and 250
   (`--rss-crs 500`: and at 500, outside make bench's budget).

`--baseline COMMIT` measures part 1, then 50 QwenDeployments on the pool's first size, with the
operator of an older commit too, from a git worktree (the before/after table of the watch caches, issue
14); `--baseline-only` measures only that.

Not a pass/fail test. Usage: .venv/bin/python bench/operator_bench.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster.nodes import POOL_LABEL, POOLS, node_body, wait_ready
from qwen_devtools.operator_proc import (
    OPERATOR_USER,
    READ_VERBS,
    WRITE_VERBS,
    OperatorProcess,
    audit_time,
    install,
    service_account_kubeconfig,
)
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review
from qwen_operator.kinds import kind_of, optional
from qwen_operator.manifests import ClusterFacts, build_children

#: The bench cluster has none of the optional kinds' CRDs (ServiceMonitor, KEDA, HTTPRoute).
FACTS = ClusterFacts(missing_crds=frozenset(k.crd for k in optional() if k.crd))

CLUSTER = "bench-operator"
EXAMPLE = REPO / "examples" / "a100-80gb-tp2-bf16.yaml"
POOL = next(p for p in POOLS if p.name == "a100-80gb")
RESYNC_SECONDS = 10.0
CONCURRENCY = 4  # kopf's workers (handlers.configure: max_workers)


def log(line: str) -> None:
    print(line, flush=True)


class Audit:
    """The apiserver's audit log, read incrementally: requests of the operator by verb and resource."""

    def __init__(self, cluster: devcluster.Cluster) -> None:
        self.path = Path(cluster.kubeconfig).parent / "audit.log"
        self.offset = 0
        self.events: list[dict[str, Any]] = []
        self.seen: set[str] = set()

    def read(self) -> None:
        size = self.path.stat().st_size
        if size < self.offset:  # rotated
            self.offset = 0
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data.rfind(b"\n") + 1
        self.offset += complete
        for line in data[:complete].splitlines():
            event = json.loads(line)
            if event["user"].get("username") != OPERATOR_USER or event["auditID"] in self.seen:
                continue
            self.seen.add(event["auditID"])
            event["time"] = audit_time(event["requestReceivedTimestamp"])
            self.events.append(event)

    def count(self, verbs: frozenset[str], since: float, until: float) -> Counter[str]:
        self.read()
        return Counter(
            f"{e['verb']} {e['objectRef'].get('resource', '?')}"
            + (f"/{e['objectRef']['subresource']}" if e["objectRef"].get("subresource") else "")
            + (" (kopf)" if e.get("userAgent", "").startswith("kopf/") else "")  # else the reconciler's
            for e in self.events
            if e["verb"] in verbs and since <= e["time"] < until
        )


def cr(namespace: str, name: str) -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"]["gateway"].pop("apiKeysSecret", None)  # generated: nothing to prepare per CR
    body["spec"]["gateway"]["replicas"] = 1
    return body


def apply_all(cluster: devcluster.Cluster, bodies: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(bodies), timeout=600)


def ensure_namespace(cluster: devcluster.Cluster, namespace: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def add_nodes(api: client.ApiClient, first: int, last: int) -> None:
    """Create simulated nodes `first` to `last - 1` of the example's pool (8 GPUs each)."""
    core = client.CoreV1Api(api)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: core.create_node(node_body(POOL, i)), range(first, last)))  # type: ignore[arg-type]
    # Ready, without kwok's not-ready taint: until then each node kwok initializes changes the pool's
    # free GPUs, and so the status, which is not the steady state to measure.
    wait_ready(core, [f"{POOL.name}-{i}" for i in range(first, last)], timeout=600)


def statuses_written(api: client.ApiClient, namespace: str, count: int) -> bool:
    """`count` QwenDeployments in `namespace`, each with Synced=True for its first generation. Read in
    this process (a kubectl run per poll would take CPU from the operator it measures, on 2 cores)."""
    page: dict[str, Any] = client.CustomObjectsApi(api).list_namespaced_custom_object(  # type: ignore[assignment]
        "inference.qwenops.dev", "v1alpha1", namespace, "qwendeployments", _request_timeout=120
    )
    items = page["items"]
    synced = [
        i
        for i in items
        if any(
            c["type"] == "Synced" and c["status"] == "True" and c.get("observedGeneration") == 1
            for c in i.get("status", {}).get("conditions", [])
        )
    ]
    return len(items) == count and len(synced) == count


def children_exist(cluster: devcluster.Cluster, namespace: str, objects: list[dict[str, Any]]) -> bool:
    """Every object of `objects` (rendered children) exists in `namespace`."""
    plurals = sorted({kind_of(o["apiVersion"], o["kind"]).plural for o in objects})
    out = cluster.kubectl(
        "-n",
        namespace,
        "get",
        ",".join(plurals),
        "-l",
        "app.kubernetes.io/managed-by=qwen-operator",
        "-o",
        "name",
        timeout=120,
    )
    return len(out.stdout.split()) >= len(objects)


def rendered(namespace: str, count: int) -> list[dict[str, Any]]:
    """The children the operator writes for `count` QwenDeployments, as the peer applies them."""
    objects = []
    for i in range(count):
        body = cr(namespace, f"qwd-{i:03d}")
        body["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
        for obj in build_children(review(body), FACTS).objects:
            obj = copy.deepcopy(obj)
            obj["metadata"].pop("ownerReferences", None)  # no owner to point to: the peer has none
            if obj["kind"] == "Deployment":
                obj["spec"]["replicas"] = 0
            objects.append(obj)
    return objects


def peer_apply(api: client.ApiClient, objects: list[dict[str, Any]]) -> float:
    """Server-side apply every object once, CONCURRENCY at a time; returns the seconds it took."""
    dynamic = client.ApiClient(api.configuration)

    def apply(obj: dict[str, Any]) -> None:
        base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
        plural = kind_of(obj["apiVersion"], obj["kind"]).plural
        path = f"{base}/namespaces/{obj['metadata']['namespace']}/{plural}/{obj['metadata']['name']}"
        method, url, headers, body, _ = dynamic.param_serialize(
            "PATCH",
            path,
            query_params=[("fieldManager", "peer"), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=obj,
            auth_settings=["BearerToken"],
        )
        resp = dynamic.call_api(method, url, header_params=headers, body=body)
        answer = resp.read()
        if resp.status >= 400:
            raise RuntimeError(f"peer apply of {path}: {resp.status} {answer[:300]!r}")

    started = time.monotonic()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(apply, objects))
    return time.monotonic() - started


def rss_mib(operator: OperatorProcess) -> float:
    assert operator.proc is not None
    status = Path(f"/proc/{operator.proc.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


class Run:
    """One operator version on the bench cluster."""

    def __init__(
        self, cluster: devcluster.Cluster, audit: Audit, label: str, source: Path, work: Path
    ) -> None:
        self.cluster, self.audit, self.label = cluster, audit, label
        kubeconfig = service_account_kubeconfig(cluster, work / f"{label}.kubeconfig")
        env = {"PYTHONPATH": str(source / "operator")}
        self.operator = OperatorProcess(
            kubeconfig, work / f"{label}.log", resync_seconds=RESYNC_SECONDS, env=env
        )
        self.rows: list[dict[str, Any]] = []

    def settle(self, timeout: float = 600) -> None:
        """Until the operator has written nothing for one resync period (and then some)."""
        quiet = RESYNC_SECONDS + 3

        def calm() -> bool:
            now = time.time()
            return not self.audit.count(WRITE_VERBS, now - quiet, now)

        time.sleep(quiet)
        wait_until(calm, timeout, "the operator's writes to stop", interval=2)

    def steady(self, what: str, crs: int, nodes: int, seconds: float) -> dict[str, Any]:
        """Requests in a window with nothing to do: per reconcile and per resync."""
        self.settle()
        before, since = self.operator.metric("qwen_operator_reconciles_total"), time.time()
        time.sleep(seconds)
        # A reconcile that reads per node may take longer than the window: wait for one to finish.
        wait_until(
            lambda: self.operator.metric("qwen_operator_reconciles_total") > before,
            900,
            "a reconcile",
            interval=1,
        )
        until = time.time()
        seconds = until - since
        time.sleep(2)  # audit lines are written when requests complete
        reconciles = self.operator.metric("qwen_operator_reconciles_total") - before
        reads = self.audit.count(READ_VERBS, since, until)
        writes = self.audit.count(WRITE_VERBS, since, until)
        n_reads, n_writes = sum(reads.values()), sum(writes.values())
        row = {
            "version": self.label,
            "what": what,
            "crs": crs,
            "gpu_nodes": nodes,
            "reconciles": reconciles,
            "reads": n_reads,
            "writes": n_writes,
            "reads_per_reconcile": round(n_reads / reconciles, 1) if reconciles else None,
            "reads_per_resync": round(n_reads / reconciles * crs, 1) if reconciles else None,
            "writes_per_resync": round(n_writes / reconciles * crs, 1) if reconciles else None,
            "top_reads": dict(reads.most_common(4)),
        }
        log(
            f"  [{self.label}] {what}: {crs} CRs, {nodes} nodes: {reconciles:.0f} reconciles"
            f" in {seconds:.0f} s, "
            f"{n_reads} reads ({row['reads_per_reconcile']}/reconcile) {row['top_reads']},"
            f" {n_writes} writes {dict(writes)}"
        )
        self.rows.append(row)
        return row


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bench-baseline-")) / "tree"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


def measure_nodes(run: Run, api: client.ApiClient, sweep: list[int], window: float) -> None:
    """Part 1 for one version: 1 CR, then the pool grown to each size of `sweep`."""
    ns = f"one-{run.label}"
    ensure_namespace(run.cluster, ns)
    apply_all(run.cluster, [cr(ns, "solo")])
    present = POOL.count
    for nodes in sweep:
        if nodes > present:
            log(f"  adding {nodes - present} simulated GPU nodes to pool {POOL.name}")
            add_nodes(api, 100 + present, 100 + nodes)
            present = nodes
        run.steady("steady state", 1, present, window)


@contextlib.contextmanager
def bench_cluster() -> Iterator[tuple[devcluster.Cluster, client.ApiClient, Audit]]:
    """A fresh dev cluster with room for 1,000 gateway pods (10 CPU nodes) and install.yaml applied."""
    devcluster.down(CLUSTER)
    cluster = devcluster.up(CLUSTER)
    try:
        api = cluster.api_client()
        cpu = next(p for p in POOLS if p.name == "cpu")  # the gateways' pool: 110 pods per node
        core = client.CoreV1Api(api)
        for i in range(1, 10):
            core.create_node(node_body(cpu, i))  # type: ignore[arg-type]
        install(cluster)
        yield cluster, api, Audit(cluster)
    finally:
        devcluster.down(CLUSTER)


def add_crs(cluster: devcluster.Cluster, api: client.ApiClient, namespace: str, count: int) -> None:
    """`count` QwenDeployments in a new `namespace`, in one apply; returns once every status is written."""
    ensure_namespace(cluster, namespace)
    apply_all(cluster, [cr(namespace, f"qwd-{i:03d}") for i in range(count)])
    wait_until(lambda: statuses_written(api, namespace, count), 900, f"{count} statuses", interval=2)


def remove_nodes(api: client.ApiClient, first: int, last: int, keep: int) -> None:
    """Delete the simulated nodes `first` to `last - 1` that add_nodes created, until `keep` remain."""
    core = client.CoreV1Api(api)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: core.delete_node(f"{POOL.name}-{i}"), range(first, last)))
    wait_until(
        lambda: len(core.list_node(label_selector=f"{POOL_LABEL}={POOL.name}").items) == keep,
        300,
        "the added nodes to go",
        interval=2,
    )


def measure_baseline(commit: str, sweep: list[int], window: float, work: Path) -> list[dict[str, Any]]:
    """Part 1 with the operator of `commit`, on a cluster of its own; then 50 QwenDeployments with the
    pool back at its first size (at 1,000 nodes the old operator reads per node: 50 of them would take
    the whole window for one resync)."""
    with worktree(commit) as tree, bench_cluster() as (cluster, api, audit):
        log(f"\nBaseline: the operator of {commit}")
        base = Run(cluster, audit, "baseline", tree, work)
        base.operator.start()
        try:
            measure_nodes(base, api, sweep, window)
            if sweep[-1] > sweep[0]:
                log(f"  removing the {sweep[-1] - sweep[0]} added GPU nodes")
                remove_nodes(api, 100 + sweep[0], 100 + sweep[-1], keep=sweep[0])
            add_crs(cluster, api, "fifty", 49)
            base.steady("steady state", 50, sweep[0], window)
        finally:
            base.operator.stop()
        return base.rows


def measure_current(
    sweep: list[int], window: float, burst: int, rss_crs: int, work: Path
) -> list[dict[str, Any]]:
    """Parts 1 to 3 with the working tree's operator."""
    rows: list[dict[str, Any]] = []
    with bench_cluster() as (cluster, api, audit):
        log("\nThe working tree's operator")
        run = Run(cluster, audit, "current", REPO, work)
        run.operator.start()
        try:
            measure_nodes(run, api, sweep, window)
            nodes = sweep[-1]
            add_crs(cluster, api, "fifty", 49)
            run.steady("steady state", 50, nodes, window)
            rss50 = rss_mib(run.operator)
            rows.append(burst_row(cluster, api, audit, burst, nodes))
            run.steady("steady state", 50 + burst, nodes, window)
            more = rss_crs - 50 - burst
            if more > 0:
                add_crs(cluster, api, "five-hundred", more)
                run.settle()
            total = 50 + burst + max(0, more)
            rss = rss_mib(run.operator)
            rows.append({"version": "current", "what": "operator RSS", "crs": 50, "rss_mib": round(rss50, 1)})
            rows.append(
                {"version": "current", "what": "operator RSS", "crs": total, "rss_mib": round(rss, 1)}
            )
            log(f"  operator RSS: {rss50:.0f} MiB at 50 CRs, {rss:.0f} MiB at {total}")
        finally:
            run.operator.stop()
    return run.rows + rows


def measure_rss_only(total: int, work: Path) -> list[dict[str, Any]]:
    """Only the operator's RSS, at 50 and at `total` QwenDeployments (no node sweep, no burst, no peer)."""
    with bench_cluster() as (cluster, api, audit):
        log(f"\nThe working tree's operator: RSS at 50 and {total} QwenDeployments")
        run = Run(cluster, audit, "current", REPO, work)
        run.operator.start()
        try:
            add_crs(cluster, api, "fifty", 50)
            run.settle()
            rss50 = rss_mib(run.operator)
            log(f"  operator RSS: {rss50:.0f} MiB at 50 CRs; adding {total - 50} more")
            add_crs(cluster, api, "many", total - 50)
            run.settle()
            rss = rss_mib(run.operator)
            log(f"  operator RSS: {rss:.0f} MiB at {total} CRs")
        finally:
            run.operator.stop()
    return [
        {"version": "current", "what": "operator RSS", "crs": crs, "rss_mib": round(mib, 1)}
        for crs, mib in ((50, rss50), (total, rss))
    ]


def measure_burst_only(burst: int, work: Path) -> list[dict[str, Any]]:
    """Part 2 alone, on 10 GPU nodes: the burst and its peer."""
    with bench_cluster() as (cluster, api, audit):
        run = Run(cluster, audit, "current", REPO, work)
        run.operator.start()
        try:
            return [burst_row(cluster, api, audit, burst, 10)]
        finally:
            run.operator.stop()


def burst_row(
    cluster: devcluster.Cluster, api: client.ApiClient, audit: Audit, burst: int, nodes: int
) -> dict[str, Any]:
    """Part 2: `burst` QwenDeployments in one kubectl apply, then the peer writing the same children."""
    log(f"\n  {burst} QwenDeployments in one kubectl apply")
    ns = "burst"
    ensure_namespace(cluster, ns)
    bodies = [cr(ns, f"qwd-{i:03d}") for i in range(burst)]
    expected = rendered(ns, burst)
    since, t0 = time.time(), time.monotonic()
    apply_all(cluster, bodies)
    wait_until(
        # children_exist (a kubectl run) only once every status is written, which comes after the writes
        lambda: statuses_written(api, ns, burst) and children_exist(cluster, ns, expected),
        900,
        "the burst to converge",
        interval=1,
    )
    took = time.monotonic() - t0
    time.sleep(2)
    writes = audit.count(WRITE_VERBS, since, time.time())
    reads = audit.count(READ_VERBS, since, time.time())
    log(f"  converged in {took:.1f} s: {sum(writes.values())} writes, {sum(reads.values())} reads")
    log(f"  writes by verb and resource: {dict(writes.most_common(8))}")
    log(f"  reads by verb and resource: {dict(reads.most_common(6))}")
    status_writes = sum(n for key, n in writes.items() if "qwendeployments/status" in str(key))
    event_writes = sum(n for key, n in writes.items() if "events" in str(key))
    log(f"  per QwenDeployment: {status_writes / burst:.2f} status writes, {event_writes / burst:.2f} Events")
    ensure_namespace(cluster, "peer")
    objects = rendered("peer", burst)
    peer = peer_apply(api, objects)
    log(f"  peer: {len(objects)} server-side applies, {CONCURRENCY} at a time, in {peer:.1f} s")
    return {
        "version": "current",
        "what": f"apply {burst} CRs at once",
        "crs": burst,
        "gpu_nodes": nodes,
        "seconds": round(took, 1),
        "peer_seconds": round(peer, 1),
        "ratio": round(took / peer, 2),
        "writes": sum(writes.values()),
        "peer_writes": len(objects),
        "reads": sum(reads.values()),
        "status_writes_per_cr": round(status_writes / burst, 2),
        "events_per_cr": round(event_writes / burst, 2),
        "top_writes": dict(writes.most_common(6)),
        "top_reads": dict(reads.most_common(4)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke: 10 and 100 nodes, bursts of 20")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--baseline", help="also measure the operator of this commit (part 1, 50 CRs)")
    parser.add_argument("--baseline-only", action="store_true", help="with --baseline: only the baseline")
    parser.add_argument("--rss-only", action="store_true", help="with --rss-crs: only the RSS measurement")
    parser.add_argument("--burst-only", action="store_true", help="only the burst of QwenDeployments")
    parser.add_argument(
        "--rss-crs",
        type=int,
        default=0,
        help="also the RSS at this many QwenDeployments (500 takes several more minutes: not in make bench)",
    )
    args = parser.parse_args()
    sweep = [10, 100] if args.quick else [10, 100, 1000]
    burst, window = (20, RESYNC_SECONDS * 1.5) if args.quick else (200, RESYNC_SECONDS * 2.0)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="operator-bench-"))
    notes = [
        "kwok nodes and pods are SIMULATED (no containers run); the control plane and the operator are real",
        f"request counts from the apiserver's audit log; resync every {RESYNC_SECONDS:.0f} s",
    ]
    if args.rss_only and args.rss_crs <= 50:
        parser.error("--rss-only needs --rss-crs above 50")
    if args.rss_only:
        rows = measure_rss_only(args.rss_crs, work)
    elif args.burst_only:
        rows = measure_burst_only(burst, work)
    else:
        rows = measure_baseline(args.baseline, sweep, window, work) if args.baseline else []
        if not args.baseline_only:
            rows += measure_current(sweep, window, burst, args.rss_crs, work)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(suite_json(rows, notes, time.monotonic() - started), indent=1))


def print_table(rows: list[dict[str, Any]]) -> None:
    log(
        "\nversion   what                         CRs  GPU nodes  reads/reconcile  reads/resync"
        "  writes/resync"
    )
    for r in rows:
        if "reads_per_reconcile" in r:
            log(
                f"{r['version']:<9} {r['what']:<28} {r['crs']:>4} {r['gpu_nodes']:>10} "
                f"{r['reads_per_reconcile']!s:>16} {r['reads_per_resync']!s:>13}"
                f" {r['writes_per_resync']!s:>14}"
            )
        elif "peer_seconds" in r:
            log(
                f"{r['version']:<9} {r['what']:<28} {r['seconds']} s vs peer {r['peer_seconds']} s "
                f"({r['ratio']}x); {r['writes']} writes vs {r['peer_writes']}"
            )
        else:
            log(f"{r['version']:<9} {r['what']:<28} {r['crs']:>4}   {r['rss_mib']} MiB")


def suite_json(rows: list[dict[str, Any]], notes: list[str], seconds: float) -> dict[str, Any]:
    """The suite's format (bench/suite.py): one row per measure, ratios where a peer exists."""
    out = []
    for r in rows:
        if "reads_per_reconcile" in r:
            for measure, key in (
                ("reads per reconcile", "reads_per_reconcile"),
                ("reads per resync", "reads_per_resync"),
                ("writes per no-op resync", "writes_per_resync"),
            ):
                out.append(
                    {
                        "measure": f"{measure}, {r['crs']} CRs, {r['gpu_nodes']} GPU nodes",
                        "variant": r["version"],
                        "value": r[key],
                        "unit": "requests",
                        "baseline": None,
                        "ratio": None,
                        "spread": None,
                        "rounds": 1,
                    }
                )
        elif "peer_seconds" in r:
            out.append(
                {
                    "measure": f"{r['what']}: every child and status written",
                    "variant": "operator",
                    "value": r["seconds"],
                    "unit": "s",
                    "baseline": "one SSA per child",
                    "ratio": r["ratio"],
                    "spread": None,
                    "rounds": 1,
                    "writes": r["writes"],
                    "peer_writes": r["peer_writes"],
                }
            )
            out.append(
                {
                    "measure": f"{r['what']}: every child and status written",
                    "variant": "one SSA per child",
                    "value": r["peer_seconds"],
                    "unit": "s",
                    "baseline": None,
                    "ratio": None,
                    "spread": None,
                    "rounds": 1,
                }
            )
        else:
            out.append(
                {
                    "measure": f"operator RSS at {r['crs']} CRs",
                    "variant": r["version"],
                    "value": r["rss_mib"],
                    "unit": "MiB",
                    "baseline": None,
                    "ratio": None,
                    "spread": None,
                    "rounds": 1,
                }
            )
    return {
        "scenario": "operator",
        "title": "Operator API cost and convergence (kwok nodes)",
        "seconds": round(seconds),
        "rows": out,
        "notes": notes,
    }


if __name__ == "__main__":
    main()
