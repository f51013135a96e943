"""The GPT of lesson 09: shapes, gradients (central differences and PyTorch autograd), the fast
path equal to the readable one, cached inference equal to the uncached forward, generation,
head masks, parameters, save and load."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mha_course import gradient_check
from mha_course.models.gpt import GPT, GPTConfig, swiglu_width
from mha_course.models.gpt_fast import fast_logits, fast_loss_and_grads

# every size different, so a transposed axis cannot hide: V=13, d_model=24, h=6 (d_k=4), g=3
SMALL = GPTConfig(vocab_size=13, d_model=24, n_layers=2, h=6, n_kv_heads=3, d_ff=20,
                  context_length=40)


def small_model(config=SMALL, seed=0, dtype=np.float64):
    model = GPT(config, rng=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    for p in model.parameters().values():  # norms away from 1, so their gradients matter
        if p.ndim == 1:
            p[...] = 1.0 + 0.3 * rng.normal(size=p.shape)
    return model


def data(config=SMALL, B=3, T=7, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, config.vocab_size, size=(B, T)),
            rng.integers(0, config.vocab_size, size=(B, T)))


def test_config_defaults_and_refusals():
    c = GPTConfig(vocab_size=65, d_model=64, n_layers=2, h=4)
    assert (c.n_kv_heads, c.d_ff, c.d_k) == (4, swiglu_width(64), 16) == (4, 176, 16)
    assert GPTConfig.from_dict(c.to_dict()) == c
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.h = 2
    for bad, match in (({"h": 5}, "not divisible by h=5"), ({"n_kv_heads": 3}, "does not divide"),
                       ({"h": 64}, "must be even"), ({"rope": "none"}, "rope="),
                       ({"vocab_size": 0}, "vocab_size=0")):
        with pytest.raises(ValueError, match=match):
            GPTConfig(**{**c.to_dict(), **bad})


def test_forward_shapes_and_parameter_names():
    model = small_model()
    tokens, _ = data()
    assert model.forward(tokens).shape == (3, 7, 13)
    assert model.forward(tokens[0]).shape == (7, 13)
    params = model.parameters()
    assert list(params)[:3] == ["W_E", "L0.attn_norm", "L0.W_q"]
    assert params["L1.W_k"].shape == (24, 3 * 4) and params["L0.W_o"].shape == (24, 24)
    assert params["L0.W_gate"].shape == (24, 20) and params["L1.W_down"].shape == (20, 24)
    assert params["W_U"].shape == (24, 13)
    assert params["L0.W_q"] is model.blocks[0].attn.W_q  # the arrays themselves
    assert model.n_params == sum(p.size for p in params.values())


def test_future_tokens_do_not_change_past_logits():
    model = small_model()
    tokens, _ = data()
    changed = tokens.copy()
    changed[:, 4:] = (changed[:, 4:] + 1) % 13
    np.testing.assert_allclose(model(tokens)[:, :4], model(changed)[:, :4], atol=1e-13)
    assert not np.allclose(model(tokens)[:, 4:], model(changed)[:, 4:])


def test_refuses_bad_tokens_with_named_errors():
    model = small_model()
    with pytest.raises(ValueError, match="GPT.forward: tokens holds the id 13"):
        model.forward(np.array([[1, 13]]))
    with pytest.raises(ValueError, match="context_length is 40"):
        model.forward(np.zeros((1, 41), dtype=int))
    with pytest.raises(ValueError, match="integer token ids"):
        model.forward(np.zeros((1, 4)))
    with pytest.raises(ValueError, match=r"head_mask has shape \(6,\); expected \(n_layers, h\)"):
        model.forward(np.zeros((1, 4), dtype=int), head_mask=np.ones(6))


def numeric_gradient(loss, param, eps=1e-6):
    """Central differences of ``loss()`` with respect to every entry of ``param`` (in place)."""
    grad = np.zeros_like(param)
    flat, out = param.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        plus = loss()
        flat[i] = old - eps
        minus = loss()
        flat[i] = old
        out[i] = (plus - minus) / (2 * eps)
    return grad


def test_gradients_match_central_differences():
    # (gradient_check's worst relative error per entry is dominated by the entries whose
    # gradient is nearly 0; over a whole array the norm of the difference is the honest measure)
    config = dataclasses.replace(SMALL, d_model=12, h=2, n_kv_heads=1, d_ff=10)
    model = small_model(config)
    tokens, targets = data(config, B=2, T=5)
    _, grads = model.loss_and_grads(tokens, targets)
    for name, param in model.parameters().items():
        numeric = numeric_gradient(lambda: model.loss(tokens, targets), param)
        error = np.linalg.norm(numeric - grads[name]) / np.linalg.norm(numeric)
        assert error < 1e-6, (name, error)  # W_E (entries ~0.02) is the most curved
    # and gradient_check, entry by entry, where no entry is nearly 0
    param = model.parameters()["L0.W_q"]

    def f(value):
        kept = param.copy()
        param[...] = value
        loss = model.loss(tokens, targets)
        param[...] = kept
        return loss, grads["L0.W_q"]

    assert gradient_check(f, param.copy(), eps=1e-5) < 1e-5


@pytest.mark.parametrize("rope", ["half", "interleaved"])
@pytest.mark.parametrize("n_kv_heads", [6, 3, 1])
def test_fast_path_equals_the_readable_one(rope, n_kv_heads):
    config = dataclasses.replace(SMALL, rope=rope, n_kv_heads=n_kv_heads)
    model = small_model(config)
    tokens, targets = data(config)
    loss, grads = model.loss_and_grads(tokens, targets)
    fast_loss, fast_grads = fast_loss_and_grads(model, tokens, targets)
    assert fast_loss == pytest.approx(loss, rel=1e-13)
    assert list(fast_grads) == list(grads)
    for name, g in grads.items():
        np.testing.assert_allclose(fast_grads[name], g, rtol=1e-10, atol=1e-13, err_msg=name)
    head_mask = np.ones((2, 6))
    head_mask[0, 1], head_mask[1, 4] = 0.0, 0.5
    np.testing.assert_allclose(fast_logits(model, tokens, head_mask=head_mask),
                               model.forward(tokens, head_mask=head_mask), atol=1e-12)


def test_float32_fast_path_is_close_to_float64():
    model = small_model()
    tokens, targets = data()
    loss64, grads64 = fast_loss_and_grads(model, tokens, targets)
    model32 = model.astype(np.float32)
    loss32, grads32 = fast_loss_and_grads(model32, tokens, targets)
    assert grads32["L0.W_q"].dtype == np.float32
    assert loss32 == pytest.approx(loss64, rel=1e-5)
    for name, g in grads64.items():
        np.testing.assert_allclose(grads32[name], g, atol=2e-5 * np.abs(g).max(), err_msg=name)


def test_head_mask_of_ones_changes_nothing_and_zero_ablates_a_head():
    model = small_model()
    tokens, _ = data()
    np.testing.assert_allclose(model(tokens, head_mask=np.ones((2, 6))), model(tokens),
                               atol=1e-13)
    mask = np.ones((2, 6))
    mask[1, 2] = 0.0
    # by hand: head 2 of block 1 zeroed in the concatenated heads before W_o
    W_o = model.blocks[1].attn.W_o.copy()
    model.blocks[1].attn.W_o[2 * 4 : 3 * 4] = 0.0
    np.testing.assert_allclose(model(tokens), model.__class__.from_parameters(
        model.config, model.parameters())(tokens), atol=1e-13)
    by_hand = model(tokens)
    model.blocks[1].attn.W_o[...] = W_o
    np.testing.assert_allclose(model(tokens, head_mask=mask), by_hand, atol=1e-12)
    with pytest.raises(ValueError, match="head_mask is for evaluation"):
        model.forward(tokens, head_mask=mask, return_cache=True)


@pytest.mark.parametrize("chunks", [[7], [1] * 7, [3, 1, 1, 2], [2, 5]])
def test_cached_steps_equal_the_uncached_forward(chunks):
    model = small_model()
    tokens, _ = data()
    full = model(tokens)
    caches = model.init_cache(batch_shape=(3,))
    got, start = [], 0
    for n in chunks:
        got.append(model.step(tokens[:, start : start + n], caches))
        start += n
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, atol=1e-12)
    assert [len(c) for c in caches] == [7, 7]


def test_a_chunk_step_equals_decode_steps_one_token_at_a_time():
    model = small_model()
    layer = model.blocks[0].attn
    x = np.random.default_rng(3).normal(size=(2, 4, 24))
    c1, c2 = layer.init_cache((2,)), layer.init_cache((2,))
    out_chunk, w_chunk = layer.step(x[:, :3], c1)
    for t in range(3):
        out_t, w_t = layer.decode_step(x[:, t : t + 1], c2)
        np.testing.assert_allclose(out_chunk[:, t : t + 1], out_t, atol=1e-13)
    out_last, w_last = layer.step(x[:, 3:], c1)
    out_t, w_t = layer.decode_step(x[:, 3:], c2)
    np.testing.assert_allclose(out_last, out_t, atol=1e-13)
    np.testing.assert_allclose(w_last, w_t, atol=1e-13)
    assert w_chunk.shape == (2, 6, 3, 3)


def test_step_refuses_a_full_context_and_foreign_caches():
    model = small_model()
    caches = model.init_cache()
    model.step(np.zeros(38, dtype=int), caches)
    with pytest.raises(ValueError, match="38 cached \\+ T=3 new positions exceed context_length"):
        model.step(np.zeros(3, dtype=int), caches)
    assert len(caches[0]) == 38  # unchanged by the refused step
    with pytest.raises(ValueError, match="init_cache"):
        model.step(np.zeros(1, dtype=int), small_model().init_cache())


def test_cached_generation_equals_uncached_for_200_tokens():
    config = dataclasses.replace(SMALL, context_length=210)
    model = small_model(config)
    prompt = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    cached = model.generate(prompt, 200, temperature=0.9, top_k=8, top_p=0.95, rng=7)
    uncached = model.generate(prompt, 200, temperature=0.9, top_k=8, top_p=0.95, rng=7,
                              use_cache=False)
    assert cached.shape == (2, 204)
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_array_equal(cached[:, :4], prompt)
    assert len(np.unique(cached[:, 4:])) > 3  # sampled, not stuck on one token


@pytest.mark.parametrize("kwargs", [{"temperature": 0}, {"temperature": 1.5, "rng": 1},
                                    {"top_k": 1, "rng": 2}, {"top_p": 0.5, "rng": 3}])
def test_cached_generation_equals_uncached_at_each_setting(kwargs):
    model = small_model()
    prompt = np.array([3, 1, 4])
    np.testing.assert_array_equal(model.generate(prompt, 30, **kwargs),
                                  model.generate(prompt, 30, use_cache=False, **kwargs))


def test_greedy_generation_is_the_argmax_of_the_forward():
    model = small_model()
    seq = model.generate(np.array([3, 1, 4]), 12, temperature=0)
    logits = model(seq[:-1])
    np.testing.assert_array_equal(seq[3:], logits[2:].argmax(-1))


def test_generation_is_seeded_and_refuses_too_long():
    model = small_model()
    a = model.generate(np.array([1, 2]), 10, rng=1)
    assert a.shape == (12,)
    np.testing.assert_array_equal(a, model.generate(np.array([1, 2]), 10, rng=1))
    with pytest.raises(ValueError, match="exceeds context_length=40"):
        model.generate(np.array([1, 2]), 39)


def test_save_and_load_round_trip(tmp_path):
    model = small_model()
    path = tmp_path / "gpt.npz"
    model.save(path, steps=12)
    loaded = GPT.load(path)
    assert loaded.config == model.config
    tokens, _ = data()
    np.testing.assert_array_equal(loaded(tokens), model(tokens))
    assert GPT.load(path, dtype=np.float32).dtype == np.float32
    with np.load(path) as stored:
        assert str(stored["meta/steps"]) == "12"


def test_from_parameters_and_load_parameters_refuse_wrong_dicts():
    model = small_model()
    params = dict(model.parameters())
    params.pop("W_U")
    with pytest.raises(ValueError, match=r"missing \['W_U'\]"):
        GPT.from_parameters(SMALL, params)
    params["W_U"] = np.zeros((3, 3))
    with pytest.raises(ValueError, match=r"params\['W_U'\] has shape \(3, 3\)"):
        model.load_parameters(params)


# ------------------------------------------------------------------------ PyTorch autograd
def torch_loss(torch, model, tokens, targets):
    """The same model written with torch ops (its own RoPE, SDPA with GQA); returns the loss and
    the parameter tensors (leaves that require grad), named as model.parameters()."""
    F = torch.nn.functional
    c = model.config
    P = {name: torch.tensor(p, requires_grad=True) for name, p in model.parameters().items()}
    T = tokens.shape[-1]
    j = torch.arange(c.d_k // 2, dtype=torch.float64)
    theta = torch.arange(T, dtype=torch.float64)[:, None] * c.rope_base ** (-2 * j / c.d_k)
    cos, sin = torch.cos(theta), torch.sin(theta)

    def rope(x):  # half layout: pairs (j, j + d_k/2)
        a, b = x[..., : c.d_k // 2], x[..., c.d_k // 2 :]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    x = P["W_E"][torch.tensor(tokens)]
    B = x.shape[0]
    for i in range(c.n_layers):
        a = F.rms_norm(x, (c.d_model,), P[f"L{i}.attn_norm"], c.eps)
        q = (a @ P[f"L{i}.W_q"]).view(B, T, c.h, c.d_k).transpose(1, 2)
        k = (a @ P[f"L{i}.W_k"]).view(B, T, c.n_kv_heads, c.d_k).transpose(1, 2)
        v = (a @ P[f"L{i}.W_v"]).view(B, T, c.n_kv_heads, c.d_k).transpose(1, 2)
        heads = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True,
                                               enable_gqa=True)
        x = x + heads.transpose(1, 2).reshape(B, T, c.d_model) @ P[f"L{i}.W_o"]
        m = F.rms_norm(x, (c.d_model,), P[f"L{i}.mlp_norm"], c.eps)
        x = x + (F.silu(m @ P[f"L{i}.W_gate"]) * (m @ P[f"L{i}.W_up"])) @ P[f"L{i}.W_down"]
    logits = F.rms_norm(x, (c.d_model,), P["norm_f"], c.eps) @ P["W_U"]
    loss = F.cross_entropy(logits.reshape(-1, c.vocab_size), torch.tensor(targets).reshape(-1))
    return loss, P


@pytest.mark.torch
def test_whole_model_gradients_equal_pytorch_autograd(torch):
    model = small_model()
    tokens, targets = data(T=9)
    loss, grads = model.loss_and_grads(tokens, targets)
    t_loss, P = torch_loss(torch, model, tokens, targets)
    t_loss.backward()
    assert loss == pytest.approx(t_loss.item(), rel=1e-13)
    for name, g in grads.items():
        np.testing.assert_allclose(g, P[name].grad.numpy(), rtol=1e-9, atol=1e-13,
                                   err_msg=name)
