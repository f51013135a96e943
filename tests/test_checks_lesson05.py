"""The checks of lesson 05: each passes a right answer and names each classic wrong one.

The generic contract (a right answer passes with one stable line, the stub's
``NotImplementedError`` passes through as "not attempted", ``None`` and an unexpected
exception fail) is bound to lesson 05's right answers, :data:`CORRECT_05`, by
:class:`TestContract` here (``tests/check_contract.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from check_contract import CheckContract

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, lesson05

# ------------------------------------------------------------------ correct implementations


def _positional_encoding(T, d_model):  # 05.1 forbids mha_course.sinusoidal_positions
    i = np.arange(d_model // 2)
    angles = np.arange(T)[:, None] / 10000.0 ** (2 * i / d_model)
    pe = np.empty((T, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def _rope_interleaved(x, positions, sign=1.0, speed=2.0, layout="interleaved"):
    """05.2 forbids mha_course.apply_rope. ``sign``/``speed``/``layout`` make the wrong ones."""
    d = x.shape[-1]
    phi = sign * np.asarray(positions)[:, None] * 10000.0 ** (-speed * np.arange(d // 2) / d)
    cos, sin = np.cos(phi), np.sin(phi)
    if layout == "half":
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def _llama3(d, base, cfg, *, swap=False, blend="smooth", times=False, compare="wavelength",
            speed=2.0):
    """05.3 forbids mha_course.variants.rope_scaling: the rule from the config; keywords make the
    wrong ones."""
    theta = base ** (-speed * np.arange(d // 2) / d)
    factor, L = cfg["factor"], cfg["original_max_position_embeddings"]
    low, high = cfg["low_freq_factor"], cfg["high_freq_factor"]
    if swap:
        low, high = high, low
    wavelength = 2 * np.pi / theta if compare == "wavelength" else theta
    slow = theta * factor if times else theta / factor
    smooth = (L / wavelength - low) / (high - low)
    middle = {"smooth": (1 - smooth) * slow + smooth * theta,
              "reversed": smooth * slow + (1 - smooth) * theta, "keep": theta,
              "divide": slow}[blend]
    return np.where(wavelength < L / high, theta, np.where(wavelength > L / low, slow, middle))


def _masks(src_lengths, tgt_lengths, S, T, enc_causal=False, dec_causal=True, dec_pad=True,
           cross_causal=False, cross_from_tgt=False, enc_unbroadcast=False):
    B = len(src_lengths)
    src = mha_course.padding_mask(src_lengths, S)
    enc = src if enc_unbroadcast else np.broadcast_to(src, (B, S, S))
    if enc_causal:
        enc = enc & mha_course.causal_mask(S)
    dec = np.ones((B, T, T), dtype=bool)
    if dec_causal:
        dec = dec & mha_course.causal_mask(T)
    if dec_pad:
        dec = dec & mha_course.padding_mask(tgt_lengths, T)
    if cross_from_tgt:
        real_q = np.arange(T)[None, :] < np.asarray(tgt_lengths)[:, None]
        cross = np.broadcast_to(real_q[:, :, None], (B, T, S))
    else:
        cross = np.broadcast_to(src, (B, T, S))
    if cross_causal:
        cross = cross & mha_course.causal_mask(T, S)
    return enc, dec, cross


def _padded_heads(q, k, v, lengths, head_axis=True):
    mask = mha_course.padding_mask(lengths, q.shape[-2])
    return mha_course.scaled_dot_product_attention(q, k, v, mask=mask[:, None] if head_axis
                                                   else mask)


def _alibi(q, k, v, *, top_left=False, mask="bottom-right", sign=1.0, reverse=False,
           first_slope_one=False, scale=True, bias_scaled=False):
    """05.6 forbids mha_course.alibi_bias; the keywords make the wrong ones."""
    h, T, S, d_k = q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]
    slopes = 2.0 ** (-8 * np.arange(h) / h) if first_slope_one else mha_course.alibi_slopes(h)
    slopes = slopes[::-1] if reverse else slopes
    q_pos = np.arange(T)[:, None] + (0 if top_left else S - T)
    bias = -sign * slopes[:, None, None] * (q_pos - np.arange(S)[None, :])
    raw = q @ np.swapaxes(k, -1, -2)
    scores = (raw + bias) / np.sqrt(d_k) if bias_scaled else (
        raw / (np.sqrt(d_k) if scale else 1.0) + bias)
    m = {"bottom-right": mha_course.causal_mask(T, S),
         "top-left": np.tril(np.ones((T, S), dtype=bool)), "none": None}[mask]
    weights = mha_course.softmax(scores, mask=m)
    return weights @ v, weights


CORRECT_05 = {
    "05.1": ("check_sinusoidal_positions", _positional_encoding),
    "05.2": ("check_rope_interleaved", _rope_interleaved),
    "05.3": ("check_llama3_rope_frequencies", _llama3),
    "05.4": ("check_encoder_decoder_masks", _masks),
    "05.5": ("check_padded_heads_attention", _padded_heads),
    "05.6": ("check_alibi_chunk_attention", _alibi),
    "05.7": ("check_mrope_position_ids", lesson05._mrope_ids_variant),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson05, CORRECT_05


# ------------------------------------------------------------------ the named mistakes


def _pe(layout="interleaved", first="sin", exponent="pair"):
    def pe(T, d_model):
        c = np.arange(d_model)
        i = c // 2
        power = {"pair": 2 * i / d_model, "column": c / d_model, "half": i / d_model}[exponent]
        angles = np.arange(T)[:, None] / 10000.0 ** power
        s, co = (np.sin, np.cos) if first == "sin" else (np.cos, np.sin)
        if layout == "concat":
            a = angles[:, 0::2]
            return np.concatenate([s(a), co(a)], axis=-1)
        return np.where(c % 2 == 0, s(angles), co(angles))

    return pe


MISTAKES = [
    ("pe-sin-cos-swapped", "check_sinusoidal_positions", _pe(first="cos"),
     r"sin and cos swapped"),
    ("pe-concatenated", "check_sinusoidal_positions", _pe(layout="concat"),
     r"all sines first, then all cosines"),
    ("pe-column-exponent", "check_sinusoidal_positions", _pe(exponent="column"),
     r"exponent uses the column index c"),
    ("pe-no-two", "check_sinusoidal_positions", _pe(exponent="half"),
     r"exponent is i/d_model; the paper's is 2i/d_model"),
    ("pe-transposed", "check_sinusoidal_positions", lambda T, d: _positional_encoding(T, d).T,
     r"shape \(8, 6\); expected \(T, d_model\) = \(6, 8\)\. Likely mistake: rows are positions"),
    ("pe-calls-the-package", "check_sinusoidal_positions",
     lambda T, d: mha_course.sinusoidal_positions(T, d),
     r"asks you to write the formula yourself; your answer calls "
     r"mha_course\.sinusoidal_positions"),
    ("rope-half-layout", "check_rope_interleaved",
     lambda x, p: _rope_interleaved(x, p, layout="half"), r"half-split layout"),
    ("rope-backwards", "check_rope_interleaved", lambda x, p: _rope_interleaved(x, p, sign=-1.0),
     r"rotation goes the wrong way"),
    ("rope-ignores-positions", "check_rope_interleaved",
     lambda x, p: _rope_interleaved(x, np.arange(x.shape[-2])),
     r"instead of the given positions"),
    ("rope-speed-j-over-d", "check_rope_interleaved",
     lambda x, p: _rope_interleaved(x, p, speed=1.0), r"speeds use j/d"),
    ("rope-calls-the-package", "check_rope_interleaved",
     lambda x, p: mha_course.apply_rope(x, p, layout="interleaved"),
     r"asks you to write the rotation yourself; your answer calls mha_course\.apply_rope"),
    ("llama3-thresholds-swapped", "check_llama3_rope_frequencies",
     lambda d, b, c: _llama3(d, b, c, swap=True),
     r"between the two thresholds are left alone \(which is also what swapping"),
    ("llama3-blend-reversed", "check_llama3_rope_frequencies",
     lambda d, b, c: _llama3(d, b, c, blend="reversed"), r"the blend is the wrong way round"),
    ("llama3-multiplied", "check_llama3_rope_frequencies",
     lambda d, b, c: _llama3(d, b, c, times=True), r"multiplied the slow pairs' frequency"),
    ("llama3-middle-kept", "check_llama3_rope_frequencies",
     lambda d, b, c: _llama3(d, b, c, blend="keep"), r"between the two thresholds are left alone"),
    ("llama3-middle-divided", "check_llama3_rope_frequencies",
     lambda d, b, c: _llama3(d, b, c, blend="divide"), r"the middle pairs are divided"),
    ("llama3-all-interpolated", "check_llama3_rope_frequencies",
     lambda d, b, c: b ** (-2.0 * np.arange(d // 2) / d) / c["factor"],
     r"every pair is divided by the factor: that is position interpolation"),
    ("llama3-frequency-thresholds", "check_llama3_rope_frequencies",
     lambda d, b, c: _llama3(d, b, c, compare="frequency"), r"the thresholds are wavelengths"),
    ("llama3-speed-j-over-d", "check_llama3_rope_frequencies",
     lambda d, b, c: _llama3(d, b, c, speed=1.0), r"yours use base\*\*\(-j/d\)"),
    ("llama3-one-per-feature", "check_llama3_rope_frequencies",
     lambda d, b, c: np.repeat(_llama3(d, b, c), 2), r"one frequency per PAIR of features"),
    ("llama3-calls-the-package", "check_llama3_rope_frequencies",
     lambda d, b, c: mha_course.variants.rope_scaling.llama3_frequencies(
         d, b, c["factor"], c["low_freq_factor"], c["high_freq_factor"],
         c["original_max_position_embeddings"]),
     r"asks you to write the rule from the config yourself; your answer calls "
     r"mha_course\.variants\.rope_scaling\.llama3_frequencies"),
    ("masks-encoder-causal", "check_encoder_decoder_masks",
     lambda *a: _masks(*a, enc_causal=True), r"encoder is bidirectional"),
    ("masks-encoder-not-broadcast", "check_encoder_decoder_masks",
     lambda *a: _masks(*a, enc_unbroadcast=True), r"broadcast it to the full shape"),
    ("masks-decoder-not-causal", "check_encoder_decoder_masks",
     lambda *a: _masks(*a, dec_causal=False), r"decoder's self-attention must be causal"),
    ("masks-decoder-no-padding", "check_encoder_decoder_masks",
     lambda *a: _masks(*a, dec_pad=False), r"left out the target padding"),
    ("masks-cross-causal", "check_encoder_decoder_masks",
     lambda *a: _masks(*a, cross_causal=True), r"cross-attention has no causal mask"),
    ("masks-cross-target-padding", "check_encoder_decoder_masks",
     lambda *a: _masks(*a, cross_from_tgt=True), r"hide the source padding"),
    ("masks-list-not-tuple", "check_encoder_decoder_masks", lambda *a: list(_masks(*a)),
     r"returned list; expected a tuple \(encoder_self, decoder_self, cross\)"),
    ("heads-mask-without-head-axis", "check_padded_heads_attention",
     lambda q, k, v, lengths: _padded_heads(q, k, v, lengths, head_axis=False),
     r"without a head axis, so sequence i's mask went to head i"),
    ("heads-query-mask", "check_padded_heads_attention",
     lambda q, k, v, lengths: mha_course.scaled_dot_product_attention(
         q, k, v, mask=np.swapaxes(mha_course.padding_mask(lengths, q.shape[-2]), -1, -2)[:, None]),
     r"hid the padded queries instead of the padded keys"),
    ("heads-no-mask", "check_padded_heads_attention",
     lambda q, k, v, lengths: mha_course.scaled_dot_product_attention(q, k, v),
     r"the mask had no effect"),
    ("alibi-all-top-left", "check_alibi_chunk_attention",
     lambda q, k, v: _alibi(q, k, v, top_left=True, mask="top-left"),
     r"the causal mask is aligned top-left"),
    ("alibi-mask-top-left", "check_alibi_chunk_attention",
     lambda q, k, v: _alibi(q, k, v, mask="top-left"), r"the causal mask is aligned top-left"),
    ("alibi-sign", "check_alibi_chunk_attention", lambda q, k, v: _alibi(q, k, v, sign=-1.0),
     r"the bias has the wrong sign"),
    ("alibi-slopes-reversed", "check_alibi_chunk_attention",
     lambda q, k, v: _alibi(q, k, v, reverse=True), r"the slopes go the wrong way round"),
    ("alibi-slope-one", "check_alibi_chunk_attention",
     lambda q, k, v: _alibi(q, k, v, first_slope_one=True), r"the slopes start at 2\*\*0 = 1"),
    ("alibi-no-mask", "check_alibi_chunk_attention", lambda q, k, v: _alibi(q, k, v, mask="none"),
     r"no causal mask"),
    ("alibi-bias-scaled", "check_alibi_chunk_attention",
     lambda q, k, v: _alibi(q, k, v, bias_scaled=True), r"added before dividing by √d_k"),
    ("alibi-unscaled", "check_alibi_chunk_attention", lambda q, k, v: _alibi(q, k, v, scale=False),
     r"not divided by √d_k"),
    ("alibi-calls-the-package", "check_alibi_chunk_attention",
     lambda q, k, v: (lambda w: (w @ v, w))(mha_course.softmax(
         q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
         + mha_course.alibi_bias(q.shape[-3], q.shape[-2], k.shape[-2]),
         mask=mha_course.causal_mask(q.shape[-2], k.shape[-2]))),
     r"asks you to build ALiBi's bias yourself; your answer calls mha_course\.alibi_bias"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        getattr(checks, check)(wrong)
    assert str(info.value).startswith("Exercise 05.")
    assert capsys.readouterr().out == "", "a failing check prints nothing"


def test_alibi_distances_counted_from_the_chunk_start_are_harmless(capsys):
    """Shifting every query's position by S - T moves each bias row by a constant, which the
    softmax ignores: only the mask's alignment matters (the check passes such an answer)."""
    q, k, v = (np.random.default_rng(0).normal(size=(4, 2, n, 3)) for n in (2, 5, 5))
    shifted, right = _alibi(q, k, v, top_left=True), _alibi(q, k, v)
    np.testing.assert_allclose(shifted[1], right[1], atol=1e-12)  # same weights: harmless
    checks.check_alibi_chunk_attention(lambda q, k, v: _alibi(q, k, v, top_left=True))
    assert capsys.readouterr().out.startswith("Exercise 05.6 passed: ")


def test_the_padded_heads_bug_raises_when_b_differs_from_h_and_the_hint_says_why():
    def buggy(q, k, v, lengths):  # the colleague's code of exercise 05.5, as given
        mask = mha_course.padding_mask(lengths, q.shape[-2])
        return mha_course.scaled_dot_product_attention(q, k, v, mask=mask)

    # B = h = 2 first: the bug runs silently and is named from its numbers
    with pytest.raises(CheckFailed, match=r"sequence i's mask went to head i"):
        checks.check_padded_heads_attention(buggy)

    def buggy_from_the_second_probe(q, k, v, lengths):
        if q.shape[0] == q.shape[1]:
            return _padded_heads(q, k, v, lengths)
        return buggy(q, k, v, lengths)

    with pytest.raises(CheckFailed, match=r"(?s)raised ValueError: scaled_dot_product_attention: "
                                          r"mask has shape \(3, 1, 5\).*Likely mistake: a "
                                          r"\(B, 1, S\) mask against \(B, h, T, S\) scores"):
        checks.check_padded_heads_attention(buggy_from_the_second_probe)


@pytest.mark.parametrize("check", ["check_sinusoidal_positions", "check_rope_interleaved",
                                   "check_llama3_rope_frequencies"])
def test_an_answer_hard_coded_for_the_first_probe_fails_on_another_shape(check):
    name, right = next(v for v in CORRECT_05.values() if v[0] == check)
    seen = {}

    def first_shape_only(*args):
        key = "first"
        if key not in seen:
            seen[key] = right(*args)
        return seen[key]

    with pytest.raises(CheckFailed, match=r"shape"):
        getattr(checks, name)(first_shape_only)
