"""Lesson 06's timing cell cannot save a wrong output: its sanity check fails on wrong timings.

nbval does not compare the timing cell's output (``nbval-ignore-output``), so the cell asserts
what it prints with ``check_decode_timings``, defined in the lesson's helpers cell. These tests
take that function from the notebook itself, show that it refuses timings that contradict the
lesson (a recomputed step no slower than a cached one, a time that is not a positive number),
and that the committed output passes it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

LESSON = Path(__file__).resolve().parent.parent / "notebooks" / "06_decoding.ipynb"
NS = [64, 128, 256, 512, 1024, 2048]


def _cells():
    return nbformat.read(LESSON, as_version=4).cells


@pytest.fixture(scope="module")
def check_decode_timings():
    """The function as the lesson defines it, compiled from the cell's source alone."""
    cell = next(c for c in _cells() if "def check_decode_timings" in c.source)
    tree = ast.parse(cell.source)
    func = next(node for node in tree.body
                if isinstance(node, ast.FunctionDef) and node.name == "check_decode_timings")
    namespace = {"np": np}
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(LESSON), "exec"), namespace)
    return namespace["check_decode_timings"]


def test_the_timing_cell_ignores_its_output_and_calls_the_check():
    cell = next(c for c in _cells() if "t_cached = [min(ten_cached_steps(n)" in c.source)
    assert "nbval-ignore-output" in cell.metadata.get("tags", [])
    assert "check_decode_timings(ns_t, t_cached, t_recompute)" in cell.source
    first_print = cell.source.index("print(")
    assert cell.source.index("check_decode_timings(") < first_print, "check before printing"


def _refusal(check, *timings):
    """What the check says against ``timings``: its AssertionError's message, or None."""
    try:
        check(NS, *timings)
    except AssertionError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("cached, recompute", [
    ([1e-4] * 6, [2e-4, 4e-4, 1e-3, 4e-3, 2e-2, 8e-2]),  # what the lesson shows
    # only the longest prompt must show the cache winning: at small n the recomputed forward
    # may be the faster one (the step's fixed costs), and the cell still says nothing false
    ([1e-4] * 6, [5e-5, 5e-5, 5e-5, 5e-5, 5e-5, 1.01e-4]),
])
def test_sane_timings_pass(check_decode_timings, cached, recompute):
    assert _refusal(check_decode_timings, cached, recompute) is None


@pytest.mark.parametrize("cached, recompute, message", [
    ([1e-4] * 6, [2e-4, 4e-4, 1e-3, 4e-3, 2e-2, 5e-5], r"is not slower than the cached one"),
    ([1e-4] * 6, [2e-4, 4e-4, 1e-3, 4e-3, 2e-2, 1e-4], r"is not slower than the cached one"),
    ([1e-4, np.nan, 1e-4, 1e-4, 1e-4, 1e-4], [1e-3] * 6, r"not finite"),
    ([1e-4] * 6, [1e-3, 1e-3, -1e-3, 1e-3, 1e-3, 1e-3], r"not positive"),
    ([1e-4] * 5, [1e-3] * 6, r"one cached and one recomputed time per n"),
])
def test_wrong_timings_are_refused(check_decode_timings, cached, recompute, message):
    with pytest.raises(AssertionError, match=message):
        check_decode_timings(NS, cached, recompute)


def test_the_committed_output_passes_the_check(check_decode_timings):
    cell = next(c for c in _cells() if "t_cached = [min(ten_cached_steps(n)" in c.source)
    text = "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")
    rows = re.findall(r"n =\s+(\d+): cached step\s+([\d.]+) ms, recompute\s+([\d.]+) ms", text)
    assert [int(n) for n, _, _ in rows] == NS, f"unexpected committed output: {text[:200]!r}"
    cached = [float(a) / 1e3 for _, a, _ in rows]
    recompute = [float(b) / 1e3 for _, _, b in rows]
    assert _refusal(check_decode_timings, cached, recompute) is None
