"""Output belongs to the cell that printed it, or to nobody (instructor trial, 2 December 2026).

A notebook's background output (a thread, a subprocess, a carriage-return progress bar, output
arriving after its cell) must never fail a setup cell, an ungraded cell or another exercise, and
the same submission graded again must give the same gradebook row, byte for byte. The rule:
the kernel (:mod:`mha_course.grading.running.kernel`) sends only a cell's own synchronous output
with
the cell's parent header; the rest goes under a parent no cell has, so nbval and the grader
never compare it. A graded cell's own extra lines cost no points when the solution's lines are
all there (a note says which cell printed them); output that breaks the solution's lines fails.

- pure parts: the attribution rule (:func:`~mha_course.grading.running.kernel.own_output`), what a
cell
  printed from a recorded list of iopub messages (:func:`~mha_course.grading.running.session.
  cell_output`), the verdicts and the gradebook row;
- a real kernel started as the checker starts it: which messages carry the cell's header;
- the real checker, three times, on a correct notebook that leaves a thread, a subprocess or a
  progress bar writing: full marks and identical gradebook files every time.
"""

from __future__ import annotations

import csv
import os
import sys
import time
from pathlib import Path

import pytest

from mha_course.grading.authoring.assignment import make_assignment
from mha_course.grading.authoring.bundle import build_bundle
from mha_course.grading.authoring.catalog import exercises
from mha_course.grading.authoring.notebooks import CellRole, info, notebook_text
from mha_course.grading.reporting.gradebook import grade_row, gradebook_csv
from mha_course.grading.reporting.verdicts import (
    BACKGROUND_NOTE,
    NotebookResult,
    Verdict,
    exercise_verdict,
    judge_run,
)
from mha_course.grading.running.kernel import BACKGROUND, own_output
from mha_course.grading.running.session import BACKGROUND_ID, cell_output

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_helpers import run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"

# ------------------------------------------------------------------------- the attribution rule


def test_only_the_running_cells_own_thread_and_process_own_its_output():
    cell = (100, 7, "exec-1")
    assert own_output({"msg_id": "exec-1"}, cell, 100, 7)
    assert not own_output({"msg_id": "exec-1"}, cell, 100, 8)  # a thread it started
    assert not own_output({"msg_id": "exec-1"}, cell, 101, 7)  # a forked child
    assert not own_output({"msg_id": "exec-0"}, cell, 100, 7)  # an earlier cell's callback
    assert not own_output({"msg_id": "exec-1"}, None, 100, 7)  # between cells
    assert not own_output({}, cell, 100, 7)
    assert BACKGROUND["msg_id"] == BACKGROUND_ID  # the kernel's and the grader's sides agree


def msg(parent, kind, **content):
    return {"parent_header": {"msg_id": parent} if parent else {}, "msg_type": kind,
            "content": content}


def stream(parent, text, name="stdout"):
    return msg(parent, "stream", name=name, text=text)


def idle(parent):
    return msg(parent, "status", execution_state="idle")


def test_a_cells_output_is_its_own_stream_up_to_its_idle_whatever_arrives_between():
    recorded = [
        msg("c2", "status", execution_state="busy"),
        stream(BACKGROUND_ID, "...", "stderr"),  # a thread's dots
        stream("c2", "Exercise 03.1 passed\n"),
        stream(BACKGROUND_ID, "\rprogress 41%"),  # a thread's progress bar
        stream("c1", "late from the cell before\n"),  # an earlier cell's output, late
        stream(BACKGROUND_ID, "tick\ntick\n"),  # a subprocess on the kernel's stdout
        idle("c2"),
        stream("c2", "after idle\n"),
    ]
    assert cell_output(recorded, "c2") == ("Exercise 03.1 passed\n", True)
    # the same cell, the background interleaved differently: the same text
    quiet = [m for m in recorded if m["parent_header"].get("msg_id") != BACKGROUND_ID]
    assert cell_output(quiet, "c2") == ("Exercise 03.1 passed\n", False)
    assert cell_output(list(reversed(recorded[:-2])) + [idle("c2")], "c2")[0] == \
        "Exercise 03.1 passed\n"
    assert cell_output([stream("c1", "x\n"), idle("c1")], "c2") == ("", False)


# ------------------------------------------------------------------------------- the verdicts

SETUP = CellRole(None, "setup", "the setup cell `import numpy as np`")
ANSWER = CellRole("03.1", "solution", "your solution cell")
CHECK = CellRole("03.1", "check", "the check cell `check_scores(attention_scores)`")
DEMO = CellRole("03.1", "reference", "the cell `print(attention_scores(q, k))`")
PASSED = "Exercise 03.1 passed\n"


def ok(cell, expected=""):
    return {"cell": cell, "ok": True, "message": "", "error": None, "got": expected,
            "expected": expected}


def differs(cell, got, expected):
    return {"cell": cell, "ok": False, "message": "Cell outputs differ", "error": None,
            "got": got, "expected": expected}


def test_a_setup_cell_with_extra_lines_does_not_stop_the_check_but_a_changed_one_does():
    roles = [SETUP, ANSWER, CHECK]
    extra = {0: differs(0, "leftover\n", ""), 1: ok(1), 2: ok(2, PASSED)}
    run = judge_run(["03.1"], roles, extra, timeout=10)
    assert not run.error and run.verdicts["03.1"].status == "passed"
    assert run.notes == ["the setup cell `import numpy as np` printed 1 line the solution's "
                         "does not (the first: 'leftover'); ignored"]
    changed = {0: differs(0, "shape (2, 3)\n", "shape (3, 2)\n"), 1: ok(1), 2: ok(2, PASSED)}
    run = judge_run(["03.1"], roles, changed, timeout=10)
    assert run.error.startswith("the setup cell `import numpy as np` failed")


def test_a_record_that_saw_background_output_gives_the_run_one_fixed_note():
    records = {0: ok(0), 1: {**ok(1), "background": True}, 2: {**ok(2, PASSED), "background": 1}}
    run = judge_run(["03.1"], [SETUP, ANSWER, CHECK], records, timeout=10)
    assert run.notes == [BACKGROUND_NOTE] and run.verdicts["03.1"].status == "passed"
    assert judge_run(["03.1"], [SETUP, ANSWER, CHECK], {0: ok(0), 1: ok(1), 2: ok(2, PASSED)},
                     timeout=10).notes == []


def test_a_graded_cells_own_extra_lines_cost_a_note_and_broken_lines_cost_the_exercise():
    # the check's line is there and one more: passed, the note names the cell and the line
    verdict, _ = exercise_verdict("03.1", [(ok(1), ANSWER),
                                           (differs(2, "debug 3\n" + PASSED, PASSED), CHECK)], 10)
    assert verdict.status == "passed"
    assert verdict.notes == ["your code printed 1 more line in the check cell "
                             "`check_scores(attention_scores)` (the first: 'debug 3'); remove "
                             "the leftover print()"]
    # a demo cell's extra line is let go only once the exercise's check passed
    demo = differs(3, "[[1. 2.]]\nx\n", "[[1. 2.]]\n")
    verdict, _ = exercise_verdict("03.1", [(ok(1), ANSWER), (ok(2, PASSED), CHECK),
                                           (demo, DEMO)], 10)
    assert verdict.status == "passed" and "remove the leftover print()" in verdict.notes[0]
    # ... even a demo cell where the solution printed nothing
    silent = differs(3, "debug\n", "")
    verdict, _ = exercise_verdict("03.1", [(ok(1), ANSWER), (ok(2, PASSED), CHECK),
                                           (silent, DEMO)], 10)
    assert verdict.status == "passed" and "(the first: 'debug')" in verdict.notes[0]
    # but a check cell must show the check's own line
    assert exercise_verdict("03.1", [(ok(1), ANSWER), (differs(2, "debug\n", ""), CHECK)],
                            10)[0].status == "failed"
    failing = {**differs(2, "wrong\n", PASSED)}
    verdict, _ = exercise_verdict("03.1", [(ok(1), ANSWER), (failing, CHECK), (demo, DEMO)], 10)
    assert verdict.status == "failed"
    # a print without a newline breaks the check's line: nothing proves the check passed
    broken = differs(2, "debug" + PASSED, PASSED)
    verdict, _ = exercise_verdict("03.1", [(ok(1), ANSWER), (broken, CHECK)], 10)
    assert verdict.status == "failed" and "printed something other" in verdict.message


def test_the_gradebook_row_leaves_out_the_background_note(tmp_path):
    catalog = exercises(SOLUTIONS)
    hw = make_assignment("03.1", catalog)
    quiet = NotebookResult(tmp_path / "a.ipynb", "", [Verdict("03.1", "passed")])
    noisy = NotebookResult(tmp_path / "a.ipynb", "", [Verdict("03.1", "passed")],
                           notes=[BACKGROUND_NOTE])
    rows = [grade_row("ada", "1", [(r.path, r)], hw) for r in (quiet, noisy)]
    assert gradebook_csv(rows[:1], hw) == gradebook_csv(rows[1:], hw)


# --------------------------------------------------------------------------- a real kernel


@pytest.fixture(scope="module")
def kernel():
    """The checker's kernel (``python -m mha_course.grading.running.kernel``), unsandboxed."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = KernelSpec(argv=[sys.executable, "-m", "mha_course.grading.running.kernel", "-f",
                            "{connection_file}"], language="python", display_name="checker")
    # without pytest's variable, ipykernel also watches the file descriptors 1 and 2 (what a
    # subprocess writes), as it does under `make check` from a terminal
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])

    class Specs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return spec

    km = KernelManager(kernel_name="checker", kernel_spec_manager=Specs())
    with open(os.devnull, "w") as devnull:
        km.start_kernel(stdout=devnull, stderr=devnull, env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    yield kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def execute(kc, code: str) -> tuple[str, list]:
    """Run ``code``; return (what nbval would take as its output, every message read)."""
    msg_id = kc.execute(code)
    messages = []
    while True:
        m = kc.get_iopub_msg(timeout=30)
        messages.append(m)
        if (m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                and m["content"]["execution_state"] == "idle"):
            return cell_output(messages, msg_id)[0], messages


def test_the_checkers_kernel_sends_threads_subprocesses_and_late_callbacks_as_background(kernel):
    assert execute(kernel, "print('setup')")[0] == "setup\n"
    started = execute(kernel, (
        "import asyncio, subprocess, sys, threading, time\n"
        "def dots():\n"
        "    while True:\n"
        "        sys.stderr.write('.'); time.sleep(0.01)\n"
        "threading.Thread(target=dots, daemon=True).start()\n"
        "tick = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True:\\n"
        "    print(\"tick\", flush=True); time.sleep(0.01)'])\n"
        "asyncio.get_event_loop().call_later(0.05, print, 'late')\n"
        "time.sleep(0.3)\n"
        "print('mine')"))
    assert started[0] == "mine\n"
    try:
        for _ in range(3):  # later cells: only their own output, however long they run
            text, messages = execute(kernel, "time.sleep(0.2); print('again'); 1 + 1")
            assert text == "again\n"
            background = "".join(m["content"].get("text", "") for m in messages
                                 if m["parent_header"].get("msg_id") == BACKGROUND_ID)
            assert "." in background and "tick" in background
    finally:
        execute(kernel, "tick.kill()")


# ---------------------------------------------------------------- the real checker, 3 times

EXERCISES = ("03.1", "03.6", "04.1")
NOISE = {
    "thread": ("import sys as _s, threading as _t, time as _tm\n"
               "def _dots():\n"
               "    while True:\n"
               "        _s.stderr.write('.')\n"
               "        _tm.sleep(0.02)\n"
               "_t.Thread(target=_dots, daemon=True).start()\n"),
    "subprocess": ("import subprocess as _sp, sys as _s\n"
                   "_sp.Popen([_s.executable, '-c', 'import time\\nwhile True:\\n"
                   "    print(\"tick\", flush=True)\\n    time.sleep(0.02)'])\n"),
    "progress": ("import sys as _s, threading as _t, time as _tm\n"
                 "def _bar():\n"
                 "    for i in range(10**6):\n"
                 "        _s.stdout.write(f'\\rprogress {i % 100:3d}%')\n"
                 "        _tm.sleep(0.02)\n"
                 "_t.Thread(target=_bar, daemon=True).start()\n"),
}


def test_a_correct_notebook_with_background_output_gets_full_marks_and_the_same_rows(tmp_path):
    """The trial's case: a correct notebook whose first answer leaves something writing."""
    catalog = exercises(SOLUTIONS)
    code, out = run_cli("assign", *EXERCISES, "-o", tmp_path / "hw.ipynb", cwd=tmp_path)
    assert code == 0, out
    subs = tmp_path / "submissions"
    subs.mkdir()
    for name, noise in NOISE.items():
        nb = build_bundle(list(EXERCISES), SOLUTIONS, stub=False)
        first = next(c for c in nb.cells if info(c).get("role") == "solution")
        first.source = noise + first.source
        (subs / f"{name}.ipynb").write_text(notebook_text(nb), encoding="utf-8")
    results = []
    for attempt in range(3):
        started = time.monotonic()
        code, out = run_cli("check", subs, "--assignment", tmp_path / "hw.assignment.json",
                            "--csv", tmp_path / f"run{attempt}.csv", "--timeout", 60,
                            cwd=tmp_path)
        assert code == 0, out
        results.append((tmp_path / f"run{attempt}.csv").read_bytes())
        print(f"run {attempt}: {time.monotonic() - started:.0f} s")
    with open(tmp_path / "run0.csv", encoding="utf-8", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    points = sum(catalog_points for catalog_points in make_assignment(
        EXERCISES, catalog).points.values())
    assert {name: (row["total"], row["max"]) for name, row in rows.items()} == {
        name: (str(points), str(points)) for name in NOISE}, rows
    assert all(row["notes"] == "" for row in rows.values()), rows
    assert results[1] == results[0] and results[2] == results[0]
    assert "background output from your notebook" in out, \
        "the report tells the learner their background output was ignored"
