"""Shared pytest options and fixtures of the tests/ suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qwen_devtools.model import build_tiny_model


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden files under tests/golden/ instead of comparing (or env UPDATE_GOLDEN=1)",
    )


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when golden files are to be rewritten (--update-golden or UPDATE_GOLDEN=1)."""
    return bool(request.config.getoption("--update-golden")) or os.environ.get("UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny random Qwen3ForCausalLM (2 layers, vocab 512) with a ChatML tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))
