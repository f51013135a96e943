"""Linear attention (Katharopoulos et al., 2020): O(n) in the sequence by giving up the softmax.

Taught in ``notebooks/07_flash_attention.ipynb``.

Softmax attention weighs key ``s`` for query ``t`` by ``exp(q_t·k_s / √d_k)``, normalised over
the keys. Linear attention replaces that kernel by a product of positive features,
``φ(q_t)·φ(k_s)`` with ``φ(x) = elu(x) + 1``. Then matrix products can be re-associated::

    out_t = Σ_s (φ(q_t)·φ(k_s)) v_s / Σ_s φ(q_t)·φ(k_s)
          = φ(q_t)ᵀ (Σ_s φ(k_s) v_sᵀ) / φ(q_t)ᵀ (Σ_s φ(k_s))

and the (d_k, d_v) sum ``Σ_s φ(k_s) v_sᵀ`` is computed once for all queries: O(n·d_k·d_v)
work instead of O(n²·d), and no (T, S) array. Causal attention becomes running sums over the
positions (a (d_k, d_v) state and a (d_k,) normaliser per step): the "RNN" form that decodes
without a KV cache. Unlike :func:`mha_course.tiled_attention` (exact softmax attention), this
is a *different* attention: its weights are not a softmax, and they cannot concentrate on one
key the way a softmax can.

Shape letters as in :mod:`mha_course.attention`: ``T`` queries, ``S`` keys, ``d_k``, ``d_v``,
``...`` batch axes.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, fmt_shape
from ..attention import validate_qkv


def elu_feature_map(x):
    """The feature map of linear attention: ``φ(x) = elu(x) + 1``, elementwise and positive.

    ``elu(x) + 1`` is ``x + 1`` for ``x > 0`` and ``exp(x)`` for ``x <= 0``: continuous, always
    ``> 0`` (so every weight is positive and the normaliser never vanishes) and linear for large
    inputs (so, unlike ``exp``, it never overflows).

    Parameters
    ----------
    x : ndarray of float, shape (...)
        Any array, e.g. queries (..., T, d_k) or keys (..., S, d_k).

    Returns
    -------
    ndarray, shape (...)
        ``φ(x)``, with the dtype of ``x`` (float32 stays float32).

    Raises
    ------
    ValueError
        If ``x`` is not a real floating array.

    Examples
    --------
    >>> elu_feature_map(np.array([-1.0, 0.0, 2.0])).round(4)
    array([0.3679, 1.    , 3.    ])
    """
    x = as_float_array("elu_feature_map", "x", x)
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))  # (...) -> (...)


def linear_attention(q, k, v, causal=False):
    """Linear attention with ``φ = elu + 1``: ``φ(q) (φ(k)ᵀ v)``, normalised per query.

    For query ``t`` the output is ``φ(q_t)ᵀ (Σ_s φ(k_s) v_sᵀ) / φ(q_t)ᵀ (Σ_s φ(k_s))``: the same
    as weights ``φ(q) φ(k)ᵀ`` with each row divided by its sum, times ``v``, but computed without
    the (T, S) weights, in O((T + S)·d_k·d_v) operations. As in Katharopoulos et al. (2020) the
    scores are not scaled by ``1/√d_k``: a scale inside ``φ`` is not a temperature (only the
    ``exp`` of a softmax turns a scale into sharpness).

    Parameters
    ----------
    q : ndarray of float, shape (..., T, d_k)
        Queries.
    k : ndarray of float, shape (..., S, d_k)
        Keys.
    v : ndarray of float, shape (..., S, d_v)
        Values. The batch axes of ``q``, ``k`` and ``v`` broadcast together.
    causal : bool, default False
        Query ``t`` sees only keys ``s <= t + (S - T)``: the queries are the *last* ``T`` of the
        ``S`` positions, as :func:`mha_course.causal_mask` aligns them (``T == S`` for
        self-attention; ``T < S`` when continuing a sequence). Computed as running sums,
        ``np.cumsum`` over the keys of ``φ(k_s) v_sᵀ`` and of ``φ(k_s)``; this vectorised form
        holds the (..., S, d_k, d_v) running states, a recurrent decoder would hold one.

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
        The outputs, in the common dtype of the inputs (float32 stays float32). No weights are
        returned: the point of the method is never to form them.

    Raises
    ------
    ValueError
        As :func:`mha_course.scaled_dot_product_attention` for the shapes and dtypes of ``q``,
        ``k`` and ``v``; if ``S == 0`` (nothing to normalise by); or if ``causal=True`` with
        more queries than keys (``T > S``).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 7, 4)), rng.normal(size=(2, 7, 3))
    >>> linear_attention(q, k, v).shape
    (2, 5, 3)
    """
    func = "linear_attention"
    q, k, v, _, _, (T, S, d_k, d_v) = validate_qkv(func, q, k, v, None)
    if S == 0:
        raise fail(func, f"k has shape {fmt_shape(k.shape)}; expected at least one key (S >= 1)")
    if causal and T > S:
        raise fail(
            func,
            f"causal=True needs T <= S (the queries are the last T of S positions); "
            f"got T={T} from q, S={S} from k",
        )
    dtype = np.result_type(q, k, v)
    fq = elu_feature_map(q).astype(dtype, copy=False)  # (..., T, d_k)
    fk = elu_feature_map(k).astype(dtype, copy=False)  # (..., S, d_k)
    v = v.astype(dtype, copy=False)
    if not causal:
        kv = np.swapaxes(fk, -1, -2) @ v  # (..., d_k, S) @ (..., S, d_v) -> (..., d_k, d_v)
        z = fk.sum(axis=-2)[..., None]  # (..., S, d_k) -> (..., d_k, 1)
        return (fq @ kv) / (fq @ z)  # (..., T, d_v) / (..., T, 1)
    kv = np.cumsum(fk[..., :, :, None] * v[..., :, None, :], axis=-3)  # (..., S, d_k, d_v)
    z = np.cumsum(fk, axis=-2)  # (..., S, d_k)
    kv, z = kv[..., S - T :, :, :], z[..., S - T :, :]  # the states the last T queries see
    # (..., T, 1, d_k) @ (..., T, d_k, d_v) -> (..., T, 1, d_v) -> (..., T, d_v)
    num = (fq[..., None, :] @ kv)[..., 0, :]
    den = np.sum(fq * z, axis=-1, keepdims=True)  # (..., T, d_k) -> (..., T, 1)
    return num / den
