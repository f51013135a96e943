"""Every committed notebook is tidy (``mha_course.grading.tidy``) and was run top to bottom.

Tidy: the kernelspec ipykernel installs (so JupyterLab does not rewrite the file on open), no
per-cell timing metadata, no saved widget state or live-widget output, nbval markers as cell tags
only. Run: lessons and solutions were executed from a fresh kernel (execution counts 1..N), so
the outputs nbval compares are the ones a learner sees. ``make notebook NB=...`` does both.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from mha_course.grading.tidy import problems

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(
    p.relative_to(ROOT).as_posix()
    for folder in ("notebooks", "solutions", "exercises")
    for p in (ROOT / folder).glob("*.ipynb")
)


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_is_tidy(path):
    found = problems(nbformat.read(ROOT / path, as_version=4))
    assert not found, f"{path} (run `make notebook NB={path}`): " + "; ".join(found[:5])


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if not p.startswith("exercises/")])
def test_lessons_and_solutions_were_run_top_to_bottom(path):
    nb = nbformat.read(ROOT / path, as_version=4)
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path}: execution counts {counts[:8]}...; re-run it with `make notebook NB={path}`")
