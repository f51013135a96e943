"""Soft-capping and QK-norm (lesson 13): the formulas against central differences (and PyTorch:
``tests/test_torch_parity.py``),
the cap's bound, the refusal of a masked (infinite) logit, QK-norm's fixed norms whatever the
projections' scale, and ``logit_stats`` against a direct computation."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import causal_mask, softmax
from mha_course.variants.logit_control import (
    logit_stats,
    qk_norm,
    qk_norm_backward,
    soft_cap,
    soft_cap_backward,
)


def test_soft_cap_is_bounded_odd_and_near_the_identity_for_small_logits(rng):
    x = rng.normal(scale=40.0, size=(3, 5, 7))
    y = soft_cap(x, 50.0)
    assert np.abs(y).max() < 50.0
    np.testing.assert_allclose(soft_cap(-x, 50.0), -y)
    small = rng.normal(scale=0.5, size=20)
    np.testing.assert_allclose(soft_cap(small, 50.0), small, atol=1e-4)
    assert soft_cap(np.float32([3.0]), 2.0).dtype == np.float32


def test_soft_cap_keeps_the_order_of_the_logits(rng):
    x = rng.normal(scale=100.0, size=50)
    assert np.array_equal(np.argsort(soft_cap(x, 30.0)), np.argsort(x))


def test_soft_cap_backward_matches_central_differences(rng):
    x, g = rng.normal(scale=20.0, size=(4, 6)), rng.normal(size=(4, 6))
    eps = 1e-6
    numeric = g * (soft_cap(x + eps, 10.0) - soft_cap(x - eps, 10.0)) / (2 * eps)
    np.testing.assert_allclose(soft_cap_backward(g, x, 10.0), numeric, rtol=1e-6, atol=1e-9)


def test_soft_cap_refuses_a_masked_logit_because_it_would_leak():
    scores = np.where(causal_mask(3), 1.0, -np.inf)
    with pytest.raises(ValueError, match="soft-cap the scores before masking"):
        soft_cap(scores, 50.0)
    # what capping after the mask would do: the masked logit becomes -cap, a real weight
    leaked = softmax(50.0 * np.tanh(np.array([1.0, -1e30]) / 50.0))
    assert leaked[1] > 0


@pytest.mark.parametrize("cap", [0.0, -1.0, np.inf, True, "50"])
def test_a_bad_cap_is_a_named_error(cap):
    with pytest.raises(ValueError, match="soft_cap: cap="):
        soft_cap(np.ones(3), cap)


def test_qk_norm_fixes_the_norm_whatever_the_scale_of_the_projection(rng):
    q = rng.normal(size=(2, 4, 5, 8))  # (B, h, T, d_k)
    w = rng.normal(size=8)
    for scale in (1.0, 10.0, 1e3):
        out = qk_norm(scale * q)
        np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.sqrt(8), rtol=1e-4)
        np.testing.assert_allclose(qk_norm(scale * q, w), out * w, rtol=1e-12)
    # per head: scaling one head's queries leaves every head's normalised queries unchanged
    q2 = q.copy()
    q2[:, 1] *= 100.0
    np.testing.assert_allclose(qk_norm(q2), qk_norm(q), rtol=1e-5)


def test_qk_norm_backward_matches_central_differences(rng):
    x, w, g = rng.normal(size=(3, 6)), rng.normal(size=6), rng.normal(size=(3, 6))
    dx, dw = qk_norm_backward(g, x, w)
    eps = 1e-6
    for i, j in [(0, 0), (1, 3), (2, 5)]:
        xp, xm = x.copy(), x.copy()
        xp[i, j] += eps
        xm[i, j] -= eps
        num = ((qk_norm(xp, w) - qk_norm(xm, w)) * g).sum() / (2 * eps)
        assert dx[i, j] == pytest.approx(num, rel=1e-6)
    wp, wm = w.copy(), w.copy()
    wp[2] += eps
    wm[2] -= eps
    assert dw[2] == pytest.approx(((qk_norm(x, wp) - qk_norm(x, wm)) * g).sum() / (2 * eps),
                                  rel=1e-6)


def test_logit_stats_equals_a_direct_computation(rng):
    s = rng.normal(scale=3.0, size=(2, 3, 5, 5))  # (B, h, T, S)
    m = causal_mask(5)
    stats = logit_stats(s, m)
    w = softmax(s, mask=m)
    ent = -(np.where(w > 0, w * np.log(np.where(w > 0, w, 1)), 0)).sum(-1)  # (B, h, T)
    np.testing.assert_allclose(stats["entropy"], ent.mean(axis=(0, 2)), rtol=1e-12)
    np.testing.assert_allclose(stats["max_logit"], np.where(m, s, -np.inf).max(axis=(0, 2, 3)))
    assert stats["max_logit"].shape == (3,)


def test_logit_stats_skips_fully_masked_rows(rng):
    s = rng.normal(size=(2, 4, 4))
    m = np.ones((4, 4), dtype=bool)
    m[0] = False
    stats = logit_stats(s, m)
    w = softmax(s, mask=m)[:, 1:]
    ent = -(w * np.log(w)).sum(-1).mean(axis=-1)
    np.testing.assert_allclose(stats["entropy"], ent, rtol=1e-12)
