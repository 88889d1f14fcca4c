"""The real node's binaries and sandbox image, built once per version into the cache.

* kubelet, kube-proxy: ``gobuild/build-node.sh`` from the control plane's wrapper module and Kubernetes
  version, into ``<cache>/k8s-node-<k8s>/`` (the control plane's directory stays as it is);
* containerd, containerd-shim-runc-v2, ctr: from ``github.com/containerd/containerd/v2`` at
  ``versions.CONTAINERD``, into ``<cache>/containerd-<version>/``;
* coredns: from ``github.com/coredns/coredns`` at ``versions.COREDNS`` with only the plugins the node's
  Corefile uses (``gobuild/coredns``: a main package of ours, CoreDNS's way of choosing plugins), into
  ``<cache>/coredns-<version>-<key>/``, ``key`` being a hash of that module;
* kube-network-policies: the NetworkPolicy controller of ``sigs.k8s.io/kube-network-policies`` (the
  version ``gobuild/netpol/go.mod`` pins) in a main package of ours that gives it a kubeconfig, into
  ``<cache>/netpol-<key>/``, ``key`` being a hash of that module;
* the pause image (``images/pause``: the static ``pause`` and ``probe`` programs in a ``FROM scratch``
  image), built with podman and saved as a docker-archive ``<cache>/pause-<key>/pause.tar``, ``key``
  being a hash of its sources.

A ``MANIFEST`` (or the final file) marks each complete build, so a rerun only looks things up.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from qwen_operator.versions import CONTAINERD, COREDNS, KUBERNETES

from ..cache import cache_dir
from ..gotools import NO_DWARF, build_go_module, find_go
from ..images import podman
from ..repo import REPO
from .build import BuildError

NODE_SCRIPT = Path(__file__).resolve().parent / "gobuild" / "build-node.sh"
NODE_BINARIES = ("kubelet", "kube-proxy")
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
#: Binary -> main package in the containerd module.
CONTAINERD_BINARIES = {
    "containerd": "./cmd/containerd",
    "containerd-shim-runc-v2": "./cmd/containerd-shim-runc-v2",
    "ctr": "./cmd/ctr",
}
#: Snapshotters the node never uses: leaving them out shortens the build.
CONTAINERD_TAGS = "no_devmapper,no_zfs"
#: The module whose main package is CoreDNS with the Corefile's five plugins (go.mod pins versions.COREDNS).
COREDNS_SOURCE = Path(__file__).resolve().parent / "gobuild" / "coredns"
#: The module whose main package runs kube-network-policies' controller with a kubeconfig (network.py says
#: how its packets are queued).
NETPOL_SOURCE = Path(__file__).resolve().parent / "gobuild" / "netpol"
NETPOL_BINARY = "kube-network-policies"
PAUSE_SOURCE = REPO / "images" / "pause"
PAUSE_PROGRAMS = ("pause", "probe")


def log(message: str, started: float | None = None) -> None:
    """One progress line, with the seconds since ``started`` when given."""
    took = f" ({time.monotonic() - started:.1f}s)" if started is not None else ""
    print(f"[devcluster build] {message}{took}", flush=True)


@dataclass(frozen=True)
class PauseImage:
    """The sandbox image: its reference in containerd and the docker-archive it is imported from."""

    ref: str
    archive: Path


def node_bin_dir() -> Path:
    """Directory of kubelet and kube-proxy for the pinned Kubernetes (may not exist yet)."""
    return cache_dir() / f"k8s-node-{KUBERNETES}"


def containerd_dir() -> Path:
    """Directory of containerd, its runc shim and ctr for the pinned version (may not exist yet)."""
    return cache_dir() / f"containerd-{CONTAINERD}"


def _source_key(source: Path) -> str:
    """A hash of every file under ``source``: its name and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def coredns_binary() -> Path:
    """Where CoreDNS of the current ``gobuild/coredns`` lands."""
    return cache_dir() / f"coredns-{COREDNS}-{_source_key(COREDNS_SOURCE)}" / "coredns"


def netpol_binary() -> Path:
    """Where kube-network-policies of the current ``gobuild/netpol`` lands."""
    return cache_dir() / f"netpol-{_source_key(NETPOL_SOURCE)}" / NETPOL_BINARY


def _pause_key() -> str:
    return _source_key(PAUSE_SOURCE)


def pause_image() -> PauseImage:
    """Reference and archive of the pause image of the current sources (nothing is built)."""
    key = _pause_key()
    return PauseImage(f"localhost/qwen-pause:{key}", cache_dir() / f"pause-{key}" / "pause.tar")


def is_built() -> bool:
    """True when every part of the real node is cached."""
    return (
        (node_bin_dir() / "MANIFEST").is_file()
        and (containerd_dir() / "MANIFEST").is_file()
        and coredns_binary().is_file()
        and netpol_binary().is_file()
        and pause_image().archive.is_file()
    )


def binary(name: str) -> Path:
    """Path of one cached real-node binary; FileNotFoundError with the command that builds it."""
    if name in NODE_BINARIES:
        path = node_bin_dir() / name
    elif name in CONTAINERD_BINARIES:
        path = containerd_dir() / name
    elif name == "coredns":
        path = coredns_binary()
    elif name == NETPOL_BINARY:
        path = netpol_binary()
    else:
        raise ValueError(f"unknown real-node binary {name!r}")
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; run: python -m qwen_devtools.devcluster build --real-node"
        )
    return path


def _go() -> str:
    go = find_go()
    if go is None:
        raise BuildError(
            "the Go toolchain (go >= 1.26) is not on PATH (nor in /usr/local/go); it is needed once to build"
            " the real node"
        )
    return go


def _build_kubelet(go: str) -> None:
    if (node_bin_dir() / "MANIFEST").is_file():
        return
    started = time.monotonic()
    log(f"building kubelet and kube-proxy {KUBERNETES} into {node_bin_dir()} (a minute or two)")
    path = os.pathsep.join([str(Path(go).parent), os.environ.get("PATH", "")])  # the script runs `go`
    try:
        subprocess.run(
            ["bash", str(NODE_SCRIPT), str(node_bin_dir()), KUBERNETES],
            check=True,
            env={**os.environ, "PATH": path},
        )
    except subprocess.CalledProcessError as error:
        raise BuildError(
            f"{NODE_SCRIPT.name} failed with exit status {error.returncode} (output above)"
        ) from error
    log("kubelet and kube-proxy built", started)


def build_containerd() -> None:
    """containerd, its runc shim and ctr, unless cached: what the image preload needs (preload.py)."""
    _build_containerd(_go())


def _build_containerd(go: str) -> None:
    out = containerd_dir()
    if (out / "MANIFEST").is_file():
        return
    # setup's two lanes may both want it (the preload, the real node's build): one builds, one waits
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "MANIFEST").is_file():
            _compile_containerd(go, out)


def _compile_containerd(go: str, out: Path) -> None:
    started = time.monotonic()
    log(f"building containerd {CONTAINERD} into {out} (about 2 minutes)")
    partial = out.with_name(out.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    version = f"{CONTAINERD_MODULE}/version"
    stamp = f"-s -w -X {version}.Version={CONTAINERD} -X {version}.Package={CONTAINERD_MODULE}"
    try:
        for name, package in CONTAINERD_BINARIES.items():
            build_go_module(
                go,
                CONTAINERD_MODULE,
                CONTAINERD,
                partial / name,
                package=package,
                ldflags=stamp,
                tags=CONTAINERD_TAGS,
            )
    except subprocess.CalledProcessError as error:
        raise BuildError(f"building containerd failed: {error} (output above)") from error
    (partial / "MANIFEST").write_text(f"containerd {CONTAINERD}\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    log("containerd built", started)


def _build_local_module(go: str, source: Path, out: Path, what: str) -> None:
    """Build the main package of one of our modules under ``gobuild/`` into ``out`` (static, no DWARF)."""
    if out.is_file():
        return
    started = time.monotonic()
    log(f"building {what} (about 2 minutes)")
    partial = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            [go, "build", "-trimpath", NO_DWARF, "-ldflags", "-s -w", "-o", str(partial), "."],
            cwd=source,
            check=True,
            env={**os.environ, "CGO_ENABLED": "0", "GOWORK": "off", "GOFLAGS": "-mod=readonly"},
        )
    except subprocess.CalledProcessError as error:
        raise BuildError(f"building {what} failed: {error} (output above)") from error
    partial.rename(out)
    log(f"{what} built", started)


def _build_coredns(go: str) -> None:
    what = f"CoreDNS {COREDNS} with the plugins of the node's Corefile"
    _build_local_module(go, COREDNS_SOURCE, coredns_binary(), what)


def _build_netpol(go: str) -> None:
    # After CoreDNS: its go.mod pins the same client-go and friends, whose compiled packages Go's build
    # cache then holds, so this build compiles little more than the controller and its netlink libraries.
    _build_local_module(go, NETPOL_SOURCE, netpol_binary(), "kube-network-policies")


def _build_pause(go: str) -> None:
    image = pause_image()
    if image.archive.is_file():
        return
    started = time.monotonic()
    log(f"building the pause image {image.ref} from {PAUSE_SOURCE.relative_to(REPO)}")
    with tempfile.TemporaryDirectory(prefix="qwen-pause-") as tmp:
        context = Path(tmp)
        try:
            for program in PAUSE_PROGRAMS:
                subprocess.run(
                    [
                        go,
                        "build",
                        "-trimpath",
                        "-ldflags",
                        "-s -w",
                        "-o",
                        str(context / program),
                        f"./{program}",
                    ],
                    cwd=PAUSE_SOURCE,
                    check=True,
                    env={**os.environ, "CGO_ENABLED": "0"},
                )
            podman.build(PAUSE_SOURCE / "Dockerfile", context, image.ref, build_args={})
            podman.save(image.ref, image.archive)
        except (podman.PodmanMissing, subprocess.CalledProcessError) as error:
            raise BuildError(f"building the pause image failed: {error}") from error
    log(f"pause image saved to {image.archive}", started)


def build() -> None:
    """Build every real-node part that is not cached yet, with progress lines; BuildError on failure."""
    if is_built():
        return
    go = _go()
    _build_kubelet(go)
    _build_containerd(go)
    _build_coredns(go)
    _build_netpol(go)
    _build_pause(go)
