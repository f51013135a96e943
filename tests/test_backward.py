"""The hand-written backward pass (``mha_course.backward``) and ``gradient_check``.

The gradients are checked three ways: against torch autograd on the same parameters (float64,
max abs difference <= 1e-10), against central differences (``gradient_check``, every parameter
and input), and by properties (masked keys and fully masked rows get exactly 0, a batch's
parameter gradient is the sum of its examples'). A deliberately wrong gradient is shown to fail
``gradient_check``, so that check can fail.

torch conventions used below: our ``q = x @ W_q`` is torch's ``x @ W_q`` with the same array
(no transpose: the reference is written with plain tensor ops, not ``nn.MultiheadAttention``);
our masks and ``F.scaled_dot_product_attention``'s bool ``attn_mask`` both say True = may
attend. torch gives NaN for a query with no allowed key, so fully masked rows are checked
against our own zeros and ``gradient_check`` instead.
"""

from __future__ import annotations

import functools
import math

import conftest
import numpy as np
import pytest

from mha_course import (
    KVCache,
    LatentCache,
    attention_backward,
    causal_mask,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    split_heads,
)
from mha_course.backward import SavedActivations, backward, gradient_check

TOL = 1e-10  # float64 max abs difference from torch autograd
# gradient_check on the layer, with step EPS (near the optimum cbrt(float64 eps) for these O(1)
# losses): a correct gradient must give a relative error below REL. Central differences carry
# an absolute error from round-off, measured at most 1.3e-9 on these cases over six seeds
# (ROUNDOFF allows 4x that); an element whose true derivative g is tiny therefore shows a
# relative error up to ROUNDOFF / (2|g|) even when it is right, so the bound is loosened to
# that, and only that, when the smallest nonzero |g| is below ROUNDOFF / (2 REL) = 2.5e-3.
REL = 1e-6
EPS = 1e-5
ROUNDOFF = 5e-9


def rel_tolerance(grad):
    """REL, or the relative error that round-off alone can give on grad's smallest element."""
    nonzero = np.abs(grad[grad != 0])
    return max(REL, ROUNDOFF / (2 * nonzero.min())) if nonzero.size else REL
# Every dimension different: B=2, T=3, h=4, S=5, d_k=6, d_model=7, d_v=9.
B, T, H, S, D_K, D_MODEL, D_V = 2, 3, 4, 5, 6, 7, 9
# the shared helper (tests/conftest.py) with this module's sizes
random_layer = functools.partial(conftest.random_layer, d_model=D_MODEL, h=H, d_k=D_K, d_v=D_V)




def loss_and_grads(layer, G, x, context=None, mask=None):
    """loss = sum(out * G) and its gradients by our backward pass."""
    out, cache = layer.forward(x, context, mask, return_cache=True)
    return float(np.sum(out * G)), layer.backward(G, cache)


def torch_grads(torch, layer, G, x, context=None, mask=None, gqa="repeat"):
    """Gradients of sum(out * G) by torch autograd, same parameters, same keys as ours.

    ``gqa="sdpa"`` shares key/value heads with ``F.scaled_dot_product_attention(...,
    enable_gqa=True)``; ``"repeat"`` with ``repeat_interleave`` and explicit softmax attention
    (which also broadcasts batch axes between x and context).
    """
    F = torch.nn.functional
    h, g = layer.h, layer.n_kv_heads
    t = {name: torch.tensor(p, requires_grad=True) for name, p in layer.parameters().items()}
    xt = torch.tensor(x, requires_grad=True)
    ct = xt if context is None else torch.tensor(context, requires_grad=True)

    def heads(a, n):  # (..., N, n*d) -> (..., n, N, d)
        return a.reshape(*a.shape[:-1], n, -1).transpose(-2, -3)

    def bias(name):
        return t[name] if layer.bias else 0.0

    q = heads(xt @ t["W_q"] + bias("b_q"), h)  # (..., h, T, d_k)
    k = heads(ct @ t["W_k"] + bias("b_k"), g)  # (..., g, S, d_k)
    v = heads(ct @ t["W_v"] + bias("b_v"), g)  # (..., g, S, d_v)
    m = None if mask is None else torch.from_numpy(np.asarray(mask)).unsqueeze(-3)
    if gqa == "sdpa":
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=g < h)
    else:
        k, v = k.repeat_interleave(h // g, dim=-3), v.repeat_interleave(h // g, dim=-3)
        scores = q @ k.transpose(-1, -2) / math.sqrt(layer.d_k)  # (..., h, T, S)
        if m is not None:
            scores = scores.masked_fill(~m, float("-inf"))
        o = torch.softmax(scores, dim=-1) @ v  # (..., h, T, d_v)
    o = o.transpose(-2, -3).reshape(*o.shape[:-3], o.shape[-2], -1)  # (..., T, h*d_v)
    out = o @ t["W_o"] + bias("b_o")
    (out * torch.from_numpy(G)).sum().backward()
    grads = {"x": xt.grad.numpy()}
    if context is not None:
        grads["context"] = ct.grad.numpy()
    grads.update((name, p.grad.numpy()) for name, p in t.items())
    return out.detach().numpy(), grads


def assert_grads_match(ours, theirs, tol=TOL):
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert ours[name].shape == theirs[name].shape, name
        diff = float(np.max(np.abs(ours[name] - theirs[name]), initial=0.0))
        assert diff <= tol, f"{name}: max abs difference {diff:.2e} from torch"


# ------------------------------------------------------------------------------ the forward pass
FORWARD_CASES = {
    "self": dict(lead=(B,), cross=False, mask=None),
    "self_unbatched_causal": dict(lead=(), cross=False, mask="causal"),
    "cross_padding": dict(lead=(B,), cross=True, mask="padding"),
    "cross_unbatched": dict(lead=(), cross=True, mask=None),
}


def make_inputs(rng, lead, cross, mask):
    x = rng.normal(size=(*lead, T, D_MODEL))
    context = rng.normal(size=(*lead, S, D_MODEL)) if cross else None
    S_ = S if cross else T
    if mask == "causal":
        mask = causal_mask(T, S_)
    elif mask == "padding":  # (B, 1, S); no row fully masked
        mask = padding_mask([S_ - 2, S_ - 1][: lead[0] if lead else 1], S_)
        mask = mask if lead else mask[0]
    return x, context, mask


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("case", FORWARD_CASES)
def test_return_cache_gives_the_plain_forward_and_its_saved_activations(rng, case, bias,
                                                                       n_kv_heads):
    layer = random_layer(rng, bias, n_kv_heads)
    x, context, mask = make_inputs(rng, **FORWARD_CASES[case])
    out, weights = layer.forward(x, context, mask)
    out_c, cache = layer.forward(x, context, mask, return_cache=True)
    assert isinstance(cache, SavedActivations) and cache.layer is layer
    assert out_c.shape == out.shape and cache.weights.shape == weights.shape
    assert np.max(np.abs(out_c - out)) <= 1e-12
    assert np.max(np.abs(cache.weights - weights)) <= 1e-12


def test_saved_activations_keep_float32(rng):
    layer = random_layer(rng, bias=True)
    x = rng.normal(size=(B, T, D_MODEL)).astype(np.float32)
    out, cache = layer.forward(x, mask=causal_mask(T), return_cache=True)
    grads = backward(layer, np.ones_like(out), cache)
    assert out.dtype == cache.weights.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())
    _, grads64 = loss_and_grads(layer, np.ones(out.shape), x.astype(np.float64), None,
                                causal_mask(T))
    for name in grads:
        np.testing.assert_allclose(grads[name], grads64[name], rtol=1e-4, atol=1e-5)


def test_return_cache_validates_like_forward(rng):
    layer = random_layer(rng)
    bad = rng.normal(size=(T, D_MODEL + 1))
    with pytest.raises(ValueError) as plain:
        layer.forward(bad)
    with pytest.raises(ValueError) as cached:
        layer.forward(bad, return_cache=True)
    assert str(cached.value) == str(plain.value)
    assert str(plain.value).startswith("MultiHeadAttention: x has shape (3, 8)")
    with pytest.raises(ValueError, match=r"MultiHeadAttention: mask has shape \(3, 4\)"):
        layer.forward(rng.normal(size=(T, D_MODEL)), mask=np.ones((T, 4), bool), return_cache=True)


# -------------------------------------------------------------------- parity with torch autograd
PARITY_CASES = {
    # name: (lead of x, lead of context or None for self-attention, mask)
    "self_batched": ((B,), None, None),
    "self_unbatched": ((), None, None),
    "self_causal": ((B,), None, "causal"),
    "self_padding": ((B,), None, "padding"),
    "self_causal_and_padding_unbatched": ((), None, "causal_and_padding"),
    "cross_batched": ((B,), (B,), None),
    "cross_unbatched": ((), (), None),
    "cross_padding": ((B,), (B,), "padding"),
    "cross_causal_T_ne_S": ((B,), (B,), "causal"),
    "cross_one_context_for_a_batch": ((B,), (), "padding"),
    "cross_one_query_set_for_a_batch": ((), (B,), None),
}


def parity_inputs(rng, x_lead, c_lead, masking):
    x = rng.normal(size=(*x_lead, T, D_MODEL))
    context = None if c_lead is None else rng.normal(size=(*c_lead, S, D_MODEL))
    S_ = T if context is None else S
    batch = np.broadcast_shapes(x_lead, c_lead or ())
    lengths = [S_ - 2, S_ - 1][: batch[0]] if batch else [S_ - 2]
    pad = padding_mask(lengths, S_)  # (B, 1, S): no row fully masked
    pad = pad if batch else pad[0]
    mask = {
        None: None,
        "causal": causal_mask(T, S_),
        "padding": pad,
        "causal_and_padding": causal_mask(T, S_) & pad,
    }[masking]
    return x, context, mask


@pytest.mark.torch
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("case", PARITY_CASES)
def test_backward_matches_torch_autograd(torch, rng, case, bias):
    layer = random_layer(rng, bias)
    x, context, mask = parity_inputs(rng, *PARITY_CASES[case])
    out, cache = layer.forward(x, context, mask, return_cache=True)
    G = rng.normal(size=out.shape)
    ours = layer.backward(G, cache)
    out_t, theirs = torch_grads(torch, layer, G, x, context, mask)
    assert np.max(np.abs(out - out_t)) <= 1e-12
    assert_grads_match(ours, theirs)
    assert ours["x"].shape == x.shape
    if context is not None:
        assert ours["context"].shape == context.shape


@pytest.mark.torch
@pytest.mark.parametrize("gqa", ["sdpa", "repeat"], ids=["sdpa_enable_gqa", "repeat_interleave"])
@pytest.mark.parametrize("n_kv_heads", [1, 2], ids=["mqa", "gqa2"])
@pytest.mark.parametrize("case", ["self_causal", "cross_padding", "self_unbatched"])
def test_gqa_backward_matches_torch_autograd(torch, rng, case, n_kv_heads, gqa):
    layer = random_layer(rng, bias=True, n_kv_heads=n_kv_heads)
    x, context, mask = parity_inputs(rng, *PARITY_CASES[case])
    out, cache = layer.forward(x, context, mask, return_cache=True)
    G = rng.normal(size=out.shape)
    ours = layer.backward(G, cache)
    _, theirs = torch_grads(torch, layer, G, x, context, mask, gqa=gqa)
    assert ours["W_k"].shape == (D_MODEL, n_kv_heads * D_K)
    assert ours["W_v"].shape == (D_MODEL, n_kv_heads * D_V)
    assert_grads_match(ours, theirs)


# ------------------------------------------------------------------------------- masks and zeros
def test_masked_keys_get_zero_gradient(rng):
    layer = random_layer(rng, bias=True)
    lengths = [2, 4]
    x, context = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, S, D_MODEL))
    G = rng.normal(size=(B, T, D_MODEL))
    _, grads = loss_and_grads(layer, G, x, context, padding_mask(lengths, S))
    for b, n in enumerate(lengths):
        assert np.all(grads["context"][b, n:] == 0), f"padding of sequence {b} got a gradient"
        assert np.all(np.abs(grads["context"][b, :n]) > 0)


def fully_masked_mask():
    """(B, T, S) causal-and-padding mask in which query 0 of sequence 1 has no key at all."""
    mask = np.broadcast_to(causal_mask(T, S), (B, T, S)).copy()
    mask[1, 0, :] = False
    return mask


def test_fully_masked_query_row_gets_zero_gradient_not_nan(rng):
    layer = random_layer(rng, bias=True)
    x, context = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, S, D_MODEL))
    G = rng.normal(size=(B, T, D_MODEL))
    out, cache = layer.forward(x, context, fully_masked_mask(), return_cache=True)
    grads = layer.backward(G, cache)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    assert np.all(cache.weights[1, :, 0, :] == 0)
    np.testing.assert_array_equal(out[1, 0], layer.b_o)  # no key: the output is the bias
    assert np.all(grads["x"][1, 0] == 0)  # the row's query moves nothing
    assert np.all(np.abs(grads["x"][1, 1:]) > 0)


def test_sequence_with_no_keys_gets_zero_gradient_everywhere(rng):
    # padding length 0: every query of sequence 0 is fully masked (torch would give NaN).
    layer = random_layer(rng, bias=True)
    x = rng.normal(size=(B, T, D_MODEL))
    G = rng.normal(size=(B, T, D_MODEL))
    _, grads = loss_and_grads(layer, G, x, mask=padding_mask([0, 2], T))
    assert np.all(grads["x"][0] == 0)
    assert np.all(np.isfinite(grads["x"])) and np.any(grads["x"][1] != 0)
    np.testing.assert_allclose(grads["b_o"], G.sum(axis=(0, 1)))


def test_key_bias_gets_zero_gradient_because_softmax_is_shift_invariant(rng):
    # q·(k + b_k) adds the same q·b_k to every score of a row, which softmax ignores.
    layer = random_layer(rng, bias=True)
    x, G = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, T, D_MODEL))
    loss, grads = loss_and_grads(layer, G, x, mask=causal_mask(T))
    assert np.max(np.abs(grads["b_k"])) <= 1e-12
    layer.b_k = layer.b_k + rng.normal(size=layer.b_k.shape)
    assert abs(loss_and_grads(layer, G, x, mask=causal_mask(T))[0] - loss) <= 1e-12


def test_empty_context_gives_zero_key_and_value_gradients(rng):
    layer = random_layer(rng, bias=True)
    x, context = rng.normal(size=(T, D_MODEL)), np.zeros((0, D_MODEL))
    G = rng.normal(size=(T, D_MODEL))
    _, grads = loss_and_grads(layer, G, x, context)
    assert grads["context"].shape == (0, D_MODEL)
    for name in ("x", "W_q", "W_k", "W_v", "b_q", "b_k", "b_v"):
        assert np.all(grads[name] == 0), name


# -------------------------------------------------------------------------------- batch algebra
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_batch_gradient_is_sum_of_example_gradients(rng, cross):
    layer = random_layer(rng, bias=True)
    x = rng.normal(size=(B, T, D_MODEL))
    context = rng.normal(size=(B, S, D_MODEL)) if cross else None
    mask = padding_mask([S - 1, S - 3], S) if cross else causal_mask(T)
    G = rng.normal(size=(B, T, D_MODEL))
    _, batch = loss_and_grads(layer, G, x, context, mask)
    singles = [
        loss_and_grads(layer, G[b], x[b], None if context is None else context[b],
                       mask[b] if cross else mask)[1]
        for b in range(B)
    ]
    for name, g in batch.items():
        if name in ("x", "context"):
            np.testing.assert_allclose(g, np.stack([s[name] for s in singles]), atol=1e-12)
        else:
            np.testing.assert_allclose(g, sum(s[name] for s in singles), atol=1e-12)


def test_shared_context_gradient_sums_over_the_batch(rng):
    layer = random_layer(rng)
    x, context = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(S, D_MODEL))
    G = rng.normal(size=(B, T, D_MODEL))
    _, shared = loss_and_grads(layer, G, x, context)
    _, tiled = loss_and_grads(layer, G, x, np.broadcast_to(context, (B, S, D_MODEL)).copy())
    assert shared["context"].shape == (S, D_MODEL)
    np.testing.assert_allclose(shared["context"], tiled["context"].sum(axis=0), atol=1e-12)


# ------------------------------------------------------------------------------ gradient_check
GC_CASES = {
    # name: (bias, n_kv_heads, x lead, context lead, masking)
    "self_causal_bias": (True, None, (B,), None, "causal"),
    "cross_padding_bias": (True, None, (B,), (B,), "padding"),
    "gqa_cross_unbatched": (True, 2, (), (), None),
    "mqa_self_padding_no_bias": (False, 1, (B,), None, "padding"),
    "self_fully_masked_row": (True, None, (B,), None, "fully_masked"),
}


@pytest.mark.parametrize("case", GC_CASES)
def test_gradient_check_agrees_with_backward(rng, case):
    bias, n_kv_heads, x_lead, c_lead, masking = GC_CASES[case]
    layer = random_layer(rng, bias, n_kv_heads)
    if masking == "fully_masked":
        x, context = rng.normal(size=(B, T, D_MODEL)), None
        mask = np.broadcast_to(causal_mask(T), (B, T, T)).copy()
        mask[0, 1, :] = False  # query 1 of sequence 0 sees nothing
    else:
        x, context, mask = parity_inputs(rng, x_lead, c_lead, masking)
    G = rng.normal(size=layer.forward(x, context, mask)[0].shape)
    inputs = {"x": x} if context is None else {"x": x, "context": context}
    names = list(inputs) + list(layer.parameters())
    assert len(names) == (len(inputs) + 4 + 4 * bias)
    for name in names:
        if name == "b_k":
            continue  # its true gradient is 0 (see the shift-invariance test): no relative error

        def f(value, name=name):
            args = dict(inputs)
            if name in args:
                args[name] = value
            else:
                setattr(layer, name, value)
            loss, grads = loss_and_grads(layer, G, args["x"], args.get("context"), mask)
            return loss, grads[name]

        start = inputs[name] if name in inputs else getattr(layer, name).copy()
        err = gradient_check(f, start, eps=EPS)
        if name not in inputs:
            setattr(layer, name, start)
        tol = rel_tolerance(f(start)[1])
        assert err < tol, f"{name}: relative error {err:.1e} (tolerance {tol:.1e})"


WRONG = ["correct", "softmax_without_subtraction", "scale_forgotten", "scale_applied_twice"]


@pytest.mark.parametrize("variant", WRONG)
def test_gradient_check_catches_a_wrong_gradient(rng, variant):
    """dLoss/dW_q rewritten here, with one deliberate bug per variant; only 'correct' passes."""
    layer = random_layer(rng)
    x, G = rng.normal(size=(B, T, D_MODEL)), rng.normal(size=(B, T, D_MODEL))
    mask = causal_mask(T)

    def f(W_q):
        layer.W_q = W_q
        out, c = layer.forward(x, mask=mask, return_cache=True)
        d_heads = split_heads(G @ layer.W_o.T, H)  # (B, h, T, d_v)
        d_weights = d_heads @ np.swapaxes(c.v, -1, -2)  # (B, h, T, S)
        if variant == "softmax_without_subtraction":
            d_scores = c.weights * d_weights  # the Jacobian's diagonal only
        else:
            d_scores = c.weights * (d_weights - np.sum(d_weights * c.weights, -1, keepdims=True))
        scale = {"scale_forgotten": 1.0, "scale_applied_twice": 1 / D_K}.get(
            variant, 1 / math.sqrt(D_K))
        d_q = merge_heads(d_scores * scale @ c.k)  # (B, T, h*d_k)
        return float(np.sum(out * G)), np.einsum("btd,bte->de", x, d_q)

    err = gradient_check(f, layer.W_q.copy(), eps=EPS)
    if variant == "correct":
        assert err < rel_tolerance(f(layer.W_q.copy())[1])
    else:
        assert err > 0.1, f"gradient_check missed the bug {variant!r}: relative error {err:.1e}"


def test_gradient_check_leaves_the_callers_array_alone():
    x = np.array([[0.3, -1.2, 2.0], [0.1, 0.0, -0.7]])
    before = x.copy()
    seen = []

    def f(z):
        seen.append(z.copy())
        return float(np.sum(np.sin(z))), np.cos(z)

    assert gradient_check(f, x) < 1e-8
    np.testing.assert_array_equal(x, before)
    assert len(seen) == 1 + 2 * x.size  # the gradient, then x + eps and x - eps per element
    np.testing.assert_array_equal(seen[0], before)
    for i in range(x.size):
        for sign, z in ((1, seen[1 + 2 * i]), (-1, seen[2 + 2 * i])):
            moved = np.flatnonzero(z != before)
            assert moved.tolist() == [i], "exactly one element moves, the others were restored"
            assert z.flat[i] == pytest.approx(before.flat[i] + sign * 1e-6, abs=1e-15)


def test_gradient_check_reports_relative_error_with_its_documented_formula():
    x = np.array([1.0, -2.0, 0.0])
    # analytic 3x against the true 2x: |2x - 3x| / (|2x| + |3x|) = 1/5; 0 where both are 0.
    assert gradient_check(lambda z: (float(z @ z), 3 * z), x) == pytest.approx(0.2, abs=1e-8)


@pytest.mark.parametrize(
    ("x", "f", "eps", "message"),
    [
        (np.ones(3, np.float32), None, 1e-6,
         r"gradient_check: x has dtype float32; expected float64"),
        (np.ones(3), None, 0.0, r"gradient_check: eps=0.0 must be a positive number"),
        (np.ones(3), lambda z: (0.0, np.ones(2)), 1e-6,
         r"gradient_check: f\(x\) returned a grad of shape \(2,\); expected x's shape \(3,\)"),
    ],
    ids=["float32", "zero_eps", "grad_shape"],
)
def test_gradient_check_bad_input_raises(x, f, eps, message):
    f = f or (lambda z: (float(z.sum()), np.ones_like(z)))
    with pytest.raises(ValueError, match=message):
        gradient_check(f, x, eps=eps)


# ------------------------------------------------------------------------------------ bad input
def test_cache_from_another_layer_raises(rng):
    layer, other = random_layer(rng), random_layer(rng)
    out, cache = other.forward(rng.normal(size=(T, D_MODEL)), return_cache=True)
    with pytest.raises(ValueError,
                       match=r"^MultiHeadAttention\.backward: the saved activations come from "
                             r"another layer"):
        layer.backward(np.ones_like(out), cache)


def test_something_that_is_not_a_cache_raises(rng):
    layer = random_layer(rng)
    out, weights = layer.forward(rng.normal(size=(T, D_MODEL)))
    with pytest.raises(ValueError, match=r"^MultiHeadAttention\.backward: saved is a ndarray; "
                       r"expected the saved activations that forward\(\.\.\., return_cache=True\) "
                       r"returned"):
        layer.backward(np.ones_like(out), weights)


@pytest.mark.parametrize(
    ("shape", "got"),
    [((B, T, D_MODEL - 1), r"\(2, 3, 6\)"), ((T, D_MODEL), r"\(3, 7\)"),
     ((B, S, D_MODEL), r"\(2, 5, 7\)"), ((1, B, T, D_MODEL), r"\(1, 2, 3, 7\)")],
    ids=["d_model", "batch_missing", "T", "batch_extra"],
)
def test_grad_out_of_the_wrong_shape_raises(rng, shape, got):
    layer = random_layer(rng)
    _, cache = layer.forward(rng.normal(size=(B, T, D_MODEL)), return_cache=True)
    message = (rf"^MultiHeadAttention\.backward: grad_out has shape {got}; "
               r"expected \(\.\.\., T, d_model\) = \(2, 3, 7\)")
    with pytest.raises(ValueError, match=message):
        layer.backward(np.ones(shape), cache)


def test_integer_grad_out_raises(rng):
    layer = random_layer(rng)
    _, cache = layer.forward(rng.normal(size=(T, D_MODEL)), return_cache=True)
    with pytest.raises(ValueError, match=r"^MultiHeadAttention\.backward: grad_out has dtype int"):
        layer.backward(np.ones((T, D_MODEL), dtype=int), cache)


# ------------------------------------------------------------- attention_backward, on its own
def test_attention_backward_matches_central_differences_with_a_broadcast_k(rng):
    """dq, dk, dv of a batched call whose k and v are shared by the batch (summed back)."""
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    g = rng.normal(size=(2, 3, 2))  # loss = sum(out * g): dLoss/dout = g

    def loss_and_grad(which):
        def f(x):
            args = {"q": q, "k": k, "v": v, which: x}
            out, weights = scaled_dot_product_attention(args["q"], args["k"], args["v"])
            grads = dict(zip("qkv", attention_backward(g, args["q"], args["k"], args["v"],
                                                       weights), strict=True))
            return float((out * g).sum()), grads[which]
        return f

    for which, x in (("q", q), ("k", k), ("v", v)):
        assert gradient_check(loss_and_grad(which), x, eps=EPS) < REL, which


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((3, 2), (3, 4), (5, 6), (5, 2), (3, 5)),
         r"k has shape \(5, 6\); expected \(S, d_k\) with d_k=4 \(from q\)"),
        (((3, 2), (3, 4), (5, 4), (5, 2), (3, 4)),
         r"weights has shape \(3, 4\); expected \(T, S\) with T=3 \(from q\), S=5 \(from k\)"),
        (((3, 3), (3, 4), (5, 4), (5, 2), (3, 5)),
         r"grad_out has shape \(3, 3\); expected \(T, d_v\) with T=3 \(from q\), d_v=2 "
         r"\(from v\)"),
        (((3, 2), (3, 4), (5, 4), (6, 2), (3, 5)),
         r"v has shape \(6, 2\); expected \(S, d_v\) with S=5 \(from k\)"),
    ],
    ids=["d_k", "weights", "grad_out", "S"],
)
def test_attention_backward_names_the_argument_of_the_wrong_shape(rng, shapes, message):
    with pytest.raises(ValueError, match=r"^attention_backward: " + message):
        attention_backward(*(rng.normal(size=s) for s in shapes))


def test_a_cache_needs_a_layer():
    with pytest.raises(ValueError, match=r"^KVCache: layer has type int; expected the "
                                         r"MultiHeadAttention"):
        KVCache(0, max_len=4)
    with pytest.raises(ValueError, match=r"^LatentCache: layer has type str; expected the "
                                         r"MultiHeadLatentAttention"):
        LatentCache("layer")
