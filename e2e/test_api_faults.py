"""Injected API faults: the operator against the dev cluster's REAL apiserver behind a fault proxy.

Every fault here is produced by qwen_devtools.faultproxy, in front of the real kube-apiserver of the kwok
dev cluster: a real server will not answer 409, 429 + Retry-After, 503 for a minute, 410 Gone on a watch
or a silent watch on demand. Everything the proxy does not answer goes to the real apiserver, so the
operator converges against real Kubernetes once a fault ends. The checks are made from the outside: the
operator process stays alive, the proxy's own request log (its timestamps, not the operator's counters)
shows the retries and their intervals, the CR's status shows Synced=False with the fault's reason during
it, `qwen_operator_failing_objects` on the operator's /metrics goes 1 then 0, and afterwards the children
match what `build_children` renders and the status is Ready and Synced.

Why not kmock (PyPI `kmock` 0.8, read from its source): its Kubernetes emulator filters lists and
watches by namespace and name only (no label or field selectors: the operator finds its children by
label), treats server-side apply as a plain JSON merge, keeps no resourceVersions, and runs no
controllers, scheduler or kwok, so no Deployment ever gets pods and no QwenDeployment can become Ready.
It can express each fault, but not the convergence that must follow it.

Engine and gateway pods here are SIMULATED (kwok nodes run no containers): a Ready status in these
tests is kwok's, not a real engine's (e2e/test_real_journey.py serves for real).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from qwen_devtools.faultproxy import UPSTREAM, FaultProxy, Match, Reply, WatchGone, WatchStall
from qwen_devtools.net import http_get
from qwen_devtools.operator_proc import OperatorProcess, install, service_account_kubeconfig
from qwen_devtools.repo import REPO
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review
from qwen_operator.api.rollout import ROLLOUT_ANNOTATION
from qwen_operator.k8s import contains
from qwen_operator.kinds import optional
from qwen_operator.manifests import ClusterFacts, build_children
from qwen_operator.workqueue import RETRY_JITTER

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "examples" / "a100-80gb-tp2-bf16.yaml"
#: The operator runs cluster-wide (install.yaml's default scope): kopf watches and the resync lists here.
QWD_API = "/apis/inference.qwenops.dev/v1alpha1"
QWD_COLLECTION = f"{QWD_API}/qwendeployments"
KOPF = "kopf/"  # User-Agent of kopf's own requests (the watches and their LISTs)
CLIENT = "OpenAPI-Generator/"  # User-Agent of the kubernetes client: the reconciler and the resync
#: How much later than its backoff a retry may start on a busy machine (the timer fires on time; the
#: attempt then waits for the failure's status write and re-reads the object): 1.7 s was seen in CI.
LATE_SECONDS = 5.0
KOPF_RETRY_SECONDS = sum((1, 1, 2, 3, 5, 8, 13, 21))  # kopf's default networking.error_backoffs


@dataclass
class Faulty:
    """The operator (cluster-wide) behind `proxy`; the test puts its QwenDeployments in `namespace`."""

    proxy: FaultProxy
    operator: OperatorProcess
    namespace: str

    def engine_apply(self, name: str) -> Match:
        """The server-side apply of the engine Deployment of QwenDeployment `name`."""
        return Match(
            methods=frozenset({"PATCH"}),
            path=f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}-engine",
        )


@pytest.fixture(scope="module")
def operator_kubeconfig(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    install(cluster)
    return service_account_kubeconfig(cluster, tmp_path_factory.mktemp("faults") / "kubeconfig")


def dying_qwds(cluster: Any) -> list[str]:
    """QwenDeployments in namespaces being deleted (earlier tests'): a cluster-wide operator would count
    them among its failing objects until they are gone (nothing can be created there)."""
    dying = {
        n["metadata"]["name"]
        for n in kubectl_json(cluster, "get", "namespaces")["items"]
        if n.get("status", {}).get("phase") == "Terminating"
    }
    qwds = kubectl_json(cluster, "get", "qwd", "-A")["items"]
    return [
        f"{q['metadata']['namespace']}/{q['metadata']['name']}"
        for q in qwds
        if q["metadata"]["namespace"] in dying
    ]


@pytest.fixture
def start_operator(
    cluster: Any, operator_kubeconfig: Path, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Faulty]]:
    """Start a fault proxy and the operator behind it; at the end, the test's QwenDeployments are deleted
    (so that the next test's operator finds none dying) and both are stopped."""
    started: list[Faulty] = []

    def start(resync_seconds: float = 300, env: dict[str, str] | None = None) -> Faulty:
        wait_until(lambda: not dying_qwds(cluster), 120, "QwenDeployments of deleted namespaces to go")
        proxy = FaultProxy.in_front_of(operator_kubeconfig).start()
        kubeconfig = proxy.client_kubeconfig(operator_kubeconfig, tmp_path / "proxied-kubeconfig")
        operator = OperatorProcess(kubeconfig, tmp_path / "operator.log", resync_seconds, env=env)
        faulty = Faulty(proxy, operator, namespace)
        started.append(faulty)
        operator.start()
        return faulty

    yield start
    cluster.kubectl("-n", namespace, "delete", "qwd", "--all", "--wait=true", "--timeout=60s")
    for faulty in started:
        faulty.operator.stop()
        faulty.proxy.stop()
        report = getattr(request.node, "devcluster_call_report", None)
        if report is not None and report.failed:
            print(f"\n--- operator log (tail) ---\n{faulty.operator.tail(60)}")


# --- helpers ---------------------------------------------------------------------------------------


def kubectl_json(cluster: Any, *args: str) -> Any:
    out = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def get_qwd(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    return kubectl_json(cluster, "-n", ns, "get", "qwd", name)


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == ctype:
            return c
    return {}


def deploy(cluster: Any, ns: str, name: str) -> None:
    """The A100 example as QwenDeployment `name`, with its API-key Secret."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] |= {"name": name, "namespace": ns}
    body["spec"]["gateway"]["apiKeysSecret"] = f"{name}-api-keys"
    cluster.kubectl("-n", ns, "create", "secret", "generic", f"{name}-api-keys", "--from-literal=a=sk-a")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))


def wait_condition(cluster: Any, ns: str, name: str, ctype: str, status: str, timeout: float) -> dict:
    def check() -> dict[str, Any] | None:
        obj = get_qwd(cluster, ns, name)
        return obj if condition(obj, ctype).get("status") == status else None

    return wait_until(check, timeout, f"{name} {ctype}={status}", interval=0.2)


def wait_converged(cluster: Any, ns: str, name: str, timeout: float = 90) -> dict[str, Any]:
    """The status describes the current generation, Ready and Synced."""

    def converged() -> dict[str, Any] | None:
        obj = get_qwd(cluster, ns, name)
        current = obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"]
        good = all(condition(obj, c).get("status") == "True" for c in ("Ready", "Synced"))
        return obj if current and good else None

    try:
        return wait_until(converged, timeout, f"{name} converged (Ready, Synced, observedGeneration)")
    except AssertionError:
        print(json.dumps(get_qwd(cluster, ns, name).get("status"), indent=1))
        raise


def assert_children_as_rendered(cluster: Any, obj: dict[str, Any]) -> None:
    """Every child `build_children` renders for `obj` exists and holds the rendered fields."""
    crds = {c["metadata"]["name"] for c in kubectl_json(cluster, "get", "crd")["items"]}
    missing = frozenset(k.crd for k in optional() if k.crd and k.crd not in crds)
    for want in build_children(review(obj), ClusterFacts(free_gpus=None, missing_crds=missing)).objects:
        group = want["apiVersion"].rpartition("/")[0]
        kind = f"{want['kind']}.{group}" if group else want["kind"]
        live = kubectl_json(
            cluster, "-n", obj["metadata"]["namespace"], "get", kind, want["metadata"]["name"]
        )
        assert live is not None, f"{want['kind']} {want['metadata']['name']} missing"
        want = copy.deepcopy(want)
        if want["kind"] == "Deployment":  # the rollout mode depends on the free GPUs the operator saw
            want["spec"].pop("strategy")
            want["metadata"].get("annotations", {}).pop(ROLLOUT_ANNOTATION, None)
        assert contains(live, want), f"{want['kind']} {want['metadata']['name']} differs from the render"


def engine_max_model_len(cluster: Any, ns: str, name: str) -> str:
    dep = kubectl_json(cluster, "-n", ns, "get", "deployment", f"{name}-engine")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return str(args[args.index("--max-model-len") + 1])


def retry_delays(faulty: Faulty, fault: str, match: Match, since: float) -> list[float]:
    """Seconds from each failed attempt (the end of its request that `fault` answered: an attempt stops
    at its first failed request) to the next request `match` selects (the next attempt's), as the proxy
    saw them: the backoff itself, plus the requests that passed before it in that attempt (the operator
    reads from its caches: few or none).

    Only requests after `since` (when the spec change was stored) count: an attempt on the old
    generation may fail just before the new generation's event, which rightly runs at once."""
    tries = faulty.proxy.exchanges(match, since=since)
    return [
        round(b.started - (a.ended or 0), 2) for a, b in itertools.pairwise(tries) if a.answered_by == fault
    ]


def scheduled_delays(faulty: Faulty, name: str, offset: int) -> list[float]:
    """The backoffs the operator chose for `name`, in order: the "retrying in N s" of its log lines
    written after `offset` (what the measured delays are held to: on a busy machine the next attempt
    starts after its timer, never before)."""
    with faulty.operator.log_path.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    found = []
    for line in lines:
        try:
            msg = json.loads(line).get("msg", "")
        except ValueError:
            continue
        match = re.match(
            rf"{faulty.namespace}/{name}: reconcile failed \(.+?\), retrying in (\d+(?:\.\d+)?) s", msg
        )
        if match:
            found.append(float(match[1]))
    return found


def assert_delays_kept(measured: list[float], scheduled: list[float]) -> None:
    """Every retry waited its scheduled backoff and not much longer, and no retry came without one."""
    assert len(measured) == len(scheduled), f"measured {measured}, scheduled {scheduled}"
    pairs = list(zip(measured, scheduled, strict=True))
    early = [(m, s) for m, s in pairs if m < s - 0.1]
    assert not early, f"retries sooner than their backoff (measured, scheduled): {early}"
    late = [(m, s) for m, s in pairs if m > s + LATE_SECONDS]
    assert not late, f"retries more than {LATE_SECONDS} s after their backoff (measured, scheduled): {late}"


def jittered(scheduled: list[float], backoffs: list[float]) -> bool:
    """Each scheduled delay is its backoff lengthened by the operator's jitter (0 to RETRY_JITTER of it;
    the log line has tenths of a second)."""
    pairs = zip(scheduled, backoffs, strict=True)
    return len(scheduled) == len(backoffs) and all(b <= s <= b * (1 + RETRY_JITTER) + 0.05 for s, b in pairs)


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 2) for a, b in itertools.pairwise(times)]


def failing_objects(faulty: Faulty) -> float:
    return faulty.operator.metric("qwen_operator_failing_objects")


def assert_alive(faulty: Faulty, pid: int) -> None:
    """The operator that started the test still runs, the same process, and says it is healthy."""
    proc = faulty.operator.proc
    assert proc is not None and proc.poll() is None, f"the operator exited:\n{faulty.operator.tail()}"
    assert proc.pid == pid
    assert http_get(f"{faulty.operator.url}/healthz", timeout=5)[0] == 200


def change_spec(cluster: Any, ns: str, name: str, max_model_len: int) -> None:
    patch = json.dumps({"spec": {"engine": {"maxModelLen": max_model_len}}})
    cluster.kubectl("-n", ns, "patch", "qwd", name, "--type=merge", "-p", patch)


def fault_during_update(
    cluster: Any, faulty: Faulty, name: str, reply: Reply, seconds: float
) -> tuple[list[float], dict[str, Any]]:
    """Converge `name`, answer its engine Deployment's apply with `reply` for `seconds`, change the spec
    meanwhile; returns the retry delays and the Synced condition seen during the fault, after checking
    that the metric went 1 then 0 and that everything converged to the new spec."""
    ns = faulty.namespace
    deploy(cluster, ns, name)
    wait_converged(cluster, ns, name)
    pid = faulty.operator.proc.pid  # type: ignore[union-attr]
    offset = faulty.operator.log_path.stat().st_size
    apply = faulty.engine_apply(name)
    fault = faulty.proxy.inject(f"engine-apply-{reply.code}", apply, reply, seconds)
    changed = time.monotonic()  # before the edit: the first attempt can fail before change_spec returns
    change_spec(cluster, ns, name, 16384)
    synced = condition(wait_condition(cluster, ns, name, "Synced", "False", timeout=10), "Synced")
    wait_until(lambda: failing_objects(faulty) == 1, 10, "qwen_operator_failing_objects 1")
    obj = wait_converged(cluster, ns, name, timeout=seconds + 70)
    wait_until(lambda: failing_objects(faulty) == 0, 10, "qwen_operator_failing_objects 0")
    assert engine_max_model_len(cluster, ns, name) == "16384"
    assert_children_as_rendered(cluster, obj)
    assert condition(obj, "Synced")["reason"] == "ReconcileSucceeded"
    assert_alive(faulty, pid)
    delays = retry_delays(faulty, fault.name, apply, since=changed)
    scheduled = scheduled_delays(faulty, name, offset)
    print(f"\n[{fault.name}] {fault.answered} attempts answered by the proxy, then the apply passed;")
    print(f"  delays before each retry {delays} s (scheduled {scheduled}); Synced during the fault: {synced}")
    assert_delays_kept(delays, scheduled)
    return scheduled, synced


# --- the faults ---------------------------------------------------------------------------------------


def test_conflicts_are_retried_with_growing_intervals(
    cluster: Any, start_operator: Callable[..., Faulty]
) -> None:
    """409 Conflict (produced by the fault proxy) on the engine Deployment's apply for 10 s: the backoffs
    double from 1 s, and the proxy saw each retry wait at least its backoff. (The measured delays alone
    need not double: on a busy machine a 1 s wait can stretch to 2.7 s, longer than the 2 s after it.)"""
    faulty = start_operator()
    scheduled, synced = fault_during_update(cluster, faulty, "conflict", Reply(409), seconds=10)
    assert synced["reason"] == "Conflict", synced
    assert "retrying in 1 s" in synced["message"], synced
    # Three failed attempts fit the 10 s fault (the third starts after 3 s of backoff); whether the
    # fourth, after 4 s more, still fails depends on how long the attempts took on a busy machine.
    assert len(scheduled) >= 3, scheduled
    assert jittered(scheduled, [2**i for i in range(len(scheduled))]), f"not doubling from 1 s: {scheduled}"


def test_throttling_waits_for_retry_after(cluster: Any, start_operator: Callable[..., Faulty]) -> None:
    """429 Too Many Requests with Retry-After: 4 (produced by the fault proxy) on the engine apply, 15 s."""
    faulty = start_operator()
    scheduled, synced = fault_during_update(
        cluster, faulty, "throttled", Reply(429, retry_after=4), seconds=15
    )
    assert synced["reason"] == "Throttled", synced
    assert re.search(r"retrying in [45] s", synced["message"]), synced  # 4 s and its jitter, whole seconds
    # The fault starts before the spec change; the first attempt comes when the operator has seen the
    # change, each retry 4 s (and on a busy machine up to a second or two) after a failure. A 9 s fault
    # fitted only two failed attempts in one CI run ([4.0, 4.0]); 15 s leaves 7 s for those delays.
    assert len(scheduled) >= 3, scheduled
    assert all(delay >= 4 for delay in scheduled), f"sooner than Retry-After: {scheduled}"


def test_server_errors_outlast_kopfs_retries(cluster: Any, start_operator: Callable[..., Faulty]) -> None:
    """503 (produced by the fault proxy) for 60 s on every namespaced request of the reconciler and on
    kopf's own LIST and watch of QwenDeployments: longer than kopf's retries of its requests (54 s)."""
    faulty = start_operator(env={"QWEN_OPERATOR_RETRY_MAX_SECONDS": "8"})
    ns, name = faulty.namespace, "outage"
    deploy(cluster, ns, name)
    wait_converged(cluster, ns, name)
    pid = faulty.operator.proc.pid  # type: ignore[union-attr]
    offset = faulty.operator.log_path.stat().st_size
    seconds = KOPF_RETRY_SECONDS + 6
    reconciler = Match(
        path=rf"/apis?/.+/namespaces/{ns}/.+",
        user_agent=CLIENT,
        exclude=rf".+/namespaces/{ns}/(qwendeployments|events)(/.*)?",  # the status must get through
    )
    api_down = faulty.proxy.inject("reconciler-503", reconciler, Reply(503), seconds=seconds + 1)
    # Taken before the edit: the operator's first attempt can fail before change_spec has returned.
    changed = time.monotonic()
    change_spec(cluster, ns, name, 16384)
    synced = condition(wait_condition(cluster, ns, name, "Synced", "False", timeout=10), "Synced")
    assert synced["reason"] == "ApiServerError", synced
    assert "retrying in" in synced["message"], synced
    kopf_qwd = Match(path=QWD_COLLECTION, user_agent=KOPF)
    watch_down = faulty.proxy.inject("kopf-503", kopf_qwd, Reply(503), seconds=seconds, cut=True)
    assert failing_objects(faulty) == 1

    ends = time.monotonic() + seconds
    wait_until(lambda: not faulty.operator.alive() or time.monotonic() > ends, seconds + 5, "the fault's end")
    assert_alive(faulty, pid)
    obj = wait_converged(cluster, ns, name, timeout=40)
    wait_until(lambda: failing_objects(faulty) == 0, 10, "qwen_operator_failing_objects 0")
    assert engine_max_model_len(cluster, ns, name) == "16384"
    assert_children_as_rendered(cluster, obj)
    kopf_tries = faulty.proxy.exchanges(answered_by=watch_down.name)
    assert kopf_tries[-1].started - kopf_tries[0].started >= KOPF_RETRY_SECONDS - 1, gaps(
        [e.started for e in kopf_tries]
    )
    # The watch came back: a QwenDeployment created now converges through it (the resync is 300 s).
    kopf_watch = Match(path=QWD_COLLECTION, watch=True, user_agent=KOPF)
    wait_until(
        lambda: faulty.proxy.exchanges(kopf_watch, answered_by=UPSTREAM, since=ends),
        45,
        "kopf's watch of QwenDeployments to pass again",
    )
    deploy(cluster, ns, "after-outage")
    wait_converged(cluster, ns, "after-outage", timeout=60)
    assert_alive(faulty, pid)

    delays = retry_delays(faulty, api_down.name, reconciler, since=changed)
    scheduled = scheduled_delays(faulty, name, offset)
    print(
        f"\n[5xx] reconcile attempts answered 503: {api_down.answered}, delays before each retry {delays} s"
        f" (scheduled {scheduled})"
    )
    print(f"[5xx] kopf's requests answered 503: {len(kopf_tries)}, {gaps([e.started for e in kopf_tries])} s")
    assert_delays_kept(delays, scheduled)
    assert jittered(scheduled[:4], [1, 2, 4, 8]), f"not doubling from 1 s: {scheduled}"
    at_cap = [s for s in scheduled if s >= 8]
    cap = "the cap (QWEN_OPERATOR_RETRY_MAX_SECONDS=8, with its jitter) was not kept"
    assert jittered(at_cap, [8] * len(at_cap)), f"{cap}: {scheduled}"
    assert len(at_cap) >= 3, f"the backoff did not stay at its cap: {scheduled}"


def test_watch_gone_relists_and_resumes(cluster: Any, start_operator: Callable[..., Faulty]) -> None:
    """410 Gone on kopf's watch of QwenDeployments, twice (produced by the fault proxy: the ERROR event
    the apiserver sends for an expired resourceVersion)."""
    faulty = start_operator()
    ns = faulty.namespace
    deploy(cluster, ns, "before-gone")
    wait_converged(cluster, ns, "before-gone")
    pid = faulty.operator.proc.pid  # type: ignore[union-attr]
    kopf_qwd = Match(path=QWD_COLLECTION, user_agent=KOPF)
    since = time.monotonic()
    gone = faulty.proxy.inject("gone", Match(path=QWD_COLLECTION, watch=True), WatchGone(), times=2, cut=True)
    wait_until(lambda: gone.answered == 2, 30, "two watches answered 410")
    deploy(cluster, ns, "after-gone")
    wait_converged(cluster, ns, "after-gone", timeout=60)
    assert_alive(faulty, pid)
    seen = [
        (("watch" if e.watch else "list"), e.answered_by)
        for e in faulty.proxy.exchanges(kopf_qwd, since=since)
    ]
    print(f"\n[410] kopf's requests on QwenDeployments after the cut: {seen}")
    # A client must LIST again after a 410 before it watches again; the second watch after it lasts.
    assert seen[:5] == [
        ("watch", "gone"),
        ("list", UPSTREAM),
        ("watch", "gone"),
        ("list", UPSTREAM),
        ("watch", UPSTREAM),
    ], seen


def test_silent_watch_stall(cluster: Any, start_operator: Callable[..., Faulty]) -> None:
    """kopf's watch of QwenDeployments accepted and then silent for 60 s (produced by the fault proxy),
    with the first resync LISTs answered 503 meanwhile: the resync, which survives a failed LIST, still
    reconciles a QwenDeployment the watch never delivers, and kopf drops the silent stream by itself."""
    faulty = start_operator(resync_seconds=10)
    ns = faulty.namespace
    pid = faulty.operator.proc.pid  # type: ignore[union-attr]
    qwd_watch = Match(path=QWD_COLLECTION, watch=True, user_agent=KOPF)
    stall = faulty.proxy.inject("stall", qwd_watch, WatchStall(), seconds=60, cut=True)
    resync_list = Match(methods=frozenset({"GET"}), path=QWD_COLLECTION, watch=False, user_agent=CLIENT)
    list_down = faulty.proxy.inject("resync-503", resync_list, Reply(503), seconds=12)
    wait_until(lambda: stall.answered >= 1, 10, "kopf's watch to reconnect into the stall")
    stalled_at = time.monotonic()
    deploy(cluster, ns, "unwatched")
    wait_converged(cluster, ns, "unwatched", timeout=45)
    converged_after = time.monotonic() - stalled_at
    assert list_down.answered >= 1, "no resync LIST happened during the 503s"
    after_503 = faulty.proxy.exchanges(resync_list, answered_by=UPSTREAM, since=list_down.deadline or 0)
    assert after_503, "the resync did not LIST again after its LIST failed"
    assert stall.deadline is not None and time.monotonic() < stall.deadline, "converged only after the stall"

    stalled = faulty.proxy.exchanges(qwd_watch, answered_by="stall")
    wait_until(lambda: all(e.ended for e in stalled), 90, "kopf to drop the silent watch")
    silent = [round((e.ended or 0) - e.started, 1) for e in stalled]
    print(f"\n[stall] converged {converged_after:.1f} s into the stall (resync every 10 s); silent streams")
    print(f"  dropped by kopf after {silent} s; resync LISTs answered 503: {list_down.answered}")
    assert all(60 <= s <= 90 for s in silent), f"kopf's inactivity timeout is 70 s: {silent}"
    wait_until(
        lambda: faulty.proxy.exchanges(qwd_watch, answered_by=UPSTREAM, since=stall.deadline or 0),
        30,
        "a watch after the stall, answered by the apiserver",
    )
    deploy(cluster, ns, "watched")
    wait_converged(cluster, ns, "watched", timeout=30)
    assert_alive(faulty, pid)
