"""Split-KV (Flash-Decoding): any split of the cache, combined by log-sum-exp, equals
decode_step; the occupancy arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course import MultiHeadAttention, scaled_dot_product_attention
from mha_course.serving.split_kv import (
    chunk_bounds,
    combine_partials,
    occupancy,
    split_kv_decode_step,
    split_kv_partials,
    splits_to_fill,
)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 30), st.integers(1, 8), st.sampled_from([(8, 4, 2), (12, 3, 1), (8, 2, 2)]),
       st.sampled_from([None, "half", "interleaved"]), st.integers(0, 999))
def test_split_kv_decoding_equals_decode_step(T, n_splits, dims, rope, seed):
    d_model, h, g = dims
    layer = MultiHeadAttention(d_model, h, n_kv_heads=g, rope=rope, rng=seed)
    plain, split = layer.init_cache(batch_shape=(2,)), layer.init_cache(batch_shape=(2,))
    x = np.random.default_rng(seed).normal(size=(T, 2, 1, d_model))
    for t in range(T):
        want, _ = layer.decode_step(x[t], plain)
        got = split_kv_decode_step(layer, x[t], split, min(n_splits, t + 1))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_split_kv_decoding_keeps_the_biases():
    # bias=True, RoPE and grouped heads: the split path must add b_q, b_k, b_v and b_o as
    # decode_step does
    layer = MultiHeadAttention(12, 6, n_kv_heads=2, rope="half", bias=True, rng=4)
    rng = np.random.default_rng(4)
    for name in ("b_q", "b_k", "b_v", "b_o"):
        setattr(layer, name, rng.normal(size=getattr(layer, name).shape))
    plain, split = layer.init_cache(), layer.init_cache()
    x = rng.normal(size=(9, 1, 12))
    for t in range(9):
        want, _ = layer.decode_step(x[t], plain)
        got = split_kv_decode_step(layer, x[t], split, min(3, t + 1))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_combining_partials_gives_the_whole_softmax_and_its_lse():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 1, 4)), rng.normal(size=(3, 23, 4)), rng.normal(size=(3, 23, 5))
    out, lse = combine_partials(*split_kv_partials(q, k, v, 4))
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v)[0], atol=1e-12)
    scores = q @ k.swapaxes(-1, -2) / 2.0
    np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)), atol=1e-12)


def test_chunks_and_occupancy():
    assert chunk_bounds(7, 7) == [(i, i + 1) for i in range(7)]
    with pytest.raises(ValueError, match="chunk_bounds: n_splits=8 is more than the S=7"):
        chunk_bounds(7, 8)
    assert occupancy(1, 8, 1, 132) == pytest.approx(8 / 132)
    assert occupancy(64, 8, 1, 132) == pytest.approx(512 / (132 * 4))
    assert splits_to_fill(1, 8, 132) == 16 and occupancy(1, 8, 16, 132) == pytest.approx(128 / 132)
    assert occupancy(1, 8, 17, 132) < 0.6  # 136 blocks: a second wave for 4 of them
    # Llama 3 70B under tensor parallelism 8: one K/V head per GPU, so one block at batch 1
    assert occupancy(batch=1, kv_heads=1, n_splits=1, sms=132) == pytest.approx(1 / 132)
    assert splits_to_fill(1, 1, 132) == 132 and splits_to_fill(64, 1, 132) == 2


def test_combine_partials_takes_a_chunk_with_no_visible_key_as_nothing():
    # a chunk whose keys are all masked has lse = -inf (and output 0): it adds nothing, never NaN
    out = np.array([[[1.0, 2.0]]])
    got, lse = combine_partials([out, np.zeros_like(out)], [np.zeros((1, 1)),
                                                             np.full((1, 1), -np.inf)])
    np.testing.assert_array_equal(got, out)
    np.testing.assert_array_equal(lse, np.zeros((1, 1)))
    none, lse = combine_partials([np.zeros_like(out)] * 2, [np.full((1, 1), -np.inf)] * 2)
    assert not np.isnan(none).any() and np.isneginf(lse).all()
