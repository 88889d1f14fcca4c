"""The real node's containerd from the outside: waiting until its CRI answers, and what ``ctr`` does with
it (importing docker-archive images into the ``k8s.io`` namespace, looking them up, removing the
containers a killed run left).

Readiness comes from containerd itself: it sends systemd's ``READY=1`` to ``$NOTIFY_SOCKET`` only once
every plugin that registered readiness is up, the CRI service included, which is what kubelet needs
(started earlier it exits: "server is not initialized yet").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import subprocess
import tarfile
import time
from pathlib import Path

from . import nodebuild
from .procs import ComponentError, running

#: The namespace the CRI plugin, and so kubelet, sees.
NAMESPACE = "k8s.io"


class NotifySocket:
    """A datagram socket for containerd's sd_notify messages (bound before containerd starts)."""

    def __init__(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.2)

    def wait_ready(self, pid: int, executable: str, log: Path, timeout: float) -> None:
        """Return once READY=1 arrives; ComponentError if the process exits or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                try:
                    if b"READY=1" in self._sock.recv(4096).split(b"\n"):
                        return
                except TimeoutError:
                    pass
                if not running(pid, executable):
                    raise ComponentError("containerd", "exited during start-up", log)
            raise ComponentError("containerd", f"CRI not ready after {timeout:.0f}s", log)
        finally:
            self._sock.close()
            self.path.unlink(missing_ok=True)


class CtrError(RuntimeError):
    """A ctr command failed."""


class Ctr:
    """``ctr`` against one containerd socket, in the ``k8s.io`` namespace."""

    def __init__(self, address: Path) -> None:
        self.address = address.resolve()  # ctr 2.x needs an absolute --address

    def run(self, *args: str, timeout: float = 60) -> str:
        argv = [str(nodebuild.binary("ctr")), f"--address={self.address}", f"--namespace={NAMESPACE}", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if result.returncode:
            raise CtrError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def manifest_digest(self, ref: str) -> str | None:
        """The digest ``ref`` points at, None when the store has no such image."""
        for line in self.run("images", "list", f"name=={ref}").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[0] == ref:
                return fields[2]
        return None

    def config_digest(self, ref: str) -> str | None:
        """The image ID (its config's digest) of ``ref``, None when absent."""
        digest = self.manifest_digest(ref)
        if digest is None:
            return None
        manifest = json.loads(self.run("content", "get", digest))
        return str(manifest["config"]["digest"])

    def import_archive(self, archive: Path, timeout: float) -> None:
        """Import (and unpack) a docker-archive; names already in the store are updated."""
        self.run("images", "import", str(archive.resolve()), timeout=timeout)

    def remove_all_containers(self) -> int:
        """Kill and delete every container of the namespace with its task, then every pod sandbox record
        (the CRI keeps those in the image store's metadata); returns how many containers there were."""
        ids = self.run("containers", "list", "--quiet").split()
        for container in ids:
            for args in (
                ("tasks", "kill", "--signal", "SIGKILL", container),
                ("tasks", "delete", "--force", container),
            ):
                with contextlib.suppress(CtrError):  # no task, or already gone
                    self.run(*args)
            self.run("containers", "delete", container)
        sandboxes = [
            line.split()[0] for line in self.run("sandboxes", "list").splitlines()[1:] if line.strip()
        ]
        for sandbox in sandboxes:
            with contextlib.suppress(CtrError):  # its shim may be gone already
                self.run("sandboxes", "remove", "--force", sandbox)
        return len(ids)


def archive_config_digest(archive: Path) -> str:
    """The image ID of the (first) image of a docker-archive: the sha256 of its config JSON."""
    with tarfile.open(archive, mode="r:") as tar:
        manifest = tar.extractfile("manifest.json")
        if manifest is None:
            raise ValueError(f"{archive}: no manifest.json")
        config_name = json.load(manifest)[0]["Config"]
        config = tar.extractfile(config_name)
        if config is None:
            raise ValueError(f"{archive}: no {config_name}")
        return "sha256:" + hashlib.sha256(config.read()).hexdigest()
