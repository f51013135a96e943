"""Parity with PyTorch: ``torch.nn.MultiheadAttention`` and
``torch.nn.functional.scaled_dot_product_attention``, weights copied across, float64.

Conventions that differ between the two libraries, translated here:

- torch's ``in_proj_weight`` (3·d_model, d_model) multiplies from the right (``x @ W.T``), so
  its rows are ``[W_q.T; W_k.T; W_v.T]``; ``out_proj.weight`` is ``W_o.T``.
- Our masks say True = *may attend*. ``nn.MultiheadAttention``'s bool ``attn_mask`` and
  ``key_padding_mask`` say True = *not allowed* / *ignore*, so they get ``~mask``;
  ``F.scaled_dot_product_attention``'s bool ``attn_mask`` says True = allowed, like ours.
- For a query with no allowed key we give 0. torch 2.13's ``F.scaled_dot_product_attention``
  gives 0 too, ``nn.MultiheadAttention`` gives NaN when it returns the weights (its default)
  and in inference (``eval()`` under ``no_grad``: its fused fast path) even without them; the
  parity tests keep every row non-empty, and ``test_a_fully_masked_row_in_torch`` pins what
  lessons 02 and 13 say about it.
"""

from __future__ import annotations

import functools

import conftest
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mha_course import (
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)

pytestmark = pytest.mark.torch

TOL = 1e-12  # float64 max abs difference
# Every dimension different: B=2, T=3, h=4, S=5, d_k=6, d_model=24.
B, T, H, S, D_MODEL = 2, 3, 4, 5, 24
# the shared helper (tests/conftest.py) with this module's sizes
random_layer = functools.partial(conftest.random_layer, d_model=D_MODEL, h=H)


def max_abs_diff(ours, theirs):
    return float(np.max(np.abs(ours - theirs.detach().numpy())))




def torch_copy(torch, layer):
    """A float64 ``nn.MultiheadAttention`` holding the same parameters as ``layer``."""
    module = torch.nn.MultiheadAttention(
        layer.d_model, layer.h, bias=layer.bias, batch_first=True, dtype=torch.float64
    )
    module.eval()
    with torch.no_grad():
        module.in_proj_weight.copy_(
            torch.from_numpy(np.concatenate([layer.W_q.T, layer.W_k.T, layer.W_v.T]))
        )
        module.out_proj.weight.copy_(torch.from_numpy(layer.W_o.T))
        if layer.bias:
            module.in_proj_bias.copy_(
                torch.from_numpy(np.concatenate([layer.b_q, layer.b_k, layer.b_v]))
            )
            module.out_proj.bias.copy_(torch.from_numpy(layer.b_o))
    return module


MASKINGS = [
    "none",
    "causal",
    "padding_key_padding_mask",
    "padding_attn_mask",
    "causal_and_padding",
    "per_batch_random",
]


def masks_for(masking, batched, T_, S_, rng):
    """(our mask, torch kwargs) for one way of masking."""
    # Key lengths per batch element; never 0, so no row is fully masked.
    lengths = [1, S_ - 1] if batched else [S_ - 1]
    ours_pad = padding_mask(lengths, S_)  # (B, 1, S)
    if not batched:
        ours_pad = ours_pad[0]  # (1, S)
    kpm = ~ours_pad[..., 0, :]  # (B, S) or (S,), True = ignore

    def expanded(mask):
        # torch's 3-D attn_mask is (B·h, T, S), batch-major: row b·h + i is batch b, head i.
        full = np.broadcast_to(mask, (B, T_, S_))
        return np.repeat(full, H, axis=0)

    if masking == "none":
        return None, {}
    if masking == "causal":
        m = causal_mask(T_, S_)
        return m, {"attn_mask": torch_bool(~m)}
    if masking == "padding_key_padding_mask":
        return ours_pad, {"key_padding_mask": torch_bool(kpm)}
    if masking == "padding_attn_mask":
        theirs = ~(expanded(ours_pad) if batched else np.broadcast_to(ours_pad, (T_, S_)))
        return ours_pad, {"attn_mask": torch_bool(theirs)}
    if masking == "causal_and_padding":
        m = causal_mask(T_, S_) & ours_pad
        return m, {"attn_mask": torch_bool(~causal_mask(T_, S_)), "key_padding_mask":
                   torch_bool(kpm)}
    if masking == "per_batch_random":
        shape = (B, T_, S_) if batched else (T_, S_)
        m = rng.random(shape) > 0.5
        m[..., 0] = True  # every query keeps at least one key
        return m, {"attn_mask": torch_bool(~(expanded(m) if batched else m))}
    raise AssertionError(masking)


def torch_bool(a):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("attention", ["self", "cross"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_multihead_attention_matches_torch(torch, rng, bias, attention, masking, batched):
    layer = random_layer(rng, bias)
    module = torch_copy(torch, layer)
    lead = (B,) if batched else ()
    x = rng.normal(size=(*lead, T, D_MODEL))
    context = x if attention == "self" else rng.normal(size=(*lead, S, D_MODEL))
    S_ = context.shape[-2]
    mask, torch_masks = masks_for(masking, batched, T, S_, rng)

    out, weights = layer(x, context=None if attention == "self" else context, mask=mask)
    xt, ct = torch.from_numpy(x), torch.from_numpy(context)
    with torch.no_grad():
        out_t, weights_t = module(
            xt, ct, ct, need_weights=True, average_attn_weights=False, **torch_masks
        )
    assert out.shape == tuple(out_t.shape) == (*lead, T, D_MODEL)
    assert weights.shape == tuple(weights_t.shape) == (*lead, H, T, S_)
    assert max_abs_diff(out, out_t) <= TOL
    assert max_abs_diff(weights, weights_t) <= TOL


def test_float32_multihead_attention_matches_torch(torch, rng):
    layer = random_layer(rng, bias=True)
    module = torch_copy(torch, layer).to(torch.float32)
    x = rng.normal(size=(B, T, D_MODEL)).astype(np.float32)
    out, weights = layer(x, mask=causal_mask(T))
    with torch.no_grad():
        xt = torch.from_numpy(x)
        out_t, weights_t = module(xt, xt, xt, attn_mask=torch_bool(~causal_mask(T)),
                                  average_attn_weights=False)
    assert out.dtype == np.float32
    assert max_abs_diff(out, out_t) <= 1e-5 and max_abs_diff(weights, weights_t) <= 1e-5


def test_layer_built_from_torch_parameters_matches_torch(torch):
    # The other direction: torch's own (Xavier) initialisation copied into our layer.
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(D_MODEL, H, batch_first=True, dtype=torch.float64)
    module.eval()
    W = module.in_proj_weight.detach().numpy()  # (3·d_model, d_model)
    layer = MultiHeadAttention(D_MODEL, H)
    layer.W_q, layer.W_k, layer.W_v = (w.T.copy() for w in np.split(W, 3))
    layer.W_o = module.out_proj.weight.detach().numpy().T.copy()
    x = np.random.default_rng(1).normal(size=(B, T, D_MODEL))
    xt = torch.from_numpy(x)
    with torch.no_grad():
        out_t, weights_t = module(xt, xt, xt, average_attn_weights=False)
    out, weights = layer(x)
    assert max_abs_diff(out, out_t) <= TOL and max_abs_diff(weights, weights_t) <= TOL


def test_torch_initialisation_is_what_the_course_says(torch):
    # Review W5: nn.MultiheadAttention draws Xavier uniform over the stacked (3·d, d)
    # in_proj_weight (variance 1/(2·d) per entry, the same for q, k and v) and leaves out_proj at
    # nn.Linear's Kaiming uniform with a = √5 (variance 1/(3·d)); per-matrix Xavier only on the
    # separate-projection path (kdim, vdim != embed_dim). Lesson 03 §2, lesson 04 §10, the
    # drill's 13.7 and MultiHeadAttention's docstring say so; the package draws per-matrix Xavier.
    torch.manual_seed(0)
    d = 512
    module = torch.nn.MultiheadAttention(d, 8)
    in_proj = module.in_proj_weight.detach().numpy()
    assert in_proj.shape == (3 * d, d)
    assert np.abs(in_proj).max() <= np.sqrt(6 / (4 * d))  # Xavier's bound for fan 4·d
    for part in np.split(in_proj, 3):
        assert np.isclose(part.var() * 2 * d, 1.0, rtol=0.02)
    assert np.isclose(module.out_proj.weight.detach().numpy().var() * 3 * d, 1.0, rtol=0.02)
    separate = torch.nn.MultiheadAttention(d, 8, kdim=256, vdim=128)
    assert separate.in_proj_weight is None
    for weight, fan_in in ((separate.q_proj_weight, d), (separate.k_proj_weight, 256),
                           (separate.v_proj_weight, 128)):
        assert np.isclose(weight.detach().numpy().var() * (d + fan_in) / 2, 1.0, rtol=0.03)
    ours = MultiHeadAttention(d, 8, rng=0)  # per-matrix Xavier: variance 2 / (d + d) = 1 / d
    assert np.isclose(ours.W_q.var() * d, 1.0, rtol=0.02)
    assert np.isclose(ours.W_o.var() * d, 1.0, rtol=0.02)


def test_a_fully_masked_row_in_torch(torch, rng):
    # Review D38: a query with no allowed key. Ours gives 0 (lesson 02 §7); torch 2.13's SDPA
    # gives 0 as well, nn.MultiheadAttention gives NaN when it also returns the weights (its
    # default) and in inference (eval() under no_grad: its fused fast path, with biases and an
    # even h) even with need_weights=False; off the fast path need_weights=False calls SDPA: 0
    # (plus the output projection's bias).
    # Lessons 02 and 13 (Q4) say so.
    q, k, v = sdpa_inputs(rng, (B, H), T, S)
    mask = np.ones((T, S), dtype=bool)
    mask[1] = False  # query 1 may attend to nothing
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert np.all(out[..., 1, :] == 0) and np.all(weights[..., 1, :] == 0)
    out_t = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch_bool(mask))
    assert torch.all(out_t[..., 1, :] == 0) and max_abs_diff(out, out_t) <= TOL
    layer = random_layer(rng, bias=False)
    module = torch_copy(torch, layer)
    x = torch.from_numpy(rng.normal(size=(B, T, D_MODEL)))
    with torch.no_grad():
        out_m, weights_m = module(x, x, x, attn_mask=torch_bool(~mask[:, :T]))
        out_fast, _ = module(x, x, x, attn_mask=torch_bool(~mask[:, :T]), need_weights=False)
    assert torch.isnan(out_m[:, 1]).all() and torch.isnan(weights_m[:, 1]).all()
    assert not torch.isnan(out_m[:, [0, 2]]).any()
    assert torch.all(out_fast[:, 1] == 0)
    assert max_abs_diff(layer(x.numpy(), mask=mask[:, :T])[0], out_fast) <= TOL
    # inference: eval() under no_grad takes the fused fast path (it needs the biases and an even
    # number of heads, as nn.MultiheadAttention's defaults have), which gives NaN again
    fast = torch_copy(torch, random_layer(rng, bias=True))  # in eval mode
    with torch.no_grad():
        out_eval, _ = fast(x, x, x, attn_mask=torch_bool(~mask[:, :T]), need_weights=False)
    assert torch.isnan(out_eval[:, 1]).all() and not torch.isnan(out_eval[:, [0, 2]]).any()
    fast.train()  # off the fast path, the same call goes through SDPA: 0
    with torch.no_grad():
        assert torch.all(fast(x, x, x, attn_mask=torch_bool(~mask[:, :T]),
                              need_weights=False)[0][:, 1] == fast.out_proj.bias)


# ------------------------------------------------------------------ F.scaled_dot_product_attention
def sdpa_inputs(rng, lead, T_, S_, d_k=6, d_v=7):
    return (rng.normal(size=(*lead, T_, d_k)), rng.normal(size=(*lead, S_, d_k)),
            rng.normal(size=(*lead, S_, d_v)))


@pytest.mark.parametrize("lead", [(), (B,), (B, H)], ids=["2d", "3d", "4d"])
def test_sdpa_without_mask_matches_torch(torch, rng, lead):
    q, k, v = sdpa_inputs(rng, lead, T, S)
    out, _ = scaled_dot_product_attention(q, k, v)
    out_t = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v))
    )
    assert out.shape == tuple(out_t.shape) == (*lead, T, 7)
    assert max_abs_diff(out, out_t) <= TOL


@pytest.mark.parametrize("scale", [144 ** -0.5, 0.05, 2.0])
def test_sdpa_with_a_scale_matches_torch_scale(torch, rng, scale):
    # torch's scale= (default None: 1/sqrt(E)), as Gemma 2's query_pre_attn_scalar**-0.5 uses it
    q, k, v = sdpa_inputs(rng, (B, H), T, S)
    mask = causal_mask(T, S)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    out_t = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch_bool(mask), scale=scale)
    assert max_abs_diff(out, out_t) <= TOL
    layer = random_layer(rng, scale=scale)
    x = rng.normal(size=(B, T, layer.d_model))

    def heads(y):  # (B, T, h·d) -> (B, h, T, d), in torch
        return torch.from_numpy(y).unflatten(-1, (layer.h, -1)).transpose(-3, -2)

    o = torch.nn.functional.scaled_dot_product_attention(
        heads(x @ layer.W_q), heads(x @ layer.W_k), heads(x @ layer.W_v), scale=scale)
    want = o.transpose(-3, -2).flatten(-2).numpy() @ layer.W_o
    assert max_abs_diff(layer(x)[0], torch.from_numpy(want)) <= TOL


@pytest.mark.parametrize("mask_shape", [(T, S), (B, H, T, S), (B, 1, 1, S)])
def test_sdpa_with_boolean_mask_matches_torch(torch, rng, mask_shape):
    q, k, v = sdpa_inputs(rng, (B, H), T, S)
    mask = rng.random(mask_shape) > 0.4
    mask[..., 0] = True  # no fully masked row (see test_a_fully_masked_row_in_torch)
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    out_t = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch_bool(mask)  # True = allowed
    )
    assert max_abs_diff(out, out_t) <= TOL


@pytest.mark.parametrize("lead", [(), (B, H)], ids=["2d", "4d"])
def test_sdpa_causal_matches_torch_is_causal(torch, rng, lead):
    # For T == S our causal_mask and torch's is_causal agree (they differ in alignment if not).
    q, k, v = sdpa_inputs(rng, lead, S, S)
    out, weights = scaled_dot_product_attention(q, k, v, mask=causal_mask(S))
    out_t = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), is_causal=True
    )
    assert max_abs_diff(out, out_t) <= TOL
    assert np.all(np.triu(weights, 1) == 0)


def test_causal_mask_is_torchs_causal_lower_right_not_is_causal(torch, rng):
    # Lesson 06 §2 and the drill's Q22: for T < S the package aligns bottom-right, as
    # torch.nn.attention.bias.causal_lower_right does; is_causal=True aligns top-left, where a
    # single new query sees key 0 only (review D2).
    from torch.nn.attention.bias import causal_lower_right

    for T_ in (1, 3):
        q, k, v = sdpa_inputs(rng, (B, H), T_, S)
        qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
        ours = scaled_dot_product_attention(q, k, v, mask=causal_mask(T_, S))[0]
        lower_right = torch.nn.functional.scaled_dot_product_attention(
            qt, kt, vt, attn_mask=causal_lower_right(T_, S))
        assert max_abs_diff(ours, lower_right) <= TOL
        top_left = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        assert max_abs_diff(ours, top_left) > 1e-3
    assert max_abs_diff(v[..., :1, :], top_left[..., :1, :]) <= TOL  # T = 3: query 0 sees key 0


@given(
    lead=hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
    T_=st.integers(1, 5), S_=st.integers(1, 5), d_k=st.integers(1, 5), d_v=st.integers(1, 5),
    use_mask=st.booleans(), seed=st.integers(0, 2**32 - 1),
)
def test_sdpa_matches_torch_for_random_sizes(torch, lead, T_, S_, d_k, d_v, use_mask, seed):
    rng = np.random.default_rng(seed)
    q, k, v = sdpa_inputs(rng, lead, T_, S_, d_k, d_v)
    mask = None
    kwargs = {}
    if use_mask:
        mask = rng.random((*lead, T_, S_)) > 0.5
        mask[..., rng.integers(S_)] = True
        kwargs["attn_mask"] = torch_bool(mask)
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    out_t = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), **kwargs
    )
    assert max_abs_diff(out, out_t) <= TOL
