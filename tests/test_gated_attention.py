"""Gated and differential attention (lesson 13): the gate against a direct computation and
PyTorch, the differential map's softmaxes (against two torch SDPAs:
``tests/test_torch_parity.py``), the paper's lambda_init, and the
costs against counts by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_course import causal_mask, softmax
from mha_course.variants.gated_attention import (
    diff_lambda,
    differential_attention,
    differential_cost,
    gate_cost,
    gated_heads,
    lambda_init,
)


@pytest.mark.parametrize("kind", ["headwise", "elementwise"])
def test_gated_heads_multiply_each_head_by_a_sigmoid_of_the_input(kind, rng):
    B, h, T, d_v, d_model = 2, 3, 5, 4, 7
    o, a = rng.normal(size=(B, h, T, d_v)), rng.normal(size=(B, T, d_model))
    W = rng.normal(size=(d_model, h if kind == "headwise" else h * d_v))
    gated, gate = gated_heads(o, a, W, kind)
    for b in range(B):
        for i in range(h):
            for t in range(T):
                z = a[b, t] @ W
                g = (1 / (1 + np.exp(-z[i])) if kind == "headwise"
                     else 1 / (1 + np.exp(-z[i * d_v:(i + 1) * d_v])))
                np.testing.assert_allclose(gated[b, i, t], o[b, i, t] * g, rtol=1e-12)
    assert ((gate > 0) & (gate < 1)).all()


def test_a_gate_of_the_wrong_width_is_a_named_error(rng):
    with pytest.raises(ValueError, match="gated_heads: W_gate has shape"):
        gated_heads(np.ones((2, 3, 4)), np.ones((3, 5)), np.ones((5, 3)))


def test_lambda_init_is_the_papers_schedule():
    assert lambda_init(1) == pytest.approx(0.2)
    assert lambda_init(2) == pytest.approx(0.8 - 0.6 * math.exp(-0.3))
    assert lambda_init(40) == pytest.approx(0.8, abs=1e-4)
    z = np.full(3, 0.1)
    assert diff_lambda(z, z, np.zeros(3), np.zeros(3), 0.5) == pytest.approx(
        math.exp(0.03) - 1 + 0.5)


def test_differential_maps_are_softmaxes_and_each_row_keeps_one_minus_lambda(rng):
    # the output against two torch SDPAs: tests/test_torch_parity.py's gold table
    h, T, S, d, d_v = 3, 4, 6, 5, 7
    q1, q2 = rng.normal(size=(2, h, T, d))
    k1, k2 = rng.normal(size=(2, h, S, d))
    v = rng.normal(size=(h, S, d_v))
    lam = rng.uniform(0.1, 0.9, size=h)
    mask = causal_mask(T, S)
    _, w, (w1, w2) = differential_attention(q1, k1, q2, k2, v, lam, mask, lam_init=0.3)
    np.testing.assert_allclose(w.sum(-1), np.broadcast_to(1 - lam[:, None], (h, T)), rtol=1e-12)
    np.testing.assert_allclose(w1, softmax(q1 @ np.swapaxes(k1, -1, -2) / math.sqrt(d),
                                           mask=mask), rtol=1e-12)
    np.testing.assert_allclose(w2, softmax(q2 @ np.swapaxes(k2, -1, -2) / math.sqrt(d),
                                           mask=mask), rtol=1e-12)


def test_equal_maps_cancel_to_one_minus_lambda(rng):
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    out, w, (w1, _) = differential_attention(q, k, q, k, v, 0.25)
    np.testing.assert_allclose(w, 0.75 * w1, rtol=1e-12)


def test_the_costs_are_the_counts_by_hand():
    c = gate_cost(64, 4, 16, 128)
    assert c == {"params": 256, "flops": 2 * 128 * 64 * 4 + 128 * 4 * 16,
                 "layer_params": 4 * 64 * 64}
    assert gate_cost(64, 4, 16, 128, "elementwise")["params"] == 64 * 64
    d = differential_cost(10, 12, 8, 16)
    assert d["ordinary"] == 2 * 10 * 12 * 16 + 2 * 10 * 12 * 16
    assert d["differential"] - d["ordinary"] == 2 * 10 * 12
