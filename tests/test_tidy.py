"""The notebook tidier (``python -m mha_course tidy``) on small synthetic notebooks."""

from __future__ import annotations

import nbformat

from mha_course.grading.cli import main
from mha_course.grading.tidy import KERNELSPEC, WIDGET_VIEW, problems, tidy


def messy_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    cell = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nexplorer()")
    cell.metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "text/plain": "VBox(children=(...))", WIDGET_VIEW: {"model_id": "abc"}}),
        nbformat.v4.new_output("stream", text="summary line\n")]
    raising = nbformat.v4.new_code_cell("  # NBVAL_RAISES_EXCEPTION\nf(bad)")
    raising.metadata["tags"] = ["raises-exception"]
    nb.cells += [cell, raising, nbformat.v4.new_markdown_cell("# NBVAL_SKIP in prose stays")]
    return nb


def test_tidy_fixes_every_problem_and_keeps_the_rest():
    nb = messy_notebook()
    assert len(problems(nb)) == 6
    clean = tidy(nb)
    assert problems(clean) == []
    assert clean.metadata["kernelspec"] == KERNELSPEC and "widgets" not in clean.metadata
    widget_cell, raising, prose = clean.cells
    assert widget_cell.source == "explorer()"
    assert widget_cell.metadata["tags"] == ["nbval-ignore-output"]
    assert [o.output_type for o in widget_cell.outputs] == ["stream"]  # the summary is kept
    assert raising.source == "f(bad)" and raising.metadata["tags"] == ["raises-exception"]
    assert prose.source == "# NBVAL_SKIP in prose stays"
    assert len(problems(nb)) == 6  # the input is not changed


def test_tidy_command_writes_only_untidy_files_and_check_mode_writes_nothing(tmp_path, capsys):
    path = tmp_path / "lesson.ipynb"
    nbformat.write(messy_notebook(), path)
    before = path.read_bytes()
    assert main(["tidy", "--check", str(path)]) == 1
    assert path.read_bytes() == before
    assert main(["tidy", str(path)]) == 0
    assert "tidied" in capsys.readouterr().out
    after = path.read_bytes()
    assert main(["tidy", "--check", str(path)]) == 0
    assert main(["tidy", str(path)]) == 0 and path.read_bytes() == after
