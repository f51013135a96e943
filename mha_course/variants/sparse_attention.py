"""Sparse attention that chooses its keys: NSA's blocks (compressed, selected, sliding) and DSA's
top-k keys per query from a light indexer; the weight mass each keeps and the FLOPs it saves.

Taught in ``notebooks/13_attention_2025.ipynb``.

- **NSA** (Yuan et al. 2025, *Native Sparse Attention*, DeepSeek): three branches per query,
  mixed by gates ``g ∈ [0, 1]``: attention over *compressed* blocks (each block of keys and values
  summarised into one: the paper learns the summary with a small MLP, :func:`compress_kv` takes
  the mean), attention over the tokens of the *selected* blocks (the blocks the compressed
  attention weighted most, plus the first block and the query's own), and a *sliding window*.
- **DSA** (DeepSeek-V3.2's sparse attention): a *lightning indexer* scores every earlier token,
  ``I_{t,s} = Σ_j w_{t,j} · ReLU(q^I_{t,j} · k^I_s)`` with a few small indexer heads, and each
  query attends to its top-k tokens only (:func:`lightning_index`, :func:`topk_mask`). The index
  has no head axis: one selection per query, shared by all the heads (DeepSeek-V3.2-Exp's
  ``inference/model.py``: ``Indexer.forward`` returns ``topk_indices`` of shape (batch, T, k) and
  ``MLA.forward`` adds ``index_mask.unsqueeze(2)`` to every head's scores), so the best a DSA
  selection of k keys can keep is the top-k of the weights summed over the heads.

:func:`mass_kept` is what a sparse pattern keeps of the full attention: the share of each
query's softmax weight that falls on the kept keys.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, validate_mask, validate_positive_int
from ..attention import causal_mask, sdpa_unchecked, sliding_window_mask, validate_qkv

__all__ = ["compress_kv", "lightning_index", "mass_kept", "nsa_attention", "select_blocks",
           "sparse_flops", "topk_mask"]


def compress_kv(k, v, block: int, stride: int | None = None):
    """Summarise keys and values block by block (the mean of each block).

    Parameters
    ----------
    k : ndarray of float, shape (..., S, d_k)
    v : ndarray of float, shape (..., S, d_v)
    block : int
        Tokens per block.
    stride : int, optional
        Distance between block starts (default ``block``: blocks do not overlap).

    Returns
    -------
    k_cmp : ndarray, shape (..., n_blocks, d_k)
    v_cmp : ndarray, shape (..., n_blocks, d_v)
    ends : ndarray of int, shape (n_blocks,)
        The last position in each block: query ``t`` may read block ``i`` once ``ends[i] <= t``.

    Examples
    --------
    >>> k_c, v_c, ends = compress_kv(np.arange(8.0)[:, None], np.ones((8, 2)), 4)
    >>> k_c.ravel().tolist(), ends.tolist()
    ([1.5, 5.5], [3, 7])
    """
    func = "compress_kv"
    k = as_float_array(func, "k", k)
    v = as_float_array(func, "v", v)
    if k.ndim < 2 or v.ndim < 2 or k.shape[-2] != v.shape[-2]:
        raise fail(func, f"k has shape {k.shape} and v {v.shape}; expected (..., S, d_k) and "
                         "(..., S, d_v) with the same S")
    block = validate_positive_int(func, "block", block)
    stride = block if stride is None else validate_positive_int(func, "stride", stride)
    S = k.shape[-2]
    if block > S:
        raise fail(func, f"block={block} is longer than the S={S} keys")
    starts = np.arange(0, S - block + 1, stride)
    idx = starts[:, None] + np.arange(block)  # (n_blocks, block)
    return k[..., idx, :].mean(axis=-2), v[..., idx, :].mean(axis=-2), starts + block - 1


def select_blocks(importance, n_select: int, block: int, T: int, S: int | None = None,
                  *, first: bool = True, local: bool = True) -> np.ndarray:
    """NSA's selection: each query keeps the ``n_select`` blocks of keys it ranks highest.

    Parameters
    ----------
    importance : ndarray of float, shape (..., T, n_blocks)
        A score per block (NSA: the compressed attention's weights, summed over the heads of a
        group when they share a selection).
    n_select : int
        Blocks kept per query, counting the forced ones.
    block : int
        Tokens per block (blocks start at 0, block, 2·block, ...).
    T, S : int
        Queries and keys; queries are the last ``T`` of ``S`` positions (bottom-right).
    first, local : bool
        Always keep block 0 and the query's own block (NSA keeps the initial block and the
        local ones).

    Returns
    -------
    ndarray of bool, shape (..., T, S)
        True where query ``t`` keeps key ``s``: ``s`` lies in a kept block and ``s <= t``.

    Examples
    --------
    >>> imp = np.array([[0.0, 0.0, 1.0, 0.0]])  # one query at position 15, four blocks of 4
    >>> select_blocks(imp, 2, 4, 1, 16, first=False, local=True).astype(int).tolist()
    [[0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]]
    """
    func = "select_blocks"
    imp = as_float_array(func, "importance", importance)
    n_select = validate_positive_int(func, "n_select", n_select)
    block = validate_positive_int(func, "block", block)
    S = T if S is None else S
    causal = causal_mask(T, S)  # validates T and S
    n_blocks = -(-S // block)
    if imp.ndim < 2 or imp.shape[-2:] != (T, n_blocks):
        raise fail(func, f"importance has shape {imp.shape}; expected (..., T, n_blocks) = "
                         f"(..., {T}, {n_blocks})")
    pos = np.arange(T) + (S - T)  # (T,) each query's position
    own = pos // block  # (T,) the block holding the query
    reachable = np.arange(n_blocks)[None, :] <= own[:, None]  # (T, n_blocks): started already
    score = np.where(reachable, imp, -np.inf)
    forced = np.zeros((T, n_blocks), dtype=bool)
    if first:
        forced[:, 0] = True
    if local:
        forced[np.arange(T), own] = True
    score = np.where(forced, np.inf, score)
    order = np.argsort(-score, axis=-1, kind="stable")[..., :n_select]  # (..., T, n_select)
    keep_block = np.zeros(score.shape, dtype=bool)
    np.put_along_axis(keep_block, order, True, axis=-1)
    keep_block &= np.isfinite(score) | forced  # a query may reach fewer than n_select blocks
    token_block = np.arange(S) // block  # (S,)
    return keep_block[..., token_block] & causal


def nsa_attention(q, k, v, *, block: int, n_select: int, window: int, gates=None,
                  shared_axis: int | None = None):
    """NSA's three branches on one attention's queries, keys and values, mixed by gates.

    Parameters
    ----------
    q : ndarray of float, shape (..., T, d_k)
    k : ndarray of float, shape (..., S, d_k)
    v : ndarray of float, shape (..., S, d_v)
        Causal, queries the last ``T`` of ``S`` positions.
    block : int
        Compression and selection block (NSA lets them differ; one size here).
    n_select : int
        Blocks each query keeps (with the first block and its own).
    window : int
        The sliding branch's window.
    gates : ndarray of float, shape (..., T, 3), optional
        ``(g_cmp, g_sel, g_win)`` per query, each in [0, 1] (NSA: a sigmoid of an MLP of the
        input). Default: 1 each.
    shared_axis : int, optional
        An axis of ``q``'s batch axes (e.g. the head axis of a GQA group) over which the
        importance is summed, so every query on it keeps the same blocks (NSA shares them
        within a group, for the kernel's sake).

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
    parts : dict
        ``cmp``, ``sel``, ``win``: the three branches' outputs; ``selected``: the bool
        (..., T, S) pattern of the selected branch; ``importance`` (..., T, n_blocks).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(16, 4)) for _ in range(3))
    >>> out, parts = nsa_attention(q, k, v, block=4, n_select=2, window=4)
    >>> out.shape, parts["selected"].sum(axis=-1)[-1].item()
    ((16, 4), 8)
    """
    func = "nsa_attention"
    q, k, v, _m, _b, (T, S, d_k, _dv) = validate_qkv(func, q, k, v, None)
    k_cmp, v_cmp, ends = compress_kv(k, v, block)
    pos = np.arange(T) + (S - T)
    cmp_mask = ends[None, :] <= pos[:, None]  # (T, n_full_blocks): whole block in the past
    # The three branches are scaled dot-product attentions (checked above, so their kernel) over
    # other keys or under other masks: compressed blocks, selected blocks, the window.
    o_cmp, p_cmp = sdpa_unchecked(q, k_cmp, v_cmp, cmp_mask)
    n_blocks = -(-S // block)
    importance = np.zeros(p_cmp.shape[:-1] + (n_blocks,), dtype=p_cmp.dtype)
    importance[..., : p_cmp.shape[-1]] = p_cmp  # a last, partial block has no summary yet
    if shared_axis is not None:
        importance = np.broadcast_to(importance.sum(axis=shared_axis, keepdims=True),
                                     importance.shape)
    selected = select_blocks(importance, n_select, block, T, S)
    o_sel, _ = sdpa_unchecked(q, k, v, selected)
    o_win, _ = sdpa_unchecked(q, k, v, sliding_window_mask(T, window, S))
    if gates is None:
        g = np.ones(o_sel.shape[:-1] + (3,), dtype=o_sel.dtype)
    else:
        g = as_float_array(func, "gates", gates)
        if g.shape[-1] != 3 or g.shape[-2] != T:
            raise fail(func, f"gates has shape {g.shape}; expected (..., T, 3) with T={T}")
    out = g[..., 0:1] * o_cmp + g[..., 1:2] * o_sel + g[..., 2:3] * o_win
    return out, {"cmp": o_cmp, "sel": o_sel, "win": o_win, "selected": selected,
                 "importance": importance}


def lightning_index(q_index, k_index, w) -> np.ndarray:
    """DSA's index scores ``I_{t,s} = Σ_j w_{t,j} · ReLU(q^I_{t,j} · k^I_s)``.

    Parameters
    ----------
    q_index : ndarray of float, shape (..., T, H_I, d_I)
        The indexer's queries: ``H_I`` small heads per query token.
    k_index : ndarray of float, shape (..., S, d_I)
        One indexer key per token, shared by the indexer heads.
    w : ndarray of float, shape (..., T, H_I)
        Each query's weight on each indexer head.

    Returns
    -------
    ndarray, shape (..., T, S)

    Examples
    --------
    >>> q = np.ones((2, 1, 3)); k = np.array([[1.0, 1, 1], [-1, -1, -1]]); w = np.ones((2, 1))
    >>> lightning_index(q, k, w).tolist()
    [[3.0, 0.0], [3.0, 0.0]]
    """
    func = "lightning_index"
    q = as_float_array(func, "q_index", q_index)
    k = as_float_array(func, "k_index", k_index)
    w = as_float_array(func, "w", w)
    if q.ndim < 3 or k.ndim < 2 or q.shape[-1] != k.shape[-1] or w.shape[-2:] != q.shape[-3:-1]:
        raise fail(func, f"q_index {q.shape}, k_index {k.shape} and w {w.shape}; expected "
                         "(..., T, H_I, d_I), (..., S, d_I) and (..., T, H_I)")
    u = np.einsum("...tjd,...sd->...tjs", q, k)  # (..., T, H_I, S)
    return np.einsum("...tj,...tjs->...ts", w, np.maximum(u, 0.0))


def topk_mask(scores, top_k: int, mask=None) -> np.ndarray:
    """For each query, True on the ``top_k`` highest-scoring allowed keys (all of them when it
    has fewer); ties go to the earlier key.

    Examples
    --------
    >>> topk_mask(np.array([[3.0, 1.0, 2.0, 5.0]]), 2).astype(int).tolist()
    [[1, 0, 0, 1]]
    >>> topk_mask(np.array([[3.0, 1.0, 2.0, 5.0]]), 2,
    ...           np.array([[True, True, False, False]])).astype(int).tolist()
    [[1, 1, 0, 0]]
    """
    func = "topk_mask"
    s = as_float_array(func, "scores", scores)
    top_k = validate_positive_int(func, "top_k", top_k)
    m = validate_mask(func, mask, s.shape, f"scores' shape {s.shape}")
    filled = s if m is None else np.where(m, s, -np.inf)
    k = min(top_k, s.shape[-1])
    order = np.argsort(-filled, axis=-1, kind="stable")[..., :k]
    keep = np.zeros(s.shape, dtype=bool)
    np.put_along_axis(keep, order, True, axis=-1)
    return keep if m is None else keep & np.broadcast_to(m, s.shape)


def mass_kept(weights, keep) -> np.ndarray:
    """The share of each query's attention weight that falls on the kept keys.

    Parameters
    ----------
    weights : ndarray of float, shape (..., T, S)
        The full attention's weights (rows sum to 1).
    keep : ndarray of bool, broadcastable to (..., T, S)

    Returns
    -------
    ndarray, shape (..., T)
        In [0, 1]; 1 when a sparse pattern keeps everything the full attention uses.

    Examples
    --------
    >>> mass_kept(np.array([[0.5, 0.3, 0.2]]), np.array([[True, False, True]])).tolist()
    [0.7]
    """
    w = as_float_array("mass_kept", "weights", weights)
    m = validate_mask("mass_kept", keep, w.shape, f"weights' shape {w.shape}")
    return np.where(m, w, 0.0).sum(axis=-1)


def sparse_flops(T: int, S: int, d_k: int, d_v: int, keys_per_query, *, index_heads: int = 0,
                 d_index: int = 0) -> dict:
    """Score and weighted-sum FLOPs of one head, full against sparse, plus an indexer's.

    Parameters
    ----------
    T, S, d_k, d_v : int
        Causal attention of ``T`` queries (the last of ``S`` positions) over ``S`` keys.
    keys_per_query : int or ndarray of int, shape (T,)
        Keys each query attends to in the sparse pattern.
    index_heads, d_index : int
        DSA's indexer (``H_I`` heads of width ``d_I``): ``2·H_I·d_I`` FLOPs per (query, earlier
        key) pair, plus the weighted sum over heads (``2·H_I``); 0 for no indexer.

    Returns
    -------
    dict
        ``full``: the causal pairs times ``2·(d_k + d_v)``; ``sparse``: the kept pairs times the
        same; ``indexer``; ``ratio``: (sparse + indexer) / full.

    Examples
    --------
    >>> f = sparse_flops(4, 4, 8, 8, 2)
    >>> f["full"], f["sparse"]
    (320, 224)
    """
    for name, n in (("T", T), ("S", S), ("d_k", d_k), ("d_v", d_v)):
        validate_positive_int("sparse_flops", name, n)
    pairs = int(causal_mask(T, S).sum())
    kept = int(np.broadcast_to(np.minimum(keys_per_query, np.arange(T) + (S - T) + 1),
                               (T,)).sum())
    per_pair = 2 * (d_k + d_v)
    indexer = pairs * (2 * index_heads * d_index + 2 * index_heads)
    return {"full": pairs * per_pair, "sparse": kept * per_pair, "indexer": indexer,
            "ratio": (kept * per_pair + indexer) / (pairs * per_pair)}
