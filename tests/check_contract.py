"""What every exercise check promises, written once: a lesson's tests inherit it.

A lesson's test module binds the contract to its right answers and to the checks module it
tests, in two lines::

    class TestContract(CheckContract):
        MODULE, CORRECT = lesson07, CORRECT_07   # {exercise: (check name, right answer)}

and pytest runs, for each exercise of ``CORRECT``: the right answer passes with one stable
success line (the same on a second run); the stub's ``NotImplementedError`` passes through
unchanged, so the checker can say "not attempted"; a function returning ``None`` fails; an
unexpected exception is quoted. Once per module: every check ``MODULE`` exports has a right
answer here, and is exported by :mod:`mha_course.checks`. ``tests/test_checks.py`` shows that
every public check belongs to one such module.

The right answers stay beside the tests that name each lesson's mistakes (which call them with
a switch per mistake); no test module imports another.
"""

from __future__ import annotations

import re

import pytest

from mha_course import checks
from mha_course.checks import CheckFailed


def _stub(ex):
    def stub(*args, **kwargs):
        raise NotImplementedError(f"Exercise {ex}: the one-line task")

    return stub


class CheckContract:
    """The contract of the checks of ``MODULE``, run over ``CORRECT`` (see the module)."""

    MODULE = None  # the checks module: mha_course.checks.lessonNN or mha_course.checks.drill
    CORRECT: dict = {}  # {exercise: (check name, a right answer)}

    def pytest_generate_tests(self, metafunc):
        if "ex" in metafunc.fixturenames:
            metafunc.parametrize("ex", sorted(self.CORRECT, key=lambda e: tuple(
                int(n) for n in e.split("."))))

    def _check(self, ex):
        return getattr(checks, self.CORRECT[ex][0])

    def test_every_check_of_the_module_has_a_right_answer_and_is_exported(self):
        exported = {n for n in self.MODULE.__all__ if n.startswith("check_")}
        assert exported == {name for name, _ in self.CORRECT.values()}
        assert exported <= set(checks.__all__)

    def test_check_passes_a_right_answer_with_one_stable_line(self, ex, capsys):
        assert self._check(ex)(self.CORRECT[ex][1]) is None
        out, err = capsys.readouterr()
        assert err == ""
        assert out.count("\n") == 1
        assert out.startswith(f"Exercise {ex} passed: ")
        assert not re.search(r"\d\.\d{5,}", out), "no long floats in the success line"

    def test_check_passes_twice_with_identical_output(self, ex, capsys):
        self._check(ex)(self.CORRECT[ex][1])
        first = capsys.readouterr().out
        self._check(ex)(self.CORRECT[ex][1])
        assert capsys.readouterr().out == first

    def test_check_lets_the_stub_error_through_for_not_attempted(self, ex, capsys):
        with pytest.raises(NotImplementedError, match=rf"^Exercise {ex}: the one-line task$"):
            self._check(ex)(_stub(ex))
        assert capsys.readouterr().out == ""

    def test_check_fails_a_function_that_returns_none(self, ex, capsys):
        with pytest.raises(CheckFailed, match=rf"^Exercise {re.escape(ex)}: "):
            self._check(ex)(lambda *a, **k: None)
        assert capsys.readouterr().out == ""

    def test_check_quotes_an_unexpected_exception(self, ex, capsys):
        def broken(*args, **kwargs):
            raise KeyError("oops")

        with pytest.raises(CheckFailed, match=rf"^Exercise {re.escape(ex)}: .*raised KeyError"):
            self._check(ex)(broken)
        assert capsys.readouterr().out == ""
