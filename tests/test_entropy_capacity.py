"""Entropy, log-n scaling and the low-rank bottleneck (lesson 13): entropy (against
torch.distributions in ``tests/test_torch_parity.py``), log n for uniform rows, Qwen's log-n
factor, the best rank-r fit exact at full rank, and the heads' mixture fit improving."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import softmax
from mha_course.models.head_capacity import best_rank_fit, fit_heads, total_variation
from mha_course.variants.entropy import attention_entropy, logn_scale


def test_entropy_of_uniform_and_one_hot_rows():
    for n in (1, 5, 64):
        assert attention_entropy(np.full(n, 1 / n)) == pytest.approx(np.log(n))
    assert attention_entropy(np.eye(4)).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="attention_entropy: weights holds a negative"):
        attention_entropy(np.array([0.5, -0.1]))


def test_logn_scale_is_log_n_over_log_n_train_beyond_the_trained_length():
    n = np.array([1, 100, 512, 513, 4096])
    np.testing.assert_allclose(logn_scale(n, 512), [1, 1, 1, np.log(513) / np.log(512),
                                                    np.log(4096) / np.log(512)])
    with pytest.raises(ValueError, match="logn_scale: n has dtype"):
        logn_scale(np.array([1.5]), 512)


def test_best_rank_fit_is_exact_at_full_rank_and_improves_with_rank(rng):
    p = softmax(rng.normal(scale=2.0, size=(8, 10)))
    np.testing.assert_allclose(best_rank_fit(p, 8), p, rtol=1e-8)
    errs = [total_variation(best_rank_fit(p, r), p).mean() for r in (1, 3, 6)]
    assert errs[0] > errs[1] > errs[2]


def test_fit_heads_lowers_the_kl_and_beats_one_head_on_an_identity_target():
    n = 8
    p = np.full((n, n), 0.02 / (n - 1))
    np.fill_diagonal(p, 0.98)
    p /= p.sum(-1, keepdims=True)
    _, one = fit_heads(p, 1, 1, steps=300, rng=0)
    _, four = fit_heads(p, 4, 1, steps=300, rng=0)
    assert one[-1] < one[0] and four[-1] < four[0]
    assert four[-1] < one[-1]
