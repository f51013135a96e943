"""A memory-lean, faster forward pass of ``MultiHeadAttention``, beside the readable one.

Taught in ``notebooks/07_flash_attention.ipynb`` (the performance lab); tested equal to
``MultiHeadAttention.forward`` in ``tests/test_lean.py``.

``MultiHeadAttention.forward`` is lesson 04's recipe, one step per line: it holds q, k, v, the
scores (which become the weights), the heads and the merged heads. :func:`lean_forward` computes
the same output and weights, ordered for the machine instead of the reader, as nanoGPT keeps its
manual attention beside the flash call:

1. **Blocks of query rows.** When one head's scores outgrow the L2 cache, they are computed a
   block of query rows at a time straight into the weights array and softmaxed there while the
   block is still in the cache, instead of passes over a (..., h, T, S) array too large for it.
2. **Memory in order.** ``q`` is scaled in place; ``v`` is projected only after ``k`` is
   freed, so q, k and v never coexist with the weights; the heads are written straight into
   the merged layout (..., T, h*d_v) through a ``split_heads`` view, reusing q's buffer, so
   there is no separate heads array and no ``merge_heads`` copy.
3. **Max subtraction skipped when provably useless.** Softmax subtracts each row's max so that
   ``exp`` cannot overflow (lesson 02: always do it). By Cauchy-Schwarz every score obeys
   ``|q_t·k_s| <= B = max_t |q_t| · max_s |k_s|``, which costs O((T + S)·d_k) to compute. When
   ``B <= 0.4·ln(largest float)`` (35 for float32, 283 for float64) each ``exp`` lies in
   ``[e^-B, e^B]``: no overflow, no underflow to 0, and a row sum of at most ``S·e^B`` is
   representable, so the shift changes nothing but rounding, and its two passes (the row max, the
   subtraction) are skipped. Large, inf or NaN inputs fail the test (NaN compares False) and take
   the shifted path.

Peak memory is the (..., h, T, S) weights (returned) plus two (..., T, h·d) arrays (q and k,
then q's buffer and v, then the merged heads and the output), not four or five.
"""

from __future__ import annotations

import math

import numpy as np

from ._validate import refuse_layer_scale
from .heads import group_heads, kv_for_groups, merge_heads, project, split_heads, ungroup_heads
from .positions import apply_rope
from .softmax import softmax_inplace

#: One head's scores larger than this (a core's L2 cache) are computed and softmaxed a block of
#: query rows at a time.
BLOCK_BYTES = 1 << 21
#: Scores larger than ``4 * SOFTMAX_BLOCK_BYTES`` are softmaxed a block of rows (of every head at
#: once) at a time, each block small enough to stay in a core's L2 cache through the softmax's
#: passes: on (8, 2048, 2048) scores, one thread, CPU time, the softmax took 95 -> 61 ms (float32)
#: and 172 -> 105 ms (float64); at (8, 512, 512), which fits in the L3 cache, it changed nothing.
SOFTMAX_BLOCK_BYTES = 1 << 19
#: Fewest query rows per block: OpenBLAS runs thinner (rows, d_k) @ (d_k, S) products several times
#: slower per FLOP (measured: 16-row blocks took 4.7x as long as the whole (2048, 2048) product).
MIN_ROWS = 128


def lean_forward(layer, x, context=None, mask=None):
    """``layer.forward(x, context, mask)``, ordered for speed and memory; same output and weights.

    Parameters
    ----------
    layer : MultiHeadAttention
        The layer whose parameters to use (GQA and RoPE included).
    x, context, mask
        As for ``MultiHeadAttention.forward``.

    Returns
    -------
    out : ndarray, shape (..., T, d_model)
    weights : ndarray, shape (..., h, T, S)
        Equal to ``layer.forward``'s to round-off (float64: about 1e-15).

    Raises
    ------
    ValueError
        As ``MultiHeadAttention.forward``, with the same messages.

    Examples
    --------
    >>> from mha_course import MultiHeadAttention, causal_mask
    >>> layer = MultiHeadAttention(d_model=8, h=2, rng=0)
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 8))
    >>> out, weights = lean_forward(layer, x, mask=causal_mask(5))
    >>> bool(np.allclose(out, layer(x, mask=causal_mask(5))[0]))
    True
    """
    refuse_layer_scale("lean_forward", layer)
    x, kv_input, m = layer.validate_inputs(x, context, mask)  # m: (..., 1, 1, T, S) or None
    dtype = np.result_type(x, kv_input)
    h, g, d_k, d_v = layer.h, layer.n_kv_heads, layer.d_k, layer.d_v
    T, S = x.shape[-2], kv_input.shape[-2]
    batch = np.broadcast_shapes(x.shape[:-2], kv_input.shape[:-2])
    rope = {"base": layer.rope_base, "layout": layer.rope}
    q = project(x, layer.W_q, layer.b_q, dtype)  # (..., T, h*d_k)
    q *= 1.0 / math.sqrt(d_k)  # in place; a python float keeps the dtype
    k = split_heads(project(kv_input, layer.W_k, layer.b_k, dtype), g)  # (..., g, S, d_k)
    if layer.rope is not None:  # the rotation commutes with the scale, so q is scaled already
        q = merge_heads(apply_rope(split_heads(q, h), **rope))  # (..., T, h*d_k), a new array
        k = apply_rope(k, **rope)
    q_heads = group_heads(split_heads(q, h), g)  # (..., g, h/g, T, d_k), a view of q
    kT = np.swapaxes(kv_for_groups(k), -1, -2)  # (..., g, 1, d_k, S), a view of k
    shift = not exp_is_safe(q_heads, kT, dtype)

    # 1. Scores, then softmax in place (shifted only when it can matter). When one head's scores
    #    outgrow the L2 cache, a block of query rows of one head at a time, so the softmax reads
    #    the block while it is still in the cache.
    weights = np.empty((*batch, g, h // g, T, S), dtype=dtype)
    if T * S * weights.itemsize <= BLOCK_BYTES:
        np.matmul(q_heads, kT, out=weights)  # (..., g, h/g, T, d_k) @ (..., g, 1, d_k, S)
        softmax_rows(weights, mask=m, shift=shift)
    else:
        lead = weights.shape[:-2]  # (..., g, h/g): one (T, S) matrix per index
        q_all = np.broadcast_to(q_heads, (*lead, T, d_k))  # views: nothing is copied
        kT_all = np.broadcast_to(kT, (*lead, d_k, S))
        m_all = None if m is None else np.broadcast_to(m, (*lead, *m.shape[-2:]))
        rows = max(MIN_ROWS, BLOCK_BYTES // (S * weights.itemsize))
        for i in np.ndindex(*lead):
            for t0 in range(0, T, rows):
                t = slice(t0, t0 + rows)
                w = weights[i][t]  # (rows, S), a view
                np.matmul(q_all[i][t], kT_all[i], out=w)  # (rows, d_k) @ (d_k, S)
                block_mask = None if m is None else m_all[i][t] if m.shape[-2] > 1 else m_all[i]
                softmax_rows(w, mask=block_mask, shift=shift)
    del k, kT  # memory: k is not needed once the weights exist
    # 2. The values, projected only now, so q, k and v never coexist with the weights.
    v = kv_for_groups(split_heads(project(kv_input, layer.W_v, layer.b_v, dtype), g))
    # 3. The heads, written straight into merge_heads layout (..., T, h*d_v) through a
    #    split_heads view; q's buffer is reused when it has that shape.
    if q.shape[:-2] == batch and d_v == d_k:
        concat = q
    else:
        concat = np.empty((*batch, T, h * d_v), dtype=dtype)
    del q, q_heads
    # (..., g, h/g, T, S) @ (..., g, 1, S, d_v) -> (..., g, h/g, T, d_v), stored as (..., T, h*d_v)
    np.matmul(weights, v, out=group_heads(split_heads(concat, h), g))
    del v
    out = project(concat, layer.W_o, layer.b_o, dtype)  # (..., T, d_model)
    return out, ungroup_heads(weights)


def softmax_rows(s: np.ndarray, mask=None, shift: bool = True) -> np.ndarray:
    """:func:`~mha_course.softmax.softmax_inplace` along the last axis, a block of rows at a
    time when ``s`` is large (:data:`SOFTMAX_BLOCK_BYTES`), and without the max subtraction when
    ``shift=False`` (only after :func:`exp_is_safe` proved it useless). The same result, row by
    row; ``mask`` (bool, broadcastable to ``s``) already validated.
    """
    kernel = softmax_inplace if shift else _softmax_unshifted
    if not (s.ndim >= 2 and s.nbytes > 4 * SOFTMAX_BLOCK_BYTES):
        return kernel(s, -1, mask)
    if mask is not None:
        mask = np.asarray(mask)
        mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)  # a row axis to slice
    rows = max(1, SOFTMAX_BLOCK_BYTES // s[..., 0, :].nbytes)  # rows of every leading axis
    for t0 in range(0, s.shape[-2], rows):
        t = slice(t0, t0 + rows)
        block_mask = mask if mask is None or mask.shape[-2] == 1 else mask[..., t, :]
        kernel(s[..., t, :], -1, block_mask)  # (..., rows, S), a view into s
    return s


def _softmax_unshifted(s: np.ndarray, axis: int, mask) -> np.ndarray:
    """The softmax without its max subtraction, in place: exp, then times 1 / the row's sum."""
    if mask is not None:
        np.copyto(s, -np.inf, where=~mask)
    np.exp(s, out=s)
    total = s.sum(axis=axis, keepdims=True)
    if mask is not None:
        total[total == 0] = 1
    s *= np.reciprocal(total, out=total)
    return s


def exp_is_safe(q: np.ndarray, kT: np.ndarray, dtype) -> bool:
    """True when ``exp(q·k)`` can neither overflow nor underflow for any query and key.

    ``q`` (..., T, d_k) and ``kT`` (..., d_k, S); see the module docstring for the bound.
    """
    if q.size == 0 or kT.size == 0:
        return False
    limit = 0.4 * math.log(float(np.finfo(dtype).max))
    # squared row norms of q, (..., T), and column norms of kT, (..., S): no temporary copies
    q_norm2 = float(np.einsum("...i,...i->...", q, q).max())
    k_norm2 = float(np.einsum("...ij,...ij->...j", kT, kT).max())
    return q_norm2 * k_norm2 <= limit * limit
