"""Import the serving images into the real node's image store before any cluster runs.

Importing the images into containerd is the slowest part of the first `make demo` after its builds
(the CPU engine's 6.7 GB archive alone takes minutes: written once more, then unpacked), and it only
reads the archives and writes the image store. Setup's images lane is done long before the cluster
lane's compile of Kubernetes, so it runs the import then (`python -m qwen_devtools.devcluster
preload`), and the demo's `realnode.load_image` finds every image in the store with the archive's
image ID and imports nothing.

The import uses a containerd of its own: the node's binary and configuration (the same root, so the
same store), a socket in a temporary directory, a private mount namespace (the unpacking's overlay
mounts stay in it and go with it), stopped when done. It holds the real-node lock meanwhile, so no
cluster starts a second containerd on the same store; when a cluster holds the node, nothing is done
here (its `load_image` imports at start).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from ..net import free_ports
from ..wait import wait_until
from . import containerd, nodebuild, nodecomponents, procs, realnode
from .nodecomponents import NodeLayout

#: The name the real-node lock carries while this runs (what RealNodeBusy names).
HOLDER = "preload"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


def log(message: str) -> None:
    print(f"[preload] {message}", flush=True)


def preload(images: Iterable[tuple[Path, str]]) -> int:
    """Import each (docker-archive, reference) the store lacks with that image ID; returns how many
    it imported. Nothing is done (0) while a dev cluster holds the real node."""
    wanted = [(archive, ref, containerd.archive_config_digest(archive)) for archive, ref in images]
    if not wanted:
        return 0
    try:
        fd, previous = realnode.acquire(HOLDER)
    except realnode.RealNodeBusy as busy:
        log(f"dev cluster {busy.holder!r} holds the real node: its containerd imports the images instead")
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="qwen-preload-") as tmp:
            return _import(_layout(Path(tmp)), wanted)
    finally:
        if previous:  # a killed cluster's name: the next start cleans what that run left
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{previous}\n".encode(), 0)
        os.close(fd)


def _layout(directory: Path) -> NodeLayout:
    (port,) = free_ports(1)
    unused = directory / "unused"  # containerd's configuration names none of the node's kubeconfigs
    return NodeLayout(
        dir=directory,
        ports={"containerd-stream": port},
        kubeconfig=unused,
        ca_file=unused,
        pause_ref=nodebuild.pause_image().ref,
        kubelet_kubeconfig=unused,
        proxy_kubeconfig=unused,
    )


def _import(layout: NodeLayout, wanted: list[tuple[Path, str, str]]) -> int:
    for directory in (layout.containerd_state, layout.cni_conf_dir, layout.registry_dir / "_default"):
        directory.mkdir(parents=True, exist_ok=True)
    (layout.registry_dir / "_default" / "hosts.toml").write_text(f'server = "{nodecomponents.NO_REGISTRY}"\n')
    layout.file("containerd.toml").write_text(nodecomponents.containerd_config(layout))
    notify = containerd.NotifySocket(layout.notify_socket)
    binary = os.path.realpath(nodebuild.binary("containerd"))
    # unshare execs containerd in its place (same pid), in this process group: stopping setup's step
    # (its group) stops it too.
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        *nodecomponents.argv("containerd", layout),
    ]
    path = f"{nodebuild.containerd_dir()}:{os.environ.get('PATH', '')}"
    log_file = layout.file("containerd.log")
    started = time.monotonic()
    with open(log_file, "ab") as output:
        process = subprocess.Popen(
            argv,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PATH": path, "NOTIFY_SOCKET": str(layout.notify_socket)},
        )
    try:
        wait_until(lambda: procs.running(process.pid, binary), 5, "containerd to start", interval=0.02)
        notify.wait_ready(process.pid, binary, log_file, START_TIMEOUT)
        ctr = containerd.Ctr(layout.socket)
        imported = 0
        for archive, ref, digest in wanted:
            if ctr.config_digest(ref) == digest:
                continue
            began = time.monotonic()
            log(f"importing {ref} ({archive.stat().st_size / 2**20:.0f} MiB) into the real node's store")
            ctr.import_archive(archive, realnode.IMPORT_TIMEOUT)
            if ctr.config_digest(ref) != digest:
                raise containerd.CtrError(f"{archive} imported, but {ref} is not the archive's {digest}")
            log(f"imported {ref} ({time.monotonic() - began:.1f}s)")
            imported += 1
        log(f"{imported} of {len(wanted)} images imported ({time.monotonic() - started:.0f}s)")
        return imported
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
