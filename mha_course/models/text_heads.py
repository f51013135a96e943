"""Reading a character model's heads on real text: patterns, ablations, the induction probe.

Taught in ``notebooks/09_tiny_gpt.ipynb``.

Lesson 08's pattern scores (:func:`~mha_course.models.specialisation.pattern_score`: a head's
mean weight on the key a pattern names for each query) on windows of a play. The patterns, for a
query at position ``t`` of a window (:data:`TEXT_PATTERNS`):

================= ========================================================= ===================
pattern           key                                                        queries counted
================= ========================================================= ===================
previous char     ``t − 1``                                                  ``t >= 1``
current char      ``t`` itself                                               every ``t``
first position    ``0``, the window's first character                        ``t >= 1``
word start        the first character of the word ``t`` is in                letters past it
line start        the first character of ``t``'s line                        past it, same line
last newline      the last ``"\\n"`` before ``t``                            one exists
speaker name      the first letter of the current speaker's name (the line   inside the speech
                  ``NAME:`` that opens the speech ``t`` is in)
================= ========================================================= ===================

A head that spreads its weight evenly over the ``t + 1`` keys it can see scores the mean of
``1 / (t + 1)`` over the counted queries: :func:`uniform_baseline` gives that number per
pattern, the score to beat.

The induction probe (:func:`repeated_windows`): validation windows whose second half repeats
their first half. :func:`copy_losses` compares the loss on the same characters in the first and
the second copy (a model that can look up "what followed this character last time" predicts the
second copy much better); :func:`repeat_scores` measures, for the queries of the second copy,
each head's weight on the *induction* key (the position after the earlier occurrence of the
current character, ``t − T/2 + 1``) and on the *duplicate* key (the earlier occurrence itself,
``t − T/2``). :func:`ablation_losses` switches each head off (``head_mask``) and measures how
much the loss rises.
"""

from __future__ import annotations

import numpy as np

from .._validate import fail
from .corpus import eval_windows
from .gpt_fast import fast_logits
from .specialisation import pattern_score
from .tiny_model import cross_entropy, token_losses

__all__ = ["TEXT_PATTERNS", "ablation_losses", "copy_losses", "per_position_losses",
           "repeat_scores", "repeated_windows", "text_pattern_keys", "text_pattern_scores",
           "uniform_baseline"]

#: The patterns :func:`text_pattern_keys` knows, in the order the lesson reports them.
TEXT_PATTERNS = ("previous char", "current char", "first position", "word start",
                 "line start", "last newline", "speaker name")


def text_pattern_keys(text: str, pattern: str) -> np.ndarray:
    """For every position of ``text`` (one window), the key ``pattern`` names (-1: not counted).

    Examples
    --------
    >>> text_pattern_keys("to be\\nor", "word start").tolist()
    [-1, -1, -1, -1, 3, -1, -1, 6]
    >>> keys = text_pattern_keys("ALL:\\nYes.\\n\\nKING:\\nNo", "speaker name").tolist()
    >>> keys[5:9], keys[17:]  # a NAME: line at the window's start may be cut: not counted
    ([-1, -1, -1, -1], [11, 11])
    """
    if pattern not in TEXT_PATTERNS:
        raise fail("text_pattern_keys", f"pattern={pattern!r} is not one of {TEXT_PATTERNS}")
    T = len(text)
    t = np.arange(T)
    if pattern == "previous char":
        return np.where(t >= 1, t - 1, -1)
    if pattern == "current char":
        return t.copy()
    if pattern == "first position":
        return np.where(t >= 1, 0, -1)
    chars = np.array(list(text))
    newline = chars == "\n"
    # the last newline at or before each position (-1: none), and the line's first character
    last_nl = np.maximum.accumulate(np.where(newline, t, -1))
    if pattern == "last newline":
        before = np.concatenate([[-1], last_nl[:-1]])  # strictly before t
        return before
    if pattern == "line start":
        start = np.concatenate([[-1], last_nl[:-1]]) + 1  # first character of t's line
        counted = (start < t) & ~newline & (np.concatenate([[-1], last_nl[:-1]]) >= 0)
        return np.where(counted, start, -1)
    if pattern == "word start":
        letter = np.char.isalpha(chars)
        boundary = np.where(~letter, t, -1)
        last_gap = np.maximum.accumulate(boundary)  # last non-letter at or before t
        start = last_gap + 1
        counted = letter & (start < t) & (last_gap >= 0)
        return np.where(counted, start, -1)
    return _speaker_keys(text)


def _speaker_keys(text: str) -> np.ndarray:
    """Each position inside a speech -> the first letter of its ``NAME:`` line (-1 elsewhere)."""
    keys = np.full(len(text), -1)
    lines, pos = text.split("\n"), 0
    speaker, previous_blank = -1, True
    for line in lines:
        if previous_blank and line.endswith(":") and line[:1].isalpha() and pos > 0:
            speaker = pos  # a NAME: line after a blank line (not cut by the window's start)
            keys[pos + len(line): pos + len(line) + 1] = -1
        elif line == "":
            speaker = -1  # a blank line ends the speech
        elif speaker >= 0:
            keys[pos: pos + len(line) + 1] = speaker  # the line and its newline
        previous_blank = line == ""
        pos += len(line) + 1
    keys[keys >= np.arange(len(text))] = -1  # a key must come before its query
    return keys[: len(text)]


def text_pattern_scores(weights, texts) -> dict[str, np.ndarray]:
    """Every head's score for every pattern of :data:`TEXT_PATTERNS`.

    Parameters
    ----------
    weights : list of ndarray, each (B, h, T, T)
        One block's attention weights per entry (``GPT.attention_weights``).
    texts : sequence of B str, each of length T
        The windows' characters.

    Returns
    -------
    dict of str to ndarray, shape (n_layers, h)
    """
    keys = {p: np.stack([text_pattern_keys(s, p) for s in texts]) for p in TEXT_PATTERNS}
    return {p: np.stack([pattern_score(w, keys[p]) for w in weights]) for p in TEXT_PATTERNS}


def uniform_baseline(texts) -> dict[str, float]:
    """The score of a head that spreads its weight evenly over every key it can see: the mean
    of ``1 / (t + 1)`` over the queries each pattern counts."""
    out = {}
    for p in TEXT_PATTERNS:
        keys = np.stack([text_pattern_keys(s, p) for s in texts])
        t = np.broadcast_to(np.arange(keys.shape[1]), keys.shape)
        out[p] = float(np.mean(1.0 / (t[keys >= 0] + 1)))
    return out


def per_position_losses(model, x, y, head_mask=None) -> np.ndarray:
    """Cross-entropy of every target, shape (B, T), in nats."""
    return token_losses(fast_logits(model, x, head_mask=head_mask), y)  # (B, T, V) -> (B, T)


def ablation_losses(model, x, y) -> tuple[float, np.ndarray]:
    """The loss on ``(x, y)`` and, for every head, how much it rises with that head off.

    Returns
    -------
    loss : float
    rise : ndarray, shape (n_layers, h)
        ``loss(head_mask with head (i, j) = 0) − loss``.
    """
    c = model.config

    def loss(mask):
        return cross_entropy(fast_logits(model, x, head_mask=mask), y)[0]

    full = loss(None)
    rise = np.zeros((c.n_layers, c.h))
    for i in range(c.n_layers):
        for j in range(c.h):
            mask = np.ones((c.n_layers, c.h))
            mask[i, j] = 0.0
            rise[i, j] = loss(mask) - full
    return full, rise


def repeated_windows(ids, T: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows of ``T`` ids (``T`` even) whose second half repeats the first half.

    The first halves are consecutive stretches of ``ids`` (e.g. the validation split); the
    target of every position is the next id of the repeated stream (the last one's is the
    first id again).

    Returns
    -------
    x, y : ndarray of int64, shape (n, T)
    """
    if T % 2:
        raise fail("repeated_windows", f"T={T} must be even (two copies of T/2)")
    half, _ = eval_windows(ids, T // 2)
    if len(half) < n:
        raise fail("repeated_windows", f"ids holds {len(half)} stretches of T/2={T // 2}; "
                                       f"n={n} asked")
    half = half[:n]
    stream = np.concatenate([half, half, half[:, :1]], axis=1)  # (n, T + 1)
    return stream[:, :T], stream[:, 1:]


def copy_losses(model, x, y) -> dict[str, float]:
    """Mean loss on the same characters in the first and the second copy of repeated windows.

    The first copy's targets are positions ``0 .. T/2 − 2`` (each predicts the next character
    of the first half), the second copy's the positions ``T/2 .. T − 2`` (the same characters
    again); the two positions that predict the start of a copy are left out.
    """
    T = x.shape[1]
    half = T // 2
    losses = per_position_losses(model, x, y)
    return {"first": float(losses[:, : half - 1].mean()),
            "second": float(losses[:, half : T - 1].mean())}


def repeat_scores(weights, T: int) -> dict[str, np.ndarray]:
    """Each head's mean weight, over the queries of the second copy, on the induction key
    (``t − T/2 + 1``) and on the duplicate key (``t − T/2``).

    Parameters
    ----------
    weights : list of ndarray (B, h, T, T), one per block
    T : int

    Returns
    -------
    dict
        ``{"induction": (n_layers, h), "duplicate": (n_layers, h)}``.
    """
    half = T // 2
    t = np.arange(T)
    second = (t >= half) & (t <= T - 2)
    out = {}
    for name, offset in (("induction", 1 - half), ("duplicate", -half)):
        keys = np.where(second, t + offset, -1)
        out[name] = np.stack([pattern_score(w, np.broadcast_to(keys, w.shape[:1] + (T,)))
                              for w in weights])
    return out
