"""The checker's decisions, on fake per-cell records: each verdict and its message in milliseconds.

A record is what the nbval plugin writes for one code cell (see
``mha_course.grading.reporting.verdicts``);
these tests build them by hand, so no kernel runs here. ``tests/test_exercise_tools.py`` runs
the same decisions end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_course.grading.authoring.notebooks import CellRole, ExerciseError, read_notebook, sort_ids
from mha_course.grading.reporting.report import (
    Row,
    collect_submissions,
    combine,
    csv_text,
    format_result,
    legend,
    summary_table,
)
from mha_course.grading.reporting.verdicts import (
    DEAD_ON_START,
    KERNEL_DIED,
    STATUS_MEANING,
    STATUS_SHORT,
    NotebookResult,
    Verdict,
    exercise_verdict,
    failure_message,
    judge_run,
    kernel_died,
)

SETUP = CellRole(None, "setup", "the setup cell `import numpy as np`")
SOLUTION = CellRole("03.2", "solution", "your solution cell")
CHECK = CellRole("03.2", "check", "the check cell `checks.check_attention(attention)`")


def ok(cell=0, got=""):
    return {"cell": cell, "ok": True, "message": "", "error": None, "got": got, "expected": got}


def raised(ename, evalue, traceback=(), cell=0):
    return {"cell": cell, "ok": False, "message": "Cell execution caused an exception",
            "error": {"ename": ename, "evalue": evalue, "traceback": list(traceback)},
            "got": "", "expected": ""}


def nbval_failed(message, cell=0, got="", expected=""):
    return {"cell": cell, "ok": False, "message": message, "error": None, "got": got,
            "expected": expected}


def verdict_of(solution_record, check_record, timeout=30):
    verdict, lost = exercise_verdict("03.2", [(solution_record, SOLUTION),
                                              (check_record, CHECK)], timeout)
    return verdict, lost


# ----------------------------------------------------------------------- one exercise's cells


def test_every_cell_ran_and_passed_is_passed():
    assert verdict_of(ok(), ok(got="Exercise 03.2 passed: ...\n")) == (Verdict("03.2", "passed"),
                                                                      False)


def test_a_checks_own_message_is_shown_without_its_exercise_prefix():
    evalue = "Exercise 03.2: your weights: shape (2, 5, 3); expected (..., T, S) = (2, 3, 5)"
    verdict, lost = verdict_of(ok(), raised("CheckFailed", evalue, ["frame 1", "frame 2"]))
    assert verdict == Verdict("03.2", "failed",
                              "your weights: shape (2, 5, 3); expected (..., T, S) = (2, 3, 5)")
    assert not lost


def test_a_forbidden_call_is_shown_in_the_checks_own_words():
    evalue = ("Exercise 03.2 asks you to write the masking yourself; your answer calls "
              "mha_course.softmax")
    verdict, _ = verdict_of(ok(), raised("CheckFailed", evalue, ["frame 1", "frame 2"]))
    assert verdict == Verdict("03.2", "failed", evalue)


def test_a_checks_long_message_is_cut_to_twelve_lines():
    evalue = "Exercise 03.2: " + "\n".join(f"line {i}" for i in range(20))
    verdict, _ = verdict_of(ok(), raised("CheckFailed", evalue))
    lines = verdict.message.split("\n")
    assert len(lines) == 12 and lines[-1] == "... (9 more lines)"


def test_the_exercises_own_stub_is_not_attempted():
    stub = raised("NotImplementedError", "Exercise 03.2: return (out, weights) of attention")
    assert verdict_of(ok(), stub) == (Verdict("03.2", "not attempted"), False)


def test_the_stub_counts_even_when_another_cell_failed_first():
    stub = raised("NotImplementedError", "Exercise 03.2: write attention")
    other = raised("NameError", "name 'q' is not defined")
    assert verdict_of(other, stub)[0].status == "not attempted"


def test_another_exercises_stub_says_which_to_do_first():
    verdict, _ = verdict_of(ok(), raised("NotImplementedError", "Exercise 03.1: write scores"))
    assert verdict == Verdict("03.2", "failed", "this exercise uses Exercise 03.1, which still "
                              "raises NotImplementedError: do that one first")


def test_an_unexpected_error_is_quoted_with_the_cell_and_the_line_that_raised_it():
    traceback = [
        "\x1b[0;31mValueError\x1b[0m  Traceback (most recent call last)",
        "Cell \x1b[0;32mIn[7], line 3\x1b[0m\n      1 def attention(q, k, v):\n"
        "\x1b[0;32m----> 3\x1b[0m     raise ValueError('bad')",
        "\x1b[0;31mValueError\x1b[0m: bad",
    ]
    verdict, _ = verdict_of(raised("ValueError", "bad", traceback), None)
    assert verdict.status == "failed"
    assert verdict.message == ("ValueError: bad  (raised in your solution cell)\n"
                               "  Cell In[7], line 3\n"
                               "  ----> 3     raise ValueError('bad')")


def test_a_syntax_error_names_the_line_of_the_cell_not_ipythons_file():
    verdict, _ = verdict_of(raised("SyntaxError", "invalid syntax (2381395.py, line 4)"), None)
    assert verdict.message == ("SyntaxError: invalid syntax (line 4 of the cell)  "
                               "(raised in your solution cell)")


def test_output_that_differs_from_the_solutions_shows_both():
    record = nbval_failed("Cell outputs differ", got="debug\n43\n", expected="42\n")
    verdict, _ = verdict_of(ok(), record)
    assert verdict == Verdict("03.2", "failed", "\n".join([
        "the check cell `checks.check_attention(attention)` printed something other than the "
        "solution's output",
        "  expected: 42",
        "  got:      debug",
        "  got:      43",
        "(a print() inside your function shows up here: remove it)",
    ]))


def test_a_leftover_print_in_a_correct_answer_passes_with_a_note():
    """Issue 10, problem 5: print("debug", ...) inside a correct function used to FAIL."""
    line = "Exercise 03.2 passed: out (2, 3, 6) and weights (2, 3, 5) match\n"
    record = nbval_failed("Cell outputs differ", got="debug 1\n" + line + "debug 2\n",
                          expected=line)
    verdict, lost = verdict_of(ok(), record)
    assert verdict.status == "passed" and not lost
    assert verdict.notes == ["your code printed 2 more lines in the check cell "
                             "`checks.check_attention(attention)` (the first: 'debug 1'); "
                             "remove the leftover print()"]


def test_extra_output_without_the_checks_line_is_not_a_pass():
    record = nbval_failed("Cell outputs differ", got="Exercise 03.2 passed: ...\n",
                          expected="Exercise 03.2 passed: out (2, 3, 6)\n")
    assert verdict_of(ok(), record)[0].status == "failed"


def test_a_reference_cell_that_printed_more_passes_only_when_the_check_passed():
    demo = CellRole("03.2", "text", "the cell `print(attention(q, k, v)[0].shape)`")
    more = nbval_failed("Cell outputs differ", got="debug\n(2, 3, 6)\n", expected="(2, 3, 6)\n")
    cells = [(ok(), SOLUTION), (ok(got="Exercise 03.2 passed\n"), CHECK), (more, demo)]
    assert exercise_verdict("03.2", cells, 30)[0].status == "passed"
    failed_check = raised("CheckFailed", "Exercise 03.2: wrong")
    cells[1] = (failed_check, CHECK)
    assert exercise_verdict("03.2", cells, 30)[0].message == "wrong"


OWN = CellRole("03.2", "own", "your cell `import math`")


def test_the_learners_own_cell_that_failed_is_a_note_not_the_verdict():
    error = raised("ModuleNotFoundError", "No module named 'pandas'")
    verdict, _ = exercise_verdict("03.2", [(error, OWN), (ok(), SOLUTION), (ok(), CHECK)], 30)
    assert verdict.status == "passed"
    assert verdict.notes == ["ModuleNotFoundError: No module named 'pandas'  (raised in your "
                             "cell `import math`); the check went on without it"]
    verdict, _ = exercise_verdict("03.2", [(error, OWN), (raised("NameError", "name 'math' is "
                                                                 "not defined"), SOLUTION),
                                           (None, CHECK)], 30)
    assert verdict.status == "failed" and verdict.message.startswith("NameError")
    assert verdict.notes[0].startswith("ModuleNotFoundError")


def test_a_timeout_in_the_learners_own_cell_names_that_cell():
    record = nbval_failed("Timeout of 30 seconds exceeded executing cell")
    verdict, lost = exercise_verdict("03.2", [(record, OWN), (ok(), SOLUTION)], 30)
    assert verdict == Verdict("03.2", "timed out", "TIMED OUT after 30 s in your cell "
                              "`import math`")
    assert not lost


def test_a_cell_timeout_names_the_cell_and_keeps_the_kernel():
    record = nbval_failed("Timeout of 5 seconds exceeded executing cell")
    verdict, lost = verdict_of(ok(), record, timeout=5)
    assert verdict == Verdict("03.2", "timed out",
                              "TIMED OUT after 5 s in the check cell "
                              "`checks.check_attention(attention)`")
    assert not lost


def test_a_timeout_whose_kernel_could_not_be_interrupted_loses_the_kernel():
    record = nbval_failed("Timeout of 2.5 seconds exceeded while executing cell. Failed to "
                          "interrupt kernel in 10 seconds, so failing without traceback.")
    verdict, lost = verdict_of(record, None, timeout=2.5)
    assert verdict.message == ("TIMED OUT after 2.5 s in your solution cell; it ignored the "
                               "interrupt, so its kernel was stopped")
    assert lost and kernel_died(record)


def test_a_dead_kernel_is_crashed_and_lost():
    record = nbval_failed(f"RuntimeError: {KERNEL_DIED}")
    verdict, lost = verdict_of(record, None)
    assert verdict == Verdict("03.2", "crashed", "the kernel died while running your solution "
                              "cell (os._exit, sys.exit in a thread, a segfault or out of memory?)")
    assert lost


def test_a_cell_that_did_not_run_is_not_checked():
    assert verdict_of(ok(), None) == (
        Verdict("03.2", "not checked", "a cell of this exercise did not run"), False)


def test_a_failure_beats_a_cell_that_did_not_run():
    verdict, _ = verdict_of(raised("CheckFailed", "Exercise 03.2: wrong"), None)
    assert verdict == Verdict("03.2", "failed", "wrong")


def test_failure_message_of_a_record_without_error_or_output_difference_is_nbvals():
    record = nbval_failed("Unrun reference cell has outputs")
    assert failure_message("03.2", record, CHECK) == "Unrun reference cell has outputs"


# ------------------------------------------------------------------------ a whole run's cells


ORDER = ["01.1", "01.2", "01.3"]


def roles_for(order=ORDER):
    """A setup cell, then a solution and a check cell per exercise."""
    roles = [SETUP]
    for x in order:
        roles += [CellRole(x, "solution", "your solution cell"),
                  CellRole(x, "check", f"the check cell `check_{x}`")]
    return roles


def records_for(**by_cell):
    """Every cell of ``roles_for()`` ok, except the cells given as ``c<index>=record``."""
    records = {i: ok(i) for i in range(1 + 2 * len(ORDER))}
    for key, record in by_cell.items():
        index = int(key[1:])
        if record is None:
            records.pop(index)
        else:
            records[index] = {**record, "cell": index}
    return records


def statuses(run):
    return [v.status for v in run.verdicts.values()]


def test_a_run_gives_one_verdict_per_exercise_in_order():
    stub = raised("NotImplementedError", "Exercise 01.2: write it")
    run = judge_run(ORDER, roles_for(), records_for(c4=stub), timeout=30)
    assert list(run.verdicts) == ORDER
    assert statuses(run) == ["passed", "not attempted", "passed"]
    assert run.lost_at is None and run.error == ""


def test_a_failed_setup_cell_stops_the_check_with_one_line():
    error = raised("ModuleNotFoundError", "No module named 'numpy'")
    run = judge_run(ORDER, roles_for(), records_for(c0=error), timeout=30)
    assert run.error == ("the setup cell `import numpy as np` failed, so nothing could be "
                         "checked: ModuleNotFoundError: No module named 'numpy'  (raised in the "
                         "setup cell `import numpy as np`)")
    assert run.verdicts == {}


def test_a_dead_kernel_marks_the_exercise_and_leaves_the_rest_unchecked():
    died = nbval_failed(f"RuntimeError: {KERNEL_DIED}")
    run = judge_run(ORDER, roles_for(), records_for(c3=died, c5=None, c6=None), timeout=30)
    assert run.lost_at == "01.2"
    assert statuses(run) == ["passed", "crashed", "not checked"]
    assert run.verdicts["01.3"].message == "the kernel died in an earlier exercise"


def test_an_exercise_decided_in_an_earlier_run_keeps_its_verdict():
    crashed = Verdict("01.2", "crashed", "the kernel died while running your solution cell")
    stub = raised("NotImplementedError", "Exercise 01.2: write it")  # the stub put in its place
    run = judge_run(ORDER, roles_for(), records_for(c3=stub), timeout=30,
                    decided={"01.2": crashed})
    assert run.lost_at is None
    assert run.verdicts["01.2"] is crashed
    assert statuses(run) == ["passed", "crashed", "passed"]


def test_the_backstop_turns_unchecked_exercises_into_timeouts():
    run = judge_run(ORDER, roles_for(), records_for(c4=None, c5=None, c6=None), timeout=30,
                    backstop=True)
    assert statuses(run) == ["passed", "timed out", "timed out"]
    assert run.verdicts["01.3"].message == "TIMED OUT: the whole check ran too long"


# ---------------------------------------------------------------------------------- reports


def test_format_result_indents_a_multi_line_message_under_its_exercise():
    result = NotebookResult(Path("ada.ipynb"), "solutions/01_matmul.ipynb", [
        Verdict("01.1", "passed"),
        Verdict("01.2", "failed", "first line\nsecond line"),
        Verdict("01.3", "not attempted"),
    ])
    assert format_result(result, 30) == "\n".join([
        "ada.ipynb (checked against solutions/01_matmul.ipynb; cell timeout 30 s)",
        "  Exercise 01.1  passed",
        "  Exercise 01.2  FAILED: first line",
        "                 second line",
        "  Exercise 01.3  not attempted",
        "  1 of 3 passed; 1 failed, 1 not attempted.",
    ])
    assert not result.all_passed


def test_format_result_of_an_error_is_one_line():
    result = NotebookResult(Path("bob.ipynb"), error="the setup cell `x` failed")
    assert format_result(result, 30) == "bob.ipynb: ERROR: the setup cell `x` failed"


def test_a_long_message_and_a_5_mb_line_are_capped_in_the_report():
    huge = "x" * 5_000_000
    result = NotebookResult(Path("max.ipynb"), "ref", [
        Verdict("01.1", "failed", "\n".join([huge] * 3 + [f"line {i}" for i in range(40)]),
                notes=[huge])])
    text = format_result(result, 30)
    assert len(text) < 6_000, len(text)
    assert "... (32 more lines)" in text
    assert "... (4999708 more characters)" in text
    record = nbval_failed("Cell outputs differ", got=huge + "\n", expected="42\n")
    assert len(failure_message("03.2", record, CHECK)) < 1_000


# ------------------------------------------------- a crash or hang in an assignment bundle


def bundle_roles():
    """An assignment of 01.1, 02.1, 02.2: one setup cell per lesson, as `assign` builds it."""
    def setup(lesson):
        return CellRole(None, "setup", f"the setup cell `import lesson{lesson}`")

    def pair(x):
        return [CellRole(x, "solution", "your solution cell"),
                CellRole(x, "check", f"the check cell `check_{x}`")]

    return [setup("01"), *pair("01.1"), setup("02"), *pair("02.1"), *pair("02.2")]


BUNDLE = ["01.1", "02.1", "02.2"]


def test_a_crash_in_a_bundles_first_exercise_loses_only_that_exercise():
    """Issue 10, problem 1: the next lesson's setup cell ran in the dead kernel; that used to
    make the whole submission one ERROR."""
    records = {i: ok(i) for i in range(8)}
    records[1] = nbval_failed(f"RuntimeError: {KERNEL_DIED}", cell=1)
    for i in range(2, 8):
        records[i] = nbval_failed(DEAD_ON_START, cell=i)
    run = judge_run(BUNDLE, bundle_roles(), records, timeout=30)
    assert run.error == ""
    assert run.lost_at == "01.1"
    assert statuses(run) == ["crashed", "not checked", "not checked"]
    # the checker then runs the bundle again with 01.1 stubbed: the others get real verdicts
    records = {i: ok(i) for i in range(8)}
    records[2] = raised("NotImplementedError", "Exercise 01.1: write it", cell=2)
    again = judge_run(BUNDLE, bundle_roles(), records, timeout=30,
                      decided={"01.1": run.verdicts["01.1"]})
    assert statuses(again) == ["crashed", "passed", "passed"] and again.lost_at is None


def test_a_hang_that_ignores_the_interrupt_in_a_bundles_first_exercise_loses_only_it():
    records = {i: ok(i) for i in range(8)}
    records[1] = nbval_failed("Timeout of 5 seconds exceeded while executing cell. Failed to "
                              "interrupt kernel in 5 seconds, so failing without traceback.",
                              cell=1)
    for i in range(2, 8):
        records[i] = nbval_failed(DEAD_ON_START, cell=i)
    run = judge_run(BUNDLE, bundle_roles(), records, timeout=5)
    assert run.error == "" and run.lost_at == "01.1"
    assert run.verdicts["01.1"] == Verdict("01.1", "timed out", "TIMED OUT after 5 s in your "
                                           "solution cell; it ignored the interrupt, so its "
                                           "kernel was stopped")


def test_a_kernel_killed_between_cells_is_blamed_on_the_last_cell_that_ran():
    """A thread started by 01.1's answer kills the kernel after its check passed."""
    records = {i: ok(i) for i in range(8)}
    for i in range(4, 8):
        records[i] = nbval_failed(DEAD_ON_START, cell=i)
    run = judge_run(BUNDLE, bundle_roles(), records, timeout=30)
    assert run.lost_at == "01.1" and run.error == ""
    assert run.verdicts["01.1"] == Verdict("01.1", "crashed", "the kernel died after the check "
                                           "cell `check_01.1` had run (a thread or a process "
                                           "your code started?)")
    assert statuses(run)[1:] == ["not checked", "not checked"]


def test_a_kernel_that_died_in_the_first_setup_cell_is_an_error():
    records = {0: nbval_failed(f"RuntimeError: {KERNEL_DIED}", cell=0)}
    run = judge_run(BUNDLE, bundle_roles(), records, timeout=30)
    assert run.error == "the kernel died in the setup cell `import lesson01`, so nothing could " \
                        "be checked"


# ----------------------------------------------------------------------------- folder mode


def test_tables_have_a_column_per_exercise_and_count_passes_per_submission():
    rows = [Row("ada", {"01.1": "passed", "01.2": "failed"}, ["01.1", "01.2"]),
            Row("bob", {"01.1": "crashed"}, ["01.1"])]
    assert csv_text(rows, ["01.1", "01.2"]) == ("submission,01.1,01.2,passed,total\n"
                                                "ada,passed,failed,1,2\nbob,crashed,,0,1\n")
    lines = summary_table(rows, ["01.1", "01.2"]).split("\n")
    assert lines[2].split() == ["ada", "pass", "FAIL", "1/2"]
    assert lines[3].split() == ["bob", "CRASH", "0/1"]


def test_an_assignment_and_a_lesson_notebook_each_count_out_of_their_own_exercises():
    """Issue 10, problem 6: a union denominator made a perfect assignment read 3/11."""
    hw = combine("ada", [("hw.ipynb", NotebookResult(Path("hw.ipynb"), "", [
        Verdict(x, "passed") for x in ("01.1", "03.2", "04.4")]))])
    lessons = combine("bob", [("03.ipynb", NotebookResult(Path("03.ipynb"), "", [
        Verdict(f"03.{i}", "passed") for i in range(1, 6)]))])
    columns = sort_ids([*hw.statuses, *lessons.statuses])
    table = summary_table([hw, lessons], columns).split("\n")
    assert table[2].split()[-1] == "3/3" and table[3].split()[-1] == "5/5"


def test_every_file_of_a_learners_folder_counts_best_result_per_exercise_with_a_note():
    """kim/hw_old.ipynb used to override kim/hw.ipynb (the last file in sort order won)."""
    hw = NotebookResult(Path("hw.ipynb"), "", [Verdict("03.1", "passed"),
                                               Verdict("03.2", "passed")])
    old = NotebookResult(Path("hw_old.ipynb"), "", [Verdict("03.1", "not attempted"),
                                                    Verdict("03.2", "failed", "wrong")])
    row = combine("kim", [("kim/hw.ipynb", hw), ("kim/hw_old.ipynb", old)])
    assert row.statuses == {"03.1": "passed", "03.2": "passed"}
    assert row.notes == ["Exercise 03.2: passed in hw.ipynb; failed in hw_old.ipynb (the best, "
                         "passed, counts)"]


def test_an_unreadable_file_in_a_learners_folder_is_an_error():
    good = NotebookResult(Path("a.ipynb"), "", [Verdict("03.1", "passed")])
    row = combine("kim", [("kim/a.ipynb", good),
                          ("kim/b.ipynb", ExerciseError("kim/b.ipynb: not a notebook"))])
    assert row.unreadable and row.notes == ["b.ipynb: ERROR: kim/b.ipynb: not a notebook"]
    table = summary_table([row], ["03.1", "03.2"]).split("\n")
    assert table[2].split() == ["kim", "pass", "ERROR", "1/2"]
    empty = combine("lou", [])
    assert summary_table([empty], ["03.1"]).split("\n")[2].split() == ["lou", "ERROR", "0/1"]


def test_the_legend_names_every_status():
    text = legend()
    for status, short in STATUS_SHORT.items():
        assert f"{short} = {STATUS_MEANING[status]}" in text
    assert "blank = not in this submission's notebooks" in text


def test_submissions_skip_hidden_and_system_folders_and_keep_clashing_names_apart(tmp_path):
    for rel in ["ada.ipynb", "jay.ipynb", "jay/hw.ipynb", "jay/old/hw_old.ipynb",
                "jay/.ipynb_checkpoints/hw-checkpoint.ipynb", "__MACOSX/._ada.ipynb",
                "._ada.ipynb", ".hidden/x.ipynb", "notes.txt", "kim/notes.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    subs = collect_submissions([tmp_path])
    assert [(s.name, [p.relative_to(tmp_path).as_posix() for p in s.notebooks]) for s in subs] == [
        ("ada", ["ada.ipynb"]),
        ("jay/", ["jay/hw.ipynb", "jay/old/hw_old.ipynb"]),
        ("jay.ipynb", ["jay.ipynb"]),
        ("kim", []),
    ]


def test_a_json_file_without_nbformat_gets_our_own_one_line_message(tmp_path):
    path = tmp_path / "x.ipynb"
    path.write_text('{"cells": [], "metadata": {}}')
    with pytest.raises(ExerciseError) as info:
        read_notebook(path)
    assert str(info.value) == f'{path}: not a notebook: the JSON has no "nbformat" version number'
