"""The shared machinery of the exercise checks: call the learner's function, compare, explain.

Every ``check_*`` in ``mha_course/checks/lessonNN.py`` is built from these pieces:

- :func:`call` runs the learner's function on the check's inputs and turns what can go wrong
  (an exception, a changed argument, not a function at all, a call to what the exercise asks
  the learner to write themselves: ``forbid=``, see :mod:`mha_course.checks.forbid`) into a
  :class:`CheckFailed`;
- :func:`compare` compares the result with the package's reference, computed at check time;
  when they differ it runs the known wrong versions (``variants``, see
  :mod:`mha_course.checks.variants`) and names the mistake of the one that matches, else reports
  the shape, a NaN, the first broken property (``props``: :func:`rows_sum_to_one`,
  :func:`masked_are_zero`) or the first differing entry;
- :func:`pair`, :func:`swapped_pair` and :func:`compare_pair` do the same for ``(out, weights)``;
- :func:`passed` prints the one success line; :func:`fail` builds the failure.

Every message starts with ``Exercise NN.M: `` (the checker relies on it to show a check's own
words; a forbidden call reads ``Exercise NN.M asks you to ...``), numbers are printed with
:func:`fmt` (4 decimals) so a message is the same on every machine, and with more digits
(:func:`fmt_pair`) where 4 would make two different numbers look equal. In a notebook a failed
check shows the learner's own frames and the message, not the checker's internals
(:meth:`CheckFailed._render_traceback_`).

A new check, in outline (the lesson modules hold twenty real ones)::

    def check_scores(fn) -> None:  # Exercise 05.1: scores(q, k) = q kᵀ / √d_k, (B, T, S)
        ex = "05.1"
        q, k, _ = attention_probes(check_rng(501))
        want = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        got = call(ex, fn, (q, k), ("q", "k"), hint=attention_hint,
                   forbid={"mha_course.scaled_dot_product_attention": "scale the scores yourself"})
        compare(ex, got, want, "your scores", "(B, T, S)",
                variants=[("scores not scaled by √d_k", lambda: want * 2.0)])
        passed(ex, "q kᵀ / √d_k matches for q (2, 3, 4) and k (2, 5, 4)")
"""

from __future__ import annotations

import copy
import math
import numbers
import os
import sys
import traceback
import warnings

import numpy as np

from .. import MultiHeadAttention
from .._validate import fmt_shape  # the lessons' checks import it here
from .forbid import CallWatch, Rule, Use, find_in_source, rules_for
from .measure import PROBE, check_rng, traced  # noqa: F401  (the lessons import check_rng here)

RTOL, ATOL = 1e-6, 1e-9
NAN_GENERIC = ("NaN and inf come from 0/0, inf/inf, inf - inf or a log of 0 or less; print "
               "the intermediate arrays of your function to see where they first appear")


class CheckFailed(AssertionError):
    """Your answer to an exercise is wrong; the message says how, and the likely mistake."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error: the learner's frames and the message only.

        IPython calls this hook instead of printing the full traceback, whose frames inside
        the checker (the check, ``compare``, ...) say nothing to the learner.
        """
        return short_traceback(self)


#: Frames in these folders are the checker's or a library's, not the learner's.
_NOT_LEARNER = tuple(
    os.path.join(os.path.abspath(p), "")
    for p in {os.path.dirname(os.path.dirname(os.path.abspath(__file__))), sys.prefix,
              sys.base_prefix, sys.exec_prefix}
)


def _frame_lines(frame) -> list[str]:
    """``Cell In[7], line 4, in attention`` and ``----> 4 <the line>`` for one frame."""
    where = frame.filename
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    named = getattr(getattr(shell, "compile", None), "format_code_name", lambda name: None)
    label = named(frame.filename)
    if label:
        where = " ".join(label)
    head = f"{where}, line {frame.lineno}" + (
        f", in {frame.name}" if frame.name != "<module>" else "")
    return [head] + ([f"----> {frame.lineno} {frame.line.strip()}"] if frame.line else [])


def short_traceback(exc: BaseException) -> list[str]:
    """The learner's frames of ``exc`` (and of the error it quotes), then the message.

    A check's own frames, NumPy's and the standard library's are left out: what is kept is the
    line that called the check and at most the last three frames of the learner's code that
    raised.
    """
    def learner(tb):
        return [f for f in traceback.extract_tb(tb)
                if not os.path.abspath(f.filename).startswith(_NOT_LEARNER)]

    lines = [ln for f in learner(exc.__traceback__)[-1:] for ln in _frame_lines(f)]
    cause = exc.__cause__
    if cause is not None:
        lines += [ln for f in learner(cause.__traceback__)[-3:] for ln in _frame_lines(f)]
    return lines + [f"\x1b[0;31m{type(exc).__name__}\x1b[0m: {exc}"]


# --------------------------------------------------------------------------- shared helpers


def fail(ex: str, message: str) -> CheckFailed:
    return CheckFailed(f"Exercise {ex}: {message}")


def passed(ex: str, what: str) -> None:
    print(f"Exercise {ex} passed: {what}")


def fmt(value) -> str:
    """A number for a failure message: integers as they are, floats to 4 decimals."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (numbers.Integral, np.integer)):
        return str(int(value))
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value + 0.0:.4f}"


def fmt_pair(a, b) -> tuple[str, str]:
    """Two numbers as :func:`fmt` prints them, with more digits where 4 would look equal.

    >>> fmt_pair(0.5, 0.25)
    ('0.5000', '0.2500')
    >>> fmt_pair(0.44181, 0.44179)
    ('0.44181', '0.44179')
    """
    first, second = fmt(a), fmt(b)
    if first != second:
        return first, second
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return first, second
    for digits in range(6, 18):
        first, second = f"{fa:.{digits}g}", f"{fb:.{digits}g}"
        if first != second:
            break
    return first, second


def fmt_index(index) -> str:
    index = tuple(int(i) for i in index)
    return str(index[0]) if len(index) == 1 else str(index)


def equal(a, b) -> bool:
    """Exact equality of two arguments (arrays, lists, layers and models), NaN equal to NaN.

    A layer or a model (anything with a ``parameters()`` dict, such as lesson 09's ``GPT``) is
    equal to another of its type with equal parameters.
    """
    if isinstance(a, MultiHeadAttention) or callable(getattr(a, "parameters", None)):
        pa, pb = a.parameters(), getattr(b, "parameters", dict)()
        return type(a) is type(b) and list(pa) == list(pb) and all(
            equal(p, q) for p, q in zip(pa.values(), pb.values(), strict=True)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def quiet(make):
    """Run ``make()`` with NumPy warnings off; return None if it raises (for wrong variants)."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return make()
    except Exception:
        return None


def call(ex: str, fn, args: tuple, names: tuple, kwargs=None, hint=None, forbid=None,
         inplace: bool = True, who: str = "your function", measure: dict | None = None):
    """Call the learner's ``fn`` on copies; turn its exceptions and side effects into words.

    Parameters
    ----------
    ex : str
        The exercise id, "NN.M", that starts every message.
    fn : callable
        The learner's function.
    args : tuple
        The positional arguments; ``names`` are their parameter names, for messages.
    kwargs : dict, optional
        Keyword arguments.
    hint : callable, optional
        ``hint(exception) -> str or None``: the likely mistake behind an exception ``fn``
        raised (see :mod:`mha_course.checks.variants`).
    forbid : dict of str to str, optional
        What the exercise asks the learner to write themselves, ``{dotted name: phrase}``:
        a function (``"mha_course.softmax"``) or a whole module (``"numpy"``), and the phrase
        that completes "Exercise NN.M asks you to ...". A use of one, in the function's source
        or in a call it makes, fails with ``Exercise NN.M asks you to <phrase>; your answer
        calls <name>`` (see :mod:`mha_course.checks.forbid`).
    inplace : bool
        Whether changing an argument in place fails (a decode step must change its cache).
    who : str
        How messages name ``fn`` ("your function raised ...").
    measure : dict, optional
        Receives ``"peak"``: the most memory (bytes, tracemalloc) the call held above what was
        held when it started.

    In grading mode ``fn`` is the grader's handle on a function in the learner's kernel (it
    has ``mha_course_remote_call``): the call, the forbidden-call watch and the in-place test
    run there, and everything else here, as for a local function.

    Returns
    -------
    object
        What ``fn`` returned.

    Raises
    ------
    CheckFailed
        ``fn`` is not callable, raised an exception, changed an argument in place, or used a
        forbidden name.
    NotImplementedError
        Unchanged from ``fn``: the exercise's stub, reported as "not attempted".
    """
    kwargs = kwargs or {}
    if not callable(fn):
        raise fail(
            ex,
            f"expected your function, got {type(fn).__name__}: pass the function itself "
            "(check_x(my_function)), not the result of calling it",
        )
    forbid = forbid or {}
    remote = getattr(fn, "mha_course_remote_call", None)
    if remote is not None:  # grading mode: the learner's kernel calls it, this process judges
        outcome = remote(args, kwargs, forbid=list(forbid), inplace=inplace,
                         measure=measure is not None)
        if measure is not None:
            measure["peak"] = outcome.get("peak", 0)
        found, error = outcome.get("found"), outcome.get("error")
        if found is not None and found[0] in forbid:
            rule = Rule(found[0], forbid[found[0]])
            raise CheckFailed(Use(rule, found[1], found[2], found[3]).message(ex))
        if error is not None:
            _raised(ex, error, args, kwargs, hint, who)
        changed = [i for i in outcome.get("changed", []) if 0 <= i < len(args) + len(kwargs)]
        if changed:
            raise _changed(ex, (list(names) + list(kwargs))[changed[0]])
        return outcome.get("value")
    rules = rules_for(forbid) if forbid else []
    use = find_in_source(fn, rules)
    if use is not None:
        raise CheckFailed(use.message(ex))
    watch = CallWatch(rules)
    pristine = copy.deepcopy((args, kwargs)) if inplace else None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"), traced(measure):
            warnings.simplefilter("ignore")
            result = watch.run(fn, args, kwargs) if watch.rules else fn(*args, **kwargs)
    except Exception as exc:
        if watch.found is not None and not isinstance(exc, (NotImplementedError, CheckFailed)):
            raise CheckFailed(watch.found.message(ex)) from exc
        _raised(ex, exc, args, kwargs, hint, who)
    if watch.found is not None:
        raise CheckFailed(watch.found.message(ex))
    if pristine is None:
        return result
    for name, before, after in zip(
        list(names) + list(kwargs), list(pristine[0]) + list(pristine[1].values()),
        list(args) + list(kwargs.values()), strict=True,
    ):
        if not equal(before, after):
            raise _changed(ex, name)
    return result


def repeat(fn, args: tuple, n: int, kwargs=None) -> list:
    """``[fn(*args, **kwargs) for _ in range(n)]``: ``n`` draws of a random function whose
    arguments (a NumPy Generator) advance from call to call.

    In grading mode (``fn`` has ``mha_course_remote_repeat``) the ``n`` calls run in the
    learner's kernel as one request and their results come back together, as ``n`` calls would
    bring them (the Generator advanced as far), without ``n`` round trips; what they mean is
    decided here, as for :func:`call`. An error of the function is raised as the calls raise it.

    >>> gen = np.random.default_rng(0)
    >>> [round(x, 3) for x in repeat(lambda g: g.random(), (gen,), 2)]
    [0.637, 0.27]
    """
    kwargs = kwargs or {}
    remote = getattr(fn, "mha_course_remote_repeat", None)
    if remote is not None:
        return remote(args, kwargs, n)
    return [fn(*args, **kwargs) for _ in range(n)]


def _raised(ex, exc, args, kwargs, hint, who):
    """Raise what the learner's function raised, in the check's words (the stub unchanged)."""
    if isinstance(exc, (NotImplementedError, CheckFailed)):
        raise exc  # the exercise stub (or one it calls): "not attempted yet", not a mistake
    called = ", ".join(
        [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    )
    extra = hint(exc) if hint else None
    raise fail(
        ex,
        f"{who} raised {type(exc).__name__}: {exc}\n  (called with {called})"
        + (f"\n  Likely mistake: {extra}" if extra else ""),
    ) from exc


def _changed(ex, name) -> CheckFailed:
    return fail(ex, f"your function changed its argument `{name}` in place. Work on a new array "
                    "(e.g. `x = x - m` rather than `x -= m`), so the caller's data stays as it "
                    "was")


def describe(a) -> str:
    if isinstance(a, np.ndarray):
        return f"array of shape {fmt_shape(a.shape)} dtype {a.dtype}"
    if isinstance(a, MultiHeadAttention):
        return repr(a)
    if isinstance(a, list) and a and isinstance(a[0], list):
        return f"list of lists of shape ({len(a)}, {len(a[0])})"
    return repr(a)


def as_array(ex, got, what: str, shape, letters: str, kind: str):
    """Turn what the learner returned into an array of the expected shape and kind, or fail."""
    if got is None:
        raise fail(ex, f"your function returned None instead of {what}: did you forget `return`?")
    try:
        arr = np.asarray(got)
    except Exception:
        arr = np.asarray(got, dtype=object)
    if arr.dtype == object:
        raise fail(ex, f"{what}: not a numeric array (got {type(got).__name__}); "
                       f"expected shape {letters} = {fmt_shape(shape)}")
    if arr.shape != tuple(shape):
        return arr  # the caller reports shapes, after trying the known wrong variants
    if kind == "b" and arr.dtype.kind != "b":
        raise fail(
            ex,
            f"{what}: dtype {arr.dtype}; expected bool (True = may attend). Build it with a "
            "comparison such as `s <= t`, or `.astype(bool)`",
        )
    if kind == "f" and arr.dtype.kind != "f":
        raise fail(ex, f"{what}: dtype {arr.dtype}; expected a float array")
    if kind == "i" and arr.dtype.kind not in "iu":
        raise fail(ex, f"{what}: dtype {arr.dtype}; expected integers (indices)")
    return arr


def close(a, b) -> bool:
    return a.shape == b.shape and bool(
        np.allclose(a.astype(float), b.astype(float), rtol=RTOL, atol=ATOL, equal_nan=True)
    )


def compare(ex, got, want, what: str, letters: str, variants=(), shape_hints=None,
            props=(), nan_message=None):
    """Fail unless ``got`` equals ``want``; name the mistake when a known variant matches.

    ``variants`` are ``(message, make)`` pairs: ``make()`` computes a known wrong answer on the
    same inputs; if the learner's answer equals it, ``message`` names the mistake.
    ``shape_hints`` maps a wrong shape to a message. ``props`` are callables that raise
    :class:`CheckFailed` when a property (rows sum to 1, ...) is violated.
    """
    want = np.asarray(want)
    arr = as_array(ex, got, what, want.shape, letters, want.dtype.kind)
    if arr.shape == want.shape and close(arr, want):
        return arr
    for message, make in variants:
        wrong = quiet(make)
        if wrong is None:
            continue
        wrong = np.asarray(wrong)
        if wrong.shape == arr.shape and not close(wrong, want) and close(arr, wrong):
            raise fail(ex, f"{what}: not what the reference gives. Likely mistake: {message}")
    if arr.shape != want.shape:
        hint = (shape_hints or {}).get(tuple(arr.shape))
        raise fail(
            ex,
            f"{what}: shape {fmt_shape(arr.shape)}; expected {letters} = {fmt_shape(want.shape)}"
            + (f". Likely mistake: {hint}" if hint else ""),
        )
    if arr.dtype.kind == "f" and not np.isfinite(arr).all() and np.isfinite(want).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise fail(
            ex,
            f"{what}: {fmt(arr[tuple(bad)])} at index {fmt_index(bad)}"
            + f". Likely mistake: {nan_message or NAN_GENERIC}",
        )
    for prop in props:
        prop(arr)
    diff = np.abs(arr.astype(float) - want.astype(float))
    diff = np.where(np.isnan(diff), np.inf, diff)
    where = np.unravel_index(int(np.argmax(diff)), diff.shape)
    mine, theirs = fmt_pair(arr[where], want[where])
    detail = ""
    if fmt(arr[where]) == fmt(want[where]):
        scale = max(abs(float(want[where])), 1e-300)
        detail = f" (a relative difference of {float(diff[where]) / scale:.1e})"
    if arr.dtype.kind == "f" and arr.dtype.itemsize < want.dtype.itemsize:
        detail += (f"; your array is {arr.dtype}, which keeps about 7 significant digits: "
                   f"compute in {want.dtype} (NumPy's default) to match to 1e-6")
    raise fail(ex, f"{what}: at index {fmt_index(where)} you have {mine}, the reference has "
                   f"{theirs}{detail}")


def rows_sum_to_one(ex, what: str, fully_masked=None):
    """A property check: every row (last axis) sums to 1, except fully masked rows (sum 0)."""

    def prop(arr):
        sums = arr.sum(axis=-1)
        target = np.ones_like(sums)
        if fully_masked is not None:
            target = np.where(fully_masked, 0.0, 1.0)
        bad = np.argwhere(~np.isclose(sums, target, rtol=1e-6, atol=1e-9))
        if len(bad):
            i = tuple(bad[0])
            raise fail(
                ex,
                f"row {fmt_index(i)} of {what} sums to {fmt(sums[i])}, not {fmt(int(target[i]))}: "
                "did you normalise over the right axis (the last one, keys)?",
            )
        if (arr < 0).any():
            i = tuple(np.argwhere(arr < 0)[0])
            raise fail(ex, f"{what}: a negative entry {fmt(arr[i])} at {fmt_index(i)}; "
                           "softmax weights are never negative")

    return prop


def masked_are_zero(ex, what: str, mask):
    def prop(arr):
        leak = np.argwhere(~np.broadcast_to(mask, arr.shape) & (arr != 0))
        if len(leak):
            i = tuple(leak[0])
            raise fail(ex, f"{what}: {fmt(arr[i])} at {fmt_index(i)}, where the mask is False; "
                           "masked entries must be exactly 0 (set their scores to -inf "
                           "before the softmax)")

    return prop


def pair(ex, got, names=("out", "weights")):
    if not isinstance(got, tuple) or len(got) != 2:
        kind = f"a tuple of {len(got)}" if isinstance(got, tuple) else type(got).__name__
        raise fail(ex, f"your function returned {kind}; expected a tuple ({', '.join(names)})")
    return got


def swapped_pair(ex, got, out_shape, weights_shape):
    a, b = (np.shape(x) for x in got)
    if a == tuple(weights_shape) and b == tuple(out_shape) and a != b:
        raise fail(ex, "you returned (weights, out); return (out, weights) in that order")


def random_mask(rng, shape, full_rows=()):
    mask = rng.random(shape) < 0.6
    mask[..., 0] |= ~mask.any(axis=-1)  # every row keeps at least one entry...
    for row in full_rows:
        mask[row] = False  # ...except the rows chosen to be fully masked
    return mask


def attention_probes(rng, B=2, T=3, S=5, d_k=4, d_v=6):
    q = rng.normal(size=(B, T, d_k))
    k = rng.normal(size=(B, S, d_k))
    v = rng.normal(size=(B, S, d_v))
    return q, k, v


def compare_pair(ex, got, want_out, want_w, label, variants, mask=None, full_rows=None,
                 nan_message=None):
    """Compare (out, weights): weights first (they show the mistake), then out."""
    pair(ex, got)
    swapped_pair(ex, got, want_out.shape, want_w.shape)
    props = [rows_sum_to_one(ex, f"your weights {label}", full_rows)]
    if mask is not None:
        props.insert(0, masked_are_zero(ex, f"your weights {label}", mask))
    compare(ex, got[1], want_w, f"your weights {label}", "(..., T, S)",
            variants=[(m, (lambda mk=mk: mk()[1])) for m, mk in variants],
            props=props, nan_message=nan_message)
    compare(ex, got[0], want_out, f"your output {label}", "(..., T, d_v)",
            variants=[(m, (lambda mk=mk: mk()[0])) for m, mk in variants])

