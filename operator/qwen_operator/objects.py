"""Comparisons of Kubernetes objects as plain dicts: what the reconciler and the builders both need."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["changed_paths", "contains", "content_hash"]


def content_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def contains(live: Any, want: Any) -> bool:
    """True when every field of `want` is in `live` with the same value (the server may add more)."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(map(contains, live, want))
    return bool(live == want or str(live) == str(want))


def changed_paths(live: Any, want: Any, path: str = "") -> list[str]:
    """The paths at which `live` does not contain `want` (see `contains`), e.g. `.containers[0].args`;
    a list of another length is one path."""
    if isinstance(want, dict) and isinstance(live, dict):
        return [p for k, v in want.items() for p in changed_paths(live.get(k), v, f"{path}.{k}")]
    if isinstance(want, list) and isinstance(live, list) and len(want) == len(live):
        return [
            p
            for i, (a, b) in enumerate(zip(live, want, strict=True))
            for p in changed_paths(a, b, f"{path}[{i}]")
        ]
    return [] if contains(live, want) else [path or "."]
