"""Invariants of the child builders, and strict schema validation of everything they render."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from qwen_operator.api.catalog import GPUS
from qwen_operator.api.review import Review, review
from qwen_operator.api.rollout import Rollout
from qwen_operator.kinds import optional
from qwen_operator.manifests import ClusterFacts, build_all, build_children, scaling
from qwen_operator.manifests.engine import startup_seconds
from support import EXAMPLES, load

#: Kind name -> CRD of the kinds that need one.
CRD_OF_KIND = {k.kind: k.crd for k in optional()}

K8S_SCHEMA_VERSION = "1.36"  # the dev cluster's Kubernetes version


def _review(path: Any = None, **spec: Any) -> Review:
    body = load(path or EXAMPLES[0])
    body["metadata"]["uid"] = "0b1c2d3e-0000-4000-8000-000000000001"
    body["spec"] |= spec
    return review(body)


def _by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _engine(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in _by_kind(objects, "Deployment") if o["metadata"]["name"].endswith("-engine"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_gpu_request_is_tensor_times_pipeline(example: Any) -> None:
    rev = _review(example)
    container = _engine(build_all(rev))["spec"]["template"]["spec"]["containers"][0]
    want = str(rev.plan.tensor_parallel_size * rev.plan.pipeline_parallel_size)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == want
    assert container["resources"]["requests"]["nvidia.com/gpu"] == want
    args = container["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == str(rev.plan.tensor_parallel_size)


def test_engine_lands_on_the_gpu_pool_and_tolerates_its_taint() -> None:
    rev = _review(gpu={"type": "H100-80GB"})
    pod = _engine(build_all(rev))["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchExpressions"][0]["values"] == list(GPUS["H100-80GB"].product_labels)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_user_node_selector_replaces_the_default_affinity() -> None:
    rev = _review(gpu={"type": "A100-80GB", "nodeSelector": {"pool": "gpu-a"}})
    pod = _engine(build_all(rev))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu-a"}
    assert "affinity" not in pod


def test_no_replicas_field_when_autoscaled() -> None:
    rev = _review(replicas=None, autoscaling={"minReplicas": 1, "maxReplicas": 3})
    objects = build_all(rev)
    assert "replicas" not in _engine(objects)["spec"]
    hpa = _by_kind(objects, "HorizontalPodAutoscaler")[0]
    assert hpa["spec"]["maxReplicas"] == 3
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == scaling.HPA_METRIC == "qwen_queue_depth"


def test_fixed_replicas_are_written() -> None:
    assert _engine(build_all(_review(replicas=3)))["spec"]["replicas"] == 3


def test_selectors_do_not_change_with_the_spec() -> None:
    """Deployment selectors are immutable: no spec change may alter them."""
    a = _engine(build_all(_review()))["spec"]["selector"]
    b = _engine(build_all(_review(engine={"maxModelLen": 8192}, replicas=4)))["spec"]["selector"]
    assert a == b


def test_rollout_surges_only_with_free_gpus() -> None:
    assert Rollout.choose(None, 2).mode == "InPlace"
    assert Rollout.choose(1, 2).mode == "InPlace"
    assert Rollout.choose(2, 2).mode == "Surge"
    rev = _review()
    strategy = _engine(build_children(rev, ClusterFacts(free_gpus=0)).objects)["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_startup_probe_budget_grows_with_the_weights() -> None:
    bf16 = _review()
    awq = _review(
        model={"name": "Qwen/Qwen3-32B-AWQ"},
        gpu={"type": "L40S-48GB", "gpusPerNode": 4},
        parallelism={"tensor": 1},
    )
    assert startup_seconds(bf16) > startup_seconds(awq) >= 600
    probe = _engine(build_all(bf16))["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= startup_seconds(bf16)


@pytest.mark.parametrize(("grace", "hung"), [(120, 30), (31, 30), (30, None), (0, None)])
def test_a_hung_engine_is_killed_after_the_liveness_probes_grace_not_the_drains(
    grace: int, hung: int | None
) -> None:
    """A liveness kill waits the probe's terminationGracePeriodSeconds when it is shorter than the
    pod's (the drain of a rollout); an engine that answers nothing drains nothing. Run for real:
    e2e/test_real_journey.py (a SIGSTOPped engine killed 30 s after the verdict)."""
    rev = _review(engine={"terminationGracePeriodSeconds": grace})
    pod = _engine(build_all(rev))["spec"]["template"]["spec"]
    liveness = pod["containers"][0]["livenessProbe"]
    assert pod["terminationGracePeriodSeconds"] == grace
    assert liveness.get("terminationGracePeriodSeconds") == hung
    assert liveness["periodSeconds"] * liveness["failureThreshold"] == 90


def test_api_keys_come_from_secrets_never_literals() -> None:
    rev = _review(
        engine={"apiKeySecret": {"name": "engine-key"}},
        model={"name": "Qwen/Qwen3-32B", "hfTokenSecret": {"name": "hf"}},
    )
    container = _engine(build_all(rev))["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "engine-key", "key": "token"}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    assert "--api-key" not in container["args"]


def test_missing_optional_crds_skip_their_children() -> None:
    rev = _review(monitoring={"serviceMonitor": True, "prometheusRule": True})
    full = {o["kind"] for o in build_all(rev)}
    assert {"ServiceMonitor", "PrometheusRule"} <= full
    children = build_children(rev, ClusterFacts(missing_crds=frozenset(CRD_OF_KIND.values())))
    assert not {o["kind"] for o in children.objects} & set(CRD_OF_KIND)
    assert any(s.kind.kind == "ServiceMonitor" for s in children.skipped)


def test_every_child_is_owned_and_labelled() -> None:
    for obj in build_all(_review()):
        meta = obj["metadata"]
        assert meta["ownerReferences"][0]["uid"] == "0b1c2d3e-0000-4000-8000-000000000001"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "qwen-operator"
        assert meta["labels"]["qwenops.dev/deployment"] == "chat-a100"


def test_gateway_off_points_the_client_service_at_the_engines() -> None:
    objects = build_all(_review(gateway={"enabled": False}))
    service = next(o for o in _by_kind(objects, "Service") if o["metadata"]["name"] == "chat-a100")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "engine"
    assert not _by_kind(objects, "NetworkPolicy")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_rendered_objects_pass_strict_schema_validation(example: Any) -> None:
    rev = _review(example)
    for variant in (rev, _with_everything(rev)):
        for obj in build_all(variant):
            if obj["kind"] in CRD_OF_KIND:
                continue  # CRD-typed: no upstream schema in kubernetes-validate
            clean = yaml.safe_load(yaml.safe_dump(obj))
            kubernetes_validate.validate(clean, K8S_SCHEMA_VERSION, strict=True)


def _with_everything(rev: Review) -> Review:
    body = copy.deepcopy(rev.resource.model_dump(by_alias=True, exclude_none=True))
    body["metadata"]["uid"] = "0b1c2d3e-0000-4000-8000-000000000001"
    body["spec"]["gateway"]["ingress"] = {"host": "chat.example.com", "tlsSecretName": "chat-tls"}
    body["spec"]["engine"]["priorityClassName"] = "gpu-high"
    body["spec"]["model"]["cache"] = {"claimName": "qwen-weights"}
    body["spec"]["gpu"]["runtimeClassName"] = "nvidia"
    body["spec"]["imagePullSecrets"] = [{"name": "registry-mirror"}]
    return review(body)


def _pods(rev: Review) -> dict[str, dict[str, Any]]:
    """Pod spec of each Deployment by component (engine, gateway)."""
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["spec"]
        for o in _by_kind(build_all(rev), "Deployment")
    }


def test_runtime_class_and_pull_secrets_reach_the_pods_that_need_them() -> None:
    pods = _pods(_review())
    assert all("runtimeClassName" not in p and "imagePullSecrets" not in p for p in pods.values())
    pods = _pods(
        _review(gpu={"type": "A100-80GB", "runtimeClassName": "nvidia"}, imagePullSecrets=[{"name": "m"}])
    )
    assert pods["engine"]["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in pods["gateway"], "the gateway runs no GPU code"
    assert pods["engine"]["imagePullSecrets"] == pods["gateway"]["imagePullSecrets"] == [{"name": "m"}]


def _disk(rev: Review) -> tuple[str, str]:
    resources = _pods(rev)["engine"]["containers"][0]["resources"]
    return resources["requests"]["ephemeral-storage"], resources["limits"]["ephemeral-storage"]


def test_ephemeral_storage_covers_an_emptydir_model_cache() -> None:
    rev = _review(model={"name": "Qwen/Qwen3-32B"})  # no claim: the weights go to an emptyDir
    volume = next(v for v in _pods(rev)["engine"]["volumes"] if v["name"] == "model-cache")
    limit_gib = int(volume["emptyDir"]["sizeLimit"].removesuffix("Gi"))
    assert limit_gib * 2**30 > rev.plan.weights_bytes_per_gpu * rev.plan.gpus_per_replica
    # The cache's usage counts against the pod's ephemeral storage: a request below it would let the
    # scheduler place the pod on a disk too small, and a limit below it evicts the pod mid-download.
    assert _disk(rev) == (f"{limit_gib + 10}Gi", f"{limit_gib + 10}Gi")
    claimed = _review(model={"name": "Qwen/Qwen3-32B", "cache": {"claimName": "weights"}})
    assert _disk(claimed) == ("10Gi", "10Gi")
    chosen = _review(engine={"resources": {"ephemeralStorage": "200G"}})
    assert _disk(chosen) == ("200G", "200G")


def test_one_gateway_configuration_render_per_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConfigMap and the pod's config hash come from one render; the limits are split once."""
    from qwen_operator.gateway import config, limits

    calls = {"limits": 0, "nginx": 0}
    real_limits, real_nginx = limits.Limits.of, config.nginx_conf

    def counted_limits(rev: Review) -> limits.Limits:
        calls["limits"] += 1
        return real_limits(rev)

    def counted_nginx(*args: Any, **kwargs: Any) -> str:
        calls["nginx"] += 1
        return real_nginx(*args, **kwargs)

    monkeypatch.setattr(limits.Limits, "of", staticmethod(counted_limits))
    monkeypatch.setattr(config, "nginx_conf", counted_nginx)
    build_children(_review())
    assert calls == {"limits": 1, "nginx": 1}
