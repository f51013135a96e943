"""Lesson 15's drill, 15.1 to 15.15 (:mod:`mha_course.checks.drill.attention`, ``.decoding``,
``.timed_build``): a fix that only hides the symptom fails, named; the timed build's
interviewer; the property audit.

The broken functions and the solutions come from ``solutions/15_interview_drill.ipynb``
through ``tests/drill_cells.py``; the drill's contract (each broken function fails naming
the property it breaks, each solution passes, the stub is "not attempted") is tested once,
over all 26 exercises, by ``tests/test_checks_drill.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from drill_cells import CELLS, CHECKS, CORRECT_13, define
from hypothesis import given
from hypothesis import strategies as st

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, drill, properties


# ---------------------------------------------------- fixes that hide the symptom: still fail
def _scores(q, k):
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])


def _sdpa(q, k, v, mask=None):
    return mha_course.scaled_dot_product_attention(q, k, v, mask=mask)


def heads_by_model_width_over_h(x, W_q, W_k, W_v, W_o, h):
    q, k, v = (mha_course.split_heads(x @ W, h) for W in (W_q, W_k, W_v))
    weights = mha_course.softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(x.shape[-1] / h))
    return mha_course.merge_heads(weights @ v) @ W_o, weights


def causal_tril_triu_swapped(q, k, v):
    T = q.shape[-2]
    future = np.tril(np.ones((T, T), dtype=bool), k=-1)  # "shouldn't it be tril?"
    return _sdpa(q, k, v, mask=~future)


def causal_first_row_patched(q, k, v):
    T = q.shape[-2]
    future = np.triu(np.ones((T, T), dtype=bool))
    future[0, 0] = False  # query 0 had nothing: let it see itself
    return _sdpa(q, k, v, mask=~future)


def mask_then_renormalise(q, k, v, mask):
    w = mha_course.softmax(_scores(q, k)) * mask
    w = w / w.sum(axis=-1, keepdims=True)
    return w @ v, w


def bias_nan_cleaned(q, k, v, keep):
    w = np.nan_to_num(mha_course.softmax(_scores(q, k) + (1.0 - keep) * -np.inf))
    return w @ v, w


def bias_minus_1e9(q, k, v, keep):
    w = mha_course.softmax(_scores(q, k) + (1.0 - keep) * -1e9)
    return w @ v, w


def _keep(scores, valid_lens):
    return np.arange(scores.shape[-1])[None, None, :] < valid_lens[:, None, None]


def softmax_minus_inf(scores, valid_lens):
    return mha_course.softmax(np.where(_keep(scores, valid_lens), scores, -np.inf))


def softmax_minus_inf_cleaned(scores, valid_lens):
    return np.nan_to_num(softmax_minus_inf(scores, valid_lens))


def softmax_minus_1e30(scores, valid_lens):
    return mha_course.softmax(np.where(_keep(scores, valid_lens), scores, -1e30))


def merge_swapping_axes_0_1(x, W_q, W_k, W_v, W_o, h):
    *batch, T, _ = x.shape
    heads, w = _sdpa(*(mha_course.split_heads(x @ W, h) for W in (W_q, W_k, W_v)))
    return np.swapaxes(heads, 0, 1).reshape(*batch, T, -1) @ W_o, w


def _xavier(rng, fan_in, fan_out):
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=(fan_in, fan_out))


def init_square_w_o(d_model, h, d_k=None, d_v=None, rng=None):
    rng = np.random.default_rng(rng)
    d_k = d_model // h if d_k is None else d_k
    d_v = d_k if d_v is None else d_v
    return {"W_q": _xavier(rng, d_model, h * d_k), "W_k": _xavier(rng, d_model, h * d_k),
            "W_v": _xavier(rng, d_model, h * d_v), "W_o": _xavier(rng, d_model, d_model)}


def init_w_o_cut_down(d_model, h, d_k=None, d_v=None, rng=None):
    weights = init_square_w_o(d_model, h, d_k, d_v, rng)
    d_v = weights["W_v"].shape[1] // h
    weights["W_o"] = _xavier(np.random.default_rng(rng), h * d_model, d_model)[: h * d_v]
    return weights


def _dropout(how):
    def dropout(weights, p, rng, training=True):
        if not training:
            return weights
        keep = np.random.default_rng(rng).random(weights.shape) >= p
        if how == "times":
            return np.where(keep, weights * (1 - p), 0.0)
        if how == "keep_with_p":
            return np.where(~keep, weights / (1 - p), 0.0)
        dropped = np.where(keep, weights, 0.0)
        return dropped / dropped.sum(axis=-1, keepdims=True)

    return dropout


def chunk_without_mask(q, k, v, causal_buffer):
    return _sdpa(q, k, v)


def chunk_top_left(q, k, v, causal_buffer):  # the broken version: right only for the first chunk
    T, S = q.shape[-2], k.shape[-2]
    return _sdpa(q, k, v, mask=causal_buffer[:T, :S])


def chunk_last_row_only(q, k, v, causal_buffer):
    S = k.shape[-2]
    return _sdpa(q, k, v, mask=causal_buffer[S - 1 : S, :S])


def _prompts(position):
    def run_prompts(layer, prompts, max_len=64):
        h, K, V = layer.h, np.zeros((layer.h, max_len, layer.d_k)), np.zeros((layer.h, max_len,
                                                                              layer.d_v))
        pos, outputs = 0, []
        for x in prompts:
            rows = []
            for t in range(len(x)):
                q, k, v = (mha_course.split_heads(x[t : t + 1] @ W, h)
                           for W in (layer.W_q, layer.W_k, layer.W_v))
                at = np.array([position(t, pos)])
                q, k = (mha_course.apply_rope(a, at, layout=layer.rope) for a in (q, k))
                K[:, pos], V[:, pos] = k[:, 0], v[:, 0]
                pos += 1
                heads, _ = _sdpa(q, K[:, :pos], V[:, :pos])
                rows.append(mha_course.merge_heads(heads) @ layer.W_o)
            outputs.append(np.concatenate(rows))
            if position(1, 0) == 0:  # the "positions at 0" version resets its cache
                pos = 0
        return outputs

    return run_prompts


def gqa_caching_the_repeated_heads(layer, x):
    h, g, T = layer.h, layer.n_kv_heads, x.shape[-2]
    q = mha_course.split_heads(x @ layer.W_q, h)
    k, v = (np.repeat(mha_course.split_heads(x @ W, g), h // g, axis=-3)
            for W in (layer.W_k, layer.W_v))
    heads, _ = _sdpa(q, k, v, mask=mha_course.causal_mask(T))
    return mha_course.merge_heads(heads) @ layer.W_o, (k, v)


def _rope(rotate=True, layout=None):
    def rope_attention(layer, x, positions):
        h, T = layer.h, x.shape[0]
        q, k, v = (mha_course.split_heads(x @ W, h) for W in (layer.W_q, layer.W_k, layer.W_v))
        if rotate:
            q, k = (mha_course.apply_rope(a, positions, layout=layout or layer.rope)
                    for a in (q, k))
        heads, _ = _sdpa(q, k, v, mask=mha_course.causal_mask(T))
        return mha_course.merge_heads(heads) @ layer.W_o

    return rope_attention


def _window(keep):
    def window_attention(q, k, v, window):
        T = q.shape[-2]
        return _sdpa(q, k, v, mask=keep(np.arange(T)[:, None], np.arange(T)[None, :], window))

    return window_attention


def mla_two_latents(config, seq_len, batch=1, bytes_per_value=2):
    return 2 * config["num_hidden_layers"] * config["kv_lora_rank"] * seq_len * batch * (
        bytes_per_value)


def mla_rope_key_per_head(config, seq_len, batch=1, bytes_per_value=2):
    d = config["kv_lora_rank"] + config["num_attention_heads"] * config["qk_rope_head_dim"]
    return config["num_hidden_layers"] * d * seq_len * batch * bytes_per_value


P, L9, D9 = properties, drill.attention, drill.decoding
WRONG_FIXES = [
    ("15.1", heads_by_model_width_over_h, P.HEADS, r"√\(d_model / h\)"),
    ("15.2", causal_tril_triu_swapped, P.CAUSAL, r"wrong way round \(tril and triu swapped"),
    ("15.2", causal_first_row_patched, P.SELF, r"patching the first row"),
    ("15.3", mask_then_renormalise, P.MASK_FREE, r"renormalising after the softmax"),
    ("15.4", bias_nan_cleaned, P.SUMS, r"np.nan_to_num turns the NaN weights into 0"),
    ("15.4", bias_minus_1e9, P.FINITE, r"-1e9 is -inf in float16"),
    ("15.5", softmax_minus_inf, P.FINITE, r"-inf - \(-inf\) is NaN"),
    ("15.5", softmax_minus_inf_cleaned, P.NO_NAN_INSIDE, None),
    ("15.5", softmax_minus_1e30, P.MASKED_ZERO, None),
    ("15.6", merge_swapping_axes_0_1, f"({re.escape(P.EQUIVARIANT)}|{re.escape(P.BATCH)})",
     r"swaps batch and heads"),
    ("15.7", init_square_w_o, L9.FITS, None),
    ("15.7", init_w_o_cut_down, L9.XAVIER, r"drawn for a wider input"),
    ("15.8", _dropout("times"), L9.EXPECTED, r"multiplied the survivors by 1 - p"),
    ("15.8", _dropout("renormalise"), L9.EXPECTED, r"renormalising each row"),
    ("15.8", _dropout("keep_with_p"), L9.DROPPED, r"kept each weight with probability p"),
    ("15.9", chunk_without_mask, P.CAUSAL, r"saw the whole chunk.*no mask"),
    ("15.9", chunk_last_row_only, P.CAUSAL, r"saw the whole chunk.*a \(1, S\) row of the buffer"),
    ("15.10", _prompts(lambda t, pos: t), D9.PROMPTS, r"still holds the earlier prompts' keys"),
    ("15.10", _prompts(lambda t, pos: 0), P.CACHED, r"as if it sat at position 0"),
    ("15.11", gqa_caching_the_repeated_heads, D9.GQA_CACHE, r"cached the h repeated K/V heads"),
    ("15.12", _rope(rotate=False), D9.ORDER, r"without RoPE on q and k"),
    ("15.12", _rope(layout="half"), P.REFERENCE, r"transformers#25199"),
    ("15.13", _window(lambda t, s, w: (s < t) & (s >= t - w)), P.SELF, None),
    ("15.13", _window(lambda t, s, w: (s <= t) & (s > t - w + 1)), D9.WINDOW, None),
    ("15.14", mla_two_latents, D9.MEASURED, r"LMCache PR #694"),
    ("15.14", mla_rope_key_per_head, D9.MEASURED, r"shared by all heads"),
]


@pytest.mark.parametrize(("ex", "wrong", "prop", "likely"), WRONG_FIXES,
                         ids=[f"{w[0]}-{w[1].__qualname__.split('.')[0]}" for w in WRONG_FIXES])
def test_a_fix_that_hides_the_symptom_fails(ex, wrong, prop, likely, capsys):
    with pytest.raises(CheckFailed) as info:
        getattr(checks, CHECKS[ex])(wrong)
    message = str(info.value)
    pattern = prop if prop.startswith("(") else re.escape(prop)
    assert re.match(rf"Exercise {re.escape(ex)}: property violated: {pattern}\. ", message), message
    if likely:
        assert re.search(rf"Likely mistake: .*{likely}", message), message
    assert capsys.readouterr().out == ""


def test_the_chunk_check_tests_one_new_token_explicitly():
    # Review D2: with True = may attend, the top-left corner gives a single new token key 0 only;
    # the check says so in the T = 1 case, before any chunk of several tokens.
    with pytest.raises(CheckFailed) as info:
        checks.check_chunk_mask(chunk_top_left)
    message = str(info.value)
    assert message.startswith(f"Exercise 15.9: property violated: {P.CACHED}. ")
    assert "for one new token (T = 1) at position 1 over 2 keys" in message, message
    assert "single-token decoding attends to the first token only" in message, message


def test_a_fix_that_calls_the_package_instead_is_refused():
    def run_prompts(layer, prompts):
        return [layer(x, mask=mha_course.causal_mask(len(x)))[0] for x in prompts]

    with pytest.raises(CheckFailed, match=r"^Exercise 15.10 asks you to write the decoding loop"):
        checks.check_cache_reset(run_prompts)


# ---------------------------------------------------------------------- the timed build
def _build(slip=None, gqa=True):
    """A build_attention with one classic slip, for the interviewer's messages."""
    def build_attention(W_q, W_k, W_v, W_o, h):
        d_k = W_q.shape[1] // h
        g = W_k.shape[1] // d_k
        if g != h and not gqa:
            raise ValueError("this build does one K/V head per query head")

        def split(p, n):
            return np.swapaxes(p.reshape(*p.shape[:-1], n, -1), -3, -2)

        def attend(q, k, v, causal):
            if slip == "tile":
                k, v = (np.tile(a, (h // g, 1, 1)) for a in (k, v))
            else:
                k, v = (np.repeat(a, h // g, axis=-3) for a in (k, v))
            s = q @ np.swapaxes(k, -1, -2) / (1.0 if slip == "unscaled" else np.sqrt(d_k))
            T, S = s.shape[-2:]
            allowed = np.tril(np.ones((T, S), dtype=bool), k=S - T)
            if causal and slip != "after":
                s = np.where(allowed, s, -np.inf)
            w = np.exp(s - s.max(axis=-1, keepdims=True))  # NumPy only: mha_course is forbidden
            w = w / w.sum(axis=-1, keepdims=True)
            if causal and slip == "after":
                w = w * allowed
            heads = w @ v
            if slip == "reshape":
                return heads.reshape(*heads.shape[:-3], T, -1) @ W_o
            return np.swapaxes(heads, -3, -2).reshape(*heads.shape[:-3], T, -1) @ W_o

        class Attention:
            def forward(self, x, causal=True):
                return attend(split(x @ W_q, h), split(x @ W_k, g), split(x @ W_v, g),
                              causal and slip != "no_mask")

            def new_cache(self):
                return []

            def decode_step(self, x_t, cache):
                cache.append(x_t)
                seen = x_t if slip == "own_token" else np.concatenate(cache, axis=-2)
                return attend(split(x_t @ W_q, h), split(seen @ W_k, g), split(seen @ W_v, g),
                              causal=False)

        return Attention()

    return build_attention


def test_a_build_without_gqa_passes_with_gqa_not_attempted(capsys):
    checks.check_timed_build(_build(gqa=False))
    assert capsys.readouterr().out.rstrip().endswith("GQA (optional) not attempted")


@pytest.mark.parametrize(("slip", "pattern"), [
    ("unscaled", r"step 1 \(forward without a mask\).*not scaled by √d_k"),
    ("reshape", r"step 1 \(forward without a mask\).*reshape and no transpose"),
    ("no_mask", r"property violated: causality.*step 2 .*Likely mistake: no causal mask"),
    ("after", r"step 2 \(causal forward\)"),
    ("own_token", r"property violated: cached == uncached.*step 3.*only to its own token"),
    ("tile", r"8 query heads|4 K/V|2 K/V heads.*np.tile"),
])
def test_the_interviewer_says_which_step_failed_and_why(slip, pattern):
    with pytest.raises(CheckFailed, match=rf"^Exercise 15.15: .*{pattern}"):
        checks.check_timed_build(_build(slip))


def test_the_timed_build_refuses_the_package():
    def build_attention(W_q, W_k, W_v, W_o, h):
        layer = mha_course.MultiHeadAttention.from_per_head(
            np.stack(np.split(W_q, h, axis=1)), np.stack(np.split(W_k, h, axis=1)),
            np.stack(np.split(W_v, h, axis=1)), W_o)

        class Attention:
            def forward(self, x, causal=True):
                return layer(x, mask=mha_course.causal_mask(x.shape[-2]) if causal else None)[0]

        return Attention()

    with pytest.raises(CheckFailed, match=r"^Exercise 15.15 asks you to write attention from a "
                                          r"blank cell, with NumPy only"):
        checks.check_timed_build(build_attention)


def test_the_decode_step_may_change_its_cache_but_not_call_the_package():
    build = _build()

    def sneaky(W_q, W_k, W_v, W_o, h):
        obj = build(W_q, W_k, W_v, W_o, h)
        step = obj.decode_step

        class Sneaky:
            forward, new_cache = obj.forward, obj.new_cache

            def decode_step(self, x_t, cache):
                mha_course.softmax(np.zeros(2))
                return step(x_t, cache)

        return Sneaky()

    with pytest.raises(CheckFailed, match=r"^Exercise 15.15 asks you to .*mha_course.softmax"):
        checks.check_timed_build(sneaky)


# ---------------------------------------------------------------- the property tests, audited
def test_audit_finds_nothing_wrong_with_the_package():
    audit = properties.audit_attention(
        lambda q, k, v, mask: mha_course.scaled_dot_product_attention(q, k, v, mask=mask))
    assert audit == dict.fromkeys(audit)


@pytest.mark.parametrize(("attn", "broken"), [
    (lambda q, k, v, mask: (lambda w: (w @ v, w))(mha_course.softmax(_scores(q, k)) * (
        1 if mask is None else mask)), {properties.SUMS, properties.CAUSAL, properties.MASK_FREE}),
    (lambda q, k, v, mask: _sdpa(q, k, v), {properties.MASKED_ZERO, properties.CAUSAL,
                                            properties.MASK_FREE}),
    (lambda q, k, v, mask: _sdpa(q, k, v, mask) if mask is not None else _sdpa(
        q, k[::-1], v[::-1]), {properties.BATCH}),
    (lambda q, k, v, mask: _sdpa(q, k, v, mha_course.causal_mask(q.shape[-2]) if mask is None
                                 else mask), {properties.EQUIVARIANT}),
    (lambda q, k, v, mask: 1 / 0, set(properties.ALL) - {properties.SELF, properties.CACHED}),
])
def test_audit_names_what_a_broken_attention_breaks(attn, broken):
    audit = properties.audit_attention(attn)
    assert {p for p, evidence in audit.items() if evidence} == broken


def test_moved_reports_the_largest_change_and_treats_nan_as_a_change():
    assert properties.moved(np.zeros(3), np.zeros(3)) is None
    assert properties.moved(np.zeros(3), np.array([0.0, 2.0, -5.0]))[0] == (2,)
    assert properties.moved(np.zeros(2), np.array([0.0, np.nan]))[0] == (1,)
    assert properties.moved_text(np.ones((2, 2)), np.eye(2)) == "output (0, 1) moved from " \
                                                                "1.0000 to 0.0000"


# ------------------------------------------- property-based: any shape, not just the probes
def _broken(ex):
    """The broken function of exercise ``ex``, without running its cell's demo lines."""
    return define(CELLS[ex]["broken"].split("\n\n\n")[0], "buggy_")


@given(T=st.integers(1, 9), d_k=st.integers(1, 5), d_v=st.integers(1, 5),
       seed=st.integers(0, 2**32 - 1))
def test_the_causal_fix_keeps_its_properties_on_any_shape_and_the_bug_never_does(T, d_k, d_v,
                                                                                  seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k)), rng.normal(size=(T, d_v))
    weights = CORRECT_13["15.2"][1](q, k, v)[1]
    assert properties.self_weight_violation(weights) is None
    assert properties.row_sum_violation(weights) is None
    assert properties.masked_weight_violation(weights, mha_course.causal_mask(T)) is None
    assert properties.self_weight_violation(_broken("15.2")(q, k, v)[1]) is not None


@given(T=st.integers(1, 9), window=st.integers(1, 10), seed=st.integers(0, 2**32 - 1))
def test_the_window_fix_sees_exactly_the_window_and_the_bug_one_more(T, window, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(T, 3)), rng.normal(size=(T, 3)), rng.normal(size=(T, 2))
    seen = np.arange(T) + 1
    fixed = (CORRECT_13["15.13"][1](q, k, v, window)[1] > 0).sum(axis=-1)
    broken = (_broken("15.13")(q, k, v, window)[1] > 0).sum(axis=-1)
    np.testing.assert_array_equal(fixed, np.minimum(window, seen))
    np.testing.assert_array_equal(broken, np.minimum(window + 1, seen))
