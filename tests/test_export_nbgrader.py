"""The nbgrader export, checked by the real nbgrader (the version the export pins).

The first tests read the exported source notebook (no nbgrader needed): every cell carries
nbgrader's metadata as nbgrader's schema version 3 documents it (``grade``, ``solution``,
``locked``, ``points``, ``grade_id``, ``schema_version``), answers are autograded-answer cells,
checks are locked autograder-tests cells worth the exercise's points, the rest is read-only.

Then a course folder goes through nbgrader as an instructor's would: ``nbgrader
generate_assignment`` makes the students' version, three students' submissions (right, wrong,
untouched) go through ``nbgrader autograde``, and ``nbgrader export`` yields the same points as
the course's own checker (``check --assignment``) gives the same notebooks. nbgrader lives in
``.venv-nbgrader`` (``make nbgrader``; ``MHA_COURSE_NBGRADER`` may name another executable);
without it these tests skip, unless ``MHA_COURSE_REQUIRE_NBGRADER=1`` (CI).
"""

from __future__ import annotations

import copy
import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from cli_helpers import make_class, run_cli

from mha_course.grading.export.to_nbgrader import NBGRADER_VERSION

ROOT = Path(__file__).resolve().parent.parent
IDS = ["03.1", "03.2", "03.5"]  # ★, ★★, ★★★: 1 + 2 + 3 points
#: nbgrader's cell metadata, schema version 3, as its documentation describes the keys.
NBGRADER_KEYS = {"grade", "grade_id", "locked", "points", "schema_version", "solution", "task",
                 "checksum", "cell_type"}






def nbgrader_executable() -> Path:
    """The nbgrader to test with; skip (or fail when CI requires it) without one."""
    for candidate in (os.environ.get("MHA_COURSE_NBGRADER"),
                      ROOT / ".venv-nbgrader" / "bin" / "nbgrader"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    why = ("nbgrader is not installed: `make nbgrader` puts nbgrader " + NBGRADER_VERSION
           + " into .venv-nbgrader")
    if os.environ.get("MHA_COURSE_REQUIRE_NBGRADER") == "1":
        pytest.fail(f"MHA_COURSE_REQUIRE_NBGRADER=1 but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    course = tmp_path_factory.mktemp("nbgrader") / "course"
    code, out = run_cli("export", "nbgrader", *IDS, "-o", course, "--name", "hw1", "--title",
                        "Week 2: attention", "--points", "03.5=4", cwd=ROOT)
    assert code == 0, out
    return course, out


def test_the_export_writes_a_course_folder_and_refuses_to_overwrite_it(exported, tmp_path):
    course, out = exported
    names = sorted(str(p.relative_to(course)) for p in course.rglob("*") if p.is_file())
    assert names == ["README.md", "hw1.assignment.json", "nbgrader_config.py",
                     "source/hw1/hw1.ipynb", "wheels/mha_course-0.1.0-py3-none-any.whl"]
    assert "exported exercises 03.1 03.2 03.5 (7 points) for nbgrader" in out
    spec = json.loads((course / "hw1.assignment.json").read_text())
    assert spec["exercises"] == [{"id": "03.1", "points": 1}, {"id": "03.2", "points": 2},
                                 {"id": "03.5", "points": 4}]
    assert spec["title"] == "Week 2: attention" and spec["notebook"] == "hw1.ipynb"
    before = (course / "source" / "hw1" / "hw1.ipynb").read_bytes()
    code, text = run_cli("export", "nbgrader", "03.1", "-o", course, "--name", "hw1", cwd=ROOT)
    assert code == 2 and "already exists; use --force to overwrite it" in text
    assert (course / "source" / "hw1" / "hw1.ipynb").read_bytes() == before
    code, text = run_cli("export", "nbgrader", "03.1", "--assignment", course /
                         "hw1.assignment.json", "-o", tmp_path, cwd=ROOT)
    assert code == 2 and "give exercise ids or --assignment FILE, not both" in text
    code, text = run_cli("export", "nbgrader", "--assignment", course / "hw1.assignment.json",
                         "-o", tmp_path / "again", cwd=ROOT)
    assert code == 0 and "(7 points)" in text
    assert (tmp_path / "again" / "source" / "week-2-attention" / "week-2-attention.ipynb"
            ).is_file()


def test_every_cell_has_nbgraders_metadata_and_the_checks_hold_the_points(exported):
    course, _ = exported
    nb = nbformat.read(course / "source" / "hw1" / "hw1.ipynb", as_version=4)
    seen, points = set(), {}
    for cell in nb.cells:
        meta = cell.metadata["nbgrader"]
        assert set(meta) <= NBGRADER_KEYS and meta["schema_version"] == 3
        assert {"grade", "solution", "locked", "grade_id"} <= set(meta)
        assert re.fullmatch(r"[a-zA-Z0-9_\-]+", meta["grade_id"]) and meta["grade_id"] not in seen
        seen.add(meta["grade_id"])
        role = cell.metadata.get("mha_course", {}).get("role", "text")
        kind = (meta["grade"], meta["solution"], meta["locked"])
        if role == "solution":  # an autograded answer: the solution between nbgrader's markers
            assert kind == (False, True, False) and cell.cell_type == "code"
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
        elif role == "check":  # autograder tests, locked, worth the exercise's points
            assert kind == (True, False, True) and cell.cell_type == "code"
            exercise = cell.metadata["mha_course"]["exercise"]
            points[exercise] = points.get(exercise, 0) + meta["points"]
        else:  # the title, setup, tasks, hints: read-only
            assert kind == (False, False, True) and "points" not in meta
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert points == {"03.1": 1, "03.2": 2, "03.5": 4}
    assert "# YOUR CODE HERE" in nb.cells[0].source and "Week 2: attention" in nb.cells[0].source
    config = (course / "nbgrader_config.py").read_text()
    assert "c.Execute.timeout = 30" in config and "c.Autograde.create_student = True" in config
    compile(config, "nbgrader_config.py", "exec")
    readme = (course / "README.md").read_text()
    for step in ("nbgrader generate_assignment hw1", "nbgrader autograde hw1", "nbgrader export",
                 "pip install wheels/mha_course-0.1.0-py3-none-any.whl",
                 f"nbgrader=={NBGRADER_VERSION}", "--assignment hw1.assignment.json"):
        assert step in readme, step


def nbgrader(executable: Path, *args, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{executable.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run([executable, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=1800)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def graded(exported, tmp_path_factory):
    """generate_assignment, three submissions, autograde, export: nbgrader's grades.csv, and
    the course checker's gradebook for the same notebooks."""
    executable = nbgrader_executable()
    version = nbgrader(executable, "--version", cwd=ROOT)
    assert f"nbgrader version {NBGRADER_VERSION}" in version, version
    source, _ = exported
    course = tmp_path_factory.mktemp("nbgrader-run") / "course"
    shutil.copytree(source, course)
    nbgrader(executable, "generate_assignment", "hw1", cwd=course)
    released = nbformat.read(course / "release" / "hw1" / "hw1.ipynb", as_version=4)
    classes = make_class()
    answers = {"right": {x: classes.RIGHT[x] for x in IDS},
               "wrong": {"03.1": classes.WRONG["03.1"][0], "03.2": classes.RIGHT["03.2"],
                         "03.5": classes.WRONG["03.5"][0]},
               "untouched": {}}
    for student, chosen in answers.items():
        nb = copy.deepcopy(released)
        for cell in nb.cells:
            exercise = cell.metadata.get("mha_course", {}).get("exercise")
            if cell.metadata["nbgrader"].get("solution") and exercise in chosen:
                cell.source = chosen[exercise]
        target = course / "submitted" / student / "hw1" / "hw1.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
    before = {p: p.read_bytes() for p in (course / "submitted").rglob("*.ipynb")}
    ours = course / "ours.csv"
    code, report = run_cli("check", course / "submitted", "--assignment",
                           course / "hw1.assignment.json", "--jobs", 2, "--csv", ours, cwd=ROOT)
    assert code == 0, report
    assert all(p.read_bytes() == data for p, data in before.items())
    nbgrader(executable, "autograde", "hw1", cwd=course)
    nbgrader(executable, "export", cwd=course)
    with open(course / "grades.csv", newline="") as f:
        theirs = {row["student_id"]: row for row in csv.DictReader(f)}
    with open(ours, newline="") as f:
        ours_rows = {row["student"]: row for row in csv.DictReader(f)}
    return {"theirs": theirs, "ours": ours_rows, "report": report, "course": course}


def test_nbgrader_gives_the_points_the_course_checker_gives(graded):
    theirs, ours = graded["theirs"], graded["ours"]
    assert sorted(theirs) == sorted(ours) == ["right", "untouched", "wrong"]
    expected = {"right": 7, "wrong": 2, "untouched": 0}  # wrong: only 03.2 (2 points) is right
    for student, total in expected.items():
        assert float(theirs[student]["score"]) == total, theirs[student]
        assert float(theirs[student]["max_score"]) == 7
        assert float(ours[student]["total"]) == total, graded["report"]
        assert float(ours[student]["max"]) == 7
    assert [ours["wrong"][f"{x} status"] for x in IDS] == ["failed", "passed", "failed"]
    # nbgrader's stub (`raise NotImplementedError()`) is "not attempted", as the course's is
    assert [ours["untouched"][f"{x} status"] for x in IDS] == ["not attempted"] * 3
    assert "Likely mistake: scores not scaled by √d_k" in graded["report"]


def test_autograde_put_back_the_locked_checks_and_graded_each_check_cell(graded):
    """nbgrader's autograded notebook: the check cells are the source's, each scored."""
    course = graded["course"]
    nb = nbformat.read(course / "autograded" / "wrong" / "hw1" / "hw1.ipynb", as_version=4)
    checks = [c for c in nb.cells if c.metadata["nbgrader"].get("grade")]
    assert [c.source for c in checks] == ["checks.check_attention_scores(attention_scores)",
                                          "checks.check_attention(attention)",
                                          "checks.check_causal_self_attention("
                                          "causal_self_attention)"]
    failed = [any(o.output_type == "error" for o in c.outputs) for c in checks]
    assert failed == [True, False, True]


#: A hostile submission's first answer cell: every check becomes a no-op in its own kernel.
FAKE_CHECKS = ("import mha_course.checks as _checks\n"
               "for _name in dir(_checks):\n"
               "    if _name.startswith('check_'):\n"
               "        setattr(_checks, _name, lambda *args, **kwargs: None)\n")


def test_a_faked_check_earns_every_nbgrader_point_and_nothing_from_the_checker(exported,
                                                                               tmp_path):
    """The gap the README's nbgrader section states: nbgrader runs each check in the student's
    kernel, after the student's cells, so one answer cell that replaces the checks earns every
    point of the assignment there, answering nothing; the course's checker (grading mode: the
    checks run in the grader) gives the same notebook 0."""
    executable = nbgrader_executable()
    source, _ = exported
    course = tmp_path / "course"
    shutil.copytree(source, course)
    nbgrader(executable, "generate_assignment", "hw1", cwd=course)
    nb = nbformat.read(course / "release" / "hw1" / "hw1.ipynb", as_version=4)
    answers = [c for c in nb.cells if c.metadata["nbgrader"].get("solution")]
    assert [c.metadata["mha_course"]["exercise"] for c in answers] == IDS
    assert all("raise NotImplementedError()" in c.source for c in answers)  # nothing answered
    answers[0].source = FAKE_CHECKS + answers[0].source
    target = course / "submitted" / "hostile" / "hw1" / "hw1.ipynb"
    target.parent.mkdir(parents=True)
    nbformat.write(nb, target)
    ours = tmp_path / "ours.csv"
    code, report = run_cli("check", course / "submitted", "--assignment",
                           course / "hw1.assignment.json", "--csv", ours, cwd=ROOT)
    assert code == 0, report
    nbgrader(executable, "autograde", "hw1", cwd=course)
    nbgrader(executable, "export", cwd=course)
    with open(course / "grades.csv", newline="") as f:
        theirs = {row["student_id"]: row for row in csv.DictReader(f)}
    with open(ours, newline="") as f:
        ours_row = {row["student"]: row for row in csv.DictReader(f)}["hostile"]
    assert float(theirs["hostile"]["score"]) == float(theirs["hostile"]["max_score"]) == 7
    assert float(ours_row["total"]) == 0 and float(ours_row["max"]) == 7, report
    assert [ours_row[f"{x} status"] for x in IDS] == ["not attempted"] * 3, report
