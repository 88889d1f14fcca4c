"""The pure parts of editing a QwenDeployment that serves: the status patch, canonical quantities, the
replicas hand-off, the rollout strategy kept, and engine pods held across operator upgrades. The same
transitions against the real API server are in e2e/test_transitions.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from qwen_devtools.repo import REPO
from qwen_operator import names
from qwen_operator.api.quantity import canonical
from qwen_operator.api.review import review
from qwen_operator.api.rollout import ROLLOUT_ANNOTATION, Rollout, rollout_complete
from qwen_operator.manifests import ClusterFacts, build_children, node_pool
from qwen_operator.manifests.engine import hands_replicas_over, replicas_floor
from qwen_operator.manifests.transition import edit_impact
from qwen_operator.manifests.upgrade import (
    ENGINE_GENERATION,
    ENGINE_TEMPLATE,
    UNRECORDED,
    hold_engine_template,
    replaces_pods,
)
from qwen_operator.objects import changed_paths, content_hash
from qwen_operator.reconcile import surge_stuck
from qwen_operator.status import Observed, compute_status, merge_patch
from support import KEDA_AT_ZERO, cli_in_process
from test_status import example, reviewed

# --- status: exactly the computed one -------------------------------------------------------------


def test_a_status_key_that_stops_applying_is_removed_by_the_patch() -> None:
    old = {"plan": {"maxModelLen": 131072, "yarnFactor": 4, "fits": True}, "phase": "Ready"}
    new = {"plan": {"maxModelLen": 32768, "fits": True}, "phase": "Ready"}
    assert merge_patch(old, new) == {"plan": {"maxModelLen": 32768, "yarnFactor": None}}


def test_an_unchanged_status_is_no_patch_at_all() -> None:
    status = {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}], "plan": {"a": 1}}
    assert merge_patch(copy.deepcopy(status), status) == {}


def test_lists_are_replaced_whole_and_removed_objects_become_null() -> None:
    old = {"conditions": [{"type": "A"}], "engineUpdate": {"available": True}, "gateway": {"auth": "apiKeys"}}
    new = {"conditions": [{"type": "A"}, {"type": "B"}], "gateway": {}}
    assert merge_patch(old, new) == {
        "conditions": [{"type": "A"}, {"type": "B"}],
        "engineUpdate": None,
        "gateway": {"auth": None},
    }
    assert merge_patch(None, {"phase": "Ready"}) == {"phase": "Ready"}


def _apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies it (to check merge_patch against its definition)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _apply_merge_patch(out.get(key), value)
    return out


@pytest.mark.parametrize(
    "old,new",
    [
        ({"a": {"b": 1, "c": [1]}, "d": 2}, {"a": {"c": [2]}, "e": {"f": {}}}),
        ({"a": 1}, {"a": {"b": 1}}),
        ({"a": {"b": 1}}, {"a": 1}),
        ({}, {}),
    ],
)
def test_the_patch_applied_gives_the_new_status(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert _apply_merge_patch(old, merge_patch(old, new)) == new


# --- quantities as the API server stores them ---------------------------------------------------------


@pytest.mark.parametrize(
    "written,stored",
    [
        ("0.5", "500m"),
        ("65536Mi", "64Gi"),
        ("64Gi", "64Gi"),
        ("1000", "1k"),
        ("1500", "1500"),
        (8, "8"),
        ("1.5Gi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("19.5G", "19500M"),
        ("2000m", "2"),
        ("0", "0"),
        ("512", "512"),
        ("0.5Ki", "512"),
        ("1024Mi", "1Gi"),
        ("1.3Gi", "1395864371200m"),
        ("0.0000000001", "1n"),
    ],
)
def test_quantities_are_rendered_in_the_servers_canonical_form(written: Any, stored: str) -> None:
    assert canonical(written) == stored


def test_the_engine_pod_carries_canonical_quantities() -> None:
    dep = _engine_deployment(engine={"resources": {"cpu": "0.5", "memory": "65536Mi", "shmSize": "1024Mi"}})
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == "500m"
    assert (
        container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"] == "64Gi"
    )
    shm = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["sizeLimit"] == "1Gi"


def _autoscaled(spec: dict[str, Any]) -> Any:
    body = example("a100-80gb-tp2-bf16")
    body["spec"].pop("replicas", None)
    body["spec"].update(spec)
    return review(body)


# --- replicas handed over to the autoscaler -------------------------------------------------------------


def _engine_deployment(**spec: Any) -> dict[str, Any]:
    rev = reviewed(**spec) if "autoscaling" not in spec else _autoscaled(spec)
    name = names.engine(rev.resource)
    return next(
        o for o in build_children(rev).objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name
    )


def test_turning_autoscaling_on_hands_the_live_replicas_over_first() -> None:
    fixed = _engine_deployment(replicas=3)
    scaled = _engine_deployment(autoscaling={"minReplicas": 2, "maxReplicas": 4})
    assert "replicas" not in scaled["spec"]
    assert scaled["metadata"]["annotations"][names.REPLICAS_OWNER_ANNOTATION] == "autoscaler"
    live_fixed = copy.deepcopy(fixed)
    assert hands_replicas_over(scaled, live_fixed), "fixed -> autoscaled: hand over"
    live_scaled = copy.deepcopy(scaled) | {"spec": {**scaled["spec"], "replicas": 3}}
    assert not hands_replicas_over(scaled, live_scaled), "already the autoscaler's: nothing to hand over"
    assert not hands_replicas_over(scaled, None), "a new Deployment starts at the HPA's minimum"
    assert not hands_replicas_over(fixed, live_scaled), "back to fixed: the operator's apply takes it"


def test_the_hpa_after_keda_at_zero_gets_engines_lifted_to_its_minimum() -> None:
    """Kubernetes' HPA never scales a target at 0 replicas, where KEDA left it: the operator lifts it."""
    autoscaling = {"driver": "hpa", "minReplicas": 2, "maxReplicas": 4}
    hpa, desired = _autoscaled({"autoscaling": autoscaling}), _engine_deployment(autoscaling=autoscaling)
    at = {n: copy.deepcopy(desired) | {"spec": {**desired["spec"], "replicas": n}} for n in (0, 1)}
    assert replicas_floor(hpa, desired, at[0]) == 2
    assert replicas_floor(hpa, desired, at[1]) is None, "serving: the HPA takes it from here"
    assert replicas_floor(hpa, desired, None) is None, "a new Deployment starts at the HPA's minimum"
    keda = _autoscaled({"autoscaling": KEDA_AT_ZERO})
    assert replicas_floor(keda, desired, at[0]) is None, "KEDA lifts its own target"


# --- the rollout strategy kept -------------------------------------------------------------------------


def _rolling(mode_text: str, done: bool, surge: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"generation": 4, "annotations": {ROLLOUT_ANNOTATION: mode_text}},
        "spec": {"replicas": 2, "strategy": {"rollingUpdate": {"maxSurge": surge}}},
        "status": {
            "observedGeneration": 4,
            "replicas": 2 if done else 3,
            "updatedReplicas": 2 if done else 1,
            "availableReplicas": 2,
        },
    }


def test_a_rollout_keeps_the_strategy_it_started_with() -> None:
    started = "Surge: the pool has the 2 free GPUs of a surge replica"
    assert Rollout.kept(_rolling(started, done=True)) is None, "no rollout: chosen again"
    kept = Rollout.kept(_rolling(started, done=False))
    assert kept == Rollout("Surge", "the pool has the 2 free GPUs of a surge replica")
    # The surge pod itself took the free GPUs: choosing again would now say InPlace.
    facts = ClusterFacts(free_gpus=0, rollout_under_way=kept)
    assert build_children(reviewed(), facts).rollout.mode == "Surge"
    assert build_children(reviewed(), ClusterFacts(free_gpus=0)).rollout.mode == "InPlace"


def test_surge_is_given_up_only_when_its_pod_cannot_be_scheduled() -> None:
    started = "Surge: the pool has the 2 free GPUs of a surge replica"
    given_up = Rollout.kept(_rolling(started, done=False), unschedulable=True)
    assert given_up is not None and given_up.mode == "InPlace" and "cannot be scheduled" in given_up.reason


def _engine_pod(scheduled: str = "", terminating: bool = False) -> dict[str, Any]:
    """An engine pod: running, or (scheduled = the scheduler's message) Unschedulable."""
    meta: dict[str, Any] = {"name": "engine-pod"}
    if terminating:
        meta["deletionTimestamp"] = "2026-12-07T14:00:00Z"
    cond = {"type": "PodScheduled", "status": "True"}
    if scheduled:
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": scheduled}
    return {"metadata": meta, "status": {"conditions": [cond]}}


def test_surge_waits_for_a_terminating_pods_gpus_and_gives_up_only_when_they_went_elsewhere() -> None:
    """Each surge step after the first scales an old pod down and a new one up at once: the new pod is
    Unschedulable until the old one's GPUs come back (e2e/test_transitions.py caught the operator taking
    that for lost GPUs and switching to InPlace mid-rollout, 2026-12-07)."""
    rev = reviewed()
    gpus = rev.plan.gpus_per_replica
    lacking_gpus = _engine_pod(f"0/7 nodes are available: 1 Insufficient {node_pool(rev).resource}.")
    serving, old = _engine_pod(), _engine_pod(terminating=True)
    full, free_again = {"gpu-0": 0, "gpu-1": 0}, {"gpu-0": gpus, "gpu-1": 0}
    assert not surge_stuck([serving, lacking_gpus, old], full, rev), "the terminating pod's GPUs come back"
    assert surge_stuck([serving, lacking_gpus], full, rev), "no pod terminates: the GPUs went elsewhere"
    assert surge_stuck([serving, lacking_gpus], None, rev), "free GPUs unknown: as before"
    assert not surge_stuck([serving, lacking_gpus], free_again, rev), "free again: the scheduler's next try"
    spread = {"gpu-0": gpus - 1, "gpu-1": 1}
    assert gpus > 1 and surge_stuck([serving, lacking_gpus], spread, rev), "spread over nodes places nothing"
    lacking_memory = _engine_pod("0/7 nodes are available: 1 Insufficient memory.")
    assert surge_stuck([serving, lacking_memory], free_again, rev), "free GPUs do not help it"
    assert not surge_stuck([serving, old], full, rev)


def test_a_deployment_of_an_earlier_release_keeps_its_strategy_by_its_max_surge() -> None:
    old = _rolling("", done=False, surge=0)
    del old["metadata"]["annotations"]
    kept = Rollout.kept(old)
    assert kept is not None and kept.mode == "InPlace"
    assert rollout_complete(_rolling("", done=True))
    assert not rollout_complete(_rolling("", done=True) | {"metadata": {"generation": 5}})


# --- operator upgrades hold the running engine pod ------------------------------------------------------


def _live(desired: dict[str, Any], generation: int, template_hash: str | None) -> dict[str, Any]:
    live = copy.deepcopy(desired)
    live["spec"]["template"]["metadata"]["creationTimestamp"] = None
    live["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"  # a server default
    if template_hash is not None:
        annotations = live["metadata"].setdefault("annotations", {})
        annotations |= {ENGINE_GENERATION: str(generation), ENGINE_TEMPLATE: template_hash}
    return live


def _with_new_default(desired: dict[str, Any]) -> dict[str, Any]:
    newer = copy.deepcopy(desired)
    newer["spec"]["template"]["spec"]["containers"][0]["args"].append("--a-new-default")
    return newer


def test_an_unchanged_spec_keeps_the_pod_an_earlier_version_rendered() -> None:
    before = _engine_deployment()
    live = _live(before, 3, content_hash(before["spec"]["template"]))
    after = _with_new_default(before)
    held = hold_engine_template(after, live, generation=3, reconciled_generation=3, policy="OnEdit")
    assert (
        held.deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        == (before["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    assert "creationTimestamp" not in held.deployment["spec"]["template"]["metadata"]
    assert held.changes == [".spec.containers[0].args"]
    assert held.deployment["metadata"]["annotations"][ENGINE_TEMPLATE] == content_hash(
        before["spec"]["template"]
    )


def test_a_held_security_setting_is_a_condition_not_only_a_field() -> None:
    """Issue 39 item 10: an upgrade whose new defaults tighten the engine pod (its securityContext, the
    engine key) still holds the running pod until the next edit, as every operator default is held
    (docs/security.md, "Operator upgrades"); the held security settings are a condition in the status,
    not only a line of status.engineUpdate."""
    before = _engine_deployment()
    live = _live(before, 3, content_hash(before["spec"]["template"]))
    after = copy.deepcopy(before)
    engine = after["spec"]["template"]["spec"]["containers"][0]
    engine["securityContext"]["readOnlyRootFilesystem"] = True
    engine.setdefault("env", []).append(
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "chat-engine-key", "key": "key"}}}
    )
    held = hold_engine_template(after, live, generation=3, reconciled_generation=3, policy="OnEdit")
    running = held.deployment["spec"]["template"]["spec"]["containers"][0]
    assert (
        running["securityContext"] == before["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    )
    assert held.security == [
        ".spec.containers[0].securityContext.readOnlyRootFilesystem",
        f".spec.containers[{engine['name']}].env[VLLM_API_KEY]",
    ]
    assert hold_engine_template(_with_new_default(before), live, 3, 3, "OnEdit").security == []
    observed = Observed(generation=3, engine_update={"available": True}, held_security=held.security)
    conditions = {c["type"]: c for c in compute_status(observed, None)["conditions"]}
    held_condition = conditions["SecurityUpdateHeld"]
    assert (held_condition["status"], held_condition["reason"]) == ("True", "HeldUntilEdit")
    assert (
        "readOnlyRootFilesystem" in held_condition["message"] and "VLLM_API_KEY" in held_condition["message"]
    )
    assert "SecurityUpdateHeld" not in {
        c["type"] for c in compute_status(Observed(generation=3), None)["conditions"]
    }


def test_an_edit_or_immediate_takes_the_new_rendering() -> None:
    before = _engine_deployment()
    live = _live(before, 3, content_hash(before["spec"]["template"]))
    after = _with_new_default(before)
    for generation, policy in ((4, "OnEdit"), (3, "Immediate")):
        held = hold_engine_template(after, live, generation, 3, policy)
        assert held.changes == [] and held.deployment["spec"]["template"] == after["spec"]["template"]
        annotations = held.deployment["metadata"]["annotations"]
        assert annotations[ENGINE_GENERATION] == str(generation)
        assert annotations[ENGINE_TEMPLATE] == content_hash(after["spec"]["template"])


def test_the_same_rendering_is_applied_as_rendered_so_hand_edits_are_reverted() -> None:
    before = _engine_deployment()
    live = _live(before, 3, content_hash(before["spec"]["template"]))
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    held = hold_engine_template(before, live, 3, 3, "OnEdit")
    assert held.changes == [] and held.deployment["spec"]["template"] == before["spec"]["template"]


def test_a_deployment_of_v0_1_0_is_held_when_its_status_says_it_runs_this_generation() -> None:
    before = _engine_deployment()
    live = _live(before, 3, None)  # v0.1.0 wrote neither annotation
    after = _with_new_default(before)
    held = hold_engine_template(after, live, 3, reconciled_generation=3, policy="OnEdit")
    assert held.changes == [".spec.containers[0].args"]
    assert held.deployment["metadata"]["annotations"][ENGINE_TEMPLATE] == UNRECORDED
    # The same pod in both versions: recorded as this rendering, nothing held.
    same = hold_engine_template(before, live, 3, reconciled_generation=3, policy="OnEdit")
    assert same.changes == []
    assert same.deployment["metadata"]["annotations"][ENGINE_TEMPLATE] == content_hash(
        before["spec"]["template"]
    )
    # Edited while no operator ran (the status is of an older generation): the edit applies.
    edited = hold_engine_template(after, live, 4, reconciled_generation=3, policy="OnEdit")
    assert edited.changes == [] and edited.deployment["spec"]["template"] == after["spec"]["template"]


def test_changed_paths_name_what_differs_and_ignore_server_defaults() -> None:
    live = {"a": {"b": [1, 2], "c": "x", "default": 1}, "d": [1]}
    assert changed_paths(live, {"a": {"b": [1, 3], "c": "x"}, "d": [1, 2]}) == [".a.b[1]", ".d"]
    assert changed_paths(live, {"a": {"c": "x"}}) == []


# --- `qwen-operator plan --from`: what an edit does, offline ----------------------------------------------


def test_an_engine_edit_on_a_full_pool_is_announced_as_downtime_for_one_replica() -> None:
    old, new = reviewed(), reviewed(engine={"maxModelLen": 16384})
    full = edit_impact(old, new, free_gpus=0)
    assert full.restarts_engines and full.strategy.startswith("InPlace")
    assert (full.lowest_serving, full.zero_downtime) == (0, False)
    room = edit_impact(old, new, free_gpus=2)
    assert room.strategy.startswith("Surge") and (room.lowest_serving, room.zero_downtime) == (1, True)


def test_gateway_and_scaling_edits_keep_the_engines() -> None:
    old = reviewed(replicas=3)
    gateway = edit_impact(old, reviewed(replicas=3, gateway={"auth": "none"}), free_gpus=0)
    assert not gateway.restarts_engines and gateway.lowest_serving == 3
    down = edit_impact(old, reviewed(replicas=2), free_gpus=0)
    assert not down.restarts_engines and down.lowest_serving == 2
    handoff = edit_impact(old, _autoscaled({"autoscaling": {"minReplicas": 2, "maxReplicas": 4}}), 0)
    assert not handoff.restarts_engines and handoff.lowest_serving == 3 and handoff.autoscaled_after


def test_plan_from_prints_the_edit(tmp_path: Any) -> None:
    old = REPO / "examples" / "a100-80gb-tp2-bf16.yaml"
    new = tmp_path / "edit.yaml"
    new.write_text(old.read_text().replace("maxModelLen: 32768", "maxModelLen: 16384"))
    table = cli_in_process("plan", "-f", str(new), "--from", str(old))
    assert table.returncode == 0, table.stderr
    assert "DOWNTIME while the new engine starts" in table.stdout and "InPlace" in table.stdout
    as_json = cli_in_process("plan", "-f", str(new), "--from", str(old), "--free-gpus", "2", "-o", "json")
    edit = json.loads(as_json.stdout)["edit"]
    assert edit["zeroDowntime"] and edit["rolloutStrategy"].startswith("Surge") and edit["restartsEngines"]


def test_replaces_pods_tells_a_held_or_same_rendering_from_a_new_one() -> None:
    before = _engine_deployment()
    live = _live(before, 3, content_hash(before["spec"]["template"]))
    after = _with_new_default(before)
    held = hold_engine_template(after, live, 3, 3, "OnEdit").deployment
    assert not replaces_pods(held, live), "a held template is what runs"
    same = hold_engine_template(before, live, 3, 3, "OnEdit").deployment
    assert not replaces_pods(same, live), "the same rendering (server defaults aside) changes nothing"
    edited = hold_engine_template(after, live, 4, 3, "OnEdit").deployment
    assert replaces_pods(edited, live)


# --- LoRA: the adapter list is not in the engine pod ---------------------------------------------------

LORA_SLOTS = {"maxLoras": 2, "maxLoraRank": 32}


def _adapter(name: str) -> dict[str, Any]:
    return {"name": name, "source": {"huggingFace": {"repo": f"my-org/{name}-lora", "revision": "ab" * 20}}}


def test_adding_or_removing_an_adapter_keeps_the_engine_pod() -> None:
    lists: list[list[dict[str, Any]]] = [[], [_adapter("sql")], [_adapter("sql"), _adapter("chat")]]
    templates = {
        content_hash(_engine_deployment(lora=LORA_SLOTS | {"adapters": a})["spec"]["template"]) for a in lists
    }
    assert len(templates) == 1
    reviews = [reviewed(lora=LORA_SLOTS | {"adapters": a}) for a in lists]
    assert not edit_impact(reviews[1], reviews[2], free_gpus=0).restarts_engines
    assert not edit_impact(reviews[2], reviews[0], free_gpus=0).restarts_engines


@pytest.mark.parametrize(
    ("change", "flags"),
    [
        ({"maxLoras": 3}, ["--max-loras", "--max-cpu-loras"]),  # maxCpuLoras defaults to maxLoras
        ({"maxLoraRank": 64}, ["--max-lora-rank"]),
        ({"maxCpuLoras": 4}, ["--max-cpu-loras"]),
    ],
)
def test_changing_a_slot_setting_restarts_the_engines(change: dict[str, Any], flags: list[str]) -> None:
    base = reviewed(lora=LORA_SLOTS | {"adapters": [_adapter("sql")]})
    edited = reviewed(lora=LORA_SLOTS | change | {"adapters": [_adapter("sql")]})
    before = _engine_deployment(lora=LORA_SLOTS)["spec"]["template"]
    after = _engine_deployment(lora=LORA_SLOTS | change)["spec"]["template"]
    assert content_hash(before) != content_hash(after)
    impact = edit_impact(base, edited, free_gpus=0)
    args = after["spec"]["containers"][0]["args"]
    assert impact.restarts_engines
    assert impact.changes == [f".spec.containers[0].args[{args.index(flag) + 1}]" for flag in flags]


def test_turning_lora_on_adds_the_flags_and_the_runtime_loading_switch() -> None:
    impact = edit_impact(reviewed(), reviewed(lora=LORA_SLOTS), free_gpus=0)
    assert impact.restarts_engines
    # The flags and the switch, the lora-sync sidecar (a container added) and its ConfigMap volume.
    assert set(impact.changes) == {".spec.containers", ".spec.volumes"}
    env = _engine_deployment(lora=LORA_SLOTS)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"} in env
    plain = _engine_deployment()["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in {e["name"] for e in plain}
