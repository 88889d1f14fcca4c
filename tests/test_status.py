"""The status function: conditions and reasons for every situation users must be able to tell apart."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from qwen_operator.adapters import AdapterState, LoraObservation
from qwen_operator.api.crd import crd
from qwen_operator.api.review import Review, review
from qwen_operator.kinds import Skipped, kind_of
from qwen_operator.status import (
    CONDITION_TYPES,
    Event,
    Observed,
    TierObservation,
    compute_status,
    events,
    merge_patch,
    transitions,
)
from support import example

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def deployment(replicas: int, ready: int, updated: int | None = None, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": generation,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
        },
    }


def reviewed(name: str = "a100-80gb-tp2-bf16", **spec: Any) -> Review:
    """The review of an example, with top-level spec fields replaced."""
    body = example(name)
    body["spec"].update(spec)
    return review(body)


def serving(**extra: Any) -> Observed:
    base = dict(
        generation=3,
        review=reviewed(),
        endpoint="http://chat.llm.svc/v1",
        engine=deployment(2, 2),
        gateway=deployment(2, 2),
        pods=[
            {
                "metadata": {"name": "p"},
                "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
            }
        ],
    )
    return Observed(**(base | extra))


def test_serving_is_ready_with_every_condition_present() -> None:
    status = compute_status(serving(), None, T0)
    assert [c["type"] for c in status["conditions"]] == list(CONDITION_TYPES)
    assert cond(status, "Ready")["status"] == "True"
    assert cond(status, "Progressing")["reason"] == "RolloutComplete"
    assert status["phase"] == "Ready" and status["replicasSummary"] == "2/2"
    assert status["observedGeneration"] == 3


def test_the_crd_documents_every_condition() -> None:
    described = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    text = described["properties"]["conditions"]["description"]
    assert [t for t in CONDITION_TYPES if t not in text] == []


def test_invalid_spec() -> None:
    status = compute_status(Observed(generation=1, spec_errors=["spec.engine.foo: unknown field"]), None, T0)
    assert (cond(status, "ConfigValid")["status"], cond(status, "Ready")["reason"]) == (
        "False",
        "InvalidSpec",
    )
    assert status["phase"] == "Invalid"


def test_does_not_fit() -> None:
    too_small = reviewed(gpu={"type": "A100-40GB"}, parallelism={"tensor": 1})
    assert not too_small.ok
    status = compute_status(Observed(generation=1, review=too_small), None, T0)
    assert cond(status, "CapacityFit")["status"] == "False"
    assert cond(status, "Ready")["reason"] == "DoesNotFit"
    assert (cond(status, "ConfigValid")["status"], cond(status, "ConfigValid")["reason"]) == ("True", "Valid")


def _engine(**engine: Any) -> Review:
    body = example("a100-80gb-tp2-bf16")
    body["spec"]["engine"] = engine
    return review(body)


def test_refused_extra_args_are_a_config_problem() -> None:
    status = compute_status(Observed(generation=2, review=_engine(extraArgs=["--port", "9000"])), None, T0)
    config = cond(status, "ConfigValid")
    assert (config["status"], config["reason"]) == ("False", "InvalidSpec")
    assert config["message"] == (
        "spec.engine.extraArgs[0]: --port is set by the operator (the engine listens on 8000 for the "
        "gateway and probes); remove it"
    )
    assert (cond(status, "CapacityFit")["status"], cond(status, "CapacityFit")["reason"]) == (
        "Unknown",
        "InvalidSpec",
    )
    ready = cond(status, "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "InvalidSpec", config["message"])
    assert status["phase"] == "Invalid"


def test_a_spec_rule_of_the_plan_is_a_config_problem() -> None:
    # TP 3 cannot divide the heads on any GPU pool: the spec is wrong, not too large.
    status = compute_status(Observed(generation=1, review=reviewed(parallelism={"tensor": 3})), None, T0)
    assert cond(status, "ConfigValid")["message"].startswith(
        "spec.parallelism.tensor: tensor parallel size 3"
    )
    assert cond(status, "CapacityFit")["status"] == "Unknown"
    assert cond(status, "Ready")["reason"] == "InvalidSpec"


def test_config_and_capacity_problems_are_both_shown() -> None:
    rev = review(
        example("a100-80gb-tp2-bf16")
        | {"spec": {"model": {"name": "Qwen/Qwen3-32B"}, "gpu": {"type": "A10-24GB"},
                    "parallelism": {"tensor": 1}, "engine": {"extraArgs": ["--trust-remote-code"]}}}
    )  # fmt: skip
    status = compute_status(Observed(generation=1, review=rev), None, T0)
    assert cond(status, "ConfigValid")["message"].startswith("spec.engine.extraArgs[0]: --trust-remote-code")
    capacity = cond(status, "CapacityFit")
    assert (capacity["status"], capacity["reason"]) == ("False", "DoesNotFit")
    assert capacity["message"].startswith("spec.gpu.type: weights need")
    assert cond(status, "Ready")["reason"] == "InvalidSpec"  # the spec is fixed first


def test_unschedulable_pod_reports_the_scheduler_reason() -> None:
    pending = {
        "metadata": {"name": "chat-engine-x"},
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/7 nodes are available: 2 Insufficient nvidia.com/gpu.",
                }
            ]
        },
    }
    status = compute_status(serving(engine=deployment(1, 0), pods=[pending]), None, T0)
    assert cond(status, "Scheduled")["status"] == "False"
    assert "Insufficient nvidia.com/gpu" in cond(status, "Scheduled")["message"]
    assert cond(status, "Ready")["reason"] == "Unschedulable"
    assert status["phase"] == "Degraded"


def test_rollout_in_progress_and_stuck() -> None:
    rolling = compute_status(serving(engine=deployment(2, 2, updated=1)), None, T0)
    assert cond(rolling, "Progressing")["status"] == "True"
    assert rolling["phase"] == "Progressing"
    stuck = deployment(2, 1, updated=1)
    stuck["status"]["conditions"] = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": "took too long",
        }
    ]
    status = compute_status(serving(engine=stuck), None, T0)
    assert cond(status, "Progressing")["reason"] == "ProgressDeadlineExceeded"


def test_gateway_not_ready() -> None:
    status = compute_status(serving(gateway=deployment(2, 0)), None, T0)
    assert cond(status, "Ready")["reason"] == "GatewayNotReady"


def test_hpa_without_metric_is_not_scaling_ready() -> None:
    hpa = {
        "status": {
            "conditions": [
                {
                    "type": "ScalingActive",
                    "status": "False",
                    "reason": "FailedGetPodsMetric",
                    "message": "unable to get metric qwen_queue_depth",
                }
            ]
        }
    }
    status = compute_status(serving(review=reviewed("h100-80gb-tp2-fp8-128k"), hpa=hpa), None, T0)
    scaling = cond(status, "ScalingReady")
    assert (scaling["status"], scaling["reason"]) == ("False", "FailedGetPodsMetric")


AVAILABLE = {"status": {"conditions": [{"type": "Available", "status": "True", "reason": "Passed"}]}}
READING_HPA = {
    "status": {
        "desiredReplicas": 2,
        "currentMetrics": [
            {
                "type": "Pods",
                "pods": {"metric": {"name": "qwen_queue_depth"}, "current": {"averageValue": "7500m"}},
            }
        ],
        "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"},
            {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"},
        ],
    }
}
ENGINE_METRIC = {"kind": "MetricValueList", "items": [{"metricName": "qwen_queue_depth", "value": "7500m"}]}


def autoscaled(**extra: Any) -> Observed:
    """Serving with the HPA example; metrics API, metric and HPA as given (default: all working)."""
    base: dict[str, Any] = dict(
        review=reviewed("h100-80gb-tp2-fp8-128k"),
        hpa=READING_HPA,
        metrics_api=AVAILABLE,
        metrics_api_read=True,
        queue_metric=ENGINE_METRIC,
        queue_metric_answered=True,
    )
    return serving(**(base | extra))


def test_hpa_reading_the_metric_is_scaling_ready_with_current_and_target_depth() -> None:
    status = compute_status(autoscaled(), None, T0)
    scaling = cond(status, "ScalingReady")
    assert (scaling["status"], scaling["reason"]) == ("True", "MetricAvailable")
    assert "7.5 waiting per pod" in scaling["message"]
    assert status["autoscaling"] == {
        "driver": "hpa",
        "metric": "qwen_queue_depth",
        "targetQueueDepth": 5,
        "targetQueueDepthSource": "spec",
        "concurrencyPerReplica": 64,
        "currentQueueDepth": 7.5,
    }


def test_default_target_queue_depth_is_shown_with_its_source() -> None:
    body = example("h100-80gb-tp2-fp8-128k")
    del body["spec"]["autoscaling"]["targetQueueDepth"]
    status = compute_status(autoscaled(review=review(body), hpa=None), None, T0)
    assert status["autoscaling"]["targetQueueDepth"] == 7  # a tenth of 64 running, rounded up
    assert status["autoscaling"]["targetQueueDepthSource"] == "plan"
    assert "currentQueueDepth" not in status["autoscaling"]


def test_no_custom_metrics_api_says_what_to_install() -> None:
    status = compute_status(autoscaled(metrics_api=None), None, T0)
    scaling = cond(status, "ScalingReady")
    assert (scaling["status"], scaling["reason"]) == ("False", "MetricsAPIMissing")
    assert (
        "v1beta1.custom.metrics.k8s.io" in scaling["message"] and "prometheus-adapter" in scaling["message"]
    )


def test_unavailable_custom_metrics_api_carries_its_reason() -> None:
    down = {
        "status": {
            "conditions": [
                {
                    "type": "Available",
                    "status": "False",
                    "reason": "MissingEndpoints",
                    "message": "endpoints for service/prometheus-adapter in monitoring have no addresses",
                }
            ]
        }
    }
    scaling = cond(compute_status(autoscaled(metrics_api=down), None, T0), "ScalingReady")
    assert (scaling["status"], scaling["reason"]) == ("False", "MetricsAPIUnavailable")
    assert "have no addresses" in scaling["message"]


@pytest.mark.parametrize(
    "metric", [None, {"kind": "MetricValueList", "items": []}], ids=["unknown-metric", "no-pod-has-it"]
)
def test_metric_absent_from_the_adapter(metric: dict[str, Any] | None) -> None:
    failing = {
        "status": {
            "conditions": [{"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric"}]
        }
    }
    scaling = cond(compute_status(autoscaled(queue_metric=metric, hpa=failing), None, T0), "ScalingReady")
    assert (scaling["status"], scaling["reason"]) == ("False", "MetricAbsent")
    assert "qwen_queue_depth" in scaling["message"]
    starting = autoscaled(queue_metric=metric, hpa=failing, engine=deployment(1, 0))
    assert cond(compute_status(starting, None, T0), "ScalingReady")["reason"] == "MetricPending"


def test_unreadable_metrics_api_falls_back_on_the_hpa() -> None:
    """Without the rights to read APIServices or the metric, the HPA's own conditions decide."""
    obs = autoscaled(metrics_api=None, metrics_api_read=False, queue_metric=None, queue_metric_answered=False)
    assert cond(compute_status(obs, None, T0), "ScalingReady")["reason"] == "MetricAvailable"


def test_keda_reads_its_own_hpa_and_metrics_server() -> None:
    body = example("h100-80gb-tp2-fp8-128k")
    body["spec"]["autoscaling"] |= {"driver": "keda", "prometheusAddress": "http://prom:9090"}
    external = {
        "status": {
            "currentMetrics": [
                {
                    "type": "External",
                    "external": {"metric": {"name": "s0-prometheus"}, "current": {"averageValue": "2"}},
                }
            ],
            "conditions": [{"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}],
        }
    }
    obs = autoscaled(review=review(body), hpa=external, queue_metric=None, queue_metric_answered=False)
    status = compute_status(obs, None, T0)
    assert cond(status, "ScalingReady")["status"] == "True"
    assert status["autoscaling"]["currentQueueDepth"] == 2
    assert status["autoscaling"]["metric"].startswith("sum(qwen_engine:queue_depth{")
    missing = cond(
        compute_status(autoscaled(review=review(body), metrics_api=None), None, T0), "ScalingReady"
    )
    assert "v1beta1.external.metrics.k8s.io" in missing["message"] and "KEDA" in missing["message"]


def test_the_status_schema_admits_the_autoscaling_block() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    declared = schema["properties"]["autoscaling"]["properties"]
    assert set(compute_status(autoscaled(), None, T0)["autoscaling"]) <= set(declared)


def test_monitoring_crd_missing() -> None:
    service_monitor = Skipped(kind_of("monitoring.coreos.com/v1", "ServiceMonitor"), "chat-engine")
    status = compute_status(serving(skipped=[service_monitor]), None, T0)
    monitoring = cond(status, "MonitoringReady")
    assert (monitoring["status"], monitoring["reason"]) == ("False", "CRDNotInstalled")
    assert cond(status, "ExposureReady")["status"] == "True"


def test_http_route_crd_missing_is_an_exposure_problem_not_a_monitoring_one() -> None:
    """With no Gateway API CRDs, a requested HTTPRoute is reported by ExposureReady (was: MonitoringReady)."""
    route = {"parentRefs": [{"name": "public"}]}
    gateway = {**example("a100-80gb-tp2-bf16")["spec"]["gateway"], "httpRoute": route}
    http_route = Skipped(kind_of("gateway.networking.k8s.io/v1", "HTTPRoute"), "chat-a100-gateway")
    status = compute_status(serving(review=reviewed(gateway=gateway), skipped=[http_route]), None, T0)
    exposure = cond(status, "ExposureReady")
    assert (exposure["status"], exposure["reason"]) == ("False", "CRDNotInstalled")
    crd = "httproutes.gateway.networking.k8s.io"
    assert f"HTTPRoute chat-a100-gateway ({crd} not installed)" in exposure["message"]
    monitoring = cond(status, "MonitoringReady")
    assert (monitoring["status"], monitoring["reason"]) == ("True", "Configured")
    assert "HTTPRoute" not in monitoring["message"]
    ready = compute_status(serving(review=reviewed(gateway=gateway)), None, T0)
    assert (cond(ready, "ExposureReady")["status"], cond(ready, "ExposureReady")["reason"]) == (
        "True",
        "Configured",
    )


def test_transition_time_only_moves_on_change() -> None:
    first = compute_status(serving(), None, T0)
    again = compute_status(serving(), first, T1)
    assert again == first, "an unchanged world must give an identical status (no write)"
    degraded = compute_status(serving(engine=deployment(2, 0)), first, T1)
    assert cond(degraded, "Ready")["lastTransitionTime"] == "2026-01-02T00:00:00Z"
    assert cond(degraded, "ConfigValid")["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert [c["type"] for c in transitions(first, degraded)] == ["Ready", "Progressing"]


def test_a_new_good_status_posts_no_events_and_changes_post_one_each() -> None:
    first = compute_status(serving(), None, T0)
    assert events(None, first) == [], "a fine new QwenDeployment: its conditions are in the status only"
    degraded = compute_status(serving(engine=deployment(2, 0)), first, T1)
    posted = events(first, degraded)
    # Ready=False (no engine ready) while Progressing=True: pods are starting, not a Warning
    assert (cond(degraded, "Progressing")["status"], cond(degraded, "Ready")["reason"]) == (
        "True",
        "NoReadyReplicas",
    )
    assert [(e.type, e.message.split(":")[0]) for e in posted] == [
        ("Normal", "Ready=False"),
        ("Normal", "Progressing=True"),
    ]
    assert posted[0].reason == "NoReadyReplicas"
    back = compute_status(serving(), degraded, T1)
    assert [(e.type, e.message.split(":")[0]) for e in events(degraded, back)] == [
        ("Normal", "Ready=True"),
        ("Normal", "Progressing=False"),
    ]
    assert events(back, back) == []
    # no rollout and no engine ready (they crashed, or were evicted): that is a Warning
    lost = {**back, "conditions": [c for c in degraded["conditions"] if c["type"] != "Progressing"]}
    lost["conditions"].append({**cond(back, "Progressing")})
    assert [(e.type, e.message.split(":")[0]) for e in events(back, lost)] == [("Warning", "Ready=False")]


def test_a_new_status_in_a_bad_state_posts_its_warnings() -> None:
    status = compute_status(Observed(generation=1, spec_errors=["spec.gpu.count: must be 2"]), None, T0)
    posted = events(None, status)
    assert posted and all(e.type == "Warning" for e in posted)
    assert any(e.message.startswith("ConfigValid=False: ") for e in posted)
    ready = cond(status, "Ready")
    assert Event("Warning", ready["reason"], f"Ready=False: {ready['message']}") in posted
    assert not any(e.message.startswith("Progressing=") for e in posted)  # a refused spec has no rollout


def test_no_nulls_in_status() -> None:
    def walk(value: Any) -> None:
        assert value is not None
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(compute_status(Observed(generation=None, spec_errors=["x"]), None, T0))


def _at_zero(**extra: Any) -> Observed:
    """Serving the bf16 example with autoscaling.minReplicas 0 (KEDA), engine Deployment and pods as given."""
    body = example("a100-80gb-tp2-bf16")
    body["spec"].pop("replicas", None)
    keda = {"driver": "keda", "prometheusAddress": "http://prometheus.monitoring.svc:9090"}
    body["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2, **keda}
    return serving(review=review(body), **extra)


def test_scaled_to_zero_then_waking_then_serving_and_the_resync_writes_nothing() -> None:
    idle = compute_status(_at_zero(engine=deployment(0, 0), pods=[]), None, T0)
    zero = cond(idle, "ScaledToZero")
    assert (zero["status"], zero["reason"]) == ("True", "Idle")
    assert "the first answer takes about 302 s" in zero["message"], zero
    assert (cond(idle, "Ready")["status"], cond(idle, "Ready")["reason"]) == ("False", "ScaledToZero")
    assert [c["type"] for c in idle["conditions"]] == [*CONDITION_TYPES, "ScaledToZero"]

    waking = compute_status(_at_zero(engine=deployment(1, 0)), idle, T1)
    zero = cond(waking, "ScaledToZero")
    assert (zero["status"], zero["reason"]) == ("False", "Waking")
    assert zero["lastTransitionTime"] == "2026-01-02T00:00:00Z"  # when the wake began
    assert cond(waking, "Ready")["reason"] == "NoReadyReplicas"

    later = datetime(2026, 1, 3, tzinfo=UTC)
    up = compute_status(_at_zero(engine=deployment(1, 1)), waking, later)
    zero = cond(up, "ScaledToZero")
    assert (zero["status"], zero["reason"]) == ("False", "Serving")
    assert zero["lastTransitionTime"] == "2026-01-02T00:00:00Z"
    assert cond(up, "Ready")["status"] == "True"
    assert merge_patch(up, compute_status(_at_zero(engine=deployment(1, 1)), up, later)) == {}


def test_serving_says_one_engine_stays_while_a_gateway_pod_cannot_hold() -> None:
    status = compute_status(_at_zero(engine=deployment(1, 1), gateway_holds=False), None, T0)
    zero = cond(status, "ScaledToZero")
    assert (zero["status"], zero["reason"]) == ("False", "Serving")
    assert zero["message"] == (
        "1 engine replica(s) ready; one stays until every gateway pod can hold requests (rolling out), "
        "then back to zero after 1800 s without completions"
    )
    rolled = compute_status(_at_zero(engine=deployment(1, 1)), status, T1)
    assert cond(rolled, "ScaledToZero")["message"] == (
        "1 engine replica(s) ready; back to zero after 1800 s without completions"
    )


def test_above_zero_there_is_no_scaled_to_zero_condition() -> None:
    status = compute_status(serving(engine=deployment(0, 0), pods=[]), None, T0)
    assert "ScaledToZero" not in [c["type"] for c in status["conditions"]]
    assert cond(status, "Ready")["reason"] == "NoReadyReplicas"


def _keda_hpa(held: str, replicas: int = 1) -> dict[str, Any]:
    """KEDA's HPA as the API server stores it after a read: its external metrics named by trigger place."""
    metrics = [
        {
            "type": "External",
            "external": {"metric": {"name": f"s{i}-prometheus"}, "current": {"averageValue": v}},
        }
        for i, v in enumerate(("0", held, "0"))
    ]
    return {"status": {"currentReplicas": replicas, "currentMetrics": metrics}}


def test_waking_says_how_many_requests_the_gateway_holds_as_kedas_hpa_last_read_them() -> None:
    idle = compute_status(_at_zero(engine=deployment(0, 0), pods=[]), None, T0)
    waking = compute_status(_at_zero(engine=deployment(1, 0), hpa=_keda_hpa("8")), idle, T1)
    zero = cond(waking, "ScaledToZero")
    assert zero["reason"] == "Waking" and "8 request(s) wait in the gateway" in zero["message"], zero
    assert zero["lastTransitionTime"] == "2026-01-02T00:00:00Z"  # a new count is no new transition
    # a reading from before the scale-down (the HPA reads nothing at zero replicas) says no count
    stale = compute_status(_at_zero(engine=deployment(1, 0), hpa=_keda_hpa("0")), idle, T1)
    assert " s, requests wait in the gateway" in cond(stale, "ScaledToZero")["message"]
    # an AverageValue: the HPA divided the sum by its current replicas
    two = compute_status(_at_zero(engine=deployment(2, 0), hpa=_keda_hpa("1500m", 2)), idle, T1)
    assert "3 request(s) wait" in cond(two, "ScaledToZero")["message"]
    served = compute_status(_at_zero(engine=deployment(1, 1), hpa=_keda_hpa("8")), waking, T1)
    assert "request(s) wait" not in cond(served, "ScaledToZero")["message"]


# --- strings from outside the operator are bounded in the status ----------------------------------

#: A message far larger than any status should carry (a sidecar's, an engine's, an API server's...).
HUGE = "x" * 100_000
#: What the status keeps of any one text (status.TEXT_LIMIT; spelled out so that the test fails,
#: rather than not importing, where the bound is missing).
BOUND = 1024


def _strings(value: Any, path: str = "status") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


def _huge_observations() -> dict[str, Observed]:
    """Every place a text from outside enters the status, each fed 100 kB."""
    pending = {
        "metadata": {"name": "chat-engine-x"},
        "status": {
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": HUGE}
            ],
            "containerStatuses": [
                {
                    "state": {
                        "waiting": {
                            "reason": "CreateContainerConfigError",
                            "message": f'secret "{HUGE}" not found',
                        }
                    }
                }
            ],
        },
    }
    stuck = deployment(2, 1, updated=1)
    stuck["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": HUGE}
    ]
    failing_hpa = {
        "status": {
            "conditions": [{"type": "ScalingActive", "status": "False", "reason": HUGE, "message": HUGE}]
        }
    }
    down = {"status": {"conditions": [{"type": "Available", "status": "False", "message": HUGE}]}}
    lora_body = example("a100-80gb-tp2-bf16")
    lora_body["spec"]["lora"] = {"adapters": [{"name": "sql", "source": {"huggingFace": {
        "repo": "org/sql", "revision": "0123456789abcdef0123456789abcdef01234567"}}}]}  # fmt: skip
    lora = LoraObservation(
        pods=3,
        adapters={"sql": AdapterState(errors=[f"pod-{i}: {HUGE}" for i in range(3)])},
        silent=[f"pod-3: {HUGE}"],
        unloading={HUGE: 1},
    )
    tiers_body = example("a100-80gb-tp2-bf16")
    tiers_body["spec"].setdefault("gateway", {})["tiers"] = [
        {"name": "small", "deploymentRef": {"name": "s"}}
    ]
    tier = TierObservation("small", "s", {"spec": {"model": {"name": "m", "servedModelName": HUGE}}})
    return {
        "pods and rollout": serving(
            engine=stuck,
            pods=[pending],
            mount_events=[{"message": f'persistentvolumeclaim "{HUGE}" not found'}],
        ),
        "reconcile failure": serving(failure=("ServerError", HUGE)),
        "autoscaler": serving(review=reviewed("h100-80gb-tp2-fp8-128k"), hpa=failing_hpa),
        "metrics API": serving(
            review=reviewed("h100-80gb-tp2-fp8-128k"), metrics_api=down, metrics_api_read=True
        ),
        "lora sidecars": serving(review=review(lora_body), lora=lora),
        "tiers": serving(review=review(tiers_body), tiers=[tier]),
    }


@pytest.mark.parametrize("case", sorted(_huge_observations()))
def test_every_string_from_outside_is_bounded_in_the_status_and_events(case: str) -> None:
    status = compute_status(_huge_observations()[case], None, T0)
    texts = dict(_strings(status))
    long = {path: len(text) for path, text in texts.items() if len(text) > BOUND}
    assert not long, f"unbounded strings: {long}"
    assert any(text.endswith("…") for text in texts.values()), "something was cut, with an ellipsis"
    for event in events(None, status):
        assert len(event.message) <= BOUND and len(event.reason) <= BOUND


def test_bounded_cuts_with_an_ellipsis() -> None:
    from qwen_operator.status import TEXT_LIMIT, bounded

    assert TEXT_LIMIT == BOUND
    assert bounded("abc", 3) == "abc"
    assert bounded("abcd", 3) == "ab\u2026"
    assert len(bounded(HUGE)) == TEXT_LIMIT and bounded(HUGE).endswith("\u2026")


@pytest.mark.parametrize(
    "before, after",
    [
        (
            autoscaled,
            lambda: serving(review=reviewed("h100-80gb-tp2-fp8-128k", autoscaling=None, replicas=2)),
        ),
        (serving, lambda: serving(review=reviewed(gateway={"enabled": False}), gateway=None)),
    ],
    ids=["autoscaling-removed", "gateway-off"],
)
def test_a_status_after_an_edit_is_the_fresh_status_of_the_new_spec(before: Any, after: Any) -> None:
    """Nothing of the previous status is carried over but the conditions' transition times: the status
    computed with the old one as `previous` equals the status of the new spec computed from nothing (no
    stale `autoscaling` or `gateway` block once the spec stops asking for it)."""
    previous = compute_status(before(), None, T0)
    edited, fresh = compute_status(after(), previous, T1), compute_status(after(), None, T1)
    assert set(previous) - set(fresh), "the edit must drop a block, or the case tests nothing"
    strip = lambda s: {**s, "conditions": [{**c, "lastTransitionTime": ""} for c in s["conditions"]]}  # noqa: E731
    assert strip(edited) == strip(fresh)
