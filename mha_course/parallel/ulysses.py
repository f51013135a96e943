"""DeepSpeed-Ulysses: a sequence split over p devices, attended head by head after an all-to-all.

Taught in ``notebooks/11_parallel.ipynb`` (section 4); ring against Ulysses at 128k tokens in
``notebooks/deep_dives/11a_parallel_at_scale.ipynb`` (section 4).

Ulysses (Jacobs et al. 2023) keeps the sequence split across the devices everywhere except
inside attention. Each device projects its ``T / p`` tokens to queries, keys and values for all
heads; an **all-to-all** re-shards them from "my tokens, every head" to "every token, my
``h / p`` heads"; each device runs ordinary (causal) attention over the whole sequence for its
heads; a second all-to-all brings the outputs back to "my tokens, every head", ready for ``W_o``
and the MLP. Four all-to-alls per layer in the forward pass (``q``, ``k``, ``v`` and the output),
each sending ``(p - 1) / p`` of what a device holds: the volume per device falls as ``1 / p``.

The head count bounds it: ``p`` must divide ``h``. With GQA (``g = n_kv_heads < p``) the K/V heads
are repeated to ``p`` before the all-to-all (each device needs the one its query heads read),
so keys and values then cost as much traffic as with ``p`` K/V heads.
"""

from __future__ import annotations

import numpy as np

from .. import causal_mask, scaled_dot_product_attention
from .._validate import fail
from .collectives import Meta, is_meta
from .ring import grouped


def kv_for_ulysses(k, p: int):
    """K or V heads ready for the all-to-all: unchanged when ``p`` divides ``g``; each head
    repeated ``p / g`` times when ``g < p`` (so device ``j`` gets K/V head ``j // (p / g)``, the
    one query heads ``j·h/p ..`` read)."""
    g = k.shape[-3]
    if g % p == 0:
        return k
    if p % g:
        raise fail("ulysses_attention", f"p={p} and n_kv_heads={g}: one must divide the other")
    if is_meta(k):
        return Meta(k.shape[:-3] + (p,) + k.shape[-2:], k.dtype)
    return np.repeat(k, p // g, axis=-3)


def ulysses_attention(cluster, q_shards, k_shards, v_shards, causal: bool = False) -> list:
    """Attention over a sequence held in ``p`` consecutive blocks, by two all-to-alls.

    Parameters
    ----------
    cluster : Cluster
    q_shards : list of p arrays (..., h, T_i, d_k)
        Device ``i``'s queries: block ``i`` of the sequence (consecutive positions), all heads.
    k_shards, v_shards : list of p arrays (..., g, T_i, d_k) / (..., g, T_i, d_v)
        Its keys and values (placeholders count bytes without computing).
    causal : bool

    Returns
    -------
    list of p arrays (..., h, T_i, d_v)
        Device ``i``'s outputs, for its own block of positions and every head.

    Raises
    ------
    ValueError
        If ``p`` does not divide ``h``.

    Examples
    --------
    >>> from mha_course.parallel.collectives import Cluster
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(4, 6, 3)) for _ in range(3))
    >>> cut = lambda a: np.array_split(a, 2, axis=-2)
    >>> out = ulysses_attention(Cluster(2), cut(q), cut(k), cut(v), causal=True)
    >>> want = scaled_dot_product_attention(q, k, v, mask=causal_mask(6))[0]
    >>> bool(np.allclose(np.concatenate(out, axis=-2), want))
    True
    """
    p = cluster.p
    h = q_shards[0].shape[-3]
    if h % p:
        raise fail("ulysses_attention", f"p={p} devices cannot share h={h} heads: Ulysses "
                                        "gives each device h / p whole heads, so p must divide h")
    # 1. sequence-sharded (..., heads, T/p, d) -> head-sharded (..., heads/p, T, d)
    q = cluster.all_to_all(q_shards, split_axis=-3, concat_axis=-2)
    k = cluster.all_to_all([kv_for_ulysses(a, p) for a in k_shards], split_axis=-3,
                           concat_axis=-2)
    v = cluster.all_to_all([kv_for_ulysses(a, p) for a in v_shards], split_axis=-3,
                           concat_axis=-2)
    # 2. ordinary attention over the whole sequence, for this device's heads
    heads = []
    for qi, ki, vi in zip(q, k, v, strict=True):
        if is_meta(qi):
            heads.append(Meta(qi.shape[:-1] + (vi.shape[-1],), qi.dtype))
            continue
        T = qi.shape[-2]
        qg, kg, vg = grouped(qi, ki, vi)
        out = scaled_dot_product_attention(qg, kg, vg, mask=causal_mask(T) if causal else None)[0]
        heads.append(out.reshape(*qi.shape[:-1], vi.shape[-1]))
    # 3. head-sharded -> sequence-sharded, for W_o and the MLP
    return cluster.all_to_all(heads, split_axis=-2, concat_axis=-3)
