"""The one podman command line of the dev tooling: a private image store in the cache, and the runtime
settings these machines need (runc, explicit ulimits, the host's network).

Why each setting: crun fails on cgroup v1 "hybrid" hosts ("cgroups in hybrid mode not supported");
podman's default ulimits are above this VM's hard limits and raising them needs CAP_SYS_RESOURCE;
a bridge network would make netavark add firewall rules to the host, while the host's network changes
nothing machine-wide (build steps reach Debian's mirror through it). The store lives under the cache
so that it never meets another user's podman images and can be removed as a whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..cache import cache_dir

#: Limits each build step and container runs with: below this VM's hard limits (nofile 20000).
ULIMITS = ("nofile=1024:1024", "nproc=1024:1024")
RUNTIME = "runc"
#: Options of every `podman build` besides the runtime's. No layer cache: an image is built only when
#: its content key changed, and podman cannot see what a mounted directory holds; one commit at the end
#: also keeps the engine's 6 GB from being written once per step.
BUILD_OPTIONS = ("--layers=false", "--format=docker")


class PodmanMissing(RuntimeError):
    """podman (or runc) is not installed: `apt-get install podman runc`."""


def images_dir() -> Path:
    """Where image archives, base root file systems and podman's store live (``<cache>/images``)."""
    return cache_dir() / "images"


def store_dir() -> Path:
    """podman's private store (graph root, run root, temporary files)."""
    return images_dir() / "podman"


def podman_argv() -> list[str]:
    """`podman` with the global options every call here uses."""
    podman = shutil.which("podman")
    if not podman or not shutil.which(RUNTIME):
        raise PodmanMissing(f"podman and {RUNTIME} are needed: `apt-get install podman {RUNTIME}`")
    store = store_dir()
    return [
        podman,
        "--root", str(store / "root"),
        "--runroot", str(store / "run"),
        "--runtime", RUNTIME,
        "--cgroup-manager", "cgroupfs",
        "--events-backend", "file",
        "--storage-driver", "overlay",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    # podman stages layers and archives under TMPDIR (/var/tmp by default): keep them beside the store
    tmp = store_dir() / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def podman(*args: str, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run podman with the store and runtime options; output to the terminal unless ``capture``."""
    return subprocess.run(
        [*podman_argv(), *args],
        check=check,
        text=True,
        capture_output=capture,
        env=_env(),
        stdin=subprocess.DEVNULL,
    )


def runtime_options() -> list[str]:
    """Options of `podman build` and `podman run` (ulimits, host network)."""
    return [*(f"--ulimit={u}" for u in ULIMITS), "--network=host"]


def build(
    dockerfile: Path,
    context: Path,
    tag: str,
    build_args: dict[str, str],
    build_contexts: dict[str, Path] | None = None,
    volumes: Sequence[str] = (),
) -> None:
    """`podman build` a Dockerfile into ``tag`` (from scratch each time: no layer cache)."""
    podman(
        "build",
        *runtime_options(),
        *BUILD_OPTIONS,
        "--file", str(dockerfile),
        "--tag", tag,
        *(f"--build-arg={k}={v}" for k, v in sorted(build_args.items())),
        *(f"--build-context={k}={v}" for k, v in sorted((build_contexts or {}).items())),
        *(f"--volume={v}" for v in volumes),
        str(context),
    )  # fmt: skip


def import_rootfs(tarball: Path, tag: str, changes: Sequence[str]) -> None:
    """`podman import` a root file system tarball as ``tag`` with Dockerfile-style ``changes``."""
    podman("import", *(f"--change={c}" for c in changes), str(tarball), tag, capture=True)


def exists(ref: str) -> bool:
    """Whether the store holds ``ref``."""
    return podman("image", "exists", ref, check=False, capture=True).returncode == 0


def inspect(ref: str) -> dict[str, Any]:
    """The image's `podman image inspect` record."""
    out = podman("image", "inspect", ref, capture=True).stdout
    return dict(json.loads(out)[0])


def save(ref: str, archive: Path) -> None:
    """Write ``ref`` as a docker-archive tarball (what `ctr images import` reads), atomically."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    podman("save", "--format", "docker-archive", "--output", str(partial), ref, capture=True)
    partial.replace(archive)


def remove(ref: str) -> None:
    """Remove ``ref`` from the store and the layers no image uses any more (build cache included)."""
    podman("rmi", "--force", ref, check=False, capture=True)
    podman("image", "prune", "--force", check=False, capture=True)


def progress(prefix: str, message: str, started: float | None = None) -> None:
    """One progress line, with the seconds since ``started`` when given."""
    took = f" ({time.monotonic() - started:.0f} s)" if started is not None else ""
    print(f"[{prefix}] {message}{took}", flush=True)


@contextlib.contextmanager
def exclusive(name: str) -> Iterator[None]:
    """One holder of ``name`` at a time on this machine: a build (the demo and a test run may both ask
    for the same image) or the base."""
    images_dir().mkdir(parents=True, exist_ok=True)
    with open(images_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
