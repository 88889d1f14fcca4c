"""Autoscaling objects: the HPA's metric, the target queue depth from the plan, behaviour sized for
engines that take minutes to start, and KEDA's equivalent query."""

from __future__ import annotations

import math
from typing import Any

import pytest

from qwen_operator.api import queueing as names
from qwen_operator.api.queueing import TARGET_QUEUE_SHARE, TYPICAL_REQUEST_TOKENS, queueing
from qwen_operator.api.review import Review, review
from qwen_operator.manifests import scaling
from qwen_operator.manifests.engine import startup_seconds
from support import example

H100 = "h100-80gb-tp2-fp8-128k"


def reviewed(autoscaling: dict[str, Any] | None = None, **spec: Any) -> Review:
    body = example(H100)
    body["spec"] |= spec
    if autoscaling is not None:
        body["spec"]["autoscaling"] = autoscaling
    return review(body)


def autoscaled(name: str, **autoscaling: Any) -> Review:
    """An example switched from fixed replicas to autoscaling."""
    body = example(name)
    body["spec"].pop("replicas", None)
    body["spec"]["autoscaling"] = autoscaling
    return review(body)


def metric_target(hpa: dict[str, Any]) -> dict[str, Any]:
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    return metric["pods"]


def test_the_hpa_reads_the_adapters_per_pod_queue_metric() -> None:
    pods = metric_target(scaling.build_hpa(reviewed()))
    assert pods["metric"] == {"name": "qwen_queue_depth"}
    assert pods["target"] == {"type": "AverageValue", "averageValue": "5"}


def test_the_metric_names_agree_with_the_recording_rules() -> None:
    recording = pytest.importorskip("qwen_operator.recording")
    assert scaling.HPA_METRIC == names.HPA_METRIC == recording.ADAPTER_METRIC
    assert scaling.QUEUE_METRIC == names.QUEUE_METRIC == recording.VLLM_WAITING
    assert names.QUEUE_RECORDING == recording.ENGINE_QUEUE_DEPTH
    assert names.DEPLOYMENT_LABEL == recording.DEPLOYMENT_LABEL


def test_default_target_queue_depth_comes_from_the_plan() -> None:
    """A tenth of what one replica runs at once: maxNumSeqs, or fewer when the KV cache holds fewer
    typical requests."""
    batch_bound = reviewed({"minReplicas": 1, "maxReplicas": 4})
    q = queueing(batch_bound.resource.spec, batch_bound.plan)
    assert batch_bound.plan.kv_tokens_per_replica // TYPICAL_REQUEST_TOKENS > 64  # the batch binds
    assert (q.concurrency_per_replica, q.target_queue_depth, q.target_queue_depth_source) == (64, 7, "plan")
    assert metric_target(scaling.build_hpa(batch_bound))["target"]["averageValue"] == "7"

    kv_bound = autoscaled("l40s-48gb-tp1-awq", maxReplicas=3)
    q = queueing(kv_bound.resource.spec, kv_bound.plan)
    fits = kv_bound.plan.kv_tokens_per_replica // TYPICAL_REQUEST_TOKENS
    assert fits < kv_bound.resource.spec.engine.max_num_seqs  # the KV cache binds
    assert q.concurrency_per_replica == fits
    assert q.target_queue_depth == max(1, math.ceil(fits * TARGET_QUEUE_SHARE))


def test_the_users_target_wins() -> None:
    q = queueing(reviewed().resource.spec, reviewed().plan)
    assert (q.target_queue_depth, q.target_queue_depth_source) == (5, "spec")


def test_a_tiny_batch_still_targets_one_waiting_request() -> None:
    rev = reviewed({"maxReplicas": 3}, engine={**example(H100)["spec"]["engine"], "maxNumSeqs": 4})
    assert queueing(rev.resource.spec, rev.plan).target_queue_depth == 1


def test_scale_up_is_fast_and_paced_by_the_engines_start_up() -> None:
    rev = reviewed()
    up = scaling.build_hpa(rev)["spec"]["behavior"]["scaleUp"]
    budget = startup_seconds(rev)
    assert up["stabilizationWindowSeconds"] == 0  # the first high reading acts
    assert up["selectPolicy"] == "Max"
    assert up["policies"] == [
        {"type": "Pods", "value": 2, "periodSeconds": budget},
        {"type": "Percent", "value": 100, "periodSeconds": budget},
    ]


def test_scale_down_is_slow_and_stabilised_for_a_start_up() -> None:
    rev = reviewed()
    down = scaling.build_hpa(rev)["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] == startup_seconds(rev) >= 300
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_heavier_weights_wait_longer_within_the_hpa_limits() -> None:
    fp8 = reviewed()
    bf16 = autoscaled("a100-80gb-tp2-bf16", maxReplicas=3)
    assert scaling.scale_up_period(bf16) > scaling.scale_up_period(fp8)
    slow = reviewed(engine={**example(H100)["spec"]["engine"], "probes": {"startupSeconds": 7200}})
    assert scaling.scale_up_period(slow) == 1800
    assert scaling.scale_down_window(slow) == 3600
    fast = reviewed(engine={**example(H100)["spec"]["engine"], "probes": {"startupSeconds": 60}})
    assert scaling.scale_down_window(fast) == 300


def test_behaviour_overrides() -> None:
    behavior = {
        "scaleUpStabilizationSeconds": 15,
        "scaleUpPods": 3,
        "scaleUpPeriodSeconds": 30,
        "scaleDownStabilizationSeconds": 45,
        "scaleDownPods": 2,
        "scaleDownPeriodSeconds": 20,
    }
    rev = reviewed({"maxReplicas": 3, "behavior": behavior})
    b = scaling.build_hpa(rev)["spec"]["behavior"]
    assert b["scaleUp"]["stabilizationWindowSeconds"] == 15
    assert b["scaleUp"]["policies"][0] == {"type": "Pods", "value": 3, "periodSeconds": 30}
    assert b["scaleDown"] == {
        "stabilizationWindowSeconds": 45,
        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 20}],
        "selectPolicy": "Min",
    }


def test_keda_sums_the_recorded_queue_of_the_deployment() -> None:
    rev = reviewed(
        {"driver": "keda", "prometheusAddress": "http://prom:9090", "maxReplicas": 4, "targetQueueDepth": 3}
    )
    so = scaling.build_scaled_object(rev)
    (trigger,) = so["spec"]["triggers"]
    assert (
        trigger["metadata"]["query"]
        == 'sum(qwen_engine:queue_depth{namespace="llm",qwendeployment="chat-h100"})'
    )
    assert trigger["metadata"]["threshold"] == "3"
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == scaling._behavior(rev)
    assert scaling.keda_hpa_name(rev) == "keda-hpa-chat-h100-engine"
