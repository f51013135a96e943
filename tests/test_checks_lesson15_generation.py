"""Lesson 15's drill, the generation bugs from lesson 09 (15.16 to 15.18,
:mod:`mha_course.checks.drill.generation`): each named wrong fix is recognised.

The broken functions and the solutions come from ``solutions/15_interview_drill.ipynb``
through ``tests/drill_cells.py``; the drill's contract (each broken function fails naming
the property it breaks, each solution passes, the stub is "not attempted") is tested once,
over all 26 exercises, by ``tests/test_checks_drill.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed


# ------------------------------------------------------------------ named wrong fixes
def _nucleus(logits, p, kind):
    probs = mha_course.softmax(logits)
    order = np.argsort(probs if kind == "ascending" else -probs, axis=-1, kind="stable")
    sp = np.take_along_axis(probs, order, axis=-1)
    cum = np.cumsum(sp, axis=-1)
    if kind == "shift_no_first":  # fish-speech's fix, without forcing the first token in
        remove = cum > p
        shifted = remove.copy()
        shifted[..., 1:] = remove[..., :-1]  # shifted[..., 0] stays cum[0] > p
        keep_sorted = ~shifted
    else:
        keep_sorted = (cum - sp) < p
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    kept = np.where(keep, probs, 0.0)
    if kind == "not_renormalised":
        return kept
    with np.errstate(invalid="ignore"):
        return kept / kept.sum(axis=-1, keepdims=True)


def _sampling(logits, temperature, kind):
    scaled = {"twice": logits / temperature**2, "times": logits * temperature,
              "plus": logits + temperature}[kind]
    e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _offset(layer, x, n_prompt, kind):
    h, g = layer.h, layer.n_kv_heads
    keys = values = None
    offset, chunk, outs = 0, x[:n_prompt], []
    for t in range(n_prompt, len(x) + 1):
        positions = offset + np.arange(len(chunk))
        q = mha_course.apply_rope(mha_course.split_heads(chunk @ layer.W_q, h), positions,
                                  layout=layer.rope)
        k = mha_course.apply_rope(mha_course.split_heads(chunk @ layer.W_k, g), positions,
                                  layout=layer.rope)
        v = mha_course.split_heads(chunk @ layer.W_v, g)
        keys = k if keys is None else np.concatenate([keys, k], axis=-2)
        values = v if values is None else np.concatenate([values, v], axis=-2)
        heads, _ = mha_course.scaled_dot_product_attention(
            q, np.repeat(keys, h // g, axis=-3), np.repeat(values, h // g, axis=-3),
            mask=mha_course.causal_mask(len(chunk), keys.shape[-2]))
        outs.append(mha_course.merge_heads(heads) @ layer.W_o)
        offset += 1 if kind == "one" else len(chunk)
        chunk = x[t : t + 1]
    return np.concatenate(outs, axis=-2)


WRONG_FIXES = [
    ("nucleus-ascending", "check_nucleus", lambda lg, p: _nucleus(lg, p, "ascending"),
     r"sorted in increasing order"),
    ("nucleus-shift-without-the-first", "check_nucleus",
     lambda lg, p: _nucleus(lg, p, "shift_no_first"),
     r"keeps no token at all: the most probable token is always in the nucleus"),
    ("nucleus-not-renormalised", "check_nucleus",
     lambda lg, p: _nucleus(lg, p, "not_renormalised"), r"renormalise what the filter keeps"),
    ("nucleus-calls-top-p-filter", "check_nucleus",
     lambda lg, p: mha_course.softmax(mha_course.serving.sampling.top_p_filter(lg, p)),
     r"asks you to fix the filter; your answer calls .*top_p_filter"),
    ("temperature-twice", "check_temperature", lambda lg, t: _sampling(lg, t, "twice"),
     r"applied twice"),
    ("temperature-times", "check_temperature", lambda lg, t: _sampling(lg, t, "times"),
     r"multiplying the logits by τ sharpens"),
    ("temperature-added", "check_temperature", lambda lg, t: _sampling(lg, t, "plus"),
     r"are the same"),
    ("offset-plus-one-after-the-prompt", "check_decode_offset",
     lambda layer, x, n: _offset(layer, x, n, "one"), r"the prefill holds n_prompt of them"),
    ("offset-calls-the-layer", "check_decode_offset",
     lambda layer, x, n: layer(x, mask=mha_course.causal_mask(len(x)))[0],
     r"fix the loop, not replace it"),
]


@pytest.mark.parametrize(("name", "check", "fn", "match"), WRONG_FIXES,
                         ids=[w[0] for w in WRONG_FIXES])
def test_each_named_wrong_fix_is_recognised(name, check, fn, match):
    with pytest.raises(CheckFailed, match=match):
        getattr(checks, check)(fn)
