"""Tiny Shakespeare: the corpus, its fixed 90/10 split, training windows and n-gram baselines.

Taught in ``notebooks/09_tiny_gpt.ipynb``.

The text ships with the package (``mha_course/models/data/tinyshakespeare.txt``, 1,115,394
characters of Shakespeare's plays, public domain; its provenance is in ``data/README.md``), so a
clone of the course trains on it offline. :func:`load_text` reads it and checks its sha256.

- :func:`split`: the first 90 % of the token ids train, the last 10 % validate (nanoGPT's
  character-level split). Fixed, never shuffled: every number the lesson reports on "the
  validation split" is on the same 111,540 characters.
- :func:`random_windows`: a batch of training windows ``x`` and their next-character targets
  ``y = x`` shifted by one, drawn at random offsets.
- :func:`eval_windows`: the validation split cut into consecutive windows that cover it once.
- :func:`ngram_losses`: the unigram and bigram baselines (add-one smoothed counts of the
  training split), in nats per character on the validation split: what a model must beat.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .._validate import fail, validate_positive_int

__all__ = ["SHA256", "TEXT", "eval_windows", "load_text", "ngram_losses", "random_windows",
           "split"]

#: The shipped corpus.
TEXT = Path(__file__).with_name("data") / "tinyshakespeare.txt"
#: Its checksum (``data/README.md`` and ``tests/test_corpus.py``).
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
#: Share of the corpus that trains.
TRAIN_FRACTION = 0.9


def load_text(path=TEXT, *, verify: bool = True) -> str:
    """The corpus as one string (checked against :data:`SHA256` when it is the shipped file).

    Raises
    ------
    ValueError
        If the shipped file's checksum is not :data:`SHA256` (a damaged or edited copy).

    Examples
    --------
    >>> text = load_text()
    >>> len(text), text[:14]
    (1115394, 'First Citizen:')
    """
    data = Path(path).read_bytes()
    if verify and Path(path) == TEXT:
        digest = hashlib.sha256(data).hexdigest()
        if digest != SHA256:
            raise fail("load_text", f"{path} has sha256 {digest}; expected {SHA256} (the "
                                    "shipped Tiny Shakespeare): restore it with git checkout")
    return data.decode("utf-8")


def split(ids, fraction: float = TRAIN_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """The first ``fraction`` of ``ids`` (train) and the rest (validation), in order.

    Examples
    --------
    >>> train, val = split(np.arange(10))
    >>> train.tolist(), val.tolist()
    ([0, 1, 2, 3, 4, 5, 6, 7, 8], [9])
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) < 2:
        raise fail("split", f"ids has shape {ids.shape}; expected (N,) with N >= 2")
    if not 0 < fraction < 1:
        raise fail("split", f"fraction={fraction!r} must be between 0 and 1")
    n = int(len(ids) * fraction)
    return ids[:n], ids[n:]


def random_windows(data, batch_size: int, T: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``batch_size`` windows of ``T`` token ids at random offsets, and their targets.

    Parameters
    ----------
    data : ndarray of int, shape (N,)
    batch_size, T : int
    rng : int or numpy.random.Generator

    Returns
    -------
    x, y : ndarray of int64, shape (batch_size, T)
        ``y[b, t] = data[offset_b + t + 1]``: the character after ``x[b, t]``.

    Examples
    --------
    >>> x, y = random_windows(np.arange(100), 2, 5, rng=0)
    >>> x.shape, bool((y == x + 1).all())
    ((2, 5), True)
    """
    func = "random_windows"
    batch_size = validate_positive_int(func, "batch_size", batch_size)
    T = validate_positive_int(func, "T", T)
    data = np.asarray(data)
    if data.ndim != 1 or len(data) < T + 1:
        raise fail(func, f"data has shape {data.shape}; expected (N,) with N >= T + 1 = {T + 1}")
    rng = np.random.default_rng(rng)
    starts = rng.integers(0, len(data) - T, size=batch_size)  # (B,)
    index = starts[:, None] + np.arange(T)  # (B, T)
    return data[index].astype(np.int64), data[index + 1].astype(np.int64)


def eval_windows(data, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive windows of ``T`` token ids that cover ``data`` once, and their targets.

    Every character after the first is predicted exactly once, from the start of its window (a
    window's first character sees no context from the previous window). ``len(data) - 1`` is cut
    to a multiple of ``T``: the few characters of the remainder are left out.

    Returns
    -------
    x, y : ndarray of int64, shape (n_windows, T)

    Examples
    --------
    >>> x, y = eval_windows(np.arange(11), 5)
    >>> x.tolist(), y[:, -1].tolist()
    ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], [5, 10])
    """
    T = validate_positive_int("eval_windows", "T", T)
    data = np.asarray(data)
    n = (len(data) - 1) // T
    if data.ndim != 1 or n < 1:
        raise fail("eval_windows", f"data has shape {data.shape}; expected (N,) with N > T = {T}")
    x = data[: n * T].reshape(n, T)
    y = data[1 : n * T + 1].reshape(n, T)
    return x.astype(np.int64), y.astype(np.int64)


def ngram_losses(train, val, vocab_size: int) -> dict[str, float]:
    """Cross-entropy (nats per character) on ``val`` of add-one unigram and bigram models of
    ``train``.

    The unigram model predicts every character with its frequency in ``train``; the bigram model
    with its frequency after the previous character. Both add one to every count (Laplace), so
    no character of ``val`` gets probability 0. The bigram model scores ``val[1:]`` (each
    character after the first, from the one before it), the unigram model every character.

    Returns
    -------
    dict
        ``{"unigram": float, "bigram": float}``.

    Examples
    --------
    >>> losses = ngram_losses(np.array([0, 1, 0, 1, 0, 1]), np.array([0, 1, 0]), 2)
    >>> round(losses["unigram"], 4), losses["bigram"] < losses["unigram"]
    (0.6931, True)
    """
    train, val = np.asarray(train), np.asarray(val)
    uni = np.bincount(train, minlength=vocab_size) + 1.0  # (V,)
    unigram = -np.log(uni[val] / uni.sum()).mean()
    pairs = np.zeros((vocab_size, vocab_size))
    np.add.at(pairs, (train[:-1], train[1:]), 1.0)
    pairs += 1.0  # (V, V): counts of (previous, next), add-one
    bigram = -np.log(pairs[val[:-1], val[1:]] / pairs[val[:-1]].sum(axis=1)).mean()
    return {"unigram": float(unigram), "bigram": float(bigram)}
