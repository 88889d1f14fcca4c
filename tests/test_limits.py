"""The gateway's pass-through limit never hides the engines' queue from the autoscaler (issue 11).

The rule: a growing queue always shows up in the engines' waiting count, so it adds replicas up to
maxReplicas. The gateway therefore passes at least what the engines can run and hold waiting at
maxReplicas; its own queue and 503s apply only above that.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from qwen_operator.api.queueing import queueing
from qwen_operator.api.review import Review, review
from qwen_operator.gateway import Limits, router_args
from qwen_operator.gateway.limits import pass_through
from support import example

A100 = "a100-80gb-tp2-bf16"  # fixed 1 replica, maxNumSeqs 128, gateway replicas 2
H100 = "h100-80gb-tp2-fp8-128k"  # autoscaling 1..4, maxNumSeqs 64, targetQueueDepth 5


def reviewed(name: str, gateway: dict[str, Any] | None = None, **spec: Any) -> Review:
    body = example(name)
    body["spec"] |= spec
    if gateway is not None:
        body["spec"]["gateway"] = {**body["spec"].get("gateway", {}), **gateway}
    return review(body)


def router_cap(rev: Review) -> int:
    args = router_args(rev)
    return int(args[args.index("--max-concurrent-requests") + 1])


def engine_queue_seen(rev: Review, replicas: int, offered: int) -> float:
    """Average waiting per engine pod when `offered` requests arrive at one gateway pod and `replicas`
    engines run: what the gateway passes, minus what the engines run, spread over the pods."""
    passed = min(offered, pass_through(rev))
    running = replicas * rev.resource.spec.engine.max_num_seqs
    return max(0, passed - running) / replicas


def test_default_pass_through_is_the_engines_capacity_at_max_replicas() -> None:
    rev = reviewed(H100)
    spec = rev.resource.spec
    seqs, target = spec.engine.max_num_seqs, spec.autoscaling.target_queue_depth  # type: ignore[union-attr]
    waiting_room = max(seqs, 2 * target)  # type: ignore[operator]
    assert pass_through(rev) == 4 * (seqs + waiting_room) == 512
    # Not split across gateway pods: one pod alone may pass it (a client's connections may all land there).
    assert router_cap(rev) == Limits.of(rev).max_concurrent == 512
    assert Limits.of(rev).in_flight == 512 + math.ceil(spec.gateway.queue_size / spec.gateway.replicas)


def test_fixed_replicas_default_matches_their_capacity() -> None:
    rev = reviewed(A100)
    assert pass_through(rev) == 1 * (128 + 128)
    assert pass_through(reviewed(A100, replicas=3)) == 3 * 256


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_a_growing_queue_is_seen_by_the_engines_at_every_replica_count_below_max(replicas: int) -> None:
    """The HPA adds a replica while the average waiting count is above the target: a queue large
    enough to need more replicas must reach the engines at every count below maxReplicas."""
    rev = reviewed(H100)
    target = queueing(rev.resource.spec, rev.plan).target_queue_depth
    assert target is not None
    huge = 100_000
    assert engine_queue_seen(rev, replicas, huge) > target


def test_a_limit_below_min_replicas_times_max_num_seqs_is_raised_with_autoscaling() -> None:
    """Issue 11's case: the pass-through limit asked for is below minReplicas x maxNumSeqs. Applied as
    set, the engines would never queue and the HPA would never scale; it is raised, with a warning."""
    autoscaling = {"minReplicas": 2, "maxReplicas": 3, "targetQueueDepth": 4}
    rev = reviewed(H100, autoscaling=autoscaling, gateway={"maxConcurrentRequests": 64, "replicas": 2})
    assert 64 < 2 * 64  # below minReplicas x maxNumSeqs
    assert pass_through(rev) == 3 * (64 + 64)
    assert engine_queue_seen(rev, 2, 10_000) > 4
    warning = next(m for p, m in rev.plan.warnings if p == "spec.gateway.maxConcurrentRequests")
    assert "384" in warning and "not the 32 asked for" in warning and "autoscaler" in warning
    assert rev.ok


def test_a_limit_above_the_engines_capacity_raises_the_pass_through() -> None:
    rev = reviewed(H100, gateway={"maxConcurrentRequests": 3000, "replicas": 2})
    assert pass_through(rev) == 1500  # the spec's whole-gateway value, split
    assert not [p for p, _ in rev.plan.warnings if p == "spec.gateway.maxConcurrentRequests"]


def test_fixed_replicas_apply_an_explicit_limit_as_set_and_warn_when_engines_would_idle() -> None:
    rev = reviewed(A100, replicas=2, gateway={"maxConcurrentRequests": 90, "replicas": 3})
    assert pass_through(rev) == 30
    warning = next(m for p, m in rev.plan.warnings if p == "spec.gateway.maxConcurrentRequests")
    assert "below replicas x maxNumSeqs (256)" in warning
    roomy = reviewed(A100, replicas=2, gateway={"maxConcurrentRequests": 600})
    assert pass_through(roomy) == 300
    assert not [p for p, _ in roomy.plan.warnings if p == "spec.gateway.maxConcurrentRequests"]


def test_rate_limits_and_the_gateway_queue_are_still_split_per_pod() -> None:
    rev = reviewed(
        H100,
        gateway={"replicas": 3, "rateLimit": {"requestsPerMinute": 100, "burst": 10}, "queueSize": 30},
    )
    limits = Limits.of(rev)
    # 100 // 3 per minute; 11 at once (the burst above one at the rate) // 3 = 3, so nginx's burst is 2
    assert (limits.rate_per_minute, limits.burst, limits.queue_size) == (33, 2, 10)
    assert limits.in_flight == limits.max_concurrent + 10


@pytest.mark.parametrize("replicas", [1, 2, 3, 5])
@pytest.mark.parametrize(("rpm", "burst"), [(600, 50), (100, 10), (7, 0), (61, 3)])
def test_the_gateway_pods_together_admit_no_more_than_the_key_limit(
    replicas: int, rpm: int, burst: int
) -> None:
    """Each pod's share is rounded down: the pods together admit at most the key's rate, and at once at
    most what one pod enforcing the whole limit would (nginx admits burst + 1 at once)."""
    limits = Limits.of(
        reviewed(
            A100, gateway={"replicas": replicas, "rateLimit": {"requestsPerMinute": rpm, "burst": burst}}
        )
    )
    assert replicas * limits.rate_per_minute <= rpm
    assert limits.rate_per_minute >= rpm // replicas
    assert replicas * (limits.burst + 1) <= max(burst + 1, replicas)  # at least one at once per pod


def test_a_key_limit_below_one_per_gateway_pod_is_a_warning() -> None:
    """Every pod admits at least one request per minute and one at once: with fewer than the pods, the
    gateway admits more than the key's limit, and the plan says so at the field."""
    rev = reviewed(A100, gateway={"replicas": 3, "rateLimit": {"requestsPerMinute": 2, "burst": 0}})
    limits = Limits.of(rev)
    assert (limits.rate_per_minute, limits.burst) == (1, 0)
    warnings = dict(rev.plan.warnings)
    assert "the gateway admits 3" in warnings["spec.gateway.rateLimit.requestsPerMinute"]
    assert "the gateway admits 3" in warnings["spec.gateway.rateLimit.burst"]
    fine = reviewed(A100, gateway={"replicas": 3, "rateLimit": {"requestsPerMinute": 3, "burst": 2}})
    assert not [p for p, _ in fine.plan.warnings if p.startswith("spec.gateway.rateLimit")]


def test_the_429_says_what_this_pod_admits_of_the_key_limit() -> None:
    two = Limits.of(
        reviewed(A100, gateway={"replicas": 2, "rateLimit": {"requestsPerMinute": 600, "burst": 50}})
    )
    assert two.rate_limited_message() == (
        "Rate limit reached for this API key: this gateway pod admits 300 requests per minute of the key "
        "limit of 600 (600 split across 2 gateway pods); retry after 1 s."
    )
    one = Limits.of(
        reviewed(A100, gateway={"replicas": 1, "rateLimit": {"requestsPerMinute": 30, "burst": 3}})
    )
    assert (
        one.rate_limited_message()
        == "Rate limit reached for this API key (30 requests per minute); retry after 2 s."
    )


def test_zero_fixed_replicas_still_pass_one_request() -> None:
    assert pass_through(reviewed(A100, replicas=0)) == 1


def test_sticky_least_loaded_warns_where_its_per_pod_table_works_against_the_deployment() -> None:
    """Its table of conversation buckets is per gateway pod and outlives the traffic that filled it:
    replicas the autoscaler adds get almost no requests (measured in bench/routing_bench.py), and two
    gateway pods can place one conversation on two engines. Warnings only: it still renders."""

    def policy_warnings(rev: Review) -> list[str]:
        return [m for p, m in rev.plan.warnings if p == "spec.gateway.policy"]

    scaled = reviewed(H100, gateway={"policy": "sticky_least_loaded", "replicas": 2})
    autoscaling, pods = policy_warnings(scaled)
    assert "replicas the autoscaler adds get almost no requests" in autoscaling and scaled.ok
    assert "each of the 2 gateway pods" in pods
    (pods_only,) = policy_warnings(reviewed(A100, gateway={"policy": "sticky_least_loaded"}))
    assert "each of the 2 gateway pods" in pods_only
    assert not policy_warnings(reviewed(A100, gateway={"policy": "sticky_least_loaded", "replicas": 1}))
    assert not policy_warnings(reviewed(H100))  # consistent_hash, the default
