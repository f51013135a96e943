"""The checks of lesson 11 (attention across devices): each passes a right answer and names
each classic wrong one.

The generic contract (a right answer passes with one stable line, the stub's
``NotImplementedError`` passes through as "not attempted", ``None`` and an unexpected
exception fail) is bound to lesson 11's right answers, :data:`CORRECT_11`, by
:class:`TestContract` here (``tests/check_contract.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from check_contract import CheckContract

from mha_course import checks
from mha_course.checks import CheckFailed, lesson11

# ------------------------------------------------------------------ correct implementations


def _tp_layer_bytes(tokens, d_model, p, b, n=4, share=(2, 1)):
    activation = tokens * d_model * b
    return n * (share[0] * (p - 1) * activation // (share[1] * p))


def _ring_all_reduce(cluster, shards, how="ring"):
    p = cluster.p
    if how == "gather":  # reduce-then-broadcast through device 0
        total = shards[0].copy()
        for i in range(1, p):
            total = total + cluster.send(i, 0, shards[i])
        return [total] + [cluster.send(0, i, total) for i in range(1, p)]
    if how == "everyone":  # every device sends its array to every other
        return [sum(cluster.send(j, i, shards[j]) if j != i else shards[i] for j in range(p))
                for i in range(p)]
    part = [np.array_split(s.reshape(-1), p) for s in shards]
    for step in range(p - 1):
        moves = [(i, (i - 1 - step) % p, cluster.send(i, (i + 1) % p,
                                                       part[i][(i - 1 - step) % p]))
                 for i in range(p)]
        for i, c, x in moves:
            part[(i + 1) % p][c] = part[(i + 1) % p][c] + x
    for step in range(p - 1):
        moves = [(i, (i - step) % p, cluster.send(i, (i + 1) % p, part[i][(i - step) % p]))
                 for i in range(p)]
        for i, c, x in moves:
            part[(i + 1) % p][c] = x
    return [np.concatenate(part[i]).reshape(shards[0].shape) for i in range(p)]


def _ring_work(T, p, layout, direction=-1, cmp="<="):
    if layout == "contiguous":
        pos = np.array_split(np.arange(T), p)
    else:
        ch = np.array_split(np.arange(T), 2 * p)
        pos = [np.concatenate([ch[i], ch[2 * p - 1 - i]]) for i in range(p)]
    work = np.zeros((p, p), dtype=np.int64)
    for s in range(p):
        for i in range(p):
            q, k = pos[i], pos[(i + direction * s) % p]
            allowed = (k[None, :] <= q[:, None]) if cmp == "<=" else (k[None, :] < q[:, None])
            work[s, i] = int(allowed.sum())
    return work


def _cu_from_positions(position_ids):
    return np.append(np.flatnonzero(np.asarray(position_ids) == 0), len(position_ids))


CORRECT_11 = {
    "11.1": ("check_tp_layer_bytes", _tp_layer_bytes),
    "11.2": ("check_ring_all_reduce", _ring_all_reduce),
    "11.3": ("check_ring_work", _ring_work),
    "11.4": ("check_cu_seqlens_from_positions", _cu_from_positions),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson11, CORRECT_11


MISTAKES = [
    ("bytes-forward-only", "check_tp_layer_bytes", lambda *a: _tp_layer_bytes(*a, n=2),
     r"a layer has four all-reduces"),
    ("bytes-whole-array", "check_tp_layer_bytes",
     lambda t, d, p, b: 4 * t * d * b, r"the ring sends 2 \(p - 1\) / p of it"),
    ("bytes-reduce-scatter-only", "check_tp_layer_bytes",
     lambda *a: _tp_layer_bytes(*a, share=(1, 1)), r"a reduce-scatter's \(p - 1\) / p"),
    ("bytes-one-all-reduce", "check_tp_layer_bytes", lambda *a: _tp_layer_bytes(*a, n=1),
     r"one all-reduce; the layer has four"),
    ("ring-reduce-then-broadcast", "check_ring_all_reduce",
     lambda c, s: _ring_all_reduce(c, s, how="gather"), r"reduce-then-broadcast"),
    ("ring-everyone-to-everyone", "check_ring_all_reduce",
     lambda c, s: _ring_all_reduce(c, s, how="everyone"), r"every device sent its whole array"),
    ("ring-uses-the-collective", "check_ring_all_reduce", lambda c, s: c.all_reduce(s),
     r"asks you to write the ring from cluster.send alone; your answer calls"),
    ("ring-wrong-sum", "check_ring_all_reduce",
     lambda c, s: [x * 0 + s[0] for x in _ring_all_reduce(c, s)], r"device 0's array"),
    ("work-wrong-direction", "check_ring_work",
     lambda T, p, layout: _ring_work(T, p, layout, direction=1), r"the blocks travel the other"),
    ("work-strict", "check_ring_work",
     lambda T, p, layout: _ring_work(T, p, layout, cmp="<"), r"a query sees its own position"),
    ("work-transposed", "check_ring_work",
     lambda T, p, layout: _ring_work(T, p, layout).T, r"your work for T=16"),
    ("work-uses-the-package", "check_ring_work",
     lambda T, p, layout: __import__("mha_course.parallel.ring", fromlist=["x"])
     .sequence_layout(T, p, layout) and _ring_work(T, p, layout),
     r"asks you to lay out the positions yourself"),
    ("cu-no-total", "check_cu_seqlens_from_positions",
     lambda pos: np.flatnonzero(np.asarray(pos) == 0), r"ends with the total length"),
    ("cu-no-zero", "check_cu_seqlens_from_positions",
     lambda pos: _cu_from_positions(pos)[1:], r"begin with 0"),
    ("cu-package", "check_cu_seqlens_from_positions",
     lambda pos: __import__("mha_course.parallel.packing", fromlist=["x"]).cu_seqlens(
         np.diff(_cu_from_positions(pos))),
     r"asks you to read the boundaries off the positions yourself"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        getattr(checks, check)(wrong)
    assert str(info.value).startswith("Exercise 11.")
    assert capsys.readouterr().out == ""


def test_a_ring_that_changes_its_input_shards_is_told(capsys):
    def in_place(cluster, shards):
        out = _ring_all_reduce(cluster, [s.copy() for s in shards])
        shards[0] += 1.0
        return out

    with pytest.raises(CheckFailed, match=r"changed its argument `shards` in place"):
        checks.check_ring_all_reduce(in_place)
