"""Flash-Decoding (split-KV): one query over a long cache, split into chunks and combined.

Taught in ``notebooks/10_serving.ipynb`` (§5); the combine is lesson 07's log-sum-exp
(:func:`~mha_course.tiled_attention` with ``return_lse=True``). Dao, Haziza, Massa & Sizov,
*Flash-Decoding for long-context inference* (PyTorch blog, October 2023): a decode step has one
query per head, so FlashAttention's parallelism over batch × heads × query blocks gives a
GPU only ``batch · heads`` pieces of work, far fewer than its SMs at batch 1; with grouped
queries only ``batch · kv_heads``, since the ``h/g`` queries of a group share one block
(:func:`occupancy`). Splitting the cache's keys into ``n_splits`` chunks multiplies the pieces
by ``n_splits``; each returns its partial output ``o_j`` (normalised over its own keys) and
log-sum-exp ``ℓ_j``, and one small reduction combines them exactly::

    out = Σ_j exp(ℓ_j - ℓ) o_j,   ℓ = log Σ_j exp(ℓ_j)

(the weights ``exp(ℓ_j - ℓ)`` are each chunk's share of the softmax's denominator).
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import fail, refuse_layer_scale, validate_positive_int
from ..heads import group_heads, kv_for_groups, merge_heads, ungroup_heads
from ..kernels.tiled import tiled_attention
from ..kv_cache import KVCache
from ..parallel.ring import merge_partials


def chunk_bounds(S: int, n_splits: int) -> list[tuple[int, int]]:
    """``n_splits`` contiguous chunks of ``S`` keys, as equal as possible (none empty).

    Examples
    --------
    >>> chunk_bounds(10, 3)
    [(0, 3), (3, 7), (7, 10)]
    """
    n = validate_positive_int("chunk_bounds", "n_splits", n_splits)
    if n > S:
        raise fail("chunk_bounds", f"n_splits={n} is more than the S={S} keys to split")
    edges = np.linspace(0, S, n + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def split_kv_partials(q, k, v, n_splits: int):
    """Each chunk's partial attention: ``(outs, lses)``, one entry per chunk.

    q (..., h, T, d_k) over k (..., g, S, d_k), v (..., g, S, d_v), query head ``i`` reading
    K/V head ``i // (h/g)``; no mask (every cached key is visible to a decoding query).
    ``outs[j]`` (..., h, T, d_v) is normalised over chunk ``j``'s keys only, ``lses[j]``
    (..., h, T) the log-sum-exp of its scaled scores.
    """
    g = k.shape[-3]
    outs, lses = [], []
    for a, b in chunk_bounds(k.shape[-2], n_splits):
        out, lse = tiled_attention(group_heads(q, g), kv_for_groups(k[..., a:b, :]),
                                   kv_for_groups(v[..., a:b, :]), block_size=max(1, b - a),
                                   return_lse=True)  # (..., g, h/g, T, d_v), (..., g, h/g, T)
        outs.append(ungroup_heads(out))
        lses.append(ungroup_heads(lse[..., None])[..., 0])
    return outs, lses


def combine_partials(outs, lses):
    """Merge chunks' partial outputs by their log-sum-exps: ``(out, lse)`` of all the keys.

    Ring attention's :func:`~mha_course.parallel.ring.merge_partials`, folded over the chunks:
    a chunk with no visible key (``lse = -inf``) adds nothing, never a NaN.

    Examples
    --------
    >>> from mha_course import scaled_dot_product_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=shape) for shape in ((4, 1, 8), (4, 50, 8), (4, 50, 6)))
    >>> out, _ = combine_partials(*split_kv_partials(q, k, v, n_splits=5))
    >>> bool(np.allclose(out, scaled_dot_product_attention(q, k, v)[0]))
    True
    """
    out, lse = outs[0], lses[0]
    for out_j, lse_j in zip(outs[1:], lses[1:], strict=True):
        out, lse = merge_partials(out, lse, out_j, lse_j)
    return out, lse


def split_kv_decode_step(layer, x_t, cache, n_splits: int):
    """``layer.decode_step(x_t, cache)``'s output, its attention done by split-KV chunks.

    Projects the new token, rotates it at ``cache.tokens_seen`` and appends its key and value
    to the :class:`~mha_course.KVCache` (as ``decode_step`` does), then attends over the cache
    in ``n_splits`` chunks and combines them. x_t (..., 1, d_model) -> out_t (..., 1, d_model).
    """
    refuse_layer_scale("split_kv_decode_step", layer)
    x_t = KVCache.check_step("split_kv_decode_step", layer, x_t, cache, one=True)
    # the layer's own pieces, as its step: project (biases), split heads, RoPE at the position
    q, k, v = layer._heads(*layer._project(x_t, x_t, x_t.dtype))  # (..., h | g, T, d_k | d_v)
    positions = cache.tokens_seen + np.arange(x_t.shape[-2])
    q, k = layer._rope(q, positions), layer._rope(k, positions)
    cache.append(k, v)
    out, _ = combine_partials(*split_kv_partials(q, cache.keys, cache.values, n_splits))
    return layer._output(merge_heads(out), out.dtype)  # (..., 1, d_model)


def occupancy(batch: int, kv_heads: int, n_splits: int, sms: int) -> float:
    """Share of a GPU's SMs that ``batch · kv_heads · n_splits`` thread blocks keep busy.

    The grid of a grouped-query decode step counts **K/V heads**, not query heads:
    FlashAttention folds the ``h/g`` query heads that share a K/V head into the query axis
    (flash-attn ``csrc/flash_attn/flash_api.cpp``, ``mha_fwd`` and ``mha_fwd_kvcache``: when
    ``seqlen_q == 1`` and ``num_heads > num_heads_k``, ``seqlenq_ngroups_swapped`` reshapes q to
    ``(b, ngroups, nheads_kv, d)``, sets ``seqlen_q = ngroups`` and ``num_heads = num_heads_k``),
    so the ``h/g`` queries of a group form one block of query rows that reads its K/V head once.
    One block per SM at a time (this simple model; flash-attn's split heuristic counts two of its
    128-thread blocks per SM): the blocks run in ``ceil(work / sms)`` waves, and the SMs idle for
    what the last wave leaves empty.

    Examples
    --------
    >>> [round(occupancy(batch=1, kv_heads=8, n_splits=s, sms=132), 3) for s in (1, 16, 17)]
    [0.061, 0.97, 0.515]
    """
    work = batch * kv_heads * n_splits
    return work / (sms * math.ceil(work / sms))


def splits_to_fill(batch: int, kv_heads: int, sms: int) -> int:
    """The most chunks that still fit one wave: ``sms // (batch · kv_heads)`` (at least 1).

    One more chunk would start a second wave that leaves most SMs idle (:func:`occupancy`).

    Examples
    --------
    >>> splits_to_fill(1, 8, 132), splits_to_fill(64, 8, 132)
    (16, 1)
    """
    return max(1, sms // (batch * kv_heads))
