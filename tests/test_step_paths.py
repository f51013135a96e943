"""Every cached path equals the layer's (or the model's) forward: the layer's ``step`` in chunks,
the serving decoder over every cache it has, split-KV decoding, speculative verification and
``GPT.step``. Each path runs with biases (non-zero), RoPE and GQA (n_kv_heads < h), so a path
that drops one of them, or rotates at the wrong positions, or groups heads differently, fails."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import MultiHeadAttention, causal_mask
from mha_course.models.gpt import GPT, GPTConfig
from mha_course.serving.decoder import ContiguousCache, Decoder
from mha_course.serving.eviction import EvictingCache
from mha_course.serving.paged import PagedStore
from mha_course.serving.quantized import QuantizedCache
from mha_course.serving.speculative import verify_tree
from mha_course.serving.split_kv import split_kv_decode_step

D_MODEL, H, G = 24, 6, 2


def biased(layer: MultiHeadAttention, rng) -> MultiHeadAttention:
    """``layer`` with non-zero biases (a layer's biases start at zero, which would hide a path
    that drops them)."""
    layer.bias = True
    for name, W in (("b_q", layer.W_q), ("b_k", layer.W_k), ("b_v", layer.W_v)):
        setattr(layer, name, rng.normal(size=W.shape[1]))
    layer.b_o = rng.normal(size=layer.W_o.shape[1])
    return layer


def layer_under_test(rng, rope="half") -> MultiHeadAttention:
    return biased(MultiHeadAttention(D_MODEL, H, n_kv_heads=G, rope=rope, rng=rng), rng)


def split(T: int, sizes) -> list[slice]:
    """Chunks of the given sizes (the last takes the rest) covering 0..T."""
    bounds = np.cumsum([0, *sizes])
    bounds = np.append(bounds[bounds < T], T)
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


# ----------------------------------------------------------------------------- the layer
@pytest.mark.parametrize("rope", ["half", "interleaved"])
@pytest.mark.parametrize("sizes", [(1,) * 9, (4, 1, 1, 3), (9,), (2, 5, 1, 1)])
def test_layer_step_in_chunks_equals_the_causal_forward(rope, sizes):
    rng = np.random.default_rng(len(sizes))
    layer = layer_under_test(rng, rope)
    x = rng.normal(size=(2, 9, D_MODEL))
    full, full_w = layer(x, mask=causal_mask(9))
    cache = layer.init_cache(batch_shape=(2,))
    for s in split(9, sizes):
        out, w = layer.step(x[:, s], cache)
        np.testing.assert_allclose(out, full[:, s], rtol=1e-10, atol=1e-10)
        # the chunk's weights over every cached position: the forward's rows, cut at L
        np.testing.assert_allclose(w, full_w[..., s, : s.stop], rtol=1e-10, atol=1e-12)
    assert len(cache) == 9


def test_layer_step_refuses_a_chunk_that_does_not_fit_and_leaves_the_cache_unchanged():
    rng = np.random.default_rng(0)
    layer = layer_under_test(rng)
    cache = layer.init_cache(max_len=4)
    layer.step(rng.normal(size=(3, D_MODEL)), cache)
    with pytest.raises(ValueError, match=r"^MultiHeadAttention\.step: the cache is full"):
        layer.step(rng.normal(size=(2, D_MODEL)), cache)
    assert len(cache) == 3
    rolling = layer.init_cache(window=4)
    with pytest.raises(ValueError, match=r"^MultiHeadAttention\.step: the cache has a rolling"):
        layer.step(rng.normal(size=(2, D_MODEL)), rolling)
    assert len(rolling) == 0


def test_split_kv_decoding_equals_decode_step_with_biases_rope_and_gqa():
    rng = np.random.default_rng(1)
    layer = layer_under_test(rng)
    x = rng.normal(size=(2, 8, D_MODEL))
    full, _ = layer(x, mask=causal_mask(8))
    plain, split_cache = layer.init_cache((2,)), layer.init_cache((2,))
    for t in range(8):
        want, _ = layer.decode_step(x[:, t : t + 1], plain)
        got = split_kv_decode_step(layer, x[:, t : t + 1], split_cache, min(3, t + 1))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(got, full[:, t : t + 1], rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------- the serving decoder
def biased_decoder(seed=3) -> Decoder:
    rng = np.random.default_rng(seed)
    dec = Decoder.random(vocab=19, d_model=D_MODEL, n_layers=2, h=H, n_kv_heads=G, rng=rng)
    for block in dec.blocks:
        biased(block.attn, rng)
    return dec


DEC = biased_decoder()
TOKENS = np.random.default_rng(7).integers(0, DEC.vocab, 11)


def steps(dec, cache, sizes, tokens=TOKENS):
    return np.concatenate([dec.step(tokens[s], cache) for s in split(len(tokens), sizes)])


@pytest.mark.parametrize("sizes", [(11,), (1,) * 11, (5, 1, 1, 4)])
@pytest.mark.parametrize("make", [
    lambda dec: ContiguousCache(dec),
    lambda dec: PagedStore(dec, n_blocks=16, block_size=3).new_sequence(),
    lambda dec: QuantizedCache(dec, keys="none", values="none"),
    lambda dec: EvictingCache(dec, budget=11, policy="window"),
    lambda dec: EvictingCache(dec, budget=11, policy="h2o"),
], ids=["contiguous", "paged", "quantised-none", "evicting-window", "evicting-h2o"])
def test_decoder_steps_over_every_cache_equal_its_forward(make, sizes):
    # an evicting cache equals forward while nothing is evicted (budget = the whole sequence)
    np.testing.assert_allclose(steps(DEC, make(DEC), sizes), DEC.forward(TOKENS), rtol=1e-9,
                               atol=1e-9)


@pytest.mark.parametrize("keys,values,tol", [("int8-channel", "int8-token", 0.05),
                                             ("fp8", "fp8", 0.25)])
def test_a_quantised_cache_stays_within_its_tolerance_of_forward(keys, values, tol):
    want = DEC.forward(TOKENS)
    got = steps(DEC, QuantizedCache(DEC, keys, values, group=4), (6, 1, 1, 3))
    err = np.abs(got - want).max()
    assert 0 < err < tol * np.abs(want).max(), f"error {err:.3g} (tolerance {tol})"


def test_an_evicting_cache_departs_from_forward_once_it_evicts():
    got = steps(DEC, EvictingCache(DEC, budget=6, policy="window"), (1,) * 11)
    want = DEC.forward(TOKENS)
    np.testing.assert_allclose(got[:6], want[:6], rtol=1e-9, atol=1e-9)
    assert not np.allclose(got[6:], want[6:])


def test_step_batch_and_step_many_equal_forward_with_biases():
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, DEC.vocab, (3, 7))
    cache = ContiguousCache(DEC, batch=3)
    batch = np.concatenate([DEC.step_batch(tokens[:, :4], cache),
                            DEC.step_batch(tokens[:, 4:], cache)], axis=1)
    caches = [ContiguousCache(DEC) for _ in range(3)]
    first = DEC.step_many([tokens[0, :2], tokens[1, :6], tokens[2, :1]], caches)
    second = DEC.step_many([tokens[0, 2:], tokens[1, 6:], tokens[2, 1:]], caches)
    for b in range(3):
        want = DEC.forward(tokens[b])
        np.testing.assert_allclose(batch[b], want, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(np.concatenate([first[b], second[b]]), want, rtol=1e-9,
                                   atol=1e-9)


def test_the_decoders_layers_equal_their_own_step():
    # the decoder's attention over a ContiguousCache is the layer's step: one layer alone
    rng = np.random.default_rng(2)
    layer = DEC.blocks[0].attn
    x = rng.normal(size=(7, D_MODEL))
    cache = layer.init_cache()
    got = np.concatenate([layer.step(x[s], cache)[0] for s in split(7, (3, 1, 3))])
    np.testing.assert_allclose(got, layer(x, mask=causal_mask(7))[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("parents", [[-1, 0, 1, 2], [-1, 0, 0, 1]])
def test_speculative_verification_equals_forward_on_each_branch(parents):
    context, drafts = TOKENS[:5], np.array([3, 8, 1, 12])
    cache = ContiguousCache(DEC)
    DEC.step(context, cache)
    rows = verify_tree(DEC, cache, drafts, parents)
    for j in range(len(parents)):
        path = [j]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        seq = np.concatenate([context, drafts[path[::-1]]])
        np.testing.assert_allclose(rows[j], DEC.forward(seq)[-1], rtol=1e-9, atol=1e-9)
    # and the chunk a target verifies in one pass equals forward's rows
    np.testing.assert_allclose(DEC.step(drafts, cache), DEC.forward(
        np.concatenate([context, drafts]))[5:], rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------------- the GPT
@pytest.mark.parametrize("sizes", [(7,), (1,) * 7, (3, 1, 3)])
def test_gpt_step_equals_gpt_forward(sizes):
    config = GPTConfig(vocab_size=13, d_model=D_MODEL, n_layers=2, h=H, n_kv_heads=G,
                       context_length=16)
    model = GPT(config, rng=4)
    tokens = np.random.default_rng(6).integers(0, 13, (2, 7))
    caches = model.init_cache(batch_shape=(2,))
    got = np.concatenate([model.step(tokens[:, s], caches) for s in split(7, sizes)], axis=1)
    np.testing.assert_allclose(got, model.forward(tokens), rtol=1e-10, atol=1e-10)


def test_one_ragged_pass_over_every_kind_of_cache_equals_each_sequence_alone():
    # step_many: one product per weight for all sequences, attention by each one's own cache
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, DEC.vocab, n) for n in (6, 3, 8, 5)]
    caches = [ContiguousCache(DEC), PagedStore(DEC, n_blocks=8, block_size=4).new_sequence(),
              QuantizedCache(DEC, keys="none", values="none"),
              EvictingCache(DEC, budget=8, policy="snapkv", obs_window=2)]
    first = DEC.step_many([p[:2] for p in prompts], caches)
    rest = DEC.step_many([p[2:] for p in prompts], caches)
    for p, a, b in zip(prompts, first, rest, strict=True):
        np.testing.assert_allclose(np.concatenate([a, b]), DEC.forward(p), rtol=1e-9,
                                   atol=1e-9)
