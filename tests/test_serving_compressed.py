"""Quantised and evicting caches: exact when they keep everything, and each policy keeps what
its paper says it keeps."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.serving.decoder import ContiguousCache, Decoder
from mha_course.serving.eviction import EvictingCache, max_pool
from mha_course.serving.quantized import (
    FP8_MAX,
    QuantizedCache,
    bytes_per_value,
    quantize,
    quantize_int8,
)

DEC = Decoder.random(vocab=13, d_model=16, n_layers=2, h=4, n_kv_heads=2, rng=2)
TOKENS = np.random.default_rng(1).integers(0, 13, 30)


def test_int8_error_is_at_most_half_a_step_and_per_channel_scales_suit_outlier_channels():
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(64, 16))
    keys[:, 3] *= 30  # an outlier channel, as KIVI finds in keys
    for axis in (-1, -2):
        q, scale = quantize_int8(keys, axis)
        assert np.all(np.abs(q * scale - keys) <= scale / 2 + 1e-12)
    err = {s: np.abs(quantize(keys, s) - keys)[:, np.arange(16) != 3].mean()
           for s in ("int8-channel", "int8-token")}
    assert err["int8-channel"] < err["int8-token"] / 5


def test_fp8_has_a_relative_error_and_refuses_overflow():
    x = np.array([0.02, 0.1, 3.0, 200.0])  # E4M3's normal range starts at 2^-6 = 0.0156
    rel = np.abs(quantize(x, "fp8") - x) / x
    assert rel.max() <= 2 ** -4  # 3 mantissa bits: half a unit is 1/16 at worst
    assert abs(quantize(np.array([1e-3]), "fp8")[0] - 1e-3) > 5e-4  # below it: subnormals
    with pytest.raises(ValueError, match="quantize: a value of 500 exceeds E4M3's largest, 448"):
        quantize(np.array([500.0]), "fp8")
    assert FP8_MAX == 448
    assert bytes_per_value("int8-channel", 64, 32) == pytest.approx(1 + 2 / 32)


def test_quantised_caches_are_exact_without_quantisation_and_close_with_it():
    exact = DEC.forward(TOKENS)
    chunks = (TOKENS[:7], TOKENS[7:8], TOKENS[8:])
    for keys, values, tol in (("none", "none", 1e-12), ("int8-channel", "int8-token", 0.05),
                              ("fp8", "fp8", 0.3)):
        cache = QuantizedCache(DEC, keys, values, group=4)
        got = np.concatenate([DEC.step(c, cache) for c in chunks])
        assert np.abs(got - exact).max() <= tol, (keys, values)
    with pytest.raises(ValueError, match="QuantizedCache: keys='int4'"):
        QuantizedCache(DEC, "int4")


def test_an_evicting_cache_with_room_for_everything_is_exact():
    for policy in ("window", "h2o", "snapkv"):
        got = DEC.step(TOKENS, EvictingCache(DEC, budget=40, policy=policy))
        np.testing.assert_allclose(got, DEC.forward(TOKENS), rtol=1e-10, atol=1e-10)


def test_what_each_policy_keeps():
    window = EvictingCache(DEC, 8, "window")
    DEC.step(TOKENS, window)
    assert window.kept_positions(0).tolist() == [list(range(22, 30))] * 2
    sinks = EvictingCache(DEC, 8, "sinks")
    DEC.step(TOKENS, sinks)
    assert sinks.kept_positions(1).tolist() == [[0, 1, 2, 3, 26, 27, 28, 29]] * 2
    h2o = EvictingCache(DEC, 8, "h2o")
    DEC.step(TOKENS, h2o)
    kept = h2o.kept_positions(0)
    assert np.all(kept[:, -4:] == np.arange(26, 30))  # the recent half always stays
    snap = EvictingCache(DEC, 12, "snapkv", obs_window=4)
    DEC.step(TOKENS, snap)
    assert np.all(snap.kept_positions(0)[:, -4:] == np.arange(26, 30))
    with pytest.raises(ValueError, match="EvictingCache: budget=4 must exceed what 'sinks'"):
        EvictingCache(DEC, 4, "sinks")


def test_sinks_with_positions_in_the_cache_rotate_keys_at_their_slots():
    """With a budget that never evicts, cache positions are the text's positions: exact."""
    got = DEC.step(TOKENS, EvictingCache(DEC, 40, "sinks"))
    np.testing.assert_allclose(got, DEC.step(TOKENS, ContiguousCache(DEC)), atol=1e-10)
    moved = EvictingCache(DEC, 10, "sinks", positions="cache")
    kept = EvictingCache(DEC, 10, "sinks", positions="original")
    assert not np.allclose(DEC.step(TOKENS, moved)[-1], DEC.step(TOKENS, kept)[-1])


def test_max_pool():
    assert max_pool(np.array([[1.0, 0, 0, 0, 5]]), 3).tolist() == [[1.0, 1.0, 0.0, 5.0, 5.0]]
