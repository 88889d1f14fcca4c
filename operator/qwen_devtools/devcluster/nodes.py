"""Simulated node pools: GPU nodes labelled like NVIDIA GPU feature discovery does, plus one CPU node.

The nodes are ordinary Node objects annotated ``kwok.x-k8s.io/node: fake``; kwok keeps them Ready and
plays the pod lifecycle on them, and the real scheduler places pods using their capacity, labels and
taints. GPU nodes carry the usual ``nvidia.com/gpu=present:NoSchedule`` taint; the CPU node has none,
except beside a real node (``up --real-node``): then it carries ``qwenops.dev/simulated=true:NoSchedule``,
so that pods without tolerations (the operator, the gateway) can only land on the real node, where
they actually run, while pods that tolerate it (or the GPU taint) may still use the simulated pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from qwen_operator.api.catalog import GPU_PRODUCT_LABEL, GPU_RESOURCE

from ..wait import Timeout, wait_until

POOL_LABEL = "qwenops.dev/pool"
KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
SIMULATED_TAINT = {"key": "qwenops.dev/simulated", "value": "true", "effect": "NoSchedule"}
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@dataclass(frozen=True)
class Pool:
    """A group of identical nodes; ``product`` is empty for CPU-only nodes."""

    name: str
    count: int
    instance_type: str
    cpu: str
    memory: str
    product: str = ""
    gpus: int = 0
    gpu_memory_mib: int = 0
    gpu_family: str = ""


POOLS = (
    Pool("a100-80gb", 2, "p4de.24xlarge", "96", "1152Gi", "NVIDIA-A100-SXM4-80GB", 8, 81920, "ampere"),
    Pool("h100-80gb", 2, "p5.48xlarge", "192", "2048Gi", "NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper"),
    Pool("a100-40gb", 1, "p4d.24xlarge", "96", "1152Gi", "NVIDIA-A100-SXM4-40GB", 8, 40960, "ampere"),
    Pool("l40s-48gb", 1, "g6e.12xlarge", "48", "384Gi", "NVIDIA-L40S", 4, 46068, "ada-lovelace"),
    Pool("cpu", 1, "m6i.8xlarge", "32", "128Gi"),
)


def _labels(pool: Pool, node: str) -> dict[str, str]:
    labels = {
        "kubernetes.io/hostname": node,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": pool.instance_type,
        "type": "kwok",
        POOL_LABEL: pool.name,
    }
    if pool.gpus:
        labels |= {
            "nvidia.com/gpu.present": "true",
            GPU_PRODUCT_LABEL: pool.product,
            "nvidia.com/gpu.count": str(pool.gpus),
            "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
            "nvidia.com/gpu.family": pool.gpu_family,
        }
    return labels


def node_body(pool: Pool, index: int, beside_real_node: bool = False) -> dict[str, Any]:
    """The Node object (with status, which creation keeps) for node ``index`` of ``pool``.

    ``beside_real_node`` taints the CPU node too (see the module docstring).
    """
    name = f"{pool.name}-{index}"
    resources = {"cpu": pool.cpu, "memory": pool.memory, "pods": "110", "ephemeral-storage": "2Ti"}
    if pool.gpus:
        resources[GPU_RESOURCE] = str(pool.gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": _labels(pool, name), "annotations": KWOK_ANNOTATION},
        "spec": {"providerID": f"kwok://{name}", "taints": _taints(pool, beside_real_node)},
        "status": {"capacity": resources, "allocatable": resources},
    }


def _taints(pool: Pool, beside_real_node: bool) -> list[dict[str, str]]:
    if pool.gpus:
        return [GPU_TAINT]
    return [SIMULATED_TAINT] if beside_real_node else []


def create_all(api: client.CoreV1Api, beside_real_node: bool = False) -> list[str]:
    """Create every node of every pool (existing ones are left alone); returns the node names."""
    names = []
    for pool in POOLS:
        for index in range(pool.count):
            body = node_body(pool, index, beside_real_node)
            try:
                api.create_node(body)  # type: ignore[arg-type]  # the client accepts plain dicts
            except client.ApiException as error:
                if error.status != 409:
                    raise
            names.append(body["metadata"]["name"])
    return names


def list_simulated(api: client.CoreV1Api) -> list[dict[str, Any]]:
    """The kwok-managed Node objects as plain dicts, sorted by name."""
    node_list = api.api_client.sanitize_for_serialization(api.list_node(label_selector="type=kwok"))
    return sorted(node_list["items"], key=lambda n: str(n["metadata"]["name"]))


def _ready(node: dict[str, Any]) -> str:
    conditions = node.get("status", {}).get("conditions") or []
    return next((str(c["status"]) for c in conditions if c["type"] == "Ready"), "Unknown")


def _schedulable(node: dict[str, Any]) -> bool:
    taints = {t["key"] for t in node["spec"].get("taints") or []}
    return _ready(node) == "True" and not taints.intersection(NOT_READY_TAINTS)


def wait_ready(api: client.CoreV1Api, names: list[str], timeout: float) -> None:
    """Wait until the named nodes are Ready and rid of the not-ready taints; TimeoutError otherwise."""
    pending = set(names)

    def all_ready() -> bool:
        nonlocal pending
        pending = set(names) - {n["metadata"]["name"] for n in list_simulated(api) if _schedulable(n)}
        return not pending

    try:
        wait_until(all_ready, timeout, "the simulated nodes", interval=0.5)
    except Timeout:
        raise TimeoutError(f"nodes not Ready after {timeout:.0f}s: {', '.join(sorted(pending))}") from None


def gpu_table(api: client.CoreV1Api, extra: Sequence[tuple[str, str, str, str, str]] = ()) -> str:
    """A ``kubectl get nodes``-like table of the simulated nodes: name, pool, product, GPUs, status;
    ``extra`` rows (the real node) come first."""
    rows = [("NAME", "POOL", "GPU PRODUCT", "GPUS", "READY"), *extra]
    for node in list_simulated(api):
        labels = node["metadata"].get("labels") or {}
        gpus = node.get("status", {}).get("capacity", {}).get(GPU_RESOURCE, "0")
        product = labels.get(GPU_PRODUCT_LABEL, "-")
        rows.append((node["metadata"]["name"], labels.get(POOL_LABEL, "-"), product, gpus, _ready(node)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
