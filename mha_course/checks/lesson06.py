"""Checks for the exercises of lesson 06, decoding fast (``solutions/06_decoding.ipynb``).

The lesson is ``notebooks/06_decoding.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`). The references are computed at check time by the package:
:func:`~mha_course.kv_cache_bytes` on the config's fields, the layer's causal forward,
:func:`~mha_course.heads.group_heads`' grouping, :func:`~mha_course.apply_rope` at StreamingLLM's
positions within the cache, :func:`~mha_course.scaled_dot_product_attention` on the rebuilt MLA
keys and values, and :func:`~mha_course.causal_mask` for a chunk over a longer cache, and
:func:`reference_chunked_mask` (Llama 4's chunked causal mask, written in
``notebooks/deep_dives/06c_model_family_layouts.ipynb``) for 06.7.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import (
    MultiHeadAttention,
    apply_rope,
    causal_mask,
    kv_cache_bytes,
    scaled_dot_product_attention,
    softmax,
)
from ..cost import head_dim
from ..heads import kv_for_groups, ungroup_heads
from .harness import call, check_rng, compare, compare_pair, fail, fmt_shape, pair, passed
from .variants import attention_hint

__all__ = [
    "check_absorbed_head",
    "check_cache_bytes",
    "check_chunk_attention",
    "check_chunked_mask",
    "check_decode_with_cache",
    "check_repeat_kv",
    "check_streaming_step",
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
                   forbid={"mha_course.cost": "read the config's fields yourself"})
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


# ---------------------------------------------------------- 06.4 one StreamingLLM decoding step
def streaming_kept(n: int, n_sink: int, window: int) -> np.ndarray:
    """Indices StreamingLLM keeps of a stream of ``n`` tokens: the first ``n_sink`` and the last
    ``window`` (the newest included), each once, in order."""
    return np.array(sorted(set(range(min(n_sink, n))) | set(range(max(0, n - window), n))))


def _streaming_variant(q_t, keys, values, n_sink, window, *, positions="cache", sinks=True,
                       query_at="last", layout="half", extra=0, rotate_query=True):
    """One StreamingLLM step with one classic slip switched on."""
    n = keys.shape[-2]
    kept = streaming_kept(n, n_sink if sinks else 0, window + extra)
    pos = np.arange(len(kept)) if positions == "cache" else kept
    k = apply_rope(keys[..., kept, :], pos, layout=layout)
    q_pos = {"last": pos[-1], "past": len(kept), "zero": 0}[query_at]
    q = apply_rope(q_t, np.array([q_pos]), layout=layout) if rotate_query else q_t
    return scaled_dot_product_attention(q, k, values[..., kept, :])


def check_streaming_step(fn) -> None:
    """Exercise 06.4: ``streaming_step(q_t, keys, values, n_sink, window)`` -> (out, weights)."""
    ex = "06.4"
    rng = check_rng(604)
    probes = (((), 2, 10, 4, 4, 6, 5), ((2,), 3, 12, 1, 5, 4, 3), ((), 2, 6, 4, 4, 8, 6),
              ((), 1, 20, 2, 3, 4, 7), ((2,), 2, 1, 4, 4, 6, 4))
    for lead, h, n, n_sink, window, d_k, d_v in probes:
        q_t = rng.normal(size=(*lead, h, 1, d_k))
        keys, values = rng.normal(size=(*lead, h, n, d_k)), rng.normal(size=(*lead, h, n, d_v))
        kept = streaming_kept(n, n_sink, window)
        want_out, want_w = _streaming_variant(q_t, keys, values, n_sink, window)
        got = call(ex, fn, (q_t, keys, values, n_sink, window),
                   ("q_t", "keys", "values", "n_sink", "window"), hint=attention_hint)

        def var(q_t=q_t, keys=keys, values=values, n_sink=n_sink, window=window, **kw):
            return lambda: _streaming_variant(q_t, keys, values, n_sink, window, **kw)

        variants = [
            ("you rotated the kept keys at their positions in the TEXT; StreamingLLM gives them "
             "their positions in the cache, 0, 1, 2, ... (and the query the last one), so that "
             "the distances RoPE sees stay within the cache", var(positions="text")),
            ("the query is rotated one position too far: the new token is the last of the kept "
             "ones, at cache position n_kept - 1", var(query_at="past")),
            ("the query was rotated at position 0: it is the newest token, at the last cache "
             "position", var(query_at="zero")),
            ("the query was not rotated: rotate it too, at its position in the cache",
             var(rotate_query=False)),
            ("you used the interleaved layout; this exercise uses apply_rope's default, the "
             "half-split layout", var(layout="interleaved")),
        ]
        n_kept = len(kept)
        wrong_counts = {  # how many tokens a classic slip keeps -> the slip
            len(streaming_kept(n, 0, window)): "you kept only the window: StreamingLLM also keeps "
                                               "the first n_sink tokens, its attention sinks",
            len(streaming_kept(n, n_sink, window + 1)): "you kept window + 1 tokens at the end: "
                                                        "the window of `window` tokens includes "
                                                        "the new one",
            min(n_sink, n) + min(window, n): "a token that is both a sink and in the window is "
                                             "kept once, not twice",
        }
        wrong_counts.pop(n_kept, None)
        pair(ex, got)
        shape = np.shape(got[1])
        if len(shape) == len(lead) + 3 and shape[-1] in wrong_counts:
            raise fail(ex, f"your weights for n={n}, n_sink={n_sink}, window={window} have "
                           f"shape {fmt_shape(shape)}; expected (..., h, 1, n_kept) = "
                           f"{fmt_shape((*lead, h, 1, n_kept))}. Likely mistake: "
                           f"{wrong_counts[shape[-1]]}")
        compare_pair(ex, got, want_out, want_w,
                     f"for n={n} tokens, n_sink={n_sink}, window={window} (kept "
                     f"{kept.tolist()})", variants)
    passed(ex, "five streams (n = 10, 12, 6, 20 and 1 tokens; sinks and windows of several sizes, "
               "with and without a batch axis) match attention over the kept tokens rotated at "
               "their positions in the cache")


# ------------------------------------------------------------------ 06.5 MLA absorption, one head
def check_absorbed_head(fn) -> None:
    """Exercise 06.5: ``absorbed_head(q_nope, q_rope, c, k_rope, W_uk, W_uv)`` -> (out, weights):
    T new queries, the last T of S cached positions, bottom-right causal."""
    ex = "06.5"
    rng = check_rng(605)
    for T, S, d_c, d_k, d_v, d_rope in ((3, 5, 12, 4, 6, 2), (2, 6, 9, 5, 3, 4),
                                         (1, 7, 10, 3, 4, 2)):
        q_nope, q_rope = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_rope))
        c, k_rope = rng.normal(size=(S, d_c)), rng.normal(size=(S, d_rope))
        W_uk = rng.normal(size=(d_c, d_k)) / math.sqrt(d_c)
        W_uv = rng.normal(size=(d_c, d_v)) / math.sqrt(d_c)
        # the naive head: rebuild the keys and values, then attend (scale 1/√(d_k + d_rope))
        mask = causal_mask(T, S)  # the T new queries are the last T of the S positions
        want_out, want_w = scaled_dot_product_attention(
            np.concatenate([q_nope, q_rope], -1), np.concatenate([c @ W_uk, k_rope], -1),
            c @ W_uv, mask=mask)

        latent = (q_nope @ W_uk.T) @ c.T  # (T, d_c) @ (d_c, S): the absorbed scores
        rope_part = q_rope @ k_rope.T

        def with_scale(scale, rope=True, m="bottom-right", latent=latent, rope_part=rope_part,
                       c=c, W_uv=W_uv, T=T, S=S):
            def make():
                scores = (latent + (rope_part if rope else 0.0)) / scale
                keep = {"bottom-right": causal_mask(T, S), "none": None,
                        "top-left": np.tril(np.ones((T, S), dtype=bool))}[m]
                w = softmax(scores, mask=keep)
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
            ("no causal mask: a query of the chunk sees the chunk's later tokens",
             with_scale(math.sqrt(d_k + d_rope), m="none")),
            ("the causal mask is aligned top-left (np.tril of a (T, S) block): the new queries "
             "are the LAST T of the S cached positions, mha_course.causal_mask(T, S)",
             with_scale(math.sqrt(d_k + d_rope), m="top-left")),
        ]
        args = (q_nope, q_rope, c, k_rope, W_uk, W_uv)
        names = ("q_nope", "q_rope", "c", "k_rope", "W_uk", "W_uv")
        got = call(ex, fn, args, names, hint=_absorb_hint)
        compare_pair(ex, got, want_out, want_w, f"for T={T}, S={S}, d_c={d_c}, d_k={d_k}",
                     variants, mask=mask)
    passed(ex, "three heads (d_c = 12, 9, 10; chunks of T = 3, 2, 1 over S = 5, 6, 7 cached): the "
               "absorbed head equals the naive one under the bottom-right causal mask")


def _absorb_hint(exc):
    if "matmul" in str(exc) or "shapes" in str(exc):
        return ("a shape mismatch: W_uk is (d_c, d_k), so the query (T, d_k) meets it transposed: "
                "q_nope @ W_uk.T is (T, d_c), a query in the latent space")
    return None


# ------------------------------------------------------- 06.6 a chunk of new tokens over a cache
def check_chunk_attention(fn) -> None:
    """Exercise 06.6: ``chunk_attention(q, k, v)``: T new queries over S >= T cached keys; one
    new token (T = 1) is tested first, where the top-left mask is worst."""
    ex = "06.6"
    rng = check_rng(606)
    for lead, T, S in (((), 1, 5), ((2,), 3, 7), ((2, 2), 4, 4), ((), 2, 9)):
        q = rng.normal(size=(*lead, T, 4))
        k, v = rng.normal(size=(*lead, S, 4)), rng.normal(size=(*lead, S, 6))
        mask = causal_mask(T, S)
        want_out, want_w = scaled_dot_product_attention(q, k, v, mask=mask)
        top_left = np.tril(np.ones((T, S), dtype=bool))
        top_left_message = (
            "with ONE new token (T = 1) your weights put everything on key 0: the top-left mask "
            "np.tril(np.ones((1, S))) (torch's is_causal=True) lets the new token see key 0 "
            "only. The new queries are the LAST T of S positions: query t may see keys "
            "s <= S - T + t (mha_course.causal_mask(T, S))" if T == 1 else
            "the mask is aligned top-left (np.tril of a (T, S) block, like torch's "
            "is_causal=True), so query t sees only keys 0..t. The new queries are the LAST T of "
            "S positions: query t may see keys s <= S - T + t (mha_course.causal_mask(T, S))")
        variants = [
            (top_left_message,
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
    passed(ex, "one new token (T, S) = (1, 5), then chunks (3, 7), (4, 4), (2, 9) match attention "
               "with mha_course.causal_mask(T, S), the bottom-right mask")


# -------------------------------------------------------- 06.7 Llama 4's chunked causal mask
def reference_chunked_mask(T: int, chunk: int) -> np.ndarray:
    """Bool (T, T): query t may see key s iff ``s <= t`` and both lie in the same chunk of
    ``chunk`` positions (chunk k holds positions ``k·chunk .. (k+1)·chunk - 1``)."""
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    return causal_mask(T) & (s // chunk == t // chunk)


def check_chunked_mask(fn) -> None:
    """Exercise 06.7: ``chunked_causal_mask(T, chunk)``: bool (T, T), Llama 4's local layers."""
    ex = "06.7"
    for T, chunk in ((10, 4), (7, 3), (9, 1), (4, 10), (12, 5)):
        want = reference_chunked_mask(T, chunk)
        got = call(ex, fn, (T, chunk), ("T", "chunk"))
        t, s = np.arange(T)[:, None], np.arange(T)[None, :]
        causal = causal_mask(T)

        def prop(arr, T=T):
            above = np.argwhere(np.triu(arr, k=1))
            if len(above):
                q, k = above[0]
                raise fail(ex, f"your mask is True at (query {q}, key {k}): query {q} would see "
                               f"the future key {k}. Not causal within the chunk: a chunk is a "
                               "causal mask cut into blocks, so s <= t as well")
            if not np.diag(arr).all():
                q = int(np.argmin(np.diag(arr)))
                raise fail(ex, f"your mask is False at (query {q}, key {q}): a token must be "
                               "able to attend to itself")

        off_by_one = ("chunk boundaries off by one: the chunks start at position 1 (or end "
                      "one early). Chunk k holds positions k·chunk .. (k+1)·chunk - 1, so "
                      "compare s // chunk with t // chunk on 0-based positions")
        wrong = [  # each classic mistake, computed on the same (T, chunk)
            ("a sliding window instead of a chunk: query t sees the last `chunk` keys whatever "
             "their chunk. In a chunked layer the query just after a boundary (t = chunk) sees "
             "1 key, itself: keep s <= t and s // chunk == t // chunk", causal & (t - s < chunk)),
            (off_by_one, causal & ((s - 1) // chunk == (t - 1) // chunk)),
            (off_by_one, causal & ((s + 1) // chunk == (t + 1) // chunk)),
            ("not causal within the chunk: every query sees its whole chunk, the later tokens "
             "of the chunk too. Keep s <= t as well as s // chunk == t // chunk",
             s // chunk == t // chunk),
        ]
        compare(ex, got, want, f"your mask for T={T}, chunk={chunk}", "(T, T)",
                variants=[(message, lambda m=m: m) for message, m in wrong], props=[prop])
    passed(ex, "(T, T) bool masks for (T, chunk) = (10, 4), (7, 3), (9, 1), (4, 10), (12, 5) "
               "are causal within each chunk and blind across chunk boundaries")
