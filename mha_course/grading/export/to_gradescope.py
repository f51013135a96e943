"""The Gradescope export: an autograder zip that grades with the course's own checker.

Not taught in a lesson: ``python -m mha_course export gradescope 03.1 03.2 -o autograder.zip``
writes, for an instructor whose institution grades on Gradescope (each submission in its own
container; the layout and results format are Gradescope's "Autograder Specifications"):

- ``autograder.zip``, with at its root ``setup.sh`` (run once when Gradescope builds the image:
  Python, bubblewrap, a virtual environment with the checker's packages from the package index
  and then the course from the wheel inside the zip, without its dependencies, so pip has no
  missing JupyterLab to complain about; nothing else is fetched),
  ``run_autograder`` (run for every submission: :func:`run_autograder` checks the submitted
  notebook against the assignment with the course's checker, in grading mode, and writes
  ``/autograder/results/results.json``), ``wheels/`` (the course), ``solutions/`` (the
  reference notebooks of the lessons used; like ``assignment.json``, mode 0600 in the zip, and
  made unreadable to the student's kernel for each run: see :func:`run_autograder`),
  ``assignment.json``, ``autograder.json`` (the cell
  timeout), ``nbval_sanitize.cfg`` and the starter notebook;
- beside the zip, the students' starter notebook ``NAME.ipynb`` (what ``assign`` writes).

``results.json`` holds one test per exercise (its name with stars and title, ``score`` and
``max_score`` from the assignment's points, ``status``, and the checker's own words as
``output``), the total ``score``, and as the top-level ``output`` the student's feedback in
Markdown (:mod:`mha_course.grading.reporting.feedback`). A crash, a hang or a missing exercise
loses only
that exercise; a submission without a notebook, or with one that cannot be read, scores 0 with
the reason. Both scripts honour ``MHA_COURSE_AUTOGRADER_ROOT`` (default ``/autograder``), so
the tests run them for real on a folder laid out like Gradescope's.
"""

from __future__ import annotations

import json
import stat
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from ..authoring.assignment import Assignment, assignment_text, load_assignment, number
from ..authoring.bundle import build_bundle
from ..authoring.catalog import exercises
from ..authoring.generate import load_solutions
from ..authoring.notebooks import ExerciseError, course_root, lesson_of, notebook_text
from ..reporting.feedback import SAID, feedback_markdown, scrub
from ..reporting.gradebook import grade_row
from ..reporting.verdicts import cap_line
from ..running.check import Checker
from ..running.run import DEFAULT_TIMEOUT
from .common import assignment_name, build_wheel, checker_requirements, refuse_to_overwrite

ROOT_ENV = "MHA_COURSE_AUTOGRADER_ROOT"
#: The note :func:`~mha_course.grading.reporting.gradebook.grade_row` adds to a row without
#: notebooks.
EMPTY_NOTE = "no notebooks in this submission"
#: Longest ``output`` of one test (Gradescope collapses it; a 5 MB print must not travel).
OUTPUT_CAP = 4000

SETUP_SH = f"""\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu). It
# installs Python and bubblewrap (the checker's sandbox; where the container forbids it, the
# checker runs without it), then, in a virtual environment, the checker's packages from the
# package index and the course from the wheel in this zip. Nothing else is downloaded.
set -euo pipefail
AG="${{{ROOT_ENV}:-/autograder}}"
if [ -z "${{MHA_COURSE_SKIP_APT:-}}" ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip \\
        bubblewrap >/dev/null
fi
"${{MHA_COURSE_PYTHON:-python3}}" -m venv "$AG/venv"
# The checker's packages first, then the course without its dependencies: they are those
# packages, less the learner's editor (JupyterLab), which grading does not need. In the other
# order pip would check the installed course against the environment and print "ERROR:
# mha-course ... requires jupyterlab", which is harmless but alarming.
"$AG/venv/bin/python" -m pip install -q -r "$AG/source/requirements.txt"
"$AG/venv/bin/python" -m pip install -q --no-deps "$AG"/source/wheels/*.whl
"$AG/venv/bin/python" -c "import mha_course.grading.export.to_gradescope"
"""

RUN_AUTOGRADER = f"""\
#!/usr/bin/env bash
# Gradescope runs this for every submission (working folder /autograder): the course's checker
# grades the submitted notebook and writes /autograder/results/results.json.
AG="${{{ROOT_ENV}:-/autograder}}"
cd "$AG" || exit 1
exec "$AG/venv/bin/python" -m mha_course.grading.export.to_gradescope "$AG"
"""


def _readme(name: str, assignment: Assignment) -> str:
    rows = "\n".join(f"| {x} | {number(assignment.points[x])} |" for x in assignment.exercises)
    return f"""\
# {assignment.title or name}: a Gradescope autograder from mha-course

| exercise | points |
|---|---|
{rows}

Upload this zip as a programming assignment's autograder (Ubuntu base image), with
{number(assignment.max_points)} points. Students submit their `{name}.ipynb` (the starter
notebook written beside the zip); each exercise is one test, worth its points when its check
passes; the checker's messages are the tests' output and the feedback the submission's.
"""


def export_gradescope(assignment: Assignment, out: Path, solutions=None, name: str | None = None,
                      force: bool = False, timeout: float = DEFAULT_TIMEOUT) -> list[Path]:
    """Write the autograder zip ``out`` and the starter beside it; return both paths."""
    out = Path(out)
    if out.suffix.lower() != ".zip":
        raise ExerciseError(f"{out}: the autograder's file name must end in .zip")
    name = assignment_name(assignment, name)
    starter = out.with_name(f"{name}.ipynb")
    refuse_to_overwrite([out, starter], force)
    solutions = solutions if solutions is not None else course_root() / "solutions"
    loaded = load_solutions(solutions)
    lessons = sorted({lesson_of(x) for x in assignment.exercises})
    nb = build_bundle(list(assignment.exercises), loaded, stub=True, assignment=assignment)
    starter_text = notebook_text(nb)
    sanitize = course_root() / "tests" / "nbval_sanitize.cfg"
    with tempfile.TemporaryDirectory(prefix="mha-course-export-") as tmp:
        wheel = build_wheel(Path(tmp))
        files = {
            "setup.sh": SETUP_SH.encode(), "run_autograder": RUN_AUTOGRADER.encode(),
            "requirements.txt": ("\n".join(checker_requirements()) + "\n").encode(),
            f"wheels/{wheel.name}": wheel.read_bytes(),
            "assignment.json": assignment_text(assignment).encode(),
            "autograder.json": (json.dumps({"name": name, "starter": starter.name,
                                            "timeout": timeout}, indent=1) + "\n").encode(),
            starter.name: starter_text.encode(), "README.md": _readme(name, assignment).encode(),
        }
        for lesson in lessons:
            path = loaded[lesson][0]
            files[f"solutions/{path.name}"] = path.read_bytes()
        if sanitize.is_file():
            files["nbval_sanitize.cfg"] = sanitize.read_bytes()
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for file_name, data in files.items():
                entry = zipfile.ZipInfo(file_name, date_time=(1980, 1, 1, 0, 0, 0))
                executable = file_name in ("setup.sh", "run_autograder")
                private = file_name.startswith("solutions/") or file_name == "assignment.json"
                mode = 0o755 if executable else 0o600 if private else 0o644  # the grader's only
                entry.external_attr = (mode | stat.S_IFREG) << 16
                entry.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(entry, data)
    starter.write_text(starter_text, encoding="utf-8", newline="\n")
    return [out, starter]


# ---------------------------------------------------------------- inside Gradescope's image


def submitted_notebooks(folder: Path) -> list[Path]:
    """The notebooks a submission holds (any depth, ``.ipynb`` in any case, no hidden ones)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() == ".ipynb"
                  and not any(part.startswith((".", "__"))
                              for part in p.relative_to(folder).parts))


def _student(root: Path) -> str:
    try:
        meta = json.loads((root / "submission_metadata.json").read_text(encoding="utf-8"))
        return str(meta["users"][0]["name"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "student"


def results_for(row, assignment: Assignment, catalog: dict, roots, seconds: float) -> dict:
    """The ``results.json`` object of one graded submission (Gradescope's format)."""
    tests = []
    for exercise in assignment.exercises:
        verdict = row.verdicts[exercise]
        entry = catalog.get(exercise)
        stars = "★" * entry.stars if entry else ""
        title = f" — {entry.title}" if entry and entry.title else ""
        said = SAID.get(verdict.status, verdict.status)
        text = said + (f": {scrub(verdict.message, roots)}" if verdict.message else "")
        text += "".join(f"\nnote: {scrub(n, roots)}" for n in verdict.notes)
        if len(text) > OUTPUT_CAP:
            text = cap_line(text, OUTPUT_CAP)
        tests.append({"name": f"Exercise {exercise} {stars}{title}".replace("  ", " "),
                      "number": exercise, "score": row.points[exercise],
                      "max_score": assignment.points[exercise],
                      "status": "passed" if verdict.status == "passed" else "failed",
                      "output": text, "visibility": "visible"})
    return {"score": row.total, "execution_time": round(seconds, 1),
            "output": feedback_markdown(row, assignment, catalog, roots),
            "output_format": "md", "test_output_format": "text", "visibility": "visible",
            "stdout_visibility": "hidden", "tests": tests}


def run_autograder(root: str | Path) -> dict:
    """Grade ``root/submission`` against ``root/source``; write and return ``results.json``.

    In the sandbox the kernel cannot see ``root``; without it (Gradescope runs this as root)
    each kernel runs as an unprivileged user of its own, and ``source/`` (the solutions, the
    assignment), the submission and the results are unreadable to it for the run
    (:mod:`mha_course.grading.running.account`); the log says which held.
    """
    start = time.monotonic()
    root = Path(root)
    source, submission = root / "source", root / "submission"
    private = [source / "assignment.json", source, submission, root / "results"]
    assignment = load_assignment(source / "assignment.json")
    settings = json.loads((source / "autograder.json").read_text(encoding="utf-8"))
    timeout = float(settings.get("timeout", DEFAULT_TIMEOUT))
    catalog = exercises(source / "solutions")
    sanitize = source / "nbval_sanitize.cfg"
    checker = Checker.create(source / "solutions", timeout, hidden=[root],
                             sanitize=sanitize if sanitize.is_file() else None,
                             assignment=assignment, private=private)
    if checker.unsandboxed:
        how = (", each kernel as an unprivileged user of its own" if checker.own_users else
               "; the kernel runs as this user and can read the solutions")
        print(f"note: checking without a sandbox: {checker.unsandboxed}{how}", flush=True)
    notebooks = submitted_notebooks(submission)
    checker.watch(notebooks)
    results = []
    with checker:  # the private folders get their permissions back
        for path in notebooks:
            try:
                result = checker.check(path)
            except ExerciseError as exc:
                result = exc
            results.append((path, result))
            print(result if isinstance(result, ExerciseError) else
                  f"{path.name}: " + ", ".join(f"{v.exercise} {v.status}"
                                               for v in result.verdicts), flush=True)
        for line in checker.changed():
            print(f"warning: changed or written during the check: {line}", flush=True)
    row = grade_row(_student(root), "", results, assignment)
    if not notebooks:  # say why once, and what to do: not also grade_row's generic note
        why = (f"no notebook (.ipynb) in the submission: upload your "
               f"{settings.get('starter', 'notebook')}")
        row.notes = [n for n in row.notes if n != EMPTY_NOTE]
        for verdict in row.verdicts.values():
            verdict.message = why
    for path, result in results:
        if isinstance(result, ExerciseError):
            row.notes.append(f"{path.name}: {result}")
    data = results_for(row, assignment, catalog, [submission, source, root],
                       time.monotonic() - start)
    out = root / "results" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"score {number(row.total)} / {number(row.max_points)}; wrote {out}", flush=True)
    return data


if __name__ == "__main__":
    run_autograder(sys.argv[1] if len(sys.argv) > 1 else "/autograder")
