"""Attention sinks two ways: a learned sink logit per head (gpt-oss), and kept first tokens
(StreamingLLM).

Taught in ``notebooks/13_attention_2025.ipynb`` (lesson 06's deep dive 06b §2 wrote the sink
column inline).

**A learned sink** (gpt-oss's reference ``sdpa``): each head ``i`` has one learned logit
``sink_i`` that joins every row of its scores as an extra column of the softmax and is then
dropped. The real keys' weights are ``exp(s_j) / (Σ_j' exp(s_j') + exp(sink_i))``: they sum to
``1 − p_sink < 1``, and the sink carries no value, so a head that finds nothing relevant can hand
out (almost) nothing. The sink sits in the denominator only: it is never a key, never a value,
and a fully masked row puts all its weight on the sink (its output is 0).

**Kept first tokens** (StreamingLLM, Xiao et al. 2023): a sliding window plus the first
``n_sink`` positions, which trained models use as sinks (:func:`streaming_mask`; the paper keeps
4 initial tokens).
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, validate_mask, validate_positive_int
from ..attention import (
    sdpa_unchecked,
    sliding_window_mask,
    softmax_with_sink_unchecked,
    validate_qkv,
)

__all__ = ["sink_attention", "softmax_with_sink", "softmax_with_sink_backward",
           "streaming_mask"]


def _sink_column(func: str, sink, shape: tuple[int, ...], dtype) -> np.ndarray:
    """The sink logits as (h, 1, 1) (one per head, the head axis third from last in the
    (..., T, S) ``shape`` of the scores) or () (one for all), in ``dtype``."""
    s = as_float_array(func, "sink", sink)
    if s.ndim > 1:
        raise fail(func, f"sink has shape {s.shape}; expected () or (h,), one logit per head")
    if s.ndim == 1:
        if len(shape) < 3 or shape[-3] != s.shape[0]:
            raise fail(func, f"sink has shape {s.shape}; expected (h,) with h="
                             f"{shape[-3] if len(shape) >= 3 else '?'} (from scores "
                             f"{shape}, axis -3)")
        s = s[:, None, None]  # (h, 1, 1)
    if not np.isfinite(s).all():
        raise fail(func, "sink holds a non-finite logit")
    return s.astype(dtype, copy=False)


def softmax_with_sink(scores, sink, mask=None) -> tuple[np.ndarray, np.ndarray]:
    """Softmax of each row of ``scores`` with one extra logit ``sink`` in the denominator.

    ``w_j = exp(s_j − m) / (Σ_j' exp(s_j' − m) + exp(sink − m))`` with ``m`` the larger of the
    row's maximum and the sink (so nothing overflows); masked keys get 0.

    Parameters
    ----------
    scores : ndarray of float, shape (..., T, S)
        Scaled (and capped) scores.
    sink : float or ndarray of float, shape (h,)
        One logit per head (``scores`` then has the head axis at -3), or one for all.
    mask : ndarray of bool, broadcastable to (..., T, S), optional
        True = may attend.

    Returns
    -------
    weights : ndarray, shape (..., T, S)
        Rows sum to ``1 − sink_weight``.
    sink_weight : ndarray, shape (..., T)
        The share each row gives the sink: 1 on a fully masked row.

    Raises
    ------
    ValueError
        On non-float input, a sink that is not one per head, or a bad mask.

    Examples
    --------
    >>> w, p = softmax_with_sink(np.zeros((1, 3)), 0.0)
    >>> w.round(2).tolist(), p.round(2).tolist()
    ([[0.25, 0.25, 0.25]], [0.25])
    """
    func = "softmax_with_sink"
    s = as_float_array(func, "scores", scores)
    if s.ndim < 2:
        raise fail(func, f"scores has shape {s.shape}; expected (..., T, S)")
    col = _sink_column(func, sink, s.shape, s.dtype)  # (h, 1, 1) or ()
    m = validate_mask(func, mask, s.shape, f"scores' shape {s.shape}")
    # The kernel behind scaled_dot_product_attention(..., sink=): [s | sink] softmaxed, the
    # sink's column dropped (the max subtracted is the larger of the row's and the sink).
    return softmax_with_sink_unchecked(s, col, m)


def softmax_with_sink_backward(grad_weights, weights, sink_weight, per_head: bool = True):
    """Gradients of :func:`softmax_with_sink`: ``(dscores, dsink)``.

    With ``g = grad_weights`` and ``ḡ = Σ_j w_j g_j`` per row (the sink's own ``g`` is 0: its
    column is dropped), ``dscores_j = w_j (g_j − ḡ)`` and ``dsink = −p_sink · ḡ``, summed over
    every row of a head.

    Parameters
    ----------
    grad_weights, weights : ndarray of float, shape (..., h, T, S)
    sink_weight : ndarray of float, shape (..., h, T)
    per_head : bool, default True
        Sum ``dsink`` to shape (h,) (one logit per head); False sums it to a scalar.

    Returns
    -------
    dscores : ndarray, shape (..., h, T, S)
    dsink : ndarray, shape (h,) or ()
    """
    func = "softmax_with_sink_backward"
    g = as_float_array(func, "grad_weights", grad_weights)
    w = as_float_array(func, "weights", weights)
    p = as_float_array(func, "sink_weight", sink_weight)
    if g.shape != w.shape or p.shape != w.shape[:-1]:
        raise fail(func, f"grad_weights {g.shape}, weights {w.shape} and sink_weight {p.shape}"
                         " must be (..., T, S), (..., T, S) and (..., T)")
    gbar = (w * g).sum(axis=-1)  # (..., T)
    dscores = w * (g - gbar[..., None])
    dsink_rows = -p * gbar  # (..., T)
    if not per_head:
        return dscores, dsink_rows.sum()
    if w.ndim < 3:
        raise fail(func, f"weights has shape {w.shape}; per_head needs (..., h, T, S)")
    dsink = np.moveaxis(dsink_rows, -2, 0).reshape(w.shape[-3], -1).sum(axis=1)
    return dscores, dsink


def sink_attention(q, k, v, sink, mask=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scaled dot-product attention with a learned sink logit per head (gpt-oss).

    Parameters
    ----------
    q : ndarray of float, shape (..., h, T, d_k)
    k : ndarray of float, shape (..., h, S, d_k)
    v : ndarray of float, shape (..., h, S, d_v)
    sink : float or ndarray of float, shape (h,)
    mask : ndarray of bool, broadcastable to (..., h, T, S), optional

    Returns
    -------
    out : ndarray, shape (..., h, T, d_v)
        ``weights @ v``: the sink adds nothing to it.
    weights : ndarray, shape (..., h, T, S)
        Rows sum to ``1 − sink_weight``.
    sink_weight : ndarray, shape (..., h, T)

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 6))
    >>> out, w, p = sink_attention(q, k, v, np.array([0.0, 30.0]))
    >>> out.shape, bool(np.abs(out[1]).max() < 1e-9), bool((p[1] > 0.999).all())
    ((2, 3, 6), True, True)
    """
    func = "sink_attention"
    q, k, v, m, batch, (T, S, _d_k, _d_v) = validate_qkv(func, q, k, v, mask)
    col = _sink_column(func, sink, (*batch, T, S), np.result_type(q, k))  # (h, 1, 1) or ()
    # scaled_dot_product_attention's kernel with the sink hook (inputs checked just above)
    return sdpa_unchecked(q, k, v, m, sink=col, func=func)


def streaming_mask(T: int, n_sink: int, window: int, S: int | None = None) -> np.ndarray:
    """StreamingLLM's mask: the first ``n_sink`` positions plus a sliding window, causal.

    Aligned bottom-right like :func:`~mha_course.causal_mask`: query ``t`` at position
    ``p = S − T + t`` sees keys ``s <= p`` that are either among the first ``n_sink`` or within
    the last ``window`` positions (``p − window < s``).

    Parameters
    ----------
    T, n_sink, window : int
        ``n_sink >= 0``, ``window >= 1``.
    S : int, optional
        Key positions (default ``T``).

    Returns
    -------
    ndarray of bool, shape (T, S)

    Examples
    --------
    >>> streaming_mask(5, 1, 2).astype(int).tolist()
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]]
    """
    func = "streaming_mask"
    n_sink = validate_positive_int(func, "n_sink", n_sink, minimum=0)
    window = validate_positive_int(func, "window", window)
    local = sliding_window_mask(T, window, S)  # validates T and S
    S = local.shape[-1]
    p = np.arange(T)[:, None] + (S - T)  # (T, 1): each query's position
    s = np.arange(S)[None, :]
    return local | ((s < n_sink) & (s <= p))
