"""Checks for the exercises in ``solutions/`` and ``exercises/``: they say what is wrong, in words.

Used by ``exercises/NN_*.ipynb`` (the exercises for ``notebooks/01_matmul.ipynb`` to
``notebooks/04_multi_head_attention.ipynb``). Each exercise ``NN.M`` has one public
``check_<name>(fn)`` that

1. calls your function on seeded inputs whose dimensions all differ (B=2, T=3, S=5, d_k=4, d_v=6
   and the like), so a transposed axis cannot hide;
2. compares the result with the package's reference, computed now (not numbers frozen in a
   file);
3. if they differ, runs the known wrong versions (no √d_k, softmax over the wrong axis, the mask
   applied after the softmax, ...) on the same inputs and, when one matches yours, names that
   mistake; otherwise checks properties (shape, dtype, no NaN, rows sum to 1, nothing above the
   causal diagonal) and reports the first that fails;
4. prints one line ``Exercise NN.M passed: <what was checked>`` on success, or raises
   :class:`CheckFailed` whose message starts with ``Exercise NN.M: ``.

An exception raised by your function becomes a :class:`CheckFailed` that quotes it, except
``NotImplementedError``: the exercise stub raises it (``Exercise NN.M: <task>``), and it passes
through unchanged, so the checker (``python -m mha_course check``) can report "not attempted".

Examples
--------
>>> check_causal_mask(lambda T: np.tril(np.ones((T, T), dtype=bool)))
Exercise 03.3 passed: (T, T) bool masks for T = 1, 4, 7 match mha_course.causal_mask
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings

import numpy as np

from .attention import causal_mask, padding_mask, scaled_dot_product_attention
from .cost import param_count
from .multihead import MultiHeadAttention, merge_heads, split_heads
from .naive import matmul as naive_matmul
from .softmax import log_softmax, softmax

__all__ = [
    "CheckFailed",
    "check_attention",
    "check_attention_scores",
    "check_batched_scores",
    "check_causal_mask",
    "check_cheaper_order",
    "check_cross_attention",
    "check_flops_chain",
    "check_fuse_heads",
    "check_log_softmax",
    "check_masked_self_attention",
    "check_masked_softmax",
    "check_matmul_loops",
    "check_merge_heads",
    "check_mha_forward",
    "check_most_similar",
    "check_padding_mask",
    "check_param_count",
    "check_softmax",
    "check_softmax_temperature",
    "check_split_heads",
]

RTOL, ATOL = 1e-6, 1e-9
_NAN_GENERIC = ("NaN and inf come from 0/0, inf/inf, inf - inf or a log of 0 or less; print "
                "the intermediate arrays of your function to see where they first appear")


class CheckFailed(AssertionError):
    """Your answer to an exercise is wrong; the message says how, and the likely mistake."""


# --------------------------------------------------------------------------- shared helpers


def _fail(ex: str, message: str) -> CheckFailed:
    return CheckFailed(f"Exercise {ex}: {message}")


def _passed(ex: str, what: str) -> None:
    print(f"Exercise {ex} passed: {what}")


def _fmt(value) -> str:
    """A number for a failure message: integers as they are, floats to 4 decimals."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (numbers.Integral, np.integer)):
        return str(int(value))
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value + 0.0:.4f}"


def _idx(index) -> str:
    index = tuple(int(i) for i in index)
    return str(index[0]) if len(index) == 1 else str(index)


def _shape(shape) -> str:
    shape = tuple(int(n) for n in shape)
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _equal(a, b) -> bool:
    """Exact equality of two arguments (arrays, lists, layers), NaN equal to NaN."""
    if isinstance(a, MultiHeadAttention):
        return isinstance(b, MultiHeadAttention) and all(
            _equal(p, q) for p, q in zip(a.parameters().values(), b.parameters().values(),
                                         strict=True)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _quiet(make):
    """Run ``make()`` with NumPy warnings off; return None if it raises (for wrong variants)."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return make()
    except Exception:
        return None


def _call(ex: str, fn, args: tuple, names: tuple, kwargs=None, hint=None):
    """Call the learner's ``fn`` on copies; turn its exceptions and side effects into words."""
    kwargs = kwargs or {}
    if not callable(fn):
        raise _fail(
            ex,
            f"expected your function, got {type(fn).__name__}: pass the function itself "
            "(check_x(my_function)), not the result of calling it",
        )
    pristine = copy.deepcopy((args, kwargs))
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            result = fn(*args, **kwargs)
    except NotImplementedError:
        raise  # the exercise stub (or one it calls): "not attempted yet", not a mistake
    except CheckFailed:
        raise
    except Exception as exc:
        called = ", ".join(
            [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
        )
        extra = hint(exc) if hint else None
        raise _fail(
            ex,
            f"your function raised {type(exc).__name__}: {exc}\n  (called with {called})"
            + (f"\n  Likely mistake: {extra}" if extra else ""),
        ) from exc
    for name, before, after in zip(
        list(names) + list(kwargs), list(pristine[0]) + list(pristine[1].values()),
        list(args) + list(kwargs.values()), strict=True,
    ):
        if not _equal(before, after):
            raise _fail(
                ex,
                f"your function changed its argument `{name}` in place. Work on a new array "
                "(e.g. `x = x - m` rather than `x -= m`), so the caller's data stays as it was",
            )
    return result


def _describe(a) -> str:
    if isinstance(a, np.ndarray):
        return f"array of shape {_shape(a.shape)} dtype {a.dtype}"
    if isinstance(a, MultiHeadAttention):
        return repr(a)
    if isinstance(a, list) and a and isinstance(a[0], list):
        return f"list of lists of shape ({len(a)}, {len(a[0])})"
    return repr(a)


def _array(ex, got, what: str, shape, letters: str, kind: str):
    """Turn what the learner returned into an array of the expected shape and kind, or fail."""
    if got is None:
        raise _fail(ex, f"your function returned None instead of {what}: did you forget `return`?")
    try:
        arr = np.asarray(got)
    except Exception:
        arr = np.asarray(got, dtype=object)
    if arr.dtype == object:
        raise _fail(ex, f"{what}: not a numeric array (got {type(got).__name__}); "
                        f"expected shape {letters} = {_shape(shape)}")
    if arr.shape != tuple(shape):
        return arr  # the caller reports shapes, after trying the known wrong variants
    if kind == "b" and arr.dtype.kind != "b":
        raise _fail(
            ex,
            f"{what}: dtype {arr.dtype}; expected bool (True = may attend). Build it with a "
            "comparison such as `s <= t`, or `.astype(bool)`",
        )
    if kind == "f" and arr.dtype.kind != "f":
        raise _fail(ex, f"{what}: dtype {arr.dtype}; expected a float array")
    if kind == "i" and arr.dtype.kind not in "iu":
        raise _fail(ex, f"{what}: dtype {arr.dtype}; expected integers (indices)")
    return arr


def _close(a, b) -> bool:
    return a.shape == b.shape and bool(
        np.allclose(a.astype(float), b.astype(float), rtol=RTOL, atol=ATOL, equal_nan=True)
    )


def _compare(ex, got, want, what: str, letters: str, variants=(), shape_hints=None,
             props=(), nan_message=None):
    """Fail unless ``got`` equals ``want``; name the mistake when a known variant matches.

    ``variants`` are ``(message, make)`` pairs: ``make()`` computes a known wrong answer on the
    same inputs; if the learner's answer equals it, ``message`` names the mistake.
    ``shape_hints`` maps a wrong shape to a message. ``props`` are callables that raise
    :class:`CheckFailed` when a property (rows sum to 1, ...) is violated.
    """
    want = np.asarray(want)
    arr = _array(ex, got, what, want.shape, letters, want.dtype.kind)
    if arr.shape == want.shape and _close(arr, want):
        return arr
    for message, make in variants:
        wrong = _quiet(make)
        if wrong is None:
            continue
        wrong = np.asarray(wrong)
        if wrong.shape == arr.shape and not _close(wrong, want) and _close(arr, wrong):
            raise _fail(ex, f"{what}: not what the reference gives. Likely mistake: {message}")
    if arr.shape != want.shape:
        hint = (shape_hints or {}).get(tuple(arr.shape))
        raise _fail(
            ex,
            f"{what}: shape {_shape(arr.shape)}; expected {letters} = {_shape(want.shape)}"
            + (f". Likely mistake: {hint}" if hint else ""),
        )
    if arr.dtype.kind == "f" and not np.isfinite(arr).all() and np.isfinite(want).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise _fail(
            ex,
            f"{what}: {_fmt(arr[tuple(bad)])} at index {_idx(bad)}"
            + f". Likely mistake: {nan_message or _NAN_GENERIC}",
        )
    for prop in props:
        prop(arr)
    diff = np.abs(arr.astype(float) - want.astype(float))
    diff = np.where(np.isnan(diff), np.inf, diff)
    where = np.unravel_index(int(np.argmax(diff)), diff.shape)
    raise _fail(
        ex,
        f"{what}: at index {_idx(where)} you have {_fmt(arr[where])}, the reference has "
        f"{_fmt(want[where])}",
    )


def _rows_sum_to_one(ex, what: str, fully_masked=None):
    """A property check: every row (last axis) sums to 1, except fully masked rows (sum 0)."""

    def prop(arr):
        sums = arr.sum(axis=-1)
        target = np.ones_like(sums)
        if fully_masked is not None:
            target = np.where(fully_masked, 0.0, 1.0)
        bad = np.argwhere(~np.isclose(sums, target, rtol=1e-6, atol=1e-9))
        if len(bad):
            i = tuple(bad[0])
            raise _fail(
                ex,
                f"row {_idx(i)} of {what} sums to {_fmt(sums[i])}, not {_fmt(int(target[i]))}: "
                "did you normalise over the right axis (the last one, keys)?",
            )
        if (arr < 0).any():
            i = tuple(np.argwhere(arr < 0)[0])
            raise _fail(ex, f"{what}: a negative entry {_fmt(arr[i])} at {_idx(i)}; "
                            "softmax weights are never negative")

    return prop


def _masked_are_zero(ex, what: str, mask):
    def prop(arr):
        leak = np.argwhere(~np.broadcast_to(mask, arr.shape) & (arr != 0))
        if len(leak):
            i = tuple(leak[0])
            raise _fail(ex, f"{what}: {_fmt(arr[i])} at {_idx(i)}, where the mask is False; "
                            "masked entries must be exactly 0 (set their scores to -inf "
                            "before the softmax)")

    return prop


def _pair(ex, got, names=("out", "weights")):
    if not isinstance(got, tuple) or len(got) != 2:
        kind = f"a tuple of {len(got)}" if isinstance(got, tuple) else type(got).__name__
        raise _fail(ex, f"your function returned {kind}; expected a tuple ({', '.join(names)})")
    return got


def _swapped_pair(ex, got, out_shape, weights_shape):
    a, b = (np.shape(x) for x in got)
    if a == tuple(weights_shape) and b == tuple(out_shape) and a != b:
        raise _fail(ex, "you returned (weights, out); return (out, weights) in that order")


# ------------------------------------------------------- wrong versions the checks recognise


def _softmax_plain(x, axis=-1):
    """Softmax without max subtraction: overflows (inf/inf = NaN) once scores pass ~709."""
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _softmax_global_max(x):
    e = np.exp(x - x.max())
    return e / e.sum(axis=-1, keepdims=True)


def _attention_variant(q, k, v, mask=None, scale="sqrt", axis=-1, where="before",
                       fill=-np.inf, stable=True):
    """One attention function with a switch for each classic mistake."""
    d_k = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2)
    scores = {"sqrt": scores / np.sqrt(d_k), "none": scores, "d_k": scores / d_k,
              "times": scores * np.sqrt(d_k)}[scale]
    if mask is not None and where == "before":
        if fill == -np.inf and axis == -1 and stable:
            weights = softmax(scores, mask=np.broadcast_to(mask, scores.shape))
        else:
            s = np.where(mask, scores, fill)
            weights = (softmax(s, axis=axis) if stable else _softmax_plain(s, axis=axis))
    else:
        weights = softmax(scores, axis=axis) if stable else _softmax_plain(scores, axis=axis)
        if mask is not None and where == "after":
            weights = weights * mask
    return weights @ v, weights


def _attention_hint(exc):
    text = str(exc)
    if "matmul" in text or "mismatch" in text or "shapes" in text or "broadcast" in text:
        return ("a shape mismatch in a matmul: for batched arrays, k.T reverses ALL axes; swap "
                "only the last two with np.swapaxes(k, -1, -2)")
    return None


def _keepdims_hint(exc):
    if "broadcast" in str(exc):
        return ("x.max(axis=-1) and x.sum(axis=-1) drop the axis; pass keepdims=True so the "
                "result broadcasts back against x")
    return None


# ================================================================ lesson 01: matmul


def check_matmul_loops(fn) -> None:
    """Exercise 01.1: ``matmul(a, b)`` of lists of lists with three Python loops."""
    ex = "01.1"
    rng = np.random.default_rng(101)
    for m, n, p in ((3, 5, 4), (4, 1, 3), (1, 2, 1)):
        a = rng.integers(-4, 5, size=(m, n)).tolist()
        b = rng.integers(-4, 5, size=(n, p)).tolist()
        want = np.asarray(naive_matmul(a, b), dtype=float)
        got = _call(ex, fn, (a, b), ("a", "b"))
        try:
            got = None if got is None else np.asarray(got, dtype=float)
        except (TypeError, ValueError):
            raise _fail(ex, f"you returned {type(got).__name__} that is not a rectangular list "
                            "of lists of numbers") from None
        last = np.asarray(a)[:, -1:] * np.asarray(b)[-1:, :]
        _compare(
            ex, got, want,
            f"your product of a {_shape((m, n))} and a {_shape((n, p))} list", "(m, p)",
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
        raise _fail(ex, f"multiplying a (3, 5) by a (3, 5) raised {type(exc).__name__} ({exc}); "
                        "expected ValueError: check that len(a[0]) == len(b) before the "
                        "loops") from exc
    else:
        raise _fail(ex, f"multiplying a (3, 5) by a (3, 5) returned {_describe(result)}; "
                        "the inner dimensions 5 and 3 differ, so raise ValueError")
    _passed(ex, "(3, 5) @ (5, 4), (4, 1) @ (1, 3) and (1, 2) @ (2, 1) match "
                "mha_course.naive.matmul; mismatched inner dimensions raise ValueError")


def check_most_similar(fn) -> None:
    """Exercise 01.2: ``most_similar(queries, keys)``: index of the key with the largest dot."""
    ex = "01.2"
    rng = np.random.default_rng(102)
    queries = rng.normal(size=(3, 4))
    keys = rng.normal(size=(5, 4)) * np.array([[0.4], [1.0], [2.5], [0.7], [1.6]])
    scores = queries @ keys.T  # (T, S)
    want = np.argmax(scores, axis=1)
    got = _call(ex, fn, (queries, keys), ("queries", "keys"))
    if got is not None and np.asarray(got).dtype.kind == "f":
        if np.asarray(got).shape == (3,) and np.allclose(got, scores.max(axis=1)):
            raise _fail(ex, "you returned the largest scores, not their positions: use "
                            "np.argmax instead of np.max")
    dist = np.linalg.norm(queries[:, None, :] - keys[None, :, :], axis=-1)
    _compare(
        ex, got, want, "your indices", "(T,)",
        variants=[
            ("you picked the nearest key by distance; the dot product also grows with a key's "
             "length, so the most similar key by dot product can be a far, long one",
             lambda: np.argmin(dist, axis=1)),
            ("you took the argmin: the most similar key has the LARGEST dot product",
             lambda: np.argmin(scores, axis=1)),
        ],
        shape_hints={(5,): "one index per key: take the argmax over the keys, axis=1 of the "
                           "(T, S) scores queries @ keys.T"},
    )
    _passed(ex, "the indices for 3 queries and 5 keys of different lengths match "
                "np.argmax(queries @ keys.T, axis=1)")


def check_batched_scores(fn) -> None:
    """Exercise 01.3: ``batched_scores(Q, K)``: Q Kᵀ for every batch and head, (B, h, T, S)."""
    ex = "01.3"
    rng = np.random.default_rng(103)
    B, h, T, S, d = 2, 3, 4, 5, 6
    Q = rng.normal(size=(B, h, T, d))
    K = rng.normal(size=(B, h, S, d))
    want = Q @ np.swapaxes(K, -1, -2)
    got = _call(ex, fn, (Q, K), ("Q", "K"), hint=_attention_hint)
    _compare(
        ex, got, want, "your scores", "(B, h, T, S)",
        variants=[
            ("you divided by √d: this exercise wants the raw dot products (the scaling comes in "
             "lesson 03)", lambda: want / np.sqrt(d)),
        ],
        shape_hints={
            (B, T, S): "you summed over the head axis: keep h in the output, e.g. "
                       "np.einsum('bhtd,bhsd->bhts', Q, K)",
            (B, h, S, T): "you computed K Qᵀ, (S, T): the queries index the rows, Q @ Kᵀ",
        },
    )
    _passed(ex, "(2, 3, 4, 6) @ (2, 3, 5, 6)ᵀ gives (2, 3, 4, 5) and matches Q @ "
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
        got = _call(ex, fn, (list(shapes),), ("shapes",))
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral,
                                                                      np.integer)):
            raise _fail(ex, f"for {shapes} you returned {got!r} ({type(got).__name__}); "
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
        raise _fail(ex, f"for {shapes} you returned {got}, expected {want}"
                        + (f". Likely mistake: {why}" if why else ""))
    try:
        result = fn([(2, 3), (4, 5)])
    except NotImplementedError:
        raise
    except ValueError:
        pass
    except Exception as exc:
        raise _fail(ex, f"for [(2, 3), (4, 5)] your function raised {type(exc).__name__}; "
                        "expected ValueError (the inner dimensions 3 and 4 differ)") from exc
    else:
        raise _fail(ex, f"for [(2, 3), (4, 5)] you returned {result!r}; the inner dimensions "
                        "3 and 4 differ, so raise ValueError")
    _passed(ex, "chains of 2, 3 and 4 matrices give 2·m·n·p summed over the steps; a "
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
        got = _call(ex, fn, (a, b, c), ("a", "b", "c"))
        if got not in ("(AB)C", "A(BC)"):
            raise _fail(ex, f"you returned {got!r}; expected one of the strings '(AB)C' "
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
        raise _fail(ex, f"for A {a}, B {b}, C {c}: (AB)C costs {left} FLOPs and A(BC) costs "
                        f"{right}, so the answer is {want!r}; you returned {got!r}.{why}")
    _passed(ex, "four chains, including (Q Kᵀ) V against Q (Kᵀ V), choose the cheaper order")


# ================================================================ lesson 02: softmax


def check_softmax(fn) -> None:
    """Exercise 02.1: ``softmax(x)`` over the last axis, stable for large scores."""
    ex = "02.1"
    rng = np.random.default_rng(201)
    x = rng.normal(size=(2, 3, 5)) * 2
    probes = [
        ("on scores of shape (2, 3, 5)", x),
        ("on a 1-D array of 5 scores", rng.normal(size=5)),
        ("on scores near 800", rng.normal(size=(2, 3, 5)) * 2 + 800),
        ("on rows of very different size (offsets from -700 to 900)",
         rng.normal(size=(2, 3, 5)) + np.array([[0.0, 900.0, -40.0], [300.0, -700.0, 5.0]])[
             ..., None]),
    ]
    for label, scores in probes:
        want = softmax(scores)
        got = _call(ex, fn, (scores,), ("x",), hint=_keepdims_hint)
        _compare(
            ex, got, want, f"your softmax {label}", "x.shape",
            variants=[
                ("softmax without max subtraction: exp of a large score overflows to inf, and "
                 "inf/inf = NaN. Subtract each row's max first (softmax is shift-invariant)",
                 lambda s=scores: _softmax_plain(s)),
                ("softmax over the wrong axis: normalise over the last axis (axis=-1), so that "
                 "each row sums to 1",
                 lambda s=scores: softmax(s, axis=-2) if s.ndim > 1 else None),
                ("you subtracted the max of the whole array instead of each row's max: rows far "
                 "below it underflow to 0/0 = NaN. Use x.max(axis=-1, keepdims=True)",
                 lambda s=scores: _softmax_global_max(s)),
                ("you divided by the sum of the whole array; sum over axis=-1 with "
                 "keepdims=True", lambda s=scores: np.exp(s - s.max()) / np.exp(s - s.max()).sum()),
            ],
            nan_message=("softmax without max subtraction: exp of a large score overflows to "
                         "inf, and inf/inf = NaN. Subtract each row's max first")
            if scores.max() > 700 else None,
            props=[_rows_sum_to_one(ex, "your softmax")],
        )
    _passed(ex, "matches mha_course.softmax on shapes (5,) and (2, 3, 5); rows sum to 1; no "
                "overflow near 800; rows of very different size; input left unchanged")


def check_softmax_temperature(fn) -> None:
    """Exercise 02.2: ``softmax_temperature(x, tau)`` = softmax(x / tau) over the last axis."""
    ex = "02.2"
    rng = np.random.default_rng(202)
    x = rng.normal(size=(2, 3, 5))
    for tau in (0.5, 1.0, 3.0, 0.001):
        want = softmax(x / tau)
        got = _call(ex, fn, (x, tau), ("x", "tau"), hint=_keepdims_hint)
        _compare(
            ex, got, want, f"your result for tau={tau}", "x.shape",
            variants=[
                ("you multiplied the scores by the temperature; divide: softmax(x / tau)",
                 lambda t=tau: softmax(x * t)),
                ("the temperature had no effect: compute softmax(x / tau)", lambda: softmax(x)),
                ("softmax without max subtraction: at tau=0.001 the scores x / tau reach the "
                 "thousands and exp overflows (inf/inf = NaN). Subtract each row's max first",
                 lambda t=tau: _softmax_plain(x / t)),
            ],
            nan_message=("at a small tau the scores x / tau are huge and exp overflows: "
                         "subtract each row's max before exp") if tau < 0.01 else None,
            props=[_rows_sum_to_one(ex, f"your result for tau={tau}")],
        )
    _passed(ex, "matches mha_course.softmax(x / tau) for tau = 0.5, 1, 3 and 0.001 "
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
              ("on scores near 800", x + 800)]
    for label, scores in probes:
        want = log_softmax(scores)
        got = _call(ex, fn, (scores,), ("x",), hint=_keepdims_hint)
        _compare(
            ex, got, want, f"your log-softmax {label}", "x.shape",
            variants=[
                ("you computed log(softmax(x)): the softmax underflows to 0 for scores far "
                 "below the max, and log(0) = -inf. Compute x - logsumexp(x) instead",
                 lambda s=scores: np.log(softmax(s))),
                ("log-sum-exp without max subtraction: exp(800) overflows to inf. Use "
                 "m + log(sum(exp(x - m))) with m the row max",
                 lambda s=scores: s - np.log(np.exp(s).sum(axis=-1, keepdims=True))),
                ("log-softmax over the wrong axis: reduce over the last axis (axis=-1)",
                 lambda s=scores: log_softmax(s, axis=-2)),
            ],
            nan_message=("a non-finite value: compute x - (m + log(sum(exp(x - m)))) with m "
                         "the row max, never log(softmax(x)) or exp of a raw score"),
        )
    _passed(ex, "matches mha_course.log_softmax on ordinary scores, on scores 800 below the "
                "max (no -inf) and on scores near 800 (no overflow)")


def _random_mask(rng, shape, full_rows=()):
    mask = rng.random(shape) < 0.6
    mask[..., 0] |= ~mask.any(axis=-1)  # every row keeps at least one entry...
    for row in full_rows:
        mask[row] = False  # ...except the rows chosen to be fully masked
    return mask


def check_masked_softmax(fn) -> None:
    """Exercise 02.4: ``masked_softmax(x, mask)``: zeros where masked, zeros on a full-mask row."""
    ex = "02.4"
    rng = np.random.default_rng(204)
    x = rng.normal(size=(2, 3, 5)) * 2
    for full in ((), ((1, 0), (0, 2))):
        mask = _random_mask(rng, x.shape, full)
        want = softmax(x, mask=mask)
        full_rows = ~mask.any(axis=-1)
        got = _call(ex, fn, (x, mask), ("x", "mask"), hint=_keepdims_hint)
        label = "with a fully masked row" if full else "with every row partly kept"
        rows = " and ".join(_idx(r) for r in full)
        _compare(
            ex, got, want, f"your masked softmax {label}", "x.shape",
            variants=[
                ("the mask was applied after the softmax: the kept weights no longer sum to 1. "
                 "Set masked scores to -inf BEFORE the softmax",
                 lambda m=mask: softmax(x) * m),
                ("the mask is inverted: True means keep (may attend), False means masked out",
                 lambda m=mask: softmax(x, mask=~m)),
                ("the mask had no effect: masked entries must come out exactly 0",
                 lambda: softmax(x)),
                (f"the fully masked rows {rows} come out uniform (1/5 each): that is what "
                 "filling with a large negative number such as -1e9 does. A row with nothing "
                 "to attend to must be all zeros", lambda m=mask: softmax(np.where(m, x, -1e9))),
            ],
            nan_message=(f"rows {rows} are fully masked: their max is -inf and -inf - (-inf) = "
                         "NaN. Shift such a row by 0 instead of its max (np.where(np.isfinite(m), "
                         "m, 0)) and divide by 1 where the sum is 0, so the row is all zeros")
            if full else None,
            props=[_masked_are_zero(ex, "your masked softmax", mask),
                   _rows_sum_to_one(ex, "your masked softmax", full_rows)],
        )
    _passed(ex, "matches mha_course.softmax(x, mask=mask); masked entries are 0; a fully "
                "masked row is all zeros, not NaN")


# ================================================================ lesson 03: attention


def check_attention_scores(fn) -> None:
    """Exercise 03.1: ``attention_scores(q, k)`` = q kᵀ / √d_k, (..., T, S)."""
    ex = "03.1"
    rng = np.random.default_rng(301)
    probes = [(rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), "(B, T, S)"),
              (rng.normal(size=(3, 9)), rng.normal(size=(5, 9)), "(T, S)")]
    for q, k, letters in probes:
        raw = q @ np.swapaxes(k, -1, -2)
        d_k = q.shape[-1]
        want = raw / math.sqrt(d_k)
        got = _call(ex, fn, (q, k), ("q", "k"), hint=_attention_hint)
        _compare(
            ex, got, want, f"your scores for q {_shape(q.shape)}, k {_shape(k.shape)}",
            letters,
            variants=[
                ("scores not scaled by √d_k: divide q·kᵀ by np.sqrt(d_k), with d_k = "
                 "q.shape[-1]", lambda raw=raw: raw),
                ("you divided by d_k instead of √d_k", lambda raw=raw, d=d_k: raw / d),
                ("you multiplied by √d_k; divide by it", lambda raw=raw, d=d_k: raw * np.sqrt(d)),
            ],
            shape_hints={k.shape[:-1] + (q.shape[-2],):
                         "you computed k·qᵀ, (S, T); the queries index the rows: q @ kᵀ"},
        )
    _passed(ex, "q kᵀ / √d_k matches for q (2, 3, 4), k (2, 5, 4) and for q (3, 9), k (5, 9)")


def _attention_probes(rng, B=2, T=3, S=5, d_k=4, d_v=6):
    q = rng.normal(size=(B, T, d_k))
    k = rng.normal(size=(B, S, d_k))
    v = rng.normal(size=(B, S, d_v))
    return q, k, v


def _check_pair(ex, got, want_out, want_w, label, variants, mask=None, full_rows=None,
                nan_message=None):
    """Compare (out, weights): weights first (they show the mistake), then out."""
    _pair(ex, got)
    _swapped_pair(ex, got, want_out.shape, want_w.shape)
    props = [_rows_sum_to_one(ex, f"your weights {label}", full_rows)]
    if mask is not None:
        props.insert(0, _masked_are_zero(ex, f"your weights {label}", mask))
    _compare(ex, got[1], want_w, f"your weights {label}", "(..., T, S)",
             variants=[(m, (lambda mk=mk: mk()[1])) for m, mk in variants],
             props=props, nan_message=nan_message)
    _compare(ex, got[0], want_out, f"your output {label}", "(..., T, d_v)",
             variants=[(m, (lambda mk=mk: mk()[0])) for m, mk in variants])


_OVERFLOW = ("softmax without max subtraction: at large scores exp overflows to inf and "
             "inf/inf = NaN. Use mha_course.softmax, or subtract each row's max first")
_FULL_NAN = ("a fully masked query row gives NaN: its max is -inf and -inf - (-inf) = NaN. "
             "Use mha_course.softmax(scores, mask=mask), which gives zeros there")


def check_attention(fn) -> None:
    """Exercise 03.2: ``attention(q, k, v, mask=None)`` -> (out, weights)."""
    ex = "03.2"
    rng = np.random.default_rng(302)
    q, k, v = _attention_probes(rng)
    mask = _random_mask(rng, (2, 3, 5))
    full = _random_mask(rng, (2, 3, 5), full_rows=((0, 1),))
    probes = [("without a mask", (q, k, v), None),
              ("with a mask", (q, k, v), mask),
              ("with a fully masked query (row (0, 1))", (q, k, v), full),
              ("at large scores (q times 2000)", (q * 2000, k, v), None)]
    for label, (qq, kk, vv), m in probes:
        want_out, want_w = scaled_dot_product_attention(qq, kk, vv, mask=m)
        kwargs = {} if m is None else {"mask": m}
        got = _call(ex, fn, (qq, kk, vv), ("q", "k", "v"), kwargs, hint=_attention_hint)

        def var(m=m, qq=qq, **kw):
            return lambda: _attention_variant(qq, k, v, m, **kw)

        variants = [
            ("scores not scaled by √d_k: divide q·kᵀ by np.sqrt(d_k)", var(scale="none")),
            ("you divided the scores by d_k instead of √d_k", var(scale="d_k")),
            ("softmax over the wrong axis: normalise over the keys (the last axis), so each "
             "query's weights sum to 1", var(axis=-2)),
            (_OVERFLOW, var(stable=False)),
        ]
        if m is not None:
            variants += [
                ("mask applied after the softmax: the kept weights no longer sum to 1. Set the "
                 "masked scores to -inf BEFORE the softmax", var(where="after")),
                ("the mask is inverted: True means the query MAY attend to that key",
                 var(m=~m)),
                ("the mask was ignored", var(m=None)),
                ("the fully masked query comes out uniform over all keys: filling with -1e9 "
                 "does that. A query with no allowed key must get weights 0 and output 0",
                 var(fill=-1e9)),
            ]
        _check_pair(ex, got, want_out, want_w, label, variants, mask=m,
                    full_rows=None if m is None else ~m.any(axis=-1),
                    nan_message=_OVERFLOW if qq is not q else _FULL_NAN if m is full else None)
    _passed(ex, "out (2, 3, 6) and weights (2, 3, 5) match "
                "mha_course.scaled_dot_product_attention without a mask, with a mask, with a "
                "fully masked query (zeros) and at large scores")


def check_causal_mask(fn) -> None:
    """Exercise 03.3: ``causal_mask(T)``: bool (T, T), True where key s <= query t."""
    ex = "03.3"
    for T in (4, 1, 7):
        want = causal_mask(T)
        got = _call(ex, fn, (T,), ("T",))
        ones = np.ones((T, T), dtype=bool)

        def prop(arr, T=T):
            above = np.argwhere(np.triu(arr, k=1))
            if len(above):
                t, s = above[0]
                raise _fail(ex, f"your mask is True at (query {t}, key {s}): query {t} would "
                                f"see the future key {s}; the upper triangle must be False")
            if not np.diag(arr).all():
                t = int(np.argmin(np.diag(arr)))
                raise _fail(ex, f"your mask is False at (query {t}, key {t}): a token must be "
                                "able to attend to itself")

        _compare(
            ex, got, want, f"your mask for T={T}", "(T, T)",
            variants=[
                ("causal triangle off by one: you excluded the diagonal (np.tril(..., k=-1) or "
                 "s < t). A token may attend to itself: use s <= t",
                 lambda o=ones: np.tril(o, k=-1)),
                ("causal triangle off by one: one diagonal too many (np.tril(..., k=1) or "
                 "s <= t + 1) lets query t see key t+1, the future",
                 lambda o=ones: np.tril(o, k=1)),
                ("you built the upper triangle: True must be where key s <= query t, on and "
                 "below the diagonal (rows are queries)", lambda o=ones: np.triu(o)),
                ("the mask is inverted: True means may attend, so the past and the diagonal "
                 "are True and the future is False", lambda o=ones: np.triu(o, k=1)),
            ],
            props=[prop],
        )
    _passed(ex, "(T, T) bool masks for T = 1, 4, 7 match mha_course.causal_mask")


def check_padding_mask(fn) -> None:
    """Exercise 03.4: ``padding_mask(lengths, S)``: bool (B, 1, S), True at real positions."""
    ex = "03.4"
    for lengths, S in (([3, 5, 1, 4], 5), (np.array([2, 6]), 7)):
        want = padding_mask(lengths, S)
        L = np.asarray(lengths)[:, None, None]
        pos = np.arange(S)
        got = _call(ex, fn, (lengths, S), ("lengths", "S"))
        B = len(lengths)
        _compare(
            ex, got, want, f"your mask for lengths {list(map(int, lengths))}, S={S}",
            "(B, 1, S)",
            variants=[
                ("off by one: position lengths[b] is the first PADDING position (positions "
                 "count from 0), so keep s < lengths[b], not s <= lengths[b]",
                 lambda L=L, pos=pos: pos <= L),
                ("off by one: you dropped the last real token; keep s < lengths[b]",
                 lambda L=L, pos=pos: pos < L - 1),
                ("the mask is inverted: True marks the real tokens (may attend), False the "
                 "padding", lambda L=L, pos=pos: pos >= L),
            ],
            shape_hints={
                (B, S): "add a middle axis: return (B, 1, S) so it broadcasts against "
                        "(B, T, S) scores, e.g. mask[:, None, :]",
                (B, S, 1): "the length-1 axis goes in the middle, (B, 1, S): (B, S, 1) would "
                           "hide padded queries instead of padded keys",
            },
        )
    _passed(ex, "(B, 1, S) bool masks for lengths [3, 5, 1, 4] (S=5) and [2, 6] (S=7) match "
                "mha_course.padding_mask")


def check_masked_self_attention(fn) -> None:
    """Exercise 03.5: ``masked_self_attention(q, k, v, lengths)``: causal AND padding masks."""
    ex = "03.5"
    rng = np.random.default_rng(305)
    q, k, v = _attention_probes(rng, B=2, T=5, S=5, d_k=4, d_v=6)
    lengths = [3, 5]
    causal, pad = causal_mask(5), padding_mask(lengths, 5)
    want_out, want_w = scaled_dot_product_attention(q, k, v, mask=causal & pad)
    got = _call(ex, fn, (q, k, v, lengths), ("q", "k", "v", "lengths"), hint=_attention_hint)

    def var(m, **kw):
        return lambda: _attention_variant(q, k, v, m, **kw)

    variants = [
        ("you applied only the causal mask: sequence 0 (length 3) still attends to its "
         "padding keys 3 and 4. Combine both: causal_mask(T) & padding_mask(lengths, T)",
         var(causal)),
        ("you applied only the padding mask: queries still see future keys. Combine both "
         "with &", var(pad)),
        ("you combined the masks with | (or): a key must be allowed by BOTH masks, use &",
         var(causal | pad)),
        ("no mask had any effect", var(None)),
        ("scores not scaled by √d_k", var(causal & pad, scale="none")),
        ("mask applied after the softmax: set masked scores to -inf before it",
         var(causal & pad, where="after")),
    ]
    _check_pair(ex, got, want_out, want_w, "for lengths [3, 5], T=S=5", variants,
                mask=causal & pad)
    _passed(ex, "out (2, 5, 6) and weights (2, 5, 5) match attention with causal_mask(5) & "
                "padding_mask([3, 5], 5): no future keys, no padding keys")


# ================================================================ lesson 04: multi-head


def check_split_heads(fn) -> None:
    """Exercise 04.1: ``split_heads(x, h)``: (B, T, h*d) -> (B, h, T, d)."""
    ex = "04.1"
    rng = np.random.default_rng(401)
    for B, T, h, d in ((2, 4, 3, 5), (1, 6, 2, 4)):
        x = rng.normal(size=(B, T, h * d))
        want = split_heads(x, h)
        got = _call(ex, fn, (x, h), ("x", "h"))
        _compare(
            ex, got, want, f"your heads for x {_shape(x.shape)}, h={h}", "(B, h, T, d)",
            variants=[
                ("reshape without the transpose: x.reshape(B, h, T, d) cuts the memory into "
                 "blocks that mix positions and heads. Reshape to (B, T, h, d), then swap axes "
                 "1 and 2", lambda x=x, s=(B, h, T, d): x.reshape(s)),
                ("you split the last axis as (d, h): head i must be the contiguous columns "
                 "i*d:(i+1)*d, so reshape to (B, T, h, d)",
                 lambda x=x, s=(B, T, d, h): x.reshape(s).transpose(0, 3, 1, 2)),
            ],
            shape_hints={(B, T, h, d): "you reshaped but did not move the head axis: swap "
                                       "axes 1 and 2 to get (B, h, T, d)"},
        )
    _passed(ex, "(2, 4, 15) with h=3 and (1, 6, 8) with h=2 match mha_course.split_heads")


def check_merge_heads(fn) -> None:
    """Exercise 04.2: ``merge_heads(x)``: (B, h, T, d) -> (B, T, h*d)."""
    ex = "04.2"
    rng = np.random.default_rng(402)
    for B, h, T, d in ((2, 3, 4, 5), (1, 2, 6, 4)):
        x = rng.normal(size=(B, h, T, d))
        want = merge_heads(x)
        got = _call(ex, fn, (x,), ("x",))
        _compare(
            ex, got, want, f"your merged heads for x {_shape(x.shape)}", "(B, T, h*d)",
            variants=[
                ("reshape without the transpose: first swap axes 1 and 2 to (B, T, h, d), then "
                 "reshape to (B, T, h*d)", lambda x=x, s=(B, T, h * d): x.reshape(s)),
                ("you interleaved the heads' columns: move the axes to (B, T, h, d), not "
                 "(B, T, d, h), before the reshape",
                 lambda x=x, s=(B, T, h * d): x.transpose(0, 2, 3, 1).reshape(s)),
            ],
        )
    _passed(ex, "(2, 3, 4, 5) and (1, 2, 6, 4) match mha_course.merge_heads")


def check_fuse_heads(fn) -> None:
    """Exercise 04.3: ``fuse_heads(W)``: per-head (h, d_model, d_k) -> fused (d_model, h*d_k)."""
    ex = "04.3"
    rng = np.random.default_rng(403)
    h, d_model, d_k = 3, 10, 6
    W = rng.normal(size=(h, d_model, d_k))
    want = MultiHeadAttention.from_per_head(W, W, W, np.zeros((h * d_k, d_model))).W_q
    got = _call(ex, fn, (W,), ("W",))
    _compare(
        ex, got, want, "your fused matrix", "(d_model, h*d_k)",
        variants=[
            ("reshape without the transpose: W.reshape(d_model, h*d_k) reads head 0's rows "
             "across the columns. Move the head axis next to d_k first: "
             "W.transpose(1, 0, 2).reshape(d_model, h*d_k)", lambda: W.reshape(d_model, -1)),
            ("you interleaved the heads' columns: head i must occupy columns i*d_k:(i+1)*d_k; "
             "use W.transpose(1, 0, 2), not (1, 2, 0)",
             lambda: W.transpose(1, 2, 0).reshape(d_model, -1)),
        ],
        shape_hints={(h * d_model, d_k): "you stacked the heads' rows (axis 0); lay them side "
                                         "by side (axis=1): np.concatenate(list(W), axis=1)"},
    )
    _passed(ex, "(3, 10, 6) -> (10, 18) matches MultiHeadAttention.from_per_head(...).W_q")


def check_param_count(fn) -> None:
    """Exercise 04.4: ``mha_param_count(d_model, h, d_k, d_v, bias)`` -> int."""
    ex = "04.4"
    configs = [(512, 8, 64, 64, False), (512, 8, 64, 64, True), (10, 3, 6, 7, False),
               (10, 3, 6, 7, True), (12, 4, 2, 5, True)]
    for d_model, h, d_k, d_v, bias in configs:
        want = param_count(d_model, h, d_k, d_v, bias=bias)
        got = _call(ex, fn, (d_model, h, d_k, d_v, bias), ("d_model", "h", "d_k", "d_v", "bias"))
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral,
                                                                      np.integer)):
            raise _fail(ex, f"you returned {got!r} ({type(got).__name__}); expected an int")
        if got == want:
            continue
        b = 2 * h * d_k + h * d_v + d_model if bias else 0
        guesses = {
            want - h * d_v * d_model: "you left out the output projection W_o, (h·d_v, d_model)",
            want - b: "you left out the biases (b_q, b_k: h·d_k each; b_v: h·d_v; b_o: d_model)",
            want - b + 4 * d_model: "biases: b_q and b_k have h·d_k entries, b_v has h·d_v and "
                                    "b_o has d_model; 4·d_model holds only when h·d_k = h·d_v = "
                                    "d_model",
            4 * d_model**2 + (4 * d_model if bias else 0):
                "you used 4·d_model², which holds only when h·d_k = h·d_v = d_model; count "
                "each matrix from d_k and d_v",
            want - b + (2 * h * d_k + h * d_v + h * d_v if bias else 0):
                "b_o has d_model entries (it is added after W_o), not h·d_v",
        }
        guesses.pop(want, None)
        why = guesses.get(int(got))
        raise _fail(ex, f"for d_model={d_model}, h={h}, d_k={d_k}, d_v={d_v}, bias={bias} you "
                        f"returned {int(got)}, expected {want}"
                        + (f". Likely mistake: {why}" if why else ""))
    _passed(ex, "five layer sizes, with and without biases, match mha_course.param_count")


def _mha_variant(x, W_q, W_k, W_v, W_o, mask=None, scale="sqrt", axis=-1, order=1,
                 use_mask=True):
    heads, weights = [], []
    d_model = x.shape[-1]
    for i in range(W_q.shape[0])[::order]:
        q, k, v = x @ W_q[i], x @ W_k[i], x @ W_v[i]
        if scale == "d_model":
            q = q * np.sqrt(q.shape[-1] / d_model)
        out, w = _attention_variant(q, k, v, mask if use_mask else None,
                                    scale="none" if scale == "none" else "sqrt", axis=axis)
        heads.append(out)
        weights.append(w)
    return np.concatenate(heads, axis=-1) @ W_o, np.stack(weights[::order], axis=-3)


def check_mha_forward(fn) -> None:
    """Exercise 04.5: ``mha_forward(x, W_q, W_k, W_v, W_o, mask=None)`` -> (out, weights)."""
    ex = "04.5"
    rng = np.random.default_rng(405)
    B, T, d_model, h, d_k, d_v = 2, 4, 10, 3, 6, 7
    x = rng.normal(size=(B, T, d_model))
    W_q, W_k = rng.normal(size=(2, h, d_model, d_k)) / np.sqrt(d_model)
    W_v = rng.normal(size=(h, d_model, d_v)) / np.sqrt(d_model)
    W_o = rng.normal(size=(h * d_v, d_model)) / np.sqrt(h * d_v)
    layer = MultiHeadAttention.from_per_head(W_q, W_k, W_v, W_o)
    for label, mask in (("without a mask", None), ("with a causal mask", causal_mask(T))):
        want_out, want_w = layer(x, mask=mask)
        kwargs = {} if mask is None else {"mask": mask}
        got = _call(ex, fn, (x, W_q, W_k, W_v, W_o), ("x", "W_q", "W_k", "W_v", "W_o"), kwargs,
                    hint=_attention_hint)
        _pair(ex, got)
        _swapped_pair(ex, got, want_out.shape, want_w.shape)
        if np.shape(got[0]) == (B, T, h * d_v):
            raise _fail(ex, f"your output has shape {_shape((B, T, h * d_v))}, the concatenated "
                            "heads: you forgot the output projection, concat(heads) @ W_o")

        def var(mask=mask, **kw):
            return lambda: _mha_variant(x, W_q, W_k, W_v, W_o, mask, **kw)

        variants = [
            ("scores not scaled by √d_k: each head divides q·kᵀ by √d_k", var(scale="none")),
            ("you scaled by √d_model; each head scales by its own √d_k", var(scale="d_model")),
            ("softmax over the wrong axis: normalise over the keys (the last axis)", var(axis=-2)),
            ("the heads are concatenated in reverse order: head i goes in columns "
             "i*d_v:(i+1)*d_v, which W_o's rows expect", var(order=-1)),
        ]
        if mask is not None:
            variants.append(("the mask was ignored: pass it to every head", var(use_mask=False)))
        _compare(ex, got[1], want_w, f"your weights {label}", "(B, h, T, S)",
                 variants=[(m, (lambda mk=mk: mk()[1])) for m, mk in variants],
                 shape_hints={(B, T, h, T): "stack the heads' weights on axis 1: (B, h, T, S)"},
                 props=[_rows_sum_to_one(ex, f"your weights {label}")])
        _compare(ex, got[0], want_out, f"your output {label}", "(B, T, d_model)",
                 variants=[(m, (lambda mk=mk: mk()[0])) for m, mk in variants])
    _passed(ex, "out (2, 4, 10) and weights (2, 3, 4, 4) match "
                "MultiHeadAttention.from_per_head(...) with h=3, d_k=6, d_v=7, with and "
                "without a causal mask")


def check_cross_attention(fn) -> None:
    """Exercise 04.6: ``cross_attention(layer, x, context)`` -> (out, weights)."""
    ex = "04.6"
    rng = np.random.default_rng(406)
    B, T, S, d_model = 2, 4, 5, 10
    layer = MultiHeadAttention(d_model, 3, d_k=6, d_v=7, rng=rng)
    x = rng.normal(size=(B, T, d_model))
    context = rng.normal(size=(B, S, d_model))
    want_out, want_w = layer(x, context=context)
    got = _call(ex, fn, (layer, x, context), ("layer", "x", "context"), hint=_attention_hint)
    _pair(ex, got)
    _swapped_pair(ex, got, want_out.shape, want_w.shape)
    shapes = {
        (B, 3, T, T): "your weights are (B, h, T, T): keys and values must come from context "
                      "(k = context @ W_k, v = context @ W_v), queries from x",
        (B, 3, S, S): "your weights are (B, h, S, S): the queries must come from x "
                      "(q = x @ W_q); only keys and values come from context",
        (B, 3, S, T): "you swapped the roles: queries come from x, keys and values from context",
    }
    if np.shape(got[1]) in shapes:
        raise _fail(ex, f"Likely mistake: {shapes[np.shape(got[1])]}")

    def unscaled():
        q = split_heads(x @ layer.W_q, layer.h)
        k = split_heads(context @ layer.W_k, layer.h)
        v = split_heads(context @ layer.W_v, layer.h)
        out, w = _attention_variant(q, k, v, scale="none")
        return merge_heads(out) @ layer.W_o, w

    variants = [("scores not scaled by √d_k", unscaled)]
    _compare(ex, got[1], want_w, "your weights", "(B, h, T, S)",
             variants=[(m, (lambda mk=mk: mk()[1])) for m, mk in variants],
             props=[_rows_sum_to_one(ex, "your weights")])
    _compare(ex, got[0], want_out, "your output", "(B, T, d_model)",
             variants=[(m, (lambda mk=mk: mk()[0])) for m, mk in variants],
             shape_hints={(B, T, 3 * 7): "you forgot the output projection: merged heads @ "
                                         "layer.W_o"})
    _passed(ex, "out (2, 4, 10) and weights (2, 3, 4, 5) match layer(x, context=context) "
                "for T=4 queries and S=5 context positions")
