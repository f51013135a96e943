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
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .bundle import assign
from .check import check_notebook
from .generate import find_stale, generate
from .notebooks import ExerciseError, course_root, notebook_text, read_notebook, sort_ids
from .report import collect_submissions, csv_text, format_result, summary_table
from .run import DEFAULT_TIMEOUT
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
    chk.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                     help="a notebook, or a folder whose files/sub-folders are submissions")
    chk.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                     help=f"stop a cell that runs longer than this (default {DEFAULT_TIMEOUT})")
    chk.add_argument("--csv", type=Path, metavar="FILE",
                     help="write the exercise x submission table here (folder mode default: "
                          "results.csv, only if it does not exist)")
    chk.add_argument("--force", action="store_true", help="overwrite the CSV file")
    chk.add_argument("--solutions", type=Path, help="solution notebooks (default: solutions/)")
    chk.add_argument("--jobs", type=int, default=1, metavar="N",
                     help="check N notebooks at a time (default 1)")

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


def _check(args) -> int:
    if importlib.util.find_spec("nbval") is None:
        raise ExerciseError("nbval is not installed: run `pip install -e '.[test]'` "
                               "(or `make check EX=NN`, which does it)")
    if args.jobs < 1:
        raise ExerciseError("--jobs must be at least 1")
    if args.timeout <= 0:
        raise ExerciseError("--timeout must be a positive number of seconds")
    solutions = _solutions(args.solutions)
    folder_mode = any(p.is_dir() for p in args.paths)
    csv_path = args.csv
    if csv_path is None and folder_mode:
        csv_path = Path("results.csv")
        if csv_path.exists() and not args.force:
            print(f"note: {csv_path} exists and will not be overwritten "
                  "(use --csv FILE, or --force)")
            csv_path = None
    elif csv_path is not None and csv_path.exists() and not args.force:
        raise ExerciseError(f"{csv_path} already exists; use --force to overwrite it")

    if not folder_mode:  # one report per notebook; a bad file gives exit code 2
        code = 0
        rows = {}
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [(p, pool.submit(check_notebook, p, solutions, args.timeout))
                       for p in args.paths]
            for path, future in futures:
                try:
                    result = future.result()
                except ExerciseError as exc:
                    print(f"error: {exc}", file=sys.stderr, flush=True)
                    code = 2
                    continue
                print(format_result(result, args.timeout), flush=True)
                code = max(code, 0 if result.all_passed else 1)
                rows[path.stem] = {v.exercise: v.status for v in result.verdicts}
        if csv_path is not None:
            _write_csv(csv_path, rows)
        return code

    submissions = collect_submissions(args.paths)
    if not submissions:
        raise ExerciseError("no submissions found (no .ipynb files or sub-folders)")
    def check_one(path):
        try:
            return check_notebook(path, solutions, args.timeout)
        except ExerciseError as exc:
            return exc

    rows: dict[str, dict[str, str]] = {}
    code = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [(name, [(p, pool.submit(check_one, p)) for p in notebooks])
                   for name, notebooks in submissions]
        for name, pending in futures:  # print in submission order as the results come in
            statuses: dict[str, str] = {}
            print(f"== {name}", flush=True)
            if not pending:
                print("  ERROR: no notebooks in this submission")
                code = 1
            for _, future in pending:
                result = future.result()
                if isinstance(result, ExerciseError):
                    print(f"  ERROR: {result}", flush=True)
                    code = 1
                    continue
                report = format_result(result, args.timeout)
                print("  " + report.replace("\n", "\n  "), flush=True)
                if not result.all_passed:
                    code = 1
                for v in result.verdicts:
                    statuses[v.exercise] = v.status
            rows[name] = statuses or {"": "error"}
    print()
    exercises = sort_ids(x for s in rows.values() for x in s if x)
    for name in rows:
        if rows[name] == {"": "error"}:
            rows[name] = {x: "error" for x in exercises}
    print(summary_table(rows, exercises))
    if csv_path is not None:
        _write_csv(csv_path, rows, exercises)
    return code


def _write_csv(path: Path, rows, exercises=None) -> None:
    if exercises is None:
        exercises = sort_ids(x for s in rows.values() for x in s)
    path.write_text(csv_text(rows, exercises), encoding="utf-8")
    print(f"wrote {path}")


def _assign(args) -> int:
    out = assign(args.ids, args.output, _solutions(args.solutions), force=args.force)
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

