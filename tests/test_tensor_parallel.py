"""Tensor parallelism: the layer split by heads over p devices equals the single-device layer,
forward and backward, with one all-reduce per block; GQA's K/V heads split or replicated by the
rule vLLM uses; the MLP split by columns and rows likewise.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_layer as make_layer
from hypothesis import given
from hypothesis import strategies as st

from mha_course import causal_mask, swiglu
from mha_course.block import swiglu_backward
from mha_course.parallel.collectives import Cluster, expected_bytes, meta
from mha_course.parallel.tensor import (
    TensorParallelAttention,
    TensorParallelSwiGLU,
    kv_heads_per_device,
)

# (h, g, p) that the rule allows: p divides h, and p divides g or g divides p
ALLOWED = [(h, g, p) for h in (1, 2, 4, 6, 8, 12) for g in range(1, h + 1) if h % g == 0
           for p in (1, 2, 3, 4, 6, 8) if h % p == 0 and (g % p == 0 or p % g == 0)]


@given(case=st.sampled_from(ALLOWED), T=st.integers(1, 6), bias=st.booleans(),
       rope=st.sampled_from([None, "half", "interleaved"]), seed=st.integers(0, 50))
def test_split_by_heads_equals_the_single_device_layer(case, T, bias, rope, seed):
    h, g, p = case
    rng = np.random.default_rng(seed)
    layer = make_layer(rng, bias=bias, n_kv_heads=g, d_model=8, h=h, d_k=4, d_v=3, rope=rope)
    x = rng.normal(size=(2, T, 8))
    mask = causal_mask(T)
    want = layer(x, mask=mask)[0]
    tp = TensorParallelAttention(layer, p)
    cluster = Cluster(p)
    out = tp.forward(cluster, x, mask=mask)
    for o in out:
        np.testing.assert_allclose(o, want, atol=1e-12)
    # one all-reduce of the (2, T, d_model) output, and nothing else
    assert [name for name, _ in cluster.log] == ["all_reduce"]
    assert cluster.sent.sum() == 2 * (p - 1) * want.nbytes
    # every query head on exactly one device; each device's K/V heads are its query heads' ones
    assert sorted(i for qh in tp.query_heads for i in qh) == list(range(h))
    for qh, kh in zip(tp.query_heads, tp.kv_heads, strict=True):
        assert sorted({i // (h // g) for i in qh}) == kh


@given(case=st.sampled_from(ALLOWED), bias=st.booleans(), seed=st.integers(0, 50))
def test_backward_sums_the_input_gradient_and_keeps_weight_gradients_local(case, bias, seed):
    h, g, p = case
    rng = np.random.default_rng(seed)
    layer = make_layer(rng, bias=bias, n_kv_heads=g, d_model=8, h=h, d_k=4, d_v=3, rope="half")
    x, T = rng.normal(size=(2, 5, 8)), 5
    grad_out = rng.normal(size=(2, T, 8))
    _, saved = layer.forward(x, mask=causal_mask(T), return_cache=True)
    want = layer.backward(grad_out, saved)
    tp = TensorParallelAttention(layer, p)
    cluster = Cluster(p)
    dx, grads = tp.backward(cluster, x, grad_out, mask=causal_mask(T))
    for d in dx:
        np.testing.assert_allclose(d, want["x"], atol=1e-12)
    assert [name for name, _ in cluster.log] == ["all_reduce"]
    d_k, d_v = 4, 3
    for qh, kh, gr in zip(tp.query_heads, tp.kv_heads, grads, strict=True):
        q_cols = np.concatenate([np.arange(i * d_k, (i + 1) * d_k) for i in qh])
        np.testing.assert_allclose(gr["W_q"], want["W_q"][:, q_cols], atol=1e-12)
        o_rows = np.concatenate([np.arange(i * d_v, (i + 1) * d_v) for i in qh])
        np.testing.assert_allclose(gr["W_o"], want["W_o"][o_rows], atol=1e-12)
        if g % p == 0:  # split K/V heads: their gradients are the full layer's, column for column
            k_cols = np.concatenate([np.arange(i * d_k, (i + 1) * d_k) for i in kh])
            np.testing.assert_allclose(gr["W_k"], want["W_k"][:, k_cols], atol=1e-12)
    if g < p:  # replicated K/V heads: the copies' gradients add up to the layer's
        k_sum = np.zeros_like(want["W_k"])
        for kh, gr in zip(tp.kv_heads, grads, strict=True):
            k_sum[:, kh[0] * d_k:(kh[0] + 1) * d_k] += gr["W_k"]
        np.testing.assert_allclose(k_sum, want["W_k"], atol=1e-12)
    assert "b_o" not in grads[0]


def test_the_output_bias_is_added_once_after_the_sum():
    rng = np.random.default_rng(3)
    layer = make_layer(rng, bias=True, d_model=8, h=4, d_k=2)
    layer.b_o = np.full(8, 10.0)
    tp = TensorParallelAttention(layer, 4)
    x = rng.normal(size=(3, 8))
    np.testing.assert_allclose(tp.forward(Cluster(4), x)[0], layer(x)[0], atol=1e-12)
    partial_sum = np.sum(tp.partial_outputs(x), axis=0)
    np.testing.assert_allclose(partial_sum + layer.b_o, layer(x)[0], atol=1e-12)


def test_kv_heads_per_device_follows_the_divisibility_rule():
    assert kv_heads_per_device(64, 8, 8) == (1, False)
    assert kv_heads_per_device(64, 8, 4) == (2, False)
    assert kv_heads_per_device(64, 8, 16) == (1, True)
    assert kv_heads_per_device(32, 1, 8) == (1, True)
    with pytest.raises(ValueError, match=r"p=3 devices cannot share h=64 query heads"):
        kv_heads_per_device(64, 8, 3)
    with pytest.raises(ValueError, match=r"p=4 and n_kv_heads=6: one must divide the other"):
        kv_heads_per_device(12, 6, 4)


def test_weights_per_device_shrink_by_p_except_replicated_kv():
    layer = make_layer(np.random.default_rng(0), n_kv_heads=2, d_model=16, h=8)
    full = sum(a.nbytes for a in layer.parameters().values())
    assert TensorParallelAttention(layer, 2).weight_bytes() == [full // 2] * 2
    four = TensorParallelAttention(layer, 8).weight_bytes()  # K/V heads replicated 4 times
    wq = layer.W_q.nbytes
    assert four == [(wq + layer.W_o.nbytes) // 8 + 2 * layer.W_k.nbytes // 2] * 8


def test_placeholder_input_counts_the_all_reduce_of_a_real_size():
    layer = make_layer(np.random.default_rng(0), d_model=16, h=8)
    tp = TensorParallelAttention(layer, 8)
    cluster = Cluster(8)
    out = tp.forward(cluster, meta((8192, 16), np.float16))
    assert out[0].shape == (8192, 16)
    assert cluster.sent.tolist() == [expected_bytes("all_reduce", 8192 * 16 * 2, 8)] * 8


@given(p=st.sampled_from([1, 2, 3, 6]), T=st.integers(1, 5), seed=st.integers(0, 50))
def test_swiglu_split_by_columns_and_rows_equals_the_mlp(p, T, seed):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(5, 12)), rng.normal(size=(5, 12)), rng.normal(size=(12, 5))
    x, grad = rng.normal(size=(2, T, 5)), rng.normal(size=(2, T, 5))
    mlp = TensorParallelSwiGLU(*W, p=p)
    cluster = Cluster(p)
    for o in mlp.forward(cluster, x):
        np.testing.assert_allclose(o, swiglu(x, *W), atol=1e-11)
    dx, grads = mlp.backward(cluster, x, grad)
    want = swiglu_backward(grad, x, *W)
    np.testing.assert_allclose(dx[0], want["x"], atol=1e-11)
    np.testing.assert_allclose(np.concatenate([g["W_gate"] for g in grads], axis=1),
                               want["W_gate"], atol=1e-11)
    np.testing.assert_allclose(np.concatenate([g["W_down"] for g in grads], axis=0),
                               want["W_down"], atol=1e-11)
    assert [name for name, _ in cluster.log] == ["all_reduce", "all_reduce"]


def test_bad_input_is_refused_by_name():
    layer = make_layer(np.random.default_rng(0), d_model=8, h=4)
    with pytest.raises(ValueError, match=r"TensorParallelAttention: layer is a str"):
        TensorParallelAttention("layer", 2)
    with pytest.raises(ValueError, match=r"cluster has p=3 devices; expected p=2"):
        TensorParallelAttention(layer, 2).forward(Cluster(3), np.zeros((2, 8)))
    with pytest.raises(ValueError, match=r"TensorParallelSwiGLU: p=5 does not divide d_ff=12"):
        TensorParallelSwiGLU(np.zeros((4, 12)), np.zeros((4, 12)), np.zeros((12, 4)), p=5)

