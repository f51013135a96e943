"""Reading heads on text: the patterns' keys on known strings, scores of heads built to do one
job, the uniform baseline, repeated windows, copy losses and ablations."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.models.gpt import GPT, GPTConfig
from mha_course.models.text_heads import (
    TEXT_PATTERNS,
    ablation_losses,
    copy_losses,
    per_position_losses,
    repeat_scores,
    repeated_windows,
    text_pattern_keys,
    text_pattern_scores,
    uniform_baseline,
)

TEXT = "ALL:\nYes.\n\nKING:\nNo, sir. Go\nnow"


def test_keys_of_each_pattern_on_a_known_string():
    k = {p: text_pattern_keys(TEXT, p) for p in TEXT_PATTERNS}
    t = TEXT.index("sir")
    assert k["previous char"][t] == t - 1 and k["current char"][t] == t
    assert k["first position"][t] == 0 and k["first position"][0] == -1
    assert k["word start"][t + 2] == t and k["word start"][t] == -1  # not counted at the start
    line = TEXT.index("No")
    assert k["line start"][t] == line and k["line start"][line] == -1
    assert k["last newline"][t] == line - 1
    king = TEXT.index("KING")
    # inside KING's speech every position points at the K of KING; ALL's name line starts at
    # position 0, which could have been cut by the window, so it is not counted
    assert (k["speaker name"][line : TEXT.index("now") + 3] == king).all()
    assert (k["speaker name"][: king] == -1).all()
    for p in TEXT_PATTERNS:  # a key never comes after its query
        assert (k[p] <= np.arange(len(TEXT))).all(), p


def test_a_head_built_for_a_pattern_scores_one_and_uniform_scores_the_baseline():
    T = len(TEXT)
    texts = [TEXT, TEXT]
    for pattern in ("previous char", "line start", "speaker name"):
        keys = text_pattern_keys(TEXT, pattern)
        built = np.zeros((T, T))
        built[np.arange(T), np.where(keys >= 0, keys, 0)] = 1.0
        uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
        weights = [np.stack([built, uniform])[None].repeat(2, axis=0)]  # (B, h=2, T, T)
        scores = text_pattern_scores(weights, texts)[pattern]  # (1 layer, 2 heads)
        assert scores[0, 0] == pytest.approx(1.0)
        assert scores[0, 1] == pytest.approx(uniform_baseline(texts)[pattern])


def test_repeated_windows_and_repeat_scores():
    ids = np.arange(100)
    x, y = repeated_windows(ids, 8, n=3)
    np.testing.assert_array_equal(x[0], [0, 1, 2, 3, 0, 1, 2, 3])
    np.testing.assert_array_equal(y[1], [5, 6, 7, 4, 5, 6, 7, 4])
    T = 8
    induction = np.zeros((T, T))
    for t in range(T):
        induction[t, t - 3 if t >= 4 else t] = 1.0  # t - T/2 + 1
    w = [np.stack([induction, np.eye(T)])[None]]
    s = repeat_scores(w, T)
    assert s["induction"][0].tolist() == [1.0, 0.0] and s["duplicate"][0].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="T=7 must be even"):
        repeated_windows(ids, 7, 1)


def small():
    return GPT(GPTConfig(vocab_size=11, d_model=16, n_layers=2, h=4, n_kv_heads=2,
                         context_length=16), rng=0)


def test_copy_losses_compare_the_same_characters():
    model = small()
    x, y = repeated_windows(np.random.default_rng(0).integers(0, 11, 200), 16, n=4)
    losses = per_position_losses(model, x, y)
    got = copy_losses(model, x, y)
    assert got["first"] == pytest.approx(losses[:, :7].mean())
    assert got["second"] == pytest.approx(losses[:, 8:15].mean())
    np.testing.assert_array_equal(y[:, :7], y[:, 8:15])  # the same targets in both copies


def test_ablation_losses_switch_off_one_head_at_a_time():
    model = small()
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 11, (3, 10)), rng.integers(0, 11, (3, 10))
    full, rise = ablation_losses(model, x, y)
    assert full == pytest.approx(model.loss(x, y))
    mask = np.ones((2, 4))
    mask[1, 2] = 0.0
    assert rise[1, 2] == pytest.approx(model.loss(x, y, head_mask=mask) - full)
    assert rise.shape == (2, 4) and np.abs(rise).max() > 0
