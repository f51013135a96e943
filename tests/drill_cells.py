"""Lesson 15's drill as a learner sees it, for the tests of its checks: one table of its
exercises and the functions its cells define.

The drill's tests (``tests/test_checks_drill.py``, the contract over all 26 exercises, and
``tests/test_checks_lesson13*.py``, the wrong fixes each group of checks names) read each
spot-the-bug exercise's broken function and its solution from
``solutions/15_interview_drill.ipynb`` (the single source of the exercises), run them, and hand
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

DRILL = Path(__file__).resolve().parent.parent / "solutions" / "15_interview_drill.ipynb"

#: {exercise: the check of mha_course.checks that marks it}, in the drill's order.
CHECKS = {
    "15.1": "check_head_scale", "15.2": "check_causal_off_by_one",
    "15.3": "check_mask_after_softmax", "15.4": "check_minus_inf_bias",
    "15.5": "check_fully_masked_rows", "15.6": "check_merge_order",
    "15.7": "check_output_width", "15.8": "check_dropout_scale", "15.9": "check_chunk_mask",
    "15.10": "check_cache_reset", "15.11": "check_gqa_prefill", "15.12": "check_rope_values",
    "15.13": "check_window_off_by_one", "15.14": "check_mla_cache_formula",
    "15.15": "check_timed_build",
    "15.16": "check_nucleus", "15.17": "check_temperature", "15.18": "check_decode_offset",
    "15.19": "check_prefix_keys", "15.20": "check_speculative_rollback",
    "15.21": "check_speculative_residual",
    "15.22": "check_row_parallel_bias", "15.23": "check_packed_documents",
    "15.24": "check_lse_merge",
    "15.25": "check_softcap_before_mask", "15.26": "check_per_head_qk_norm",
}

#: {exercise: the property its broken function breaks}: every exercise but the timed build
#: (15.15, written from a blank cell) hands the learner a broken function.
P = properties
BROKEN_PROPERTY = {
    "15.1": P.HEADS, "15.2": P.SELF, "15.3": P.SUMS, "15.4": P.FINITE, "15.5": P.MASKED_ZERO,
    "15.6": P.EQUIVARIANT, "15.7": drill.attention.FITS, "15.8": drill.attention.EXPECTED,
    "15.9": P.CACHED, "15.10": drill.decoding.PROMPTS, "15.11": drill.decoding.GROUPS,
    "15.12": drill.decoding.SHIFT, "15.13": drill.decoding.WINDOW,
    "15.14": drill.decoding.MEASURED,
    "15.16": drill.generation.NUCLEUS, "15.17": drill.generation.TEMPERATURE, "15.18": P.CACHED,
    "15.19": drill.serving.PREFIX, "15.20": drill.serving.SPEC_GREEDY,
    "15.21": drill.serving.SPEC_SAMPLE,
    "15.22": drill.parallel.TP_EQUAL, "15.23": drill.parallel.DOCS, "15.24": drill.parallel.MERGE,
    "15.25": P.MASKED_ZERO, "15.26": drill.block2025.PER_HEAD,
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
