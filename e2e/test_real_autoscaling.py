"""Monitoring and queue-depth autoscaling, the whole loop on the dev cluster's real node with nothing
simulated:

real CPU vLLM engines (tiny model) behind the real gateway; Prometheus (run by prometheus-operator from
the monitors the qwen-operator created) scraping them; prometheus-adapter serving the recorded queue
depth through custom.metrics.k8s.io to the real kube-controller-manager's HPA controller. Load through
the gateway makes requests queue in the engine; the HPA raises the engine Deployment's replicas, the
scheduler places the new pod on the real node, the engine starts and the router sends it traffic; the
load stops and the HPA scales back after its stabilisation window.

The gateway's pass-through limit is asked to be 4, below minReplicas x maxNumSeqs (8): the operator
raises it to the engines' capacity (with a warning) so the queue stays where the HPA sees it.

First the signal path alone, at one replica: Prometheus runs on the real node and scrapes exactly what
the operator's monitors select, the recorded queue depth exists, and the custom metrics API serves it.

The timeline (load start, queue above target, HPA decision, new pod scheduled, engine ready, first
request served by it, load stop, scale-down) is printed and written to .devcluster/
autoscaling-timeline.json; `python tools/plot_autoscaling.py FILE` draws it (docs/autoscaling.md).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from qwen_devtools import monitoringstack, serving
from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster.nodecomponents import NODE_NAME
from qwen_devtools.operator_proc import deployment_writes
from qwen_devtools.wait import wait_until
from qwen_operator import recording
from qwen_operator.api.review import review
from qwen_operator.manifests import ClusterFacts, build_children

pytestmark = [pytest.mark.cluster, pytest.mark.real_node, pytest.mark.engine]

NAMESPACE = "e2e-autoscaling"
NAME = "chat-hpa"
ENGINE = f"{NAME}-engine"
ENGINE_SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=engine"
TARGET_QUEUE_DEPTH = 2
MAX_REPLICAS = 2
#: Clients sending requests back to back: more than the engine's batch (maxNumSeqs 8), so about 4 wait.
CLIENTS = 12
#: Once the new engine is ready, a light load (no queue) that the router spreads over both engines. The
#: load stops from the HPA's decision until then: on these 2 cores a busy CPU engine (its OpenMP
#: threads spin on both cores) starves a starting one, and Prometheus, for many minutes; on GPUs the
#: new engine starts on its own accelerators.
LIGHT_CLIENTS = 3
#: Short windows so that one run sees a scale-up and a scale-down in minutes (defaults: docs/autoscaling.md).
#: The scale-down window covers the new engine's start (40-100 s here) after the queue emptied.
BEHAVIOR = {"scaleUpPeriodSeconds": 15, "scaleDownStabilizationSeconds": 180, "scaleDownPeriodSeconds": 15}
SAMPLE_SECONDS = 3.0
METRIC_TIMEOUT = 120.0
TIMELINE = Path(__file__).resolve().parents[1] / ".devcluster" / "autoscaling-timeline.json"
HPA_CONTROLLER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"


@dataclass
class Sample:
    t: float
    replicas: int
    ready: int
    queue: float | None  # sum of qwen_engine:queue_depth over the deployment's engines
    pods_with_queue: int


@dataclass
class Loop:
    cluster: devcluster.Cluster
    key: str
    url: str
    #: The monitors and rule the operator renders for the deployment (what Prometheus must load).
    rendered: list[dict[str, Any]]
    samples: list[Sample] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)
    _stop_sampling: threading.Event = field(default_factory=threading.Event)

    def get(self, *args: str) -> Any:
        return serving.get_json(self.cluster, "-n", NAMESPACE, *args)

    def engines(self) -> list[dict[str, Any]]:
        return loop_engines(self.cluster)

    def qwd(self) -> dict[str, Any]:
        return dict(self.get("get", "qwd", NAME))

    def condition(self, kind: str) -> dict[str, Any]:
        conditions = self.qwd().get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == kind), {})

    def mark(self, what: str, at: float | None = None) -> None:
        self.marks.setdefault(what, time.time() if at is None else at)

    def sample_forever(self) -> None:
        query = f"{recording.ENGINE_QUEUE_DEPTH}{{{recording.scope(NAMESPACE, NAME)}}}"
        while not self._stop_sampling.is_set():
            try:
                dep = self.get("get", "deployment", ENGINE)
                series = monitoringstack.prometheus_query(self.cluster, query)
                queue = sum(float(s["value"][1]) for s in series) if series else None
                self.samples.append(
                    Sample(
                        time.time(),
                        dep["spec"].get("replicas", 0),
                        dep.get("status", {}).get("readyReplicas", 0),
                        queue,
                        len(series),
                    )
                )
                if queue is not None and series and queue / len(series) > TARGET_QUEUE_DEPTH:
                    self.mark("queue above target")
            except Exception as exc:  # a slow API call under load: keep sampling
                print(f"[autoscaling] sample failed: {exc}")
            self._stop_sampling.wait(SAMPLE_SECONDS)

    def timeline(self) -> list[tuple[float, str]]:
        start = self.marks["load start"]
        return sorted((t - start, what) for what, t in self.marks.items())

    def write(self, path: Path) -> None:
        start = self.marks["load start"]
        path.write_text(
            json.dumps(
                {
                    "marks": {what: round(t - start, 1) for what, t in self.marks.items()},
                    "samples": [
                        {
                            "t": round(s.t - start, 1),
                            "replicas": s.replicas,
                            "ready": s.ready,
                            "queue": s.queue,
                        }
                        for s in self.samples
                    ],
                    "targetQueueDepth": TARGET_QUEUE_DEPTH,
                    "maxReplicas": MAX_REPLICAS,
                    "clients": CLIENTS,
                },
                indent=1,
            )
        )


class Load:
    """Client threads sending chat completions through the gateway back to back until stopped."""

    def __init__(self, loop: Loop, clients: int, name: str) -> None:
        self.loop = loop
        self.name = name
        self.stop = threading.Event()
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        while not self.stop.is_set():
            try:
                status, _ = serving.chat(
                    self.loop.url, self.loop.key, secrets.token_hex(8), max_tokens=64, timeout=300
                )
            except Exception:
                status = -1
            with self.lock:
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def __enter__(self) -> Load:
        self.loop.mark(f"{self.name} start")
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.loop.mark(f"{self.name} stop")
        for t in self.threads:
            t.join(timeout=330)


@pytest.fixture(scope="module")
def loop(real_cluster: devcluster.Cluster) -> Iterator[Loop]:
    assert real_cluster.name
    body = serving.dev_qwendeployment(name=NAME, namespace=NAMESPACE)
    spec = body["spec"]
    spec.pop("replicas", None)
    spec["parallelism"]["tensor"] = 1  # two engines at once on 2 cores (see test_real_serving.py)
    spec["engine"]["extraArgs"] = ["--enforce-eager"]
    spec["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": MAX_REPLICAS,
        "targetQueueDepth": TARGET_QUEUE_DEPTH,
        "behavior": BEHAVIOR,
    }
    spec["gateway"]["maxConcurrentRequests"] = 4  # below minReplicas x maxNumSeqs: raised by the operator
    # The load is the engine queue's, not one client over its rate: on a fast machine 12 clients back to
    # back pass the default 600 requests a minute of their one key (CI saw 423 answers 429 to 279 200s).
    spec["gateway"]["rateLimit"] = {"requestsPerMinute": 60_000, "burst": 1_000}
    spec["monitoring"] = {"serviceMonitor": True, "prometheusRule": True, "interval": "5s"}
    rendered = build_children(review(body), ClusterFacts()).objects
    rule = next(c for c in rendered if c["kind"] == "PrometheusRule")
    serving.load_images(real_cluster.name)
    monitoringstack.up(real_cluster, rendered_rule=rule)
    serving.install_operator(real_cluster)
    serving.prepare_namespace(real_cluster, NAMESPACE)
    serving.model_cache(real_cluster, NAMESPACE, spec["model"]["cache"]["claimName"])
    key = serving.api_key_secret(real_cluster, NAMESPACE, spec["gateway"]["apiKeysSecret"])
    serving.apply(real_cluster, body)
    serving.wait_serving(real_cluster, NAMESPACE, NAME)
    monitors = [c for c in rendered if c["kind"] in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}]
    stack = Loop(real_cluster, key, serving.service_url(real_cluster, NAMESPACE, NAME), monitors)
    sampler = threading.Thread(target=stack.sample_forever, daemon=True)
    sampler.start()
    yield stack
    stack._stop_sampling.set()
    sampler.join(timeout=30)
    real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    with contextlib.suppress(TimeoutError):  # engines stop within seconds; do not fail the tests on it
        wait_until(lambda: not loop_engines(real_cluster), 120, "the engine pods gone", interval=3)
    serving.uninstall_operator(real_cluster)
    monitoringstack.down(real_cluster, crds=True)


def loop_engines(cluster: devcluster.Cluster) -> list[dict[str, Any]]:
    items = serving.get_json(cluster, "-n", NAMESPACE, "get", "pods", "-l", ENGINE_SELECTOR)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


# --- the signal path, at one replica -----------------------------------------------------------------


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


def test_prometheus_runs_on_the_real_node_and_scrapes_exactly_what_the_monitors_select(loop: Loop) -> None:
    pod = serving.get_json(
        loop.cluster,
        "-n",
        monitoringstack.NAMESPACE,
        "get",
        "pod",
        f"prometheus-{monitoringstack.PROMETHEUS_NAME}-0",
    )
    assert pod["spec"]["nodeName"] == NODE_NAME and pod["status"]["phase"] == "Running"
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    assert images["prometheus"] == monitoringstack.PROMETHEUS_IMAGE
    expected = _expected_scrape_pools(loop.rendered)
    (engine_pod,) = loop.engines()

    def engine_scraped_up() -> list[dict[str, Any]] | None:
        targets = monitoringstack.prometheus_targets(loop.cluster)
        engine = [t for t in targets if t["labels"].get("pod") == engine_pod["metadata"]["name"]]
        return targets if engine and all(t["health"] == "up" for t in engine) else None

    targets = wait_until(engine_scraped_up, METRIC_TIMEOUT, "the engine pod scraped and up", interval=2)
    assert {t["scrapePool"] for t in targets} == expected, targets
    engine = [t for t in targets if t["scrapePool"].startswith("serviceMonitor/")]
    ip = engine_pod["status"]["podIP"]
    assert engine and all(t["scrapeUrl"].startswith(f"http://{ip}:") for t in engine), engine


def test_engine_series_and_the_recorded_queue_depth_are_in_prometheus(loop: Loop) -> None:
    (engine_pod,) = loop.engines()
    pod = engine_pod["metadata"]["name"]
    waiting = monitoringstack.prometheus_query(
        loop.cluster, f'vllm:num_requests_waiting{{namespace="{NAMESPACE}"}}'
    )
    assert {s["metric"]["pod"] for s in waiting} == {pod}, waiting

    def recorded() -> list[dict[str, Any]]:
        query = f'{monitoringstack.QUEUE_RECORD}{{namespace="{NAMESPACE}"}}'
        return monitoringstack.prometheus_query(loop.cluster, query)

    series = wait_until(recorded, METRIC_TIMEOUT, f"{monitoringstack.QUEUE_RECORD} recorded", interval=2)
    assert {s["metric"]["pod"] for s in series} == {pod}, series


def test_custom_metrics_api_serves_the_engines_queue_depth(loop: Loop) -> None:
    (engine_pod,) = loop.engines()
    pod = engine_pod["metadata"]["name"]

    def served() -> dict[str, Any] | None:
        metrics = monitoringstack.custom_metric(loop.cluster, NAMESPACE)
        return metrics if metrics and metrics.get("items") else None

    metrics = wait_until(served, METRIC_TIMEOUT, f"{monitoringstack.QUEUE_CUSTOM_METRIC} served", interval=2)
    (item,) = metrics["items"]
    described = item["describedObject"]
    assert (described["kind"], described["namespace"], described["name"]) == ("Pod", NAMESPACE, pod)
    assert item["metricName"] == monitoringstack.QUEUE_CUSTOM_METRIC  # v1beta1's field (v1beta2: metric.name)
    value = item["value"]  # a quantity: "0", "2", "1500m"
    assert (float(value[:-1]) / 1000 if value.endswith("m") else float(value)) >= 0
    print(f"\n[monitoring] {pod}: {item['value']}")


# --- the loop ----------------------------------------------------------------------------------------


def test_scaling_ready_once_the_hpa_reads_the_adapters_metric(loop: Loop) -> None:
    ready = wait_until(
        lambda: (c := loop.condition("ScalingReady")).get("status") == "True" and c,
        180,
        "ScalingReady=True",
        interval=3,
    )
    assert ready["reason"] == "MetricAvailable", ready
    hpa = loop.get("get", "hpa", ENGINE)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == recording.ADAPTER_METRIC
    active = next(c for c in hpa["status"]["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("True", "ValidMetricFound"), active
    status = loop.qwd()["status"]
    assert status["autoscaling"]["targetQueueDepth"] == TARGET_QUEUE_DEPTH
    assert any("spec.gateway.maxConcurrentRequests" in w for w in status["plan"]["warnings"]), status["plan"]


def test_queue_growth_scales_out_and_the_new_engine_serves_then_it_scales_back(loop: Loop) -> None:
    (first,) = loop.engines()
    with Load(loop, CLIENTS, "load") as load:
        wait_until(lambda: "queue above target" in loop.marks, 180, "the queue above target", interval=1)
        wait_until(
            lambda: loop.get("get", "deployment", ENGINE)["spec"]["replicas"] == MAX_REPLICAS,
            240,
            f"the HPA to raise replicas to {MAX_REPLICAS}",
            interval=1,
        )
        dep = loop.get("get", "deployment", ENGINE, "--show-managed-fields")
        hpa = loop.get("get", "hpa", ENGINE)
        loop.mark("HPA decision", serving.timestamp(hpa["status"]["lastScaleTime"]))
        queue_seen = max((s.queue or 0) for s in loop.samples)
        statuses = dict(load.statuses)
    # No load while the new engine starts (see LIGHT_CLIENTS), then a light one the router spreads.
    (second,) = wait_until(
        lambda: [p for p in loop.engines() if p["metadata"]["uid"] != first["metadata"]["uid"]],
        60,
        "the new engine pod",
    )
    ready = wait_until(
        lambda: (p := _pod(loop, second)) and serving.pod_condition_time(p, "Ready"),
        240,
        "the new engine Ready",
        2,
    )
    second = _pod(loop, second)
    assert second["spec"]["nodeName"] == NODE_NAME
    loop.mark("new pod scheduled", serving.pod_condition_time(second, "PodScheduled"))
    loop.mark("engine ready", ready)
    with Load(loop, LIGHT_CLIENTS, "light load") as light:
        wait_until(lambda: _served(second), 120, "a request served by the new engine", interval=1)
        loop.mark("first request served by it")
        light_statuses = dict(light.statuses)
    assert statuses.get(200, 0) > 0 and set(statuses) == {200}, statuses
    assert set(light_statuses) <= {200}, light_statuses
    assert queue_seen > TARGET_QUEUE_DEPTH

    # The replica change was the HPA controller's: the API server's audit log names its service account
    # (kube-controller-manager runs each controller under its own) as the only writer of deployments/scale,
    # and no other field manager (the operator, the test) owns spec.replicas.
    writers = _scale_writers(loop.cluster)
    assert writers == {HPA_CONTROLLER}, writers
    owners = [
        m["manager"]
        for m in dep["metadata"].get("managedFields", [])
        if "f:replicas" in json.dumps(m.get("fieldsV1", {}).get("f:spec", {}))
    ]
    assert set(owners) <= {"kube-controller-manager"}, owners

    # No load: the queue is empty, and after the stabilisation window the HPA removes the replica.
    wait_until(
        lambda: loop.get("get", "deployment", ENGINE)["spec"]["replicas"] == 1,
        BEHAVIOR["scaleDownStabilizationSeconds"] + 120,
        "the HPA to scale back to 1",
        interval=1,
    )
    loop.mark("scale-down", serving.timestamp(loop.get("get", "hpa", ENGINE)["status"]["lastScaleTime"]))
    time.sleep(SAMPLE_SECONDS * 2)  # a last sample or two at one replica
    path = TIMELINE  # outside the cluster's directory, which `down` removes
    path.parent.mkdir(parents=True, exist_ok=True)
    loop.write(path)
    print("\n[autoscaling] timeline (seconds from load start):")
    for t, what in loop.timeline():
        print(f"[autoscaling] {t:7.1f}  {what}")
    print(f"[autoscaling] written to {path}")


def test_stopping_the_adapter_makes_scaling_not_ready_with_the_reason(loop: Loop) -> None:
    loop.cluster.kubectl(
        "-n", monitoringstack.NAMESPACE, "scale", "deployment", monitoringstack.ADAPTER, "--replicas=0"
    )
    broken = wait_until(
        lambda: (c := loop.condition("ScalingReady")).get("status") == "False" and c,
        180,
        "ScalingReady=False after the adapter stopped",
        interval=3,
    )
    assert broken["reason"] in ("MetricsAPIUnavailable", "FailedGetPodsMetric"), broken
    print(f"\n[autoscaling] adapter stopped: ScalingReady=False {broken['reason']}: {broken['message']}")


# --- helpers -----------------------------------------------------------------------------------------


def _pod(loop: Loop, pod: dict[str, Any]) -> dict[str, Any]:
    return dict(loop.get("get", "pod", pod["metadata"]["name"]))


def _served(pod: dict[str, Any]) -> bool:
    ip = pod.get("status", {}).get("podIP")
    if not ip:
        return False
    status, text = serving.pod_get(f"http://{ip}:8000/metrics")
    return status == 200 and any(
        line.startswith("vllm:request_success_total{") and float(line.rsplit(" ", 1)[1]) > 0
        for line in text.splitlines()
    )


def _scale_writers(cluster: devcluster.Cluster) -> set[str]:
    writes = deployment_writes(cluster, NAMESPACE, ENGINE)
    return {w["user"]["username"] for w in writes if w["objectRef"].get("subresource") == "scale"}
