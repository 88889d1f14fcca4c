"""The one helm lookup: ``$QWEN_HELM``, else the helm the dev cluster build caches (the pinned version).

`make generate` renders manifests/install.yaml with it and the chart tests lint and template with it,
so both use the same binary.
"""

from __future__ import annotations

import os
from pathlib import Path

from .devcluster.build import bin_dir

#: What to do when `helm_path()` does not exist.
HOW_TO_GET_HELM = "run `make setup` (builds the dev cluster binaries), or set QWEN_HELM"


def helm_path() -> Path:
    """QWEN_HELM, else the cached helm of the pinned version; it may not exist (see HOW_TO_GET_HELM)."""
    return Path(os.environ.get("QWEN_HELM") or bin_dir() / "helm")
