"""The real-node journey: one QwenDeployment served on the dev cluster's real node, edited day 2 in sequence,
with nothing simulated but the model (a tiny random Qwen3 on the CPU build of vLLM, as everywhere on this
machine). It is the suite's one real-node scenario with engines: each step asserts only what needs the
real node (a real kubelet, real vLLM engines, the real gateway pods, Prometheus, prometheus-adapter, KEDA
and the real HPA controller); what a loopback process or the kwok cluster proves is tested there
(docs/testing.md says where).

The stack is set up once, in this order: the images loaded into the real node, the monitoring stack
(prometheus-operator, Prometheus, prometheus-adapter), KEDA (its operator, metrics API server and
admission webhooks, built from its Go module), the chart's operator pod under its RBAC, then the dev
QwenDeployment (examples/dev/cpu-real-node.yaml; TP 1 and eager here: the steps that run two engines at
once do it on 2 cores; `make demo` serves the TP-2 default) with its monitors. The steps, in file order,
each an edit of the deployment that serves:

1. served: a chat answered by the engine pod on the real node; Ready only once the engine passes its
   readiness probe; the slow start survived; the operator is a pod of the chart; the router discovers
   the engines with its own ServiceAccount; Pod Security; the engine NetworkPolicy as the node enforces it;
   Prometheus scrapes exactly what the operator's monitors select and records the queue depth;
2. an engine edit (maxModelLen) rolls the engines with no failed request; API-key rotation under traffic;
3. autoscaling on (HPA, queue depth through prometheus-adapter): queue growth scales out, the new engine
   serves; autoscaling off and on again at two engines keeps both; the HPA scales back; the adapter
   stopped makes ScalingReady False with the reason;
4. LoRA slots and two adapters: loaded and removed without restarting the engine, a key limited to one;
5. scale to zero (driver keda, minReplicas 0): KEDA scales in once every gateway pod holds; concurrent
   requests (the base model and the adapter, one streamed) wake one engine and all are answered, the
   adapter's too (a pod is Ready only once it has its adapters); a deployment whose engine cannot start
   answers its held requests with the JSON 503 at the bound; after the last answer the idle period, with
   refused requests keeping nothing up; from zero to the HPA driver the operator lifts the engines;
6. a deployment whose API-key Secret does not exist: its gateway pod waits and the status says why.

The steps build on each other: once one fails, the later ones are skipped with its name (marker
``journey``, e2e/conftest.py) rather than each waiting out its bounds on a state it did not expect.

Timelines are printed and written to .devcluster/autoscaling-timeline.json and
.devcluster/scale-to-zero-timeline.json (`python tools/plot_autoscaling.py FILE`, docs/autoscaling.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from qwen_devtools import keda, monitoringstack, serving
from qwen_devtools.capacity import CapacityWatch
from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster import nodebuild
from qwen_devtools.devcluster.nodecomponents import NODE_NAME
from qwen_devtools.net import check_destination, http_get
from qwen_devtools.operator_proc import assert_settled_writes_nothing, audit_requests, deployment_writes
from qwen_devtools.realparts.lora import write_random_lora
from qwen_devtools.wait import wait_until
from qwen_operator import recording
from qwen_operator.api.review import review
from qwen_operator.manifests import ClusterFacts, build_children
from qwen_operator.manifests.scaling import traffic_window
from qwen_operator.status import CONDITION_TYPES

pytestmark = [pytest.mark.cluster, pytest.mark.real_node, pytest.mark.engine, pytest.mark.journey]

NAMESPACE = "e2e-journey"
NAME = "chat"
ENGINE = f"{NAME}-engine"
COMPONENT = "app.kubernetes.io/component"
ENGINE_SELECTOR = f"app.kubernetes.io/instance={NAME},{COMPONENT}=engine"
GATEWAY_SELECTOR = f"app.kubernetes.io/instance={NAME},{COMPONENT}=gateway"
OPERATOR_USER = f"system:serviceaccount:{serving.OPERATOR_NAMESPACE}:{serving.RELEASE}"
HPA_CONTROLLER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
REPLICASET_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
MODEL = "Qwen/Qwen3-32B"
PROMETHEUS = f"http://{monitoringstack.PROMETHEUS_SERVICE}.{monitoringstack.NAMESPACE}.svc:9090"
CACHE_CLAIM = serving.dev_qwendeployment()["spec"]["model"]["cache"]["claimName"]
DEVCLUSTER = Path(__file__).resolve().parents[1] / ".devcluster"  # outside the cluster's own directory
METRIC_TIMEOUT = 120.0


def _body() -> dict[str, Any]:
    """The journey's QwenDeployment as first applied: one replica, monitors with 5 s scrapes."""
    body = serving.dev_qwendeployment(name=NAME, namespace=NAMESPACE)
    spec = body["spec"]
    spec["replicas"] = 1
    # TP 1: the rollout and scale-out steps run two engines at once on 2 cores, and two TP-2 engines'
    # workers (each pinned to both cores, busy-polling their shared-memory queues) starve the starting one
    # for minutes. Without torch.compile an engine starts in about 40 s instead of 70-300 s beside a busy one.
    spec["parallelism"]["tensor"] = 1
    spec["engine"]["extraArgs"] = ["--enforce-eager"]
    # The load of the autoscaling step is the engine queue's, not one client over its rate: on a fast
    # machine 12 clients back to back pass the default 600 requests a minute of their one key.
    spec["gateway"]["rateLimit"] = {"requestsPerMinute": 60_000, "burst": 1_000}
    spec["monitoring"] = {"serviceMonitor": True, "prometheusRule": True, "interval": "5s"}
    return body


@dataclass
class Journey:
    cluster: devcluster.Cluster
    key: str
    url: str
    #: The monitors and rule the operator renders for the deployment (what Prometheus must load).
    monitors: list[dict[str, Any]]
    #: Ready condition seen while the engine pod existed but was not ready yet (None: never seen).
    ready_before_engine: dict[str, Any] | None = None
    marks: dict[str, float] = field(default_factory=dict)
    zero_marks: dict[str, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    #: (time, spec.replicas, readyReplicas, ScaledToZero reason or "", Ready reason, ScaledToZero message)
    #: on every change, from the scale-to-zero step on.
    states: list[tuple[float, int, int, str, str, str]] = field(default_factory=list)
    scaler: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)

    def get(self, *args: str) -> Any:
        return serving.get_json(self.cluster, "-n", NAMESPACE, *args)

    def kubectl_json(self, *args: str) -> Any:
        return serving.get_json(self.cluster, *args)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        items = self.get("get", "pods", "-l", selector)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def engines(self) -> list[dict[str, Any]]:
        return self.pods(ENGINE_SELECTOR)

    def qwd(self, name: str = NAME) -> dict[str, Any]:
        return dict(self.get("get", "qwd", name))

    def condition(self, kind: str) -> dict[str, Any]:
        return _condition(self.qwd(), kind)

    def patch(self, spec: dict[str, Any], name: str = NAME) -> None:
        self.cluster.kubectl(
            "-n", NAMESPACE, "patch", "qwd", name, "--type=merge", "-p", json.dumps({"spec": spec})
        )

    def replicas(self) -> int:
        return int(self.get("get", "deployment", ENGINE)["spec"].get("replicas", 0))

    def mark(self, what: str, at: float | None = None) -> None:  # the first time of each
        self.marks.setdefault(what, time.time() if at is None else at)

    def zero_mark(self, what: str, at: float | None = None) -> None:
        self.zero_marks.setdefault(what, time.time() if at is None else at)

    def sample(self) -> None:
        """Every few seconds: the queue (autoscaling step) and, on each change, replicas and conditions."""
        query = f"{recording.ENGINE_QUEUE_DEPTH}{{{recording.scope(NAMESPACE, NAME)}}}"
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a slow API call under load: sample again
                dep = self.get("get", "deployment", ENGINE)
                replicas = dep["spec"].get("replicas", 0)
                ready = dep.get("status", {}).get("readyReplicas", 0)
                conditions = {c["type"]: c for c in self.qwd().get("status", {}).get("conditions", [])}
                state = (
                    replicas,
                    ready,
                    conditions.get("ScaledToZero", {}).get("reason", ""),
                    conditions.get("Ready", {}).get("reason", ""),
                    conditions.get("ScaledToZero", {}).get("message", ""),
                )
                if not self.states or self.states[-1][1:] != state:
                    self.states.append((time.time(), *state))
                if "load start" in self.marks and "scale-down" not in self.marks:
                    series = monitoringstack.prometheus_query(self.cluster, query)
                    queue = sum(float(s["value"][1]) for s in series) if series else None
                    self.samples.append(Sample(time.time(), replicas, ready, queue, len(series)))
                    if queue is not None and series and queue / len(series) > TARGET_QUEUE_DEPTH:
                        self.mark("queue above target")
            self._stop.wait(1)

    def first(self, scaled_to_zero: str, after: float) -> float | None:
        return next((s[0] for s in self.states if s[3] == scaled_to_zero and s[0] >= after), None)


@dataclass
class Sample:
    t: float
    replicas: int
    ready: int
    queue: float | None  # sum of qwen_engine:queue_depth over the deployment's engines
    pods_with_queue: int


@pytest.fixture(scope="module")
def journey(real_cluster: devcluster.Cluster) -> Iterator[Journey]:
    assert real_cluster.name
    body = _body()
    rendered = build_children(review(body), ClusterFacts()).objects
    rule = next(c for c in rendered if c["kind"] == "PrometheusRule")
    serving.load_images(real_cluster.name)
    monitoringstack.up(real_cluster, rendered_rule=rule)
    keda.up(real_cluster)
    serving.install_operator(real_cluster)
    serving.prepare_namespace(real_cluster, NAMESPACE)
    serving.model_cache(real_cluster, NAMESPACE, CACHE_CLAIM)
    key = serving.api_key_secret(real_cluster, NAMESPACE, body["spec"]["gateway"]["apiKeysSecret"])
    monitors = [c for c in rendered if c["kind"] in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}]
    state = Journey(real_cluster, key, "", monitors)
    started = time.monotonic()
    serving.apply(real_cluster, body)
    state.ready_before_engine = _ready_while_engine_starts(state)
    serving.wait_serving(real_cluster, NAMESPACE, NAME)
    print(f"\n[journey] serving {time.monotonic() - started:.0f} s after the apply")
    state.url = serving.service_url(real_cluster, NAMESPACE, NAME)
    sampler = threading.Thread(target=state.sample, daemon=True)
    sampler.start()
    yield state
    state._stop.set()
    sampler.join(timeout=30)
    # KEDA removes its finalizer from the ScaledObject: delete it while KEDA runs and the namespace is
    # active; the QwenDeployments go first (while one exists the operator re-creates a deleted
    # ScaledObject, and one re-created as KEDA stops keeps the finalizer).
    for kind in ("qwendeployments", "scaledobjects"):
        real_cluster.kubectl(
            "-n", NAMESPACE, "delete", kind, "--all", "--wait=true", "--timeout=120s",
            check=False, timeout=130,
        )  # fmt: skip
    real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    real_cluster.kubectl(
        "delete", "pv", f"{NAMESPACE}-{CACHE_CLAIM}", "--ignore-not-found", "--wait=false", check=False
    )  # fmt: skip
    serving.uninstall_operator(real_cluster)
    keda.down(real_cluster, crds=True)  # drops KEDA's finalizer from any ScaledObject left (logged)
    monitoringstack.down(real_cluster, crds=True)
    real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", check=False, timeout=180)
    # the LoRA step's adapters, written into the model cache every dev cluster shares
    shutil.rmtree(serving.cache_dir() / serving.MODEL_CACHE_DIR / ADAPTERS_FOLDER, ignore_errors=True)


def _ready_while_engine_starts(journey: Journey) -> dict[str, Any] | None:
    """The Ready condition once the engine container runs but has not passed readiness yet."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for pod in journey.engines():
            statuses = pod.get("status", {}).get("containerStatuses", [])
            if statuses and "running" in statuses[0]["state"] and not statuses[0]["ready"]:
                time.sleep(5)  # the operator reconciles on the pod's events; give it one
                conditions = journey.qwd().get("status", {}).get("conditions", [])
                return next((c for c in conditions if c["type"] == "Ready"), None)
        time.sleep(1)
    return None


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def _engine_requests(pod: dict[str, Any]) -> float:
    """vllm:request_success_total of one engine, read from its own /metrics on the pod IP."""
    status, text = serving.pod_get(f"http://{pod['status']['podIP']}:8000/metrics")
    assert status == 200, text[:300]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


def _chat_ok(journey: Journey, prompt: str = "Say hello.") -> str:
    status, body = serving.chat(journey.url, journey.key, prompt)
    assert status == 200, body
    return str(body["choices"][0]["message"].get("content") or body["choices"][0]["message"])


class _Traffic:
    """Chat requests through the gateway, one after another, until stopped: every status kept."""

    def __init__(self, journey: Journey, key: str, pause: float = 0.3, timeout: float = 120) -> None:
        self.journey, self.key, self.pause, self.timeout = journey, key, pause, timeout
        self.results: list[int] = []
        self.sent: list[float] = []  # when each of them was sent (time.time())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.time()
            try:
                status, _ = serving.chat(
                    self.journey.url, self.key, "Count to three.", max_tokens=4, timeout=self.timeout
                )
            except OSError:  # no answer in time, or the connection reset: a failed request
                status = 0
            self.results.append(status)
            self.sent.append(sent)
            time.sleep(self.pause)

    def __enter__(self) -> _Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)

    def failed(self) -> list[int]:
        assert self.results, "no request was sent"
        return [s for s in self.results if s != 200]


# --- 1. served -------------------------------------------------------------------------------------------


def test_chat_completion_through_the_gateway_is_answered_on_the_real_node(journey: Journey) -> None:
    (engine,) = journey.engines()
    (gateway,) = journey.pods(GATEWAY_SELECTOR)
    assert engine["spec"]["nodeName"] == NODE_NAME and gateway["spec"]["nodeName"] == NODE_NAME
    before = _engine_requests(engine)
    assert _chat_ok(journey)
    assert _engine_requests(engine) == before + 1  # this engine, no other, answered
    status, body = serving.chat(journey.url, "sk-not-a-key", "hi")
    assert status == 401, body
    # Anthropic's Messages API and OpenAI's Responses API, with their SDKs, through the gateway pod: the
    # router sends the engine key itself on these routes (its --api-key, expanded by the kubelet from
    # the engine-key Secret), which only a real pod shows (tests/test_engine_live.py has the rest).
    check_destination(journey.url, serving.CLUSTER_NETWORKS)
    claude = anthropic.Anthropic(
        api_key=journey.key,
        base_url=journey.url,
        max_retries=0,
        timeout=120,
        http_client=anthropic.DefaultHttpxClient(trust_env=False),
    )
    message = claude.messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert message.type == "message" and message.usage.output_tokens > 0
    responses = openai.OpenAI(
        api_key=journey.key,
        base_url=f"{journey.url}/v1",
        max_retries=0,
        timeout=120,
        http_client=openai.DefaultHttpxClient(trust_env=False),
    ).responses
    assert responses.create(model=MODEL, input="Say hello.", max_output_tokens=4).output
    assert _engine_requests(engine) == before + 3


def test_ready_only_once_an_engine_passes_readiness(journey: Journey) -> None:
    assert journey.ready_before_engine is not None, "never saw the engine running but not ready"
    assert journey.ready_before_engine["status"] == "False"
    assert journey.ready_before_engine["reason"] in ("NoReadyReplicas", "GatewayNotReady")
    status = journey.qwd()["status"]
    assert status["readyReplicas"] == 1 and status["replicasSummary"] == "1/1"


def test_slow_starting_engine_is_not_killed(journey: Journey) -> None:
    """The engine takes longer to start than its readiness and liveness probes allow: the startup
    probe's budget (sized from the weights) holds them off, and the container never restarted."""
    (engine,) = journey.engines()
    container = engine["spec"]["containers"][0]
    status = engine["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0
    started = serving.timestamp(status["state"]["running"]["startedAt"])
    ready = serving.pod_condition_time(engine, "Ready")
    readiness = container["readinessProbe"]
    startup = container["startupProbe"]
    assert ready - started > readiness["periodSeconds"] * readiness["failureThreshold"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_operator_runs_as_a_pod_under_the_charts_rbac(journey: Journey) -> None:
    pods = journey.kubectl_json("-n", serving.OPERATOR_NAMESPACE, "get", "pods")["items"]
    operators = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/name") == "qwen-operator"]
    assert len(operators) == 2  # the chart's default: a leader and a standby
    for operator in operators:
        assert operator["spec"]["nodeName"] == NODE_NAME
        assert operator["status"]["phase"] == "Running"
        assert operator["spec"]["serviceAccountName"] == serving.RELEASE
    lease = journey.kubectl_json("-n", serving.OPERATOR_NAMESPACE, "get", "lease", "qwen-operator")
    assert lease["spec"]["holderIdentity"] in {p["metadata"]["name"] for p in operators}
    status_writes = [
        e
        for e in audit_requests(journey.cluster, [OPERATOR_USER], ["patch", "update"], 0)
        if e["objectRef"].get("subresource") == "status" and e["objectRef"].get("name") == NAME
    ]
    assert status_writes, "the operator pod's ServiceAccount never wrote the status"


def test_router_discovers_engines_with_its_own_service_account(journey: Journey) -> None:
    (gateway,) = journey.pods(GATEWAY_SELECTOR)
    log = journey.cluster.kubectl("-n", NAMESPACE, "logs", gateway["metadata"]["name"], "-c", "router").stdout
    (engine,) = journey.engines()
    assert engine["status"]["podIP"] in log, log[-2000:]
    account = f"--as=system:serviceaccount:{NAMESPACE}:{NAME}-gateway"
    can_i = journey.cluster.kubectl("auth", "can-i", "list", "pods", "-n", NAMESPACE, account, check=False)
    assert can_i.stdout.strip() == "yes"
    cannot = journey.cluster.kubectl("auth", "can-i", "get", "secrets", "-n", NAMESPACE, account, check=False)
    assert cannot.stdout.strip() == "no"


def test_gateway_pods_meet_restricted_engines_need_baseline(journey: Journey) -> None:
    """The server's own Pod Security check of every running pod against restricted."""
    dry_run = journey.cluster.kubectl(
        "label", "--dry-run=server", "--overwrite", "namespace", NAMESPACE,
        "pod-security.kubernetes.io/enforce=restricted",
    )  # fmt: skip
    warnings = dry_run.stderr
    engines = [p["metadata"]["name"] for p in journey.engines()]
    gateways = [p["metadata"]["name"] for p in journey.pods(GATEWAY_SELECTOR)]
    assert all(name in warnings for name in engines) or "pods" in warnings, warnings
    assert not any(name in warnings for name in gateways), warnings
    labels = journey.kubectl_json("get", "namespace", serving.OPERATOR_NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus"}


def _probe_pod(journey: Journey, namespace: str, name: str, url: str) -> dict[str, Any]:
    """GET ``url`` from a new pod (the pause image's /probe, restricted, Prometheus's labels) in
    ``namespace``; its result: ``status`` when it connected, ``error`` when not (10 s timeout)."""
    container = {
        "name": "probe",
        "image": nodebuild.pause_image().ref,
        "imagePullPolicy": "Never",
        "command": ["/probe"],
        "args": ["-get", url],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": PROMETHEUS_LABELS},
        "spec": {"containers": [container], "restartPolicy": "Never", "terminationGracePeriodSeconds": 1},
    }
    journey.cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def finished() -> str | None:
        phase = journey.kubectl_json("-n", namespace, "get", "pod", name).get("status", {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    wait_until(finished, 120, f"probe pod {namespace}/{name} to finish", interval=1)
    log = journey.cluster.kubectl("-n", namespace, "logs", name).stdout
    journey.cluster.kubectl("-n", namespace, "delete", "pod", name, "--wait=false")
    return dict(json.loads(next(line for line in log.splitlines() if line.startswith("{"))))


def test_engines_are_reached_only_by_their_gateway_and_the_configured_scrapers(journey: Journey) -> None:
    """The engine NetworkPolicy as the real node enforces it (kube-network-policies): a pod that carries
    Prometheus's label outside the configured scrapers' namespace (the monitoring stack's, as
    serving.install_operator configures the chart), in another namespace or the engines' own, gets no
    connection to the engine port (vLLM's /invocations answers without the engine key); a pod of the
    configured namespace gets /metrics; the gateway serves a new chat."""
    (engine,) = journey.engines()
    engine_ip = engine["status"]["podIP"]
    journey.cluster.kubectl("create", "namespace", "e2e-stranger", check=False)
    probes = {
        "scraper": (monitoringstack.NAMESPACE, f"http://{engine_ip}:8000/metrics"),
        "stranger elsewhere": ("e2e-stranger", f"http://{engine_ip}:8000/invocations"),
        "stranger beside the engines": (NAMESPACE, f"http://{engine_ip}:8000/invocations"),
    }
    try:
        with ThreadPoolExecutor(len(probes)) as pool:
            futures = {
                who: pool.submit(_probe_pod, journey, ns, f"probe-{i}", url)
                for i, (who, (ns, url)) in enumerate(probes.items())
            }
            results = {who: future.result() for who, future in futures.items()}
    finally:
        journey.cluster.kubectl("delete", "namespace", "e2e-stranger", "--wait=false", check=False)
    print(f"[network policy] {json.dumps(results)}")
    assert results["scraper"].get("status") == 200, results
    for stranger in ("stranger elsewhere", "stranger beside the engines"):
        # dropped, not refused: the connection never opens (a refusal or an HTTP status would mean it did)
        assert "status" not in results[stranger] and "Timeout" in results[stranger]["error"], results
    _chat_ok(journey, "Which pods may call the engines?")


def _expected_scrape_pools(rendered: list[dict[str, Any]]) -> set[str]:
    """prometheus-operator's job names: one per monitor endpoint, `<kind>/<namespace>/<name>/<index>`."""
    pools = set()
    for obj in rendered:
        endpoints = {"ServiceMonitor": "endpoints", "PodMonitor": "podMetricsEndpoints"}.get(obj["kind"])
        if endpoints:
            kind = obj["kind"][0].lower() + obj["kind"][1:]
            meta = obj["metadata"]
            pools |= {
                f"{kind}/{meta['namespace']}/{meta['name']}/{i}" for i in range(len(obj["spec"][endpoints]))
            }
    return pools


def test_prometheus_runs_on_the_real_node_and_scrapes_exactly_what_the_monitors_select(
    journey: Journey,
) -> None:
    pod = journey.kubectl_json(
        "-n", monitoringstack.NAMESPACE, "get", "pod", f"prometheus-{monitoringstack.PROMETHEUS_NAME}-0"
    )
    assert pod["spec"]["nodeName"] == NODE_NAME and pod["status"]["phase"] == "Running"
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    assert images["prometheus"] == monitoringstack.PROMETHEUS_IMAGE
    expected = _expected_scrape_pools(journey.monitors)
    (engine_pod,) = journey.engines()

    def engine_scraped_up() -> list[dict[str, Any]] | None:
        targets = monitoringstack.prometheus_targets(journey.cluster)
        engine = [t for t in targets if t["labels"].get("pod") == engine_pod["metadata"]["name"]]
        return targets if engine and all(t["health"] == "up" for t in engine) else None

    targets = wait_until(engine_scraped_up, METRIC_TIMEOUT, "the engine pod scraped and up", interval=2)
    assert {t["scrapePool"] for t in targets} == expected, targets
    engine = [t for t in targets if t["scrapePool"].startswith("serviceMonitor/")]
    ip = engine_pod["status"]["podIP"]
    assert engine and all(t["scrapeUrl"].startswith(f"http://{ip}:") for t in engine), engine


def test_engine_series_and_the_recorded_queue_depth_are_in_prometheus(journey: Journey) -> None:
    (engine_pod,) = journey.engines()
    pod = engine_pod["metadata"]["name"]
    waiting = monitoringstack.prometheus_query(
        journey.cluster, f'vllm:num_requests_waiting{{namespace="{NAMESPACE}"}}'
    )
    assert {s["metric"]["pod"] for s in waiting} == {pod}, waiting

    def recorded() -> list[dict[str, Any]]:
        query = f'{monitoringstack.QUEUE_RECORD}{{namespace="{NAMESPACE}"}}'
        return monitoringstack.prometheus_query(journey.cluster, query)

    series = wait_until(recorded, METRIC_TIMEOUT, f"{monitoringstack.QUEUE_RECORD} recorded", interval=2)
    assert {s["metric"]["pod"] for s in series} == {pod}, series


def test_custom_metrics_api_serves_the_engines_queue_depth(journey: Journey) -> None:
    (engine_pod,) = journey.engines()
    pod = engine_pod["metadata"]["name"]

    def served() -> dict[str, Any] | None:
        metrics = monitoringstack.custom_metric(journey.cluster, NAMESPACE)
        return metrics if metrics and metrics.get("items") else None

    metrics = wait_until(served, METRIC_TIMEOUT, f"{monitoringstack.QUEUE_CUSTOM_METRIC} served", interval=2)
    (item,) = metrics["items"]
    described = item["describedObject"]
    assert (described["kind"], described["namespace"], described["name"]) == ("Pod", NAMESPACE, pod)
    assert item["metricName"] == monitoringstack.QUEUE_CUSTOM_METRIC  # v1beta1's field (v1beta2: metric.name)
    value = item["value"]  # a quantity: "0", "2", "1500m"
    assert (float(value[:-1]) / 1000 if value.endswith("m") else float(value)) >= 0


# --- 2. engine edit, key rotation ------------------------------------------------------------------------


def _args(pod: dict[str, Any]) -> list[str]:
    return list(pod["spec"]["containers"][0]["args"])


def _value(pod: dict[str, Any], flag: str) -> str:
    args = _args(pod)
    return args[args.index(flag) + 1]


def test_an_engine_edit_rolls_engines_with_zero_failed_requests(journey: Journey) -> None:
    """maxModelLen and LoRA slots (the LoRA step's) in one edit of the engines: one surge rollout, no
    failed request; AdaptersLoaded True with no adapter yet."""
    (old,) = journey.engines()
    with _Traffic(journey, journey.key, pause=0.5) as traffic:
        journey.patch({"engine": {"maxModelLen": 512}, "lora": {**SLOTS, "adapters": []}})

        def rolled() -> bool:
            pods = journey.engines()
            gone = all(p["metadata"]["uid"] != old["metadata"]["uid"] for p in pods)
            ready = [p for p in pods if all(s["ready"] for s in p["status"].get("containerStatuses", []))]
            return (
                gone
                and len(ready) == 1
                and _value(ready[0], "--max-model-len") == "512"
                and "--enable-lora" in _args(ready[0])
            )

        wait_until(rolled, 600, "the engine rolled to maxModelLen 512", interval=3)
        time.sleep(5)
    failed = traffic.failed()
    assert failed == [], (
        f"{len(failed)} of {len(traffic.results)} requests failed during the rollout: {failed}"
    )
    assert journey.qwd()["status"]["rolloutStrategy"].startswith("Surge")
    wait_until(lambda: _adapters_loaded(journey, set()), 120, "AdaptersLoaded with no adapter")


def _wait_answered(journey: Journey, key: str, status: int, what: str) -> None:
    """Until a request with `key` gets `status` (the gateway reloads keys once kubelet updates the
    Secret's volume: about a minute)."""
    wait_until(
        lambda: serving.chat(journey.url, key, "Hi.", max_tokens=2)[0] == status, 180, what, interval=2
    )


def test_api_key_rotation_under_traffic_fails_no_request(journey: Journey) -> None:
    """A new key added to the Secret works once the gateway reloads, the old one keeps working meanwhile;
    removed, the old key is refused. No request with a valid key fails, no gateway pod restarts."""
    secret = journey.qwd()["spec"]["gateway"]["apiKeysSecret"]
    gateways = {p["metadata"]["uid"] for p in journey.pods(GATEWAY_SELECTOR)}
    new_key = f"sk-{secrets.token_urlsafe(24)}"
    with _Traffic(journey, journey.key) as old_traffic:
        journey.cluster.kubectl(
            "-n", NAMESPACE, "patch", "secret", secret, "--type=merge",
            "-p", json.dumps({"stringData": {"rotated": new_key}}),
        )  # fmt: skip
        _wait_answered(journey, new_key, 200, "new key")
    assert old_traffic.failed() == [], f"the old key failed during the rotation: {old_traffic.failed()}"
    with _Traffic(journey, new_key) as new_traffic:
        old, journey.key = journey.key, new_key
        current = journey.get("get", "secret", secret)["data"]
        first = next(k for k in current if k != "rotated")
        journey.cluster.kubectl(
            "-n", NAMESPACE, "patch", "secret", secret, "--type=json",
            "-p", json.dumps([{"op": "remove", "path": f"/data/{first}"}]),
        )  # fmt: skip
        _wait_answered(journey, old, 401, "old key refused")
    assert new_traffic.failed() == [], f"the new key failed: {new_traffic.failed()}"
    assert {p["metadata"]["uid"] for p in journey.pods(GATEWAY_SELECTOR)} == gateways, (
        "a gateway pod restarted"
    )
    sent = len(old_traffic.results) + len(new_traffic.results)
    print(f"[transitions] key rotation: {sent} requests, 0 failed")


# --- 3. queue-depth autoscaling (HPA) --------------------------------------------------------------------

TARGET_QUEUE_DEPTH = 2
MAX_REPLICAS = 2
#: Clients sending requests back to back: more than the engine's batch (maxNumSeqs 8), so about 4 wait.
CLIENTS = 12
#: Once the new engine is ready, a light load (no queue) that the router spreads over both engines. The
#: load stops from the HPA's decision until then: on these 2 cores a busy CPU engine (its OpenMP threads
#: spin on both cores) starves a starting one, and Prometheus, for many minutes; on GPUs the new engine
#: starts on its own accelerators.
LIGHT_CLIENTS = 3
#: Short windows so that one run sees a scale-up and a scale-down in minutes (defaults: docs/autoscaling.md).
#: The scale-down window covers the new engine's start (40-100 s here) after the queue emptied.
BEHAVIOR = {"scaleUpPeriodSeconds": 15, "scaleDownStabilizationSeconds": 180, "scaleDownPeriodSeconds": 15}
HPA = {
    "minReplicas": 1,
    "maxReplicas": MAX_REPLICAS,
    "targetQueueDepth": TARGET_QUEUE_DEPTH,
    "behavior": BEHAVIOR,
}


class Load:
    """Client threads sending chat completions through the gateway back to back until stopped."""

    def __init__(self, journey: Journey, clients: int, name: str) -> None:
        self.journey = journey
        self.name = name
        self.stop = threading.Event()
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        while not self.stop.is_set():
            try:
                status, _ = serving.chat(
                    self.journey.url, self.journey.key, secrets.token_hex(8), max_tokens=64, timeout=300
                )
            except Exception:
                status = -1
            with self.lock:
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def __enter__(self) -> Load:
        self.journey.mark(f"{self.name} start")
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.journey.mark(f"{self.name} stop")
        for t in self.threads:
            t.join(timeout=330)


def test_scaling_ready_once_the_hpa_reads_the_adapters_metric(journey: Journey) -> None:
    """replicas 1 -> autoscaling (the documented hand-off of replicas to the HPA). (The gateway's
    pass-through limit raised to the engines' capacity, with its warning, is tests/test_limits.py's: the
    journey leaves the gateway alone here, so that the hand-off steps below roll nothing
    of it.)"""
    journey.patch({"replicas": None, "autoscaling": HPA})
    generation = journey.qwd()["metadata"]["generation"]
    ready = wait_until(
        lambda: (
            (c := journey.condition("ScalingReady")).get("status") == "True"
            and c.get("observedGeneration") == generation
            and c
        ),
        180,
        "ScalingReady=True for the edit",
        interval=3,
    )
    assert ready["reason"] == "MetricAvailable", ready
    hpa = journey.get("get", "hpa", ENGINE)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == recording.ADAPTER_METRIC
    active = next(c for c in hpa["status"]["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("True", "ValidMetricFound"), active
    status = journey.qwd()["status"]
    assert status["autoscaling"]["targetQueueDepth"] == TARGET_QUEUE_DEPTH
    # the gateway's default pass-through limit follows maxReplicas: it may roll once for this edit
    serving.wait_serving(journey.cluster, NAMESPACE, NAME)
    journey.cluster.kubectl(
        "-n", NAMESPACE, "rollout", "status", f"deployment/{NAME}-gateway", "--timeout=300s", timeout=320
    )


def _served(pod: dict[str, Any]) -> bool:
    ip = pod.get("status", {}).get("podIP")
    if not ip:
        return False
    status, text = serving.pod_get(f"http://{ip}:8000/metrics")
    return status == 200 and any(
        line.startswith("vllm:request_success_total{") and float(line.rsplit(" ", 1)[1]) > 0
        for line in text.splitlines()
    )


def test_queue_growth_scales_out_and_the_new_engine_serves(journey: Journey) -> None:
    (first,) = journey.engines()
    since = time.time()
    with Load(journey, CLIENTS, "load") as load:
        wait_until(lambda: "queue above target" in journey.marks, 180, "the queue above target", interval=1)
        wait_until(
            lambda: journey.replicas() == MAX_REPLICAS, 240, f"the HPA to raise replicas to {MAX_REPLICAS}", 1
        )
        dep = journey.get("get", "deployment", ENGINE, "--show-managed-fields")
        hpa = journey.get("get", "hpa", ENGINE)
        journey.mark("HPA decision", serving.timestamp(hpa["status"]["lastScaleTime"]))
        queue_seen = max((s.queue or 0) for s in journey.samples)
        statuses = dict(load.statuses)
    # No load while the new engine starts (see LIGHT_CLIENTS), then a light one the router spreads.
    (second,) = wait_until(
        lambda: [p for p in journey.engines() if p["metadata"]["uid"] != first["metadata"]["uid"]],
        60,
        "the new engine pod",
    )
    name = second["metadata"]["name"]
    ready = wait_until(
        lambda: serving.pod_condition_time(journey.get("get", "pod", name), "Ready"),
        240,
        "the new engine Ready",
        2,
    )
    second = journey.get("get", "pod", name)
    assert second["spec"]["nodeName"] == NODE_NAME
    journey.mark("new pod scheduled", serving.pod_condition_time(second, "PodScheduled"))
    journey.mark("engine ready", ready)
    with Load(journey, LIGHT_CLIENTS, "light load") as light:
        wait_until(lambda: _served(second), 120, "a request served by the new engine", interval=1)
        journey.mark("first request served by it")
        light_statuses = dict(light.statuses)
    assert statuses.get(200, 0) > 0 and set(statuses) == {200}, statuses
    assert set(light_statuses) <= {200}, light_statuses
    assert queue_seen > TARGET_QUEUE_DEPTH

    # The replica change was the HPA controller's: the API server's audit log names its service account
    # (kube-controller-manager runs each controller under its own) as the only writer of deployments/scale,
    # and no other field manager (the operator, the test) owns spec.replicas.
    writes = deployment_writes(journey.cluster, NAMESPACE, ENGINE, since)
    writers = {w["user"]["username"] for w in writes if w["objectRef"].get("subresource") == "scale"}
    assert writers == {HPA_CONTROLLER}, writers
    owners = [
        m["manager"]
        for m in dep["metadata"].get("managedFields", [])
        if "f:replicas" in json.dumps(m.get("fieldsV1", {}).get("f:spec", {}))
    ]
    assert set(owners) <= {"kube-controller-manager"}, owners


def test_autoscaling_turned_off_and_on_again_at_two_engines_keeps_both(journey: Journey) -> None:
    """Real engines, real requests: the HPA's 2 -> replicas 2 -> autoscaling again (at
    minimum 2). The replicas field
    passes from the HPA at its value and back to it (the documented hand-off): no engine stops, no
    request fails."""
    engines = {p["metadata"]["uid"] for p in journey.engines()}
    assert len(engines) == 2, "runs after the scale-out to two replicas"
    api = journey.cluster.api_client()
    with (
        CapacityWatch(api, NAMESPACE, ENGINE, ENGINE) as seen,
        _Traffic(journey, journey.key) as t,
    ):
        start = time.time()
        journey.patch({"autoscaling": None, "replicas": 2})
        wait_until(lambda: "autoscaling" not in journey.qwd()["status"], 60, "no status.autoscaling")
        time.sleep(10)
        # minReplicas 2: a new HPA has no recommendations to stabilise over, and would scale in at once
        journey.patch({"replicas": None, "autoscaling": {**HPA, "minReplicas": 2}})
        wait_until(lambda: "autoscaling" in journey.qwd()["status"], 60, "status.autoscaling")
        time.sleep(20)  # the HPA's first looks
    assert t.failed() == [], f"{len(t.failed())} of {len(t.results)} requests failed"
    assert min(r or 0 for r in seen.replicas_seen(start)) >= 2, seen.replicas_seen(start)
    assert seen.lowest(start) >= (2, 2), f"capacity dropped: {seen.lowest(start)}"
    assert {p["metadata"]["uid"] for p in journey.engines()} == engines, "an engine was replaced"
    print(f"[transitions] autoscaling off/on: {len(t.results)} requests, 0 failed, capacity kept 2/2")


def _container_pids(container_id: str) -> list[int]:
    """The host PIDs of one container's processes: those whose cgroup path names its containerd id (the
    real node's kubelet uses the cgroupfs driver, .../pod<uid>/<container id>)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if container_id in (proc / "cgroup").read_text():
                    pids.append(int(proc.name))
    return pids


def _event_time(event: dict[str, Any]) -> float:
    return serving.timestamp(event.get("lastTimestamp") or event["eventTime"])


def _events_of(journey: Journey, pod: str, since: float) -> list[dict[str, Any]]:
    """The pod's Events last seen since `since`, oldest first."""
    events = journey.get("get", "events", "--field-selector", f"involvedObject.name={pod}")["items"]
    return sorted((e for e in events if _event_time(e) >= since - 1), key=_event_time)


#: The engine's liveness probe fails 6 times 15 s apart, each after a 10 s timeout (manifests/engine.py).
LIVENESS_VERDICT_SECONDS = 6 * 15 + 10


def test_a_hung_engine_is_restarted_by_its_liveness_probe_while_the_other_serves(journey: Journey) -> None:
    """One of the two engines hangs (SIGSTOP to every process of its container: /health answers nothing).
    Readiness takes it out of the router's set within seconds, so requests keep being answered by the
    other; the liveness probe gives its verdict after six failures 15 s apart and the kubelet kills the
    container after the probe's own 30 s grace (api/drains.py: a hung engine drains nothing, so not the
    pod's 120 s), then starts it again in the same pod. (Its start-up is not waited for: the next step
    scales in, and the ReplicaSet removes a pod that is not Ready first.)"""
    engines = journey.engines()
    assert len(engines) == 2, "runs at two engines"
    hung = engines[0]
    name = hung["metadata"]["name"]
    (status,) = [c for c in hung["status"]["containerStatuses"] if c["name"] == "vllm"]
    container_id = status["containerID"].removeprefix("containerd://")
    pids = _container_pids(container_id)
    assert pids, f"no process of container {container_id} found"
    restarts = status["restartCount"]
    with _Traffic(journey, journey.key, timeout=20) as traffic:
        time.sleep(5)
        frozen = time.time()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: _condition(journey.get("get", "pod", name), "Ready").get("status") == "False",
                60,
                "the hung engine not Ready",
                interval=1,
            )
            unready = time.time()

            def restarted() -> dict[str, Any] | None:
                pod = journey.get("get", "pod", name)
                (c,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "vllm"]
                return c if c["restartCount"] > restarts else None

            after = wait_until(restarted, LIVENESS_VERDICT_SECONDS + 120, "the kubelet's restart", interval=2)
        finally:
            for pid in pids:  # only if the kubelet has not killed them (a failure above)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        time.sleep(5)  # requests after the restart: still the other engine's
    events = _events_of(journey, name, frozen)
    # the kubelet's verdict: "Container vllm failed liveness probe, will be restarted"
    (killing,) = [e for e in events if e["reason"] == "Killing" and "liveness" in e["message"]]
    killed = _event_time(killing)
    terminated = after["lastState"]["terminated"]
    exited = serving.timestamp(terminated["finishedAt"])
    assert terminated["exitCode"] == 137, terminated  # SIGKILL: a stopped process takes no SIGTERM
    assert LIVENESS_VERDICT_SECONDS - 30 <= killed - frozen <= LIVENESS_VERDICT_SECONDS + 30, killed - frozen
    assert exited - killed <= 30 + 5, (killed, exited)  # the probe's grace, not the pod's 120 s
    # Requests sent once the hung pod had left the router's set were all answered by the other engine.
    late = [s for s, t in zip(traffic.results, traffic.sent, strict=True) if t >= unready + 2]
    assert late and set(late) == {200}, late
    running = after["state"].get("running", {}).get("startedAt")
    started = f"{serving.timestamp(running) - frozen:.0f} s" if running else f"not yet ({after['state']})"
    early = [s for s, t in zip(traffic.results, traffic.sent, strict=True) if t < unready + 2]
    print(
        f"\n[liveness] engine {name} hung at 0 s: not Ready after {unready - frozen:.0f} s, killed after "
        f"{killed - frozen:.0f} s (exit {terminated['exitCode']} {exited - killed:.0f} s later), started "
        f"again after {started}; {len(traffic.results)} requests, {len(traffic.failed())} failed (the "
        f"statuses of those sent before it left the router's set: {early})"
    )


def test_without_a_queue_the_hpa_scales_back_to_its_minimum(journey: Journey) -> None:
    """minReplicas back to 1 and no scale-down window any more (a behaviour edit): with no queue the HPA
    removes the second engine at its next look."""
    journey.patch({"autoscaling": {"minReplicas": 1, "behavior": {"scaleDownStabilizationSeconds": 0}}})
    wait_until(
        lambda: journey.replicas() == 1,
        BEHAVIOR["scaleDownStabilizationSeconds"] + 120,
        "the HPA to scale back to 1",
        interval=1,
    )
    journey.mark(
        "scale-down", serving.timestamp(journey.get("get", "hpa", ENGINE)["status"]["lastScaleTime"])
    )
    _write_autoscaling_timeline(journey)


def _write_autoscaling_timeline(journey: Journey) -> None:
    start = journey.marks["load start"]
    path = DEVCLUSTER / "autoscaling-timeline.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    samples = [s for s in journey.samples if s.t >= start]
    path.write_text(
        json.dumps(
            {
                "marks": {what: round(t - start, 1) for what, t in journey.marks.items()},
                "samples": [
                    {"t": round(s.t - start, 1), "replicas": s.replicas, "ready": s.ready, "queue": s.queue}
                    for s in samples
                ],
                "targetQueueDepth": TARGET_QUEUE_DEPTH,
                "maxReplicas": MAX_REPLICAS,
                "clients": CLIENTS,
            },
            indent=1,
        )
    )
    print("\n[autoscaling] timeline (seconds from load start):")
    for t, what in sorted((t - start, what) for what, t in journey.marks.items()):
        print(f"[autoscaling] {t:7.1f}  {what}")
    print(f"[autoscaling] written to {path}")


def test_stopping_the_adapter_makes_scaling_not_ready_with_the_reason(journey: Journey) -> None:
    scale = ["-n", monitoringstack.NAMESPACE, "scale", "deployment", monitoringstack.ADAPTER]
    journey.cluster.kubectl(*scale, "--replicas=0")
    try:
        broken = wait_until(
            lambda: (c := journey.condition("ScalingReady")).get("status") == "False" and c,
            180,
            "ScalingReady=False after the adapter stopped",
            interval=3,
        )
    finally:
        # An unavailable aggregated API slows discovery for every client: bring it back.
        journey.cluster.kubectl(*scale, "--replicas=1")
    assert broken["reason"] in ("MetricsAPIUnavailable", "FailedGetPodsMetric"), broken
    print(f"\n[autoscaling] adapter stopped: ScalingReady=False {broken['reason']}: {broken['message']}")


# --- 4. LoRA ---------------------------------------------------------------------------------------------

SLOTS = {"maxLoras": 2, "maxLoraRank": 8}
ADAPTERS_FOLDER = f"loras/e2e-{secrets.token_hex(4)}"


def _ask(journey: Journey, model: str, prompt: str = "Name three colours.") -> tuple[int, Any]:
    """One chat completion at temperature 0 for `model` (the base model or an adapter): (status, its
    text), or (status, the JSON error)."""
    status, body = serving.chat(journey.url, journey.key, prompt, max_tokens=12, model=model, temperature=0)
    if status != 200:
        return status, json.loads(body)
    message = body["choices"][0]["message"]
    # The tiny model's random text may land in the reasoning field (the qwen3 reasoning parser).
    return status, "".join(str(message.get(k) or "") for k in ("reasoning", "reasoning_content", "content"))


def _adapters_loaded(journey: Journey, want: set[str]) -> bool:
    """AdaptersLoaded is True and status.lora lists exactly `want`, each loaded on every ready engine pod."""
    status = journey.qwd().get("status", {})
    condition = next((c for c in status.get("conditions", []) if c["type"] == "AdaptersLoaded"), {})
    listed = {a["name"]: a["loaded"].split("/") for a in status.get("lora", {}).get("adapters", [])}
    everywhere = all(loaded == ready != "0" for loaded, ready in listed.values())
    return condition.get("status") == "True" and set(listed) == want and everywhere


def _listed(journey: Journey, key: str) -> set[str]:
    """The model ids the gateway's /v1/models lists for `key`."""
    headers = {"Authorization": f"Bearer {key}"}
    status, body = http_get(f"{journey.url}/v1/models", 10, headers, serving.CLUSTER_NETWORKS)
    assert status == 200, body
    return {card["id"] for card in json.loads(body)["data"]}


def test_lora_adapters_are_loaded_and_removed_without_restarting_the_engine(journey: Journey) -> None:
    """With the LoRA slots of the engine edit step, two tiny random adapters (random A and B, so each
    really changes the output) written into the model cache PVC and added to the spec: the engine pod's
    lora-sync sidecar loads them without a restart (same pod UID), status.lora and AdaptersLoaded say so,
    and through the gateway each adapter answers differently from the base model at temperature 0, the
    same way twice. One removed: the engine answers it with its own 404 JSON, the other still serves (and
    stays for the scale-to-zero step)."""
    cache = serving.cache_dir() / serving.MODEL_CACHE_DIR
    model_dir = serving.cache_dir() / "tiny-qwen3-model"
    for seed, name in enumerate(("sql", "poet")):
        write_random_lora(cache / ADAPTERS_FOLDER / name, model_dir, rank=8, seed=seed + 1, scale=4.0)
    before = sorted(p["metadata"]["uid"] for p in journey.engines())
    base = _ask(journey, MODEL)
    assert base[0] == 200, base

    adapters = [{"name": n, "source": {"path": f"{ADAPTERS_FOLDER}/{n}"}, "rank": 8} for n in ("sql", "poet")]
    started = time.monotonic()
    journey.patch({"lora": {**SLOTS, "adapters": adapters}})
    wait_until(lambda: _adapters_loaded(journey, {"sql", "poet"}), 240, "both adapters")
    loaded_in = time.monotonic() - started
    assert sorted(p["metadata"]["uid"] for p in journey.engines()) == before
    answers = {name: _ask(journey, name) for name in ("sql", "poet")}
    again = _ask(journey, "sql")
    print(f"\n[lora] both adapters loaded {loaded_in:.0f} s after the edit; base {base[1]!r}, {answers}")
    assert all(status == 200 for status, _ in answers.values()), answers
    assert len({base[1], answers["sql"][1], answers["poet"][1]}) == 3, (base, answers)
    assert again == answers["sql"]

    started = time.monotonic()
    journey.patch({"lora": {**SLOTS, "adapters": adapters[:1]}})
    wait_until(lambda: _adapters_loaded(journey, {"sql"}), 240, "poet to be unloaded")
    removed_in = time.monotonic() - started
    status, error = _ask(journey, "poet")
    assert status == 404 and "poet" in error["error"]["message"], error
    assert _ask(journey, "sql") == answers["sql"]
    assert sorted(p["metadata"]["uid"] for p in journey.engines()) == before
    print(f"[lora] one removed {removed_in:.0f} s after the edit; the other still answers the same")
    # Settled, the operator's reconciles (its own status writes' events, the pods' watch, its timers)
    # write nothing more: no status flapping between the sidecars' reports.
    assert_settled_writes_nothing(journey.cluster, [OPERATOR_USER])


# --- 5. scale to zero (KEDA) -----------------------------------------------------------------------------

#: 8 requests at once during the cold start; the engine runs 8 at once (maxNumSeqs). Two ask the adapter.
CONCURRENT = 8
IDLE_SECONDS = 60  # the smallest the spec allows
TRAFFIC_WINDOW_SECONDS = int(traffic_window(review(_body())).removesuffix("s"))
KEDA_AT_ZERO = {
    "driver": "keda",
    "prometheusAddress": PROMETHEUS,
    "minReplicas": 0,
    "maxReplicas": 2,  # one wake is still one scale-up
    "targetQueueDepth": None,
    "behavior": None,
    "scaleToZero": {"idleSeconds": IDLE_SECONDS},
}


def _gateway_pods_deleted(journey: Journey, since: float) -> list[dict[str, Any]]:
    """The ReplicaSet controller's deletes of this deployment's gateway pods since `since` (a rollout's
    old pods), from the audit log, oldest first."""
    deletes = audit_requests(journey.cluster, [REPLICASET_CONTROLLER], ["delete"], since)
    prefix = f"{NAME}-gateway-"
    return [
        e
        for e in deletes
        if e["objectRef"].get("resource") == "pods" and e["objectRef"].get("name", "").startswith(prefix)
    ]


def _scale_writes(journey: Journey, since: float) -> list[dict[str, Any]]:
    """Every write to the engine Deployment's replicas since `since`, from the audit log: its scale
    subresource (KEDA, the HPA controller, kubectl scale) or the Deployment itself by anyone but the
    operator, which never sets replicas of an autoscaled engine."""
    writes = deployment_writes(journey.cluster, NAMESPACE, ENGINE, since)
    return [
        w
        for w in writes
        if w["objectRef"].get("subresource") == "scale"
        or (not w["objectRef"].get("subresource") and w["user"]["username"] != OPERATOR_USER)
    ]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _post_status(url: str, headers: dict[str, str]) -> int:
    """The status of one small chat request through the gateway with `headers`."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1}
    check_destination(url, serving.CLUSTER_NETWORKS)
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={**headers, "Content-Type": "application/json"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _stream(url: str, key: str, prompt: str) -> list[tuple[float, str]]:
    """A streamed chat request through the gateway: [(0, status)] then (time, line) for each SSE line."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "stream": True,
    }
    check_destination(url, serving.CLUSTER_NETWORKS)
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={**_auth(key), "Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=600) as response:
            lines = [(0.0, str(response.status))]
            for raw in response:
                if line := raw.decode().strip():
                    lines.append((time.time(), line))
            return lines
    except urllib.error.HTTPError as error:
        return [(0.0, str(error.code)), (time.time(), error.read().decode(errors="replace"))]


def _gateway_holds(journey: Journey) -> bool:
    """Every gateway pod runs the activator and is Ready, and no other is left, even terminating (the
    Deployment's status may lag its pods), and Prometheus has the activator's held-requests series (its
    scrape job comes with the edit, through prometheus-operator's configuration Secret: up to a minute)."""
    items = journey.get("get", "pods", "-l", GATEWAY_SELECTOR)["items"]
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
    return bool(monitoringstack.prometheus_query(journey.cluster, query))


def _wait_idle(journey: Journey, since: float) -> None:
    """ScaledToZero True/Idle and Ready False/ScaledToZero in one status. (A status computed while the
    Deployment's readyReplicas still counts the deleted pod has Idle beside Ready True for a reconcile.)"""

    def idle() -> dict[str, Any] | None:
        obj = journey.qwd()
        zero_cond, ready = _condition(obj, "ScaledToZero"), _condition(obj, "Ready")
        pair = (zero_cond.get("status"), zero_cond.get("reason"), ready.get("status"), ready.get("reason"))
        return obj if pair == ("True", "Idle", "False", "ScaledToZero") else None

    obj = wait_until(idle, 120, "ScaledToZero True/Idle with Ready False/ScaledToZero", interval=1)
    assert _condition(obj, "Ready")["message"] == _condition(obj, "ScaledToZero")["message"]
    seen = journey.first("Idle", since)
    journey.zero_mark(
        "ScaledToZero Idle" if "ScaledToZero Idle" not in journey.zero_marks else "ScaledToZero Idle again",
        seen,
    )


def _zero_report(journey: Journey) -> None:
    """Print the scale-to-zero timeline so far and write it."""
    start = journey.zero_marks["edit to minReplicas 0"]
    marks = sorted((t - start, what) for what, t in journey.zero_marks.items() if t is not None)
    path = DEVCLUSTER / "scale-to-zero-timeline.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "marks": {what: round(t, 1) for t, what in marks},
                "idleSeconds": IDLE_SECONDS,
                "concurrent": CONCURRENT,
                "scaler": journey.scaler,
            },
            indent=1,
        )
    )
    print("\n[scale-to-zero] timeline (seconds from the edit to minReplicas 0):")
    for t, what in marks:
        print(f"[scale-to-zero] {t:7.1f}  {what}")
    print(f"[scale-to-zero] the scale-up's writer: {journey.scaler}; written to {path}")


def _scaled_object_refused(journey: Journey) -> str:
    """A second ScaledObject for the engines, created with a server-side dry run: KEDA's admission webhook
    (in the dev cluster as its chart installs it) answers; the refusal's message, "" when admitted."""
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": f"{NAME}-second", "namespace": NAMESPACE},
        "spec": {
            "scaleTargetRef": {"name": ENGINE},
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {"serverAddress": PROMETHEUS, "query": "vector(0)", "threshold": "1"},
                }
            ],
        },
    }
    result = journey.cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(scaled), check=False
    )
    return "" if result.returncode == 0 else result.stderr.strip()


def test_keda_runs_on_the_real_node_and_the_hpa_gives_way_to_its_scaled_object(journey: Journey) -> None:
    """hpa -> keda at minReplicas 0, with KEDA's admission webhook running (issue 39 item 6): it refuses a
    ScaledObject whose target an HPA scales, so the switch works only because the operator prunes its HPA
    before it applies the ScaledObject (the order the kwok test reads from the audit log). KEDA's
    ScaledObject is then Ready."""
    pods = journey.kubectl_json("-n", keda.NAMESPACE, "get", "pods")["items"]
    running = {p["metadata"]["labels"]["app"]: p for p in pods if p["status"].get("phase") == "Running"}
    assert set(running) == set(keda.DEPLOYMENTS), list(running)
    assert all(p["spec"]["nodeName"] == NODE_NAME for p in running.values())
    images = {name: p["spec"]["containers"][0]["image"] for name, p in running.items()}
    assert images == keda.DEPLOYMENTS
    resources = json.loads(
        journey.cluster.kubectl("get", "--raw", f"/apis/{keda.EXTERNAL_METRICS_GROUP}/v1beta1").stdout
    )
    assert [r["name"] for r in resources["resources"]] == ["externalmetrics"], resources
    # The webhook answers, and would refuse a ScaledObject applied while the operator's HPA exists.
    refused = _scaled_object_refused(journey)
    assert f"is already managed by the hpa '{ENGINE}'" in refused, refused

    journey.zero_mark("edit to minReplicas 0")
    journey.patch({"autoscaling": KEDA_AT_ZERO})

    def scaled_object_ready() -> dict[str, Any] | None:
        found = journey.cluster.kubectl(
            "-n", NAMESPACE, "get", "scaledobject", ENGINE, "-o", "json", check=False
        )
        scaled = json.loads(found.stdout) if found.returncode == 0 else {}
        return scaled if _condition(scaled, "Ready").get("status") == "True" else None

    wait_until(scaled_object_ready, 120, "KEDA's ScaledObject Ready", interval=2)
    # KEDA's own HPA is keda-hpa-<name>; the operator's (named like the engines) is gone
    hpas = {h["metadata"]["name"] for h in journey.get("get", "hpa")["items"]}
    assert hpas == {f"keda-hpa-{ENGINE}"}, hpas
    # now the operator's ScaledObject holds the target: the webhook names it or its HPA, whichever of
    # its checks (HPAs first, then ScaledObjects, from its informers) sees it first
    refused = _scaled_object_refused(journey)
    holders = (f"the ScaledObject '{ENGINE}'", f"the hpa 'keda-hpa-{ENGINE}'")
    assert any(f"is already managed by {holder}" in refused for holder in holders), refused


def test_at_zero_concurrent_requests_wake_one_engine_and_are_all_answered(journey: Journey) -> None:
    """KEDA scales in once no trigger was active for idleSeconds (the traffic trigger stays active for its
    window after the LoRA step's answers), and only once every gateway pod holds. At zero the gateway
    lists the models itself. CONCURRENT requests arrive together (two for the adapter, one streamed):
    the activator holds them all, KEDA writes the one scale-up, the new pod is Ready only once lora-sync
    has loaded the adapter (issue 39 item 5: before, the router sent the adapter's requests into the
    engine's 404), and every request is answered 200 by it."""
    edited = journey.zero_marks["edit to minReplicas 0"]
    wait_until(
        lambda: journey.replicas() == 0,
        TRAFFIC_WINDOW_SECONDS + IDLE_SECONDS + 180,
        "KEDA to scale the engines to 0",
        interval=1,
    )
    (down,) = [w for w in _scale_writes(journey, edited) if w["user"]["username"] == keda.OPERATOR_USER]
    journey.zero_mark("scale-down to 0 written", down["time"])
    # Not before every gateway pod holds: the ScaledObject keeps one engine until the ReplicaSet controller
    # has deleted the last gateway pod without the activator (the audit log has both writes).
    (*_, last_old) = _gateway_pods_deleted(journey, edited)
    journey.zero_mark("last gateway pod without the activator deleted", last_old["time"])
    assert down["time"] > last_old["time"], (down["time"], last_old["time"])
    _wait_idle(journey, down["time"])
    wait_until(lambda: not journey.engines(), 120, "the engine pod gone", interval=1)
    journey.zero_mark("engine pod gone")
    wait_until(lambda: _gateway_holds(journey), 300, "the activator's held requests scraped", interval=1)
    journey.zero_mark("held requests scraped")

    status, text = http_get(f"{journey.url}/v1/models", 10, _auth(journey.key), serving.CLUSTER_NETWORKS)
    assert status == 200 and {m["id"] for m in json.loads(text)["data"]} == {MODEL, "sql"}, (status, text)

    sent = time.time()
    journey.zero_mark("requests sent")
    with ThreadPoolExecutor(CONCURRENT) as pool:
        streamed = pool.submit(_stream, journey.url, journey.key, f"wake streamed {secrets.token_hex(4)}")
        models = [MODEL] * (CONCURRENT - 3) + ["sql", "sql"]
        calls = [
            pool.submit(
                serving.chat,
                journey.url,
                journey.key,
                f"wake {i} {secrets.token_hex(4)}",
                16,
                600,
                model=model,
            )
            for i, model in enumerate(models)
        ]
        results = []
        for call in calls:
            results.append(call.result())
            journey.zero_mark("first answer")
        lines = streamed.result()
    journey.zero_mark("all answered")
    assert [status for status, _ in results] == [200] * len(models), results
    # the engine's own answers (a random model's text may all be reasoning, so no content is asked for)
    assert [b["model"] for _, b in results] == models, results
    assert all(b["usage"]["completion_tokens"] > 0 for _, b in results)
    stream_status = lines[0][1]
    comments = [t for t, line in lines if line.startswith(":")]
    data = [(t, line) for t, line in lines if line.startswith("data:")]
    assert stream_status == "200" and data and data[-1][1] == "data: [DONE]", lines[:3] + lines[-3:]
    assert len(comments) >= 2 and max(comments) < data[0][0], "keep-alive comments, then the tokens"
    assert json.loads(data[0][1].removeprefix("data: "))["model"] == MODEL

    time.sleep(2)  # the audit log is written as requests complete
    writes = _scale_writes(journey, sent)
    summary = [(w["user"]["username"], w.get("userAgent", ""), w["verb"]) for w in writes]
    assert len(writes) == 1, f"one scale-up expected, got {summary}"
    (up,) = writes
    assert up["user"]["username"] == keda.OPERATOR_USER and up["userAgent"].startswith("keda"), summary
    journey.zero_mark("scale-up to 1 written", up["time"])
    journey.scaler = f"{up['user']['username']} ({up['userAgent']})"
    (engine,) = journey.engines()
    assert engine["spec"]["nodeName"] == NODE_NAME
    journey.zero_mark("engine pod scheduled", serving.pod_condition_time(engine, "PodScheduled"))
    journey.zero_mark("engine ready", serving.pod_condition_time(engine, "Ready"))
    replicas = [s[1] for s in journey.states if s[0] >= sent]
    assert max(replicas) == 1, journey.states  # KEDA's HPA, reading 8 held of 16, asked for no second one

    serving_seen = wait_until(
        lambda: journey.first("Serving", sent), 60, "ScaledToZero Serving after the wake", interval=1
    )
    waking = journey.first("Waking", sent)
    assert waking is not None and waking <= serving_seen, journey.states
    journey.zero_mark("ScaledToZero Waking", waking)
    journey.zero_mark("ScaledToZero Serving", serving_seen)
    assert journey.condition("Ready")["status"] == "True"
    _zero_report(journey)


NO_CACHE = "no-cache"
#: A short hold for the deployment whose engines cannot start: long enough for KEDA to wake one (a new
#: gateway pod's series reach Prometheus in about 20 s here, then KEDA's 10 s poll).
HOLD_SECONDS = 45


def test_with_no_engine_able_to_start_held_requests_get_the_json_503_at_the_bound(journey: Journey) -> None:
    """A deployment at zero whose model cache does not exist: the woken engine pod cannot start, so a held
    request gets the JSON 503 at holdSeconds and a held stream its keep-alive comments, then an error event
    and the end of the stream; neither hangs. Its gateway holds two requests (maxHeldRequests 2), both
    taken by team-a's key: team-b's request is still held, in the place of team-a's newest, which gets the
    JSON 503 `overloaded` at once (issue 39 item 9, through the gateway pod and its mounted keys)."""
    keys = {team: f"sk-{secrets.token_urlsafe(24)}" for team in ("team-a", "team-b")}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{NO_CACHE}-keys", "namespace": NAMESPACE},
        "stringData": keys,
    }
    journey.cluster.kubectl("apply", "-f", "-", input=json.dumps(secret))
    body = serving.dev_qwendeployment(name=NO_CACHE, namespace=NAMESPACE)
    spec = body["spec"]
    spec.pop("replicas", None)
    spec["model"]["cache"]["claimName"] = "no-such-cache"
    spec["gateway"]["apiKeysSecret"] = secret["metadata"]["name"]
    spec["autoscaling"] = {
        "driver": "keda",
        "prometheusAddress": PROMETHEUS,
        "minReplicas": 0,
        "maxReplicas": 1,
        "scaleToZero": {"idleSeconds": IDLE_SECONDS, "holdSeconds": HOLD_SECONDS, "maxHeldRequests": 2},
    }
    spec["monitoring"] = _body()["spec"]["monitoring"]  # the PodMonitor the wake is read through
    serving.apply(journey.cluster, body)
    selector = f"app.kubernetes.io/instance={NO_CACHE},{COMPONENT}=gateway"

    def gateway_ready() -> bool:
        pods = journey.get("get", "pods", "-l", selector)["items"]
        return bool(pods) and all(_condition(p, "Ready").get("status") == "True" for p in pods)

    wait_until(gateway_ready, 180, f"{NO_CACHE}'s gateway pod ready", interval=1)
    url = serving.service_url(journey.cluster, NAMESPACE, NO_CACHE)

    def listed() -> bool:  # the Service routes to the pod (its endpoints lag the pod's readiness)
        return http_get(f"{url}/v1/models", 10, _auth(keys["team-a"]), serving.CLUSTER_NETWORKS)[0] == 200

    wait_until(listed, 60, f"{NO_CACHE}'s gateway Service to answer", interval=1)
    # A new deployment's PodMonitor reaches Prometheus through prometheus-operator's configuration Secret
    # (up to a minute); until it is scraped, nothing could wake an engine.
    held = f'{recording.GATEWAY_HELD}{{namespace="{NAMESPACE}",qwendeployment="{NO_CACHE}"}}'
    wait_until(
        lambda: monitoringstack.prometheus_query(journey.cluster, held), 180, f"{NO_CACHE}'s held series", 2
    )

    def timed_chat(key: str, prompt: str) -> tuple[int, str, float]:
        sent = time.monotonic()
        status, error = serving.chat(url, key, prompt, 16, 120)
        return status, error, time.monotonic() - sent

    with ThreadPoolExecutor(3) as pool:
        streamed = pool.submit(_stream, url, keys["team-a"], "Anyone streaming?")
        time.sleep(2)  # the stream is team-a's older held request, this one its newest
        newest = pool.submit(timed_chat, keys["team-a"], "Anyone there?")
        time.sleep(2)
        other = pool.submit(timed_chat, keys["team-b"], "Anyone there for team-b?")
        evicted, evicted_error, evicted_after = newest.result()
        status, error, waited = other.result()
        lines = streamed.result()
    assert evicted == 503 and json.loads(evicted_error)["error"]["code"] == "overloaded", evicted_error
    assert evicted_after < HOLD_SECONDS / 2, evicted_after  # ended when team-b came, not at the bound
    assert status == 503, (status, error)
    assert json.loads(error)["error"]["code"] == "no_engine_available", error
    assert HOLD_SECONDS <= waited < HOLD_SECONDS + 10, waited
    comments = [line for _, line in lines if line.startswith(":")]
    data = [line for _, line in lines if line.startswith("data:")]
    assert lines[0][1] == "200" and len(comments) >= 2, lines
    assert json.loads(data[0].removeprefix("data: "))["error"]["code"] == "no_engine_available", lines
    assert data[-1] == "data: [DONE]", lines
    # KEDA woke one engine meanwhile, which cannot start: its volume's claim does not exist.
    (engine,) = journey.get("get", "pods", "-l", f"app.kubernetes.io/instance={NO_CACHE},{COMPONENT}=engine")[
        "items"
    ]
    assert engine["status"]["phase"] == "Pending", engine["status"]
    unscheduled = _condition(engine, "PodScheduled")
    assert 'persistentvolumeclaim "no-such-cache" not found' in unscheduled.get("message", ""), unscheduled
    print(
        f"\n[scale-to-zero] {NO_CACHE}: team-a's newest held request ended 503 overloaded after "
        f"{evicted_after:.1f} s when team-b's came; team-b's 503 after {waited:.1f} s (holdSeconds "
        f"{HOLD_SECONDS}), the stream got {len(comments)} comment(s) then its error event; the woken "
        f"engine pod: {unscheduled['message']}"
    )
    journey.cluster.kubectl("-n", NAMESPACE, "delete", "qwd", NO_CACHE, "--wait=false")


def test_after_the_last_answer_keda_waits_the_idle_period_then_scales_to_zero(journey: Journey) -> None:
    """(The clock runs from the wake's last answer, through the test before.) The answers keep the traffic
    trigger active for its window, KEDA then waits idleSeconds and scales the engines to 0; the gateway
    still lists the models. Meanwhile requests the gateway refuses (no API key, a wrong one) arrive every
    few seconds: they keep nothing up (the traffic trigger counts admitted answers only)."""
    last = journey.zero_marks["all answered"]
    stop = threading.Event()
    refused: list[int] = []

    def knock() -> None:
        while not stop.wait(3):
            for headers in ({}, _auth("sk-not-a-key-of-this-gateway")):
                refused.append(_post_status(f"{journey.url}/v1/chat/completions", headers))

    knocker = threading.Thread(target=knock, daemon=True)
    knocker.start()
    try:
        wait_until(
            lambda: journey.replicas() == 0,
            TRAFFIC_WINDOW_SECONDS + IDLE_SECONDS + 120,
            "KEDA to scale the engines to 0 after the idle period, with refused requests arriving",
            interval=2,
        )
    finally:
        stop.set()
        knocker.join(timeout=30)
    assert len(refused) >= 10 and set(refused) == {401}, refused
    (down,) = _scale_writes(journey, last)
    assert down["user"]["username"] == keda.OPERATOR_USER, down
    # The answers keep the traffic trigger active for its window (from the scrape that first saw them, at
    # most 5 s later), KEDA then waits idleSeconds after its last poll (every 10 s) that saw it.
    assert down["time"] - last >= TRAFFIC_WINDOW_SECONDS + IDLE_SECONDS - 10, down["time"] - last
    journey.zero_mark("idle scale-down to 0 written", down["time"])
    _wait_idle(journey, down["time"])
    status, text = http_get(f"{journey.url}/v1/models", 10, _auth(journey.key), serving.CLUSTER_NETWORKS)
    assert status == 200 and MODEL in {m["id"] for m in json.loads(text)["data"]}, (status, text)
    print(f"\n[scale-to-zero] idle scale-down {down['time'] - last:.0f} s after the last answer")
    _zero_report(journey)


def test_from_zero_to_the_hpa_serves_again_and_leaves_nothing_of_scale_to_zero(journey: Journey) -> None:
    """From zero (the idle test) to `driver: hpa, minReplicas: 1`: an HPA does nothing while its target is
    at 0, so the operator lifts the engines to 1 (issue 39 item 3; before: 0 replicas and a gateway
    without the activator, every request a 503, indefinitely). The status then carries nothing of scale
    to zero."""
    journey.patch({"autoscaling": {"minReplicas": 1, "driver": "hpa", "scaleToZero": None}})

    def settled() -> dict[str, Any] | None:
        obj = journey.qwd()
        status = obj.get("status", {})
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and _condition(obj, "Ready").get("status") == "True" else None

    obj = wait_until(settled, 300, "the status of minReplicas 1, Ready", interval=1)
    status = obj["status"]
    types = [c["type"] for c in status["conditions"]]
    assert types == [*CONDITION_TYPES, "AdaptersLoaded"], types  # ScaledToZero gone, the adapter stays
    assert all(c["observedGeneration"] == obj["metadata"]["generation"] for c in status["conditions"])
    assert "scaleToZero" not in status["plan"], status["plan"]
    assert not [w for w in status["plan"].get("warnings", []) if "no engine runs" in w], status["plan"]
    assert _condition(obj, "Ready")["reason"] == "Serving"
    assert not journey.cluster.kubectl("-n", NAMESPACE, "get", "scaledobject", "-o", "name").stdout.strip()
    assert journey.get("get", "hpa", ENGINE)["spec"]["minReplicas"] == 1
    assert journey.replicas() == 1
    status_code, _ = http_get(f"{journey.url}/v1/models", 10, _auth(journey.key), serving.CLUSTER_NETWORKS)
    assert status_code == 200
    assert _post_status(f"{journey.url}/v1/chat/completions", _auth(journey.key)) == 200


# --- 6. a deployment of its own --------------------------------------------------------------------------


def test_missing_api_key_secret_leaves_the_gateway_pod_waiting(journey: Journey) -> None:
    body = serving.dev_qwendeployment(name="no-keys", namespace=NAMESPACE)
    body["spec"]["replicas"] = 0  # no engine needed to see the gateway wait
    serving.apply(journey.cluster, body)

    def waiting_for_the_secret() -> bool:
        pods = journey.pods(f"app.kubernetes.io/instance=no-keys,{COMPONENT}=gateway")
        if not pods:
            return False
        events = journey.get(
            "get", "events", "--field-selector",
            f"involvedObject.name={pods[0]['metadata']['name']},reason=FailedMount",
        )["items"]  # fmt: skip
        return pods[0]["status"]["phase"] == "Pending" and any(
            re.search(r'secret "no-keys-api-keys" not found', e["message"]) for e in events
        )

    wait_until(waiting_for_the_secret, 120, "the gateway pod waiting for its API-key Secret", interval=2)

    # The status names the Secret and the field (from kubelet's FailedMount event: no Secret is read).
    def reported() -> dict[str, Any] | None:
        conditions = {c["type"]: c for c in journey.qwd("no-keys").get("status", {}).get("conditions", [])}
        return conditions if conditions.get("ReferencesResolved", {}).get("status") == "False" else None

    conditions = wait_until(reported, 90, "ReferencesResolved=False", interval=2)
    assert conditions["ReferencesResolved"]["message"] == (
        f"Secret {NAMESPACE}/no-keys-api-keys (spec.gateway.apiKeysSecret) does not exist: create it"
    )
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "MissingReference"), ready
    journey.cluster.kubectl("-n", NAMESPACE, "delete", "qwd", "no-keys", "--wait=false")
