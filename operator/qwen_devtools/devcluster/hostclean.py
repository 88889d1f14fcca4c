"""What a real node leaves on the host if it is not stopped in order, found and removed: mounts under its
directory, the kubepods cgroups, container processes and runc shims of a killed run, and what kubelet
and containerd put in their fixed machine-wide paths.

Only things of the real node are touched: mounts below its own directory, the ``kubepods`` cgroups
(kubelet's fixed names; one real node per machine), processes in those cgroups or recorded as its
shims in containerd's state directory whose executable is the cached shim, log links into its own
directory, and the fixed directories below once they are empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
#: kubelet's device-plugin directory (its socket and checkpoint), whatever --root-dir says.
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
#: kubelet's links to container logs, whatever podLogsDir says.
CONTAINER_LOG_LINKS = Path("/var/log/containers")
#: containerd's shims put their sockets here, whatever containerd's state directory is.
SHIM_SOCKETS = Path("/run/containerd/s")
#: libcni's result cache (containerd cannot move it): one file per pod network attachment.
CNI_CACHE = Path("/var/lib/cni/results")
#: Directories kubelet, containerd's shims and libcni create for themselves: removed once empty.
FIXED_DIRS = (
    Path("/var/lib/kubelet"),
    CONTAINER_LOG_LINKS,
    SHIM_SOCKETS,
    SHIM_SOCKETS.parent,
    CNI_CACHE,
    CNI_CACHE.parent,
)


def _unescape(field: str) -> str:
    """Mount points in mountinfo escape space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts_under(directory: Path, pid: int | str = "self") -> list[Path]:
    """Mount points at or below ``directory`` in the mount namespace of ``pid``, deepest first."""
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError:
        return []
    root = str(directory).rstrip("/")
    points = [Path(_unescape(line.split()[4])) for line in lines]
    inside = [p for p in points if str(p) == root or str(p).startswith(root + "/")]
    return sorted(set(inside), key=lambda p: len(p.parts), reverse=True)


def unmount_under(directory: Path, namespace_pid: int | None = None) -> list[Path]:
    """Unmount everything at or below ``directory`` (in the mount namespace of ``namespace_pid``, else
    this process's); returns what is still mounted afterwards."""
    pid: int | str = namespace_pid if namespace_pid is not None else "self"
    enter = ["nsenter", f"--mount=/proc/{namespace_pid}/ns/mnt", "--"] if namespace_pid is not None else []
    for point in mounts_under(directory, pid):
        # lazy as a last resort: a busy mount (a process still inside) is detached instead of kept
        if subprocess.run([*enter, "umount", str(point)], capture_output=True).returncode:
            subprocess.run([*enter, "umount", "-l", str(point)], capture_output=True)
    return mounts_under(directory, pid)


def _kubepods_dirs() -> list[Path]:
    """Every ``kubepods`` cgroup directory, one per mounted hierarchy (v1 controllers, the v2 one)."""
    with contextlib.suppress(OSError):
        return [d / KUBEPODS for d in CGROUP_ROOT.iterdir() if (d / KUBEPODS).is_dir()]
    return []


def kubepods_cgroups() -> list[Path]:
    """The kubepods cgroups that exist (empty after a clean stop)."""
    return _kubepods_dirs()


def kill_pods_processes() -> int:
    """SIGKILL every process still in a kubepods cgroup (the containers of a killed run); returns how many."""
    pids: set[int] = set()
    for top in _kubepods_dirs():
        for directory, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    text = (Path(directory) / "cgroup.procs").read_text()
                    pids.update(int(line) for line in text.split())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def remove_kubepods_cgroups() -> list[Path]:
    """rmdir the empty kubepods cgroups, leaves first; returns the directories that could not go."""
    left = []
    for top in _kubepods_dirs():
        for directory, _dirs, _files in os.walk(top, topdown=False):
            try:
                os.rmdir(directory)
            except OSError:
                left.append(Path(directory))
    return left


def kill_shims(state_prefix: str, shim_executable: str) -> int:
    """SIGKILL the runc shims of a real node: processes running the cached ``shim_executable`` whose working
    directory (a container's bundle in containerd's state) starts with ``state_prefix``."""
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            exe = os.readlink(proc / "exe").removesuffix(" (deleted)")
            cwd = os.readlink(proc / "cwd").removesuffix(" (deleted)")
        except OSError:
            continue
        if exe == shim_executable and cwd.startswith(state_prefix):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
            _remove_shim_socket(Path(cwd) / "bootstrap.json")
    return killed


def _remove_shim_socket(bootstrap: Path) -> None:
    """A killed shim leaves its socket in /run/containerd/s; the bundle's bootstrap.json names it."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        address = str(json.loads(bootstrap.read_text())["address"])
        socket = Path(address.removeprefix("unix://"))
        if socket.parent == SHIM_SOCKETS:
            socket.unlink()


def remove_fixed_paths(state_prefix: str, cni_networks: Sequence[str]) -> None:
    """kubelet's device-plugin socket and checkpoint, its log links to files below ``state_prefix``,
    libcni's entries of ``cni_networks``, and the fixed directories once empty (run with kubelet and
    containerd stopped)."""
    for network in cni_networks:
        for entry in CNI_CACHE.glob(f"{network}-*"):
            with contextlib.suppress(OSError):
                entry.unlink()
    for entry in DEVICE_PLUGINS.glob("*"):
        with contextlib.suppress(OSError):
            entry.unlink()
    with contextlib.suppress(OSError):
        DEVICE_PLUGINS.rmdir()
    for link in CONTAINER_LOG_LINKS.glob("*.log"):
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(state_prefix):
                link.unlink()
    for directory in FIXED_DIRS:
        with contextlib.suppress(OSError):
            directory.rmdir()
