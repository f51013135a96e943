"""Grading a real class (issue 26): the assignment decides, points and a gradebook, feedback,
intake like an LMS download, result files decided before any work, and checks that cannot be
talked into passing.

The first tests are pure (intake, gradebook, feedback, outputs, matching cells by name: no
kernel). Then three runs, each shared by its tests through a module-scoped fixture:

- the fixture lessons graded with an assignment and a probes file (timeouts, crashes, a check
  replaced in memory, an answer that only fits the check's inputs);
- lesson 03 with an attack per exercise (the issue's, a decorator, a default argument, an
  import hook with patched NumPy and harness, atexit and __del__, a stack walk), graded and,
  for contrast, checked as a learner checks: the attacks work there, not here;
- the instructor trial of the issue from the command line: ten students with Canvas and Moodle
  names, a tampered notebook, a lesson notebook handed in instead, a metadata-stripped one,
  duplicates, a late file, a crash, a hang, invalid JSON; the CSV and the feedback checked.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys
import unicodedata
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

from mha_course.grading.authoring.assignment import (
    load_assignment,
    make_assignment,
    save_assignment,
)
from mha_course.grading.authoring.bundle import build_bundle
from mha_course.grading.authoring.catalog import exercises
from mha_course.grading.authoring.generate import generate
from mha_course.grading.authoring.notebooks import ExerciseError, info, notebook_text
from mha_course.grading.reporting.feedback import feedback_markdown, scrub
from mha_course.grading.reporting.gradebook import grade_row, gradebook_csv
from mha_course.grading.reporting.intake import collect, parse_name, read_roster
from mha_course.grading.reporting.verdicts import NotebookResult, Verdict
from mha_course.grading.running.check import Checker
from mha_course.grading.running.merge import classify
from mha_course.grading.running.outputs import backup, plan_outputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_helpers import CRASH, FIXTURES, GOOD, HANG, WRONG, run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"


def answer(nb, answers: dict):
    """``nb`` with the solution cell of each exercise in ``answers`` replaced by its source."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        meta = info(cell)
        if meta.get("role") == "solution" and meta["exercise"] in answers:
            cell.source = answers[meta["exercise"]]
    return nb


def write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(notebook_text(nb), encoding="utf-8")
    return path


def solution_source(exercise: str) -> str:
    """The worked solution of ``exercise``, typed in as a learner would."""
    bundle = build_bundle([exercise], SOLUTIONS, stub=False)
    return next(c.source for c in bundle.cells if info(c).get("role") == "solution")


def passed_line(exercise: str) -> str:
    """What the solution's check cell prints (what an attack prints to pass)."""
    bundle = build_bundle([exercise], SOLUTIONS, stub=False)
    cell = next(c for c in bundle.cells if info(c).get("role") == "check")
    return "".join(o.get("text", "") for o in cell.outputs).strip()


def strip_metadata(nb):
    """What a Colab-style save leaves: no cell metadata, no cell ids, no course metadata."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("mha_course", None)
    nb.nbformat_minor = 4
    for cell in nb.cells:
        cell.metadata = {}
        cell.pop("id", None)
    return nb


# ------------------------------------------------------------------------------ pure parts


def test_lms_names_are_read_and_nfc_normalised():
    assert parse_name("lovelaceada_LATE_12345_67890_week2").id == "12345"
    assert parse_name("lovelaceada_LATE_12345_67890_week2").late
    assert parse_name("lovelaceada_12345_67890_week2-1").late is False
    moodle = parse_name(unicodedata.normalize("NFD", "Émilie du Châtelet_4242_"
                                                     "assignsubmission_file_week2"))
    assert (moodle.name, moodle.id, moodle.lms) == ("Émilie du Châtelet", "4242", "Moodle")
    assert moodle.name == unicodedata.normalize("NFC", moodle.name)
    assert parse_name("王小明 (2)").name == "王小明"


def test_intake_names_every_skipped_file_keeps_the_newest_copy_and_marks_late(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("alice.ipynb", "alice (1).ipynb", "BOB.IPYNB", "notes.pdf", ".DS_Store",
                 "carol_LATE_7_8_hw.ipynb", "dan_9_10_hw.ipynb"):
        (subs / name).write_text("{}")
    (subs / "__MACOSX").mkdir()
    (subs / "__MACOSX" / "._alice.ipynb").write_text("x")
    (subs / "eve").mkdir()
    (subs / "eve" / "hw.ipynb").write_text("{}")
    (subs / "eve" / "draft.txt").write_text("x")
    os.utime(subs / "alice.ipynb", (1e9, 1e9))  # older than "alice (1).ipynb"
    os.utime(subs / "dan_9_10_hw.ipynb", (4.2e9, 4.2e9))  # after the deadline below
    roster = tmp_path / "roster.csv"
    roster.write_text("\ufefffile,id,name\nalice,111,Alice Liddell\nBOB,222,Bob\n",
                      encoding="utf-8")
    intake = collect([subs], read_roster(roster), deadline=datetime(2100, 1, 1))
    assert intake.skipped == [(".DS_Store", "a hidden file"),
                              ("__MACOSX/", "macOS archive metadata"),
                              ("eve/draft.txt", "not a notebook (.ipynb)"),
                              ("notes.pdf", "not a notebook (.ipynb)")]
    by_name = {s.name: s for s in intake.submissions}
    assert sorted(by_name) == ["Alice Liddell", "Bob", "carol", "dan", "eve"]
    alice = by_name["Alice Liddell"]
    assert alice.source.name == "alice (1).ipynb" and alice.student_id == "111"
    assert alice.copies == [subs / "alice.ipynb"]
    assert "alice.ipynb is an older copy of alice (1).ipynb" in alice.notes[0]
    assert by_name["carol"].late and by_name["carol"].student_id == "7"
    assert by_name["dan"].late and not by_name["Bob"].late  # by the deadline
    assert by_name["eve"].folder and by_name["eve"].notebooks == [subs / "eve" / "hw.ipynb"]
    assert by_name["eve"].notes == ["eve is not in the roster"]
    with pytest.raises(ValueError, match="needs a header with a 'file'"):
        bad = tmp_path / "bad.csv"
        bad.write_text("who,what\nx,y\n")
        read_roster(bad)


def test_the_gradebook_holds_numbers_from_the_assignment_not_from_the_submission():
    catalog = exercises(FIXTURES)
    hw = make_assignment("98.1 98.2", catalog, points="98.2=3")
    # a notebook that had only 98.1 and an extra exercise 97.1: 98.2 is missing, 97.1 ignored
    result = NotebookResult(Path("a.ipynb"), "", [Verdict("97.1", "passed"),
                                                  Verdict("98.1", "passed")])
    row = grade_row("Ada", "12345", [(Path("a.ipynb"), result)], hw, late=True, modified=0)
    assert row.statuses == {"98.1": "passed", "98.2": "missing"}
    assert (row.total, row.max_points, row.percent) == (1, 4, 25.0)
    unreadable = grade_row("Kay", "7", [(Path("k.ipynb"), ExerciseError("k.ipynb: not JSON"))],
                           hw)
    assert unreadable.statuses == {"98.1": "error", "98.2": "error"} and unreadable.total == 0
    assert unreadable.verdicts["98.1"].message == "k.ipynb: not JSON"
    table = list(csv.reader(gradebook_csv([row, unreadable], hw).splitlines()))
    assert table[0] == ["student", "id", "98.1", "98.2", "total", "max", "percent", "late",
                        "submitted", "98.1 status", "98.2 status", "files", "notes"]
    assert table[1][:8] == ["Ada", "12345", "1", "0", "1", "4", "25", "1"]
    assert table[1][9:11] == ["passed", "missing"]
    assert table[2][:8] == ["Kay", "7", "0", "0", "0", "4", "0", "0"]


def test_feedback_says_what_failed_in_the_checkers_words_without_this_machines_paths(tmp_path):
    catalog = exercises(FIXTURES)
    hw = make_assignment("98.1 98.2", catalog, title="Week 1")
    where = tmp_path / "submissions" / "bob.ipynb"
    message = (f"double(3) returned 7, not 6.\nDid you add instead of multiply?\n"
               f"(raised in {where} and /tmp/ipykernel_7/123.py)")
    result = NotebookResult(where, "", [Verdict("98.1", "failed", message),
                                        Verdict("98.2", "passed")])
    row = grade_row("Bob", "9", [(where, result)], hw)
    text = feedback_markdown(row, hw, catalog, roots=[tmp_path / "submissions"])
    assert "# Feedback: Week 1" in text and "Score: 2 / 3 points (66.67 %)" in text
    assert "| 98.1 Double | 0 / 1 | not yet right |" in text
    assert "Did you add instead of multiply?" in text
    assert str(tmp_path) not in text and "/tmp/" not in text and "bob.ipynb" in text
    assert scrub(f"{Path.home()}/x.ipynb") == "x.ipynb"


def test_results_are_decided_before_any_work_and_never_land_in_the_submissions(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (tmp_path / "results.csv").write_text("old")
    os.chdir(tmp_path)
    try:
        plan = plan_outputs(None, None, False, True, [subs])
        assert plan.csv == Path("results-2.csv") and "results.csv exists" in plan.notes[0]
        assert plan_outputs(None, None, True, True, [subs]).csv == Path("results.csv")
        with pytest.raises(ExerciseError, match="already exists; use --force"):
            plan_outputs(tmp_path / "results.csv", None, False, True, [subs])
        with pytest.raises(ExerciseError, match="inside the submissions folder"):
            plan_outputs(subs / "grades.csv", None, False, True, [subs])
        with pytest.raises(ExerciseError, match="inside the submissions folder"):
            plan_outputs(None, subs / "feedback", False, True, [subs])
        with pytest.raises(ExerciseError, match="no folder"):
            plan_outputs(tmp_path / "nowhere" / "r.csv", None, False, True, [subs])
        (tmp_path / "fb").mkdir()
        (tmp_path / "fb" / "old.md").write_text("x")
        with pytest.raises(ExerciseError, match="is not empty; use --force"):
            plan_outputs(tmp_path / "new.csv", tmp_path / "fb", False, True, [subs])
        assert backup(tmp_path / "results.csv") == tmp_path / "results.csv.bak"
        (tmp_path / "results.csv").write_text("newer")
        assert backup(tmp_path / "results.csv") == tmp_path / "results.csv.bak2"
    finally:
        os.chdir(ROOT)


def test_a_stripped_notebook_is_matched_by_its_checks_and_functions_and_old_drill_ids_move():
    catalog = exercises(SOLUTIONS)
    ref = build_bundle(["03.1", "03.2", "15.3"], SOLUTIONS, stub=False)
    graded = {x: catalog[x] for x in ("03.1", "03.2", "15.3")}
    lesson = build_bundle(["03.1", "03.2", "03.3"], SOLUTIONS, stub=True)
    stripped = strip_metadata(answer(lesson, {"03.1": solution_source("03.1")}))
    found = {(c.kind, c.exercise) for c in classify(ref, stripped, graded)}
    assert ("answer", "03.1") in found and ("answer", "03.2") in found
    assert ("check", "03.1") in found
    assert not any(x == "03.3" for _, x in found if _ in ("answer", "check"))  # not assigned
    # an old drill notebook: its exercise is 09.3, its check and function are 15.3's (its
    # cell ids are the same: matched by id; without them: by the check and the function)
    drill = build_bundle(["15.3"], SOLUTIONS, stub=True)
    for cell in drill.cells:
        if info(cell).get("exercise") == "15.3":
            info(cell)["exercise"] = "09.3"
    for old in (drill, strip_metadata(drill)):
        if old is not drill:
            for new, cell in zip(drill.cells, old.cells, strict=True):
                cell.metadata = copy.deepcopy(new.metadata)
        moved = [c for c in classify(ref, old, graded) if c.kind == "answer"]
        assert [c.exercise for c in moved] == ["15.3"]
        assert "was graded as Exercise 15.3 (the interview drill moved" in moved[0].note
    # without a catalog (a learner's own check) nothing is matched by name
    assert all(c.kind == "own" for c in classify(ref, strip_metadata(lesson))
               if c.exercise is None and c.kind != "check")


# ----------------------------------------------------- grading the fixtures with probes

PROBES = '''
def probe_98_1(double):
    got = double(-4)
    if got != -8:
        raise AssertionError(f"Exercise 98.1: double(-4) returned {got!r}, not -8")
'''
FITS_THE_CHECK = {"98.1": "def double(x):\n    return {3: 6, 21: 42}.get(x, 0)",  # check, demo
                  "98.2": "answer = 42"}
ATTACK = {"98.1": "def double(x):\n    return 42 if x == 21 else x  # the demo cell: 42\n\n"
                  "check_double = lambda f: print("
                  "'Exercise 98.1 passed: double(3) == 6')",
          "98.2": "answer = 41\nimport builtins\n"
                  "check_answer = lambda a: print('Exercise 98.2 passed: answer == 42')"}


@pytest.fixture(scope="module")
def fixture_grading(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fixture_grading")
    generate(FIXTURES, tmp / "ex")
    lesson = nbformat.read(tmp / "ex" / "98_fixture.ipynb", as_version=4)
    paths = {name: write(answer(lesson, answers), tmp / f"{name}.ipynb")
             for name, answers in (("good", GOOD), ("wrong", WRONG), ("hang", HANG),
                                   ("crash", CRASH), ("fits", FITS_THE_CHECK),
                                   ("attack", ATTACK))}
    hw = make_assignment("98.1 98.2", exercises(FIXTURES))
    graded = Checker.create(FIXTURES, timeout=5, hidden=[tmp], assignment=hw, probes=PROBES)
    learner = Checker.create(FIXTURES, timeout=5, hidden=[tmp])
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {(mode, name): pool.submit(checker.check, path) for name, path in paths.items()
                for mode, checker in (("graded", graded), ("learner", learner))
                if mode == "graded" or name in ("fits", "attack")}
        return {key: {v.exercise: v for v in job.result().verdicts} for key, job in jobs.items()}


def test_graded_fixtures_pass_fail_time_out_and_crash_as_they_should(fixture_grading):
    status = {name: {x: v.status for x, v in verdicts.items()}
              for (mode, name), verdicts in fixture_grading.items() if mode == "graded"}
    assert status["good"] == {"98.1": "passed", "98.2": "passed"}
    assert status["wrong"] == {"98.1": "failed", "98.2": "passed"}
    assert status["hang"] == {"98.1": "timed out", "98.2": "passed"}
    assert status["crash"] == {"98.1": "crashed", "98.2": "passed"}
    assert fixture_grading[("graded", "wrong")]["98.1"].message.startswith(
        "double(3) returned 7, not 6.")


def test_a_timeout_names_the_learners_function(fixture_grading):
    assert fixture_grading[("graded", "hang")]["98.1"].message == (
        "TIMED OUT after 5 s in your function `double` (called by the check cell "
        "`check_double(double)`)")


def test_a_check_replaced_in_the_kernel_passes_a_learner_and_fails_in_grading(fixture_grading):
    learner = fixture_grading[("learner", "attack")]
    graded = fixture_grading[("graded", "attack")]
    assert {x: v.status for x, v in learner.items()} == {"98.1": "passed", "98.2": "passed"}
    assert {x: v.status for x, v in graded.items()} == {"98.1": "failed", "98.2": "failed"}
    assert graded["98.1"].message.startswith("double(3) returned 3, not 6.")
    assert graded["98.2"].message == "answer is 41, not 42"


def test_the_instructors_probes_catch_an_answer_that_only_fits_the_check(fixture_grading):
    assert fixture_grading[("learner", "fits")]["98.1"].status == "passed"
    graded = fixture_grading[("graded", "fits")]["98.1"]
    assert graded.status == "failed" and graded.message == (
        "double(-4) returned 0, not -8\n(found by the instructor's own probe)")


# ------------------------------------------------------- lesson 03: an attack per exercise


def attacks() -> dict[str, str]:
    """A wrong answer per exercise of lesson 03, each with a way to talk its check into passing."""
    line = {x: passed_line(x) for x in ("03.1", "03.2", "03.3", "03.4", "03.5", "03.6")}
    return {
        # the attack: replace the check in memory
        "03.1": "def attention_scores(q, k):\n    return q\n\n"
                f"checks.check_attention_scores = lambda f: print({line['03.1']!r})",
        # a decorator that replaces the check when the function is defined
        "03.2": "def passing(fn):\n    import mha_course.checks as c\n"
                f"    c.check_attention = lambda f: print({line['03.2']!r})\n    return fn\n\n"
                "@passing\ndef attention(q, k, v, mask=None):\n    return q, q",
        # a default argument evaluated at definition time
        "03.3": "def causal_mask(T, _=setattr(checks, 'check_causal_mask', lambda f: print("
                f"{line['03.3']!r}))):\n    return np.ones((T, T), dtype=bool)",
        # an import hook and sys.modules tricks, NumPy and the harness patched
        "03.4": "import sys, types, importlib.abc\nimport numpy\n"
                "import mha_course.checks.harness as h\n"
                "numpy.allclose = lambda *a, **k: True\n"
                "numpy.array_equal = lambda *a, **k: True\n"
                "h.compare = lambda ex, got, want, *a, **k: got\n"
                "h.close = lambda a, b: True\n"
                f"h.passed = lambda ex, what: print({line['03.4']!r})\n"
                "fake = types.ModuleType('mha_course.checks')\n"
                f"fake.check_padding_mask = lambda f: print({line['03.4']!r})\n"
                "class Finder(importlib.abc.MetaPathFinder):\n"
                "    def find_spec(self, name, path, target=None):\n"
                "        return None\n"
                "sys.meta_path.insert(0, Finder())\n"
                "sys.modules['mha_course.checks'] = fake\n"
                "checks = fake\n\n"
                "def padding_mask(lengths, S):\n    return np.ones((len(lengths), 1, S), bool)",
        # printing the line from atexit, __del__ and the function itself
        "03.5": "import atexit\n"
                f"atexit.register(print, {line['03.5']!r})\n"
                "class Liar:\n    def __del__(self):\n"
                f"        print({line['03.5']!r})\n\n"
                "def causal_self_attention(x, W_q, W_k, W_v, lengths):\n"
                f"    print({line['03.5']!r})\n    Liar()\n"
                "    return x @ W_v, np.zeros((x.shape[0], x.shape[1], x.shape[1]))",
        # walking up the stack to the check's frame while it runs
        "03.6": "import sys\n\ndef choose_scale(q, k):\n    frame = sys._getframe(1)\n"
                "    while frame is not None:\n"
                "        for name in ('want', 'expected', 'ref'):\n"
                "            if name in frame.f_locals:\n"
                "                frame.f_locals[name] = 0.5\n"
                "        frame = frame.f_back\n"
                "    return 0.5",
    }


@pytest.fixture(scope="module")
def lesson_03_attacked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacked")
    lesson = nbformat.read(ROOT / "exercises" / "03_single_head_attention.ipynb", as_version=4)
    path = write(answer(lesson, attacks()), tmp / "attacked.ipynb")
    hw = make_assignment("03", exercises(SOLUTIONS), probe_seed=11)
    graded = Checker.create(SOLUTIONS, timeout=30, hidden=[tmp], assignment=hw)
    learner = Checker.create(SOLUTIONS, timeout=30, hidden=[tmp])
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {mode: pool.submit(checker.check, path)
                for mode, checker in (("graded", graded), ("learner", learner))}
        return {mode: {v.exercise: v for v in job.result().verdicts}
                for mode, job in jobs.items()}


def test_the_attacks_pass_where_the_check_runs_in_the_learners_kernel(lesson_03_attacked):
    """The hole the issue found, shown real: where the check runs in the kernel, it passes."""
    learner = {x: v.status for x, v in lesson_03_attacked["learner"].items()}
    assert learner["03.1"] == learner["03.2"] == learner["03.3"] == "passed", learner


def test_no_attack_passes_in_grading_mode(lesson_03_attacked):
    graded = lesson_03_attacked["graded"]
    assert {x: v.status for x, v in graded.items()} == dict.fromkeys(
        ("03.1", "03.2", "03.3", "03.4", "03.5", "03.6"), "failed"), graded
    assert graded["03.1"].message.startswith("your scores")
    assert "your weights" in graded["03.2"].message or "your output" in graded["03.2"].message
    assert graded["03.3"].message.startswith("your mask")


def test_every_real_solution_passes_in_grading_mode_with_a_probe_seed(tmp_path):
    """Every check works through the proxy (arrays, layers, configs, Generators, callbacks,
    a returned object with methods, peak memory), on its own inputs and on a probe seed's."""
    catalog = exercises(SOLUTIONS)
    ids = list(catalog)
    answered = write(build_bundle(ids, SOLUTIONS, stub=False), tmp_path / "all.ipynb")
    hw = make_assignment(ids, catalog, probe_seed=3)
    # a generous cell timeout: a loaded machine runs the whole course's checks slowly; this
    # test is about verdicts, not speed
    result = Checker.create(SOLUTIONS, timeout=300, hidden=[tmp_path], assignment=hw).check(
        answered)
    failed = {v.exercise: v.message for v in result.verdicts if v.status != "passed"}
    assert not failed, failed
    assert [v.exercise for v in result.verdicts] == ids



DROPOUT_TIMES = ("def attention_dropout(weights, p, rng, training=True):\n"
                 "    if not training:\n"
                 "        return weights\n"
                 "    keep = np.random.default_rng(rng).random(weights.shape) >= p\n"
                 "    return np.where(keep, weights * (1 - p), 0.0)\n")
DROPOUT_TIRES = ("_draws = [0]\n\n\n"
                 "def attention_dropout(weights, p, rng, training=True):\n"
                 "    _draws[0] += 1\n"
                 "    if _draws[0] > 100:\n"
                 "        raise RuntimeError('out of masks')\n"
                 "    if not training:\n"
                 "        return weights\n"
                 "    keep = np.random.default_rng(rng).random(weights.shape) >= p\n"
                 "    return np.where(keep, weights / (1 - p), 0.0)\n")


@pytest.mark.parametrize("source, expected", [
    (DROPOUT_TIMES, "you multiplied the survivors by 1 - p"),
    (DROPOUT_TIRES, "out of masks"),
], ids=["wrong-scale", "raises-on-draw-99"])
def test_13_8s_draws_run_in_the_kernel_in_one_request_and_are_judged_in_the_grader(
        tmp_path, source, expected):
    """15.8's check draws 8,000 masks (``harness.repeat``): in grading mode the draws run in
    the kernel as one request, not 8,000 round trips, and the grader still judges them: a wrong
    scale fails with its likely mistake, an answer that raises on a later draw with its error."""
    bundle = build_bundle(["15.8"], SOLUTIONS, stub=False)
    nb = write(answer(bundle, {"15.8": source}), tmp_path / "sub" / "hw.ipynb")
    hw = make_assignment(["15.8"], exercises(SOLUTIONS))
    result = Checker.create(SOLUTIONS, timeout=120, hidden=[tmp_path], assignment=hw).check(nb)
    [verdict] = result.verdicts
    assert verdict.status == "failed" and expected in verdict.message, verdict


def test_only_the_exercises_named_in_in_kernel_keep_their_check_in_the_kernel():
    """11.2's check reads counters its argument objects keep: it stays in the kernel, named."""
    from mha_course.grading.running.check import IN_KERNEL
    catalog = exercises(SOLUTIONS)
    assert set(IN_KERNEL) == {"11.2"} and set(IN_KERNEL) <= set(catalog)
    hw = make_assignment(["11.1", "11.2", "03.1"], catalog)
    ref = Checker.create(SOLUTIONS, timeout=30, assignment=hw).graded_bundle
    marked = {info(c)["exercise"]: bool(info(c).get("grader")) for c in ref.cells
              if info(c).get("role") == "check"}
    assert marked == {"03.1": True, "11.1": True, "11.2": False}


# --------------------------------------------------------- the instructor trial, end to end

RIGHT = {x: solution_source(x) for x in ("03.1", "03.2", "04.1", "04.5")}
WRONG_03_2 = ("def attention(q, k, v, mask=None):\n"
              "    w = mha_course.softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))\n"
              "    if mask is not None:\n        w = w * mask\n    return w @ v, w")
WRONG_04_1 = ("def split_heads(x, h):\n    B, T, D = x.shape\n"
              "    return x.reshape(B, h, T, D // h)")


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    """The issue's trial, from the command line as an instructor types it."""
    tmp = tmp_path_factory.mktemp("trial")
    code, out = run_cli("assign", "3.1,3.2", "4.1", "04.5", "-o", tmp / "week2.ipynb",
                        "--title", "Week 2: attention", "--due", "2030-01-01", cwd=tmp)
    assert code == 0, out
    hw = nbformat.read(tmp / "week2.ipynb", as_version=4)
    subs = tmp / "submissions"
    lesson = nbformat.read(ROOT / "exercises" / "03_single_head_attention.ipynb", as_version=4)
    sys.path.insert(0, str(ROOT / "tests" / "data"))
    from make_class import RIGHT as LESSON_03_RIGHT

    tampered = answer(hw, {**RIGHT, "03.1": attacks()["03.1"]})
    tampered.metadata["mha_course"]["assignment"] = ["03.1"]  # "grade me on 03.1 only"
    students = {
        "lovelaceada_12345_900001_week2.ipynb": answer(hw, RIGHT),
        "hoppergrace_LATE_12346_900002_week2.ipynb": answer(hw, RIGHT),
        "turingalan_12347_900003_week2.ipynb": tampered,
        "babbagecharles_12348_900004_week2.ipynb": answer(lesson, LESSON_03_RIGHT),
        "curiemarie_12349_900005_week2.ipynb": strip_metadata(answer(hw, RIGHT)),
        unicodedata.normalize("NFD", "Émilie du Châtelet_4242_assignsubmission_file_week2.ipynb"):
            answer(hw, {**RIGHT, "03.2": WRONG_03_2, "04.1": WRONG_04_1}),
        "ramanujan.ipynb": answer(hw, {**RIGHT, "03.1": "def attention_scores(q, k):\n"
                                                        "    return q"}),
        "ramanujan (1).ipynb": answer(hw, RIGHT),
        "hamiltonmargaret_12352_900007_week2.ipynb": answer(hw, {**RIGHT, "03.1": CRASH["98.1"]}),
        "liskovbarbara_12353_900008_week2.ipynb": answer(hw, {
            **RIGHT, "03.2": "def attention(q, k, v, mask=None):\n    while True:\n        pass"}),
    }
    for name, nb in students.items():
        write(nb, subs / name)
    (subs / "kayalan_12354_900009_week2.ipynb").write_text('{"cells": [{"cell_type": "co')
    (subs / "zeroes_12355_900010_week2.ipynb").write_bytes(b"")  # 0 bytes: 0 of 7, like kay
    (subs / "notes.pdf").write_bytes(b"%PDF-1.4")
    (subs / "__MACOSX").mkdir()
    (subs / "__MACOSX" / "._week2.ipynb").write_bytes(b"\0")
    os.utime(subs / "ramanujan.ipynb", (1.7e9, 1.7e9))
    late = datetime(2030, 2, 1).timestamp()
    os.utime(subs / "ramanujan (1).ipynb", (late, late))  # after the due date
    (tmp / "roster.csv").write_text("file,id,name\nramanujan,12351,Srinivasa Ramanujan\n",
                                    encoding="utf-8")
    before = {p: p.read_bytes() for p in subs.rglob("*") if p.is_file()}
    code, out = run_cli("check", subs, "--assignment", tmp / "week2.assignment.json", "--jobs",
                        2, "--timeout", 10, "--roster", tmp / "roster.csv", "--deadline",
                        "--feedback", tmp / "feedback", "--excel", cwd=tmp)
    with open(tmp / "results.csv", encoding="utf-8-sig", newline="") as f:
        table = list(csv.DictReader(f))
    return {"code": code, "out": out, "table": {row["id"]: row for row in table},
            "raw": (tmp / "results.csv").read_bytes(), "tmp": tmp, "subs": subs,
            "before": before}


def test_the_trial_gives_a_numeric_gradebook_keyed_by_student_id(trial):
    table = trial["table"]
    points = {sid: (row["03.1"], row["03.2"], row["04.1"], row["04.5"], row["total"],
                    row["max"], row["percent"]) for sid, row in table.items()}
    assert points == {
        "12345": ("1", "2", "1", "3", "7", "7", "100"),
        "12346": ("1", "2", "1", "3", "7", "7", "100"),
        "12347": ("0", "2", "1", "3", "6", "7", "85.71"),  # tampered: 03.1 fails
        "12348": ("1", "2", "0", "0", "3", "7", "42.86"),  # the lesson notebook handed in
        "12349": ("1", "2", "1", "3", "7", "7", "100"),  # metadata stripped
        "4242": ("1", "0", "0", "3", "4", "7", "57.14"),
        "12351": ("1", "2", "1", "3", "7", "7", "100"),  # the newest copy
        "12352": ("0", "2", "1", "3", "6", "7", "85.71"),  # crash in 03.1
        "12353": ("1", "0", "1", "3", "5", "7", "71.43"),  # hang in 03.2
        "12354": ("0", "0", "0", "0", "0", "7", "0"),  # invalid JSON
        "12355": ("0", "0", "0", "0", "0", "7", "0"),  # 0 bytes: out of the same 7
    }, points
    assert table["4242"]["student"] == "Émilie du Châtelet"  # NFC
    assert table["12351"]["student"] == "Srinivasa Ramanujan"
    assert {sid for sid, row in table.items() if row["late"] == "1"} == {"12346", "12351"}
    status = {sid: [row[f"{x} status"] for x in ("03.1", "03.2", "04.1", "04.5")]
              for sid, row in table.items()}
    assert status["12348"] == ["passed", "passed", "missing", "missing"]
    assert status["12352"][0] == "crashed" and status["12353"][1] == "timed out"
    assert status["12354"] == status["12355"] == ["error"] * 4
    assert trial["raw"].startswith(b"\xef\xbb\xbf")  # --excel: a BOM
    assert trial["code"] == 1  # grading completed; one submission could not be read


def test_the_trial_writes_one_feedback_file_per_student_without_the_instructors_paths(trial):
    files = sorted(p.name for p in (trial["tmp"] / "feedback").iterdir())
    assert len(files) == 11 and "4242 Émilie du Châtelet.md" in files
    for path in (trial["tmp"] / "feedback").iterdir():
        text = path.read_text(encoding="utf-8")
        assert "# Feedback: Week 2: attention" in text
        assert str(trial["tmp"]) not in text and str(ROOT) not in text, path.name
        assert "/tmp/" not in text, path.name
    emilie = (trial["tmp"] / "feedback" / "4242 Émilie du Châtelet.md").read_text("utf-8")
    assert "Score: 4 / 7 points (57.14 %)" in emilie
    assert "Likely mistake" in emilie  # the checker's own words
    turing = next(p for p in (trial["tmp"] / "feedback").iterdir() if "12347" in p.name)
    assert "## Exercise 03.1: Scaled scores" in turing.read_text("utf-8")
    liskov = next(p for p in (trial["tmp"] / "feedback").iterdir() if "12353" in p.name)
    assert "your function `attention`" in liskov.read_text("utf-8")


def test_the_trial_names_every_skipped_file_and_every_copy_not_graded(trial):
    out = trial["out"]
    assert "skipped __MACOSX/: macOS archive metadata" in out
    assert "skipped notes.pdf: not a notebook (.ipynb)" in out
    assert "ramanujan.ipynb is an older copy of ramanujan (1).ipynb" in out
    assert "your notebook also answers 03.3 03.4 03.5 03.6, which are not part of this " \
           "assignment: not graded" in out
    assert "zeroes_12355_900010_week2.ipynb: not a notebook: the file is empty (0 bytes)" in out
    assert ("not a notebook: the file is not valid JSON (Unterminated string starting at line "
            "1, column 26; the file may have been cut short or edited by hand)") in out


def test_the_trial_changed_no_submission(trial):
    for path, data in trial["before"].items():
        assert path.read_bytes() == data, path
    assert {p.name for p in trial["subs"].iterdir()} == {
        p.name for p in trial["before"] if p.parent == trial["subs"]} | {"__MACOSX"}


def test_an_assignment_notebook_decides_as_its_file_does(trial):
    hw = load_assignment(trial["tmp"] / "week2.ipynb")
    assert hw == load_assignment(trial["tmp"] / "week2.assignment.json")
    assert hw.points == {"03.1": 1, "03.2": 2, "04.1": 1, "04.5": 3}
    first = nbformat.read(trial["tmp"] / "week2.ipynb", as_version=4).cells[0].source
    assert first.startswith("# Week 2: attention") and "Due: 2030-01-01 23:59:59" in first
    assert ".venv/bin/python -m mha_course check" in first


# ---------------------------------------------------------------- the command's refusals


def test_a_run_refuses_before_any_work_when_it_could_not_write_its_results(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "a.ipynb").write_text("{}")
    hw = make_assignment("98.1", exercises(FIXTURES))
    save_assignment(hw, tmp_path / "hw.assignment.json")
    (tmp_path / "taken.csv").write_text("keep me")
    cases = {
        ("--csv", subs / "r.csv"): "inside the submissions folder",
        ("--feedback", subs / "fb"): "inside the submissions folder",
        ("--csv", tmp_path / "no" / "r.csv"): "no folder",
        ("--deadline",): "needs an --assignment with a due date",
        ("--probes", tmp_path / "none.py"): "cannot use it as probes",
    }
    for extra, message in cases.items():
        code, out = run_cli("check", subs, "--assignment", tmp_path / "hw.assignment.json",
                            "--solutions", FIXTURES, *extra, cwd=tmp_path)
        assert code == 2 and message in out, (extra, out)
        assert "== " not in out, out  # nothing was checked
    assert (tmp_path / "taken.csv").read_text() == "keep me"
    bad = tmp_path / "bad.assignment.json"
    bad.write_text(json.dumps({"format": "mha-course-assignment", "version": 1}))
    code, out = run_cli("check", subs, "--assignment", bad, cwd=tmp_path)
    assert code == 2 and '"exercises" must be a non-empty list' in out


def test_assign_lists_exercises_and_takes_ids_as_typed(tmp_path):
    code, out = run_cli("assign", "--list")
    assert code == 0 and "03.2   ★★   2 points  Scaled dot-product attention with a mask" in out
    code, out = run_cli("assign", "3.1, 03.2", "-o", tmp_path / "hw.ipynb", "--points",
                        "3.2=5")
    assert code == 0 and "(6 points)" in out, out
    assert load_assignment(tmp_path / "hw.assignment.json").points == {"03.1": 1, "03.2": 5}
    code, out = run_cli("assign", "3.1", "-o", tmp_path / "hw.ipynb")
    assert code == 2 and "already exists; use --force" in out
    code, out = run_cli("assign", "3.1", "-o", tmp_path / "hw.ipynb", "--force")
    assert code == 0 and load_assignment(tmp_path / "hw.assignment.json").exercises == ("03.1",)
    code, out = run_cli("assign", "9.14", "-o", tmp_path / "x.ipynb")  # 09.1-09.5: lesson 09's
    assert code == 2 and "09.14 is now 15.14" in out


def test_assign_list_into_a_closed_pipe_ends_without_a_traceback():
    """`assign --list | head -5`: the reader leaves early; one quiet exit, no BrokenPipeError."""
    read, write_end = os.pipe()
    os.close(read)  # the reader has gone before the first line is written
    proc = subprocess.run([sys.executable, "-m", "mha_course", "assign", "--list"], cwd=ROOT,
                          stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert proc.stderr == "" and proc.returncode == 1, proc.stderr


def test_a_class_with_failures_but_every_notebook_read_exits_0(tmp_path):
    """Exit 1 means "some submission could not be read", not "some student failed"."""
    generate(FIXTURES, tmp_path / "ex")
    lesson = nbformat.read(tmp_path / "ex" / "98_fixture.ipynb", as_version=4)
    write(answer(lesson, WRONG), tmp_path / "subs" / "bob.ipynb")
    save_assignment(make_assignment("98.1 98.2", exercises(FIXTURES)), tmp_path / "a.json")
    code, out = run_cli("check", tmp_path / "subs", "--assignment", tmp_path / "a.json",
                        "--solutions", FIXTURES, "--timeout", 10, cwd=tmp_path)
    assert code == 0, out
    assert "Exercise 98.1  FAILED" in out and "wrote results.csv" in out
    with open(tmp_path / "results.csv", encoding="utf-8", newline="") as f:
        assert [row["total"] for row in csv.DictReader(f)] == ["2"]


def make_dry_run(*args) -> str:
    """The command ``make -n ARGS`` would run, its continuation lines joined (without the
    "Entering directory" lines a make inside ``make test`` would print)."""
    out = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return " ".join(out.replace("\\\n", " ").split())


def test_make_assign_and_make_grade_pass_their_options():
    """make assign FORCE=1 TITLE=... DUE=... POINTS=...; make grade SUBMISSIONS= ASSIGNMENT=."""
    line = make_dry_run("assign", "IDS=3.1 3.2", "OUT=hw.ipynb", "TITLE=Week 2",
                        "DUE=2025-03-14", "POINTS=03.2=4", "FORCE=1")
    assert line.endswith('-m mha_course assign 3.1 3.2 -o hw.ipynb --title "Week 2" --due '
                         '"2025-03-14" --points "03.2=4" --force'), line
    assert "--force" not in make_dry_run("assign", "IDS=3.1", "OUT=hw.ipynb")
    line = make_dry_run("grade", "SUBMISSIONS=subs", "ASSIGNMENT=hw.assignment.json",
                        "CSV=g.csv", "FEEDBACK=fb", "ARGS=--excel")
    assert line.endswith('-m mha_course check "subs" --assignment "hw.assignment.json" '
                         '--jobs 2 --csv "g.csv" --feedback "fb" --excel'), line
    makefile = (ROOT / "Makefile").read_text()
    # checking and grading need only the course's own install (a `make lab` environment)
    assert "\ncheck: $(VENV)/.installed\n" in makefile
    assert "\ngrade: $(VENV)/.installed\n" in makefile
