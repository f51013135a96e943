"""Simulated devices and the collectives that move arrays between them, counting the bytes.

Taught in ``notebooks/11_parallel.ipynb`` (section 1); how the bytes grow with ``p``, in
``notebooks/deep_dives/11a_parallel_at_scale.ipynb`` (section 1).

``p`` devices live in one process: what device ``i`` holds is element ``i`` of a Python list of
arrays. A :class:`Cluster` moves arrays between them with one primitive, :meth:`Cluster.send`,
which copies an array from one device to another and adds its size to the sender's ``sent`` and
the receiver's ``received`` counters. Every collective is a schedule of such sends, as NCCL and
gloo run them:

- :meth:`Cluster.ring_pass`: every device sends its array to the next one on the ring (ring
  attention's step);
- :meth:`Cluster.reduce_scatter`: ``p - 1`` ring steps; device ``i`` ends with the sum over the
  devices of chunk ``i``; each device sends ``(p - 1) / p`` of the array;
- :meth:`Cluster.all_gather`: ``p - 1`` ring steps; every device ends with every chunk; each
  sends ``(p - 1)`` chunks;
- :meth:`Cluster.all_reduce`: a reduce-scatter then an all-gather (the ring all-reduce), so each
  device sends ``2 (p - 1) / p`` of the array, whatever ``p`` is;
- :meth:`Cluster.all_to_all`: device ``i`` cuts its array into ``p`` chunks and sends chunk
  ``j`` to device ``j`` (Ulysses' re-sharding); each device sends ``(p - 1) / p`` of its array.

The counters are the point: a byte count printed by the lesson is read from them, and
:func:`expected_bytes` states the formula it must match. A :class:`Meta` placeholder (a shape and
a dtype, no numbers) runs through the same schedules, so the traffic of a layer far too large for
this machine is counted by the same code that moves the small arrays.

Examples
--------
>>> cluster = Cluster(4)
>>> out = cluster.all_reduce([np.full(8, float(i)) for i in range(4)])
>>> out[2].tolist() == [6.0] * 8, cluster.sent.tolist()
(True, [96, 96, 96, 96])
>>> expected_bytes("all_reduce", 8 * 8, 4)
96
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .._validate import fail, fmt_shape, validate_positive_int

#: The collectives :func:`expected_bytes` knows, with the share of the array each device sends.
COLLECTIVES = ("ring_pass", "all_gather", "reduce_scatter", "all_reduce", "all_to_all")


@dataclass(frozen=True)
class Meta:
    """A placeholder for an array: its shape and dtype, and no numbers.

    The collectives accept it wherever they accept an array and count its bytes as they would
    count the array's; splitting, joining and adding placeholders only computes shapes.

    Examples
    --------
    >>> m = Meta((131072, 8192), np.dtype("float16"))
    >>> m.nbytes / 2**30
    2.0
    """

    shape: tuple[int, ...]
    dtype: np.dtype = field(default=np.dtype(np.float32))

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"Meta({fmt_shape(self.shape)}, {self.dtype.name})"


def meta(shape, dtype=np.float32) -> Meta:
    """A :class:`Meta` placeholder of ``shape`` and ``dtype``."""
    return Meta(tuple(shape), np.dtype(dtype))


def is_meta(x) -> bool:
    return isinstance(x, Meta)


# ------------------------------------------------------------ shape-only twins of NumPy calls
def split(x, p: int, axis: int):
    """``np.array_split(x, p, axis)``, for arrays and placeholders alike."""
    if not is_meta(x):
        return np.array_split(x, p, axis=axis)
    axis = axis % x.ndim
    n = x.shape[axis]
    sizes = [n // p + (1 if i < n % p else 0) for i in range(p)]
    return [Meta(x.shape[:axis] + (s,) + x.shape[axis + 1:], x.dtype) for s in sizes]


def concat(parts, axis: int):
    """``np.concatenate(parts, axis)``, for arrays and placeholders alike."""
    if not any(is_meta(a) for a in parts):
        return np.concatenate(parts, axis=axis)
    first = parts[0]
    axis = axis % first.ndim
    total = sum(a.shape[axis] for a in parts)
    return Meta(first.shape[:axis] + (total,) + first.shape[axis + 1:], first.dtype)


def add(a, b):
    """``a + b`` (the reduction of a reduce-scatter), for arrays and placeholders alike."""
    if is_meta(a) or is_meta(b):
        return a if is_meta(a) else b
    return a + b


def reshape(x, shape):
    return Meta(tuple(shape), x.dtype) if is_meta(x) else np.reshape(x, shape)


def copy(x):
    return x if is_meta(x) else np.array(x, copy=True)


def nbytes(x) -> int:
    return int(x.nbytes)


def shard(x, p: int, axis: int = 0) -> list:
    """Cut ``x`` into ``p`` consecutive pieces along ``axis``, one per device (no bytes counted:
    this is how the input is laid out before the run starts, not a collective)."""
    return list(split(x, validate_positive_int("shard", "p", p), axis))


def unshard(shards, axis: int = 0):
    """Join the pieces of :func:`shard` (no bytes counted: for checking results)."""
    return concat(list(shards), axis)


# ---------------------------------------------------------------------------------- the cluster
class Cluster:
    """``p`` simulated devices and the collectives between them, with byte counters.

    Parameters
    ----------
    p : int
        Number of devices.

    Attributes
    ----------
    sent, received : ndarray of int64, shape (p,)
        Bytes each device has sent and received since the cluster was made or :meth:`reset`.
    messages : int
        Point-to-point sends so far.
    log : list of (str, ndarray)
        One entry per collective call: its name and the bytes each device sent in it.

    Examples
    --------
    >>> cluster = Cluster(2)
    >>> cluster.ring_pass([np.zeros(3), np.ones(3)])[0].tolist()
    [1.0, 1.0, 1.0]
    >>> cluster.sent.tolist(), cluster.log[0][0]
    ([24, 24], 'ring_pass')
    """

    def __init__(self, p):
        self.p = validate_positive_int("Cluster", "p", p)
        self.reset()

    def reset(self) -> None:
        """Zero the counters and the log."""
        self.sent = np.zeros(self.p, dtype=np.int64)
        self.received = np.zeros(self.p, dtype=np.int64)
        self.messages = 0
        self.log: list[tuple[str, np.ndarray]] = []

    def __repr__(self) -> str:
        return f"Cluster(p={self.p}, sent={self.sent.tolist()})"

    # ------------------------------------------------------------------------ the one primitive
    def send(self, src: int, dst: int, x):
        """Move ``x`` from device ``src`` to device ``dst``: returns the receiver's copy and
        counts ``x.nbytes`` as sent by ``src`` and received by ``dst``."""
        if not (0 <= src < self.p and 0 <= dst < self.p):
            raise fail("Cluster.send", f"devices {src} -> {dst}; expected 0..{self.p - 1}")
        if src == dst:
            return x
        self.sent[src] += nbytes(x)
        self.received[dst] += nbytes(x)
        self.messages += 1
        return copy(x)

    def _shards(self, func: str, shards) -> list:
        shards = list(shards)
        if len(shards) != self.p:
            raise fail(f"Cluster.{func}", f"got {len(shards)} arrays; expected one per device, "
                                          f"p={self.p}")
        return shards

    def _same_shapes(self, func: str, shards) -> None:
        first = shards[0].shape
        for i, s in enumerate(shards):
            if s.shape != first:
                raise fail(f"Cluster.{func}", f"device {i} holds shape {fmt_shape(s.shape)}; "
                                              f"expected {fmt_shape(first)} like device 0")

    def _logged(self, name: str, before: np.ndarray) -> None:
        self.log.append((name, self.sent - before))

    # ----------------------------------------------------------------------------- collectives
    def ring_pass(self, shards, shift: int = 1) -> list:
        """Device ``i`` sends its array to device ``(i + shift) % p``; returns what each holds
        afterwards (device ``j`` holds what device ``j - shift`` had)."""
        shards = self._shards("ring_pass", shards)
        before = self.sent.copy()
        out = [None] * self.p
        for i, x in enumerate(shards):  # every device sends at once; nothing is overwritten
            out[(i + shift) % self.p] = self.send(i, (i + shift) % self.p, x)
        self._logged("ring_pass", before)
        return out

    def reduce_scatter(self, shards, axis: int = 0) -> list:
        """Sum the devices' arrays and leave chunk ``i`` of the sum on device ``i``.

        The ring schedule: the arrays are cut into ``p`` chunks along ``axis``
        (``np.array_split``); at step ``s`` (``0 .. p-2``) device ``i`` sends its running sum of
        chunk ``(i - 1 - s) % p`` to device ``i + 1``, which adds its own copy of that chunk.
        After ``p - 1`` steps chunk ``i`` has visited every device and rests, fully summed, on
        device ``i``.
        """
        shards = self._shards("reduce_scatter", shards)
        self._same_shapes("reduce_scatter", shards)
        before = self.sent.copy()
        p = self.p
        chunks = [split(x, p, axis) for x in shards]  # chunks[device][chunk]
        partial = [list(c) for c in chunks]  # running sums, device by device
        for s in range(p - 1):
            moves = []
            for i in range(p):
                c = (i - 1 - s) % p
                moves.append(((i + 1) % p, c, self.send(i, (i + 1) % p, partial[i][c])))
            for dst, c, x in moves:  # all sends of a step happen before any add
                partial[dst][c] = add(x, chunks[dst][c])
        self._logged("reduce_scatter", before)
        return [partial[i][i] for i in range(p)]

    def all_gather(self, shards, axis: int = 0) -> list:
        """Give every device the concatenation (along ``axis``) of all devices' arrays.

        The ring schedule: at step ``s`` device ``i`` forwards chunk ``(i - s) % p`` (its own at
        step 0, then the one it just received) to device ``i + 1``.
        """
        shards = self._shards("all_gather", shards)
        before = self.sent.copy()
        p = self.p
        have = [{i: shards[i]} for i in range(p)]  # have[device][chunk]
        for s in range(p - 1):
            moves = [((i + 1) % p, (i - s) % p, self.send(i, (i + 1) % p, have[i][(i - s) % p]))
                     for i in range(p)]
            for dst, c, x in moves:
                have[dst][c] = x
        self._logged("all_gather", before)
        return [concat([have[i][c] for c in range(p)], axis) for i in range(p)]

    def all_reduce(self, shards) -> list:
        """Every device gets the sum of all devices' arrays: the ring all-reduce, a
        :meth:`reduce_scatter` of the flattened arrays followed by an :meth:`all_gather`."""
        shards = self._shards("all_reduce", shards)
        self._same_shapes("all_reduce", shards)
        shape = shards[0].shape
        before, log_len = self.sent.copy(), len(self.log)
        flat = [reshape(x, (-1,) if not is_meta(x) else (x.size,)) for x in shards]
        summed = self.all_gather(self.reduce_scatter(flat, axis=0), axis=0)
        del self.log[log_len:]  # one entry for the all-reduce, not its two halves
        self._logged("all_reduce", before)
        return [reshape(x, shape) for x in summed]

    def all_to_all(self, shards, split_axis: int, concat_axis: int) -> list:
        """Device ``i`` cuts its array into ``p`` chunks along ``split_axis`` and sends chunk
        ``j`` to device ``j``; device ``j`` joins the chunks it got, in device order, along
        ``concat_axis``. Ulysses uses it to turn sequence shards into head shards and back."""
        shards = self._shards("all_to_all", shards)
        before = self.sent.copy()
        p = self.p
        chunks = [split(x, p, split_axis) for x in shards]
        received = [[self.send(i, j, chunks[i][j]) for i in range(p)] for j in range(p)]
        self._logged("all_to_all", before)
        return [concat(received[j], concat_axis) for j in range(p)]

    def bytes_by_collective(self) -> dict[str, int]:
        """Bytes sent per device (the largest over devices), summed by collective name."""
        out: dict[str, int] = {}
        for name, per_device in self.log:
            out[name] = out.get(name, 0) + int(per_device.max())
        return out


def expected_bytes(collective: str, nbytes: int, p: int) -> int:
    """The bytes each device sends in one collective over an array of ``nbytes`` bytes.

    ``nbytes`` is the size of the array each device passes in (for :meth:`Cluster.all_gather`,
    the size of one device's piece). Exact when ``p`` divides the array's elements:

    - ``ring_pass``: ``nbytes``;
    - ``all_gather``: ``(p - 1) · nbytes`` (each device forwards ``p - 1`` pieces);
    - ``reduce_scatter`` and ``all_to_all``: ``(p - 1) / p · nbytes``;
    - ``all_reduce``: ``2 (p - 1) / p · nbytes`` (a reduce-scatter, then an all-gather).

    Examples
    --------
    >>> expected_bytes("all_reduce", 2**20, 8)
    1835008
    """
    func = "expected_bytes"
    p = validate_positive_int(func, "p", p)
    if collective not in COLLECTIVES:
        raise fail(func, f"collective={collective!r}; expected one of {', '.join(COLLECTIVES)}")
    if p == 1:
        return 0
    share = {"ring_pass": (1, 1), "all_gather": (p - 1, 1), "reduce_scatter": (p - 1, p),
             "all_to_all": (p - 1, p), "all_reduce": (2 * (p - 1), p)}[collective]
    return int(nbytes) * share[0] // share[1]
