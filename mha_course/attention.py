"""Scaled dot-product attention and the masks that go with it.

Taught in ``notebooks/03_single_head_attention.ipynb``; :func:`sliding_window_mask` in
``notebooks/06_decoding.ipynb``.

Shape letters: ``T`` query positions, ``S`` key/value positions, ``d_k`` query/key width,
``d_v`` value width; ``...`` any leading batch axes (batch, heads). Masks are boolean with
``True`` = *may attend*.
"""

from __future__ import annotations

import math

import numpy as np

from ._validate import (
    as_float_array,
    fail,
    fmt_shape,
    validate_mask,
    validate_positive_int,
    validate_shape,
)
from .softmax import softmax_inplace


def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, score_mod=None, sink=None
                                 ) -> tuple[np.ndarray, np.ndarray]:
    """``softmax(q kᵀ / √d_k) v``, with an optional boolean mask, score change and sink logit.

    Parameters
    ----------
    q : ndarray of float, shape (..., T, d_k)
        Queries.
    k : ndarray of float, shape (..., S, d_k)
        Keys.
    v : ndarray of float, shape (..., S, d_v)
        Values.
    mask : ndarray of bool, broadcastable to (..., T, S), optional
        ``True`` where query ``t`` may attend to key ``s``. A query with no allowed key gets
        weights 0 and output 0.
    scale : float, optional
        What multiplies ``q kᵀ``; default (None) ``1/√d_k``, as PyTorch's ``scale=None``. A model
        may fix another: Gemma 2 uses ``query_pre_attn_scalar**-0.5`` (27B: ``144**-0.5`` with
        ``d_k = 128``; Hugging Face ``Gemma2Attention.scaling``), DeepSeek's MLA multiplies
        ``1/√(d_k + d_rope)`` by YaRN's ``mscale²``.
    score_mod : callable, optional
        ``score_mod(scores, q_idx, kv_idx) -> scores``: a change to the scaled scores before the
        mask and the softmax (soft-capping, ALiBi, ...), the hook of PyTorch's FlexAttention
        ``score_mod(score, b, h, q_idx, kv_idx)``. FlexAttention calls its function once per
        score with scalar indices; here it is called once, vectorised: ``scores`` is the whole
        (..., T, S) array, ``q_idx`` the (T, 1) and ``kv_idx`` the (1, S) integer indices (0 to
        T - 1 and 0 to S - 1, as FlexAttention's; with the course's bottom-right alignment
        query ``t`` sits at position ``t + S - T``), and the batch and head indices ``b, h`` are
        the leading axes of ``scores`` (broadcast a per-head value as ``(h, 1, 1)``). It may
        change ``scores`` in place and return it; what it returns is softmaxed in place.
    sink : float or ndarray of float, broadcastable to (..., T, 1), optional
        A learned sink logit (gpt-oss): one extra column of every row of the softmax, dropped
        afterwards, so each row's weights sum to ``1 − p_sink`` (a fully masked row gives all
        its weight to the sink). One per head: shape (h, 1, 1).

    Returns
    -------
    out : ndarray, shape (..., T, d_v)
        Each row is a weighted average of the rows of ``v``.
    weights : ndarray, shape (..., T, S)
        The attention weights; each row sums to 1 (or is all 0 if fully masked; with a
        ``sink``, to ``1 − p_sink``).

    Raises
    ------
    ValueError
        On a wrong rank, mismatched ``d_k`` or ``S``, batch axes that do not broadcast, a mask
        that is not boolean or does not broadcast to (..., T, S), non-float input, a ``scale``
        that is not a positive finite number, a ``score_mod`` that is not callable or returns
        another shape, or a ``sink`` that is not finite or does not broadcast to (..., T, 1).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> out, weights = scaled_dot_product_attention(
    ...     rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 6)))
    >>> out.shape, weights.shape
    ((3, 6), (3, 5))
    >>> capped = lambda s, q_idx, kv_idx: 2.0 * np.tanh(s / 2.0)  # soft-capping at 2
    >>> out, weights = scaled_dot_product_attention(
    ...     rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 6)),
    ...     score_mod=capped, sink=0.0)
    >>> bool((weights.sum(axis=-1) < 1).all())
    True
    """
    func = "scaled_dot_product_attention"
    q, k, v, m, batch, (T, S, _d_k, _d_v) = validate_qkv(func, q, k, v, mask)
    scale = None if scale is None else validate_scale(func, scale)
    if score_mod is not None and not callable(score_mod):
        raise fail(func, f"score_mod is a {type(score_mod).__name__}; expected a function "
                         "score_mod(scores, q_idx, kv_idx) -> scores")
    if sink is not None:
        sink = validate_sink(func, sink, (*batch, T, 1))
    return sdpa_unchecked(q, k, v, m, scale, score_mod=score_mod, sink=sink)[:2]


def sdpa_unchecked(q, k, v, mask=None, scale=None, *, score_mod=None, sink=None, func=None):
    """:func:`scaled_dot_product_attention`'s kernel, on inputs already validated.

    ``q``, ``k``, ``v`` float arrays of compatible shapes, ``mask`` bool broadcastable to
    (..., T, S) or None, ``scale`` a float or None, ``sink`` a float array broadcastable to
    (..., T, 1) or None. Nothing is re-checked (the layer calls it once per forward, after its
    own validation) except the shape ``score_mod`` returns; ``func`` names the public function
    in that error. With a ``sink`` it returns ``(out, weights, sink_weight)``, ``sink_weight``
    (..., T) the share of each row that went to the sink (:func:`softmax_with_sink_unchecked`).
    """
    T, d_k = q.shape[-2:]
    S = k.shape[-2]
    # 1. Scale q rather than the scores: T·d_k multiplications instead of T·S. A python float
    #    keeps q's dtype (float32 stays float32).
    q = q * (1.0 / math.sqrt(d_k) if scale is None else scale)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) != batch:
        # v has batch axes that q and k lack: the scores need them too, since the mask is
        # applied to them in place.
        q = np.broadcast_to(q, (*batch, T, d_k))
    # 2. Scores: (..., T, d_k) @ (..., d_k, S) -> (..., T, S)
    scores = q @ np.swapaxes(k, -1, -2)
    if score_mod is not None:  # 2b. the score hook: the whole (..., T, S) array at once
        new = score_mod(scores, np.arange(T)[:, None], np.arange(S)[None, :])
        if np.shape(new) != scores.shape:
            raise fail(func or "scaled_dot_product_attention",
                       f"score_mod returned shape {fmt_shape(np.shape(new))}; expected the "
                       f"scores' shape {fmt_shape(scores.shape)}")
        scores = new if new is scores else np.array(new, dtype=scores.dtype)
    if sink is not None:  # 3-4 with the sink's column in the softmax, dropped after it
        weights, sink_weight = softmax_with_sink_unchecked(scores, sink, mask)
        return weights @ v, weights, sink_weight
    # 3. Mask (-inf where the mask is False) and softmax over the keys, in place: the score
    #    buffer becomes the weights, so one (..., T, S) array is ever held.
    weights = softmax_inplace(scores, axis=-1, mask=mask)
    # 4. Weighted sum of the values: (..., T, S) @ (..., S, d_v) -> (..., T, d_v)
    out = weights @ v
    return out, weights


def softmax_with_sink_unchecked(scores, sink, mask=None):
    """The softmax of ``[scores | sink]`` along the last axis, the sink's column dropped: the
    gpt-oss reference's ``sdpa`` step, on arrays the caller validated (``sink`` broadcasts to
    (..., T, 1), ``mask`` to (..., T, S), True = may attend; the sink is always allowed).

    Returns ``(weights, sink_weight)``: (..., T, S), a view of the (..., T, S + 1) buffer, and
    (..., T), the share of each row that went to the sink (1 on a fully masked row).
    :func:`mha_course.variants.sinks.softmax_with_sink` is the checked version.
    """
    S = scores.shape[-1]
    lead = np.broadcast_shapes(scores.shape[:-1], np.shape(sink)[:-1])
    both = np.empty((*lead, S + 1), dtype=scores.dtype)  # (..., T, S + 1)
    both[..., :S] = scores
    both[..., S:] = sink
    if mask is not None:  # mask (..., T, S) -> (..., T, S + 1), True in the sink's column
        mask = np.asarray(mask)
        mask = np.broadcast_to(mask, (*np.broadcast_shapes(mask.shape[:-1], (1,)), S))
        mask = np.concatenate([mask, np.ones((*mask.shape[:-1], 1), dtype=bool)], axis=-1)
    softmax_inplace(both, axis=-1, mask=mask)
    return both[..., :S], both[..., S]


def validate_sink(func: str, sink, shape: tuple[int, ...]) -> np.ndarray:
    """``sink`` as a finite float array that broadcasts to ``shape`` (..., T, 1), or a
    ``ValueError`` naming ``func``."""
    plain_number = isinstance(sink, (int, float)) and not isinstance(sink, bool)
    s = np.asarray(sink, dtype=float) if plain_number else as_float_array(func, "sink", sink)
    try:
        ok = np.broadcast_shapes(s.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise fail(func, f"sink has shape {fmt_shape(s.shape)}; expected a shape that "
                         f"broadcasts to (..., T, 1) = {fmt_shape(shape)}, e.g. (h, 1, 1)")
    if not np.isfinite(s).all():
        raise fail(func, "sink holds a non-finite logit")
    return s


def validate_scale(func: str, scale) -> float:
    """``scale`` as a float, or a ``ValueError`` naming ``func`` unless it is a positive finite
    number (None, the default ``1/√d_k``, is the caller's to handle)."""
    if (isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer,
                                                                      np.floating))
            or not (math.isfinite(scale) and scale > 0)):
        raise fail(func, f"scale={scale!r} must be a positive finite number (None: 1/sqrt(d_k))")
    return float(scale)


def validate_qkv(func: str, q, k, v, mask):
    """The input validation shared by the attention functions, with their messages.

    Returns ``(q, k, v, mask, batch, (T, S, d_k, d_v))``: the arrays as float arrays, the mask
    as a bool array (or None) validated to broadcast to ``(*batch, T, S)``, and ``batch`` the
    broadcast batch axes of q, k and v.
    """
    q = as_float_array(func, "q", q)
    k = as_float_array(func, "k", k)
    v = as_float_array(func, "v", v)
    T, d_k = validate_shape(func, "q", q, ("T", "d_k")).values()
    S = validate_shape(func, "k", k, ("S", "d_k"), {"d_k": (d_k, "q")})["S"]
    d_v = validate_shape(func, "v", v, ("S", "d_v"), {"S": (S, "k")})["d_v"]
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise fail(
            func,
            f"the batch axes of q {q.shape[:-2]}, k {k.shape[:-2]} and v {v.shape[:-2]} "
            "do not broadcast together",
        ) from None
    m = validate_mask(func, mask, (*batch, T, S), f"(..., T, S) = {(*batch, T, S)}")
    return q, k, v, m, batch, (T, S, d_k, d_v)


def causal_mask(T: int, S: int | None = None) -> np.ndarray:
    """Boolean (T, S) mask in which a query may attend only to itself and earlier positions.

    With ``S > T`` the queries are taken to be the *last* ``T`` of ``S`` positions (as when
    decoding with a cache): query ``t`` may attend to key ``s`` iff ``s <= t + (S - T)``. Note
    that ``torch``'s ``is_causal=True`` aligns the triangle to the top-left instead; for
    ``T == S`` the two agree.

    Parameters
    ----------
    T : int
        Number of query positions.
    S : int, optional
        Number of key positions (default ``T``).

    Returns
    -------
    ndarray of bool, shape (T, S)
        Lower-triangular (including the diagonal) when ``T == S``.

    Raises
    ------
    ValueError
        If ``T`` or ``S`` is not a positive integer.

    Examples
    --------
    >>> causal_mask(3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    T = validate_positive_int("causal_mask", "T", T)
    S = T if S is None else validate_positive_int("causal_mask", "S", S)
    return np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)


def sliding_window_mask(T: int, window: int, S: int | None = None) -> np.ndarray:
    """Boolean (T, S) mask in which a query sees only the ``window`` positions ending at itself.

    Aligned bottom-right like :func:`causal_mask`: query ``t`` sits at position
    ``p = S - T + t`` and may attend to key ``s`` iff ``p - window < s <= p``. It is the causal
    mask with everything older than ``window`` positions removed (Mistral 7B v0.1: 4096; the
    local layers of Gemma 2 and 3, gpt-oss). A cache of the last ``window`` keys and values (a
    rolling buffer, ``init_cache(window=...)``) is then all a decoder needs.

    Parameters
    ----------
    T : int
        Number of query positions (the last ``T`` of the ``S`` key positions).
    window : int
        Keys a query sees, itself included; ``window >= S`` gives :func:`causal_mask`.
    S : int, optional
        Number of key positions (default ``T``).

    Returns
    -------
    ndarray of bool, shape (T, S)
        A band of width ``window`` on and below the (bottom-right) diagonal.

    Raises
    ------
    ValueError
        If ``T``, ``window`` or ``S`` is not a positive integer.

    Examples
    --------
    >>> sliding_window_mask(4, window=2).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    func = "sliding_window_mask"
    T = validate_positive_int(func, "T", T)
    window = validate_positive_int(func, "window", window)
    S = T if S is None else validate_positive_int(func, "S", S)
    p = np.arange(T)[:, None] + (S - T)  # (T, 1): each query's position among the S keys
    s = np.arange(S)[None, :]  # (1, S)
    return (s <= p) & (s > p - window)


def padding_mask(lengths, S: int) -> np.ndarray:
    """Boolean (B, 1, S) mask that hides the padding at the end of each sequence of a batch.

    Parameters
    ----------
    lengths : sequence of int, shape (B,)
        The real length of each sequence; positions ``>= lengths[b]`` are padding.
    S : int
        The padded length.

    Returns
    -------
    ndarray of bool, shape (B, 1, S)
        Ready to broadcast against (B, T, S) scores: every query of sequence ``b`` may attend
        to its first ``lengths[b]`` keys.

    Raises
    ------
    ValueError
        If ``lengths`` is not a 1-D array of integers in ``[0, S]``.

    Examples
    --------
    >>> padding_mask([2, 3], 4).astype(int)
    array([[[1, 1, 0, 0]],
    <BLANKLINE>
           [[1, 1, 1, 0]]])
    """
    func = "padding_mask"
    S = validate_positive_int(func, "S", S)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise fail(
            func,
            f"lengths has shape {lengths.shape} and dtype {lengths.dtype}; "
            "expected a 1-D array of integers, shape (B,)",
        )
    if lengths.size and (lengths.min() < 0 or lengths.max() > S):
        raise fail(func, f"lengths {lengths.tolist()} must lie between 0 and S={S}")
    return (np.arange(S)[None, :] < lengths[:, None])[:, None, :]
