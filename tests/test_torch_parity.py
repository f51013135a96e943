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
  lessons 02 and 15 say about it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import conftest
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mha_course import (
    MultiHeadAttention,
    MultiHeadLatentAttention,
    apply_rope,
    causal_mask,
    layer_norm,
    padding_mask,
    param_count,
    scaled_dot_product_attention,
    sliding_window_mask,
    softmax,
    tiled_attention,
)
from mha_course.variants.entropy import attention_entropy
from mha_course.variants.gated_attention import differential_attention
from mha_course.variants.logit_control import qk_norm, soft_cap, soft_cap_backward
from mha_course.variants.sinks import sink_attention, softmax_with_sink_backward
from mha_course.variants.sparse_attention import topk_mask

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
    # drill's 15.7 and MultiHeadAttention's docstring say so; the package draws per-matrix Xavier.
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
    # Lessons 02 and 15 (Q4) say so.
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
    # Lesson 06 §2 and rapid question Q33 (deep dive 14a): for T < S the package aligns
    # bottom-right, as torch.nn.attention.bias.causal_lower_right does; is_causal=True aligns
    # top-left, where a single new query sees key 0 only (review D2).
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


# ============================================================ the gold table: one function each
# Each row: our function and torch's on the same seeded inputs. ``inputs(rng)`` returns the
# arguments; NumPy arrays reach torch as tensors (float64 stays float64, bool masks stay bool:
# torch's bool attn_mask says True = may attend, like ours), anything else as it is. Both sides
# may return a tuple (an output and a gradient, say); each part is compared, to rtol and atol.
# Model-level parity stays with its model's tests, where a table row would be a page of
# set-up: the layer backward (test_backward.py), a whole GPT's gradients (test_gpt.py,
# test_gpt_variants.py, test_tiny_model.py), an encoder layer and the RMSNorm/SwiGLU
# sub-layer's gradients (test_block.py), dropout's scaling (test_block.py: its kept entries
# differ by generator, so it compares statistics), NSA's branches (test_sparse_attention.py:
# each branch against SDPA on the mask NSA itself chose), and torch.distributed
# (test_distributed.py).
@dataclass(frozen=True)
class Case:
    name: str
    ours: Callable
    theirs: Callable  # (torch, *inputs) -> a tensor, a number, or a tuple of them
    inputs: Callable  # (rng) -> a tuple of inputs
    rtol: float = 1e-12
    atol: float = 1e-12


def _sdpa(torch, q, k, v, mask=None, **kw):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def _heads(y, n):  # (..., T, n·d) -> (..., n, T, d), in torch
    return y.unflatten(-1, (n, -1)).transpose(-3, -2)


def _merged(o):  # (..., n, T, d) -> (..., T, n·d)
    return o.transpose(-3, -2).flatten(-2)


def _layer_params(torch, layer):
    return {name: torch.from_numpy(p) for name, p in layer.parameters().items()}


# ---- norms, caps, entropy, top-k, parameter counts (lessons 04, 09 and 13)
def _soft_cap_grad(torch, g, x):
    xt = x.clone().requires_grad_()
    (50.0 * torch.tanh(xt / 50.0) * g).sum().backward()
    return xt.grad


def _topk_keep(torch, s):
    idx = torch.topk(s, 4, dim=-1).indices
    return torch.zeros_like(s, dtype=torch.bool).scatter(-1, idx, True)


def _torch_param_count(torch, d_model, h, bias):
    module = torch.nn.MultiheadAttention(d_model, h, bias=bias, batch_first=True)
    return sum(p.numel() for p in module.parameters())


BASICS = [
    Case("layer_norm = F.layer_norm", lambda x, g, b: layer_norm(x, g, b),
         lambda torch, x, g, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, 1e-5),
         lambda rng: (rng.normal(size=(B, T, D_MODEL)) * 4 + 1, rng.normal(size=D_MODEL),
                      rng.normal(size=D_MODEL)), rtol=0),
    Case("soft_cap = cap·tanh(x / cap)", lambda x: soft_cap(x, 50.0),
         lambda torch, x: 50.0 * torch.tanh(x / 50.0),
         lambda rng: (rng.normal(scale=30.0, size=(2, 3, 4, 8)),)),
    Case("soft_cap_backward = autograd", lambda g, x: soft_cap_backward(g, x, 50.0),
         _soft_cap_grad,
         lambda rng: (rng.normal(size=(2, 3, 4, 8)), rng.normal(scale=30.0, size=(2, 3, 4, 8))),
         rtol=1e-10),
    Case("qk_norm = F.rms_norm", lambda x, w: qk_norm(x, w, 1e-6),
         lambda torch, x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=1e-6),
         lambda rng: (rng.normal(scale=30.0, size=(2, 3, 4, 8)), rng.normal(size=8)),
         rtol=1e-10),
    Case("attention_entropy = Categorical.entropy", attention_entropy,
         lambda torch, w: torch.distributions.Categorical(probs=w).entropy(),
         lambda rng: (softmax(rng.normal(scale=3.0, size=(4, 7))),), atol=0),
    Case("topk_mask = torch.topk's indices", lambda s: topk_mask(s, 4), _topk_keep,
         lambda rng: (rng.normal(size=(3, 5, 11)),)),  # distinct scores: no ties
    *(Case(f"param_count = nn.MultiheadAttention's (d_model={d}, h={h}, bias={bias})",
           lambda d, h, bias: param_count(d, h, bias=bias), _torch_param_count,
           lambda rng, d=d, h=h, bias=bias: (d, h, bias), rtol=0, atol=0)
      for d, h in [(8, 1), (8, 2), (12, 3), (16, 8), (512, 8)] for bias in (False, True)),
]


# ---- SDPA with the bottom-right masks of a chunk over a longer cache (lesson 06)
def _chunk_inputs(mask):
    def inputs(rng):
        T_, S_ = mask.shape
        return (rng.normal(size=(2, H, T_, 6)), rng.normal(size=(2, H, S_, 6)),
                rng.normal(size=(2, H, S_, 7)), mask)

    return inputs


CHUNKS = [
    Case(f"sdpa, a chunk of 3 over 7 keys, {name} mask",
         lambda q, k, v, m: scaled_dot_product_attention(q, k, v, mask=m)[0], _sdpa,
         _chunk_inputs(mask))
    for name, mask in [("causal", causal_mask(3, 7)), ("window-4", sliding_window_mask(3, 4, 7))]
]


# ---- FlashAttention's loop (lesson 07) against F.scaled_dot_product_attention
TB, TH, TT, TS, TD_K, TD_V = 2, 3, 11, 13, 4, 6  # test_tiled.py's sizes: every one different
TILE_BLOCKS = [1, 3, 7, TS, TS + 4]  # 1, two that do not divide S, S itself, more than S
TILE_TOL = {np.float64: 1e-12, np.float32: 1e-5}


def _tile_mask(kind, rng, T_, S_):
    """Masks of several shapes, each broadcastable to (B, h, T, S); no row fully masked."""
    if kind == "random":  # one per batch element and head
        m = rng.random((TB, TH, T_, S_)) > 0.5
        m[..., rng.integers(S_)] = True
        return m
    if kind == "padding":  # (B, 1, 1, S): lengths per batch element
        return padding_mask([S_ - 4, S_ - 9], S_)[:, None]
    if kind == "key_vector":  # (S,): one row of keys for every query
        return np.arange(S_) % 3 != 1
    return None


def _tile_inputs(T_, S_, kind, dtype):
    def inputs(rng):
        q, k, v = (rng.normal(size=(TB, TH, n, d)).astype(dtype)
                   for n, d in ((T_, TD_K), (S_, TD_K), (S_, TD_V)))
        return q, k, v, _tile_mask(kind, rng, T_, S_)

    return inputs


def _sdpa_2d_mask(torch, q, k, v, mask):  # torch's attn_mask needs at least (T, S)
    if mask is not None:
        mask = mask.broadcast_to(torch.broadcast_shapes(mask.shape, (q.shape[-2], k.shape[-2])))
    return _sdpa(torch, q, k, v, mask)


def _huge_scores(dtype):
    def inputs(rng):
        q = np.full((2, TT, TD_K), 60.0)
        k = np.linspace(0.0, 100.0, TS)[:, None] * np.ones(TD_K) + rng.normal(size=(2, TS, TD_K))
        return q.astype(dtype), k.astype(dtype), rng.normal(size=(2, TS, TD_V)).astype(dtype)

    return inputs


def _causal_top_or_bottom(torch, q, k, v):
    T_, S_ = q.shape[-2], k.shape[-2]
    if T_ == S_:
        return _sdpa(torch, q, k, v, is_causal=True)
    # torch's is_causal aligns the triangle top-left, ours bottom-right: an explicit mask
    return _sdpa(torch, q, k, v, torch.from_numpy(causal_mask(T_, S_)))


_DTYPES = [(np.float64, "float64"), (np.float32, "float32")]
TILED = [
    *(Case(f"tiled_attention = sdpa ({name}, T={T_}, S={S_}, block {bs}, mask {kind})",
           lambda q, k, v, m, bs=bs: tiled_attention(q, k, v, mask=m, block_size=bs),
           _sdpa_2d_mask, _tile_inputs(T_, S_, kind, dtype),
           rtol=0, atol=TILE_TOL[dtype])
      for dtype, name in _DTYPES for T_, S_ in [(TT, TS), (TS, TT)] for bs in TILE_BLOCKS
      for kind in ["none", "random", "padding", "key_vector"]),
    *(Case(f"tiled_attention causal = sdpa ({name}, T={T_}, S={S_}, block {bs})",
           lambda q, k, v, _, bs=bs: tiled_attention(q, k, v, causal=True, block_size=bs),
           lambda torch, q, k, v, _: _causal_top_or_bottom(torch, q, k, v),
           _tile_inputs(T_, S_, "none", dtype), rtol=0, atol=TILE_TOL[dtype])
      for dtype, name in _DTYPES for T_, S_ in [(TS, TS), (TT, TS)] for bs in TILE_BLOCKS),
    *(Case(f"tiled_attention = sdpa on huge scores ({name})",
           lambda q, k, v: tiled_attention(q, k, v, block_size=3), _sdpa, _huge_scores(dtype),
           rtol=0, atol=TILE_TOL[dtype]) for dtype, name in _DTYPES),
    Case("tiled_attention's log-sum-exp = torch.logsumexp",
         lambda q, k, v, _: tiled_attention(q, k, v, block_size=5, return_lse=True)[1],
         lambda torch, q, k, v, _: torch.logsumexp(q @ k.transpose(-1, -2) / np.sqrt(TD_K), -1),
         _tile_inputs(TT, TS, "none", np.float64), rtol=0),
]


# ---- the layer with grouped K/V heads and a sliding window (lesson 06) = SDPA's enable_gqa
GB, GT, GS, GH, GD_MODEL = 2, 3, 5, 4, 10  # test_gqa.py's sizes


def _gqa_inputs(g, x_shape, c_shape, mask_kind):
    def inputs(rng):
        layer = conftest.random_layer(rng, True, g, d_model=GD_MODEL, h=GH, d_k=6, d_v=7)
        x = rng.normal(size=x_shape)
        context = None if c_shape is None else rng.normal(size=c_shape)
        s = x_shape[-2] if c_shape is None else c_shape[-2]
        mask = {None: None, "causal": causal_mask(x_shape[-2], s),
                "padding": padding_mask([s, 2], s)}[mask_kind]  # (B, 1, S)
        return layer, x, context, mask

    return inputs


def _gqa_theirs(torch, layer, x, context, mask):
    P, c = _layer_params(torch, layer), x if context is None else context
    q = _heads(x @ P["W_q"] + P["b_q"], layer.h)
    k, v = (_heads(c @ P[f"W_{n}"] + P[f"b_{n}"], layer.n_kv_heads) for n in "kv")
    mask = None if mask is None else mask[..., None, :, :]  # one mask for every head
    return _merged(_sdpa(torch, q, k, v, mask, enable_gqa=True)) @ P["W_o"] + P["b_o"]


GQA_CASES = {
    "unbatched self": ((GT, GD_MODEL), None, None),
    "unbatched self causal": ((GT, GD_MODEL), None, "causal"),
    "batched self causal": ((GB, GT, GD_MODEL), None, "causal"),
    "batched cross": ((GB, GT, GD_MODEL), (GB, GS, GD_MODEL), None),
    "batched cross padding": ((GB, GT, GD_MODEL), (GB, GS, GD_MODEL), "padding"),
    "unbatched cross causal": ((GT, GD_MODEL), (GS, GD_MODEL), "causal"),
}


def _window_inputs(g, window):
    def inputs(rng):
        layer = conftest.random_layer(rng, True, g, d_model=14, h=6, d_k=4, d_v=5)
        return layer, rng.normal(size=(2, 8, 14)), sliding_window_mask(8, window)

    return inputs


def _window_theirs(torch, layer, x, mask):
    P, h, g = _layer_params(torch, layer), layer.h, layer.n_kv_heads
    q = _heads(x @ P["W_q"] + P["b_q"], h)
    k, v = (_heads(x @ P[f"W_{n}"] + P[f"b_{n}"], g) for n in "kv")
    out = _merged(_sdpa(torch, q, k, v, mask, enable_gqa=True)) @ P["W_o"] + P["b_o"]
    # the weights from torch's own matmul and softmax; query head i reads K/V head i // (h/g)
    scores = q @ k.repeat_interleave(h // g, dim=-3).transpose(-1, -2) / np.sqrt(layer.d_k)
    return out, torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


LAYERS = [
    *(Case(f"GQA layer, g={g}, {case} = sdpa(enable_gqa=True)",
           lambda layer, x, c, m: layer(x, context=c, mask=m)[0], _gqa_theirs,
           _gqa_inputs(g, *GQA_CASES[case]))
      for g in (1, 2, 4) for case in GQA_CASES),
    *(Case(f"sliding-window GQA layer, g={g}, window {w} = sdpa(enable_gqa=True)",
           lambda layer, x, m: layer(x, mask=m), _window_theirs, _window_inputs(g, w))
      for g in (6, 3, 2, 1) for w in (1, 3, 8)),
]


# ---- lesson 13's variants: differential attention, sinks, MLA
def _differential_inputs(rng):
    h, T_, S_, d, d_v = 3, 4, 6, 5, 7
    q1, q2 = rng.normal(size=(2, h, T_, d))
    k1, k2 = rng.normal(size=(2, h, S_, d))
    return q1, k1, q2, k2, rng.normal(size=(h, S_, d_v)), rng.uniform(0.1, 0.9, size=h), (
        causal_mask(T_, S_))


def _differential_theirs(torch, q1, k1, q2, k2, v, lam, mask):
    raw = _sdpa(torch, q1, k1, v, mask) - lam[:, None, None] * _sdpa(torch, q2, k2, v, mask)
    return 0.7 * torch.nn.functional.rms_norm(raw, (v.shape[-1],), eps=1e-5)  # 1 - λ_init


def _sink_inputs(rng):
    q, k, v = (rng.normal(size=(2, 3, 5, 4)) for _ in range(3))
    return q, k, v, rng.normal(size=3), causal_mask(5), rng.normal(size=(2, 3, 5, 4))


def _sink_ours(q, k, v, sink, mask, g):  # the output, and the sink logits' gradient
    out, w, p = sink_attention(q, k, v, sink, mask)
    return out, softmax_with_sink_backward(g @ np.swapaxes(v, -1, -2), w, p)[1]


def _sink_theirs(torch, q, k, v, sink, mask, g):
    sink = sink.clone().requires_grad_()
    scores = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~mask, float("-inf"))
    column = sink.reshape(1, 3, 1, 1).expand(2, 3, 5, 1)
    out = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1] @ v
    (out * g).sum().backward()
    return out, sink.grad


def _mla_inputs(rng):
    mla = MultiHeadLatentAttention(d_model=18, h=3, d_c=7, d_rope=4, d_k=5, d_v=6, rng=0)
    for name, W in mla.parameters().items():  # every entry nonzero
        setattr(mla, name, rng.normal(size=W.shape) / np.sqrt(W.shape[0]))
    return mla, rng.normal(size=(2, 9, 18)), sliding_window_mask(9, 4)


def _mla_theirs(torch, mla, x, mask):
    P, h, pos = _layer_params(torch, mla), mla.h, np.arange(x.shape[-2])

    def rope(a):  # the same rotation, computed by the package on NumPy, then back to torch
        return torch.from_numpy(apply_rope(a.numpy(), pos))

    # DeepSeek's kv_a_layernorm, as torch computes it
    c = torch.nn.functional.rms_norm(x @ P["W_dkv"], (mla.d_c,), P["kv_norm"], 1e-6)
    k_rope = rope(x @ P["W_kr"])[:, None].expand(-1, h, -1, -1)
    q = torch.cat([_heads(x @ P["W_q"], h), rope(_heads(x @ P["W_qr"], h))], -1)
    k = torch.cat([_heads(c @ P["W_uk"], h), k_rope], -1)
    return _merged(_sdpa(torch, q, k, _heads(c @ P["W_uv"], h), mask)) @ P["W_o"]


VARIANTS = [
    Case("differential attention = two SDPAs, subtracted, RMS-normed",
         lambda *a: differential_attention(*a, lam_init=0.3)[0], _differential_theirs,
         _differential_inputs, rtol=1e-10),
    Case("sink attention and its sink's gradient = a softmax over [scores, sink] + autograd",
         _sink_ours, _sink_theirs, _sink_inputs, rtol=1e-10),
    Case("MLA's naive form = sdpa on the up-projected heads, windowed mask",
         lambda mla, x, m: mla(x, mask=m)[0], _mla_theirs, _mla_inputs, rtol=0),
]

GOLD = [*BASICS, *CHUNKS, *TILED, *LAYERS, *VARIANTS]


def _to_torch(torch, a):
    return torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a


def _to_numpy(a):
    return a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)


def test_the_gold_table_names_each_case_once():
    names = [case.name for case in GOLD]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", GOLD, ids=[case.name for case in GOLD])
def test_matches_torch(torch, case):
    args = case.inputs(np.random.default_rng(20240611))
    ours = case.ours(*args)
    theirs = case.theirs(torch, *(_to_torch(torch, a) for a in args))
    ours, theirs = (x if isinstance(x, tuple) else (x,) for x in (ours, theirs))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        a, b = np.asarray(a), _to_numpy(b)
        assert a.shape == b.shape
        if a.dtype == bool or b.dtype == bool or np.issubdtype(a.dtype, np.integer):
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=case.rtol, atol=case.atol)
