"""Command line: ``python -m mha_course generate | check | assign`` (also ``mha-course ...``).

``mha_course/__main__.py`` and the ``mha-course`` script both call :func:`main`.

- ``generate``: rebuild ``exercises/`` from ``solutions/`` (what ``make exercises`` runs), and
  the package's ``references/`` (the solutions without their answers: a learner with only the
  wheel checks against them).
- ``check``: the learner's verdict on a notebook (``make check EX=03``), or an instructor's
  table over a folder of submissions; with ``--assignment`` (``make grade``) a class graded
  against the assignment: the gradebook CSV, feedback files, checks run in the grader.
- ``assign``: bundle chosen exercises into one assignment notebook and its
  ``.assignment.json`` (``--list`` shows every exercise).
- ``tidy``: notebook hygiene for maintainers (``make notebook NB=...`` runs it after executing).
- ``workspace``: the learner's copies in ``my-work/`` (``make lab`` runs it first; see
  :mod:`mha_course.grading.workspace`).

Exit codes of ``check`` on notebooks (a learner's own check): 0 every exercise passed; 1 some
exercise did not pass; 2 a usage error, or a missing, broken or foreign notebook.

Exit codes of ``check`` on folders, or with ``--assignment`` (an instructor grading a class):
0 grading completed (every submission was read and graded, whatever its score); 1 grading
completed but some submissions could not be read or checked (each is an ERROR row with its
reason; the others are graded); 2 a usage error (nothing was checked: a bad option, a result
file that would land in the submissions folder, an unreadable assignment or roster). A CSV
that exists is never overwritten without ``--force``: the run writes ``NAME-2.csv`` (the first
free name) and says so; the bytes of a submission that changed during the check are kept in
``NAME.changed-during-check/`` beside the CSV, never in the submissions folder.

``generate --verify`` exits 1 when exercises/ is stale; ``tidy --check`` 1 when a notebook is
untidy; every command exits 2 on a usage error.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from .authoring.assignment import (
    assignment_path_for,
    load_assignment,
    make_assignment,
    number,
    parse_due,
    save_assignment,
)
from .authoring.bundle import assign
from .authoring.catalog import exercises, parse_ids
from .authoring.generate import REFERENCES, default_solutions, find_stale, generate
from .authoring.notebooks import (
    MOVED_LESSONS,
    ExerciseError,
    course_root,
    moved_message,
    notebook_text,
    read_notebook,
    sort_ids,
)
from .authoring.tidy import problems, tidy
from .export.common import choose
from .export.to_gradescope import export_gradescope
from .export.to_nbgrader import export_nbgrader
from .reporting.feedback import write_feedback
from .reporting.grade import check_class
from .reporting.gradebook import gradebook_csv, gradebook_table, write_text
from .reporting.intake import read_roster
from .reporting.report import combine, csv_text, format_result, summary_table
from .running.check import Checker, keep_folder
from .running.limits import (
    DEFAULT_DISK,
    DEFAULT_MEMORY,
    DEFAULT_PROCESSES,
    Limits,
    parse_size,
    size_text,
)
from .running.outputs import backup, free_name, plan_outputs
from .running.run import DEFAULT_TIMEOUT, stop_on_signals
from .workspace import WORKSPACE, sync


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mha_course",
        description="Exercise tools of the mha-course: generate, check, assign.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="rebuild exercises/ from solutions/")
    gen.add_argument("--solutions", type=Path, help="solution notebooks (default: solutions/)")
    gen.add_argument("--out", type=Path, help="where to write (default: exercises/)")
    gen.add_argument("--verify", action="store_true",
                     help="write nothing; exit 1 if the exercise notebooks are stale")
    gen.add_argument("--force", action="store_true",
                     help="overwrite exercise notebooks even if they hold a learner's work")

    chk = sub.add_parser("check", help="check exercise notebooks, or folders of submissions")
    chk.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                     help="a notebook, or a folder whose files/sub-folders are submissions")
    chk.add_argument("--lesson", metavar="NN",
                     help="check exercises/NN_*.ipynb (what `make check EX=NN` runs)")
    chk.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                     help=f"stop a cell that runs longer than this (default {DEFAULT_TIMEOUT})")
    chk.add_argument("--csv", type=Path, metavar="FILE",
                     help="write the exercise x submission table here (folder mode default: "
                          "results.csv, only if it does not exist)")
    chk.add_argument("--force", action="store_true", help="overwrite the CSV file")
    chk.add_argument("--solutions", type=Path, help="solution notebooks (default: solutions/)")
    chk.add_argument("--jobs", type=int, default=1, metavar="N",
                     help="check N notebooks at a time (default 1)")
    chk.add_argument("--no-sandbox", action="store_true",
                     help="run learners' code without the bubblewrap sandbox (see the trust "
                          "model in docs/instructors.md)")
    chk.add_argument("--assignment", type=Path, metavar="FILE",
                     help="grade against this assignment (the .assignment.json `assign` wrote, "
                          "or its notebook): its exercises, its points; checks run in the "
                          "grader, not in the submission's kernel")
    chk.add_argument("--roster", type=Path, metavar="FILE",
                     help="CSV with columns file,id[,name]: file names to student ids")
    chk.add_argument("--deadline", nargs="?", const="due", metavar="WHEN",
                     help="a submission modified after WHEN (ISO 8601; alone: the assignment's "
                          "due date) is late; Canvas's _LATE_ marker always is")
    chk.add_argument("--feedback", type=Path, metavar="DIR",
                     help="write one Markdown feedback file per student into DIR")
    chk.add_argument("--excel", action="store_true",
                     help="write the CSV with a UTF-8 BOM, so Excel reads accents right")
    chk.add_argument("--probes", type=Path, metavar="FILE",
                     help="grading: a Python file of probe_NN_M(function) checks of your own, "
                          "run in the grader after each exercise's check passed")
    chk.add_argument("--memory", type=_size_or_none, default=DEFAULT_MEMORY, metavar="SIZE",
                     help=f"memory each kernel may use (default {size_text(DEFAULT_MEMORY)}; "
                          "e.g. 8G, or 'none')")
    chk.add_argument("--processes", type=_count_or_none, default=DEFAULT_PROCESSES, metavar="N",
                     help=f"processes and threads each kernel may have (default "
                          f"{DEFAULT_PROCESSES}, or 'none')")
    chk.add_argument("--disk", type=_size_or_none, default=DEFAULT_DISK, metavar="SIZE",
                     help=f"what each kernel may write to its folders and /tmp (default "
                          f"{size_text(DEFAULT_DISK)}, or 'none')")

    asg = sub.add_parser("assign", help="bundle chosen exercises into one notebook")
    asg.add_argument("ids", nargs="*", metavar="ID",
                     help="exercise ids: 03.1 3.2 '4.1,4.5'; a lesson (03) means all of it")
    asg.add_argument("-o", "--output", type=Path, metavar="FILE",
                     help="the assignment notebook to write (.ipynb); its .assignment.json "
                          "goes beside it")
    asg.add_argument("--list", action="store_true",
                     help="list every exercise (id, stars, title, default points) and exit")
    asg.add_argument("--title", default="", help="the assignment's title")
    asg.add_argument("--due", metavar="WHEN", help="due date, ISO 8601 (2025-03-14T23:59)")
    asg.add_argument("--points", action="append", metavar="ID=N,...",
                     help="points per exercise (default: its stars), e.g. 03.1=2,04.5=4")
    asg.add_argument("--probe-seed", type=int, metavar="N",
                     help="grading runs each check again on inputs drawn from seed N")
    asg.add_argument("--force", action="store_true",
                     help="overwrite FILE and its .assignment.json if they exist")
    asg.add_argument("--solutions", type=Path, help="solution notebooks (default: solutions/)")

    exp = sub.add_parser("export", help="the chosen exercises for nbgrader or Gradescope")
    targets = exp.add_subparsers(dest="target", required=True)
    for target, what in (("nbgrader", "an nbgrader course folder (source assignment, config, "
                                      "README, the course's wheel)"),
                         ("gradescope", "a Gradescope autograder zip (setup.sh, run_autograder, "
                                        "the course's wheel) and the students' starter")):
        one = targets.add_parser(target, help=what)
        one.add_argument("ids", nargs="*", metavar="ID",
                         help="exercise ids as for assign: 03.1 3.2 '4.1,4.5'; a lesson (03)")
        one.add_argument("-o", "--output", type=Path, required=True,
                         metavar="FOLDER" if target == "nbgrader" else "FILE.zip",
                         help="the course folder to write into" if target == "nbgrader" else
                         "the autograder zip to write (the starter notebook goes beside it)")
        one.add_argument("--assignment", type=Path, metavar="FILE",
                         help="take the exercises, points, title and due date from this "
                              "assignment file (what `assign` wrote) instead of ids")
        one.add_argument("--points", action="append", metavar="ID=N,...",
                         help="points per exercise (default: its stars), e.g. 03.1=2,04.5=4")
        one.add_argument("--title", default="", help="the assignment's title")
        one.add_argument("--due", metavar="WHEN", help="due date, ISO 8601 (2025-03-14T23:59)")
        one.add_argument("--name", metavar="NAME",
                         help="the assignment's name (default: from the title or the ids)")
        one.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                         help=f"the cell timeout when grading (default {DEFAULT_TIMEOUT})")
        one.add_argument("--force", action="store_true", help="overwrite files that exist")
        one.add_argument("--solutions", type=Path,
                         help="solution notebooks (default: solutions/)")

    tdy = sub.add_parser("tidy", help="maintainers: kernelspec, no timing metadata, no widget "
                                      "state, nbval markers as tags")
    tdy.add_argument("paths", nargs="+", type=Path, metavar="NOTEBOOK")
    tdy.add_argument("--check", action="store_true",
                     help="write nothing; list what is untidy and exit 1 if anything is")
    wsp = sub.add_parser("workspace", help="copy the course's notebooks into my-work/, never "
                                           "overwriting your changes (make lab runs it)")
    wsp.add_argument("--root", type=Path, help="the course's folder (default: this one)")
    return parser


def _workspace(args) -> int:
    try:
        lines = sync(args.root or course_root())
    except (OSError, ValueError) as exc:
        raise ExerciseError(str(exc)) from None
    for line in lines:
        print(line)
    return 0


def _size_or_none(text: str) -> int | None:
    if text.strip().lower() in ("none", "unlimited"):
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count_or_none(text: str) -> int | None:
    if text.strip().lower() in ("none", "unlimited"):
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (at least 1)")
    return int(text)


def _solutions(arg: Path | None) -> Path:
    return arg if arg is not None else default_solutions(course_root())


def _generate(args) -> int:
    solutions = _solutions(args.solutions)
    out = args.out if args.out is not None else course_root() / "exercises"
    own = args.solutions is None and args.out is None and solutions != REFERENCES
    refs = {"references": REFERENCES, "sanitize": course_root() / "tests" / "nbval_sanitize.cfg"}
    if args.verify:
        stale = find_stale(solutions, out, **(refs if own else {}))
        for line in stale:
            print(f"stale: {line}")
        if stale:
            print("exercises are stale: run `make exercises`")
            return 1
        print(f"{out}: up to date with {solutions}")
        return 0
    for path, changed in generate(solutions, out, force=args.force, **(refs if own else {})):
        print(f"{'wrote' if changed else 'unchanged'} {path}")
    return 0


def lesson_notebook(value: str, root: Path | None = None) -> Path:
    """``exercises/NN_*.ipynb`` for ``make check EX=NN`` ("3" means "03"); else list the lessons.

    The learner's copy ``my-work/exercises/NN_*.ipynb`` (what ``make lab`` opens) comes first;
    the course's ``exercises/`` is used when there is no such copy.

    Raises
    ------
    ExerciseError
        Naming the lessons that have an exercise notebook.
    """
    folder = (root or course_root()) / "exercises"
    lessons = sorted(p.name[:2] for p in folder.glob("[0-9][0-9]_*.ipynb"))
    value = value.strip()
    wanted = value.zfill(2) if value.isdigit() and len(value) <= 2 else value
    mine = folder.parent / WORKSPACE / "exercises"
    if re.fullmatch(r"\d\d", wanted):
        copies = sorted(mine.glob(f"{wanted}_*.ipynb"))
        course = {p.name for p in folder.glob(f"{wanted}_*.ipynb")}
        copies = [p for p in copies if p.name in course] or copies
        if len(copies) == 1:
            return copies[0]
    matches = sorted(folder.glob(f"{wanted}_*.ipynb")) if re.fullmatch(r"\d\d", wanted) else []
    if len(matches) == 1:
        return matches[0]
    choices = " ".join(lessons) or "(none)"
    example = f" (e.g. make check EX={lessons[0]})" if lessons else ""
    if not value:
        raise ExerciseError(f"which lesson? pass EX=NN, one of: {choices}{example}")
    moved = MOVED_LESSONS.get(wanted)
    if moved and moved[0] in lessons:
        raise ExerciseError(f"lesson {wanted} has no exercise notebook: {moved[1]}, so its "
                            f"exercises are checked with make check EX={moved[0]}")
    raise ExerciseError(f"no exercise notebook for lesson {value!r} in {folder}; the lessons "
                        f"are: {choices}{example}")


def _options(args):
    """The assignment, roster, deadline and probes of ``check``, read before any work."""
    try:
        assignment = load_assignment(args.assignment) if args.assignment else None
        roster = read_roster(args.roster) if args.roster else None
        when = args.deadline
        if when == "due":
            if assignment is None or not assignment.due:
                raise ValueError("--deadline without a date needs an --assignment with a due "
                                 "date (or pass --deadline 2025-03-14T23:59)")
            when = assignment.due
        deadline = datetime.fromisoformat(parse_due(when)) if when else None
    except ValueError as exc:
        raise ExerciseError(str(exc)) from None
    probes = None
    if args.probes is not None:
        if assignment is None:
            raise ExerciseError("--probes needs --assignment (probes run in grading mode)")
        try:
            probes = args.probes.read_text(encoding="utf-8")
            compile(probes, str(args.probes), "exec")
        except (OSError, UnicodeDecodeError, SyntaxError) as exc:
            raise ExerciseError(f"{args.probes}: cannot use it as probes ({exc})") from None
    return assignment, roster, deadline, probes


def _check(args) -> int:
    if importlib.util.find_spec("nbval") is None:
        raise ExerciseError("nbval is not installed: run `.venv/bin/python -m pip install -e .` "
                            "in the course folder (the checker's needs install with the course)")
    if args.jobs < 1:
        raise ExerciseError("--jobs must be at least 1")
    if args.timeout <= 0:
        raise ExerciseError("--timeout must be a positive number of seconds")
    paths = list(args.paths)
    if args.lesson is not None:
        paths.append(lesson_notebook(args.lesson))
    if not paths:
        raise ExerciseError("nothing to check: give notebooks or folders (or --lesson NN)")
    assignment, roster, deadline, probes = _options(args)
    folder_mode = any(p.is_dir() for p in paths) or assignment is not None
    missing = [p for p in paths if not p.exists()]
    if folder_mode and missing:
        raise ExerciseError(f"{missing[0]}: no such file or folder")
    if (args.feedback or roster or deadline) and not folder_mode:
        raise ExerciseError("--feedback, --roster and --deadline grade a class: give a folder "
                            "of submissions (and --assignment)")
    if args.feedback and assignment is None:
        raise ExerciseError("--feedback needs --assignment (the points and exercises it "
                            "reports come from the assignment)")
    csv, first = args.csv, []
    if csv is not None and folder_mode and csv.exists() and not csv.is_dir() and not args.force:
        csv = free_name(csv)  # never overwrite an instructor's file: the next free name
        first.append(f"{args.csv} exists, so this run writes {csv} (use --force to replace "
                     f"{args.csv}; the old one is then kept as a .bak file)")
    outputs = plan_outputs(csv, args.feedback, args.force, folder_mode, paths)
    for note in [*first, *outputs.notes]:
        print(f"note: {note}", flush=True)
    keep = keep_folder(outputs.csv) if outputs.csv is not None and folder_mode else None
    hidden = [p if p.is_dir() else p.parent for p in paths]
    limits = Limits(args.memory, args.processes, args.disk)
    private = [p for p in (args.assignment, args.probes, args.roster) if p is not None]
    with stop_on_signals():
        checker = Checker.create(_solutions(args.solutions), args.timeout,
                                 sandbox=not args.no_sandbox, hidden=hidden, assignment=assignment,
                                 probes=probes, limits=limits, keep=keep, private=private)
        with checker:  # the files made private to the kernels get their permissions back
            for note in checker.notes():
                print(f"note: {note}", file=sys.stderr, flush=True)
            if folder_mode:
                code = _check_folder(args, paths, checker, outputs, roster, deadline)
            else:
                code = _check_files(args, paths, checker, outputs.csv)
            changed = checker.changed()
    if changed:  # by an editor's autosave, or by a submission's code without a sandbox
        print("warning: these files changed on disk during the check (every verdict above used "
              "the copies taken at the start):\n" + "\n".join(f"  {c}" for c in changed),
              file=sys.stderr, flush=True)
    return code


def _check_files(args, paths, checker, csv_path) -> int:
    """One report per notebook; a bad file gives exit code 2."""
    checker.watch(paths, own=len(paths) == 1)  # a learner's own notebook: their saves are kept
    code = 0
    rows = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [(p, pool.submit(checker.check, p)) for p in paths]
        for path, future in futures:
            try:
                result = future.result()
            except ExerciseError as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
                code = 2
                continue
            print(format_result(result, args.timeout), flush=True)
            code = max(code, 0 if result.all_passed else 1)
            rows.append(combine(path.stem, [(path, result)]))
    if csv_path is not None:
        columns = sort_ids(x for row in rows for x in row.statuses)
        _write(csv_path, csv_text(rows, columns), args.force)
    return code


def _check_folder(args, paths, checker, outputs, roster, deadline) -> int:
    """Each file or sub-folder of the folders is a submission: reports, then one table."""
    rows, _ = check_class(paths, checker, args.jobs, args.timeout, roster, deadline,
                          say=lambda line: print(line, flush=True))
    print()
    assignment = checker.assignment
    if assignment is None:
        columns = sort_ids(x for row in rows for x in row.statuses)
        print(summary_table(rows, columns))
        print("note: without --assignment each row counts the exercises of its own notebooks; "
              "to grade a class, pass the assignment `assign` wrote (--assignment FILE)")
        if outputs.csv is not None:
            _write(outputs.csv, csv_text(rows, columns), args.force)
        return 1 if any(row.unreadable for row in rows) else 0
    print(gradebook_table(rows, assignment))
    if outputs.csv is not None:
        _write(outputs.csv, gradebook_csv(rows, assignment), args.force, args.excel)
    if outputs.feedback is not None:
        roots = [*(p if p.is_dir() else p.parent for p in paths), course_root()]
        files = write_feedback(rows, outputs.feedback, assignment, checker.catalog, roots)
        print(f"wrote {len(files)} feedback files into {outputs.feedback}")
    return 1 if any(row.unreadable for row in rows) else 0


def _write(path: Path, text: str, force: bool, excel: bool = False) -> None:
    kept = backup(path) if force else None
    write_text(path, text, excel)
    print(f"wrote {path}" + (f" (the old one is now {kept})" if kept else ""))


def _list_exercises(solutions) -> int:
    catalog = exercises(solutions)
    width = max(len(x) for x in catalog)
    for info in catalog.values():
        points = f"{info.points} point{'s' if info.points != 1 else ''}"
        print(f"{info.id.ljust(width)}  {('★' * info.stars).ljust(3)}  {points.ljust(8)}  "
              f"{info.title}")
    print(f"{len(catalog)} exercises; `assign 3.1 3.2 04 -o hw.ipynb` bundles some (a lesson "
          "number means all of its exercises)")
    return 0


def _assign(args) -> int:
    solutions = _solutions(args.solutions)
    if args.list:
        return _list_exercises(solutions)
    if not args.ids:
        raise ExerciseError("which exercises? pass ids (03.1 3.2 '4.1,4.5'), or --list to see "
                            "them all")
    if args.output is None:
        raise ExerciseError("pass -o FILE.ipynb: the assignment notebook to write")
    catalog = exercises(solutions)
    try:
        ids = parse_ids(args.ids, known=list(catalog))
        out = Path(args.output)
        hw = make_assignment(ids, catalog, points=args.points or None, title=args.title,
                             due=args.due, notebook=out.name, probe_seed=args.probe_seed)
    except ValueError as exc:
        raise ExerciseError(str(exc)) from None
    for exercise in ids:
        note = moved_message(exercise, list(catalog))
        if note:
            print(note, file=sys.stderr)
    spec = assignment_path_for(out)
    if spec.exists() and not args.force:
        raise ExerciseError(f"{spec} already exists; use --force to overwrite it")
    out = assign(ids, out, solutions, force=args.force, assignment=hw)
    try:
        save_assignment(hw, spec, force=True)
    except (OSError, ValueError) as exc:
        raise ExerciseError(f"{spec}: cannot write it ({exc})") from None
    total = number(hw.max_points)
    print(f"wrote {out} with exercises {' '.join(ids)} ({total} points"
          + (f", due {hw.due}" if hw.due else "") + ")")
    print(f"wrote {spec}: keep it; grade with it: .venv/bin/python -m mha_course check "
          f"SUBMISSIONS/ --assignment {spec}")
    print(f"students check their work with: .venv/bin/python -m mha_course check {out.name}")
    return 0


def _export(args) -> int:
    solutions = _solutions(args.solutions)
    if args.timeout <= 0:
        raise ExerciseError("--timeout must be a positive number of seconds")
    hw = choose(args.ids, args.assignment, args.points, args.title, args.due, solutions)
    if args.target == "nbgrader":
        written = export_nbgrader(hw, args.output, solutions, args.name, args.force,
                                  args.timeout)
    else:
        written = export_gradescope(hw, args.output, solutions, args.name, args.force,
                                    args.timeout)
    print(f"exported exercises {' '.join(hw.exercises)} ({number(hw.max_points)} points) for "
          f"{args.target}:")
    for path in written:
        print(f"  wrote {path}")
    readme = next((p for p in written if p.name == "README.md"), None)
    if readme is not None:
        print(f"next: read {readme}")
    return 0


def _tidy(args) -> int:
    untidy = 0
    for path in args.paths:
        nb = read_notebook(path)
        found = problems(nb)
        if args.check:
            untidy += bool(found)
            for line in found:
                print(f"{path}: {line}")
            continue
        text = notebook_text(tidy(nb))
        if text != path.read_text(encoding="utf-8"):
            path.write_text(text, encoding="utf-8")
            print(f"tidied {path}" + (f" ({len(found)} fixes)" if found else ""))
    return 1 if untidy else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m mha_course`` and the ``mha-course`` script."""
    args = _parser().parse_args(argv)
    try:
        commands = {"generate": _generate, "check": _check, "assign": _assign, "tidy": _tidy,
                    "export": _export, "workspace": _workspace}
        return commands[args.command](args)
    except ExerciseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `assign --list | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1

