"""Multi-head attention: split and merge heads, and the ``MultiHeadAttention`` layer.

Taught in ``notebooks/04_multi_head_attention.ipynb``.

Layout: the fused projection ``W_q`` of shape (d_model, h*d_k) holds head ``i`` in columns
``i*d_k : (i+1)*d_k``; that is exactly the article's per-head matrices ``W_q[i]`` of shape
(d_model, d_k) laid side by side (:meth:`MultiHeadAttention.from_per_head` and
:meth:`MultiHeadAttention.per_head` convert). Inputs multiply from the left: ``q = x @ W_q``.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import _fmt_shape, as_float_array, check_mask, check_positive_int, check_shape, fail
from .attention import _exp_is_safe, _weights_from_scores


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
    h = check_positive_int(func, "h", h)
    x = np.asarray(x)
    check_shape(func, "x", x, ("T", "h*d"))
    *lead, T, D = x.shape
    if D % h:
        raise fail(func, f"x has shape {x.shape}; its last axis {D} is not divisible by h={h}")
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
    check_shape("merge_heads", "x", x, ("h", "T", "d"))
    *lead, h, T, d = x.shape
    # (..., h, T, d) -> (..., T, h, d) -> (..., T, h*d)
    return np.swapaxes(x, -3, -2).reshape(*lead, T, h * d)


def _stack_heads(func: str, name: str, heads) -> np.ndarray:
    """[h][d_model, d] (a sequence of h matrices, or one (h, d_model, d) array) -> (h, d_model, d).

    Each matrix is checked against the first, so ragged input gets a named error rather than
    NumPy's "inhomogeneous shape".
    """
    if isinstance(heads, np.ndarray):
        return as_float_array(func, name, heads)
    heads = [as_float_array(func, f"{name}[{i}]", w) for i, w in enumerate(heads)]
    if not heads:
        raise fail(func, f"{name} is empty; expected h >= 1 matrices of shape (d_model, d)")
    first = heads[0]
    for i, w in enumerate(heads):
        check_shape(func, f"{name}[{i}]", w, ("d_model", "d"),
                    {"d_model": (first.shape[0], f"{name}[0]"),
                     "d": (first.shape[-1], f"{name}[0]")} if first.ndim == 2 else None,
                    batch=False)
    return np.stack(heads)


def _head_dims(func: str, d_model, h, d_k, d_v) -> tuple[int, int, int, int]:
    """Validate the layer's sizes; fill in d_k = d_model / h and d_v = d_k when not given."""
    d_model = check_positive_int(func, "d_model", d_model)
    h = check_positive_int(func, "h", h)
    if d_k is None:
        if d_model % h:
            raise fail(func, f"d_model={d_model} is not divisible by h={h}; pass d_k explicitly")
        d_k = d_model // h
    d_k = check_positive_int(func, "d_k", d_k)
    d_v = d_k if d_v is None else check_positive_int(func, "d_v", d_v)
    return d_model, h, d_k, d_v


def _kv_heads(func: str, h: int, n_kv_heads) -> int:
    """Validate the number of key/value heads (None means ``h``); it must divide ``h``."""
    if n_kv_heads is None:
        return h
    n_kv_heads = check_positive_int(func, "n_kv_heads", n_kv_heads)
    if h % n_kv_heads:
        divisors = [g for g in range(1, h + 1) if h % g == 0]
        raise fail(
            func,
            f"n_kv_heads={n_kv_heads} does not divide h={h}; each key/value head serves "
            f"h/n_kv_heads query heads, so choose one of {divisors}",
        )
    return n_kv_heads


def _group_heads(x: np.ndarray, g: int) -> np.ndarray:
    """(..., h, T, d) -> (..., g, h/g, T, d): query heads ``j*h/g`` to ``(j+1)*h/g - 1`` share
    key/value head ``j``.

    Always a view (splitting one axis never needs a copy), so ``forward`` can write its heads
    through it; matmul against K/V heads of shape (..., g, 1, S, d) then broadcasts each K/V
    head over its group without repeating it.
    """
    *lead, h, T, d = x.shape
    return x.reshape(*lead, g, h // g, T, d)


class MultiHeadAttention:
    """Multi-head attention as in Vaswani et al. (2017), vectorised over heads.

    ``MultiHead(x, context) = Concat(head_1, ..., head_h) W_o`` with
    ``head_i = Attention(x W_q[i], context W_k[i], context W_v[i])``, all heads computed at once
    by one fused projection and a reshape.

    With ``n_kv_heads = g < h`` (grouped-query attention, GQA; ``g = 1`` is multi-query
    attention, MQA) the ``h`` query heads share ``g`` key/value heads: query head ``i`` reads
    K/V head ``i // (h // g)``, the grouping of PyTorch's
    ``scaled_dot_product_attention(..., enable_gqa=True)``. ``W_k`` and ``W_v`` shrink to
    ``g`` heads, and so does the KV cache (:meth:`init_cache`); the scores and weights keep
    all ``h`` heads.

    Parameters
    ----------
    d_model : int
        Width of the input and output.
    h : int
        Number of heads.
    d_k : int, optional
        Query/key width per head; default ``d_model // h`` (then ``h`` must divide ``d_model``).
    d_v : int, optional
        Value width per head; default ``d_k``.
    bias : bool, default False
        Add biases ``b_q``, ``b_k``, ``b_v``, ``b_o`` (zeros at start, as in PyTorch).
    rng : int or numpy.random.Generator, optional
        Seed or generator for the initial weights (Xavier/Glorot uniform, as PyTorch).
    n_kv_heads : int, optional
        Number of key/value heads ``g``; must divide ``h``. Default (None): ``h``, the standard
        layer (its weights and outputs are exactly those of a layer built without it).

    Attributes
    ----------
    n_kv_heads : int
        ``g``: ``h`` unless given.
    W_q : ndarray, shape (d_model, h*d_k)
    W_k : ndarray, shape (d_model, g*d_k)
    W_v : ndarray, shape (d_model, g*d_v)
    W_o : ndarray, shape (h*d_v, d_model)
    b_q, b_k, b_v, b_o : ndarray or None
        Shapes (h*d_k,), (g*d_k,), (g*d_v,), (d_model,) when ``bias=True``.

    Raises
    ------
    ValueError
        If a size is not a positive integer, ``h`` does not divide ``d_model`` and no ``d_k``
        is given, or ``n_kv_heads`` does not divide ``h``.

    Examples
    --------
    >>> mha = MultiHeadAttention(d_model=8, h=2, rng=0)
    >>> out, weights = mha(np.ones((3, 8)))
    >>> out.shape, weights.shape
    ((3, 8), (2, 3, 3))
    >>> gqa = MultiHeadAttention(d_model=8, h=4, n_kv_heads=2, rng=0)
    >>> gqa.W_k.shape, gqa(np.ones((3, 8)))[1].shape
    ((8, 4), (4, 3, 3))
    """

    def __init__(self, d_model, h, d_k=None, d_v=None, *, bias=False, rng=None, n_kv_heads=None):
        d_model, h, d_k, d_v = _head_dims("MultiHeadAttention", d_model, h, d_k, d_v)
        g = _kv_heads("MultiHeadAttention", h, n_kv_heads)
        self.d_model, self.h, self.d_k, self.d_v = d_model, h, d_k, d_v
        self.n_kv_heads = g
        rng = np.random.default_rng(rng)

        def xavier(fan_in, fan_out):
            bound = np.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-bound, bound, size=(fan_in, fan_out))

        # Drawn in this order (W_q, W_k, W_v, W_o), so g = h gives the standard layer's weights.
        self.W_q = xavier(d_model, h * d_k)
        self.W_k = xavier(d_model, g * d_k)
        self.W_v = xavier(d_model, g * d_v)
        self.W_o = xavier(h * d_v, d_model)
        self.bias = bool(bias)
        zeros = np.zeros if self.bias else (lambda n: None)
        self.b_q, self.b_k, self.b_v, self.b_o = (
            zeros(h * d_k), zeros(g * d_k), zeros(g * d_v), zeros(d_model)
        )

    # ----------------------------------------------------------------- the article's layout
    @classmethod
    def from_per_head(cls, W_q, W_k, W_v, W_o, *, b_q=None, b_k=None, b_v=None, b_o=None):
        """Build the layer from the article's per-head matrices.

        Parameters
        ----------
        W_q : sequence of h arrays of shape (d_model, d_k), or one array (h, d_model, d_k)
        W_k : sequence of g arrays of shape (d_model, d_k), or one array (g, d_model, d_k)
            ``g = h`` for the standard layer; fewer (a divisor of ``h``) for grouped-query
            attention: the layer's ``n_kv_heads`` is read off ``W_k``.
        W_v : sequence of g arrays of shape (d_model, d_v), or one array (g, d_model, d_v)
        W_o : ndarray, shape (h*d_v, d_model)
        b_q : sequence of h arrays (d_k,), optional
        b_k, b_v : sequence of g arrays (d_k,) / (d_v,), optional
        b_o : ndarray, shape (d_model,), optional
            Give all four biases or none.

        Returns
        -------
        MultiHeadAttention
            Whose fused ``W_q`` is ``concatenate(W_q, axis=1)`` (and likewise for K and V).

        Raises
        ------
        ValueError
            If the per-head matrices disagree in shape or with ``W_o``, or the number of K/V
            heads does not divide the number of query heads.

        Examples
        --------
        >>> heads = [np.eye(4, 2)] * 2
        >>> MultiHeadAttention.from_per_head(heads, heads, heads, np.eye(4)).W_q.shape
        (4, 4)
        """
        func = "MultiHeadAttention.from_per_head"
        stacked = {}
        for name, arr in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v)):
            stacked[name] = _stack_heads(func, name, arr)
        W_o = as_float_array(func, "W_o", W_o)
        per_head = ("h", "d_model", "d_k")
        h, d_model, d_k = check_shape(func, "W_q", stacked["W_q"], per_head, batch=False).values()
        # GQA: W_k may hold fewer heads g (a divisor of h); its axis is then named n_kv_heads.
        W_k_ = stacked["W_k"]
        g = W_k_.shape[0] if W_k_.ndim == 3 else h
        kv = "h" if g == h else "n_kv_heads"
        if g != h and (g < 1 or h % g):
            raise fail(
                func,
                f"W_k has shape {_fmt_shape(W_k_.shape)}; expected (n_kv_heads, d_model, d_k) "
                f"with n_kv_heads dividing h={h} (from W_q)",
            )
        known = {kv: (h, "W_q"), "d_model": (d_model, "W_q"), "d_k": (d_k, "W_q")}
        if g != h:
            known.pop(kv)
        check_shape(func, "W_k", W_k_, (kv, "d_model", "d_k"), known, batch=False)
        known.pop("d_k")
        known[kv] = (g, "W_q" if g == h else "W_k")
        known = {kv: known.pop(kv), **known}  # letters in the order of the shape
        d_v = check_shape(func, "W_v", stacked["W_v"], (kv, "d_model", "d_v"), known, batch=False)
        d_v = d_v["d_v"]
        fused = {"h*d_k": (h * d_k, "W_q"), "h*d_v": (h * d_v, "W_v"), "d_model": (d_model, "W_q")}
        if g != h:
            fused.update({f"{kv}*d_k": (g * d_k, "W_k"), f"{kv}*d_v": (g * d_v, "W_v")})
        check_shape(func, "W_o", W_o, ("h*d_v", "d_model"), fused, batch=False)
        biases = {"b_q": b_q, "b_k": b_k, "b_v": b_v, "b_o": b_o}
        if any(b is not None for b in biases.values()) and any(b is None for b in biases.values()):
            raise fail(func, "give all four biases b_q, b_k, b_v, b_o, or none")
        layer = cls(d_model, h, d_k, d_v, bias=b_q is not None, n_kv_heads=g)
        # [h][d_model, d] -> (d_model, h*d): head i in columns i*d:(i+1)*d
        for name in ("W_q", "W_k", "W_v"):
            setattr(layer, name, np.concatenate(list(stacked[name]), axis=1))
        layer.W_o = np.array(W_o)
        if layer.bias:
            letters = {"b_q": "h*d_k", "b_k": f"{kv}*d_k", "b_v": f"{kv}*d_v", "b_o": "d_model"}
            for name, b in biases.items():
                # per-head biases [h][d] -> (h*d,); b_o is already (d_model,)
                b = as_float_array(func, name, b)
                b = b.reshape(-1) if name != "b_o" else b
                check_shape(func, name, b, (letters[name],), fused, batch=False)
                setattr(layer, name, np.array(b))
        return layer

    def per_head(self) -> dict[str, np.ndarray]:
        """The projections in the article's per-head layout.

        Returns
        -------
        dict
            ``"W_q"``: (h, d_model, d_k); ``"W_k"``: (g, d_model, d_k); ``"W_v"``:
            (g, d_model, d_v), with g = ``n_kv_heads`` (= h unless the layer uses GQA);
            ``"W_o"``: (h, d_v, d_model), the rows of ``W_o`` that read head ``i``.

        Examples
        --------
        >>> MultiHeadAttention(8, 2, rng=0).per_head()["W_q"].shape
        (2, 8, 4)
        >>> MultiHeadAttention(8, 4, n_kv_heads=1, rng=0).per_head()["W_k"].shape
        (1, 8, 2)
        """
        h, d_model, d_k, d_v = self.h, self.d_model, self.d_k, self.d_v
        g = self.n_kv_heads
        return {
            # (d_model, h*d_k) -> (d_model, h, d_k) -> (h, d_model, d_k)
            "W_q": self.W_q.reshape(d_model, h, d_k).transpose(1, 0, 2),
            "W_k": self.W_k.reshape(d_model, g, d_k).transpose(1, 0, 2),
            "W_v": self.W_v.reshape(d_model, g, d_v).transpose(1, 0, 2),
            # (h*d_v, d_model) -> (h, d_v, d_model)
            "W_o": self.W_o.reshape(h, d_v, d_model),
        }

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter array by name (biases only when the layer has them).

        Examples
        --------
        >>> sorted(MultiHeadAttention(8, 2, bias=True).parameters())
        ['W_k', 'W_o', 'W_q', 'W_v', 'b_k', 'b_o', 'b_q', 'b_v']
        """
        names = ["W_q", "W_k", "W_v", "W_o"] + (["b_q", "b_k", "b_v", "b_o"] if self.bias else [])
        return {name: getattr(self, name) for name in names}

    def _check_inputs(self, x, context, mask):
        """The input checks of :meth:`forward` (and of the backward module's forward).

        Returns ``(x, context, mask, batch, T, S)``: float arrays (``context`` is ``x`` for
        self-attention), the mask reshaped to (..., 1, T, S) so it applies to every head (or
        None), and the broadcast batch axes of ``x`` and ``context``.
        """
        func = "MultiHeadAttention"
        x = as_float_array(func, "x", x)
        known = {"d_model": (self.d_model, "the layer")}
        T = check_shape(func, "x", x, ("T", "d_model"), known)["T"]
        context = x if context is None else as_float_array(func, "context", context)
        S = check_shape(func, "context", context, ("S", "d_model"), known)["S"]
        try:
            batch = np.broadcast_shapes(x.shape[:-2], context.shape[:-2])
        except ValueError:
            raise fail(
                func,
                f"the batch axes of x {x.shape[:-2]} and context {context.shape[:-2]} "
                "do not broadcast together",
            ) from None
        m = check_mask(func, mask, (*batch, T, S), f"(..., T, S) = {(*batch, T, S)}")
        if m is not None:
            # (..., T, S) -> (..., 1, T, S): the same mask for every head
            m = m.reshape((1,) * (2 - m.ndim) + m.shape)[..., None, :, :]
        return x, context, m, batch, T, S

    # ------------------------------------------------------------------------ the forward pass
    def forward(self, x, context=None, mask=None, *, return_cache=False):
        """Attend from ``x`` to ``context`` (to ``x`` itself when ``context`` is None).

        Parameters
        ----------
        x : ndarray of float, shape (..., T, d_model)
            The queries' input.
        context : ndarray of float, shape (..., S, d_model), optional
            The keys' and values' input, for cross-attention. Default: ``x``.
        mask : ndarray of bool, broadcastable to (..., T, S), optional
            ``True`` = may attend; applied to every head.
        return_cache : bool, default False
            Return ``(out, cache)`` instead, where ``cache`` keeps what :meth:`backward` needs
            (the weights are ``cache.weights``).

        Returns
        -------
        out : ndarray, shape (..., T, d_model)
            In ``x``'s dtype (float32 in, float32 out).
        weights : ndarray, shape (..., h, T, S)
            Every head's attention weights (or the cache, with ``return_cache=True``).

        Raises
        ------
        ValueError
            On a wrong last axis, batch axes of ``x`` and ``context`` that do not broadcast, a
            mask that does not broadcast to (..., T, S), or non-float input.

        Examples
        --------
        >>> mha = MultiHeadAttention(d_model=8, h=2, rng=0)
        >>> out, weights = mha(np.ones((4, 3, 8)), context=np.ones((4, 5, 8)))
        >>> out.shape, weights.shape
        ((4, 3, 8), (4, 2, 3, 5))
        """
        if return_cache:
            # The training path keeps every intermediate the backward pass needs (lesson on
            # backprop); the plain path below is ordered for speed and memory instead.
            from .backward import forward_with_cache

            return forward_with_cache(self, x, context, mask)
        x, context, m, batch, T, S = self._check_inputs(x, context, mask)

        # Each head computes scaled_dot_product_attention(q_i, k_i, v_i, mask); the steps are
        # written out here (with its private helpers) only to order them for memory: peak memory
        # is the (..., h, T, S) weights plus two (..., T, h*d) arrays, not four or five.
        dtype = np.result_type(x, context)
        h, d_k, d_v, g = self.h, self.d_k, self.d_v, self.n_kv_heads
        q = self._project(x, self.W_q, self.b_q, dtype)  # (..., T, h*d_k)
        # Memory: scale our own q in place (no temporary copy); a python float keeps the dtype.
        q *= 1.0 / math.sqrt(d_k)
        k = self._project(context, self.W_k, self.b_k, dtype)  # (..., S, g*d_k)
        # GQA: the h query heads in g groups, (..., g, h/g, T, d_k), against the g K/V heads
        # as (..., g, 1, S, d_k): matmul broadcasts each K/V head over its group, so K and V
        # are never repeated in memory. The standard layer is g = h: groups of one. All views.
        q_heads = _group_heads(split_heads(q, h), g)
        k_heads = split_heads(k, g)[..., None, :, :]
        shift = not _exp_is_safe(q_heads, k_heads, dtype)  # before the big buffer exists
        # (..., g, h/g, T, d_k) @ (..., g, 1, d_k, S) -> (..., g, h/g, T, S) -> (..., h, T, S),
        # a free reshape of the new contiguous buffer. BLAS reads the strided views directly
        # (measured: no slower than contiguous copies, which would cost memory).
        scores = q_heads @ np.swapaxes(k_heads, -1, -2)
        scores = scores.reshape(*scores.shape[:-4], h, T, S)
        del k, k_heads  # memory: k is not needed once the scores exist
        weights = _weights_from_scores(scores, m, shift)  # in place: scores become weights
        # Memory: v is projected only now, after k is freed, so q, k and v never coexist with
        # the (..., h, T, S) buffer.
        v = self._project(context, self.W_v, self.b_v, dtype)  # (..., S, g*d_v)
        # The heads are written straight into merge_heads layout (..., T, h*d_v) through a
        # split_heads view, which saves merge_heads' copy; q's buffer is reused when it has the
        # right shape (d_v == d_k and no batch broadcasting between x and context).
        batch = weights.shape[:-3]
        if q.shape[:-2] == batch and d_v == d_k:
            concat = q
        else:
            concat = np.empty((*batch, T, h * d_v), dtype=dtype)
        del q, q_heads
        # (..., g, h/g, T, S) @ (..., g, 1, S, d_v) -> (..., g, h/g, T, d_v), stored as
        # (..., T, h*d_v)
        np.matmul(
            _group_heads(weights, g),
            split_heads(v, g)[..., None, :, :],
            out=_group_heads(split_heads(concat, h), g),
        )
        del v
        out = self._project(concat, self.W_o, self.b_o, dtype)  # (..., T, d_model)
        return out, weights

    __call__ = forward

    # ------------------------------------------------------------------ decoding with a cache
    def init_cache(self, batch_shape=(), max_len=None, *, dtype=None):
        """An empty KV cache for decoding with this layer, one token at a time.

        Parameters
        ----------
        batch_shape : tuple of int, default ()
            The leading axes ``...`` of every ``x_t`` that :meth:`decode_step` will get.
        max_len : int, optional
            Most positions to hold, preallocated; None lets the cache grow (by doubling).
        dtype : numpy dtype, optional
            Dtype of the stored keys and values; default: that of the first ``x_t``.

        Returns
        -------
        KVCache
            Empty; its buffers will have shape (..., n_kv_heads, capacity, d_k | d_v).

        Raises
        ------
        ValueError
            If ``batch_shape`` is not a tuple of non-negative integers, ``max_len`` is not a
            positive integer, or ``dtype`` is not a floating dtype.

        Examples
        --------
        >>> cache = MultiHeadAttention(8, 2, rng=0).init_cache(batch_shape=(3,), max_len=16)
        >>> len(cache), cache.keys.shape
        (0, (3, 2, 0, 4))
        """
        from .kv_cache import KVCache

        return KVCache(self, batch_shape, max_len, dtype=dtype)

    def decode_step(self, x_t, cache):
        """Attend from one new position to itself and every earlier one, using ``cache``.

        Appends the new key and value (one per K/V head) to ``cache``, then attends from the
        new query to all ``L`` cached positions. Decoding T tokens one at a time gives the
        rows of ``forward(x, mask=causal_mask(T))``, at O(d_model² + L·d_model) per step.

        Parameters
        ----------
        x_t : ndarray of float, shape (..., 1, d_model)
            The new position's input; ``...`` must be the cache's ``batch_shape``.
        cache : KVCache
            From this layer's :meth:`init_cache`; updated in place.

        Returns
        -------
        out_t : ndarray, shape (..., 1, d_model)
        weights_t : ndarray, shape (..., h, 1, L)
            Every head's weights over the ``L = len(cache)`` positions, this one included.

        Raises
        ------
        ValueError
            If ``x_t`` holds more than one position, has the wrong width or batch axes, or is
            not float; if ``cache`` is not a KVCache of this layer; or if it is full
            (``max_len``). The cache is left unchanged.

        Examples
        --------
        >>> mha = MultiHeadAttention(8, 2, rng=0)
        >>> cache = mha.init_cache()
        >>> for x_t in np.ones((3, 1, 8)):
        ...     out_t, weights_t = mha.decode_step(x_t, cache)
        >>> out_t.shape, weights_t.shape
        ((1, 8), (2, 1, 3))
        """
        from .kv_cache import decode_step

        return decode_step(self, x_t, cache)

    def backward(self, grad_out, cache) -> dict[str, np.ndarray]:
        """Gradients of a loss with respect to the inputs and every parameter.

        Parameters
        ----------
        grad_out : ndarray, shape (..., T, d_model)
            dLoss/dout for the ``out`` of ``forward(..., return_cache=True)``.
        cache : object
            The cache that call returned.

        Returns
        -------
        dict of str to ndarray
            ``"x"``, ``"context"`` (cross-attention only), ``"W_q"``, ``"W_k"``, ``"W_v"``,
            ``"W_o"`` (and ``"b_q"``, ``"b_k"``, ``"b_v"``, ``"b_o"`` with biases), each shaped
            like what it is the gradient of.

        See Also
        --------
        mha_course.backward : the hand-written backward pass, taught step by step.
        """
        from .backward import backward

        return backward(self, grad_out, cache)

    @staticmethod
    def _project(x, W, b, dtype):
        y = x @ W.astype(dtype, copy=False)
        if b is not None:
            y += b.astype(dtype, copy=False)
        return y

    def __repr__(self) -> str:
        return (
            f"MultiHeadAttention(d_model={self.d_model}, h={self.h}, d_k={self.d_k}, "
            f"d_v={self.d_v}, bias={self.bias}"
            + (f", n_kv_heads={self.n_kv_heads})" if self.n_kv_heads != self.h else ")")
        )
