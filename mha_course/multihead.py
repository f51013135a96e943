"""The ``MultiHeadAttention`` layer, composed of the pieces the lessons teach.

Taught in ``notebooks/04_multi_head_attention.ipynb``; its options in later lessons: RoPE
(``notebooks/05_layer_to_model.ipynb``), GQA/MQA and decoding with a KV cache
(``notebooks/06_decoding.ipynb``), the backward pass (``notebooks/08_learning.ipynb``).

``forward`` is exactly lesson 04's recipe: project -> :func:`~mha_course.split_heads` ->
(RoPE) -> :func:`~mha_course.scaled_dot_product_attention` -> :func:`~mha_course.merge_heads`
-> ``W_o``, its input checked once at the top and then trusted: it calls those functions'
``*_unchecked`` kernels, as nanoGPT asserts once and trusts inside.
:meth:`MultiHeadAttention.step` uses the same pieces on a chunk of new tokens over a
:class:`~mha_course.KVCache` (prefill, decode, verify; :meth:`~MultiHeadAttention.decode_step`
is its one-token case). A forward ordered for speed and memory lives beside it, in
:mod:`mha_course.kernels.lean`, tested equal to this one.

Layout: the fused projection ``W_q`` of shape (d_model, h*d_k) holds head ``i`` in columns
``i*d_k : (i+1)*d_k``; that is exactly the article's per-head matrices ``W_q[i]`` of shape
(d_model, d_k) laid side by side (:meth:`MultiHeadAttention.from_per_head` and
:meth:`MultiHeadAttention.per_head` convert). Inputs multiply from the left: ``q = x @ W_q``.
"""

from __future__ import annotations

import numpy as np

from ._validate import as_float_array, fail, fmt_shape, validate_mask, validate_shape
from .attention import causal_mask, sdpa_unchecked, validate_scale
from .backward import SavedActivations, backward
from .heads import (
    attend_heads,
    fuse_per_head,
    head_dims,
    kv_head_count,
    merge_heads,
    project,
    sdpa_operands,
    split_heads_unchecked,
    ungroup_heads,
)
from .kv_cache import KVCache
from .positions import apply_rope, rope_unchecked, validate_layout


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
        Seed or generator for the initial weights: Xavier/Glorot uniform on each matrix, so
        ``W_q`` of shape (d_model, h*d_k) has variance ``2 / (d_model + h*d_k)``. That is
        PyTorch's choice only on its separate-projection path (``kdim`` or ``vdim`` not
        ``embed_dim``). ``torch.nn.MultiheadAttention`` otherwise draws Xavier uniform once over
        its stacked (3*d_model, d_model) ``in_proj_weight`` (variance ``1 / (2*d_model)`` for
        each of q, k and v) and leaves ``out_proj`` at ``nn.Linear``'s default, Kaiming uniform
        with ``a = sqrt(5)`` (variance ``1 / (3*d_model)``); copy its weights in to match it
        (``tests/test_torch_parity.py`` does both).
    n_kv_heads : int, optional
        Number of key/value heads ``g``; must divide ``h``. Default (None): ``h``, the standard
        layer (its weights and outputs are exactly those of a layer built without it).
    rope : {None, "half", "interleaved"}, default None
        Rotary position embeddings (:func:`~mha_course.apply_rope`) on every query and key
        head, never on the values: ``"half"`` pairs features ``(j, j + d_k/2)`` (GPT-NeoX,
        Hugging Face), ``"interleaved"`` pairs ``(2j, 2j + 1)`` (Meta Llama, GPT-J). Needs an
        even ``d_k``; self-attention only (queries and keys must share positions).
    rope_base : float, default 10000.0
        RoPE's base (500000 in Llama 3).
    scale : float, optional
        What multiplies the scores ``q kᵀ``; default (None) ``1/√d_k``. Gemma 2 fixes it to
        ``query_pre_attn_scalar**-0.5`` (27B: ``144**-0.5`` with ``d_k = 128``; Hugging Face
        ``Gemma2Attention``: ``self.scaling = config.query_pre_attn_scalar**-0.5``).
        :meth:`forward` and :meth:`decode_step` use it; the hand-written backward pass assumes
        ``1/√d_k``, so ``forward(..., return_cache=True)`` refuses another scale.

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
    rope : str or None
    rope_base : float
    scale : float or None
        None for ``1/√d_k``.

    Raises
    ------
    ValueError
        If a size is not a positive integer, ``h`` does not divide ``d_model`` and no ``d_k``
        is given, ``n_kv_heads`` does not divide ``h``, ``rope`` is not None, "half" or
        "interleaved" (or is given with an odd ``d_k``), or ``scale`` is not a positive finite
        number.

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

    def __init__(self, d_model, h, d_k=None, d_v=None, *, bias=False, rng=None, n_kv_heads=None,
                 rope=None, rope_base=10000.0, scale=None):
        func = "MultiHeadAttention"
        d_model, h, d_k, d_v = head_dims(func, d_model, h, d_k, d_v)
        g = kv_head_count(func, h, n_kv_heads)
        self.d_model, self.h, self.d_k, self.d_v = d_model, h, d_k, d_v
        self.n_kv_heads = g
        if rope is not None:
            validate_layout(func, rope)
            if d_k % 2:
                raise fail(func, f"rope={rope!r} turns pairs of features, so d_k={d_k} must "
                                 "be even")
            apply_rope(np.zeros((1, d_k)), base=rope_base)  # refuses a bad base, by name
        self.rope, self.rope_base = rope, float(rope_base)
        self.scale = None if scale is None else validate_scale(func, scale)
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
    def from_per_head(cls, W_q, W_k, W_v, W_o, *, b_q=None, b_k=None, b_v=None, b_o=None,
                      **options):
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
        **options
            ``rope``, ``rope_base`` and ``scale``, as for the constructor.

        Returns the layer whose fused ``W_q`` is ``concatenate(W_q, axis=1)`` (likewise K and V).
        Raises a ``ValueError`` if the per-head matrices disagree in shape or with ``W_o``, or
        the number of K/V heads does not divide the number of query heads.

        Examples
        --------
        >>> heads = [np.eye(4, 2)] * 2
        >>> MultiHeadAttention.from_per_head(heads, heads, heads, np.eye(4)).W_q.shape
        (4, 4)
        """
        dims, params = fuse_per_head(
            "MultiHeadAttention.from_per_head", W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o
        )
        layer = cls(**dims, bias="b_q" in params, **options)
        for name, value in params.items():
            setattr(layer, name, value)
        return layer

    def per_head(self) -> dict[str, np.ndarray]:
        """The projections in the article's per-head layout.

        ``"W_q"``: (h, d_model, d_k); ``"W_k"``: (g, d_model, d_k); ``"W_v"``: (g, d_model,
        d_v), g = ``n_kv_heads``; ``"W_o"``: (h, d_v, d_model), the rows of ``W_o`` reading head i.

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

    def validate_inputs(self, x, context, mask):
        """The input validation of :meth:`forward` (and of
        :func:`mha_course.kernels.lean.lean_forward`).

        Returns ``(x, kv_input, mask)``: float arrays (``kv_input`` is ``x`` for
        self-attention) and the mask as (..., 1, 1, T, S), ready to broadcast over the
        (..., g, h/g, T, S) scores of the grouped query heads (or None).
        """
        func = "MultiHeadAttention"
        x = as_float_array(func, "x", x)
        known = {"d_model": (self.d_model, "the layer")}
        T = validate_shape(func, "x", x, ("T", "d_model"), known)["T"]
        if context is not None and self.rope is not None:
            raise fail(func, f"rope={self.rope!r} rotates queries and keys by their positions in "
                             "one sequence; cross-attention (context=...) has no shared "
                             "positions: build the layer with rope=None")
        kv_input = x if context is None else as_float_array(func, "context", context)
        S = validate_shape(func, "context", kv_input, ("S", "d_model"), known)["S"]
        try:
            batch = np.broadcast_shapes(x.shape[:-2], kv_input.shape[:-2])
        except ValueError:
            raise fail(
                func,
                f"the batch axes of x {x.shape[:-2]} and context {kv_input.shape[:-2]} "
                "do not broadcast together",
            ) from None
        m = validate_mask(func, mask, (*batch, T, S), f"(..., T, S) = {(*batch, T, S)}")
        if m is not None:
            # (..., T, S) -> (..., 1, 1, T, S): the same mask for every group and head
            m = m.reshape((1,) * (2 - m.ndim) + m.shape)[..., None, None, :, :]
        return x, kv_input, m

    # ------------------------------------------------------------------------ the forward pass
    def forward(self, x, context=None, mask=None, *, head_mask=None, return_cache=False):
        """Attend from ``x`` to ``context`` (to ``x`` itself when ``context`` is None).

        Parameters
        ----------
        x : ndarray of float, shape (..., T, d_model)
            The queries' input.
        context : ndarray of float, shape (..., S, d_model), optional
            The keys' and values' input, for cross-attention. Default: ``x``.
        mask : ndarray of bool, broadcastable to (..., T, S), optional
            ``True`` = may attend; applied to every head.
        head_mask : array_like, shape (h,), optional
            Multiplies each head's output before ``W_o`` (0 ablates the head; evaluation only,
            not with ``return_cache``): lessons 09 to 12 read what a head does this way.
        return_cache : bool, default False
            Return ``(out, saved)`` instead, where ``saved`` holds the saved activations
            (:class:`~mha_course.backward.SavedActivations`) that :meth:`backward` needs; the
            weights are ``saved.weights``.

        Returns
        -------
        out : ndarray, shape (..., T, d_model)
            In ``x``'s dtype (float32 in, float32 out).
        weights : ndarray, shape (..., h, T, S)
            Every head's attention weights (or the saved activations, with
            ``return_cache=True``).

        Raises a ``ValueError`` on a wrong last axis, batch axes of ``x`` and ``context`` that
        do not broadcast, a mask that does not broadcast to (..., T, S), non-float input,
        ``context`` given to a layer with RoPE, a ``head_mask`` not of shape (h,), or
        ``return_cache=True`` with a ``head_mask`` or on a layer with a ``scale``.

        Examples
        --------
        >>> mha = MultiHeadAttention(d_model=8, h=2, rng=0)
        >>> out, weights = mha(np.ones((4, 3, 8)), context=np.ones((4, 5, 8)))
        >>> out.shape, weights.shape
        ((4, 3, 8), (4, 2, 3, 5))
        """
        if return_cache and self.scale is not None:
            raise fail("MultiHeadAttention.forward", f"return_cache=True saves what backward "
                       f"needs, and backward assumes the scale 1/sqrt(d_k); this layer has "
                       f"scale={self.scale!r}: build it with scale=None to train it by hand")
        x, kv_input, mask = self.validate_inputs(x, context, mask)
        dtype = np.result_type(x, kv_input)
        if head_mask is not None:
            head_mask = self._validate_head_mask(head_mask, return_cache)
        mask = None if mask is None else mask[..., 0, 0, :, :]  # (..., T, S)
        q, k, v = self._heads(*self._project(x, kv_input, dtype))  # (..., h | g, T | S, d)
        q, k = self._rope(q), self._rope(k)  # RoPE on queries and keys, never values
        # GQA (lesson 06): h/g query heads per K/V head, (..., g, h/g, T, d) views; else 4-D
        # checked once above (validate_inputs); the kernel trusts it, as nanoGPT asserts once
        heads, weights = sdpa_unchecked(*sdpa_operands(q, k, v, mask), self.scale)
        if self.n_kv_heads < self.h:
            heads, weights = ungroup_heads(heads), ungroup_heads(weights)  # (..., h, T, d_v | S)
        if head_mask is not None:  # scale each head's output: (h,) -> (h, 1, 1)
            heads = heads * head_mask[:, None, None]
        concat = merge_heads(heads)  # (..., h, T, d_v) -> (..., T, h*d_v)
        out = self._output(concat, dtype)  # (..., T, h*d_v) -> (..., T, d_model)
        if return_cache:
            params = {name: p.astype(dtype, copy=False) for name, p in self.parameters().items()}
            saved_context = None if context is None else kv_input
            saved_mask = None if mask is None else mask[..., None, :, :]  # (..., 1, T, S)
            return out, SavedActivations(self, x, saved_context, saved_mask, q, k, v, weights,
                                         concat, params, dtype)
        return out, weights

    __call__ = forward

    # ------------------------------------------------------------------ decoding with a cache
    def init_cache(self, batch_shape=(), max_len=None, *, dtype=None, window=None):
        """An empty :class:`~mha_course.KVCache` for :meth:`step` / :meth:`decode_step`.

        ``batch_shape``: the leading axes ``...`` of every input it will get; ``max_len``: most
        positions, preallocated (None: grown by doubling); ``dtype``: of the stored keys and
        values (default: the first input's); ``window``: a rolling buffer of the last
        ``window`` positions (decoding then equals ``forward(x, mask=sliding_window_mask(T,
        window))`` in flat memory). Buffers (..., n_kv_heads, capacity, d_k | d_v). Raises a
        ``ValueError`` on a bad ``batch_shape``, ``max_len``, ``window`` or ``dtype``.

        Examples
        --------
        >>> cache = MultiHeadAttention(8, 2, rng=0).init_cache(batch_shape=(3,), max_len=16)
        >>> len(cache), cache.keys.shape
        (0, (3, 2, 0, 4))
        """
        return KVCache(self, batch_shape, max_len, dtype=dtype, window=window)

    def _validate_head_mask(self, head_mask, return_cache) -> np.ndarray:
        func, m = "MultiHeadAttention.forward", as_float_array("MultiHeadAttention.forward",
                                                               "head_mask", head_mask)
        if return_cache or m.shape != (self.h,):
            raise fail(func, "head_mask is for evaluation; backward needs the unmasked forward"
                       if return_cache else f"head_mask has shape {fmt_shape(m.shape)}; "
                       f"expected (h,) = ({self.h},)")
        return m

    # --------------------------------------- the pieces forward and step are built from
    def _project(self, x, kv_input, dtype):
        """``x W_q + b_q``, ``kv_input W_k + b_k``, ``kv_input W_v + b_v`` in ``dtype``: shapes
        (..., T, h*d_k), (..., S, g*d_k), (..., S, g*d_v). Rows are independent, so a server may
        pass every sequence's tokens as one (N, d_model) matrix."""
        return (project(x, self.W_q, self.b_q, dtype),
                project(kv_input, self.W_k, self.b_k, dtype),
                project(kv_input, self.W_v, self.b_v, dtype))

    def _heads(self, q, k, v):
        """Split the projections into heads: (..., h, T, d_k), (..., g, S, d_k | d_v)."""
        g = self.n_kv_heads
        split = split_heads_unchecked  # the layer's own projections: shapes known to fit
        return split(q, self.h), split(k, g), split(v, g)

    def _rope(self, x, positions=None):
        """RoPE on queries or keys (..., n, T, d_k) at ``positions`` (T,) (default 0..T-1);
        ``x`` itself when the layer has no RoPE."""
        if self.rope is None:
            return x
        return rope_unchecked(x, positions, self.rope_base, self.rope)

    def _output(self, concat, dtype):
        """``concat W_o + b_o``: (..., T, h*d_v) -> (..., T, d_model) in ``dtype``."""
        return project(concat, self.W_o, self.b_o, dtype)

    def _attend_cached(self, q, k, v, cache):
        """The middle of :meth:`step`, trusted: unrotated q (..., h, T, d_k), k (..., g, T, d_k),
        v (..., g, T, d_v) rotated at positions ``cache.tokens_seen + 0..T-1``, k and v appended,
        attention over all L cached positions, bottom-right causal -> heads, weights."""
        T = q.shape[-2]
        positions = cache.tokens_seen + np.arange(T)
        q, k = self._rope(q, positions), self._rope(k, positions)
        cache.append(k, v)  # keys (..., g, L, d_k), values (..., g, L, d_v)
        # chunk position t is cache position L - T + t; one new token sees every cached one
        mask = causal_mask(T, len(cache)) if T > 1 else None
        heads, weights = attend_heads(q, cache.keys, cache.values, mask, self.scale)
        return heads, cache.oldest_first(weights)  # a rolling buffer's slots in position order

    # ------------------------------------------------------------------ decoding with a cache
    def step(self, x, cache):
        """Attend from a chunk of ``T >= 1`` new positions over ``cache`` and themselves.

        The one cached path: a prompt at once (prefill), one token (decode, :meth:`decode_step`),
        or ``k`` drafted tokens that a target model verifies in one pass (speculative decoding).
        Built from :meth:`forward`'s pieces: project (with the biases), split heads, RoPE at the
        chunk's positions ``L0 .. L0 + T - 1`` (``L0 = cache.tokens_seen``), append the chunk's
        keys and values to ``cache``, :func:`attend_heads` over all ``L = L0 + T`` cached
        positions under the bottom-right :func:`~mha_course.causal_mask` (T, L) (chunk position
        ``t`` sees the cache and the chunk up to itself), merge heads, ``W_o``. Stepping through
        a sequence in chunks of any sizes gives the rows of ``forward(x, mask=causal_mask(T))``.

        x (..., T, d_model), ``...`` the cache's ``batch_shape``; ``cache`` from this layer's
        :meth:`init_cache`, updated in place (a rolling ``window`` takes ``T = 1``) -> out
        (..., T, d_model), weights (..., h, T, L) over the ``L = len(cache)`` cached positions,
        oldest first. Raises a ``ValueError`` (and leaves the cache unchanged) if ``x`` has the
        wrong width or batch axes or is not float, or ``cache`` is not this layer's KVCache, has
        no room for T more positions, or has a window and ``T > 1``.

        Examples
        --------
        >>> from mha_course import causal_mask
        >>> mha = MultiHeadAttention(8, 4, n_kv_heads=2, bias=True, rope="half", rng=0)
        >>> x = np.random.default_rng(0).normal(size=(5, 8))
        >>> cache = mha.init_cache()
        >>> prefill, _ = mha.step(x[:3], cache)       # a prompt of 3
        >>> decode, weights = mha.step(x[3:4], cache)  # then one token
        >>> full, _ = mha(x, mask=causal_mask(5))
        >>> bool(np.allclose(np.concatenate([prefill, decode]), full[:4])), weights.shape
        (True, (4, 1, 4))
        """
        x = KVCache.check_step("MultiHeadAttention.step", self, x, cache)
        return self._step(x, cache)

    def _step(self, x, cache):
        """:meth:`step` on trusted input."""
        q, k, v = self._heads(*self._project(x, x, x.dtype))  # (..., h | g, T, d_k | d_v)
        heads, weights = self._attend_cached(q, k, v, cache)  # (..., h, T, d_v | L)
        # (..., h, T, d_v) -> (..., T, h*d_v) -> (..., T, d_model), in the cache's dtype if wider
        return self._output(merge_heads(heads), heads.dtype), weights

    def decode_step(self, x_t, cache):
        """:meth:`step` for one new position (``T = 1``), as lesson 06 decodes.

        Project the new token, append its key and value (one per K/V head) to ``cache``, attend
        its query over all ``L`` cached positions (every cached key is at or before it: no
        mask), merge the heads, ``W_o``. Decoding T tokens one at a time gives the rows of
        ``forward(x, mask=causal_mask(T))`` (with a rolling ``window``: of
        ``sliding_window_mask(T, window)``), at O(d_model² + L·d_model) per step; with RoPE the
        token sits at position ``cache.tokens_seen``. x_t (..., 1, d_model) -> out_t
        (..., 1, d_model), weights_t (..., h, 1, L), oldest first. Raises as :meth:`step` does,
        and if ``x_t`` holds more than one position.

        Examples
        --------
        >>> mha = MultiHeadAttention(8, 2, rng=0)
        >>> cache = mha.init_cache()
        >>> for x_t in np.ones((3, 1, 8)):
        ...     out_t, weights_t = mha.decode_step(x_t, cache)
        >>> out_t.shape, weights_t.shape
        ((1, 8), (2, 1, 3))
        """
        func = "MultiHeadAttention.decode_step"
        return self._step(KVCache.check_step(func, self, x_t, cache, one=True), cache)

    def backward(self, grad_out, saved) -> dict[str, np.ndarray]:
        """Gradients of a loss with respect to the inputs and every parameter.

        Parameters
        ----------
        grad_out : ndarray, shape (..., T, d_model)
            dLoss/dout for the ``out`` of ``forward(..., return_cache=True)``.
        saved : SavedActivations
            The saved activations that call returned.

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
        return backward(self, grad_out, saved)

    def __repr__(self) -> str:
        extra = f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.h else ""
        if self.rope is not None:
            extra += f", rope={self.rope!r}"
            extra += f", rope_base={self.rope_base:g}" if self.rope_base != 10000.0 else ""
        extra += f", scale={self.scale:g}" if self.scale is not None else ""
        return (
            f"MultiHeadAttention(d_model={self.d_model}, h={self.h}, d_k={self.d_k}, "
            f"d_v={self.d_v}, bias={self.bias}{extra})"
        )
