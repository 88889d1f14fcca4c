"""What a docker-archive tarball (`podman save --format docker-archive`) says about its image, read
from its manifest and config JSON without podman or a container runtime. Standard library only."""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ArchiveImage:
    """The parts of an archived image's config a pod depends on."""

    repo_tags: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    user: str
    env: dict[str, str]
    workdir: str
    layers: int


def read_archive(archive: Path) -> ArchiveImage:
    """The first image of ``archive``: tags, entrypoint, cmd, user, environment, layer count.

    Only the tar headers are walked to find manifest.json and the config; layer data is skipped over.
    """
    with tarfile.open(archive, mode="r:") as tar:
        manifest = _json(tar, "manifest.json")[0]
        config: dict[str, Any] = _json(tar, manifest["Config"]).get("config") or {}
    env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
    return ArchiveImage(
        repo_tags=tuple(manifest.get("RepoTags") or ()),
        entrypoint=tuple(config.get("Entrypoint") or ()),
        cmd=tuple(config.get("Cmd") or ()),
        user=str(config.get("User") or ""),
        env=env,
        workdir=str(config.get("WorkingDir") or ""),
        layers=len(manifest.get("Layers") or ()),
    )


def _json(tar: tarfile.TarFile, name: str) -> Any:
    member = tar.extractfile(name)
    if member is None:
        raise ValueError(f"{name} is not a file in the archive")
    return json.load(member)
