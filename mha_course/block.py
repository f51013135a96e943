"""The block around attention: dropout on the weights, LayerNorm, and the residual (pre/post-LN).

Taught in ``notebooks/05_layer_to_model.ipynb``.

- :func:`dropout` is *inverted* dropout, as PyTorch's ``nn.Dropout`` and
  ``scaled_dot_product_attention(..., dropout_p=p)`` apply it: during training each entry is
  zeroed with probability ``p`` and the survivors are multiplied by ``1 / (1 - p)`` (not
  ``1 / p``: the two agree only at ``p = 0.5``, the example in which the mistake of
  rasbt/LLMs-from-scratch#431 hid), so every entry keeps its expected value; in evaluation it
  is the identity. Applied to the attention weights it sits after the softmax and before the
  product with the values.
- :func:`layer_norm` normalises each row (the last axis) to mean 0 and variance 1, then scales
  and shifts it (``gamma``, ``beta``), as ``torch.nn.functional.layer_norm``.
- :func:`residual` wraps a sublayer (attention, or the feed-forward network) with the residual
  connection and a LayerNorm, in one of two placements: ``"post"``, ``LN(x + f(x))`` (Vaswani
  et al. 2017), or ``"pre"``, ``x + f(LN(x))`` (GPT-2 onward; such a stack ends with one more
  LayerNorm).
"""

from __future__ import annotations

import numpy as np

from ._validate import as_float_array, fail, fmt_shape, validate_shape

PLACEMENTS = ("pre", "post")


def dropout(x, p: float, rng=None, training: bool = True) -> np.ndarray:
    """Inverted dropout: zero each entry with probability ``p``, scale the rest by 1/(1 - p).

    Which entries survive is ``rng.random(x.shape) >= p``: the same generator state gives the
    same mask (seed it for a reproducible run).

    Parameters
    ----------
    x : ndarray of float, any shape
        E.g. attention weights (..., T, S), after the softmax and before ``@ v``.
    p : float
        Probability of dropping an entry, ``0 <= p < 1``.
    rng : int or numpy.random.Generator, optional
        Seed or generator of the mask (a generator is advanced, so two calls differ).
    training : bool, default True
        False (evaluation): return ``x`` unchanged, no scaling.

    Returns
    -------
    ndarray, same shape and dtype as ``x``
        Every entry's expected value equals ``x``'s: ``E = (1 - p) · x / (1 - p)``.

    Raises
    ------
    ValueError
        If ``x`` is not a float array or ``p`` is not a number in [0, 1).

    Examples
    --------
    >>> w = np.full((2, 4), 0.25)
    >>> dropout(w, 0.5, rng=0).shape, dropout(w, 0.5, training=False) is w
    ((2, 4), True)
    """
    func = "dropout"
    x = as_float_array(func, "x", x)
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer,
                                                             np.floating)):
        raise fail(func, f"p={p!r} must be a number with 0 <= p < 1")
    if not 0 <= p < 1:
        raise fail(func, f"p={p!r} must be a number with 0 <= p < 1 (p = 1 would drop "
                         "everything and divide by 0)")
    if not training or p == 0:
        return x
    keep = np.random.default_rng(rng).random(x.shape) >= p  # True with probability 1 - p
    return np.where(keep, x * (1.0 / (1.0 - p)), 0.0).astype(x.dtype, copy=False)


def layer_norm(x, gamma=None, beta=None, eps: float = 1e-5) -> np.ndarray:
    """Normalise each row of ``x`` over its last axis, then scale by ``gamma`` and add ``beta``.

    ``(x - mean) / sqrt(var + eps) * gamma + beta``, with the mean and the (biased) variance
    taken over the last axis, as ``torch.nn.functional.layer_norm(x, (d_model,), ...)``.

    Parameters
    ----------
    x : ndarray of float, shape (..., d_model)
    gamma, beta : ndarray of float, shape (d_model,), optional
        The learned scale and shift; default 1 and 0.
    eps : float, default 1e-5
        Added to the variance (PyTorch's default).

    Returns
    -------
    ndarray, shape (..., d_model)

    Raises
    ------
    ValueError
        If ``x`` is not a float array with at least one axis, or ``gamma``/``beta`` do not have
        shape (d_model,), or ``eps`` is negative.

    Examples
    --------
    >>> y = layer_norm(np.array([[1.0, 2.0, 3.0, 6.0]]))
    >>> y.shape, float(np.round(y.mean(), 6) + 0.0), float(np.round(y.var(), 4))
    ((1, 4), 0.0, 1.0)
    """
    func = "layer_norm"
    x = as_float_array(func, "x", x)
    d_model = validate_shape(func, "x", x, ("d_model",))["d_model"]
    if not eps >= 0:
        raise fail(func, f"eps={eps!r} must be >= 0")
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1), biased, as PyTorch
    y = (x - mean) / np.sqrt(var + eps)  # (..., d_model)
    for name, param in (("gamma", gamma), ("beta", beta)):
        if param is None:
            continue
        param = as_float_array(func, name, param)
        if param.shape != (d_model,):
            raise fail(func, f"{name} has shape {fmt_shape(param.shape)}; expected (d_model,) "
                             f"with d_model={d_model} (from x)")
        y = y * param if name == "gamma" else y + param
    return y


def residual(x, sublayer, placement: str = "pre", *, gamma=None, beta=None,
             eps: float = 1e-5) -> np.ndarray:
    """One sublayer with its residual connection and LayerNorm, pre-LN or post-LN.

    ``placement="post"`` (Vaswani et al. 2017): ``layer_norm(x + sublayer(x))``.
    ``placement="pre"`` (GPT-2 onward): ``x + sublayer(layer_norm(x))``: the residual stream
    itself is never normalised, so a stack of pre-LN blocks ends with one more ``layer_norm``.

    Parameters
    ----------
    x : ndarray of float, shape (..., T, d_model)
    sublayer : callable
        ``(..., T, d_model) -> (..., T, d_model)``, e.g. ``lambda y: mha(y)[0]``.
    placement : {"pre", "post"}, default "pre"
    gamma, beta, eps
        The LayerNorm's parameters (see :func:`layer_norm`).

    Returns
    -------
    ndarray, shape (..., T, d_model)

    Raises
    ------
    ValueError
        If ``placement`` is unknown, ``sublayer`` is not callable or returns another shape.

    Examples
    --------
    >>> x = np.ones((3, 4))
    >>> residual(x, lambda y: 2 * y, "pre").shape
    (3, 4)
    """
    func = "residual"
    if placement not in PLACEMENTS:
        raise fail(func, f"placement={placement!r} is not one of 'pre' (GPT-2 onward) or "
                         "'post' (Vaswani et al. 2017)")
    if not callable(sublayer):
        raise fail(func, f"sublayer is a {type(sublayer).__name__}; expected a function of x")
    x = as_float_array(func, "x", x)

    def apply(y):
        out = np.asarray(sublayer(y))
        if out.shape != x.shape:
            raise fail(func, f"sublayer returned shape {fmt_shape(out.shape)}; expected "
                             f"{fmt_shape(x.shape)}, the shape of x (the residual adds them)")
        return out

    if placement == "post":
        return layer_norm(x + apply(x), gamma, beta, eps)
    return x + apply(layer_norm(x, gamma, beta, eps))
