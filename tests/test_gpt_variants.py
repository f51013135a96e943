"""Lesson 09's GPT with the 2025 block (lesson 13): every switch off is lesson 09's model
exactly; with the switches on, the hand-written gradients equal PyTorch autograd on the same
forward written independently in torch, and central differences; save/load keep the variant."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_course import apply_rope
from mha_course.models.gpt import GPT, GPTConfig
from mha_course.models.gpt_variants import BlockVariant, VariantGPT

CONFIG = GPTConfig(vocab_size=13, d_model=16, n_layers=2, h=4, n_kv_heads=2, context_length=8)
VARIANTS = [
    BlockVariant(qk_norm=True),
    BlockVariant(softcap=2.0),
    BlockVariant(sinks=True),
    BlockVariant(gate="headwise"),
    BlockVariant(qk_norm=True, softcap=3.0, sinks=True, gate="elementwise"),
    BlockVariant(softcap=2.0, scale=0.3),  # Gemma 2: its own score scale, then the cap
]


def batch(rng, B=2, T=7):
    tokens = rng.integers(0, CONFIG.vocab_size, size=(B, T))
    return tokens, rng.integers(0, CONFIG.vocab_size, size=(B, T))


def perturbed(model, rng):
    """Move every new parameter away from its start (gains 1, sinks 0) so each one matters."""
    params = model.parameters()
    for name, p in params.items():
        if name.endswith(("q_norm", "k_norm", "sinks")):
            p += rng.normal(scale=0.5, size=p.shape)
        if name.endswith("W_gate_attn"):
            p += rng.normal(scale=0.5, size=p.shape)
    model.load_parameters(params)
    return model


def test_every_switch_off_is_lesson_09s_model(rng):
    tokens, targets = batch(rng)
    base, plain = GPT(CONFIG, rng=3), VariantGPT(CONFIG, rng=3)
    assert set(base.parameters()) == set(plain.parameters())
    loss0, g0 = base.loss_and_grads(tokens, targets)
    loss1, g1 = plain.loss_and_grads(tokens, targets)
    assert loss0 == pytest.approx(loss1, rel=1e-12)
    for name in g0:
        np.testing.assert_allclose(g1[name], g0[name], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_the_gradients_match_central_differences(variant, rng):
    model = perturbed(VariantGPT(CONFIG, variant, rng=1), rng)
    tokens, targets = batch(rng)
    _, grads = model.loss_and_grads(tokens, targets)
    params = model.parameters()
    direction = {n: rng.normal(size=p.shape) for n, p in params.items()}
    eps = 1e-5

    def loss_at(t):
        m = VariantGPT.from_parameters(CONFIG, {n: p + t * direction[n]
                                                for n, p in params.items()}, variant=variant)
        return m.loss_and_grads(tokens, targets)[0]

    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    analytic = sum(float(np.vdot(grads[n], direction[n])) for n in params)
    assert analytic == pytest.approx(numeric, rel=2e-5, abs=1e-9)  # O(eps²) truncation
    for name in ("L0.q_norm", "L1.sinks", "L0.W_gate_attn"):  # each new parameter on its own
        if name not in params:
            continue
        one = {n: np.zeros_like(p) for n, p in params.items()}
        one[name] = direction[name]
        m_p = VariantGPT.from_parameters(CONFIG, {n: params[n] + eps * one[n] for n in params},
                                         variant=variant)
        m_m = VariantGPT.from_parameters(CONFIG, {n: params[n] - eps * one[n] for n in params},
                                         variant=variant)
        num = (m_p.loss_and_grads(tokens, targets)[0]
               - m_m.loss_and_grads(tokens, targets)[0]) / (2 * eps)
        assert float(np.vdot(grads[name], direction[name])) == pytest.approx(num, rel=1e-5,
                                                                             abs=1e-9)


def torch_loss(torch, model, tokens, targets):
    """The variant forward written again in torch (half-split RoPE only), its loss and grads."""
    c, v = model.config, model.variant
    P = {n: torch.tensor(p, dtype=torch.float64, requires_grad=True)
         for n, p in model.parameters().items()}
    F = torch.nn.functional
    tok = torch.tensor(tokens)
    T = tok.shape[-1]

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.eps) * w

    def rope(x):
        half = c.d_k // 2
        inv = c.rope_base ** (-torch.arange(half, dtype=torch.float64) / half)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        if c.rope == "interleaved":
            x1, x2 = x[..., 0::2], x[..., 1::2]
            o1, o2 = x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()
            return torch.stack([o1, o2], -1).flatten(-2)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1)

    def heads(x, n):
        return x.reshape(*x.shape[:-1], n, c.d_k).transpose(-2, -3)

    x = P["W_E"][tok]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    r = c.h // c.n_kv_heads
    for i in range(c.n_layers):
        a = rms(x, P[f"L{i}.attn_norm"])
        q, k = heads(a @ P[f"L{i}.W_q"], c.h), heads(a @ P[f"L{i}.W_k"], c.n_kv_heads)
        vv = heads(a @ P[f"L{i}.W_v"], c.n_kv_heads)
        if v.qk_norm:
            q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + c.eps) * P[f"L{i}.q_norm"]
            k = k / torch.sqrt((k * k).mean(-1, keepdim=True) + c.eps) * P[f"L{i}.k_norm"]
        q, k = rope(q), rope(k).repeat_interleave(r, dim=-3)
        vv = vv.repeat_interleave(r, dim=-3)
        s = q @ k.transpose(-1, -2) * (1 / math.sqrt(c.d_k) if v.scale is None else v.scale)
        if v.softcap is not None:
            s = v.softcap * torch.tanh(s / v.softcap)
        s = s.masked_fill(~causal, float("-inf"))
        if v.sinks:
            col = P[f"L{i}.sinks"][:, None, None].expand(*s.shape[:-1], 1)
            p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
        else:
            p = torch.softmax(s, -1)
        o = p @ vv
        if v.gate == "headwise":
            o = o * torch.sigmoid(a @ P[f"L{i}.W_gate_attn"]).transpose(-1, -2)[..., None]
        elif v.gate == "elementwise":
            o = o * heads(torch.sigmoid(a @ P[f"L{i}.W_gate_attn"]), c.h)
        x = x + o.transpose(-2, -3).flatten(-2) @ P[f"L{i}.W_o"]
        m = rms(x, P[f"L{i}.mlp_norm"])
        x = x + (F.silu(m @ P[f"L{i}.W_gate"]) * (m @ P[f"L{i}.W_up"])) @ P[f"L{i}.W_down"]
    logits = rms(x, P["norm_f"]) @ P["W_U"]
    loss = F.cross_entropy(logits.reshape(-1, c.vocab_size), torch.tensor(targets).reshape(-1))
    loss.backward()
    return loss.item(), {n: p.grad.numpy() for n, p in P.items()}


@pytest.mark.torch
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_loss_and_gradients_equal_pytorch_autograd(variant, torch, rng):
    model = perturbed(VariantGPT(CONFIG, variant, rng=2), rng)
    tokens, targets = batch(rng)
    loss, grads = model.loss_and_grads(tokens, targets)
    t_loss, t_grads = torch_loss(torch, model, tokens, targets)
    assert loss == pytest.approx(t_loss, rel=1e-10)
    assert set(grads) == set(t_grads)
    for name in grads:
        np.testing.assert_allclose(grads[name], t_grads[name], rtol=1e-7, atol=1e-10,
                                   err_msg=name)


def first_block_logits(model, tokens):
    """Block 0's raw logits written out in NumPy: RMSNorm, projections, QK-norm with the
    config's eps (Qwen3: config.rms_norm_eps), RoPE, q kᵀ times the variant's scale (Gemma 2:
    query_pre_attn_scalar**-0.5) or 1/sqrt(d_k)."""
    c, v, P = model.config, model.variant, model.parameters()

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.eps) * w

    def heads(x, n):  # (B, T, n·d_k) -> (B, n, T, d_k)
        return np.swapaxes(x.reshape(*x.shape[:-1], n, c.d_k), -2, -3)

    a = rms(P["W_E"][tokens], P["L0.attn_norm"])
    q, k = heads(a @ P["L0.W_q"], c.h), heads(a @ P["L0.W_k"], c.n_kv_heads)
    if v.qk_norm:
        q, k = rms(q, P["L0.q_norm"]), rms(k, P["L0.k_norm"])
    q, k = apply_rope(q), np.repeat(apply_rope(k), c.h // c.n_kv_heads, axis=-3)
    scale = 1 / math.sqrt(c.d_k) if v.scale is None else v.scale
    return q @ np.swapaxes(k, -1, -2) * scale  # (B, h, T, T)


@pytest.mark.parametrize("eps", [1e-5, 0.4])
@pytest.mark.parametrize("variant", [BlockVariant(qk_norm=True),
                                     BlockVariant(qk_norm=True, softcap=1.5, scale=0.7),
                                     BlockVariant(softcap=50.0, scale=144 ** -0.5)],
                         ids=lambda v: v.name if isinstance(v, BlockVariant) else None)
def test_qk_norm_takes_the_configs_eps_and_the_scores_the_variants_scale(variant, eps, rng):
    config = GPTConfig(vocab_size=13, d_model=16, n_layers=1, h=4, n_kv_heads=2,
                       context_length=8, eps=eps)
    model = perturbed(VariantGPT(config, variant, rng=4), rng)
    tokens, _ = batch(rng)
    _, stats = model.forward(tokens, stats=True)
    s = first_block_logits(model, tokens)
    causal = np.tril(np.ones((tokens.shape[-1],) * 2, dtype=bool))
    want = np.where(causal, s, -np.inf).max(axis=(0, 2, 3))
    np.testing.assert_allclose(stats[0]["max_logit"], want, rtol=1e-12)
    if variant.softcap is not None:
        cap = variant.softcap
        np.testing.assert_allclose(stats[0]["max_capped_logit"], cap * np.tanh(want / cap),
                                   rtol=1e-12)


def test_stats_report_each_heads_logits_entropy_and_sink_mass(rng):
    model = perturbed(VariantGPT(CONFIG, BlockVariant(softcap=1.0, sinks=True), rng=0), rng)
    tokens, _ = batch(rng)
    _, stats = model.forward(tokens, stats=True)
    assert len(stats) == CONFIG.n_layers
    for blk in stats:
        assert all(blk[key].shape == (CONFIG.h,) for key in blk)
        assert (blk["max_capped_logit"] < 1.0).all()  # the cap bounds what the softmax sees
        assert ((blk["sink_mass"] > 0) & (blk["sink_mass"] < 1)).all()
        assert (blk["entropy"] >= 0).all()
    sink = model.sink_weights(tokens)[0]
    np.testing.assert_allclose(sink.mean(axis=(0, 2)), stats[0]["sink_mass"], rtol=1e-12)
    w = model.attention_weights(tokens)[0]
    np.testing.assert_allclose(w.sum(-1) + sink, 1.0, rtol=1e-12)


def test_save_and_load_keep_the_variant(tmp_path, rng):
    variant = BlockVariant(qk_norm=True, sinks=True, gate="headwise")
    model = perturbed(VariantGPT(CONFIG, variant, rng=0), rng)
    model.save(tmp_path / "m.npz")
    back = VariantGPT.load(tmp_path / "m.npz")
    assert back.variant == variant
    tokens, _ = batch(rng)
    np.testing.assert_array_equal(back.forward(tokens), model.forward(tokens))


def test_bad_variants_and_the_missing_cache_are_named_errors():
    with pytest.raises(ValueError, match="BlockVariant: softcap="):
        BlockVariant(softcap=-1.0)
    with pytest.raises(ValueError, match="BlockVariant: gate="):
        BlockVariant(gate="per-token")
    with pytest.raises(ValueError, match=r"^BlockVariant: scale=0 must be None \(1/sqrt\(d_k\)\) "
                                         r"or a positive number$"):
        BlockVariant(scale=0)
    with pytest.raises(ValueError, match="VariantGPT.init_cache"):
        VariantGPT(CONFIG, rng=0).init_cache()
