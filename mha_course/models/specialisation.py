"""Measuring what each head does: a score per attention pattern, and ablations.

Taught in ``notebooks/08_learning.ipynb``.

A *pattern* names, for some query positions of a sequence, the one key a head with that job
would attend to. A head's score for the pattern is the mean attention weight it puts on that key,
over every such query of every example: 1 for a head that always does exactly this, about
``1 / (number of keys it can see)`` for a head that spreads its weight evenly. The patterns, for
a sequence of ``n`` symbols, its delimiter at position ``n`` and the answer after it
(:mod:`mha_course.models.tasks`):

============== ================================ =================================================
pattern        queries ``t``                    key
============== ================================ =================================================
previous-token ``1 … n`` (before the answer)     ``t − 1``
diagonal       ``1 … 2n`` (every real position)  ``t`` itself
first-token    ``1 … 2n``                        ``0``
duplicate-     ``n + 1 … 2n − 1`` (the answer)   the earlier occurrence of token ``t``
token
induction      ``n + 1 … 2n − 1`` (the answer)   the position after the earlier occurrence of
                                                 token ``t``
anti-diagonal  ``n … 2n − 1`` (scored positions) ``2n − 1 − t``: the mirror image across the
                                                 delimiter
============== ================================ =================================================

The previous-token queries stop at the delimiter because that is where the job matters: an
induction head reads the keys of the first half, and the reversal needs the token before the
delimiter; after it, no later query needs to know what preceded an answer token.

An *ablation* sets one head's output to zero (``TinyTransformer.forward(..., ablate=...)``) and
measures the accuracy that is left: a head the task needs takes the accuracy down with it.
"""

from __future__ import annotations

import numpy as np

from .._validate import fail, validate_shape

__all__ = ["PATTERNS", "ablation_table", "pattern_keys", "pattern_score", "pattern_scores"]

#: The patterns :func:`pattern_scores` measures, in the order it reports them.
PATTERNS = ("previous-token", "diagonal", "first-token", "duplicate-token", "induction",
            "anti-diagonal")


def pattern_keys(tokens, lengths, pattern: str) -> np.ndarray:
    """For every query position, the key a head doing ``pattern`` attends to (-1: not counted).

    Parameters
    ----------
    tokens : ndarray of int, shape (B, T)
    lengths : ndarray of int, shape (B,)
        ``n`` of every example (its delimiter is at position ``n``).
    pattern : str
        One of :data:`PATTERNS`.

    Returns
    -------
    ndarray of int, shape (B, T)
        ``keys[b, t]`` is the key position for query ``t`` of example ``b``, or -1 where the
        pattern does not count that query.

    Raises
    ------
    ValueError
        If ``pattern`` is unknown or the shapes disagree.

    Examples
    --------
    >>> from mha_course.models.tasks import encode
    >>> pattern_keys(encode("abc>abc")[None], np.array([3]), "induction").tolist()
    [[-1, -1, -1, -1, 1, 2, -1]]
    """
    func = "pattern_keys"
    if pattern not in PATTERNS:
        raise fail(func, f"pattern={pattern!r} is not one of {PATTERNS}")
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    if tokens.ndim != 2 or lengths.shape != tokens.shape[:1]:
        raise fail(func, f"tokens {tokens.shape} and lengths {lengths.shape}; expected (B, T) "
                         "and (B,)")
    B, T = tokens.shape
    t = np.broadcast_to(np.arange(T), (B, T))  # (B, T): the query positions
    n = lengths[:, None]  # (B, 1)
    if pattern == "previous-token":
        return np.where((t >= 1) & (t <= n), t - 1, -1)
    if pattern == "diagonal":
        return np.where((t >= 1) & (t <= 2 * n), t, -1)
    if pattern == "first-token":
        return np.where((t >= 1) & (t <= 2 * n), 0, -1)
    if pattern == "anti-diagonal":
        return np.where((t >= n) & (t <= 2 * n - 1), 2 * n - 1 - t, -1)
    # the last earlier position s < t holding token t's token (-1 if none)
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T): query t, key s
    earlier = np.arange(T)[None, :] < np.arange(T)[:, None]  # s < t
    s = np.where(same & earlier, np.arange(T), -1).max(axis=-1)  # (B, T)
    answer = (t >= n + 1) & (t <= 2 * n - 1)
    if pattern == "duplicate-token":
        return np.where(answer & (s >= 0), s, -1)
    # induction: the position after that earlier occurrence (if it is not t itself)
    return np.where(answer & (s >= 0) & (s + 1 < t), s + 1, -1)


def pattern_score(weights, keys) -> np.ndarray:
    """Every head's mean weight on the key ``keys`` names for each query (-1: query not counted).

    Parameters
    ----------
    weights : ndarray, shape (B, h, T, S)
        Attention weights of ``B`` examples.
    keys : ndarray of int, shape (B, T)
        For every query, the key position the pattern says, or -1 to leave the query out.

    Returns
    -------
    ndarray, shape (h,)
        NaN for every head when no query is counted.

    Raises
    ------
    ValueError
        If the shapes disagree or a key is outside ``0 .. S - 1``.

    Examples
    --------
    >>> previous = np.eye(3, k=-1)[None, None]  # (1, 1, 3, 3): always on the previous token
    >>> pattern_score(previous, np.array([[-1, 0, 1]])).tolist()
    [1.0]
    """
    func = "pattern_score"
    weights, keys = np.asarray(weights), np.asarray(keys)
    if weights.ndim != 4 or keys.shape != (weights.shape[0], weights.shape[2]):
        raise fail(func, f"weights {weights.shape} and keys {keys.shape}; expected "
                         "(B, h, T, S) and (B, T)")
    if keys.size and keys.max() >= weights.shape[-1]:
        raise fail(func, f"keys holds {int(keys.max())}; the weights have S={weights.shape[-1]}"
                         " keys")
    b, t = np.nonzero(keys >= 0)  # the counted queries
    if len(b) == 0:
        return np.full(weights.shape[1], np.nan)
    # (queries, h): each counted query's weight on its key, for every head
    return weights[b, :, t, keys[b, t]].mean(axis=0)


def pattern_scores(weights, tokens, lengths) -> dict[str, np.ndarray]:
    """Every head's score for every pattern: its mean weight on the pattern's key.

    Parameters
    ----------
    weights : ndarray, shape (B, h, T, T)
        One layer's attention weights on ``tokens``.
    tokens : ndarray of int, shape (B, T)
    lengths : ndarray of int, shape (B,)

    Returns
    -------
    dict of str to ndarray of shape (h,)
        One entry per pattern of :data:`PATTERNS`, in that order; NaN where no query of the
        batch counts for the pattern.

    Raises
    ------
    ValueError
        If the shapes disagree.

    Examples
    --------
    >>> from mha_course.models.tasks import encode
    >>> tokens = encode("abc>abc")[None]  # (1, 7)
    >>> previous = np.eye(7, k=-1)[None, None]  # (1, 1, 7, 7): one head on the previous token
    >>> {p: s.round(2).tolist() for p, s in pattern_scores(previous, tokens, [3]).items()}
    {'previous-token': [1.0], 'diagonal': [0.0], 'first-token': [0.17], \
'duplicate-token': [0.0], 'induction': [0.0], 'anti-diagonal': [0.33]}
    """
    func = "pattern_scores"
    weights = np.asarray(weights)
    tokens = np.asarray(tokens)
    B, T = tokens.shape if tokens.ndim == 2 else (None, None)
    validate_shape(func, "weights", weights, ("B", "h", "T", "S"), batch=False,
                   known={"B": (B, "tokens"), "T": (T, "tokens"), "S": (T, "tokens")})
    return {pattern: pattern_score(weights, pattern_keys(tokens, lengths, pattern))
            for pattern in PATTERNS}


def ablation_table(model, batch) -> np.ndarray:
    """Accuracy on ``batch`` with each head ablated: ``table[layer, head]``.

    Parameters
    ----------
    model : TinyTransformer
    batch : Batch

    Returns
    -------
    ndarray, shape (n_layers, h)
        ``model.evaluate(batch, ablate=[(layer, head)])["accuracy"]`` for every head.
    """
    return np.array([[model.evaluate(batch, ablate=[(layer, head)])["accuracy"]
                      for head in range(model.h)] for layer in range(model.n_layers)])
