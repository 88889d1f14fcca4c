"""`make mutants`' list stays true to the code: each mutant's code occurs exactly once where it says, and
the tests it names exist (the mutants themselves run in `make mutants`, not here: minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen_devtools import mutants
from qwen_devtools.repo import REPO


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_each_mutant_applies_once_and_names_existing_tests(mutant: mutants.Mutant, tmp_path: Path) -> None:
    target = tmp_path / mutant.path
    target.parent.mkdir(parents=True)
    target.write_text((REPO / mutant.path).read_text())
    mutants.apply(mutant, tmp_path)
    assert target.read_text() != (REPO / mutant.path).read_text()
    assert all((REPO / t).is_file() for t in mutant.tests)


def test_a_mutant_whose_code_moved_is_refused(tmp_path: Path) -> None:
    moved = mutants.MUTANTS[0]
    (tmp_path / moved.path).parent.mkdir(parents=True)
    (tmp_path / moved.path).write_text("# refactored away\n")
    with pytest.raises(ValueError, match="0 times, not once"):
        mutants.apply(moved, tmp_path)
