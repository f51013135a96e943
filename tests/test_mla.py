"""Multi-head latent attention (``mha_course.variants.mla``) and ``mla_cache_bytes``.

The absorbed form must equal the naive one to float64 round-off, with and without masks; the
naive one must equal the definition written as a loop over heads in DeepSeek's order (Hugging
Face's ``DeepseekV3Attention.forward``: the key/value latent RMS-normalised over its ``d_c``
features before it is cached and up-projected, the RoPE key not; the query latent normalised when
queries are compressed; the softmax scale times YaRN's ``mscale²``), and PyTorch's
``F.rms_norm`` and ``F.scaled_dot_product_attention`` on the same weights (in
``tests/test_torch_parity.py``'s gold table); decoding with the
latent cache (absorbed or naive) must equal the causal forward; the cache holds the normalised
latent and the rotated RoPE key, ``d_c + d_rope`` values per token; and the cache bytes of
DeepSeek-V2 and V3 follow from their published configurations.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from mha_course import (
    LatentCache,
    MultiHeadLatentAttention,
    apply_rope,
    causal_mask,
    kv_cache_bytes,
    mla_cache_bytes,
    padding_mask,
    sliding_window_mask,
    softmax,
)
from mha_course.cost import MODELS, cache_bytes, values_per_layer_token

# Every dimension different: d_model=18, h=3, d_c=7, d_rope=4, d_k=5, d_v=6, T=9.
D_MODEL, H, D_C, D_ROPE, D_K, D_V, T = 18, 3, 7, 4, 5, 6, 9
TOL = 1e-12


def layer(rng=0, **sizes):
    """A layer with N(0, 1/fan_in) weights (every entry nonzero), the module's sizes unless
    overridden."""
    args = {"d_model": D_MODEL, "h": H, "d_c": D_C, "d_rope": D_ROPE, "d_k": D_K, "d_v": D_V,
            **sizes}
    mla = MultiHeadLatentAttention(**args, rng=rng)
    gen = np.random.default_rng(rng)
    for name, W in mla.parameters().items():
        setattr(mla, name, gen.normal(size=W.shape) / np.sqrt(W.shape[0]))
    return mla


def rms(a, gain, eps):
    """RMSNorm over the last axis, written out: a / sqrt(mean(a²) + eps) · gain."""
    return a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + eps) * gain


def by_definition(mla, x, mask=None, eps=1e-6, scale=None):
    """MLA from its definition, one head at a time, positions 0..T-1 (x: (T, d_model)), in the
    order of DeepseekV3Attention.forward: kv_a_layernorm on the d_c part only, before the
    up-projection; the RoPE key not normalised; q_a_layernorm on the query latent (d_cq set)."""
    n = x.shape[0]
    norm = mla.latent_norm
    c = x @ mla.W_dkv  # (T, d_c)
    if norm:
        c = rms(c, mla.kv_norm, eps)
    k_rope = apply_rope(x @ mla.W_kr)  # (T, d_rope), shared by all heads, not normalised
    if mla.d_cq is None:
        q_in, W_q = x, mla.W_q
    else:
        q_in, W_q = x @ mla.W_dq, mla.W_uq  # (T, d_cq): the query latent
        if norm:
            q_in = rms(q_in, mla.q_norm, eps)
    scale = 1 / np.sqrt(mla.d_k + mla.d_rope) if scale is None else scale
    outs, weights = [], []
    for i in range(mla.h):
        cols_k = slice(i * mla.d_k, (i + 1) * mla.d_k)
        cols_v = slice(i * mla.d_v, (i + 1) * mla.d_v)
        cols_r = slice(i * mla.d_rope, (i + 1) * mla.d_rope)
        q_i = np.concatenate([q_in @ W_q[:, cols_k], apply_rope(q_in @ mla.W_qr[:, cols_r])], -1)
        k_i = np.concatenate([c @ mla.W_uk[:, cols_k], k_rope], -1)
        v_i = c @ mla.W_uv[:, cols_v]
        scores = q_i @ k_i.T * scale
        w = softmax(scores, mask=None if mask is None else np.broadcast_to(mask, (n, n)))
        outs.append(w @ v_i)
        weights.append(w)
    return np.concatenate(outs, -1) @ mla.W_o, np.stack(weights)


MASKS = {
    "none": lambda rng, lead: None,
    "causal": lambda rng, lead: causal_mask(T),
    "window": lambda rng, lead: sliding_window_mask(T, 3),
    "padding": lambda rng, lead: padding_mask(rng.integers(1, T + 1, size=lead[-1]), T)
    if lead else padding_mask([5], T)[0],
    "random": lambda rng, lead: (rng.random((*lead, T, T)) < 0.5) | np.eye(T, dtype=bool),
}


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
@pytest.mark.parametrize("masking", list(MASKS))
def test_absorbed_equals_naive_to_round_off(lead, masking):
    rng = np.random.default_rng(11)
    mla = layer()
    x = rng.normal(size=(*lead, T, D_MODEL))
    mask = MASKS[masking](rng, lead)
    naive_out, naive_w = mla(x, mask=mask)
    abs_out, abs_w = mla(x, mask=mask, absorbed=True)
    assert naive_out.shape == abs_out.shape == (*lead, T, D_MODEL)
    assert naive_w.shape == abs_w.shape == (*lead, H, T, T)
    assert np.abs(abs_out - naive_out).max() <= TOL
    assert np.abs(abs_w - naive_w).max() <= TOL
    np.testing.assert_allclose(naive_w.sum(-1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("sizes", [{}, {"d_c": 2}, {"d_c": 40, "d_rope": 2},
                                   {"h": 6, "d_k": 3, "d_v": 2}, {"d_cq": 8},
                                   {"latent_norm": False}, {"d_cq": 11, "latent_norm": False}])
def test_naive_form_equals_the_definition_head_by_head(sizes):
    rng = np.random.default_rng(12)
    mla = layer(**sizes)
    x = rng.normal(size=(T, D_MODEL))
    for mask in (None, causal_mask(T)):
        want_out, want_w = by_definition(mla, x, mask)
        for absorbed in (False, True):
            out, w = mla(x, mask=mask, absorbed=absorbed)
            assert np.abs(out - want_out).max() <= TOL
            assert np.abs(w - want_w).max() <= TOL


def test_the_scale_is_one_over_sqrt_of_d_k_plus_d_rope():
    # If W_uk were folded in and the attention scaled by the width it sees, d_c + d_rope, the
    # weights would be flatter or sharper than the naive form's: the rescale is what keeps them.
    rng = np.random.default_rng(13)
    mla = layer(d_c=30)  # d_c + d_rope = 34, d_k + d_rope = 9
    x = rng.normal(size=(T, D_MODEL))
    _, w = mla(x, absorbed=True)
    _, w_def = by_definition(mla, x)
    assert np.abs(w - w_def).max() <= TOL


def test_the_latents_are_normalised_with_their_own_gains_and_eps():
    # DeepSeek's kv_a_layernorm and q_a_layernorm are RMSNorms with learned gains; eps is the
    # config's (1e-6 by default). A large eps makes the difference visible.
    rng = np.random.default_rng(19)
    x = rng.normal(size=(T, D_MODEL))
    for eps in (1e-6, 0.5):
        mla = layer(d_cq=8, eps=eps)
        assert mla.eps == eps and mla.kv_norm.shape == (D_C,) and mla.q_norm.shape == (8,)
        for absorbed in (False, True):
            out, w = mla(x, mask=causal_mask(T), absorbed=absorbed)
            want_out, want_w = by_definition(mla, x, causal_mask(T), eps=eps)
            assert np.abs(out - want_out).max() <= TOL and np.abs(w - want_w).max() <= TOL
    # The norms change the output: the same weights without them give another layer.
    bare = layer(d_cq=8, latent_norm=False)
    normed = layer(d_cq=8)
    assert np.abs(bare(x)[0] - normed(x)[0]).max() > 0.1


def test_only_the_latent_part_is_normalised_not_the_rope_key():
    # kv_a_proj_with_mqa makes [c ; k_rope] in one matmul; the norm covers the kv_lora_rank part
    # only. Normalising the whole 11-wide row instead is a different layer.
    rng = np.random.default_rng(20)
    mla = layer()
    x = rng.normal(size=(T, D_MODEL))
    whole = np.concatenate([x @ mla.W_dkv, x @ mla.W_kr], -1)  # (T, d_c + d_rope), unrotated
    wrong_c = rms(whole, 1.0, 1e-6)[:, :D_C] * mla.kv_norm
    assert np.abs(wrong_c - mla.latent(x)).max() > 1e-3
    np.testing.assert_allclose(mla.latent(x), rms(x @ mla.W_dkv, mla.kv_norm, 1e-6), rtol=0,
                               atol=1e-12)


def yarn_mscale(factor, mscale):
    """DeepSeek's yarn_get_mscale, written out: 0.1 · mscale · ln(factor) + 1 (1 at factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * np.log(factor) + 1.0


@pytest.mark.parametrize("rope_scaling", [
    {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
     "original_max_position_embeddings": 4096},  # DeepSeek-V3's
    {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707},  # DeepSeek-V2's
    {"rope_type": "yarn", "factor": 3.0, "mscale_all_dim": 0.5},
    {"type": "yarn", "factor": 7.0},  # no mscale_all_dim: no change (Hugging Face's `if`)
])
def test_yarn_mscale_reaches_the_softmax_scale(rope_scaling):
    rng = np.random.default_rng(21)
    mla = layer(rope_scaling=rope_scaling, d_cq=10)
    m = yarn_mscale(rope_scaling["factor"], rope_scaling.get("mscale_all_dim", 0))
    if not rope_scaling.get("mscale_all_dim"):
        m = 1.0
    want_scale = m * m / np.sqrt(D_K + D_ROPE)
    assert mla.scale == pytest.approx(want_scale, rel=1e-15)
    x = rng.normal(size=(2, T, D_MODEL))
    want = [by_definition(mla, x_b, causal_mask(T), scale=want_scale) for x_b in x]
    want_out, want_w = np.stack([o for o, _ in want]), np.stack([w for _, w in want])
    for absorbed in (False, True):
        out, w = mla(x, mask=causal_mask(T), absorbed=absorbed)
        assert np.abs(out - want_out).max() <= TOL and np.abs(w - want_w).max() <= TOL
    cache = mla.init_cache((2,))
    steps = [mla.decode_step(x[:, t : t + 1], cache)[0] for t in range(T)]
    assert np.abs(np.concatenate(steps, axis=-2) - want_out).max() <= TOL


def test_float32_stays_float32():
    mla = layer()
    out, w = mla(np.ones((T, D_MODEL), np.float32), absorbed=True)
    assert out.dtype == w.dtype == np.float32


def test_rope_on_the_latent_keys_would_block_absorption():
    # Rotate head 0's whole key c W_uk (no decoupled part). Then q_m · R_n (W_ukᵀ c) =
    # q_m R_{n-m} W_ukᵀ c: folding W_uk into the query once, at the query's position, does not
    # give the scores: the matrix between depends on the key's position too.
    rng = np.random.default_rng(15)
    mla = layer(d_k=6)
    x = rng.normal(size=(T, D_MODEL))
    c = mla.latent(x)
    W_uk = mla.W_uk[:, :6]  # head 0
    q = apply_rope(x @ mla.W_q[:, :6])  # (T, 6)
    k = apply_rope(c @ W_uk)  # RoPE on the up-projected key
    true_scores = q @ k.T
    folded = (q @ W_uk.T) @ c.T  # what an absorbed query would compute
    assert np.abs(folded - true_scores).max() > 0.1
    # Without RoPE on that part the fold is exact: the decoupled design.
    q0 = x @ mla.W_q[:, :6]
    np.testing.assert_allclose((q0 @ W_uk.T) @ c.T, q0 @ (c @ W_uk).T, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("absorbed", [True, False])
@pytest.mark.parametrize("batch_shape", [(), (2,), (2, 3)])
@pytest.mark.parametrize("max_len", [None, T])
def test_decoding_with_the_latent_cache_equals_the_causal_forward(absorbed, batch_shape, max_len):
    rng = np.random.default_rng(16)
    mla = layer()
    x = rng.normal(size=(*batch_shape, T, D_MODEL))
    full_out, full_w = mla(x, mask=causal_mask(T))
    cache = mla.init_cache(batch_shape, max_len=max_len)
    for t in range(T):
        out_t, w_t = mla.decode_step(x[..., t : t + 1, :], cache, absorbed=absorbed)
        assert out_t.shape == (*batch_shape, 1, D_MODEL) and w_t.shape == (*batch_shape, H, 1,
                                                                            t + 1)
        assert np.abs(out_t - full_out[..., t : t + 1, :]).max() <= TOL
        assert np.abs(w_t - full_w[..., t : t + 1, : t + 1]).max() <= TOL
    assert len(cache) == cache.tokens_seen == T


def test_the_cache_holds_the_latent_and_the_rotated_rope_key_only():
    rng = np.random.default_rng(17)
    mla = layer()
    x = rng.normal(size=(2, T, D_MODEL))
    cache = mla.init_cache((2,), max_len=T, dtype=np.float64)
    assert cache.nbytes == 2 * T * (D_C + D_ROPE) * 8  # no head axis, no separate values
    assert cache.values_per_token == D_C + D_ROPE
    for t in range(T):
        mla.decode_step(x[:, t : t + 1], cache)
    # the normalised latent (DeepSeek-V3 inference/model.py: kv_cache = kv_norm(kv)), and the
    # rotated RoPE key, not normalised (pe_cache = k_pe)
    np.testing.assert_allclose(cache.latent, rms(x @ mla.W_dkv, mla.kv_norm, 1e-6), rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(cache.rope_keys, apply_rope(x @ mla.W_kr), rtol=0, atol=1e-12)
    assert cache.latent.shape == (2, T, D_C) and cache.rope_keys.shape == (2, T, D_ROPE)
    with pytest.raises(ValueError, match="read-only"):
        cache.latent[0, 0, 0] = 1.0


def test_a_growing_latent_cache_doubles():
    mla = layer()
    cache = mla.init_cache()
    capacities = []
    for x_t in np.random.default_rng(18).normal(size=(40, 1, D_MODEL)):
        mla.decode_step(x_t, cache)
        capacities.append(cache._buf.shape[-2])
    assert sorted(set(capacities)) == [16, 32, 64]


# ----------------------------------------------------------------------------- errors
def error(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"d_rope": 3}, "MultiHeadLatentAttention: d_rope=3 must be even: RoPE turns pairs of "
                    "features"),
    ({"d_rope": 0}, "MultiHeadLatentAttention: d_rope=0 must be an integer >= 1"),
    ({"d_c": 0}, "MultiHeadLatentAttention: d_c=0 must be an integer >= 1"),
    ({"d_k": None, "h": 4}, "MultiHeadLatentAttention: d_model=18 is not divisible by h=4; "
                            "pass d_k explicitly"),
    ({"d_cq": 0}, "MultiHeadLatentAttention: d_cq=0 must be an integer >= 1"),
    ({"eps": -1e-6}, "MultiHeadLatentAttention: eps=-1e-06 must be a finite number >= 0"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}},
     "MultiHeadLatentAttention: rope_scaling={'type': 'linear', 'factor': 2.0}; expected None "
     "or a YaRN rope_scaling dict (type 'yarn', a 'factor', 'mscale_all_dim'), as DeepSeek's "
     "config.json has"),
    ({"rope_scaling": {"type": "yarn"}},
     "mla_softmax_scale: rope_scaling={'type': 'yarn'}; expected None or a config's "
     "rope_scaling dict with a 'factor' (and 'mscale_all_dim' for YaRN's temperature)"),
])
def test_bad_sizes_are_named_errors(kwargs, message):
    args = {"d_model": D_MODEL, "h": H, "d_c": D_C, "d_rope": D_ROPE, "d_k": D_K, **kwargs}
    assert error(lambda: MultiHeadLatentAttention(**args)) == message


def test_bad_inputs_to_forward_are_named_errors():
    mla = layer()
    assert error(lambda: mla(np.ones((T, 5)))) == (
        "MultiHeadLatentAttention: x has shape (9, 5); expected (T, d_model) with d_model=18 "
        "(from the layer)")
    assert error(lambda: mla(np.ones((T, D_MODEL)), mask=np.ones((T, T + 1), bool))) == (
        "MultiHeadLatentAttention: mask has shape (9, 10); expected a shape that broadcasts to "
        "(..., T, T) = (9, 9)")


def test_bad_decode_steps_leave_the_cache_unchanged():
    mla = layer()
    cache = mla.init_cache((2,), max_len=3)
    for x_t in np.ones((3, 2, 1, D_MODEL)):
        mla.decode_step(x_t, cache)
    before = cache.latent.copy()
    step = "MultiHeadLatentAttention.decode_step"
    assert error(lambda: mla.decode_step(np.ones((2, 1, D_MODEL)), cache)) == (
        f"{step}: the cache is full: it holds 3 of max_len=3 positions and cannot take 1 more; "
        "make a larger one with init_cache(..., max_len=6), or with max_len=None to let it grow")
    fresh = mla.init_cache((2,))
    assert error(lambda: mla.decode_step(np.ones((3, 1, D_MODEL)), fresh)) == (
        f"{step}: x_t has shape (3, 1, 18); expected (..., 1, d_model) with ... = (2,) (from "
        "the cache), d_model=18 (from the layer)")
    assert error(lambda: mla.decode_step(np.ones((2, 2, D_MODEL)), fresh)).startswith(
        f"{step}: x_t has shape (2, 2, 18)")
    assert re.match(rf"{step}: cache is made by another layer \(MultiHeadLatentAttention\(",
                    error(lambda: layer().decode_step(np.ones((2, 1, D_MODEL)), fresh)))
    assert error(lambda: mla.decode_step(np.ones((1, D_MODEL)), {})) == (
        f"{step}: cache is a dict; expected a LatentCache from this layer's init_cache()")
    np.testing.assert_array_equal(cache.latent, before)
    assert len(fresh) == 0 and isinstance(fresh, LatentCache)


# ------------------------------------------------------------ cache bytes of real models
def test_deepseek_v2_caches_576_values_per_layer_and_token():
    v2 = MODELS["DeepSeek-V2"]
    assert values_per_layer_token(v2) == 576 == v2["kv_lora_rank"] + v2["qk_rope_head_dim"]
    per_token = mla_cache_bytes(60, 512, 64, seq_len=1)
    assert per_token == 60 * 576 * 2 == cache_bytes(v2, 1)
    # "like GQA with 2.25 groups" of head_dim 128: 2 · 2.25 · 128 = 576
    assert 576 == 2 * 2.25 * v2["qk_nope_head_dim"]
    # against its 128 heads as plain MHA: 2 · 128 · 128 = 32,768 values, 56.9 times more
    mha = kv_cache_bytes(60, 128, 128, seq_len=1)
    assert mha / per_token == pytest.approx(32768 / 576)


def test_deepseek_v3_has_one_more_layer_and_the_same_latent():
    v3 = MODELS["DeepSeek-V3"]
    assert cache_bytes(v3, 8192) == mla_cache_bytes(61, 512, 64, 8192) == 61 * 576 * 8192 * 2


def test_forgetting_the_rope_key_undercounts_by_an_eighth():
    assert mla_cache_bytes(60, 512, 64, 1000) / (60 * 512 * 1000 * 2) == 576 / 512


@pytest.mark.parametrize("bad", [{"d_rope": 0}, {"seq_len": -1}, {"bytes_per_value": 2.0}])
def test_mla_cache_bytes_refuses_non_positive_sizes(bad):
    args = {"n_layers": 2, "d_c": 8, "d_rope": 2, "seq_len": 8, **bad}
    name, value = next(iter(bad.items()))
    with pytest.raises(ValueError, match=re.escape(f"mla_cache_bytes: {name}={value!r} must be")):
        mla_cache_bytes(**args)
