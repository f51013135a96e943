"""Tensor-parallel and ring attention on real processes, with ``torch.distributed`` (gloo).

Taught in ``notebooks/appendix_distributed.ipynb``, the PyTorch appendix of
``notebooks/11_parallel.ipynb``.

:func:`run` starts ``p`` processes on this machine (``torch.multiprocessing``, the spawn start
method), which join one gloo process group over TCP on 127.0.0.1 and each run :func:`worker`:

1. **tensor parallelism**: rank ``r`` holds its heads of a
   :class:`~mha_course.MultiHeadAttention` layer (the shards of
   :class:`~mha_course.parallel.tensor.TensorParallelAttention`, as torch tensors), computes its
   term of ``concat @ W_o`` with torch operations, and the terms are summed twice: by gloo's own
   ``dist.all_reduce``, and by a ring all-reduce written with ``dist.send`` / ``dist.recv``;
2. **ring attention**: rank ``r`` holds block ``r`` of a causal sequence's queries, keys and
   values, attends with its queries to the block it holds, merges by log-sum-exp, and passes the
   key and value blocks on with ``dist.isend`` / ``dist.irecv``.

gloo counts no bytes, so the bytes each rank sent are counted around its point-to-point calls:
every ``send`` / ``isend`` adds ``tensor.numel() * tensor.element_size()`` to the rank's
counter. The ring all-reduce is there for that count (gloo's ``all_reduce`` picks its own
algorithm and reports nothing); the two sums are compared. Each rank writes its results to
``rank<r>.npz`` in a temporary folder that :func:`run` reads back.

PyTorch is imported inside the functions (``import mha_course`` must not load it); without
PyTorch only :func:`run` fails, with an ``ImportError`` that says what to install.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import MultiHeadAttention
from .._validate import fail, validate_positive_int
from .ring import sequence_layout
from .tensor import TensorParallelAttention

#: The problem every rank rebuilds from the seed: the layer and the ring's sequence.
D_MODEL, HEADS, KV_HEADS, TOKENS = 16, 8, 4, 12
RING_HEADS, RING_D = 2, 4


def problem(seed: int, p: int):
    """The layer, its input and the ring's q, k, v, identical in every process (seeded)."""
    rng = np.random.default_rng(seed)
    layer = MultiHeadAttention(D_MODEL, HEADS, n_kv_heads=KV_HEADS, rng=rng)
    x = rng.normal(size=(TOKENS, D_MODEL))
    T = 6 * p
    q, k, v = (rng.normal(size=(RING_HEADS, T, RING_D)) for _ in range(3))
    return layer, x, (q, k, v)


def _torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:  # pragma: no cover - exercised without torch only
        raise ImportError("the appendix needs PyTorch: pip install -e '.[reference]'") from exc
    return torch, dist


class _Counter:
    """Bytes this rank handed to point-to-point sends."""

    def __init__(self):
        self.sent = 0

    def send(self, dist, tensor, dst):
        self.sent += tensor.numel() * tensor.element_size()
        dist.send(tensor, dst)

    def isend(self, dist, tensor, dst):
        self.sent += tensor.numel() * tensor.element_size()
        return dist.isend(tensor, dst)


def ring_all_reduce(torch, dist, tensor, counter):
    """The ring all-reduce of :meth:`~mha_course.parallel.collectives.Cluster.all_reduce`, with
    ``dist.send`` / ``dist.recv``: a reduce-scatter, then an all-gather, one chunk per step."""
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in torch.tensor_split(tensor.reshape(-1), p)]
    right, left = (rank + 1) % p, (rank - 1) % p
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(p - 1):
            out_c = (rank - 1 - step) % p if phase == "reduce-scatter" else (rank - step) % p
            in_c = (out_c - 1) % p
            incoming = torch.empty_like(chunks[in_c])
            if rank % 2 == 0:  # even ranks send first, odd ranks receive first: no deadlock
                counter.send(dist, chunks[out_c], right)
                dist.recv(incoming, left)
            else:
                dist.recv(incoming, left)
                counter.send(dist, chunks[out_c], right)
            chunks[in_c] = chunks[in_c] + incoming if phase == "reduce-scatter" else incoming
    return torch.cat(chunks).reshape(tensor.shape)


def _attend(torch, q, k, v, mask):
    """Attention and log-sum-exp of one block, in torch (mask: True = may attend)."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf for a query with no key
    weights = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return weights @ v, lse


def worker(rank: int, p: int, port: int, folder: str, seed: int, fail_rank=None) -> None:
    """One process of :func:`run`: tensor-parallel attention, then ring attention.

    ``fail_rank`` makes that rank raise at the start (to test that :func:`run` stops the
    others)."""
    torch, dist = _torch()
    torch.set_num_threads(1)
    if rank == fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=p, timeout=datetime.timedelta(seconds=60))
    try:
        layer, x, (q, k, v) = problem(seed, p)
        counter = _Counter()
        # 1. tensor parallelism: this rank's heads, its term, then the sums
        shard = TensorParallelAttention(layer, p).shards[rank]
        tx = torch.from_numpy(x)
        hl, gl, dk = shard.h, shard.n_kv_heads, shard.d_k
        qh = (tx @ torch.from_numpy(shard.W_q)).reshape(TOKENS, hl, dk).transpose(0, 1)
        kh = (tx @ torch.from_numpy(shard.W_k)).reshape(TOKENS, gl, dk).transpose(0, 1)
        vh = (tx @ torch.from_numpy(shard.W_v)).reshape(TOKENS, gl, dk).transpose(0, 1)
        kh, vh = (a.repeat_interleave(hl // gl, dim=0) for a in (kh, vh))  # GQA groups
        causal = torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril()
        heads, _ = _attend(torch, qh, kh, vh, causal)
        partial = heads.transpose(0, 1).reshape(TOKENS, hl * dk) @ torch.from_numpy(shard.W_o)
        by_gloo = partial.clone()
        dist.all_reduce(by_gloo)  # gloo's own algorithm
        by_ring = ring_all_reduce(torch, dist, partial, counter)
        tp_bytes = counter.sent
        # 2. ring attention over a causal sequence, block `rank` of p contiguous blocks
        pos = sequence_layout(q.shape[-2], p)
        mine = torch.from_numpy(pos[rank])
        qb = torch.from_numpy(q[:, pos[rank]])
        kb, vb = (torch.from_numpy(np.ascontiguousarray(a[:, pos[rank]])) for a in (k, v))
        out = lse = None
        for step in range(p):
            src = (rank - step) % p
            keys = torch.from_numpy(pos[src])
            mask = keys[None, :] <= mine[:, None]
            if mask.any():  # a block wholly in the future is skipped
                o, l_ = _attend(torch, qb, kb, vb, mask)
                if out is None:
                    out, lse = o, l_
                else:  # merge by log-sum-exp
                    new = torch.logaddexp(lse, l_)
                    out = torch.exp(lse - new)[..., None] * out + torch.exp(l_ - new)[..., None] * o
                    lse = new
            if step < p - 1:
                k_in, v_in = torch.empty_like(kb), torch.empty_like(vb)
                reqs = [counter.isend(dist, kb, (rank + 1) % p),
                        counter.isend(dist, vb, (rank + 1) % p),
                        dist.irecv(k_in, (rank - 1) % p), dist.irecv(v_in, (rank - 1) % p)]
                for r in reqs:
                    r.wait()
                kb, vb = k_in, v_in
        np.savez(Path(folder) / f"rank{rank}.npz", tp_gloo=by_gloo.numpy(),
                 tp_ring=by_ring.numpy(), tp_bytes=tp_bytes, ring_out=out.numpy(),
                 ring_lse=lse.numpy(), ring_bytes=counter.sent - tp_bytes)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for the process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(p: int, seed: int = 0, timeout: float = 120.0, start_method=None, fail_rank=None) -> dict:
    """Start ``p`` processes running :func:`worker`; return what each rank wrote.

    ``start_method`` defaults to ``"fork"`` on Linux (the children share the parent's imported
    PyTorch: a second, not the ten a fresh ``import torch`` can take on a busy machine) and
    ``"spawn"`` elsewhere (macOS and Windows).

    Returns a dict of lists, one entry per rank: ``"tp_gloo"`` and ``"tp_ring"`` (the layer's
    output after gloo's all-reduce and after the ring all-reduce), ``"tp_bytes"`` (bytes the rank
    sent in the ring all-reduce), ``"ring_out"``, ``"ring_lse"`` (its block of the ring
    attention's output and log-sum-exp) and ``"ring_bytes"`` (bytes it sent passing K/V).

    Every process is stopped before this returns, also when one fails or the run takes longer
    than ``timeout`` seconds (then a ``TimeoutError``).

    Raises
    ------
    ImportError
        Without PyTorch.
    RuntimeError
        If a process failed (its error is quoted).
    """
    p = validate_positive_int("run", "p", p)
    torch, _ = _torch()
    import torch.multiprocessing as mp

    if start_method is None:
        start_method = "fork" if sys.platform.startswith("linux") else "spawn"
    with tempfile.TemporaryDirectory(prefix="mha_course_dist_") as folder:
        context = mp.start_processes(worker, args=(p, free_port(), folder, seed, fail_rank),
                                     nprocs=p, join=False, start_method=start_method)
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run: {p} processes did not finish in {timeout:.0f} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            raise RuntimeError(f"run: a process failed: {exc}") from None
        finally:
            for proc in context.processes:  # nothing left behind, whatever happened
                if proc.is_alive():
                    proc.kill()
                proc.join(timeout=5)
        results: dict[str, list] = {}
        for rank in range(p):
            path = os.path.join(folder, f"rank{rank}.npz")
            if not os.path.exists(path):
                raise fail("run", f"rank {rank} wrote no results")
            with np.load(path) as data:
                for key in data.files:
                    value = data[key]
                    results.setdefault(key, []).append(value.item() if value.ndim == 0 else value)
    return results
