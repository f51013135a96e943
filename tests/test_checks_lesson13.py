"""Lesson 13's exercise checks name each classic mistake.

The generic contract (a right answer passes with one stable line, the stub's
``NotImplementedError`` passes through as "not attempted", ``None`` and an unexpected
exception fail) is bound to lesson 13's right answers, :data:`CORRECT_12`, by
:class:`TestContract` here (``tests/check_contract.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from check_contract import CheckContract

import mha_course
from mha_course import checks, softmax
from mha_course.checks import CheckFailed, lesson13

# ------------------------------------------------------------------ correct implementations


def _capped(scores, mask, cap, kind="right"):
    if kind == "after_mask":
        return softmax(cap * np.tanh(np.where(mask, scores, -np.inf) / cap))
    capped = {"right": cap * np.tanh(scores / cap), "no_cap": scores,
              "no_factor": np.tanh(scores / cap), "clip": np.clip(scores, -cap, cap)}[kind]
    return softmax(capped, mask=mask)


def _sink(scores, sinks, kind="right"):
    col = np.broadcast_to(np.asarray(sinks)[:, None, None], scores.shape[:-1] + (1,))
    if kind == "renormalised":
        return softmax(scores)
    if kind == "linear_sink":
        return np.exp(scores) / (np.exp(scores).sum(-1, keepdims=True) + col)
    w = softmax(np.concatenate([scores, col], axis=-1))
    return w if kind == "kept_column" else w[..., :-1]


def _qk(x, h, gain, eps=1e-6, kind="right"):
    shape = x.shape
    if kind == "whole_row":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.tile(gain, h)
    heads = x.reshape(*shape[:-1], h, shape[-1] // h)
    axis = -3 if kind == "tokens" else -1
    if kind == "layer_norm":
        heads = heads - heads.mean(-1, keepdims=True)
    out = heads / np.sqrt((heads * heads).mean(axis, keepdims=True) + eps)
    return (out if kind == "no_gain" else out * gain).reshape(shape)


def _delta(S, k, v, beta, kind="right"):
    if kind == "linear":
        return S + beta * np.outer(k, v)
    if kind == "read_Sk":
        return S + beta * np.outer(k, v - S @ k)
    if kind == "beta_outside":
        return S + np.outer(k, beta * v - k @ S)
    if kind == "transposed":
        return (S + beta * np.outer(k, v - k @ S)).T
    return S + beta * np.outer(k, v - k @ S)


def _chunked(q, k, v, a, C, kind="right"):
    if kind == "whole_matrix":  # right numbers, but the whole (T, T) masked matrix at once
        g = np.cumprod(a)
        return (np.tril(g[:, None] / g[None, :]) * (q @ k.T)) @ v
    S = np.zeros((k.shape[1], v.shape[1]))
    out = []
    for s in range(0, len(k), C):
        qc, kc, vc, ac = q[s:s + C], k[s:s + C], v[s:s + C], a[s:s + C]
        g = np.cumprod(ac)
        mask = g[:, None] / g[None, :]
        if kind != "not_causal":
            mask = np.tril(mask, -1 if kind == "strict_mask" else 0)
        g_read = {"no_read_decay": np.ones_like(g), "late": g / ac[0]}.get(kind, g)
        w = np.ones_like(g) if kind == "no_key_decay" else g[-1] / g
        S_new = (1.0 if kind == "no_carry" else g[-1]) * S + kc.T @ (w[:, None] * vc)
        read = S_new if kind == "read_after_update" else S
        out.append((mask * (qc @ kc.T)) @ vc + g_read[:, None] * (qc @ read))
        S = S_new
    return np.concatenate(out)


def _bos(scores, t_min, kind="right"):
    T = scores.shape[-1]
    mask = np.tril(np.ones((T, T), dtype=bool))
    w = {"no_mask": lambda: softmax(scores), "wrong_axis": lambda: softmax(scores, axis=-2,
                                                                          mask=mask)
         }.get(kind, lambda: softmax(scores, mask=mask))()
    start = {"from_zero": 0, "off_by_one": t_min + 1}.get(kind, t_min)
    col = w[:, :, start:, 0]
    if kind == "no_batch_mean":
        return col.mean(axis=-1)
    return col.mean(axis=(0, 2))


CORRECT_12 = {
    "13.1": ("check_capped_weights", _capped),
    "13.2": ("check_sink_softmax", _sink),
    "13.3": ("check_qk_norm_fused", _qk),
    "13.4": ("check_delta_write", _delta),
    "13.5": ("check_chunked_scan", _chunked),
    "13.6": ("check_bos_mass", _bos),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson13, CORRECT_12


def _kind(f, kind):
    return lambda *a: f(*a, kind=kind)


MISTAKES = [
    ("cap-after-mask", "check_capped_weights", _kind(_capped, "after_mask"),
     r"the cap is applied after the mask"),
    ("cap-missing", "check_capped_weights", _kind(_capped, "no_cap"), r"the scores are not capped"),
    ("cap-no-factor", "check_capped_weights", _kind(_capped, "no_factor"),
     r"tanh\(s/c\) without the factor c"),
    ("cap-clip", "check_capped_weights", _kind(_capped, "clip"), r"a hard clip is not a soft cap"),
    ("cap-calls-the-package", "check_capped_weights",
     lambda s, m, c: softmax(mha_course.variants.logit_control.soft_cap(s, c), mask=m),
     r"asks you to write the cap yourself"),
    ("sink-renormalised", "check_sink_softmax", _kind(_sink, "renormalised"),
     r"dropped and the rest renormalised"),
    ("sink-linear", "check_sink_softmax", _kind(_sink, "linear_sink"), r"as sink, not exp\(sink\)"),
    ("sink-kept-column", "check_sink_softmax", _kind(_sink, "kept_column"),
     r"the sink's column is still there"),
    ("qk-whole-row", "check_qk_norm_fused", _kind(_qk, "whole_row"), r"OLMo 2's QK-norm"),
    ("qk-tokens", "check_qk_norm_fused", _kind(_qk, "tokens"), r"runs over the tokens"),
    ("qk-no-gain", "check_qk_norm_fused", _kind(_qk, "no_gain"), r"the gain is missing"),
    ("qk-layer-norm", "check_qk_norm_fused", _kind(_qk, "layer_norm"), r"that is LayerNorm"),
    ("delta-linear", "check_delta_write", _kind(_delta, "linear"), r"linear attention's write"),
    ("delta-read-Sk", "check_delta_write", _kind(_delta, "read_Sk"), r"the read is S k"),
    ("delta-beta-outside", "check_delta_write", _kind(_delta, "beta_outside"),
     r"beta scales the whole write"),
    ("delta-transposed", "check_delta_write", _kind(_delta, "transposed"),
     r"np.outer\(k, error\)"),
    ("scan-no-carry", "check_chunked_scan", _kind(_chunked, "no_carry"),
     r"the decay is not carried across the chunk boundary"),
    ("scan-no-read-decay", "check_chunked_scan", _kind(_chunked, "no_read_decay"),
     r"read without its decay to each query"),
    ("scan-decay-late", "check_chunked_scan", _kind(_chunked, "late"),
     r"starts one token late"),
    ("scan-no-key-decay", "check_chunked_scan", _kind(_chunked, "no_key_decay"),
     r"without their decay to the chunk's end"),
    ("scan-read-after-update", "check_chunked_scan", _kind(_chunked, "read_after_update"),
     r"updated with this chunk before it is read \(off by one chunk\)"),
    ("scan-not-causal", "check_chunked_scan", _kind(_chunked, "not_causal"),
     r"the intra-chunk mask is not causal"),
    ("scan-strict-mask", "check_chunked_scan", _kind(_chunked, "strict_mask"),
     r"leaves out its diagonal"),
    ("scan-whole-matrix", "check_chunked_scan", _kind(_chunked, "whole_matrix"),
     r"that is the whole masked matrix"),
    ("bos-no-mask", "check_bos_mass", _kind(_bos, "no_mask"), r"the causal mask is forgotten"),
    ("bos-wrong-axis", "check_bos_mass", _kind(_bos, "wrong_axis"),
     r"normalises over the wrong axis"),
    ("bos-counts-t0", "check_bos_mass", _kind(_bos, "from_zero"),
     r"the queries before t_min are counted: at t = 0"),
    ("bos-off-by-one", "check_bos_mass", _kind(_bos, "off_by_one"), r"off by one"),
    ("bos-no-batch-mean", "check_bos_mass", _kind(_bos, "no_batch_mean"),
     r"the mean over the examples is missing"),
    ("bos-calls-the-package", "check_bos_mass",
     lambda s, t: mha_course.models.phenomena.first_position_mass(
         [softmax(s, mask=np.tril(np.ones(s.shape[-2:], dtype=bool)))], t)[0],
     r"asks you to measure the mass yourself"),
    ("scan-calls-the-package", "check_chunked_scan",
     lambda q, k, v, a, C: mha_course.variants.ssd.ssd_chunked(q, k, v, a, C)[0],
     r"asks you to write the chunked scan yourself"),
]


@pytest.mark.parametrize(("name", "check", "fn", "match"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_named_mistake_is_recognised(name, check, fn, match):
    with pytest.raises(CheckFailed, match=match):
        getattr(checks, check)(fn)
