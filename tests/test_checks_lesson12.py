"""The checks of lesson 12, attention in low precision: each passes a right answer and names each
classic wrong one (12.1 an accumulator, 12.2 FP8 scales per block of rows). Exercise 12.1 was
11.5 before lesson 11 split into devices and precision.

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


def _blocks(x, block, fmt="float8_e4m3fn", how="right"):
    """Quantise ``x`` with one scale per block of rows, or with one classic mistake."""
    x = np.asarray(x, dtype=np.float32)
    top = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "bfloat16": 3.3895314e38}[fmt]
    if how == "columns":
        return np.swapaxes(_blocks(np.swapaxes(x, -1, -2), block, fmt), -1, -2)
    if how == "tensor":
        block = x.shape[-2]
    out = np.empty_like(x)
    for r0 in range(0, x.shape[-2], block):
        part = x[..., r0:r0 + block, :]
        axes = None if how in ("batch", "tensor") else (-2, -1)
        amax = np.abs(part).max(axis=axes, keepdims=True)
        if how == "zero":
            scale = amax / top
        else:
            scale = np.where(amax > 0, amax if how == "amax" else amax / top, 1.0)
        q = round_to(part / scale, fmt, saturate=True)
        out[..., r0:r0 + block, :] = q if how == "units" else q * scale
    return out


CORRECT_12 = {
    "12.1": ("check_accumulator_stall", _stall),
    "12.2": ("check_block_quantize_rows", _blocks),
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
    ("blocks-one-scale", "check_block_quantize_rows",
     lambda x, b, fmt="float8_e4m3fn": _blocks(x, b, fmt, how="tensor"),
     r"one scale for the whole"),
    ("blocks-of-columns", "check_block_quantize_rows",
     lambda x, b, fmt="float8_e4m3fn": _blocks(x, b, fmt, how="columns"), r"not of columns"),
    ("blocks-per-row", "check_block_quantize_rows",
     lambda x, b, fmt="float8_e4m3fn": _blocks(x, 1, fmt), r"one scale per row"),
    ("blocks-across-the-batch", "check_block_quantize_rows",
     lambda x, b, fmt="float8_e4m3fn": _blocks(x, b, fmt, how="batch"),
     r"one amax across every matrix of the batch"),
    ("blocks-not-scaled-back", "check_block_quantize_rows",
     lambda x, b, fmt="float8_e4m3fn": _blocks(x, b, fmt, how="units"),
     r"multiply it back by the scale"),
    ("blocks-divided-by-amax", "check_block_quantize_rows",
     lambda x, b, fmt="float8_e4m3fn": _blocks(x, b, fmt, how="amax"), r"you divided by amax"),
    ("blocks-of-zeros", "check_block_quantize_rows",
     lambda x, b, fmt="float8_e4m3fn": _blocks(x, b, fmt, how="zero"),
     r"a block of zeros has amax 0"),
    ("blocks-package", "check_block_quantize_rows",
     lambda x, b, fmt="float8_e4m3fn": __import__(
         "mha_course.parallel.precision", fromlist=["x"]).block_quantize(x, fmt, b),
     r"asks you to write the scales yourself"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        getattr(checks, check)(wrong)
    assert str(info.value).startswith("Exercise 12.")
    assert capsys.readouterr().out == ""
