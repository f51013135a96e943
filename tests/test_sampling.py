"""Sampling: greedy, temperature, top-k, top-p, and the seeded draw; none changes its input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course.serving.sampling import (
    apply_temperature,
    greedy,
    next_token,
    sample,
    top_k_filter,
    top_p_filter,
)
from mha_course.softmax import softmax

LOGITS = np.log(np.array([[0.05, 0.5, 0.15, 0.3], [0.25, 0.25, 0.25, 0.25]]))


def test_greedy_and_temperature():
    assert greedy(LOGITS).tolist() == [1, 0]
    sharp = softmax(apply_temperature(LOGITS[0], 0.5))
    flat = softmax(apply_temperature(LOGITS[0], 2.0))
    assert sharp.max() > 0.5 > flat.max()
    # temperature divides the logits: dividing the probabilities would change nothing
    np.testing.assert_allclose(softmax(np.log(softmax(LOGITS[0]) / 0.5)), softmax(LOGITS[0]))
    with pytest.raises(ValueError, match="temperature=0 must be a positive number"):
        apply_temperature(LOGITS, 0)


def test_top_k_keeps_the_k_largest_and_ties():
    kept = np.isfinite(top_k_filter(LOGITS, 2))
    assert kept[0].tolist() == [False, True, False, True]
    assert kept[1].all()  # four-way tie with the 2nd largest: all kept
    assert np.isfinite(top_k_filter(LOGITS, 10)).all()
    with pytest.raises(ValueError, match="k=0 must be an integer >= 1"):
        top_k_filter(LOGITS, 0)


@pytest.mark.parametrize(("p", "kept"), [(0.49, [1]), (0.51, [1, 3]), (0.79, [1, 3]),
                                         (0.81, [1, 2, 3]), (1.0, [0, 1, 2, 3]),
                                         (0.01, [1])])
def test_top_p_keeps_the_token_that_crosses_p(p, kept):
    got = np.flatnonzero(np.isfinite(top_p_filter(LOGITS[0], p))).tolist()
    assert got == kept


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.floats(0.05, 1.0), st.integers(0, 2**31 - 1))
def test_top_p_is_the_smallest_set_with_mass_at_least_p(V, p, seed):
    logits = np.random.default_rng(seed).normal(size=V) * 2
    probs = softmax(logits)
    kept = np.isfinite(top_p_filter(logits, p))
    assert probs[kept].sum() >= p - 1e-12  # enough mass
    # minimal: without its least probable token the set falls short of p
    smallest = np.flatnonzero(kept)[np.argmin(probs[kept])]
    assert kept.sum() == 1 or probs[kept].sum() - probs[smallest] < p
    # and it holds the most probable tokens
    assert probs[kept].min() >= probs[~kept].max(initial=0.0)


def test_filters_do_not_change_their_input():
    logits = LOGITS.copy()
    for f in (lambda x: top_k_filter(x, 1), lambda x: top_p_filter(x, 0.5),
              lambda x: apply_temperature(x, 2.0), greedy):
        f(logits)
    np.testing.assert_array_equal(logits, LOGITS)


def test_sample_is_seeded_and_follows_the_distribution():
    logits = np.broadcast_to(LOGITS[0], (20000, 4))
    ids = sample(logits, rng=0)
    np.testing.assert_array_equal(ids, sample(logits, rng=0))
    freq = np.bincount(ids, minlength=4) / len(ids)
    np.testing.assert_allclose(freq, [0.05, 0.5, 0.15, 0.3], atol=0.015)
    # a filtered token is never drawn
    assert not np.isin(sample(np.broadcast_to(top_k_filter(LOGITS[0], 2), (5000, 4)), 1),
                       [0, 2]).any()


def test_next_token_composes_in_order():
    assert next_token(LOGITS, temperature=0).tolist() == [1, 0]
    assert next_token(LOGITS, top_k=1, rng=3).tolist()[0] == 1
    rng = np.random.default_rng(5)
    assert next_token(LOGITS[0], temperature=0.7, top_p=0.9, rng=rng).shape == ()
    with pytest.raises(ValueError, match="temperature=-1 must be a number >= 0"):
        next_token(LOGITS, temperature=-1)
    with pytest.raises(ValueError, match="p=1.5"):
        next_token(LOGITS, top_p=1.5)
