"""The GPU pool's nodes: the engine pod's scheduling terms and the free-GPU count use one definition.

Nodes are judged as the scheduler judges them (nodeSelector, required node affinity, taints), so the
rollout strategy's free-GPU count looks at exactly the nodes engine pods can land on.
"""

from __future__ import annotations

from typing import Any

import pytest

from qwen_operator.api.pool import NodePool
from qwen_operator.api.review import review
from qwen_operator.api.spec import GpuPool, SpecError
from qwen_operator.manifests import build_all, node_pool
from support import example

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(name: str, labels: dict[str, str], taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints or [GPU_TAINT]}}


def pool(**gpu: Any) -> NodePool:
    return NodePool.of(GpuPool.model_validate({"type": "A100-80GB", **gpu}))


A100 = node("a100-0", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "pool": "spot"})
H100 = node("h100-0", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "spot"})


def test_default_pool_is_the_gpu_products_nodes() -> None:
    p = pool()
    assert p.admits(A100)
    assert not p.admits(H100)
    assert not p.admits(node("cpu", {}))


def test_untolerated_taints_keep_nodes_out() -> None:
    tainted = node(
        "a100-1", A100["metadata"]["labels"], [GPU_TAINT, {"key": "maintenance", "effect": "NoExecute"}]
    )
    assert not pool().admits(tainted)
    assert pool().admits(
        node("a100-2", A100["metadata"]["labels"], [{"key": "x", "effect": "PreferNoSchedule"}])
    )
    everything = pool(tolerations=[{"operator": "Exists"}])
    assert everything.admits(tainted)


def test_node_selector_replaces_the_product_match() -> None:
    p = pool(nodeSelector={"pool": "spot"})
    assert p.admits(A100) and p.admits(H100)
    assert not p.admits(node("x", {"pool": "on-demand"}))


def test_user_affinity_decides_membership() -> None:
    """The bug this module fixes: with gpu.affinity set, the count used the product labels instead."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["spot"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["reserved-0"]}]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}
            ],
        }
    }
    p = pool(affinity=affinity)
    assert p.admits(H100)  # no A100 label, but the affinity allows it: the scheduler would use it
    assert p.admits(node("reserved-0", {}))
    assert not p.admits(node("a100-9", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}))


@pytest.mark.parametrize(
    ("expression", "admitted"),
    [
        ({"key": "pool", "operator": "NotIn", "values": ["spot"]}, False),
        ({"key": "absent", "operator": "NotIn", "values": ["x"]}, True),
        ({"key": "pool", "operator": "Exists"}, True),
        ({"key": "pool", "operator": "DoesNotExist"}, False),
        ({"key": "gpus", "operator": "Gt", "values": ["4"]}, True),
        ({"key": "gpus", "operator": "Lt", "values": ["4"]}, False),
        ({"key": "pool", "operator": "Gt", "values": ["4"]}, False),  # not a number
    ],
)
def test_node_selector_operators(expression: dict[str, Any], admitted: bool) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]
            }
        }
    }
    labelled = node("n", {"pool": "spot", "gpus": "8"})
    assert pool(affinity=affinity).admits(labelled) is admitted


@pytest.mark.parametrize("gpu", [{}, {"nodeSelector": {"pool": "spot"}}, {"tolerations": []}])
def test_engine_pod_carries_the_pools_terms(gpu: dict[str, Any]) -> None:
    body = example("a100-80gb-tp2-bf16")
    body["spec"]["gpu"] |= gpu
    rev = review(body)
    (engine,) = [
        o for o in build_all(rev) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-engine")
    ]
    pod = engine["spec"]["template"]["spec"]
    terms = node_pool(rev).pod_scheduling()
    assert {k: pod.get(k) for k in terms} == terms
    assert not {"nodeSelector", "affinity"} - set(terms) & set(pod)  # nothing else constrains placement


GKE_H100 = node("gke-h100-0", {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"})
GKE_A100 = node("gke-a100-0", {"cloud.google.com/gke-accelerator": "nvidia-a100-80gb"})


def test_gke_accelerator_label_selects_the_pool_without_gpu_feature_discovery() -> None:
    p = NodePool.of(
        GpuPool.model_validate(
            {"type": "H100-80GB", "nodeLabel": {"key": "cloud.google.com/gke-accelerator"}}
        )
    )
    assert p.admits(GKE_H100)
    assert not p.admits(GKE_A100)
    assert not p.admits(H100), "GPU feature discovery's label is not what this pool reads"
    assert p.selection == "cloud.google.com/gke-accelerator in (nvidia-h100-80gb, nvidia-h100-mega-80gb)"


@pytest.mark.parametrize(
    "key", ["karpenter.k8s.aws/instance-gpu-name", "eks.amazonaws.com/instance-gpu-name"]
)
def test_eks_gpu_name_labels_select_the_pool(key: str) -> None:
    """Karpenter and EKS Auto Mode label nodes with EC2's GPU name, lower case."""
    p = NodePool.of(GpuPool.model_validate({"type": "H100-80GB", "nodeLabel": {"key": key}}))
    assert p.admits(node("eks-0", {key: "h100"}))
    assert not p.admits(node("eks-1", {key: "a100"}))
    assert p.selection == f"{key} in (h100)"


def test_any_label_with_its_values_selects_the_pool() -> None:
    labelled = node("site-0", {"example.com/gpu-model": "h100-sxm"})
    p = pool(nodeLabel={"key": "example.com/gpu-model", "values": ["h100-sxm"]})
    assert p.admits(labelled)
    assert not p.admits(A100)


@pytest.mark.parametrize(
    ("gpu", "path", "says"),
    [
        ({"nodeLabel": {"key": "example.com/gpu"}}, "spec.gpu.nodeLabel.values", "list the values"),
        (  # GKE offers no L40S: the catalog has no value to select on
            {"type": "L40S-48GB", "nodeLabel": {"key": "cloud.google.com/gke-accelerator"}},
            "spec.gpu.nodeLabel.values",
            "no value of cloud.google.com/gke-accelerator for L40S-48GB",
        ),
        (  # EC2's p4d and p4de both say a100: the name alone cannot tell 40 GB from 80 GB
            {"type": "A100-80GB", "nodeLabel": {"key": "karpenter.k8s.aws/instance-gpu-name"}},
            "spec.gpu.nodeLabel.values",
            "no value of karpenter.k8s.aws/instance-gpu-name for A100-80GB",
        ),
        (
            {"nodeLabel": {"key": "cloud.google.com/gke-accelerator"}, "nodeSelector": {"pool": "a"}},
            "spec.gpu.nodeLabel",
            "not both",
        ),
    ],
)
def test_a_node_label_that_selects_nothing_is_refused_with_its_path(
    gpu: dict[str, Any], path: str, says: str
) -> None:
    body = example("a100-80gb-tp2-bf16")
    body["spec"]["gpu"] = {"type": "A100-80GB", **gpu}
    with pytest.raises(SpecError) as caught:
        review(body)
    assert [p for p, m in caught.value.problems if says in m] == [path], caught.value.problems


def test_the_plan_says_which_label_it_selects_on() -> None:
    body = example("a100-80gb-tp2-bf16")
    assert review(body).plan_dict()["nodeSelection"].startswith("nvidia.com/gpu.product in (NVIDIA-")
    body["spec"]["gpu"]["nodeSelector"] = {"pool": "gpu-a"}
    assert review(body).plan_dict()["nodeSelection"] == "spec.gpu.nodeSelector pool=gpu-a"
