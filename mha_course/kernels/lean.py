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

Every other fast path lives here too, beside the readable one it equals: :func:`softmax_rows`
(lesson 02's softmax a block of rows at a time, in L2) and :func:`lean_tiled_attention`
(:func:`mha_course.tiled_attention`'s loop with four savings, :class:`Tricks`, among them the
SIMD probe :func:`exp2_is_vectorised`), tested equal in ``tests/test_tiled.py``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

try:  # NumPy >= 2 says which CPU features each compiled loop dispatched to
    from numpy.lib.introspect import opt_func_info
except ImportError:  # pragma: no cover - NumPy 1.x
    opt_func_info = None

from .._validate import fail, refuse_layer_scale, validate_positive_int
from ..attention import validate_qkv
from ..heads import group_heads, kv_for_groups, merge_heads, project, split_heads, ungroup_heads
from ..positions import apply_rope
from ..softmax import softmax_inplace
from .tiled import TileMask, key_blocks

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


# ------------------------------------------------------------- tiled attention, the fast loop
#: log2(e): exp(x) = 2 ** (x · LOG2E). With base 2 the loop holds base-2 scores.
LOG2E = math.log2(math.e)
#: ln(2): a base-2 log-sum-exp times LN2 is the natural one.
LN2 = math.log(2.0)


@dataclass(frozen=True)
class Tricks:
    """Which savings :func:`lean_tiled_attention` may use; each gives the same output up to
    rounding.

    The defaults are what the package uses; lesson 07 turns them off one at a time to measure
    what each is worth (``Tricks(max_shortcut=False)`` and so on).

    Attributes
    ----------
    max_shortcut : bool, default True
        1. Skip the running max when Cauchy-Schwarz proves no ``exp`` can overflow or
        underflow (:func:`exp_is_safe`).
    ones_column : bool, default True
        2. Give ``v`` a column of ones, so the second matmul also returns the row sum ``l``.
    base2 : bool or None, default None
        3. ``exp2`` on base-2 scores (``log2 e`` folded into the scale of ``q``) instead of
        ``exp``. ``None``: base 2 only where NumPy's ``exp2`` is vectorised on this CPU
        (:func:`exp2_is_vectorised`); on CPUs without AVX-512 NumPy computes ``exp2`` one number
        at a time and ``exp`` eight at a time.
    shift_in_matmul : bool, default True
        4. When the max cannot be skipped: take each query's shift from its first key tile and
        let the score matmul subtract it (a column ``-m`` appended to ``q``, a row of ones to
        ``kᵀ``), so the later tiles need no max pass, no subtraction and no rescaling; a block
        whose sums overflow is redone with the running max.
    """

    max_shortcut: bool = True
    ones_column: bool = True
    base2: bool | None = None
    shift_in_matmul: bool = True


@functools.lru_cache(maxsize=1)
def exp2_is_vectorised() -> bool:
    """True when NumPy runs float32 ``exp2`` with SIMD instructions on this CPU.

    NumPy 2 reports which CPU features each of its compiled loops dispatched to
    (``numpy.lib.introspect.opt_func_info``): ``exp2`` has only an AVX-512 (``X86_V4``) kernel,
    ``exp`` also an AVX2 one. ``False`` where NumPy cannot say (NumPy 1.x).
    """
    if opt_func_info is None:  # pragma: no cover - NumPy 1.x
        return False
    info = opt_func_info(func_name="^exp2$", signature="^ff$").get("exp2", {}).get("ff", {})
    return not str(info.get("current", "baseline")).startswith("baseline")


def lean_tiled_attention(q, k, v, *, mask=None, causal=False, block_size=256,
                         return_lse=False, tricks=None):
    """:func:`~mha_course.tiled_attention`'s output (and lse), with four savings on the passes
    that are not matrix products; each gives the same result up to rounding (:class:`Tricks`
    switches them; lesson 07 measures each, ``benchmarks/tiled.py`` times the whole against
    torch with the tiles' matrix products alone as the floor):

    1. **No running max when it cannot matter.** By Cauchy-Schwarz every score obeys
       ``|x_s| <= max_t |q_t| · max_s |k_s| / √d_k``; when that bound is small enough that no
       ``exp`` can overflow or underflow (:func:`exp_is_safe`), the shift is 0 for every query:
       no max pass, no subtraction, no rescaling.
    2. **The row sum inside the second matmul.** ``v`` gets a last column of ones, so
       ``p @ [v | 1]`` yields ``Σ_s p_s v_s`` and ``l``'s increment ``Σ_s p_s`` in one BLAS call
       instead of a separate sum over the tile.
    3. **Base 2** where NumPy's ``exp2`` is vectorised: ``exp(x) = 2 ** (x · log2 e)``, with
       ``log2 e`` folded into the scale of ``q`` (as FlashAttention's kernels do), so the loop
       holds base-2 scores and maxima.
    4. **The shift inside the first matmul, when the max is needed** (large scores, which a
       trained model's often are). Any per-query shift ``m`` with every ``exp(x_s - m)`` finite
       gives the same ``acc / l``, and ``l >= 1`` as soon as ``m`` is the max of *some* of the
       query's scores. So each query block takes ``m`` from its first key tile, appends ``-m``
       to ``q`` as a last column and a row of ones to ``kᵀ``, and every later tile's matmul
       yields ``x_s - m`` directly: no max pass, no subtraction, no rescaling of ``acc``. A
       block whose sums overflow (a later score far above the first tile's max), or in which
       some query has no allowed key in its first tile, is redone with the running max.

    Parameters
    ----------
    q, k, v, mask, causal, block_size, return_lse
        As :func:`~mha_course.tiled_attention` (which also draws its tiles, ``on_tile``).
        ``block_size=256`` was fastest for (8, n, 64) float32 at n = 2048 and 4096 (one
        (8, 256, 256) tile is 2 MiB, 256 KiB per head).
    tricks : Tricks, optional
        Which of the four savings to use; default ``Tricks()``, all of them.

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
    lse : ndarray, shape (..., T)
        Only with ``return_lse=True``.

    Raises
    ------
    ValueError
        As :func:`~mha_course.tiled_attention` (under this function's name), and when
        ``tricks`` is not a :class:`Tricks`.

    Examples
    --------
    >>> from mha_course import tiled_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 7, 4)), rng.normal(size=(2, 7, 3))
    >>> out = lean_tiled_attention(q, k, v, causal=True, block_size=3)
    >>> bool(np.allclose(out, tiled_attention(q, k, v, causal=True, block_size=3)))
    True
    """
    func = "lean_tiled_attention"
    q, k, v, mask, batch, (T, S, d_k, d_v) = validate_qkv(func, q, k, v, mask)
    block = validate_positive_int(func, "block_size", block_size)
    tricks = Tricks() if tricks is None else tricks
    if not isinstance(tricks, Tricks):
        raise fail(func, f"tricks must be a Tricks, got {type(tricks).__name__}")
    if mask is not None and mask.ndim < 2:  # (S,) -> (1, S): a row axis and a column axis to slice
        mask = mask.reshape((1,) * (2 - mask.ndim) + mask.shape)

    dtype = np.result_type(q, k, v)  # float32 stays float32 (no float64 temporaries below)
    base2 = exp2_is_vectorised() if tricks.base2 is None else bool(tricks.base2)
    exp, log = (np.exp2, np.log2) if base2 else (np.exp, np.log)
    kT = np.swapaxes(k, -1, -2)  # (..., d_k, S), a view
    q = q * (1.0 / math.sqrt(d_k))  # (..., T, d_k); a python float keeps the dtype
    # 1. No shift at all when no exp can overflow or underflow without one; else 4. or the
    #    running max.
    if not (tricks.max_shortcut and exp_is_safe(q, kT, dtype)):
        mode = "folded" if tricks.shift_in_matmul else "running"
    else:
        mode = "none"
    if base2:  # 3. base-2 scores: y = x·log2(e), so exp(x - m) = exp2(y - m2)
        q *= LOG2E
    # Broadcasting q to every batch axis (a view, no copy) makes each score tile carry all of
    # them, so a mask or v with more batch axes than q and k still lines up.
    q = np.broadcast_to(q, (*batch, T, d_k))
    if tricks.ones_column:  # 2. v with a column of ones: p @ v1 = [Σ_s p_s v_s | Σ_s p_s]
        v_ = np.empty((*v.shape[:-1], d_v + 1), dtype=dtype)  # (..., S, d_v + 1)
        v_[..., :d_v] = v
        v_[..., d_v] = 1.0
    else:
        v_ = v
    if mode == "folded":  # 4. [q | -m] @ [kᵀ ; 1] = q kᵀ - m: the shift inside the matmul
        qa = np.empty((*batch, T, d_k + 1), dtype=dtype)  # (..., T, d_k + 1)
        qa[..., :d_k] = q
        ka = np.empty((*kT.shape[:-2], d_k + 1, S), dtype=dtype)  # (..., d_k + 1, S)
        ka[..., :d_k, :] = kT
        ka[..., d_k, :] = 1.0
    out = np.empty((*batch, T, d_v), dtype=dtype)
    lse = np.empty((*batch, T), dtype=dtype) if return_lse else None

    for t0 in range(0, T, block):  # one block of queries [t0, t1) at a time
        t1 = min(t0 + block, T)
        keys = list(key_blocks(t0, t1, T, S, block, causal))
        tile = TileMask(mask, causal, t0, t1, S - T)
        state = None
        if mode == "folded":  # an overflow here is detected and redone, not an error
            with np.errstate(over="ignore", invalid="ignore"):
                state = _folded_block(qa[..., t0:t1, :], ka, v_, keys, tile, exp, d_v)
        if state is None:
            state = _running_block(q[..., t0:t1, :], kT, v_, keys, tile, exp, d_v,
                                   track_max=mode != "none")
        acc, l_run, m_run = state  # (..., bt, d_v), (..., bt, 1), (..., bt, 1)
        # out_t = acc / l. A query that saw no allowed key has l = 0 and acc = 0: output 0.
        if lse is not None:  # lse = m + log l (in the exp's base, then natural); log 0 = -inf
            m0 = np.where(m_run == -np.inf, 0.0, m_run)  # 0 where no key was allowed
            with np.errstate(divide="ignore"):
                lse[..., t0:t1] = ((m0 + log(l_run)) * (LN2 if base2 else 1.0))[..., 0]
        l_run = np.where(l_run == 0, 1.0, l_run).astype(dtype, copy=False)
        out[..., t0:t1, :] = acc / l_run
    return (out, lse) if return_lse else out


def _running_block(qb, kT, v_, keys, tile, exp, d_v, *, track_max):
    """:func:`mha_course.kernels.tiled.running_block` with tricks 1 to 3: the running max of
    FlashAttention-2 (or, if not ``track_max``, the shift 0 that trick 1 proved safe), ``exp``
    or ``exp2``; ``(acc, l, m)`` after the block's last key tile.

    ``qb`` (..., bt, d_k) scaled queries, ``kT`` (..., d_k, S), ``v_`` (..., S, d_v [+ 1]): with
    a column of ones ``acc`` holds ``l`` in its last column and one rescaling covers both.
    """
    ones = v_.shape[-1] == d_v + 1
    dtype = qb.dtype
    acc = np.zeros((*qb.shape[:-1], v_.shape[-1]), dtype=dtype)  # (..., bt, d_v [+ 1])
    l_run = acc[..., d_v:] if ones else np.zeros((*qb.shape[:-1], 1), dtype=dtype)
    m_run = np.full((*qb.shape[:-1], 1), -np.inf if track_max else 0.0, dtype=dtype)
    for s0, s1 in keys:
        # (..., bt, d_k) @ (..., d_k, s1-s0) -> (..., bt, s1-s0): one tile of scores
        scores = qb @ kT[..., s0:s1]
        tile.apply(scores, s0, s1)
        if track_max:
            # m_new = max(m_old, max_s x_s): the running max over all keys seen so far.
            m_new = np.maximum(m_run, scores.max(axis=-1, keepdims=True))
            # A query whose keys so far are all masked still has m_new = -inf; shift it by
            # 0 instead, so exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
            shift = np.where(m_new == -np.inf, 0.0, m_new).astype(dtype, copy=False)
            scores -= shift  # x_s - m_new <= 0, in place in the score tile
            # alpha = exp(m_old - m_new) <= 1 re-expresses the old sums relative to the
            # new max: l = alpha·l and acc = alpha·acc (one array when l is its last column).
            alpha = exp(m_run - shift)
            acc *= alpha
            if not ones:
                l_run *= alpha
            m_run = m_new
        p = exp(scores, out=scores)  # p_s = exp(x_s - m), in place
        # acc += [Σ_s p_s v_s | Σ_s p_s]: (..., bt, s1-s0) @ (..., s1-s0, d_v [+ 1])
        acc += p @ v_[..., s0:s1, :]
        if not ones:
            l_run += p.sum(axis=-1, keepdims=True)
    return acc[..., :d_v], l_run, m_run


def _folded_block(qa_b, ka, v_, keys, tile, exp, d_v):
    """One query block with trick 4: the shift from the first key tile, inside the later
    matmuls. ``(acc, l, m)``, or ``None`` when the block must take the running max instead.

    ``qa_b`` (..., bt, d_k + 1): the scaled queries and a last column this function fills with
    ``-m``; ``ka`` (..., d_k + 1, S): ``kᵀ`` with a row of ones.
    """
    if not keys:
        return None
    ones = v_.shape[-1] == d_v + 1
    (s0, s1), rest = keys[0], keys[1:]
    qa_b[..., -1] = 0.0  # the first tile: plain scores
    scores = qa_b @ ka[..., s0:s1]  # (..., bt, s1-s0)
    tile.apply(scores, s0, s1)
    m_run = scores.max(axis=-1, keepdims=True)  # (..., bt, 1): each query's shift for good
    if not np.isfinite(m_run).all():  # a query with no allowed key here (or inf / NaN input)
        return None
    scores -= m_run
    p = exp(scores, out=scores)
    acc = p @ v_[..., s0:s1, :]  # (..., bt, d_v [+ 1])
    l_run = acc[..., d_v:] if ones else p.sum(axis=-1, keepdims=True)
    qa_b[..., -1] = -m_run[..., 0]  # from now on the matmul subtracts the shift
    for s0, s1 in rest:
        # [q | -m] @ [kᵀ ; 1] = x_s - m: (..., bt, d_k + 1) @ (..., d_k + 1, s1-s0)
        scores = qa_b @ ka[..., s0:s1]
        tile.apply(scores, s0, s1)
        p = exp(scores, out=scores)  # exp(x_s - m); may exceed 1, which is fine while finite
        acc += p @ v_[..., s0:s1, :]
        if not ones:
            l_run += p.sum(axis=-1, keepdims=True)
    if not (np.isfinite(acc).all() and np.isfinite(l_run).all()):  # scores far above m: redo
        return None
    return acc[..., :d_v], l_run, m_run
