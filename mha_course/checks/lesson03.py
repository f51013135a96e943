"""Checks for the exercises of lesson 03, single-head attention
(``solutions/03_single_head_attention.ipynb``).

The lesson is ``notebooks/03_single_head_attention.ipynb``; each ``check_*`` is called by an
exercise's check cell (see :mod:`mha_course.checks`).
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np

from .. import causal_mask, padding_mask, scaled_dot_product_attention
from .harness import (
    attention_probes,
    call,
    check_rng,
    compare,
    compare_pair,
    describe,
    fail,
    fmt,
    fmt_pair,
    fmt_shape,
    passed,
    random_mask,
)
from .variants import attention_hint, attention_variant

__all__ = [
    "check_attention",
    "check_attention_scores",
    "check_causal_mask",
    "check_causal_self_attention",
    "check_choose_scale",
    "check_padding_mask",
]

#: Exercise 03.2 is to write attention (mha_course.softmax is allowed, as its task says).
_OWN_ATTENTION = dict.fromkeys(
    ["mha_course.scaled_dot_product_attention", "mha_course.tiled_attention",
     "mha_course.MultiHeadAttention", "mha_course.kernels.lean.lean_forward",
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
    rng = check_rng(301)
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
    rng = check_rng(302)
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


#: Exercise 03.5 is to fix the colleague's code: the package's attention and masks would
#: replace it rather than fix it.
_FIX_IT = dict.fromkeys(
    ["mha_course.scaled_dot_product_attention", "mha_course.tiled_attention",
     "mha_course.MultiHeadAttention", "mha_course.kernels.lean.lean_forward",
     "mha_course.causal_mask",
     "mha_course.padding_mask", "mha_course.sliding_window_mask",
     "torch.nn.functional.scaled_dot_product_attention"],
    "fix the colleague's attention yourself (mha_course.softmax is allowed)",
)

#: The colleague's three bugs, each hidden by one feature of their test (d_model == d_k, no
#: padding, only the last position compared).
_SELF_BUGS = {
    "scale": "the scores are divided by √d_model (x.shape[-1]); divide by √d_k, the width of "
             "q and k (q.shape[-1]): the two are equal only when d_model == d_k",
    "queries": "the padding mask hides padded QUERIES: real[:, :, None] is (B, T, 1). Hide "
               "padded KEYS: (B, 1, T), False in the key columns past each length",
    "after": "the mask is applied after the softmax, so the kept weights no longer sum to 1; "
             "set the masked scores to -inf BEFORE the softmax (mha_course.softmax(scores, "
             "mask=...))",
}


def self_attention_variant(x, W_q, W_k, W_v, lengths, bugs=(), causal=True, padding=True,
                           combine="and"):
    """Causal self-attention over a padded batch with some of the colleague's bugs in it."""
    T = x.shape[-2]
    q, k, v = x @ W_q, x @ W_k, x @ W_v  # (B, T, d_k), (B, T, d_k), (B, T, d_v)
    if "scale" in bugs:  # attention_variant divides by √d_k; make that √d_model
        q = q * np.sqrt(q.shape[-1] / x.shape[-1])
    real = np.arange(T)[None, :] < np.asarray(lengths)[:, None]  # (B, T)
    pad = real[:, :, None] if "queries" in bugs else real[:, None, :]  # (B, T, 1) or (B, 1, T)
    tril = causal_mask(T)
    if causal and padding:
        mask = (tril & pad) if combine == "and" else (tril | pad)
    else:
        mask = tril if causal else pad if padding else None
    where = "after" if "after" in bugs else "before"
    return attention_variant(q, k, v, mask, where=where)


def _self_variants(x, W_q, W_k, W_v, lengths):
    """``(message, make)``: every combination of the colleague's bugs, then other mistakes."""
    names = list(_SELF_BUGS)
    variants = []
    for size in (1, 2, 3):  # the fewest bugs first: name only what this probe shows
        for on in combinations(names, size):
            words = "; and ".join(_SELF_BUGS[name] for name in on)
            prefix = "" if size == 1 else f"{size} of the colleague's bugs: "
            variants.append((prefix + words, lambda on=on: self_attention_variant(
                x, W_q, W_k, W_v, lengths, bugs=on)))
    variants += [
        ("only the causal mask: padded keys must be hidden too (combine both masks with &)",
         lambda: self_attention_variant(x, W_q, W_k, W_v, lengths, padding=False)),
        ("only the padding mask: queries must not see future keys (combine both with &)",
         lambda: self_attention_variant(x, W_q, W_k, W_v, lengths, causal=False)),
        ("you combined the masks with | (or): a key must pass BOTH masks, use &",
         lambda: self_attention_variant(x, W_q, W_k, W_v, lengths, combine="or")),
        ("no mask had any effect", lambda: self_attention_variant(
            x, W_q, W_k, W_v, lengths, causal=False, padding=False)),
    ]
    return variants


def check_causal_self_attention(fn) -> None:
    """Exercise 03.5: ``causal_self_attention(x, W_q, W_k, W_v, lengths)``, the bugs fixed."""
    ex = "03.5"
    rng = check_rng(305)
    probes = [(2, 5, 8, 4, 6, [3, 5]), (3, 6, 10, 6, 3, [6, 2, 4]), (1, 4, 6, 6, 5, [4])]
    for B, T, d_model, d_k, d_v, lengths in probes:
        x = rng.normal(size=(B, T, d_model))
        W_q, W_k = rng.normal(size=(2, d_model, d_k)) / np.sqrt(d_model)
        W_v = rng.normal(size=(d_model, d_v)) / np.sqrt(d_model)
        mask = causal_mask(T) & padding_mask(lengths, T)  # (B, T, T)
        want_out, want_w = scaled_dot_product_attention(x @ W_q, x @ W_k, x @ W_v, mask=mask)
        got = call(ex, fn, (x, W_q, W_k, W_v, lengths), ("x", "W_q", "W_k", "W_v", "lengths"),
                   hint=attention_hint, forbid=_FIX_IT)
        label = f"for x {fmt_shape(x.shape)}, d_k={d_k}, lengths {lengths}"
        compare_pair(ex, got, want_out, want_w, label, _self_variants(x, W_q, W_k, W_v, lengths),
                     mask=mask, nan_message="a query row with no allowed key gives NaN: "
                     + _SELF_BUGS["queries"])
    passed(ex, "out and weights match causal attention with the padded keys hidden, for x "
               "(2, 5, 8) with d_k=4, (3, 6, 10) with d_k=6 and (1, 4, 6) with d_k=6")


#: How close a measured scale must be: loose enough for np.var's ddof=0 or ddof=1 (a relative
#: difference of 1/(2n), n >= 1500 pairs), tight enough to tell every known mistake apart.
_SCALE_RTOL = 2e-3


def _measured_scale(q, k, how="std"):
    """1 / the spread of the n dot products q[i]·k[i], measured as ``how`` says."""
    dots = (q * k).sum(axis=-1)  # (n,): row i of q with row i of k
    return {"std": 1 / dots.std(), "var": 1 / dots.var(), "inverse": dots.std(),
            "rms": 1 / np.sqrt((dots**2).mean()), "entries": 1 / (q * k).std(),
            "all_pairs": 1 / (q @ k.T).std(), "theory": 1 / np.sqrt(q.shape[-1])}[how]


_SCALE_MISTAKES = [
    ("theory", "you returned 1/√d_k: the right scale only when every entry of q and k has "
               "variance 1 (and mean 0). Measure the spread of these dot products instead"),
    ("var", "you divided by the variance; c·(q·k) has variance c²·var(q·k), so c = 1/std"),
    ("inverse", "you returned the standard deviation itself; the scale is 1/std(q·k)"),
    ("rms", "you used the mean square of the dot products, which counts their mean too; "
            "variance 1 is measured around the mean: use the standard deviation (np.std "
            "subtracts the mean)"),
    ("entries", "you measured single products q_j·k_j; the score is their SUM over the d_k "
                "features: (q * k).sum(axis=-1)"),
    ("all_pairs", "you paired every query with every key (q @ k.T); pair row i of q with row "
                  "i of k: (q * k).sum(axis=-1)"),
]


def check_choose_scale(fn) -> None:
    """Exercise 03.6: ``choose_scale(q, k)``: c with var(c · q[i]·k[i]) = 1, measured."""
    ex = "03.6"
    rng = check_rng(306)
    probes = [
        ("unit-variance entries, d_k=16", rng.normal(size=(2, 2000, 16))),
        ("unit-variance entries, d_k=64", rng.normal(size=(2, 1500, 64))),
        ("entries of std 2 (q) and 1.5 (k), d_k=9",
         rng.normal(size=(2, 2000, 9)) * np.array([2.0, 1.5])[:, None, None]),
        ("features of different sizes, d_k=32",
         rng.normal(size=(2, 2000, 32)) * np.linspace(0.2, 3.0, 32)),
        ("entries with mean 1 (q) and 0.5 (k), d_k=8",
         rng.normal(size=(2, 2500, 8)) + np.array([1.0, 0.5])[:, None, None]),
    ]
    for label, (q, k) in probes:
        want = _measured_scale(q, k)
        got = call(ex, fn, (q, k), ("q", "k"))
        if got is None:
            raise fail(ex, f"for {label}: your function returned None instead of the scale: "
                           "did you forget `return`?")
        arr = np.asarray(got)
        if arr.dtype == object or arr.dtype.kind not in "iuf" or arr.size != 1:
            raise fail(ex, f"for {label}: you returned {describe(got)}; expected one number, "
                           "the scale c")
        c = float(arr.reshape(()))
        if abs(c - want) <= _SCALE_RTOL * abs(want):
            continue
        for how, message in _SCALE_MISTAKES:
            wrong = _measured_scale(q, k, how)
            if abs(wrong - want) > 10 * _SCALE_RTOL * want and \
                    abs(c - wrong) <= _SCALE_RTOL * abs(wrong):
                raise fail(ex, f"for {label} you chose c = {fmt(c)}; the measured scale is "
                               f"{fmt(want)}. Likely mistake: {message}")
        mine, theirs = fmt_pair(c, want)
        raise fail(ex, f"for {label} you chose c = {mine}; the measured scale 1/std(q·k) is "
                       f"{theirs}: c·(q[i]·k[i]) should have variance 1")
    passed(ex, "c = 1/std(q·k) measured for unit entries at d_k = 16 and 64 (c·√d_k ≈ 1), and "
               "for entries of other sizes and means, where 1/√d_k would be wrong")
