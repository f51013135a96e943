"""FlashAttention-2 in Triton: the forward and backward kernels a GPU runs, and their traffic.

Taught in ``notebooks/deep_dives/07c_triton_kernels.ipynb`` (lesson 07's deep dive). Lesson 07
writes FlashAttention-2's loop in NumPy (:func:`mha_course.kernels.tiled.tiled_attention`); here
the same loop is a Triton kernel: one *program* per (batch, query head, block of queries), its
query block held in fast on-chip memory (SRAM) while it walks the key/value blocks. The same
source compiles for a GPU unchanged; without one, Triton's interpreter runs it on the CPU with
torch CPU tensors, slowly: importing this module on a machine without CUDA sets
``TRITON_INTERPRET=1`` (unless it is already set) before the kernels are defined
(``INTERPRETED`` says which way they run).

- :func:`flash_forward`: ``(o, lse)``, causal or not (bottom-right aligned when T != S), grouped
  query attention by program id (query head ``i`` reads K/V head ``i // (h // g)``, K and V are
  never copied), any lengths (the tail blocks are masked), the log-sum-exp saved;
- :func:`flash_backward`: ``(dq, dk, dv)`` from the saved log-sum-exp and
  ``D = rowsum(dO ∘ O)``, the weights recomputed tile by tile and never stored;
- :func:`standard_attention`: attention as three kernels that write the (T, S) scores and
  weights to memory and read them back, the baseline of the traffic count;
- :func:`count_traffic`: the bytes every ``tl.load`` and ``tl.store`` moves while the
  interpreter runs kernels (masked-off elements not counted), and the closed forms
  :func:`standard_attention_bytes`, :func:`flash_forward_bytes` and
  :func:`flash_backward_bytes` that equal those counts (FlashAttention's Theorem 2, on these
  kernels).

Needs the ``kernels`` extra (``pip install -e '.[kernels]'``: triton and torch); ``import
mha_course`` never imports this module. Shapes: q (B, h, T, d), k and v (B, g, S, d), float32.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field

from .._validate import fail, fmt_shape

try:
    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # no GPU: the interpreter runs the kernels
    import triton
    import triton.language as tl
except ImportError as _exc:  # the extra is not installed: the module imports, the kernels refuse
    HAS_TRITON = False
    _IMPORT_ERROR: ImportError | None = _exc
else:
    HAS_TRITON = True
    _IMPORT_ERROR = None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

KERNELS_MISSING = (
    "mha_course.kernels.triton_flash needs triton and torch: pip install -e '.[kernels]'"
)


def require_triton() -> None:
    """Raise a clear ``ImportError`` when triton or torch is missing.

    >>> require_triton() if HAS_TRITON else None
    """
    if not HAS_TRITON:
        raise ImportError(f"{KERNELS_MISSING} ({_IMPORT_ERROR})")


if HAS_TRITON:

    @triton.jit
    def _flash_fwd_kernel(
        Q, K, V, O, LSE, sm_scale,
        sqb, sqh, sqt, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
        sob, soh, sot, sod, slb, slh, slt,
        H, G, T, S, D,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # One program: one block of BLOCK_M queries of one (batch, query head).
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        hq = pid_bh % H
        hk = hq // (H // G)  # grouped query attention: the K/V head this query head reads
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        row_ok = offs_m < T
        d_ok = offs_d < D
        q = tl.load(Q + b * sqb + hq * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        k_base = K + b * skb + hk * skh
        v_base = V + b * svb + hk * svh
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp(x - m)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running sum of exp(x - m) v
        hi = S
        if CAUSAL:  # causal early exit: key blocks wholly in the future are never visited
            hi = tl.minimum(S, tl.maximum(0, (pid_m + 1) * BLOCK_M + S - T))
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < S
            kt = tl.load(k_base + cols[None, :] * sks + offs_d[:, None] * skd,
                         mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
            s = tl.dot(q, kt, input_precision="ieee") * sm_scale
            ok = row_ok[:, None] & col_ok[None, :]
            if CAUSAL:  # bottom-right: query t sees key s iff s <= t + S - T
                ok = ok & (cols[None, :] <= offs_m[:, None] + (S - T))
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: no NaN
            p = tl.exp(s - shift[:, None])
            alpha = tl.exp(m_i - shift)  # rescale what was accumulated under the old max
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :] * svd,
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            m_i = m_new
        # a query that saw no allowed key: l = 0, acc = 0, output 0 and lse = -inf
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        lse = tl.where(l_i == 0.0, float("-inf"),
                       tl.where(m_i == float("-inf"), 0.0, m_i) + tl.log(l_safe))
        tl.store(O + b * sob + hq * soh + offs_m[:, None] * sot + offs_d[None, :] * sod, out,
                 mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE + b * slb + hq * slh + offs_m * slt, lse, mask=row_ok)


def _check_block(func: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value & (value - 1):
        raise fail(func, f"{name} is {value!r}; expected a power of two >= 16 (tl.dot's minimum)")
    return value


def _check_tensor(func: str, name: str, x, ndim: int, letters: str):
    if not isinstance(x, torch.Tensor):
        raise fail(func, f"{name} is a {type(x).__name__}; expected a torch tensor {letters}")
    if x.ndim != ndim:
        raise fail(func, f"{name} has shape {fmt_shape(x.shape)}; expected {letters}")
    if x.dtype != torch.float32:
        raise fail(func, f"{name} has dtype {x.dtype}; expected torch.float32")
    return x


def _check_qkv(func: str, q, k, v):
    """The shapes of q (B, h, T, d), k and v (B, g, S, d) with h % g == 0; returns them."""
    _check_tensor(func, "q", q, 4, "(B, h, T, d)")
    _check_tensor(func, "k", k, 4, "(B, g, S, d)")
    _check_tensor(func, "v", v, 4, "(B, g, S, d)")
    B, h, T, d = q.shape
    _, g, S, _ = k.shape
    if k.shape[0] != B or k.shape[3] != d or g < 1 or h % g:
        raise fail(func, f"k has shape {fmt_shape(k.shape)}; expected (B, g, S, d) with B={B}, "
                         f"d={d} (from q) and g dividing h={h}")
    if tuple(v.shape) != tuple(k.shape):
        raise fail(func, f"v has shape {fmt_shape(v.shape)}; expected (B, g, S, d) = "
                         f"{fmt_shape(k.shape)} (from k)")
    if T < 1 or S < 1 or d < 1:
        raise fail(func, f"q has shape {fmt_shape(q.shape)} and k {fmt_shape(k.shape)}; "
                         "expected T, S and d >= 1")
    if not (q.device == k.device == v.device):
        raise fail(func, f"q, k, v are on {q.device}, {k.device}, {v.device}; expected one device")
    return B, h, g, T, S, d


def flash_forward(q, k, v, *, causal=False, block_m=16, block_n=16):
    """FlashAttention-2's forward in Triton: ``(o, lse)`` without the (T, S) matrix.

    One program per (block of ``block_m`` queries, batch × query head): it loads its query
    block once, walks the key/value blocks of ``block_n`` keys with an online softmax (the
    running max ``m``, sum ``l`` and unnormalised output, rescaled by ``exp(m_old - m_new)``
    when the max moves), and writes its output block and log-sum-exp once.

    Parameters
    ----------
    q : torch.Tensor, float32, shape (B, h, T, d)
    k, v : torch.Tensor, float32, shape (B, g, S, d)
        ``g`` K/V heads, ``g`` dividing ``h``: query head ``i`` reads K/V head ``i // (h // g)``
        (grouped query attention; g = h is multi-head, g = 1 multi-query).
    causal : bool, default False
        Query ``t`` sees key ``s`` iff ``s <= t + S - T`` (the queries are the last T of S
        positions, as :func:`mha_course.causal_mask`). Key blocks wholly in the future are
        skipped. With T > S the first T - S queries see no key: output 0, lse ``-inf``.
    block_m, block_n : int, default 16
        Queries and keys per tile: powers of two >= 16. Any lengths T, S work (tail blocks are
        masked); any d works (padded to a power of two >= 16 inside the kernel).

    Returns
    -------
    o : torch.Tensor, float32, shape (B, h, T, d)
    lse : torch.Tensor, float32, shape (B, h, T)
        Natural-log log-sum-exp of each query's scaled (1/√d), masked scores.

    Raises
    ------
    ImportError
        Without triton and torch (the ``kernels`` extra).
    ValueError
        Naming ``flash_forward``, the argument, its shape and the shape expected.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(1, 2, 5, 16, generator=g)
    >>> k, v = torch.randn(1, 1, 7, 16, generator=g), torch.randn(1, 1, 7, 16, generator=g)
    >>> o, lse = flash_forward(q, k, v, causal=True)
    >>> o.shape, lse.shape
    (torch.Size([1, 2, 5, 16]), torch.Size([1, 2, 5]))
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     q, k.expand(1, 2, 7, 16), v.expand(1, 2, 7, 16),
    ...     attn_mask=torch.ones(5, 7, dtype=torch.bool).tril(2))
    >>> bool(torch.allclose(o, ref, atol=1e-5))
    True
    """
    func = "flash_forward"
    require_triton()
    B, h, g, T, S, d = _check_qkv(func, q, k, v)
    block_m = _check_block(func, "block_m", block_m)
    block_n = _check_block(func, "block_n", block_n)
    o = torch.empty((B, h, T, d), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, h, T), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(T, block_m), B * h)
    _flash_fwd_kernel[grid](
        q, k, v, o, lse, 1.0 / math.sqrt(d),
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        h, g, T, S, d,
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
    )
    return o, lse


def flash_backward(q, k, v, o, lse, do, *, causal=False, block_m=16, block_n=16):
    """FlashAttention-2's backward in Triton: ``(dq, dk, dv)`` (being written)."""
    require_triton()
    raise NotImplementedError("flash_backward: not written yet")


@dataclass
class Traffic:
    """Bytes moved by ``tl.load`` (``loaded``) and ``tl.store`` (``stored``), per kernel too."""

    loaded: int = 0
    stored: int = 0
    per_kernel: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.loaded + self.stored


@contextlib.contextmanager
def count_traffic():
    """Count the bytes the interpreter's loads and stores move inside the ``with`` block (being
    written)."""
    require_triton()
    traffic = Traffic()
    yield traffic
