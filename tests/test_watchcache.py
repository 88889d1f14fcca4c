"""The watch cache's store: newer versions win, indexes follow changes, a re-LIST reports the
difference. The informers themselves run against the real API server in e2e/test_watch_cache.py (and
under faults in e2e/test_api_faults.py, e2e/test_faults.py)."""

from __future__ import annotations

from typing import Any

from qwen_operator.k8s import _slim_node, _slim_pod, _without_managed_fields
from qwen_operator.watchcache import Store


def obj(name: str, version: int, owner: str = "a", namespace: str = "ns") -> dict[str, Any]:
    labels = {"qwenops.dev/deployment": owner}
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(version), "labels": labels}
    }


def by_owner(o: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["metadata"]["namespace"], o["metadata"]["labels"]["qwenops.dev/deployment"])]


def test_an_older_version_never_replaces_a_newer_one() -> None:
    store = Store()
    assert store.put(obj("x", 7))  # a write's answer
    assert not store.put(obj("x", 5))  # a late watch event of before the write
    assert store.get("ns", "x")["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    assert store.put(obj("x", 7)) and store.put(obj("x", 9))  # the watch catching up, then a change


def test_indexes_follow_changes_and_removals() -> None:
    store = Store(indexes={"owner": by_owner})
    store.put(obj("x", 1, owner="a"))
    store.put(obj("y", 1, owner="a"))
    store.put(obj("x", 2, owner="b"))  # relabelled
    assert [o["metadata"]["name"] for o in store.by("owner", ("ns", "a"))] == ["y"]
    assert [o["metadata"]["name"] for o in store.by("owner", ("ns", "b"))] == ["x"]
    store.remove(("ns", "y"))
    assert store.by("owner", ("ns", "a")) == [] and len(store) == 1


def test_a_relist_reports_what_changed_and_what_went() -> None:
    store = Store()
    for name, version in (("kept", 1), ("changed", 1), ("gone", 1)):
        store.put(obj(name, version))
    changed, gone = store.replace([obj("kept", 1), obj("changed", 4), obj("new", 5)])
    assert sorted(o["metadata"]["name"] for o in changed) == ["changed", "new"]
    assert [o["metadata"]["name"] for o in gone] == ["gone"]
    assert sorted(o["metadata"]["name"] for o in store.items()) == ["changed", "kept", "new"]


def test_nodes_and_pods_on_them_are_kept_slim() -> None:
    node = {
        "metadata": {"name": "n", "labels": {"a": "b"}, "resourceVersion": "3", "managedFields": [{}] * 20},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "images": [{"names": ["x"] * 50}],
            "conditions": [],
        },
    }
    assert _slim_node(node) == {
        "metadata": {"name": "n", "labels": {"a": "b"}, "resourceVersion": "3"},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "resourceVersion": "4",
            "annotations": {"x": "y" * 1000},
        },
        "spec": {
            "nodeName": "n",
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    assert _slim_pod(pod) == {
        "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "4"},
        "spec": {"nodeName": "n", "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
    }


def test_children_are_kept_whole_but_for_their_managed_fields() -> None:
    """The transform of the children's, own pods' and QwenDeployments' stores: a write's answer (or a
    watch event) loses metadata.managedFields, nothing else, and the caller's object is left as it was."""
    fields = [{"manager": "qwen-operator", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]
    answer = obj("x", 3) | {"spec": {"replicas": 2}}
    answer["metadata"] |= {"managedFields": fields, "annotations": {"qwenops.dev/hash": "h"}}
    store = Store(transform=_without_managed_fields)
    store.put(answer)
    kept = store.get("ns", "x")
    assert kept is not None and "managedFields" not in kept["metadata"]
    meta = {k: v for k, v in answer["metadata"].items() if k != "managedFields"}
    assert kept == answer | {"metadata": meta}
    assert answer["metadata"]["managedFields"] == fields
    assert _without_managed_fields(obj("y", 1)) == obj("y", 1)
