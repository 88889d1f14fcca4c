"""Pins the operator image's Python dependencies to the versions installed in the test venv.

    .venv/bin/python tools/image_requirements.py > images/operator/requirements.txt

Walks the runtime requirements of the qwen-operator distribution (no extras) through the installed
packages, so the image carries exactly what the tests ran with.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.requirements import Requirement

ROOT = "qwen-operator"
MARKER_ENV = {"extra": "", "python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "os_name": "posix"}  # fmt: skip


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(root: str = ROOT) -> dict[str, str]:
    """{distribution name: installed version} of everything `root` needs at run time."""
    pins: dict[str, str] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        dist = metadata.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(MARKER_ENV):
                continue
            key = _canonical(req.name)
            if key not in pins:
                pins[key] = metadata.version(req.name)
                todo.append(req.name)
    return dict(sorted(pins.items()))


def main() -> int:
    print("# Runtime dependencies of the operator image, pinned to the versions the tests ran with.")
    print("# Regenerate: .venv/bin/python tools/image_requirements.py > images/operator/requirements.txt")
    for name, version in runtime_closure().items():
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
