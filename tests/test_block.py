"""The block around attention: inverted dropout, LayerNorm, pre-/post-LN residuals.

References: the definitions written out here, and PyTorch (``F.dropout``'s scaling and
``nn.TransformerEncoderLayer`` with ``norm_first`` False and True, its
weights copied from ours; ``F.layer_norm`` in the gold table of
``tests/test_torch_parity.py``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mha_course import MultiHeadAttention, dropout, layer_norm, residual

B, T, D_MODEL, H, D_FF = 2, 5, 8, 2, 12


# ------------------------------------------------------------------------------------ dropout
def test_eval_mode_and_p_zero_return_the_input_unchanged(rng):
    x = rng.random((B, H, T, T))
    assert dropout(x, 0.3, rng=0, training=False) is x
    assert dropout(x, 0.0, rng=0) is x


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.8])
def test_survivors_are_scaled_by_one_over_one_minus_p_and_the_rest_are_zero(rng, p):
    x = rng.random((B, H, T, T)) + 0.1  # no zeros in x, so a zero means "dropped"
    y = dropout(x, p, rng=7)
    kept = y != 0
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=1e-15)
    assert 0 < kept.sum() < x.size


def test_the_mask_is_rng_random_at_least_p_so_a_seed_reproduces_it(rng):
    x = rng.random((3, 4, 6))
    want = np.where(np.random.default_rng(11).random(x.shape) >= 0.2, x / 0.8, 0.0)
    np.testing.assert_allclose(dropout(x, 0.2, rng=11), want, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(dropout(x, 0.2, rng=11), dropout(x, 0.2, rng=11))
    gen = np.random.default_rng(11)
    assert not np.array_equal(dropout(x, 0.2, rng=gen), dropout(x, 0.2, rng=gen))


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_keeps_the_expected_value_and_drops_a_fraction_p(p):
    x = np.full((200_000,), 0.125)
    y = dropout(x, p, rng=3)
    assert abs((y == 0).mean() - p) < 0.005
    assert abs(y.mean() / 0.125 - 1) < 0.01
    # the "1/p" mistake of rasbt/LLMs-from-scratch#431 would give a mean of (1 - p)/p times x
    wrong = np.where(y != 0, x / p, 0.0)
    assert abs(wrong.mean() / 0.125 - (1 - p) / p) < 0.05


def test_dropout_keeps_float32(rng):
    x = rng.random((4, 5)).astype(np.float32)
    assert dropout(x, 0.5, rng=0).dtype == np.float32


@pytest.mark.parametrize("call,message", [
    (lambda: dropout(np.ones(3), 1.0), "dropout: p=1.0 must be a number with 0 <= p < 1 (p = 1 "
                                       "would drop everything and divide by 0)"),
    (lambda: dropout(np.ones(3), -0.1), "dropout: p=-0.1 must be a number with 0 <= p < 1 (p = "
                                        "1 would drop everything and divide by 0)"),
    (lambda: dropout(np.ones(3), "0.1"), "dropout: p='0.1' must be a number with 0 <= p < 1"),
    (lambda: dropout(np.ones(3, dtype=int), 0.1),
     "dropout: x has dtype int64; expected a real floating dtype (float32 or float64)"),
    (lambda: layer_norm(np.ones((2, 4)), gamma=np.ones(3)),
     "layer_norm: gamma has shape (3,); expected (d_model,) with d_model=4 (from x)"),
    (lambda: layer_norm(np.float64(1.0)), "layer_norm: x has shape (); expected (..., d_model)"),
    (lambda: residual(np.ones((2, 4)), lambda y: y, "middle"),
     "residual: placement='middle' is not one of 'pre' (GPT-2 onward) or 'post' (Vaswani et "
     "al. 2017)"),
    (lambda: residual(np.ones((2, 4)), lambda y: y[:, :3]),
     "residual: sublayer returned shape (2, 3); expected (2, 4), the shape of x (the residual "
     "adds them)"),
])
def test_bad_input_is_a_named_error(call, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call()


# --------------------------------------------------------------------------------- LayerNorm
def test_layer_norm_gives_rows_of_mean_0_and_variance_1_then_scales_and_shifts(rng):
    x = 3.0 + 5.0 * rng.normal(size=(B, T, D_MODEL))
    y = layer_norm(x, eps=0.0)
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=-1), 1, atol=1e-12)
    gamma, beta = rng.normal(size=D_MODEL), rng.normal(size=D_MODEL)
    np.testing.assert_allclose(layer_norm(x, gamma, beta, eps=0.0), y * gamma + beta, atol=1e-12)


def test_residual_placements_follow_their_formulas(rng):
    x = rng.normal(size=(B, T, D_MODEL))
    W = rng.normal(size=(D_MODEL, D_MODEL))

    def f(y):
        return np.tanh(y @ W)

    np.testing.assert_allclose(residual(x, f, "post"), layer_norm(x + f(x)), atol=1e-14)
    np.testing.assert_allclose(residual(x, f, "pre"), x + f(layer_norm(x)), atol=1e-14)


# -------------------------------------------------------------------------- against PyTorch
@pytest.mark.torch
def test_dropout_scales_like_torch(torch):
    x = np.linspace(0.1, 1.0, 1000)
    for p in (0.1, 0.4):
        theirs = torch.nn.functional.dropout(torch.from_numpy(x), p=p, training=True).numpy()
        ours = dropout(x, p, rng=0)
        kept_t, kept_o = theirs != 0, ours != 0
        np.testing.assert_allclose(theirs[kept_t] / x[kept_t], 1 / (1 - p), rtol=1e-12)
        np.testing.assert_allclose(ours[kept_o] / x[kept_o], 1 / (1 - p), rtol=1e-12)


@pytest.mark.torch
@pytest.mark.parametrize("placement", ["post", "pre"])
def test_an_encoder_layer_built_from_residual_matches_torch(torch, rng, placement):
    mha = MultiHeadAttention(D_MODEL, H, bias=True, rng=rng)
    for name, p in mha.parameters().items():
        setattr(mha, name, rng.normal(size=p.shape) / np.sqrt(D_MODEL))
    W1, b1 = rng.normal(size=(D_MODEL, D_FF)) / np.sqrt(D_MODEL), rng.normal(size=D_FF)
    W2, b2 = rng.normal(size=(D_FF, D_MODEL)) / np.sqrt(D_FF), rng.normal(size=D_MODEL)
    norms = [(rng.normal(size=D_MODEL), rng.normal(size=D_MODEL)) for _ in range(2)]
    x = rng.normal(size=(B, T, D_MODEL))

    y = residual(x, lambda z: mha(z)[0], placement, gamma=norms[0][0], beta=norms[0][1])
    ours = residual(y, lambda z: np.maximum(z @ W1 + b1, 0) @ W2 + b2, placement,
                    gamma=norms[1][0], beta=norms[1][1])

    layer = torch.nn.TransformerEncoderLayer(
        D_MODEL, H, dim_feedforward=D_FF, dropout=0.0, batch_first=True,
        norm_first=placement == "pre", dtype=torch.float64)
    layer.eval()
    t = torch.from_numpy
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(t(np.concatenate([mha.W_q.T, mha.W_k.T, mha.W_v.T])))
        layer.self_attn.in_proj_bias.copy_(t(np.concatenate([mha.b_q, mha.b_k, mha.b_v])))
        layer.self_attn.out_proj.weight.copy_(t(mha.W_o.T))
        layer.self_attn.out_proj.bias.copy_(t(mha.b_o))
        layer.linear1.weight.copy_(t(W1.T))
        layer.linear1.bias.copy_(t(b1))
        layer.linear2.weight.copy_(t(W2.T))
        layer.linear2.bias.copy_(t(b2))
        for norm, (g, b) in zip((layer.norm1, layer.norm2), norms, strict=True):
            norm.weight.copy_(t(g))
            norm.bias.copy_(t(b))
        theirs = layer(t(x)).numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-12)


# ------------------------------------------ RMSNorm, SwiGLU and the backward passes (lesson 09)
from mha_course import gradient_check, rms_norm, swiglu  # noqa: E402
from mha_course.block import (  # noqa: E402
    layer_norm_backward,
    rms_norm_backward,
    sigmoid,
    swiglu_backward,
)


def _weights(rng, d_model=D_MODEL, d_ff=D_FF):
    return (rng.normal(size=(d_model, d_ff)) / np.sqrt(d_model),
            rng.normal(size=(d_model, d_ff)) / np.sqrt(d_model),
            rng.normal(size=(d_ff, d_model)) / np.sqrt(d_ff))


def test_rms_norm_is_x_over_its_root_mean_square_times_the_weight(rng):
    x, w = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=D_MODEL)
    want = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(rms_norm(x, w), want, rtol=1e-14)
    y = rms_norm(x, eps=0.0)
    np.testing.assert_allclose(np.sqrt((y ** 2).mean(-1)), 1.0, rtol=1e-14)
    np.testing.assert_allclose(rms_norm(3.0 * x, eps=0.0), y, rtol=1e-13)  # scale-invariant


def test_rms_norm_keeps_the_mean_that_layer_norm_removes(rng):
    x = rng.normal(size=(T, D_MODEL)) + 5.0
    assert np.abs(layer_norm(x).mean(-1)).max() < 1e-12
    assert rms_norm(x).mean(-1).min() > 0.5


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_backward_matches_central_differences(rng, with_weight):
    x = rng.normal(size=(B, T, D_MODEL))
    w = rng.normal(size=D_MODEL) if with_weight else None
    g = rng.normal(size=x.shape)
    dx, dw = rms_norm_backward(g, x, w)
    assert gradient_check(lambda x_: (float((rms_norm(x_, w) * g).sum()), dx), x) < 1e-6
    if with_weight:
        assert gradient_check(lambda w_: (float((rms_norm(x, w_) * g).sum()), dw), w) < 1e-6
    else:
        assert dw is None


@pytest.mark.parametrize("with_gamma", [True, False])
def test_layer_norm_backward_matches_central_differences(rng, with_gamma):
    x = rng.normal(size=(B, T, D_MODEL))
    gamma = rng.normal(size=D_MODEL) if with_gamma else None
    beta = rng.normal(size=D_MODEL)
    g = rng.normal(size=x.shape)
    dx, dgamma, dbeta = layer_norm_backward(g, x, gamma)
    loss = lambda x_, ga, be: float((layer_norm(x_, ga, be) * g).sum())  # noqa: E731
    assert gradient_check(lambda x_: (loss(x_, gamma, beta), dx), x) < 1e-6
    assert gradient_check(lambda b_: (loss(x, gamma, b_), dbeta), beta) < 1e-6
    if with_gamma:
        assert gradient_check(lambda g_: (loss(x, g_, beta), dgamma), gamma) < 1e-6


def test_sigmoid_never_overflows_and_is_one_over_one_plus_exp():
    a = np.array([-1000.0, -30.0, -1.0, 0.0, 2.0, 1000.0])
    with np.errstate(over="raise"):
        s = sigmoid(a)
    np.testing.assert_allclose(s[1:5], 1 / (1 + np.exp(-a[1:5])), rtol=1e-15)
    assert s[0] == 0.0 and s[-1] == 1.0


def test_swiglu_is_the_gated_mlp(rng):
    x = rng.normal(size=(B, T, D_MODEL))
    W_gate, W_up, W_down = _weights(rng)
    a = x @ W_gate
    want = (a / (1 + np.exp(-a)) * (x @ W_up)) @ W_down
    np.testing.assert_allclose(swiglu(x, W_gate, W_up, W_down), want, rtol=1e-13)


def test_swiglu_backward_matches_central_differences(rng):
    x = rng.normal(size=(B, T, D_MODEL))
    W = dict(zip(("W_gate", "W_up", "W_down"), _weights(rng), strict=True))
    g = rng.normal(size=x.shape)
    grads = swiglu_backward(g, x, **W)

    def loss(**kw):
        args = {"x": x, **W, **kw}
        return float((swiglu(args["x"], args["W_gate"], args["W_up"], args["W_down"]) * g).sum())

    assert gradient_check(lambda x_: (loss(x=x_), grads["x"]), x) < 1e-6
    for name in W:
        assert gradient_check(lambda w_, n=name: (loss(**{n: w_}), grads[n]), W[name]) < 1e-6


def test_a_wrong_swiglu_gradient_is_caught_by_the_check(rng):
    x = rng.normal(size=(T, D_MODEL))
    W_gate, W_up, W_down = _weights(rng)
    g = rng.normal(size=x.shape)
    wrong = swiglu_backward(g, x, W_gate, W_up, W_down)["W_up"] * 1.5
    err = gradient_check(lambda w_: (float((swiglu(x, W_gate, w_, W_down) * g).sum()), wrong), W_up)
    assert err > 0.1


def test_bad_shapes_name_the_argument_and_what_was_expected(rng):
    W_gate, W_up, W_down = _weights(rng)
    with pytest.raises(ValueError, match=re.escape(
            "swiglu: W_up has shape (8, 5); expected (d_model, d_ff) with d_model=8 (from x), "
            "d_ff=12 (from W_gate)")):
        swiglu(np.ones((T, D_MODEL)), W_gate, W_up[:, :5], W_down)
    with pytest.raises(ValueError, match=r"^rms_norm: weight has shape \(3,\); expected "
                                         r"\(d_model,\) with d_model=8 \(from x\)"):
        rms_norm(np.ones((T, D_MODEL)), np.ones(3))
    with pytest.raises(ValueError, match=r"^rms_norm_backward: grad_y has shape \(5, 7\); "
                                         r"expected \(5, 8\), the shape of x"):
        rms_norm_backward(np.ones((T, 7)), np.ones((T, D_MODEL)))
    with pytest.raises(ValueError, match=r"^rms_norm: x has dtype int64"):
        rms_norm(np.ones((2, 3), dtype=np.int64))


@pytest.mark.torch
def test_rms_norm_swiglu_and_their_gradients_match_pytorch_autograd(torch, rng):
    F = torch.nn.functional
    x = rng.normal(size=(B, T, D_MODEL))
    w, gamma = rng.normal(size=D_MODEL), rng.normal(size=D_MODEL)
    W_gate, W_up, W_down = _weights(rng)
    g = rng.normal(size=x.shape)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in
         dict(x=x, w=w, gamma=gamma, W_gate=W_gate, W_up=W_up, W_down=W_down).items()}
    tg = torch.tensor(g)
    y_rms = F.rms_norm(t["x"], (D_MODEL,), t["w"], eps=1e-5)
    y_ln = F.layer_norm(t["x"], (D_MODEL,), t["gamma"], None, eps=1e-5)
    y_mlp = (F.silu(t["x"] @ t["W_gate"]) * (t["x"] @ t["W_up"])) @ t["W_down"]
    np.testing.assert_allclose(rms_norm(x, w), y_rms.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(swiglu(x, W_gate, W_up, W_down), y_mlp.detach().numpy(),
                               rtol=1e-12, atol=1e-14)
    ((y_rms + y_ln + y_mlp) * tg).sum().backward()
    dx_rms, dw = rms_norm_backward(g, x, w)
    dx_ln, dgamma, _ = layer_norm_backward(g, x, gamma)
    mlp = swiglu_backward(g, x, W_gate, W_up, W_down)
    np.testing.assert_allclose(dx_rms + dx_ln + mlp["x"], t["x"].grad.numpy(), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(dw, t["w"].grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dgamma, t["gamma"].grad.numpy(), rtol=1e-10, atol=1e-12)
    for name in ("W_gate", "W_up", "W_down"):
        np.testing.assert_allclose(mlp[name], t[name].grad.numpy(), rtol=1e-10, atol=1e-12)
