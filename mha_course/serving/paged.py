"""Many sequences of one decoder in paged KV caches: one block pool per layer, in lockstep.

Taught in ``notebooks/10_serving.ipynb`` (§2); the pool itself, :class:`~mha_course.PagedKVCache`,
is deep dive 06b §4's. A :class:`PagedStore` keeps one pool per layer of a
:class:`~mha_course.serving.decoder.Decoder`; every operation is applied to all of them in the
same order, so a sequence has the same id and the same block table in every layer, and one
table describes it. A :class:`PagedSequence` is a sequence's view of the store with the cache
protocol the decoder runs over (``length``, ``attend``, ``advance``): it appends the chunk's
keys and values to its blocks, gathers its positions and attends with the bottom-right causal
mask, so decoding over pages gives the same logits as the contiguous cache of one request alone.
"""

from __future__ import annotations

import numpy as np

from .._validate import fail, validate_positive_int
from ..attention import causal_mask
from ..heads import attend_heads
from .paged_cache import PagedKVCache


class PagedStore:
    """One :class:`~mha_course.PagedKVCache` per decoder layer, operated in lockstep.

    Parameters
    ----------
    decoder : Decoder
    n_blocks, block_size : int
        Blocks per layer's pool and positions per block.

    Examples
    --------
    >>> from mha_course.serving.decoder import Decoder
    >>> dec = Decoder.random(vocab=11, d_model=8, n_layers=2, h=2, rng=0)
    >>> store = PagedStore(dec, n_blocks=8, block_size=4)
    >>> seq = store.new_sequence()
    >>> dec.step([1, 2, 3, 4, 5], seq).shape, seq.block_table, store.free_blocks
    ((5, 11), [0, 1], 6)
    """

    def __init__(self, decoder, n_blocks: int, block_size: int):
        func = "PagedStore"
        self.decoder = decoder
        self.n_blocks = validate_positive_int(func, "n_blocks", n_blocks)
        self.block_size = validate_positive_int(func, "block_size", block_size)
        self.pools = [PagedKVCache(block.attn, self.n_blocks, self.block_size)
                      for block in decoder.blocks]

    @property
    def free_blocks(self) -> int:
        """Blocks on each pool's free list (the same in every layer)."""
        return self.pools[0].free_blocks

    @property
    def blocks_in_use(self) -> int:
        return self.pools[0].blocks_in_use

    def blocks_for(self, n_positions: int) -> int:
        """Blocks that hold ``n_positions`` positions: ``ceil(n / block_size)``."""
        return -(-int(n_positions) // self.block_size)

    def new_sequence(self, blocks=()) -> PagedSequence:
        """A new sequence, empty or starting on full shared ``blocks`` (a prefix-cache hit)."""
        blocks = [int(b) for b in blocks]
        ids = {pool.add_sequence(blocks) for pool in self.pools}
        if len(ids) != 1:
            raise fail("PagedStore.new_sequence", f"the layers' pools disagree on ids {ids}")
        return PagedSequence(self, ids.pop(), len(blocks) * self.block_size)

    def free(self, seq: PagedSequence) -> None:
        """The sequence is done: its blocks return to the pools unless something else holds them."""
        for pool in self.pools:
            pool.free(seq.seq_id)

    def retain(self, block: int) -> None:
        for pool in self.pools:
            pool.retain(block)

    def release(self, block: int) -> None:
        for pool in self.pools:
            pool.release(block)

    def ref_count(self, block: int) -> int:
        return self.pools[0].ref_count(block)

    def block_bytes(self, bytes_per_value: int | None = None) -> int:
        """Bytes of one block in all layers (keys and values); ``bytes_per_value`` overrides
        the pools' dtype (2 for bf16)."""
        per = sum(2 * p.n_kv_heads * p.d_k * self.block_size for p in self.pools)
        width = bytes_per_value or (self.pools[0].dtype.itemsize if self.pools[0].dtype else 8)
        return per * width


class PagedSequence:
    """One sequence in a :class:`PagedStore`, with the cache protocol of the decoder."""

    def __init__(self, store: PagedStore, seq_id: int, length: int = 0):
        self.store, self.seq_id, self.length = store, seq_id, length

    @property
    def block_table(self) -> list[int]:
        return self.store.pools[0].block_table(self.seq_id)

    def attend(self, layer: int, q, k, v):
        """Append the chunk's keys and values to this sequence's blocks and attend over them.

        q (h, T, d_k), k (g, T, d_k), v (g, T, d_v), unrotated -> heads (h, T, d_v).
        """
        attn = self.store.decoder.blocks[layer].attn
        pool = self.store.pools[layer]
        positions = self.length + np.arange(q.shape[-2])
        q, k = attn._rope(q, positions), attn._rope(k, positions)
        pool.append(self.seq_id, k, v)
        K, V = pool.gather(self.seq_id)  # (g, S, d_k), (g, S, d_v)
        return attend_heads(q, K, V, causal_mask(q.shape[-2], K.shape[-2]), attn.scale)[0]

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (in every layer)."""
        for pool in self.store.pools:
            pool.truncate(self.seq_id, length)
        self.length = length
