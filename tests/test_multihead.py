"""split_heads, merge_heads and the MultiHeadAttention layer."""

from __future__ import annotations

import functools

import conftest
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mha_course.multihead as multihead_module
from mha_course import (
    MultiHeadAttention,
    causal_mask,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    split_heads,
)
from mha_course.heads import attend_heads

moderate = st.floats(-2, 2, allow_nan=False, allow_infinity=False)
small = st.integers(1, 4)

# B=2, T=3, S=5, d_model=7, h=2, d_k=4, d_v=6: every dimension different.
B, T, S, D_MODEL, H, D_K, D_V = 2, 3, 5, 7, 2, 4, 6
# the shared helper (tests/conftest.py) with this module's sizes
random_layer = functools.partial(conftest.random_layer, d_model=D_MODEL, h=H, d_k=D_K, d_v=D_V)




def per_head_loop(W_q, W_k, W_v, W_o, x, context, mask=None, biases=None):
    """The article's layout: one projection and one attention per head, then Concat and W_o."""
    b_q, b_k, b_v, b_o = biases if biases is not None else (None,) * 4
    heads, weights = [], []
    for i in range(len(W_q)):
        q = x @ W_q[i] + (0 if b_q is None else b_q[i])
        k = context @ W_k[i] + (0 if b_k is None else b_k[i])
        v = context @ W_v[i] + (0 if b_v is None else b_v[i])
        head, w = scaled_dot_product_attention(q, k, v, mask=mask)
        heads.append(head)
        weights.append(w)
    out = np.concatenate(heads, axis=-1) @ W_o + (0 if b_o is None else b_o)
    return out, np.stack(weights, axis=-3)


@st.composite
def layer_and_inputs(draw):
    """Per-head weights of random sizes, an input, maybe a context, a mask and biases."""
    h, d_model, d_k, d_v = (draw(small, label=n) for n in ("h", "d_model", "d_k", "d_v"))
    T = draw(small, label="T")
    batch = draw(hnp.array_shapes(min_dims=0, max_dims=1, max_side=2), label="batch")
    arr = lambda shape, label: draw(hnp.arrays(np.float64, shape, elements=moderate), label=label)  # noqa: E731
    W_q = arr((h, d_model, d_k), "W_q")
    W_k = arr((h, d_model, d_k), "W_k")
    W_v = arr((h, d_model, d_v), "W_v")
    W_o = arr((h * d_v, d_model), "W_o")
    x = arr((*batch, T, d_model), "x")
    cross = draw(st.booleans(), label="cross")
    context = arr((*batch, draw(small, label="S"), d_model), "context") if cross else None
    S = context.shape[-2] if cross else T
    mask = draw(hnp.arrays(np.bool_, (T, S)), label="mask") if draw(st.booleans()) else None
    biases = None
    if draw(st.booleans(), label="bias"):
        biases = (arr((h, d_k), "b_q"), arr((h, d_k), "b_k"), arr((h, d_v), "b_v"),
                  arr((d_model,), "b_o"))
    return (W_q, W_k, W_v, W_o), x, context, mask, biases


# ---------------------------------------------------------------------- fused heads vs the loop
@given(layer_and_inputs())
def test_fused_heads_match_per_head_loop(case):
    (W_q, W_k, W_v, W_o), x, context, mask, biases = case
    kwargs = {} if biases is None else dict(zip(("b_q", "b_k", "b_v", "b_o"), biases, strict=True))
    # The article's layout: a list of h matrices (d_model, d_k) for Q, stacked arrays for K, V.
    layer = MultiHeadAttention.from_per_head(list(W_q), W_k, W_v, W_o, **kwargs)
    out, weights = layer(x, context=context, mask=mask)
    ref_out, ref_weights = per_head_loop(
        W_q, W_k, W_v, W_o, x, x if context is None else context, mask, biases
    )
    assert out.shape == ref_out.shape and weights.shape == ref_weights.shape
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("bias", [False, True])
def test_random_layer_matches_loop_over_its_per_head_matrices(bias, rng):
    layer = random_layer(rng, bias=bias)
    x, context = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, S, D_MODEL))
    p = layer.per_head()
    biases = None
    if bias:
        biases = (layer.b_q.reshape(H, D_K), layer.b_k.reshape(H, D_K),
                  layer.b_v.reshape(H, D_V), layer.b_o)
    out, weights = layer(x, context=context, mask=causal_mask(T, S))
    ref_out, ref_weights = per_head_loop(
        p["W_q"], p["W_k"], p["W_v"], layer.W_o, x, context, causal_mask(T, S), biases
    )
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-12, atol=1e-12)


def test_per_head_and_from_per_head_are_inverse(rng):
    layer = random_layer(rng, bias=True)
    p = layer.per_head()
    assert p["W_q"].shape == (H, D_MODEL, D_K) and p["W_k"].shape == (H, D_MODEL, D_K)
    assert p["W_v"].shape == (H, D_MODEL, D_V) and p["W_o"].shape == (H, D_V, D_MODEL)
    for i in range(H):  # head i owns columns i*d_k:(i+1)*d_k of the fused matrix
        np.testing.assert_array_equal(p["W_q"][i], layer.W_q[:, i * D_K : (i + 1) * D_K])
        np.testing.assert_array_equal(p["W_v"][i], layer.W_v[:, i * D_V : (i + 1) * D_V])
        np.testing.assert_array_equal(p["W_o"][i], layer.W_o[i * D_V : (i + 1) * D_V])
    rebuilt = MultiHeadAttention.from_per_head(
        p["W_q"], p["W_k"], p["W_v"], layer.W_o,
        b_q=layer.b_q.reshape(H, D_K), b_k=layer.b_k.reshape(H, D_K),
        b_v=layer.b_v.reshape(H, D_V), b_o=layer.b_o,
    )
    assert (rebuilt.d_model, rebuilt.h, rebuilt.d_k, rebuilt.d_v) == (D_MODEL, H, D_K, D_V)
    for name, value in layer.parameters().items():
        np.testing.assert_array_equal(rebuilt.parameters()[name], value)


def test_output_is_the_sum_over_heads_of_each_head_times_its_rows_of_W_o(rng):
    # Concat(head_1..head_h) W_o = sum_i head_i W_o[i]: what W_o adds is a mix of the heads.
    layer = random_layer(rng)
    x = rng.normal(size=(T, D_MODEL))
    out, weights = layer(x)
    p = layer.per_head()
    total = np.zeros((T, D_MODEL))
    for i in range(H):
        head = weights[i] @ (x @ p["W_v"][i])  # (T, S) @ (S, d_v) -> (T, d_v)
        total += head @ p["W_o"][i]  # (T, d_v) @ (d_v, d_model)
    np.testing.assert_allclose(out, total, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- split and merge
@given(
    hnp.array_shapes(min_dims=0, max_dims=2, max_side=3), small, small, small, st.data()
)
def test_split_then_merge_heads_round_trips(batch, T, h, d, data):
    x = data.draw(hnp.arrays(np.float64, (*batch, T, h * d), elements=moderate), label="x")
    heads = split_heads(x, h)
    assert heads.shape == (*batch, h, T, d)
    for i in range(h):
        np.testing.assert_array_equal(heads[..., i, :, :], x[..., i * d : (i + 1) * d])
    np.testing.assert_array_equal(merge_heads(heads), x)
    y = data.draw(hnp.arrays(np.float64, (*batch, h, T, d), elements=moderate), label="y")
    merged = merge_heads(y)
    assert merged.shape == (*batch, T, h * d)
    np.testing.assert_array_equal(split_heads(merged, h), y)


def test_split_heads_hand_example():
    # T=2 rows of h*d = 2*3 columns: head 0 takes columns 0-2, head 1 columns 3-5.
    x = np.arange(12.0).reshape(2, 6)
    assert split_heads(x, 2).tolist() == [
        [[0, 1, 2], [6, 7, 8]],
        [[3, 4, 5], [9, 10, 11]],
    ]
    assert split_heads(x, 3)[1].tolist() == [[2, 3], [8, 9]]


# -------------------------------------------------------------------------------- properties
@given(st.integers(1, 6), st.integers(1, 3), st.booleans(), st.data())
def test_permuting_tokens_permutes_outputs_without_mask(T, h, bias, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    layer = random_layer(rng, bias=bias, d_model=2 * h, h=h, d_k=2, d_v=3)
    x = data.draw(hnp.arrays(np.float64, (T, 2 * h), elements=moderate), label="x")
    perm = np.array(data.draw(st.permutations(range(T)), label="perm"))
    out, weights = layer(x)
    out_p, weights_p = layer(x[perm])
    np.testing.assert_allclose(out_p, out[perm], rtol=1e-10, atol=1e-12)
    # weights_p[i, j] is how much token perm[i] attends to token perm[j]
    np.testing.assert_allclose(weights_p, weights[:, perm][:, :, perm], rtol=1e-10, atol=1e-14)


@given(st.integers(2, 6), st.integers(1, 3), st.data())
def test_future_tokens_do_not_change_past_outputs(T, h, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    layer = random_layer(rng, bias=True, d_model=5, h=h, d_k=2, d_v=3)
    x = data.draw(hnp.arrays(np.float64, (T, 5), elements=moderate), label="x")
    t = data.draw(st.integers(0, T - 2), label="last_kept")
    x2 = x.copy()
    x2[t + 1 :] = data.draw(hnp.arrays(np.float64, (T - t - 1, 5), elements=moderate), label="new")
    out, weights = layer(x, mask=causal_mask(T))
    out2, weights2 = layer(x2, mask=causal_mask(T))
    np.testing.assert_allclose(out2[: t + 1], out[: t + 1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights2[:, : t + 1], weights[:, : t + 1], rtol=1e-12, atol=1e-12)
    assert np.all(weights[:, ~causal_mask(T)] == 0)


def test_context_order_does_not_matter_in_cross_attention(rng):
    layer = random_layer(rng, bias=True)
    x, context = rng.normal(size=(T, D_MODEL)), rng.normal(size=(S, D_MODEL))
    perm = rng.permutation(S)
    out, weights = layer(x, context=context)
    out_p, weights_p = layer(x, context=context[perm])
    np.testing.assert_allclose(out_p, out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights_p, weights[..., perm], rtol=1e-12, atol=1e-15)


def test_padded_context_positions_do_not_change_the_output(rng):
    layer = random_layer(rng, bias=True)
    x, context = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, S, D_MODEL))
    mask = padding_mask([2, 4], S)
    out, weights = layer(x, context=context, mask=mask)
    context2 = context.copy()
    context2[0, 2:] = 50.0
    context2[1, 4:] = -50.0
    out2, _ = layer(x, context=context2, mask=mask)
    np.testing.assert_allclose(out2, out, rtol=1e-12, atol=1e-12)
    assert np.all(weights[0, :, :, 2:] == 0) and np.all(weights[1, :, :, 4:] == 0)


def test_mask_applies_to_every_head_and_fully_masked_rows_give_the_output_bias(rng):
    layer = random_layer(rng, bias=True)
    mask = causal_mask(T, S)
    mask[1] = False  # query 1 may attend to nothing
    out, weights = layer(rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, S, D_MODEL)), mask)
    assert weights.shape == (B, H, T, S)
    assert not np.isnan(out).any() and not np.isnan(weights).any()
    assert np.all(weights[..., ~mask] == 0)
    np.testing.assert_allclose(weights[:, :, [0, 2]].sum(-1), 1.0)
    # All heads give 0 for query 1, so the layer gives 0 @ W_o + b_o.
    np.testing.assert_allclose(out[:, 1], np.broadcast_to(layer.b_o, (B, D_MODEL)), atol=1e-15)


def test_huge_finite_scores_never_give_nan_or_inf():
    # W_q = W_k = 10·I and x up to 100 give scores up to 1e3·1e3·2/√2 ≈ 1.4e6.
    eye = [10.0 * np.eye(2)] * 2
    layer = MultiHeadAttention.from_per_head(eye, eye, eye, np.eye(4, 2))
    x = np.array([[100.0, -100.0], [-100.0, 100.0], [100.0, 100.0]])
    for dtype in (np.float32, np.float64):
        out, weights = layer(x.astype(dtype))
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(weights))
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize(("dtype", "top"), [(np.float32, 10.0), (np.float64, 28.3)])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["overflow", "underflow"])
def test_scores_beyond_the_range_of_exp_give_exact_weights(dtype, top, sign):
    # d_model = d_k = 1, all weights 1: a query a and a key b score a·b. Query [top] against
    # keys [sign·top, 0.9·sign·top] scores sign·[top², 0.9·top²]: 100 and 90 in float32,
    # about 801 and 721 in float64, past the range of exp (overflow, or underflow to 0 when
    # negative). softmax: [1, e^-g] / (1 + e^-g) with g = 0.1·top², reversed when negative.
    one = [np.ones((1, 1))]
    layer = MultiHeadAttention.from_per_head(one, one, one, np.ones((1, 1)))
    x = np.array([[top]], dtype=dtype)
    context = sign * np.array([[top], [0.9 * top]], dtype=dtype)
    out, weights = layer(x, context=context)
    g = 0.1 * top * top
    expected = np.array([1.0, np.exp(-g)]) / (1.0 + np.exp(-g))
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(weights))
    np.testing.assert_allclose(weights[0, 0], expected[:: int(sign)], rtol=1e-4)


# ------------------------------------------------------------------------------ shapes, dtypes
def test_self_attention_uses_x_as_context(rng):
    layer = random_layer(rng, bias=True)
    x = rng.normal(size=(B, T, D_MODEL))
    out, weights = layer(x)
    assert out.shape == (B, T, D_MODEL) and weights.shape == (B, H, T, T)
    out2, weights2 = layer.forward(x, context=x)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(weights, weights2)


def test_cross_attention_shapes(rng):
    layer = random_layer(rng)
    out, weights = layer(rng.normal(size=(B, T, D_MODEL)), context=rng.normal(size=(B, S, D_MODEL)))
    assert out.shape == (B, T, D_MODEL) and weights.shape == (B, H, T, S)


def test_any_leading_batch_axes_are_independent(rng):
    layer = random_layer(rng, bias=True)
    x, context = rng.normal(size=(2, 3, 4, D_MODEL)), rng.normal(size=(2, 3, S, D_MODEL))
    mask = causal_mask(4, S)
    out, weights = layer(x, context=context, mask=mask)
    assert out.shape == (2, 3, 4, D_MODEL) and weights.shape == (2, 3, H, 4, S)
    for i, j in np.ndindex(2, 3):
        o, w = layer(x[i, j], context=context[i, j], mask=mask)
        np.testing.assert_allclose(out[i, j], o, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(weights[i, j], w, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("d_v", [D_K, D_V], ids=["d_v=d_k", "d_v!=d_k"])
@pytest.mark.parametrize("batched", ["x", "context"])
def test_batch_axes_of_x_and_context_broadcast(rng, batched, d_v):
    # One shared context (S, d_model) for a batch of x (B, T, d_model), or the other way round.
    layer = random_layer(rng, bias=True, d_v=d_v)
    x = rng.normal(size=(B, T, D_MODEL) if batched == "x" else (T, D_MODEL))
    context = rng.normal(size=(B, S, D_MODEL) if batched == "context" else (S, D_MODEL))
    out, weights = layer(x, context=context)
    assert out.shape == (B, T, D_MODEL) and weights.shape == (B, H, T, S)
    for b in range(B):
        o, w = layer(x[b] if batched == "x" else x, context=context[b] if batched == "context"
                     else context)
        np.testing.assert_allclose(out[b], o, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(weights[b], w, rtol=1e-12, atol=1e-14)


def test_per_batch_mask_is_applied_to_its_own_batch_element(rng):
    layer = random_layer(rng)
    x = rng.normal(size=(B, T, D_MODEL))
    mask = np.stack([causal_mask(T), np.ones((T, T), dtype=bool)])  # (B, T, T)
    out, weights = layer(x, mask=mask)
    np.testing.assert_allclose(out[0], layer(x[0], mask=causal_mask(T))[0], atol=1e-13)
    np.testing.assert_allclose(out[1], layer(x[1])[0], atol=1e-13)
    assert np.all(weights[0][:, ~causal_mask(T)] == 0)
    assert np.all(weights[1] > 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [False, True])
def test_layer_keeps_the_input_float_dtype(dtype, bias, rng):
    layer = random_layer(rng, bias=bias)
    x, context = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, S, D_MODEL))
    out, weights = layer(x.astype(dtype), context=context.astype(dtype), mask=causal_mask(T, S))
    assert out.dtype == dtype and weights.dtype == dtype
    ref, _ = layer(x, context=context, mask=causal_mask(T, S))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    assert layer.W_q.dtype == np.float64  # the float64 parameters are not changed by the call


def test_forward_does_not_modify_its_inputs(rng):
    layer = random_layer(rng, bias=True)
    x, context = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, S, D_MODEL))
    before = [a.copy() for a in (x, context, *layer.parameters().values())]
    layer(x, context=context)
    layer(x)
    for a, b in zip((x, context, *layer.parameters().values()), before, strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------ construction, params
def test_default_head_sizes_split_d_model():
    layer = MultiHeadAttention(d_model=12, h=3)
    assert (layer.d_k, layer.d_v) == (4, 4)
    assert layer.W_q.shape == layer.W_k.shape == layer.W_v.shape == (12, 12)
    assert layer.W_o.shape == (12, 12)


def test_explicit_head_sizes_set_the_weight_shapes():
    layer = MultiHeadAttention(D_MODEL, H, D_K, D_V, bias=True)
    assert layer.W_q.shape == layer.W_k.shape == (D_MODEL, H * D_K)
    assert layer.W_v.shape == (D_MODEL, H * D_V) and layer.W_o.shape == (H * D_V, D_MODEL)
    assert layer.b_q.shape == layer.b_k.shape == (H * D_K,)
    assert layer.b_v.shape == (H * D_V,) and layer.b_o.shape == (D_MODEL,)
    for b in (layer.b_q, layer.b_k, layer.b_v, layer.b_o):
        assert np.all(b == 0)  # zeros at start, as in PyTorch


def test_no_bias_means_no_bias_arrays():
    layer = MultiHeadAttention(8, 2)
    assert layer.b_q is None and layer.b_k is None and layer.b_v is None and layer.b_o is None
    assert sorted(layer.parameters()) == ["W_k", "W_o", "W_q", "W_v"]


def test_parameters_are_the_layers_own_arrays():
    layer = MultiHeadAttention(D_MODEL, H, D_K, D_V, bias=True)
    params = layer.parameters()
    assert sorted(params) == ["W_k", "W_o", "W_q", "W_v", "b_k", "b_o", "b_q", "b_v"]
    for name, p in params.items():
        assert p is getattr(layer, name)


def test_initial_weights_are_seeded_xavier_uniform():
    a, b, c = (MultiHeadAttention(16, 4, rng=seed) for seed in (0, 0, 1))
    np.testing.assert_array_equal(a.W_q, b.W_q)
    assert not np.array_equal(a.W_q, c.W_q)
    assert not np.array_equal(a.W_q, a.W_k)  # each projection drawn separately
    bound = np.sqrt(6 / (16 + 16))
    for W in (a.W_q, a.W_k, a.W_v, a.W_o):
        assert np.abs(W).max() <= bound and np.abs(W).max() > 0.8 * bound
    wide = MultiHeadAttention(16, 4, d_k=8, d_v=2, rng=0)
    assert np.abs(wide.W_q).max() <= np.sqrt(6 / (16 + 32))
    assert np.abs(wide.W_o).max() <= np.sqrt(6 / (8 + 16))


def test_generator_is_accepted_as_rng():
    layer = MultiHeadAttention(8, 2, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(layer.W_v, MultiHeadAttention(8, 2, rng=3).W_v)


# ------------------------------------------------------------------------ one attention path
@pytest.mark.parametrize("g", [1, 2, 4])
def test_attend_heads_reads_kv_head_i_over_h_by_g_for_query_head_i(rng, g):
    """The one GQA grouping: query head i attends with K/V head i // (h/g), each head alone
    through scaled_dot_product_attention (lesson 03), under the same mask."""
    h = 4
    q, k, v = rng.normal(size=(B, h, T, 3)), rng.normal(size=(B, g, T, 3)), rng.normal(
        size=(B, g, T, 5))
    heads, weights = attend_heads(q, k, v, causal_mask(T))
    for i in range(h):
        want, want_w = scaled_dot_product_attention(q[:, i], k[:, i // (h // g)],
                                                    v[:, i // (h // g)], mask=causal_mask(T))
        np.testing.assert_allclose(heads[:, i], want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(weights[:, i], want_w, rtol=1e-12, atol=1e-12)


def test_forward_and_every_step_attend_through_one_sdpa_kernel(rng, monkeypatch):
    """One attention path: forward, step and decode_step each run lesson 03's attention once,
    through its kernel ``sdpa_unchecked`` (the layer validated its input already; the steps go
    through attend_heads), the one place scaled_dot_product_attention's formula is written."""
    import mha_course.attention as attention_module
    import mha_course.heads as heads_module

    calls = []
    real = attention_module.sdpa_unchecked

    def spy(q, k, v, mask=None, scale=None, **hooks):
        calls.append((q.shape, k.shape, None if mask is None else np.shape(mask)))
        return real(q, k, v, mask, scale, **hooks)

    monkeypatch.setattr(multihead_module, "sdpa_unchecked", spy)  # the forward's kernel call
    monkeypatch.setattr(heads_module, "sdpa_unchecked", spy)  # the steps' (attend_heads)
    monkeypatch.setattr(attention_module, "sdpa_unchecked", spy)  # what the public function runs
    layer = conftest.random_layer(rng, d_model=12, h=4, n_kv_heads=2)
    x = rng.normal(size=(B, T, 12))
    layer(x, mask=causal_mask(T))
    cache = layer.init_cache(batch_shape=(B,))
    layer.step(x[:, :2], cache)
    layer.decode_step(x[:, 2:3], cache)
    assert len(calls) == 3


# ------------------------------------------------------------------------- the score scale
def scaled_by_definition(layer, x, scale, mask=None):
    """softmax(scale · q kᵀ) v per head, W_o after: the layer written out (no GQA, no RoPE)."""
    per = layer.per_head()
    heads, weights = [], []
    for i in range(layer.h):
        q, k, v = x @ per["W_q"][i], x @ per["W_k"][i], x @ per["W_v"][i]
        s = scale * q @ np.swapaxes(k, -1, -2)
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        heads.append(w @ v)
        weights.append(w)
    return np.concatenate(heads, -1) @ layer.W_o, np.stack(weights, -3)


@pytest.mark.parametrize("scale", [None, 144 ** -0.5, 0.9])
def test_a_layer_scales_its_scores_by_its_scale(rng, scale):
    # Gemma 2: query_pre_attn_scalar**-0.5 (27B: 144**-0.5 with head_dim 128), not 1/sqrt(d_k).
    layer = random_layer(rng, scale=scale)
    x = rng.normal(size=(B, T, D_MODEL))
    want = 1 / np.sqrt(D_K) if scale is None else scale
    want_out, want_w = scaled_by_definition(layer, x, want, causal_mask(T))
    out, w = layer(x, mask=causal_mask(T))
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-12)
    cache = layer.init_cache((B,))
    steps = [layer.decode_step(x[:, t : t + 1], cache)[0] for t in range(T)]
    np.testing.assert_allclose(np.concatenate(steps, -2), want_out, rtol=0, atol=1e-12)


def test_no_scale_is_the_default_layer_exactly(rng):
    x = rng.normal(size=(B, T, D_MODEL))
    a = MultiHeadAttention(D_MODEL, H, D_K, D_V, rng=3)
    b = MultiHeadAttention(D_MODEL, H, D_K, D_V, rng=3, scale=None)
    np.testing.assert_array_equal(a(x)[0], b(x)[0])
    c = MultiHeadAttention(D_MODEL, H, D_K, D_V, rng=3, scale=1 / np.sqrt(D_K))
    np.testing.assert_allclose(c(x)[0], a(x)[0], rtol=0, atol=1e-12)
    assert "scale" not in repr(a) and "scale=0.5" in repr(
        MultiHeadAttention(D_MODEL, H, D_K, D_V, scale=0.5))


def test_a_bad_scale_and_backward_with_a_scale_are_named_errors(rng):
    for bad in (0.0, -1.0, float("inf"), "0.1", True):
        with pytest.raises(ValueError, match=r"^MultiHeadAttention: scale=.* must be a positive "
                                             r"finite number \(None: 1/sqrt\(d_k\)\)$"):
            MultiHeadAttention(D_MODEL, H, D_K, scale=bad)
    with pytest.raises(ValueError, match=r"^scaled_dot_product_attention: scale=-2 must be"):
        scaled_dot_product_attention(np.ones((T, D_K)), np.ones((S, D_K)), np.ones((S, D_V)),
                                     scale=-2)
    layer = random_layer(rng, scale=0.3)
    with pytest.raises(ValueError, match=r"^MultiHeadAttention.forward: return_cache=True saves "
                                         r"what backward needs, and backward assumes the scale "
                                         r"1/sqrt\(d_k\); this layer has scale=0.3"):
        layer(rng.normal(size=(T, D_MODEL)), return_cache=True)


def test_head_mask_zero_ablates_a_head_as_zeroing_its_rows_of_W_o(rng):
    layer = conftest.random_layer(rng, d_model=12, h=4, n_kv_heads=2, bias=True)
    x = rng.normal(size=(B, T, 12))
    got, _ = layer(x, mask=causal_mask(T), head_mask=[1.0, 0.0, 1.0, 1.0])
    W_o = layer.W_o.copy()
    layer.W_o[3:6] = 0.0  # head 1's rows (d_v = 3)
    want, _ = layer(x, mask=causal_mask(T))
    layer.W_o[...] = W_o
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert not np.allclose(got, layer(x, mask=causal_mask(T))[0])
    with pytest.raises(ValueError, match=r"^MultiHeadAttention.forward: head_mask has shape "):
        layer(x, head_mask=[1.0, 0.0])
    with pytest.raises(ValueError, match=r"^MultiHeadAttention.forward: head_mask is for "):
        layer(x, head_mask=np.ones(4), return_cache=True)
