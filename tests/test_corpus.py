"""The shipped Tiny Shakespeare (checksum, size, provenance), the character tokenizer, the fixed
split, training windows and the n-gram baselines."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from mha_course.models.corpus import (
    SHA256,
    TEXT,
    eval_windows,
    load_text,
    ngram_losses,
    random_windows,
    split,
)
from mha_course.models.tokenizer import CharTokenizer, display_char


def test_the_shipped_corpus_is_tiny_shakespeare():
    assert hashlib.sha256(TEXT.read_bytes()).hexdigest() == SHA256
    text = load_text()
    assert len(text) == 1_115_394 and len(set(text)) == 65
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")
    readme = (TEXT.parent / "README.md").read_text()
    assert SHA256 in readme and "char-rnn" in readme and "public domain" in readme


def test_the_corpus_and_the_shipped_models_are_package_data():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(TEXT.parents[3] / "pyproject.toml", "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["mha_course"]
    for name in ("models/data/tinyshakespeare.txt", "models/data/README.md",
                 "models/shakespeare_gpt.npz", "models/head_count_study.json",
                 "models/induction_probes.npz"):
        assert name in data, name


def test_a_damaged_copy_is_refused(tmp_path, monkeypatch):
    import mha_course.models.corpus as corpus

    copy = tmp_path / "tinyshakespeare.txt"
    copy.write_text("First Citizen:\nchanged\n")
    monkeypatch.setattr(corpus, "TEXT", copy)
    with pytest.raises(ValueError, match="load_text: .* has sha256 .*; expected 86c4e6aa"):
        corpus.load_text(copy)


def test_tokenizer_round_trips_and_refuses_unknown_characters():
    text = load_text()
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == 65 and tok.chars[:2] == "\n "
    ids = tok.encode(text[:5000])
    assert ids.dtype == np.int64 and tok.decode(ids) == text[:5000]
    with pytest.raises(ValueError, match=r"CharTokenizer.encode: text\[7\] is 'é', not in the "
                                         "vocabulary of 65 characters"):
        tok.encode("Romeo, é")
    with pytest.raises(ValueError, match="ids holds 65"):
        tok.decode([1, 65])
    with pytest.raises(ValueError, match="repeats"):
        CharTokenizer("aba")
    assert tok.labels(tok.encode("a b\n")) == ["a", "␣", "b", "↵"] == [
        display_char(c) for c in "a b\n"]


def test_split_is_the_first_90_percent():
    tok = CharTokenizer.from_text(load_text())
    train, val = split(tok.encode(load_text()))
    assert (len(train), len(val)) == (1_003_854, 111_540)
    assert tok.decode(val[:20]) == load_text()[1_003_854:1_003_874]


def test_windows():
    data = np.arange(50)
    x, y = random_windows(data, 4, 8, rng=1)
    assert x.shape == y.shape == (4, 8) and (y == x + 1).all() and x.max() < 49
    np.testing.assert_array_equal(x, random_windows(data, 4, 8, rng=1)[0])
    x, y = eval_windows(data, 8)
    assert x.shape == (6, 8) and (x.reshape(-1) == np.arange(48)).all() and y[-1, -1] == 48
    with pytest.raises(ValueError, match="N >= T \\+ 1 = 51"):
        random_windows(data, 1, 50, rng=0)


def test_ngram_baselines_on_the_validation_split():
    tok = CharTokenizer.from_text(load_text())
    train, val = split(tok.encode(load_text()))
    losses = ngram_losses(train, val, tok.vocab_size)
    assert round(losses["unigram"], 2) == 3.35 and round(losses["bigram"], 2) == 2.48
