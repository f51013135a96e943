"""The checks of lesson 05: each passes a right answer and names each classic wrong one.

The generic properties (one stable success line, the stub passes through as "not attempted", a
``None`` or an exception becomes a failure) are tested in ``test_checks.py``, which takes lesson
05's right answers from :data:`CORRECT_05` here.
"""

from __future__ import annotations

import numpy as np
import pytest

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed

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


def _score_table(q, k, P, layout, rotate_k=True, scale=1.0):
    pos = np.arange(P)
    qs = mha_course.apply_rope(np.tile(q, (P, 1)), pos, layout=layout)
    ks = np.tile(k, (P, 1))
    if rotate_k:
        ks = mha_course.apply_rope(ks, pos, layout=layout)
    return qs @ ks.T * scale


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


def _dropout(weights, p, seed, training, factor=None, keep_p=False, always=False):
    """05.6 forbids mha_course.dropout; the keywords make the wrong ones."""
    if not training and not always:
        return weights
    draw = np.random.default_rng(seed).random(weights.shape)
    keep = draw < p if keep_p else draw >= p
    scale = 1 / (1 - p) if factor is None else factor(p)
    return np.where(keep, weights * scale, 0.0)


CORRECT_05 = {
    "05.1": ("check_sinusoidal_positions", _positional_encoding),
    "05.2": ("check_rope_interleaved", _rope_interleaved),
    "05.3": ("check_rope_score_table", _score_table),
    "05.4": ("check_encoder_decoder_masks", _masks),
    "05.5": ("check_padded_heads_attention", _padded_heads),
    "05.6": ("check_attention_dropout", _dropout),
}


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


def _toeplitz_broken(q, k, P, layout):
    table = _score_table(q, k, P, layout)
    table[0, 0] += 0.5  # one entry off its diagonal's value: no known mistake, a broken property
    return table


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
    ("table-transposed", "check_rope_score_table",
     lambda q, k, P, layout: _score_table(q, k, P, layout).T, r"rows and columns swapped"),
    ("table-scaled", "check_rope_score_table",
     lambda q, k, P, layout: _score_table(q, k, P, layout, scale=1 / np.sqrt(len(q))),
     r"divided by √d"),
    ("table-k-not-rotated", "check_rope_score_table",
     lambda q, k, P, layout: _score_table(q, k, P, layout, rotate_k=False),
     r"only q is rotated"),
    ("table-other-layout", "check_rope_score_table",
     lambda q, k, P, layout: _score_table(q, k, P, "interleaved" if layout == "half" else "half"),
     r"the other layout"),
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
    ("dropout-one-over-p", "check_attention_dropout",
     lambda w, p, s, t: _dropout(w, p, s, t, factor=lambda p: 1 / p),
     r"scaled the survivors by 1/p; it is 1/\(1-p\).*rasbt/LLMs-from-scratch#431"),
    ("dropout-unscaled", "check_attention_dropout",
     lambda w, p, s, t: _dropout(w, p, s, t, factor=lambda p: 1.0), r"survivors are not scaled"),
    ("dropout-keeps-with-p", "check_attention_dropout",
     lambda w, p, s, t: _dropout(w, p, s, t, keep_p=True), r"kept each weight with probability p"),
    ("dropout-in-eval", "check_attention_dropout",
     lambda w, p, s, t: _dropout(w, p, s, t, always=True),
     r"in evaluation \(training=False\) dropout does nothing: return the weights unchanged"),
    ("dropout-calls-the-package", "check_attention_dropout",
     lambda w, p, s, t: mha_course.dropout(w, p, rng=s, training=t),
     r"asks you to write the dropout yourself; your answer calls mha_course\.dropout"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        getattr(checks, check)(wrong)
    assert str(info.value).startswith("Exercise 05.")
    assert capsys.readouterr().out == "", "a failing check prints nothing"


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


def test_a_table_that_is_not_constant_along_a_diagonal_is_reported_as_such():
    with pytest.raises(CheckFailed, match=r"not constant along the diagonal n - m = 0"):
        checks.check_rope_score_table(_toeplitz_broken)


@pytest.mark.parametrize("check", ["check_sinusoidal_positions", "check_rope_interleaved",
                                   "check_rope_score_table"])
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
