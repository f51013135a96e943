"""``linear_attention``: equals the explicit quadratic form φ(q) φ(k)ᵀ, rows normalised, times v.

Checked non-causal (T != S, batch axes that broadcast) and causal (bottom-right aligned, as
``causal_mask``, T == S and T < S); causality (later tokens cannot change earlier outputs);
the feature map positive and dtype-preserving; float32 stays float32; bad input refused with
messages; a hypothesis search over shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_course import causal_mask, elu_feature_map, linear_attention


def quadratic(q, k, v, causal=False):
    """The (T, S) form: weights φ(q) φ(k)ᵀ, (masked,) rows divided by their sums, times v."""
    w = elu_feature_map(q) @ np.swapaxes(elu_feature_map(k), -1, -2)  # (..., T, S)
    if causal:
        w = np.where(causal_mask(q.shape[-2], k.shape[-2]), w, 0.0)
    w = w / w.sum(axis=-1, keepdims=True)
    return w @ v


def qkv(rng, lead_q, lead_kv, T, S, d_k=4, d_v=6, dtype=np.float64):
    q = rng.normal(size=(*lead_q, T, d_k)).astype(dtype)
    k = rng.normal(size=(*lead_kv, S, d_k)).astype(dtype)
    v = rng.normal(size=(*lead_kv, S, d_v)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize(("T", "S"), [(5, 5), (3, 9), (9, 3), (1, 1)])
@pytest.mark.parametrize(
    ("lead_q", "lead_kv"), [((), ()), ((2, 3), (2, 3)), ((2, 3), (1, 3)), ((2, 1), ())]
)
def test_non_causal_equals_quadratic_form(rng, T, S, lead_q, lead_kv):
    q, k, v = qkv(rng, lead_q, lead_kv, T, S)
    out = linear_attention(q, k, v)
    assert out.shape == np.broadcast_shapes(lead_q, lead_kv) + (T, 6)
    np.testing.assert_allclose(out, quadratic(q, k, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("T", "S"), [(7, 7), (3, 8), (1, 5), (1, 1)])
@pytest.mark.parametrize(("lead_q", "lead_kv"), [((), ()), ((2, 3), (2, 3)), ((2, 3), (3,))])
def test_causal_equals_masked_quadratic_form(rng, T, S, lead_q, lead_kv):
    q, k, v = qkv(rng, lead_q, lead_kv, T, S)
    out = linear_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out, quadratic(q, k, v, causal=True), rtol=1e-12, atol=1e-12)


def test_causal_differs_from_non_causal(rng):
    # the test above could not catch a causal flag that is ignored if the two agreed
    q, k, v = qkv(rng, (), (), 6, 6)
    assert np.max(np.abs(linear_attention(q, k, v, causal=True) - linear_attention(q, k, v))) > 1e-3


def test_causal_last_query_sees_everything(rng):
    q, k, v = qkv(rng, (2,), (2,), 6, 6)
    causal = linear_attention(q, k, v, causal=True)
    np.testing.assert_allclose(causal[..., -1, :], linear_attention(q, k, v)[..., -1, :],
                               rtol=1e-12)


def test_causal_output_depends_only_on_the_past(rng):
    n, cut = 10, 4
    q, k, v = qkv(rng, (2,), (2,), n, n)
    out = linear_attention(q, k, v, causal=True)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a in (q2, k2, v2):
        a[..., cut:, :] = rng.normal(size=a[..., cut:, :].shape) * 5
    out2 = linear_attention(q2, k2, v2, causal=True)
    np.testing.assert_array_equal(out2[..., :cut, :], out[..., :cut, :])
    assert np.max(np.abs(out2[..., cut:, :] - out[..., cut:, :])) > 1e-3


def test_feature_map_positive_and_elu_plus_one(rng):
    x = np.concatenate([rng.normal(size=50) * 10, [-800.0, 0.0, 1e30]])
    phi = elu_feature_map(x)
    assert np.all(phi[x > -700] > 0)  # positive wherever exp(x) does not underflow
    assert phi[x == -800.0][0] >= 0
    want = np.where(x > 0, x + 1, np.expm1(np.minimum(x, 0)) + 1)
    np.testing.assert_allclose(phi, want, rtol=1e-15, atol=1e-15)  # expm1 + 1 rounds tiny values
    assert np.all(np.isfinite(phi))


@pytest.mark.parametrize("causal", [False, True])
def test_float32_stays_float32(rng, causal):
    q, k, v = qkv(rng, (2,), (2,), 5, 5, dtype=np.float32)
    out = linear_attention(q, k, v, causal=causal)
    assert out.dtype == np.float32
    assert elu_feature_map(q).dtype == np.float32
    ref = quadratic(*(a.astype(np.float64) for a in (q, k, v)), causal=causal)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_large_inputs_do_not_overflow(rng):
    q, k, v = qkv(rng, (), (), 4, 6)
    out = linear_attention(q * 1e3, k * 1e3, v)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (((5, 4), (4, 7), (7, 6)), {},
         r"linear_attention: k has shape \(4, 7\); expected \(S, d_k\) with d_k=4 \(from q\)"),
        (((5, 4), (7, 4), (6, 6)), {},
         r"linear_attention: v has shape \(6, 6\); expected \(S, d_v\) with S=7 \(from k\)"),
        (((4,), (7, 4), (7, 6)), {},
         r"linear_attention: q has shape \(4,\); expected \(\.\.\., T, d_k\)"),
        (((2, 5, 4), (3, 7, 4), (3, 7, 6)), {}, r"linear_attention: the batch axes of q"),
        (((5, 4), (0, 4), (0, 6)), {},
         r"linear_attention: k has shape \(0, 4\); expected at least"),
        (((8, 4), (7, 4), (7, 6)), {"causal": True},
         r"linear_attention: causal=True needs T <= S .*got T=8 from q, S=7 from k"),
    ],
)
def test_bad_shapes_raise(args, kwargs, message):
    q, k, v = (np.zeros(shape) for shape in args)
    with pytest.raises(ValueError, match=message):
        linear_attention(q, k, v, **kwargs)


def test_bad_dtypes_raise():
    with pytest.raises(ValueError, match=r"linear_attention: q has dtype int64; expected a real"):
        linear_attention(np.zeros((2, 3), dtype=np.int64), np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"elu_feature_map: x has dtype bool"):
        elu_feature_map(np.zeros(3, dtype=bool))


@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    T=st.integers(1, 6),
    extra=st.integers(0, 4),
    d_k=st.integers(1, 5),
    d_v=st.integers(1, 5),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_hypothesis_shapes(lead, T, extra, d_k, d_v, causal, seed):
    rng = np.random.default_rng(seed)
    S = T + extra
    q, k, v = qkv(rng, tuple(lead), tuple(lead), T, S, d_k, d_v)
    out = linear_attention(q, k, v, causal=causal)
    assert out.shape == (*lead, T, d_v)
    np.testing.assert_allclose(out, quadratic(q, k, v, causal=causal), rtol=1e-10, atol=1e-10)
