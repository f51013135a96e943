"""Tiled attention with an online softmax: the idea behind FlashAttention, in NumPy.

Taught in ``notebooks/07_flash_attention.ipynb``; the docstring of :func:`tiled_attention` and
the comments in its loops are the short version.

Standard attention (:func:`mha_course.scaled_dot_product_attention`) builds the whole
(..., T, S) score matrix, softmaxes it and multiplies it by ``v``: memory grows as T·S, and the
scores and weights make a round trip through main memory. Tiled attention gets the same output
while holding only one (..., block, block) tile of scores at a time, so the extra memory grows
as T·d_v (the output) plus one tile. With ``return_lse=True`` it also returns the one number per
query a backward pass needs to recompute the weights: the log-sum-exp of the query's scores.

This module is FlashAttention-2's forward line by line (the loop the lesson writes and the tile
stepper draws). The same loop with four savings on the passes that are not matrix products (no
running max when it provably cannot matter, the row sum inside the second matmul, base 2, the
shift inside the first matmul) is :func:`mha_course.kernels.lean.lean_tiled_attention`, the fast
path,
tested equal to this one.

Shape letters as in :mod:`mha_course.attention`: ``T`` query positions, ``S`` key/value
positions, ``d_k`` query/key width, ``d_v`` value width, ``...`` any leading batch axes (batch,
heads). Masks are boolean with ``True`` = *may attend*.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import validate_positive_int
from ..attention import validate_qkv


def tiled_attention(q, k, v, *, mask=None, causal=False, block_size=256, return_lse=False,
                    on_tile=None):
    """``softmax(q kᵀ / √d_k) v`` one (block × block) tile at a time, never the (T, S) matrix.

    The algorithm is the online softmax of Milakov & Gimelshein (2018), tiled as in
    FlashAttention (Dao et al., 2022), with FlashAttention-2's deferred normalisation. For one
    query ``t`` with scores ``x_s = q_t·k_s / √d_k``, the output is::

        out_t = Σ_s exp(x_s - m) v_s / Σ_s exp(x_s - m),   m = max_s x_s

    (subtracting the maximum ``m`` changes nothing and keeps every ``exp`` <= 1). The sums can
    be built block by block of keys if we keep, per query, three running quantities over the
    keys seen so far: the maximum ``m``, the sum ``l = Σ exp(x_s - m)`` and the unnormalised
    output ``acc = Σ exp(x_s - m) v_s``. When a new block raises the maximum from ``m_old`` to
    ``m_new``, everything accumulated so far was scaled by ``exp(-m_old)`` and must now be
    scaled by ``exp(-m_new)``: multiply ``l`` and ``acc`` by ``exp(m_old - m_new)`` (<= 1), then
    add the new block's terms. After the last block, ``out_t = acc / l`` (one division per
    output, at the end) and ``lse_t = m + log(l)``. The result equals standard attention up to
    rounding, for any block size.

    The queries are walked in blocks too, so the largest temporary is a (..., block, block)
    tile of scores: besides the output, the function holds ``q``, ``v`` and a few tiles, about
    T·(d_k + d_v) + 2·block² numbers per batch element and head, instead of T·S. With
    ``causal=True`` a key block that lies wholly above the diagonal of a query block (every key
    in the future of every query) is skipped, not computed and masked: for T = S about half the
    tiles are never visited.

    Parameters
    ----------
    q : ndarray of float, shape (..., T, d_k)
        Queries.
    k : ndarray of float, shape (..., S, d_k)
        Keys.
    v : ndarray of float, shape (..., S, d_v)
        Values.
    mask : ndarray of bool, broadcastable to (..., T, S), optional
        ``True`` where query ``t`` may attend to key ``s``; sliced tile by tile, never expanded.
        A query with no allowed key gets output 0.
    causal : bool, default False
        Also hide the future: query ``t`` may attend to key ``s`` iff ``s <= t + (S - T)``
        (the queries are the *last* ``T`` of ``S`` positions, as :func:`mha_course.causal_mask`
        aligns them). Combined with ``mask`` by logical and.
    block_size : int, default 256
        Queries and keys per tile. Any value >= 1 gives the same output; it trades Python loop
        overhead (small blocks: many tiles) against memory and cache misses (large blocks).
    return_lse : bool, default False
        Also return the log-sum-exp of each query's scaled, masked scores.
    on_tile : callable, optional
        Called after each tile with a dict: ``"queries"`` ``(t0, t1)`` and ``"keys"``
        ``(s0, s1)``, the block's rows and columns; ``"m"`` (..., t1-t0) the running max of the
        scores seen so far (``-inf`` where none is allowed yet), ``"l"`` (..., t1-t0) the
        running sum and ``"acc"`` (..., t1-t0, d_v) the unnormalised output, all copies. For
        teaching (lesson 07's tile stepper).

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
        As the ``out`` of :func:`mha_course.scaled_dot_product_attention`; in float32 when the
        inputs are float32. No attention weights are returned: they are never all in memory.
    lse : ndarray, shape (..., T)
        Only with ``return_lse=True``: ``log Σ_s exp(q_t·k_s / √d_k)`` over the keys ``s``
        query ``t`` may attend to (:func:`mha_course.logsumexp` of the scaled, masked scores);
        ``-inf`` for a query with no allowed key. The weights are ``exp(scores - lse)``.

    Raises
    ------
    ValueError
        As :func:`mha_course.scaled_dot_product_attention` (wrong rank, mismatched ``d_k`` or
        ``S``, batch axes that do not broadcast, a bad mask, non-float input), and when
        ``block_size`` is not an integer >= 1.

    Examples
    --------
    >>> from mha_course import causal_mask, scaled_dot_product_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 7, 4)), rng.normal(size=(2, 7, 3))
    >>> out, lse = tiled_attention(q, k, v, causal=True, block_size=3, return_lse=True)
    >>> out.shape, lse.shape
    ((2, 5, 3), (2, 5))
    >>> bool(np.allclose(out, scaled_dot_product_attention(q, k, v, mask=causal_mask(5, 7))[0]))
    True
    """
    func = "tiled_attention"
    q, k, v, mask, batch, (T, S, d_k, d_v) = validate_qkv(func, q, k, v, mask)
    block = validate_positive_int(func, "block_size", block_size)
    if mask is not None and mask.ndim < 2:  # (S,) -> (1, S): a row axis and a column axis to slice
        mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)
    dtype = np.result_type(q, k, v)  # float32 stays float32 (no float64 temporaries below)
    # Scale q once (T·d_k multiplications, not T·S). Broadcasting it to every batch axis (a
    # view, no copy) makes each score tile carry all of them, so a mask or v with more batch
    # axes than q and k still lines up.
    q = np.broadcast_to(q * (1.0 / math.sqrt(d_k)), (*batch, T, d_k))
    kT = np.swapaxes(k, -1, -2)  # (..., d_k, S), a view
    out = np.empty((*batch, T, d_v), dtype=dtype)
    lse = np.empty((*batch, T), dtype=dtype) if return_lse else None
    for t0 in range(0, T, block):  # one block of queries [t0, t1) at a time
        t1 = min(t0 + block, T)
        tile = TileMask(mask, causal, t0, t1, S - T)
        keys = key_blocks(t0, t1, T, S, block, causal)
        acc, l_run, m_run = running_block(q[..., t0:t1, :], kT, v, keys, tile, on_tile)
        if lse is not None:  # lse = m + log l; log 0 = -inf where no key was allowed
            m0 = np.where(m_run == -np.inf, 0.0, m_run)
            with np.errstate(divide="ignore"):
                lse[..., t0:t1] = (m0 + np.log(l_run))[..., 0]
        # out_t = acc / l. A query that saw no allowed key has l = 0 and acc = 0: output 0.
        out[..., t0:t1, :] = acc / np.where(l_run == 0, 1.0, l_run).astype(dtype, copy=False)
    return (out, lse) if return_lse else out


def running_block(qb, kT, v, keys, tile, on_tile=None):
    """One block of queries against its key blocks, with FlashAttention-2's running max.

    ``qb`` (..., bt, d_k) scaled queries, ``kT`` (..., d_k, S), ``v`` (..., S, d_v); ``keys``
    the ``(s0, s1)`` blocks to visit (:func:`key_blocks`), ``tile`` their :class:`TileMask`.
    Returns ``(acc, l, m)`` after the last key block: (..., bt, d_v), (..., bt, 1), (..., bt, 1).
    """
    dtype = qb.dtype
    acc = np.zeros((*qb.shape[:-1], v.shape[-1]), dtype=dtype)  # Σ exp(x_s - m) v_s
    l_run = np.zeros((*qb.shape[:-1], 1), dtype=dtype)  # Σ exp(x_s - m)
    m_run = np.full((*qb.shape[:-1], 1), -np.inf, dtype=dtype)  # max_s x_s so far
    for s0, s1 in keys:
        # (..., bt, d_k) @ (..., d_k, s1-s0) -> (..., bt, s1-s0): one tile of scores
        scores = qb @ kT[..., s0:s1]
        tile.apply(scores, s0, s1)
        # m_new = max(m_old, max_s x_s): the running max over all keys seen so far.
        m_new = np.maximum(m_run, scores.max(axis=-1, keepdims=True))
        # A query whose keys so far are all masked still has m_new = -inf; shift it by 0
        # instead, so exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
        shift = np.where(m_new == -np.inf, 0.0, m_new).astype(dtype, copy=False)
        p = np.exp(scores - shift)  # exp(x_s - m_new) <= 1
        # alpha = exp(m_old - m_new) <= 1 re-expresses the old sums relative to the new max.
        alpha = np.exp(m_run - shift)
        l_run = alpha * l_run + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + p @ v[..., s0:s1, :]  # (..., bt, s1-s0) @ (..., s1-s0, d_v)
        m_run = m_new
        if on_tile is not None:
            on_tile(_tile_state(tile.t0, tile.t1, s0, s1, m_run, l_run, acc))
    return acc, l_run, m_run


class TileMask:
    """Masks one (..., t1-t0, s1-s0) tile of scores in place: the user's mask and the future.

    Shared with the fast path, :func:`mha_course.kernels.lean.lean_tiled_attention`."""

    def __init__(self, mask, causal: bool, t0: int, t1: int, offset: int):
        self.mask, self.causal, self.t0, self.t1, self.offset = mask, causal, t0, t1, offset

    def apply(self, scores: np.ndarray, s0: int, s1: int) -> None:
        if self.mask is not None:
            np.copyto(scores, -np.inf, where=~_mask_tile(self.mask, self.t0, self.t1, s0, s1))
        if self.causal and s1 - 1 > self.t0 + self.offset:  # crosses the diagonal: hide the future
            # (t1-t0, s1-s0), True where key s lies in the future of query t
            future = np.arange(s0, s1) > np.arange(self.t0, self.t1)[:, None] + self.offset
            np.copyto(scores, -np.inf, where=future)


def _tile_state(t0, t1, s0, s1, m_run, l_run, acc) -> dict:
    """What ``on_tile`` receives: the running quantities, as copies."""
    return {
        "queries": (t0, t1),
        "keys": (s0, s1),
        "m": m_run[..., 0].copy(),
        "l": l_run[..., 0].copy(),
        "acc": acc.copy(),
    }


def key_blocks(t0: int, t1: int, T: int, S: int, block: int, causal: bool):
    """Yield ``(s0, s1)`` for each key block the query block ``[t0, t1)`` must visit.

    Without ``causal``: every block of ``block`` keys. With ``causal``, query ``t`` sees keys
    ``s <= t + (S - T)``; the last query of the block, ``t1 - 1``, sees the most, so key blocks
    starting after ``t1 - 1 + (S - T)`` lie wholly in the future of every query here and are
    skipped (the loop stops before them).
    """
    last = S if not causal else min(S, t1 + (S - T))  # one past the last key any query may see
    for s0 in range(0, max(last, 0), block):
        yield s0, min(s0 + block, S)


def _mask_tile(mask: np.ndarray, t0: int, t1: int, s0: int, s1: int) -> np.ndarray:
    """The (..., t1-t0, s1-s0) part of a mask that broadcasts to (..., T, S), as a view.

    An axis of length 1 broadcasts, so it is kept whole rather than sliced.
    """
    rows = slice(None) if mask.shape[-2] == 1 else slice(t0, t1)
    cols = slice(None) if mask.shape[-1] == 1 else slice(s0, s1)
    return mask[..., rows, cols]
