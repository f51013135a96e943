"""Tiled attention with an online softmax: the idea behind FlashAttention, in NumPy.

Taught in ``notebooks/07_flash_attention.ipynb``; the docstring of :func:`tiled_attention` and
the comments in its loops are the short version.

Standard attention (:func:`mha_course.scaled_dot_product_attention`) builds the whole
(..., T, S) score matrix, softmaxes it and multiplies it by ``v``: memory grows as T·S, and the
scores and weights make a round trip through main memory. Tiled attention gets the same output
while holding only one (..., block, block) tile of scores at a time, so the extra memory grows
as T·d_v (the output) plus one tile. With ``return_lse=True`` it also returns the one number per
query a backward pass needs to recompute the weights: the log-sum-exp of the query's scores.

Two loops live here, beside each other as the course's "one attention path" asks: the
*running-max* loop (:func:`_running_block`), FlashAttention-2's forward line by line (the one the
lesson writes inline and the tile stepper draws), and the *shift-in-the-matmul* loop
(:func:`_folded_block`), the fast one for scores too large to skip the max, tested equal to it.
:class:`Tricks` switches each saving on or off, for the lesson's ablation.

Shape letters as in :mod:`mha_course.attention`: ``T`` query positions, ``S`` key/value
positions, ``d_k`` query/key width, ``d_v`` value width, ``...`` any leading batch axes (batch,
heads). Masks are boolean with ``True`` = *may attend*.
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

from ._validate import fail, validate_positive_int
from .attention import validate_qkv
from .lean import exp_is_safe

#: log2(e): exp(x) = 2 ** (x · LOG2E). With base 2 the loop holds base-2 scores.
LOG2E = math.log2(math.e)
#: ln(2): a base-2 log-sum-exp times LN2 is the natural one.
LN2 = math.log(2.0)


@dataclass(frozen=True)
class Tricks:
    """Which savings :func:`tiled_attention` may use; each gives the same output up to rounding.

    The defaults are what the package uses; lesson 07 turns them off one at a time to measure
    what each is worth (``Tricks(max_shortcut=False)`` and so on).

    Attributes
    ----------
    max_shortcut : bool, default True
        1. Skip the running max when Cauchy-Schwarz proves no ``exp`` can overflow or
        underflow (:func:`mha_course.lean.exp_is_safe`).
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


def tiled_attention(q, k, v, *, mask=None, causal=False, block_size=256, return_lse=False,
                    on_tile=None, tricks=None):
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
    tile of scores: besides the output, the function holds ``q``, ``v`` with one more column and
    a few tiles, about T·(d_k + d_v) + 2·block² numbers per batch element and head, instead of
    T·S. With ``causal=True`` a key block that lies wholly above the diagonal of a query block
    (every key in the future of every query) is skipped, not computed and masked: for T = S
    about half the tiles are never visited.

    Four savings on the passes that are not matrix products, each giving the same result up
    to rounding (:class:`Tricks` switches them; lesson 07 measures each, ``benchmarks/tiled.py``
    times the whole against torch with the tiles' matrix products alone as the floor):

    1. **No running max when it cannot matter.** By Cauchy-Schwarz every score obeys
       ``|x_s| <= max_t |q_t| · max_s |k_s| / √d_k``; when that bound is small enough that no
       ``exp`` can overflow or underflow (:func:`mha_course.lean.exp_is_safe`), the shift is 0
       for every query: no max pass, no subtraction, no rescaling.
    2. **The row sum inside the second matmul.** ``v`` gets a last column of ones, so
       ``p @ [v | 1]`` yields ``Σ_s p_s v_s`` and ``l``'s increment ``Σ_s p_s`` in one BLAS call
       instead of a separate sum over the tile.
    3. **Base 2** where NumPy's ``exp2`` is vectorised: ``exp(x) = 2 ** (x · log2 e)``, with
       ``log2 e`` folded into the scale of ``q`` (as FlashAttention's kernels do), so the loop
       holds base-2 scores and maxima.
    4. **The shift inside the first matmul, when the max is needed** (large scores, which a
       trained model's often are). The shift need not be the running max: any per-query ``m``
       with every ``exp(x_s - m)`` finite gives the same ``acc / l``, and ``l >= 1`` as soon as
       ``m`` is the max of *some* of the query's scores. So each query block takes ``m`` from
       its first key tile (max, subtract, as above), appends ``-m`` to ``q`` as a last column
       and a row of ones to ``kᵀ``, and every later tile's matmul yields ``x_s - m`` directly:
       no max pass, no subtraction, no rescaling of ``acc``. A later score above the first
       tile's max by nearly ``ln(largest float)`` (88 for float32) would overflow the sums, so
       the block checks that its ``acc`` and ``l`` are finite and otherwise is redone with the
       running max, as is a block in which some query has no allowed key in its first tile.

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
        ``benchmarks/tiled.py`` measures each; 256 was fastest for (8, n, 64) float32 at
        n = 2048 and 4096 (one (8, 256, 256) tile is 2 MiB, 256 KiB per head).
    return_lse : bool, default False
        Also return the log-sum-exp of each query's scaled, masked scores.
    on_tile : callable, optional
        Called after each tile with a dict: ``"queries"`` ``(t0, t1)`` and ``"keys"``
        ``(s0, s1)``, the block's rows and columns; ``"m"`` (..., t1-t0) the running max of the
        scores seen so far (``-inf`` where none is allowed yet), ``"l"`` (..., t1-t0) the
        running sum and ``"acc"`` (..., t1-t0, d_v) the unnormalised output, all in natural
        units and copies. For teaching (lesson 07's tile stepper): with it the running max is
        always kept, so ``"m"`` is the true running max.
    tricks : Tricks, optional
        Which of the four savings to use; default ``Tricks()``, all of them.

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
        ``block_size`` is not an integer >= 1, or ``tricks`` is not a :class:`Tricks`.

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
    #    running max. The tile stepper (on_tile) always sees the running max.
    if on_tile is not None or not (tricks.max_shortcut and exp_is_safe(q, kT, dtype)):
        mode = "folded" if tricks.shift_in_matmul and on_tile is None else "running"
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
        keys = list(_key_blocks(t0, t1, T, S, block, causal))
        tile = _Tile(mask, causal, t0, t1, S - T)
        state = None
        if mode == "folded":  # an overflow here is detected and redone, not an error
            with np.errstate(over="ignore", invalid="ignore"):
                state = _folded_block(qa[..., t0:t1, :], ka, v_, keys, tile, exp, d_v)
        if state is None:
            state = _running_block(q[..., t0:t1, :], kT, v_, keys, tile, exp, d_v,
                                   track_max=mode != "none", on_tile=on_tile,
                                   to_natural=LN2 if base2 else 1.0)
        acc, l_run, m_run = state  # (..., bt, d_v), (..., bt, 1), (..., bt, 1)
        # out_t = acc / l. A query that saw no allowed key has l = 0 and acc = 0: output 0.
        if lse is not None:  # lse = m + log l (in the exp's base, then natural); log 0 = -inf
            m0 = np.where(m_run == -np.inf, 0.0, m_run)  # 0 where no key was allowed
            with np.errstate(divide="ignore"):
                lse[..., t0:t1] = ((m0 + log(l_run)) * (LN2 if base2 else 1.0))[..., 0]
        l_run = np.where(l_run == 0, 1.0, l_run).astype(dtype, copy=False)
        out[..., t0:t1, :] = acc / l_run
    return (out, lse) if return_lse else out


class _Tile:
    """Masks one (..., t1-t0, s1-s0) tile of scores in place: the user's mask and the future."""

    def __init__(self, mask, causal: bool, t0: int, t1: int, offset: int):
        self.mask, self.causal, self.t0, self.t1, self.offset = mask, causal, t0, t1, offset

    def apply(self, scores: np.ndarray, s0: int, s1: int) -> None:
        if self.mask is not None:
            np.copyto(scores, -np.inf, where=~_mask_tile(self.mask, self.t0, self.t1, s0, s1))
        if self.causal and s1 - 1 > self.t0 + self.offset:  # crosses the diagonal: hide the future
            # (t1-t0, s1-s0), True where key s lies in the future of query t
            future = np.arange(s0, s1) > np.arange(self.t0, self.t1)[:, None] + self.offset
            np.copyto(scores, -np.inf, where=future)


def _running_block(qb, kT, v_, keys, tile, exp, d_v, *, track_max, on_tile, to_natural):
    """One query block with the running max of FlashAttention-2 (or, if not ``track_max``, with
    the shift 0 that trick 1 proved safe): ``(acc, l, m)`` after the block's last key tile.

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
        if on_tile is not None:
            on_tile(_tile_state(tile.t0, tile.t1, s0, s1, m_run, l_run, acc[..., :d_v],
                                to_natural))
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


def _tile_state(t0, t1, s0, s1, m_run, l_run, acc, to_natural) -> dict:
    """What ``on_tile`` receives: the running quantities in natural units, as copies."""
    return {
        "queries": (t0, t1),
        "keys": (s0, s1),
        "m": m_run[..., 0] * to_natural,  # base-2 max -> natural (-inf stays -inf)
        "l": l_run[..., 0].copy(),
        "acc": acc.copy(),
    }


def _key_blocks(t0: int, t1: int, T: int, S: int, block: int, causal: bool):
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
