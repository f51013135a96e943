"""Checks for the exercises of lesson 02, softmax (``solutions/02_softmax.ipynb``).

The lesson is ``notebooks/02_softmax.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`).
"""

from __future__ import annotations

import numpy as np

from .. import log_softmax, softmax
from .harness import (
    ATOL,
    RTOL,
    call,
    check_rng,
    compare,
    fail,
    fmt,
    fmt_pair,
    fmt_shape,
    passed,
    quiet,
    rows_sum_to_one,
)
from .variants import keepdims_hint, softmax_global_max, softmax_plain

__all__ = [
    "check_cross_entropy",
    "check_log_softmax",
    "check_softmax",
    "check_softmax_temperature",
]

#: Every softmax a library offers: what exercise 02.1 asks to write (also through
#: exp(log_softmax)). PyTorch is forbidden whole: these exercises are NumPy.
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
    rng = check_rng(201)
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
    rng = check_rng(202)
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
    rng = check_rng(203)
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


#: Exercise 02.4 is to fix a loss with NumPy: PyTorch's cross_entropy would do it for you.
_NUMPY_LOSS = {"torch": "fix the loss with NumPy (mha_course.log_softmax is allowed)"}
#: The padding label, as in PyTorch's cross_entropy(ignore_index=-100) and Hugging Face.
IGNORE = -100


def cross_entropy_variant(logits, targets, pairing=False, log_of_softmax=False, ignore=True,
                          reduce="mean_real", axis=-1):
    """Cross-entropy with a switch for each classic mistake (the reference when all are off).

    ``pairing``: ``probs[:, targets]`` (every row with every target); ``log_of_softmax``:
    ``-log(softmax)``, infinite where a probability underflows; ``ignore=False``: padding labels
    used as indices (-100 picks class C - 100); ``reduce``: "mean_real" (the reference), "sum",
    or "mean_all" (padding counted as loss 0 in the mean); ``axis``: the softmax's axis.
    """
    C = logits.shape[-1]
    flat_t = np.asarray(targets).reshape(-1)  # (N,)
    real = flat_t != IGNORE if ignore else np.ones(flat_t.shape, dtype=bool)
    if log_of_softmax:
        logp = np.log(softmax(logits, axis=axis)).reshape(-1, C)
    else:
        logp = log_softmax(logits, axis=axis).reshape(-1, C)
    if pairing:  # (N, N): row i with target j, for every i and j
        picked = logp[:, flat_t[real]][real]
        losses = -picked
        return float(losses.mean() if reduce != "sum" else losses.sum())
    losses = -logp[np.arange(len(flat_t)), np.where(real, flat_t, 0)]  # (N,)
    losses = np.where(real, losses, 0.0)
    if reduce == "sum":
        return float(losses.sum())
    return float(losses.sum() / (real.sum() if reduce == "mean_real" else len(flat_t)))


_CE_BUGS = {
    "pairing": "probs[:, targets] pairs every position with every target, an (N, N) array; "
               "pick one per position: probs[np.arange(N), targets]",
    "log_of_softmax": "-np.log(softmax(...)) is inf where a target's probability underflows to "
                      "0 (a confident wrong guess): use log_softmax, x - logsumexp(x)",
    "no_ignore": f"targets of {IGNORE} mark padding: leave them out of the mean (as an index, "
                 f"{IGNORE} silently picks class C{IGNORE})",
}


def _ce_variants(logits, targets):
    """``(message, make)`` for every combination of the three bugs, and the other mistakes."""
    variants = []
    subsets = sorted(range(1, 8), key=lambda mask: bin(mask).count("1"))
    for mask in subsets:  # the fewest bugs first: name only what this probe shows
        on = [name for bit, name in enumerate(_CE_BUGS) if mask >> bit & 1]
        words = "; and ".join(_CE_BUGS[name] for name in on)
        prefix = "" if len(on) == 1 else f"{len(on)} of the colleague's bugs: "
        variants.append((prefix + words, lambda on=on: cross_entropy_variant(
            logits, targets, pairing="pairing" in on, log_of_softmax="log_of_softmax" in on,
            ignore="no_ignore" not in on)))
    variants += [
        ("you summed the losses; the loss is their mean over the real (non-padding) positions",
         lambda: cross_entropy_variant(logits, targets, reduce="sum")),
        ("you divided by every position, padding included; divide by the number of real "
         "targets", lambda: cross_entropy_variant(logits, targets, reduce="mean_all")),
        ("softmax over the wrong axis: normalise over the classes, the last axis",
         lambda: cross_entropy_variant(logits, targets, axis=-2)),
    ]
    return variants


def _loss_of(ex, got, label, shape):
    """The learner's loss as a float, or a failure saying what came back instead."""
    if got is None:
        raise fail(ex, f"{label}: your function returned None instead of the loss: did you "
                       "forget `return`?")
    arr = np.asarray(got)
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise fail(ex, f"{label}: you returned {type(got).__name__}; expected one float")
    if arr.shape != ():
        hint = (" (one loss per position: take their mean over the real positions)"
                if arr.shape in (shape, (int(np.prod(shape)),)) else "")
        raise fail(ex, f"{label}: you returned an array of shape {fmt_shape(arr.shape)}; "
                       f"expected one float, the mean loss{hint}")
    return float(arr)


def check_cross_entropy(fn) -> None:
    """Exercise 02.4: ``cross_entropy(logits, targets)``: the colleague's loss, fixed."""
    ex = "02.4"
    rng = check_rng(204)
    confident = rng.normal(size=(4, 6))
    confident[1, 2] += 900.0  # position 1 is sure of class 2 ...
    t_confident = np.array([0, 4, 5, 1])  # ... and its target is 4: p = exp(-900) = 0.0
    t_lm = rng.integers(0, 7, size=(2, 4))
    t_lm[0, 3] = t_lm[1, 2:] = IGNORE  # padded positions of a (B, T) batch
    t_vocab = rng.integers(0, 120, size=5)
    t_vocab[[1, 4]] = IGNORE  # with 120 classes, index -100 is class 20: no error, just wrong
    probes = [
        ("on logits (6, 5) with different targets", rng.normal(size=(6, 5)) * 2,
         rng.permutation(6) % 5),
        ("on logits (2, 4, 7) with padding (-100)", rng.normal(size=(2, 4, 7)), t_lm),
        ("on logits (5, 120) with padding (-100)", rng.normal(size=(5, 120)), t_vocab),
        ("on logits (4, 6) where position 1 is confidently wrong (logit gap 900)",
         confident, t_confident),
        ("on logits (1, 5), one position (the colleague's test)", rng.normal(size=(1, 5)),
         np.array([3])),
    ]
    for label, logits, targets in probes:
        want = cross_entropy_variant(logits, targets)
        got = call(ex, fn, (logits, targets), ("logits", "targets"), hint=_ce_hint,
                   forbid=_NUMPY_LOSS)
        loss = _loss_of(ex, got, f"your loss {label}", targets.shape)
        if np.isclose(loss, want, rtol=RTOL, atol=ATOL):
            continue
        for message, make in _ce_variants(logits, targets):
            wrong = quiet(make)
            if wrong is not None and not np.isclose(wrong, want, rtol=RTOL, atol=ATOL) and (
                    np.isclose(loss, wrong, rtol=RTOL, atol=ATOL) or loss == wrong):
                raise fail(ex, f"your loss {label} is {fmt(loss)}, the reference "
                               f"{fmt(want)}. Likely mistake: {message}")
        if not np.isfinite(loss):
            raise fail(ex, f"your loss {label} is {fmt(loss)}, the reference {fmt(want)}. "
                           f"Likely mistake: {_CE_BUGS['log_of_softmax']}")
        mine, theirs = fmt_pair(loss, want)
        raise fail(ex, f"your loss {label} is {mine}, the reference {theirs}")
    passed(ex, "matches the mean of -log_softmax at the targets for logits (6, 5), (2, 4, 7), "
               "(5, 120) and (1, 5): padding (-100) ignored, finite for a confident wrong guess")


def _ce_hint(exc):
    text = str(exc)
    if "out of bounds" in text and str(IGNORE) in text:
        return (f"targets of {IGNORE} mark padding: leave them out (a mask targets != {IGNORE}) "
                "before you index with them")
    if "too many indices" in text or "shape mismatch" in text or "broadcast" in text:
        return ("logits may have leading axes, (B, T, C) with targets (B, T): reshape to "
                "(N, C) and (N,) first, or use np.take_along_axis")
    return None
