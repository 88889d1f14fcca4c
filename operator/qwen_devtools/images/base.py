"""The base image made here, in place of python:3.11-slim-bookworm (no registry can be reached): a
Debian root file system from debootstrap, imported into podman's store and kept as a tarball in the cache.

It holds what the images' Dockerfiles expect of their public base: Python 3.11 with venv and pip
(`python`, `pip`), CA certificates, apt with bookworm's main, updates and security suites. pip may
install into /usr/local as in python:3.11-slim: Debian's EXTERNALLY-MANAGED marker is removed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from qwen_operator.versions import DEBIAN_SUITE

from . import podman
from .podman import images_dir, progress

MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
#: Installed by debootstrap itself (minbase: dpkg, apt and the required packages, nothing else).
PACKAGES = ("python3.11", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
#: What the public python:3.11-slim base sets and the Dockerfiles rely on.
CHANGES = (
    "ENV LANG=C.UTF-8",
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    'CMD ["python3"]',
)
#: Bump when the steps below change in a way the inputs of the key do not show.
RECIPE = 1
_SOURCES = f"""\
Types: deb
URIs: {MIRROR}
Suites: {DEBIAN_SUITE} {DEBIAN_SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {SECURITY_MIRROR}
Suites: {DEBIAN_SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


@dataclass(frozen=True)
class Base:
    """The local base image: its reference in podman's store, content key and root file system tarball."""

    ref: str
    key: str
    rootfs: Path


def base_key() -> str:
    """Hash of everything the base is made from (suite, mirrors, packages, changes, recipe)."""
    inputs = {
        "suite": DEBIAN_SUITE,
        "mirror": MIRROR,
        "packages": PACKAGES,
        "changes": CHANGES,
        "sources": _SOURCES,
        "recipe": RECIPE,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def base() -> Base:
    """The base's reference, key and tarball path (nothing is made)."""
    key = base_key()
    return Base(
        ref=f"localhost/qwen-base-{DEBIAN_SUITE}:{key}",
        key=key,
        rootfs=images_dir() / f"base-{DEBIAN_SUITE}-{key}.tar",
    )


def ensure_base() -> Base:
    """The base in podman's store: imported from the cached tarball, made with debootstrap first if needed.

    debootstrap takes about 3 minutes and 200 MB of downloads; the import a few seconds.
    """
    b = base()
    with podman.exclusive("base"):
        if podman.exists(b.ref):
            return b
        if not b.rootfs.exists():
            make_rootfs(b.rootfs)
        started = time.monotonic()
        podman.import_rootfs(b.rootfs, b.ref, CHANGES)
        progress("images", f"imported {b.ref}", started)
    return b


def make_rootfs(tarball: Path) -> None:
    """debootstrap the root file system and write it to ``tarball`` (numeric owners, no /dev or /proc)."""
    debootstrap = shutil.which("debootstrap")
    if not debootstrap:
        raise podman.PodmanMissing("debootstrap is needed: `apt-get install debootstrap`")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=tarball.parent))
    try:
        started = time.monotonic()
        progress("images", f"debootstrap {DEBIAN_SUITE} (minbase + {', '.join(PACKAGES)}), about 3 min")
        log = tarball.with_suffix(".debootstrap.log")
        with open(log, "w") as out:
            result = subprocess.run(
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    DEBIAN_SUITE,
                    str(work / "root"),
                    MIRROR,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if result.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"debootstrap failed ({result.returncode}); {log}:\n{tail}")
        progress("images", "debootstrap done", started)
        _finish(work / "root")
        partial = tarball.with_name(tarball.name + ".partial")
        subprocess.run(
            [
                "tar", "--numeric-owner", "--xattrs", "-C", str(work / "root"),
                "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./run/*",
                "-cf", str(partial), ".",
            ],
            check=True,
        )  # fmt: skip
        partial.replace(tarball)
        for old in tarball.parent.glob(f"base-{DEBIAN_SUITE}-*.tar"):
            if old != tarball:
                old.unlink()  # a base of an earlier recipe
        progress("images", f"root file system {tarball} ({tarball.stat().st_size / 2**20:.0f} MiB)", started)
    finally:
        # --one-file-system: never descend into something debootstrap left mounted (a killed run)
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)


def _finish(root: Path) -> None:
    """What debootstrap leaves different from debian:bookworm-slim: apt sources, caches, pip's marker."""
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    (root / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/apt/sources.list.d/debian.sources").write_text(_SOURCES)
    # the images' Dockerfiles `pip install` system-wide, as on python:3.11-slim
    for marker in (root / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (root / cache).glob("*"):
            if entry.is_file():
                entry.unlink()
