"""Lesson 13's drill, part five (the 2025 attention block from lesson 12, 13.25 and 13.26): every
broken function fails its check naming the property it breaks, the solution passes, and each
named wrong fix is recognised.

The broken functions and the solutions are read from the notebook a learner sees:
``solutions/13_interview_drill.ipynb``. The generic contract is tested by
``tests/test_checks.py`` over :data:`CORRECT_13_BLOCK2025`.
"""

from __future__ import annotations

import numpy as np
import pytest
from drill_cells import define, drill_cells

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, drill, properties

CHECKS = {"13.25": "check_softcap_before_mask", "13.26": "check_per_head_qk_norm"}


def _cells():
    return drill_cells(CHECKS)


def _define(source: str, prefix: str):
    return define(source, prefix)


CELLS = _cells()
CORRECT_13_BLOCK2025 = {ex: (name, _define(CELLS[ex]["solution"], ""))
                        for ex, name in CHECKS.items()}
BROKEN_PROPERTY = {"13.25": properties.MASKED_ZERO, "13.26": drill.block2025.PER_HEAD}


def test_every_check_is_exported_and_has_a_broken_and_a_solved_version():
    assert set(drill.block2025.__all__) == set(CHECKS.values())
    assert set(CHECKS.values()) <= set(checks.__all__)
    assert all({"broken", "solution"} <= set(CELLS[ex]) for ex in CHECKS)


@pytest.mark.parametrize("ex", sorted(CHECKS))
def test_the_broken_version_fails_naming_the_property_it_breaks(ex, capsys):
    broken = _define(CELLS[ex]["broken"], "buggy_")
    capsys.readouterr()
    with pytest.raises(CheckFailed) as info:
        getattr(checks, CHECKS[ex])(broken)
    message = str(info.value)
    assert message.startswith(f"Exercise {ex}: property violated: {BROKEN_PROPERTY[ex]}. ")
    assert "Likely mistake" not in message, "the broken version gets no hint"


@pytest.mark.parametrize("ex", sorted(CHECKS))
def test_the_broken_cell_runs_and_diagnose_prints_the_same_property(ex, capsys):
    _define(CELLS[ex]["broken"], "buggy_")
    assert f"Exercise {ex}: property violated: {BROKEN_PROPERTY[ex]}. " in capsys.readouterr().out


@pytest.mark.parametrize("ex", sorted(CHECKS))
def test_the_solution_passes_and_the_stub_is_not_attempted(ex, capsys):
    name, fn = CORRECT_13_BLOCK2025[ex]
    getattr(checks, name)(fn)
    assert capsys.readouterr().out.startswith(f"Exercise {ex} passed: ")

    def stub(*args, **kwargs):
        raise NotImplementedError(f"Exercise {ex}: the task")

    with pytest.raises(NotImplementedError):
        getattr(checks, name)(stub)


# ------------------------------------------------------------------ named wrong fixes
def _capped(q, k, v, mask, cap, kind):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = {"removed": s, "clip": np.clip(s, -cap, cap)}[kind]
    w = mha_course.softmax(np.where(mask, s, -np.inf))
    return w @ v, w


def _qk(x, h, gain, eps, kind):
    heads = x.reshape(*x.shape[:-1], h, x.shape[-1] // h)
    if kind == "no_gain":
        return (heads / np.sqrt((heads * heads).mean(-1, keepdims=True) + eps)).reshape(x.shape)
    return (heads / np.sqrt((heads * heads).mean(-3, keepdims=True) + eps) * gain
            ).reshape(x.shape)


WRONG_FIXES = [
    ("cap-removed", "check_softcap_before_mask",
     lambda q, k, v, m, c: _capped(q, k, v, m, c, "removed"), r"the cap was removed"),
    ("cap-clipped", "check_softcap_before_mask",
     lambda q, k, v, m, c: _capped(q, k, v, m, c, "clip"), r"a hard clip at ±cap"),
    ("qk-no-gain", "check_per_head_qk_norm", lambda x, h, g, e: _qk(x, h, g, e, "no_gain"),
     r"the gain is gone"),
    ("qk-over-tokens", "check_per_head_qk_norm", lambda x, h, g, e: _qk(x, h, g, e, "tokens"),
     r"the norm now runs over the tokens"),
]


@pytest.mark.parametrize(("name", "check", "fn", "match"), WRONG_FIXES,
                         ids=[w[0] for w in WRONG_FIXES])
def test_each_named_wrong_fix_is_recognised(name, check, fn, match):
    with pytest.raises(CheckFailed, match=match):
        getattr(checks, check)(fn)
