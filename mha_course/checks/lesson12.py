"""Checks for the exercises of lesson 12, attention in low precision
(``solutions/12_precision.ipynb``).

The lesson is ``notebooks/12_precision.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`). The references come from the simulated accumulators of
:mod:`mha_course.parallel.precision` at check time. Exercise 12.1 was exercise 11.5 before
lesson 11 split into devices (11) and precision (12).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..parallel.precision import format_info, round_to
from .harness import call, fail, passed

__all__ = ["check_accumulator_stall"]


def _int(ex, got, label):
    if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral, np.integer)):
        raise fail(ex, f"{label} you returned {got!r} ({type(got).__name__}); expected an int")
    return int(got)


# ---------------------------------------------------------------------------------- 12.1
def _stall(fmt, term) -> int:
    acc, n = np.float32(0.0), 0
    while True:
        new = round_to(np.array([acc + np.float32(term)]), fmt)[0]
        if new == acc:
            return n
        acc, n = new, n + 1


def check_accumulator_stall(fn) -> None:
    """Exercise 12.1: ``accumulator_stall(fmt, term)`` -> int, the terms added before the
    running sum stops growing."""
    ex = "12.1"
    probes = [("bfloat16", 1.0), ("float16", 1.0), ("float8_e4m3fn", 1.0), ("bfloat16", 0.01),
              ("float16", 0.3), ("float8_e5m2", 2.0), ("bfloat16", 3.0)]
    for fmt, term in probes:
        want = _stall(fmt, term)
        label = f"for fmt={fmt!r}, term={term}"
        got = _int(ex, call(ex, fn, (fmt, term), ("fmt", "term"),
                            forbid={"mha_course.parallel.precision.sequential_sum":
                                    "write the accumulator yourself"}), label)
        if got == want:
            continue
        m = format_info(fmt)["mantissa_bits"]
        hint = None
        if got == want + 1:
            hint = "you counted the addition that changed nothing; return how many did change it"
        elif got == want - 1:
            hint = "one too few: count every addition that changed the sum"
        elif term == 1.0 and got == 2**m:
            hint = (f"2**{m} (the fraction bits) is where the gap between values reaches 1; the "
                    "sum still grows there, by rounding to even, until the gap is 2")
        raise fail(ex, f"{label} you returned {got}; the sum stops growing after {want} "
                       "additions (simulated with round_to after each one)"
                   + (f". Likely mistake: {hint}" if hint else ""))
    passed(ex, "7 formats and terms (ones in bfloat16, float16 and e4m3, 0.01, 0.3, 2 and 3) "
               "stall where a simulated accumulator does")
