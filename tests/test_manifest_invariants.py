"""What the cases without a golden file of their own are there for, as invariants of `build_children`:
the rollout strategy from the free GPUs (and its way back from the engine Deployment), a cluster without
the optional CRDs, the gateway off, engines scaled to zero, and each example's pool and checkpoint.

The whole render of two cases is golden (tests/test_golden_manifests.py); each builder's own invariants
are in tests/test_manifests.py, the command lines in test_engine_args.py and test_gateway_render.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from qwen_operator import names
from qwen_operator.api.catalog import GPUS
from qwen_operator.api.review import Review, review
from qwen_operator.api.rollout import ROLLOUT_ANNOTATION, Rollout
from qwen_operator.kinds import optional
from qwen_operator.manifests import ClusterFacts, build_all, build_children
from support import GOLDEN, example, load

INPUTS = GOLDEN / "inputs"
OPTIONAL_CRDS = sorted({k.crd for k in optional() if k.crd})


def _engine(rev: Review, objects: list[dict[str, Any]]) -> dict[str, Any]:
    name = names.engine(rev.resource)
    (engine,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    return engine


def _component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


# --- the rollout strategy ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("free_gpus", "mode", "reason"),
    [
        (None, "InPlace", "free GPUs in the pool unknown"),  # an offline render
        (1, "InPlace", "fewer free GPUs in the pool than the 2 of a surge replica"),
        (2, "Surge", "the pool has the 2 free GPUs of a surge replica"),
        (16, "Surge", "the pool has the 2 free GPUs of a surge replica"),  # the threshold, not the count
    ],
)
def test_the_engine_surges_only_onto_the_free_gpus_of_a_whole_replica(
    free_gpus: int | None, mode: str, reason: str
) -> None:
    rev = review(example("h100-80gb-tp2-fp8-128k"))
    assert rev.plan.gpus_per_replica == 2
    children = build_children(rev, ClusterFacts(free_gpus=free_gpus))
    engine = _engine(rev, children.objects)
    surge, unavailable = (1, 0) if mode == "Surge" else (0, 1)
    assert engine["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
    }
    assert engine["metadata"]["annotations"][ROLLOUT_ANNOTATION].startswith(f"{mode}: {reason}")
    # The next reconcile, mid-rollout, reads the strategy back from the annotation and keeps it.
    rolling = engine | {
        "status": {"observedGeneration": 0, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}
    }
    assert Rollout.kept(rolling) == children.rollout


# --- a cluster without the optional CRDs -------------------------------------------------------------


def test_the_everything_input_asks_for_a_child_of_every_optional_kind() -> None:
    """So that the next test drops each of them."""
    kinds = {o["kind"] for o in build_all(review(load(INPUTS / "everything.yaml")))}
    assert {k.kind for k in optional()} <= kinds


@pytest.mark.parametrize("missing", [*OPTIONAL_CRDS, "all"])
def test_a_missing_crd_drops_the_children_of_its_kind_and_changes_no_other(missing: str) -> None:
    """Facts as a live reconcile has them (GPUs free for a surge), with one optional CRD missing or all."""
    crds = frozenset(OPTIONAL_CRDS if missing == "all" else [missing])
    rev = review(load(INPUTS / "everything.yaml"))
    full = build_all(rev, ClusterFacts(free_gpus=16))
    children = build_children(rev, ClusterFacts(free_gpus=16, missing_crds=crds))
    dropped_kinds = {k.kind for k in optional() if k.crd in crds}
    assert children.objects == [o for o in full if o["kind"] not in dropped_kinds]
    assert [(s.kind.kind, s.name) for s in children.skipped] == [
        (o["kind"], o["metadata"]["name"]) for o in full if o["kind"] in dropped_kinds
    ]
    assert {s.kind.crd for s in children.skipped} == crds
    assert children.rollout.mode == "Surge"


# --- the gateway off ---------------------------------------------------------------------------------


def test_with_the_gateway_off_only_engine_objects_are_rendered() -> None:
    """Clients call the engines: no gateway pod, its RBAC, config, disruption budget or scrape, and no
    NetworkPolicy (which admits only the gateway and the scrapers); the engines' own objects stay."""
    rev = review(load(INPUTS / "gateway-off.yaml"))
    assert not rev.resource.spec.gateway.enabled
    objects = build_all(rev)
    assert {_component(o) for o in objects} == {"engine"}
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "NetworkPolicy", "PodMonitor"}
    assert {"HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule"} <= kinds  # what it asks for
    client_name = names.client_service(rev.resource)
    (client,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == client_name]
    assert client["spec"]["selector"] == names.selector(rev.resource, "engine")
    assert client["spec"]["ports"] == [
        {
            "name": "http",
            "port": rev.resource.spec.gateway.service.port,
            "targetPort": "http",
            "protocol": "TCP",
        }
    ]


# --- engines scaled to zero --------------------------------------------------------------------------


def test_engines_scaled_to_zero_are_scaled_by_keda_alone_behind_a_holding_gateway() -> None:
    rev = review(load(INPUTS / "scale-to-zero.yaml"))
    autoscaling = rev.resource.spec.autoscaling
    assert autoscaling is not None and autoscaling.min_replicas == 0
    objects = build_all(rev)
    engine = _engine(rev, objects)
    assert "replicas" not in engine["spec"], "an apply would lift the engines off zero"
    assert engine["metadata"]["annotations"][names.REPLICAS_OWNER_ANNOTATION] == "autoscaler"
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]  # KEDA makes its own
    (scaled,) = [o for o in objects if o["kind"] == "ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": names.engine(rev.resource),
    }
    assert scaled["spec"]["minReplicaCount"] == 0
    gateway = next(o for o in objects if o["kind"] == "Deployment" and _component(o) == "gateway")
    assert "activator" in {c["name"] for c in gateway["spec"]["template"]["spec"]["containers"]}


# --- each example's pool and checkpoint ---------------------------------------------------------------


#: Example -> the engine's --quantization (None: the checkpoint's own dtype) and its Deployment's
#: replicas (None: the autoscaler's), as the example's comment describes it.
EXAMPLE_ENGINES: dict[str, tuple[str | None, int | None]] = {
    "a100-80gb-tp2-bf16": (None, 1),
    "h100-80gb-tp2-fp8-128k": ("fp8", None),
    "l40s-48gb-tp1-awq": ("awq_marlin", 2),
}


@pytest.mark.parametrize("name", sorted(EXAMPLE_ENGINES))
def test_each_example_serves_its_checkpoint_on_its_pool(name: str) -> None:
    body = example(name)
    rev = review(body)
    engine = _engine(rev, build_all(rev))
    pod = engine["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["values"] == list(GPUS[body["spec"]["gpu"]["type"]].product_labels)
    args = pod["containers"][0]["args"]
    assert args[0] == body["spec"]["model"]["name"]
    quantization, replicas = EXAMPLE_ENGINES[name]
    assert (args[args.index("--quantization") + 1] if "--quantization" in args else None) == quantization
    assert engine["spec"].get("replicas") == replicas


# --- what the kubelet expands ------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["everything", "scale-to-zero"])
def test_every_variable_a_container_names_in_its_arguments_is_in_its_environment(case: str) -> None:
    """The kubelet expands $(NAME) in args from the container's own env and leaves an unknown one as it
    is: vllm-router would then send the literal text as the engine key (its --api-key, which the
    Responses and Messages routes depend on). Each tier's key is optional, so present as a variable."""
    objects = build_all(review(load(INPUTS / f"{case}.yaml")))
    containers = [
        c
        for o in objects
        if o["kind"] == "Deployment"
        for c in [
            *o["spec"]["template"]["spec"]["containers"],
            *o["spec"]["template"]["spec"].get("initContainers", []),
        ]
    ]
    named = 0
    for c in containers:
        env = {e["name"] for e in c.get("env", [])}
        for arg in [*c.get("command", []), *c.get("args", [])]:
            for variable in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                named += 1
                assert variable in env, f"{c['name']}: $({variable}) without an env entry"
    assert named >= 1  # the router's engine key at least
