"""Pattern scores and ablations of lesson 08 (``mha_course.models.specialisation``)."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.models.specialisation import (
    PATTERNS,
    ablation_table,
    pattern_keys,
    pattern_score,
    pattern_scores,
)
from mha_course.models.tasks import encode, make_batch
from mha_course.models.tiny_model import TinyTransformer

COPY, REVERSE = encode("dkfa>dkfa.."), encode("dkfa<afkd..")  # n = 4, T = 11

# For each pattern, the key of every query t of the copy and the reverse example (-1: not counted)
KEYS = {
    "previous-token": ([-1, 0, 1, 2, 3, -1, -1, -1, -1, -1, -1],) * 2,
    "diagonal": ([-1, 1, 2, 3, 4, 5, 6, 7, 8, -1, -1],) * 2,
    "first-token": ([-1, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1],) * 2,
    # answer queries 5..7 hold d, k, f (copy) and a, f, k (reverse): their earlier occurrences
    "duplicate-token": ([-1] * 5 + [0, 1, 2] + [-1] * 3, [-1] * 5 + [3, 2, 1] + [-1] * 3),
    "induction": ([-1] * 5 + [1, 2, 3] + [-1] * 3, [-1] * 5 + [4, 3, 2] + [-1] * 3),
    "anti-diagonal": ([-1] * 4 + [3, 2, 1, 0] + [-1] * 3,) * 2,
}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_keys_on_a_copy_and_a_reverse_example(pattern):
    tokens, lengths = np.stack([COPY, REVERSE]), np.array([4, 4])
    np.testing.assert_array_equal(pattern_keys(tokens, lengths, pattern), KEYS[pattern])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_head_that_does_exactly_the_pattern_scores_one(pattern):
    batch = make_batch("mixed", 16, rng=3, n_max=6)
    keys = pattern_keys(batch.tokens, batch.lengths, pattern)
    B, T = batch.tokens.shape
    weights = np.zeros((B, 2, T, T))
    weights[:, :, np.arange(T), np.arange(T)] = 1.0  # uncounted queries: on themselves
    b, t = np.nonzero(keys >= 0)
    weights[b, 0, t, :] = 0.0
    weights[b, 0, t, keys[b, t]] = 1.0  # head 0 does the pattern; head 1 stays on itself
    scores = pattern_scores(weights, batch.tokens, batch.lengths)
    assert scores[pattern][0] == 1.0
    if pattern != "diagonal":
        assert scores[pattern][1] < 1.0


def test_uniform_causal_heads_score_the_mean_of_one_over_the_visible_keys():
    tokens, lengths = COPY[None], np.array([4])
    T = len(COPY)
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # (T, T)
    scores = pattern_scores(uniform[None, None], tokens, lengths)
    assert scores["previous-token"][0] == pytest.approx(np.mean(1 / np.arange(2, 6)))
    assert scores["first-token"][0] == pytest.approx(np.mean(1 / np.arange(2, 10)))


def test_pattern_score_is_nan_when_no_query_counts_and_refuses_bad_shapes():
    w = np.full((1, 3, 4, 4), 0.25)
    assert np.isnan(pattern_score(w, np.full((1, 4), -1))).all()
    with pytest.raises(ValueError, match=r"pattern_score: weights \(1, 3, 4, 4\) and keys "
                                         r"\(1, 3\); expected \(B, h, T, S\) and \(B, T\)"):
        pattern_score(w, np.zeros((1, 3), dtype=int))
    with pytest.raises(ValueError, match=r"pattern_score: keys holds 4; the weights have S=4"):
        pattern_score(w, np.full((1, 4), 4))
    with pytest.raises(ValueError, match=r"pattern_keys: pattern='next-token' is not one of"):
        pattern_keys(COPY[None], np.array([4]), "next-token")
    with pytest.raises(ValueError, match=r"pattern_scores: weights has shape \(3, 11, 11\); "
                                         r"expected \(B, h, T, S\)"):
        pattern_scores(np.zeros((3, 11, 11)), COPY[None], np.array([4]))


def test_ablation_table_is_the_accuracy_with_each_head_off():
    model = TinyTransformer(19, 9, d_model=8, h=2, n_layers=2, rng=1)
    batch = make_batch("copy", 8, rng=0, n_max=4)
    table = ablation_table(model, batch)
    assert table.shape == (2, 2)
    for layer in range(2):
        for head in range(2):
            want = model.evaluate(batch, ablate=[(layer, head)])["accuracy"]
            assert table[layer, head] == want
