"""The one cache directory of the dev tooling: vLLM CPU venv, dev cluster binaries, Go-built exporters.

``$QWEN_OPERATOR_CACHE``, else ``$XDG_CACHE_HOME/qwen-operator``, else ``~/.cache/qwen-operator``.
Standard library only, so the Makefile can ask before any virtualenv exists::

    python3 operator/qwen_devtools/cache.py    # prints the directory
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Directory holding every cached build; honours QWEN_OPERATOR_CACHE and XDG_CACHE_HOME."""
    override = os.environ.get("QWEN_OPERATOR_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "qwen-operator"


if __name__ == "__main__":
    print(cache_dir())
