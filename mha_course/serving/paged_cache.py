"""A paged KV cache (PagedAttention, vLLM): many sequences' keys and values in one pool of blocks.

Taught in ``notebooks/06_decoding.ipynb``. Like :class:`~mha_course.KVCache` this module only
stores: the attention over a sequence's gathered keys and values is the package's usual
``scaled_dot_product_attention``.

A server decodes many sequences at once and does not know how long each will grow. Reserving
one contiguous buffer of ``max_len`` positions per sequence wastes everything a sequence never
uses. Kwon et al. (SOSP 2023, vLLM) page the cache like virtual memory: one layer's keys live in
a pool of ``n_blocks`` fixed-size blocks of ``block_size`` positions, shape
(n_blocks, n_kv_heads, block_size, d_k) (values likewise, with d_v); each sequence owns a *block
table*, the list of the physical blocks that hold its positions ``0..n-1`` in order; a new block
is taken from a free list only when the sequence's last block is full. A sequence then wastes at
most ``block_size - 1`` positions, and a finished sequence's blocks go straight back to the pool.

Sequences with a common prefix (parallel sampling, beam search) can share blocks:
:meth:`PagedKVCache.fork` gives a new sequence the same block table, each block counting the
tables that hold it; a sequence about to write into a shared block first copies it
(copy-on-write), and a block returns to the free list when no table holds it any more.

Usage::

    cache = PagedKVCache(layer, n_blocks=1024, block_size=16)
    seq = cache.add_sequence()
    cache.append(seq, k, v)                   # k (g, T_new, d_k), v (g, T_new, d_v)
    keys, values = cache.gather(seq)          # (g, n, d_k), (g, n, d_v): a copy
    child = cache.fork(seq)                   # shares seq's blocks until one of them writes
    cache.free(seq)                           # blocks no other sequence holds: back to the pool

Lesson 10 (``notebooks/10_serving.ipynb``) serves many requests from the pool: a prefix cache
starts a sequence on shared full blocks (``add_sequence(blocks=...)``) and holds indexed blocks
with ``retain`` / ``release``; speculative decoding rolls a sequence back with ``truncate``.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, fail, fmt_shape, validate_positive_int, validate_shape


class PagedKVCache:
    """One layer's keys and values for many sequences, in a shared pool of fixed-size blocks.

    Position ``p`` of a sequence lives in block ``table[p // block_size]`` at offset
    ``p % block_size``; blocks are taken from the free list one at a time, when the sequence's
    last block is full, so the blocks of one sequence are in general not contiguous. A block
    may be held by several tables after :meth:`fork` (a reference count per block); it is
    copied before a sequence writes into it while shared. Storage only: attention over
    :meth:`gather`'s output is the package's usual attention.

    Parameters
    ----------
    layer : MultiHeadAttention
        The layer whose keys and values the pool holds (its ``n_kv_heads``, ``d_k``, ``d_v``).
    n_blocks : int
        Blocks in the pool.
    block_size : int
        Positions per block.
    dtype : numpy dtype, optional
        Dtype of the pools. None: that of the first ``k`` appended (the pools are then allocated
        at the first :meth:`append`).

    Attributes
    ----------
    layer : MultiHeadAttention
    n_blocks, block_size : int
    n_kv_heads, d_k, d_v : int
        Copied from the layer.

    Raises
    ------
    ValueError
        If ``layer`` has no ``n_kv_heads``, ``d_k``, ``d_v``, if ``n_blocks`` or ``block_size``
        is not a positive integer, or if ``dtype`` is not a real floating dtype.

    Examples
    --------
    >>> from mha_course import MultiHeadAttention
    >>> layer = MultiHeadAttention(d_model=8, h=4, n_kv_heads=2, rng=0)  # g=2, d_k=d_v=2
    >>> cache = PagedKVCache(layer, n_blocks=8, block_size=4)
    >>> a, b = cache.add_sequence(), cache.add_sequence()
    >>> cache.append(a, np.ones((2, 6, 2)), np.ones((2, 6, 2)))  # 6 positions: 2 blocks
    >>> cache.append(b, np.ones((2, 3, 2)), np.ones((2, 3, 2)))  # 3 positions: 1 block
    >>> cache.append(a, np.ones((2, 3, 2)), np.ones((2, 3, 2)))  # 9 positions: a 3rd block
    >>> cache.block_table(a), cache.block_table(b), cache.gather(a)[0].shape
    ([0, 1, 3], [2], (2, 9, 2))
    >>> cache.blocks_in_use, cache.free_blocks
    (4, 4)
    """

    def __init__(self, layer, n_blocks, block_size, *, dtype=None):
        func = "PagedKVCache"
        if not all(hasattr(layer, a) for a in ("n_kv_heads", "d_k", "d_v")):
            raise fail(func, f"layer has type {type(layer).__name__}; expected the "
                       "MultiHeadAttention whose keys and values it will hold")
        self.layer = layer
        self.n_blocks = validate_positive_int(func, "n_blocks", n_blocks)
        self.block_size = validate_positive_int(func, "block_size", block_size)
        self.n_kv_heads, self.d_k, self.d_v = layer.n_kv_heads, layer.d_k, layer.d_v
        # the free list, as a stack: block 0 is taken first, a freed block is reused first
        self._free = list(range(self.n_blocks - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}  # seq_id -> physical block ids, in order
        self._refs = [0] * self.n_blocks  # block -> how many tables hold it
        self._lens: dict[int, int] = {}  # seq_id -> positions stored
        self._next_id = 0
        self._k = self._v = None  # (n_blocks, g, block_size, d_k | d_v) once allocated
        if dtype is not None:
            dtype = np.dtype(dtype)
            if dtype.kind != "f":
                raise fail(func, f"dtype={dtype} must be a real floating dtype")
            self._allocate(dtype)

    def _allocate(self, dtype) -> None:
        shape = (self.n_blocks, self.n_kv_heads, self.block_size)
        self._k = np.zeros((*shape, self.d_k), dtype=dtype)  # (n_blocks, g, block_size, d_k)
        self._v = np.zeros((*shape, self.d_v), dtype=dtype)  # (n_blocks, g, block_size, d_v)

    # ---------------------------------------------------------------------------- state
    @property
    def dtype(self):
        """Dtype of the pools (None until allocated)."""
        return None if self._k is None else self._k.dtype

    @property
    def blocks_in_use(self) -> int:
        """Blocks owned by live sequences."""
        return self.n_blocks - len(self._free)

    @property
    def free_blocks(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def sequences(self) -> list[int]:
        """The ids of the live sequences, oldest first."""
        return list(self._tables)

    def ref_count(self, block: int) -> int:
        """How many sequences' block tables hold physical block ``block`` (0: it is free)."""
        return self._refs[block]

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (keys and values; 0 before the pools are allocated)."""
        return 0 if self._k is None else (self._k.nbytes + self._v.nbytes) // self.n_blocks

    def _check_id(self, func: str, seq_id) -> int:
        if seq_id not in self._tables:
            raise fail(func, f"unknown seq_id={seq_id!r}; the live sequences are "
                       f"{self.sequences} (add one with add_sequence(); a freed id is gone)")
        return seq_id

    def len_of(self, seq_id) -> int:
        """Positions stored for ``seq_id``.

        Raises
        ------
        ValueError
            If ``seq_id`` is not a live sequence.
        """
        return self._lens[self._check_id("PagedKVCache.len_of", seq_id)]

    def block_table(self, seq_id) -> list[int]:
        """The physical block ids of ``seq_id``, in position order (a copy).

        Raises
        ------
        ValueError
            If ``seq_id`` is not a live sequence.
        """
        return list(self._tables[self._check_id("PagedKVCache.block_table", seq_id)])

    # ---------------------------------------------------------------------- sequences
    def add_sequence(self, blocks=()) -> int:
        """Start a sequence and return its id: empty, or starting with full shared ``blocks``.

        ``blocks`` (lesson 10's prefix cache) are physical blocks already holding positions
        ``0 .. len(blocks)·block_size - 1`` of another sequence: the new sequence's table starts
        with them and their reference counts go up by one, as :meth:`fork` does.

        Raises
        ------
        ValueError
            If a block is free or out of range.
        """
        blocks = [int(b) for b in blocks]
        for b in blocks:
            if not 0 <= b < self.n_blocks or self._refs[b] == 0:
                raise fail("PagedKVCache.add_sequence", f"block {b} is not a live block of the "
                           f"pool (0..{self.n_blocks - 1}, held by a sequence or retained)")
        seq_id = self._next_id
        self._next_id += 1
        self._tables[seq_id] = blocks
        self._lens[seq_id] = len(blocks) * self.block_size
        for b in blocks:
            self._refs[b] += 1
        return seq_id

    def retain(self, block: int) -> None:
        """Hold ``block`` for a holder outside the block tables (a prefix cache's index): its
        reference count goes up by one, so freeing its sequences does not free it."""
        if not 0 <= block < self.n_blocks or self._refs[block] == 0:
            raise fail("PagedKVCache.retain", f"block {block} is not a live block")
        self._refs[block] += 1

    def release(self, block: int) -> None:
        """Undo one :meth:`retain`; the block returns to the free list when nothing holds it."""
        if not 0 <= block < self.n_blocks or self._refs[block] == 0:
            raise fail("PagedKVCache.release", f"block {block} is not held")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)

    def truncate(self, seq_id, length: int) -> None:
        """Keep the first ``length`` positions of ``seq_id`` (speculative decoding's rollback).

        Blocks past the new length leave the table (and return to the free list when nothing
        else holds them); a kept, partly filled last block is overwritten by later appends
        (copied first if shared).

        Raises
        ------
        ValueError
            If ``seq_id`` is not live or ``length`` is not between 0 and its length.
        """
        func = "PagedKVCache.truncate"
        self._check_id(func, seq_id)
        if isinstance(length, bool) or not 0 <= length <= self._lens[seq_id]:
            raise fail(func, f"length={length!r} must be between 0 and the "
                             f"{self._lens[seq_id]} positions of sequence {seq_id}")
        table = self._tables[seq_id]
        keep = -(-int(length) // self.block_size)  # ceil
        for block in reversed(table[keep:]):
            self.release(block)
        del table[keep:]
        self._lens[seq_id] = int(length)

    def free(self, seq_id) -> None:
        """Forget ``seq_id`` and put its blocks back on the free list.

        Raises
        ------
        ValueError
            If ``seq_id`` is not a live sequence.
        """
        self._check_id("PagedKVCache.free", seq_id)
        for block in reversed(self._tables.pop(seq_id)):  # its first block is reused first
            self._refs[block] -= 1
            if self._refs[block] == 0:  # no other sequence holds it
                self._free.append(block)
        del self._lens[seq_id]

    def fork(self, seq_id) -> int:
        """A new sequence with the same positions as ``seq_id``, sharing its blocks.

        Nothing is copied now: the new block table points to the same physical blocks, whose
        reference counts go up by one. The first :meth:`append` of either sequence into a
        shared, partly filled last block copies that block first (copy-on-write); full blocks
        are never written again, so they stay shared.

        Returns
        -------
        int
            The new sequence's id.

        Raises
        ------
        ValueError
            If ``seq_id`` is not a live sequence.

        Examples
        --------
        >>> from mha_course import MultiHeadAttention
        >>> cache = PagedKVCache(MultiHeadAttention(8, 2, rng=0), n_blocks=4, block_size=2)
        >>> a = cache.add_sequence()
        >>> cache.append(a, np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))  # blocks 0, 1
        >>> b = cache.fork(a)
        >>> cache.blocks_in_use, cache.block_table(b)
        (2, [0, 1])
        >>> cache.append(b, np.ones((2, 1, 4)), np.ones((2, 1, 4)))  # block 1 copied first
        >>> cache.block_table(a), cache.block_table(b), cache.gather(b)[0].shape
        ([0, 1], [0, 2], (2, 4, 4))
        """
        self._check_id("PagedKVCache.fork", seq_id)
        child = self.add_sequence()
        self._tables[child] = list(self._tables[seq_id])
        self._lens[child] = self._lens[seq_id]
        for block in self._tables[child]:
            self._refs[block] += 1
        return child

    def append(self, seq_id, k, v) -> None:
        """Append ``T_new`` positions of projected keys and values to ``seq_id``.

        The positions fill the sequence's last block, then new blocks from the free list (as
        many as needed: ``T_new`` may span several blocks). A partly filled last block that
        another sequence shares (after :meth:`fork`) is first copied to a block of its own.

        Parameters
        ----------
        seq_id : int
            From :meth:`add_sequence`.
        k : ndarray of float, shape (n_kv_heads, T_new, d_k)
        v : ndarray of float, shape (n_kv_heads, T_new, d_v)

        Raises
        ------
        ValueError
            If ``seq_id`` is unknown, ``k`` or ``v`` has the wrong shape or is not float, or the
            free list has fewer blocks than the new positions need; the cache is then unchanged.

        Examples
        --------
        >>> from mha_course import MultiHeadAttention
        >>> cache = PagedKVCache(MultiHeadAttention(8, 2, rng=0), n_blocks=4, block_size=2)
        >>> s = cache.add_sequence()
        >>> cache.append(s, np.zeros((2, 5, 4)), np.zeros((2, 5, 4)))
        >>> cache.len_of(s), cache.block_table(s), cache.gather(s)[1].shape
        (5, [0, 1, 2], (2, 5, 4))
        """
        func = "PagedKVCache.append"
        self._check_id(func, seq_id)
        k = as_float_array(func, "k", k)
        v = as_float_array(func, "v", v)
        n_new = k.shape[-2] if k.ndim >= 2 else -1
        for name, arr, d, letter in (("k", k, self.d_k, "d_k"), ("v", v, self.d_v, "d_v")):
            validate_shape(func, name, arr, ("n_kv_heads", "T_new", letter),
                           {"n_kv_heads": (self.n_kv_heads, "the cache"), "T_new": (n_new, "k"),
                            letter: (d, "the cache")}, batch=False)
        if n_new < 1:
            raise fail(func, f"k has shape {fmt_shape(k.shape)}; expected at least one "
                       "position (T_new >= 1)")
        table, n_old, bs = self._tables[seq_id], self._lens[seq_id], self.block_size
        n_total = n_old + n_new
        needed = -(-n_total // bs) - len(table)  # ceil(n_total / bs) blocks in all
        copy = n_old % bs != 0 and self._refs[table[-1]] > 1  # a shared block to write into
        if needed + copy > len(self._free):
            why = " (one to copy a shared block)" if copy else ""
            raise fail(func, f"the pool is full: sequence {seq_id} needs {needed + copy} more "
                       f"block{'s' if needed + copy != 1 else ''}{why} of {bs} positions for "
                       f"{n_new} new position{'s' if n_new != 1 else ''}, but only "
                       f"{len(self._free)} of {self.n_blocks} blocks are free; free finished "
                       "sequences or make a larger pool")
        if self._k is None:
            self._allocate(k.dtype)
        if copy:  # copy-on-write: the other sequences keep the shared block as it is
            shared, own = table[-1], self._free.pop()
            self._k[own], self._v[own] = self._k[shared], self._v[shared]
            self._refs[shared] -= 1
            self._refs[own] = 1
            table[-1] = own
        for _ in range(needed):
            block = self._free.pop()
            self._refs[block] = 1
            table.append(block)
        positions = np.arange(n_old, n_total)  # (T_new,)
        blocks = np.asarray(table)[positions // bs]  # (T_new,): the physical block of each
        offsets = positions % bs  # (T_new,): the slot inside it
        # two index arrays around a slice: the indexed axes come first, (T_new, g, d_k)
        self._k[blocks, :, offsets, :] = np.swapaxes(k, 0, 1)  # (g, T_new, d_k) -> (T_new, g, d_k)
        self._v[blocks, :, offsets, :] = np.swapaxes(v, 0, 1)  # (g, T_new, d_v) -> (T_new, g, d_v)
        self._lens[seq_id] = n_total

    def gather(self, seq_id) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values of ``seq_id``, contiguous and in position order (a copy).

        Returns
        -------
        k : ndarray, shape (n_kv_heads, n, d_k)
        v : ndarray, shape (n_kv_heads, n, d_v)
            ``n = len_of(seq_id)``.

        Raises
        ------
        ValueError
            If ``seq_id`` is not a live sequence.
        """
        self._check_id("PagedKVCache.gather", seq_id)
        table, n = self._tables[seq_id], self._lens[seq_id]
        if self._k is None:
            return (np.empty((self.n_kv_heads, 0, self.d_k)),
                    np.empty((self.n_kv_heads, 0, self.d_v)))
        return self._read(self._k, table, n), self._read(self._v, table, n)

    def _read(self, pool: np.ndarray, table: list[int], n: int) -> np.ndarray:
        g, d = self.n_kv_heads, pool.shape[-1]
        blocks = pool[np.asarray(table, dtype=np.intp)]  # (n_blocks_of_seq, g, block_size, d)
        blocks = np.swapaxes(blocks, 0, 1)  # -> (g, n_blocks_of_seq, block_size, d)
        return blocks.reshape(g, len(table) * self.block_size, d)[:, :n]  # -> (g, n, d)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(n_blocks={self.n_blocks}, block_size={self.block_size}, "
            f"sequences={len(self._tables)}, blocks_in_use={self.blocks_in_use}, "
            f"n_kv_heads={self.n_kv_heads}, d_k={self.d_k}, d_v={self.d_v}, dtype={self.dtype})"
        )
