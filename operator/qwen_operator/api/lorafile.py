"""The contract between the operator and the `lora-sync` sidecar beside each engine (lorasync.py): the
desired-adapters file the operator renders into a ConfigMap from spec.lora and the sidecar reads, where
it is mounted, and the sidecar's port (its /status tells where each adapter is loaded).

    {"adapters": [{"name": "sql-expert", "path": "loras/sql"},
                  {"name": "x", "huggingFace": {"repo": "org/name", "revision": "<40-hex commit>"}}]}

`path` is relative to the model cache root that both the engine and the sidecar mount (the sidecar's
--model-cache); a Hugging Face source is downloaded into that cache's hub/ directory first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

#: The key of the ConfigMap, and so the file name under the sidecar's mount.
FILE_NAME = "adapters.json"
MOUNT_DIR = "/etc/qwen-operator/lora"
DESIRED_FILE = f"{MOUNT_DIR}/{FILE_NAME}"
#: The sidecar's /status, /metrics and /healthz.
SIDECAR_PORT = 8001

_REPO = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class DesiredFileError(ValueError):
    """The file (or the list given to `render`) is not a valid desired-adapters list."""


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face repository at one commit (a branch could move under running engines)."""

    repo: str
    revision: str


@dataclass(frozen=True)
class Adapter:
    """One desired adapter: its model name and exactly one source."""

    name: str
    path: str | None = None
    hub: HubSource | None = None


def problems(adapter: Adapter) -> list[str]:
    """What is wrong with one adapter (empty when nothing is)."""
    found = []
    if not adapter.name or adapter.name != adapter.name.strip():
        found.append("name must be a non-empty string without surrounding spaces")
    if (adapter.path is None) == (adapter.hub is None):
        found.append("set exactly one of path or huggingFace")
    if adapter.path is not None:
        parts = PurePosixPath(adapter.path).parts
        if not adapter.path or adapter.path.startswith("/") or ".." in parts:
            found.append(f"path {adapter.path!r} must be relative to the model cache and stay inside it")
    if adapter.hub is not None:
        if not _REPO.match(adapter.hub.repo):
            found.append(f"huggingFace.repo {adapter.hub.repo!r} is not owner/name")
        if not _COMMIT.match(adapter.hub.revision):
            found.append(f"huggingFace.revision {adapter.hub.revision!r} is not a 40-hex commit hash")
    return found


def _check(adapters: list[Adapter]) -> list[Adapter]:
    errors = [f"adapters[{i}] ({a.name!r}): {p}" for i, a in enumerate(adapters) for p in problems(a)]
    names = [a.name for a in adapters]
    errors += [f"adapter name {n!r} appears more than once" for n in sorted(set(names)) if names.count(n) > 1]
    if errors:
        raise DesiredFileError("; ".join(errors))
    return adapters


def _entry(adapter: Adapter) -> dict[str, Any]:
    if adapter.hub is not None:
        return {
            "name": adapter.name,
            "huggingFace": {"repo": adapter.hub.repo, "revision": adapter.hub.revision},
        }
    return {"name": adapter.name, "path": adapter.path}


def render(adapters: Iterable[Adapter]) -> str:
    """The file's text for these adapters (in the given order); DesiredFileError when one is invalid."""
    checked = _check(list(adapters))
    return json.dumps({"adapters": [_entry(a) for a in checked]}, indent=2) + "\n"


def _adapter(i: int, raw: Any) -> Adapter:
    if not isinstance(raw, dict):
        raise DesiredFileError(f"adapters[{i}] is not an object")
    unknown = set(raw) - {"name", "path", "huggingFace"}
    if unknown:
        raise DesiredFileError(f"adapters[{i}]: unknown fields {sorted(unknown)}")
    name, path, hub = raw.get("name"), raw.get("path"), raw.get("huggingFace")
    if not isinstance(name, str) or (path is not None and not isinstance(path, str)):
        raise DesiredFileError(f"adapters[{i}]: name and path must be strings")
    if hub is None:
        return Adapter(name, path=path)
    if not isinstance(hub, dict) or set(hub) != {"repo", "revision"}:
        raise DesiredFileError(f"adapters[{i}].huggingFace must have exactly repo and revision")
    if not all(isinstance(v, str) for v in hub.values()):
        raise DesiredFileError(f"adapters[{i}].huggingFace: repo and revision must be strings")
    return Adapter(name, path=path, hub=HubSource(hub["repo"], hub["revision"]))


def parse(text: str) -> list[Adapter]:
    """The adapters of a file's text; DesiredFileError (one message naming each problem) when invalid."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise DesiredFileError(f"not valid JSON: {error}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("adapters"), list):
        raise DesiredFileError('expected an object {"adapters": [...]}')
    return _check([_adapter(i, raw) for i, raw in enumerate(doc["adapters"])])
