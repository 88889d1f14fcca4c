"""Building an image once per content key: the base, the wheels, `podman build`, the archive.

A built image is a docker-archive tarball ``<cache>/images/<name>-<key>.tar`` (what `ctr images import`
loads); while it exists, `ensure_image` returns at once. Archives of older keys are deleted when a new
one is written, so each image takes its size once on disk.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..repo import REPO
from ..vllm_env import HOW_TO_GET, vllm_venv
from . import podman
from .base import base_key, ensure_base
from .podman import images_dir, progress
from .specs import SERVING, SPECS, WHEELS_MOUNT, ImageSpec, content_key, requirement_lines


@dataclass(frozen=True)
class BuiltImage:
    """A built image: the reference it is tagged with, its archive and its content key."""

    ref: str
    archive: Path
    key: str


class VenvMissing(RuntimeError):
    """The engine image copies the vLLM CPU venv, which is not made yet."""


def archive_path(name: str, key: str) -> Path:
    """Where the archive of ``name`` at content ``key`` is (or will be)."""
    return images_dir() / f"{name}-{key}.tar"


def image_key(name: str) -> str:
    """The content key ``name`` has now (no build)."""
    return content_key(SPECS[name], base_key())


def ensure_image(name: str) -> BuiltImage:
    """The image ``name`` (operator, gateway, engine-cpu) built and archived for its current content key.

    Cold: the base (debootstrap, about 1 min), wheels, `podman build` and `podman save`; the engine
    copies about 6 GB and takes several minutes. Warm (archive present): returns at once.
    """
    spec = SPECS[name]
    key = image_key(name)
    archive = archive_path(name, key)
    if not archive.exists():
        with podman.exclusive(name):
            if not archive.exists():  # another process may have built it while this one waited
                _build(spec, archive)
    else:
        progress("images", f"{name}: {spec.ref} is built ({archive})")
    return BuiltImage(spec.ref, archive, key)


def _build(spec: ImageSpec, archive: Path) -> None:
    name, key = spec.name, archive.stem.removeprefix(f"{spec.name}-")
    started = time.monotonic()
    progress("images", f"{name}: building {spec.ref} (key {key})")
    contexts: dict[str, Path] = {}
    if spec.needs_vllm_venv:
        if not (vllm_venv() / "READY").exists():
            raise VenvMissing(f"the vLLM CPU venv {vllm_venv()} is missing; {HOW_TO_GET}")
        contexts["vllm-venv"] = vllm_venv()
    if spec.program:
        contexts["program"] = spec.program().parent
    build_args = dict(spec.build_args)
    if spec.base_arg:
        build_args[spec.base_arg] = ensure_base().ref
    volumes: list[str] = []
    if spec.requirements:
        wheels = wheelhouse(spec)
        # the build steps cannot verify PyPI's certificate here: pip installs the wheels offline
        build_args.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=WHEELS_MOUNT)
        volumes.append(f"{wheels}:{WHEELS_MOUNT}:ro")
    step = time.monotonic()
    podman.build(REPO / spec.dockerfile, REPO, spec.ref, build_args, contexts, volumes)
    progress("images", f"{name}: podman build done", step)
    step = time.monotonic()
    podman.save(spec.ref, archive)
    progress("images", f"{name}: saved {archive} ({archive.stat().st_size / 2**30:.2f} GiB)", step)
    # Older archives of this image only: `<name>-<content key>.tar`, never another image's whose name
    # starts with this one's (prometheus-operator-<key>.tar is not an old prometheus archive).
    for old in images_dir().glob(f"{name}-{'[0-9a-f]' * len(archive.stem.rsplit('-', 1)[1])}.tar"):
        if old != archive:
            old.unlink()
    if not spec.keep_in_store:
        podman.remove(spec.ref)
        progress("images", f"{name}: removed from podman's store (the archive is what is kept)")
    progress("images", f"{name}: {spec.ref} ready", started)


def ensure_serving() -> list[BuiltImage]:
    """The images of a served QwenDeployment (specs.SERVING), in that order."""
    return [ensure_image(name) for name in SERVING]


def wheelhouse(spec: ImageSpec) -> Path:
    """The wheels of ``spec``'s requirements (plus its extra wheels), downloaded once on the host.

    The host's pip reaches PyPI (its certificate store trusts this machine's proxy); no dependency
    resolution: the requirements files already pin each image's whole closure.
    """
    assert spec.requirements
    wanted = [*requirement_lines(REPO / spec.requirements), *spec.extra_wheels]
    digest = hashlib.sha256("\n".join(sorted(wanted)).encode()).hexdigest()[:16]
    out = images_dir() / "wheels" / f"{spec.name}-{digest}"
    if out.is_dir():
        return out
    started = time.monotonic()
    progress("images", f"{spec.name}: downloading {len(wanted)} wheels")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=out.parent))
    env = {k: v for k, v in os.environ.items() if k not in {"PIP_FIND_LINKS", "PIP_NO_INDEX"}}
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", str(partial), *wanted],
            check=True,
            env=env,
        )  # fmt: skip
        partial.replace(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    progress("images", f"{spec.name}: wheels in {out}", started)
    return out
