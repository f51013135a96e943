"""The checks of lesson 12, attention in low precision: each passes a right answer and names each
classic wrong one. Exercise 12.1 was 11.5 before lesson 11 split into devices and precision.

The generic contract (``tests/check_contract.py``) is bound to lesson 12's right answers,
:data:`CORRECT_12`, by :class:`TestContract` here.
"""

from __future__ import annotations

import numpy as np
import pytest
from check_contract import CheckContract

from mha_course import checks
from mha_course.checks import CheckFailed, lesson12
from mha_course.parallel.precision import round_to


def _stall(fmt, term, off=0):
    acc, n = 0.0, 0
    while True:
        new = float(round_to(np.array([acc + term], dtype=np.float32), fmt)[0])
        if new == acc:
            return n + off
        acc, n = new, n + 1


CORRECT_12 = {
    "12.1": ("check_accumulator_stall", _stall),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson12, CORRECT_12


MISTAKES = [
    ("stall-plus-one", "check_accumulator_stall", lambda f, t: _stall(f, t, off=1),
     r"you counted the addition that changed nothing"),
    ("stall-minus-one", "check_accumulator_stall", lambda f, t: _stall(f, t, off=-1),
     r"one too few"),
    ("stall-mantissa", "check_accumulator_stall",
     lambda f, t: 2 ** {"bfloat16": 7, "float16": 10, "float8_e4m3fn": 3,
                        "float8_e5m2": 2}[f] if t == 1.0 else _stall(f, t),
     r"2\*\*7 \(the fraction bits\)"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        getattr(checks, check)(wrong)
    assert str(info.value).startswith("Exercise 12.1")
    assert capsys.readouterr().out == ""
