"""Checks for lesson 15's spot-the-bug drill: the generation bugs (15.16 to 15.18).

Taught with lesson 09 (``notebooks/09_tiny_gpt.ipynb``, §4: sampling and the KV cache) and
drilled in ``notebooks/15_interview_drill.ipynb``. Each bug comes from a public report: a top-p
filter that drops the token crossing the threshold, a temperature that cancels out because it
divides the probabilities instead of the logits, and a decoding offset advanced by the prompt's
length at every step. Like :mod:`mha_course.checks.drill.attention` and
:mod:`mha_course.checks.drill.decoding`, each check computes its reference at check time on
several shapes, names the first property the learner's function breaks with the evidence, and
recognises the likely wrong fixes.
"""

from __future__ import annotations

import numpy as np

from ... import (
    MultiHeadAttention,
    apply_rope,
    causal_mask,
    merge_heads,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from ...serving.sampling import top_p_filter
from ...variants.entropy import attention_entropy
from .. import properties as P
from ..harness import call, compare, fmt, passed
from ..measure import check_rng
from ..properties import array, require

__all__ = ["check_decode_offset", "check_nucleus", "check_temperature"]

#: The properties these checks name, beside those of :mod:`mha_course.checks.properties`.
DISTRIBUTION = "the result is a probability distribution: non-negative, each row sums to 1"
NUCLEUS = ("the nucleus is the smallest set of most probable tokens whose probability sums to at "
           "least p")
TEMPERATURE = ("temperature reshapes the distribution: softmax(logits / τ), so τ < 1 sharpens it, "
               "τ > 1 flattens it and τ = 1 is the model's own softmax")
LAYER_CALLS = ("forward", "__call__", "step", "decode_step", "init_cache")


def _distribution(ex, got, shape, label):
    arr = array(ex, got, shape, f"your distribution {label}", "(..., V)")
    sums = arr.sum(axis=-1)
    bad = np.argwhere(~np.isclose(sums, 1.0, atol=1e-9))
    require(ex, DISTRIBUTION, (arr < 0).any() and f"{label}: an entry is {fmt(arr.min())}")
    if len(bad):
        row = tuple(int(i) for i in bad[0])
        empty = not np.nansum(arr[row]) > 0
        require(ex, DISTRIBUTION, f"{label}: row {row} sums to {fmt(sums[row])}" + (
            "; it keeps no token at all: the most probable token is always in the nucleus "
            "(a mask shifted by one position must still keep the first)" if empty else
            "; renormalise what the filter keeps"))
    return arr


# ------------------------------------------------- 15.16 top-p drops the crossing token
def _nucleus_variant(logits, p, rule):
    probs = softmax(logits)
    order = np.argsort(-probs, axis=-1, kind="stable")
    sp = np.take_along_axis(probs, order, axis=-1)
    cum = np.cumsum(sp, axis=-1)
    if rule == "ascending":  # the least probable first
        order = np.argsort(probs, axis=-1, kind="stable")
        sp = np.take_along_axis(probs, order, axis=-1)
        cum = np.cumsum(sp, axis=-1)
    keep_sorted = (cum - sp) < p
    keep_sorted[..., 0] = True
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    kept = np.where(keep, probs, 0.0)
    return kept / np.maximum(kept.sum(-1, keepdims=True), 1e-300)


def check_nucleus(fn) -> None:
    """Exercise 15.16: ``nucleus_probs(logits, p)`` -> the distribution top-p samples from."""
    ex, rng = "15.16", check_rng(1316)
    probes = [("for probabilities [0.4, 0.3, 0.2, 0.1] and p = 0.8",
               np.log(np.array([0.4, 0.3, 0.2, 0.1])), 0.8),
              ("for probabilities [0.5, 0.41, 0.09] and p = 0.9",
               np.log(np.array([0.5, 0.41, 0.09])), 0.9),
              ("for a batch (2, 3, 9) of random logits and p = 0.6",
               rng.normal(size=(2, 3, 9)) * 1.5, 0.6),
              ("for a confident row [0.9, 0.05, 0.05] and p = 0.5",
               np.log(np.array([0.9, 0.05, 0.05])), 0.5)]
    for label, logits, p in probes:
        want = softmax(top_p_filter(logits, p))
        got = call(ex, fn, (logits.copy(), p), ("logits", "p"),
                   forbid={"mha_course.serving.sampling.top_p_filter": "fix the filter",
                           "mha_course.serving.sampling.next_token": "fix the filter"})
        arr = _distribution(ex, got, want.shape, label)
        probs = softmax(logits)
        kept = arr > 0
        mass = np.where(kept, probs, 0.0).sum(-1)
        short = np.argwhere(mass < p - 1e-12)
        wrong = [("the probabilities were sorted in increasing order: the nucleus is the most "
                  "probable tokens, so sort in decreasing order (argsort of -probs)",
                  lambda lg=logits, p=p: _nucleus_variant(lg, p, "ascending"))]
        require(ex, NUCLEUS, len(short) and f"{label}: the tokens you keep have probability "
                f"{fmt(mass[tuple(short[0])])} in all, less than p = {p}", arr, wrong)
        want_kept = want > 0
        extra = np.argwhere(kept & ~want_kept)
        require(ex, NUCLEUS, len(extra) and f"{label}: you keep token {tuple(extra[0])[-1]} "
                "although the more probable tokens before it already reach p", arr, wrong)
        compare(ex, arr, want, f"your distribution {label}", "(..., V)")
    passed(ex, "the nucleus keeps the crossing token and matches top-p sampling's distribution, "
               "on one row, a confident row and a (2, 3, 9) batch")


# ------------------------------------------------------ 15.17 temperature that cancels out
def check_temperature(fn) -> None:
    """Exercise 15.17: ``sampling_probs(logits, temperature)`` -> softmax(logits / τ)."""
    ex, rng = "15.17", check_rng(1317)
    for shape in ((6,), (2, 4, 7)):
        logits = rng.normal(size=shape) * 2
        outs = {}
        for tau in (0.5, 1.0, 2.0):
            label = f"for logits of shape {shape} at temperature {tau}"
            got = call(ex, fn, (logits.copy(), tau), ("logits", "temperature"),
                       forbid={"mha_course.serving.sampling.apply_temperature": "fix the "
                               "temperature yourself", "mha_course.serving.sampling.next_token":
                               "fix the temperature yourself"})
            outs[tau] = _distribution(ex, got, shape, label)
        label = f"for logits of shape {shape}"
        h = {tau: float(attention_entropy(o).mean()) for tau, o in outs.items()}
        twice = ("the temperature is applied twice: softmax(logits / τ²), as in "
                 "RL-Align/RL-Kernel#81", lambda lg=logits: softmax(lg / 0.25))
        times = ("multiplying the logits by τ sharpens where dividing should flatten",
                 lambda lg=logits: softmax(lg * 0.5))
        require(ex, TEMPERATURE, np.allclose(outs[0.5], outs[2.0]) and f"{label}: your "
                f"distributions at τ = 0.5 and τ = 2 are the same (entropy {fmt(h[0.5])} both)")
        require(ex, TEMPERATURE, not (h[0.5] < h[1.0] < h[2.0]) and f"{label}: the entropy at "
                f"τ = 0.5, 1, 2 is {fmt(h[0.5])}, {fmt(h[1.0])}, {fmt(h[2.0])}; it must grow "
                "with τ", outs[0.5], [times])
        require(ex, TEMPERATURE, not np.allclose(outs[1.0], softmax(logits)) and f"{label}: at "
                "τ = 1 your distribution is not the softmax of the logits", outs[1.0])
        for tau, out in outs.items():
            compare(ex, out, softmax(logits / tau), f"your distribution {label} at τ = {tau}",
                    "(..., V)", variants=[twice] if tau == 0.5 else ())
    passed(ex, "softmax(logits / τ) for τ = 0.5, 1, 2 on one row and a (2, 4, 7) batch: the "
               "entropy grows with τ")


# ------------------------------------------- 15.18 a decoding offset advanced by the prompt
def _offset_decode(layer, x, n_prompt, rule):
    """The drill's loop with a given rule for advancing the offset (a known wrong fix)."""
    h, g = layer.h, layer.n_kv_heads
    keys = values = None
    offset, chunk, outs = 0, x[:n_prompt], []
    for t in range(n_prompt, len(x) + 1):
        T = len(chunk)
        positions = offset + np.arange(T)
        q = apply_rope(split_heads(chunk @ layer.W_q, h), positions, layout=layer.rope)
        k = apply_rope(split_heads(chunk @ layer.W_k, g), positions, layout=layer.rope)
        v = split_heads(chunk @ layer.W_v, g)
        keys = k if keys is None else np.concatenate([keys, k], axis=-2)
        values = v if values is None else np.concatenate([values, v], axis=-2)
        heads, _ = scaled_dot_product_attention(
            q, np.repeat(keys, h // g, axis=-3), np.repeat(values, h // g, axis=-3),
            mask=causal_mask(T, keys.shape[-2]))
        outs.append(merge_heads(heads) @ layer.W_o)
        offset += {"one": 1, "right": T}[rule]
        chunk = x[t : t + 1]
    return np.concatenate(outs, axis=-2)


def check_decode_offset(fn) -> None:
    """Exercise 15.18: ``cached_outputs(layer, x, n_prompt)``: prefill ``x[:n_prompt]``, then
    one position at a time over a cache; equal to the layer's causal forward."""
    ex, rng = "15.18", check_rng(1318)
    for layer, T, n_prompt in (
            (MultiHeadAttention(16, 4, n_kv_heads=2, rope="half", rng=rng), 9, 4),
            (MultiHeadAttention(8, 2, 6, 5, rope="interleaved", rng=rng), 7, 3),
            (MultiHeadAttention(10, 5, rope="half", rng=rng), 6, 1)):
        x = rng.normal(size=(T, layer.d_model))
        want = layer(x, mask=causal_mask(T))[0]
        got = call(ex, fn, (layer, x, n_prompt), ("layer", "x", "n_prompt"),
                   forbid={**{f"mha_course.MultiHeadAttention.{m}": "fix the loop, not "
                              "replace it by the layer's own passes" for m in LAYER_CALLS}})
        label = (f"{layer!r}, {T} positions after a prompt of {n_prompt}")
        out = array(ex, got, want.shape, f"your outputs for {label}", "(T, d_model)")
        found = P.moved_text(want, out)
        require(ex, P.CACHED, found and f"{label}: {found}", out, [
            ("adding 1 per step is right for the decoded tokens, but the prefill holds "
             "n_prompt of them: after it the offset is n_prompt, not 1",
             lambda layer=layer, x=x, n=n_prompt: _offset_decode(layer, x, n, "one"))])
        compare(ex, out, want, f"your outputs for {label}", "(T, d_model)")
    passed(ex, "prefill then one token at a time equals the causal forward, for three layers "
               "(GQA, both RoPE layouts) and prompts of 4, 3 and 1 tokens")
