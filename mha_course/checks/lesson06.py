"""Checks for the exercises of lesson 06, decoding fast (``solutions/06_decoding.ipynb``).

The lesson is ``notebooks/06_decoding.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`). The references are computed at check time by the package:
:func:`~mha_course.kv_cache_bytes` on the config's fields, the layer's causal forward,
:func:`~mha_course.heads.group_heads`' grouping, :func:`~mha_course.sliding_window_mask`,
:func:`~mha_course.scaled_dot_product_attention` on the rebuilt MLA keys and values, and
:func:`~mha_course.causal_mask` for a chunk over a longer cache.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import (
    MultiHeadAttention,
    causal_mask,
    kv_cache_bytes,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from ..heads import kv_for_groups, ungroup_heads
from ..model_configs import head_dim
from .harness import call, check_rng, compare, compare_pair, fail, fmt_shape, passed
from .variants import attention_hint

__all__ = [
    "check_absorbed_head",
    "check_cache_bytes",
    "check_chunk_attention",
    "check_decode_with_cache",
    "check_repeat_kv",
    "check_sliding_window_mask",
]


# ------------------------------------------------------------------ 06.1 cache bytes of a config
#: Config.json-style dicts (attention fields only) the check probes, every one different: the
#: head width is ``head_dim`` when given (gpt-oss: 64, not 2880 / 64 = 45).
CONFIGS = {
    "Llama 3 8B": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                   "num_key_value_heads": 8},
    "Llama 3 70B": {"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                    "num_key_value_heads": 8},
    "gpt-oss-120b without its windows": {
        "num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64},
    "a small MHA model": {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 6,
                          "num_key_value_heads": 6},
}


def check_cache_bytes(fn) -> None:
    """Exercise 06.1: ``cache_bytes_of(config, seq_len, batch=1, bytes_per_value=2)`` -> int."""
    ex = "06.1"
    probes = [("Llama 3 8B", 8192, 1, 2), ("Llama 3 70B", 131072, 1, 2),
              ("gpt-oss-120b without its windows", 4096, 3, 2), ("a small MHA model", 1000, 2, 4)]
    for name, seq_len, batch, width in probes:
        config = dict(CONFIGS[name])
        d = head_dim(config)
        g, h, L = (config[k] for k in ("num_key_value_heads", "num_attention_heads",
                                       "num_hidden_layers"))
        want = kv_cache_bytes(L, g, d, seq_len, batch, width)
        got = call(ex, fn, (config, seq_len), ("config", "seq_len"),
                   {"batch": batch, "bytes_per_value": width},
                   forbid={"mha_course.model_configs": "read the config's fields yourself"})
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral,
                                                                      np.integer)):
            if isinstance(got, (float, np.floating)) and float(got) == want:
                raise fail(ex, f"you returned {got!r}, a float; return an int (use // for the "
                               "head width, or int(...))")
            raise fail(ex, f"you returned {got!r} ({type(got).__name__}); expected an int")
        if got == want:
            continue
        per = want // (2 * L * g * d)  # seq_len · batch · bytes
        guesses = [
            (want * h // g, "you used num_attention_heads; the cache holds one key and one value "
                            "per K/V head: num_key_value_heads (GQA shares each K/V head among "
                            "h/g query heads)"),
            (want // 2, "you counted only the keys: the cache holds a key AND a value, a "
                        "factor 2"),
            (want // width, "you left out bytes_per_value (2 for bf16)"),
            (want // batch, "you left out the batch: every sequence has its own cache"),
            (want // L, "you left out num_hidden_layers: every layer has its own cache"),
            (2 * L * g * (config["hidden_size"] // h) * per,
             "the head width is config['head_dim'] when the config has one (gpt-oss: 64, not "
             "hidden_size / num_attention_heads = 45)"),
        ]
        # several mistakes can give the same number (keys only, or bytes left out, at bf16)
        why = "; or ".join(m for value, m in guesses if value == int(got) and value != want)
        raise fail(ex, f"for {name} at seq_len={seq_len}, batch={batch}, "
                       f"bytes_per_value={width} you returned {int(got):,}, expected {want:,}"
                       + (f". Likely mistake: {why}" if why else ""))
    passed(ex, "four configs (Llama 3 8B and 70B, gpt-oss-120b's head_dim, a small MHA) match "
               "mha_course.kv_cache_bytes")


# --------------------------------------------------------------- 06.2 decode with your cache
#: Exercise 06.2 asks for the decoding loop itself: the layer's own passes are not it.
_NOT_THE_LAYER = dict.fromkeys(
    ["mha_course.MultiHeadAttention.forward", "mha_course.MultiHeadAttention.__call__",
     "mha_course.MultiHeadAttention.decode_step", "mha_course.MultiHeadAttention.init_cache",
     "mha_course.KVCache"],
    "write the decoding loop and its cache yourself, from the layer's weights",
)


def _no_cache_variants(layer, x):
    """Known wrong decodes of x (B, T, d_model): (message, make) pairs."""
    T = x.shape[-2]
    h, d_k, d_v = layer.h, layer.d_k, layer.d_v
    q = (x @ layer.W_q).reshape(*x.shape[:-1], h, d_k).swapaxes(-2, -3)  # (B, h, T, d_k)
    v = (x @ layer.W_v).reshape(*x.shape[:-1], h, d_v).swapaxes(-2, -3)

    def merge(heads):
        return heads.swapaxes(-2, -3).reshape(*x.shape[:-1], h * d_v) @ layer.W_o

    def unscaled():
        k = (x @ layer.W_k).reshape(*x.shape[:-1], h, d_k).swapaxes(-2, -3)
        w = np.exp(q @ k.swapaxes(-1, -2))
        w = np.where(causal_mask(T), w, 0.0)
        return merge((w / w.sum(-1, keepdims=True)) @ v)

    return [
        ("every step attended to all T tokens, the future too: at step t the cache holds "
         "tokens 0..t only (append the new key and value, then attend over what is cached)",
         lambda: layer(x)[0]),
        ("each step attended only to its own token: attend over every cached key, not just the "
         "new one", lambda: merge(v)),
        ("scores not scaled by √d_k", unscaled),
    ]


def check_decode_with_cache(fn) -> None:
    """Exercise 06.2: ``decode(layer, x)`` -> outputs (B, T, d_model), one token at a time."""
    ex = "06.2"
    rng = check_rng(602)
    for B, T, d_model, h, d_k, d_v in ((2, 5, 12, 3, 4, 6), (1, 7, 10, 2, 3, 5)):
        layer = MultiHeadAttention(d_model, h, d_k, d_v, rng=rng)
        x = rng.normal(size=(B, T, d_model))
        want, _ = layer(x, mask=causal_mask(T))
        got = call(ex, fn, (layer, x), ("layer", "x"), hint=attention_hint, forbid=_NOT_THE_LAYER)
        compare(ex, got, want, f"your outputs for B={B}, T={T}, h={h}, d_k={d_k}, d_v={d_v}",
                "(B, T, d_model)", variants=_no_cache_variants(layer, x),
                shape_hints={(B, T, h * d_v): "you returned the merged heads: multiply by "
                                              "layer.W_o",
                             (B, 1, d_model): "you returned only the last step's output: "
                                              "collect every step's and concatenate them on "
                                              "axis -2"})
    passed(ex, "two layers (h=3, d_k=4, d_v=6 and h=2, d_k=3, d_v=5): your token-by-token outputs "
               "match the causal forward")


# ----------------------------------------------------------------------- 06.3 repeat K/V heads
def check_repeat_kv(fn) -> None:
    """Exercise 06.3: ``repeat_kv(k, n_rep)``: (B, g, S, d) -> (B, g*n_rep, S, d)."""
    ex = "06.3"
    rng = check_rng(603)
    for B, g, n_rep, S, d in ((2, 2, 3, 5, 4), (1, 3, 2, 4, 6), (2, 1, 4, 3, 5)):
        k = rng.normal(size=(B, g, S, d))
        # query head i reads K/V head i // n_rep: each K/V head broadcast over its group
        want = ungroup_heads(np.broadcast_to(kv_for_groups(k), (B, g, n_rep, S, d)))
        got = call(ex, fn, (k, n_rep), ("k", "n_rep"))
        compare(
           ex, got, want, f"your heads for k {fmt_shape(k.shape)}, n_rep={n_rep}",
           "(B, g*n_rep, S, d)",
           variants=[
               ("np.tile interleaves the K/V heads (0, 1, 0, 1, ...), so query head i would read "
                "K/V head i % g; grouped-query attention needs i // n_rep, consecutive copies: "
                "np.repeat(k, n_rep, axis=1)", lambda k=k, n=n_rep: np.tile(k, (1, n, 1, 1))),
           ],
           shape_hints={(B, g, S * n_rep, d): "you repeated along the positions (axis 2); "
                                              "repeat the heads, axis 1",
                        (B, g, S, d * n_rep): "you repeated along the features (last axis); "
                                              "repeat the heads, axis 1"},
        )
    passed(ex, "query head i reads K/V head i // n_rep for (g, n_rep) = (2, 3), (3, 2), (1, 4)")


# --------------------------------------------------------------- 06.4 the sliding-window mask
def check_sliding_window_mask(fn) -> None:
    """Exercise 06.4: ``sliding_window_mask(T, window, S=None)``: bool (T, S), bottom-right."""
    ex = "06.4"
    for T, window, S in ((6, 3, None), (3, 2, 7), (5, 1, None), (4, 10, 6)):
        want = sliding_window_mask(T, window, S)
        S_ = T if S is None else S
        t = np.arange(T)[:, None]
        s = np.arange(S_)[None, :]
        p = t + S_ - T
        got = call(ex, fn, (T, window) if S is None else (T, window, S),
                   ("T", "window") if S is None else ("T", "window", "S"),
                   forbid={"mha_course.sliding_window_mask": "build the mask yourself"})
        compare(
           ex, got, want, f"your mask for T={T}, window={window}, S={S_}", "(T, S)",
           variants=[(message, lambda m=m: m) for message, m in (
               ("the band is aligned top-left (query t at position t); with S > T the queries "
                "are the LAST T positions: query t sits at p = S - T + t",
                (s <= t) & (s > t - window)),
               ("one key too many: a query sees `window` keys, itself included, so "
                "p - window < s <= p (not p - window <= s)", (s <= p) & (s >= p - window)),
               ("one key too few: the window includes the query itself: p - window < s <= p",
                (s <= p) & (s > p - window + 1)),
               ("the future is visible: the window ends at the query (s <= p); it is a causal "
                "mask with the old keys removed", np.abs(s - p) < window),
               ("no window: this is the causal mask; also drop the keys older than "
                "p - window + 1", s <= p),
           )],
        )
    passed(ex, "(T, window, S) = (6, 3, 6), (3, 2, 7), (5, 1, 5), (4, 10, 6) match "
               "mha_course.sliding_window_mask")


# ------------------------------------------------------------------ 06.5 MLA absorption, one head
def check_absorbed_head(fn) -> None:
    """Exercise 06.5: ``absorbed_head(q_nope, q_rope, c, k_rope, W_uk, W_uv)`` -> (out, weights)."""
    ex = "06.5"
    rng = check_rng(605)
    for T, S, d_c, d_k, d_v, d_rope in ((3, 5, 12, 4, 6, 2), (2, 6, 9, 5, 3, 4)):
        q_nope, q_rope = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_rope))
        c, k_rope = rng.normal(size=(S, d_c)), rng.normal(size=(S, d_rope))
        W_uk = rng.normal(size=(d_c, d_k)) / math.sqrt(d_c)
        W_uv = rng.normal(size=(d_c, d_v)) / math.sqrt(d_c)
        # the naive head: rebuild the keys and values, then attend (scale 1/√(d_k + d_rope))
        want_out, want_w = scaled_dot_product_attention(
            np.concatenate([q_nope, q_rope], -1), np.concatenate([c @ W_uk, k_rope], -1),
            c @ W_uv)

        latent = (q_nope @ W_uk.T) @ c.T  # (T, d_c) @ (d_c, S): the absorbed scores
        rope_part = q_rope @ k_rope.T

        def with_scale(scale, rope=True, latent=latent, rope_part=rope_part, c=c, W_uv=W_uv):
            def make():
                scores = (latent + (rope_part if rope else 0.0)) / scale
                w = np.exp(scores - scores.max(-1, keepdims=True))
                w = w / w.sum(-1, keepdims=True)
                return (w @ c) @ W_uv, w
            return make

        variants = [
            ("you scaled by √(d_c + d_rope), the width of the absorbed dot product; the scores "
             "must equal the naive head's, q·k over d_k + d_rope features: divide by "
             "√(d_k + d_rope)", with_scale(math.sqrt(d_c + d_rope))),
            ("you scaled by √d_k only; the head's dot product has d_k + d_rope features "
             "(position-free part and RoPE part)", with_scale(math.sqrt(d_k))),
            ("the RoPE part is missing: add q_rope @ k_rope.T to the latent scores",
             with_scale(math.sqrt(d_k + d_rope), rope=False)),
        ]
        args = (q_nope, q_rope, c, k_rope, W_uk, W_uv)
        names = ("q_nope", "q_rope", "c", "k_rope", "W_uk", "W_uv")
        got = call(ex, fn, args, names, hint=_absorb_hint)
        compare_pair(ex, got, want_out, want_w, f"for T={T}, S={S}, d_c={d_c}, d_k={d_k}",
                     variants)
    passed(ex, "two heads (d_c=12, d_k=4, d_rope=2 and d_c=9, d_k=5, d_rope=4): the absorbed "
               "head equals the naive one")


def _absorb_hint(exc):
    if "matmul" in str(exc) or "shapes" in str(exc):
        return ("a shape mismatch: W_uk is (d_c, d_k), so the query (T, d_k) meets it transposed: "
                "q_nope @ W_uk.T is (T, d_c), a query in the latent space")
    return None


# ------------------------------------------------------- 06.6 a chunk of new tokens over a cache
def check_chunk_attention(fn) -> None:
    """Exercise 06.6: ``chunk_attention(q, k, v)``: T new queries over S >= T cached keys."""
    ex = "06.6"
    rng = check_rng(606)
    for lead, T, S in (((2,), 3, 7), ((), 1, 5), ((2, 2), 4, 4), ((), 2, 9)):
        q = rng.normal(size=(*lead, T, 4))
        k, v = rng.normal(size=(*lead, S, 4)), rng.normal(size=(*lead, S, 6))
        mask = causal_mask(T, S)
        want_out, want_w = scaled_dot_product_attention(q, k, v, mask=mask)
        top_left = np.tril(np.ones((T, S), dtype=bool))
        variants = [
            ("the mask is aligned top-left (np.tril of a (T, S) block, like torch's "
             "is_causal=True), so query t sees only keys 0..t. The new queries are the LAST T of "
             "S positions: query t may see keys s <= S - T + t (mha_course.causal_mask(T, S))",
             lambda q=q, k=k, v=v, m=top_left: scaled_dot_product_attention(q, k, v, mask=m)),
            ("no mask: a query of the chunk sees the chunk's later tokens, its future",
             lambda q=q, k=k, v=v: scaled_dot_product_attention(q, k, v)),
            ("off by one: query t sits at position S - T + t and may see itself: s <= S - T + t",
             lambda q=q, k=k, v=v, T=T, S=S: scaled_dot_product_attention(
                 q, k, v, mask=np.arange(S)[None, :] < np.arange(T)[:, None] + S - T)),
        ]
        got = call(ex, fn, (q, k, v), ("q", "k", "v"), hint=attention_hint)
        compare_pair(ex, got, want_out, want_w, f"for T={T} new queries over S={S} keys",
                     variants, mask=mask)
    passed(ex, "chunks (T, S) = (3, 7), (1, 5), (4, 4), (2, 9) match attention with "
               "mha_course.causal_mask(T, S), the bottom-right mask")
