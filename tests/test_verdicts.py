"""The checker's decisions, on fake per-cell records: each verdict and its message in milliseconds.

A record is what the nbval plugin writes for one code cell (see ``mha_course.grading.verdicts``);
these tests build them by hand, so no kernel runs here. ``tests/test_exercise_tools.py`` runs
the same decisions end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_course.grading.notebooks import CellRole
from mha_course.grading.report import csv_text, format_result, summary_table
from mha_course.grading.verdicts import (
    KERNEL_DIED,
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
    record = nbval_failed("Cell outputs differ", got="debug\n42\n", expected="42\n")
    verdict, _ = verdict_of(ok(), record)
    assert verdict == Verdict("03.2", "failed", "\n".join([
        "the check cell `checks.check_attention(attention)` printed something other than the "
        "solution's output",
        "  expected: 42",
        "  got:      debug",
        "  got:      42",
        "(a print() inside your function shows up here: remove it)",
    ]))


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
    assert verdict.message == "TIMED OUT after 2.5 s in your solution cell"
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
    assert run.verdicts["01.3"].message == ""


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


@pytest.mark.parametrize("render", [summary_table, csv_text])
def test_tables_have_a_column_per_exercise_and_count_passes(render):
    rows = {"ada": {"01.1": "passed", "01.2": "failed"}, "bob": {"01.1": "crashed"}}
    text = render(rows, ["01.1", "01.2"])
    if render is csv_text:
        assert text == ("submission,01.1,01.2,passed\nada,passed,failed,1\n"
                        "bob,crashed,missing,0\n")
    else:
        lines = text.split("\n")
        assert lines[2].split() == ["ada", "pass", "FAIL", "1/2"]
        assert lines[3].split() == ["bob", "CRASH", "·", "0/2"]
