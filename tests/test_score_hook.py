"""The score hook of scaled_dot_product_attention (``score_mod``, ``sink``): each variant that
changes the scores (soft-capping, ALiBi, learned sinks, differential and sparse attention, the
2025 block of lesson 13) goes through the one function and equals its formula written out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_course import alibi_bias, alibi_slopes, causal_mask, scaled_dot_product_attention, softmax
from mha_course.heads import merge_heads, split_heads
from mha_course.models.gpt import GPTConfig
from mha_course.models.gpt_variants import BlockVariant, VariantGPT
from mha_course.positions import apply_rope
from mha_course.variants.gated_attention import differential_attention
from mha_course.variants.logit_control import soft_cap
from mha_course.variants.sinks import sink_attention
from mha_course.variants.sparse_attention import compress_kv, nsa_attention

B, h, T, S, d_k, d_v = 2, 3, 5, 7, 4, 6


def reference(scores, v, mask=None, sink=None):
    """softmax([scores | sink]) with the sink's column dropped, then @ v, written out."""
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    cols = [scores]
    if sink is not None:
        cols.append(np.broadcast_to(sink, scores.shape[:-1] + (1,)))
    full = np.concatenate(cols, axis=-1)
    top = full.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(full - top)
    total = e.sum(axis=-1, keepdims=True)
    w = e / np.where(total == 0, 1.0, total)
    weights = w[..., : scores.shape[-1]]
    return weights @ v, weights


@pytest.fixture
def qkv(rng):
    return (rng.normal(size=(B, h, T, d_k)) * 2, rng.normal(size=(B, h, S, d_k)) * 2,
            rng.normal(size=(B, h, S, d_v)))


def test_score_mod_gets_the_scaled_scores_and_flexattention_indices(qkv):
    q, k, v = qkv
    seen = {}

    def spy(scores, q_idx, kv_idx):
        seen.update(scores=scores.copy(), q_idx=q_idx, kv_idx=kv_idx)
        return scores

    out, weights = scaled_dot_product_attention(q, k, v, score_mod=spy)
    np.testing.assert_allclose(seen["scores"], q @ np.swapaxes(k, -1, -2) / math.sqrt(d_k),
                               rtol=1e-12)
    assert seen["q_idx"].tolist() == [[t] for t in range(T)]
    assert seen["kv_idx"].tolist() == [list(range(S))]
    plain = scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, plain[0], rtol=1e-12)
    np.testing.assert_allclose(weights, plain[1], rtol=1e-12)


def test_soft_capping_through_the_hook_is_the_capped_softmax(qkv):
    q, k, v = qkv
    cap, mask = 1.5, causal_mask(T, S)
    out, weights = scaled_dot_product_attention(
        q, k, v, mask=mask, score_mod=lambda s, q_idx, kv_idx: soft_cap(s, cap))
    raw = np.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d_k)
    ref_out, ref_w = reference(cap * np.tanh(raw / cap), v, mask)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights, ref_w, rtol=1e-10, atol=1e-12)


def test_alibi_through_the_hook_adds_minus_slope_times_distance(qkv):
    q, k, v = qkv
    slopes = alibi_slopes(h)  # (h,)

    def alibi(s, q_idx, kv_idx):  # queries are the last T of S positions (bottom-right)
        return s - slopes[:, None, None] * (q_idx + (S - T) - kv_idx)

    mask = causal_mask(T, S)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, score_mod=alibi)
    raw = np.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d_k)
    dist = (np.arange(T)[:, None] + S - T) - np.arange(S)[None, :]
    ref_out, ref_w = reference(raw - slopes[:, None, None] * dist, v, mask)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    # and the package's own bias, alibi_bias(h, T, S), is the same change
    out2, _ = scaled_dot_product_attention(
        q, k, v, mask=mask, score_mod=lambda s, q_idx, kv_idx: s + alibi_bias(h, T, S))
    np.testing.assert_allclose(out2, out, rtol=1e-12)


def test_a_sink_is_one_more_softmax_column_that_is_dropped(qkv):
    q, k, v = qkv
    sink = np.array([0.0, 2.0, -1.0])[:, None, None]  # (h, 1, 1)
    mask = causal_mask(T, S).copy()
    mask[1] = False  # a fully masked row: all its weight on the sink, output 0
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, sink=sink)
    raw = np.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(d_k)
    ref_out, ref_w = reference(raw, v, mask, sink)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights, ref_w, rtol=1e-10, atol=1e-12)
    assert np.array_equal(out[..., 1, :], np.zeros((B, h, d_v)))
    assert (weights.sum(axis=-1) < 1).all()


def test_sink_attention_is_sdpa_with_its_sink(qkv):
    q, k, v = qkv
    sink = np.array([0.5, -2.0, 1.0])
    out, w, p = sink_attention(q, k, v, sink, causal_mask(T, S))
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask=causal_mask(T, S),
                                                  sink=sink[:, None, None])
    np.testing.assert_allclose(out, ref_out, rtol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=1e-12)
    np.testing.assert_allclose(p, 1 - w.sum(axis=-1), rtol=1e-10, atol=1e-12)


def test_differential_attention_is_the_difference_of_two_softmaxes(rng):
    q1, q2 = rng.normal(size=(2, B, h, T, d_k))
    k1, k2 = rng.normal(size=(2, B, h, S, d_k))
    v = rng.normal(size=(B, h, S, d_v))
    lam, mask = np.array([0.2, 0.5, 0.8]), causal_mask(T, S)
    out, weights, (w1, w2) = differential_attention(q1, k1, q2, k2, v, lam, mask)
    scale = 1 / math.sqrt(d_k)
    ref_w1 = softmax(q1 @ np.swapaxes(k1, -1, -2) * scale, mask=mask)
    ref_w2 = softmax(q2 @ np.swapaxes(k2, -1, -2) * scale, mask=mask)
    ref = ref_w1 - lam[:, None, None] * ref_w2
    np.testing.assert_allclose(weights, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out, ref @ v, rtol=1e-10, atol=1e-12)


def test_nsa_compressed_branch_is_attention_over_the_block_summaries(rng):
    q, k, v = rng.normal(size=(16, 4)), rng.normal(size=(16, 4)), rng.normal(size=(16, 3))
    out, parts = nsa_attention(q, k, v, block=4, n_select=2, window=4)
    k_cmp, v_cmp, ends = compress_kv(k, v, 4)
    allowed = ends[None, :] <= np.arange(16)[:, None]  # the whole block in the query's past
    ref_out, _ = reference(q @ k_cmp.T / 2.0, v_cmp, allowed)
    np.testing.assert_allclose(parts["cmp"], ref_out, rtol=1e-10, atol=1e-12)
    sel_out, _ = reference(q @ k.T / 2.0, v, parts["selected"])
    np.testing.assert_allclose(parts["sel"], sel_out, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", [
    BlockVariant(softcap=2.0), BlockVariant(sinks=True), BlockVariant(softcap=2.0, sinks=True),
    BlockVariant()])
def test_the_2025_block_attention_equals_its_formula(rng, variant):
    model = VariantGPT(GPTConfig(vocab_size=11, d_model=16, n_layers=1, h=4, n_kv_heads=2),
                       variant, rng=0)
    for p in model.parameters().values():
        p += 0.1 * rng.normal(size=p.shape)  # sinks and norms away from their start
    c = model.config
    a = rng.normal(size=(2, 6, c.d_model))
    mask = causal_mask(6)
    out, saved, (s, p, p_sink) = model._attention(0, a, mask, None, keep=True)
    attn, extra = model.blocks[0].attn, model.extra[0]
    r = c.h // c.n_kv_heads
    q = apply_rope(split_heads(a @ attn.W_q, c.h), layout=c.rope, base=c.rope_base)
    k = apply_rope(split_heads(a @ attn.W_k, c.n_kv_heads), layout=c.rope, base=c.rope_base)
    vv = np.repeat(split_heads(a @ attn.W_v, c.n_kv_heads), r, axis=-3)
    raw = q @ np.swapaxes(np.repeat(k, r, axis=-3), -1, -2) * model.scale  # (B, h, T, T)
    z = soft_cap(raw, variant.softcap) if variant.softcap is not None else raw
    sink = extra["sinks"][:, None, None] if variant.sinks else None
    o_ref, w_ref = reference(z, vv, mask, sink)
    np.testing.assert_allclose(s, raw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p, w_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out, merge_heads(o_ref) @ attn.W_o, rtol=1e-10, atol=1e-12)
    assert (p_sink is None) == (not variant.sinks)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"score_mod": 3.0}, r"^scaled_dot_product_attention: score_mod is a float; expected a "
                         r"function"),
    ({"score_mod": lambda s, q_idx, kv_idx: s[..., :1]},
     r"^scaled_dot_product_attention: score_mod returned shape \(3, 1\); expected the "
     r"scores' shape \(3, 5\)"),
    ({"sink": np.zeros(5)}, r"^scaled_dot_product_attention: sink has shape \(5,\); expected "
                            r"a shape that broadcasts to \(\.\.\., T, 1\) = \(3, 1\)"),
    ({"sink": np.inf}, r"sink holds a non-finite logit"),
    ({"sink": True}, r"^scaled_dot_product_attention: sink has dtype bool"),
])
def test_a_bad_hook_is_a_named_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        scaled_dot_product_attention(np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 2)), **kwargs)
