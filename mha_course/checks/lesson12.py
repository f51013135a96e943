"""Checks for the exercises of lesson 12, attention in low precision
(``solutions/12_precision.ipynb``).

The lesson is ``notebooks/12_precision.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`). The references come from
:mod:`mha_course.parallel.precision` at check time: its rounding (a simulated accumulator) and
its block quantisation. Exercise 12.1 was exercise 11.5 before lesson 11 split into devices (11)
and precision (12).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..parallel.precision import block_quantize, format_info, round_to
from .harness import call, compare, fail, fmt_shape, passed
from .measure import check_rng

__all__ = ["check_accumulator_stall", "check_block_quantize_rows"]


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


# ---------------------------------------------------------------------------------- 12.2
def _by_blocks(x, fmt, block, amax_axes=(-2, -1), back=True, divide=True) -> np.ndarray:
    """The per-block quantisation with one switch per classic mistake."""
    x = np.asarray(x, dtype=np.float32)
    top = format_info(fmt)["max"]
    out = np.empty_like(x)
    for r0 in range(0, x.shape[-2], block):
        part = x[..., r0 : r0 + block, :]
        amax = np.abs(part).max(axis=amax_axes, keepdims=True)
        scale = np.where(amax > 0, amax / top if divide else amax, 1.0).astype(np.float32)
        q = round_to(part / scale, fmt, saturate=True)
        out[..., r0 : r0 + block, :] = q * scale if back else q
    return out


def check_block_quantize_rows(fn) -> None:
    """Exercise 12.2: ``block_quantize_rows(x, block, fmt)`` -> x through ``fmt`` with one
    scale per block of ``block`` rows (axis -2), back in float32."""
    ex = "12.2"
    rng = check_rng(1202)
    outlier = rng.normal(size=(2, 7, 4))
    outlier[0, 1] *= 1e4  # one row far larger than the rest: its block's scale, not the others'
    zeros = rng.normal(size=(6, 3))
    zeros[2:4] = 0.0  # a whole block of zeros
    probes = [(rng.normal(size=(5, 3)) * 3, 2, "float8_e4m3fn"),
              (outlier, 3, "float8_e4m3fn"),
              (rng.normal(size=(4, 5)) * 50, 1, "float8_e5m2"),
              (zeros, 2, "float8_e4m3fn"),
              (rng.normal(size=(3, 6, 4)), 6, "float8_e4m3fn"),
              (rng.normal(size=(8, 2)) * 1e-3, 4, "bfloat16")]
    for x, block, fmt in probes:
        want = block_quantize(x, fmt, block)
        label = f"for x of shape {fmt_shape(x.shape)}, block={block}, fmt={fmt!r}"
        got = call(ex, fn, (x.copy(), block), ("x", "block"), kwargs={"fmt": fmt},
                   forbid={"mha_course.parallel.precision.block_quantize":
                           "write the scales yourself"})
        compare(
            ex, got, want, f"your result {label}", "the shape of x",
            variants=[
                ("one scale for the whole tensor: take amax over each block of rows, "
                 "x[..., r0:r0 + block, :], not over all of x",
                 lambda x=x, fmt=fmt: block_quantize(x, fmt)),
                ("the blocks are of rows (axis -2, tokens), not of columns",
                 lambda x=x, fmt=fmt, b=block: np.swapaxes(
                     _by_blocks(np.swapaxes(x, -1, -2), fmt, b), -1, -2)),
                ("one scale per row: a block holds `block` consecutive rows",
                 lambda x=x, fmt=fmt: _by_blocks(x, fmt, 1)),
                ("one amax across every matrix of the batch: each leading index has its own "
                 "blocks (amax over axes -2 and -1 only, keepdims=True)",
                 lambda x=x, fmt=fmt, b=block: _by_blocks(x, fmt, b, amax_axes=None)),
                ("the result is still in the format's units: multiply it back by the scale",
                 lambda x=x, fmt=fmt, b=block: _by_blocks(x, fmt, b, back=False)),
                ("the scale is amax / largest (format_info(fmt)['max']), so that the block's "
                 "largest |value| lands on the format's largest value; you divided by amax",
                 lambda x=x, fmt=fmt, b=block: _by_blocks(x, fmt, b, divide=False)),
            ],
            nan_message="a block of zeros has amax 0, and 0 / 0 is NaN: keep a scale of 1 there "
                        "(np.where(amax > 0, amax / largest, 1.0))",
        )
    passed(ex, "6 tensors (an outlier row, a block of zeros, a batch, block = 1 and = T, "
               "e4m3, e5m2 and bfloat16) quantised block by block as block_quantize does")
