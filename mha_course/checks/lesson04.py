"""Checks for the exercises of lesson 04, multi-head attention
(``solutions/04_multi_head_attention.ipynb``).

The lesson is ``notebooks/04_multi_head_attention.ipynb``; each ``check_*`` is called by an
exercise's check cell (see :mod:`mha_course.checks`).
"""

from __future__ import annotations

import numbers
from itertools import combinations

import numpy as np

from .. import MultiHeadAttention, causal_mask, merge_heads, param_count, split_heads
from .harness import (
    call,
    check_rng,
    compare,
    fail,
    fmt_shape,
    pair,
    passed,
    rows_sum_to_one,
    swapped_pair,
)
from .variants import attention_hint, attention_variant, mha_variant

__all__ = [
    "check_cross_attention",
    "check_fuse_heads",
    "check_merge_heads",
    "check_mha_forward",
    "check_param_count",
    "check_split_heads",
]

#: What exercises 04.1 to 04.5 ask to write, each forbidding the package's own version.
_OWN_SPLIT = {"mha_course.split_heads": "split the heads yourself, with reshape and transpose"}
_OWN_MERGE = {"mha_course.merge_heads": "merge the heads yourself, with transpose and reshape"}
_OWN_FUSE = dict.fromkeys(
    ["mha_course.MultiHeadAttention.from_per_head", "mha_course.heads.fuse_per_head"],
    "lay the heads side by side yourself, with NumPy",
)
_OWN_COUNT = dict.fromkeys(["mha_course.param_count", "mha_course.MultiHeadAttention"],
                           "count the parameters yourself, from the shapes")
_OWN_LAYER = dict.fromkeys(
    ["mha_course.MultiHeadAttention", "mha_course.kernels.lean.lean_forward"],
    "write the multi-head forward yourself (mha_course.scaled_dot_product_attention is allowed)",
)


def check_split_heads(fn) -> None:
    """Exercise 04.1: ``split_heads(x, h)``: (B, T, h*d) -> (B, h, T, d)."""
    ex = "04.1"
    rng = check_rng(401)
    for B, T, h, d in ((2, 4, 3, 5), (1, 6, 2, 4)):
        x = rng.normal(size=(B, T, h * d))
        want = split_heads(x, h)
        got = call(ex, fn, (x, h), ("x", "h"), forbid=_OWN_SPLIT)
        compare(
           ex, got, want, f"your heads for x {fmt_shape(x.shape)}, h={h}", "(B, h, T, d)",
           variants=[
               ("reshape without the transpose: x.reshape(B, h, T, d) cuts the memory into "
                "blocks that mix positions and heads. Reshape to (B, T, h, d), then swap axes "
                "1 and 2", lambda x=x, s=(B, h, T, d): x.reshape(s)),
               ("you split the last axis as (d, h): head i must be the contiguous columns "
                "i*d:(i+1)*d, so reshape to (B, T, h, d)",
                lambda x=x, s=(B, T, d, h): x.reshape(s).transpose(0, 3, 1, 2)),
           ],
           shape_hints={(B, T, h, d): "you reshaped but did not move the head axis: swap "
                                      "axes 1 and 2 to get (B, h, T, d)"},
        )
    passed(ex, "(2, 4, 15) with h=3 and (1, 6, 8) with h=2 match mha_course.split_heads")


def check_merge_heads(fn) -> None:
    """Exercise 04.2: ``merge_heads(x)``: (B, h, T, d) -> (B, T, h*d)."""
    ex = "04.2"
    rng = check_rng(402)
    for B, h, T, d in ((2, 3, 4, 5), (1, 2, 6, 4)):
        x = rng.normal(size=(B, h, T, d))
        want = merge_heads(x)
        got = call(ex, fn, (x,), ("x",), forbid=_OWN_MERGE)
        compare(
           ex, got, want, f"your merged heads for x {fmt_shape(x.shape)}", "(B, T, h*d)",
           variants=[
               ("reshape without the transpose: first swap axes 1 and 2 to (B, T, h, d), then "
                "reshape to (B, T, h*d)", lambda x=x, s=(B, T, h * d): x.reshape(s)),
               ("you interleaved the heads' columns: move the axes to (B, T, h, d), not "
                "(B, T, d, h), before the reshape",
                lambda x=x, s=(B, T, h * d): x.transpose(0, 2, 3, 1).reshape(s)),
           ],
        )
    passed(ex, "(2, 3, 4, 5) and (1, 2, 6, 4) match mha_course.merge_heads")


def check_fuse_heads(fn) -> None:
    """Exercise 04.3: ``fuse_heads(W)``: per-head (h, d_model, d_k) -> fused (d_model, h*d_k)."""
    ex = "04.3"
    rng = check_rng(403)
    for h, d_model, d_k in ((3, 10, 6), (4, 6, 2), (1, 5, 3)):
        W = rng.normal(size=(h, d_model, d_k))
        want = MultiHeadAttention.from_per_head(W, W, W, np.zeros((h * d_k, d_model))).W_q
        got = call(ex, fn, (W,), ("W",), forbid=_OWN_FUSE)
        compare(
           ex, got, want, f"your fused matrix for W {fmt_shape(W.shape)}", "(d_model, h*d_k)",
           variants=[
               ("reshape without the transpose: W.reshape(d_model, h*d_k) reads head 0's rows "
                "across the columns. Move the head axis next to d_k first: "
                "W.transpose(1, 0, 2).reshape(d_model, h*d_k)",
                lambda W=W: W.reshape(W.shape[1], -1)),
               ("you interleaved the heads' columns: head i must occupy columns "
                "i*d_k:(i+1)*d_k; use W.transpose(1, 0, 2), not (1, 2, 0)",
                lambda W=W: W.transpose(1, 2, 0).reshape(W.shape[1], -1)),
           ],
           shape_hints={(h * d_model, d_k): "you stacked the heads' rows (axis 0); lay them "
                                            "side by side (axis=1): np.concatenate(list(W), "
                                            "axis=1)"},
        )
    passed(ex, "(3, 10, 6) -> (10, 18) matches MultiHeadAttention.from_per_head(...).W_q")


def check_param_count(fn) -> None:
    """Exercise 04.4: ``mha_param_count(d_model, h, d_k, d_v, bias)`` -> int."""
    ex = "04.4"
    configs = [(512, 8, 64, 64, False), (512, 8, 64, 64, True), (10, 3, 6, 7, False),
               (10, 3, 6, 7, True), (12, 4, 2, 5, True)]
    for d_model, h, d_k, d_v, bias in configs:
        want = param_count(d_model, h, d_k, d_v, bias=bias)
        got = call(ex, fn, (d_model, h, d_k, d_v, bias), ("d_model", "h", "d_k", "d_v", "bias"),
                   forbid=_OWN_COUNT)
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral,
                                                                      np.integer)):
            raise fail(ex, f"you returned {got!r} ({type(got).__name__}); expected an int")
        if got == want:
            continue
        b = 2 * h * d_k + h * d_v + d_model if bias else 0
        guesses = {
            want - h * d_v * d_model: "you left out the output projection W_o, (h·d_v, d_model)",
            want - b: "you left out the biases (b_q, b_k: h·d_k each; b_v: h·d_v; b_o: d_model)",
            want - b + 4 * d_model: "biases: b_q and b_k have h·d_k entries, b_v has h·d_v and "
                                    "b_o has d_model; 4·d_model holds only when h·d_k = h·d_v = "
                                    "d_model",
            4 * d_model**2 + (4 * d_model if bias else 0):
                "you used 4·d_model², which holds only when h·d_k = h·d_v = d_model; count "
                "each matrix from d_k and d_v",
            want - b + (2 * h * d_k + h * d_v + h * d_v if bias else 0):
                "b_o has d_model entries (it is added after W_o), not h·d_v",
        }
        guesses.pop(want, None)
        why = guesses.get(int(got))
        raise fail(ex, f"for d_model={d_model}, h={h}, d_k={d_k}, d_v={d_v}, bias={bias} you "
                       f"returned {int(got)}, expected {want}"
                       + (f". Likely mistake: {why}" if why else ""))
    passed(ex, "five layer sizes, with and without biases, match mha_course.param_count")


def _check_mha_config(ex, fn, rng, B, T, d_model, h, d_k, d_v) -> None:
    """Exercise 04.5 on one layer size, without and with a causal mask."""
    x = rng.normal(size=(B, T, d_model))
    W_q, W_k = rng.normal(size=(2, h, d_model, d_k)) / np.sqrt(d_model)
    W_v = rng.normal(size=(h, d_model, d_v)) / np.sqrt(d_model)
    W_o = rng.normal(size=(h * d_v, d_model)) / np.sqrt(h * d_v)
    layer = MultiHeadAttention.from_per_head(W_q, W_k, W_v, W_o)
    size = f" (h={h}, d_k={d_k}, d_v={d_v})" if h != 3 else ""
    for label, mask in (("without a mask", None), ("with a causal mask", causal_mask(T))):
        label += size
        want_out, want_w = layer(x, mask=mask)
        kwargs = {} if mask is None else {"mask": mask}
        got = call(ex, fn, (x, W_q, W_k, W_v, W_o), ("x", "W_q", "W_k", "W_v", "W_o"), kwargs,
                   hint=attention_hint, forbid=_OWN_LAYER)
        pair(ex, got)
        swapped_pair(ex, got, want_out.shape, want_w.shape)
        if np.shape(got[0]) == (B, T, h * d_v) and h * d_v != d_model:
            raise fail(ex, f"your output has shape {fmt_shape((B, T, h * d_v))}, the "
                           "concatenated heads: you forgot the output projection, "
                           "concat(heads) @ W_o")

        def var(mask=mask, **kw):
            return lambda: mha_variant(x, W_q, W_k, W_v, W_o, mask, **kw)

        variants = [
            ("scores not scaled by √d_k: each head divides q·kᵀ by √d_k", var(scale="none")),
            ("you scaled by √d_model; each head scales by its own √d_k", var(scale="d_model")),
            ("softmax over the wrong axis: normalise over the keys (the last axis)",
             var(axis=-2)),
            ("the heads are concatenated in reverse order: head i goes in columns "
             "i*d_v:(i+1)*d_v, which W_o's rows expect", var(order=-1)),
        ]
        if mask is not None:
            variants.append(("the mask was ignored: pass it to every head", var(use_mask=False)))
        compare(ex, got[1], want_w, f"your weights {label}", "(B, h, T, S)",
                variants=[(m, (lambda mk=mk: mk()[1])) for m, mk in variants],
                shape_hints={(B, T, h, T): "stack the heads' weights on axis 1: (B, h, T, S)"},
                props=[rows_sum_to_one(ex, f"your weights {label}")])
        compare(ex, got[0], want_out, f"your output {label}", "(B, T, d_model)",
                variants=[(m, (lambda mk=mk: mk()[0])) for m, mk in variants])


def check_mha_forward(fn) -> None:
    """Exercise 04.5: ``mha_forward(x, W_q, W_k, W_v, W_o, mask=None)`` -> (out, weights)."""
    ex = "04.5"
    rng = check_rng(405)
    for B, T, d_model, h, d_k, d_v in ((2, 4, 10, 3, 6, 7), (1, 5, 8, 2, 4, 3)):
        _check_mha_config(ex, fn, rng, B, T, d_model, h, d_k, d_v)
    passed(ex, "out (2, 4, 10) and weights (2, 3, 4, 4) match "
               "MultiHeadAttention.from_per_head(...) with h=3, d_k=6, d_v=7, with and "
               "without a causal mask")


#: Exercise 04.6 builds cross-attention from the layer's weights: calling the layer is not it.
_NOT_THE_LAYER = dict.fromkeys(
    ["mha_course.MultiHeadAttention.forward", "mha_course.MultiHeadAttention.__call__"],
    "compute cross-attention from the layer's weights, not by calling the layer",
)


#: The colleague's bugs in exercise 04.6, each hidden by their test (one head, context = x).
_CROSS_BUGS = {
    "from_x": "keys and values are projections of x; in cross-attention they come from "
              "context (k = context @ W_k, v = context @ W_v), the queries from x",
    "reshape": "the heads are split by reshape alone, (B, h, T, d_k): reshape to (B, T, h, "
               "d_k) and swap axes 1 and 2, as split_heads does",
    "scale": "the scores are divided by √(h·d_k) (W_q.shape[1]); each head divides by its "
             "own √d_k",
}


def cross_attention_variant(layer, x, context, bugs=(), scaled=True):
    """Cross-attention from the layer's weights, with some of the colleague's bugs in it."""
    h = layer.h
    source = x if "from_x" in bugs else context

    def heads(a, W):  # (B, L, h*d) -> (B, h, L, d)
        y = a @ W
        if "reshape" in bugs:
            return y.reshape(*y.shape[:-2], h, y.shape[-2], y.shape[-1] // h)
        return split_heads(y, h)

    q, k, v = heads(x, layer.W_q), heads(source, layer.W_k), heads(source, layer.W_v)
    if "scale" in bugs:  # attention_variant divides by √d_k; make that √(h·d_k)
        q = q / np.sqrt(h)
    out, w = attention_variant(q, k, v, scale="sqrt" if scaled else "none")
    return merge_heads(out) @ layer.W_o, w


def _cross_hint(exc):
    """The likely mistake behind an exception from an answer to exercise 04.6."""
    if "cannot reshape" in str(exc):
        return ("keys and values have S = context.shape[-2] positions, not T: split them with "
                "split_heads(context @ W_k, h), which reads the length from its input")
    return attention_hint(exc)


def _check_cross_config(ex, fn, layer, x, context) -> None:
    """Exercise 04.6 on one layer and one pair of sequences."""
    (B, T, _), S, h = x.shape, context.shape[-2], layer.h
    want_out, want_w = layer(x, context=context)
    got = call(ex, fn, (layer, x, context), ("layer", "x", "context"), hint=_cross_hint,
               forbid=_NOT_THE_LAYER)
    pair(ex, got)
    swapped_pair(ex, got, want_out.shape, want_w.shape)
    shapes = {
        (B, h, T, T): "your weights are (B, h, T, T): keys and values must come from context "
                      "(k = context @ W_k, v = context @ W_v), queries from x",
        (B, h, S, S): "your weights are (B, h, S, S): the queries must come from x "
                      "(q = x @ W_q); only keys and values come from context",
        (B, h, S, T): "you swapped the roles: queries come from x, keys and values from context",
    }
    if np.shape(got[1]) in shapes and np.shape(got[1]) != want_w.shape:
        raise fail(ex, f"Likely mistake: {shapes[np.shape(got[1])]}")

    label = "" if h == 3 else f" for h={h}, T={T}, S={S}"
    variants = []
    for size in (1, 2, 3):  # the fewest bugs first: name only what this probe shows
        for on in combinations(_CROSS_BUGS, size):
            words = "; and ".join(_CROSS_BUGS[name] for name in on)
            prefix = "" if size == 1 else f"{size} of the colleague's bugs: "
            variants.append((prefix + words, lambda on=on: cross_attention_variant(
                layer, x, context, bugs=on)))
    variants.append(("scores not scaled by √d_k", lambda: cross_attention_variant(
        layer, x, context, scaled=False)))
    compare(ex, got[1], want_w, "your weights" + label, "(B, h, T, S)",
            variants=[(m, (lambda mk=mk: mk()[1])) for m, mk in variants],
            props=[rows_sum_to_one(ex, "your weights" + label)])
    compare(ex, got[0], want_out, "your output" + label, "(B, T, d_model)",
            variants=[(m, (lambda mk=mk: mk()[0])) for m, mk in variants],
            shape_hints={(B, T, layer.W_o.shape[0]): "you forgot the output projection: "
                                                     "merged heads @ layer.W_o"})


def check_cross_attention(fn) -> None:
    """Exercise 04.6: ``cross_attention(layer, x, context)`` -> (out, weights)."""
    ex = "04.6"
    rng = check_rng(406)
    for B, T, S, d_model, h, d_k, d_v in ((2, 4, 5, 10, 3, 6, 7), (1, 3, 6, 8, 2, 5, 3),
                                          (2, 4, 4, 12, 4, 2, 3)):
        layer = MultiHeadAttention(d_model, h, d_k=d_k, d_v=d_v, rng=rng)
        x = rng.normal(size=(B, T, d_model))
        context = rng.normal(size=(B, S, d_model))
        _check_cross_config(ex, fn, layer, x, context)
    passed(ex, "out (2, 4, 10) and weights (2, 3, 4, 5) match layer(x, context=context) "
               "for T=4 queries and S=5 context positions, and for h=2 and h=4 (with T = S)")
