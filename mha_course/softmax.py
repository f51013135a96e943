"""Numerically stable softmax, log-sum-exp and log-softmax, with boolean masks.

Taught in ``notebooks/02_softmax.ipynb``.

Masks follow one convention across the package: ``True`` means *may attend* (keep the entry),
``False`` means *masked out*. A slice in which every entry is masked has no distribution to
normalise; this package returns zeros there, never NaN (lesson 02 shows what ``-inf`` and
``-1e9`` do instead).
"""

from __future__ import annotations

import numpy as np

from ._validate import as_float_array, fail, validate_mask


def _prepare(func: str, x, axis: int, mask) -> tuple[np.ndarray, int, np.ndarray | None]:
    x = as_float_array(func, "x", x)
    if x.ndim == 0:
        raise fail(func, "x has shape (); expected an array with at least one axis")
    if not -x.ndim <= axis < x.ndim:
        raise fail(func, f"axis={axis} is out of range for x with shape {x.shape}")
    m = validate_mask(func, mask, x.shape, f"x's shape {x.shape}")
    return x, axis, m


def softmax(x, axis: int = -1, mask=None) -> np.ndarray:
    """Softmax along ``axis``, stable for any finite input, zeros where every entry is masked.

    ``softmax(x)_i = exp(x_i - max(x)) / sum_j exp(x_j - max(x))``: subtracting the maximum
    changes nothing mathematically (softmax is shift-invariant) and keeps every ``exp`` <= 1.

    Parameters
    ----------
    x : ndarray of float, shape (...)
        Scores.
    axis : int, default -1
        The axis that is normalised.
    mask : ndarray of bool, broadcastable to x.shape, optional
        ``True`` where an entry may take part; masked entries get exactly 0.

    Returns
    -------
    ndarray, same shape and dtype as x
        Non-negative; every slice along ``axis`` sums to 1, or is all 0 if fully masked.

    Raises
    ------
    ValueError
        If ``x`` is not a real float array, ``axis`` is out of range, or ``mask`` is not
        boolean or does not broadcast to ``x``.

    Examples
    --------
    >>> softmax(np.array([1000.0, 1000.0])).tolist()
    [0.5, 0.5]
    >>> softmax(np.zeros((2, 3)), mask=np.array([[True, False, True], [False] * 3])).round(2)
    array([[0.5, 0. , 0.5],
           [0. , 0. , 0. ]])
    """
    x, axis, m = _prepare("softmax", x, axis, mask)
    return softmax_inplace(x.copy(), axis, mask=m)


def softmax_inplace(s: np.ndarray, axis: int = -1, mask=None) -> np.ndarray:
    """Softmax of ``s`` along ``axis``, overwriting ``s``; entries where ``mask`` is False get 0.

    The package's one softmax kernel: :func:`softmax` runs it on a copy, the attention
    functions on their own score buffer, so that peak memory stays near one (..., T, S) array.
    ``mask`` (bool, broadcastable to ``s``) must already be validated. A slice with every entry
    masked becomes all 0, never NaN.

    It does what lesson 02 teaches, in the same order: subtract each row's max, ``exp``, divide by
    the row's sum (as a multiplication by the sum's reciprocal, one division per row instead of
    one per entry). The fast path, :mod:`mha_course.kernels.lean`, runs it a block of rows at a
    time.
    """
    masked = mask is not None
    if masked:
        np.copyto(s, -np.inf, where=~mask)
    if s.shape[axis] == 0:
        return s  # nothing to normalise (no keys): an empty slice, like a fully masked one
    row_max = s.max(axis=axis, keepdims=True)
    if masked:
        # A fully masked slice has max -inf; shifting by 0 leaves exp(-inf) = 0, no NaN.
        row_max[~np.isfinite(row_max)] = 0
    s -= row_max
    np.exp(s, out=s)
    total = s.sum(axis=axis, keepdims=True)
    if masked:
        total[total == 0] = 1
    s *= np.reciprocal(total, out=total)
    return s


def logsumexp(x, axis: int = -1, mask=None, keepdims: bool = False) -> np.ndarray:
    """``log(sum(exp(x)))`` along ``axis``, computed without overflow.

    Parameters
    ----------
    x : ndarray of float, shape (...)
    axis : int, default -1
    mask : ndarray of bool, broadcastable to x.shape, optional
        Masked entries are left out of the sum; a fully masked slice gives ``-inf`` (the log of
        an empty sum).
    keepdims : bool, default False

    Returns
    -------
    ndarray
        ``x``'s shape without ``axis`` (or with it kept as 1).

    Raises
    ------
    ValueError
        As :func:`softmax`.

    Examples
    --------
    >>> float(logsumexp(np.array([1000.0, 1000.0])).round(4))
    1000.6931
    """
    x, axis, m = _prepare("logsumexp", x, axis, mask)
    xm = x if m is None else np.where(m, x, -np.inf).astype(x.dtype, copy=False)
    row_max = xm.max(axis=axis, keepdims=True, initial=-np.inf)  # empty axis: log(0) = -inf
    shift = np.where(np.isfinite(row_max), row_max, 0)
    with np.errstate(divide="ignore"):  # log(0) = -inf for a fully masked slice
        out = np.log(np.exp(xm - shift).sum(axis=axis, keepdims=True)) + shift
    return out if keepdims else np.squeeze(out, axis=axis)


def log_softmax(x, axis: int = -1, mask=None) -> np.ndarray:
    """``log(softmax(x))`` as ``x - logsumexp(x)``: exact even where softmax underflows to 0.

    Parameters
    ----------
    x : ndarray of float, shape (...)
    axis : int, default -1
    mask : ndarray of bool, broadcastable to x.shape, optional
        Masked entries get ``-inf`` (log of 0); a fully masked slice is all ``-inf``.

    Returns
    -------
    ndarray, same shape as x

    Raises
    ------
    ValueError
        As :func:`softmax`.

    Examples
    --------
    >>> log_softmax(np.array([0.0, -1000.0])).round(4).tolist()
    [0.0, -1000.0]
    """
    x, axis, m = _prepare("log_softmax", x, axis, mask)
    lse = logsumexp(x, axis=axis, mask=m, keepdims=True)
    out = x - np.where(np.isfinite(lse), lse, 0)
    if m is not None:
        out = np.where(m, out, -np.inf).astype(x.dtype, copy=False)
    return out
