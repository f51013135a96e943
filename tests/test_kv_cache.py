"""The KV cache: ``init_cache`` / ``decode_step`` and ``kv_cache_bytes``.

Decoding T tokens one at a time must give the rows of the full causal forward over the T
tokens; the cache must grow without copying everything at each step, say clearly when it is
full, and refuse input that does not fit it, before it changes. A rolling buffer
(``init_cache(window=W)``) must give the rows of the forward with ``sliding_window_mask`` for
sequences longer than W, in memory that does not grow.
"""

from __future__ import annotations

import functools
import re

import conftest
import numpy as np
import pytest

from mha_course import (
    KVCache,
    MultiHeadAttention,
    apply_rope,
    causal_mask,
    kv_cache_bytes,
    sliding_window_mask,
    split_heads,
)

# Every dimension different: T=7 tokens, h=4, d_k=6, d_v=5, d_model=10 (d_k given).
T, H, D_K, D_V, D_MODEL = 7, 4, 6, 5, 10
# the shared helper (tests/conftest.py) with this module's sizes
random_layer = functools.partial(
    conftest.random_layer, d_model=D_MODEL, h=H, d_k=D_K, d_v=D_V, bias=True
)
DECODE = "MultiHeadAttention.decode_step"
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def decode(layer, x, cache):
    """Feed x (..., T, d_model) one position at a time; outputs and weights per step."""
    steps = [layer.decode_step(x[..., t : t + 1, :], cache) for t in range(x.shape[-2])]
    return [out for out, _ in steps], [w for _, w in steps]


# ---------------------------------------------------------------- decoding = causal forward
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("batch_shape", [(), (2,), (2, 3)])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("max_len", [None, T])
def test_decoding_token_by_token_equals_the_full_causal_forward(
    rng, n_kv_heads, batch_shape, dtype, max_len
):
    layer = random_layer(rng, n_kv_heads=n_kv_heads)
    x = rng.normal(size=(*batch_shape, T, D_MODEL)).astype(dtype)
    full_out, full_weights = layer(x, mask=causal_mask(T))
    cache = layer.init_cache(batch_shape, max_len=max_len)
    outs, weights = decode(layer, x, cache)
    assert len(cache) == T
    for t, (out_t, w_t) in enumerate(zip(outs, weights, strict=True)):
        assert out_t.shape == (*batch_shape, 1, D_MODEL) and out_t.dtype == dtype
        assert w_t.shape == (*batch_shape, H, 1, t + 1)
        np.testing.assert_allclose(w_t, full_weights[..., t : t + 1, : t + 1], rtol=0,
                                   atol=TOL[dtype])
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), full_out, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_cache_holds_the_projected_keys_and_values_per_kv_head(rng, n_kv_heads):
    layer = random_layer(rng, n_kv_heads=n_kv_heads)
    g = layer.n_kv_heads
    x = rng.normal(size=(2, T, D_MODEL))
    cache = layer.init_cache((2,))
    decode(layer, x, cache)
    assert cache.keys.shape == (2, g, T, D_K) and cache.values.shape == (2, g, T, D_V)
    np.testing.assert_allclose(cache.keys, split_heads(x @ layer.W_k + layer.b_k, g),
                               rtol=0, atol=1e-14)
    np.testing.assert_allclose(cache.values, split_heads(x @ layer.W_v + layer.b_v, g),
                               rtol=0, atol=1e-14)


def test_appending_a_prompt_at_once_then_decoding_equals_the_causal_forward(rng):
    # Prefill: the prompt's keys and values go in with one append; decoding continues from it.
    layer = random_layer(rng, n_kv_heads=2)
    x = rng.normal(size=(3, T, D_MODEL))
    full_out, _ = layer(x, mask=causal_mask(T))
    cache = layer.init_cache((3,))
    prompt = x[:, :4]
    cache.append(split_heads(prompt @ layer.W_k + layer.b_k, 2),
                 split_heads(prompt @ layer.W_v + layer.b_v, 2))
    outs, _ = decode(layer, x[:, 4:], cache)
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), full_out[:, 4:], rtol=0, atol=1e-12)


def test_decoding_float32_keeps_float32_in_the_cache(rng):
    layer = random_layer(rng)
    cache = layer.init_cache()
    out, weights = layer.decode_step(rng.normal(size=(1, D_MODEL)).astype(np.float32), cache)
    assert out.dtype == weights.dtype == cache.keys.dtype == cache.dtype == np.float32


# ---------------------------------------------------------------------------- memory
def test_max_len_preallocates_once_and_never_reallocates(rng):
    layer = random_layer(rng, n_kv_heads=2)
    cache = layer.init_cache((3,), max_len=20, dtype=np.float64)
    assert len(cache) == 0 and cache.capacity == 20
    expected_bytes = 3 * 2 * 20 * (D_K + D_V) * 8  # batch·g·max_len·(d_k + d_v)·8 bytes
    assert cache.nbytes == expected_bytes
    first_keys = cache._k
    decode(layer, rng.normal(size=(3, 20, D_MODEL)), cache)
    assert cache._k is first_keys and cache.capacity == 20 and cache.nbytes == expected_bytes
    assert cache.keys.nbytes + cache.values.nbytes == expected_bytes  # full: all of it used


def test_a_growing_cache_doubles_so_appending_copies_little(rng):
    layer = random_layer(rng, n_kv_heads=1)
    cache = layer.init_cache()
    capacities, reallocations, buffer = [], 0, None
    for t in range(100):
        layer.decode_step(rng.normal(size=(1, D_MODEL)), cache)
        if cache._k is not buffer:
            reallocations += 1
            buffer = cache._k
            capacities.append(cache.capacity)
        assert len(cache) == t + 1 <= cache.capacity
    assert capacities == [16, 32, 64, 128]  # the initial 16, then doubling
    assert reallocations == 4  # not 100
    # The positions copied in all, 16 + 32 + 64 (each growth copies the filled part), stay
    # below twice the length: amortised O(1) per appended token.
    assert 16 + 32 + 64 < 2 * len(cache)


def test_the_cache_views_are_read_only(rng):
    layer = random_layer(rng)
    cache = layer.init_cache()
    layer.decode_step(rng.normal(size=(1, D_MODEL)), cache)
    with pytest.raises(ValueError, match="read-only"):
        cache.keys[..., 0, 0] = 1.0


# ----------------------------------------------------------------------------- errors
def error(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.fixture
def layer_and_cache():
    layer = MultiHeadAttention(16, 4, rng=0)
    cache = layer.init_cache(batch_shape=(2,), max_len=3)
    layer.decode_step(np.zeros((2, 1, 16)), cache)  # one position filled
    return layer, cache


@pytest.mark.parametrize(
    "shape, message",
    [
        ((2, 5, 16), "x_t has shape (2, 5, 16); expected (..., 1, d_model) with d_model=16 "
                     "(from the layer)"),
        ((2, 1, 12), "x_t has shape (2, 1, 12); expected (..., 1, d_model) with d_model=16 "
                     "(from the layer)"),
        ((16,), "x_t has shape (16,); expected (..., 1, d_model) with d_model=16 "
                "(from the layer)"),
        ((3, 1, 16), "x_t has shape (3, 1, 16); expected (..., 1, d_model) with ... = (2,) "
                     "(from the cache), d_model=16 (from the layer)"),
        ((1, 16), "x_t has shape (1, 16); expected (..., 1, d_model) with ... = (2,) "
                  "(from the cache), d_model=16 (from the layer)"),
    ],
)
def test_x_t_of_the_wrong_shape_is_a_named_error_and_leaves_the_cache_alone(
    layer_and_cache, shape, message
):
    layer, cache = layer_and_cache
    keys_before = cache.keys.copy()
    assert error(lambda: layer.decode_step(np.zeros(shape), cache)) == f"{DECODE}: {message}"
    assert len(cache) == 1
    np.testing.assert_array_equal(cache.keys, keys_before)


def test_integer_x_t_is_a_named_error(layer_and_cache):
    layer, cache = layer_and_cache
    assert error(lambda: layer.decode_step(np.zeros((2, 1, 16), dtype=int), cache)) == (
        f"{DECODE}: x_t has dtype int64; expected a real floating dtype (float32 or float64)"
    )


def test_a_cache_from_another_layer_is_refused(layer_and_cache):
    _, cache = layer_and_cache
    twin = MultiHeadAttention(16, 4, rng=0)  # same sizes and weights, still another layer
    assert error(lambda: twin.decode_step(np.zeros((2, 1, 16)), cache)) == (
        f"{DECODE}: cache was made by another layer (MultiHeadAttention(d_model=16, h=4, "
        "d_k=4, d_v=4, bias=False)); each layer needs its own cache: make one with this "
        "layer's init_cache()"
    )


def test_something_else_as_the_cache_is_refused():
    layer = MultiHeadAttention(16, 4, rng=0)
    assert error(lambda: layer.decode_step(np.zeros((1, 16)), {})) == (
        f"{DECODE}: cache is a dict; expected a KVCache from this layer's init_cache()"
    )


def test_a_full_cache_says_its_limit_and_how_to_raise_it(layer_and_cache):
    layer, cache = layer_and_cache
    for _ in range(2):
        layer.decode_step(np.zeros((2, 1, 16)), cache)
    assert error(lambda: layer.decode_step(np.zeros((2, 1, 16)), cache)) == (
        f"{DECODE}: the cache is full: it holds 3 of max_len=3 positions and cannot take 1 "
        "more; make a larger one with init_cache(..., max_len=6), or with max_len=None to let "
        "it grow"
    )
    assert len(cache) == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_len": 0}, "KVCache: max_len=0 must be an integer >= 1"),
        ({"max_len": 2.5}, "KVCache: max_len=2.5 must be an integer >= 1"),
        ({"batch_shape": (2, -1)}, "KVCache: batch_shape[1]=-1 must be an integer >= 0"),
        ({"batch_shape": "B"}, "KVCache: batch_shape[0]='B' must be an integer >= 0"),
        ({"dtype": np.int64}, "KVCache: dtype=int64 must be a real floating dtype"),
    ],
)
def test_init_cache_refuses_bad_sizes(kwargs, message):
    assert error(lambda: MultiHeadAttention(16, 4).init_cache(**kwargs)) == message


def test_append_checks_the_kv_heads_and_batch_axes():
    cache = MultiHeadAttention(16, 4, n_kv_heads=2, rng=0).init_cache((3,))
    assert error(lambda: cache.append(np.zeros((3, 4, 1, 4)), np.zeros((3, 4, 1, 4)))) == (
        "KVCache.append: k has shape (3, 4, 1, 4); expected (..., n_kv_heads, n, d_k) with "
        "n_kv_heads=2 (from the cache), n=1 (from k), d_k=4 (from the cache)"
    )
    assert error(lambda: cache.append(np.zeros((2, 1, 4)), np.zeros((2, 1, 4)))) == (
        "KVCache.append: k has shape (2, 1, 4); expected (..., n_kv_heads, n, d_k) with "
        "... = (3,) (from the cache)"
    )


def test_an_int_batch_shape_means_one_batch_axis():
    cache = MultiHeadAttention(16, 4, rng=0).init_cache(5)
    assert isinstance(cache, KVCache) and cache.batch_shape == (5,)


# ---------------------------------------------------------------- the size of real caches
# Published configurations (layers, KV heads, d_k) and their cache per token in bf16, as the
# models' papers and cards state it (DESIGN.md: Llama 3 8B 128 KiB, 70B 320 KiB per token).
MODELS = {
    # name: (n_layers, n_kv_heads, d_k, KiB per token in bf16)
    "Llama-2-7B (MHA)": (32, 32, 128, 512),
    "Llama 3 8B": (32, 8, 128, 128),
    "Llama 3 70B": (80, 8, 128, 320),
    "Mistral 7B v0.1": (32, 8, 128, 128),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_kv_cache_bytes_of_published_models_per_token_and_at_4096_tokens(name):
    n_layers, n_kv_heads, d_k, kib = MODELS[name]
    assert kv_cache_bytes(n_layers, n_kv_heads, d_k, seq_len=1) == kib * 2**10
    got = kv_cache_bytes(n_layers, n_kv_heads, d_k, seq_len=4096)
    assert got == 2 * n_layers * n_kv_heads * d_k * 4096 * 2  # K and V, bf16 = 2 bytes
    assert got == kib * 4096 * 2**10


def test_llama_3_70b_at_8k_tokens_is_2_5_gib_and_at_128k_40_gib():
    assert kv_cache_bytes(80, 8, 128, seq_len=8192) == 2.5 * 2**30
    assert kv_cache_bytes(80, 8, 128, seq_len=131072) == 40 * 2**30


def test_kv_cache_bytes_scales_with_batch_and_value_width():
    one = kv_cache_bytes(32, 8, 128, 4096)
    assert kv_cache_bytes(32, 8, 128, 4096, batch=3, bytes_per_value=4) == 6 * one


def test_kv_cache_bytes_agrees_with_a_layers_filled_cache(rng):
    layer = random_layer(rng, n_kv_heads=2)
    cache = layer.init_cache((3,), max_len=T)
    decode(layer, rng.normal(size=(3, T, D_MODEL)).astype(np.float32), cache)
    # d_v = 5 here, not d_k: count K and V separately with d_k alone, then compare halves
    assert cache.keys.nbytes == kv_cache_bytes(1, 2, D_K, T, batch=3, bytes_per_value=4) // 2


@pytest.mark.parametrize("bad", [{"seq_len": 0}, {"batch": -1}, {"bytes_per_value": 1.5}])
def test_kv_cache_bytes_refuses_non_positive_sizes(bad):
    args = {"n_layers": 2, "n_kv_heads": 2, "d_k": 4, "seq_len": 8, **bad}
    with pytest.raises(ValueError, match="^" + re.escape("kv_cache_bytes: ")):
        kv_cache_bytes(**args)


# ------------------------------------------------------------------ the rolling buffer (window)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("batch_shape", [(), (2,), (2, 3)])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("window", [1, 3, 7])
def test_rolling_buffer_decode_equals_the_sliding_window_forward(
    rng, window, n_kv_heads, batch_shape, dtype
):
    n = 11  # longer than every window: the buffer wraps around
    layer = random_layer(rng, n_kv_heads=n_kv_heads)
    x = rng.normal(size=(*batch_shape, n, D_MODEL)).astype(dtype)
    full_out, full_weights = layer(x, mask=sliding_window_mask(n, window))
    cache = layer.init_cache(batch_shape, window=window)
    outs, weights = decode(layer, x, cache)
    for t, w_t in enumerate(weights):
        seen = min(t + 1, window)  # the last `window` positions, oldest first
        assert w_t.shape == (*batch_shape, H, 1, seen)
        np.testing.assert_allclose(w_t, full_weights[..., t : t + 1, t + 1 - seen : t + 1],
                                   rtol=0, atol=TOL[dtype])
        # what the windowed forward gives the keys outside the window: exactly 0
        assert not full_weights[..., t, : t + 1 - seen].any()
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), full_out, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rolling_buffer_with_rope_keeps_the_true_positions(layout):
    rng = np.random.default_rng(7)
    layer = random_layer(rng, n_kv_heads=2, rope=layout)  # d_k = 6: even
    x = rng.normal(size=(2, 13, D_MODEL))
    full_out, _ = layer(x, mask=sliding_window_mask(13, 4))
    cache = layer.init_cache((2,), window=4)
    outs, _ = decode(layer, x, cache)
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), full_out, rtol=0, atol=1e-12)
    assert cache.tokens_seen == 13 and len(cache) == 4
    # the cached keys were rotated at their own positions, not at their slots
    k_raw = split_heads(x[:, -4:] @ layer.W_k + layer.b_k, 2)  # positions 9..12
    expect = apply_rope(k_raw, np.arange(9, 13), layout=layout)
    np.testing.assert_allclose(cache.oldest_first(np.swapaxes(cache.keys, -1, -2)),
                               np.swapaxes(expect, -1, -2), rtol=0, atol=1e-12)


def test_position_i_lives_in_slot_i_mod_window_and_tokens_seen_keeps_counting(rng):
    layer = random_layer(rng, n_kv_heads=1)
    W = 4
    cache = layer.init_cache(window=W)
    x = rng.normal(size=(10, D_MODEL))
    k_all = split_heads(x @ layer.W_k + layer.b_k, 1)  # (1, 10, d_k)
    for t in range(10):
        layer.decode_step(x[t : t + 1], cache)
        assert cache.tokens_seen == t + 1
        assert len(cache) == min(t + 1, W) <= W
        positions = cache.positions
        assert sorted(positions.tolist()) == list(range(max(0, t + 1 - W), t + 1))
        for slot, p in enumerate(positions):
            assert p % W == slot
            np.testing.assert_allclose(cache.keys[0, slot], k_all[0, p], rtol=0, atol=1e-14)
    assert cache.positions.tolist() == [8, 9, 6, 7]


def test_rolling_buffer_memory_is_flat_in_the_sequence_length(rng):
    layer = random_layer(rng, n_kv_heads=2)
    cache = layer.init_cache((3,), window=5)
    sizes, buffers = [], set()
    for x_t in rng.normal(size=(40, 3, 1, D_MODEL)):
        layer.decode_step(x_t, cache)
        sizes.append(cache.nbytes)
        buffers.add(id(cache._k))
    assert set(sizes) == {3 * 2 * 5 * (D_K + D_V) * 8}  # batch·g·W·(d_k + d_v)·8, from step 1
    assert len(buffers) == 1  # allocated once, never reallocated
    assert cache.capacity == 5


def test_a_prompt_longer_than_the_window_keeps_its_last_window_positions(rng):
    layer = random_layer(rng, n_kv_heads=2)
    n, W, prompt = 12, 4, 7
    x = rng.normal(size=(2, n, D_MODEL))
    full_out, _ = layer(x, mask=sliding_window_mask(n, W))
    cache = layer.init_cache((2,), window=W)
    cache.append(split_heads(x[:, :prompt] @ layer.W_k + layer.b_k, 2),
                 split_heads(x[:, :prompt] @ layer.W_v + layer.b_v, 2))
    assert len(cache) == W and cache.tokens_seen == prompt
    assert sorted(cache.positions.tolist()) == [3, 4, 5, 6]
    outs, _ = decode(layer, x[:, prompt:], cache)
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), full_out[:, prompt:], rtol=0,
                               atol=1e-12)


def test_a_window_at_least_the_sequence_length_is_the_ordinary_cache(rng):
    layer = random_layer(rng)
    x = rng.normal(size=(T, D_MODEL))
    plain, rolling = layer.init_cache(), layer.init_cache(window=T)
    a, _ = decode(layer, x, plain)
    b, _ = decode(layer, x, rolling)
    np.testing.assert_array_equal(np.concatenate(a), np.concatenate(b))
    np.testing.assert_array_equal(sliding_window_mask(T, T), causal_mask(T))


def test_window_with_max_len_limits_the_positions_not_the_slots(rng):
    layer = random_layer(rng)
    cache = layer.init_cache(window=3, max_len=5)
    for x_t in rng.normal(size=(5, 1, D_MODEL)):
        layer.decode_step(x_t, cache)
    assert len(cache) == 3 and cache.capacity == 3
    assert error(lambda: layer.decode_step(np.zeros((1, D_MODEL)), cache)) == (
        f"{DECODE}: the cache is full: it holds 5 of max_len=5 positions and cannot take 1 "
        "more; make a larger one with init_cache(..., max_len=10), or with max_len=None to let "
        "it grow"
    )
    assert cache.tokens_seen == 5 and cache.positions.tolist() == [3, 4, 2]


@pytest.mark.parametrize("window, message", [
    (0, "KVCache: window=0 must be an integer >= 1"),
    (-2, "KVCache: window=-2 must be an integer >= 1"),
    (2.0, "KVCache: window=2.0 must be an integer >= 1"),
])
def test_init_cache_refuses_a_window_below_one(window, message):
    assert error(lambda: MultiHeadAttention(16, 4).init_cache(window=window)) == message


def test_a_bad_step_leaves_a_rolling_buffer_unchanged(rng):
    layer = random_layer(rng, n_kv_heads=2)
    cache = layer.init_cache((2,), window=3)
    for x_t in rng.normal(size=(5, 2, 1, D_MODEL)):
        layer.decode_step(x_t, cache)
    before = (cache.keys.copy(), cache.values.copy(), cache.tokens_seen, len(cache))
    with pytest.raises(ValueError, match=re.escape(f"{DECODE}: x_t has shape (2, 2, 10)")):
        layer.decode_step(np.zeros((2, 2, D_MODEL)), cache)
    with pytest.raises(ValueError, match=re.escape("KVCache.append: k has shape (2, 2, 1, 5)")):
        cache.append(np.zeros((2, 2, 1, 5)), np.zeros((2, 2, 1, D_V)))
    other = random_layer(rng, n_kv_heads=2)
    with pytest.raises(ValueError, match="cache was made by another layer"):
        other.decode_step(np.zeros((2, 1, D_MODEL)), cache)
    np.testing.assert_array_equal(cache.keys, before[0])
    np.testing.assert_array_equal(cache.values, before[1])
    assert (cache.tokens_seen, len(cache)) == before[2:]


def test_oldest_first_is_the_identity_without_a_window_or_before_wrapping(rng):
    layer = random_layer(rng)
    cache = layer.init_cache(window=4)
    for x_t in rng.normal(size=(3, 1, D_MODEL)):
        layer.decode_step(x_t, cache)
    x = np.arange(3)
    assert cache.oldest_first(x) is x
    layer.decode_step(rng.normal(size=(1, D_MODEL)), cache)
    layer.decode_step(rng.normal(size=(1, D_MODEL)), cache)  # position 4 -> slot 0
    assert cache.oldest_first(np.arange(4)).tolist() == [1, 2, 3, 0]
    assert cache.positions[cache.oldest_first(np.arange(4))].tolist() == [1, 2, 3, 4]
    assert "window=4" in repr(cache)


def test_truncate_rolls_the_cache_back_and_the_next_step_sees_only_what_is_kept(rng):
    layer = random_layer(rng, n_kv_heads=2, rope="half")
    x = rng.normal(size=(7, D_MODEL))
    cache, fresh = layer.init_cache(), layer.init_cache()
    layer.step(x[:5], cache)
    cache.truncate(3)  # as speculative decoding drops two rejected drafts
    layer.step(x[:3], fresh)
    assert (len(cache), cache.tokens_seen) == (3, 3)
    np.testing.assert_allclose(layer.step(x[5:], cache)[0], layer.step(x[5:], fresh)[0],
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"^KVCache\.truncate: length=6 must be between 0 "):
        cache.truncate(6)
    with pytest.raises(ValueError, match=r"^KVCache\.truncate: the cache has a rolling window"):
        layer.init_cache(window=2).truncate(0)
