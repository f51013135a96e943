"""The KV cache: decode one token at a time without recomputing the past.

Taught in the later lesson on the KV cache, MQA and GQA (see "Beyond the article" in the
design notes); the lesson will stand on this module.

A decoder generates token ``t`` from tokens ``0..t``. Under a causal mask the keys and values
of tokens ``0..t-1`` do not change when token ``t`` arrives, so a layer can keep them (projected,
per key/value head) and, at each step, project only the new token: one query row against all
the cached keys. A step then costs ``O(d_model² + t·d_model)`` instead of the
``O(t·d_model² + t²·d_model)`` of a full causal forward over the ``t + 1`` tokens, and gives
the same output (the last row of that forward).

Usage (through the layer)::

    cache = mha.init_cache(batch_shape=(B,), max_len=1024)
    for x_t in tokens:                        # x_t (B, 1, d_model)
        out_t, weights_t = mha.decode_step(x_t, cache)

Memory: the cache holds ``2·n_kv_heads·d_k·t`` numbers per sequence and layer (see
:func:`mha_course.cost.kv_cache_bytes`); grouped-query attention (``n_kv_heads < h``) divides
it by ``h / n_kv_heads``.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import _fmt_shape, as_float_array, check_positive_int, check_shape, fail
from .attention import _weights_from_scores
from .multihead import split_heads

# First allocation of a growing cache (max_len=None), in positions; it then doubles.
_INITIAL_CAPACITY = 16


def _batch_shape(func: str, batch_shape) -> tuple[int, ...]:
    """A tuple of non-negative ints (an int ``B`` means ``(B,)``)."""
    if isinstance(batch_shape, (int, np.integer)) and not isinstance(batch_shape, bool):
        batch_shape = (batch_shape,)
    try:
        items = tuple(batch_shape)
    except TypeError:
        raise fail(
            func, f"batch_shape={batch_shape!r} must be a tuple of integers, e.g. () or (B,)"
        ) from None
    return tuple(
        check_positive_int(func, f"batch_shape[{i}]", n, minimum=0) for i, n in enumerate(items)
    )


class KVCache:
    """The keys and values a :class:`~mha_course.MultiHeadAttention` layer has seen so far.

    Made by :meth:`MultiHeadAttention.init_cache` and filled by
    :meth:`MultiHeadAttention.decode_step`; it remembers its layer and refuses any other.
    Keys and values are stored projected, per key/value head, in buffers of shape
    (..., n_kv_heads, capacity, d_k) and (..., n_kv_heads, capacity, d_v): allocated once at
    ``max_len`` positions when ``max_len`` is given, else grown by doubling, so appending
    ``t`` tokens one at a time copies O(t) numbers in all, not O(t²).

    Parameters
    ----------
    layer : MultiHeadAttention
        The layer whose keys and values this cache holds.
    batch_shape : tuple of int, default ()
        The leading axes ``...`` of every ``x_t`` (``()`` for one unbatched sequence).
    max_len : int, optional
        Most positions the cache may hold; preallocated. None: no limit, grown as needed.
    dtype : numpy dtype, optional
        Dtype of the stored keys and values. None: that of the first ``x_t`` (the buffers are
        then allocated at the first step).

    Attributes
    ----------
    layer : MultiHeadAttention
    batch_shape : tuple of int
    max_len : int or None
    n_kv_heads, d_k, d_v : int
        Copied from the layer.

    Raises
    ------
    ValueError
        If ``batch_shape`` is not a tuple of non-negative integers or ``max_len`` is not a
        positive integer.

    Examples
    --------
    >>> from mha_course import MultiHeadAttention
    >>> mha = MultiHeadAttention(d_model=8, h=4, n_kv_heads=2, rng=0)
    >>> cache = mha.init_cache(batch_shape=(3,), max_len=10)
    >>> for x_t in np.ones((5, 3, 1, 8)):  # five steps of a batch of 3
    ...     out_t, weights_t = mha.decode_step(x_t, cache)
    >>> len(cache), cache.keys.shape, out_t.shape, weights_t.shape
    (5, (3, 2, 5, 2), (3, 1, 8), (3, 4, 1, 5))
    """

    def __init__(self, layer, batch_shape=(), max_len=None, *, dtype=None):
        func = "KVCache"
        self.layer = layer
        self.batch_shape = _batch_shape(func, batch_shape)
        self.max_len = None if max_len is None else check_positive_int(func, "max_len", max_len)
        self.n_kv_heads, self.d_k, self.d_v = layer.n_kv_heads, layer.d_k, layer.d_v
        self._len = 0
        self._k = self._v = None  # (..., n_kv_heads, capacity, d_k | d_v) once allocated
        if dtype is not None:
            dtype = np.dtype(dtype)
            if dtype.kind != "f":
                raise fail(func, f"dtype={dtype} must be a real floating dtype")
            self._allocate(self.max_len or _INITIAL_CAPACITY, dtype)

    # ---------------------------------------------------------------------------- state
    def __len__(self) -> int:
        """Positions filled so far."""
        return self._len

    @property
    def capacity(self) -> int:
        """Positions the buffers can hold before they must grow (0 before the first step)."""
        return 0 if self._k is None else self._k.shape[-2]

    @property
    def dtype(self):
        """Dtype of the stored keys and values (None until allocated)."""
        return None if self._k is None else self._k.dtype

    @property
    def keys(self) -> np.ndarray:
        """Read-only view of the filled keys, shape (..., n_kv_heads, len, d_k)."""
        return self._filled(self._k, self.d_k)

    @property
    def values(self) -> np.ndarray:
        """Read-only view of the filled values, shape (..., n_kv_heads, len, d_v)."""
        return self._filled(self._v, self.d_v)

    @property
    def nbytes(self) -> int:
        """Bytes of the allocated key and value buffers (filled or not)."""
        return 0 if self._k is None else self._k.nbytes + self._v.nbytes

    def _filled(self, buf, d) -> np.ndarray:
        if buf is None:
            return np.empty((*self.batch_shape, self.n_kv_heads, 0, d))
        view = buf[..., : self._len, :]
        view.flags.writeable = False  # writing through it would corrupt the cache
        return view

    # --------------------------------------------------------------------------- append
    def _allocate(self, capacity: int, dtype) -> None:
        """(Re)allocate both buffers at ``capacity`` positions, keeping the filled part."""
        shape = (*self.batch_shape, self.n_kv_heads, capacity)
        new_k = np.empty((*shape, self.d_k), dtype=dtype)
        new_v = np.empty((*shape, self.d_v), dtype=dtype)
        if self._k is not None:
            new_k[..., : self._len, :] = self._k[..., : self._len, :]
            new_v[..., : self._len, :] = self._v[..., : self._len, :]
        self._k, self._v = new_k, new_v

    def _check_room(self, func: str, n: int) -> None:
        """Raise if ``n`` more positions would exceed ``max_len``."""
        if self.max_len is not None and self._len + n > self.max_len:
            raise fail(
                func,
                f"the cache is full: it holds {self._len} of max_len={self.max_len} positions "
                f"and cannot take {n} more; make a larger one with "
                f"init_cache(..., max_len={max(2 * self.max_len, self._len + n)}), or with "
                "max_len=None to let it grow",
            )

    def append(self, k, v) -> None:
        """Append ``n`` positions of projected keys and values (every K/V head).

        Parameters
        ----------
        k : ndarray of float, shape (..., n_kv_heads, n, d_k)
        v : ndarray of float, shape (..., n_kv_heads, n, d_v)
            ``...`` must equal the cache's ``batch_shape``.

        Raises
        ------
        ValueError
            On a wrong shape, non-float input, or when ``max_len`` would be exceeded.

        Examples
        --------
        >>> from mha_course import MultiHeadAttention
        >>> cache = MultiHeadAttention(8, 2, rng=0).init_cache()
        >>> cache.append(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))
        >>> len(cache), cache.values.shape
        (3, (2, 3, 4))
        """
        self._append("KVCache.append", k, v)

    def _append(self, func: str, k, v) -> None:
        k = as_float_array(func, "k", k)
        v = as_float_array(func, "v", v)
        expect = (*self.batch_shape, self.n_kv_heads)
        n = k.shape[-2] if k.ndim >= 2 else -1
        for name, arr, d, letter in ((("k", k, self.d_k, "d_k"), ("v", v, self.d_v, "d_v"))):
            check_shape(func, name, arr, ("n_kv_heads", "n", letter),
                        {"n_kv_heads": (self.n_kv_heads, "the cache"), "n": (n, "k"),
                         letter: (d, "the cache")})
            if arr.shape[:-2] != expect:
                raise fail(
                    func,
                    f"{name} has shape {_fmt_shape(arr.shape)}; expected "
                    f"(..., n_kv_heads, n, {letter}) with ... = {_fmt_shape(self.batch_shape)} "
                    f"(from the cache)",
                )
        self._check_room(func, n)
        needed = self._len + n
        if self._k is None:
            self._allocate(self.max_len or max(_INITIAL_CAPACITY, needed), k.dtype)
        elif needed > self.capacity:
            # Doubling: t appends copy at most 2·t positions in all (amortised O(1) each).
            self._allocate(max(2 * self.capacity, needed), self._k.dtype)
        self._k[..., self._len : needed, :] = k
        self._v[..., self._len : needed, :] = v
        self._len = needed

    def __repr__(self) -> str:
        return (
            f"KVCache(len={self._len}, capacity={self.capacity}, max_len={self.max_len}, "
            f"batch_shape={self.batch_shape}, n_kv_heads={self.n_kv_heads}, d_k={self.d_k}, "
            f"d_v={self.d_v}, dtype={self.dtype})"
        )


def decode_step(layer, x_t, cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
    """One decoding step of ``layer`` with a KV cache; see :meth:`MultiHeadAttention.decode_step`.

    The new token's query attends to every cached key including its own (causal by
    construction). Query heads are grouped as ``(..., g, h/g, d_k)`` so that each K/V head
    serves its ``h/g`` query heads in one matmul, without repeating the cached K and V.
    """
    func = "MultiHeadAttention.decode_step"
    if not isinstance(cache, KVCache):
        raise fail(
            func,
            f"cache is a {type(cache).__name__}; expected a KVCache from this layer's init_cache()",
        )
    if cache.layer is not layer:
        raise fail(
            func,
            f"cache was made by another layer ({cache.layer!r}); each layer needs its own "
            "cache: make one with this layer's init_cache()",
        )
    x_t = as_float_array(func, "x_t", x_t)
    d_model = layer.d_model
    check_shape(func, "x_t", x_t, ("1", "d_model"), {"d_model": (d_model, "the layer")})
    batch = x_t.shape[:-2]
    if x_t.shape[-2] != 1 or batch != cache.batch_shape:
        also = "" if batch == cache.batch_shape else (
            f"... = {_fmt_shape(cache.batch_shape)} (from the cache), "
        )
        raise fail(
            func,
            f"x_t has shape {_fmt_shape(x_t.shape)}; expected (..., 1, d_model) with "
            f"{also}d_model={d_model} (from the layer)",
        )
    cache._check_room(func, 1)  # before anything is computed or stored

    h, g, d_k, d_v = layer.h, layer.n_kv_heads, layer.d_k, layer.d_v
    dtype = x_t.dtype
    k = layer._project(x_t, layer.W_k, layer.b_k, dtype)  # (..., 1, g*d_k)
    v = layer._project(x_t, layer.W_v, layer.b_v, dtype)  # (..., 1, g*d_v)
    cache._append(func, split_heads(k, g), split_heads(v, g))  # as (..., g, 1, d_k | d_v)
    keys, values = cache.keys, cache.values  # (..., g, L, d_k), (..., g, L, d_v)
    L = keys.shape[-2]

    q = layer._project(x_t, layer.W_q, layer.b_q, dtype)  # (..., 1, h*d_k)
    q *= 1.0 / math.sqrt(d_k)
    # One position: (..., 1, h*d_k) -> (..., g, h/g, d_k), query head j*(h/g) + m at [j, m]
    q = q.reshape(*batch, g, h // g, d_k)
    # (..., g, h/g, d_k) @ (..., g, d_k, L) -> (..., g, h/g, L); no mask: every cached key is
    # at or before the new token. The max-shift is kept: it costs O(h·L), negligible here.
    scores = q @ np.swapaxes(keys, -1, -2)
    weights = _weights_from_scores(scores, None, shift=True)
    # (..., g, h/g, L) @ (..., g, L, d_v) -> (..., g, h/g, d_v) -> (..., 1, h*d_v): the heads
    # are already in merge_heads order
    concat = (weights @ values).reshape(*batch, 1, h * d_v)
    out = layer._project(concat, layer.W_o, layer.b_o, concat.dtype)  # (..., 1, d_model)
    return out, weights.reshape(*batch, h, 1, L)
