"""Lesson 15's drill, its contract, once over all 26 exercises: every broken function fails its
check naming the property it breaks (and gets no hint), the cell that hands it out prints the
same diagnosis, every solution passes, and the generic contract of every check holds
(``tests/check_contract.py``).

The broken functions and the solutions are read from ``solutions/15_interview_drill.ipynb``
(``tests/drill_cells.py``), so what is tested is what is shipped. The wrong fixes each group of
checks names are tested beside it, in ``tests/test_checks_lesson13*.py``.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from check_contract import CheckContract
from drill_cells import BROKEN_PROPERTY, CELLS, CHECKS, CORRECT_13, broken, define

from mha_course import checks
from mha_course.checks import CheckFailed, drill


class TestContract(CheckContract):
    MODULE, CORRECT = drill, CORRECT_13


#: The broken functions that are themselves a mistake the check knows, and the hint it gives.
BROKEN_IS_A_NAMED_MISTAKE = {"15.24": r"base-2 log-sum-exps were merged as natural ones"}


def _ids(exercises):
    return sorted(exercises, key=lambda ex: int(ex.split(".")[1]))


def test_the_notebook_has_every_exercise_in_order_with_its_broken_and_solved_versions():
    numbers = [int(x.split(".")[1]) for x in CELLS]
    assert numbers == list(range(1, len(numbers) + 1)), "the drill's exercise ids have a gap"
    assert list(CELLS) == list(CHECKS)
    assert all("solution" in CELLS[ex] for ex in CHECKS)
    assert {ex for ex in CHECKS if "broken" in CELLS[ex]} == set(BROKEN_PROPERTY)
    assert set(CHECKS) - set(BROKEN_PROPERTY) == {"15.15"}, "only the timed build has no bug"


@pytest.mark.parametrize("ex", _ids(BROKEN_PROPERTY))
def test_the_broken_version_fails_naming_the_property_it_breaks(ex, capsys):
    buggy = broken(ex)
    with pytest.raises(CheckFailed) as info:
        getattr(checks, CHECKS[ex])(buggy)
    message = str(info.value)
    assert message.startswith(f"Exercise {ex}: property violated: {BROKEN_PROPERTY[ex]}. ")
    if ex in BROKEN_IS_A_NAMED_MISTAKE:
        assert re.search(BROKEN_IS_A_NAMED_MISTAKE[ex], message.split("Likely mistake: ")[1])
    else:
        assert "Likely mistake" not in message, "the broken version gets no hint"
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("ex", _ids(BROKEN_PROPERTY))
def test_the_broken_cell_runs_and_diagnose_prints_the_same_property(ex):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        define(CELLS[ex]["broken"], "buggy_")
    assert f"Exercise {ex}: property violated: {BROKEN_PROPERTY[ex]}. " in out.getvalue()


def test_diagnose_prints_a_pass_line_for_a_right_answer(capsys):
    checks.diagnose(checks.check_causal_off_by_one, CORRECT_13["15.2"][1])
    assert capsys.readouterr().out.startswith("Exercise 15.2 passed: ")
