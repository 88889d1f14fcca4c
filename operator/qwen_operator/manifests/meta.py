"""Object metadata shared by every child: name, namespace, labels, owner reference."""

from __future__ import annotations

from typing import Any

from .. import names
from ..api.spec import API_VERSION, KIND, QwenDeployment


def owner_reference(qd: QwenDeployment) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": qd.metadata.name,
        "uid": qd.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(qd: QwenDeployment, name: str, component: str, **extra: Any) -> dict[str, Any]:
    """Metadata of a namespaced child; owned by the resource once it has a uid (offline renders have none)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": qd.metadata.namespace,
        "labels": names.labels(qd, component),
    }
    if qd.metadata.uid:
        meta["ownerReferences"] = [owner_reference(qd)]
    return meta | extra
