"""The notebook tidier (``python -m mha_course tidy``) on small synthetic notebooks, and on two
lessons whose saved traceback is moved to another machine."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import get_sanitize_patterns

from mha_course.grading.authoring.tidy import (
    KERNELSPEC,
    PATH_REWRITES,
    WIDGET_VIEW,
    portable_paths,
    problems,
    tidy,
)
from mha_course.grading.cli import main


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


# ------------------------------------------------------ paths of the machine a notebook ran on

ROOT = Path(__file__).resolve().parent.parent
ESC = "\x1b"
#: (what a run on some machine saved, what tidy keeps)
MACHINE_PATHS = [
    (f"{ESC}[36mFile {ESC}[39m{ESC}[32m/work/wt/claims-rest/mha_course/softmax.py:62{ESC}[39m, "
     f"in {ESC}[36msoftmax{ESC}[39m", f"{ESC}[36mFile {ESC}[39m{ESC}[32mmha_course/softmax.py:62"
     f"{ESC}[39m, in {ESC}[36msoftmax{ESC}[39m"),
    ("File /home/ana/mha-course/mha_course/models/tiny_model.py:208, in fit",
     "File mha_course/models/tiny_model.py:208, in fit"),
    ("/root/x/.venv/lib/python3.12/site-packages/torch/nn/functional.py:5: UserWarning: slow\n",
     "<site-packages>/torch/nn/functional.py:5: UserWarning: slow\n"),
    ("/usr/lib/python3/dist-packages/numpy/core.py", "<site-packages>/numpy/core.py"),
    ("/tmp/ipykernel_4242/123456.py:3: RuntimeWarning: overflow",
     "<cell>:3: RuntimeWarning: overflow"),
    ("File /usr/lib/python3.12/json/decoder.py:337, in decode",
     "File <stdlib>/json/decoder.py:337, in decode"),
    ("wrote /tmp/mha-course-clone-1/x/notebooks/figure.png", "wrote notebooks/figure.png"),
    # a package file named tests/ inside the package stays the package's
    ("/work/main/mha_course/tests/helpers.py", "mha_course/tests/helpers.py"),
]
#: Text that only looks like a path: kept as it is.
NOT_MACHINE_PATHS = [
    "https://github.com/org/repo/blob/main/mha_course/softmax.py",
    "see mha_course/softmax.py and ../exercises/03_x.ipynb",
    "a/b/tests/x.py", "ratio 3/4 tests/s", "<site-packages>/numpy/core.py",
]


def test_portable_paths_keeps_the_part_after_the_checkout_or_the_site_packages():
    for saved, kept in MACHINE_PATHS:
        assert portable_paths(saved) == kept, saved
        assert portable_paths(kept) == kept, kept  # idempotent
    for text in NOT_MACHINE_PATHS:
        assert portable_paths(text) == text


def notebook_with_paths():
    """A tidy notebook whose outputs hold every path of MACHINE_PATHS (and its clean twin)."""
    saved, kept = (
        [nbformat.v4.new_output("error", ename="ValueError", evalue=side[6],
                                traceback=[side[0], side[1], "ValueError: " + side[5]]),
         nbformat.v4.new_output("stream", name="stderr", text=side[2] + side[3]),
         nbformat.v4.new_output("execute_result", data={"text/plain": repr(side[4])},
                                execution_count=1)]
        for side in zip(*MACHINE_PATHS, strict=True))
    nbs = []
    for outputs in (saved, kept):
        nb = nbformat.v4.new_notebook(metadata={"kernelspec": KERNELSPEC})
        cell = nbformat.v4.new_code_cell("f(bad)", id="c1", execution_count=1, outputs=outputs)
        cell.metadata["tags"] = ["raises-exception"]
        nb.cells += [nbformat.v4.new_markdown_cell("Paths such as /work/x/mha_course/ in prose",
                                                   id="c0"), cell]
        nbs.append(nb)
    return nbs


def test_tidy_rewrites_machine_paths_in_outputs_only_and_is_idempotent(tmp_path):
    saved, kept = notebook_with_paths()
    assert problems(saved) == ["cell 1: a path of the machine it ran on in its output"]
    assert problems(kept) == []
    path = tmp_path / "lesson.ipynb"
    nbformat.write(saved, path)
    assert main(["tidy", str(path)]) == 0
    expected = tmp_path / "expected.ipynb"
    nbformat.write(kept, expected)
    assert path.read_bytes() == expected.read_bytes()  # the prose and the source untouched
    assert main(["tidy", str(path)]) == 0 and path.read_bytes() == expected.read_bytes()


#: The lessons that save a traceback through the package (raises-exception cells).
TRACEBACKS = b"\\u001b[32mmha_course/"
LESSONS_WITH_TRACEBACKS = sorted(p.relative_to(ROOT).as_posix()
                                 for p in (ROOT / "notebooks").glob("*.ipynb")
                                 if TRACEBACKS in p.read_bytes())


def test_lessons_save_tracebacks_through_the_package_as_mha_course_paths():
    assert len(LESSONS_WITH_TRACEBACKS) >= 5, (
        f"only {LESSONS_WITH_TRACEBACKS} save a traceback as mha_course/...: run "
        "`python -m mha_course tidy notebooks/*.ipynb solutions/*.ipynb exercises/*.ipynb`")


@pytest.mark.parametrize("lesson", LESSONS_WITH_TRACEBACKS[:3])
def test_tidy_on_a_lesson_changes_only_the_paths_byte_for_byte(lesson, tmp_path):
    """A committed lesson run on another machine: the same bytes with that machine's paths in
    its traceback. Tidy gives back the committed lesson, byte for byte."""
    original = (ROOT / lesson).read_bytes()
    moved = original.replace(TRACEBACKS, TRACEBACKS.replace(b"mha_course/",
                                                            b"/home/ana/clone/mha_course/"))
    path = tmp_path / "lesson.ipynb"
    path.write_bytes(moved)
    assert main(["tidy", str(path)]) == 0
    assert path.read_bytes() == original


def test_the_sanitize_file_repeats_the_rewrites_so_nbval_compares_fresh_paths_with_saved():
    """nbval compares printed text (not tracebacks) after its sanitize file's substitutions: a
    fresh run prints this machine's paths, the saved output the tidied ones."""
    text = (ROOT / "tests" / "nbval_sanitize.cfg").read_text(encoding="utf-8")
    pairs = get_sanitize_patterns(text)
    assert [p for p in pairs if p in PATH_REWRITES] == list(PATH_REWRITES), (
        "tests/nbval_sanitize.cfg must hold tidy's PATH_REWRITES, in order")

    def sanitize(s):
        for regex, replace in pairs:
            s = re.sub(regex, replace, s)
        return s

    for saved, kept in MACHINE_PATHS:
        assert sanitize(saved) == sanitize(kept) == kept
