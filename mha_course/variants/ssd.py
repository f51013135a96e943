"""The state-space view of causal linear attention: one function, three forms (Mamba-2's
state-space duality, Dao and Gu 2024).

Taught in ``notebooks/deep_dives/13c_state_space_view.ipynb`` (deep dive 07b of lesson 07
introduced linear attention as an RNN; deep dive 13b, the delta rule).

Causal linear attention with a scalar decay ``a_t ∈ (0, 1]`` per token (no feature map, no
normaliser, as in Mamba-2, RetNet and GLA with one gate per head) is the recurrence::

    S_t = a_t S_{t-1} + k_t v_tᵀ,        o_t = S_tᵀ q_t          (S_t: (d_k, d_v), S_0 = 0)

Unrolled, ``o_t = Σ_{j≤t} (a_{j+1}⋯a_t) (q_t·k_j) v_j``: the masked matrix
``O = (L ∘ Q Kᵀ) V`` with ``L[t, j] = a_{j+1}⋯a_t`` for ``j ≤ t`` and 0 above the diagonal
(:func:`decay_mask`; ``a = 1`` gives the causal mask). ``L`` is *1-semiseparable*: every block
of it on or below the diagonal has rank 1 (``L[t, j] = γ_t / γ_j``, ``γ_t = a_1⋯a_t``).

- :func:`ssd_quadratic`: ``(L ∘ Q Kᵀ) V``, ``O(T² d)``, no loop;
- :func:`ssd_recurrent`: the recurrence, ``O(T d²)``, one step per token;
- :func:`ssd_chunked`: the chunked scan between them. Each chunk of ``C`` tokens takes the
  quadratic form inside the chunk and reads the state carried in from the chunks before,
  decayed to each query; then the state is decayed across the chunk and the chunk's keys and
  values are added. ``O(T C d + T d²)`` FLOPs, ``T / C`` sequential steps;
- :func:`ssd_flops`: the FLOPs each of the three functions does, counted as their code runs.

Shape letters: ``T`` tokens, ``d_k`` the key (state) width, ``d_v`` the value width, ``...``
batch axes (heads, batch) that broadcast.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, fmt_shape, validate_positive_int
from ..cost import attention_flops

__all__ = ["decay_mask", "ssd_chunked", "ssd_flops", "ssd_quadratic", "ssd_recurrent"]


def _decays(func: str, a, shape):
    """``a`` broadcast to ``shape`` (..., T), every entry in (0, 1]; None: all ones."""
    if a is None:
        return np.ones(shape)
    a = as_float_array(func, "a", np.asarray(a, dtype=float))
    try:
        a = np.broadcast_to(a, shape)
    except ValueError:
        raise fail(func, f"a has shape {fmt_shape(a.shape)}; expected (..., T) = "
                         f"{fmt_shape(shape)} or broadcastable to it") from None
    if not ((a > 0) & (a <= 1)).all():
        raise fail(func, "a must lie in (0, 1] (the decay of the state at each token)")
    return a


def _inputs(func: str, q, k, v, a):
    q = as_float_array(func, "q", q)
    k = as_float_array(func, "k", k)
    v = as_float_array(func, "v", v)
    if q.ndim < 2 or q.shape[-2:] != k.shape[-2:] or v.ndim < 2 or v.shape[-2] != k.shape[-2]:
        raise fail(func, f"q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}, v "
                         f"{fmt_shape(v.shape)}; expected (..., T, d_k) twice and (..., T, d_v)")
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    return q, k, v, _decays(func, a, batch + (k.shape[-2],))


def decay_mask(a) -> np.ndarray:
    """The 1-semiseparable mask ``L[t, j] = a_{j+1}⋯a_t`` for ``j ≤ t``, 0 above the diagonal.

    Parameters
    ----------
    a : ndarray of float, shape (..., T)
        The decay at each token, in (0, 1]; all ones gives the causal mask (as floats).

    Returns
    -------
    ndarray, shape (..., T, T)
        1 on the diagonal (the empty product), ``a_t`` just below it, and so on.

    Raises
    ------
    ValueError
        If ``a`` is not a floating array of at least one axis, or an entry is outside (0, 1].

    Examples
    --------
    >>> decay_mask(np.array([0.5, 0.5, 0.5])).round(4).tolist()
    [[1.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.25, 0.5, 1.0]]
    """
    a = as_float_array("decay_mask", "a", a)
    if a.ndim < 1:
        raise fail("decay_mask", f"a has shape {fmt_shape(a.shape)}; expected (..., T)")
    a = _decays("decay_mask", a, a.shape)
    cs = np.cumsum(np.log(a), axis=-1)  # (..., T): log γ_t
    T = a.shape[-1]
    lower = np.tril(np.ones((T, T), dtype=bool))
    # exp(log γ_t − log γ_j) on and below the diagonal; the upper triangle is never exponentiated
    diff = np.where(lower, cs[..., :, None] - cs[..., None, :], -np.inf)
    return np.exp(diff)


def ssd_quadratic(q, k, v, a=None) -> np.ndarray:
    """Causal linear attention with decay as one masked matrix: ``(L ∘ Q Kᵀ) V``.

    Parameters
    ----------
    q, k : ndarray of float, shape (..., T, d_k)
    v : ndarray of float, shape (..., T, d_v)
    a : ndarray of float, broadcastable to (..., T), optional
        The decay at each token, in (0, 1]; None: 1 (plain causal linear attention).

    Returns
    -------
    ndarray, shape (..., T, d_v)

    Raises
    ------
    ValueError
        On shapes that do not fit or a decay outside (0, 1].

    Examples
    --------
    >>> q = k = np.eye(2); v = np.array([[1.0], [10.0]])
    >>> ssd_quadratic(q, k, v, np.array([1.0, 0.5])).tolist()
    [[1.0], [10.0]]
    """
    q, k, v, a = _inputs("ssd_quadratic", q, k, v, a)
    return (decay_mask(a) * (q @ np.swapaxes(k, -1, -2))) @ v  # (..., T, T) @ (..., T, d_v)


def ssd_recurrent(q, k, v, a=None, state=None):
    """The same function as a recurrence: ``S_t = a_t S_{t-1} + k_t v_tᵀ``, ``o_t = S_tᵀ q_t``.

    Parameters
    ----------
    q, k, v, a
        As :func:`ssd_quadratic`.
    state : ndarray of float, shape (..., d_k, d_v), optional
        The state before the first token (default zeros): what a decoder carries.

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
    state : ndarray, shape (..., d_k, d_v)
        ``S_T``.

    Raises
    ------
    ValueError
        As :func:`ssd_quadratic`, or a ``state`` of the wrong shape.

    Examples
    --------
    >>> q = k = np.eye(2); v = np.array([[1.0], [10.0]])
    >>> out, S = ssd_recurrent(q, k, v, np.array([1.0, 0.5]))
    >>> out.tolist(), S.tolist()
    ([[1.0], [10.0]], [[0.5], [10.0]])
    """
    func = "ssd_recurrent"
    q, k, v, a = _inputs(func, q, k, v, a)
    S = _state(func, state, q, k, v)
    out = np.empty(S.shape[:-2] + (k.shape[-2], v.shape[-1]), dtype=S.dtype)
    for t in range(k.shape[-2]):
        S = a[..., t, None, None] * S + k[..., t, :, None] * v[..., t, None, :]  # decay, write
        out[..., t, :] = np.einsum("...kv,...k->...v", S, q[..., t, :])  # then read: o_t = S_tᵀ q_t
    return out, S


def _state(func, state, q, k, v):
    shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]) + (k.shape[-1],
                                                                           v.shape[-1])
    dtype = np.result_type(q, k, v)
    if state is None:
        return np.zeros(shape, dtype=dtype)
    S = as_float_array(func, "state", state)
    if S.shape != shape:
        raise fail(func, f"state has shape {fmt_shape(S.shape)}; expected (..., d_k, d_v) = "
                         f"{fmt_shape(shape)}")
    return S.astype(dtype, copy=True)


def ssd_chunked(q, k, v, a=None, chunk: int = 64, state=None):
    """The same function as a chunked scan (Mamba-2's SSD algorithm): quadratic inside each
    chunk of ``chunk`` tokens, recurrent across chunks.

    For the chunk of positions ``s … e−1`` with ``g_i = a_s⋯a_i`` (the decay from the state
    carried in, ``S_{s-1}``, to position ``i``)::

        O_c = (L_c ∘ Q_c K_cᵀ) V_c + diag(g) Q_c S_{s-1}          intra-chunk + carried state
        S_{e-1} = g_{e-1} S_{s-1} + K_cᵀ diag(g_{e-1} / g) V_c    the state passed on

    The last chunk may be shorter.

    Parameters
    ----------
    q, k, v, a, state
        As :func:`ssd_recurrent`.
    chunk : int, default 64
        Tokens per chunk, ``>= 1``: 1 is the recurrence, ``>= T`` the quadratic form.

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
    state : ndarray, shape (..., d_k, d_v)

    Raises
    ------
    ValueError
        As :func:`ssd_recurrent`, or a ``chunk`` that is not a positive integer.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(7, 3)), rng.normal(size=(7, 3)), rng.normal(size=(7, 2))
    >>> a = rng.uniform(0.5, 1.0, size=7)
    >>> bool(np.allclose(ssd_chunked(q, k, v, a, chunk=3)[0], ssd_quadratic(q, k, v, a)))
    True
    """
    func = "ssd_chunked"
    chunk = validate_positive_int(func, "chunk", chunk)
    q, k, v, a = _inputs(func, q, k, v, a)
    S = _state(func, state, q, k, v)
    T = k.shape[-2]
    out = np.empty(S.shape[:-2] + (T, v.shape[-1]), dtype=S.dtype)
    for s in range(0, T, chunk):
        e = min(s + chunk, T)
        qc, kc, vc = q[..., s:e, :], k[..., s:e, :], v[..., s:e, :]
        cs = np.cumsum(np.log(a[..., s:e]), axis=-1)  # (..., c): log g_i
        g, g_end = np.exp(cs), np.exp(cs[..., -1:])  # (..., c), (..., 1)
        intra = (decay_mask(a[..., s:e]) * (qc @ np.swapaxes(kc, -1, -2))) @ vc  # (..., c, d_v)
        out[..., s:e, :] = intra + g[..., :, None] * (qc @ S)  # read the state carried in
        w = np.exp(cs[..., -1:] - cs)  # (..., c): g_{e-1} / g_j, each key decayed to the end
        S = g_end[..., None] * S + np.swapaxes(kc * w[..., :, None], -1, -2) @ vc
    return out, S


def ssd_flops(T: int, d_k: int, d_v: int, chunk: int) -> dict:
    """FLOPs of :func:`ssd_quadratic`, :func:`ssd_recurrent` and :func:`ssd_chunked` for one
    head, as their code runs (a multiply-add is 2 FLOPs; an elementwise product or sum, 1).

    The decay factors themselves (products of the ``a``'s: ``L``, ``g``, ``w``) are not counted:
    at most ``O(T·C)`` scalars, independent of the widths. Per form:

    - quadratic: ``Q Kᵀ`` ``2T²d_k``, the mask ``T²``, times ``V`` ``2T²d_v`` (the two matmuls
      are one head's ``"scores"`` and ``"weighted_sum"`` terms of
      :func:`~mha_course.cost.attention_flops`, which this function calls);
    - recurrent: per token, the decay ``d_k d_v``, the outer product ``d_k d_v``, the sum
      ``d_k d_v``, the read ``2 d_k d_v``: ``5 T d_k d_v``;
    - chunked, per chunk of ``c`` tokens: the quadratic form on ``c`` tokens
      (``2c²(d_k + d_v) + c²``), the read ``Q_c S`` (``2c d_k d_v``), its decay and the sum
      (``2c d_v``), the keys decayed (``c d_k``), ``K_cᵀ V_c`` (``2c d_k d_v``), the state's
      decay and sum (``2 d_k d_v``).

    Returns
    -------
    dict
        ``{"quadratic", "recurrent", "chunked"}``: FLOPs (int) of each.

    Raises
    ------
    ValueError
        If an argument is not a positive integer.

    Examples
    --------
    >>> ssd_flops(4, 2, 2, 2)
    {'quadratic': 144, 'recurrent': 80, 'chunked': 176}
    """
    func = "ssd_flops"
    T, d_k, d_v, chunk = (validate_positive_int(func, n, x) for n, x in
                          (("T", T), ("d_k", d_k), ("d_v", d_v), ("chunk", chunk)))

    def masked(n):  # (L ∘ Q Kᵀ) V on n tokens: attention's two matmuls for one head, and the mask
        f = attention_flops(n, d_model=d_k, h=1, d_k=d_k, d_v=d_v)  # d_model: projections only
        return f["scores"] + f["weighted_sum"] + n * n

    def one_chunk(c):  # the masked form, the read and its decay, the state's update
        return masked(c) + 4 * c * d_k * d_v + 2 * c * d_v + c * d_k + 2 * d_k * d_v

    full, rest = divmod(T, chunk)  # full chunks, and the shorter last one
    return {
        "quadratic": masked(T),
        "recurrent": 5 * T * d_k * d_v,
        "chunked": full * one_chunk(chunk) + (one_chunk(rest) if rest else 0),
    }
