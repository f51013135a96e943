"""The drill's exercise cells as a learner sees them, for the tests of its checks.

``tests/test_checks_lesson13*.py`` read each spot-the-bug exercise's broken function and its
solution from ``solutions/13_interview_drill.ipynb`` (the single source of the exercises), run
them, and hand the functions to the checks: what is tested is what is shipped.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import numpy as np

import mha_course
from mha_course import checks

DRILL = Path(__file__).resolve().parent.parent / "solutions" / "13_interview_drill.ipynb"


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


def define(source: str, prefix: str, **names):
    """Run a cell's source (its demo lines too) and return the function it defines whose name
    starts with ``prefix``; ``names`` are what the cell may use beyond np, mha_course, checks."""
    ns = {"np": np, "mha_course": mha_course, "checks": checks, "__name__": "drill", **names}
    exec(compile(source, f"<{prefix}>", "exec"), ns)  # noqa: S102  (the course's own cells)
    found = [n for n, v in ns.items() if callable(v) and getattr(v, "__module__", "") == "drill"
             and n.startswith(prefix)]
    return ns[found[0]]
