"""RoPE's context-stretching frequencies: YaRN as the paper writes it, Llama 3.1 as Meta's code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_course.positions import rope_angles
from mha_course.variants.rope_scaling import (
    llama3_frequencies,
    mla_softmax_scale,
    ntk_base,
    rope_frequencies,
    yarn_attention_factor,
    yarn_frequencies,
    yarn_ramp,
)


def _meta_apply_scaling(freqs, factor, low_freq_factor, high_freq_factor, old_context_len):
    """Meta's ``apply_scaling`` (llama-models, Llama 3.1), transcribed loop for loop."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(new_freqs)


def _yarn_reference_code(d, factor, L, base, beta_fast=32, beta_slow=1):
    """jquesnelle/yarn's ``LlamaYaRNScaledRotaryEmbedding.yarn``: the ramp over pair indices."""
    def correction_dim(rotations):
        return d * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    theta = base ** (-np.arange(0, d, 2) / d)
    extrapolate = 1 - ramp  # 1: keep the frequency
    return theta / factor * (1 - extrapolate) + theta * extrapolate


def test_rope_frequencies_are_the_angles_of_position_one():
    for d, base in ((8, 10000.0), (64, 500000.0), (128, 10000.0)):
        np.testing.assert_allclose(rope_frequencies(d, base),
                                   rope_angles(np.array([1]), d, base)[0], rtol=1e-15)


@pytest.mark.parametrize("d, L, s, base", [(64, 2048, 4.0, 10000.0), (128, 4096, 16.0, 10000.0),
                                           (128, 8192, 8.0, 500000.0), (32, 512, 2.5, 1000.0)])
def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_ramps_between(d, L, s, base):
    theta = rope_frequencies(d, base)
    yarn = yarn_frequencies(d, s, L, base)
    turns = L * theta / (2 * np.pi)
    np.testing.assert_array_equal(yarn[turns >= 32], theta[turns >= 32])
    np.testing.assert_allclose(yarn[turns <= 1], theta[turns <= 1] / s, rtol=1e-15)
    middle = (turns > 1) & (turns < 32)
    assert np.all((yarn[middle] < theta[middle]) & (yarn[middle] > theta[middle] / s))
    # the paper's blend, one pair at a time
    for j in range(d // 2):
        r = L / (2 * np.pi / theta[j])
        gamma = 0.0 if r < 1 else 1.0 if r > 32 else (r - 1) / 31
        assert yarn[j] == pytest.approx((1 - gamma) * theta[j] / s + gamma * theta[j], rel=1e-13)


@pytest.mark.parametrize("d, L, s, base", [(64, 2048, 4.0, 10000.0), (128, 4096, 16.0, 10000.0),
                                           (128, 8192, 8.0, 500000.0)])
def test_yarn_agrees_with_the_authors_code_outside_the_ramp(d, L, s, base):
    ours, theirs = yarn_frequencies(d, s, L, base), _yarn_reference_code(d, s, L, base)
    theta = rope_frequencies(d, base)
    outside = np.isclose(ours, theta, rtol=1e-13) | np.isclose(ours, theta / s, rtol=1e-13)
    np.testing.assert_allclose(ours[outside], theirs[outside], rtol=1e-12)
    assert outside.sum() < d // 2  # there is a ramp, and it is where the two may differ


def test_factor_one_changes_nothing():
    np.testing.assert_allclose(yarn_frequencies(64, 1.0, 2048), rope_frequencies(64), rtol=1e-15)
    np.testing.assert_allclose(llama3_frequencies(128, factor=1.0), rope_frequencies(128, 5e5),
                               rtol=1e-15)


@pytest.mark.parametrize("config", [
    dict(d=128, base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position=8192),  # Llama 3.1
    dict(d=64, base=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position=8192),  # Llama 3.2 1B's factor, a 64-wide head
    dict(d=96, base=10000.0, factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0,
         original_max_position=2048),
])
def test_llama3_matches_metas_apply_scaling_and_is_yarns_ramp_without_temperature(config):
    d, base = config["d"], config["base"]
    theta = rope_frequencies(d, base)
    want = _meta_apply_scaling(theta, config["factor"], config["low_freq_factor"],
                               config["high_freq_factor"], config["original_max_position"])
    got = llama3_frequencies(**config)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    yarn = yarn_frequencies(d, config["factor"], config["original_max_position"], base,
                            alpha=config["low_freq_factor"], beta=config["high_freq_factor"])
    np.testing.assert_allclose(got, yarn, rtol=1e-13)


def test_llama31_leaves_29_pairs_alone_divides_29_and_blends_6():
    theta, new = rope_frequencies(128, 500000.0), llama3_frequencies(128)
    kept, divided = new == theta, np.isclose(new, theta / 8, rtol=1e-15)
    assert (int(kept.sum()), int(divided.sum())) == (29, 29)
    assert np.flatnonzero(~kept & ~divided).tolist() == list(range(29, 35))


def test_yarn_attention_factor_and_ntk_base():
    assert yarn_attention_factor(4.0) == pytest.approx(0.1 * math.log(4) + 1)
    assert yarn_attention_factor(32.0) == pytest.approx(1.34657, abs=1e-5)
    assert yarn_attention_factor(0.5) == 1.0
    d, s = 64, 4.0
    theta, theta_ntk = rope_frequencies(d), rope_frequencies(d, ntk_base(10000.0, s, d))
    assert theta[0] == theta_ntk[0] == 1.0
    assert theta[-1] / theta_ntk[-1] == pytest.approx(s, rel=1e-12)


def yarn_get_mscale(scale, mscale):
    """Hugging Face's (and DeepSeek's) formula, written out: 0.1 · mscale · ln(scale) + 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@pytest.mark.parametrize("factor, mscale", [(40, 1.0), (40, 0.707), (4.0, 0.5), (1.0, 0.707),
                                            (0.25, 1.0), (13.0, 0.0)])
def test_yarn_attention_factor_with_deepseeks_mscale(factor, mscale):
    assert yarn_attention_factor(factor, mscale) == pytest.approx(yarn_get_mscale(factor, mscale),
                                                                  rel=1e-15)


@pytest.mark.parametrize("qk_head_dim, rope_scaling, m", [
    (192, None, 1.0),
    (192, {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0}, (40, 1.0)),
    (192, {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707}, (40, 0.707)),
    (9, {"rope_type": "yarn", "factor": 3, "mscale_all_dim": 0.5}, (3, 0.5)),
    (9, {"type": "yarn", "factor": 3, "mscale": 0.9}, 1.0),  # no mscale_all_dim: unchanged
    (9, {"type": "yarn", "factor": 3, "mscale_all_dim": 0}, 1.0),
])
def test_mla_softmax_scale_is_deepseeks(qk_head_dim, rope_scaling, m):
    # DeepseekV3Attention.__init__: scaling = qk_head_dim**-0.5, times mscale² when
    # rope_scaling has a non-zero mscale_all_dim.
    m = m if isinstance(m, float) else yarn_get_mscale(*m)
    assert mla_softmax_scale(qk_head_dim, rope_scaling) == pytest.approx(
        qk_head_dim ** -0.5 * m * m, rel=1e-15)


def test_deepseek_v3s_softmax_is_sharpened_by_1_874():
    v3 = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0}
    ratio = mla_softmax_scale(192, v3) / mla_softmax_scale(192)
    assert ratio == pytest.approx((0.1 * math.log(40) + 1) ** 2, rel=1e-15)
    assert round(ratio, 3) == 1.874


def test_ramp_thresholds():
    np.testing.assert_array_equal(yarn_ramp([0.0, 1.0, 2.0, 4.0, 9.0], 1.0, 4.0),
                                  [0.0, 0.0, 1 / 3, 1.0, 1.0])


@pytest.mark.parametrize("call, match", [
    (lambda: rope_frequencies(7), r"rope_frequencies: d=7 must be even"),
    (lambda: yarn_frequencies(64, 0.0, 2048), r"yarn_frequencies: factor=0.0 must be a number > 0"),
    (lambda: yarn_frequencies(64, 4.0, 0), r"yarn_frequencies: original_max_position"),
    (lambda: llama3_frequencies(128, low_freq_factor=4.0, high_freq_factor=4.0),
     r"llama3_frequencies: high_freq_factor=4.0 must be a number > 4"),
    (lambda: yarn_ramp([1.0], alpha=2.0, beta=1.0), r"yarn_ramp: beta=1.0 must be a number > 2"),
    (lambda: ntk_base(10000.0, 4.0, 2), r"ntk_base: d=2 must be at least 4"),
    (lambda: rope_frequencies(8, base=1.0), r"rope_frequencies: base=1.0 must be a number > 1"),
    (lambda: yarn_attention_factor(4.0, mscale=-0.5),
     r"yarn_attention_factor: mscale=-0.5 must be a finite number >= 0"),
    (lambda: mla_softmax_scale(0), r"mla_softmax_scale: qk_head_dim=0 must be an integer >= 1"),
    (lambda: mla_softmax_scale(192, {"type": "yarn", "factor": -2.0}),
     r"mla_softmax_scale: rope_scaling\['factor'\]=-2.0 must be a number > 0"),
    (lambda: mla_softmax_scale(192, {"factor": 40, "mscale_all_dim": -1.0}),
     r"mla_softmax_scale: rope_scaling\['mscale_all_dim'\]=-1.0 must be a number > 0"),
    (lambda: mla_softmax_scale(192, 40), r"mla_softmax_scale: rope_scaling=40; expected None"),
])
def test_bad_arguments_raise_a_named_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
