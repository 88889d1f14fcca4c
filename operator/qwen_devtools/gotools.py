"""Go programs built from their Go modules into the cache: the Go toolchain lookup and the cached build.

`go install m@v` also asks the module proxy for the module's version list, which the proxy of these
machines refuses; downloading the exact version and building inside it needs only pinned, checksummed
modules.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .cache import cache_dir

#: No DWARF from the compiler (the binaries are stripped with -ldflags -s -w anyway): less to compile.
NO_DWARF = "-gcflags=all=-dwarf=false"
#: Where the official Go tarball installs when its bin/ is not on PATH.
_GO_FALLBACK = Path("/usr/local/go/bin/go")


class GoMissing(RuntimeError):
    """A Go program is not cached yet and this machine has no Go toolchain to build it."""


class GoTooOld(GoMissing):
    """The module's go.mod asks for a newer Go than this machine's (which downloads no toolchain)."""


def find_go() -> str | None:
    """The `go` command: on PATH, else the official tarball's location; None when there is none."""
    return shutil.which("go") or (str(_GO_FALLBACK) if _GO_FALLBACK.exists() else None)


def go_program(
    module: str,
    version: str,
    directory: str,
    binary: str,
    *,
    package: str = ".",
    ldflags: str = "-s -w",
    tags: str = "",
    drop_replace: tuple[str, ...] = (),
) -> Path:
    """A Go program built once from `module@version` into the cache; later calls only look it up.

    It lands in ``<cache>/<directory>-<version>/<binary>``; GoMissing when it must be built without Go.
    ``package``, ``ldflags``, ``tags`` and ``drop_replace`` are those of `build_go_module`; several
    programs of one module (``package="./cmd/x"``) share its directory.
    """
    out = cache_dir() / f"{directory}-{version}" / binary
    if out.exists():
        return out
    go = find_go()
    if not go:
        raise GoMissing(f"Go (to build {binary})")
    build_go_module(
        go, module, version, out, package=package, ldflags=ldflags, tags=tags, drop_replace=drop_replace
    )
    return out


def module_source(go: str, module: str, version: str) -> Path:
    """The read-only directory of `module@version` in Go's module cache (downloaded if needed)."""
    info = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"], check=True, capture_output=True, text=True
    )
    return Path(json.loads(info.stdout)["Dir"])


def _release(version: str) -> tuple[int, ...]:
    """(1, 26, 0) of `go1.26`, `1.26.0` or `go1.26rc1` (a pre-release counts as its release)."""
    numbers = [int(part) for part in re.findall(r"\d+", version.removeprefix("go").split("rc")[0])]
    return tuple([*numbers, 0, 0, 0][:3])


def go_directive(go_mod: str) -> str | None:
    """The `go` line of a go.mod's text (`1.26.0`), the least Go release that builds the module."""
    found = re.search(r"^go\s+(\S+)\s*$", go_mod, flags=re.MULTILINE)
    return found.group(1) if found else None


def require_go(go: str, src: Path, what: str) -> None:
    """GoTooOld when the module at ``src`` (``what``: its name for the message) needs a newer Go.

    The Go installed here has GOTOOLCHAIN=local (its go.env): it builds with itself or refuses, and
    never downloads the release a go.mod asks for; this says which release to install instead. With
    another GOTOOLCHAIN the go command fetches the release itself, and a `toolchain` line is only a
    preference: neither is checked.
    """
    wanted = go_directive((src / "go.mod").read_text())
    env = subprocess.run([go, "env", "GOVERSION", "GOTOOLCHAIN"], check=True, capture_output=True, text=True)
    have, toolchain = env.stdout.split()
    if wanted and toolchain == "local" and _release(have) < _release(wanted):
        raise GoTooOld(f"Go {wanted} or newer (to build {what}; {go} is {have})")


def writable_copy(src: Path, dest: Path, drop_replace: tuple[str, ...] = (), go: str | None = None) -> Path:
    """A writable copy of a module's source at ``dest``; its go.mod loses the ``drop_replace`` replaces.

    A module whose go.mod replaces its own nested modules with local directories (prometheus-operator:
    ``./pkg/apis/monitoring``) cannot be built from its module zip, which leaves nested modules out;
    dropping those replaces builds it against the nested modules' published versions of the same tag.
    """
    shutil.copytree(src, dest)
    for path in dest.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)
    dest.chmod(dest.stat().st_mode | 0o200)
    if drop_replace:
        assert go, "dropping replaces needs the go command"
        subprocess.run(
            [go, "mod", "edit", *(f"-dropreplace={m}" for m in drop_replace)], cwd=dest, check=True
        )
    return dest


def build_go_module(
    go: str,
    module: str,
    version: str,
    out: Path,
    *,
    package: str = ".",
    ldflags: str = "-s -w",
    tags: str = "",
    drop_replace: tuple[str, ...] = (),
) -> None:
    """`go build` a main package of `module@version` into `out` (static, stripped).

    ``package`` is relative to the module's root (its root by default, ``./cmd/x`` for a subcommand);
    ``ldflags`` and ``tags`` go to ``go build`` as they are (a version stamp, build tags);
    ``drop_replace``: see `writable_copy` (the checksums of the modules they pointed at are then added
    to go.sum, from the checksum database, as `-mod=mod` does).
    """
    print(f"[gotools] building {module}@{version} {package} into {out}", flush=True)
    src = module_source(go, module, version)
    require_go(go, src, f"{module}@{version}")
    with tempfile.TemporaryDirectory() as tmp:
        work = writable_copy(src, Path(tmp) / "src", drop_replace, go)
        out.parent.mkdir(parents=True, exist_ok=True)
        # GOWORK=off: a go.work in the module zip (prometheus) lists nested modules the zip leaves out
        env = {**os.environ, "CGO_ENABLED": "0", "GOWORK": "off"}
        if drop_replace:
            env["GOFLAGS"] = f"{env.get('GOFLAGS', '')} -mod=mod".strip()
        subprocess.run(
            [
                go,
                "build",
                "-trimpath",
                NO_DWARF,
                "-ldflags",
                ldflags,
                f"-tags={tags}",
                "-o",
                str(out),
                package,
            ],
            cwd=work,
            check=True,
            env=env,
        )
