"""The block around attention: dropout, LayerNorm and RMSNorm, the SwiGLU MLP, the residual.

Taught in ``notebooks/05_layer_to_model.ipynb`` (the backward passes and SwiGLU are used by
lesson 09's GPT).

- :func:`dropout` is *inverted* dropout, as PyTorch's ``nn.Dropout`` and
  ``scaled_dot_product_attention(..., dropout_p=p)`` apply it: during training each entry is
  zeroed with probability ``p`` and the survivors are multiplied by ``1 / (1 - p)`` (not
  ``1 / p``: the two agree only at ``p = 0.5``, the example in which the mistake of
  rasbt/LLMs-from-scratch#431 hid), so every entry keeps its expected value; in evaluation it
  is the identity. Applied to the attention weights it sits after the softmax and before the
  product with the values.
- :func:`layer_norm` normalises each row (the last axis) to mean 0 and variance 1, then scales
  and shifts it (``gamma``, ``beta``), as ``torch.nn.functional.layer_norm``.
- :func:`rms_norm` divides each row by its root mean square and scales it (``weight``): no mean
  subtracted, no shift (Zhang & Sennrich 2019), as Llama, Mistral, Qwen, DeepSeek and gpt-oss
  use; ``torch.nn.functional.rms_norm``.
- :func:`swiglu` is the gated MLP of Shazeer (2020), used by Llama and most 2024-25 models:
  ``(silu(x W_gate) * (x W_up)) W_down``.
- :func:`layer_norm_backward`, :func:`rms_norm_backward` and :func:`swiglu_backward` are their
  backward passes by hand (checked against central differences and PyTorch in the tests).
- :func:`residual` wraps a sublayer (attention, or the feed-forward network) with the residual
  connection and a LayerNorm, in one of two placements: ``"post"``, ``LN(x + f(x))`` (Vaswani
  et al. 2017), or ``"pre"``, ``x + f(LN(x))`` (GPT-2 onward; such a stack ends with one more
  LayerNorm).
- :class:`PreNormBlock`, the decoder block of lessons 09 to 12 and of serving, is made of them.
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


def _norm_weight(func: str, name: str, param, d_model: int):
    """``param`` as a (d_model,) float array, or None."""
    if param is None:
        return None
    param = as_float_array(func, name, param)
    if param.shape != (d_model,):
        raise fail(func, f"{name} has shape {fmt_shape(param.shape)}; expected (d_model,) with "
                         f"d_model={d_model} (from x)")
    return param


def _same_shape(func: str, name: str, arr, shape: tuple[int, ...], like: str) -> np.ndarray:
    arr = as_float_array(func, name, arr)
    if arr.shape != shape:
        raise fail(func, f"{name} has shape {fmt_shape(arr.shape)}; expected "
                         f"{fmt_shape(shape)}, the shape of {like}")
    return arr


def rms_norm(x, weight=None, eps: float = 1e-5) -> np.ndarray:
    """Divide each row of ``x`` by its root mean square over the last axis, then scale it.

    ``x / sqrt(mean(x**2) + eps) * weight``: LayerNorm without the mean and the shift, as
    ``torch.nn.functional.rms_norm(x, (d_model,), weight, eps)``. Llama 3 uses ``eps = 1e-5``.

    Parameters
    ----------
    x : ndarray of float, shape (..., d_model)
    weight : ndarray of float, shape (d_model,), optional
        The learned scale (default 1).
    eps : float, default 1e-5

    Returns
    -------
    ndarray, shape (..., d_model)

    Raises
    ------
    ValueError
        If ``x`` is not a float array with at least one axis, ``weight`` does not have shape
        (d_model,), or ``eps`` is negative.

    Examples
    --------
    >>> y = rms_norm(np.array([[3.0, -4.0]]), eps=0.0)
    >>> np.round(y, 4) + 0.0, float(np.round(np.sqrt((y ** 2).mean()), 4))
    (array([[ 0.8485, -1.1314]]), 1.0)
    """
    func = "rms_norm"
    x = as_float_array(func, "x", x)
    d_model = validate_shape(func, "x", x, ("d_model",))["d_model"]
    if not eps >= 0:
        raise fail(func, f"eps={eps!r} must be >= 0")
    weight = _norm_weight(func, "weight", weight, d_model)
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., d_model)
    return y if weight is None else y * weight


def rms_norm_backward(grad_y, x, weight=None, eps: float = 1e-5):
    """The gradients of :func:`rms_norm`: ``(dx, dweight)`` from ``grad_y = dL/dy``.

    With ``r = 1 / sqrt(mean(x²) + eps)``, ``x̂ = x · r`` and ``g = grad_y · weight``:
    ``dx = r · (g − x̂ · mean(g · x̂))`` (mean over the last axis) and ``dweight`` is
    ``grad_y · x̂`` summed over every leading axis (None when ``weight`` is None).

    Parameters
    ----------
    grad_y, x : ndarray of float, shape (..., d_model)
    weight : ndarray of float, shape (d_model,), optional
    eps : float, default 1e-5

    Returns
    -------
    dx : ndarray, shape (..., d_model)
    dweight : ndarray, shape (d_model,), or None

    Raises
    ------
    ValueError
        If the shapes do not match.

    Examples
    --------
    >>> dx, dw = rms_norm_backward(np.ones((2, 3)), np.arange(6.0).reshape(2, 3), np.ones(3))
    >>> dx.shape, dw.shape
    ((2, 3), (3,))
    """
    func = "rms_norm_backward"
    x = as_float_array(func, "x", x)
    d_model = validate_shape(func, "x", x, ("d_model",))["d_model"]
    grad_y = _same_shape(func, "grad_y", grad_y, x.shape, "x")
    weight = _norm_weight(func, "weight", weight, d_model)
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = x * r  # (..., d_model)
    g = grad_y if weight is None else grad_y * weight
    dx = r * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    dweight = None if weight is None else (grad_y * xhat).reshape(-1, d_model).sum(axis=0)
    return dx, dweight


def layer_norm_backward(grad_y, x, gamma=None, eps: float = 1e-5):
    """The gradients of :func:`layer_norm`: ``(dx, dgamma, dbeta)`` from ``grad_y = dL/dy``.

    With ``r = 1 / sqrt(var + eps)``, ``x̂ = (x − mean) · r`` and ``g = grad_y · gamma``:
    ``dx = r · (g − mean(g) − x̂ · mean(g · x̂))``; ``dgamma`` sums ``grad_y · x̂`` and ``dbeta``
    sums ``grad_y`` over every leading axis (``dgamma`` is None when ``gamma`` is None).

    Parameters
    ----------
    grad_y, x : ndarray of float, shape (..., d_model)
    gamma : ndarray of float, shape (d_model,), optional
    eps : float, default 1e-5

    Returns
    -------
    dx : ndarray, shape (..., d_model)
    dgamma : ndarray, shape (d_model,), or None
    dbeta : ndarray, shape (d_model,)

    Raises
    ------
    ValueError
        If the shapes do not match.

    Examples
    --------
    >>> dx, dg, db = layer_norm_backward(np.ones((2, 3)), np.arange(6.0).reshape(2, 3))
    >>> float(np.abs(dx).max()) < 1e-12, dg is None, db.tolist()
    (True, True, [2.0, 2.0, 2.0])
    """
    func = "layer_norm_backward"
    x = as_float_array(func, "x", x)
    d_model = validate_shape(func, "x", x, ("d_model",))["d_model"]
    grad_y = _same_shape(func, "grad_y", grad_y, x.shape, "x")
    gamma = _norm_weight(func, "gamma", gamma, d_model)
    mean = x.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = (x - mean) * r  # (..., d_model)
    g = grad_y if gamma is None else grad_y * gamma
    dx = r * (g - g.mean(axis=-1, keepdims=True)
              - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    flat = grad_y.reshape(-1, d_model)
    dgamma = None if gamma is None else (flat * xhat.reshape(-1, d_model)).sum(axis=0)
    return dx, dgamma, flat.sum(axis=0)


def sigmoid(a) -> np.ndarray:
    """``1 / (1 + exp(-a))``, exact for large ``|a|``: where ``exp(-a)`` overflows to inf (a
    very negative ``a``), ``1 / (1 + inf)`` is the right 0, so that overflow is not an error."""
    a = np.asarray(a)
    s = np.array(a, dtype=np.result_type(a, np.float32))  # a copy, float
    np.negative(s, out=s)
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    return np.reciprocal(s, out=s)  # four passes, in place: it runs on every MLP activation


def silu(a) -> np.ndarray:
    """SiLU (swish): ``a · sigmoid(a)``, as ``torch.nn.functional.silu``."""
    return a * sigmoid(a)


def _swiglu_shapes(func: str, x, W_gate, W_up, W_down):
    x = as_float_array(func, "x", x)
    d_model = validate_shape(func, "x", x, ("d_model",))["d_model"]
    W_gate = as_float_array(func, "W_gate", W_gate)
    d_ff = validate_shape(func, "W_gate", W_gate, ("d_model", "d_ff"),
                          {"d_model": (d_model, "x")}, batch=False)["d_ff"]
    known = {"d_model": (d_model, "x"), "d_ff": (d_ff, "W_gate")}
    W_up = as_float_array(func, "W_up", W_up)
    validate_shape(func, "W_up", W_up, ("d_model", "d_ff"), known, batch=False)
    W_down = as_float_array(func, "W_down", W_down)
    validate_shape(func, "W_down", W_down, ("d_ff", "d_model"), known, batch=False)
    return x, W_gate, W_up, W_down


def swiglu(x, W_gate, W_up, W_down) -> np.ndarray:
    """The SwiGLU MLP: ``(silu(x W_gate) * (x W_up)) W_down`` (Shazeer 2020; Llama's MLP).

    Parameters
    ----------
    x : ndarray of float, shape (..., d_model)
    W_gate, W_up : ndarray of float, shape (d_model, d_ff)
    W_down : ndarray of float, shape (d_ff, d_model)

    Returns
    -------
    ndarray, shape (..., d_model)

    Raises
    ------
    ValueError
        If a shape does not fit, e.g.
        ``swiglu: W_up has shape (4, 6); expected (d_model, d_ff) with d_model=4 (from x),
        d_ff=5 (from W_gate)``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> swiglu(np.ones((3, 4)), rng.normal(size=(4, 6)), rng.normal(size=(4, 6)),
    ...        rng.normal(size=(6, 4))).shape
    (3, 4)
    """
    x, W_gate, W_up, W_down = _swiglu_shapes("swiglu", x, W_gate, W_up, W_down)
    return (silu(x @ W_gate) * (x @ W_up)) @ W_down  # (..., d_ff) -> (..., d_model)


def swiglu_backward(grad_out, x, W_gate, W_up, W_down) -> dict[str, np.ndarray]:
    """The gradients of :func:`swiglu`: ``{"x", "W_gate", "W_up", "W_down"}``.

    With ``a = x W_gate``, ``b = x W_up``, ``s = sigmoid(a)`` and ``h = silu(a) · b``:
    ``dh = grad_out W_downᵀ``, ``dW_down = hᵀ grad_out``, ``db = dh · silu(a)``,
    ``da = dh · b · s · (1 + a · (1 − s))`` (the derivative of ``a · s``), ``dx = da W_gateᵀ +
    db W_upᵀ``; the weight gradients sum over every leading axis.

    Parameters
    ----------
    grad_out, x : ndarray of float, shape (..., d_model)
    W_gate, W_up : ndarray of float, shape (d_model, d_ff)
    W_down : ndarray of float, shape (d_ff, d_model)

    Returns
    -------
    dict of str to ndarray
        Each gradient with the shape of what it is the gradient of.

    Raises
    ------
    ValueError
        If a shape does not fit.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> g = swiglu_backward(np.ones((3, 4)), np.ones((3, 4)), rng.normal(size=(4, 6)),
    ...                     rng.normal(size=(4, 6)), rng.normal(size=(6, 4)))
    >>> sorted((k, v.shape) for k, v in g.items())
    [('W_down', (6, 4)), ('W_gate', (4, 6)), ('W_up', (4, 6)), ('x', (3, 4))]
    """
    func = "swiglu_backward"
    x, W_gate, W_up, W_down = _swiglu_shapes(func, x, W_gate, W_up, W_down)
    grad_out = _same_shape(func, "grad_out", grad_out, x.shape, "x")
    d_model, d_ff = W_gate.shape
    a, b = x @ W_gate, x @ W_up  # (..., d_ff) each
    s = sigmoid(a)
    act = a * s  # silu(a)
    h = act * b  # (..., d_ff)
    dh = grad_out @ W_down.T  # (..., d_ff)
    db = dh * act
    da = dh * b * s * (1.0 + a * (1.0 - s))
    xf, hf = x.reshape(-1, d_model), h.reshape(-1, d_ff)
    return {
        "x": da @ W_gate.T + db @ W_up.T,  # (..., d_model)
        "W_gate": xf.T @ da.reshape(-1, d_ff),
        "W_up": xf.T @ db.reshape(-1, d_ff),
        "W_down": hf.T @ grad_out.reshape(-1, d_model),
    }


class PreNormBlock:
    r"""A pre-norm decoder block (Llama's): ``x + attn(rms_norm(x))``, ``x + swiglu(rms_norm(x))``.

    Lesson 09's GPT (``GPT.blocks``), lesson 13's variants (through the GPT's attention hook)
    and the serving decoder (``Decoder.blocks``) all run it. Its attention half takes a hook, a
    function of the normalised input (..., T, d_model) returning the attention's output: by
    default the layer's forward under ``mask``; :meth:`step` passes the layer's cached step.

    ``attn`` a MultiHeadAttention; ``attn_norm``, ``mlp_norm`` (d_model,) the RMSNorm weights;
    ``W_gate``, ``W_up`` (d_model, d_ff) and ``W_down`` (d_ff, d_model) the SwiGLU's; ``eps``
    RMSNorm's epsilon. The block keeps the arrays themselves (an optimiser updates them in place).

    Examples
    --------
    >>> from mha_course import MultiHeadAttention, causal_mask
    >>> rng = np.random.default_rng(0)
    >>> block = PreNormBlock(MultiHeadAttention(8, 2, rope="half", rng=0), np.ones(8),
    ...                      np.ones(8), rng.normal(size=(8, 16)), rng.normal(size=(8, 16)),
    ...                      rng.normal(size=(16, 8)))
    >>> x = rng.normal(size=(5, 8))
    >>> full = block(x, mask=causal_mask(5))
    >>> cache = block.attn.init_cache()
    >>> steps = np.concatenate([block.step(x[:3], cache), block.step(x[3:], cache)])
    >>> full.shape, bool(np.allclose(full, steps))
    ((5, 8), True)
    """

    def __init__(self, attn, attn_norm, mlp_norm, W_gate, W_up, W_down, eps: float = 1e-5):
        self.attn, self.eps = attn, float(eps)
        self.attn_norm, self.mlp_norm = np.asarray(attn_norm), np.asarray(mlp_norm)
        self.W_gate, self.W_up, self.W_down = (np.asarray(W) for W in (W_gate, W_up, W_down))

    def with_attention(self, x, attention=None, mask=None) -> np.ndarray:
        """``x + attention(rms_norm(x, attn_norm))``, (..., T, d_model) -> (..., T, d_model);
        ``attention`` defaults to the layer's forward under ``mask``."""
        a = rms_norm(x, self.attn_norm, self.eps)
        return x + (self.attn(a, mask=mask)[0] if attention is None else attention(a))

    def with_mlp(self, x) -> np.ndarray:
        """``x + swiglu(rms_norm(x, mlp_norm))``: (..., T, d_model) -> (..., T, d_model)."""
        return x + swiglu(rms_norm(x, self.mlp_norm, self.eps), self.W_gate, self.W_up,
                          self.W_down)

    def __call__(self, x, mask=None, *, attention=None) -> np.ndarray:
        """The whole block on ``x`` (..., T, d_model): attention half, then the MLP half."""
        return self.with_mlp(self.with_attention(x, attention, mask))

    def step(self, x, cache) -> np.ndarray:
        """The block on a chunk of new positions over its layer's KV cache (trusted input)."""
        return self(x, attention=lambda a: self.attn._step(a, cache)[0])

    def parameters(self) -> dict[str, np.ndarray]:
        """Every array by name, in lesson 09's order: ``attn_norm``, the attention's
        (``W_q`` .. ``W_o``, biases if any), ``mlp_norm``, ``W_gate``, ``W_up``, ``W_down``."""
        return {"attn_norm": self.attn_norm, **self.attn.parameters(),
                "mlp_norm": self.mlp_norm, "W_gate": self.W_gate, "W_up": self.W_up,
                "W_down": self.W_down}

    def __repr__(self) -> str:
        return f"PreNormBlock({self.attn!r}, d_ff={self.W_up.shape[-1]}, eps={self.eps:g})"
