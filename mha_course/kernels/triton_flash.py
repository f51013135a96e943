"""FlashAttention-2 in Triton: the forward and backward kernels a GPU runs, and their traffic.

Taught in ``notebooks/deep_dives/07c_triton_kernels.ipynb`` (lesson 07's deep dive). Lesson 07
writes FlashAttention-2's loop in NumPy (:func:`mha_course.kernels.tiled.tiled_attention`); here
the same loop is a Triton kernel: one *program* per (batch, query head, block of queries), its
query block held in fast on-chip memory (SRAM) while it walks the key/value blocks. The same
source compiles for a GPU unchanged; without one, Triton's interpreter runs it on the CPU with
torch CPU tensors, slowly: importing this module on a machine without CUDA sets
``TRITON_INTERPRET=1`` (unless it is already set) before the kernels are defined
(``INTERPRETED`` says which way they run; the import and the argument checks are in
:mod:`mha_course.kernels.triton_common`).

- :func:`flash_forward`: ``(o, lse)``, causal or not (bottom-right aligned when T != S), grouped
  query attention by program id (query head ``i`` reads K/V head ``i // (h // g)``, K and V are
  never copied), any lengths (the tail blocks are masked), the log-sum-exp saved;
- :func:`flash_backward`: ``(dq, dk, dv)`` from the saved log-sum-exp and
  ``D = rowsum(dO ∘ O)``, the weights recomputed tile by tile and never stored;
- :func:`standard_attention`: attention as three kernels that write the (T, S) scores and
  weights to memory and read them back, the baseline of the traffic count;
- the bytes these kernels move, counted in the interpreter (``count_traffic``) and in closed
  form (``flash_forward_bytes``, ``standard_attention_bytes``, ``flash_backward_bytes``), live in
  :mod:`mha_course.kernels.traffic` (no triton needed) and are re-exported here;
- ``compile_for_gpu``: the same kernels compiled by Triton for an NVIDIA GPU, without one:
  their PTX, and the shared memory, warps and pipelining stages of a launch; it lives in
  :mod:`mha_course.kernels.triton_compile` and is re-exported here.

Needs the ``kernels`` extra (``pip install -e '.[kernels]'``: triton and torch); ``import
mha_course`` never imports this module. Shapes: q (B, h, T, d), k and v (B, g, S, d), float32.
"""

from __future__ import annotations

import math

from .traffic import (  # noqa: F401  (re-exported: lesson 07c and the tests import them here)
    Traffic,
    count_traffic,
    flash_backward_bytes,
    flash_forward_bytes,
    standard_attention_bytes,
)
from .triton_common import (  # noqa: F401  (HAS_TRITON, INTERPRETED, ...: re-exported)
    HAS_TRITON,
    IMPORT_ERROR,
    INTERPRETED,
    KERNELS_MISSING,
    block_d,
    check_block,
    check_like,
    check_qkv,
    launch_options,
    require_triton,
    tl,
    torch,
    triton,
)
from .triton_compile import GpuBuild, compile_for_gpu  # noqa: F401  (re-exported)

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


    @triton.jit
    def _bwd_preprocess_kernel(O, DO, DELTA, sob, soh, sot, sod, sdb, sdh, sdt, sdd,
                               H, T, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        # D = rowsum(dO * O), one number per query: the softmax backward's correction term
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        hq = pid_bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        ok = (offs_m < T)[:, None] & (offs_d < D)[None, :]
        o = tl.load(O + b * sob + hq * soh + offs_m[:, None] * sot + offs_d[None, :] * sod,
                    mask=ok, other=0.0)
        do = tl.load(DO + b * sdb + hq * sdh + offs_m[:, None] * sdt + offs_d[None, :] * sdd,
                     mask=ok, other=0.0)
        tl.store(DELTA + pid_bh * T + offs_m, tl.sum(o * do, 1), mask=offs_m < T)

    @triton.jit
    def _bwd_dkdv_kernel(
        Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale,
        sqb, sqh, sqt, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
        sdb, sdh, sdt, sdd, slb, slh, slt,
        H, G, T, S, D,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # One program: one block of BLOCK_N keys of one (batch, K/V head). It loops over the
        # group's query heads and their query blocks, so dK and dV are summed over the group
        # in registers and written once: no atomics.
        pid_n = tl.program_id(0)
        pid_bg = tl.program_id(1)
        b = pid_bg // G
        hk = pid_bg % G
        group = H // G
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m0 = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        col_ok = offs_n < S
        d_ok = offs_d < D
        kv_ok = col_ok[:, None] & d_ok[None, :]
        k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :] * skd,
                    mask=kv_ok, other=0.0)
        v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :] * svd,
                    mask=kv_ok, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        lo = 0
        if CAUSAL:  # query blocks wholly before this key block's first key see none of it
            lo = tl.maximum(0, pid_n * BLOCK_N - (S - T)) // BLOCK_M * BLOCK_M
        for j in range(0, group):
            hq = hk * group + j
            for start_m in range(lo, T, BLOCK_M):
                offs_m = start_m + offs_m0
                row_ok = offs_m < T
                q_ok = row_ok[:, None] & d_ok[None, :]
                q = tl.load(Q + b * sqb + hq * sqh + offs_m[:, None] * sqt
                            + offs_d[None, :] * sqd, mask=q_ok, other=0.0)
                do = tl.load(DO + b * sdb + hq * sdh + offs_m[:, None] * sdt
                             + offs_d[None, :] * sdd, mask=q_ok, other=0.0)
                lse = tl.load(LSE + b * slb + hq * slh + offs_m * slt, mask=row_ok, other=0.0)
                delta = tl.load(DELTA + (b * H + hq) * T + offs_m, mask=row_ok, other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
                ok = row_ok[:, None] & col_ok[None, :]
                if CAUSAL:
                    ok = ok & (offs_n[None, :] <= offs_m[:, None] + (S - T))
                # the weights, recomputed from the saved lse (never stored); a query with no
                # allowed key has lse = -inf and weights 0
                lse = tl.where(lse == float("-inf"), 0.0, lse)
                p = tl.exp(tl.where(ok, s, float("-inf")) - lse[:, None])
                dv += tl.dot(tl.trans(p), do, input_precision="ieee")
                dp = tl.dot(do, tl.trans(v), input_precision="ieee")
                ds = p * (dp - delta[:, None])
                dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
        tl.store(DK + pid_bg * S * D + offs_n[:, None] * D + offs_d[None, :], dk * sm_scale,
                 mask=kv_ok)
        tl.store(DV + pid_bg * S * D + offs_n[:, None] * D + offs_d[None, :], dv, mask=kv_ok)

    @triton.jit
    def _bwd_dq_kernel(
        Q, K, V, DO, LSE, DELTA, DQ, sm_scale,
        sqb, sqh, sqt, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
        sdb, sdh, sdt, sdd, slb, slh, slt,
        H, G, T, S, D,
        CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # One program: one block of BLOCK_M queries of one (batch, query head), walking the
        # key blocks as the forward does.
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        hq = pid_bh % H
        hk = hq // (H // G)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n0 = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        row_ok = offs_m < T
        d_ok = offs_d < D
        q_ok = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + b * sqb + hq * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                    mask=q_ok, other=0.0)
        do = tl.load(DO + b * sdb + hq * sdh + offs_m[:, None] * sdt + offs_d[None, :] * sdd,
                     mask=q_ok, other=0.0)
        lse = tl.load(LSE + b * slb + hq * slh + offs_m * slt, mask=row_ok, other=0.0)
        lse = tl.where(lse == float("-inf"), 0.0, lse)
        delta = tl.load(DELTA + pid_bh * T + offs_m, mask=row_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        hi = S
        if CAUSAL:
            hi = tl.minimum(S, tl.maximum(0, (pid_m + 1) * BLOCK_M + S - T))
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            col_ok = offs_n < S
            kv_ok = col_ok[:, None] & d_ok[None, :]
            k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :] * skd,
                        mask=kv_ok, other=0.0)
            v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :] * svd,
                        mask=kv_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
            ok = row_ok[:, None] & col_ok[None, :]
            if CAUSAL:
                ok = ok & (offs_n[None, :] <= offs_m[:, None] + (S - T))
            p = tl.exp(tl.where(ok, s, float("-inf")) - lse[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds, k, input_precision="ieee")
        tl.store(DQ + pid_bh * T * D + offs_m[:, None] * D + offs_d[None, :], dq * sm_scale,
                 mask=q_ok)

    @triton.jit
    def _std_scores_kernel(Q, K, SC, sm_scale, sqb, sqh, sqt, sqd, skb, skh, sks, skd,
                           H, G, T, S, D, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        # standard attention, step 1: one (BLOCK_M, BLOCK_N) tile of scores, written out
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        pid_bh = tl.program_id(2)
        b = pid_bh // H
        hq = pid_bh % H
        hk = hq // (H // G)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        row_ok = offs_m < T
        col_ok = offs_n < S
        d_ok = offs_d < D
        q = tl.load(Q + b * sqb + hq * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        kt = tl.load(K + b * skb + hk * skh + offs_n[None, :] * sks + offs_d[:, None] * skd,
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision="ieee") * sm_scale
        if CAUSAL:
            s = tl.where(offs_n[None, :] <= offs_m[:, None] + (S - T), s, float("-inf"))
        tl.store(SC + pid_bh * T * S + offs_m[:, None] * S + offs_n[None, :], s,
                 mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit
    def _std_softmax_kernel(SC, P, T, S, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
        # step 2: read a block of whole rows of scores, write their weights
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_s = tl.arange(0, BLOCK_S)
        ok = (offs_m < T)[:, None] & (offs_s < S)[None, :]
        ptrs = pid_bh * T * S + offs_m[:, None] * S + offs_s[None, :]
        s = tl.load(SC + ptrs, mask=ok, other=float("-inf"))
        m = tl.max(s, 1)
        e = tl.exp(s - tl.where(m == float("-inf"), 0.0, m)[:, None])
        total = tl.sum(e, 1)
        tl.store(P + ptrs, e / tl.where(total == 0.0, 1.0, total)[:, None], mask=ok)

    @triton.jit
    def _std_pv_kernel(P, V, O, svb, svh, svs, svd, H, G, T, S, D, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        # step 3: read the weights back, block by block of keys, times V
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        hk = (pid_bh % H) // (H // G)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n0 = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        row_ok = offs_m < T
        d_ok = offs_d < D
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start_n in range(0, S, BLOCK_N):
            offs_n = start_n + offs_n0
            col_ok = offs_n < S
            p = tl.load(P + pid_bh * T * S + offs_m[:, None] * S + offs_n[None, :],
                        mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :] * svd,
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            acc += tl.dot(p, v, input_precision="ieee")
        tl.store(O + pid_bh * T * D + offs_m[:, None] * D + offs_d[None, :], acc,
                 mask=row_ok[:, None] & d_ok[None, :])


def flash_forward(q, k, v, *, causal=False, block_m=16, block_n=16, num_warps=None,
                  num_stages=None):
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
    num_warps, num_stages : int, optional
        On a GPU: the warps that share one program's block, and the software-pipelining stages
        (how many K/V blocks are in flight in shared memory while one is computed on); Triton's
        defaults when omitted. The interpreter ignores them.

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
    B, h, g, T, S, d = check_qkv(func, q, k, v)
    block_m = check_block(func, "block_m", block_m)
    block_n = check_block(func, "block_n", block_n)
    o = torch.empty((B, h, T, d), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, h, T), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(T, block_m), B * h)
    _flash_fwd_kernel[grid](
        q, k, v, o, lse, 1.0 / math.sqrt(d),
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        h, g, T, S, d,
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d(d),
        **launch_options(func, num_warps, num_stages),
    )
    return o, lse


def flash_backward(q, k, v, o, lse, do, *, causal=False, block_m=16, block_n=16,
                   num_warps=None, num_stages=None):
    """FlashAttention-2's backward in Triton: ``(dq, dk, dv)`` from the saved log-sum-exp.

    Three kernels. A small one computes ``D = rowsum(dO ∘ O)`` per query (the term the softmax
    backward subtracts: ``dS = P ∘ (dP - D)`` with ``dP = dO Vᵀ``). Then one program per (key
    block, batch × K/V head) holds its K and V block, loops over the query heads of its group
    and their query blocks, recomputes each tile of weights ``P = exp(scores - lse)`` (never
    stored) and accumulates ``dV += Pᵀ dO`` and ``dK += dSᵀ Q / √d``: the group's sum is made
    in registers and written once, with no atomics. Last one program per (query block, batch ×
    query head) walks the key blocks as the forward does for ``dQ += dS K / √d``.

    Parameters
    ----------
    q, k, v : torch.Tensor
        As :func:`flash_forward`.
    o, lse : torch.Tensor, shapes (B, h, T, d) and (B, h, T)
        :func:`flash_forward`'s outputs for these inputs.
    do : torch.Tensor, shape (B, h, T, d)
        dLoss/do.
    causal, block_m, block_n, num_warps, num_stages
        As :func:`flash_forward` (the same ``causal``; the blocks may differ).

    Returns
    -------
    dq : torch.Tensor, shape (B, h, T, d)
    dk, dv : torch.Tensor, shape (B, g, S, d)
        Summed over the ``h // g`` query heads that share each K/V head.

    Raises
    ------
    ImportError, ValueError
        As :func:`flash_forward` (``ValueError`` naming ``flash_backward``).

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(1, 2, 5, 16, generator=g, requires_grad=True)
    >>> k = torch.randn(1, 1, 7, 16, generator=g, requires_grad=True)
    >>> v = torch.randn(1, 1, 7, 16, generator=g, requires_grad=True)
    >>> o, lse = flash_forward(q.detach(), k.detach(), v.detach())
    >>> do = torch.randn(1, 2, 5, 16, generator=g)
    >>> dq, dk, dv = flash_backward(q.detach(), k.detach(), v.detach(), o, lse, do)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     q, k.expand(1, 2, 7, 16), v.expand(1, 2, 7, 16))
    >>> ref.backward(do)
    >>> [bool(torch.allclose(a, b.grad, atol=1e-5)) for a, b in ((dq, q), (dk, k), (dv, v))]
    [True, True, True]
    """
    func = "flash_backward"
    require_triton()
    B, h, g, T, S, d = check_qkv(func, q, k, v)
    check_like(func, "o", o, (B, h, T, d), "(B, h, T, d)", q.device)
    check_like(func, "lse", lse, (B, h, T), "(B, h, T)", q.device)
    check_like(func, "do", do, (B, h, T, d), "(B, h, T, d)", q.device)
    block_m = check_block(func, "block_m", block_m)
    block_n = check_block(func, "block_n", block_n)
    bd, scale = block_d(d), 1.0 / math.sqrt(d)
    delta = torch.empty((B, h, T), dtype=torch.float32, device=q.device)
    _bwd_preprocess_kernel[(triton.cdiv(T, block_m), B * h)](
        o, do, delta, *o.stride(), *do.stride(), h, T, d, BLOCK_M=block_m, BLOCK_D=bd)
    dq = torch.empty((B, h, T, d), dtype=torch.float32, device=q.device)
    dk = torch.empty((B, g, S, d), dtype=torch.float32, device=q.device)
    dv = torch.empty((B, g, S, d), dtype=torch.float32, device=q.device)
    common = dict(CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=bd,
                  **launch_options(func, num_warps, num_stages))
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *lse.stride())
    _bwd_dkdv_kernel[(triton.cdiv(S, block_n), B * g)](
        q, k, v, do, lse, delta, dk, dv, scale, *strides, h, g, T, S, d, **common)
    _bwd_dq_kernel[(triton.cdiv(T, block_m), B * h)](
        q, k, v, do, lse, delta, dq, scale, *strides, h, g, T, S, d, **common)
    return dq, dk, dv


def standard_attention(q, k, v, *, causal=False, block_m=16, block_n=16):
    """Standard attention as three Triton kernels that write the (T, S) matrices to memory.

    The baseline of the traffic count (FlashAttention's Algorithm 0): one kernel writes the
    scores tile by tile, one reads them back a block of rows at a time and writes the weights,
    one reads the weights back with V and writes the output. Same shapes and arguments as
    :func:`flash_forward` (causal masks the scores; nothing is skipped); returns ``o``.

    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(1, 2, 9, 16, generator=g) for _ in range(3))
    >>> bool(torch.allclose(standard_attention(q, k, v, causal=True),
    ...                     flash_forward(q, k, v, causal=True)[0], atol=1e-5))
    True
    """
    func = "standard_attention"
    require_triton()
    B, h, g, T, S, d = check_qkv(func, q, k, v)
    block_m = check_block(func, "block_m", block_m)
    block_n = check_block(func, "block_n", block_n)
    bd = block_d(d)
    scores = torch.empty((B, h, T, S), dtype=torch.float32, device=q.device)
    weights = torch.empty_like(scores)
    o = torch.empty((B, h, T, d), dtype=torch.float32, device=q.device)
    _std_scores_kernel[(triton.cdiv(T, block_m), triton.cdiv(S, block_n), B * h)](
        q, k, scores, 1.0 / math.sqrt(d), *q.stride(), *k.stride(), h, g, T, S, d,
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=bd)
    _std_softmax_kernel[(triton.cdiv(T, block_m), B * h)](
        scores, weights, T, S, BLOCK_M=block_m, BLOCK_S=max(16, triton.next_power_of_2(S)))
    _std_pv_kernel[(triton.cdiv(T, block_m), B * h)](
        weights, v, o, *v.stride(), h, g, T, S, d, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=bd)
    return o
