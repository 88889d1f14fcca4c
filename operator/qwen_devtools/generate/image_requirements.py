"""Pins an image's Python dependencies to the versions installed where the tests run them.

    python image_requirements.py                 # the operator's runtime dependencies (pyproject.toml)
    python image_requirements.py vllm-router     # a requirement and everything it needs

Prints `name==version` lines: the requirements' closure through the distributions installed for the
Python that runs it, the test venv for the operator image, the vLLM CPU venv for the gateway image.
`make generate` runs it under each (`python -I`, so standard library and `packaging` only) and writes
images/operator/requirements.txt and images/gateway/requirements.txt.

The result depends only on what is installed, never on this machine: the operator's roots are read
from pyproject.toml (not from the editable install's metadata, which is as old as the last
`pip install -e`), markers are evaluated for the images' platform (CPython 3.11, linux/x86_64), and the
lines are sorted.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

#: Also run as a script by the vLLM venv's Python (`-I`, no package around it), hence no import of
#: qwen_devtools.repo: operator/qwen_devtools/generate/ is three levels below the repository root.
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
#: Both images run python:3.11-slim on linux/amd64 (their Dockerfiles pin the base).
MARKER_ENV = {"extra": "", "python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "os_name": "posix"}  # fmt: skip


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_dependencies(pyproject: Path = PYPROJECT) -> list[str]:
    """The runtime requirements of the qwen-operator distribution (no extras)."""
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def _applies(marker: Marker | None, extras: Iterable[str]) -> bool:
    """Whether a requirement holds on the images' platform for a distribution asked for with `extras`."""
    if marker is None:
        return True
    return any(marker.evaluate(MARKER_ENV | {"extra": extra}) for extra in ("", *extras))


def runtime_closure(roots: Iterable[str] | None = None) -> dict[str, str]:
    """{distribution name: installed version} of `roots` and everything they need at run time.

    `roots` defaults to the operator's runtime dependencies.
    """
    pins: dict[str, str] = {}
    walked: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = []

    def need(requirement: Requirement) -> None:
        pins.setdefault(_canonical(requirement.name), metadata.version(requirement.name))
        todo.append((requirement.name, frozenset(requirement.extras)))

    for text in project_dependencies() if roots is None else roots:
        root = Requirement(text)
        if _applies(root.marker, ()):
            need(root)
            installed = metadata.version(root.name)
            if not root.specifier.contains(installed, prereleases=True):
                raise SystemExit(f"{root.name} {installed} is installed, not {root}: reinstall the venv")
    while todo:
        name, extras = todo.pop()
        if (_canonical(name), extras) in walked:
            continue
        walked.add((_canonical(name), extras))
        for text in metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            if _applies(requirement.marker, extras):
                need(requirement)
    return dict(sorted(pins.items()))


def requirements_text(pins: dict[str, str]) -> str:
    """The `name==version` lines of a requirements file."""
    return "".join(f"{name}=={version}\n" for name, version in pins.items())


def main(argv: list[str]) -> int:
    sys.stdout.write(requirements_text(runtime_closure(argv or None)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
