"""Keeping attention logits in range: soft-capping and QK-norm, with their backward passes.

Taught in ``notebooks/13_attention_2025.ipynb``.

Two fixes for *attention-logit growth* (Dehghani et al. 2023, ViT-22B; Wortsman et al. 2023,
small-scale proxies): when ``|q|·|k|`` grows during training, the scaled scores
``s = q·k / √d_k`` grow with it, the softmax saturates and a head's entropy collapses.

- **Soft-capping** (Gemma 2: ``c = 50`` on the attention logits, 30 on the output logits)
  replaces each logit by ``c · tanh(s / c)``: close to ``s`` while ``|s| ≪ c``, never beyond
  ``±c``. It goes *before* the mask: a masked logit must stay ``-inf``, and ``c·tanh(-inf/c)`` is
  ``-c``, a finite score that leaks weight (:func:`soft_cap` refuses infinite input for that
  reason).
- **QK-norm** (ViT-22B's LayerNorm on q and k; RMSNorm in OLMo 2, Qwen3, Gemma 3) normalises
  each query and key before the scores, so ``|q|`` and ``|k|`` are fixed by learned gains
  (``weight``) rather than free to grow with the projections. Qwen3 and Gemma 3 normalise each
  head's ``d_k`` features (:func:`qk_norm` on arrays shaped ``(..., h, T, d_k)``); OLMo 2
  normalises the whole ``h·d_k``-wide projection before splitting it into heads.

:func:`logit_stats` measures what the fixes control: the largest scaled logit and the mean
entropy of every head.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, validate_mask
from ..block import rms_norm, rms_norm_backward
from .entropy import attention_entropy

__all__ = ["logit_stats", "qk_norm", "qk_norm_backward", "soft_cap", "soft_cap_backward"]


def _cap(func: str, cap) -> float:
    if isinstance(cap, (bool, np.bool_)) or not isinstance(cap, (int, float, np.floating)):
        raise fail(func, f"cap={cap!r} must be a positive number")
    if not (np.isfinite(cap) and cap > 0):
        raise fail(func, f"cap={cap!r} must be a positive finite number")
    return float(cap)


def soft_cap(x, cap: float) -> np.ndarray:
    """``cap · tanh(x / cap)``: logits squashed smoothly into ``(-cap, cap)``.

    Apply it to the scaled scores *before* masking (FlashAttention and Gemma 2 do): a logit
    already set to ``-inf`` by a mask would come out as ``-cap``, a finite score that takes
    weight from the softmax. Infinite input is refused for that reason.

    Parameters
    ----------
    x : ndarray of float
        Logits (scaled attention scores, or a model's output logits).
    cap : float
        ``c > 0`` (Gemma 2: 50 for attention, 30 for the output).

    Returns
    -------
    ndarray, same shape and dtype as x
        ``|result| < cap``; about ``x - x³/(3 cap²)`` for small ``x``.

    Raises
    ------
    ValueError
        If ``cap`` is not a positive number, ``x`` is not a float array or holds an infinity
        (soft-cap before the mask, not after).

    Examples
    --------
    >>> soft_cap(np.array([0.0, 10.0, 1000.0]), 50.0).round(3).tolist()
    [0.0, 9.869, 50.0]
    """
    func = "soft_cap"
    c = _cap(func, cap)
    x = as_float_array(func, "x", x)
    if np.isinf(x).any():
        raise fail(func, "x holds ±inf: soft-cap the scores before masking them (a masked "
                         "-inf would become -cap, a finite score that takes weight)")
    return (c * np.tanh(x / c)).astype(x.dtype, copy=False)


def soft_cap_backward(grad_y, x, cap: float) -> np.ndarray:
    """The gradient of :func:`soft_cap`: ``dx = grad_y · (1 − tanh²(x / cap))``.

    Parameters
    ----------
    grad_y, x : ndarray of float, the same shape
    cap : float

    Returns
    -------
    ndarray, shape of x
        At most ``grad_y`` in size: the cap shrinks the gradient of a large logit towards 0.

    Examples
    --------
    >>> soft_cap_backward(np.ones(3), np.array([0.0, 50.0, 500.0]), 50.0).round(4).tolist()
    [1.0, 0.42, 0.0]
    """
    func = "soft_cap_backward"
    c = _cap(func, cap)
    x = as_float_array(func, "x", x)
    grad_y = as_float_array(func, "grad_y", grad_y)
    if grad_y.shape != x.shape:
        raise fail(func, f"grad_y has shape {grad_y.shape}; expected x's shape {x.shape}")
    t = np.tanh(x / c)
    return grad_y * (1.0 - t * t)


def qk_norm(x, weight=None, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm of each query (or key) over its last axis, times a learned gain.

    ``x / sqrt(mean(x²) + eps) · weight``: on ``(..., h, T, d_k)`` arrays this is the per-head
    QK-norm of Qwen3 and Gemma 3 (each head's ``d_k`` features); on the ``(..., T, h·d_k)``
    projection before the heads are split it is OLMo 2's. The same function as
    :func:`~mha_course.block.rms_norm`, named for its place in the attention.

    Parameters
    ----------
    x : ndarray of float, shape (..., d)
    weight : ndarray of float, shape (d,), optional
        The gain (ones when omitted). Before the gains each normalised row has ``|x̂| = √d``
        (a little less with ``eps``); the gains are per element, so ``|q| <= √d · max|q gain|``
        and a scaled logit ``q·k/√d`` is at most ``√d · max|q gain| · max|k gain|``, whatever
        the projections do.
    eps : float, default 1e-6
        Pass the model's config value: real models use their ``rms_norm_eps`` here (Qwen3's
        ``q_norm = Qwen3RMSNorm(head_dim, eps=config.rms_norm_eps)``, 1e-6;
        :class:`~mha_course.models.gpt_variants.VariantGPT` its ``GPTConfig.eps``).

    Returns
    -------
    ndarray, shape of x

    Examples
    --------
    >>> q = np.array([[3.0, 4.0], [30.0, 40.0]])
    >>> qk_norm(q).round(3).tolist()
    [[0.849, 1.131], [0.849, 1.131]]
    """
    return rms_norm(x, weight, eps)


def qk_norm_backward(grad_y, x, weight=None, eps: float = 1e-6):
    """The gradients of :func:`qk_norm`: ``(dx, dweight)`` (``dweight`` summed over every
    leading axis, None without a weight)."""
    return rms_norm_backward(grad_y, x, weight, eps)


def logit_stats(scores, mask=None) -> dict[str, np.ndarray]:
    """What logit growth looks like, per head: the largest scaled logit and the mean entropy.

    Parameters
    ----------
    scores : ndarray of float, shape (..., h, T, S)
        Scaled attention logits (``q·k/√d_k``, after any cap), one ``(T, S)`` block per head.
    mask : ndarray of bool, broadcastable to (..., h, T, S), optional
        True = may attend; masked logits are left out of the maximum and get no weight.

    Returns
    -------
    dict
        ``max_logit`` (h,): the largest allowed logit of each head over every other axis;
        ``max_abs_logit`` (h,): the largest absolute value; ``entropy`` (h,): the mean, over
        every query with at least one allowed key, of its weights' entropy in nats.

    Raises
    ------
    ValueError
        If ``scores`` has fewer than 3 axes or the mask does not broadcast.

    Examples
    --------
    >>> s = np.zeros((2, 3, 4))
    >>> s[1, :, 0] = 20.0
    >>> stats = logit_stats(s)
    >>> stats["max_logit"].tolist(), stats["entropy"].round(3).tolist()
    ([0.0, 20.0], [1.386, 0.0])
    """
    func = "logit_stats"
    s = as_float_array(func, "scores", scores)
    if s.ndim < 3:
        raise fail(func, f"scores has shape {s.shape}; expected (..., h, T, S)")
    m = validate_mask(func, mask, s.shape, f"scores' shape {s.shape}")
    allowed = np.ones(s.shape, dtype=bool) if m is None else np.broadcast_to(m, s.shape)
    h = s.shape[-3]
    per_head = np.moveaxis(s, -3, 0).reshape(h, -1, s.shape[-1])  # (h, N, S): N query rows
    ok = np.moveaxis(allowed, -3, 0).reshape(h, -1, s.shape[-1])
    filled = np.where(ok, per_head, -np.inf)
    max_logit = filled.max(axis=(1, 2))
    max_abs = np.where(ok, np.abs(per_head), 0.0).max(axis=(1, 2))
    row_max = filled.max(axis=-1, keepdims=True)  # (h, N, 1)
    live = np.isfinite(row_max[..., 0])  # rows with at least one allowed key
    shifted = np.where(ok, per_head - np.where(np.isfinite(row_max), row_max, 0.0), -np.inf)
    e = np.exp(shifted)
    z = e.sum(axis=-1, keepdims=True)
    row_entropy = attention_entropy(e / np.where(z > 0, z, 1.0))  # (h, N)
    counts = np.maximum(live.sum(axis=1), 1)
    entropy = np.where(live, row_entropy, 0.0).sum(axis=1) / counts
    return {"max_logit": max_logit, "max_abs_logit": max_abs, "entropy": entropy + 0.0}
