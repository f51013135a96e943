"""Checks for the exercises of lesson 02, softmax (``solutions/02_softmax.ipynb``).

The lesson is ``notebooks/02_softmax.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`).
"""

from __future__ import annotations

import numpy as np

from .. import log_softmax, softmax
from .harness import (
    call,
    compare,
    fmt_index,
    fmt_shape,
    masked_are_zero,
    passed,
    random_mask,
    rows_sum_to_one,
)
from .variants import keepdims_hint, softmax_global_max, softmax_plain

__all__ = [
    "check_log_softmax",
    "check_masked_softmax",
    "check_softmax",
    "check_softmax_temperature",
]

#: Every softmax a library offers: what exercises 02.1 and 02.4 ask to write, and (through
#: exp(log_softmax)) 02.1 again. PyTorch is forbidden whole: these exercises are NumPy.
_LIBRARY_SOFTMAX = [
    "mha_course.softmax", "mha_course.log_softmax", "mha_course.logsumexp",
    "mha_course.softmax.softmax_inplace", "mha_course.naive.softmax_rows",
    "mha_course.tiled_attention", "mha_course.scaled_dot_product_attention",
    "scipy.special.softmax", "scipy.special.log_softmax", "scipy.special.logsumexp", "torch",
]
#: Exercise 02.1 is to write the stable softmax with NumPy.
_OWN_SOFTMAX = dict.fromkeys(_LIBRARY_SOFTMAX, "write the softmax yourself, with NumPy")
#: Exercise 02.3 is to write log-softmax through log-sum-exp with NumPy.
_OWN_LOG_SOFTMAX = dict.fromkeys(
    ["mha_course.log_softmax", "mha_course.logsumexp", "scipy.special.log_softmax",
     "scipy.special.logsumexp", "torch"],
    "compute log-sum-exp yourself, with NumPy",
)


def check_softmax(fn) -> None:
    """Exercise 02.1: ``softmax(x)`` over the last axis, stable for large scores."""
    ex = "02.1"
    rng = np.random.default_rng(201)
    x = rng.normal(size=(2, 3, 5)) * 2
    probes = [
        ("on scores of shape (2, 3, 5)", x),
        ("on a 1-D array of 5 scores", rng.normal(size=5)),
        ("on scores of shape (2, 2, 3, 4)", rng.normal(size=(2, 2, 3, 4)) * 2),
        ("on scores near 800", rng.normal(size=(2, 3, 5)) * 2 + 800),
        ("on rows of very different size (offsets from -700 to 900)",
         rng.normal(size=(2, 3, 5)) + np.array([[0.0, 900.0, -40.0], [300.0, -700.0, 5.0]])[
             ..., None]),
    ]
    for label, scores in probes:
        want = softmax(scores)
        got = call(ex, fn, (scores,), ("x",), hint=keepdims_hint, forbid=_OWN_SOFTMAX)
        compare(
           ex, got, want, f"your softmax {label}", "x.shape",
           variants=[
               ("softmax without max subtraction: exp of a large score overflows to inf, and "
                "inf/inf = NaN. Subtract each row's max first (softmax is shift-invariant)",
                lambda s=scores: softmax_plain(s)),
               ("softmax over the wrong axis: normalise over the last axis (axis=-1), so that "
                "each row sums to 1",
                lambda s=scores: softmax(s, axis=-2) if s.ndim > 1 else None),
               ("you subtracted the max of the whole array instead of each row's max: rows far "
                "below it underflow to 0/0 = NaN. Use x.max(axis=-1, keepdims=True)",
                lambda s=scores: softmax_global_max(s)),
               ("you divided by the sum of the whole array; sum over axis=-1 with "
                "keepdims=True", lambda s=scores: np.exp(s - s.max()) / np.exp(s - s.max()).sum()),
           ],
           nan_message=("softmax without max subtraction: exp of a large score overflows to "
                        "inf, and inf/inf = NaN. Subtract each row's max first")
           if scores.max() > 700 else None,
           props=[rows_sum_to_one(ex, "your softmax")],
        )
    passed(ex, "matches mha_course.softmax on shapes (5,) and (2, 3, 5); rows sum to 1; no "
               "overflow near 800; rows of very different size; input left unchanged")


def check_softmax_temperature(fn) -> None:
    """Exercise 02.2: ``softmax_temperature(x, tau)`` = softmax(x / tau) over the last axis."""
    ex = "02.2"
    rng = np.random.default_rng(202)
    x3 = rng.normal(size=(2, 3, 5))
    probes = [(x3, tau) for tau in (0.5, 1.0, 3.0, 0.001)] + [(rng.normal(size=(4, 6)), 2.0)]
    for x, tau in probes:
        want = softmax(x / tau)
        got = call(ex, fn, (x, tau), ("x", "tau"), hint=keepdims_hint)
        compare(
           ex, got, want, f"your result for tau={tau} on x {fmt_shape(x.shape)}", "x.shape",
           variants=[
               ("you multiplied the scores by the temperature; divide: softmax(x / tau)",
                lambda x=x, t=tau: softmax(x * t)),
               ("the temperature had no effect: compute softmax(x / tau)",
                lambda x=x: softmax(x)),
               ("softmax without max subtraction: at tau=0.001 the scores x / tau reach the "
                "thousands and exp overflows (inf/inf = NaN). Subtract each row's max first",
                lambda x=x, t=tau: softmax_plain(x / t)),
           ],
           nan_message=("at a small tau the scores x / tau are huge and exp overflows: "
                        "subtract each row's max before exp") if tau < 0.01 else None,
           props=[rows_sum_to_one(ex, f"your result for tau={tau}")],
        )
    passed(ex, "matches mha_course.softmax(x / tau) for tau = 0.5, 1, 3 and 0.001 "
               "(nearly one-hot, no overflow)")


def check_log_softmax(fn) -> None:
    """Exercise 02.3: ``log_softmax(x)`` = x - logsumexp(x) over the last axis."""
    ex = "02.3"
    rng = np.random.default_rng(203)
    x = rng.normal(size=(2, 3, 5))
    tiny = x.copy()
    tiny[..., 1:] -= 800  # softmax underflows to 0 there; log of it would be -inf
    probes = [("on scores of shape (2, 3, 5)", x),
              ("on rows where all but the first score are about -800", tiny),
              ("on scores near 800", x + 800),
              ("on a 1-D array of 7 scores", rng.normal(size=7)),
              ("on scores of shape (2, 2, 3, 4)", rng.normal(size=(2, 2, 3, 4)))]
    for label, scores in probes:
        want = log_softmax(scores)
        got = call(ex, fn, (scores,), ("x",), hint=keepdims_hint, forbid=_OWN_LOG_SOFTMAX)
        compare(
           ex, got, want, f"your log-softmax {label}", "x.shape",
           variants=[
               ("you computed log(softmax(x)): the softmax underflows to 0 for scores far "
                "below the max, and log(0) = -inf. Compute x - logsumexp(x) instead",
                lambda s=scores: np.log(softmax(s))),
               ("log-sum-exp without max subtraction: exp(800) overflows to inf. Use "
                "m + log(sum(exp(x - m))) with m the row max",
                lambda s=scores: s - np.log(np.exp(s).sum(axis=-1, keepdims=True))),
               ("log-softmax over the wrong axis: reduce over the last axis (axis=-1)",
                lambda s=scores: log_softmax(s, axis=-2) if s.ndim > 1 else None),
           ],
           nan_message=("a non-finite value: compute x - (m + log(sum(exp(x - m)))) with m "
                        "the row max, never log(softmax(x)) or exp of a raw score"),
        )
    passed(ex, "matches mha_course.log_softmax on ordinary scores, on scores 800 below the "
               "max (no -inf) and on scores near 800 (no overflow)")


#: Exercise 02.4 is to write the masked softmax: no library softmax may do it.
_OWN_MASKED_SOFTMAX = dict.fromkeys(_LIBRARY_SOFTMAX, "write the masking yourself")


def check_masked_softmax(fn) -> None:
    """Exercise 02.4: ``masked_softmax(x, mask)``: zeros where masked, zeros on a full-mask row."""
    ex = "02.4"
    rng = np.random.default_rng(204)
    x3, x2 = rng.normal(size=(2, 3, 5)) * 2, rng.normal(size=(4, 6)) * 2
    for x, full in ((x3, ()), (x3, ((1, 0), (0, 2))), (x2, ((2,),))):
        mask = random_mask(rng, x.shape, full)
        want = softmax(x, mask=mask)
        full_rows = ~mask.any(axis=-1)
        got = call(ex, fn, (x, mask), ("x", "mask"), hint=keepdims_hint,
                   forbid=_OWN_MASKED_SOFTMAX)
        label = ("with a fully masked row" if full else "with every row partly kept") + (
            f" on x {fmt_shape(x.shape)}" if x.ndim != 3 else "")
        rows = " and ".join(fmt_index(r) for r in full)
        compare(
           ex, got, want, f"your masked softmax {label}", "x.shape",
           variants=[
               ("the mask was applied after the softmax: the kept weights no longer sum to 1. "
                "Set masked scores to -inf BEFORE the softmax",
                lambda x=x, m=mask: softmax(x) * m),
               ("the mask is inverted: True means keep (may attend), False means masked out",
                lambda x=x, m=mask: softmax(x, mask=~m)),
               ("the mask had no effect: masked entries must come out exactly 0",
                lambda x=x: softmax(x)),
               (f"the fully masked rows {rows} come out uniform (1/{x.shape[-1]} each): that is "
                "what filling with a large negative number such as -1e9 does. A row with nothing "
                "to attend to must be all zeros",
                lambda x=x, m=mask: softmax(np.where(m, x, -1e9))),
           ],
           nan_message=(f"rows {rows} are fully masked: their max is -inf and -inf - (-inf) = "
                        "NaN. Shift such a row by 0 instead of its max (np.where(np.isfinite(m), "
                        "m, 0)) and divide by 1 where the sum is 0, so the row is all zeros")
           if full else None,
           props=[masked_are_zero(ex, "your masked softmax", mask),
                  rows_sum_to_one(ex, "your masked softmax", full_rows)],
        )
    passed(ex, "matches mha_course.softmax(x, mask=mask); masked entries are 0; a fully "
               "masked row is all zeros, not NaN")


