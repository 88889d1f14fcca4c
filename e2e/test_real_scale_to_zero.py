"""Scale to zero and back on the dev cluster's real node, nothing simulated but the model (a tiny random
Qwen3 on the CPU build of vLLM, as everywhere on this machine):

KEDA (its operator and metrics API server built from its Go module, qwen_devtools.keda) scales the
engine Deployment from the ScaledObject the qwen-operator renders; its Prometheus triggers read the
gateway's held requests (the activator sidecar) and completions, scraped by the monitoring stack's
Prometheus from the operator's PodMonitor.

A serving QwenDeployment (minReplicas 1, driver keda) is edited to minReplicas 0 with the shortest
idleSeconds (60): with no completion answered yet, no trigger was ever active and KEDA scales the engines
to 0 at once (ScaledToZero True/Idle, Ready False ScaledToZero). CONCURRENT chat requests then arrive
together: the activator holds them, KEDA's operator writes the one scale-up 0 -> 1 (the API server's
audit log names it), the engine starts, every request is answered 200 by it, and ScaledToZero goes
Waking, then Serving. A test marked bench (minutes of waiting) then checks the idle path: the answers
keep the engine up for the traffic trigger's window and idleSeconds, then KEDA scales it to 0. Edited
back to minReplicas 1, the status carries nothing of scale to zero any more, and settled reconciles
write nothing.

The timeline is printed and written to .devcluster/scale-to-zero-timeline.json (docs/autoscaling.md).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from qwen_devtools import keda, monitoringstack, serving
from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster.nodecomponents import NODE_NAME
from qwen_devtools.operator_proc import assert_settled_writes_nothing, deployment_writes
from qwen_devtools.wait import wait_until
from qwen_operator import recording
from qwen_operator.api.review import review
from qwen_operator.manifests import ClusterFacts, build_children
from qwen_operator.status import CONDITION_TYPES

pytestmark = [pytest.mark.cluster, pytest.mark.real_node, pytest.mark.engine]

NAMESPACE = "e2e-scale-to-zero"
NAME = "chat-zero"
ENGINE = f"{NAME}-engine"
ENGINE_SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=engine"
#: The issue's 8 requests at once during the cold start; the engine runs 8 at once (maxNumSeqs).
CONCURRENT = 8
IDLE_SECONDS = 60  # the smallest the spec allows
PROMETHEUS = f"http://{monitoringstack.PROMETHEUS_SERVICE}.{monitoringstack.NAMESPACE}.svc:9090"
OPERATOR_USER = f"system:serviceaccount:{serving.OPERATOR_NAMESPACE}:{serving.RELEASE}"
CACHE_CLAIM = serving.dev_qwendeployment()["spec"]["model"]["cache"]["claimName"]
TIMELINE = Path(__file__).resolve().parents[1] / ".devcluster" / "scale-to-zero-timeline.json"


@dataclass
class Zero:
    cluster: devcluster.Cluster
    key: str
    url: str
    marks: dict[str, float] = field(default_factory=dict)
    #: (time, spec.replicas, readyReplicas, ScaledToZero reason or "", Ready reason, ScaledToZero message)
    #: on every change.
    states: list[tuple[float, int, int, str, str, str]] = field(default_factory=list)
    scaler: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)

    def get(self, *args: str) -> Any:
        return serving.get_json(self.cluster, "-n", NAMESPACE, *args)

    def qwd(self) -> dict[str, Any]:
        return dict(self.get("get", "qwd", NAME))

    def patch(self, spec: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "-n", NAMESPACE, "patch", "qwd", NAME, "--type=merge", "-p", json.dumps({"spec": spec})
        )

    def mark(self, what: str, at: float | None = None) -> None:  # the first time of each
        self.marks.setdefault(what, time.time() if at is None else at)

    def watch(self) -> None:
        """Sample the engine Deployment and the conditions every second, keeping each change."""
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a slow API call: sample again
                dep = self.get("get", "deployment", ENGINE)
                conditions = {c["type"]: c for c in self.qwd().get("status", {}).get("conditions", [])}
                state = (
                    dep["spec"].get("replicas", 0),
                    dep.get("status", {}).get("readyReplicas", 0),
                    conditions.get("ScaledToZero", {}).get("reason", ""),
                    conditions.get("Ready", {}).get("reason", ""),
                    conditions.get("ScaledToZero", {}).get("message", ""),
                )
                if not self.states or self.states[-1][1:] != state:
                    self.states.append((time.time(), *state))
            self._stop.wait(1)

    def first(self, scaled_to_zero: str, after: float) -> float | None:
        return next((s[0] for s in self.states if s[3] == scaled_to_zero and s[0] >= after), None)

    def report(self) -> None:
        """Print the timeline so far and write it to TIMELINE."""
        start = self.marks["edit to minReplicas 0"]
        marks = sorted((t - start, what) for what, t in self.marks.items() if t is not None)
        TIMELINE.parent.mkdir(parents=True, exist_ok=True)
        TIMELINE.write_text(
            json.dumps(
                {
                    "marks": {what: round(t, 1) for t, what in marks},
                    "idleSeconds": IDLE_SECONDS,
                    "concurrent": CONCURRENT,
                    "scaler": self.scaler,
                },
                indent=1,
            )
        )
        print("\n[scale-to-zero] timeline (seconds from the edit to minReplicas 0):")
        for t, what in marks:
            print(f"[scale-to-zero] {t:7.1f}  {what}")
        print(f"[scale-to-zero] the scale-up's writer: {self.scaler}; written to {TIMELINE}")


@pytest.fixture(scope="module")
def zero(real_cluster: devcluster.Cluster) -> Iterator[Zero]:
    assert real_cluster.name
    body = serving.dev_qwendeployment(name=NAME, namespace=NAMESPACE)
    spec = body["spec"]
    spec.pop("replicas", None)
    spec["parallelism"]["tensor"] = 1  # one CPU worker: the engine starts in about a minute here
    spec["engine"]["extraArgs"] = ["--enforce-eager"]
    spec["autoscaling"] = {
        "driver": "keda",
        "prometheusAddress": PROMETHEUS,
        "minReplicas": 1,
        "maxReplicas": 2,  # the "maxReplicas of at least 2": one wake is still one scale-up
    }
    spec["monitoring"] = {"serviceMonitor": True, "prometheusRule": True, "interval": "5s"}
    rendered = build_children(review(body), ClusterFacts()).objects
    rule = next(c for c in rendered if c["kind"] == "PrometheusRule")
    serving.load_images(real_cluster.name)
    monitoringstack.up(real_cluster, rendered_rule=rule)
    keda.up(real_cluster)
    serving.install_operator(real_cluster)
    serving.prepare_namespace(real_cluster, NAMESPACE)
    serving.model_cache(real_cluster, NAMESPACE, CACHE_CLAIM)
    key = serving.api_key_secret(real_cluster, NAMESPACE, spec["gateway"]["apiKeysSecret"])
    serving.apply(real_cluster, body)
    serving.wait_serving(real_cluster, NAMESPACE, NAME)
    state = Zero(real_cluster, key, serving.service_url(real_cluster, NAMESPACE, NAME))
    watcher = threading.Thread(target=state.watch, daemon=True)
    watcher.start()
    yield state
    state._stop.set()
    watcher.join(timeout=30)
    # KEDA removes its finalizer from the ScaledObject: delete it while KEDA runs and the namespace is
    # active (in a terminating namespace KEDA took more than a minute once); the engine pod's graceful
    # stop goes on meanwhile, and the namespace is gone before the next module starts.
    real_cluster.kubectl(
        "-n", NAMESPACE, "delete", "scaledobjects", "--all", "--wait=true", "--timeout=120s",
        check=False, timeout=130,
    )  # fmt: skip
    for left in zero_scaled_objects(real_cluster):  # KEDA never finalized it: do not leave it stuck
        print(
            f"[scale-to-zero] teardown: KEDA left ScaledObject {left['metadata']['name']}; finalizer removed"
        )
        real_cluster.kubectl(
            "-n", NAMESPACE, "patch", "scaledobject", left["metadata"]["name"], "--type=merge",
            "-p", '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip
    real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    real_cluster.kubectl(
        "delete", "pv", f"{NAMESPACE}-{CACHE_CLAIM}", "--ignore-not-found", "--wait=false", check=False
    )  # fmt: skip
    serving.uninstall_operator(real_cluster)
    keda.down(real_cluster, crds=True)
    monitoringstack.down(real_cluster, crds=True)
    real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", check=False, timeout=180)


def zero_scaled_objects(cluster: devcluster.Cluster) -> list[dict[str, Any]]:
    found = serving.get_json(cluster, "-n", NAMESPACE, "get", "scaledobjects")
    return list((found or {}).get("items", []))


def _engines(cluster: devcluster.Cluster) -> list[dict[str, Any]]:
    items = serving.get_json(cluster, "-n", NAMESPACE, "get", "pods", "-l", ENGINE_SELECTOR)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def _scale_writes(zero: Zero, since: float) -> list[dict[str, Any]]:
    """Every write to the engine Deployment's replicas since `since`, from the audit log: its scale
    subresource (KEDA, the HPA controller, kubectl scale) or the Deployment itself by anyone but the
    operator, which never sets replicas of an autoscaled engine."""
    writes = deployment_writes(zero.cluster, NAMESPACE, ENGINE, since)
    return [
        w
        for w in writes
        if w["objectRef"].get("subresource") == "scale"
        or (not w["objectRef"].get("subresource") and w["user"]["username"] != OPERATOR_USER)
    ]


def test_keda_runs_on_the_real_node_and_serves_external_metrics(zero: Zero) -> None:
    pods = serving.get_json(zero.cluster, "-n", keda.NAMESPACE, "get", "pods")["items"]
    running = {p["metadata"]["labels"]["app"]: p for p in pods if p["status"].get("phase") == "Running"}
    assert set(running) == {keda.OPERATOR, keda.METRICS_APISERVER}, list(running)
    assert all(p["spec"]["nodeName"] == NODE_NAME for p in running.values())
    images = {name: p["spec"]["containers"][0]["image"] for name, p in running.items()}
    assert images == {
        keda.OPERATOR: keda.KEDA_IMAGE,
        keda.METRICS_APISERVER: keda.KEDA_METRICS_APISERVER_IMAGE,
    }
    resources = json.loads(
        zero.cluster.kubectl("get", "--raw", f"/apis/{keda.EXTERNAL_METRICS_GROUP}/v1beta1").stdout
    )
    assert [r["name"] for r in resources["resources"]] == ["externalmetrics"], resources
    scaled = zero.get("get", "scaledobject", ENGINE)
    ready = _condition(scaled, "Ready")
    assert ready.get("status") == "True", scaled.get("status")


def test_edit_to_zero_then_concurrent_requests_wake_one_engine_and_are_all_answered(zero: Zero) -> None:
    zero.mark("edit to minReplicas 0")
    zero.patch({"autoscaling": {"minReplicas": 0, "scaleToZero": {"idleSeconds": IDLE_SECONDS}}})
    # KEDA scales in once no trigger was active for idleSeconds; a ScaledObject whose triggers it never
    # saw active (no completion since the fixture started the engine: a completion would keep the engine
    # up for the traffic trigger's 2-min window plus idleSeconds, the bench test below) has no last
    # active time, and KEDA scales it in at its next poll.
    wait_until(
        lambda: zero.get("get", "deployment", ENGINE)["spec"].get("replicas") == 0,
        120 + IDLE_SECONDS + 120,
        "KEDA to scale the engines to 0",
        interval=1,
    )
    (down,) = _scale_writes(zero, zero.marks["edit to minReplicas 0"])
    assert down["user"]["username"] == keda.OPERATOR_USER, down
    zero.mark("scale-down to 0 written", down["time"])
    _wait_idle(zero, down["time"])
    wait_until(lambda: not _engines(zero.cluster), 120, "the engine pod gone", interval=1)
    zero.mark("engine pod gone")
    # The gateway pods that hold (with the activator) replace the others in a rollout that KEDA does not
    # wait for: a request that reaches an old pod at zero gets 503 at once (docs/autoscaling.md).
    wait_until(lambda: _gateway_holds(zero), 300, "the gateway rolled out with the activator", interval=1)
    zero.mark("gateway rolled out with the activator, its held requests scraped")

    # CONCURRENT requests at once, with no engine: the activator holds them all, one scale-up answers them.
    sent = time.time()
    zero.mark("requests sent")
    with ThreadPoolExecutor(CONCURRENT) as pool:
        calls = [
            pool.submit(serving.chat, zero.url, zero.key, f"wake {i} {secrets.token_hex(4)}", 16, 600)
            for i in range(CONCURRENT)
        ]
        results = []
        for call in calls:
            results.append(call.result())
            zero.mark("first answer")
    zero.mark("all answered")
    assert [status for status, _ in results] == [200] * CONCURRENT, results
    # the engine's own answers (a random model's text may all be reasoning, so no content is asked for)
    assert all(b["model"] == "Qwen/Qwen3-32B" and b["usage"]["completion_tokens"] > 0 for _, b in results)

    time.sleep(2)  # the audit log is written as requests complete
    writes = _scale_writes(zero, sent)
    summary = [(w["user"]["username"], w.get("userAgent", ""), w["verb"]) for w in writes]
    assert len(writes) == 1, f"one scale-up expected, got {summary}"
    (up,) = writes
    assert up["user"]["username"] == keda.OPERATOR_USER, summary
    assert up["userAgent"].startswith("keda"), summary
    zero.mark("scale-up to 1 written", up["time"])
    zero.scaler = f"{up['user']['username']} ({up['userAgent']})"
    (engine,) = _engines(zero.cluster)
    assert engine["spec"]["nodeName"] == NODE_NAME
    zero.mark("engine pod scheduled", serving.pod_condition_time(engine, "PodScheduled"))
    zero.mark("engine ready", serving.pod_condition_time(engine, "Ready"))
    replicas = [s[1] for s in zero.states if s[0] >= sent]
    assert max(replicas) == 1, zero.states  # KEDA's HPA, reading 8 held of 16, asked for no second one

    serving_seen = wait_until(
        lambda: zero.first("Serving", sent), 60, "ScaledToZero Serving after the wake", interval=1
    )
    waking = zero.first("Waking", sent)
    assert waking is not None and waking <= serving_seen, zero.states
    zero.mark("ScaledToZero Waking", waking)
    zero.mark("ScaledToZero Serving", serving_seen)
    assert _condition(zero.qwd(), "Ready")["status"] == "True"
    held = sorted({s[5] for s in zero.states if s[3] == "Waking"})
    print(f"\n[scale-to-zero] Waking messages: {held}")
    zero.report()


@pytest.mark.bench  # minutes of waiting: the traffic trigger's 2-min window, then idleSeconds
def test_after_the_last_answer_keda_waits_the_idle_period_then_scales_to_zero(zero: Zero) -> None:
    last = zero.marks["all answered"]
    wait_until(
        lambda: zero.get("get", "deployment", ENGINE)["spec"].get("replicas") == 0,
        120 + IDLE_SECONDS + 120,
        "KEDA to scale the engines to 0 after the idle period",
        interval=2,
    )
    (down,) = _scale_writes(zero, last)
    assert down["user"]["username"] == keda.OPERATOR_USER, down
    # The answers keep the traffic trigger active for its 2-min window (from the scrape that first saw
    # them, at most 5 s later), KEDA then waits idleSeconds after its last poll (every 10 s) that saw it.
    assert down["time"] - last >= 120 + IDLE_SECONDS - 10, down["time"] - last
    zero.mark("idle scale-down to 0 written", down["time"])
    _wait_idle(zero, down["time"])
    zero.report()


def test_back_to_one_replica_leaves_nothing_of_scale_to_zero_and_settles(zero: Zero) -> None:
    zero.patch({"autoscaling": {"minReplicas": 1, "scaleToZero": None}})

    def settled() -> dict[str, Any] | None:
        obj = zero.qwd()
        status = obj.get("status", {})
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and _condition(obj, "Ready").get("status") == "True" else None

    # at one replica already (after the wake), or one engine start (after the idle test)
    obj = wait_until(settled, 300, "the status of minReplicas 1, Ready", interval=1)
    status = obj["status"]
    assert [c["type"] for c in status["conditions"]] == list(CONDITION_TYPES), status["conditions"]
    assert all(c["observedGeneration"] == obj["metadata"]["generation"] for c in status["conditions"])
    assert "scaleToZero" not in status["plan"], status["plan"]
    assert not [w for w in status["plan"].get("warnings", []) if "no engine runs" in w], status["plan"]
    assert _condition(obj, "Ready")["reason"] == "Serving"
    scaled = zero.get("get", "scaledobject", ENGINE)
    assert scaled["spec"]["minReplicaCount"] == 1
    assert [t.get("name") for t in scaled["spec"]["triggers"]] == [None], scaled["spec"]["triggers"]
    assert zero.get("get", "deployment", ENGINE)["spec"]["replicas"] == 1
    assert_settled_writes_nothing(zero.cluster, [OPERATOR_USER], NAMESPACE)


def _gateway_holds(zero: Zero) -> bool:
    """Every gateway pod runs the activator and is Ready, and no other is left, even terminating (the
    Deployment's status may lag its pods), and Prometheus has the activator's held-requests series (its
    scrape job comes with the edit, through prometheus-operator's configuration Secret: up to a minute)."""
    pods = zero.get(
        "get", "pods", "-l", f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=gateway"
    )
    items = pods["items"] if pods else []
    holding = [
        p
        for p in items
        if not p["metadata"].get("deletionTimestamp")
        and "activator" in {c["name"] for c in p["spec"]["containers"]}
        and _condition(p, "Ready").get("status") == "True"
    ]
    if not items or len(holding) != len(items):
        return False
    query = f'{recording.GATEWAY_HELD}{{namespace="{NAMESPACE}",qwendeployment="{NAME}"}}'
    return bool(monitoringstack.prometheus_query(zero.cluster, query))


def _wait_idle(zero: Zero, since: float) -> None:
    """ScaledToZero True/Idle and Ready False/ScaledToZero in one status. (A status computed while the
    Deployment's readyReplicas still counts the deleted pod has Idle beside Ready True for a reconcile.)"""

    def idle() -> dict[str, Any] | None:
        obj = zero.qwd()
        zero_cond, ready = _condition(obj, "ScaledToZero"), _condition(obj, "Ready")
        pair = (zero_cond.get("status"), zero_cond.get("reason"), ready.get("status"), ready.get("reason"))
        return obj if pair == ("True", "Idle", "False", "ScaledToZero") else None

    obj = wait_until(idle, 120, "ScaledToZero True/Idle with Ready False/ScaledToZero", interval=1)
    assert _condition(obj, "Ready")["message"] == _condition(obj, "ScaledToZero")["message"]
    seen = zero.first("Idle", since)
    zero.mark(
        "ScaledToZero Idle" if "ScaledToZero Idle" not in zero.marks else "ScaledToZero Idle again", seen
    )
