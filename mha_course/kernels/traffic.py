"""The bytes attention kernels move between a GPU's memory (HBM) and its chip: counted while
Triton's interpreter runs them, and in closed form.

Taught in ``notebooks/deep_dives/07c_triton_kernels.ipynb`` (lesson 07's deep dive, section 4:
FlashAttention's Theorem 2 on the kernels of :mod:`mha_course.kernels.triton_flash`).

- :func:`count_traffic`: the bytes every ``tl.load`` and ``tl.store`` moves while the
  interpreter runs kernels (masked-off elements not counted), in a :class:`Traffic`;
- :func:`flash_forward_bytes`, :func:`standard_attention_bytes`, :func:`flash_backward_bytes`:
  the closed forms that equal those counts for
  :func:`~mha_course.kernels.triton_flash.flash_forward`,
  :func:`~mha_course.kernels.triton_flash.standard_attention` and
  :func:`~mha_course.kernels.triton_flash.flash_backward`.

This module imports neither triton nor torch: the closed forms work without the ``kernels``
extra, and :func:`count_traffic` imports Triton's interpreter only when it starts counting.
(:mod:`mha_course.kernels.triton_flash` re-exports all five names, as before the split.)
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Traffic", "count_traffic", "flash_backward_bytes", "flash_forward_bytes",
           "standard_attention_bytes"]


@dataclass
class Traffic:
    """Bytes moved by ``tl.load`` (``loaded``) and ``tl.store`` (``stored``) inside
    :func:`count_traffic`; ``per_kernel`` maps each kernel's name to its ``[loaded, stored]``."""

    loaded: int = 0
    stored: int = 0
    per_kernel: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.loaded + self.stored


@contextlib.contextmanager
def count_traffic():
    """Count the bytes every ``tl.load`` and ``tl.store`` moves while kernels run inside it.

    Wraps the Triton interpreter's memory operations (its builder's masked load and store, which
    every ``tl.load``/``tl.store`` goes through): each adds the bytes of its *unmasked*
    elements, the ones a GPU would move between its memory (HBM) and the chip. Loads of
    masked-off elements (a tail block past the end) move nothing and count nothing. The
    interpreter must be running the kernels (no GPU, or ``TRITON_INTERPRET=1``); on a GPU use
    a profiler (Nsight Compute) instead. Counts nest: an inner ``with`` counts its kernels in
    both. (Tensor-descriptor loads, TMA, are not counted; these kernels use none.)

    Raises ``RuntimeError`` when the interpreter is off (``TRITON_INTERPRET`` is not ``"1"``;
    :mod:`~mha_course.kernels.triton_flash` turns it on when imported without a GPU) and
    ``ImportError`` without triton.

    >>> import torch
    >>> from mha_course.kernels.triton_flash import flash_forward
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(1, 1, 20, 16, generator=g) for _ in range(3))
    >>> with count_traffic() as traffic:
    ...     _ = flash_forward(q, k, v)
    >>> traffic.loaded, traffic.stored  # q once; k and v once per query block (2 blocks)
    (6400, 1360)
    >>> traffic.total == flash_forward_bytes(1, 1, 1, 20, 20, 16)
    True
    """
    if os.environ.get("TRITON_INTERPRET") != "1":  # checked before triton is imported
        raise RuntimeError("count_traffic: Triton's interpreter is off (TRITON_INTERPRET is not "
                           "1), so kernels run on a GPU: measure with a profiler there; without "
                           "a GPU, import mha_course.kernels.triton_flash first (it turns the "
                           "interpreter on)")
    try:
        from triton.runtime import interpreter
    except ImportError as exc:
        raise ImportError("count_traffic needs triton: pip install -e '.[kernels]' "
                          f"({exc})") from None

    builder, executor = interpreter.interpreter_builder, interpreter.GridExecutor
    traffic = Traffic()
    current = ["?"]

    def tally(kind: int, n_bytes: int) -> None:
        counts = traffic.per_kernel.setdefault(current[0], [0, 0])
        counts[kind] += n_bytes
        if kind == 0:
            traffic.loaded += n_bytes
        else:
            traffic.stored += n_bytes

    def load(ptrs, mask, *args, **kwargs):
        itemsize = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        tally(0, int(np.broadcast_to(mask.data, ptrs.data.shape).sum()) * itemsize)
        return original_load(ptrs, mask, *args, **kwargs)

    def store(ptrs, value, mask, *args, **kwargs):
        itemsize = value.data.dtype.itemsize
        tally(1, int(np.broadcast_to(mask.data, ptrs.data.shape).sum()) * itemsize)
        return original_store(ptrs, value, mask, *args, **kwargs)

    def run(self, *args, **kwargs):
        outer, current[0] = current[0], self.fn.__name__.lstrip("_")
        try:
            return original_run(self, *args, **kwargs)
        finally:
            current[0] = outer

    original_load, original_store = builder.create_masked_load, builder.create_masked_store
    original_run = executor.__call__
    outer = {name: vars(builder)[name] for name in ("create_masked_load", "create_masked_store")
             if name in vars(builder)}  # an enclosing count_traffic's, when nested
    builder.create_masked_load, builder.create_masked_store = load, store
    executor.__call__ = run
    try:
        yield traffic
    finally:
        del builder.create_masked_load, builder.create_masked_store  # back to the class's
        for name, method in outer.items():
            setattr(builder, name, method)
        executor.__call__ = original_run


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _causal_keys(T: int, S: int, t0: int, block_m: int, block_n: int) -> int:
    """Keys a causal program of queries [t0, t0 + block_m) loads: its key blocks up to the
    diagonal, whole blocks, but none past S."""
    hi = min(S, max(0, t0 + block_m + S - T))
    return min(S, _cdiv(hi, block_n) * block_n)


def flash_forward_bytes(B, h, g, T, S, d, *, causal=False, block_m=16, block_n=16,
                        itemsize=4):
    """Bytes :func:`~mha_course.kernels.triton_flash.flash_forward` moves, in closed form
    (equal to :func:`count_traffic`'s).

    Each program reads its query block once and writes its output block and lse once; it
    reads K and V once per query block. Without causal masking::

        itemsize · B·h · (2·T·d + T + 2 · ⌈T/block_m⌉ · S·d)

    i.e. Θ(N·d + N²·d/block_m) for T = S = N: FlashAttention's Theorem 2, Θ(N²d²/M), with an
    SRAM of M numbers holding blocks of block_m ~ M/d queries. With ``causal`` each query
    block reads only the key blocks up to its diagonal (about half for T = S). ``g`` does not
    appear: every query head reads its group's K/V block itself (only a cache shares them).

    >>> flash_forward_bytes(1, 1, 1, 20, 20, 16)  # 2 query blocks: k and v read twice
    7760
    >>> flash_forward_bytes(1, 1, 1, 20, 20, 16, causal=True)  # 16 keys, then 20
    7248
    """
    keys = (sum(_causal_keys(T, S, t0, block_m, block_n) for t0 in range(0, T, block_m))
            if causal else _cdiv(T, block_m) * S)
    return itemsize * B * h * (2 * T * d + T + 2 * keys * d)


def standard_attention_bytes(B, h, g, T, S, d, *, causal=False, block_m=16, block_n=16,
                             itemsize=4):
    """Bytes :func:`~mha_course.kernels.triton_flash.standard_attention` moves, in closed form
    (equal to the count)::

        itemsize · B·h · (4·T·S + ⌈S/block_n⌉·T·d + 2·⌈T/block_m⌉·S·d + T·d)

    the scores written and read back, the weights written and read back (4·T·S), q read once
    per key block, k once per query block, v once per query block, the output written. With
    blocks >= d the re-reads are at most 3·T·S: Θ(N·d + N²) for T = S = N, Theorem 2's
    standard attention. ``causal`` masks but skips nothing, so it changes no byte.
    """
    return itemsize * B * h * (4 * T * S + _cdiv(S, block_n) * T * d
                               + 2 * _cdiv(T, block_m) * S * d + T * d)


def flash_backward_bytes(B, h, g, T, S, d, *, causal=False, block_m=16, block_n=16,
                         itemsize=4):
    """Bytes :func:`~mha_course.kernels.triton_flash.flash_backward` moves, in closed form
    (equal to the count).

    ``D``: O and dO read, D written (2·T·d + T per head). dK/dV: each key block's K and V read
    and its dK, dV written once per K/V head (4·S·d per K/V head), and for every query block
    it visits, q, dO, lse and D read (2·d + 2 per query). dQ: q, dO, lse, D read and dQ
    written once (3·T·d + 2·T per head), K and V read once per query block as in the forward.
    Without causal masking, T = S = N: Θ(N·d + N²·d/block) as the forward.
    """
    if causal:
        rows = sum(max(0, T - max(0, s0 - (S - T)) // block_m * block_m)
                   for s0 in range(0, S, block_n))
        keys = sum(_causal_keys(T, S, t0, block_m, block_n) for t0 in range(0, T, block_m))
    else:
        rows, keys = _cdiv(S, block_n) * T, _cdiv(T, block_m) * S
    per_q_head = (2 * T * d + T) + rows * (2 * d + 2) + (3 * T * d + 2 * T) + 2 * keys * d
    return itemsize * (B * h * per_q_head + B * g * 4 * S * d)
