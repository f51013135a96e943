"""Checking a class: every submission of an LMS download, in parallel, one report each.

Not taught in a lesson: folder mode of ``python -m mha_course check`` (and grading mode, with
``--assignment``) runs :func:`check_class`: the submissions come from
:func:`~mha_course.grading.reporting.intake.collect` (every skipped file is printed with why), every
notebook is read once before any runs (:meth:`~mha_course.grading.running.check.Checker.watch`), the
notebooks are checked ``jobs`` at a time, and each submission's report is printed in order as
its results come in. Without an assignment each row counts the exercises of its own notebooks
(:func:`~mha_course.grading.reporting.report.combine`); with one, each row is a
:class:`~mha_course.grading.reporting.gradebook.GradeRow` of the assignment's exercises and points.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..authoring.assignment import number
from ..authoring.notebooks import ExerciseError
from .gradebook import grade_row
from .intake import collect
from .report import combine, format_result


def _check_one(checker, path):
    try:
        return checker.check(path)
    except ExerciseError as exc:
        return exc


def check_class(paths, checker, jobs: int, timeout: float, roster=None, deadline=None,
                say=print):
    """Check every submission in ``paths``; return ``(rows, intake)``.

    ``rows`` are :class:`~mha_course.grading.reporting.gradebook.GradeRow` in grading mode (the
    checker has an assignment), else :class:`~mha_course.grading.reporting.report.Row`.

    Raises
    ------
    ExerciseError
        When the folders hold no submission at all.
    """
    intake = collect(paths, roster=roster, deadline=deadline)
    for name, why in intake.skipped:
        say(f"skipped {name}: {why}")
    if not intake.submissions:
        raise ExerciseError("no submissions found (no .ipynb files or sub-folders)")
    checker.watch(p for sub in intake.submissions for p in sub.notebooks)
    assignment = checker.assignment
    rows = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [(sub, [(p, pool.submit(_check_one, checker, p)) for p in sub.notebooks])
                   for sub in intake.submissions]
        for sub, pending in futures:  # print in submission order as the results come in
            who = sub.name + (f" ({sub.student_id})" if sub.student_id and
                              sub.student_id != sub.name else "")
            say(f"== {who}" + ("  [late]" if sub.late else ""))
            results = []
            for path, future in pending:
                result = future.result()
                results.append((path, result))
                if isinstance(result, ExerciseError):
                    say(f"  ERROR: {result}")
                else:
                    say("  " + format_result(result, timeout).replace("\n", "\n  "))
            if not results:
                say("  ERROR: no notebooks in this submission")
            if assignment is None:
                row = combine(sub.name, results)
                row.notes += sub.notes
                errors = tuple(f"{p.name}: ERROR" for p, _ in results)
                notes = [n for n in row.notes if not n.startswith(errors)]
            else:
                row = grade_row(sub.name, sub.student_id, results, assignment, sub.late,
                                sub.modified, sub.notes)
                say(f"  score: {number(row.total)} of {number(row.max_points)} points "
                    f"({number(row.percent)} %)")
                notes = [n for n in sub.notes]
                notes += [n for n in row.notes if n.startswith("Exercise ")]
            for note in notes:
                say(f"  note: {note}")
            rows.append(row)
    return rows, intake
