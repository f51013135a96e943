"""Heads: split one wide projection into h heads and merge them back; group heads for GQA.

Taught in ``notebooks/04_multi_head_attention.ipynb`` (split and merge, the fused projection);
the grouping of query heads over shared key/value heads belongs to
``notebooks/06_decoding.ipynb`` (MQA and GQA).

The layer (:mod:`mha_course.multihead`), its backward pass (:mod:`mha_course.backward`), the
memory-lean forward (:mod:`mha_course.kernels.lean`) and the cost formulas (:mod:`mha_course.cost`)
all
take their head arithmetic from here, so there is one definition of each step.

Layout: the fused projection ``W_q`` of shape (d_model, h*d_k) holds head ``i`` in columns
``i*d_k : (i+1)*d_k``; :func:`split_heads` cuts the last axis at those columns and moves the head
axis before ``T``. Inputs multiply from the left: ``q = x @ W_q``.
"""

from __future__ import annotations

import numpy as np

from ._validate import as_float_array, fail, fmt_shape, validate_positive_int, validate_shape
from .attention import sdpa_unchecked


def split_heads(x, h: int) -> np.ndarray:
    """Split the last axis into ``h`` heads and move the head axis before ``T``.

    Parameters
    ----------
    x : ndarray, shape (..., T, h*d)
    h : int
        Number of heads; must divide the last axis.

    Returns
    -------
    ndarray, shape (..., h, T, d)
        A view of ``x`` (no copy): head ``i`` is ``x[..., i*d:(i+1)*d]``.

    Raises
    ------
    ValueError
        If ``x`` has fewer than 2 axes or ``h`` does not divide its last axis.

    Examples
    --------
    >>> split_heads(np.zeros((3, 8)), h=2).shape
    (2, 3, 4)
    """
    func = "split_heads"
    h = validate_positive_int(func, "h", h)
    x = np.asarray(x)
    validate_shape(func, "x", x, ("T", "h*d"))
    *lead, T, D = x.shape
    if D % h:
        raise fail(func, f"x has shape {x.shape}; its last axis {D} is not divisible by h={h}")
    return split_heads_unchecked(x, h)


def split_heads_unchecked(x: np.ndarray, h: int) -> np.ndarray:
    """:func:`split_heads` without its checks, for an ``x`` the caller validated (the layer's
    own projections): ``h`` a positive integer that divides the last axis of ``x`` (..., T, h*d).
    """
    *lead, T, D = x.shape
    # (..., T, h*d) -> (..., T, h, d) -> (..., h, T, d)
    return np.swapaxes(x.reshape(*lead, T, h, D // h), -2, -3)


def merge_heads(x) -> np.ndarray:
    """Inverse of :func:`split_heads`: (..., h, T, d) -> (..., T, h*d).

    Parameters
    ----------
    x : ndarray, shape (..., h, T, d)

    Returns
    -------
    ndarray, shape (..., T, h*d)
        The heads side by side, head ``i`` in columns ``i*d:(i+1)*d``.

    Raises
    ------
    ValueError
        If ``x`` has fewer than 3 axes.

    Examples
    --------
    >>> merge_heads(np.zeros((2, 3, 4))).shape
    (3, 8)
    """
    x = np.asarray(x)
    validate_shape("merge_heads", "x", x, ("h", "T", "d"))
    *lead, h, T, d = x.shape
    # (..., h, T, d) -> (..., T, h, d) -> (..., T, h*d)
    return np.swapaxes(x, -3, -2).reshape(*lead, T, h * d)


def group_heads(x: np.ndarray, g: int) -> np.ndarray:
    """(..., h, T, d) -> (..., g, h/g, T, d): query heads ``j*h/g`` to ``(j+1)*h/g - 1`` form
    group ``j``, the heads that share key/value head ``j`` (grouped-query attention).

    Always a view (splitting one axis never needs a copy). Against the ``g`` K/V heads laid out
    as (..., g, 1, S, d), a matmul broadcasts each K/V head over its group, so K and V are never
    repeated in memory. Query head ``i`` lands in group ``i // (h // g)``, the grouping of
    Llama's ``repeat_kv`` and of PyTorch's ``scaled_dot_product_attention(..., enable_gqa=True)``.

    Examples
    --------
    >>> group_heads(np.zeros((8, 3, 4)), g=2).shape
    (2, 4, 3, 4)
    """
    *lead, h, T, d = x.shape
    return x.reshape(*lead, g, h // g, T, d)


def ungroup_heads(x: np.ndarray) -> np.ndarray:
    """Inverse of :func:`group_heads`: (..., g, h/g, T, d) -> (..., h, T, d).

    Examples
    --------
    >>> ungroup_heads(np.zeros((2, 4, 3, 5))).shape
    (8, 3, 5)
    """
    *lead, g, per_group, T, d = x.shape
    return x.reshape(*lead, g * per_group, T, d)


def kv_for_groups(x: np.ndarray) -> np.ndarray:
    """(..., g, S, d) -> (..., g, 1, S, d): K/V heads ready to broadcast over their groups.

    A view; see :func:`group_heads`.
    """
    return x[..., None, :, :]


def sdpa_operands(q, k, v, mask=None):
    """``(q, k, v, mask)`` ready for one :func:`~mha_course.scaled_dot_product_attention` call.

    With ``g = h`` K/V heads (lesson 04's layer) the heads as they are, 4-D, and the mask
    (..., T, S) as (..., 1, T, S); with ``g < h`` (GQA, lesson 06) the query heads grouped,
    (..., g, h/g, T, d_k) against (..., g, 1, S, d), and the mask as (..., 1, 1, T, S). After the
    call, :func:`ungroup_heads` the grouped results.

    Examples
    --------
    >>> q, k = np.zeros((4, 3, 2)), np.zeros((2, 5, 2))
    >>> [a.shape for a in sdpa_operands(q, k, k)[:2]], sdpa_operands(q, q, q)[0].shape
    ([(2, 2, 3, 2), (2, 1, 5, 2)], (4, 3, 2))
    """
    g = k.shape[-3]
    if g == q.shape[-3]:  # no grouping: every query head has its own K/V head
        return q, k, v, None if mask is None else np.asarray(mask)[..., None, :, :]
    m = None if mask is None else np.asarray(mask)[..., None, None, :, :]
    return group_heads(q, g), kv_for_groups(k), kv_for_groups(v), m


def attend_heads(q, k, v, mask=None, scale=None):
    """Attention of ``h`` query heads over ``g`` K/V heads: the layer's cached step and the
    serving wing's caches attend through it, as ``MultiHeadAttention.forward`` does.

    q (..., h, T, d_k), k (..., g, S, d_k), v (..., g, S, d_v) (query head ``i`` reads K/V head
    ``i // (h/g)``), mask broadcastable to (..., T, S) or None, scale None for ``1/√d_k`` ->
    heads (..., h, T, d_v), weights (..., h, T, S). Trusts its input.

    Examples
    --------
    >>> q, k = np.ones((4, 3, 2)), np.ones((2, 5, 2))
    >>> [a.shape for a in attend_heads(q, k, k)]
    [(4, 3, 2), (4, 3, 5)]
    """
    heads, weights = sdpa_unchecked(*sdpa_operands(q, k, v, mask), scale)
    if k.shape[-3] < q.shape[-3]:  # grouped: (..., g, h/g, T, .) -> (..., h, T, .)
        heads, weights = ungroup_heads(heads), ungroup_heads(weights)
    return heads, weights


def head_dims(func: str, d_model, h, d_k, d_v) -> tuple[int, int, int, int]:
    """Validate a layer's sizes; fill in d_k = d_model / h and d_v = d_k when not given.

    Examples
    --------
    >>> head_dims("f", 512, 8, None, None)
    (512, 8, 64, 64)
    """
    d_model = validate_positive_int(func, "d_model", d_model)
    h = validate_positive_int(func, "h", h)
    if d_k is None:
        if d_model % h:
            raise fail(func, f"d_model={d_model} is not divisible by h={h}; pass d_k explicitly")
        d_k = d_model // h
    d_k = validate_positive_int(func, "d_k", d_k)
    d_v = d_k if d_v is None else validate_positive_int(func, "d_v", d_v)
    return d_model, h, d_k, d_v


def kv_head_count(func: str, h: int, n_kv_heads) -> int:
    """Validate the number of key/value heads (None means ``h``); it must divide ``h``.

    Examples
    --------
    >>> kv_head_count("f", 8, None), kv_head_count("f", 8, 2)
    (8, 2)
    """
    if n_kv_heads is None:
        return h
    n_kv_heads = validate_positive_int(func, "n_kv_heads", n_kv_heads)
    if h % n_kv_heads:
        divisors = [g for g in range(1, h + 1) if h % g == 0]
        raise fail(
            func,
            f"n_kv_heads={n_kv_heads} does not divide h={h}; each key/value head serves "
            f"h/n_kv_heads query heads, so choose one of {divisors}",
        )
    return n_kv_heads


def project(x: np.ndarray, W: np.ndarray, b: np.ndarray | None, dtype) -> np.ndarray:
    """``x @ W + b`` in ``dtype`` (a float32 input stays float32 even with float64 weights).

    Shapes: x (..., N, d_in), W (d_in, d_out), b (d_out,) or None -> (..., N, d_out).

    Examples
    --------
    >>> project(np.ones((3, 4), np.float32), np.ones((4, 2)), None, np.float32).dtype
    dtype('float32')
    """
    y = x @ W.astype(dtype, copy=False)
    if b is not None:
        y += b.astype(dtype, copy=False)
    return y


# ------------------------------------------------------------- the article's per-head layout
def stack_heads(func: str, name: str, heads) -> np.ndarray:
    """[h][d_model, d] (a sequence of h matrices, or one (h, d_model, d) array) -> (h, d_model, d).

    Each matrix is validated against the first, so ragged input gets a named error rather than
    NumPy's "inhomogeneous shape".
    """
    if isinstance(heads, np.ndarray):
        return as_float_array(func, name, heads)
    heads = [as_float_array(func, f"{name}[{i}]", w) for i, w in enumerate(heads)]
    if not heads:
        raise fail(func, f"{name} is empty; expected h >= 1 matrices of shape (d_model, d)")
    first = heads[0]
    for i, w in enumerate(heads):
        validate_shape(func, f"{name}[{i}]", w, ("d_model", "d"),
                       {"d_model": (first.shape[0], f"{name}[0]"),
                        "d": (first.shape[-1], f"{name}[0]")} if first.ndim == 2 else None,
                       batch=False)
    return np.stack(heads)


def fuse_per_head(func: str, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None):
    """Validate the article's per-head matrices and lay them side by side (the fused layout).

    Returns ``(dims, params)``: ``dims`` holds ``d_model``, ``h``, ``d_k``, ``d_v`` and
    ``n_kv_heads`` (read off ``W_k``); ``params`` the fused ``W_q`` (d_model, h*d_k), ``W_k``,
    ``W_v`` and ``W_o``, plus the four biases when given. See
    ``MultiHeadAttention.from_per_head`` for the shapes and the errors.
    """
    stacked = {}
    for name, arr in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v)):
        stacked[name] = stack_heads(func, name, arr)
    W_o = as_float_array(func, "W_o", W_o)
    per_head = ("h", "d_model", "d_k")
    h, d_model, d_k = validate_shape(func, "W_q", stacked["W_q"], per_head, batch=False).values()
    # GQA: W_k may hold fewer heads g (a divisor of h); its axis is then named n_kv_heads.
    W_k_ = stacked["W_k"]
    g = W_k_.shape[0] if W_k_.ndim == 3 else h
    kv = "h" if g == h else "n_kv_heads"
    if g != h and (g < 1 or h % g):
        raise fail(
            func,
            f"W_k has shape {fmt_shape(W_k_.shape)}; expected (n_kv_heads, d_model, d_k) "
            f"with n_kv_heads dividing h={h} (from W_q)",
        )
    known = {kv: (h, "W_q"), "d_model": (d_model, "W_q"), "d_k": (d_k, "W_q")}
    if g != h:
        known.pop(kv)
    validate_shape(func, "W_k", W_k_, (kv, "d_model", "d_k"), known, batch=False)
    known.pop("d_k")
    known[kv] = (g, "W_q" if g == h else "W_k")
    known = {kv: known.pop(kv), **known}  # letters in the order of the shape
    d_v = validate_shape(func, "W_v", stacked["W_v"], (kv, "d_model", "d_v"), known,
                         batch=False)["d_v"]
    fused = {"h*d_k": (h * d_k, "W_q"), "h*d_v": (h * d_v, "W_v"), "d_model": (d_model, "W_q")}
    if g != h:
        fused.update({f"{kv}*d_k": (g * d_k, "W_k"), f"{kv}*d_v": (g * d_v, "W_v")})
    validate_shape(func, "W_o", W_o, ("h*d_v", "d_model"), fused, batch=False)
    biases = {"b_q": b_q, "b_k": b_k, "b_v": b_v, "b_o": b_o}
    if any(b is not None for b in biases.values()) and any(b is None for b in biases.values()):
        raise fail(func, "give all four biases b_q, b_k, b_v, b_o, or none")
    # [h][d_model, d] -> (d_model, h*d): head i in columns i*d:(i+1)*d
    params = {name: np.concatenate(list(stacked[name]), axis=1) for name in ("W_q", "W_k", "W_v")}
    params["W_o"] = np.array(W_o)
    if b_q is not None:
        letters = {"b_q": "h*d_k", "b_k": f"{kv}*d_k", "b_v": f"{kv}*d_v", "b_o": "d_model"}
        for name, b in biases.items():
            # per-head biases [h][d] -> (h*d,); b_o is already (d_model,)
            b = as_float_array(func, name, b)
            b = b.reshape(-1) if name != "b_o" else b
            validate_shape(func, name, b, (letters[name],), fused, batch=False)
            params[name] = np.array(b)
    dims = {"d_model": d_model, "h": h, "d_k": d_k, "d_v": d_v, "n_kv_heads": g}
    return dims, params
