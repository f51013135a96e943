"""Attention for a chunk of new tokens against a KV cache: prefill, decode and verify in one.

Taught in ``notebooks/09_tiny_gpt.ipynb`` (cached generation); lesson 06
(``notebooks/06_decoding.ipynb``) decodes one token at a time with
``MultiHeadAttention.decode_step``. A server needs the same step for any number ``T`` of new
tokens: the whole prompt at once (prefill), one token (decode), or ``k`` drafted tokens that a
target model verifies in one pass (speculative decoding). :func:`attend_chunk` is that step, built
from the layer's own pieces (project, split heads, RoPE at offset positions, the cache's
append, :func:`~mha_course.scaled_dot_product_attention` under the bottom-right
:func:`~mha_course.causal_mask`, merge heads, ``W_o``).
"""

from __future__ import annotations

import numpy as np

from ._validate import as_float_array, fail, fmt_shape, validate_shape
from .attention import causal_mask, scaled_dot_product_attention
from .heads import group_heads, kv_for_groups, merge_heads, project, split_heads, ungroup_heads
from .kv_cache import KVCache
from .positions import apply_rope

__all__ = ["attend_chunk"]


def attend_chunk(layer, x, cache: KVCache):
    """One block's causal self-attention for a chunk of ``T >= 1`` new positions, with a cache.

    The chunk sits right after the ``L0 = cache.tokens_seen`` positions the cache holds: its
    queries and keys are rotated at positions ``L0 .. L0 + T - 1``, its keys and values are
    appended, and its queries attend over all ``L = L0 + T`` cached positions under the
    bottom-right :func:`~mha_course.causal_mask` ``(T, L)``: chunk position ``t`` sees the
    cache and the chunk up to itself. ``T = 1`` is ``layer.decode_step``; a whole prompt is a
    prefill; ``k`` drafted tokens are a verification pass.

    Parameters
    ----------
    layer : MultiHeadAttention
    x : ndarray of float, shape (..., T, d_model)
        The chunk's input (after the block's RMSNorm); ``...`` is the cache's batch shape.
    cache : KVCache
        From ``layer.init_cache(...)`` (no rolling window); updated in place.

    Returns
    -------
    out : ndarray, shape (..., T, d_model)
    weights : ndarray, shape (..., h, T, L)

    Raises
    ------
    ValueError
        If the cache is another layer's, has a window, or has no room for ``T`` more positions
        (then it is left unchanged).
    """
    func = "attend_chunk"
    if not isinstance(cache, KVCache) or cache.layer is not layer:
        raise fail(func, "cache is not a KVCache of this layer: make it with "
                         "layer.init_cache() (GPT.init_cache() makes one per block)")
    if cache.window is not None:
        raise fail(func, f"the cache has a rolling window={cache.window}; a chunk needs every "
                         "position it attends to")
    x = as_float_array(func, "x", x)
    T = validate_shape(func, "x", x, ("T", "d_model"),
                       {"d_model": (layer.d_model, "the layer")})["T"]
    if x.shape[:-2] != cache.batch_shape:
        raise fail(func, f"x has shape {fmt_shape(x.shape)}; expected (..., T, d_model) with "
                         f"... = {fmt_shape(cache.batch_shape)} (from the cache)")
    cache.require_room(T, func)
    h, g, dtype = layer.h, layer.n_kv_heads, x.dtype
    q = split_heads(project(x, layer.W_q, layer.b_q, dtype), h)  # (..., h, T, d_k)
    k = split_heads(project(x, layer.W_k, layer.b_k, dtype), g)  # (..., g, T, d_k)
    v = split_heads(project(x, layer.W_v, layer.b_v, dtype), g)  # (..., g, T, d_v)
    if layer.rope is not None:  # the chunk's positions: after the tokens already cached
        positions = cache.tokens_seen + np.arange(T)
        q = apply_rope(q, positions, base=layer.rope_base, layout=layer.rope)
        k = apply_rope(k, positions, base=layer.rope_base, layout=layer.rope)
    cache.append(k, v)  # keys (..., g, L, d_k), values (..., g, L, d_v)
    L = len(cache)
    heads, weights = scaled_dot_product_attention(
        group_heads(q, g),  # (..., g, h/g, T, d_k)
        kv_for_groups(cache.keys),  # (..., g, 1, L, d_k)
        kv_for_groups(cache.values),  # (..., g, 1, L, d_v)
        mask=causal_mask(T, L),  # bottom-right: chunk position t is cache position L - T + t
        scale=layer.scale,  # None: 1/sqrt(d_k), as forward
    )
    heads, weights = ungroup_heads(heads), ungroup_heads(weights)  # (..., h, T, d_v | L)
    return project(merge_heads(heads), layer.W_o, layer.b_o, dtype), weights
