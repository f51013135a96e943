"""Lesson 13's serving drill (13.19 to 13.21): every broken function fails its check naming the
property it breaks, the solution passes, each known wrong fix is named, the stub is "not
attempted".

The cells are read from ``solutions/13_interview_drill.ipynb``, so what is tested is what is
shipped. The generic contract (one stable success line, the stub passes
through, ``None`` and exceptions fail) is tested by ``tests/test_checks.py`` over
:data:`CORRECT_13_SERVING`.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from drill_cells import define, drill_cells

from mha_course import checks
from mha_course.checks import CheckFailed, drill
from mha_course.serving.decoder import ContiguousCache

CHECKS = {"13.19": "check_prefix_keys", "13.20": "check_speculative_rollback",
          "13.21": "check_speculative_residual"}
BROKEN_PROPERTY = {"13.19": drill.serving.PREFIX, "13.20": drill.serving.SPEC_GREEDY,
                   "13.21": drill.serving.SPEC_SAMPLE}


def _cells():
    return drill_cells(CHECKS)


def _define(source: str, prefix: str):
    return define(source, prefix, ContiguousCache=ContiguousCache)


CELLS = _cells()
CORRECT_13_SERVING = {ex: (name, _define(CELLS[ex]["solution"], "")) for ex, name in CHECKS.items()}


def test_every_exercise_has_its_broken_code_and_solution_and_every_check_is_exported():
    assert sorted(CELLS) == sorted(CHECKS)
    assert all({"broken", "solution"} <= set(CELLS[ex]) for ex in CHECKS)
    assert set(drill.serving.__all__) == set(CHECKS.values()) <= set(checks.__all__)


@pytest.mark.parametrize("ex", sorted(CHECKS))
def test_the_broken_version_fails_naming_the_property_it_breaks(ex, capsys):
    broken = _define(CELLS[ex]["broken"], "buggy_")
    capsys.readouterr()  # the cell's demo printed its numbers and diagnosis
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
    name, fn = CORRECT_13_SERVING[ex]
    getattr(checks, name)(fn)
    assert capsys.readouterr().out.startswith(f"Exercise {ex} passed: ")

    def stub(*args, **kwargs):
        raise NotImplementedError(f"Exercise {ex}: the task")

    with pytest.raises(NotImplementedError, match=f"Exercise {ex}: the task"):
        getattr(checks, name)(stub)


# ------------------------------------------------------------ fixes that hide the symptom
def _block(tokens, i, bs):
    return tuple(int(t) for t in tokens[i * bs:(i + 1) * bs])


def keys_with_the_index(tokens, bs):  # "number the blocks": still blind to the prefix
    return [hash((i, _block(tokens, i, bs))) for i in range(len(tokens) // bs)]


def keys_of_partial_blocks_too(tokens, bs):
    n_blocks = -(-len(tokens) // bs)  # the last, partly filled block too
    return [hash(tuple(int(t) for t in tokens[:(i + 1) * bs])) for i in range(n_blocks)]


_counter = itertools.count()


def keys_never_equal(tokens, bs):  # collision-free by construction, and never a hit
    return [next(_counter) for _ in range(len(tokens) // bs)]


def _speculative(target, draft, prompt, n_new, k, keep):
    return drill.serving._speculative(target, draft, np.asarray(prompt), n_new, k, keep)


def verify_from_p(p, q, x):
    return min(1.0, p[x] / q[x]), p


def verify_adjusting_one_token(p, q, x):
    r = p.copy()
    r[x] = max(0.0, p[x] - q[x])
    return min(1.0, p[x] / q[x]), r / r.sum()


def verify_unnormalised(p, q, x):
    return min(1.0, p[x] / q[x]), np.maximum(p - q, 0.0)


WRONG_FIXES = [
    ("13.19", keys_with_the_index, drill.serving.PREFIX, "vllm-project/vllm PR #12603"),
    ("13.19", keys_of_partial_blocks_too, drill.serving.FULL, "only the full blocks"),
    ("13.19", keys_never_equal, drill.serving.HITS, None),
    ("13.20", functools.partial(_speculative, keep=lambda n, a: n + a),
     drill.serving.SPEC_GREEDY, "lablup/mlxcel#994"),
    ("13.20", functools.partial(_speculative, keep=lambda n, a: 0), drill.serving.SPEC_GREEDY,
     "paiml/aprender PR #2014"),
    ("13.21", verify_from_p, drill.serving.SPEC_SAMPLE, "SafeAILab/EAGLE#329"),
    ("13.21", verify_adjusting_one_token, drill.serving.SPEC_SAMPLE, "SafeAILab/EAGLE#20"),
    ("13.21", verify_unnormalised, drill.serving.DIST, "normalise the residual"),
]


@pytest.mark.parametrize("ex, wrong, prop, named", WRONG_FIXES,
                         ids=[f"{ex}-{w.func.__name__ if hasattr(w, 'func') else w.__name__}-{i}"
                              for i, (ex, w, _, _) in enumerate(WRONG_FIXES)])
def test_a_fix_that_hides_the_symptom_still_fails_and_is_named(ex, wrong, prop, named):
    with pytest.raises(CheckFailed) as info:
        getattr(checks, CHECKS[ex])(wrong)
    message = str(info.value)
    assert message.startswith(f"Exercise {ex}: property violated: {prop}. "), message
    if named:
        assert "Likely mistake" in message and named in message, message
