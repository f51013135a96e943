"""Checking a learner's notebook: the loop that merges, runs nbval and decides.

:func:`check_notebook` finds the solution the learner's notebook answers, puts the learner's
solution cells into a copy of it (:mod:`~mha_course.grading.merge`), runs strict nbval on the
copy in a subprocess (:mod:`~mha_course.grading.run`) and turns nbval's per-cell records into one
verdict per exercise (:mod:`~mha_course.grading.verdicts`). When the kernel dies during an
exercise, the later exercises ran in a dead kernel: the notebook is run again with that
exercise stubbed out, so a crash loses only the exercise that caused it.
"""

from __future__ import annotations

from pathlib import Path

from .merge import merge_learner, reference_for
from .notebooks import course_root, info, read_notebook
from .run import DEFAULT_TIMEOUT, run_nbval
from .verdicts import NotebookResult, Verdict, judge_run


def check_notebook(
    path: str | Path,
    solutions_dir: str | Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    sanitize: Path | None = None,
) -> NotebookResult:
    """Check one learner notebook against its solution; never writes ``path``.

    Raises
    ------
    ExerciseError
        For a missing, broken or foreign notebook (the caller reports it and exits with 2).
    """
    path = Path(path)
    root = course_root()
    solutions_dir = Path(solutions_dir) if solutions_dir is not None else root / "solutions"
    if sanitize is None and (root / "tests" / "nbval_sanitize.cfg").is_file():
        sanitize = root / "tests" / "nbval_sanitize.cfg"
    learner = read_notebook(path)
    ref, label = reference_for(learner, path, solutions_dir)
    result = NotebookResult(path=path, reference=label)
    order = []
    for cell in ref.cells:
        exercise = info(cell).get("exercise")
        if exercise and exercise not in order:
            order.append(exercise)
    decided: dict[str, Verdict] = {}
    for _ in range(len(order) + 1):
        merged, roles = merge_learner(ref, learner, stubbed=set(decided))
        records, backstop = run_nbval(merged, timeout, sanitize)
        run = judge_run(order, roles, records, timeout, backstop, decided)
        if run.error:
            result.error = run.error
            return result
        if run.lost_at is None or run.lost_at == order[-1] or backstop:
            result.verdicts = list(run.verdicts.values())
            return result
        decided[run.lost_at] = run.verdicts[run.lost_at]  # run again with it stubbed out
    result.verdicts = [decided.get(x, Verdict(x, "not checked")) for x in order]
    return result
