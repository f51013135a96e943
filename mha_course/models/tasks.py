"""Synthetic sequence tasks whose solutions need different attention heads: copy and reverse.

Taught in ``notebooks/08_learning.ipynb``.

A sequence is ``n`` distinct symbols, a delimiter that names the task, then the answer:

- ``copy``: ``x_0 … x_{n-1} > x_0 … x_{n-1}`` (e.g. ``dkfa>dkfa``). After the delimiter each
  answer token is the one that followed the current token's earlier occurrence: an *induction
  head* finds it (it needs a *previous-token head* in an earlier layer to mark each position
  with the token before it).
- ``reverse``: ``x_0 … x_{n-1} < x_{n-1} … x_0`` (e.g. ``dkfa<afkd``). The answer reads the
  first half backwards: query ``n + i`` needs key ``n - 1 - i``, an *anti-diagonal* head.

The length ``n`` varies from example to example (``n_min`` to ``n_max``), so no fixed offset
solves either task; sequences are right-padded with ``.`` to ``T = 2 * n_max + 1``. A causal
model predicts token ``t + 1`` at position ``t``; only the answer is scored: positions
``n … 2n - 1`` (the delimiter predicts the first answer token, the last answer token predicts
nothing). Symbols within a sequence are distinct, so every answer is determined.

The vocabulary is fixed: 16 symbols ``a`` … ``p`` (ids 0-15), then ``>`` (16), ``<`` (17) and
the padding ``.`` (18).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import fail, validate_positive_int

#: The symbols a sequence is made of (ids 0 .. 15).
SYMBOLS = "abcdefghijklmnop"
#: The delimiter of each task: it is also the token that tells the model which task to do.
DELIMITERS = {"copy": ">", "reverse": "<"}
#: The padding token, after the answer (never scored, never attended to by a scored position).
PAD = "."
#: Every token, in id order.
VOCAB = tuple(SYMBOLS) + tuple(DELIMITERS.values()) + (PAD,)
#: The tasks :func:`make_batch` knows; ``"mixed"`` draws one of them for every example.
TASKS = ("copy", "reverse", "mixed")
PAD_ID = VOCAB.index(PAD)


@dataclass(repr=False)
class Batch:
    """A batch of examples of one task (or a mix), ready for the model.

    Attributes
    ----------
    tokens : ndarray of int, shape (B, T)
        Token ids (:data:`VOCAB`), right-padded with ``.``.
    targets : ndarray of int, shape (B, T)
        The next token of every position (``tokens`` shifted left; padding at the end).
    weights : ndarray of float, shape (B, T)
        1 where a prediction is scored (the answer: positions ``n … 2n - 1``), else 0.
    lengths : ndarray of int, shape (B,)
        ``n`` of every example: its delimiter sits at position ``n``.
    tasks : ndarray of str, shape (B,)
        ``"copy"`` or ``"reverse"`` for every example.
    """

    tokens: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    lengths: np.ndarray
    tasks: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    def select(self, which) -> Batch:
        """The examples where ``which`` (bool (B,) or indices) holds, as a new batch."""
        return Batch(self.tokens[which], self.targets[which], self.weights[which],
                     self.lengths[which], self.tasks[which])

    def __repr__(self) -> str:
        names, counts = np.unique(self.tasks, return_counts=True)
        mix = ", ".join(f"{n}={c}" for n, c in zip(names, counts, strict=True))
        return f"Batch(B={len(self)}, T={self.tokens.shape[1]}, {mix})"


def encode(text: str) -> np.ndarray:
    """Token ids of a string of vocabulary characters.

    Raises
    ------
    ValueError
        If ``text`` holds a character outside :data:`VOCAB`.

    Examples
    --------
    >>> encode("ab>ab").tolist()
    [0, 1, 16, 0, 1]
    """
    unknown = sorted(set(text) - set(VOCAB))
    if unknown:
        raise fail("encode", f"{''.join(unknown)!r} not in the vocabulary {''.join(VOCAB)!r}")
    return np.array([VOCAB.index(c) for c in text], dtype=np.int64)


def decode(tokens) -> str:
    """The string of a 1-D sequence of token ids (inverse of :func:`encode`).

    Examples
    --------
    >>> decode([3, 10, 17, 10, 3])
    'dk<kd'
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu" or (tokens < 0).any() or (
            tokens >= len(VOCAB)).any():
        raise fail("decode", f"tokens must be a 1-D array of ids 0..{len(VOCAB) - 1}")
    return "".join(VOCAB[i] for i in tokens)


def make_batch(task: str, batch_size: int, rng=None, *, n_min: int = 3,
               n_max: int = 8) -> Batch:
    """Draw ``batch_size`` examples of ``task``, all padded to ``T = 2 * n_max + 1``.

    Parameters
    ----------
    task : {"copy", "reverse", "mixed"}
        ``"mixed"`` draws the task of each example with probability 1/2 each.
    batch_size : int
    rng : int or numpy.random.Generator, optional
        Seed or generator (the same seed gives the same batch).
    n_min, n_max : int, default 3 and 8
        The range of ``n``, the number of symbols before the delimiter (at most 16).

    Returns
    -------
    Batch

    Raises
    ------
    ValueError
        If ``task`` is unknown, a size is not a positive integer, or not
        ``1 <= n_min <= n_max <= 16``.

    Examples
    --------
    >>> batch = make_batch("reverse", 4, rng=0)
    >>> batch.tokens.shape, decode(batch.tokens[0]).rstrip(".")
    ((4, 17), 'ckdmaehf<fheamdkc')
    """
    func = "make_batch"
    if task not in TASKS:
        raise fail(func, f"task={task!r} is not one of {TASKS}")
    batch_size = validate_positive_int(func, "batch_size", batch_size)
    n_min = validate_positive_int(func, "n_min", n_min)
    n_max = validate_positive_int(func, "n_max", n_max)
    if not n_min <= n_max <= len(SYMBOLS):
        raise fail(func, f"n_min={n_min}, n_max={n_max}: expected 1 <= n_min <= n_max <= "
                         f"{len(SYMBOLS)} (the symbols of a sequence are distinct)")
    rng = np.random.default_rng(rng)
    T = 2 * n_max + 1
    tokens = np.full((batch_size, T), PAD_ID, dtype=np.int64)  # (B, T)
    weights = np.zeros((batch_size, T))  # (B, T)
    lengths = rng.integers(n_min, n_max + 1, size=batch_size)  # (B,)
    names = ("copy", "reverse")
    kinds = (rng.integers(0, 2, size=batch_size) if task == "mixed"
             else np.full(batch_size, names.index(task)))
    for b, (n, kind) in enumerate(zip(lengths, kinds, strict=True)):
        x = rng.permutation(len(SYMBOLS))[:n]  # n distinct symbols
        tokens[b, :n] = x
        tokens[b, n] = VOCAB.index(DELIMITERS[names[kind]])
        tokens[b, n + 1 : 2 * n + 1] = x if kind == 0 else x[::-1]
        weights[b, n : 2 * n] = 1.0  # the delimiter predicts the first answer token, ...
    targets = np.concatenate([tokens[:, 1:], np.full((batch_size, 1), PAD_ID)], axis=1)
    return Batch(tokens, targets, weights, lengths, np.array([names[k] for k in kinds]))
