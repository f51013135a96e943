"""Attention entropy and context length: how spread a head's weights are, why they flatten as
the context grows, and the log-n scaling of the logits that slows it.

Taught in ``notebooks/13_attention_2025.ipynb`` (lesson 02 §6 defined the entropy).

With logits of a fixed spread, a softmax over ``n`` keys has entropy that grows with ``log n``:
a head trained on 2k tokens and run on 32k spreads its weight over sixteen times as many keys.
Multiplying the logits of a query at position ``n`` by ``log n / log n_train`` for
``n > n_train`` (Qwen's ``use_logn_attn``) is a temperature that grows with the length: it
slows that flattening (lesson 13's deep dive 13b §3 measures by how much), it does not stop
it.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, validate_positive_int

__all__ = ["attention_entropy", "logn_scale"]


def attention_entropy(weights, axis: int = -1) -> np.ndarray:
    """``−Σ w log w`` along ``axis`` (nats), with ``0 log 0 = 0``.

    Rows that sum to less than 1 (a head with a sink) are taken as they are: add the sink's
    share as one more entry to count it.

    Parameters
    ----------
    weights : ndarray of float, non-negative
    axis : int, default -1

    Returns
    -------
    ndarray
        ``weights``' shape without ``axis``; 0 for one-hot rows, ``log n`` for uniform ones.

    Raises
    ------
    ValueError
        On a negative weight or a non-float array.

    Examples
    --------
    >>> attention_entropy(np.array([[1.0, 0.0], [0.5, 0.5]])).round(4).tolist()
    [0.0, 0.6931]
    """
    func = "attention_entropy"
    w = as_float_array(func, "weights", weights)
    if (w < 0).any():
        raise fail(func, "weights holds a negative entry; expected attention weights >= 0")
    safe = np.where(w > 0, w, 1.0)
    return -(np.where(w > 0, w * np.log(safe), 0.0)).sum(axis=axis) + 0.0


def logn_scale(n, n_train: int) -> np.ndarray:
    """Qwen's log-n factor for the logits of a query at position ``n`` (1-based):
    ``log n / log n_train`` beyond the trained length, 1 within it.

    Parameters
    ----------
    n : int or ndarray of int
        Positions, counting from 1 (the number of keys a causal query sees).
    n_train : int
        The length trained on (``seq_length`` in Qwen's config), >= 2.

    Returns
    -------
    ndarray of float, shape of n

    Examples
    --------
    >>> logn_scale(np.array([1, 2048, 4096, 32768]), 2048).round(4).tolist()
    [1.0, 1.0, 1.0909, 1.3636]
    """
    func = "logn_scale"
    n_train = validate_positive_int(func, "n_train", n_train, minimum=2)
    n = np.asarray(n)
    if n.dtype.kind not in "iu" or (n < 1).any():
        raise fail(func, f"n has dtype {n.dtype}; expected positions >= 1 (integers)")
    return np.where(n > n_train, np.log(np.maximum(n, 1)) / np.log(n_train), 1.0)
