"""Learned sinks and StreamingLLM's mask (lesson 13): the sink softmax equals gpt-oss's
reference (an extra column, softmaxed, dropped) and the closed form; rows sum to 1 - p_sink; a
fully masked row goes all to the sink with output 0; the backward against central differences
(and PyTorch autograd: ``tests/test_torch_parity.py``); ``streaming_mask`` against its
definition."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import causal_mask, sliding_window_mask, softmax
from mha_course.variants.sinks import (
    sink_attention,
    softmax_with_sink,
    softmax_with_sink_backward,
    streaming_mask,
)


def reference(scores, sink, mask=None):
    """gpt-oss's sdpa: concatenate the sink column, softmax, drop the column."""
    col = np.broadcast_to(np.asarray(sink)[:, None, None], scores.shape[:-1] + (1,))
    full_mask = None if mask is None else np.concatenate(
        [np.broadcast_to(mask, scores.shape), np.ones(col.shape, bool)], axis=-1)
    w = softmax(np.concatenate([scores, col], axis=-1), mask=full_mask)
    return w[..., :-1], w[..., -1]


def test_sink_softmax_equals_the_extra_column_and_the_closed_form(rng):
    s = rng.normal(scale=3.0, size=(2, 3, 4, 6))  # (B, h, T, S)
    sink = rng.normal(size=3)
    w, p = softmax_with_sink(s, sink, causal_mask(4, 6))
    w_ref, p_ref = reference(s, sink, causal_mask(4, 6))
    np.testing.assert_allclose(w, w_ref, rtol=1e-12)
    np.testing.assert_allclose(p, p_ref, rtol=1e-12)
    e = np.exp(np.where(causal_mask(4, 6), s, -np.inf))
    closed = e / (e.sum(-1, keepdims=True) + np.exp(sink)[:, None, None])
    np.testing.assert_allclose(w, closed, rtol=1e-12)
    np.testing.assert_allclose(w.sum(-1), 1 - p, rtol=1e-12)


def test_huge_scores_and_sinks_do_not_overflow():
    w, p = softmax_with_sink(np.array([[[1000.0, 999.0]]]), np.array([1001.0]))
    assert np.isfinite(w).all() and p[0, 0] == pytest.approx(1 / (1 + np.exp(-1) + np.exp(-2)))


def test_a_fully_masked_row_gives_everything_to_the_sink_and_outputs_zero(rng):
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 6))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    out, w, p = sink_attention(q, k, v, np.array([0.5, -2.0]), mask)
    assert np.array_equal(out[:, 1], np.zeros((2, 6))) and np.allclose(p[:, 1], 1.0)
    assert not np.isnan(out).any()


def test_a_very_negative_sink_is_the_plain_softmax(rng):
    s = rng.normal(size=(2, 3, 5))
    w, p = softmax_with_sink(s, np.array([-200.0, -200.0]))
    np.testing.assert_allclose(w, softmax(s), rtol=1e-12)
    assert p.max() < 1e-80


def test_sink_attention_output_ignores_the_sink_and_matches_sdpa_scaled(rng):
    q, k, v = rng.normal(size=(3, 4, 8)), rng.normal(size=(3, 6, 8)), rng.normal(size=(3, 6, 5))
    sink = np.array([0.0, 1.0, -1.0])
    out, w, p = sink_attention(q, k, v, sink)
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    w_ref, _ = reference(scores, sink)
    np.testing.assert_allclose(out, w_ref @ v, rtol=1e-12)


def test_sink_backward_matches_central_differences(rng):
    s = rng.normal(size=(2, 3, 4))  # (h, T, S)
    sink = rng.normal(size=2)
    g = rng.normal(size=s.shape)
    w, p = softmax_with_sink(s, sink)
    ds, dsink = softmax_with_sink_backward(g, w, p)
    eps = 1e-6
    for idx in [(0, 0, 0), (1, 2, 3), (0, 1, 2)]:
        sp, sm = s.copy(), s.copy()
        sp[idx] += eps
        sm[idx] -= eps
        num = ((softmax_with_sink(sp, sink)[0] - softmax_with_sink(sm, sink)[0]) * g).sum()
        assert ds[idx] == pytest.approx(num / (2 * eps), rel=1e-6, abs=1e-10)
    for i in range(2):
        up, dn = sink.copy(), sink.copy()
        up[i] += eps
        dn[i] -= eps
        num = ((softmax_with_sink(s, up)[0] - softmax_with_sink(s, dn)[0]) * g).sum()
        assert dsink[i] == pytest.approx(num / (2 * eps), rel=1e-6)


@pytest.mark.parametrize(("T", "n_sink", "window", "S"), [(6, 1, 2, None), (4, 4, 3, 10),
                                                          (5, 0, 2, None), (3, 2, 1, 7)])
def test_streaming_mask_is_sinks_or_window_and_causal(T, n_sink, window, S):
    m = streaming_mask(T, n_sink, window, S)
    S_ = T if S is None else S
    sink_cols = (np.arange(S_) < n_sink)[None, :] & causal_mask(T, S_)
    assert np.array_equal(m, sliding_window_mask(T, window, S_) | sink_cols)
    assert not (m & ~causal_mask(T, S_)).any()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: softmax_with_sink(np.ones((2, 3, 4)), np.ones(3)), r"sink has shape \(3,\)"),
    (lambda: softmax_with_sink(np.ones((2, 3, 4)), np.array([np.inf, 0.0])), "non-finite"),
    (lambda: softmax_with_sink(np.ones(4), 0.0), r"expected \(\.\.\., T, S\)"),
    (lambda: streaming_mask(4, -1, 2), "n_sink=-1"),
])
def test_bad_input_is_a_named_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
