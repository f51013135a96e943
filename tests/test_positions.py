"""Positions: sinusoidal encodings, RoPE in both layouts, and the layer with ``rope=...``.

References are independent of the package: the paper's formula written as a double loop, and
RoPE as one (d, d) block-diagonal rotation matrix per position, built entry by entry.
"""

from __future__ import annotations

import functools
import math
import re

import conftest
import numpy as np
import pytest

from mha_course import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    causal_mask,
    merge_heads,
    rope_permutation,
    scaled_dot_product_attention,
    sinusoidal_positions,
    softmax,
    split_heads,
)
from mha_course.backward import gradient_check
from mha_course.positions import rope_angles

B, T, H, D_K, D_V, D_MODEL = 2, 5, 4, 6, 3, 10
# the shared helper (tests/conftest.py) with this module's sizes
random_layer = functools.partial(
    conftest.random_layer, d_model=D_MODEL, h=H, d_k=D_K, d_v=D_V, bias=True
)


def paper_positions(T, d_model, base=10000.0):
    pe = np.zeros((T, d_model))
    for p in range(T):
        for c in range(d_model):
            i = c // 2
            angle = p / base ** (2 * i / d_model)
            pe[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe


def rotation_matrix(p, d, layout, base=10000.0):
    """The (d, d) matrix R with rope(x) = x @ R.T for a row x at position p."""
    R = np.zeros((d, d))
    for j in range(d // 2):
        a, b = (j, j + d // 2) if layout == "half" else (2 * j, 2 * j + 1)
        theta = p * base ** (-2 * j / d)
        R[a, a], R[a, b] = math.cos(theta), -math.sin(theta)
        R[b, a], R[b, b] = math.sin(theta), math.cos(theta)
    return R


def rope_by_matrices(x, positions, layout, base=10000.0):
    out = np.empty_like(x)
    for t, p in enumerate(positions):
        out[..., t, :] = x[..., t, :] @ rotation_matrix(p, x.shape[-1], layout, base).T
    return out


# ------------------------------------------------------------------------------- sinusoidal
@pytest.mark.parametrize("T,d_model,base", [(7, 8, 10000.0), (4, 5, 10000.0), (6, 4, 100.0)])
def test_sinusoidal_positions_follow_the_papers_formula(T, d_model, base):
    got = sinusoidal_positions(T, d_model, base=base)
    assert got.shape == (T, d_model)
    np.testing.assert_allclose(got, paper_positions(T, d_model, base), rtol=0, atol=1e-15)


def test_a_fixed_offset_is_a_rotation_of_each_sin_cos_pair():
    pe = sinusoidal_positions(50, 16)
    k = 7
    for i in range(8):
        w = 1 / 10000 ** (2 * i / 16)
        R = np.array([[math.cos(k * w), -math.sin(k * w)], [math.sin(k * w), math.cos(k * w)]])
        np.testing.assert_allclose(pe[k:, 2 * i : 2 * i + 2], pe[:-k, 2 * i : 2 * i + 2] @ R,
                                   atol=1e-12)


# ------------------------------------------------------------------------------------- RoPE
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("positions", [None, [3, 0, 9, 4, 1], [-2, 5, 100, 7, 0]])
def test_apply_rope_equals_one_rotation_matrix_per_position(rng, layout, positions):
    x = rng.normal(size=(B, H, T, D_K))
    pos = np.arange(T) if positions is None else np.array(positions)
    got = apply_rope(x, None if positions is None else pos, layout=layout)
    np.testing.assert_allclose(got, rope_by_matrices(x, pos, layout), rtol=0, atol=1e-13)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_scores_depend_only_on_the_offset(rng, layout):
    q, k = rng.normal(size=D_K), rng.normal(size=D_K)
    scores = {}
    for m in range(6):
        for n in range(6):
            qm = apply_rope(q[None], np.array([m]), layout=layout)[0]
            kn = apply_rope(k[None], np.array([n]), layout=layout)[0]
            scores[(m, n)] = qm @ kn
    for (m, n), s in scores.items():
        assert s == pytest.approx(scores[(m - min(m, n), n - min(m, n))], abs=1e-12)
    assert len({round(s, 9) for s in scores.values()}) == 11  # offsets -5..5, all different


def test_the_two_layouts_are_the_same_rotation_after_permuting_features(rng):
    x = rng.normal(size=(T, D_K))
    # interleaved pair j is features (2j, 2j+1); half pair j is (j, j + d/2)
    perm = np.concatenate([np.arange(0, D_K, 2), np.arange(1, D_K, 2)])
    inverse = np.argsort(perm)
    half_of_permuted = apply_rope(x[:, perm], layout="half")
    np.testing.assert_allclose(half_of_permuted[:, inverse], apply_rope(x, layout="interleaved"),
                               atol=1e-14)
    assert not np.allclose(apply_rope(x, layout="half"), apply_rope(x, layout="interleaved"))


def test_negative_positions_undo_the_rotation_and_position_0_is_identity(rng):
    x = rng.normal(size=(H, T, D_K))
    p = np.array([0, 4, 7, 1, 30])
    np.testing.assert_allclose(apply_rope(apply_rope(x, p), -p), x, atol=1e-14)
    np.testing.assert_array_equal(apply_rope(x[:, :1], np.array([0])), x[:, :1])


def test_rope_keeps_float32_and_base_changes_the_angles(rng):
    x = rng.normal(size=(T, D_K)).astype(np.float32)
    assert apply_rope(x).dtype == np.float32
    np.testing.assert_allclose(apply_rope(x, base=500000.0),
                               rope_by_matrices(x.astype(float), np.arange(T), "half", 500000.0),
                               atol=1e-6)


@pytest.mark.parametrize("call,message", [
    (lambda: apply_rope(np.ones((3, 5))),
     "apply_rope: x has shape (3, 5); expected (..., T, d) with d even (RoPE turns pairs of "
     "features)"),
    (lambda: apply_rope(np.ones((3, 4)), layout="neox"),
     "apply_rope: layout='neox' is not one of 'half' (GPT-NeoX, Hugging Face) or 'interleaved' "
     "(Meta Llama, GPT-J)"),
    (lambda: apply_rope(np.ones((3, 4)), np.arange(4)),
     "apply_rope: positions has shape (4,); expected (T,) = (3,)"),
    (lambda: apply_rope(np.ones((3, 4)), np.array([0.0, 1.0, 2.0])),
     "apply_rope: positions has shape (3,) and dtype float64; expected integers of shape (T,) = "
     "(3,)"),
    (lambda: apply_rope(np.ones((3, 4)), base=1.0), "apply_rope: base=1.0 must be a number > 1"),
    (lambda: apply_rope(np.ones((3, 4), dtype=int)),
     "apply_rope: x has dtype int64; expected a real floating dtype (float32 or float64)"),
    (lambda: sinusoidal_positions(0, 4), "sinusoidal_positions: T=0 must be an integer >= 1"),
])
def test_bad_input_is_a_named_error(call, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call()


# ------------------------------------------------------------------------ the layer with RoPE
def manual_rope_forward(layer, x, mask=None):
    """Lesson 05's recipe, written out: project, split, rotate q and k (not v), attend, merge."""
    h, g = layer.h, layer.n_kv_heads
    q = split_heads(x @ layer.W_q + layer.b_q, h)
    k = np.repeat(split_heads(x @ layer.W_k + layer.b_k, g), h // g, axis=-3)
    v = np.repeat(split_heads(x @ layer.W_v + layer.b_v, g), h // g, axis=-3)
    positions = np.arange(x.shape[-2])
    q = rope_by_matrices(q, positions, layer.rope)
    k = rope_by_matrices(k, positions, layer.rope)
    heads, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    return merge_heads(heads) @ layer.W_o + layer.b_o, weights


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_layer_rotates_queries_and_keys_of_every_head(rng, layout, n_kv_heads):
    layer = random_layer(rng, n_kv_heads=n_kv_heads, rope=layout)
    x = rng.normal(size=(B, T, D_MODEL))
    out, weights = layer(x, mask=causal_mask(T))
    want_out, want_weights = manual_rope_forward(layer, x, causal_mask(T))
    np.testing.assert_allclose(out, want_out, atol=1e-13)
    np.testing.assert_allclose(weights, want_weights, atol=1e-14)


def test_rope_makes_the_layer_order_aware(rng):
    plain, rotary = random_layer(np.random.default_rng(1)), random_layer(
        np.random.default_rng(1), rope="half")
    x = rng.normal(size=(T, D_MODEL))
    perm = np.array([3, 0, 4, 1, 2])
    # without positions, permuting the tokens permutes the outputs (equivariance) ...
    np.testing.assert_allclose(plain(x[perm])[0], plain(x)[0][perm], atol=1e-13)
    # ... with RoPE it does not
    assert not np.allclose(rotary(x[perm])[0], rotary(x)[0][perm], atol=1e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_decoding_with_rope_equals_the_causal_forward(rng, layout, n_kv_heads):
    layer = random_layer(rng, n_kv_heads=n_kv_heads, rope=layout)
    x = rng.normal(size=(B, T, D_MODEL))
    want, want_weights = layer(x, mask=causal_mask(T))
    cache = layer.init_cache(batch_shape=(B,))
    for t in range(T):
        out_t, weights_t = layer.decode_step(x[:, t : t + 1], cache)
        np.testing.assert_allclose(out_t[:, 0], want[:, t], atol=1e-13)
        np.testing.assert_allclose(weights_t[..., 0, :], want_weights[..., t, : t + 1],
                                   atol=1e-14)
    assert cache.tokens_seen == len(cache) == T


def test_decoding_without_the_position_offset_would_differ(rng):
    """The bug of open_lm#74: every new token rotated as if at position 0."""
    layer = random_layer(rng, rope="half")
    x = rng.normal(size=(T, D_MODEL))
    want = layer(x, mask=causal_mask(T))[0]
    cache = layer.init_cache()
    for t in range(T):
        out_t, _ = layer.decode_step(x[t : t + 1], cache)
    np.testing.assert_allclose(out_t[0], want[-1], atol=1e-13)
    wrong = layer.init_cache()
    for t in range(T):
        wrong.tokens_seen = 0  # the bug: the offset forgotten, every token rotated as if first
        wrong_t, _ = layer.decode_step(x[t : t + 1], wrong)
    assert not np.allclose(wrong_t[0], want[-1], atol=1e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_through_rope_passes_the_gradient_check(rng, layout):
    layer = random_layer(rng, n_kv_heads=2, rope=layout)
    x, G = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, T, D_MODEL))

    def loss_and_grad(name):
        def f(value):
            old = getattr(layer, name) if name != "x" else None
            if name == "x":
                out, saved = layer.forward(value, mask=causal_mask(T), return_cache=True)
            else:
                setattr(layer, name, value)
                out, saved = layer.forward(x, mask=causal_mask(T), return_cache=True)
            grads = layer.backward(G, saved)
            if name != "x":
                setattr(layer, name, old)
            return float(np.sum(out * G)), grads[name]
        return f

    for name in ("x", "W_q", "W_k", "W_v", "b_q", "b_k"):
        start = x if name == "x" else getattr(layer, name).copy()
        assert gradient_check(loss_and_grad(name), start, eps=1e-5) < 1e-6, name


def test_rope_layer_refuses_cross_attention_and_odd_d_k(rng):
    layer = random_layer(rng, rope="half")
    with pytest.raises(ValueError, match=r"^MultiHeadAttention: rope='half' rotates queries and "
                                         r"keys by their positions in one sequence"):
        layer(rng.normal(size=(T, D_MODEL)), context=rng.normal(size=(T + 1, D_MODEL)))
    with pytest.raises(ValueError, match=r"^MultiHeadAttention: rope='half' turns pairs of "
                                         r"features, so d_k=5 must be even$"):
        conftest.random_layer(rng, d_model=10, h=2, rope="half")
    with pytest.raises(ValueError, match=r"^MultiHeadAttention: layout='yes' is not one of"):
        conftest.random_layer(rng, d_model=8, h=2, rope="yes")
    assert repr(random_layer(rng, rope="interleaved", rope_base=500000.0)).endswith(
        "rope='interleaved', rope_base=500000)")


# ------------------------------------------------------- the two layouts, as weights are loaded
def permuted_copy(layer, perm, rope):
    """The same layer with W_q, W_k (and b_q, b_k) columns taken in the order ``perm``."""
    other = conftest.random_layer(np.random.default_rng(0), d_model=layer.d_model, h=layer.h,
                                  d_k=layer.d_k, d_v=layer.d_v, bias=layer.bias,
                                  n_kv_heads=layer.n_kv_heads, rope=rope)
    for name, p in layer.parameters().items():
        setattr(other, name, p.copy())
    perm_k = perm[: layer.n_kv_heads * layer.d_k]  # GQA: the first g heads' order, same pattern
    other.W_q, other.b_q = layer.W_q[:, perm], layer.b_q[perm]
    other.W_k, other.b_k = layer.W_k[:, perm_k], layer.b_k[perm_k]
    return other


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_permuting_w_q_and_w_k_makes_interleaved_equal_half(rng, n_kv_heads):
    """What Hugging Face's Llama conversion does: interleaved weights, permuted, run half-split."""
    interleaved = random_layer(rng, n_kv_heads=n_kv_heads, rope="interleaved")
    half = permuted_copy(interleaved, rope_permutation(D_K, H), "half")
    x = rng.normal(size=(B, T, D_MODEL))
    np.testing.assert_allclose(half(x, mask=causal_mask(T))[0],
                               interleaved(x, mask=causal_mask(T))[0], atol=1e-13)
    back = permuted_copy(half, np.argsort(rope_permutation(D_K, H)), "interleaved")
    np.testing.assert_allclose(back.W_q, interleaved.W_q)


def test_loading_weights_in_the_wrong_layout_changes_scores_except_at_offset_0(rng):
    """huggingface/transformers#25199: interleaved weights run with half-split RoPE, unpermuted."""
    right = random_layer(rng, rope="interleaved")
    wrong = permuted_copy(right, np.arange(H * D_K), "half")
    x = rng.normal(size=(T, D_MODEL))
    w_right, w_wrong = right(x)[1], wrong(x)[1]
    assert not np.allclose(w_right, w_wrong, atol=1e-3)
    # raw scores q_m·k_n: equal where m == n (no net rotation), different elsewhere
    q = split_heads(x @ right.W_q + right.b_q, H)
    k = split_heads(x @ right.W_k + right.b_k, H)
    s_right = apply_rope(q, layout="interleaved") @ np.swapaxes(
        apply_rope(k, layout="interleaved"), -1, -2)
    s_wrong = apply_rope(q, layout="half") @ np.swapaxes(apply_rope(k, layout="half"), -1, -2)
    diag = np.arange(T)
    np.testing.assert_allclose(s_right[:, diag, diag], s_wrong[:, diag, diag], atol=1e-12)
    off = ~np.eye(T, dtype=bool)
    assert np.abs(s_right - s_wrong)[:, off].min() > 1e-6


def test_rope_permutation_orders_even_features_first_in_each_head():
    np.testing.assert_array_equal(rope_permutation(6), [0, 2, 4, 1, 3, 5])
    np.testing.assert_array_equal(rope_permutation(4, 3), [0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11])
    with pytest.raises(ValueError, match=r"^rope_permutation: d_k=5 must be even \(RoPE turns "
                                         r"pairs of features\)$"):
        rope_permutation(5)
    with pytest.raises(ValueError, match=r"^rope_permutation: h=0 must be an integer >= 1$"):
        rope_permutation(4, 0)


# ------------------------------------------------------------------- rope_angles, stretched
def test_rope_angles_take_fractional_positions_and_a_larger_base():
    d, s = 64, 4
    theta = 10000.0 ** (-2 * np.arange(d // 2) / d)
    # position interpolation: positions p / s turn every pair s times slower
    np.testing.assert_allclose(rope_angles(np.arange(8) / s, d), np.arange(8)[:, None] * theta / s,
                               rtol=1e-15)
    # NTK-aware scaling: the first pair keeps its speed, the last one is s times slower
    ntk = rope_angles(np.array([1]), d, base=10000.0 * s ** (d / (d - 2)))[0]
    assert ntk[0] == 1.0
    np.testing.assert_allclose(ntk[-1], theta[-1] / s, rtol=1e-12)


# ------------------------------------------------------------------------------------ ALiBi
def test_alibi_slopes_for_a_power_of_two_are_the_papers_sequence_exactly():
    assert alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128,
                                        1 / 256]
    assert alibi_slopes(1).tolist() == [1 / 256]
    assert alibi_slopes(2).tolist() == [1 / 16, 1 / 256]


def test_alibi_slopes_for_other_head_counts_follow_the_reference_rule():
    # 12 heads: the 8 slopes of h = 8, then slopes 0, 2, 4, 6 of h = 16 (2**(-k/2), k = 1..16)
    want = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12).tolist() == want
    # 3 heads: the 2 slopes of h = 2, then slope 0 of h = 4
    assert alibi_slopes(3).tolist() == [2.0**-4, 2.0**-8, 2.0**-2]
    for h in range(1, 40):
        assert alibi_slopes(h).shape == (h,)


def test_alibi_bias_is_minus_slope_times_distance_constant_along_diagonals():
    h, T = 4, 7
    bias = alibi_bias(h, T)
    slopes = alibi_slopes(h)
    assert bias.shape == (h, T, T) and bias.dtype == np.float64
    for i in range(h):
        for t in range(T):
            for s in range(T):
                assert bias[i, t, s] == -slopes[i] * (t - s)
        for off in range(-T + 1, T):
            assert np.ptp(np.diagonal(bias[i], off)) == 0
    np.testing.assert_array_equal(np.diagonal(bias, axis1=1, axis2=2), 0.0)


def test_alibi_bias_puts_fewer_queries_at_the_end_bottom_right():
    h, T, S = 3, 2, 6
    bias = alibi_bias(h, T, S)
    assert bias.shape == (h, T, S)
    # the queries are positions S - T .. S - 1: the last rows of the square (S, S) bias
    np.testing.assert_array_equal(bias, alibi_bias(h, S)[:, S - T :])
    # 0 exactly where causal_mask(T, S) has its last allowed key, the query's own position
    last_allowed = causal_mask(T, S).sum(axis=-1) - 1
    np.testing.assert_array_equal(bias[:, np.arange(T), last_allowed], 0.0)
    assert (bias[np.broadcast_to(causal_mask(T, S), bias.shape)] <= 0).all()


def test_alibi_in_attention_makes_the_steepest_head_look_nearest():
    # uniform scores: the weights come from the bias alone
    h, T = 8, 32
    w = softmax(np.zeros((h, T, T)) + alibi_bias(h, T), mask=causal_mask(T))  # (h, T, T)
    mean_distance = (w[:, -1] * np.arange(T)[::-1]).sum(axis=-1)  # last query, per head
    assert (np.diff(mean_distance) > 0).all()


@pytest.mark.parametrize("call,message", [
    (lambda: alibi_slopes(0), "alibi_slopes: h=0 must be an integer >= 1"),
    (lambda: alibi_slopes(2.0), "alibi_slopes: h=2.0 must be an integer >= 1"),
    (lambda: alibi_bias(8, 0), "alibi_bias: T=0 must be an integer >= 1"),
    (lambda: alibi_bias(True, 3), "alibi_bias: h=True must be an integer >= 1"),
    (lambda: alibi_bias(8, 4, 3),
     "alibi_bias: S=3 must be >= T=4 (the queries are the last T of S positions)"),
])
def test_alibi_bad_input_is_a_named_error(call, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call()
