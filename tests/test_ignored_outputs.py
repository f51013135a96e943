"""The cells of every lesson, deep dive and solution whose output nbval ignores still check what
they show.

A timing or a live widget cannot be compared by nbval, so a wrong output could be saved again and
again (review W4, issue 27). Each such cell of these lessons asserts the sanity of what it prints
or draws; this test finds the assertions and feeds the training cells of lesson 08 a wrong
history, which they must refuse.
"""

from __future__ import annotations

import ast
import pathlib
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.relative_to(ROOT).as_posix()
                   for folder in ("notebooks", "notebooks/deep_dives", "solutions")
                   for p in (ROOT / folder).glob("*.ipynb")
                   if p.name != "app.ipynb")  # the app's page: tests/browser/test_app.py


def _ignored_cells(path):
    nb = nbformat.read(ROOT / path, as_version=4)
    return [c for c in nb.cells if c.cell_type == "code"
            and "nbval-ignore-output" in c.metadata.get("tags", [])]


def _asserts(cell):
    """The cell's checks, compiled on their own: its assert statements, and the assignments
    they read that only unpack what the cell shows (``loss_copy = history_copy.loss``)."""
    tree = ast.parse(cell.source)
    keep = [node for node in tree.body if isinstance(node, ast.Assert)]
    if keep:
        keep = [node for node in tree.body if isinstance(node, ast.Assert)
                or (isinstance(node, ast.Assign) and "(" not in ast.unparse(node.value))]
    return [compile(ast.Module(keep, type_ignores=[]), "<cell>", "exec")] if keep else []


#: Ignored-output cells that only show a live widget. The saved notebook holds no output for
#: them (nbexec drops widget views), so nothing stale can be saved; the test named here runs the
#: cell's code and checks the widget it shows, since asserts about widget internals are test code,
#: not lesson code (newcomer trial, item 7).
WIDGET_CELLS = {
    ("notebooks/04_multi_head_attention.ipynb", "explorer()"):
        "tests/test_explorer.py::test_lesson_04s_explorer_cell_shows_the_default_setting",
    ("notebooks/deep_dives/06b_long_contexts_and_many_sequences.ipynb", "cache_memory_widget()"):
        "tests/test_cache_memory.py::test_widget_controls_match_the_documented_interface",
    ("notebooks/07_flash_attention.ipynb", "tile_stepper()"):
        "tests/test_tile_stepper.py::test_widget_controls_and_first_picture",
}


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_every_ignored_output_cell_asserts_what_it_shows(path):
    cells = _ignored_cells(path)
    for cell in cells:
        if (path, cell.source.strip()) in WIDGET_CELLS:
            assert not cell.outputs, f"{path}: the widget cell {cell.source!r} saved an output"
            continue
        assert _asserts(cell), f"{path}: an ignored-output cell checks nothing:\n{cell.source}"


@pytest.mark.parametrize(("cell", "test"), WIDGET_CELLS.items())
def test_each_widget_only_cell_is_in_its_lesson_and_checked_by_the_test_it_names(cell, test):
    path, source = cell
    assert source in [c.source.strip() for c in _ignored_cells(path)], (path, source)
    file, name = test.split("::")
    assert f"def {name}(" in (ROOT / file).read_text(encoding="utf-8"), test


def _training_cells():
    cells = [c for c in _ignored_cells("notebooks/08_learning.ipynb") if "train(" in c.source]
    assert len(cells) == 2  # the copy model and the reverse model
    return cells


def _history(seconds=10.0, steps=300, first=3.0, last=0.01):
    return SimpleNamespace(seconds=seconds, loss=np.linspace(first, last, steps))


@pytest.mark.parametrize("wrong", [
    {"seconds": -1.0}, {"seconds": 1e4}, {"steps": 299}, {"last": 5.0}, {"last": np.nan}])
def test_the_training_cells_refuse_a_wrong_history(wrong):
    for cell in _training_cells():
        name = "history_copy" if "history_copy" in cell.source else "history_reverse"
        for code in _asserts(cell):  # a right history passes every assertion
            exec(code, {"np": np, name: _history()})
        with pytest.raises(AssertionError):
            for code in _asserts(cell):
                exec(code, {"np": np, name: _history(**wrong)})
