"""The synthetic tasks of lesson 08 (``mha_course.models.tasks``): what a batch holds, and bad
input."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.models.tasks import DELIMITERS, PAD_ID, SYMBOLS, VOCAB, decode, encode, make_batch


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_answer_is_the_first_half_copied_or_reversed_after_its_delimiter(task):
    batch = make_batch(task, 50, rng=1, n_min=2, n_max=9)
    assert batch.tokens.shape == (50, 19)
    for tokens, n, name in zip(batch.tokens, batch.lengths, batch.tasks, strict=True):
        text = decode(tokens)
        first, delimiter, answer = text[:n], text[n], text[n + 1 : 2 * n + 1]
        assert name == task and delimiter == DELIMITERS[task]
        assert answer == (first if task == "copy" else first[::-1])
        assert set(text[2 * n + 1 :]) <= {"."}
        assert len(set(first)) == n and set(first) <= set(SYMBOLS)  # distinct symbols
        assert 2 <= n <= 9


def test_targets_are_the_next_tokens_and_only_the_answer_is_scored():
    batch = make_batch("mixed", 30, rng=2, n_max=6)
    np.testing.assert_array_equal(batch.targets[:, :-1], batch.tokens[:, 1:])
    assert np.all(batch.targets[:, -1] == PAD_ID)
    for weights, n in zip(batch.weights, batch.lengths, strict=True):
        # the delimiter (position n) predicts the first answer token; the last one predicts
        # nothing: positions n .. 2n-1 are scored
        np.testing.assert_array_equal(np.flatnonzero(weights), np.arange(n, 2 * n))


def test_mixed_draws_both_tasks_and_a_seed_gives_the_same_batch():
    a, b = make_batch("mixed", 200, rng=7), make_batch("mixed", 200, rng=7)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert set(a.tasks) == {"copy", "reverse"}
    assert not np.array_equal(a.tokens, make_batch("mixed", 200, rng=8).tokens)
    sub = a.select(a.tasks == "reverse")
    assert len(sub) == int((a.tasks == "reverse").sum()) and set(sub.tasks) == {"reverse"}


def test_encode_and_decode_are_inverse():
    text = "dkfa<afkd...."
    assert decode(encode(text)) == text
    assert len(VOCAB) == 19 and VOCAB[PAD_ID] == "."


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"task": "sort"}, r"make_batch: task='sort' is not one of \('copy', 'reverse', 'mixed'\)"),
     ({"batch_size": 0}, r"make_batch: batch_size=0 must be an integer >= 1"),
     ({"n_min": 5, "n_max": 4}, r"make_batch: n_min=5, n_max=4: expected 1 <= n_min <= n_max"),
     ({"n_max": 17}, r"n_max=17: expected 1 <= n_min <= n_max <= 16 \(the symbols of a "
                     r"sequence are distinct\)")],
)
def test_bad_arguments_raise_named_errors(kwargs, message):
    args = {"task": "copy", "batch_size": 4} | kwargs
    task, batch_size = args.pop("task"), args.pop("batch_size")
    with pytest.raises(ValueError, match=message):
        make_batch(task, batch_size, **args)


def test_encode_refuses_unknown_characters_and_decode_bad_ids():
    with pytest.raises(ValueError, match=r"encode: 'xz' not in the vocabulary"):
        encode("abzx")
    with pytest.raises(ValueError, match=r"decode: tokens must be a 1-D array of ids 0..18"):
        decode([0, 19])
