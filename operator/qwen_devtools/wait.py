"""Polling until something holds: the one wait loop of the tests and the dev tooling."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Timeout(AssertionError):
    """What `wait_until` raises: an AssertionError, so a test reports it as the expectation that failed."""


def wait_until(
    check: Callable[[], T | None], timeout: float = 30.0, what: str = "condition", interval: float = 0.25
) -> T:
    """Poll ``check`` until it returns something truthy and return that; Timeout after ``timeout`` s.

    ``check`` may raise to give up early (a process that exited will never become ready).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
