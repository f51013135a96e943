"""Positions: sinusoidal encodings (2017), rotary position embeddings (RoPE) and ALiBi biases.

Taught in ``notebooks/05_layer_to_model.ipynb``.

Attention alone is permutation-equivariant: shuffle the tokens and the outputs shuffle with
them, so a layer cannot tell word order. Two ways to tell it:

- :func:`sinusoidal_positions` (Vaswani et al., 2017) *adds* a fixed vector to each token's
  input: ``PE[p, 2i] = sin(p / base**(2i/d_model))``, ``PE[p, 2i+1] = cos(p / base**(2i/d_model))``.
- :func:`apply_rope` (Su et al., 2021, RoFormer) *rotates* each query and key, pair of features
  by pair of features, by an angle proportional to its position: pair ``j`` of the token at
  position ``p`` turns by ``p · base**(-2j/d)``. A query at ``m`` and a key at ``n`` then score
  ``q·R(n - m)k``: the score depends only on the offset ``n - m``. Values are never rotated.

Real code pairs the features in one of two layouts, the same rotation after permuting the
columns of ``W_q`` and ``W_k`` (loading weights trained in one layout into code that uses the
other gives wrong scores at every offset but 0; huggingface/transformers#25199 and
Dao-AILab/flash-attention#288 are the threads that explain the permutation):

- ``layout="half"`` (GPT-NeoX, Hugging Face ``rotate_half``): pair ``j`` is ``(j, j + d/2)``;
- ``layout="interleaved"`` (Meta's original Llama code, GPT-J): pair ``j`` is ``(2j, 2j + 1)``.

:func:`rope_permutation` gives the column order that converts one into the other (what Hugging
Face's Llama conversion script does to ``W_q`` and ``W_k``).

A third way adds nothing to the tokens at all: :func:`alibi_bias` (Press et al., 2022, "Train
Short, Test Long") adds ``-slope_h · (query position - key position)`` to head ``h``'s scores
before the softmax, with the fixed geometric slopes of :func:`alibi_slopes`: nothing learned and
nothing rotated, so the same formula runs at any length; but it is a hard linear recency penalty,
so at lengths past the trained one distant keys get almost no weight (its effective reach stays
near the trained length). Stretching RoPE's context instead (position interpolation, NTK-aware
scaling, YaRN, Llama 3.1's rule) is :mod:`mha_course.variants.rope_scaling`.
"""

from __future__ import annotations

import functools

import numpy as np

from ._validate import as_float_array, fail, fmt_shape, validate_positive_int, validate_shape

LAYOUTS = ("half", "interleaved")


def _validate_base(func: str, base) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float, np.integer, np.floating)):
        raise fail(func, f"base={base!r} must be a number > 1")
    if not base > 1 or not np.isfinite(base):
        raise fail(func, f"base={base!r} must be a number > 1")
    return float(base)


def validate_layout(func: str, layout) -> str:
    """Return ``layout`` if it is one of :data:`LAYOUTS`, else raise a named ``ValueError``."""
    if layout not in LAYOUTS:
        raise fail(
            func,
            f"layout={layout!r} is not one of 'half' (GPT-NeoX, Hugging Face) or "
            "'interleaved' (Meta Llama, GPT-J)",
        )
    return layout


def sinusoidal_positions(T: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """The paper's fixed position encodings, one row per position, to be added to the inputs.

    ``PE[p, 2i] = sin(p / base**(2i/d_model))`` and ``PE[p, 2i+1] = cos(p / base**(2i/d_model))``:
    sines in the even columns, cosines in the odd ones (Vaswani et al. 2017, section 3.5).
    Column pair ``i`` is a clock of wavelength ``2π·base**(2i/d_model)`` positions, from 2π for
    ``i = 0`` to nearly ``2π·base`` for the last pair; moving ``k`` positions turns each pair by a
    fixed angle, so ``PE[p + k]`` is a linear function (a rotation) of ``PE[p]``.

    Parameters
    ----------
    T : int
        Number of positions (0 to T - 1).
    d_model : int
        Width of each encoding. For an odd width the last column is a sine.
    base : float, default 10000.0
        The paper's 10000.

    Returns
    -------
    ndarray of float64, shape (T, d_model)

    Raises
    ------
    ValueError
        If ``T`` or ``d_model`` is not a positive integer, or ``base`` is not a number > 1.

    Examples
    --------
    >>> pe = sinusoidal_positions(4, 6)
    >>> pe.shape, pe[0].tolist()
    ((4, 6), [0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    """
    func = "sinusoidal_positions"
    T = validate_positive_int(func, "T", T)
    d_model = validate_positive_int(func, "d_model", d_model)
    base = _validate_base(func, base)
    i = np.arange((d_model + 1) // 2)  # one frequency per (sin, cos) column pair
    angles = np.arange(T)[:, None] / base ** (2 * i / d_model)  # (T, ceil(d_model/2))
    pe = np.empty((T, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return pe


def rope_angles(positions, d: int, base: float = 10000.0) -> np.ndarray:
    """The angle by which RoPE turns feature pair ``j`` at each position: ``p · base**(-2j/d)``.

    Parameters
    ----------
    positions : ndarray of int or float, shape (T,)
        Fractional positions are allowed: position interpolation (Chen et al., 2023) runs a
        model trained on ``L`` positions at ``s·L`` by using positions ``p / s``.
    d : int
        The (even) width that is rotated; there are ``d / 2`` pairs.
    base : float, default 10000.0
        NTK-aware scaling for ``s`` times the context uses ``base · s**(d / (d - 2))``.

    Returns
    -------
    ndarray of float64, shape (T, d/2)

    Examples
    --------
    >>> rope_angles(np.arange(3), 4).round(2).tolist()
    [[0.0, 0.0], [1.0, 0.01], [2.0, 0.02]]
    """
    j = np.arange(d // 2)
    return np.asarray(positions)[:, None] * base ** (-2.0 * j / d)


def apply_rope(x, positions=None, *, base: float = 10000.0, layout: str = "half") -> np.ndarray:
    """Rotate each pair of features of ``x`` by an angle proportional to its position (RoPE).

    Pair ``j`` of the row at position ``p`` turns by ``θ = p · base**(-2j/d)``:
    ``(a, b) -> (a cos θ - b sin θ, a sin θ + b cos θ)``. Apply it to the queries and the keys of
    every head (never to the values), after the projections and before the scores.

    Parameters
    ----------
    x : ndarray of float, shape (..., T, d)
        Queries or keys, one head or many (the same rotation for every head). ``d`` even.
    positions : ndarray of int, shape (T,), optional
        The position of each row; default ``arange(T)``. Negative positions rotate backwards
        (``apply_rope(apply_rope(x, p), -p)`` is ``x``). When decoding with a cache, the new
        token's position is the number of tokens before it, not 0.
    base : float, default 10000.0
        10000 in RoFormer, Llama 1 and 2; 500000 in Llama 3.
    layout : {"half", "interleaved"}, default "half"
        Which features form a pair: ``(j, j + d/2)`` (GPT-NeoX, Hugging Face) or ``(2j, 2j + 1)``
        (Meta Llama, GPT-J).

    Returns
    -------
    ndarray, same shape and dtype as ``x``

    Raises
    ------
    ValueError
        If ``x`` is not a float array with an even last axis, ``positions`` is not an integer
        array of shape (T,), ``base`` is not a number > 1 or ``layout`` is unknown.

    Examples
    --------
    >>> x = np.ones((3, 4))
    >>> apply_rope(x).shape
    (3, 4)
    >>> bool(np.allclose(apply_rope(apply_rope(x, np.arange(3)), -np.arange(3)), x))
    True
    """
    func = "apply_rope"
    x = as_float_array(func, "x", x)
    T, d = validate_shape(func, "x", x, ("T", "d")).values()
    if d % 2:
        raise fail(
            func,
            f"x has shape {fmt_shape(x.shape)}; expected (..., T, d) with d even "
            "(RoPE turns pairs of features)",
        )
    layout = validate_layout(func, layout)
    base = _validate_base(func, base)
    if positions is None:
        positions = np.arange(T)
    positions = np.asarray(positions)
    if positions.ndim != 1 or (positions.size and positions.dtype.kind not in "iu"):
        raise fail(
            func,
            f"positions has shape {fmt_shape(positions.shape)} and dtype {positions.dtype}; "
            f"expected integers of shape (T,) = ({T},)",
        )
    if positions.shape != (T,):
        raise fail(
            func, f"positions has shape {fmt_shape(positions.shape)}; expected (T,) = ({T},)"
        )
    return rope_unchecked(x, positions, base, layout)


def rope_unchecked(x: np.ndarray, positions, base: float, layout: str) -> np.ndarray:
    """:func:`apply_rope`'s kernel, on inputs already validated (``x`` float (..., T, d) with
    ``d`` even, ``positions`` integers (T,) or None for ``arange(T)``, ``base`` > 1, ``layout``
    one of :data:`LAYOUTS`); the layer calls it inside its forward."""
    T, d = x.shape[-2:]
    key = None if positions is None else np.asarray(positions, dtype=np.int64).tobytes()
    cos, sin = _rope_table(T, d, float(base), x.dtype.str, key)  # (T, d/2) each
    if layout == "half":
        a, b = x[..., : d // 2], x[..., d // 2 :]  # pair j = (j, j + d/2)
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]  # pair j = (2j, 2j + 1)
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


@functools.lru_cache(maxsize=64)
def _rope_table(T: int, d: int, base: float, dtype: str, positions: bytes | None):
    """RoPE's cosines and sines (T, d/2) in ``dtype``, for ``arange(T)`` or the int64
    ``positions`` given as bytes; cached, since a model asks for the same ones every step."""
    p = np.arange(T) if positions is None else np.frombuffer(positions, dtype=np.int64)
    theta = rope_angles(p, d, base)  # (T, d/2), float64
    cos, sin = np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)
    cos.flags.writeable = sin.flags.writeable = False  # shared between calls
    return cos, sin


def rope_permutation(d_k: int, h: int = 1) -> np.ndarray:
    """Column order that turns weights trained with interleaved RoPE into half-split ones.

    Per head, interleaved pair ``j`` is features ``(2j, 2j + 1)`` and half-split pair ``j`` is
    ``(j, j + d_k/2)``; taking head by head the even features first, then the odd ones,
    ``[0, 2, 4, ..., 1, 3, 5, ...]``, moves each interleaved pair to the place of its half-split
    pair. So a layer with ``rope="interleaved"`` equals a layer with ``rope="half"`` whose
    ``W_q`` and ``W_k`` (and biases) are ``W[:, perm]``: a permutation changes no dot product.
    ``np.argsort(perm)`` converts back. Loading weights without it (the bug of
    huggingface/transformers#25199) gives other scores at every offset but 0.

    Parameters
    ----------
    d_k : int
        Width of one head's queries and keys (even).
    h : int, default 1
        Number of heads laid side by side, as in a fused (d_model, h*d_k) projection.

    Returns
    -------
    ndarray of int, shape (h*d_k,)

    Raises
    ------
    ValueError
        If ``d_k`` is not a positive even integer or ``h`` not a positive integer.

    Examples
    --------
    >>> rope_permutation(4, h=2).tolist()
    [0, 2, 1, 3, 4, 6, 5, 7]
    """
    func = "rope_permutation"
    d_k = validate_positive_int(func, "d_k", d_k)
    h = validate_positive_int(func, "h", h)
    if d_k % 2:
        raise fail(func, f"d_k={d_k} must be even (RoPE turns pairs of features)")
    one_head = np.concatenate([np.arange(0, d_k, 2), np.arange(1, d_k, 2)])  # (d_k,)
    return (np.arange(h)[:, None] * d_k + one_head).reshape(-1)  # (h, d_k) -> (h*d_k,)


def alibi_slopes(h: int) -> np.ndarray:
    """ALiBi's per-head slopes: a geometric sequence ``2**(-8/h), 2**(-16/h), ..., 2**(-8)``.

    That is the paper's rule for ``h`` a power of 2 (Press et al., 2022). For other ``h`` the
    reference implementation (ofirpress/attention_with_linear_biases) takes the ``n`` slopes of
    the closest lower power of 2, ``n``, then every other slope of ``2n`` heads (0-based indices
    0, 2, 4, ...) until there are ``h``: ``h = 12`` gives the 8 slopes of ``h = 8`` followed by
    slopes 0, 2, 4, 6 of ``h = 16``, i.e. ``2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5``.

    Parameters
    ----------
    h : int
        Number of heads.

    Returns
    -------
    ndarray of float64, shape (h,)
        Head 0 has the steepest slope (looks nearest); all slopes are in (0, 1).

    Raises
    ------
    ValueError
        If ``h`` is not a positive integer.

    Examples
    --------
    >>> alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    >>> alibi_slopes(12).shape
    (12,)
    """
    h = validate_positive_int("alibi_slopes", "h", h)
    n = 1 << (h.bit_length() - 1)  # the closest power of 2 <= h
    slopes = 2.0 ** (-8.0 * np.arange(1, n + 1) / n)  # (n,): 2**(-8/n), ..., 2**(-8)
    if n == h:
        return slopes
    extra = 2.0 ** (-8.0 * np.arange(1, 2 * n + 1) / (2 * n))[0::2][: h - n]  # (h - n,)
    return np.concatenate([slopes, extra])  # (n,) + (h - n,) -> (h,)


def alibi_bias(h: int, T: int, S: int | None = None) -> np.ndarray:
    """ALiBi's bias, added to the scores of head ``i``: ``-slope_i · (query pos - key pos)``.

    The queries are the *last* ``T`` of ``S`` positions (bottom-right, like
    ``causal_mask(T, S)``, as when decoding with a cache): query ``t`` sits at position
    ``t + S - T``, so entry ``[i, t, s]`` is ``-slope_i · (t + S - T - s)``. It depends on the
    offset alone, is 0 on the query's own position and grows more negative with the distance.
    It is meant for causal attention: use it with ``causal_mask(T, S)``. Where that mask says no
    (keys after the query) the entries are positive and meaningless.

    Parameters
    ----------
    h : int
        Number of heads; the slopes are :func:`alibi_slopes` ``(h)``.
    T : int
        Number of query positions.
    S : int, optional
        Number of key positions (default ``T``); at least ``T``.

    Returns
    -------
    ndarray of float64, shape (h, T, S)
        Add it to ``(..., h, T, S)`` scores before the softmax.

    Raises
    ------
    ValueError
        If ``h``, ``T`` or ``S`` is not a positive integer, or ``S < T``.

    Examples
    --------
    >>> alibi_bias(2, 3).shape
    (2, 3, 3)
    >>> alibi_bias(1, 2, 4)[0].tolist()
    [[-0.0078125, -0.00390625, 0.0, 0.00390625], [-0.01171875, -0.0078125, -0.00390625, 0.0]]
    """
    func = "alibi_bias"
    h = validate_positive_int(func, "h", h)
    T = validate_positive_int(func, "T", T)
    S = T if S is None else validate_positive_int(func, "S", S)
    if S < T:
        raise fail(func, f"S={S} must be >= T={T} (the queries are the last T of S positions)")
    key_minus_query = np.arange(S)[None, :] - (np.arange(T)[:, None] + (S - T))  # (T, S)
    return alibi_slopes(h)[:, None, None] * key_minus_query  # (h, 1, 1) * (T, S) -> (h, T, S)
