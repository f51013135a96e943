"""Multi-head latent attention (MLA, DeepSeek-V2): cache one small latent per token, not K and V.

Taught in ``notebooks/06_decoding.ipynb``.

Every head's key and value are made from one shared latent ``c = RMSNorm(x W_dkv)`` of width
``d_c`` (DeepSeek-V2: 512, against 128 heads × 128 × 2 = 32,768 values of keys and values), so
a decoder caches ``c`` alone, plus one small RoPE key:

- head ``i``'s key is ``[c W_uk_i ; k_rope]``: a position-free part from the latent (``d_k``)
  and a *decoupled* RoPE part ``k_rope = RoPE(x W_kr)`` (``d_rope``) shared by all heads;
- head ``i``'s query is ``[x W_q_i ; RoPE(x W_qr_i)]`` and its value is ``c W_uv_i``; with
  ``d_cq`` set (DeepSeek-V2/V3's ``q_lora_rank``, 1536) the queries are compressed too:
  ``c_q = RMSNorm(x W_dq)``, then ``[c_q W_uq_i ; RoPE(c_q W_qr_i)]``;
- scores are scaled by ``1 / sqrt(d_k + d_rope)``, the width of the dot product (times YaRN's
  ``mscale²`` when ``rope_scaling`` asks for it,
  :func:`~mha_course.variants.rope_scaling.mla_softmax_scale`).

The order is DeepSeek's (Hugging Face ``transformers``,
``src/transformers/models/deepseek_v3/modeling_deepseek_v3.py``, ``DeepseekV3Attention.forward``:
``kv_a_proj_with_mqa`` makes ``[c_raw ; k_rot]``, ``kv_a_layernorm`` normalises the ``kv_lora_rank``
part only, *before* ``kv_b_proj`` up-projects it; ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` for
the queries). The RMSNorms have learned gains (``kv_norm``, ``q_norm``; ones at start) and
``eps`` 1e-6, DeepSeek's. What is cached is the **normalised** latent and the rotated RoPE key,
which is not normalised: DeepSeek-V3's own ``inference/model.py`` (``MLA.forward``, absorbed path)
stores ``self.kv_cache[...] = self.kv_norm(kv)`` and ``self.pe_cache[...] = k_pe``.

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

Simplifications against DeepSeek-V2/V3: RoPE uses the half-split layout at ``rope_base``
without YaRN's stretched frequencies (``rope_scaling`` reaches the softmax scale only; the
frequencies are :func:`~mha_course.variants.rope_scaling.yarn_frequencies`), and there are no
biases.
Queries are projected directly unless ``d_cq`` is given (DeepSeek-V2-Lite projects them
directly; compressing them saves activation memory in training and does not change the cache).
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import (
    as_float_array,
    fail,
    fmt_shape,
    validate_mask,
    validate_positive_int,
    validate_shape,
)
from ..attention import scaled_dot_product_attention
from ..block import rms_norm
from ..heads import head_dims, merge_heads, split_heads
from ..kv_cache import INITIAL_CAPACITY, grown, grown_capacity, parse_batch_shape
from ..positions import apply_rope
from .rope_scaling import mla_softmax_scale


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
    d_cq : int, optional
        Width of the query latent (DeepSeek-V2/V3: 1536, ``q_lora_rank``); None (default):
        queries projected directly from ``x`` (DeepSeek-V2-Lite).
    latent_norm : bool, default True
        RMSNorm with a learned gain on the key/value latent (``kv_a_layernorm``) and, with
        ``d_cq``, on the query latent (``q_a_layernorm``), as every DeepSeek MLA model has;
        False gives the bare latents (the paper's equations).
    eps : float, default 1e-6
        The latent RMSNorms' epsilon (DeepSeek's ``rms_norm_eps``).
    rope_scaling : dict, optional
        The config's ``rope_scaling``; YaRN's ``mscale_all_dim`` then multiplies the softmax
        scale by ``mscale²`` (:func:`~mha_course.variants.rope_scaling.mla_softmax_scale`;
        DeepSeek-V3: ``factor`` 40, ``mscale_all_dim`` 1, so ×1.874). The RoPE frequencies are
        not stretched.
    rng : int or numpy.random.Generator, optional
        Seed or generator for the initial weights (Xavier/Glorot uniform; the gains start at 1).
    rope_base : float, default 10000.0

    Attributes
    ----------
    scale : float
        What multiplies ``q·k``: ``1/sqrt(d_k + d_rope)``, times ``mscale²`` under YaRN.
    W_dkv : ndarray, shape (d_model, d_c)
        Down-projection to the latent: ``c = RMSNorm(x W_dkv) · kv_norm``.
    kv_norm : ndarray, shape (d_c,)
        The latent's RMSNorm gain (with ``latent_norm``).
    W_uk : ndarray, shape (d_c, h*d_k)
        Up-projection of the latent to every head's key (head ``i`` in columns
        ``i*d_k:(i+1)*d_k``).
    W_uv : ndarray, shape (d_c, h*d_v)
        Up-projection of the latent to every head's value.
    W_kr : ndarray, shape (d_model, d_rope)
        The shared RoPE key: ``k_rope = RoPE(x W_kr)``.
    W_q : ndarray, shape (d_model, h*d_k)
    W_qr : ndarray, shape (d_model, h*d_rope)
        The queries' position-free and RoPE parts (without ``d_cq``).
    W_dq : ndarray, shape (d_model, d_cq)
    q_norm : ndarray, shape (d_cq,)
    W_uq : ndarray, shape (d_cq, h*d_k)
    W_qr : ndarray, shape (d_cq, h*d_rope)
        With ``d_cq``: the query latent ``c_q = RMSNorm(x W_dq) · q_norm`` (gain with
        ``latent_norm``), and its up-projections to the queries' two parts.
    W_o : ndarray, shape (h*d_v, d_model)

    Raises
    ------
    ValueError
        If a size is not a positive integer, ``h`` does not divide ``d_model`` and no ``d_k`` is
        given, ``d_rope`` is odd, ``eps`` is negative or ``rope_scaling`` is not a YaRN dict.

    Examples
    --------
    >>> mla = MultiHeadLatentAttention(d_model=16, h=4, d_c=6, d_rope=2, rng=0)
    >>> out, weights = mla(np.ones((2, 5, 16)))
    >>> out.shape, weights.shape
    ((2, 5, 16), (2, 4, 5, 5))
    >>> bool(np.allclose(mla(np.ones((5, 16)), absorbed=True)[0], mla(np.ones((5, 16)))[0]))
    True
    """

    def __init__(self, d_model, h, d_c, d_rope, d_k=None, d_v=None, *, d_cq=None,
                 latent_norm=True, eps=1e-6, rope_scaling=None, rng=None, rope_base=10000.0):
        func = "MultiHeadLatentAttention"
        d_model, h, d_k, d_v = head_dims(func, d_model, h, d_k, d_v)
        d_c = validate_positive_int(func, "d_c", d_c)
        d_rope = validate_positive_int(func, "d_rope", d_rope)
        d_cq = None if d_cq is None else validate_positive_int(func, "d_cq", d_cq)
        if d_rope % 2:
            raise fail(func, f"d_rope={d_rope} must be even: RoPE turns pairs of features")
        apply_rope(np.zeros((1, d_rope)), base=rope_base)  # refuses a bad base, by name
        if isinstance(eps, (bool, np.bool_)) or not isinstance(
                eps, (int, float, np.integer, np.floating)) or not 0 <= eps < math.inf:
            raise fail(func, f"eps={eps!r} must be a finite number >= 0")
        if rope_scaling is not None:
            kind = (rope_scaling.get("rope_type", rope_scaling.get("type", "yarn"))
                    if isinstance(rope_scaling, dict) else None)
            if kind != "yarn":
                raise fail(func, f"rope_scaling={rope_scaling!r}; expected None or a YaRN "
                                 "rope_scaling dict (type 'yarn', a 'factor', 'mscale_all_dim'), "
                                 "as DeepSeek's config.json has")
        self.d_model, self.h, self.d_k, self.d_v = d_model, h, d_k, d_v
        self.d_c, self.d_rope, self.rope_base = d_c, d_rope, float(rope_base)
        self.d_cq, self.latent_norm, self.eps = d_cq, bool(latent_norm), float(eps)
        self.rope_scaling = None if rope_scaling is None else dict(rope_scaling)
        self.scale = mla_softmax_scale(d_k + d_rope, self.rope_scaling)
        rng = np.random.default_rng(rng)

        def xavier(fan_in, fan_out):
            bound = np.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-bound, bound, size=(fan_in, fan_out))

        # Drawn in this order, so a layer without d_cq has the weights it had before the norms.
        self.W_dkv = xavier(d_model, d_c)
        self.W_uk = xavier(d_c, h * d_k)
        self.W_uv = xavier(d_c, h * d_v)
        self.W_kr = xavier(d_model, d_rope)
        if d_cq is None:
            self.W_q = xavier(d_model, h * d_k)
            self.W_qr = xavier(d_model, h * d_rope)
        else:
            self.W_dq = xavier(d_model, d_cq)
            self.W_uq = xavier(d_cq, h * d_k)
            self.W_qr = xavier(d_cq, h * d_rope)
        self.W_o = xavier(h * d_v, d_model)
        if self.latent_norm:
            self.kv_norm = np.ones(d_c)
            if d_cq is not None:
                self.q_norm = np.ones(d_cq)

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter array by name.

        Examples
        --------
        >>> sorted(MultiHeadLatentAttention(16, 4, 6, 2).parameters())
        ['W_dkv', 'W_kr', 'W_o', 'W_q', 'W_qr', 'W_uk', 'W_uv', 'kv_norm']
        >>> sorted(MultiHeadLatentAttention(16, 4, 6, 2, d_cq=5).parameters())
        ['W_dkv', 'W_dq', 'W_kr', 'W_o', 'W_qr', 'W_uk', 'W_uq', 'W_uv', 'kv_norm', 'q_norm']
        """
        names = ["W_dkv", "W_uk", "W_uv", "W_kr"]
        names += ["W_q", "W_qr"] if self.d_cq is None else ["W_dq", "W_uq", "W_qr"]
        names += ["W_o"] + (["kv_norm"] if self.latent_norm else [])
        names += ["q_norm"] if self.latent_norm and self.d_cq is not None else []
        return {name: getattr(self, name) for name in names}

    # ------------------------------------------------------------------------ the pieces
    def _weights(self, dtype) -> dict[str, np.ndarray]:
        """The parameters in ``dtype`` (no copy when they already are: a float32 model)."""
        return {name: p.astype(dtype, copy=False) for name, p in self.parameters().items()}

    def latent(self, x) -> np.ndarray:
        """The latent a token leaves in the cache: ``c = RMSNorm(x W_dkv) · kv_norm`` (the bare
        ``x W_dkv`` without ``latent_norm``), x (..., T, d_model) -> (..., T, d_c).

        Examples
        --------
        >>> mla = MultiHeadLatentAttention(16, 4, d_c=6, d_rope=2, rng=0)
        >>> c = mla.latent(np.ones((3, 16)))
        >>> c.shape, float(np.round(np.sqrt((c ** 2).mean()), 4))  # unit RMS, gains of 1
        ((3, 6), 1.0)
        """
        x, _ = self._validate_x("MultiHeadLatentAttention.latent", x)
        return self._latent(x, self._weights(x.dtype))

    def _latent(self, x, W):
        c = x @ W["W_dkv"]  # (..., T, d_model) -> (..., T, d_c)
        return rms_norm(c, W["kv_norm"], self.eps) if self.latent_norm else c

    def _project(self, x, positions):
        """x (..., T, d_model) -> the queries' two parts, and what a token leaves in the cache:
        ``[c ; k_rope]``, shape (..., T, d_c + d_rope), ``c`` normalised, ``k_rope`` not."""
        W = self._weights(x.dtype)
        rope = {"base": self.rope_base, "layout": "half"}
        c = self._latent(x, W)  # (..., T, d_c): RMSNorm before caching and up-projecting
        k_rope = apply_rope(x @ W["W_kr"], positions, **rope)  # (..., T, d_rope), no norm
        if self.d_cq is None:
            q_in, W_q = x, W["W_q"]  # queries straight from x
        else:
            q_in, W_q = x @ W["W_dq"], W["W_uq"]  # (..., T, d_cq): the query latent
            if self.latent_norm:
                q_in = rms_norm(q_in, W["q_norm"], self.eps)
        q_nope = split_heads(q_in @ W_q, self.h)  # (..., h, T, d_k)
        q_rope = apply_rope(split_heads(q_in @ W["W_qr"], self.h), positions,
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
            heads, weights = scaled_dot_product_attention(  # (..., h, T, d_v)
                q, k, v, mask, scale=self.scale)
            return merge_heads(heads) @ W["W_o"], weights  # (..., T, d_model)
        # Absorbed: fold W_uk into the queries, attend over the latents, then W_uv and W_o.
        W_uk = W["W_uk"].reshape(d_c, h, d_k).transpose(1, 2, 0)  # (h, d_k, d_c)
        q_latent = q_nope @ W_uk  # (..., h, T, d_k) @ (h, d_k, d_c) -> (..., h, T, d_c)
        # The scores must be the naive form's, scaled by 1/sqrt(d_k + d_rope) (times YaRN's
        # mscale²), not by 1/sqrt(d_c + d_rope), the width the absorbed dot product has.
        q = np.concatenate([q_latent, q_rope], axis=-1)  # (..., h, T, d_c + d_rope)
        latent_heads, weights = scaled_dot_product_attention(  # one key [c ; k_rope] for all
            q, entries[..., None, :, :], c[..., None, :, :], mask,
            scale=self.scale)  # -> (..., h, T, d_c)
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
        extra = f", d_cq={self.d_cq}" if self.d_cq is not None else ""
        extra += "" if self.latent_norm else ", latent_norm=False"
        extra += f", rope_scaling={self.rope_scaling!r}" if self.rope_scaling else ""
        return (f"MultiHeadLatentAttention(d_model={self.d_model}, h={self.h}, d_c={self.d_c}, "
                f"d_rope={self.d_rope}, d_k={self.d_k}, d_v={self.d_v}{extra})")


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
