"""The KV cache's storage: the keys and values a layer has seen, and how the buffers grow.

Taught in ``notebooks/06_decoding.ipynb``. The decoding step itself is
``MultiHeadAttention.decode_step`` (:mod:`mha_course.multihead`), built from the same pieces as
the layer's forward pass; this module only stores.

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

import numpy as np

from ._validate import as_float_array, fail, fmt_shape, validate_positive_int, validate_shape

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
        validate_positive_int(func, f"batch_shape[{i}]", n, minimum=0) for i, n in enumerate(items)
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
    tokens_seen : int
        Positions appended so far (equal to ``len(cache)``): the position of the next token,
        which RoPE needs.

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
        self.max_len = None if max_len is None else validate_positive_int(func, "max_len", max_len)
        self.n_kv_heads, self.d_k, self.d_v = layer.n_kv_heads, layer.d_k, layer.d_v
        self._len = 0
        self.tokens_seen = 0  # positions appended so far: the RoPE position of the next token
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

    def require_room(self, n: int, func: str = "KVCache.append") -> None:
        """Raise a ``ValueError`` naming ``func`` if ``n`` more positions would exceed ``max_len``.

        Callers that compute before they append (``decode_step``) ask first, so a full cache
        refuses the step before anything changes.
        """
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
        needed = self._len + n
        if self._k is None:
            self._allocate(self.max_len or max(_INITIAL_CAPACITY, needed), k.dtype)
        elif needed > self.capacity:
            # Doubling: t appends copy at most 2·t positions in all (amortised O(1) each).
            self._allocate(max(2 * self.capacity, needed), self._k.dtype)
        self._k[..., self._len : needed, :] = k
        self._v[..., self._len : needed, :] = v
        self._len = needed
        self.tokens_seen += n

    def __repr__(self) -> str:
        return (
            f"KVCache(len={self._len}, capacity={self.capacity}, max_len={self.max_len}, "
            f"batch_shape={self.batch_shape}, n_kv_heads={self.n_kv_heads}, d_k={self.d_k}, "
            f"d_v={self.d_v}, dtype={self.dtype})"
        )
