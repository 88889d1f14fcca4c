"""Real parts a test requires: skip the test when one is missing, or fail it under QWEN_REQUIRE_REAL_PARTS.

CI sets QWEN_REQUIRE_REAL_PARTS, so a part that `make setup` failed to provide fails the run instead of
silently skipping what it proves.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(what: str, how: str) -> NoReturn:
    """Skip (or, with QWEN_REQUIRE_REAL_PARTS set, fail) a test that needs a part this machine lacks."""
    message = f"{what} is missing; {how}"
    if os.environ.get("QWEN_REQUIRE_REAL_PARTS"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
