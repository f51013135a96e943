"""The low-rank bottleneck, fitted: what one head of width ``d_k`` can and cannot reproduce, and
what ``h`` heads of that width can.

Taught in ``notebooks/13_attention_2025.ipynb`` (deep dive 04a §3 of lesson 04 showed the bound
and the SVD fit inline).

A head's logits ``Q Kᵀ`` have rank at most ``d_k`` (Bhojanapalli et al. 2020), so the centred
log-weights of one head are a rank-``d_k`` matrix: :func:`best_rank_fit` gives the closest one
(least squares on the log-weights, through the SVD). ``h`` heads whose value-output maps are
equal average their weight rows, ``(1/h) Σ_i softmax(A_i B_iᵀ)``, and the logarithm of an average
is no longer low-rank: :func:`fit_heads` fits such a mixture to a target by Adam on the
cross-entropy (KL divergence) between the target rows and the mixture's.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, validate_positive_int
from ..softmax import softmax
from ..variants.entropy import attention_entropy
from .train import Adam

__all__ = ["best_rank_fit", "fit_heads", "total_variation"]


def _target(func: str, target) -> np.ndarray:
    p = as_float_array(func, "target", target)
    if p.ndim != 2 or (p <= 0).any() or not np.allclose(p.sum(axis=-1), 1.0):
        raise fail(func, f"target has shape {p.shape}; expected (T, S) rows of positive weights"
                         " that sum to 1")
    return p


def total_variation(a, b) -> np.ndarray:
    """``½ Σ_s |a_s − b_s|`` per row: 0 for equal rows, 1 for disjoint ones."""
    return 0.5 * np.abs(np.asarray(a) - np.asarray(b)).sum(axis=-1)


def best_rank_fit(target, rank: int) -> np.ndarray:
    """The weights of the rank-``rank`` logits closest to ``log target`` (each row centred first:
    the softmax ignores a constant per row).

    Parameters
    ----------
    target : ndarray of float, shape (T, S)
        Rows of positive weights summing to 1.
    rank : int

    Returns
    -------
    ndarray, shape (T, S)
        ``softmax(U_r Σ_r V_rᵀ)`` from the SVD of the centred log-target. When singular values
        tie at the cut (a target whose centred log is a multiple of a permutation minus its
        mean has all its non-zero singular values equal), the best fit is not unique and the
        one returned depends on the LAPACK build.

    Examples
    --------
    >>> p = np.full((3, 4), 0.25)
    >>> bool(np.allclose(best_rank_fit(p, 1), p))
    True
    """
    func = "best_rank_fit"
    p = _target(func, target)
    rank = validate_positive_int(func, "rank", rank)
    log_p = np.log(p)
    centred = log_p - log_p.mean(axis=-1, keepdims=True)
    U, sv, Vt = np.linalg.svd(centred, full_matrices=False)
    r = min(rank, len(sv))
    return softmax((U[:, :r] * sv[:r]) @ Vt[:r])


def fit_heads(target, h: int, d_k: int, *, steps: int = 500, lr: float = 0.05, rng=None):
    """Fit ``(1/h) Σ_i softmax(A_i B_iᵀ)`` to ``target`` (``A_i`` (T, d_k), ``B_i`` (S, d_k)).

    Parameters
    ----------
    target : ndarray of float, shape (T, S)
    h, d_k : int
        Heads and their width.
    steps : int
        Adam steps on the mean over rows of ``−Σ_s target · log mixture`` (the KL divergence
        plus the target's entropy).
    lr : float
    rng : int or numpy.random.Generator, optional
        Seeds the start: entries normal with standard deviation 0.5.

    Returns
    -------
    weights : ndarray, shape (T, S)
        The fitted mixture.
    history : ndarray, shape (steps,)
        The KL divergence (nats per row) before each step.

    Examples
    --------
    >>> p = np.full((4, 5), 0.2)
    >>> w, hist = fit_heads(p, 2, 1, steps=50, rng=0)
    >>> bool(total_variation(w, p).max() < 0.05), bool(hist[-1] < hist[0])
    (True, True)
    """
    func = "fit_heads"
    p = _target(func, target)
    h = validate_positive_int(func, "h", h)
    d_k = validate_positive_int(func, "d_k", d_k)
    steps = validate_positive_int(func, "steps", steps)
    T, S = p.shape
    rng = np.random.default_rng(rng)
    params = {"A": 0.5 * rng.normal(size=(h, T, d_k)), "B": 0.5 * rng.normal(size=(h, S, d_k))}
    opt = Adam(params, lr=lr)
    entropy = attention_entropy(p).mean()
    history = np.empty(steps)
    for step in range(steps):
        P = softmax(params["A"] @ np.swapaxes(params["B"], -1, -2))  # (h, T, S)
        M = P.mean(axis=0)  # (T, S): the heads' average
        history[step] = -(p * np.log(M)).sum(axis=-1).mean() - entropy
        dM = -p / M / T  # d(mean cross-entropy)/dM
        dP = dM / h  # the same for every head
        dZ = P * (dP - (P * dP).sum(axis=-1, keepdims=True))  # through each softmax
        grads = {"A": dZ @ params["B"], "B": np.swapaxes(dZ, -1, -2) @ params["A"]}
        opt.step(grads)
    P = softmax(params["A"] @ np.swapaxes(params["B"], -1, -2))
    return P.mean(axis=0), history
