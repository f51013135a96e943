"""Scaled dot-product attention and the masks that go with it.

Taught in ``notebooks/03_single_head_attention.ipynb``.

Shape letters: ``T`` query positions, ``S`` key/value positions, ``d_k`` query/key width,
``d_v`` value width; ``...`` any leading batch axes (batch, heads). Masks are boolean with
``True`` = *may attend*.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import as_float_array, check_mask, check_positive_int, check_shape, fail
from .softmax import _softmax_inplace


def scaled_dot_product_attention(q, k, v, mask=None) -> tuple[np.ndarray, np.ndarray]:
    """``softmax(q kᵀ / √d_k) v``, with an optional boolean mask.

    Parameters
    ----------
    q : ndarray of float, shape (..., T, d_k)
        Queries.
    k : ndarray of float, shape (..., S, d_k)
        Keys.
    v : ndarray of float, shape (..., S, d_v)
        Values.
    mask : ndarray of bool, broadcastable to (..., T, S), optional
        ``True`` where query ``t`` may attend to key ``s``. A query with no allowed key gets
        weights 0 and output 0.

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
        Each row is a weighted average of the rows of ``v``.
    weights : ndarray, shape (..., T, S)
        The attention weights; each row sums to 1 (or is all 0 if fully masked).

    Raises
    ------
    ValueError
        On a wrong rank, mismatched ``d_k`` or ``S``, batch axes that do not broadcast, a mask
        that is not boolean or does not broadcast to (..., T, S), or non-float input.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> out, weights = scaled_dot_product_attention(
    ...     rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 6)))
    >>> out.shape, weights.shape
    ((3, 6), (3, 5))
    """
    q, k, v, m, batch, (T, S, d_k, d_v) = _check_qkv("scaled_dot_product_attention", q, k, v, mask)

    # (..., T, d_k) @ (..., d_k, S) -> (..., T, S); scaling q costs T·d_k, scaling scores T·S.
    q = q * (1.0 / math.sqrt(d_k))  # a python float keeps q's dtype (float32 stays float32)
    shift = not _exp_is_safe(q, k, np.result_type(q, k))
    if np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) != batch:
        # v (or the mask, which check_mask held to v's batch) has batch axes q and k lack: the
        # weights must have them too, since the mask is applied to them in place.
        q = np.broadcast_to(q, (*batch, T, d_k))
    scores = q @ np.swapaxes(k, -1, -2)
    weights = _weights_from_scores(scores, m, shift)
    out = weights @ v  # (..., T, S) @ (..., S, d_v) -> (..., T, d_v)
    return out, weights


def _check_qkv(func: str, q, k, v, mask):
    """The input checks shared by the attention functions, with their messages.

    Returns ``(q, k, v, mask, batch, (T, S, d_k, d_v))``: the arrays as float arrays, the mask
    as a bool array (or None) checked to broadcast to ``(*batch, T, S)``, and ``batch`` the
    broadcast batch axes of q, k and v.
    """
    q = as_float_array(func, "q", q)
    k = as_float_array(func, "k", k)
    v = as_float_array(func, "v", v)
    T, d_k = check_shape(func, "q", q, ("T", "d_k")).values()
    S = check_shape(func, "k", k, ("S", "d_k"), {"d_k": (d_k, "q")})["S"]
    d_v = check_shape(func, "v", v, ("S", "d_v"), {"S": (S, "k")})["d_v"]
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise fail(
            func,
            f"the batch axes of q {q.shape[:-2]}, k {k.shape[:-2]} and v {v.shape[:-2]} "
            "do not broadcast together",
        ) from None
    m = check_mask(func, mask, (*batch, T, S), f"(..., T, S) = {(*batch, T, S)}")
    return q, k, v, m, batch, (T, S, d_k, d_v)


def _weights_from_scores(scores: np.ndarray, m: np.ndarray | None, shift: bool) -> np.ndarray:
    """Mask and softmax the (..., T, S) ``scores`` in place; the buffer becomes the weights.

    Working in place keeps peak memory at one (..., T, S) array: no second buffer for the
    exponentials or the weights.
    """
    if m is not None:
        # copyto with where= writes -inf only where ~m is True. (Inverting m costs a bool array
        # of m's own size, (T, S) for a causal mask, i.e. 1/(4h) of float32 scores of h heads;
        # np.putmask would need a mask as large as the scores, np.where a second float buffer.)
        np.copyto(scores, -np.inf, where=~m)
    return _softmax_inplace(scores, axis=-1, masked=m is not None, shift=shift)


def _exp_is_safe(q: np.ndarray, k: np.ndarray, dtype) -> bool:
    """True when ``exp(q·k)`` can neither overflow nor underflow for any query and key.

    Performance: softmax's max subtraction guards ``exp`` against overflow, but costs a read
    pass (the row max) and a read-write pass (the subtraction) over the whole (..., T, S) buffer,
    3 of the 8 memory passes of the softmax. By Cauchy-Schwarz every score obeys
    ``|q_t·k_s| <= B = max_t |q_t| · max_s |k_s|``, which costs O((T + S)·d_k) to compute. When
    ``B <= 0.4·ln(largest float)`` (35 for float32, 283 for float64), each ``exp`` lies in
    ``[e^-B, e^B]``: no overflow, no underflow to 0, and a row sum of at most ``S·e^B`` is
    representable, so the shift changes nothing but rounding and is skipped. Measured on the
    softmax of (8, 2048, 2048) scores, one thread: 50 -> 32 ms in float32, 93 -> 61 ms in
    float64 (about 8% of the whole float32 forward at n = 2048). Large, inf or NaN inputs fail
    the test (NaN compares False) and take the shifted path.
    """
    if q.size == 0 or k.size == 0:
        return False
    limit = 0.4 * math.log(float(np.finfo(dtype).max))
    # squared row norms, (..., T) and (..., S): no (..., T, d_k) temporary
    q_norm2 = float(np.einsum("...i,...i->...", q, q).max())
    k_norm2 = float(np.einsum("...i,...i->...", k, k).max())
    return q_norm2 * k_norm2 <= limit * limit


def causal_mask(T: int, S: int | None = None) -> np.ndarray:
    """Boolean (T, S) mask in which a query may attend only to itself and earlier positions.

    With ``S > T`` the queries are taken to be the *last* ``T`` of ``S`` positions (as when
    decoding with a cache): query ``t`` may attend to key ``s`` iff ``s <= t + (S - T)``. Note
    that ``torch``'s ``is_causal=True`` aligns the triangle to the top-left instead; for
    ``T == S`` the two agree.

    Parameters
    ----------
    T : int
        Number of query positions.
    S : int, optional
        Number of key positions (default ``T``).

    Returns
    -------
    ndarray of bool, shape (T, S)
        Lower-triangular (including the diagonal) when ``T == S``.

    Raises
    ------
    ValueError
        If ``T`` or ``S`` is not a positive integer.

    Examples
    --------
    >>> causal_mask(3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    T = check_positive_int("causal_mask", "T", T)
    S = T if S is None else check_positive_int("causal_mask", "S", S)
    return np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)


def padding_mask(lengths, S: int) -> np.ndarray:
    """Boolean (B, 1, S) mask that hides the padding at the end of each sequence of a batch.

    Parameters
    ----------
    lengths : sequence of int, shape (B,)
        The real length of each sequence; positions ``>= lengths[b]`` are padding.
    S : int
        The padded length.

    Returns
    -------
    ndarray of bool, shape (B, 1, S)
        Ready to broadcast against (B, T, S) scores: every query of sequence ``b`` may attend
        to its first ``lengths[b]`` keys.

    Raises
    ------
    ValueError
        If ``lengths`` is not a 1-D array of integers in ``[0, S]``.

    Examples
    --------
    >>> padding_mask([2, 3], 4).astype(int)
    array([[[1, 1, 0, 0]],
    <BLANKLINE>
           [[1, 1, 1, 0]]])
    """
    func = "padding_mask"
    S = check_positive_int(func, "S", S)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise fail(
            func,
            f"lengths has shape {lengths.shape} and dtype {lengths.dtype}; "
            "expected a 1-D array of integers, shape (B,)",
        )
    if lengths.size and (lengths.min() < 0 or lengths.max() > S):
        raise fail(func, f"lengths {lengths.tolist()} must lie between 0 and S={S}")
    return (np.arange(S)[None, :] < lengths[:, None])[:, None, :]
