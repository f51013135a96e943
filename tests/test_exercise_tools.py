"""The exercise tools: generate (solutions -> exercises), check (the learner's verdict), assign.

Most tests use the two tiny fixture solution notebooks in tests/data/solutions (lessons 97 and
98, with their check code inline), so they test the tools and not the course's checks. The
tests at the end run the same tools on the real solutions/ and exercises/.

Each `check` spawns a kernel, so the tests share runs through module-scoped fixtures.
"""

from __future__ import annotations

import copy
import csv
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from cli_helpers import CRASH, FIXTURES, GOOD, HANG, WRONG, run_cli
from cli_helpers import make_class as load_make_class
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager

from mha_course.grading.authoring.bundle import build_bundle
from mha_course.grading.authoring.generate import (
    exercise_ids,
    find_stale,
    generate,
    learner_work,
    load_solutions,
    solution_paths,
)
from mha_course.grading.authoring.notebooks import ExerciseError, id_key, info, notebook_text
from mha_course.grading.reporting.report import format_result
from mha_course.grading.running import run, sandbox
from mha_course.grading.running.check import check_notebook

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
ANSI = re.compile(r"\x1b\[")
ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")


def learner_copy(exercise_nb: Path, target: Path, answers: dict, outputs_from: Path | None = None):
    """Write a learner's notebook: the exercise notebook with ``answers`` (id -> source) typed in,
    a scratch cell of their own, and (optionally) every output saved from ``outputs_from``."""
    nb = nbformat.read(exercise_nb, as_version=4)
    saved = nbformat.read(outputs_from, as_version=4) if outputs_from else None
    for index, cell in enumerate(nb.cells):
        meta = info(cell)
        if meta.get("role") == "solution" and meta["exercise"] in answers:
            cell.source = answers[meta["exercise"]]
        if saved is not None and cell.cell_type == "code":
            cell.outputs = copy.deepcopy(saved.cells[index].outputs)
            cell.execution_count = saved.cells[index].execution_count
    nb.cells.append(nbformat.v4.new_code_cell("print('my scratch work')\nraise ValueError('oops')"))
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return target


@pytest.fixture(scope="module")
def fixture_exercises(tmp_path_factory):
    out = tmp_path_factory.mktemp("exercises")
    generate(FIXTURES, out)
    return out


# ---------------------------------------------------------------------------------- generate


def test_generate_twice_gives_identical_bytes_and_stubs_every_solution(tmp_path):
    generate(FIXTURES, tmp_path / "a")
    generate(FIXTURES, tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["97_fixture.ipynb", "98_fixture.ipynb"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    nb = nbformat.read(tmp_path / "a" / "98_fixture.ipynb", as_version=4)
    sol = nbformat.read(FIXTURES / "98_fixture.ipynb", as_version=4)
    assert [c.id for c in nb.cells] == [c.id for c in sol.cells]
    solution_cells = [c for c in nb.cells if info(c).get("role") == "solution"]
    assert [c.source for c in solution_cells] == [
        'def double(x):\n    """x -> 2 * x."""\n'
        '    raise NotImplementedError("Exercise 98.1: return twice x")',
        'raise NotImplementedError("Exercise 98.2: set answer to 6 * 7 (the \\"answer\\")")',
    ]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert "BEGIN SOLUTION" not in (tmp_path / "a" / "98_fixture.ipynb").read_text()


BAD_SOURCES = {
    "no markers": ("return 2 * x", {"task": "t"}, "no '### BEGIN SOLUTION'"),
    "no task": ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", {}, 'no "task"'),
    "unbalanced": ("### BEGIN SOLUTION\nx = 1\n", {"task": "t"}, "unbalanced markers"),
    "reversed": ("### END SOLUTION\nx = 1\n### BEGIN SOLUTION", {"task": "t"}, "comes before"),
}


@pytest.mark.parametrize("case", sorted(BAD_SOURCES))
def test_generate_refuses_a_bad_solution_cell_and_writes_nothing(tmp_path, case):
    source, extra, expected = BAD_SOURCES[case]
    nb = nbformat.read(FIXTURES / "98_fixture.ipynb", as_version=4)
    cell = next(c for c in nb.cells if info(c).get("role") == "solution")
    cell.source = source
    cell.metadata["mha_course"] = {"exercise": "98.1", "role": "solution", **extra}
    (tmp_path / "sol").mkdir()
    nbformat.write(nb, tmp_path / "sol" / "98_fixture.ipynb")
    shutil.copy(FIXTURES / "97_fixture.ipynb", tmp_path / "sol")
    code, out = run_cli("generate", "--solutions", tmp_path / "sol", "--out", tmp_path / "out")
    assert code == 2
    assert expected in out and "98_fixture.ipynb: cell 3 (exercise 98.1)" in out
    assert not (tmp_path / "out").exists()


def test_stale_exercises_are_detected_with_the_fix_in_the_message(tmp_path):
    generate(FIXTURES, tmp_path)
    assert find_stale(FIXTURES, tmp_path) == []
    path = tmp_path / "98_fixture.ipynb"
    path.write_text(path.read_text().replace("return twice x", "return 2x"))
    assert find_stale(FIXTURES, tmp_path) == [f"{path} differs from its solution"]
    code, out = run_cli("generate", "--verify", "--solutions", FIXTURES, "--out", tmp_path)
    assert code == 1 and "run `make exercises`" in out


def test_generate_does_not_overwrite_a_learners_work_without_force(tmp_path):
    generate(FIXTURES, tmp_path)
    path = learner_copy(tmp_path / "98_fixture.ipynb", tmp_path / "98_fixture.ipynb", GOOD)
    before = path.read_bytes()
    code, out = run_cli("generate", "--solutions", FIXTURES, "--out", tmp_path)
    assert code == 2 and "looks like your work (exercise 98.1 has been answered)" in out
    assert path.read_bytes() == before
    code, out = run_cli("generate", "--force", "--solutions", FIXTURES, "--out", tmp_path)
    assert code == 0 and find_stale(FIXTURES, tmp_path) == []


# ------------------------------------------------------------------------------------- check


def test_stubs_are_not_attempted_and_solutions_pass(fixture_exercises):
    code, out = run_cli("check", fixture_exercises / "98_fixture.ipynb",
                        FIXTURES / "98_fixture.ipynb", "--jobs", 2, "--solutions", FIXTURES)
    assert code == 1  # not attempted is not a pass
    stub_report, solution_report = out.split(f"\n{FIXTURES}")
    assert stub_report.count("not attempted") == 3  # two verdicts and the summary
    assert "Exercise 98.1  passed" in solution_report and "2 of 2 passed." in solution_report


def test_a_run_in_which_no_cell_ran_is_retried_then_reported(fixture_exercises, monkeypatch):
    """A kernel that never started (seen once under load) must not read as "not checked"."""
    real_once = run.run_nbval_once
    calls = []

    def kernel_fails_first(*args):
        calls.append(1)
        if len(calls) == 1:
            return {}, False, ["ERROR at setup: kernel did not start"]
        return real_once(*args)

    monkeypatch.setattr(run, "run_nbval_once", kernel_fails_first)
    result = check_notebook(FIXTURES / "98_fixture.ipynb", FIXTURES)
    assert len(calls) == 2
    assert [v.status for v in result.verdicts] == ["passed", "passed"]

    monkeypatch.setattr(run, "run_nbval_once", lambda *a: ({}, False, ["kernel died at start"]))
    with pytest.raises(ExerciseError, match="nbval could not run the notebook: kernel died"):
        check_notebook(fixture_exercises / "98_fixture.ipynb", FIXTURES)


def test_broken_foreign_and_missing_notebooks_get_one_clear_line(tmp_path):
    broken = tmp_path / "broken.ipynb"
    broken.write_text('{"cells": [')
    foreign = tmp_path / "foreign.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), foreign)
    cases = {
        broken: "not a notebook: the file is not valid JSON",
        foreign: "not a course exercise notebook",
        tmp_path / "missing.ipynb": "no such file",
    }
    for path, expected in cases.items():
        code, out = run_cli("check", path, "--solutions", FIXTURES)
        assert code == 2, out
        # a machine without a working sandbox adds its one "note:" line; the error is one line
        lines = [line for line in out.splitlines() if not line.startswith("note: ")]
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: {expected}"), out


# ----------------------------------------------- a class's folder: odd and hostile submissions


HANG_IGNORING_SIGINT = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                        "while True:\n    pass")
ASSIGNMENT = ["97.1", "98.1", "98.2"]
BUNDLE_GOOD = {"98.1": GOOD["98.1"], "98.2": "answer = 42"}


def edit(path: Path, change) -> Path:
    nb = nbformat.read(path, as_version=4)
    change(nb)
    nbformat.write(nb, path)
    return path


def solution_cell(nb, exercise):
    return next(c for c in nb.cells if info(c).get("role") == "solution"
                and info(c)["exercise"] == exercise)


def helpers_print_and_a_copied_cell(nb):
    """eve: her own cell holds an import and a helper; her double() keeps a debug print; 98.2
    is typed into a copy of its cell, the stub left above it."""
    solution_cell(nb, "98.1").source = "def double(x):\n    print('debug', x)\n    return twice(x)"
    nb.cells.insert(2, nbformat.v4.new_code_cell(
        "import math\n\ndef twice(x):\n    return math.prod([2, x])"))
    stub = solution_cell(nb, "98.2")
    copied = copy.deepcopy(stub)
    copied.id, copied.source = "eves-copy", "answer = 6 * 7"
    nb.cells.insert(nb.cells.index(stub) + 1, copied)


def metadata_lost_and_a_cell_deleted(nb):
    """fay: her 98.1 cell lost its metadata (its id is kept); she deleted 98.2's cell."""
    answer = solution_cell(nb, "98.1")
    answer.metadata = {}
    answer.source = GOOD["98.1"]
    nb.cells.remove(solution_cell(nb, "98.2"))


def a_wrong_duplicate_below(nb):
    """gil: the right 98.1, then (below its check cell) a copy with a wrong version."""
    right = solution_cell(nb, "98.1")
    wrong = copy.deepcopy(right)
    wrong.id, wrong.source = "gils-second-try", WRONG["98.1"]
    nb.cells.insert(nb.cells.index(right) + 2, wrong)


@pytest.fixture(scope="module")
def class_run(fixture_exercises, tmp_path_factory):
    """One folder of odd and hostile submissions, checked once: --jobs 2 --timeout 5."""
    tmp = tmp_path_factory.mktemp("class")
    subs = tmp / "submissions"
    lesson = fixture_exercises / "98_fixture.ipynb"
    homework = build_bundle(ASSIGNMENT, FIXTURES, stub=True)
    (tmp / "hw.ipynb").write_text(notebook_text(homework))
    hw = tmp / "hw.ipynb"
    learner_copy(lesson, subs / "ada.ipynb", GOOD)
    # bob saved his wrong answer with the solution's own outputs: they must not count.
    bob = learner_copy(lesson, subs / "bob" / "98_fixture.ipynb", WRONG,
                       outputs_from=FIXTURES / "98_fixture.ipynb")
    learner_copy(lesson, subs / "cy.ipynb", HANG)
    learner_copy(lesson, subs / "dee.ipynb", CRASH)
    edit(learner_copy(lesson, subs / "eve.ipynb", {}), helpers_print_and_a_copied_cell)
    edit(learner_copy(lesson, subs / "fay.ipynb", {}), metadata_lost_and_a_cell_deleted)
    edit(learner_copy(lesson, subs / "gil.ipynb", GOOD), a_wrong_duplicate_below)
    learner_copy(lesson, subs / "jay.ipynb", GOOD)  # and a folder jay/: two learners
    learner_copy(hw, subs / "jay" / "hw.ipynb", {**BUNDLE_GOOD, "97.1": CRASH["98.1"]})
    learner_copy(hw, subs / "jay" / "hw_old.ipynb", {"98.2": "answer = 41"})
    learner_copy(lesson, subs / "kim" / "good.ipynb", GOOD)
    (subs / "kim" / "broken.ipynb").write_text('{"cells": [')
    learner_copy(hw, subs / "lou.ipynb", {**BUNDLE_GOOD, "97.1": HANG_IGNORING_SIGINT})
    learner_copy(lesson, subs / "max.ipynb", {
        "98.1": "def double(x):\n    print('y' * 5_000_000)\n    return 2 * x",
        "98.2": "answer = 42"})
    for junk in ("jay/.ipynb_checkpoints/hw-checkpoint.ipynb", "__MACOSX/._ada.ipynb",
                 ".hidden.ipynb"):
        (subs / junk).parent.mkdir(parents=True, exist_ok=True)
        (subs / junk).write_text("not a notebook")
    (subs / "notes.txt").write_text("not a submission")
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in subs.rglob("*") if p.is_file()}
    code, out = run_cli("check", subs, "--timeout", 5, "--jobs", 2, "--solutions", FIXTURES,
                        cwd=tmp)
    reports = {}
    for block in ("\n" + out).split("\n== ")[1:]:
        name, _, body = block.partition("\n")
        reports[name] = body
    reports[list(reports)[-1]] = reports[list(reports)[-1]].split("\nsubmission  ")[0]
    table = out[out.index("\nsubmission  ") + 1:]
    return {"code": code, "out": out, "reports": reports, "table": table, "tmp": tmp,
            "files": files, "bob": bob}


def test_a_class_folder_is_checked_into_one_row_per_learner(class_run):
    rows = [line.split() for line in class_run["table"].splitlines()[2:14]]
    assert class_run["table"].splitlines()[0].split() == ["submission", "97.1", "98.1", "98.2",
                                                          "passed"]
    assert rows == [
        ["ada", "pass", "pass", "2/2"],
        ["bob", "FAIL", "pass", "1/2"],
        ["cy", "TIMEOUT", "pass", "1/2"],
        ["dee", "CRASH", "pass", "1/2"],
        ["eve", "pass", "pass", "2/2"],
        ["fay", "pass", "·", "1/2"],
        ["gil", "FAIL", "pass", "1/2"],
        ["jay/", "CRASH", "pass", "pass", "2/3"],
        ["jay.ipynb", "pass", "pass", "2/2"],
        ["kim", "ERROR", "pass", "pass", "2/3"],
        ["lou", "TIMEOUT", "pass", "pass", "2/3"],
        ["max", "pass", "pass", "2/2"],
    ]
    assert class_run["code"] == 1
    assert not ANSI.search(class_run["out"])
    with open(class_run["tmp"] / "results.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["submission", "97.1", "98.1", "98.2", "passed", "total"]
    assert table[1] == ["ada", "", "passed", "passed", "2", "2"]
    assert table[10] == ["kim", "error", "passed", "passed", "2", "3"]


def test_submissions_are_only_read(class_run):
    for path, (data, mtime) in class_run["files"].items():
        assert path.read_bytes() == data and path.stat().st_mtime_ns == mtime, path


def test_a_crash_or_a_hang_loses_only_its_exercise_in_lessons_and_bundles(class_run):
    """Issue 10, problem 1: a crash or a SIGINT-ignoring hang in a bundle's first exercise."""
    reports = class_run["reports"]
    assert ("Exercise 98.1  TIMED OUT after 5 s in your function `double` (called by the "
            "check cell `check_double(double)`)") in reports["cy"]  # issue 26: names the function
    assert "Exercise 98.1  CRASHED: the kernel died while running your solution cell" in \
        reports["dee"]
    assert ("Exercise 97.1  TIMED OUT after 5 s in your solution cell; it ignored the "
            "interrupt, so its kernel was stopped") in reports["lou"]
    assert "Exercise 97.1  CRASHED: the kernel died while running your solution cell" in \
        reports["jay/"]
    for name in ("lou", "jay/"):
        assert "ERROR" not in reports[name].split("hw_old")[0], reports[name]
        assert "Exercise 98.1  passed" in reports[name] and "Exercise 98.2  passed" in \
            reports[name]


def test_saved_outputs_never_count(class_run):
    bob = class_run["reports"]["bob"]
    assert "    Exercise 98.1  FAILED: double(3) returned 7, not 6.\n" in bob
    assert "Did you add instead of multiply?" in bob


def test_answers_are_found_where_the_learners_put_them(class_run):
    """Issue 10, problem 5: helper cell, copied cell, lost metadata, deleted cell, duplicate."""
    eve, fay, gil = (class_run["reports"][n] for n in ("eve", "fay", "gil"))
    assert "Exercise 98.1  passed" in eve and "Exercise 98.2  passed" in eve
    assert ("note: your code printed 1 more line in the check cell `check_double(double)` "
            "(the first: 'debug 3'); remove the leftover print()") in eve
    assert "Exercise 98.1  passed" in fay
    assert "Exercise 98.2  MISSING: your notebook has no solution cell for this exercise" in fay
    assert "Exercise 98.1  FAILED: double(3) returned 7, not 6." in gil
    assert ("note: cells 4 and 6 of your notebook all answer Exercise 98.1; they ran in that "
            "order, so the last one's definitions were checked") in gil


def test_a_5_mb_print_makes_a_short_report(class_run):
    report = class_run["reports"]["max"]
    assert "Exercise 98.1  passed" in report and "remove the leftover print()" in report
    assert len(class_run["out"]) < 30_000, len(class_run["out"])


def test_folder_mode_keeps_learners_apart_takes_the_best_and_skips_system_folders(class_run):
    reports, out = class_run["reports"], class_run["out"]
    assert set(reports) == {"ada", "bob", "cy", "dee", "eve", "fay", "gil", "jay/", "jay.ipynb",
                            "kim", "lou", "max"}
    # every skipped file is named, with why, and none of them is checked; the "note:" lines the
    # checker prints first (no sandbox here, or a limit it cannot enforce) are checked apart
    preamble = out.split("\n== ")[0].splitlines()
    notes = [line for line in preamble if line.startswith("note: ")]
    unsandboxed = sandbox.choose_sandbox(True)[0] is None
    assert sum("WITHOUT a sandbox" in line for line in notes) == unsandboxed, notes
    preamble = [line for line in preamble if not line.startswith("note: ")]
    assert preamble == ["skipped .hidden.ipynb: a hidden file",
                        "skipped __MACOSX/: macOS archive metadata",
                        "skipped jay/.ipynb_checkpoints/: Jupyter's autosaved checkpoints",
                        "skipped notes.txt: not a notebook (.ipynb)"], preamble
    assert "hw-checkpoint.ipynb (checked" not in out and "._ada" not in out
    assert ("note: Exercise 98.2: passed in hw.ipynb; failed in hw_old.ipynb (the best, "
            "passed, counts)") in reports["jay/"]
    assert "ERROR: " in reports["kim"] and "broken.ipynb: not a notebook" in reports["kim"]
    assert "· = missing (no cell for it in the notebook)" in class_run["table"]


def test_an_existing_csv_is_never_overwritten_without_force(class_run):
    tmp = class_run["tmp"]
    code, out = run_cli("check", tmp / "submissions" / "ada.ipynb", "--csv", tmp / "results.csv",
                        "--solutions", FIXTURES, cwd=tmp)
    assert code == 2 and "already exists; use --force" in out


# ------------------------------------------------------------------------------------ assign


def test_assign_bundles_chosen_exercises_refuses_overwrite_and_checks(tmp_path):
    out = tmp_path / "hw.ipynb"
    code, text = run_cli("assign", "98.2", "97.1", "-o", out, "--solutions", FIXTURES)
    assert code == 0, text
    nb = nbformat.read(out, as_version=4)
    assert nb.metadata["mha_course"]["assignment"] == ["97.1", "98.2"]
    assert nb.metadata["mha_course"]["assignment_info"]["exercises"] == [
        {"id": "97.1", "points": 1}, {"id": "98.2", "points": 2}]
    assert (tmp_path / "hw.assignment.json").is_file()
    roles = [(info(c).get("exercise"), info(c).get("role")) for c in nb.cells[1:]]
    assert roles == [
        (None, "setup"), ("97.1", "task"), ("97.1", "solution"), ("97.1", "check"),
        (None, "setup"), ("98.2", "task"), ("98.2", "solution"), ("98.2", "check"),
    ]
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code_cells)
    assert "BEGIN SOLUTION" not in out.read_text()

    before = out.read_bytes()
    code, text = run_cli("assign", "98.1", "-o", out, "--solutions", FIXTURES)
    assert code == 2 and "already exists; use --force" in text and out.read_bytes() == before
    code, text = run_cli("assign", "98.9", "-o", tmp_path / "x.ipynb", "--solutions", FIXTURES)
    assert code == 2 and "unknown exercise '98.9'; known exercises: 97.1 98.1 98.2" in text

    answers = {"97.1": "def square(x):\n    return x**2"}
    done = learner_copy(out, tmp_path / "hw_done.ipynb", answers)
    code, text = run_cli("check", done, "--solutions", FIXTURES)
    assert code == 1, text
    assert "Exercise 97.1  passed" in text and "Exercise 98.2  not attempted" in text


# ------------------------------------------------------- the real solutions/ and exercises/


def committed_exercises(tmp_path: Path) -> Path:
    """exercises/ as committed, when a learner is working in the checkout's exercises/.

    Learners answer in exercises/ itself; their work must not make this maintainers' test fail.
    Then the committed files (git HEAD) are compared instead; in CI's clean clone they are the
    working files anyway.
    """
    working = sorted(EXERCISES.glob("*.ipynb"))
    if not any(learner_work(p) for p in working):
        return EXERCISES
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("exercises/ holds your work and there is no git history to compare against")
    committed = tmp_path / "exercises_at_HEAD"
    committed.mkdir()
    for p in working:
        blob = subprocess.run(
            ["git", "show", f"HEAD:exercises/{p.name}"],
            cwd=ROOT, capture_output=True, check=False,
        )
        if blob.returncode == 0:
            (committed / p.name).write_bytes(blob.stdout)
    return committed


def test_committed_exercises_are_up_to_date_with_the_solutions(tmp_path):
    stale = find_stale(SOLUTIONS, committed_exercises(tmp_path))
    assert not stale, "exercises/ is stale: run `make exercises`\n" + "\n".join(stale)


def test_every_real_stub_is_not_attempted_and_every_real_solution_passes(tmp_path):
    """Checking exercises/ finds every exercise not attempted (so every check can fail); one
    assignment of all exercises with the solutions typed in passes (so every solution passes,
    also next to the other lessons' setup cells)."""
    solutions = solution_paths(SOLUTIONS)
    assert solutions, "no solution notebooks in solutions/"
    all_ids = exercise_ids(load_solutions(SOLUTIONS))
    assert len(all_ids) >= 4 * len(solutions)
    answered = tmp_path / "all_solutions.ipynb"
    answered.write_text(notebook_text(build_bundle(all_ids, SOLUTIONS, stub=False)))
    fresh = tmp_path / "exercises"  # the stubs as generated (not a learner's work in progress)
    generate(SOLUTIONS, fresh)
    paths = [fresh / p.name for p in solutions] + [answered]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda p: check_notebook(p, SOLUTIONS), paths))
    reports = "\n".join(format_result(r, run.DEFAULT_TIMEOUT) for r in results)
    stub_verdicts = [v for r in results[:-1] for v in r.verdicts]
    assert sorted((v.exercise for v in stub_verdicts), key=id_key) == all_ids, reports
    assert {v.status for v in stub_verdicts} == {"not attempted"}, reports
    assert [v.exercise for v in results[-1].verdicts] == all_ids, reports
    assert results[-1].all_passed, reports


# ------------------------------------------------------------------ short, exact messages


def test_a_failed_check_in_a_notebook_shows_a_few_lines_not_the_checkers_traceback():
    """Issue 10, problem 7: 25 to 49 lines of checker traceback before the one useful line."""
    spec = KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f",
                            "{connection_file}"], language="python", display_name="test")

    class Specs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return spec

    km = KernelManager(kernel_name="test", kernel_spec_manager=Specs())
    km.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kc = km.client()
    kc.start_channels()
    errors = []
    try:
        kc.wait_for_ready(timeout=120)
        for code in ("import numpy as np\nfrom mha_course import checks",
                     "def causal_mask(T):\n    return np.ones((T, T), dtype=bool)",
                     "checks.check_causal_mask(causal_mask)"):
            kc.execute_interactive(code, timeout=120, output_hook=lambda msg: errors.append(
                msg["content"]) if msg["msg_type"] == "error" else None)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert len(errors) == 1
    lines = [ANSI_CODE.sub("", line) for line in errors[0]["traceback"]]
    assert lines[:2] == ["Cell In[3], line 1", "----> 1 checks.check_causal_mask(causal_mask)"]
    assert len(lines) == 3 and lines[2].startswith("CheckFailed: Exercise 03.3: your mask"), lines


@pytest.fixture(scope="module")
def ready_venv(tmp_path_factory):
    """``VENV=...`` for make: a virtual environment make takes as set up (its ``bin/python``
    runs this interpreter, its install stamp is newer than pyproject.toml), so ``make check``
    runs its recipe at once instead of building .venv first (pip install -e ., minutes)."""
    venv = tmp_path_factory.mktemp("venv")
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    (venv / ".installed").touch()
    os.utime(venv / ".installed", (time.time() + 60,) * 2)  # newer than pyproject.toml
    return f"VENV={venv}"


def test_make_check_with_a_bad_lesson_lists_the_lessons_and_make_adds_no_error_line(ready_venv):
    out = subprocess.run(["make", "check", "EX=42", ready_venv], cwd=ROOT, capture_output=True,
                         text=True)
    text = out.stdout + out.stderr
    assert "no exercise notebook for lesson '42'" in text
    assert "the lessons are: 01 02 03 04" in text
    assert "Error" not in text.replace("error: ", "")


def test_make_check_ex_3_checks_lesson_03_without_makes_error_line(ready_venv):
    out = subprocess.run(["make", "check", "EX=3", ready_venv], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    text = out.stdout + out.stderr
    assert "exercises/03_single_head_attention.ipynb (checked against" in text
    assert "Exercise 03.1  " in text and "make: ***" not in text and "Error 1" not in text


def test_the_timing_class_has_thirty_learners_right_wrong_unanswered_one_hang_one_crash(tmp_path):
    """tests/data/make_class.py builds the folder the issue's timing is measured on."""
    make_class = load_make_class()
    paths = make_class.make_class(tmp_path, 30)
    assert len(paths) == 30
    kinds = []
    for path in paths:
        for cell in nbformat.read(path, as_version=4).cells:
            meta = info(cell)
            if meta.get("role") != "solution":
                continue
            x, source = meta["exercise"], cell.source
            kinds.append("right" if source == make_class.RIGHT[x] else
                         "wrong" if source in make_class.WRONG[x] else
                         "hang" if source == make_class.HANG else
                         "crash" if source == make_class.CRASH else "stub")
    counts = {k: kinds.count(k) for k in set(kinds)}
    assert counts["hang"] == 1 and counts["crash"] == 1
    assert counts["right"] > 80 and counts["wrong"] > 15 and counts["stub"] > 5, counts
