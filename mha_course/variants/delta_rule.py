"""The delta rule: linear attention whose state overwrites instead of only adding (DeltaNet), and
its gated form (Gated DeltaNet); recurrent and parallel forms.

Taught in ``notebooks/13_attention_2025.ipynb`` (deep dive 07b of lesson 07 introduced linear
attention and its recall problem).

Lesson 07's causal linear attention adds ``φ(k_t) v_tᵀ`` to a ``(d_k, d_v)`` state at every token,
so old associations are never removed and every read returns a blend. The **delta rule**
(Schlag et al. 2021, *Linear Transformers Are Secretly Fast Weight Programmers*; parallelised
by Yang et al. 2024, *DeltaNet*) first reads what the state returns for the new key and writes
only the error, with a step size ``β_t ∈ (0, 1]``::

    S_t = S_{t-1} + β_t k_t (v_t − S_{t-1}ᵀ k_t)ᵀ,         o_t = S_tᵀ q_t

With ``|k_t| = 1`` and ``β_t = 1`` the state then returns exactly ``v_t`` for ``k_t``: one
least-squares step on ``½|Sᵀk_t − v_t|²``. **Gated DeltaNet** (Yang, Kautz and Hatamizadeh 2024)
also decays the whole state by ``α_t ∈ (0, 1]`` first (Mamba-2's gate), so it can forget::

    S_t = α_t (S_{t-1} − β_t k_t k_tᵀ S_{t-1}) + β_t k_t v_tᵀ

Keys and queries are L2-normalised (``normalize=True``), as DeltaNet does: with ``β|k|² > 2`` the
update would overshoot and the state blow up.

:func:`delta_rule` runs the recurrence token by token; :func:`delta_rule_parallel` computes the
same outputs without a loop over tokens, by solving one triangular system (the "UT transform"
behind DeltaNet's chunked kernel): with ``u_t = β_t (v_t − α_t S_{t-1}ᵀ k_t)`` the state is
``S_t = Σ_{i≤t} (γ_t/γ_i) k_i u_iᵀ`` (``γ_t = α_1⋯α_t``), so
``(I + tril(diag(β) (Γ ⊙ K Kᵀ), −1)) U = diag(β) V`` and ``O = tril(Γ ⊙ Q Kᵀ) U``.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail

__all__ = ["delta_rule", "delta_rule_parallel", "l2_normalize"]


def l2_normalize(x, eps: float = 1e-6) -> np.ndarray:
    """``x / max(|x|, eps)`` along the last axis.

    Examples
    --------
    >>> l2_normalize(np.array([[3.0, 4.0]])).tolist()
    [[0.6, 0.8]]
    """
    x = as_float_array("l2_normalize", "x", x)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def _inputs(func: str, q, k, v, beta, alpha, normalize: bool):
    q = as_float_array(func, "q", q)
    k = as_float_array(func, "k", k)
    v = as_float_array(func, "v", v)
    if q.ndim < 2 or q.shape != k.shape or v.shape[:-1] != k.shape[:-1]:
        raise fail(func, f"q {q.shape}, k {k.shape}, v {v.shape}; expected (..., T, d_k) twice "
                         "and (..., T, d_v)")
    T = k.shape[-2]
    beta = np.broadcast_to(as_float_array(func, "beta", np.asarray(beta, dtype=float)),
                           k.shape[:-1])
    if not ((beta > 0) & (beta <= 1)).all():
        raise fail(func, "beta must lie in (0, 1] (the step size of each write)")
    if alpha is None:
        alpha = np.ones(k.shape[:-1])
    alpha = np.broadcast_to(as_float_array(func, "alpha", np.asarray(alpha, dtype=float)),
                            k.shape[:-1])
    if not ((alpha > 0) & (alpha <= 1)).all():
        raise fail(func, "alpha must lie in (0, 1] (the decay of the state)")
    if normalize:
        q, k = l2_normalize(q), l2_normalize(k)
    return q, k, v, beta, alpha, T


def delta_rule(q, k, v, beta=1.0, alpha=None, *, normalize: bool = True, state=None):
    """The (gated) delta rule, one token at a time.

    Parameters
    ----------
    q, k : ndarray of float, shape (..., T, d_k)
    v : ndarray of float, shape (..., T, d_v)
    beta : float or ndarray, broadcastable to (..., T)
        Write strength in (0, 1] (DeltaNet: ``σ(x W_β)``).
    alpha : float or ndarray, broadcastable to (..., T), optional
        Decay in (0, 1] applied to the state before each write (Gated DeltaNet); None: 1.
    normalize : bool, default True
        L2-normalise ``q`` and ``k`` first.
    state : ndarray of float, shape (..., d_k, d_v), optional
        The state before the first token (default zeros).

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
        ``o_t = S_tᵀ q_t``.
    state : ndarray, shape (..., d_k, d_v)
        ``S_T``: what a decoder carries to the next token (constant size, as in lesson 07).

    Raises
    ------
    ValueError
        On mismatched shapes or ``beta``/``alpha`` outside (0, 1].

    Examples
    --------
    >>> k = np.eye(3); v = np.arange(6.0).reshape(3, 2)
    >>> out, S = delta_rule(k, k, v)
    >>> (S.T @ k[1]).tolist()  # orthonormal keys, beta = 1: each value is stored exactly
    [2.0, 3.0]
    """
    func = "delta_rule"
    q, k, v, beta, alpha, T = _inputs(func, q, k, v, beta, alpha, normalize)
    shape = k.shape[:-2] + (k.shape[-1], v.shape[-1])
    S = np.zeros(shape, dtype=np.result_type(k, v)) if state is None else (
        as_float_array(func, "state", state).astype(np.result_type(k, v), copy=True))
    if S.shape != shape:
        raise fail(func, f"state has shape {S.shape}; expected (..., d_k, d_v) = {shape}")
    out = np.empty(k.shape[:-1] + (v.shape[-1],), dtype=S.dtype)
    for t in range(T):
        k_t, v_t = k[..., t, :], v[..., t, :]  # (..., d_k), (..., d_v)
        S = alpha[..., t, None, None] * S
        read = np.einsum("...kv,...k->...v", S, k_t)  # what the state returns for k_t
        S = S + beta[..., t, None, None] * k_t[..., :, None] * (v_t - read)[..., None, :]
        out[..., t, :] = np.einsum("...kv,...k->...v", S, q[..., t, :])
    return out, S


def delta_rule_parallel(q, k, v, beta=1.0, alpha=None, *, normalize: bool = True):
    """The same outputs as :func:`delta_rule` (from a zero state), with no loop over tokens.

    Solves ``(I + L) U = diag(β) V`` with ``L = tril(diag(β)(Γ ⊙ K Kᵀ), −1)`` and returns
    ``tril(Γ ⊙ Q Kᵀ) U``, ``Γ[t, i] = α_{i+1}⋯α_t`` (module docstring). Costs ``O(T²)`` like
    softmax attention: the point is parallelism across tokens (DeltaNet applies it chunk by
    chunk), not fewer FLOPs.

    Returns
    -------
    ndarray, shape (..., T, d_v)

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(5, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    >>> bool(np.allclose(delta_rule_parallel(q, k, v, 0.5), delta_rule(q, k, v, 0.5)[0]))
    True
    """
    func = "delta_rule_parallel"
    q, k, v, beta, alpha, T = _inputs(func, q, k, v, beta, alpha, normalize)
    log_g = np.cumsum(np.log(alpha), axis=-1)  # (..., T): log γ_t
    gamma = np.exp(log_g[..., :, None] - log_g[..., None, :])  # (..., T, T): γ_t / γ_i
    lower = np.tril(np.ones((T, T), dtype=bool))
    gamma = np.where(lower, gamma, 0.0)  # only i <= t
    kk = k @ np.swapaxes(k, -1, -2)  # (..., T, T)
    L = np.where(np.tril(lower, -1), beta[..., :, None] * gamma * kk, 0.0)
    A = np.eye(T) + L  # unit lower triangular
    U = np.linalg.solve(A, beta[..., :, None] * v)  # (..., T, d_v)
    return (gamma * (q @ np.swapaxes(k, -1, -2))) @ U
