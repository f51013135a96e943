"""Two changes to what a head returns: a sigmoid gate on its output, and the difference of two
softmaxes.

Taught in ``notebooks/13_attention_2025.ipynb``.

- **Gated attention** (Qiu et al. 2025, *Gated Attention for Large Language Models*; the gate of
  Qwen3-Next): ``o_i ← o_i ⊙ σ(a W_θ)``, with ``a`` the block's normalised input and the gate
  one number per head and query (*headwise*, ``W_θ`` of shape (d_model, h)) or one per feature
  (*elementwise*, (d_model, h·d_v)). The paper's best position is after the scaled dot-product
  attention (their G1), before ``W_o``. A head can then return almost nothing for a query
  without parking its softmax weight on a sink token.
- **Differential attention** (Ye et al. 2024, *Differential Transformer*): each head splits its
  queries and keys in two halves and subtracts two attention maps,
  ``(softmax(q₁k₁ᵀ/√d) − λ softmax(q₂k₂ᵀ/√d)) v``, so weight that both maps put on the same
  irrelevant keys (attention noise) cancels. ``λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init``
  with ``λ_init = 0.8 − 0.6·exp(−0.3·(l − 1))`` at layer ``l = 1, 2, ...``; each head's output
  is then RMS-normalised and scaled by ``1 − λ_init``.

:func:`gate_cost` and :func:`differential_cost` count what each adds to a layer.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_float_array, fail, validate_positive_int
from ..attention import sdpa_unchecked, validate_qkv
from ..block import rms_norm, sigmoid

__all__ = ["diff_lambda", "differential_attention", "differential_cost", "gate_cost",
           "gated_heads", "lambda_init"]


def gated_heads(o, a, W_gate, kind: str = "headwise") -> tuple[np.ndarray, np.ndarray]:
    """Each head's output times a sigmoid gate computed from the block's input.

    Parameters
    ----------
    o : ndarray of float, shape (..., h, T, d_v)
        The heads' outputs (``weights @ v``), before they are merged and ``W_o`` is applied.
    a : ndarray of float, shape (..., T, d_model)
        The block's normalised input (the one the projections read).
    W_gate : ndarray of float, shape (d_model, h) or (d_model, h·d_v)
        Headwise or elementwise gate weights.
    kind : {"headwise", "elementwise"}

    Returns
    -------
    gated : ndarray, shape (..., h, T, d_v)
    gate : ndarray, shape (..., h, T, 1) or (..., h, T, d_v)
        ``σ(a W_gate)`` laid out like ``o``; every entry in (0, 1).

    Raises
    ------
    ValueError
        On mismatched shapes or an unknown ``kind``.

    Examples
    --------
    >>> o, a = np.ones((2, 3, 4)), np.zeros((3, 5))
    >>> gated, gate = gated_heads(o, a, np.zeros((5, 2)))
    >>> gated.shape, float(gate.mean())
    ((2, 3, 4), 0.5)
    """
    func = "gated_heads"
    o = as_float_array(func, "o", o)
    a = as_float_array(func, "a", a)
    W = as_float_array(func, "W_gate", W_gate)
    if o.ndim < 3 or a.ndim < 2 or a.shape[-2] != o.shape[-2]:
        raise fail(func, f"o has shape {o.shape} and a {a.shape}; expected (..., h, T, d_v) "
                         "and (..., T, d_model) with the same T")
    h, T, d_v = o.shape[-3:]
    if kind not in ("headwise", "elementwise"):
        raise fail(func, f"kind={kind!r} must be 'headwise' or 'elementwise'")
    width = h if kind == "headwise" else h * d_v
    if W.shape != (a.shape[-1], width):
        want = "h" if kind == "headwise" else "h·d_v"
        raise fail(func, f"W_gate has shape {W.shape}; expected (d_model, {want}) = "
                         f"{(a.shape[-1], width)} for a {kind} gate")
    g = sigmoid(a @ W)  # (..., T, width)
    if kind == "headwise":
        gate = np.swapaxes(g, -1, -2)[..., None]  # (..., h, T, 1)
    else:
        gate = np.swapaxes(g.reshape(*g.shape[:-1], h, d_v), -2, -3)  # (..., h, T, d_v)
    return o * gate, gate


def lambda_init(layer: int) -> float:
    """The Differential Transformer's initial λ at layer ``layer`` (1 = first):
    ``0.8 − 0.6·exp(−0.3·(layer − 1))``.

    Examples
    --------
    >>> [round(lambda_init(l), 3) for l in (1, 2, 12)]
    [0.2, 0.356, 0.778]
    """
    layer = validate_positive_int("lambda_init", "layer", layer)
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


def diff_lambda(lambda_q1, lambda_k1, lambda_q2, lambda_k2, lam_init: float) -> float:
    """``λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init`` (learned vectors of width d).

    Examples
    --------
    >>> z = np.zeros(4)
    >>> diff_lambda(z, z, z, z, 0.2)
    0.2
    """
    vecs = [as_float_array("diff_lambda", n, x) for n, x in
            (("lambda_q1", lambda_q1), ("lambda_k1", lambda_k1), ("lambda_q2", lambda_q2),
             ("lambda_k2", lambda_k2))]
    if len({v.shape for v in vecs}) != 1 or vecs[0].ndim != 1:
        raise fail("diff_lambda", f"the four vectors have shapes {[v.shape for v in vecs]}; "
                                  "expected four of shape (d,)")
    q1, k1, q2, k2 = vecs
    return float(np.exp(q1 @ k1) - np.exp(q2 @ k2) + lam_init)


def differential_attention(q1, k1, q2, k2, v, lam, mask=None, *, lam_init=None):
    """``(softmax(q₁k₁ᵀ/√d) − λ softmax(q₂k₂ᵀ/√d)) v``, optionally with the paper's per-head
    RMSNorm and ``(1 − λ_init)`` scale.

    Parameters
    ----------
    q1, q2 : ndarray of float, shape (..., T, d)
    k1, k2 : ndarray of float, shape (..., S, d)
    v : ndarray of float, shape (..., S, d_v)
    lam : float or ndarray, broadcastable to (..., 1, 1)
        λ (one per head, on the head axis at -3, or one for all).
    mask : ndarray of bool, broadcastable to (..., T, S), optional
    lam_init : float, optional
        When given, each row of the output is RMS-normalised and multiplied by
        ``1 − lam_init`` (the paper's GroupNorm step).

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
    weights : ndarray, shape (..., T, S)
        The differential map ``w₁ − λ w₂``: rows sum to ``1 − λ`` and may be negative.
    maps : tuple of two ndarrays (..., T, S)
        ``w₁`` and ``w₂``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 6))
    >>> out, w, _ = differential_attention(q, k, q, k, v, 0.5)
    >>> out.shape, w.sum(axis=-1).round(6).tolist()
    ((3, 6), [0.5, 0.5, 0.5])
    """
    func = "differential_attention"
    q1, k1, v, m, _b, (_T, _S, d, _dv) = validate_qkv(func, q1, k1, v, mask)
    q2, k2, _, _, _, _ = validate_qkv(func, q2, k2, v, mask)
    if q2.shape[-1] != d:
        raise fail(func, f"q2 has width {q2.shape[-1]}; expected d={d} (from q1)")
    lam = np.asarray(lam, dtype=q1.dtype)
    if lam.ndim == 1:
        lam = lam[:, None, None]  # one per head: (h, 1, 1)
    # Two scaled dot-product attentions over the same values (checked above, so their kernel),
    # subtracted: (w₁ − λ w₂) v = w₁ v − λ w₂ v, as the paper's two FlashAttention calls.
    o1, w1 = sdpa_unchecked(q1, k1, v, m)
    o2, w2 = sdpa_unchecked(q2, k2, v, m)
    weights = w1 - lam * w2
    out = o1 - lam * o2
    if lam_init is not None:
        out = (1.0 - lam_init) * rms_norm(out, None, 1e-5)
    return out, weights, (w1, w2)


def gate_cost(d_model: int, h: int, d_v: int, T: int, kind: str = "headwise") -> dict:
    """What an output gate adds to one attention layer.

    Returns
    -------
    dict
        ``params`` (the gate's weights), ``flops`` (its projection ``2·T·d_model·width`` plus
        one multiply per gated output entry, ``T·h·d_v``; the sigmoid is not counted), and
        ``layer_params`` (``4·d_model·h·d_v``, a layer without biases, for scale).

    Examples
    --------
    >>> gate_cost(64, 4, 16, 128)["params"], gate_cost(64, 4, 16, 128, "elementwise")["params"]
    (256, 4096)
    """
    func = "gate_cost"
    for name, n in (("d_model", d_model), ("h", h), ("d_v", d_v), ("T", T)):
        validate_positive_int(func, name, n)
    if kind not in ("headwise", "elementwise"):
        raise fail(func, f"kind={kind!r} must be 'headwise' or 'elementwise'")
    width = h if kind == "headwise" else h * d_v
    return {"params": d_model * width, "flops": 2 * T * d_model * width + T * h * d_v,
            "layer_params": 4 * d_model * h * d_v}


def differential_cost(T: int, S: int, d: int, d_v: int) -> dict:
    """FLOPs of one differential head against one ordinary head of query width ``2d``.

    A differential head's queries and keys are two halves of width ``d``: its two score maps
    cost what one map of width ``2d`` costs (``2·T·S·2d``), but it runs two softmaxes and
    subtracts the maps (``2·T·S``) before the weighted sum (``2·T·S·d_v``).

    Returns
    -------
    dict
        ``differential`` and ``ordinary`` FLOPs (scores, combine, weighted sum), and
        ``softmax_maps``: 2 against 1.

    Examples
    --------
    >>> c = differential_cost(128, 128, 16, 32)
    >>> c["differential"] - c["ordinary"] == 2 * 128 * 128
    True
    """
    for name, n in (("T", T), ("S", S), ("d", d), ("d_v", d_v)):
        validate_positive_int("differential_cost", name, n)
    scores = 2 * T * S * (2 * d)
    weighted = 2 * T * S * d_v
    return {"differential": scores + 2 * T * S + weighted, "ordinary": scores + weighted,
            "softmax_maps": (2, 1)}
