"""The nbgrader export: the chosen exercises as an nbgrader *source* assignment.

Not taught in a lesson: ``python -m mha_course export nbgrader 03.1 03.2 03.5 -o COURSE``
writes, for an instructor who grades on JupyterHub with nbgrader (tested with nbgrader 0.9.6):

- ``COURSE/source/NAME/NAME.ipynb``: the exercises as ``assign`` bundles them, with the
  solutions and nbgrader's cell metadata (``metadata.nbgrader``, schema version 3): each answer
  cell an *autograded answer* (``solution: true``; its solution already sits between nbgrader's
  own ``### BEGIN SOLUTION`` / ``### END SOLUTION`` markers, which ``generate_assignment``
  replaces by ``# YOUR CODE HERE``); each check cell *autograder tests*, locked and worth the
  exercise's points (``grade: true, points``; split evenly when an exercise has several); the
  title, setup, task and hint cells *read-only* (``locked: true``), so the checks and the setup
  that imports them are put back from the source when ``autograde`` runs;
- ``COURSE/nbgrader_config.py``: the cell timeout of the course's checker, and as long a wait
  for a cell's last output (nbgrader's IOPub timeout: at its default, 4 s, a slow cell's late
  output makes nbgrader drop the whole submission), students created at autograde time;
- ``COURSE/NAME.assignment.json``: the same assignment for ``python -m mha_course check
  --assignment`` (to compare, or to regrade a submission with the course's own checker);
- ``COURSE/wheels/``: the course as a wheel, for the JupyterHub image (the kernels that run the
  students' notebooks, and nbgrader's autograde, import the checks from it);
- ``COURSE/README.md``: the steps, for the instructor, with the due date as nbgrader's
  gradebook takes it (``nbgrader db assignment add NAME --duedate=...``: nbgrader 0.9.6 reads
  a due date from its database only, not from its config), so nbgrader records how late each
  submission is.

A check cell passes when the course's check prints its line, and fails when it raises: that is
how nbgrader scores an autograder-tests cell (any error, or any output on stderr, is 0
points), so nbgrader's points equal the course checker's for the same answers.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import nbformat

from ..authoring.assignment import Assignment, assignment_text, number
from ..authoring.bundle import build_bundle
from ..authoring.catalog import exercises
from ..authoring.notebooks import info, notebook_text
from ..running.run import DEFAULT_TIMEOUT
from .common import assignment_name, build_wheel, checker_requirements, refuse_to_overwrite

#: The version of nbgrader this export is tested with (``tests/test_export_nbgrader.py``).
NBGRADER_VERSION = "0.9.6"
SCHEMA_VERSION = 3


def _meta(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked,
            "schema_version": SCHEMA_VERSION, "solution": solution}
    if grade:
        meta["points"] = points
    return meta


def _id(exercise: str | None, role: str) -> str:
    """``ex03_1-check``: a grade id nbgrader accepts (letters, digits, ``_`` and ``-``)."""
    return (f"ex{exercise.replace('.', '_')}-{role}" if exercise else role)


def source_notebook(assignment: Assignment, solutions=None, timeout: float = DEFAULT_TIMEOUT):
    """The nbgrader source notebook of ``assignment`` (see the module docstring)."""
    nb = build_bundle(list(assignment.exercises), solutions, stub=False, assignment=assignment)
    catalog = exercises(solutions)
    heading = assignment.title or "Assignment: exercises " + ", ".join(assignment.exercises)
    points = ", ".join(f"{x}: {number(assignment.points[x])}" for x in assignment.exercises)
    title = nb.cells[0]
    title.source = (
        f"# {heading}\n\nPoints: {points} ({number(assignment.max_points)} in all)."
        + (f" Due: {assignment.due.replace('T', ' ')}." if assignment.due else "")
        + "\n\nIn each cell that says `# YOUR CODE HERE`, replace `raise NotImplementedError()` "
        "with your answer, then run the check cell below it: it prints `Exercise NN.M passed` "
        "or says what is wrong. The check cells are what is graded (the points of an exercise "
        "are earned when its check passes); they and the setup cell are put back as they are "
        "here when your notebook is graded. Before you submit, restart the kernel and run all "
        "cells (or press Validate).")
    checks_of = {x: [c for c in nb.cells if info(c).get("exercise") == x
                     and info(c).get("role") == "check"] for x in assignment.exercises}
    used: dict[str, int] = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        meta = info(cell)
        exercise, role = meta.get("exercise"), meta.get("role", "text")
        base = _id(exercise, {"solution": "answer", "check": "check"}.get(role, role))
        if cell is title:
            base = "title"
        used[base] = used.get(base, 0) + 1
        grade_id = base if used[base] == 1 else f"{base}-{used[base]}"
        if role == "solution":
            cell.metadata["nbgrader"] = _meta(grade_id, solution=True)
        elif role == "check":
            share = assignment.points[exercise] / len(checks_of[exercise])
            cell.metadata["nbgrader"] = _meta(grade_id, grade=True, locked=True,
                                              points=int(share) if share == int(share) else share)
        else:
            cell.metadata["nbgrader"] = _meta(grade_id, locked=True)
    nb.metadata["mha_course"]["nbgrader"] = {
        "exercises": {x: {"title": catalog[x].title, "stars": catalog[x].stars,
                          "points": assignment.points[x]} for x in assignment.exercises},
        "tested_with": f"nbgrader {NBGRADER_VERSION}", "timeout": timeout}
    return nb


def nbgrader_due(assignment: Assignment) -> str | None:
    """The due date as ``nbgrader db assignment add --duedate`` takes it: ISO 8601 with an offset.

    nbgrader reads a time without an offset as UTC; the course reads it as local time, so a due
    date without one gets this machine's offset (the README shows it, to be edited if the
    course's time zone is another).

    >>> nbgrader_due(Assignment(("03.1",), due="2030-01-01T23:59:59+01:00"))
    '2030-01-01T23:59:59+01:00'
    """
    when = assignment.due_datetime()
    if when is None:
        return None
    return (when if when.tzinfo is not None else when.astimezone()).isoformat()


def config_text(name: str, timeout: float, due: str | None = None) -> str:
    seconds = math.ceil(timeout)
    due_lines = (f"""
# The due date, {due}, is not a setting: nbgrader {NBGRADER_VERSION} reads it from its
# gradebook, where README.md's step 3 puts it:
#     nbgrader db assignment add {name} --duedate={due}
# nbgrader then records how late each submission is; to give a late one 0 points:
# c.LateSubmissionPlugin.penalty_method = "zero"
""" if due else "")
    return f'''\
# nbgrader settings for the mha-course assignment "{name}"
# (written by `python -m mha_course export nbgrader`; tested with nbgrader {NBGRADER_VERSION}).
# Merge these lines into your course's nbgrader_config.py if you have one.
c = get_config()  # noqa: F821 (nbgrader provides it)

# The course's checker stops a cell after {timeout:g} s; nbgrader's autograde does the same.
c.Execute.timeout = {seconds}
# After a cell finishes, nbgrader waits this long for its last output. At nbgrader's default,
# 4 s, a slow cell (a big allocation) raises "Timeout waiting for IOPub output" and nbgrader
# drops the whole submission; this gives a cell's last output as long as the cell itself.
c.Execute.iopub_timeout = {seconds}
# Students appear in the gradebook when their first submission is autograded.
c.Autograde.create_student = True
# What replaces each solution in the students' version (nbgrader's default, said explicitly).
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
{due_lines}'''


def readme_text(name: str, assignment: Assignment, wheel: str) -> str:
    rows = "\n".join(f"| {x} | {number(assignment.points[x])} |" for x in assignment.exercises)
    requirements = " ".join(f"'{r}'" for r in checker_requirements() if not r.startswith(
        ("pytest", "nbval", "psutil")))
    due = nbgrader_due(assignment)
    if due:
        step3 = (f"Put the due date into nbgrader's gradebook (nbgrader {NBGRADER_VERSION} "
                 "takes it from there only):\n\n"
                 f"       nbgrader db assignment add {name} --duedate={due}\n\n"
                 "   (the assignment's due date, with this machine's UTC offset if the "
                 "assignment gave\n   none: nbgrader reads a time without one as UTC). "
                 "`nbgrader autograde` then records\n   how late each submission is, from the "
                 "`timestamp.txt` that `nbgrader collect` copies\n   with it; it takes no points "
                 "off unless you set\n   `c.LateSubmissionPlugin.penalty_method = \"zero\"` "
                 "(a late submission then scores 0).")
    else:
        step3 = ("The assignment has no due date. To give it one: `nbgrader db assignment "
                 f"add {name}\n   --duedate=2030-01-31T23:59:00+00:00` (ISO 8601; nbgrader reads "
                 "a time without an\n   offset as UTC).")
    return f"""\
# {assignment.title or name}: an nbgrader assignment from mha-course

Written by `python -m mha_course export nbgrader`; tested with nbgrader {NBGRADER_VERSION}.

| exercise | points |
|---|---|
{rows}

Total: {number(assignment.max_points)} points.

## On the JupyterHub

1. Install the course where the students' kernels and nbgrader run (the checks are in it):
   `pip install wheels/{wheel}` (and its packages: `pip install {requirements}`), and
   nbgrader: `pip install nbgrader=={NBGRADER_VERSION}`.
2. Copy `source/{name}/` into your course folder's `source/` (this folder is a course folder
   already: you can also work in it), and merge `nbgrader_config.py` into yours.
3. {step3}
4. `nbgrader generate_assignment {name}` writes the students' version into
   `release/{name}/`: each solution becomes `# YOUR CODE HERE`; release it as usual
   (`nbgrader release_assignment {name}`, or the Formgrader).
5. Collect the submissions (`nbgrader collect {name}`, or copy them to
   `submitted/STUDENT/{name}/{name}.ipynb`), then `nbgrader autograde {name}`.
6. `nbgrader export` writes `grades.csv` (one row per student and assignment).

An exercise's points are earned when its check cell passes; the check cells, the setup cell that
imports the checks, and the task text are read-only and put back from `source/` when nbgrader
grades, so a student cannot edit a check away. What nbgrader cannot stop (code in a student's
answer replacing a check in memory) is in the trust model of the course's
docs/instructors.md; the course's own
checker grades against the same assignment and runs the checks where a student's code cannot
reach them:

    python -m mha_course check submitted/ --assignment {name}.assignment.json

(submitted/STUDENT/{name}/ folders are submissions; the gradebook's points are the same as
nbgrader's for the same answers.)
"""


def export_nbgrader(assignment: Assignment, out: Path, solutions=None, name: str | None = None,
                    force: bool = False, timeout: float = DEFAULT_TIMEOUT) -> list[Path]:
    """Write the nbgrader course folder ``out`` (see the module docstring); return its files.

    Refuses to overwrite any of its files unless ``force``; other files in ``out`` (an
    existing course: its gradebook, other assignments) are left alone.
    """
    out = Path(out)
    name = assignment_name(assignment, name)
    notebook = out / "source" / name / f"{name}.ipynb"
    spec = out / f"{name}.assignment.json"
    config, readme = out / "nbgrader_config.py", out / "README.md"
    refuse_to_overwrite([notebook, spec, config, readme], force)
    nb = source_notebook(assignment, solutions, timeout)
    notebook.parent.mkdir(parents=True, exist_ok=True)
    notebook.write_text(notebook_text(nb), encoding="utf-8", newline="\n")
    spec.write_text(assignment_text(dataclasses.replace(assignment, notebook=notebook.name)),
                    encoding="utf-8", newline="\n")
    config.write_text(config_text(name, timeout, nbgrader_due(assignment)), encoding="utf-8",
                      newline="\n")
    wheel = build_wheel(out / "wheels")
    readme.write_text(readme_text(name, assignment, wheel.name), encoding="utf-8", newline="\n")
    nbformat.validate(nbformat.reads(notebook.read_text(encoding="utf-8"), as_version=4))
    return [notebook, spec, config, readme, wheel]
