"""The serving wing's decoder: chunk by chunk over any cache equals the whole forward, a ragged
batch equals each sequence alone, and lesson 09's GPT reads into it unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course.serving.decoder import (
    ContiguousCache,
    Decoder,
    generate_alone,
    sample_token,
)
from mha_course.serving.paged import PagedStore
from mha_course.serving.sampling import probabilities

DEC = Decoder.random(vocab=17, d_model=24, n_layers=2, h=4, n_kv_heads=2, rng=3)


def test_forward_is_each_layers_own_forward_with_a_causal_mask():
    tokens = np.array([1, 5, 2, 16, 0, 3])
    x = DEC.W_E[tokens]
    for layer in DEC.blocks:  # written out once more, from the package's pieces
        from mha_course import causal_mask, rms_norm, swiglu
        a = rms_norm(x, layer.attn_norm, DEC.eps)
        x = x + layer.attn(a, mask=causal_mask(len(tokens)))[0]
        x = x + swiglu(rms_norm(x, layer.mlp_norm, DEC.eps), layer.W_gate, layer.W_up,
                       layer.W_down)
    np.testing.assert_allclose(DEC.forward(tokens), rms_norm(x, DEC.norm_f) @ DEC.W_U,
                               rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=5), st.integers(0, 1000))
def test_chunks_over_a_cache_equal_the_whole_forward(sizes, seed):
    tokens = np.random.default_rng(seed).integers(0, DEC.vocab, sum(sizes))
    cache, rows, start = ContiguousCache(DEC), [], 0
    for n in sizes:
        rows.append(DEC.step(tokens[start:start + n], cache))
        start += n
    np.testing.assert_allclose(np.concatenate(rows), DEC.forward(tokens), rtol=1e-10,
                               atol=1e-10)
    assert cache.length == len(tokens)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4)), min_size=1, max_size=4),
       st.integers(0, 1000))
def test_a_ragged_batch_equals_each_sequence_alone_in_paged_or_contiguous_caches(shapes, seed):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, DEC.vocab, n + m) for n, m in shapes]
    store = PagedStore(DEC, n_blocks=64, block_size=3)
    seqs = [store.new_sequence() for _ in prompts]
    first = DEC.step_many([p[:n] for p, (n, _) in zip(prompts, shapes, strict=True)], seqs)
    second = DEC.step_many([p[n:] for p, (n, _) in zip(prompts, shapes, strict=True)], seqs,
                           last_only=True)
    for p, (n, _), a, b in zip(prompts, shapes, first, second, strict=True):
        full = DEC.forward(p)
        np.testing.assert_allclose(a, full[:n], rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(b, full[-1], rtol=1e-10, atol=1e-10)


def test_truncate_rolls_the_cache_back():
    tokens = np.array([3, 1, 4, 1, 5, 9, 2])
    cache = ContiguousCache(DEC)
    DEC.step(tokens, cache)
    cache.truncate(4)
    np.testing.assert_allclose(DEC.step(tokens[4:], cache), DEC.forward(tokens)[4:],
                               rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="ContiguousCache.truncate: length=9"):
        cache.truncate(9)


def test_greedy_and_sampled_generation_are_deterministic_and_sampling_follows_the_softmax():
    greedy = generate_alone(DEC, [1, 2, 3], 8)
    tokens, cache = [1, 2, 3], ContiguousCache(DEC)
    logits = DEC.step(np.array(tokens), cache)[-1]
    for _ in range(8):  # greedy by hand: the argmax, fed back
        tokens.append(int(np.argmax(logits)))
        logits = DEC.step(np.array(tokens[-1:]), cache)[-1]
    assert greedy == tokens[3:]
    assert generate_alone(DEC, [1, 2], 6, temperature=0.9, seed=4) == generate_alone(
        DEC, [1, 2], 6, temperature=0.9, seed=4)
    logits = np.array([0.0, 1.0, 2.0])
    rng = np.random.default_rng(0)
    counts = np.bincount([sample_token(logits, 1.0, rng) for _ in range(20000)], minlength=3)
    np.testing.assert_allclose(counts / 20000, probabilities(logits), atol=0.015)


def test_bad_tokens_and_models_are_refused_by_name():
    with pytest.raises(ValueError, match=r"Decoder.forward: token ids must lie in 0..16"):
        DEC.forward([0, 17])
    with pytest.raises(ValueError, match=r"Decoder.step_many: 2 chunks but 1 caches"):
        DEC.step_many([[1], [2]], [ContiguousCache(DEC)])
    with pytest.raises(ValueError, match=r"Decoder.from_model: cannot read the blocks of a "
                                         r"object"):
        Decoder.from_model(object())


def test_weight_bytes_leave_out_the_embedding_table():
    assert DEC.parameter_count() - DEC.parameter_count(embedding=False) == DEC.W_E.size
    assert DEC.weight_bytes() == DEC.parameter_count(embedding=False) * 8


def test_a_batch_of_equal_sequences_steps_at_once():
    tokens = np.random.default_rng(2).integers(0, DEC.vocab, (3, 7))
    cache = ContiguousCache(DEC, batch=3)
    got = np.concatenate([DEC.step_batch(tokens[:, :4], cache),
                          DEC.step_batch(tokens[:, 4:], cache)], axis=1)
    for b in range(3):
        np.testing.assert_allclose(got[b], DEC.forward(tokens[b]), rtol=1e-10, atol=1e-10)


def _with_biases(seed):
    # RoPE, grouped heads and random (non-zero) attention biases
    dec = Decoder.random(vocab=17, d_model=24, n_layers=2, h=6, n_kv_heads=2, rng=seed)
    rng = np.random.default_rng(seed)
    for layer in dec.blocks:
        attn = layer.attn
        attn.bias = True
        attn.b_q, attn.b_k, attn.b_v = (rng.normal(size=W.shape[1])
                                        for W in (attn.W_q, attn.W_k, attn.W_v))
        attn.b_o = rng.normal(size=attn.W_o.shape[1])
    return dec


def test_biases_reach_every_path_as_they_reach_forward():
    dec = _with_biases(5)
    tokens = np.random.default_rng(6).integers(0, dec.vocab, (3, 7))
    no_bias = Decoder(dec.W_E, Decoder.random(vocab=17, d_model=24, n_layers=2, h=6,
                                                    n_kv_heads=2, rng=5).blocks,
                      dec.norm_f, dec.W_U)
    assert not np.allclose(dec.forward(tokens[0]), no_bias.forward(tokens[0]))  # biases matter
    cache = ContiguousCache(dec, batch=3)
    got = np.concatenate([dec.step_batch(tokens[:, :4], cache),
                          dec.step_batch(tokens[:, 4:], cache)], axis=1)
    caches = [ContiguousCache(dec) for _ in range(3)]
    many = [np.concatenate(parts) for parts in zip(
        dec.step_many([tokens[0, :2], tokens[1, :5], tokens[2, :1]], caches),
        dec.step_many([tokens[0, 2:], tokens[1, 5:], tokens[2, 1:]], caches), strict=True)]
    for b in range(3):
        want = dec.forward(tokens[b])
        np.testing.assert_allclose(got[b], want, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(many[b], want, rtol=1e-10, atol=1e-10)


def test_step_batch_multiplies_each_weight_once_as_a_2d_product(monkeypatch):
    # the docstring's "one 2-d matrix product per weight": every product step_batch makes
    # has a 2-d left operand with B·T rows (attention's batched products aside)
    import mha_course.multihead as multihead_module

    shapes, plain = [], multihead_module.project

    def spy(x, W, b, dtype):
        shapes.append(x.shape)
        return plain(x, W, b, dtype)

    monkeypatch.setattr(multihead_module, "project", spy)
    tokens = np.random.default_rng(2).integers(0, DEC.vocab, (5, 1))
    DEC.step_batch(tokens, ContiguousCache(DEC, batch=5))
    assert shapes and all(s == (5, DEC.d_model) for s in shapes)
    assert len(shapes) == 4 * DEC.n_layers  # W_q, W_k, W_v, W_o in every layer


def test_lesson_09s_gpt_reads_into_the_decoder_unchanged():
    from mha_course.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=29, d_model=24, n_layers=2, h=4, n_kv_heads=2,
                          context_length=64), rng=1)
    dec = Decoder.from_model(model)
    tokens = np.random.default_rng(3).integers(0, 29, 20)
    np.testing.assert_allclose(dec.forward(tokens), model.forward(tokens), rtol=1e-12,
                               atol=1e-12)
    caches, cache = model.init_cache(), ContiguousCache(dec)
    np.testing.assert_allclose(dec.step(tokens[:9], cache), model.step(tokens[:9], caches),
                               rtol=1e-10, atol=1e-12)
    assert dec.parameter_count() == model.n_params


def test_parameters_are_named_as_lesson_09s_gpt_names_them():
    from mha_course.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=13, d_model=16, n_layers=2, h=4, n_kv_heads=2,
                          context_length=32), rng=0)
    mine = Decoder.from_model(model).parameters()
    assert list(mine) == list(model.parameters())
    assert all(mine[k] is v for k, v in model.parameters().items())  # shared, not copied


def test_a_float32_model_stays_float32_over_its_cache():
    dec = Decoder.random(vocab=11, d_model=8, n_layers=2, h=2, rng=0, dtype=np.float32)
    cache = ContiguousCache(dec, batch=2)
    logits = dec.step_batch(np.array([[1, 2], [3, 4]]), cache)
    assert logits.dtype == np.float32
    assert all(k.dtype == np.float32 for k in cache.keys + cache.values)
