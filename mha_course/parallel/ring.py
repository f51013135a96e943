"""Ring attention: a long sequence split over p devices, its key/value blocks passed around.

Taught in ``notebooks/11_parallel.ipynb`` (section 3); the causal layouts and
:func:`load_balance` in ``notebooks/deep_dives/11a_parallel_at_scale.ipynb`` (section 3).

Ring attention (Liu, Zaharia & Abbeel 2023) gives each device a block of the sequence: its
queries, keys and values. In ``p`` steps, each device attends with its queries to the key/value
block it holds, keeps the partial output and its log-sum-exp, and passes the key/value block to
the next device on the ring (:meth:`~mha_course.parallel.collectives.Cluster.ring_pass`); after
``p`` steps every query has seen every key. The partial results are merged exactly as lesson
07's combine step merges two halves of the keys: :func:`merge_partials`, in the
``(out, lse)`` form the ring-flash-attention code and FlashAttention's ``softmax_lse`` use.

With a causal mask the plain layout (device ``i`` holds positions ``i·T/p .. (i+1)·T/p - 1``)
is unbalanced: device 0's queries see only its own block, the last device's see every block,
and each step lasts as long as the busiest device. Two layouts fix it (:func:`sequence_layout`):

- **zig-zag** (the zigzag ring of ``zhuzilin/ring-flash-attention`` and of Llama 3's context
  parallelism): cut the sequence into ``2p`` chunks and give device ``i`` chunks ``i`` and
  ``2p - 1 - i``, an early one and a late one;
- **striped** (Brandon et al. 2023, "Striped attention"): device ``i`` holds positions
  ``i, i + p, i + 2p, ...``.

The work is counted as the (query, key) pairs a device scores in a step, the pairs an exact
block-sparse kernel must compute (a block with none is skipped).
"""

from __future__ import annotations

import numpy as np

from .. import tiled_attention
from .._validate import fail, validate_positive_int
from ..heads import group_heads, kv_for_groups
from .collectives import Meta, is_meta

#: The sequence layouts :func:`sequence_layout` knows.
LAYOUTS = ("contiguous", "zigzag", "striped")


def sequence_layout(T, p, layout: str = "contiguous") -> list[np.ndarray]:
    """The positions each of ``p`` devices holds, for a sequence of ``T`` tokens.

    Parameters
    ----------
    T, p : int
    layout : {"contiguous", "zigzag", "striped"}

    Returns
    -------
    list of p int arrays, ascending
        Together a permutation of ``0 .. T-1``.

    Raises
    ------
    ValueError
        If ``layout`` is unknown or ``p > T`` (a device with no token).

    Examples
    --------
    >>> [a.tolist() for a in sequence_layout(8, 2, "zigzag")]
    [[0, 1, 6, 7], [2, 3, 4, 5]]
    >>> [a.tolist() for a in sequence_layout(8, 2, "striped")]
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    """
    func = "sequence_layout"
    T, p = validate_positive_int(func, "T", T), validate_positive_int(func, "p", p)
    if layout not in LAYOUTS:
        raise fail(func, f"layout={layout!r}; expected one of {', '.join(LAYOUTS)}")
    if p > T:
        raise fail(func, f"p={p} devices for T={T} tokens: a device would hold nothing")
    pos = np.arange(T)
    if layout == "contiguous":
        return np.array_split(pos, p)
    if layout == "striped":
        return [pos[i::p] for i in range(p)]
    chunks = np.array_split(pos, 2 * p)
    return [np.concatenate([chunks[i], chunks[2 * p - 1 - i]]) for i in range(p)]


def merge_partials(out_a, lse_a, out_b, lse_b) -> tuple[np.ndarray, np.ndarray]:
    """Merge two normalised partial attention results over disjoint sets of keys.

    ``out_a`` (..., T, d_v) is attention over keys ``A`` alone and ``lse_a`` (..., T) the
    log-sum-exp of those scores (natural log); likewise for ``B``. Over ``A ∪ B``::

        lse = log(exp(lse_a) + exp(lse_b))          (np.logaddexp: no overflow)
        out = exp(lse_a - lse) · out_a + exp(lse_b - lse) · out_b

    the weights being each part's share of the softmax's denominator. A query with no key in
    one part (``lse = -inf``) takes the other part whole; with none in either, 0 and ``-inf``.

    Examples
    --------
    >>> out, lse = merge_partials(np.ones((1, 2)), np.zeros(1), np.zeros((1, 2)), np.zeros(1))
    >>> out.tolist(), np.round(lse, 4).tolist()
    ([[0.5, 0.5]], [0.6931])
    """
    lse = np.logaddexp(lse_a, lse_b)  # -inf only where both parts are empty
    safe = np.where(np.isfinite(lse), lse, 0.0)  # so that -inf - lse is -inf, never NaN
    w_a = np.exp(lse_a - safe)[..., None]  # (..., T, 1): part A's share, 0 if A is empty
    w_b = np.exp(lse_b - safe)[..., None]
    return w_a * out_a + w_b * out_b, lse


def pairs_allowed(q_pos, k_pos, causal: bool) -> int:
    """The (query, key) pairs a block scores: every pair, or with ``causal`` those with
    ``k <= q`` (counted from the sorted positions, without building the mask)."""
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    if not causal:
        return int(q_pos.size * k_pos.size)
    return int(np.searchsorted(np.sort(k_pos), q_pos, side="right").sum())


def grouped(q, k, v):
    """GQA: (..., h, T, d) queries over (..., g, S, d) keys as (..., g, h/g, T, d) over
    (..., g, 1, S, d), so one attention call broadcasts each K/V head over its group."""
    h, g = q.shape[-3], k.shape[-3]
    if h == g:
        return q, k, v
    if h % g:
        raise fail("ring_attention", f"q has {h} heads and k {g}: the K/V heads must divide "
                                     "the query heads")
    return group_heads(q, g), kv_for_groups(k), kv_for_groups(v)


def block_attention(q, k, v, q_pos, k_pos, causal: bool, pairs=None):
    """One device's step: its queries against one key/value block.

    Returns ``(out, lse)`` (the block's normalised output and log-sum-exp, shaped like ``q``'s
    rows) or ``None`` when the causal mask allows no pair (the block is skipped). ``pairs``, the
    block's :func:`pairs_allowed` when the caller has counted them already, saves a count.
    """
    if causal and (pairs_allowed(q_pos, k_pos, True) if pairs is None else pairs) == 0:
        return None
    if is_meta(q):
        return Meta(q.shape[:-1] + (v.shape[-1],), q.dtype), Meta(q.shape[:-1], q.dtype)
    qg, kg, vg = grouped(q, k, v)
    mask = (np.asarray(q_pos)[:, None] >= np.asarray(k_pos)[None, :]) if causal else None
    out, lse = tiled_attention(qg, kg, vg, mask=mask, return_lse=True)
    return out.reshape(*q.shape[:-1], v.shape[-1]), lse.reshape(q.shape[:-1])


def ring_attention(cluster, q_shards, k_shards, v_shards, positions, causal: bool = False):
    """Attention over a sequence split across ``cluster.p`` devices, by ring attention.

    Parameters
    ----------
    cluster : Cluster
        The devices; every key/value block passed along the ring is counted there.
    q_shards : list of p arrays (..., h, T_i, d_k)
        Device ``i``'s queries, at the positions ``positions[i]``.
    k_shards, v_shards : list of p arrays (..., g, T_i, d_k) / (..., g, T_i, d_v)
        Its keys and values (``g`` K/V heads, GQA allowed). Placeholders
        (:class:`~mha_course.parallel.collectives.Meta`) count the bytes and the work without
        computing anything.
    positions : list of p int arrays
        The positions each device holds (:func:`sequence_layout`).
    causal : bool
        Query at position ``t`` sees keys at positions ``<= t``.

    Returns
    -------
    out : list of p arrays (..., h, T_i, d_v)
    lse : list of p arrays (..., h, T_i)
    work : ndarray of int, shape (p, p)
        ``work[step, i]``: the (query, key) pairs device ``i`` scored at ``step`` (per head).

    Examples
    --------
    >>> from mha_course.parallel.collectives import Cluster
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(1, 8, 4)) for _ in range(3))
    >>> pos = sequence_layout(8, 2)
    >>> out, lse, work = ring_attention(Cluster(2), [q[..., i, :] for i in pos],
    ...                                 [k[..., i, :] for i in pos], [v[..., i, :] for i in pos],
    ...                                 pos, causal=True)
    >>> work.tolist()
    [[10, 10], [0, 16]]
    """
    p = cluster.p
    shards = [list(s) for s in (q_shards, k_shards, v_shards, positions)]
    if any(len(s) != p for s in shards):
        raise fail("ring_attention", f"expected p={p} shards of q, k, v and positions; got "
                                     f"{[len(s) for s in shards]}")
    q_shards, k_cur, v_cur, positions = shards
    out, lse = [None] * p, [None] * p
    work = np.zeros((p, p), dtype=np.int64)
    for step in range(p):
        for i in range(p):
            src = (i - step) % p  # the device whose key/value block device i holds now
            work[step, i] = pairs_allowed(positions[i], positions[src], causal)
            part = block_attention(q_shards[i], k_cur[i], v_cur[i], positions[i],
                                   positions[src], causal, pairs=work[step, i])
            if part is None:
                continue
            if out[i] is None or is_meta(part[0]):
                out[i], lse[i] = part
            else:
                out[i], lse[i] = merge_partials(out[i], lse[i], *part)
        if step < p - 1:  # pass the key/value blocks one device along the ring
            k_cur, v_cur = cluster.ring_pass(k_cur), cluster.ring_pass(v_cur)
    return out, lse, work


def load_balance(work) -> dict[str, float]:
    """How evenly ``work`` (steps, devices) is spread, when every step waits for its slowest
    device (the ring is synchronous: a block moves on only when its next holder is ready).

    Returns ``total`` pairs, ``time`` (the sum over steps of the busiest device's pairs),
    ``ideal`` (``total / p``, every device equally busy) and ``efficiency = ideal / time``.

    Examples
    --------
    >>> load_balance(np.array([[10, 10], [0, 16]]))
    {'total': 36, 'time': 26, 'ideal': 18.0, 'efficiency': 0.6923}
    """
    work = np.asarray(work)
    total, time = int(work.sum()), int(work.max(axis=1).sum())
    ideal = total / work.shape[1]
    return {"total": total, "time": time, "ideal": ideal,
            "efficiency": round(ideal / time, 4) if time else 1.0}
