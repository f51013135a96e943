"""Checks for the exercises of lesson 03, single-head attention
(``solutions/03_single_head_attention.ipynb``).

The lesson is ``notebooks/03_single_head_attention.ipynb``; each ``check_*`` is called by an
exercise's check cell (see :mod:`mha_course.checks`).
"""

from __future__ import annotations

import math

import numpy as np

from .. import causal_mask, padding_mask, scaled_dot_product_attention
from .harness import (
    attention_probes,
    call,
    compare,
    compare_pair,
    fail,
    fmt_shape,
    passed,
    random_mask,
)
from .variants import attention_hint, attention_variant

__all__ = [
    "check_attention",
    "check_attention_scores",
    "check_causal_mask",
    "check_masked_self_attention",
    "check_padding_mask",
]

#: Exercise 03.2 is to write attention (mha_course.softmax is allowed, as its task says).
_OWN_ATTENTION = dict.fromkeys(
    ["mha_course.scaled_dot_product_attention", "mha_course.tiled_attention",
     "mha_course.MultiHeadAttention", "mha_course.lean.lean_forward",
     "torch.nn.functional.scaled_dot_product_attention"],
    "write scaled dot-product attention yourself (mha_course.softmax is allowed)",
)
#: Exercises 03.3 and 03.4 are to build the masks with NumPy.
_OWN_CAUSAL = dict.fromkeys(["mha_course.causal_mask", "mha_course.sliding_window_mask"],
                            "build the causal mask yourself, with NumPy")
_OWN_PADDING = {"mha_course.padding_mask": "build the padding mask yourself, with NumPy"}


def check_attention_scores(fn) -> None:
    """Exercise 03.1: ``attention_scores(q, k)`` = q kᵀ / √d_k, (..., T, S)."""
    ex = "03.1"
    rng = np.random.default_rng(301)
    probes = [(rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), "(B, T, S)"),
              (rng.normal(size=(3, 9)), rng.normal(size=(5, 9)), "(T, S)"),
              (rng.normal(size=(2, 2, 3, 16)), rng.normal(size=(2, 2, 5, 16)), "(B, h, T, S)")]
    for q, k, letters in probes:
        raw = q @ np.swapaxes(k, -1, -2)
        d_k = q.shape[-1]
        want = raw / math.sqrt(d_k)
        got = call(ex, fn, (q, k), ("q", "k"), hint=attention_hint)
        compare(
           ex, got, want, f"your scores for q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}",
           letters,
           variants=[
               ("scores not scaled by √d_k: divide q·kᵀ by np.sqrt(d_k), with d_k = "
                "q.shape[-1]", lambda raw=raw: raw),
               ("you divided by d_k instead of √d_k", lambda raw=raw, d=d_k: raw / d),
               ("you multiplied by √d_k; divide by it", lambda raw=raw, d=d_k: raw * np.sqrt(d)),
           ],
           shape_hints={k.shape[:-1] + (q.shape[-2],):
                        "you computed k·qᵀ, (S, T); the queries index the rows: q @ kᵀ"},
        )
    passed(ex, "q kᵀ / √d_k matches for q (2, 3, 4), k (2, 5, 4) and for q (3, 9), k (5, 9)")


_OVERFLOW = ("softmax without max subtraction: at large scores exp overflows to inf and "
             "inf/inf = NaN. Use mha_course.softmax, or subtract each row's max first")
_FULL_NAN = ("a fully masked query row gives NaN: its max is -inf and -inf - (-inf) = NaN. "
             "Use mha_course.softmax(scores, mask=mask), which gives zeros there")


def check_attention(fn) -> None:
    """Exercise 03.2: ``attention(q, k, v, mask=None)`` -> (out, weights)."""
    ex = "03.2"
    rng = np.random.default_rng(302)
    q, k, v = attention_probes(rng)
    mask = random_mask(rng, (2, 3, 5))
    full = random_mask(rng, (2, 3, 5), full_rows=((0, 1),))
    q4, k4, v4 = (rng.normal(size=(2, 2, n, d)) for n, d in ((3, 9), (5, 9), (5, 3)))
    q2, k2, v2 = rng.normal(size=(4, 16)), rng.normal(size=(6, 16)), rng.normal(size=(6, 2))
    probes = [("without a mask", (q, k, v), None),
              ("with a mask", (q, k, v), mask),
              ("with a fully masked query (row (0, 1))", (q, k, v), full),
              ("at large scores (q times 2000)", (q * 2000, k, v), None),
              ("for q (2, 2, 3, 9) and a (3, 5) mask", (q4, k4, v4), random_mask(rng, (3, 5))),
              ("for q (4, 16), k (6, 16), v (6, 2)", (q2, k2, v2), None)]
    for label, (qq, kk, vv), m in probes:
        want_out, want_w = scaled_dot_product_attention(qq, kk, vv, mask=m)
        kwargs = {} if m is None else {"mask": m}
        got = call(ex, fn, (qq, kk, vv), ("q", "k", "v"), kwargs, hint=attention_hint,
                   forbid=_OWN_ATTENTION)

        def var(m=m, qq=qq, kk=kk, vv=vv, **kw):
            return lambda: attention_variant(qq, kk, vv, m, **kw)

        variants = [
            ("scores not scaled by √d_k: divide q·kᵀ by np.sqrt(d_k)", var(scale="none")),
            ("you divided the scores by d_k instead of √d_k", var(scale="d_k")),
            ("softmax over the wrong axis: normalise over the keys (the last axis), so each "
             "query's weights sum to 1", var(axis=-2)),
            (_OVERFLOW, var(stable=False)),
        ]
        if m is not None:
            variants += [
                ("mask applied after the softmax: the kept weights no longer sum to 1. Set the "
                 "masked scores to -inf BEFORE the softmax", var(where="after")),
                ("the mask is inverted: True means the query MAY attend to that key",
                 var(m=~m)),
                ("the mask was ignored", var(m=None)),
                ("the fully masked query comes out uniform over all keys: filling with -1e9 "
                 "does that. A query with no allowed key must get weights 0 and output 0",
                 var(fill=-1e9)),
            ]
        full_rows = None if m is None else np.broadcast_to(~m.any(axis=-1), want_w.shape[:-1])
        compare_pair(ex, got, want_out, want_w, label, variants, mask=m, full_rows=full_rows,
                     nan_message=_OVERFLOW if qq.max() > 100 else _FULL_NAN if m is full else None)
    passed(ex, "out (2, 3, 6) and weights (2, 3, 5) match "
               "mha_course.scaled_dot_product_attention without a mask, with a mask, with a "
               "fully masked query (zeros) and at large scores")


def check_causal_mask(fn) -> None:
    """Exercise 03.3: ``causal_mask(T)``: bool (T, T), True where key s <= query t."""
    ex = "03.3"
    for T in (4, 1, 7):
        want = causal_mask(T)
        got = call(ex, fn, (T,), ("T",), forbid=_OWN_CAUSAL)
        ones = np.ones((T, T), dtype=bool)

        def prop(arr, T=T):
            above = np.argwhere(np.triu(arr, k=1))
            if len(above):
                t, s = above[0]
                raise fail(ex, f"your mask is True at (query {t}, key {s}): query {t} would "
                               f"see the future key {s}; the upper triangle must be False")
            if not np.diag(arr).all():
                t = int(np.argmin(np.diag(arr)))
                raise fail(ex, f"your mask is False at (query {t}, key {t}): a token must be "
                               "able to attend to itself")

        compare(
           ex, got, want, f"your mask for T={T}", "(T, T)",
           variants=[
               ("causal triangle off by one: you excluded the diagonal (np.tril(..., k=-1) or "
                "s < t). A token may attend to itself: use s <= t",
                lambda o=ones: np.tril(o, k=-1)),
               ("causal triangle off by one: one diagonal too many (np.tril(..., k=1) or "
                "s <= t + 1) lets query t see key t+1, the future",
                lambda o=ones: np.tril(o, k=1)),
               ("you built the upper triangle: True must be where key s <= query t, on and "
                "below the diagonal (rows are queries)", lambda o=ones: np.triu(o)),
               ("the mask is inverted: True means may attend, so the past and the diagonal "
                "are True and the future is False", lambda o=ones: np.triu(o, k=1)),
           ],
           props=[prop],
        )
    passed(ex, "(T, T) bool masks for T = 1, 4, 7 match mha_course.causal_mask")


def check_padding_mask(fn) -> None:
    """Exercise 03.4: ``padding_mask(lengths, S)``: bool (B, 1, S), True at real positions."""
    ex = "03.4"
    for lengths, S in (([3, 5, 1, 4], 5), (np.array([2, 6]), 7)):
        want = padding_mask(lengths, S)
        L = np.asarray(lengths)[:, None, None]
        pos = np.arange(S)
        got = call(ex, fn, (lengths, S), ("lengths", "S"), forbid=_OWN_PADDING)
        B = len(lengths)
        compare(
           ex, got, want, f"your mask for lengths {list(map(int, lengths))}, S={S}",
           "(B, 1, S)",
           variants=[
               ("off by one: position lengths[b] is the first PADDING position (positions "
                "count from 0), so keep s < lengths[b], not s <= lengths[b]",
                lambda L=L, pos=pos: pos <= L),
               ("off by one: you dropped the last real token; keep s < lengths[b]",
                lambda L=L, pos=pos: pos < L - 1),
               ("the mask is inverted: True marks the real tokens (may attend), False the "
                "padding", lambda L=L, pos=pos: pos >= L),
           ],
           shape_hints={
               (B, S): "add a middle axis: return (B, 1, S) so it broadcasts against "
                       "(B, T, S) scores, e.g. mask[:, None, :]",
               (B, S, 1): "the length-1 axis goes in the middle, (B, 1, S): (B, S, 1) would "
                          "hide padded queries instead of padded keys",
           },
        )
    passed(ex, "(B, 1, S) bool masks for lengths [3, 5, 1, 4] (S=5) and [2, 6] (S=7) match "
               "mha_course.padding_mask")


def check_masked_self_attention(fn) -> None:
    """Exercise 03.5: ``masked_self_attention(q, k, v, lengths)``: causal AND padding masks."""
    ex = "03.5"
    rng = np.random.default_rng(305)
    for B, T, d_k, d_v, lengths in ((2, 5, 4, 6, [3, 5]), (3, 6, 9, 2, [6, 1, 4])):
        q, k, v = attention_probes(rng, B=B, T=T, S=T, d_k=d_k, d_v=d_v)
        causal, pad = causal_mask(T), padding_mask(lengths, T)
        want_out, want_w = scaled_dot_product_attention(q, k, v, mask=causal & pad)
        got = call(ex, fn, (q, k, v, lengths), ("q", "k", "v", "lengths"), hint=attention_hint)

        def var(m, q=q, k=k, v=v, **kw):
            return lambda: attention_variant(q, k, v, m, **kw)

        variants = [
            (f"you applied only the causal mask: a sequence shorter than T={T} still attends to "
             "its padding keys. Combine both: causal_mask(T) & padding_mask(lengths, T)",
             var(causal)),
            ("you applied only the padding mask: queries still see future keys. Combine both "
             "with &", var(pad)),
            ("you combined the masks with | (or): a key must be allowed by BOTH masks, use &",
             var(causal | pad)),
            ("no mask had any effect", var(None)),
            ("scores not scaled by √d_k", var(causal & pad, scale="none")),
            ("mask applied after the softmax: set masked scores to -inf before it",
             var(causal & pad, where="after")),
        ]
        compare_pair(ex, got, want_out, want_w, f"for lengths {lengths}, T=S={T}", variants,
                     mask=causal & pad)
    passed(ex, "out (2, 5, 6) and weights (2, 5, 5) match attention with causal_mask(5) & "
               "padding_mask([3, 5], 5): no future keys, no padding keys")


