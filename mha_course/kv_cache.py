"""The KV cache's storage: the keys and values a layer has seen, and how the buffers grow.

Taught in ``notebooks/06_decoding.ipynb``. The decoding step itself is
``MultiHeadAttention.step`` (:mod:`mha_course.multihead`; ``decode_step`` is its one-token case),
built from the same pieces as the layer's forward pass; this module only stores. The serving
wing's :class:`~mha_course.serving.decoder.ContiguousCache` is one of these per layer.

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

Sliding windows: ``init_cache(window=W)`` makes a *rolling buffer* of ``W`` slots (Mistral 7B
v0.1's cache): the token at position ``i`` is written to slot ``i mod W``, over the token
``W`` positions older, which a query under :func:`~mha_course.sliding_window_mask` can no
longer see. Memory stays at ``W`` positions however long the sequence grows; ``tokens_seen``
keeps counting (RoPE needs the true position), while ``len(cache)`` stops at ``W``. (StreamingLLM,
which keeps its first 4 tokens next to such a window, rotates by the positions within the cache
instead, caching the keys before RoPE: deep dive 06b §2 and exercise 06.4.)
"""

from __future__ import annotations

import numpy as np

from ._validate import as_float_array, fail, fmt_shape, validate_positive_int, validate_shape

#: First allocation of a growing cache (max_len=None), in positions; it then doubles.
INITIAL_CAPACITY = 16


def parse_batch_shape(func: str, batch_shape) -> tuple[int, ...]:
    """A tuple of non-negative ints (an int ``B`` means ``(B,)``), or a named ``ValueError``.

    Shared by :class:`KVCache` and the latent cache of :mod:`mha_course.variants.mla`.
    """
    if isinstance(batch_shape, (int, np.integer)) and not isinstance(batch_shape, bool):
        batch_shape = (batch_shape,)
    try:
        items = tuple(batch_shape)
    except TypeError:
        raise fail(
            func, f"batch_shape={batch_shape!r} must be a tuple of integers, e.g. () or (B,)"
        ) from None
    return tuple(
        validate_positive_int(func, f"batch_shape[{i}]", n, minimum=0) for i, n in enumerate(items)
    )


def grown(buf: np.ndarray, filled: int, capacity: int) -> np.ndarray:
    """A new buffer like ``buf`` with ``capacity`` positions on axis -2, its first ``filled``
    positions copied over (the growth step of a cache that doubles).

    Examples
    --------
    >>> grown(np.ones((2, 3, 4)), filled=3, capacity=6).shape
    (2, 6, 4)
    """
    new = np.empty((*buf.shape[:-2], capacity, buf.shape[-1]), dtype=buf.dtype)
    new[..., :filled, :] = buf[..., :filled, :]
    return new


def grown_capacity(capacity: int, needed: int) -> int:
    """The next capacity of a doubling cache: twice the current one, or ``needed`` if more.

    Doubling means ``t`` one-token appends copy at most ``2·t`` positions in all (amortised
    O(1) each), not O(t²).
    """
    return max(2 * capacity, needed)


class KVCache:
    """The keys and values a :class:`~mha_course.MultiHeadAttention` layer has seen so far.

    Made by :meth:`MultiHeadAttention.init_cache` and filled by
    :meth:`MultiHeadAttention.decode_step`; it remembers its layer and refuses any other.
    Keys and values are stored projected (and, with RoPE, already rotated), per key/value head,
    in buffers of shape (..., n_kv_heads, capacity, d_k) and (..., n_kv_heads, capacity, d_v):
    allocated once at ``max_len`` positions when ``max_len`` is given, else grown by doubling, so
    appending ``t`` tokens one at a time copies O(t) numbers in all, not O(t²). With ``window``
    the buffers are a rolling buffer of ``window`` slots: position ``i`` lives in slot
    ``i mod window``, and only the last ``window`` positions are kept.

    Parameters
    ----------
    layer : MultiHeadAttention
        The layer whose keys and values this cache holds.
    batch_shape : tuple of int, default ()
        The leading axes ``...`` of every ``x_t`` (``()`` for one unbatched sequence).
    max_len : int, optional
        Most positions the cache may ever take; preallocated (at most ``window`` of them with a
        window). None: no limit, grown as needed.
    dtype : numpy dtype, optional
        Dtype of the stored keys and values. None: that of the first ``x_t`` (the buffers are
        then allocated at the first step).
    window : int, optional
        Keep only the last ``window`` positions, in a rolling buffer of ``window`` slots: decoding
        then equals the forward pass with :func:`~mha_course.sliding_window_mask`. None: keep
        every position.

    Attributes
    ----------
    layer : MultiHeadAttention
    batch_shape : tuple of int
    max_len, window : int or None
    n_kv_heads, d_k, d_v : int
        Copied from the layer.
    tokens_seen : int
        Positions appended so far: the position of the next token, which RoPE needs. Equal to
        ``len(cache)`` without a window; with one, it keeps counting while ``len(cache)`` stops
        at ``window``.

    Raises
    ------
    ValueError
        If ``batch_shape`` is not a tuple of non-negative integers, or ``max_len`` or
        ``window`` is not a positive integer.

    Examples
    --------
    >>> from mha_course import MultiHeadAttention
    >>> mha = MultiHeadAttention(d_model=8, h=4, n_kv_heads=2, rng=0)
    >>> cache = mha.init_cache(batch_shape=(3,), max_len=10)
    >>> for x_t in np.ones((5, 3, 1, 8)):  # five steps of a batch of 3
    ...     out_t, weights_t = mha.decode_step(x_t, cache)
    >>> len(cache), cache.keys.shape, out_t.shape, weights_t.shape
    (5, (3, 2, 5, 2), (3, 1, 8), (3, 4, 1, 5))
    >>> rolling = mha.init_cache(window=3)
    >>> for x_t in np.ones((5, 1, 8)):
    ...     out_t, weights_t = mha.decode_step(x_t, rolling)
    >>> len(rolling), rolling.tokens_seen, rolling.positions.tolist(), weights_t.shape
    (3, 5, [3, 4, 2], (4, 1, 3))
    """

    def __init__(self, layer, batch_shape=(), max_len=None, *, dtype=None, window=None):
        func = "KVCache"
        if not all(hasattr(layer, a) for a in ("n_kv_heads", "d_k", "d_v")):
            raise fail(func, f"layer has type {type(layer).__name__}; expected the "
                       "MultiHeadAttention whose keys and values it will hold (or use "
                       "layer.init_cache())")
        self.layer = layer
        self.batch_shape = parse_batch_shape(func, batch_shape)
        self.max_len = None if max_len is None else validate_positive_int(func, "max_len", max_len)
        self.window = None if window is None else validate_positive_int(func, "window", window)
        self.n_kv_heads, self.d_k, self.d_v = layer.n_kv_heads, layer.d_k, layer.d_v
        self._len = 0  # slots filled
        self.tokens_seen = 0  # positions appended so far: the RoPE position of the next token
        self._k = self._v = None  # (..., n_kv_heads, capacity, d_k | d_v) once allocated
        if dtype is not None:
            dtype = np.dtype(dtype)
            if dtype.kind != "f":
                raise fail(func, f"dtype={dtype} must be a real floating dtype")
            self._allocate(self._first_capacity(0), dtype)

    def _first_capacity(self, needed: int) -> int:
        """Slots of the first allocation: the window, else max_len, else room to grow."""
        if self.window is not None:
            return min(self.window, self.max_len or self.window)
        return self.max_len or max(INITIAL_CAPACITY, needed)

    # ---------------------------------------------------------------------------- state
    def __len__(self) -> int:
        """Positions held now (at most ``window`` for a rolling buffer)."""
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
        """Read-only view of the filled keys, shape (..., n_kv_heads, len, d_k), in slot order
        (see :attr:`positions`)."""
        return self._filled(self._k, self.d_k)

    @property
    def values(self) -> np.ndarray:
        """Read-only view of the filled values, shape (..., n_kv_heads, len, d_v), in slot
        order (see :attr:`positions`)."""
        return self._filled(self._v, self.d_v)

    @property
    def positions(self) -> np.ndarray:
        """The position of the token in each filled slot, shape (len,).

        ``0, 1, ..., len - 1`` without a window. In a rolling buffer of ``W`` slots, slot ``j``
        holds the latest position ``p < tokens_seen`` with ``p mod W = j``.
        """
        j = np.arange(self._len)
        if self.window is None or self._len == 0:
            return j
        W = self.capacity
        return j + W * ((self.tokens_seen - 1 - j) // W)

    def oldest_first(self, x: np.ndarray) -> np.ndarray:
        """``x`` (..., len), one entry per slot, reordered by position, oldest first.

        A rolling buffer's slots are not in position order once it has wrapped around;
        :meth:`MultiHeadAttention.decode_step` reorders its weights with this, so they line up
        with the keys of the sliding-window forward. Without a window, ``x`` itself.
        """
        if self.window is None or self.tokens_seen <= self.capacity:
            return x
        start = self.tokens_seen % self.capacity  # the slot of the oldest position kept
        return np.roll(x, -start, axis=-1)

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
        """Allocate both buffers at ``capacity`` positions (keeping the filled part)."""
        if self._k is None:
            shape = (*self.batch_shape, self.n_kv_heads, capacity)
            self._k = np.empty((*shape, self.d_k), dtype=dtype)
            self._v = np.empty((*shape, self.d_v), dtype=dtype)
        else:
            self._k = grown(self._k, self._len, capacity)
            self._v = grown(self._v, self._len, capacity)

    def require_room(self, n: int, func: str = "KVCache.append") -> None:
        """Raise a ``ValueError`` naming ``func`` if ``n`` more positions would exceed ``max_len``.

        Callers that compute before they append (``decode_step``) ask first, so a full cache
        refuses the step before anything changes.
        """
        if self.max_len is not None and self.tokens_seen + n > self.max_len:
            raise fail(
                func,
                f"the cache is full: it holds {self.tokens_seen} of max_len={self.max_len} "
                f"positions and cannot take {n} more; make a larger one with "
                f"init_cache(..., max_len={max(2 * self.max_len, self.tokens_seen + n)}), or "
                "with max_len=None to let it grow",
            )

    def append(self, k, v) -> None:
        """Append ``n`` positions of projected keys and values (every K/V head).

        A rolling buffer writes position ``i`` to slot ``i mod window`` (of ``n > window`` new
        positions only the last ``window`` are kept).

        Parameters
        ----------
        k : ndarray of float, shape (..., n_kv_heads, n, d_k)
        v : ndarray of float, shape (..., n_kv_heads, n, d_v)
            ``...`` must equal the cache's ``batch_shape``.

        Raises
        ------
        ValueError
            On a wrong shape, non-float input, or when ``max_len`` would be exceeded; the cache
            is then unchanged.

        Examples
        --------
        >>> from mha_course import MultiHeadAttention
        >>> cache = MultiHeadAttention(8, 2, rng=0).init_cache()
        >>> cache.append(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))
        >>> len(cache), cache.values.shape
        (3, (2, 3, 4))
        """
        func = "KVCache.append"
        k = as_float_array(func, "k", k)
        v = as_float_array(func, "v", v)
        expect = (*self.batch_shape, self.n_kv_heads)
        n = k.shape[-2] if k.ndim >= 2 else -1
        for name, arr, d, letter in ((("k", k, self.d_k, "d_k"), ("v", v, self.d_v, "d_v"))):
            validate_shape(func, name, arr, ("n_kv_heads", "n", letter),
                           {"n_kv_heads": (self.n_kv_heads, "the cache"), "n": (n, "k"),
                            letter: (d, "the cache")})
            if arr.shape[:-2] != expect:
                raise fail(
                    func,
                    f"{name} has shape {fmt_shape(arr.shape)}; expected "
                    f"(..., n_kv_heads, n, {letter}) with ... = {fmt_shape(self.batch_shape)} "
                    f"(from the cache)",
                )
        self.require_room(n, func)
        if self._k is None:
            self._allocate(self._first_capacity(n), k.dtype)
        if self.window is not None:
            W = self.capacity
            kept = min(n, W)  # of more than W new positions only the last W stay
            slots = (self.tokens_seen + np.arange(n - kept, n)) % W  # position i -> slot i mod W
            self._k[..., slots, :] = k[..., n - kept :, :]
            self._v[..., slots, :] = v[..., n - kept :, :]
            self._len = min(W, self._len + n)
        else:
            needed = self._len + n
            if needed > self.capacity:
                self._allocate(grown_capacity(self.capacity, needed), self._k.dtype)
            self._k[..., self._len : needed, :] = k
            self._v[..., self._len : needed, :] = v
            self._len = needed
        self.tokens_seen += n

    @staticmethod
    def check_step(func: str, layer, x, cache, one: bool = False) -> np.ndarray:
        """``x`` (..., T, d_model) as a float array for ``layer``'s cached step over ``cache``
        (``one``: exactly one position, as ``decode_step`` takes), or a ``ValueError`` naming
        ``func``. The cache is not touched when it fails.
        """
        if not isinstance(cache, KVCache):
            raise fail(func, f"cache is a {type(cache).__name__}; expected a KVCache from this "
                             "layer's init_cache()")
        if cache.layer is not layer:
            raise fail(func, f"cache was made by another layer ({cache.layer!r}); each layer "
                             "needs its own cache: make one with this layer's init_cache()")
        name, T = ("x_t", "1") if one else ("x", "T")
        x = as_float_array(func, name, x)
        d_model = layer.d_model
        validate_shape(func, name, x, (T, "d_model"), {"d_model": (d_model, "the layer")})
        batch = x.shape[:-2]
        if (one and x.shape[-2] != 1) or batch != cache.batch_shape:
            also = "" if batch == cache.batch_shape else (
                f"... = {fmt_shape(cache.batch_shape)} (from the cache), ")
            raise fail(func, f"{name} has shape {fmt_shape(x.shape)}; expected (..., {T}, "
                             f"d_model) with {also}d_model={d_model} (from the layer)")
        if cache.window is not None and x.shape[-2] > 1:
            raise fail(func, f"the cache has a rolling window={cache.window}; it takes one "
                             f"token at a time, and x has T={x.shape[-2]}")
        cache.require_room(x.shape[-2], func)  # before anything is computed or stored
        return x

    def truncate(self, length: int, func: str = "KVCache.truncate") -> None:
        """Keep the first ``length`` positions (``0 <= length <= len(cache)``), as speculative
        decoding rolls rejected drafts back; not for a rolling buffer.

        Examples
        --------
        >>> from mha_course import MultiHeadAttention
        >>> cache = MultiHeadAttention(8, 2, rng=0).init_cache()
        >>> cache.append(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))
        >>> cache.truncate(1); len(cache), cache.tokens_seen
        (1, 1)
        """
        if self.window is not None:
            raise fail(func, f"the cache has a rolling window={self.window}; its dropped "
                             "positions cannot be rolled back to")
        if not 0 <= length <= self._len:
            raise fail(func, f"length={length} must be between 0 and the {self._len} "
                             "positions stored")
        self._len = self.tokens_seen = int(length)

    def __repr__(self) -> str:
        window = "" if self.window is None else f", window={self.window}"
        return (
            f"KVCache(len={self._len}, capacity={self.capacity}, max_len={self.max_len}"
            f"{window}, batch_shape={self.batch_shape}, n_kv_heads={self.n_kv_heads}, "
            f"d_k={self.d_k}, d_v={self.d_v}, dtype={self.dtype})"
        )
