"""Go programs built from their Go modules into the cache: the Go toolchain lookup and the cached build.

`go install m@v` also asks the module proxy for the module's version list, which the proxy of these
machines refuses; downloading the exact version and building inside it needs only pinned, checksummed
modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .cache import cache_dir

#: Where the official Go tarball installs when its bin/ is not on PATH.
_GO_FALLBACK = Path("/usr/local/go/bin/go")


class GoMissing(RuntimeError):
    """A Go program is not cached yet and this machine has no Go toolchain to build it."""


def find_go() -> str | None:
    """The `go` command: on PATH, else the official tarball's location; None when there is none."""
    return shutil.which("go") or (str(_GO_FALLBACK) if _GO_FALLBACK.exists() else None)


def go_program(module: str, version: str, directory: str, binary: str) -> Path:
    """A Go program built once from `module@version` into the cache; later calls only look it up.

    It lands in ``<cache>/<directory>-<version>/<binary>``; GoMissing when it must be built without Go.
    """
    out = cache_dir() / f"{directory}-{version}" / binary
    if out.exists():
        return out
    go = find_go()
    if not go:
        raise GoMissing(f"Go (to build {binary})")
    build_go_module(go, module, version, out)
    return out


def build_go_module(
    go: str,
    module: str,
    version: str,
    out: Path,
    *,
    package: str = ".",
    ldflags: str = "-s -w",
    tags: str = "",
) -> None:
    """`go build` a main package of `module@version` into `out` (static, stripped).

    ``package`` is relative to the module's root (its root by default, ``./cmd/x`` for a subcommand);
    ``ldflags`` and ``tags`` go to ``go build`` as they are (a version stamp, build tags).
    """
    print(f"[gotools] building {module}@{version} {package} into {out}", flush=True)
    info = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"], check=True, capture_output=True, text=True
    )
    src = Path(json.loads(info.stdout)["Dir"])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(src, work)
        for path in work.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [go, "build", "-trimpath", "-ldflags", ldflags, f"-tags={tags}", "-o", str(out), package],
            cwd=work,
            check=True,
            env={**os.environ, "CGO_ENABLED": "0"},
        )
