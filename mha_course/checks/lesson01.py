"""Checks for the exercises of lesson 01, matrix multiplication (``solutions/01_matmul.ipynb``).

The lesson is ``notebooks/01_matmul.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`).
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np

from ..naive import matmul as naive_matmul
from .harness import CheckFailed, call, check_rng, compare, describe, fail, fmt_shape, passed
from .variants import attention_hint

__all__ = [
    "check_batched_scores",
    "check_cheaper_order",
    "check_flops_chain",
    "check_matmul_loops",
    "check_matmul_shape",
    "check_most_similar",
]


#: Exercise 01.1 is the lesson's first matmul: Python loops over lists, nothing else.
_LOOPS_ONLY = {
    "numpy": "multiply with three Python loops, without NumPy",
    "mha_course.naive": "write the three loops yourself",  # matmul, matmul_ijk, ...
}


def check_matmul_loops(fn) -> None:
    """Exercise 01.1: ``matmul(a, b)`` of lists of lists with three Python loops."""
    ex = "01.1"
    rng = check_rng(101)
    for m, n, p in ((3, 5, 4), (4, 1, 3), (1, 2, 1)):
        a = rng.integers(-4, 5, size=(m, n)).tolist()
        b = rng.integers(-4, 5, size=(n, p)).tolist()
        want = np.asarray(naive_matmul(a, b), dtype=float)
        got = call(ex, fn, (a, b), ("a", "b"), forbid=_LOOPS_ONLY)
        try:
            got = None if got is None else np.asarray(got, dtype=float)
        except (TypeError, ValueError):
            raise fail(ex, f"you returned {type(got).__name__} that is not a rectangular list "
                           "of lists of numbers") from None
        last = np.asarray(a)[:, -1:] * np.asarray(b)[-1:, :]
        compare(
           ex, got, want,
           f"your product of a {fmt_shape((m, n))} and a {fmt_shape((n, p))} list", "(m, p)",
           variants=[
               ("every entry equals only the last term a[i][k]*b[k][j]: did you write `=` "
                "instead of `+=` in the innermost loop?", lambda last=last: last),
           ],
           shape_hints={(p, m): "you returned (p, m): did you swap i and j when indexing "
                                "the result?"},
        )
    a = rng.integers(-4, 5, size=(3, 5)).tolist()
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            result = fn(a, a)
    except NotImplementedError:
        raise
    except ValueError:
        pass
    except Exception as exc:
        raise fail(ex, f"multiplying a (3, 5) by a (3, 5) raised {type(exc).__name__} ({exc}); "
                       "expected ValueError: check that len(a[0]) == len(b) before the "
                       "loops") from exc
    else:
        raise fail(ex, f"multiplying a (3, 5) by a (3, 5) returned {describe(result)}; "
                       "the inner dimensions 5 and 3 differ, so raise ValueError")
    passed(ex, "(3, 5) @ (5, 4), (4, 1) @ (1, 3) and (1, 2) @ (2, 1) match "
               "mha_course.naive.matmul; mismatched inner dimensions raise ValueError")


def check_most_similar(fn) -> None:
    """Exercise 01.2: ``most_similar(queries, keys)``: index of the key with the largest dot."""
    ex = "01.2"
    rng = check_rng(102)
    probes = [(rng.normal(size=(3, 4)), rng.normal(size=(5, 4)) * np.array([[0.4], [1.0], [2.5],
                                                                            [0.7], [1.6]])),
              (rng.normal(size=(6, 9)), rng.normal(size=(4, 9)) * np.array([[2.0], [0.3], [1.2],
                                                                            [0.8]]))]
    for queries, keys in probes:
        scores = queries @ keys.T  # (T, S)
        want = np.argmax(scores, axis=1)
        got = call(ex, fn, (queries, keys), ("queries", "keys"))
        if got is not None and np.asarray(got).dtype.kind == "f":
            if np.asarray(got).shape == want.shape and np.allclose(got, scores.max(axis=1)):
                raise fail(ex, "you returned the largest scores, not their positions: use "
                               "np.argmax instead of np.max")
        dist = np.linalg.norm(queries[:, None, :] - keys[None, :, :], axis=-1)
        T, S = scores.shape
        compare(
           ex, got, want,
           f"your indices for {T} queries and {S} keys of size {queries.shape[1]}", "(T,)",
           variants=[
               ("you picked the nearest key by distance; the dot product also grows with a "
                "key's length, so the most similar key by dot product can be a far, long one",
                lambda dist=dist: np.argmin(dist, axis=1)),
               ("you took the argmin: the most similar key has the LARGEST dot product",
                lambda scores=scores: np.argmin(scores, axis=1)),
           ],
           shape_hints={(S,): "one index per key: take the argmax over the keys, axis=1 of the "
                              "(T, S) scores queries @ keys.T"},
        )
    passed(ex, "the indices for 3 queries and 5 keys of different lengths match "
               "np.argmax(queries @ keys.T, axis=1)")


def check_batched_scores(fn) -> None:
    """Exercise 01.3: ``batched_scores(Q, K)``: Q Kᵀ for every batch and head, (B, h, T, S)."""
    ex = "01.3"
    rng = check_rng(103)
    for B, h, T, S, d in ((2, 3, 4, 5, 6), (1, 4, 2, 3, 5)):
        Q = rng.normal(size=(B, h, T, d))
        K = rng.normal(size=(B, h, S, d))
        want = Q @ np.swapaxes(K, -1, -2)
        got = call(ex, fn, (Q, K), ("Q", "K"), hint=attention_hint)
        compare(
           ex, got, want, f"your scores for Q {fmt_shape(Q.shape)}, K {fmt_shape(K.shape)}",
           "(B, h, T, S)",
           variants=[
               ("you divided by √d: this exercise wants the raw dot products (the scaling comes "
                "in lesson 03)", lambda want=want, d=d: want / np.sqrt(d)),
           ],
           shape_hints={
               (B, T, S): "you summed over the head axis: keep h in the output, e.g. "
                          "np.einsum('bhtd,bhsd->bhts', Q, K)",
               (B, h, S, T): "you computed K Qᵀ, (S, T): the queries index the rows, Q @ Kᵀ",
           },
        )
    passed(ex, "(2, 3, 4, 6) @ (2, 3, 5, 6)ᵀ gives (2, 3, 4, 5) and matches Q @ "
               "np.swapaxes(K, -1, -2)")


def _flops_chain(shapes) -> int:
    (m, n), total = shapes[0], 0
    for n2, p in shapes[1:]:
        if n2 != n:
            raise ValueError("inner dimensions differ")
        total += 2 * m * n * p
        n = p
    return total


def check_flops_chain(fn) -> None:
    """Exercise 01.4: ``flops_chain(shapes)``: FLOPs of multiplying a chain left to right."""
    ex = "01.4"
    chains = [[(3, 5), (5, 4)], [(2, 3), (3, 7), (7, 5)], [(10, 1), (1, 10), (10, 1), (1, 6)]]
    for shapes in chains:
        want = _flops_chain(shapes)
        got = call(ex, fn, (list(shapes),), ("shapes",))
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral,
                                                                      np.integer)):
            raise fail(ex, f"for {shapes} you returned {got!r} ({type(got).__name__}); "
                           f"expected an int ({want}). Use // or int arithmetic, not /")
        if got == want:
            continue
        pairwise = sum(2 * a * b * c for (a, b), (_, c) in zip(shapes, shapes[1:], strict=False))
        why = ""
        if 2 * got == want:
            why = ("you counted m·n·p; a multiply-add is 2 FLOPs, so an (m, n) @ (n, p) costs "
                   "2·m·n·p")
        elif got == pairwise and len(shapes) > 2:
            why = ("you multiplied each pair of neighbours; after the first step the left "
                   "operand is the running product, whose shape is (first rows, current cols)")
        raise fail(ex, f"for {shapes} you returned {got}, expected {want}"
                       + (f". Likely mistake: {why}" if why else ""))
    try:
        result = fn([(2, 3), (4, 5)])
    except NotImplementedError:
        raise
    except ValueError:
        pass
    except Exception as exc:
        raise fail(ex, f"for [(2, 3), (4, 5)] your function raised {type(exc).__name__}; "
                       "expected ValueError (the inner dimensions 3 and 4 differ)") from exc
    else:
        raise fail(ex, f"for [(2, 3), (4, 5)] you returned {result!r}; the inner dimensions "
                       "3 and 4 differ, so raise ValueError")
    passed(ex, "chains of 2, 3 and 4 matrices give 2·m·n·p summed over the steps; a "
               "mismatched chain raises ValueError")


def check_cheaper_order(fn) -> None:
    """Exercise 01.5: ``cheaper_order(a, b, c)``: "(AB)C" or "A(BC)", whichever costs less."""
    ex = "01.5"
    cases = [((10, 100), (100, 5), (5, 50)), ((50, 5), (5, 100), (100, 10)),
             ((2, 3), (3, 5), (5, 4)), ((1000, 64), (64, 1000), (1000, 64))]
    answers = []
    for a, b, c in cases:
        left = _flops_chain([a, b]) + _flops_chain([(a[0], b[1]), c])
        right = _flops_chain([b, c]) + _flops_chain([a, (b[0], c[1])])
        want = "(AB)C" if left < right else "A(BC)"
        got = call(ex, fn, (a, b, c), ("a", "b", "c"))
        if got not in ("(AB)C", "A(BC)"):
            raise fail(ex, f"you returned {got!r}; expected one of the strings '(AB)C' "
                           "or 'A(BC)'")
        answers.append((got, want, a, b, c, left, right))
    wrong = [t for t in answers if t[0] != t[1]]
    if wrong:
        got, want, a, b, c, left, right = wrong[0]
        why = ""
        if len(wrong) == len(answers):
            why = " Likely mistake: you return the MORE expensive order; flip the comparison."
        elif len({t[0] for t in answers}) == 1:
            why = f" Likely mistake: you always return {got!r}; compare the two costs."
        raise fail(ex, f"for A {a}, B {b}, C {c}: (AB)C costs {left} FLOPs and A(BC) costs "
                       f"{right}, so the answer is {want!r}; you returned {got!r}.{why}")
    passed(ex, "four chains, including (Q Kᵀ) V against Q (Kᵀ V), choose the cheaper order")



#: Exercise 01.6 is a prediction: the shape comes from the rules, not from asking NumPy.
_SHAPE_BY_RULE = {"numpy": "work out the shape from the rules, without NumPy"}

#: (a's shape, b's shape, what a wrong rule gets wrong here): the probes of exercise 01.6, in
#: the order a learner meets the rules (same batch, a shared weight, stretching 1s, errors).
_SHAPE_PROBES = [
    ((2, 3, 4, 5), (2, 3, 5, 6), ""),
    ((7, 4, 5), (5, 6), "a 2-D b multiplies every (4, 5) matrix of a: x @ W_q in lesson 03"),
    ((4, 5), (2, 3, 5, 6), "a's missing leading axes count as 1s, so b's (2, 3) come through"),
    ((2, 1, 4, 5), (3, 5, 6), "a's batch axis of size 1 stretches to b's 3; b's missing axis "
                              "counts as 1 and stretches to a's 2"),
    ((1, 3, 4, 5), (2, 1, 5, 6), "each size-1 batch axis stretches to the other's size"),
    ((5, 3, 2, 4), (4, 7), ""),
    ((6, 1), (1, 9), "inner sizes 1 and 1 agree: an outer product"),
    ((2, 3, 4, 5), (2, 3, 4, 6), "the inner sizes 5 (a's last axis) and 4 (b's second-to-last) "
                                 "differ"),
    ((2, 4, 5), (3, 5, 6), "the batch sizes 2 and 3 differ and neither is 1"),
    ((3, 2), (1, 4), "the inner sizes 2 and 1 differ: a 1 stretches only in the batch axes, "
                     "never in the two matrix axes"),
]


def _numpy_matmul_shape(a_shape, b_shape):
    """What NumPy itself does: the shape of ``zeros(a) @ zeros(b)``, or the ValueError."""
    try:
        return tuple(np.matmul(np.zeros(a_shape, np.int8), np.zeros(b_shape, np.int8)).shape), ""
    except ValueError as exc:
        return None, str(exc)


def _call_or_value_error(ex, fn, args, names, forbid):
    """``(result, None)``, or ``(None, error)`` when ``fn`` raised ValueError (as asked)."""
    try:
        return call(ex, fn, args, names, forbid=forbid), None
    except CheckFailed as err:
        if isinstance(err.__cause__, ValueError) and str(err).startswith(
                f"Exercise {ex}: your function raised"):
            return None, err.__cause__
        raise


def _as_shape(ex, got, label):
    """The learner's returned shape as a tuple of ints, or a failure saying what was returned."""
    if got is None:
        raise fail(ex, f"{label}: your function returned None instead of a shape: did you "
                       "forget `return`?")
    if isinstance(got, np.ndarray) and got.ndim > 1:
        raise fail(ex, f"{label}: you returned an array of shape {fmt_shape(got.shape)}; "
                       "return the SHAPE of the product, a tuple such as (2, 3, 4, 6)")
    try:
        items = list(got)
    except TypeError:
        raise fail(ex, f"{label}: you returned {got!r} ({type(got).__name__}); expected a "
                       "tuple of ints such as (2, 3, 4, 6)") from None
    if not all(isinstance(n, (numbers.Integral, np.integer)) and not isinstance(n, bool)
               for n in items):
        raise fail(ex, f"{label}: you returned {got!r}; expected a tuple of ints such as "
                       "(2, 3, 4, 6)")
    return tuple(int(n) for n in items)


def check_matmul_shape(fn) -> None:
    """Exercise 01.6: ``matmul_shape(a_shape, b_shape)``: the shape of ``a @ b``, or ValueError."""
    ex = "01.6"
    for a_shape, b_shape, why in _SHAPE_PROBES:
        want, numpy_error = _numpy_matmul_shape(a_shape, b_shape)
        label = f"for a {fmt_shape(a_shape)} @ b {fmt_shape(b_shape)}"
        got, error = _call_or_value_error(ex, fn, (a_shape, b_shape), ("a_shape", "b_shape"),
                                          _SHAPE_BY_RULE)
        if want is None:
            if error is not None:
                continue
            mine = _as_shape(ex, got, label)
            batch_a, batch_b = a_shape[:-2], b_shape[:-2]
            if a_shape[-1] != b_shape[-2]:
                likely = (f"{why}. Raise ValueError when a_shape[-1] != b_shape[-2]" if
                          1 in (a_shape[-1], b_shape[-2]) else
                          f"{why}: check a_shape[-1] == b_shape[-2] and raise ValueError")
            else:
                likely = (f"{why}: aligned from the right, two batch sizes must be equal or "
                          f"one of them 1 (a's batch axes {fmt_shape(batch_a)}, b's "
                          f"{fmt_shape(batch_b)}); otherwise raise ValueError")
            raise fail(ex, f"{label} you returned {fmt_shape(mine)}, but NumPy refuses this "
                           f"product (ValueError). Likely mistake: {likely}")
        if error is not None:
            likely = why or "the batch axes broadcast"
            raise fail(ex, f"{label} you raised ValueError ({error}), but NumPy computes it: "
                           f"shape {fmt_shape(want)}. Likely mistake: {likely}")
        mine = _as_shape(ex, got, label)
        if mine == want:
            continue
        likely = ""
        if mine == a_shape[:-1] + b_shape[-1:] and a_shape[:-2] != want[:-2]:
            likely = ("you kept only a's leading axes: the result's batch axes are a's and b's "
                      "leading axes broadcast together")
        elif mine == b_shape[:-2] + (a_shape[-2], b_shape[-1]) and b_shape[:-2] != want[:-2]:
            likely = "you kept only b's leading axes: broadcast a's and b's leading axes together"
        elif mine[:-2] == want[:-2] and mine[-2:] == (b_shape[-1], a_shape[-2]):
            likely = "the last two axes are (a's rows, b's columns): (..., m, n) @ (..., n, p) " \
                     "-> (..., m, p)"
        elif len(mine) != len(want):
            likely = ("the result has as many axes as the operand with more axes: "
                      f"{len(want)} here")
        raise fail(ex, f"{label} you returned {fmt_shape(mine)}; NumPy gives {fmt_shape(want)}"
                       + (f". Likely mistake: {likely}" if likely else
                          (f". Here: {why}" if why else "")))
    passed(ex, "ten pairs of shapes, from (2, 3, 4, 5) @ (2, 3, 5, 6) to stretched size-1 batch "
               "axes, give NumPy's shape, and the three products NumPy refuses raise ValueError")
