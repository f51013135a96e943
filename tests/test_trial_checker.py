"""The instructor's trial of 2 December 2026, items 7, 9, 11, 13 and 15, on the checker.

- 7: a wrong notebook (another lesson's exercise notebook) is said to be one, once, first;
- 9: metadata tampering (exercise list, points, a replaced check cell) is a note in the row;
- 11: nothing is written into the submissions folder, even when a submission changes itself
  during the check: the changed bytes are kept beside the CSV;
- 13: a CSV that exists is never overwritten: the next run writes ``NAME-2.csv`` and says so;
- 15: rows in roster order (else by name, ignoring case); ``assign --list`` imports no nbval,
  pytest or jupyter_client.

One class of the fixture lessons (97, 98) is graded once, unsandboxed (so a submission can
write its own file), from the command line as an instructor types it.
"""

from __future__ import annotations

import copy
import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from cli_helpers import run_cli_split as run_cli

from mha_course.grading.authoring.assignment import load_assignment
from mha_course.grading.authoring.bundle import build_bundle
from mha_course.grading.authoring.generate import generate, load_solutions
from mha_course.grading.authoring.notebooks import info
from mha_course.grading.reporting.intake import collect, read_roster
from mha_course.grading.running import check as check_module
from mha_course.grading.running.check import NOT_IN_WRONG_NOTEBOOK, tampering, wrong_notebook

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "solutions"
RIGHT = {"97.1": "def square(x):\n    return x * x", "98.1": "def double(x):\n    return x * 2",
         "98.2": "answer = 6 * 7"}


def answered(base: Path, target: Path, answers: dict, edit=None) -> Path:
    """``base`` with ``answers`` (exercise -> source) in its solution cells, then ``edit(nb)``."""
    nb = nbformat.read(base, as_version=4)
    for cell in nb.cells:
        if info(cell).get("role") == "solution" and info(cell)["exercise"] in answers:
            cell.source = answers[info(cell)["exercise"]]
    if edit is not None:
        edit(nb)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return target


def tamper(nb) -> None:
    """What the trial's hostile student did: other exercises and 100 points in the metadata,
    the check cell of 98.2 replaced by one that always passes."""
    meta = nb.metadata["mha_course"]
    meta["assignment"] = ["97.1"]
    for item in meta["assignment_info"]["exercises"]:
        item["points"] = 100
    check = next(c for c in nb.cells if info(c) == {"exercise": "98.2", "role": "check"})
    check.source = "print('all checks passed')"


def listing(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trial")
    solutions = tmp / "solutions"
    shutil.copytree(FIXTURES, solutions)
    exercises = tmp / "exercises"
    generate(solutions, exercises)
    code, out, err = run_cli("assign", "97.1", "98.1", "98.2", "-o", tmp / "hw1.ipynb",
                             "--title", "Homework 1", "--solutions", solutions, cwd=tmp)
    assert code == 0, out + err
    subs = tmp / "submissions"
    answered(tmp / "hw1.ipynb", subs / "ada.ipynb", RIGHT, tamper)
    answered(exercises / "97_fixture.ipynb", subs / "Bob.ipynb", RIGHT)  # the wrong notebook
    cy = subs / "cy.ipynb"
    rewrite = f"answer = 6 * 7\nopen({str(cy)!r}, 'w').write('changed by cy')"
    answered(tmp / "hw1.ipynb", cy, {**RIGHT, "98.2": rewrite})
    before = listing(subs)
    out_dir = tmp / "out"
    out_dir.mkdir()
    (out_dir / "results.csv").write_text("the instructor's own file")
    args = ["check", subs, "--assignment", tmp / "hw1.assignment.json", "--solutions",
            solutions, "--csv", out_dir / "results.csv", "--feedback", tmp / "feedback",
            "--no-sandbox", "--timeout", "30"]
    with pytest.MonkeyPatch.context() as patch:  # unsandboxed, the checker restores package
        # files a run changed: let it guard a copy, not the checkout being edited
        shutil.copytree(ROOT / "mha_course", tmp / "package" / "mha_course",
                        ignore=shutil.ignore_patterns("__pycache__"))
        patch.setattr(check_module, "PACKAGE_DIR", tmp / "package" / "mha_course")
        patch.setenv("MHA_COURSE_KERNEL_USER", "same")  # as a laptop: cy's write succeeds
        code, out, err = run_cli(*args, cwd=tmp)
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(
        (out_dir / "results-2.csv").read_text(encoding="utf-8")))} \
        if (out_dir / "results-2.csv").exists() else {}
    return {"tmp": tmp, "code": code, "out": out, "err": err, "subs": subs, "before": before,
            "out_dir": out_dir, "rows": rows, "cy": cy}


def report_of(out: str, name: str) -> str:
    start = out.index(f"== {name}")
    end = out.find("\n== ", start + 1)
    return out[start:] if end < 0 else out[start:end]


# ------------------------------------------------------------- item 13: never overwrite


def test_an_existing_csv_leads_to_the_next_free_name_and_the_run_says_so(graded):
    out_dir = graded["out_dir"]
    assert graded["code"] == 0, graded["out"] + graded["err"]
    assert (out_dir / "results.csv").read_text() == "the instructor's own file"
    assert f"note: {out_dir / 'results.csv'} exists, so this run writes " \
           f"{out_dir / 'results-2.csv'}" in graded["out"]
    assert f"wrote {out_dir / 'results-2.csv'}" in graded["out"]
    assert set(graded["rows"]) == {"ada", "Bob", "cy"}


# ------------------------------------------------ item 11: the submissions are not written


def test_nothing_is_written_into_the_submissions_folder(graded):
    assert listing(graded["subs"]) == graded["before"]


def test_a_submission_that_changed_itself_is_kept_beside_the_csv_and_the_report_says_where(
        graded):
    kept = graded["out_dir"] / "results-2.changed-during-check" / "cy.ipynb"  # after its CSV
    assert kept.read_text() == "changed by cy"
    warning = graded["err"][graded["err"].index("warning: these files changed"):]
    line = next(ln for ln in warning.splitlines() if ln.startswith(f"  {graded['cy']}: "))
    assert line.endswith(f"restored as it was before the check, the changed bytes kept in "
                         f"{kept} (nothing is written into the submissions folder)"), line
    assert graded["rows"]["cy"]["total"] == "4"  # graded from the bytes read at the start


# ---------------------------------------------------------------- item 7: wrong notebook


def test_a_wrong_notebook_is_said_once_and_first_and_scores_what_it_answers(graded):
    report = report_of(graded["out"], "Bob")
    said = ("WRONG NOTEBOOK: this looks like exercises/97_fixture.ipynb (lesson 97's exercise "
            'notebook), not the assignment hw1.ipynb ("Homework 1"): 2 of its 3 exercises are '
            "not in it (98.1 98.2); hand in the assignment's notebook")
    assert report.count("WRONG NOTEBOOK") == 1 and said in report, report
    lines = report.splitlines()
    first = next(n for n, ln in enumerate(lines) if ln.strip() == said)
    assert first < next(n for n, ln in enumerate(lines) if "Exercise 97.1" in ln), report
    assert "Exercises 98.1 98.2  MISSING: not in this notebook" in report
    assert "(deleted?)" not in report
    row = graded["rows"]["Bob"]
    assert (row["total"], row["97.1"], row["98.1"], row["98.2 status"]) == ("1", "1", "0",
                                                                              "missing")
    assert said.replace("WRONG NOTEBOOK: ", "wrong notebook: ") in row["notes"]
    feedback = (graded["tmp"] / "feedback" / "Bob.md").read_text()
    assert feedback.count("this looks like exercises/97_fixture.ipynb") == 1
    assert "(deleted?)" not in feedback and NOT_IN_WRONG_NOTEBOOK in feedback


def test_the_right_notebook_with_missing_cells_is_not_called_wrong(graded):
    sols = load_solutions(graded["tmp"] / "solutions")
    hw = load_assignment(graded["tmp"] / "hw1.assignment.json")
    nb = nbformat.read(graded["tmp"] / "hw1.ipynb", as_version=4)
    assert wrong_notebook(nb, hw, sols, {"97.1", "98.1", "98.2"}) == ""
    lesson98 = nbformat.read(graded["tmp"] / "exercises" / "98_fixture.ipynb", as_version=4)
    assert wrong_notebook(lesson98, hw, sols, {"97.1"}) == ""  # most of it is there
    assert "exercises/98_fixture.ipynb" in wrong_notebook(lesson98, hw, sols, {"97.1", "98.1"})
    del lesson98.metadata["mha_course"]  # the metadata lost: its exercise cells say lesson 98
    assert "exercises/98_fixture.ipynb" in wrong_notebook(lesson98, hw, sols, {"97.1", "98.1"})


# -------------------------------------------------------------- item 9: tampering reported


def test_metadata_tampering_is_ignored_and_reported_in_the_row(graded):
    row = graded["rows"]["ada"]
    assert (row["total"], row["max"]) == ("4", "4"), row
    notes = row["notes"].split(" | ")
    assert "ignored: the notebook's metadata lists the exercises 97.1, not the assignment's " \
           "97.1 98.1 98.2; graded against the assignment" in notes, notes
    assert "ignored: the notebook's metadata gives other points (97.1: 100, 98.1: 100, " \
           "98.2: 100); the assignment file's points count" in notes, notes
    assert any(n.startswith("ignored: the check cell of Exercise 98.2 (cell ") and
               n.endswith("is not the course's; the course's check ran instead")
               for n in notes), notes
    assert not any(n.startswith("ignored: ") for n in graded["rows"]["cy"]["notes"].split(" | "))


def test_tampering_notes_are_a_pure_function_of_the_notebook(graded):
    hw = load_assignment(graded["tmp"] / "hw1.assignment.json")
    ref = build_bundle(hw.exercises, graded["tmp"] / "solutions", stub=False)
    honest = nbformat.read(graded["tmp"] / "hw1.ipynb", as_version=4)
    assert tampering(honest, ref, hw) == []
    bad = copy.deepcopy(honest)
    tamper(bad)
    assert tampering(bad, ref, hw) == tampering(copy.deepcopy(bad), ref, hw)
    assert len(tampering(bad, ref, hw)) == 3


# --------------------------------------------------------------------- item 15: the order


def test_rows_follow_the_roster_else_the_name_ignoring_case(graded, tmp_path):
    assert [r for r in graded["rows"]] == ["ada", "Bob", "cy"]  # not Bob, ada, cy
    roster = tmp_path / "roster.csv"
    roster.write_text("file,id,name\ncy,3,Cyrus Young\nBob,2,Bob Bauer\n", encoding="utf-8")
    subs = [s.name for s in collect([graded["subs"]], read_roster(roster)).submissions]
    assert subs == ["Cyrus Young", "Bob Bauer", "ada"]  # the roster's order; others after
    canvas = tmp_path / "canvas"
    canvas.mkdir()
    for name in ("zed_1_2_hw1.ipynb", "andersalice_12345_678_hw1.ipynb", "Mia_3_4_hw1.ipynb"):
        (canvas / name).write_text("{}")
    assert [s.name for s in collect([canvas]).submissions] == ["andersalice", "Mia", "zed"]


def test_assign_list_imports_no_nbval_pytest_or_jupyter_client():
    code = ("import sys, contextlib, io\n"
            "from mha_course.grading.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    assert main(['assign', '--list']) == 0\n"
            "assert '03.1' in out.getvalue()\n"
            "heavy = ('nbval', 'pytest', '_pytest', 'jupyter_client', 'matplotlib', 'torch',"
            " 'ipykernel', 'zmq')\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"assign --list imports {result.stdout.strip()}"
