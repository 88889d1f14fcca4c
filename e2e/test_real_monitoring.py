"""The monitoring stack really running on the dev cluster's real node, scraping a really served engine:

prometheus-operator runs Prometheus (both built from their Go modules) as a pod on the real node,
configured from the ServiceMonitor and PodMonitor the qwen-operator created for a served
QwenDeployment and from its rules; prometheus-adapter serves the recorded queue depth of each engine pod
through the aggregated custom metrics API, where the HPA controller reads it. Nothing is simulated: the
numbers come from the engine's own /metrics.

One served deployment (TP 1, eager, as in test_real_serving.py), the stack installed before the
operator so that its first reconcile already sees the CRDs; the stack and its CRDs are removed at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from qwen_devtools import monitoringstack, serving
from qwen_devtools.devcluster import cluster as devcluster
from qwen_devtools.devcluster.nodecomponents import NODE_NAME
from qwen_devtools.wait import wait_until
from qwen_operator.api.review import review
from qwen_operator.manifests import ClusterFacts, build_children

pytestmark = [pytest.mark.cluster, pytest.mark.real_node, pytest.mark.engine]

NAMESPACE = "e2e-monitoring"
NAME = "chat-mon"
ENGINE_SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=engine"
#: Scrape interval of the deployment's monitors: the tests wait for a few scrapes.
INTERVAL = "5s"
METRIC_TIMEOUT = 120.0


@dataclass
class Monitored:
    cluster: devcluster.Cluster
    key: str
    url: str
    #: The monitors and rule the operator renders for the deployment (what Prometheus must load).
    rendered: list[dict[str, Any]]
    seconds_to_stack: float

    def engine_pod(self) -> dict[str, Any]:
        pods = serving.get_json(self.cluster, "-n", NAMESPACE, "get", "pods", "-l", ENGINE_SELECTOR)["items"]
        (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return dict(pod)


@pytest.fixture(scope="module")
def monitored(real_cluster: devcluster.Cluster) -> Iterator[Monitored]:
    assert real_cluster.name
    body = serving.dev_qwendeployment(name=NAME, namespace=NAMESPACE)
    body["spec"]["parallelism"]["tensor"] = 1
    body["spec"]["engine"]["extraArgs"] = ["--enforce-eager"]
    body["spec"]["monitoring"] = {"serviceMonitor": True, "prometheusRule": True, "interval": INTERVAL}
    rendered = [
        c
        for c in build_children(review(body), ClusterFacts()).objects
        if c["kind"] in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    ]
    rule = next((c for c in rendered if c["kind"] == "PrometheusRule"), None)
    serving.load_images(real_cluster.name)
    started = time.monotonic()
    monitoringstack.up(real_cluster, rendered_rule=rule)
    seconds_to_stack = time.monotonic() - started
    serving.install_operator(real_cluster)
    serving.prepare_namespace(real_cluster, NAMESPACE)
    serving.model_cache(real_cluster, NAMESPACE, body["spec"]["model"]["cache"]["claimName"])
    key = serving.api_key_secret(real_cluster, NAMESPACE, body["spec"]["gateway"]["apiKeysSecret"])
    serving.apply(real_cluster, body)
    serving.wait_serving(real_cluster, NAMESPACE, NAME)
    url = serving.service_url(real_cluster, NAMESPACE, NAME)
    yield Monitored(real_cluster, key, url, rendered, seconds_to_stack)
    real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    serving.uninstall_operator(real_cluster)
    monitoringstack.down(real_cluster, crds=True)


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
    monitored: Monitored,
) -> None:
    cluster = monitored.cluster
    pod = serving.get_json(
        cluster,
        "-n",
        monitoringstack.NAMESPACE,
        "get",
        "pod",
        f"prometheus-{monitoringstack.PROMETHEUS_NAME}-0",
    )
    assert pod["spec"]["nodeName"] == NODE_NAME and pod["status"]["phase"] == "Running"
    images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
    assert images["prometheus"] == monitoringstack.PROMETHEUS_IMAGE
    expected = _expected_scrape_pools(monitored.rendered)
    engine_ip = monitored.engine_pod()["status"]["podIP"]

    def engine_scraped_up() -> list[dict[str, Any]] | None:
        targets = monitoringstack.prometheus_targets(cluster)
        engine = [t for t in targets if t["labels"].get("pod") == monitored.engine_pod()["metadata"]["name"]]
        return targets if engine and all(t["health"] == "up" for t in engine) else None

    targets = wait_until(engine_scraped_up, METRIC_TIMEOUT, "the engine pod scraped and up", interval=2)
    assert {t["scrapePool"] for t in targets} == expected, targets
    engine = [t for t in targets if t["scrapePool"].startswith("serviceMonitor/")]
    assert engine and all(t["scrapeUrl"].startswith(f"http://{engine_ip}:") for t in engine), engine


def test_engine_series_and_the_recorded_queue_depth_are_in_prometheus(monitored: Monitored) -> None:
    pod = monitored.engine_pod()["metadata"]["name"]
    waiting = monitoringstack.prometheus_query(
        monitored.cluster, f'vllm:num_requests_waiting{{namespace="{NAMESPACE}"}}'
    )
    assert {s["metric"]["pod"] for s in waiting} == {pod}, waiting

    def recorded() -> list[dict[str, Any]]:
        query = f'{monitoringstack.QUEUE_RECORD}{{namespace="{NAMESPACE}"}}'
        return monitoringstack.prometheus_query(monitored.cluster, query)

    series = wait_until(recorded, METRIC_TIMEOUT, f"{monitoringstack.QUEUE_RECORD} recorded", interval=2)
    assert {s["metric"]["pod"] for s in series} == {pod}, series


def test_custom_metrics_api_serves_the_engines_queue_depth(monitored: Monitored) -> None:
    pod = monitored.engine_pod()["metadata"]["name"]

    def served() -> dict[str, Any] | None:
        metrics = monitoringstack.custom_metric(monitored.cluster, NAMESPACE)
        return metrics if metrics and metrics.get("items") else None

    metrics = wait_until(served, METRIC_TIMEOUT, f"{monitoringstack.QUEUE_CUSTOM_METRIC} served", interval=2)
    (item,) = metrics["items"]
    described = item["describedObject"]
    assert (described["kind"], described["namespace"], described["name"]) == ("Pod", NAMESPACE, pod)
    assert item["metricName"] == monitoringstack.QUEUE_CUSTOM_METRIC  # v1beta1's field (v1beta2: metric.name)
    value = item["value"]  # a quantity: "0", "2", "1500m"
    assert (float(value[:-1]) / 1000 if value.endswith("m") else float(value)) >= 0
    print(f"\n[monitoring] stack up in {monitored.seconds_to_stack:.0f}s; {pod}: {item['value']}")
