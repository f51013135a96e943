"""The backward pass of multi-head attention, by hand, and a finite-difference gradient check.

Taught in ``notebooks/08_learning.ipynb``.

``MultiHeadAttention.forward(..., return_cache=True)`` returns, beside the output, the
:class:`SavedActivations`: the layer's own intermediate arrays (projected heads, weights, merged
heads), kept by the forward pass a lesson reads. :func:`backward` walks those steps in reverse,
applying the chain rule to each: output projection, merge heads, weighted sum, softmax (its
Jacobian), the ``1/√d_k`` scale, RoPE (when the layer uses it), the grouping of query heads over
shared key/value heads, split heads, the three projections. The attention step is
:func:`attention_backward` (dV, dweights, dscores, dQ, dK), whose softmax step is
:func:`softmax_backward`, the product with the :func:`softmax_jacobian` ``diag(p) − p pᵀ``.
:func:`gradient_check` compares any hand-written gradient with central differences.
``MultiHeadAttention.backward`` calls :func:`backward`.

Shape letters: ``T`` query positions, ``S`` key/value positions, ``h`` query heads, ``g`` key/value
heads (``n_kv_heads``; ``g = h`` for the standard layer, ``g = 1`` for MQA), ``d_k``, ``d_v``
per-head widths; ``...`` any leading batch axes. Query head ``i`` reads key/value head
``i // (h // g)``, as ``torch``'s ``scaled_dot_product_attention(..., enable_gqa=True)``.

Conventions: ``q = x @ W_q + b_q`` (inputs multiply from the left), masks say ``True`` = may
attend, and a fully masked query row has weights 0, output ``b_o`` and no gradient through its
query (0, never NaN); masked keys get no gradient through their key or value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._validate import as_float_array, fail, fmt_shape, refuse_layer_scale, validate_shape
from .heads import group_heads, kv_for_groups, merge_heads, split_heads_unchecked, ungroup_heads
from .positions import rope_unchecked

__all__ = [
    "SavedActivations",
    "attention_backward",
    "backward",
    "gradient_check",
    "softmax_backward",
    "softmax_jacobian",
]


@dataclass(repr=False)
class SavedActivations:
    """What ``MultiHeadAttention.forward(..., return_cache=True)`` keeps for :func:`backward`.

    Attributes
    ----------
    layer : MultiHeadAttention
        The layer that ran the forward pass; :func:`backward` refuses activations of another one.
    x : ndarray, shape (..., T, d_model)
        The queries' input.
    context : ndarray or None, shape (..., S, d_model)
        The keys' and values' input for cross-attention; ``None`` for self-attention
        (then the keys and values came from ``x``).
    mask : ndarray of bool or None, broadcastable to (..., 1, T, S)
        The mask as applied to every head (``True`` = may attend).
    q : ndarray, shape (..., h, T, d_k)
        Queries per head as they entered the scores: after RoPE (if any), before ``1/√d_k``.
    k : ndarray, shape (..., g, S, d_k)
        Keys per key/value head, after RoPE (if any).
    v : ndarray, shape (..., g, S, d_v)
        Values per key/value head.
    weights : ndarray, shape (..., h, T, S)
        The attention weights of every query head.
    concat : ndarray, shape (..., T, h*d_v)
        The heads side by side, the input of the output projection.
    params : dict of str to ndarray
        The parameters as the forward pass used them (cast to ``dtype``).
    dtype : numpy.dtype
        The dtype the forward pass computed in.

    Examples
    --------
    >>> from mha_course import MultiHeadAttention
    >>> out, saved = MultiHeadAttention(8, 2, rng=0).forward(np.ones((3, 8)), return_cache=True)
    >>> saved.weights.shape
    (2, 3, 3)
    """

    layer: object
    x: np.ndarray
    context: np.ndarray | None
    mask: np.ndarray | None
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    weights: np.ndarray
    concat: np.ndarray
    params: dict
    dtype: np.dtype

    @property
    def out_shape(self) -> tuple[int, ...]:
        """Shape of the forward pass's output, (..., T, d_model): what ``grad_out`` must have."""
        return (*self.concat.shape[:-1], self.layer.d_model)

    def __repr__(self) -> str:
        *batch, h, T, S = self.weights.shape
        kind = "self-attention" if self.context is None else "cross-attention"
        return (
            f"SavedActivations({kind}, batch={tuple(batch)}, h={h}, "
            f"n_kv_heads={self.k.shape[-3]}, T={T}, S={S}, masked={self.mask is not None}, "
            f"dtype={self.dtype})"
        )


def sum_to_shape(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Undo broadcasting: sum ``grad`` over the axes that broadcasting added or stretched.

    Examples
    --------
    >>> sum_to_shape(np.ones((4, 2, 3)), (1, 3)).tolist()
    [[8.0, 8.0, 8.0]]
    """
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad  # drop added leading axes
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=stretched, keepdims=True) if stretched else grad


def softmax_jacobian(weights) -> np.ndarray:
    """The Jacobian of softmax at its output ``p``: ``J = diag(p) − p pᵀ``.

    ``J[..., i, j] = ∂p_i/∂s_j`` for ``p = softmax(s)`` along the last axis: ``p_i (1 − p_i)`` on
    the diagonal, ``−p_i p_j`` off it. Every row and column sums to 0 (adding a constant to all
    scores changes nothing), and ``J`` is 0 when ``p`` is one-hot (a saturated softmax passes no
    gradient).

    Parameters
    ----------
    weights : ndarray of float, shape (..., S)
        Softmax outputs ``p``.

    Returns
    -------
    ndarray, shape (..., S, S)

    Raises
    ------
    ValueError
        If ``weights`` is not a float array with at least one axis.

    Examples
    --------
    >>> softmax_jacobian(np.array([0.5, 0.5]))
    array([[ 0.25, -0.25],
           [-0.25,  0.25]])
    """
    func = "softmax_jacobian"
    p = as_float_array(func, "weights", weights)
    if p.ndim == 0:
        raise fail(func, "weights has shape (); expected (..., S)")
    eye = np.eye(p.shape[-1], dtype=p.dtype)  # (S, S)
    # (..., S, 1) * (S, S) - (..., S, 1) * (..., 1, S) -> (..., S, S)
    return p[..., :, None] * eye - p[..., :, None] * p[..., None, :]


def softmax_backward(dweights, weights) -> np.ndarray:
    """dLoss/dscores from dLoss/dweights through ``weights = softmax(scores)``, row by row.

    ``dscores = Jᵀ dweights`` with ``J`` the :func:`softmax_jacobian`; since ``J`` is symmetric
    this is ``weights * (dweights − Σ_s dweights·weights)``, computed without forming the
    (S, S) matrix. Entries with weight 0 (masked keys, fully masked rows) get exactly 0.

    Parameters
    ----------
    dweights, weights : ndarray of float, shape (..., S)
        (Shapes that broadcast together.)

    Returns
    -------
    ndarray, shape (..., S)

    Examples
    --------
    >>> softmax_backward(np.array([1.0, 0.0]), np.array([0.5, 0.5]))
    array([ 0.25, -0.25])
    """
    row_dot = np.einsum("...s,...s->...", dweights, weights)[..., None]  # (..., 1), no temporary
    return weights * (dweights - row_dot)  # (..., S)


def attention_backward(grad_out, q, k, v, weights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of ``out = softmax(q kᵀ/√d_k, mask) v`` with respect to q, k and v, by hand.

    The mask is not needed: the saved ``weights`` are 0 where it said no, and so are the
    gradients that flow through those entries. Each step undoes one of the forward pass:

    1. ``out = weights @ v``: ``dweights = grad_out @ vᵀ`` and ``dv = weightsᵀ @ grad_out``;
    2. ``weights = softmax(scores)``: ``dscores`` by :func:`softmax_backward`;
    3. ``scores = q kᵀ / √d_k``: ``dq = dscores @ k / √d_k``, ``dk = dscoresᵀ @ q / √d_k``.

    Parameters
    ----------
    grad_out : ndarray of float, shape (..., T, d_v)
        dLoss/dout.
    q : ndarray, shape (..., T, d_k)
    k : ndarray, shape (..., S, d_k)
    v : ndarray, shape (..., S, d_v)
    weights : ndarray, shape (..., T, S)
        The forward pass's attention weights (e.g. from
        :func:`~mha_course.scaled_dot_product_attention`).

    Returns
    -------
    dq, dk, dv : ndarray
        Shaped like ``q``, ``k``, ``v``: an input that was broadcast (a length-1 or missing
        batch axis) gets the sum over the axes it was broadcast along.

    Raises
    ------
    ValueError
        If an argument is not a float array or its trailing axes do not match the others'
        (the message names the argument, its shape and the shape expected).

    Examples
    --------
    >>> q, k, v = np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 2))
    >>> weights = np.full((3, 5), 0.2)
    >>> [g.shape for g in attention_backward(np.ones((3, 2)), q, k, v, weights)]
    [(3, 4), (5, 4), (5, 2)]
    """
    func = "attention_backward"
    grad_out, q, k, v, weights = (as_float_array(func, name, a) for name, a in zip(
        ("grad_out", "q", "k", "v", "weights"), (grad_out, q, k, v, weights), strict=True))
    T, d_k = validate_shape(func, "q", q, ("T", "d_k")).values()
    S = validate_shape(func, "k", k, ("S", "d_k"), {"d_k": (d_k, "q")})["S"]
    d_v = validate_shape(func, "v", v, ("S", "d_v"), {"S": (S, "k")})["d_v"]
    validate_shape(func, "weights", weights, ("T", "S"), {"T": (T, "q"), "S": (S, "k")})
    validate_shape(func, "grad_out", grad_out, ("T", "d_v"), {"T": (T, "q"), "d_v": (d_v, "v")})
    return attention_backward_unchecked(grad_out, q, k, v, weights)


def attention_backward_unchecked(grad_out, q, k, v, weights):
    """:func:`attention_backward` without its checks, for arrays the caller validated (the
    layer's own saved activations, in :func:`backward`)."""
    d_k = q.shape[-1]
    # 1. out = weights @ v
    dweights = grad_out @ np.swapaxes(v, -1, -2)  # (..., T, d_v) @ (..., d_v, S) -> (..., T, S)
    dv = np.swapaxes(weights, -1, -2) @ grad_out  # (..., S, T) @ (..., T, d_v) -> (..., S, d_v)
    # 2. weights = softmax(scores), row by row
    dscores = softmax_backward(dweights, weights)  # (..., T, S)
    # 3. scores = q @ kᵀ / √d_k: the product, then the scale (on the (.., d_k) results: fewer
    #    numbers than the (..., T, S) scores)
    scale = 1.0 / math.sqrt(d_k)
    dq = dscores @ k  # (..., T, S) @ (..., S, d_k) -> (..., T, d_k)
    dq *= scale
    dk = np.swapaxes(dscores, -1, -2) @ q  # (..., S, T) @ (..., T, d_k) -> (..., S, d_k)
    dk *= scale
    return sum_to_shape(dq, q.shape), sum_to_shape(dk, k.shape), sum_to_shape(dv, v.shape)


def _param_grad(inp: np.ndarray, d_proj: np.ndarray) -> np.ndarray:
    """dW for ``proj = inp @ W``: ``inpᵀ @ d_proj`` summed over every batch axis and position.

    ``inp`` (..., N, d_in) and ``d_proj`` (..., N, d_out) may differ in batch axes that
    broadcast (``inp`` was broadcast in the forward pass); the result is (d_in, d_out).
    """
    inp = np.broadcast_to(inp, (*d_proj.shape[:-1], inp.shape[-1]))  # (..., N, d_in)
    # (B*N, d_in)ᵀ @ (B*N, d_out) -> (d_in, d_out)
    return inp.reshape(-1, inp.shape[-1]).T @ d_proj.reshape(-1, d_proj.shape[-1])


def backward(layer, grad_out, saved) -> dict[str, np.ndarray]:
    """Gradients of a loss with respect to the inputs and every parameter, by hand.

    Walks the layer's forward pass in reverse; step ``n`` here undoes step ``n`` there
    (``MultiHeadAttention.forward``): 1 projections, 2 split heads, 3 RoPE, 4 group the query
    heads over their key/value head, 5 scaled dot-product attention (scores, softmax, weighted
    sum), 6 merge heads, 7 output projection.

    Parameters
    ----------
    layer : MultiHeadAttention
        The layer that made ``saved``.
    grad_out : ndarray of float, shape (..., T, d_model)
        dLoss/dout, the gradient of the loss with respect to the forward pass's output.
    saved : SavedActivations
        What ``layer.forward(..., return_cache=True)`` returned with the output.

    Returns
    -------
    dict of str to ndarray
        ``"x"`` (..., T, d_model); ``"context"`` (..., S, d_model) for cross-attention only
        (for self-attention the key and value paths flow into ``"x"``); ``"W_q"``, ``"W_k"``,
        ``"W_v"``, ``"W_o"`` and, with biases, ``"b_q"``, ``"b_k"``, ``"b_v"``, ``"b_o"``, each
        shaped like its parameter and summed over the batch axes. Nothing flows through a
        masked key or a fully masked query row (0 there, never NaN).

    Raises
    ------
    ValueError
        If ``saved`` is not a :class:`SavedActivations` or comes from another layer, or
        ``grad_out`` is not a float array of the output's shape.

    Examples
    --------
    >>> from mha_course import MultiHeadAttention
    >>> layer = MultiHeadAttention(d_model=8, h=2, rng=0)
    >>> out, saved = layer.forward(np.ones((3, 8)), return_cache=True)
    >>> grads = backward(layer, np.ones_like(out), saved)
    >>> grads["x"].shape, grads["W_q"].shape
    ((3, 8), (8, 8))
    """
    func = "MultiHeadAttention.backward"
    refuse_layer_scale(func, layer)
    if not isinstance(saved, SavedActivations):
        raise fail(
            func,
            f"saved is a {type(saved).__name__}; expected the saved activations that "
            "forward(..., return_cache=True) returned",
        )
    if saved.layer is not layer:
        raise fail(func, "the saved activations come from another layer")
    grad_out = as_float_array(func, "grad_out", grad_out)
    if grad_out.shape != saved.out_shape:
        raise fail(
            func,
            f"grad_out has shape {fmt_shape(grad_out.shape)}; expected (..., T, d_model) = "
            f"{fmt_shape(saved.out_shape)}, the shape of the output",
        )
    P = saved.params  # the parameters as the forward pass used them
    h, g = layer.h, saved.k.shape[-3]
    dout = grad_out.astype(saved.dtype, copy=False)  # (..., T, d_model)
    grads = {}

    # 7. Output projection, out = concat @ W_o + b_o.
    grads["W_o"] = _param_grad(saved.concat, dout)  # (h*d_v, d_model)
    grads["b_o"] = dout.reshape(-1, dout.shape[-1]).sum(axis=0)  # (d_model,)
    dconcat = dout @ P["W_o"].T  # (..., T, d_model) @ (d_model, h*d_v) -> (..., T, h*d_v)
    # 6. Merge heads is only a reshape: its backward is the inverse reshape.
    dheads = split_heads_unchecked(dconcat, h)  # (..., T, h*d_v) -> (..., h, T, d_v)
    # 4-5. Attention within each group of h/g query heads that share one K/V head (views).
    weights = group_heads(saved.weights, g)  # (..., g, h/g, T, S)
    dheads = group_heads(dheads, g)  # (..., g, h/g, T, d_v)
    q = group_heads(saved.q, g)  # (..., g, h/g, T, d_k)
    k, v = kv_for_groups(saved.k), kv_for_groups(saved.v)  # (..., g, 1, S, d_k | d_v)
    # 5. Scaled dot-product attention within each group (scores, softmax, weighted sum).
    #    k and v have a length-1 group axis, so dk and dv come back summed over the h/g query
    #    heads of their group: (..., g, 1, S, d_k | d_v).
    dq, dk, dv = attention_backward_unchecked(dheads, q, k, v, weights)
    # 4. The h/g query heads of a group read one K/V head: their gradients added up in it (5).
    dq = ungroup_heads(dq)  # (..., h, T, d_k)
    dk = dk.sum(axis=-3)  # (..., g, 1, S, d_k) -> (..., g, S, d_k)
    dv = dv.sum(axis=-3)  # (..., g, 1, S, d_v) -> (..., g, S, d_v)
    # 3. RoPE rotated q and k by R(p); a rotation's transpose is the rotation back, R(-p).
    if layer.rope is not None:
        T, S = dq.shape[-2], dk.shape[-2]
        dq = rope_unchecked(dq, -np.arange(T), layer.rope_base, layer.rope)
        dk = rope_unchecked(dk, -np.arange(S), layer.rope_base, layer.rope)
    # 2. Split heads, undone by merge_heads.
    dq = merge_heads(dq)  # (..., h, T, d_k) -> (..., T, h*d_k)
    dk = merge_heads(dk)  # (..., g, S, d_k) -> (..., S, g*d_k)
    dv = merge_heads(dv)  # (..., g, S, d_v) -> (..., S, g*d_v)
    # 1. Projections, q = x @ W_q + b_q, k = context @ W_k + b_k, v = context @ W_v + b_v.
    kv_input = saved.x if saved.context is None else saved.context  # (..., S, d_model)
    grads["W_q"] = _param_grad(saved.x, dq)  # (d_model, h*d_k)
    grads["W_k"] = _param_grad(kv_input, dk)  # (d_model, g*d_k)
    grads["W_v"] = _param_grad(kv_input, dv)  # (d_model, g*d_v)
    grads["b_q"] = dq.reshape(-1, dq.shape[-1]).sum(axis=0)  # (h*d_k,)
    grads["b_k"] = dk.reshape(-1, dk.shape[-1]).sum(axis=0)  # (g*d_k,)
    grads["b_v"] = dv.reshape(-1, dv.shape[-1]).sum(axis=0)  # (g*d_v,)
    dx = dq @ P["W_q"].T  # (..., T, h*d_k) @ (h*d_k, d_model) -> (..., T, d_model)
    # (..., S, g*d_k) @ (g*d_k, d_model) + (..., S, g*d_v) @ (g*d_v, d_model) -> (..., S, d_model)
    dkv = dk @ P["W_k"].T + dv @ P["W_v"].T
    # Batch axes that were broadcast (e.g. one context for a batch of x) sum back.
    dx = sum_to_shape(dx, saved.x.shape)  # (..., T, d_model) with x's own batch axes
    dkv = sum_to_shape(dkv, kv_input.shape)  # (..., S, d_model) with its own batch axes
    if saved.context is None:
        # Self-attention: x fed the queries, the keys and the values; the three paths add up.
        result = {"x": dx + dkv}  # (..., T, d_model)
    else:
        result = {"x": dx, "context": dkv}
    names = ["W_q", "W_k", "W_v", "W_o"] + (["b_q", "b_k", "b_v", "b_o"] if layer.bias else [])
    result.update((name, grads[name]) for name in names)
    return result


def gradient_check(f, x, eps: float = 1e-6) -> float:
    """Compare a hand-written gradient with central differences; return the worst relative error.

    For every element ``i`` of ``x``, the numerical derivative is
    ``num_i = (f(x + eps·e_i) - f(x - eps·e_i)) / (2·eps)`` and the relative error is
    ``|num_i - ana_i| / max(|num_i| + |ana_i|, tiny)`` (``tiny`` the smallest normal float64,
    so two exact zeros count as agreement). On float64 losses of size about 1, a correct
    gradient gives about 1e-7 or less and a wrong one something near 1 (0.2 for a gradient
    off by a factor 1.5). The step trades truncation error (about ``eps**2``) against
    round-off (about ``1e-16 · |loss| / eps``, some 1e-10 absolute at ``eps = 1e-6``); so an
    element whose true derivative is nearly 0 (say below 1e-4) can show a large relative
    error even when it is right, and one that is exactly 0 by symmetry shows noise over noise.

    Parameters
    ----------
    f : callable
        ``f(x) -> (loss, grad)`` with ``loss`` a float and ``grad`` an array shaped like ``x``.
    x : ndarray of float64, any shape
        The point at which to check. It is copied: the caller's array is never modified.
    eps : float, default 1e-6
        The step of the central differences.

    Returns
    -------
    float
        The largest relative error over all elements of ``x`` (0.0 for an empty ``x``).

    Raises
    ------
    ValueError
        If ``x`` is not float64, ``eps`` is not positive, or ``f`` returns a gradient of
        another shape.

    Examples
    --------
    >>> def f(x):
    ...     return float(np.sum(x ** 2)), 2 * x
    >>> x = np.array([[1.0, -2.0, 0.5], [3.0, 0.0, -1.5]])  # shape (2, 3)
    >>> gradient_check(f, x) < 1e-8
    True
    >>> round(gradient_check(lambda x: (float(np.sum(x ** 2)), x), x), 4)  # forgot the 2
    0.3333
    """
    func = "gradient_check"
    x = as_float_array(func, "x", x)
    if x.dtype != np.float64:
        raise fail(
            func,
            f"x has dtype {x.dtype}; expected float64 (central differences lose every "
            "digit to round-off in float32)",
        )
    if isinstance(eps, bool) or not (isinstance(eps, (int, float, np.floating)) and eps > 0):
        raise fail(func, f"eps={eps!r} must be a positive number")
    x = np.array(x, dtype=np.float64, copy=True)  # our own copy: the caller's x stays as it is
    _, analytic = f(x.copy())
    analytic = np.asarray(analytic, dtype=np.float64)
    if analytic.shape != x.shape:
        raise fail(
            func,
            f"f(x) returned a grad of shape {fmt_shape(analytic.shape)}; expected x's shape "
            f"{fmt_shape(x.shape)}",
        )
    numeric = np.zeros_like(x)  # same shape as x
    flat = x.reshape(-1)  # a view: writing flat[i] moves x[i]
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        loss_plus = float(f(x)[0])
        flat[i] = old - eps
        loss_minus = float(f(x)[0])
        flat[i] = old  # restored exactly (old is the stored value, not old + eps - eps)
        numeric.reshape(-1)[i] = (loss_plus - loss_minus) / (2 * eps)
    if x.size == 0:
        return 0.0
    tiny = np.finfo(np.float64).tiny
    rel = np.abs(numeric - analytic) / np.maximum(np.abs(numeric) + np.abs(analytic), tiny)
    return float(rel.max())
