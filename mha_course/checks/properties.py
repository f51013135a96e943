"""Property tests of attention code: what must hold whatever the numbers are.

A reference says what the right answer is; a property says what no right answer can do, and
so points at the kind of bug: weights that do not sum to 1, a future that leaks, a cache that
disagrees with the full forward pass, a shuffle that does not commute. Lesson 15's spot-the-bug
checks (:mod:`mha_course.checks.drill`) state the first property a learner's function
breaks, by name (the constants below), with the evidence; the lesson writes each test inline
first and shows it agrees with :func:`audit_attention` here.

The pieces are pure: each ``*_violation`` returns None when the property holds, else one line
of evidence; :func:`violated` turns a property and its evidence into the check's failure.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import causal_mask, padding_mask
from .harness import as_array, close, fail, fmt, fmt_index, fmt_pair, fmt_shape, quiet

#: The properties, as the checks name them.
SUMS = "every query's weights sum to 1"
MASKED_ZERO = "a masked key gets weight exactly 0"
FINITE = "finite input gives finite output (no NaN, no inf)"
NO_NAN_INSIDE = "no NaN is made on the way, not even one cleaned up afterwards"
SELF = "every query attends to itself"
CAUSAL = "causality: changing a later token changes no earlier output"
MASK_FREE = "masked keys have no influence: changing them changes nothing"
EQUIVARIANT = "permutation equivariance: shuffling the tokens shuffles the outputs the same way"
BATCH = "batch independence: each sequence's output depends only on that sequence"
CACHED = "cached == uncached: going token by token over a cache equals the full causal forward"
HEADS = "each head is scaled dot-product attention on its own q, k, v, scaled by its own √d_k"
REFERENCE = "equal to the reference"

ALL = (SUMS, MASKED_ZERO, FINITE, SELF, CAUSAL, MASK_FREE, EQUIVARIANT, BATCH, CACHED)

TOL = dict(rtol=1e-6, atol=1e-9)


def violated(ex: str, prop: str, evidence: str, likely: str | None = None):
    """The failure of a property check: ``Exercise NN.M: property violated: <prop>. <evidence>``."""
    return fail(ex, f"property violated: {prop}. {evidence}"
                + (f". Likely mistake: {likely}" if likely else ""))


def likely(got, variants) -> str | None:
    """The message of the known wrong version (``(message, make)`` pairs) whose output equals
    ``got``, else None."""
    for message, make in variants:
        wrong = quiet(make)
        if wrong is not None and np.shape(wrong) == np.shape(got) and close(
                np.asarray(wrong, float), np.asarray(got, float)):
            return message
    return None


def require(ex: str, prop: str, evidence, got=None, variants=()) -> None:
    """Fail with ``prop`` when there is ``evidence``, naming a matching known wrong version."""
    if evidence:
        raise violated(ex, prop, evidence, likely(got, variants) if got is not None else None)


def array(ex: str, got, shape, what: str, letters: str) -> np.ndarray:
    """``got`` as a float array of ``shape``, or a failure naming the shape it has."""
    arr = as_array(ex, got, what, shape, letters, "f")
    if arr.shape != tuple(shape):
        raise fail(ex, f"{what}: shape {fmt_shape(arr.shape)}; expected {letters} = "
                       f"{fmt_shape(shape)}")
    return arr.astype(float)


# ----------------------------------------------------------------------- evidence, pure
def first_nonfinite(arr) -> str | None:
    """``"entry (0, 2) is nan"`` for the first NaN or inf of ``arr``; None if all finite."""
    arr = np.asarray(arr, dtype=float)
    bad = np.argwhere(~np.isfinite(arr))
    return None if not len(bad) else f"entry {fmt_index(bad[0])} is {arr[tuple(bad[0])]}"


def row_sum_violation(weights, nothing=None) -> str | None:
    """Rows (last axis) that do not sum to 1 (to 0 where ``nothing`` is True: no key allowed)."""
    w = np.asarray(weights, dtype=float)
    sums = w.sum(axis=-1)
    target = np.ones_like(sums) if nothing is None else np.where(nothing, 0.0, 1.0)
    bad = np.argwhere(~np.isclose(sums, target, rtol=1e-6, atol=1e-9) | np.isnan(sums))
    if not len(bad):
        return None
    i = tuple(bad[0])
    return f"row {fmt_index(i)} of the weights sums to {fmt(sums[i])}, not {fmt(int(target[i]))}"


def masked_weight_violation(weights, mask) -> str | None:
    """A nonzero weight where ``mask`` (broadcast to the weights) is False."""
    w = np.asarray(weights, dtype=float)
    leak = np.argwhere(~np.broadcast_to(mask, w.shape) & (w != 0))
    if not len(leak):
        return None
    i = tuple(leak[0])
    return f"weight {fmt(w[i])} at {fmt_index(i)}, where the mask is False"


def self_weight_violation(weights, offset: int = 0) -> str | None:
    """A query (row t) that gives its own key (column t + offset) weight 0."""
    w = np.asarray(weights, dtype=float)
    T = w.shape[-2]
    own = w[..., np.arange(T), np.arange(T) + offset]  # (..., T)
    bad = np.argwhere(~(own > 0))
    if not len(bad):
        return None
    *lead, t = bad[0]
    where = f" (batch index {fmt_index(lead)})" if lead else ""
    return f"query {t}{where} gives its own key weight {fmt(own[tuple(bad[0])])}"


def moved(before, after) -> tuple[tuple[int, ...], float, float] | None:
    """The entry that differs most between two arrays that should be equal (NaN differs)."""
    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"moved: shapes {a.shape} and {b.shape} differ")
    same = np.isclose(a, b, **TOL) | (np.isnan(a) & np.isnan(b))
    if same.all():
        return None
    diff = np.where(same, -1.0, np.nan_to_num(np.abs(a - b), nan=np.inf))
    i = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return tuple(int(n) for n in i), float(a[i]), float(b[i])


def moved_text(before, after, what: str = "output") -> str | None:
    """:func:`moved` as evidence: ``"output (0, 1) moved from 0.1234 to 0.5678"``."""
    found = moved(before, after)
    if found is None:
        return None
    i, a, b = found
    a_s, b_s = fmt_pair(a, b)
    return f"{what} {fmt_index(i)} moved from {a_s} to {b_s}"


# --------------------------------------------------------- a whole attention function, audited
def _run(attn, q, k, v, mask):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out, weights = attn(q, k, v, mask)
    return np.asarray(out, dtype=float), np.asarray(weights, dtype=float)


def audit_attention(attn, rng=0) -> dict[str, str | None]:
    """Run the property tests on ``attn(q, k, v, mask) -> (out, weights)``.

    ``attn`` gets q (2, T, d_k), k (2, S, d_k), v (2, S, d_v) with every size different and a
    boolean mask (True = may attend) or None. Returns ``{property: None if it holds, else one
    line of evidence}`` for :data:`FINITE`, :data:`SUMS`, :data:`MASKED_ZERO`, :data:`CAUSAL`,
    :data:`MASK_FREE`, :data:`EQUIVARIANT` and :data:`BATCH`. An ``attn`` that raises gets the
    exception as the evidence of every property.

    Examples
    --------
    >>> from mha_course import scaled_dot_product_attention as sdpa
    >>> audit = audit_attention(lambda q, k, v, mask: sdpa(q, k, v, mask=mask))
    >>> len(audit), sum(evidence is not None for evidence in audit.values())
    (7, 0)
    """
    rng = np.random.default_rng(rng)
    B, T, d_k, d_v = 2, 6, 4, 3
    q, k, v = (rng.normal(size=(B, T, d)) for d in (d_k, d_k, d_v))
    found: dict[str, str | None] = {}
    try:
        out, w = _run(attn, q, k, v, causal_mask(T))
        found[FINITE] = first_nonfinite(out) or first_nonfinite(w)
        found[SUMS] = row_sum_violation(w)
        found[MASKED_ZERO] = masked_weight_violation(w, causal_mask(T))
        cut = T // 2  # change tokens cut.. (their queries, keys, values): outputs :cut stay
        q2, k2, v2 = (a.copy() for a in (q, k, v))
        for a in (q2, k2, v2):
            a[:, cut:] = rng.normal(size=a[:, cut:].shape) * 3
        found[CAUSAL] = moved_text(out[:, :cut], _run(attn, q2, k2, v2, causal_mask(T))[0][:, :cut])
        pad = padding_mask([T, T - 2], T)  # (B, 1, S): sequence 1's last two keys are padding
        k3, v3 = k.copy(), v.copy()
        k3[1, -2:], v3[1, -2:] = 1e3 * rng.normal(size=(2, d_k)), 1e3 * rng.normal(size=(2, d_v))
        found[MASK_FREE] = moved_text(_run(attn, q, k, v, pad)[0], _run(attn, q, k3, v3, pad)[0])
        perm = rng.permutation(T)
        plain = _run(attn, q, k, v, None)[0]
        found[EQUIVARIANT] = moved_text(plain[:, perm],
                                        _run(attn, q[:, perm], k[:, perm], v[:, perm], None)[0])
        found[BATCH] = moved_text(plain[1:], _run(attn, q[1:], k[1:], v[1:], None)[0])
    except Exception as exc:  # a property test of broken code must report, not crash
        evidence = f"it raised {type(exc).__name__}: {exc}"
        return {p: found.get(p, evidence) for p in (FINITE, SUMS, MASKED_ZERO, CAUSAL, MASK_FREE,
                                                     EQUIVARIANT, BATCH)}
    return found
