"""Choosing the next token from a model's logits: greedy, temperature, top-k, top-p (nucleus).

Taught in ``notebooks/09_tiny_gpt.ipynb``.

Pure functions over logits of shape (..., V), one row per sequence; none changes its input.
:func:`next_token` composes them in the order Hugging Face's ``generate`` applies its logits
warpers: temperature first, then top-k, then top-p, then a draw from the softmax of what is
left. Filters set the logits they remove to ``-inf`` (probability exactly 0 after the softmax).

- **greedy** (:func:`greedy`): the largest logit; deterministic; ``temperature=0`` means greedy.
- **temperature** (:func:`apply_temperature`): ``logits / τ``. ``τ < 1`` sharpens the
  distribution (towards greedy), ``τ > 1`` flattens it (towards uniform). It divides the
  *logits*: dividing the probabilities would change nothing after renormalisation.
- **top-k** (:func:`top_k_filter`): keep the ``k`` largest logits (ties with the ``k``-th
  largest are kept too).
- **top-p** (:func:`top_p_filter`, Holtzman et al. 2020, "The Curious Case of Neural Text
  Degeneration"): keep the smallest set of most probable tokens whose probabilities sum to at
  least ``p``. The token whose probability carries the running sum across ``p`` is *inside* the
  nucleus (dropping it is a classic bug); the most probable token is always kept.
- **sampling** (:func:`sample`, a :func:`draw` from :func:`probabilities`): draw one id per
  row by inverse transform: ``u ~ U(0, 1)``,
  the first id whose cumulative probability exceeds ``u``. One uniform number per row, so a
  seeded generator gives the same tokens whatever the logits' round-off.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, validate_positive_int
from ..softmax import softmax

__all__ = ["apply_temperature", "draw", "greedy", "next_token", "probabilities", "sample",
           "top_k_filter", "top_p_filter"]


def _logits(func: str, logits) -> np.ndarray:
    logits = as_float_array(func, "logits", logits)
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise fail(func, f"logits has shape {logits.shape}; expected (..., V) with V >= 1")
    return logits


def greedy(logits) -> np.ndarray:
    """The id of the largest logit of each row: shape (...), int64.

    Examples
    --------
    >>> greedy(np.array([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])).tolist()
    [1, 0]
    """
    return _logits("greedy", logits).argmax(axis=-1).astype(np.int64)


def apply_temperature(logits, temperature: float) -> np.ndarray:
    """``logits / temperature`` (temperature > 0).

    Raises
    ------
    ValueError
        If ``temperature`` is not a positive number (use :func:`greedy` for 0).

    Examples
    --------
    >>> apply_temperature(np.array([2.0, 1.0]), 0.5).tolist()
    [4.0, 2.0]
    """
    func = "apply_temperature"
    logits = _logits(func, logits)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.number)) \
            or not np.isfinite(temperature) or temperature <= 0:
        raise fail(func, f"temperature={temperature!r} must be a positive number "
                         "(temperature 0 is greedy decoding: use greedy)")
    return logits / temperature


def top_k_filter(logits, k: int) -> np.ndarray:
    """Keep each row's ``k`` largest logits (and any tied with the ``k``-th); ``-inf`` elsewhere.

    Raises
    ------
    ValueError
        If ``k`` is not an integer >= 1 (``k >= V`` keeps every logit).

    Examples
    --------
    >>> top_k_filter(np.array([1.0, 3.0, 2.0, 0.0]), 2).tolist()
    [-inf, 3.0, 2.0, -inf]
    """
    func = "top_k_filter"
    logits = _logits(func, logits)
    k = validate_positive_int(func, "k", k)
    V = logits.shape[-1]
    if k >= V:
        return logits.copy()
    kth = np.partition(logits, V - k, axis=-1)[..., V - k : V - k + 1]  # (..., 1)
    return np.where(logits >= kth, logits, -np.inf)


def top_p_filter(logits, p: float) -> np.ndarray:
    """Keep each row's nucleus: the fewest most probable tokens with total probability >= ``p``.

    Sort the probabilities in decreasing order and keep a token when the probability of the
    tokens *before* it is still below ``p``: the token that crosses ``p`` is kept, the most
    probable token always is. Ties are broken by id (a stable sort), as Hugging Face's warper.

    Raises
    ------
    ValueError
        If ``p`` is not a number with ``0 < p <= 1`` (``p = 1`` keeps every token with
        nonzero probability).

    Examples
    --------
    >>> probs = np.array([0.5, 0.3, 0.15, 0.05])
    >>> np.isfinite(top_p_filter(np.log(probs), 0.7)).tolist()  # 0.5 < 0.7: 0.3 crosses, kept
    [True, True, False, False]
    """
    func = "top_p_filter"
    logits = _logits(func, logits)
    if isinstance(p, bool) or not isinstance(p, (int, float, np.number)) or not 0 < p <= 1:
        raise fail(func, f"p={p!r} must be a number with 0 < p <= 1")
    probs = softmax(logits)  # (..., V)
    order = np.argsort(-probs, axis=-1, kind="stable")  # most probable first
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass of the tokens before each
    keep_sorted = before < p
    keep_sorted[..., 0] = True
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)  # back to id order
    return np.where(keep, logits, -np.inf)


def probabilities(logits, temperature: float = 1.0) -> np.ndarray:
    """``softmax(logits / temperature)`` over the last axis: the distribution a draw samples.

    Examples
    --------
    >>> probabilities(np.log(np.array([0.2, 0.8])), temperature=1.0).round(3).tolist()
    [0.2, 0.8]
    """
    return softmax(apply_temperature(logits, temperature))


def draw(weights, rng) -> np.ndarray:
    """One id per row from ``weights`` (..., V) (not necessarily normalised), shape (...), int64.

    Inverse transform with one uniform number ``u`` per row: the first id whose cumulative
    weight exceeds ``u · total``. An id of weight 0 is never drawn. Speculative decoding draws
    from distributions that are not a softmax of logits (the residual ``max(0, p − q)``), so the
    draw takes weights; :func:`sample` is a draw from the softmax.

    Examples
    --------
    >>> draw(np.array([[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]]), rng=0).tolist()
    [1, 0]
    """
    weights = as_float_array("draw", "weights", weights)
    rng = np.random.default_rng(rng)
    u = rng.random(size=weights.shape[:-1] + (1,))  # (..., 1)
    cdf = np.cumsum(weights, axis=-1, dtype=np.float64)
    ids = (cdf <= u * cdf[..., -1:]).sum(axis=-1)  # the first id whose cdf exceeds u · total
    # round-off can leave u beyond the last cdf; and a 0-weight id is never chosen
    ids = np.minimum(ids, weights.shape[-1] - 1)
    last_nonzero = weights.shape[-1] - 1 - np.argmax(weights[..., ::-1] > 0, axis=-1)
    return np.minimum(ids, last_nonzero).astype(np.int64)


def sample(logits, rng) -> np.ndarray:
    """Draw one id per row from ``softmax(logits)``, by inverse transform: shape (...), int64.

    Parameters
    ----------
    logits : ndarray of float, shape (..., V)
        ``-inf`` entries have probability 0 and are never drawn.
    rng : int or numpy.random.Generator
        One uniform number is drawn per row (:func:`draw`).

    Examples
    --------
    >>> sample(np.log(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]) + 1e-300), rng=0).tolist()
    [1, 0]
    """
    return draw(softmax(_logits("sample", logits)), rng)


def next_token(logits, temperature: float = 1.0, top_k=None, top_p=None, rng=None):
    """The next token of each row: greedy when ``temperature == 0``, else sampled.

    Temperature, then top-k, then top-p, then :func:`sample` (Hugging Face's order).

    Parameters
    ----------
    logits : ndarray of float, shape (..., V)
    temperature : float, default 1.0
        0 for greedy decoding (then ``top_k`` and ``top_p`` change nothing).
    top_k : int, optional
    top_p : float, optional
    rng : int or numpy.random.Generator, optional
        Needed for sampling; pass one generator to a whole generation loop.

    Returns
    -------
    ndarray of int64, shape (...)

    Raises
    ------
    ValueError
        On a negative temperature, a bad ``top_k`` or ``top_p``.

    Examples
    --------
    >>> logits = np.log(np.array([0.6, 0.3, 0.1]))
    >>> int(next_token(logits, temperature=0)), int(next_token(logits, top_k=1, rng=0))
    (0, 0)
    """
    func = "next_token"
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.number)) \
            or not temperature >= 0:
        raise fail(func, f"temperature={temperature!r} must be a number >= 0 (0: greedy)")
    if temperature == 0:
        if top_k is not None:
            validate_positive_int(func, "top_k", top_k)
        return greedy(logits)
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return sample(logits, rng)
