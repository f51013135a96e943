"""Grouped-query and multi-query attention: ``MultiHeadAttention(..., n_kv_heads=g)``.

Query head ``i`` reads key/value head ``i // (h // g)`` (torch's ``enable_gqa=True`` grouping).
Checked against a loop over query heads, an explicit ``np.repeat`` of the K/V heads through the
package's standard attention, and (in ``tests/test_torch_parity.py``'s gold table) torch's
``F.scaled_dot_product_attention(..., enable_gqa=True)`` after the same projections;
``n_kv_heads = h`` must be the standard layer, bit for bit.
"""

from __future__ import annotations

import functools
import re
import tracemalloc

import conftest
import numpy as np
import pytest

from mha_course import (
    MultiHeadAttention,
    attention_flops,
    causal_mask,
    padding_mask,
    param_count,
    scaled_dot_product_attention,
    split_heads,
)

TOL = 1e-12  # float64 max abs difference
# Every dimension different: B=2, T=3, S=5, h=4, d_k=6, d_v=7, d_model=10 (d_k given).
B, T, S, H, D_K, D_V, D_MODEL = 2, 3, 5, 4, 6, 7, 10
# the shared helper (tests/conftest.py) with this module's sizes
random_layer = functools.partial(
    conftest.random_layer, d_model=D_MODEL, h=H, d_k=D_K, d_v=D_V, bias=True
)
MHA = "MultiHeadAttention"
FPH = "MultiHeadAttention.from_per_head"


def projections(layer, x, context):
    """q (..., h, T, d_k), k (..., g, S, d_k), v (..., g, S, d_v), as the layer computes them."""
    def proj(inp, W, b):
        return inp @ W + (0 if b is None else b)

    return (
        split_heads(proj(x, layer.W_q, layer.b_q), layer.h),
        split_heads(proj(context, layer.W_k, layer.b_k), layer.n_kv_heads),
        split_heads(proj(context, layer.W_v, layer.b_v), layer.n_kv_heads),
    )


def output(layer, heads):
    """(..., h, T, d_v) -> the layer's output (..., T, d_model)."""
    concat = np.swapaxes(heads, -3, -2).reshape(*heads.shape[:-3], heads.shape[-2], -1)
    return concat @ layer.W_o + (0 if layer.b_o is None else layer.b_o)


# Inputs: unbatched and batched self-attention, cross-attention, with and without masks.
CASES = {
    "unbatched self": ((T, D_MODEL), None, None),
    "unbatched self causal": ((T, D_MODEL), None, "causal"),
    "batched self causal": ((B, T, D_MODEL), None, "causal"),
    "batched cross": ((B, T, D_MODEL), (B, S, D_MODEL), None),
    "batched cross padding": ((B, T, D_MODEL), (B, S, D_MODEL), "padding"),
    "unbatched cross causal": ((T, D_MODEL), (S, D_MODEL), "causal"),
}


def make_case(rng, case):
    x_shape, c_shape, mask_kind = CASES[case]
    x = rng.normal(size=x_shape)
    context = None if c_shape is None else rng.normal(size=c_shape)
    s = x_shape[-2] if c_shape is None else c_shape[-2]
    mask = {
        None: None,
        "causal": causal_mask(x_shape[-2], s),
        "padding": padding_mask([s, 2], s),  # (B, 1, S): no query row is fully masked
    }[mask_kind]
    return x, context, mask


# --------------------------------------------------------------------- the standard layer
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_n_kv_heads_equal_to_h_is_the_standard_layer_bit_for_bit(case, dtype):
    x, context, mask = make_case(np.random.default_rng(1), case)
    x = x.astype(dtype)
    context = None if context is None else context.astype(dtype)
    default = MultiHeadAttention(D_MODEL, H, D_K, D_V, bias=True, rng=7)
    explicit = MultiHeadAttention(D_MODEL, H, D_K, D_V, bias=True, rng=7, n_kv_heads=H)
    assert default.n_kv_heads == explicit.n_kv_heads == H
    for name, p in default.parameters().items():
        assert np.array_equal(p, explicit.parameters()[name]), name
    assert repr(default) == repr(explicit) == (
        f"MultiHeadAttention(d_model={D_MODEL}, h={H}, d_k={D_K}, d_v={D_V}, bias=True)"
    )
    out_a, w_a = default(x, context=context, mask=mask)
    out_b, w_b = explicit(x, context=context, mask=mask)
    assert out_a.dtype == dtype
    assert np.array_equal(out_a, out_b) and np.array_equal(w_a, w_b)


def test_standard_layer_keeps_its_weights_and_outputs_from_before_gqa():
    # Reference values computed with the layer as it was before n_kv_heads existed (commit
    # f42134a): the same seed must draw the same weights, and the forward give the same output.
    layer = MultiHeadAttention(6, 2, bias=True, rng=0)
    layer.b_k = np.linspace(0.1, 0.6, 6)
    out, weights = layer(np.linspace(-1, 1, 18).reshape(3, 6), mask=causal_mask(3))
    W_k_row0 = [-0.020031827646232125, 0.5508189777156817, 0.6138302269254313,
                -0.20110796144863108, 0.10115845673227974, -0.2519147230141805]
    out_row2 = [-0.17211704424865262, -0.0354655800195009, -0.4986456509988099,
                0.415588962893478, -0.4084917225343463, 0.6743292182700342]
    weights_row2 = [[0.5108617342383219, 0.30593082609349714, 0.1832074396681808],
                    [0.3729204697761935, 0.3318236759104355, 0.2952558543133712]]
    np.testing.assert_array_equal(layer.W_k[0], W_k_row0)  # the RNG draws: exact
    np.testing.assert_allclose(out[2], out_row2, rtol=0, atol=TOL)
    np.testing.assert_allclose(weights[:, 2], weights_row2, rtol=0, atol=TOL)


# -------------------------------------------------------------------- GQA against references
@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_gqa_equals_a_loop_over_query_heads_reading_kv_head_i_over_group_size(rng, g, case):
    layer = random_layer(rng, n_kv_heads=g)
    x, context, mask = make_case(rng, case)
    out, weights = layer(x, context=context, mask=mask)
    q, k, v = projections(layer, x, x if context is None else context)
    heads, head_weights = [], []
    for i in range(H):
        j = i // (H // g)  # the K/V head that query head i reads
        o, w = scaled_dot_product_attention(q[..., i, :, :], k[..., j, :, :], v[..., j, :, :],
                                            mask=mask)
        heads.append(o)
        head_weights.append(w)
    s = x.shape[-2] if context is None else context.shape[-2]
    assert weights.shape == (*out.shape[:-2], H, x.shape[-2], s)
    np.testing.assert_allclose(weights, np.stack(head_weights, axis=-3), rtol=0, atol=TOL)
    np.testing.assert_allclose(out, output(layer, np.stack(heads, axis=-3)), rtol=0, atol=TOL)


@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_gqa_equals_repeating_kv_heads_through_standard_attention(rng, g, case):
    layer = random_layer(rng, n_kv_heads=g)
    x, context, mask = make_case(rng, case)
    out, weights = layer(x, context=context, mask=mask)
    q, k, v = projections(layer, x, x if context is None else context)
    k, v = np.repeat(k, H // g, axis=-3), np.repeat(v, H // g, axis=-3)  # (..., h, S, d)
    head_mask = None if mask is None else mask[..., None, :, :]  # the same for every head
    heads, ref_weights = scaled_dot_product_attention(q, k, v, mask=head_mask)
    np.testing.assert_allclose(weights, ref_weights, rtol=0, atol=TOL)
    np.testing.assert_allclose(out, output(layer, heads), rtol=0, atol=TOL)


def test_gqa_forward_never_holds_repeated_keys_or_values():
    # One query against S = 4096 keys with MQA (g = 1, h = 8): repeating K (or V) over the 8
    # query heads would allocate an (8, S, d_k) array of 8 MiB. The forward must stay well below
    # that: it holds k (S, d_k) = 1 MiB, v (S, d_v) = 1 MiB and the (8, 1, S) weights.
    h, d_k, s = 8, 32, 4096
    layer = MultiHeadAttention(64, h, d_k, rng=0, n_kv_heads=1)
    rng = np.random.default_rng(0)
    x, context = rng.normal(size=(1, 64)), rng.normal(size=(s, 64))
    repeated_bytes = h * s * d_k * 8
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = layer(x, context=context)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    assert result[1].shape == (h, 1, s)
    assert peak < repeated_bytes / 2, f"peak {peak} bytes; one repeated K is {repeated_bytes}"


# ----------------------------------------------------------------------- the per-head layout
@pytest.mark.parametrize("g", [1, 2, 4])
def test_per_head_and_from_per_head_round_trip_with_gqa(rng, g):
    layer = random_layer(rng, n_kv_heads=g)
    p = layer.per_head()
    assert p["W_q"].shape == (H, D_MODEL, D_K)
    assert p["W_k"].shape == (g, D_MODEL, D_K)
    assert p["W_v"].shape == (g, D_MODEL, D_V)
    assert p["W_o"].shape == (H, D_V, D_MODEL)
    rebuilt = MultiHeadAttention.from_per_head(
        p["W_q"], list(p["W_k"]), p["W_v"], layer.W_o,
        b_q=layer.b_q.reshape(H, D_K), b_k=layer.b_k.reshape(g, D_K),
        b_v=layer.b_v.reshape(g, D_V), b_o=layer.b_o,
    )
    assert rebuilt.n_kv_heads == g  # read off W_k
    for name, param in layer.parameters().items():
        np.testing.assert_array_equal(rebuilt.parameters()[name], param, err_msg=name)
    x = rng.normal(size=(B, T, D_MODEL))
    np.testing.assert_array_equal(rebuilt(x)[0], layer(x)[0])


def test_per_head_kv_head_j_is_the_columns_that_query_heads_of_group_j_read(rng):
    layer = random_layer(rng, n_kv_heads=2)  # h = 4: query heads 0, 1 read K/V head 0; 2, 3 head 1
    W_k = layer.per_head()["W_k"]
    np.testing.assert_array_equal(W_k[1], layer.W_k[:, D_K : 2 * D_K])


# ---------------------------------------------------------------------------------- costs
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("g", [1, 2, 4])
def test_param_count_with_n_kv_heads_counts_the_layers_arrays(g, bias):
    layer = MultiHeadAttention(D_MODEL, H, D_K, D_V, bias=bias, rng=0, n_kv_heads=g)
    actual = sum(p.size for p in layer.parameters().values())
    assert param_count(D_MODEL, H, D_K, D_V, bias=bias, n_kv_heads=g) == actual


def test_param_count_and_flops_with_n_kv_heads_h_equal_the_defaults():
    assert param_count(512, 8, n_kv_heads=8) == param_count(512, 8) == 4 * 512**2
    assert attention_flops(100, 512, 8, n_kv_heads=8) == attention_flops(100, 512, 8)


def test_gqa_shrinks_only_the_kv_projection_flops():
    d_model, h, t, s = 512, 8, 100, 300
    full, mqa = attention_flops(t, d_model, h, S=s), attention_flops(t, d_model, h, S=s,
                                                                    n_kv_heads=1)
    d_k = d_model // h
    # Q projection unchanged; K and V projections 8 times smaller
    assert mqa["projections"] == 2 * t * d_model * d_model + 2 * s * d_model * 1 * 2 * d_k
    assert full["projections"] - mqa["projections"] == 2 * s * d_model * (h - 1) * 2 * d_k
    for term in ("scores", "weighted_sum", "output_projection"):
        assert mqa[term] == full[term], term


# --------------------------------------------------------------------------------- errors
def test_n_kv_heads_that_does_not_divide_h_is_a_named_error():
    with pytest.raises(ValueError) as info:
        MultiHeadAttention(16, 8, n_kv_heads=3)
    assert str(info.value) == (
        f"{MHA}: n_kv_heads=3 does not divide h=8; each key/value head serves h/n_kv_heads "
        "query heads, so choose one of [1, 2, 4, 8]"
    )


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, "2"])
def test_n_kv_heads_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="^" + re.escape(f"{MHA}: n_kv_heads=")):
        MultiHeadAttention(16, 8, n_kv_heads=bad)


@pytest.mark.parametrize("func", [param_count, attention_flops])
def test_cost_functions_refuse_n_kv_heads_that_does_not_divide_h(func):
    args = (512, 8) if func is param_count else (10, 512, 8)
    with pytest.raises(ValueError, match="^" + re.escape(f"{func.__name__}: n_kv_heads=3 does "
                                                         "not divide h=8")):
        func(*args, n_kv_heads=3)


def test_from_per_head_with_kv_heads_that_do_not_divide_h_is_a_named_error():
    z = np.zeros
    with pytest.raises(ValueError) as info:
        MultiHeadAttention.from_per_head(z((4, 5, 2)), z((3, 5, 2)), z((3, 5, 2)), z((8, 5)))
    assert str(info.value) == (
        f"{FPH}: W_k has shape (3, 5, 2); expected (n_kv_heads, d_model, d_k) with n_kv_heads "
        "dividing h=4 (from W_q)"
    )


def test_from_per_head_with_w_v_heads_unlike_w_k_is_a_named_error():
    z = np.zeros
    with pytest.raises(ValueError) as info:
        MultiHeadAttention.from_per_head(z((4, 5, 2)), z((2, 5, 2)), z((1, 5, 3)), z((12, 5)))
    assert str(info.value) == (
        f"{FPH}: W_v has shape (1, 5, 3); expected (n_kv_heads, d_model, d_v) with "
        "n_kv_heads=2 (from W_k), d_model=5 (from W_q)"
    )
