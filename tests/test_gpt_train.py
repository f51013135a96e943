"""Training the GPT on text: the schedule, repeated windows, windows opened by a BOS id, a short
seeded run that learns, the fast and readable steps giving the same run, evaluation over windows
that cover a split."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.models.corpus import eval_windows, random_windows
from mha_course.models.gpt import GPT, GPTConfig
from mha_course.models.gpt_train import (
    evaluate,
    learning_rate,
    open_with_bos,
    repeat_first_half,
    train_gpt,
)

CONFIG = GPTConfig(vocab_size=7, d_model=16, n_layers=1, h=2, context_length=16)
# a text a model can learn quickly: "abcdef" cycling with noise
DATA = np.random.default_rng(0).choice(7, size=3000, p=[0.05, 0.19, 0.19, 0.19, 0.19, 0.19,
                                                         0.0])
DATA[::2] = np.arange(len(DATA[::2])) % 6 + 1


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    lrs = [learning_rate(s, 200, 1.0, 20) for s in range(200)]
    assert lrs[0] == pytest.approx(0.05) and lrs[19] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[19:], lrs[20:], strict=False))
    assert lrs[-1] == pytest.approx(0.1)


@pytest.mark.parametrize("T", [8, 9])
def test_repeated_windows_repeat_their_first_half(T):
    x = np.arange(3 * T).reshape(3, T)
    y = x + 1
    rx, ry = repeat_first_half(x, y, 1.0, rng=0)
    half = T // 2
    np.testing.assert_array_equal(rx[:, half : 2 * half], x[:, :half])
    np.testing.assert_array_equal(ry[:, :-1], rx[:, 1:])  # targets are still the next token
    same, _ = repeat_first_half(x, y, 0.0, rng=0)
    np.testing.assert_array_equal(same, x)


def test_repeated_spans_of_random_lengths_repeat_then_go_on_with_the_text():
    T = 16
    x = np.arange(5 * T).reshape(5, T) * 3
    y = x + 3  # the stretch of each row: x then one more id
    rx, ry = repeat_first_half(x, y, 1.0, rng=4, lengths=(3, 8))
    stretch = np.concatenate([x, y[:, -1:]], axis=1)
    found = set()
    for b in range(5):
        L = next(L for L in range(3, 9) if (rx[b, L : 2 * L] == x[b, :L]).all()
                 and (rx[b, L:] == stretch[b, : T - L]).all())
        found.add(L)
        np.testing.assert_array_equal(ry[b, :-1], rx[b, 1:])  # still the next id
    assert len(found) > 1  # the distance between the copies changes from row to row
    np.testing.assert_array_equal(repeat_first_half(x, y, 0.0, rng=4, lengths=(3, 8))[0], x)
    with pytest.raises(ValueError, match=r"repeat_lengths=\(2, 9\) must be \(lo, hi\)"):
        train_gpt(GPT(CONFIG, rng=0), DATA, steps=1, repeat_fraction=0.5, repeat_lengths=(2, 9),
                  progress=False)


def test_bos_opens_every_window_after_the_repeat_so_the_repeated_span_stays():
    T, bos = 8, 99
    x = np.arange(3 * T).reshape(3, T)
    rx, ry = repeat_first_half(x, x + 1, 1.0, rng=0)
    bx, by = open_with_bos(rx, ry, bos)
    assert bx.shape == by.shape == (3, T) and (bx[:, 0] == bos).all()
    np.testing.assert_array_equal(bx[:, 1:], rx[:, :-1])  # the window shifted by one
    np.testing.assert_array_equal(by, rx)  # the first query predicts the window's first id
    # the span and its copy (T - 1 ids after BOS: the copy loses its last id, never its start)
    np.testing.assert_array_equal(bx[:, 1 : T // 2], bx[:, 1 + T // 2 : T])
    np.testing.assert_array_equal(by[:, :-1], bx[:, 1:])  # targets are still the next id


def test_a_bos_run_trains_on_bos_opened_windows_and_none_changes_nothing():
    model = GPT(CONFIG, rng=0)
    history = train_gpt(model, DATA, steps=1, batch_size=4, seed=5, bos_id=0, progress=False)
    x, y = random_windows(DATA, 4, CONFIG.context_length, np.random.default_rng(5))
    bx, by = open_with_bos(x, y, 0)
    assert history.loss[0] == pytest.approx(GPT(CONFIG, rng=0).loss(bx, by), rel=1e-9)
    plain = train_gpt(GPT(CONFIG, rng=0), DATA, steps=3, batch_size=4, seed=5, progress=False)
    none = train_gpt(GPT(CONFIG, rng=0), DATA, steps=3, batch_size=4, seed=5, bos_id=None,
                     progress=False)
    np.testing.assert_array_equal(plain.loss, none.loss)
    assert plain.loss[0] == pytest.approx(GPT(CONFIG, rng=0).loss(x, y), rel=1e-9)
    assert plain.loss[0] != pytest.approx(history.loss[0], rel=1e-6)


@pytest.mark.parametrize("bos_id", [-1, 7, 2.0, "0"])
def test_a_bos_id_outside_the_vocabulary_is_refused(bos_id):
    with pytest.raises(ValueError, match=r"train_gpt: bos_id=.* must be an id in \[0, "
                                         r"vocab_size=7\)"):
        train_gpt(GPT(CONFIG, rng=0), DATA, steps=1, bos_id=bos_id, progress=False)


def test_a_short_seeded_run_learns_and_repeats_exactly():
    losses = []
    for _ in range(2):
        model = GPT(CONFIG, rng=0, dtype=np.float32)
        history = train_gpt(model, DATA, steps=60, batch_size=8, lr=1e-2, seed=3,
                            progress=False, val_ids=DATA[:200], eval_every=30)
        losses.append(history.loss)
    np.testing.assert_array_equal(losses[0], losses[1])
    assert len(losses[0]) == 60  # one loss per step: lesson 09 prints the steps it ran from it
    assert losses[0][-10:].mean() < losses[0][:5].mean() - 0.3
    assert history.eval_steps.tolist() == [30, 60] and history.seconds > 0


def test_fast_and_readable_steps_train_the_same_model():
    runs = []
    for fast in (True, False):
        model = GPT(CONFIG, rng=1)
        train_gpt(model, DATA, steps=5, batch_size=4, seed=0, progress=False, fast=fast)
        runs.append(model)
    for name, p in runs[0].parameters().items():
        np.testing.assert_allclose(p, runs[1].parameters()[name], atol=1e-10, err_msg=name)


def test_evaluate_is_the_mean_loss_over_covering_windows():
    model = GPT(CONFIG, rng=2)
    x, y = eval_windows(DATA[:500], 16)
    assert evaluate(model, DATA[:500], 16, batch_size=7) == pytest.approx(model.loss(x, y))


def test_divergence_and_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="steps=0 must be an integer >= 1"):
        train_gpt(GPT(CONFIG, rng=0), DATA, steps=0)
    with pytest.raises(ValueError, match="lr=-1"):
        train_gpt(GPT(CONFIG, rng=0), DATA, steps=1, lr=-1)
