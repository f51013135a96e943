"""Multi-head latent attention (MLA, DeepSeek-V2): cache one small latent per token, not K and V.

Taught in ``notebooks/06_decoding.ipynb``.

Every head's key and value are made from one shared latent ``c = x W_dkv`` of width ``d_c``
(DeepSeek-V2: 512, against 128 heads × 128 × 2 = 32,768 values of keys and values), so a
decoder caches ``c`` alone, plus one small RoPE key:

- head ``i``'s key is ``[c W_uk_i ; k_rope]``: a position-free part from the latent (``d_k``)
  and a *decoupled* RoPE part ``k_rope = RoPE(x W_kr)`` (``d_rope``) shared by all heads;
- head ``i``'s query is ``[x W_q_i ; RoPE(x W_qr_i)]`` and its value is ``c W_uv_i``;
- scores are scaled by ``1 / sqrt(d_k + d_rope)``, the width of the dot product.

Two ways to compute it, with the same output (:meth:`MultiHeadLatentAttention.forward`):

- *naive*: rebuild every head's keys and values from the cached latents, then attend;
- *absorbed*: ``q_i · (c W_uk_i) = (q_i W_uk_iᵀ) · c``, so ``W_uk`` folds into the query and
  each head attends straight over the latents (one shared key ``[c ; k_rope]``, like MQA); and
  ``weights_i (c W_uv_i) = (weights_i c) W_uv_i``, so ``W_uv`` applies after the weighted sum,
  to ``T`` rows instead of ``S`` (with precomputed weights it folds into ``W_o``). Keys and
  values are never rebuilt: this is how MLA decodes. Absorbed decoding *is* multi-query
  attention: every head attends over one shared ``d_c + d_rope``-wide key and a ``d_c``-wide
  value (DeepSeek-V2: 576 and 512, for 128 heads).

Which form to use: a score costs ``d_c + d_rope`` multiply-adds per head absorbed against
``d_k + d_rope`` naive (576 against 192 at V2's sizes), so absorbing pays only when rebuilding
the cached keys and values dominates, that is when few queries meet a long cache (decoding: about
119 times fewer multiply-adds for one token over 8,192 cached at V2's sizes). A prefill or a
training step, with as many queries as keys, is cheaper naive (about 3 times at 4,096 tokens);
vLLM's MLA backend, for one, runs the naive form for prefill and the absorbed one for decode
(lesson 06 §6 computes both).

Why the RoPE part must be separate: a rotation between query and key depends on both
positions, ``q R_mᵀ R_n W_ukᵀ c = q R_{n-m} W_ukᵀ c``, so a rotated ``c W_uk`` could not be
folded into a query once for all keys. DeepSeek keeps the rotation on a small extra key
(``d_rope``) that is cached as it is: ``d_c + d_rope`` values per layer and token
(:func:`~mha_course.cost.mla_cache_bytes`).

Simplifications against DeepSeek-V2: queries are projected directly (V2 also compresses them,
through a latent of width ``q_lora_rank`` = 1536, which saves activation memory in training and
does not change the cache; DeepSeek-V2-Lite projects them directly, as here), there is no
normalisation of the latent, and RoPE uses the half-split layout.
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
from .attention import scaled_dot_product_attention
from .heads import head_dims, merge_heads, split_heads
from .kv_cache import INITIAL_CAPACITY, grown, grown_capacity, parse_batch_shape
from .positions import apply_rope


class MultiHeadLatentAttention:
    """DeepSeek-V2's multi-head latent attention, in its naive and its absorbed form.

    Parameters
    ----------
    d_model : int
        Width of the input and output.
    h : int
        Number of heads.
    d_c : int
        Width of the key/value latent ``c`` (DeepSeek-V2: 512, ``kv_lora_rank``).
    d_rope : int
        Width of the decoupled RoPE query and key per head (DeepSeek-V2: 64,
        ``qk_rope_head_dim``); even.
    d_k : int, optional
        Width of each head's position-free query and key (DeepSeek-V2: 128,
        ``qk_nope_head_dim``); default ``d_model // h``.
    d_v : int, optional
        Value width per head; default ``d_k``.
    rng : int or numpy.random.Generator, optional
        Seed or generator for the initial weights (Xavier/Glorot uniform).
    rope_base : float, default 10000.0

    Attributes
    ----------
    W_dkv : ndarray, shape (d_model, d_c)
        Down-projection to the latent: ``c = x W_dkv``.
    W_uk : ndarray, shape (d_c, h*d_k)
        Up-projection of the latent to every head's key (head ``i`` in columns
        ``i*d_k:(i+1)*d_k``).
    W_uv : ndarray, shape (d_c, h*d_v)
        Up-projection of the latent to every head's value.
    W_kr : ndarray, shape (d_model, d_rope)
        The shared RoPE key: ``k_rope = RoPE(x W_kr)``.
    W_q : ndarray, shape (d_model, h*d_k)
    W_qr : ndarray, shape (d_model, h*d_rope)
        The queries' position-free and RoPE parts.
    W_o : ndarray, shape (h*d_v, d_model)

    Raises
    ------
    ValueError
        If a size is not a positive integer, ``h`` does not divide ``d_model`` and no ``d_k`` is
        given, or ``d_rope`` is odd.

    Examples
    --------
    >>> mla = MultiHeadLatentAttention(d_model=16, h=4, d_c=6, d_rope=2, rng=0)
    >>> out, weights = mla(np.ones((2, 5, 16)))
    >>> out.shape, weights.shape
    ((2, 5, 16), (2, 4, 5, 5))
    >>> bool(np.allclose(mla(np.ones((5, 16)), absorbed=True)[0], mla(np.ones((5, 16)))[0]))
    True
    """

    def __init__(self, d_model, h, d_c, d_rope, d_k=None, d_v=None, *, rng=None,
                 rope_base=10000.0):
        func = "MultiHeadLatentAttention"
        d_model, h, d_k, d_v = head_dims(func, d_model, h, d_k, d_v)
        d_c = validate_positive_int(func, "d_c", d_c)
        d_rope = validate_positive_int(func, "d_rope", d_rope)
        if d_rope % 2:
            raise fail(func, f"d_rope={d_rope} must be even: RoPE turns pairs of features")
        apply_rope(np.zeros((1, d_rope)), base=rope_base)  # refuses a bad base, by name
        self.d_model, self.h, self.d_k, self.d_v = d_model, h, d_k, d_v
        self.d_c, self.d_rope, self.rope_base = d_c, d_rope, float(rope_base)
        rng = np.random.default_rng(rng)

        def xavier(fan_in, fan_out):
            bound = np.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-bound, bound, size=(fan_in, fan_out))

        self.W_dkv = xavier(d_model, d_c)
        self.W_uk = xavier(d_c, h * d_k)
        self.W_uv = xavier(d_c, h * d_v)
        self.W_kr = xavier(d_model, d_rope)
        self.W_q = xavier(d_model, h * d_k)
        self.W_qr = xavier(d_model, h * d_rope)
        self.W_o = xavier(h * d_v, d_model)

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter array by name.

        Examples
        --------
        >>> sorted(MultiHeadLatentAttention(16, 4, 6, 2).parameters())
        ['W_dkv', 'W_kr', 'W_o', 'W_q', 'W_qr', 'W_uk', 'W_uv']
        """
        names = ["W_dkv", "W_uk", "W_uv", "W_kr", "W_q", "W_qr", "W_o"]
        return {name: getattr(self, name) for name in names}

    # ------------------------------------------------------------------------ the pieces
    def _weights(self, dtype) -> dict[str, np.ndarray]:
        """The parameters in ``dtype`` (no copy when they already are: a float32 model)."""
        return {name: p.astype(dtype, copy=False) for name, p in self.parameters().items()}

    def _project(self, x, positions):
        """x (..., T, d_model) -> the queries' two parts, and what a token leaves in the cache:
        ``[c ; k_rope]``, shape (..., T, d_c + d_rope)."""
        W = self._weights(x.dtype)
        rope = {"base": self.rope_base, "layout": "half"}
        c = x @ W["W_dkv"]  # (..., T, d_model) -> (..., T, d_c)
        k_rope = apply_rope(x @ W["W_kr"], positions, **rope)  # (..., T, d_rope)
        q_nope = split_heads(x @ W["W_q"], self.h)  # (..., h, T, d_k)
        q_rope = apply_rope(split_heads(x @ W["W_qr"], self.h), positions,
                            **rope)  # (..., h, T, d_rope)
        return q_nope, q_rope, np.concatenate([c, k_rope], axis=-1)  # (..., T, d_c + d_rope)

    def _attend(self, q_nope, q_rope, entries, mask, absorbed):
        """The h query heads over S cached entries ``[c ; k_rope]`` (..., S, d_c + d_rope),
        naive or absorbed; returns (out, weights)."""
        h, d_c, d_k, d_v, d_rope = self.h, self.d_c, self.d_k, self.d_v, self.d_rope
        W = self._weights(q_nope.dtype)
        c, k_rope = entries[..., :d_c], entries[..., d_c:]  # (..., S, d_c), (..., S, d_rope)
        if not absorbed:
            # Rebuild every head's key and value from the latents.
            k_nope = split_heads(c @ W["W_uk"], h)  # (..., S, d_c) -> (..., h, S, d_k)
            v = split_heads(c @ W["W_uv"], h)  # (..., h, S, d_v)
            # (..., S, d_rope) -> (..., h, S, d_rope): the one RoPE key serves every head
            k_rope = np.broadcast_to(k_rope[..., None, :, :], (*k_nope.shape[:-1], d_rope))
            q = np.concatenate([q_nope, q_rope], axis=-1)  # (..., h, T, d_k + d_rope)
            k = np.concatenate([k_nope, k_rope], axis=-1)  # (..., h, S, d_k + d_rope)
            heads, weights = scaled_dot_product_attention(q, k, v, mask)  # (..., h, T, d_v)
            return merge_heads(heads) @ W["W_o"], weights  # (..., T, d_model)
        # Absorbed: fold W_uk into the queries, attend over the latents, then W_uv and W_o.
        W_uk = W["W_uk"].reshape(d_c, h, d_k).transpose(1, 2, 0)  # (h, d_k, d_c)
        q_latent = q_nope @ W_uk  # (..., h, T, d_k) @ (h, d_k, d_c) -> (..., h, T, d_c)
        # scaled_dot_product_attention divides by sqrt(d_c + d_rope), the width it sees; the
        # scores must be those of the naive form, scaled by 1/sqrt(d_k + d_rope).
        rescale = math.sqrt((d_c + d_rope) / (d_k + d_rope))
        q = np.concatenate([q_latent, q_rope], axis=-1) * rescale  # (..., h, T, d_c + d_rope)
        latent_heads, weights = scaled_dot_product_attention(  # one key [c ; k_rope] for all
            q, entries[..., None, :, :], c[..., None, :, :], mask)  # -> (..., h, T, d_c)
        W_uv = W["W_uv"].reshape(d_c, h, d_v).transpose(1, 0, 2)  # (h, d_c, d_v)
        heads = latent_heads @ W_uv  # (..., h, T, d_c) @ (h, d_c, d_v): T rows, not S
        return merge_heads(heads) @ W["W_o"], weights  # (..., T, d_model)

    def _validate_x(self, func, x):
        x = as_float_array(func, "x", x)
        T = validate_shape(func, "x", x, ("T", "d_model"),
                           {"d_model": (self.d_model, "the layer")})["T"]
        return x, T

    # -------------------------------------------------------------------------- forward
    def forward(self, x, mask=None, *, absorbed=False):
        """Self-attention over ``x``; positions ``0..T-1`` for RoPE.

        Parameters
        ----------
        x : ndarray of float, shape (..., T, d_model)
        mask : ndarray of bool, broadcastable to (..., T, T), optional
            ``True`` = may attend; the same for every head.
        absorbed : bool, default False
            Attend in the latent space, ``W_uk`` folded into the queries and ``W_uv`` applied
            to each head's weighted latent (T rows, not S), instead of rebuilding every head's
            keys and values. Same output.

        Returns
        -------
        out : ndarray, shape (..., T, d_model)
        weights : ndarray, shape (..., h, T, T)

        Raises
        ------
        ValueError
            On a wrong last axis, non-float input, or a mask that does not broadcast to
            (..., T, T).

        Examples
        --------
        >>> mla = MultiHeadLatentAttention(16, 4, d_c=6, d_rope=2, rng=0)
        >>> mla(np.ones((3, 16)), absorbed=True)[1].shape
        (4, 3, 3)
        """
        func = "MultiHeadLatentAttention"
        x, T = self._validate_x(func, x)
        target = (*x.shape[:-2], T, T)
        m = validate_mask(func, mask, target, f"(..., T, T) = {target}")
        if m is not None:
            m = m[..., None, :, :]  # (..., T, S) -> (..., 1, T, S): every head
        q_nope, q_rope, entries = self._project(x, np.arange(T))
        return self._attend(q_nope, q_rope, entries, m, absorbed)

    __call__ = forward

    # ------------------------------------------------------------- decoding with a cache
    def init_cache(self, batch_shape=(), max_len=None, *, dtype=None):
        """An empty latent cache: ``d_c + d_rope`` values per token, nothing per head.

        Examples
        --------
        >>> MultiHeadLatentAttention(16, 4, d_c=6, d_rope=2).init_cache().values_per_token
        8
        """
        return LatentCache(self, batch_shape, max_len, dtype=dtype)

    def decode_step(self, x_t, cache, *, absorbed=True):
        """Attend from one new token over itself and the cached ones; append it to ``cache``.

        The new token sits at position ``cache.tokens_seen`` for RoPE; its latent and RoPE key
        are appended, then its queries attend over all ``L`` cached latents (absorbed, by
        default, as MLA decodes; or naive, rebuilding every head's keys and values). Decoding
        ``T`` tokens one at a time gives the rows of ``forward(x, mask=causal_mask(T))``.

        Parameters
        ----------
        x_t : ndarray of float, shape (..., 1, d_model)
            ``...`` must be the cache's ``batch_shape``.
        cache : LatentCache
            From this layer's :meth:`init_cache`; updated in place.
        absorbed : bool, default True

        Returns
        -------
        out_t : ndarray, shape (..., 1, d_model)
        weights_t : ndarray, shape (..., h, 1, L)

        Raises
        ------
        ValueError
            If ``cache`` is not this layer's, ``x_t`` has the wrong shape or dtype, or the
            cache is full; the cache is then unchanged.

        Examples
        --------
        >>> mla = MultiHeadLatentAttention(16, 4, d_c=6, d_rope=2, rng=0)
        >>> cache = mla.init_cache()
        >>> for x_t in np.ones((3, 1, 16)):
        ...     out_t, weights_t = mla.decode_step(x_t, cache)
        >>> out_t.shape, weights_t.shape, cache.latent.shape
        ((1, 16), (4, 1, 3), (3, 6))
        """
        func = "MultiHeadLatentAttention.decode_step"
        if not isinstance(cache, LatentCache) or cache.layer is not self:
            what = (f"made by another layer ({cache.layer!r})" if isinstance(cache, LatentCache)
                    else f"a {type(cache).__name__}")
            raise fail(func, f"cache is {what}; expected a LatentCache from this layer's "
                             "init_cache()")
        x_t, _ = self._validate_x(func, x_t)
        if x_t.shape[-2] != 1 or x_t.shape[:-2] != cache.batch_shape:
            raise fail(func, f"x_t has shape {fmt_shape(x_t.shape)}; expected (..., 1, d_model) "
                             f"with ... = {fmt_shape(cache.batch_shape)} (from the cache), "
                             f"d_model={self.d_model} (from the layer)")
        cache.require_room(1, func)  # before anything is stored
        q_nope, q_rope, entry = self._project(x_t, np.array([cache.tokens_seen]))
        cache.append(entry[..., : self.d_c], entry[..., self.d_c :])
        return self._attend(q_nope, q_rope, cache.entries, None, absorbed)

    def __repr__(self) -> str:
        return (f"MultiHeadLatentAttention(d_model={self.d_model}, h={self.h}, d_c={self.d_c}, "
                f"d_rope={self.d_rope}, d_k={self.d_k}, d_v={self.d_v})")


class LatentCache:
    """MLA's cache: per token, the latent ``c`` (d_c) and the shared RoPE key (d_rope).

    One buffer of shape (..., capacity, d_c + d_rope), allocated at ``max_len`` positions or
    grown by doubling; made by :meth:`MultiHeadLatentAttention.init_cache` and filled by its
    ``decode_step``. No head axis: every head's key and value come from the same latent.

    Attributes
    ----------
    layer : MultiHeadLatentAttention
    batch_shape : tuple of int
    max_len : int or None
    d_c, d_rope : int
    values_per_token : int
        ``d_c + d_rope`` (576 for DeepSeek-V2).
    tokens_seen : int
        Positions appended so far: the RoPE position of the next token.

    Examples
    --------
    >>> mla = MultiHeadLatentAttention(16, 4, d_c=6, d_rope=2)
    >>> cache = mla.init_cache(batch_shape=(2,), max_len=8)
    >>> cache.append(np.zeros((2, 3, 6)), np.zeros((2, 3, 2)))
    >>> len(cache), cache.latent.shape, cache.rope_keys.shape
    (3, (2, 3, 6), (2, 3, 2))
    """

    def __init__(self, layer, batch_shape=(), max_len=None, *, dtype=None):
        func = "LatentCache"
        if not all(hasattr(layer, a) for a in ("d_c", "d_rope")):
            raise fail(func, f"layer has type {type(layer).__name__}; expected the "
                       "MultiHeadLatentAttention whose latents it will hold (or use "
                       "layer.init_cache())")
        self.layer = layer
        self.batch_shape = parse_batch_shape(func, batch_shape)
        self.max_len = None if max_len is None else validate_positive_int(func, "max_len", max_len)
        self.d_c, self.d_rope = layer.d_c, layer.d_rope
        self.values_per_token = self.d_c + self.d_rope
        self.tokens_seen = 0
        self._buf = None  # (..., capacity, d_c + d_rope) once allocated
        if dtype is not None:
            dtype = np.dtype(dtype)
            if dtype.kind != "f":
                raise fail(func, f"dtype={dtype} must be a real floating dtype")
            self._buf = np.empty((*self.batch_shape, self.max_len or INITIAL_CAPACITY,
                                  self.values_per_token), dtype=dtype)

    def __len__(self) -> int:
        return self.tokens_seen

    @property
    def nbytes(self) -> int:
        """Bytes of the allocated buffer (filled or not)."""
        return 0 if self._buf is None else self._buf.nbytes

    def _view(self, start, stop) -> np.ndarray:
        if self._buf is None:
            return np.empty((*self.batch_shape, 0, stop - start))
        view = self._buf[..., : self.tokens_seen, start:stop]
        view.flags.writeable = False
        return view

    @property
    def entries(self) -> np.ndarray:
        """Read-only view of the cached ``[c ; k_rope]``, shape (..., len, d_c + d_rope): the
        one key every head attends over in the absorbed form."""
        return self._view(0, self.values_per_token)

    @property
    def latent(self) -> np.ndarray:
        """Read-only view of the cached latents, shape (..., len, d_c)."""
        return self._view(0, self.d_c)

    @property
    def rope_keys(self) -> np.ndarray:
        """Read-only view of the cached RoPE keys, shape (..., len, d_rope)."""
        return self._view(self.d_c, self.values_per_token)

    def require_room(self, n: int, func: str = "LatentCache.append") -> None:
        """Raise a ``ValueError`` naming ``func`` if ``n`` more positions exceed ``max_len``."""
        if self.max_len is not None and self.tokens_seen + n > self.max_len:
            raise fail(func, f"the cache is full: it holds {self.tokens_seen} of "
                             f"max_len={self.max_len} positions and cannot take {n} more; make "
                             f"a larger one with init_cache(..., "
                             f"max_len={max(2 * self.max_len, self.tokens_seen + n)}), or with "
                             "max_len=None to let it grow")

    def append(self, c, k_rope) -> None:
        """Append ``n`` positions: latents ``c`` (..., n, d_c) and RoPE keys (..., n, d_rope).

        Raises
        ------
        ValueError
            On a wrong shape, non-float input, or when ``max_len`` would be exceeded; the cache
            is then unchanged.
        """
        func = "LatentCache.append"
        c = as_float_array(func, "c", c)
        k_rope = as_float_array(func, "k_rope", k_rope)
        n = c.shape[-2] if c.ndim >= 2 else -1
        for name, arr, letter, d in (("c", c, "d_c", self.d_c),
                                     ("k_rope", k_rope, "d_rope", self.d_rope)):
            validate_shape(func, name, arr, ("n", letter),
                           {"n": (n, "c"), letter: (d, "the cache")})
            if arr.shape[:-2] != self.batch_shape:
                raise fail(func, f"{name} has shape {fmt_shape(arr.shape)}; expected "
                                 f"(..., n, {letter}) with ... = {fmt_shape(self.batch_shape)} "
                                 "(from the cache)")
        self.require_room(n, func)
        needed = self.tokens_seen + n
        if self._buf is None:
            capacity = self.max_len or max(INITIAL_CAPACITY, needed)
            self._buf = np.empty((*self.batch_shape, capacity, self.values_per_token), c.dtype)
        elif needed > self._buf.shape[-2]:
            self._buf = grown(self._buf, self.tokens_seen,
                              grown_capacity(self._buf.shape[-2], needed))
        self._buf[..., self.tokens_seen : needed, : self.d_c] = c
        self._buf[..., self.tokens_seen : needed, self.d_c :] = k_rope
        self.tokens_seen = needed

    def __repr__(self) -> str:
        capacity = 0 if self._buf is None else self._buf.shape[-2]
        return (f"LatentCache(len={self.tokens_seen}, capacity={capacity}, "
                f"max_len={self.max_len}, batch_shape={self.batch_shape}, d_c={self.d_c}, "
                f"d_rope={self.d_rope})")
