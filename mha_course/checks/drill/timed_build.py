"""The check of lesson 15's timed build (exercise 15.15): the interviewer, as a function.

The learner writes, from a blank cell and with NumPy only, ``build_attention(W_q, W_k, W_v,
W_o, h)`` returning an object with ``forward(x, causal=True)``, ``new_cache()`` and
``decode_step(x_t, cache)``. :func:`check_timed_build` asks what an interviewer asks, in order,
on three layers of different shapes (d_k ≠ d_model/h, d_v ≠ d_k, extra batch axes): does the
forward pass equal :class:`~mha_course.MultiHeadAttention`'s, is the causal one causal and
right, does decoding with the cache equal the causal forward. Grouped-query attention is
optional: a ``W_k`` narrower than ``W_q`` (g < h K/V heads) is tried last, and an object that
refuses it passes with "GQA not attempted".
"""

from __future__ import annotations

import numpy as np

from ... import MultiHeadAttention, causal_mask
from .. import properties as P
from ..harness import CheckFailed, call, check_rng, compare, fail, fmt_shape, passed
from ..properties import array, require
from ..variants import attention_hint

__all__ = ["check_timed_build"]

FORBID = {"mha_course": "write attention from a blank cell, with NumPy only"}
STEPS = ("forward without a mask", "causal forward", "decoding with your cache")


def _heads(layer, x, variant=None, causal=True):
    """The layer's forward with one classic slip (``variant``), for naming mistakes."""
    h, g = layer.h, layer.n_kv_heads

    def split(p, n):  # (..., T, n*d) -> (..., n, T, d)
        return np.swapaxes(p.reshape(*p.shape[:-1], n, -1), -3, -2)

    q, k, v = split(x @ layer.W_q, h), split(x @ layer.W_k, g), split(x @ layer.W_v, g)
    k, v = (np.tile(a, (h // g, 1, 1)) if variant == "tile" else np.repeat(a, h // g, axis=-3)
            for a in (k, v))
    s = q @ np.swapaxes(k, -1, -2) / (1.0 if variant == "unscaled" else np.sqrt(layer.d_k))
    T = x.shape[-2]
    if causal and variant != "no_mask":
        s = np.where(causal_mask(T), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w = w / w.sum(axis=-1, keepdims=True)
    if variant == "own_token":  # decode attending to the new token only
        w = np.broadcast_to(np.eye(T), w.shape)
    heads = w @ v  # (..., h, T, d_v)
    if variant == "reshape":
        return heads.reshape(*heads.shape[:-3], T, -1) @ layer.W_o
    return np.swapaxes(heads, -3, -2).reshape(*heads.shape[:-3], T, -1) @ layer.W_o


MISTAKES = (("scores not scaled by √d_k", "unscaled"),
            ("the heads merged with a reshape and no transpose: (..., h, T, d_v) must become "
             "(..., T, h, d_v) before (..., T, h·d_v)", "reshape"),
            ("no causal mask: each token saw the later ones", "no_mask"),
            ("each step attended only to its own token: attend over everything in the cache",
             "own_token"),
            ("np.tile lays the K/V heads out 0, 1, 0, 1: query head i must read K/V head "
             "i // (h/g), np.repeat's order", "tile"))


def _step(ex, method, args):
    """:func:`~mha_course.checks.harness.call` without its in-place test: a decode step must
    change its cache. Forbidden calls and exceptions are reported as ``call`` does."""
    return call(ex, method, args, ("x_t", "cache"), forbid=FORBID, inplace=False,
                who="your decode_step")


def _ask(ex, build, layer, x):
    """The three steps on one layer; a failed step says which step it was."""
    W = (layer.W_q, layer.W_k, layer.W_v, layer.W_o)
    lead, T, d_model = x.shape[:-2], x.shape[-2], layer.d_model
    label = f"for x {fmt_shape(x.shape)}, h={layer.h}, d_k={layer.d_k}, d_v={layer.d_v}" + (
        f", {layer.n_kv_heads} K/V heads" if layer.n_kv_heads != layer.h else "")
    obj = call(ex, build, (*W, layer.h), ("W_q", "W_k", "W_v", "W_o", "h"), forbid=FORBID)
    for method in ("forward", "new_cache", "decode_step"):
        if not callable(getattr(obj, method, None)):
            raise fail(ex, f"build_attention returned {type(obj).__name__}, which has no method "
                           f"`{method}`; return an object with forward, new_cache, decode_step")

    def forward(x_, causal):
        got = call(ex, obj.forward, (x_,), ("x",), {"causal": causal}, hint=attention_hint,
                   forbid=FORBID)
        return array(ex, got, (*x_.shape[:-1], d_model), f"your forward output {label}",
                     "(..., T, d_model)")

    for n, causal in ((1, False), (2, True)):
        wrong = [(m, lambda v=v, c=causal: _heads(layer, x, v, c)) for m, v in MISTAKES]
        out = forward(x, causal)
        if causal:  # an interviewer's first question: can a token see its future?
            x2 = np.concatenate([x[..., :2, :], 3 * x[..., 2:, :] + 1], axis=-2)
            found = P.moved_text(out[..., :2, :], forward(x2, True)[..., :2, :])
            require(ex, P.CAUSAL, found and f"step 2 ({STEPS[1]}) {label}: changing tokens "
                    f"2..{T - 1} moved {found}", out, wrong)
        want = layer(x, mask=causal_mask(T) if causal else None)[0]
        compare(ex, out, want, f"step {n} ({STEPS[n - 1]}): your output {label}",
                "(..., T, d_model)", variants=wrong)
    cache = call(ex, obj.new_cache, (), (), forbid=FORBID)
    steps = []
    for t in range(T):
        got = _step(ex, obj.decode_step, (x[..., t:t + 1, :], cache))
        steps.append(array(ex, got, (*lead, 1, d_model), f"step 3 ({STEPS[2]}): your output "
                           f"for token {t} {label}", "(..., 1, d_model)"))
    decoded = np.concatenate(steps, axis=-2)
    found = P.moved_text(layer(x, mask=causal_mask(T))[0], decoded)
    require(ex, P.CACHED, found and f"step 3 ({STEPS[2]}) {label}: {found}", decoded, wrong)


def check_timed_build(build) -> None:
    """Exercise 15.15: ``build_attention(W_q, W_k, W_v, W_o, h)`` -> forward / new_cache /
    decode_step, checked against MultiHeadAttention on three shapes, GQA optional."""
    ex, rng = "15.15", check_rng(915)
    shapes = (((2,), 5, 12, 3, 4, 4), ((), 6, 10, 2, 3, 5), ((2, 2), 3, 8, 4, 2, 3))
    for lead, T, d_model, h, d_k, d_v in shapes:
        layer = MultiHeadAttention(d_model, h, d_k, d_v, rng=rng)
        _ask(ex, build, layer, rng.normal(size=(*lead, T, d_model)))
    gqa = MultiHeadAttention(16, 4, 4, 4, n_kv_heads=2, rng=rng)
    x = rng.normal(size=(2, 5, 16))
    try:
        _ask(ex, build, gqa, x)
        note = "GQA (optional) matches too"
    except CheckFailed as exc:
        if "raised" not in str(exc):  # it ran and was wrong: that is a failure, not "optional"
            raise
        note = "GQA (optional) not attempted"
    passed(ex, f"{len(shapes)} shapes: forward, causal forward and decoding with your cache "
               f"match MultiHeadAttention; {note}")
