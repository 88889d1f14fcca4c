"""Pinned tool versions and the per-version binary cache of the dev cluster.

The binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm) are
built from Go modules by ``gobuild/build.sh`` into
``$QWEN_OPERATOR_CACHE/k8s-<k8s>-kwok-<kwok>-helm-<helm>/`` (``$QWEN_OPERATOR_CACHE`` defaults to
``${XDG_CACHE_HOME:-~/.cache}/qwen-operator``). A ``MANIFEST`` file there marks a complete build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

K8S_VERSION = "v1.36.3"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)
BUILD_SCRIPT = Path(__file__).resolve().parent / "gobuild" / "build.sh"


class BuildError(RuntimeError):
    """The binaries could not be built."""


def cache_root() -> Path:
    """Directory holding all cached builds; honours QWEN_OPERATOR_CACHE and XDG_CACHE_HOME."""
    override = os.environ.get("QWEN_OPERATOR_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "qwen-operator"


def bin_dir() -> Path:
    """Directory of the binaries for the pinned versions (may not exist yet)."""
    return cache_root() / f"k8s-{K8S_VERSION}-kwok-{KWOK_VERSION}-helm-{HELM_VERSION}"


def is_built() -> bool:
    """True when a complete build of the pinned versions is cached."""
    return (bin_dir() / "MANIFEST").is_file()


def binary(name: str) -> Path:
    """Path of one cached binary; raises FileNotFoundError with the command to build it."""
    if name not in BINARIES:
        raise ValueError(f"unknown binary {name!r}; known: {', '.join(BINARIES)}")
    path = bin_dir() / name
    if not is_built() or not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run: PYTHONPATH=e2e python -m devcluster build")
    return path


def build() -> Path:
    """Build the pinned binaries unless cached, streaming the build's output; returns bin_dir().

    Raises BuildError when Go is missing or the build fails.
    """
    if is_built():
        return bin_dir()
    print(
        f"[devcluster] building Kubernetes {K8S_VERSION}, kwok {KWOK_VERSION}, helm {HELM_VERSION} "
        f"into {bin_dir()} (first build takes several minutes on 2 cores)",
        flush=True,
    )
    if shutil.which("go") is None:
        raise BuildError(
            "the Go toolchain (go >= 1.26) is not on PATH; it is needed once to build the binaries"
        )
    bin_dir().parent.mkdir(parents=True, exist_ok=True)
    argv = ["bash", str(BUILD_SCRIPT), str(bin_dir()), K8S_VERSION, KWOK_VERSION, HELM_VERSION]
    try:
        subprocess.run(argv, check=True)
    except subprocess.CalledProcessError as error:
        raise BuildError(
            f"{BUILD_SCRIPT.name} failed with exit status {error.returncode} (output above)"
        ) from error
    return bin_dir()
