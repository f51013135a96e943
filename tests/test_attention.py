"""scaled_dot_product_attention, causal_mask and padding_mask."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mha_course import causal_mask, padding_mask, scaled_dot_product_attention

moderate = st.floats(-5, 5, allow_nan=False, allow_infinity=False)
side = st.integers(1, 5)
batch_shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3)


def reference_attention(q, k, v, mask=None):
    """The paper's formula, one query at a time, for 2-D q (T, d_k), k (S, d_k), v (S, d_v)."""
    T, d_k = q.shape
    S, d_v = v.shape
    out, weights = np.zeros((T, d_v)), np.zeros((T, S))
    for t in range(T):
        scores = np.array([np.dot(q[t], k[s]) for s in range(S)]) / math.sqrt(d_k)
        allowed = np.ones(S, dtype=bool) if mask is None else mask[t]
        if allowed.any():
            e = np.exp(scores[allowed] - scores[allowed].max())
            weights[t, allowed] = e / e.sum()
        out[t] = sum(weights[t, s] * v[s] for s in range(S))
    return out, weights


def reference_batched(q, k, v, mask=None):
    """reference_attention over every index of the broadcast batch axes."""
    T, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q = np.broadcast_to(q, (*batch, *q.shape[-2:]))
    k = np.broadcast_to(k, (*batch, *k.shape[-2:]))
    v = np.broadcast_to(v, (*batch, *v.shape[-2:]))
    m = None if mask is None else np.broadcast_to(mask, (*batch, T, S))
    out, weights = np.zeros((*batch, T, v.shape[-1])), np.zeros((*batch, T, S))
    for idx in np.ndindex(*batch):
        out[idx], weights[idx] = reference_attention(
            q[idx], k[idx], v[idx], None if m is None else m[idx]
        )
    return out, weights


@st.composite
def attention_inputs(draw, with_mask=True, elements=moderate, dtype=np.float64):
    """q, k, v with random batch axes and sizes, and maybe a mask of (T, S) or full shape."""
    batch = draw(batch_shapes, label="batch")
    T, S, d_k, d_v = (draw(side, label=name) for name in ("T", "S", "d_k", "d_v"))
    q = draw(hnp.arrays(dtype, (*batch, T, d_k), elements=elements), label="q")
    k = draw(hnp.arrays(dtype, (*batch, S, d_k), elements=elements), label="k")
    v = draw(hnp.arrays(dtype, (*batch, S, d_v), elements=elements), label="v")
    mask = None
    if with_mask and draw(st.booleans(), label="has_mask"):
        mask_shape = draw(st.sampled_from([(T, S), (*batch, T, S)]), label="mask_shape")
        mask = draw(hnp.arrays(np.bool_, mask_shape), label="mask")
    return q, k, v, mask


# ------------------------------------------------------------------------- hand-computed cases
# T=2 queries, S=3 keys, d_k=4 (so √d_k = 2), d_v=2.
Q = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
K = np.array([[2.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
V = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]])


def test_hand_computed_attention():
    # scores = Q Kᵀ = [[4, 0, 0], [0, 0, 2]];  / √4  ->  [[2, 0, 0], [0, 0, 1]].
    # row 0: [e², 1, 1] / (e² + 2) = [0.786986, 0.106507, 0.106507]
    # row 1: [1, 1, e]  / (2 + e)  = [0.211942, 0.211942, 0.576117]
    # out row 0 = (e²·[1, 0] + [0, 1] + [3, 3]) / (e² + 2) = [e² + 3, 4] / (e² + 2)
    #           = [1.106507, 0.426028]
    # out row 1 = ([1, 0] + [0, 1] + e·[3, 3]) / (2 + e) = (1 + 3e) / (2 + e) · [1, 1]
    #           = [1.940292, 1.940292]
    # Without the 1/√d_k row 0 would be [e⁴, 1, 1] / (e⁴ + 2) = [0.964663, ...].
    out, weights = scaled_dot_product_attention(Q, K, V)
    np.testing.assert_allclose(
        weights, [[0.78698604, 0.10650698, 0.10650698], [0.21194156, 0.21194156, 0.57611688]],
        rtol=1e-7,
    )
    np.testing.assert_allclose(
        out, [[1.10650698, 0.42602792], [1.94029221, 1.94029221]], rtol=1e-7
    )
    e = math.e
    np.testing.assert_allclose(weights[0], np.array([e**2, 1, 1]) / (e**2 + 2), rtol=1e-14)
    np.testing.assert_allclose(out[1], [(1 + 3 * e) / (2 + e)] * 2, rtol=1e-14)


def test_hand_computed_attention_with_mask():
    # Row 0 may not attend to key 0 (its favourite): weights [0, 1/2, 1/2] (the two other
    # scores are equal), out = ([0, 1] + [3, 3]) / 2 = [1.5, 2]. Row 1 may see keys 0 and 2:
    # scores [0, 1] -> [1, e] / (1 + e), out = ([1, 0] + e·[3, 3]) / (1 + e).
    # A mask applied after the softmax would leave row 0 summing to 0.213, not 1.
    mask = np.array([[False, True, True], [True, False, True]])
    out, weights = scaled_dot_product_attention(Q, K, V, mask=mask)
    e = math.e
    np.testing.assert_allclose(weights, [[0, 0.5, 0.5], [1 / (1 + e), 0, e / (1 + e)]])
    np.testing.assert_allclose(out, [[1.5, 2.0], [(1 + 3 * e) / (1 + e), 3 * e / (1 + e)]])
    assert weights[0, 0] == 0.0 and weights[1, 1] == 0.0


def test_causal_attention_with_equal_scores_is_a_running_mean():
    # q = k = 0 makes every score 0: each query averages the values it may see, so
    # out[t] = mean(v[:t+1]) = [3, 0], [(3+6)/2, (0+3)/2], [(3+6+0)/3, (0+3+9)/3].
    q = np.zeros((3, 2))
    v = np.array([[3.0, 0.0], [6.0, 3.0], [0.0, 9.0]])
    out, weights = scaled_dot_product_attention(q, q, v, mask=causal_mask(3))
    np.testing.assert_allclose(weights, [[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(out, [[3.0, 0.0], [4.5, 1.5], [3.0, 4.0]])


def test_causal_mask_is_lower_triangular():
    assert causal_mask(3).tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]
    assert causal_mask(3).dtype == np.bool_


def test_causal_mask_with_more_keys_aligns_queries_to_the_end():
    # Queries are the last T=2 of S=4 positions: query t sees keys s <= t + 2.
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(3, 3).tolist() == causal_mask(3).tolist()


def test_padding_mask_hides_positions_past_each_length():
    m = padding_mask([2, 0, 3], 4)
    assert m.shape == (3, 1, 4) and m.dtype == np.bool_
    assert m[:, 0].tolist() == [
        [True, True, False, False],
        [False, False, False, False],
        [True, True, True, False],
    ]
    np.testing.assert_array_equal(padding_mask(np.array([2, 0, 3], dtype=np.int32), 4), m)


def test_padding_mask_applies_to_every_query(rng):
    # (B=2, 1, S=5) broadcasts against (B, T=3, S): padded keys get weight 0 for every query.
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 6))
    out, weights = scaled_dot_product_attention(q, k, v, mask=padding_mask([2, 4], 5))
    assert np.all(weights[0, :, 2:] == 0) and np.all(weights[1, :, 4:] == 0)
    np.testing.assert_allclose(weights.sum(-1), 1.0)
    # Changing the padded values changes nothing.
    v2 = v.copy()
    v2[0, 2:] = 1e3
    v2[1, 4:] = -1e3
    np.testing.assert_allclose(
        scaled_dot_product_attention(q, k, v2, mask=padding_mask([2, 4], 5))[0], out, atol=1e-12
    )


# -------------------------------------------------------------------------------- properties
@given(attention_inputs())
def test_attention_matches_the_formula_row_by_row(inputs):
    q, k, v, mask = inputs
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    ref_out, ref_weights = reference_batched(q, k, v, mask)
    assert out.shape == ref_out.shape and weights.shape == ref_weights.shape
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-10)


@given(st.integers(2, 6), st.integers(1, 4), st.integers(1, 4), st.data())
def test_future_tokens_do_not_change_past_outputs(T, d_k, d_v, data):
    arrays = {
        name: data.draw(hnp.arrays(np.float64, (T, d), elements=moderate), label=name)
        for name, d in (("q", d_k), ("k", d_k), ("v", d_v))
    }
    t = data.draw(st.integers(0, T - 2), label="last_kept")
    changed = {
        name: np.concatenate(
            [a[: t + 1], data.draw(hnp.arrays(np.float64, (T - t - 1, a.shape[1]),
                                              elements=moderate), label=f"new_{name}")]
        )
        for name, a in arrays.items()
    }
    out, weights = scaled_dot_product_attention(**arrays, mask=causal_mask(T))
    out2, weights2 = scaled_dot_product_attention(**changed, mask=causal_mask(T))
    np.testing.assert_allclose(out2[: t + 1], out[: t + 1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights2[: t + 1], weights[: t + 1], rtol=1e-12, atol=1e-12)
    assert np.all(weights[np.triu_indices(T, 1)] == 0)


@given(st.integers(1, 5), st.integers(1, 6), st.data())
def test_permuting_keys_and_values_together_permutes_weight_columns(T, S, data):
    q = data.draw(hnp.arrays(np.float64, (T, 3), elements=moderate), label="q")
    k = data.draw(hnp.arrays(np.float64, (S, 3), elements=moderate), label="k")
    v = data.draw(hnp.arrays(np.float64, (S, 2), elements=moderate), label="v")
    perm = np.array(data.draw(st.permutations(range(S)), label="perm"))
    out, weights = scaled_dot_product_attention(q, k, v)
    out_p, weights_p = scaled_dot_product_attention(q, k[perm], v[perm])
    np.testing.assert_allclose(weights_p, weights[:, perm], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out_p, out, rtol=1e-10, atol=1e-12)


@given(attention_inputs(with_mask=False), st.data())
def test_fully_masked_rows_give_zero_weights_and_zero_output(inputs, data):
    q, k, v, _ = inputs
    T, S = q.shape[-2], k.shape[-2]
    mask = data.draw(hnp.arrays(np.bool_, (T, S)), label="mask")
    dead = data.draw(hnp.arrays(np.bool_, (T,)), label="fully_masked_rows")
    mask[dead] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert not np.isnan(out).any() and not np.isnan(weights).any()
    empty = ~mask.any(axis=-1)  # (T,)
    assert np.all(weights[..., empty, :] == 0)
    assert np.all(out[..., empty, :] == 0)
    np.testing.assert_allclose(weights[..., ~empty, :].sum(-1), 1.0, rtol=1e-12)


@given(
    attention_inputs(elements=st.floats(-100, 100), dtype=np.float64),
    st.sampled_from([np.float32, np.float64]),
)
def test_huge_finite_scores_never_give_nan_or_inf(inputs, dtype):
    # Entries up to 100 with d_k up to 5 give scores up to 100·100·5/√5 ≈ 2.2e4.
    q, k, v, mask = inputs
    scale = 100.0 / max(np.abs(q).max(), np.abs(k).max(), 1.0)  # push the largest entry to 100
    q, k, v = (q * scale).astype(dtype), (k * scale).astype(dtype), v.astype(dtype)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(weights))
    row_sums = weights.sum(-1)
    assert np.all((np.abs(row_sums - 1) < 1e-5) | (row_sums == 0))


@pytest.mark.parametrize(
    ("dtype", "top"),
    # exp overflows above ~88.7 in float32 and ~709.8 in float64, and underflows to 0 below
    # about -103 and -745: scores just past those limits, both signs.
    [(np.float32, 100.0), (np.float32, -100.0), (np.float64, 800.0), (np.float64, -800.0)],
)
def test_scores_beyond_the_range_of_exp_give_exact_weights(dtype, top):
    # d_k = 1, q = [[top]], k = [[1], [0.9]]: scores [top, 0.9·top], a gap of 0.1·|top|.
    # weights = softmax([top, 0.9·top]) = [1, e^-g] / (1 + e^-g) with g = 0.1·top.
    q = np.array([[top]], dtype=dtype)
    k = np.array([[1.0], [0.9]], dtype=dtype)
    v = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=dtype)
    out, weights = scaled_dot_product_attention(q, k, v)
    g = 0.1 * top
    expected = np.array([1.0, math.exp(-g)]) / (1.0 + math.exp(-g))
    assert np.all(np.isfinite(weights)) and np.all(np.isfinite(out))
    np.testing.assert_allclose(weights[0], expected, rtol=1e-5)
    np.testing.assert_allclose(out[0], expected, rtol=1e-5)


# ------------------------------------------------------------------------ dtypes, axes, copies
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_keeps_the_input_float_dtype(dtype, rng):
    q, k, v = (rng.normal(size=s).astype(dtype) for s in [(2, 3, 4), (2, 5, 4), (2, 5, 6)])
    for mask in (None, causal_mask(3, 5)):
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
        assert out.dtype == dtype and weights.dtype == dtype


def test_float32_result_is_close_to_float64(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 6))
    out64, w64 = scaled_dot_product_attention(q, k, v)
    out32, w32 = scaled_dot_product_attention(*(a.astype(np.float32) for a in (q, k, v)))
    np.testing.assert_allclose(out32, out64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w32, w64, rtol=1e-5, atol=1e-6)


def test_any_leading_batch_axes_are_independent(rng):
    # (2, 3, T, d): batch and heads; every index equals the 2-D call on that slice.
    q, k, v = rng.normal(size=(2, 3, 4, 6)), rng.normal(size=(2, 3, 5, 6)), rng.normal(
        size=(2, 3, 5, 7))
    mask = rng.random((2, 3, 4, 5)) > 0.3
    mask[..., 0] = True
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.shape == (2, 3, 4, 7) and weights.shape == (2, 3, 4, 5)
    for i, j in np.ndindex(2, 3):
        o, w = scaled_dot_product_attention(q[i, j], k[i, j], v[i, j], mask=mask[i, j])
        np.testing.assert_allclose(out[i, j], o, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(weights[i, j], w, rtol=1e-12, atol=1e-14)


def test_batch_axes_broadcast_between_q_k_and_v(rng):
    # q (2, 1, T, d_k) and k, v (3, S, d) broadcast to a (2, 3) batch.
    q, k, v = rng.normal(size=(2, 1, 3, 4)), rng.normal(size=(3, 5, 4)), rng.normal(size=(3, 5, 6))
    out, weights = scaled_dot_product_attention(q, k, v, mask=causal_mask(3, 5))
    assert out.shape == (2, 3, 3, 6) and weights.shape == (2, 3, 3, 5)
    for i, j in np.ndindex(2, 3):
        o, w = scaled_dot_product_attention(q[i, 0], k[j], v[j], mask=causal_mask(3, 5))
        np.testing.assert_allclose(out[i, j], o, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(weights[i, j], w, rtol=1e-12, atol=1e-14)


def test_attention_does_not_modify_its_inputs(rng):
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 6))
    mask = padding_mask([2, 5], 5)
    copies = [a.copy() for a in (q, k, v, mask)]
    scaled_dot_product_attention(q, k, v, mask=mask)
    for a, before in zip((q, k, v, mask), copies, strict=True):
        np.testing.assert_array_equal(a, before)


def test_weights_are_a_fresh_array_not_a_view_of_the_inputs(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 6))
    out, weights = scaled_dot_product_attention(q, k, v)
    for a in (q, k, v):
        assert not np.shares_memory(weights, a) and not np.shares_memory(out, a)


def test_batch_axes_carried_only_by_v_and_the_mask_reach_the_weights():
    # q and k unbatched, v and the mask batched: each batch entry masks its own weights.
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(2, 5, 6))
    mask = np.array([[True] * 5, [True, True, False, False, False]])[:, None, :]  # (2, 1, 5)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.shape == (2, 3, 6) and weights.shape == (2, 3, 5)
    for b in range(2):
        out_b, weights_b = scaled_dot_product_attention(q, k, v[b], mask=mask[b])
        np.testing.assert_allclose(weights[b], weights_b, rtol=0, atol=1e-12)
        np.testing.assert_allclose(out[b], out_b, rtol=0, atol=1e-12)
