"""Lesson 13's drill, part four (13.22 to 13.24, from lesson 11): each broken function fails
its check naming the property it breaks, the solution passes, each known wrong fix is named,
and the stub is "not attempted".

The broken functions and solutions are read from the cells a learner sees, in
``solutions/13_interview_drill.ipynb``. The generic contract (one stable success
line, ``None`` and exceptions fail) is tested by ``tests/test_checks.py`` over
:data:`CORRECT_13_PARALLEL`.
"""

from __future__ import annotations

import numpy as np
import pytest
from drill_cells import define, drill_cells

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, lesson13_parallel
from mha_course.parallel.collectives import Cluster

CHECKS = {"13.22": "check_row_parallel_bias", "13.23": "check_packed_documents",
          "13.24": "check_lse_merge"}


def _cells():
    return drill_cells(CHECKS)


def _define(source: str, prefix: str):
    return define(source, prefix, Cluster=Cluster, print=lambda *a, **k: None)


CELLS = _cells()
CORRECT_13_PARALLEL = {ex: (name, _define(CELLS[ex]["solution"], ""))
                       for ex, name in CHECKS.items()}
BROKEN = {ex: _define(CELLS[ex]["broken"], "buggy_") for ex in CHECKS}


def test_every_check_of_part_three_is_an_exercise_here():
    assert set(lesson13_parallel.__all__) == set(CHECKS.values())
    assert set(lesson13_parallel.__all__) <= set(checks.__all__)
    assert sorted(CELLS) == sorted(CHECKS)


@pytest.mark.parametrize("ex", sorted(CHECKS))
def test_the_solution_passes(ex, capsys):
    name, fn = CORRECT_13_PARALLEL[ex]
    getattr(checks, name)(fn)
    assert capsys.readouterr().out.startswith(f"Exercise {ex} passed: ")


PROPERTY = {"13.22": lesson13_parallel.TP_EQUAL, "13.23": lesson13_parallel.DOCS,
            "13.24": lesson13_parallel.MERGE}


@pytest.mark.parametrize("ex", sorted(CHECKS))
def test_the_broken_function_fails_with_its_property(ex, capsys):
    with pytest.raises(CheckFailed) as info:
        getattr(checks, CHECKS[ex])(BROKEN[ex])
    assert str(info.value).startswith(f"Exercise {ex}: property violated: {PROPERTY[ex]}")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("ex", sorted(CHECKS))
def test_the_stub_is_not_attempted(ex, capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError(f"Exercise {ex}: the one-line task")

    with pytest.raises(NotImplementedError, match=rf"^Exercise {ex}: the one-line task$"):
        getattr(checks, CHECKS[ex])(stub)


# ---------------------------------------------------------------------- the named wrong fixes
def _terms(concat_shards, W_o_shards):
    return [c @ W for c, W in zip(concat_shards, W_o_shards, strict=True)]


def _row_no_all_reduce(cluster, cs, ws, b_o):
    return [t + b_o for t in _terms(cs, ws)]


def _row_average(cluster, cs, ws, b_o):
    return [s / cluster.p + b_o for s in cluster.all_reduce(_terms(cs, ws))]


def _row_gather_everything(cluster, cs, ws, b_o):
    concat, W_o = cluster.all_gather(cs, axis=1), cluster.all_gather(ws, axis=0)
    return [c @ w + b_o for c, w in zip(concat, W_o, strict=True)]


def _packed(layer, x, lengths, reset, block):
    total = x.shape[0]
    doc = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])[doc]
    pos = np.arange(total) - starts if reset else np.arange(total)
    mask = mha_course.causal_mask(total)
    if block:
        mask = mask & (doc[:, None] == doc[None, :])
    return layer(x + mha_course.sinusoidal_positions(total, layer.d_model)[pos], mask=mask)[0]


def _merge(out_a, a, out_b, b, how):
    if how != "base2":
        a, b = a * np.log(2), b * np.log(2)
    with np.errstate(all="ignore"):
        if how == "added":
            lse = a + b
        elif how == "log1p":
            lse = a + np.log(1 + np.exp(b - a))
        elif how == "base2":  # base 2 throughout: the output is right, lse stays base 2
            lse = np.logaddexp2(a, b)
            return (np.exp2(a - lse)[:, None] * out_a + np.exp2(b - lse)[:, None] * out_b), lse
        return np.exp(a - lse)[:, None] * out_a + np.exp(b - lse)[:, None] * out_b, lse


WRONG_FIXES = [
    ("row-no-all-reduce", "check_row_parallel_bias", _row_no_all_reduce,
     r"the all-reduce is gone.*sglang PR #14811"),
    ("row-average", "check_row_parallel_bias", _row_average, r"averaging the sum"),
    ("row-gather-everything", "check_row_parallel_bias", _row_gather_everything,
     r"property violated: one all-reduce of the \(T, d_model\) output"),
    ("row-package-layer", "check_row_parallel_bias",
     lambda c, cs, ws, b: mha_course.parallel.tensor.TensorParallelAttention(None, 1),
     r"asks you to fix the row-parallel projection yourself"),
    ("packed-reset-only", "check_packed_documents",
     lambda layer, x, lengths: _packed(layer, x, lengths, True, False),
     r"packed documents are independent.*restarting the positions is half the fix"),
    ("packed-mask-only", "check_packed_documents",
     lambda layer, x, lengths: _packed(layer, x, lengths, False, True),
     r"equals the document run alone.*the block-diagonal mask is half the fix"),
    ("packed-uses-the-package", "check_packed_documents",
     lambda layer, x, lengths: layer(x, mask=mha_course.parallel.packing.varlen_mask(
         mha_course.parallel.packing.cu_seqlens(lengths)))[0],
     r"asks you to build the mask and positions yourself"),
    ("merge-added", "check_lse_merge", lambda *a: _merge(*a, "added"),
     r"the two log-sum-exps were added.*ring-flash-attention#20"),
    ("merge-log1p", "check_lse_merge", lambda *a: _merge(*a, "log1p"),
     r"finite input gives finite output.*ring-flash-attention PR #30"),
    ("merge-lse-left-in-base-2", "check_lse_merge", lambda *a: _merge(*a, "base2"),
     r"the merged log-sum-exp is log.*tokenspeed PR #571"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [w[1:] for w in WRONG_FIXES],
                         ids=[w[0] for w in WRONG_FIXES])
def test_a_known_wrong_fix_is_named(check, wrong, pattern, capsys):
    import mha_course.parallel.packing  # noqa: F401  (the names the wrong fixes reach for)
    import mha_course.parallel.tensor  # noqa: F401

    with pytest.raises(CheckFailed, match=pattern):
        getattr(checks, check)(wrong)
    assert capsys.readouterr().out == ""
