"""A layer's own score scale (Gemma 2's query_pre_attn_scalar**-0.5) on every path over its weights:
the layer's step applies it and equals forward; the paths that assume 1/sqrt(d_k) refuse the layer
with an error that names them, instead of returning another layer's output."""

import numpy as np
import pytest

from mha_course import MultiHeadAttention, causal_mask
from mha_course.backward import backward
from mha_course.kernels.lean import lean_forward
from mha_course.parallel.tensor import TensorParallelAttention
from mha_course.serving.split_kv import split_kv_decode_step


def scaled_layer(scale=0.2):
    return MultiHeadAttention(d_model=12, h=6, n_kv_heads=2, bias=True, rope="half", rng=3,
                              scale=scale)


def test_chunked_prefill_and_decode_apply_the_layer_scale_and_equal_forward():
    layer = scaled_layer()
    x = np.random.default_rng(0).normal(size=(2, 7, 12))
    full, _ = layer.forward(x, mask=causal_mask(7))
    cache = layer.init_cache(batch_shape=(2,), max_len=7)
    first, _ = layer.step(x[:, :4], cache)
    rest, _ = layer.step(x[:, 4:], cache)
    np.testing.assert_allclose(np.concatenate([first, rest], axis=1), full, atol=1e-12)
    plain = MultiHeadAttention(d_model=12, h=6, n_kv_heads=2, bias=True, rope="half", rng=3)
    assert not np.allclose(plain.forward(x, mask=causal_mask(7))[0], full), \
        "the scale must change the output, or this test shows nothing"


def test_the_serving_decoder_applies_the_layer_scale_on_every_cache():
    from mha_course.serving.decoder import ContiguousCache, Decoder
    from mha_course.serving.paged import PagedStore

    dec = Decoder.random(vocab=11, d_model=12, n_layers=2, h=6, n_kv_heads=2, rng=1)
    for block in dec.blocks:
        block.attn.scale = 0.2
    tokens = np.arange(9) % 11
    want = dec.forward(tokens)
    for cache in (ContiguousCache(dec), PagedStore(dec, 8, 4).new_sequence()):
        got = np.concatenate([dec.step(tokens[:5], cache), dec.step(tokens[5:], cache)])
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_paths_that_assume_the_default_scale_refuse_a_scaled_layer_by_name():
    layer = scaled_layer()
    x = np.ones((3, 12))
    with pytest.raises(ValueError, match=r"^lean_forward: layer has scale=0\.2"):
        lean_forward(layer, x)
    with pytest.raises(ValueError, match=r"^split_kv_decode_step: layer has scale=0\.2"):
        split_kv_decode_step(layer, x[:1], layer.init_cache(max_len=4), 2)
    with pytest.raises(ValueError, match=r"^TensorParallelAttention: layer has scale=0\.2"):
        TensorParallelAttention(layer, 2)
    plain = MultiHeadAttention(d_model=12, h=6, n_kv_heads=2, rng=3)
    out, saved = plain.forward(x, return_cache=True)
    with pytest.raises(ValueError, match=r"^MultiHeadAttention.backward: layer has scale=0\.2"):
        backward(layer, np.ones_like(out), saved)


def test_the_default_scale_passes_every_guard():
    layer = MultiHeadAttention(d_model=12, h=6, n_kv_heads=2, rng=3)
    x = np.random.default_rng(1).normal(size=(3, 12))
    np.testing.assert_allclose(lean_forward(layer, x)[0], layer.forward(x)[0], atol=1e-12)
    TensorParallelAttention(layer, 2)
