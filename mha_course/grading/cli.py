"""Command line: ``python -m mha_course generate | check | assign`` (also ``mha-course ...``).

``mha_course/__main__.py`` and the ``mha-course`` script both call :func:`main`.

- ``generate``: rebuild ``exercises/`` from ``solutions/`` (what ``make exercises`` runs).
- ``check``: the learner's verdict on a notebook (``make check EX=03``), or an instructor's
  table over a folder of submissions.
- ``assign``: bundle chosen exercises into one assignment notebook.
- ``tidy``: notebook hygiene for maintainers (``make notebook NB=...`` runs it after executing).

Exit codes: 0 all good; 1 some exercise did not pass (or exercises/ is stale with --verify);
2 a usage error or a missing, broken or foreign notebook.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .bundle import assign
from .check import Checker
from .generate import exercise_ids, find_stale, generate, load_solutions
from .limits import DEFAULT_DISK, DEFAULT_MEMORY, DEFAULT_PROCESSES, Limits, parse_size, size_text
from .notebooks import (
    MOVED_LESSONS,
    ExerciseError,
    course_root,
    moved_message,
    notebook_text,
    read_notebook,
    sort_ids,
)
from .report import collect_submissions, combine, csv_text, format_result, summary_table
from .run import DEFAULT_TIMEOUT, stop_on_signals
from .sandbox import UNSANDBOXED
from .tidy import problems, tidy


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
                     help="run learners' code without the bubblewrap sandbox (see the README's "
                          "trust model)")
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
    asg.add_argument("ids", nargs="+", metavar="ID", help='exercise ids, e.g. 01.1 03.2 04.4')
    asg.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                     help="the assignment notebook to write (.ipynb)")
    asg.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    asg.add_argument("--solutions", type=Path, help="solution notebooks (default: solutions/)")

    tdy = sub.add_parser("tidy", help="maintainers: kernelspec, no timing metadata, no widget "
                                      "state, nbval markers as tags")
    tdy.add_argument("paths", nargs="+", type=Path, metavar="NOTEBOOK")
    tdy.add_argument("--check", action="store_true",
                     help="write nothing; list what is untidy and exit 1 if anything is")
    return parser


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
    return arg if arg is not None else course_root() / "solutions"


def _generate(args) -> int:
    solutions = _solutions(args.solutions)
    out = args.out if args.out is not None else course_root() / "exercises"
    if args.verify:
        stale = find_stale(solutions, out)
        for line in stale:
            print(f"stale: {line}")
        if stale:
            print("exercises are stale: run `make exercises`")
            return 1
        print(f"{out}: up to date with {solutions}")
        return 0
    for path, changed in generate(solutions, out, force=args.force):
        print(f"{'wrote' if changed else 'unchanged'} {path}")
    return 0


def lesson_notebook(value: str, root: Path | None = None) -> Path:
    """``exercises/NN_*.ipynb`` for ``make check EX=NN`` ("3" means "03"); else list the lessons.

    Raises
    ------
    ExerciseError
        Naming the lessons that have an exercise notebook.
    """
    folder = (root or course_root()) / "exercises"
    lessons = sorted(p.name[:2] for p in folder.glob("[0-9][0-9]_*.ipynb"))
    value = value.strip()
    wanted = value.zfill(2) if value.isdigit() and len(value) <= 2 else value
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


def _check(args) -> int:
    if importlib.util.find_spec("nbval") is None:
        raise ExerciseError("nbval is not installed: run `pip install -e '.[test]'` "
                            "(or `make check EX=NN`, which does it)")
    if args.jobs < 1:
        raise ExerciseError("--jobs must be at least 1")
    if args.timeout <= 0:
        raise ExerciseError("--timeout must be a positive number of seconds")
    paths = list(args.paths)
    if args.lesson is not None:
        paths.append(lesson_notebook(args.lesson))
    if not paths:
        raise ExerciseError("nothing to check: give notebooks or folders (or --lesson NN)")
    folder_mode = any(p.is_dir() for p in paths)
    csv_path = args.csv
    if csv_path is None and folder_mode:
        csv_path = Path("results.csv")
        if csv_path.exists() and not args.force:
            print(f"note: {csv_path} exists and will not be overwritten "
                  "(use --csv FILE, or --force)")
            csv_path = None
    elif csv_path is not None and csv_path.exists() and not args.force:
        raise ExerciseError(f"{csv_path} already exists; use --force to overwrite it")
    hidden = [p if p.is_dir() else p.parent for p in paths]
    limits = Limits(args.memory, args.processes, args.disk)
    with stop_on_signals():
        checker = Checker.create(_solutions(args.solutions), args.timeout,
                                 sandbox=not args.no_sandbox, hidden=hidden, limits=limits)
        if checker.unsandboxed:
            print("note: " + UNSANDBOXED.format(reason=checker.unsandboxed), file=sys.stderr,
                  flush=True)
        else:  # unsandboxed, the note above says it all
            for missing in checker.isolation.enforcement.missing:
                print(f"note: {missing}", file=sys.stderr, flush=True)
        if folder_mode:
            code = _check_folder(args, paths, checker, csv_path)
        else:
            code = _check_files(args, paths, checker, csv_path)
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
        _write_csv(csv_path, rows)
    return code


def _check_folder(args, paths, checker, csv_path) -> int:
    """Each file or sub-folder of the folders is a submission: reports, then one table."""
    submissions = collect_submissions(paths)
    if not submissions:
        raise ExerciseError("no submissions found (no .ipynb files or sub-folders)")
    checker.watch(p for sub in submissions for p in sub.notebooks)

    def check_one(path):
        try:
            return checker.check(path)
        except ExerciseError as exc:
            return exc

    rows, code = [], 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [(sub, [(p, pool.submit(check_one, p)) for p in sub.notebooks])
                   for sub in submissions]
        for sub, pending in futures:  # print in submission order as the results come in
            print(f"== {sub.name}", flush=True)
            results = []
            for path, future in pending:
                result = future.result()
                results.append((path, result))
                if isinstance(result, ExerciseError):
                    print(f"  ERROR: {result}", flush=True)
                    continue
                print("  " + format_result(result, args.timeout).replace("\n", "\n  "),
                      flush=True)
            row = combine(sub.name, results)
            for note in row.notes:
                if not note.startswith(tuple(f"{p.name}: ERROR" for p, _ in results)):
                    print(f"  note: {note}", flush=True)
            if not results:
                print("  ERROR: no notebooks in this submission", flush=True)
            rows.append(row)
            if row.unreadable or any(s != "passed" for s in row.statuses.values()):
                code = 1
    print()
    columns = sort_ids(x for row in rows for x in row.statuses)
    print(summary_table(rows, columns))
    if csv_path is not None:
        _write_csv(csv_path, rows, columns)
    return code


def _write_csv(path: Path, rows, columns=None) -> None:
    if columns is None:
        columns = sort_ids(x for row in rows for x in row.statuses)
    path.write_text(csv_text(rows, columns), encoding="utf-8")
    print(f"wrote {path}")


def _assign(args) -> int:
    solutions = _solutions(args.solutions)
    known = exercise_ids(load_solutions(solutions))
    for exercise in sort_ids(x for x in args.ids if x in known):
        note = moved_message(exercise, known)
        if note:
            print(note, file=sys.stderr)
    out = assign(args.ids, args.output, solutions, force=args.force)
    print(f"wrote {out} with exercises {' '.join(sort_ids(args.ids))}")
    print(f"check it with: python -m mha_course check {out}")
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
        commands = {"generate": _generate, "check": _check, "assign": _assign, "tidy": _tidy}
        return commands[args.command](args)
    except ExerciseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

