"""The repository checkout the dev tooling runs from (it is only ever installed editable from one)."""

from __future__ import annotations

from pathlib import Path

#: The checkout's root: operator/qwen_devtools/repo.py is two levels below it.
REPO = Path(__file__).resolve().parents[2]
