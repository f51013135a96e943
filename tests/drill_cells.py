"""Lesson 13's drill as a learner sees it, for the tests of its checks: one table of its
exercises and the functions its cells define.

The drill's tests (``tests/test_checks_drill.py``, the contract over all 26 exercises, and
``tests/test_checks_lesson13*.py``, the wrong fixes each group of checks names) read each
spot-the-bug exercise's broken function and its solution from
``solutions/13_interview_drill.ipynb`` (the single source of the exercises), run them, and hand
the functions to the checks: what is tested is what is shipped.
"""

from __future__ import annotations

import contextlib
import functools
import io
from pathlib import Path

import nbformat
import numpy as np

import mha_course
from mha_course import checks
from mha_course.checks import drill, properties
from mha_course.parallel.collectives import Cluster
from mha_course.serving.decoder import ContiguousCache

DRILL = Path(__file__).resolve().parent.parent / "solutions" / "13_interview_drill.ipynb"

#: {exercise: the check of mha_course.checks that marks it}, in the drill's order.
CHECKS = {
    "13.1": "check_head_scale", "13.2": "check_causal_off_by_one",
    "13.3": "check_mask_after_softmax", "13.4": "check_minus_inf_bias",
    "13.5": "check_fully_masked_rows", "13.6": "check_merge_order",
    "13.7": "check_output_width", "13.8": "check_dropout_scale", "13.9": "check_chunk_mask",
    "13.10": "check_cache_reset", "13.11": "check_gqa_prefill", "13.12": "check_rope_values",
    "13.13": "check_window_off_by_one", "13.14": "check_mla_cache_formula",
    "13.15": "check_timed_build",
    "13.16": "check_nucleus", "13.17": "check_temperature", "13.18": "check_decode_offset",
    "13.19": "check_prefix_keys", "13.20": "check_speculative_rollback",
    "13.21": "check_speculative_residual",
    "13.22": "check_row_parallel_bias", "13.23": "check_packed_documents",
    "13.24": "check_lse_merge",
    "13.25": "check_softcap_before_mask", "13.26": "check_per_head_qk_norm",
}

#: {exercise: the property its broken function breaks}: every exercise but the timed build
#: (13.15, written from a blank cell) hands the learner a broken function.
P = properties
BROKEN_PROPERTY = {
    "13.1": P.HEADS, "13.2": P.SELF, "13.3": P.SUMS, "13.4": P.FINITE, "13.5": P.MASKED_ZERO,
    "13.6": P.EQUIVARIANT, "13.7": drill.attention.FITS, "13.8": drill.attention.EXPECTED,
    "13.9": P.CACHED, "13.10": drill.decoding.PROMPTS, "13.11": drill.decoding.GROUPS,
    "13.12": drill.decoding.SHIFT, "13.13": drill.decoding.WINDOW,
    "13.14": drill.decoding.MEASURED,
    "13.16": drill.generation.NUCLEUS, "13.17": drill.generation.TEMPERATURE, "13.18": P.CACHED,
    "13.19": drill.serving.PREFIX, "13.20": drill.serving.SPEC_GREEDY,
    "13.21": drill.serving.SPEC_SAMPLE,
    "13.22": drill.parallel.TP_EQUAL, "13.23": drill.parallel.DOCS, "13.24": drill.parallel.MERGE,
    "13.25": P.MASKED_ZERO, "13.26": drill.block2025.PER_HEAD,
}

#: What a cell uses beyond np, mha_course and checks (the drill's setup cell imports them).
NAMES = {"Cluster": Cluster, "ContiguousCache": ContiguousCache}


def drill_cells(exercises=None) -> dict[str, dict[str, str]]:
    """{exercise: {role: source}} of the drill's broken and solution cells (the broken cell as
    "broken"); only ``exercises`` when given, each of which must be there."""
    found: dict[str, dict[str, str]] = {}
    for cell in nbformat.read(DRILL, as_version=4).cells:
        info = cell.metadata.get("mha_course", {})
        role = "broken" if info.get("kind") == "broken" else info.get("role")
        if "exercise" in info and role in ("broken", "solution"):
            found.setdefault(info["exercise"], {})[role] = cell.source
    if exercises is None:
        return found
    missing = sorted(set(exercises) - set(found))
    assert not missing, f"exercises {missing} are not in {DRILL.name}"
    return {ex: found[ex] for ex in exercises}


CELLS = drill_cells()


def define(source: str, prefix: str, **names):
    """Run a cell's source (its demo lines too) and return the function it defines whose name
    starts with ``prefix``; ``names`` are what the cell may use beyond np, mha_course, checks
    and :data:`NAMES`."""
    ns = {"np": np, "mha_course": mha_course, "checks": checks, "__name__": "drill", **NAMES,
          **names}
    exec(compile(source, f"<{prefix}>", "exec"), ns)  # noqa: S102  (the course's own cells)
    found = [n for n, v in ns.items() if callable(v) and getattr(v, "__module__", "") == "drill"
             and n.startswith(prefix)]
    return ns[found[0]]


@functools.cache
def broken(ex: str):
    """Exercise ``ex``'s broken function, as its cell defines it (its demo's output dropped)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return define(CELLS[ex]["broken"], "buggy_")


def _solution(ex: str):
    with contextlib.redirect_stdout(io.StringIO()):
        return define(CELLS[ex]["solution"], "")


#: {exercise: (check name, the solution cell's function)} for all 26 exercises.
CORRECT_13 = {ex: (name, _solution(ex)) for ex, name in CHECKS.items()}
