"""Checks for the exercises of lesson 11, attention across devices
(``solutions/11_parallel.ipynb``).

The lesson is ``notebooks/11_parallel.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`). The references come from the package at check time: the
simulated collectives' byte counters (:mod:`mha_course.parallel.collectives`), the ring's work
counts (:func:`mha_course.parallel.ring.ring_attention` on placeholders) and the packing helpers
(:mod:`mha_course.parallel.packing`). Exercise 11.5 (the low-precision accumulator) is exercise
12.1 now, checked in :mod:`mha_course.checks.lesson12`.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..parallel.collectives import Cluster, meta
from ..parallel.packing import cu_seqlens, packed_positions
from ..parallel.ring import ring_attention, sequence_layout
from .harness import call, compare, fail, fmt_shape, passed
from .measure import check_rng

__all__ = [
    "check_cu_seqlens_from_positions",
    "check_ring_all_reduce",
    "check_ring_work",
    "check_tp_layer_bytes",
]


def _int(ex, got, label):
    if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral, np.integer)):
        raise fail(ex, f"{label} you returned {got!r} ({type(got).__name__}); expected an int")
    return int(got)


# ---------------------------------------------------------------------------------- 11.1
def _all_reduces(tokens, d_model, p, itemsize, n) -> int:
    """Bytes device 0 sends in ``n`` all-reduces of a (tokens, d_model) activation, counted."""
    cluster = Cluster(p)
    for _ in range(n):
        cluster.all_reduce([meta((tokens, d_model), np.dtype(f"f{itemsize}"))] * p)
    return int(cluster.sent[0])


def check_tp_layer_bytes(fn) -> None:
    """Exercise 11.1: ``tp_layer_bytes(tokens, d_model, p, bytes_per_value)`` -> int."""
    ex = "11.1"
    probes = [(8192, 8192, 8, 2), (1024, 512, 4, 4), (96, 12, 3, 2), (4096, 4096, 1, 2),
              (2048, 5120, 2, 8)]
    for tokens, d_model, p, b in probes:
        label = f"for tokens={tokens}, d_model={d_model}, p={p}, bytes_per_value={b}"
        want = _all_reduces(tokens, d_model, p, b, 4)
        got = _int(ex, call(ex, fn, (tokens, d_model, p, b),
                            ("tokens", "d_model", "p", "bytes_per_value")), label)
        if got == want:
            continue
        n = tokens * d_model * b
        guesses = {
            want // 2: "half the answer: a layer has four all-reduces (two forward, after "
                       "attention and after the MLP; two backward, for the input's gradient of "
                       "each block), and each sends 2 (p - 1) / p of the activation: a "
                       "reduce-scatter's (p - 1) / p plus an all-gather's",
            4 * n: "an all-reduce does not send the whole array once: the ring sends "
                   "2 (p - 1) / p of it per device (a reduce-scatter, then an all-gather)",
            4 * (p - 1) * n: "that is what every device sending its whole array to every other "
                             "device costs; the ring all-reduce sends 2 (p - 1) / p of it",
            want // 4: "one all-reduce; the layer has four",
        }
        hint = guesses.get(got)
        raise fail(ex, f"{label} you returned {got:,}; each device sends {want:,} bytes per "
                       "layer, counted by the simulated all-reduces"
                   + (f". Likely mistake: {hint}" if hint else ""))
    passed(ex, "5 layers (1 to 8 devices, 2 to 8 bytes a value) match the bytes the simulated "
               "all-reduces count: 4 per layer, 2 (p - 1) / p of the activation each")


# ---------------------------------------------------------------------------------- 11.2
_OWN_RING = {
    f"mha_course.parallel.collectives.Cluster.{m}": "write the ring from cluster.send alone"
    for m in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "ring_pass")
}


def check_ring_all_reduce(fn) -> None:
    """Exercise 11.2: ``ring_all_reduce(cluster, shards)`` -> list of p arrays, from sends."""
    ex = "11.2"
    rng = check_rng(1102)
    for p, shape in ((4, (12,)), (3, (2, 9)), (5, (7,)), (2, (3, 4, 2)), (1, (6,))):
        shards = [rng.normal(size=shape) for _ in range(p)]
        want = np.sum(shards, axis=0)
        label = f"on p={p} devices, arrays of shape {fmt_shape(shape)}"
        cluster = Cluster(p)
        # the cluster's counters change as it is used: only the shards must stay as they were
        got = call(ex, lambda shards, c=cluster: fn(c, shards), ([s.copy() for s in shards],),
                   ("shards",), forbid=_OWN_RING)
        if not isinstance(got, (list, tuple)) or len(got) != p:
            raise fail(ex, f"{label} your function returned {type(got).__name__}; expected a "
                           f"list of {p} arrays, one per device")
        for i, g in enumerate(got):
            compare(ex, g, want, f"device {i}'s array {label}", fmt_shape(shape))
        n = shards[0].nbytes
        sent = cluster.sent.tolist()
        if sum(sent) != 2 * (p - 1) * n:
            hint = ("every device sent its whole array to every other one, (p - 1) arrays "
                    "each; cut the arrays into p chunks and pass one chunk per step"
                    if sum(sent) == p * (p - 1) * n else "")
            raise fail(ex, f"{label} the devices sent {sent} bytes, {sum(sent):,} in all; the "
                           f"ring all-reduce sends 2 (p - 1) · N = {2 * (p - 1) * n:,} in all"
                       + (f". Likely mistake: {hint}" if hint else ""))
        chunk = -(-shards[0].size // p) * shards[0].itemsize
        if max(sent) > 2 * (p - 1) * chunk:
            hint = ("device 0 gathers everything, sums and sends the sum back "
                    "(reduce-then-broadcast): its link carries p - 1 whole arrays; in the ring "
                    "every device sends one chunk per step" if sent[0] == (p - 1) * n else
                    "one device does another's share; in the ring every device sends one chunk "
                    "per step")
            raise fail(ex, f"{label} the devices sent {sent} bytes: the total is right but one "
                           f"device sent more than 2 (p - 1) chunks ({2 * (p - 1) * chunk:,} "
                           f"bytes). Likely mistake: {hint}")
    passed(ex, "5 clusters (1 to 5 devices, sizes p divides and does not) give every device "
               "the sum, with 2 (p - 1) chunks sent per device")


# ---------------------------------------------------------------------------------- 11.3
def _work(T, p, layout):
    pos = sequence_layout(T, p, layout)
    blocks = [meta((1, len(i), 1)) for i in pos]
    return ring_attention(Cluster(p), blocks, blocks, blocks, pos, causal=True)[2]


def _work_variant(T, p, layout, direction=-1, diagonal="causal"):
    pos = sequence_layout(T, p, layout)
    work = np.zeros((p, p), dtype=np.int64)
    for s in range(p):
        for i in range(p):
            q, k = pos[i], pos[(i + direction * s) % p]
            if diagonal == "full":
                work[s, i] = q.size * k.size if (k.min() <= q.max()) else 0
            else:
                strict = diagonal == "strict"
                work[s, i] = int(((k[None, :] < q[:, None]) if strict
                                  else (k[None, :] <= q[:, None])).sum())
    return work


_OWN_WORK = {"mha_course.parallel.ring.ring_attention": "count the pairs yourself",
             "mha_course.parallel.ring.pairs_allowed": "count the pairs yourself",
             "mha_course.parallel.ring.sequence_layout": "lay out the positions yourself"}


def check_ring_work(fn) -> None:
    """Exercise 11.3: ``ring_work(T, p, layout)`` -> (p steps, p devices) int array."""
    ex = "11.3"
    for T, p, layout in ((16, 4, "contiguous"), (16, 4, "zigzag"), (24, 3, "zigzag"),
                         (12, 2, "contiguous"), (40, 5, "zigzag"), (6, 1, "contiguous")):
        want = _work(T, p, layout)
        label = f"for T={T}, p={p}, layout={layout!r}"
        got = call(ex, fn, (T, p, layout), ("T", "p", "layout"), forbid=_OWN_WORK)
        compare(
            ex, got, want, f"your work {label}", "(steps, devices)",
            variants=[
                ("the blocks travel the other way: a ring pass sends device i's block to "
                 "device i + 1, so at step s device i holds the block of device (i - s) % p",
                 lambda a=(T, p, layout): _work_variant(*a, direction=1)),
                ("a block on the diagonal costs only its causal half: count the pairs with "
                 "key position <= query position, not the whole block",
                 lambda a=(T, p, layout): _work_variant(*a, diagonal="full")),
                ("a query sees its own position too: count key position <= query position, "
                 "not <", lambda a=(T, p, layout): _work_variant(*a, diagonal="strict")),
            ],
            shape_hints={(p, p): "rows are the steps, columns the devices"},
        )
    passed(ex, "6 rings (contiguous and zig-zag, 1 to 5 devices) match the work "
               "mha_course.parallel.ring.ring_attention counts, step by step and device by "
               "device")


# ---------------------------------------------------------------------------------- 11.4
def check_cu_seqlens_from_positions(fn) -> None:
    """Exercise 11.4: ``cu_seqlens_from_positions(position_ids)`` -> (n_docs + 1,) ints."""
    ex = "11.4"
    rng = check_rng(1104)
    probes = [[3, 1, 4], [5], [1, 1, 1], [2, 7, 1, 3], list(rng.integers(1, 9, size=12))]
    for lengths in probes:
        want = cu_seqlens(lengths)
        pos = packed_positions(want)
        label = f"for documents of lengths {list(map(int, lengths))}"
        got = call(ex, fn, (pos.copy(),), ("position_ids",),
                   forbid={"mha_course.parallel.packing": "read the boundaries off the positions "
                                                 "yourself"})
        starts = np.flatnonzero(pos == 0)
        compare(
            ex, got, want, f"your cu_seqlens {label}", "(n_docs + 1,)",
            variants=[
                ("cu_seqlens ends with the total length: append len(position_ids) after the "
                 "starts", lambda s=starts: s),
                ("cu_seqlens holds where each document starts (the indices where the position "
                 "is 0), not the lengths", lambda L=lengths: np.asarray(L)),
                ("the cumulative lengths begin with 0", lambda w=want: w[1:]),
            ],
        )
    passed(ex, "5 packed rows (one document, documents of length 1, twelve documents) give "
               "the cu_seqlens they were packed with")
