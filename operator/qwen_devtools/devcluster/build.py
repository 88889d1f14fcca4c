"""The per-version binary cache of the dev cluster, at the versions pinned in qwen_operator.versions.

The binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm) are
built from Go modules by ``gobuild/build.sh`` into ``<cache>/k8s-<k8s>-kwok-<kwok>-helm-<helm>/``
(``<cache>`` is qwen_devtools.cache.cache_dir()). A ``MANIFEST`` file there marks a complete build.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from qwen_operator.versions import HELM, KUBERNETES, KWOK

from ..cache import cache_dir
from ..gotools import find_go

#: Aliases of the pins in qwen_operator.versions (the values live only there), for importers.
K8S_VERSION, KWOK_VERSION, HELM_VERSION = KUBERNETES, KWOK, HELM

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


def bin_dir() -> Path:
    """Directory of the binaries for the pinned versions (may not exist yet)."""
    return cache_dir() / f"k8s-{KUBERNETES}-kwok-{KWOK}-helm-{HELM}"


def is_built() -> bool:
    """True when a complete build of the pinned versions is cached."""
    return (bin_dir() / "MANIFEST").is_file()


def binary(name: str) -> Path:
    """Path of one cached binary; raises FileNotFoundError with the command to build it."""
    if name not in BINARIES:
        raise ValueError(f"unknown binary {name!r}; known: {', '.join(BINARIES)}")
    path = bin_dir() / name
    if not is_built() or not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run: python -m qwen_devtools.devcluster build")
    return path


def build() -> Path:
    """Build the pinned binaries unless cached, streaming the build's output; returns bin_dir().

    Raises BuildError when Go is missing or the build fails.
    """
    if is_built():
        return bin_dir()
    print(
        f"[devcluster] building Kubernetes {KUBERNETES}, kwok {KWOK}, helm {HELM} "
        f"into {bin_dir()} (first build takes several minutes on 2 cores)",
        flush=True,
    )
    go = find_go()
    if go is None:
        raise BuildError(
            "the Go toolchain (go >= 1.26) is not on PATH (nor in /usr/local/go); it is needed once to build"
            " the binaries"
        )
    bin_dir().parent.mkdir(parents=True, exist_ok=True)
    argv = ["bash", str(BUILD_SCRIPT), str(bin_dir()), KUBERNETES, KWOK, HELM]
    path = os.pathsep.join([str(Path(go).parent), os.environ.get("PATH", "")])  # build.sh runs `go`
    try:
        subprocess.run(argv, check=True, env={**os.environ, "PATH": path})
    except subprocess.CalledProcessError as error:
        raise BuildError(
            f"{BUILD_SCRIPT.name} failed with exit status {error.returncode} (output above)"
        ) from error
    return bin_dir()
