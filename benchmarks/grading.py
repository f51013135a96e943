"""Benchmark the course's checker against real nbgrader: the same class, graded by both, in one run.

Run from the repository root (needs nbgrader: ``make nbgrader``, or ``MHA_COURSE_NBGRADER``
naming its executable)::

    .venv/bin/python benchmarks/grading.py            # lessons 03, 06, 10; 6 students; 3 rounds
    .venv/bin/python benchmarks/grading.py --quick    # lesson 03; 3 students; 1 round
    .venv/bin/python benchmarks/grading.py --jobs 1   # the checker one notebook at a time only

It builds a class in a temporary folder: ``export nbgrader`` of the lessons' exercises (one
assignment), ``nbgrader generate_assignment``, then students made from the released notebook:
*right* (every answer the solution's), *blank* (nbgrader's stubs, untouched) and *wrong* (every
other answer wrapped so that it returns a changed result). It then grades the class with
``nbgrader autograde`` and with the checker (``python -m mha_course check submitted
--assignment``, grading mode, sandboxed where bubblewrap works) on the same notebooks, each as a
command of its own (start-up included), in turns (each round starts with the next one), and
prints the times per round, per notebook, and the ratio checker / nbgrader of the summed times:
below 1.0 the checker is the faster. The checker runs twice a round, one notebook at a time
(``--jobs 1``, as nbgrader grades) and two at a time (``--jobs 2``, what ``make grade``
runs). It also prints the graders' points per student (they must agree on these honest
notebooks). Wall times on a shared machine vary with its load: only the ratios of one run,
measured in turns, are meaningful.
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NAME = "hw"


def nbgrader_executable() -> Path | None:
    """``MHA_COURSE_NBGRADER``, else ``.venv-nbgrader/bin/nbgrader`` (``make nbgrader``)."""
    for candidate in (os.environ.get("MHA_COURSE_NBGRADER"),
                      ROOT / ".venv-nbgrader" / "bin" / "nbgrader"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def run(cmd, cwd: Path, env=None) -> str:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(map(str, cmd))}\n"
                 f"{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def nbgrader_env(executable: Path) -> dict:
    return {**os.environ, "PATH": f"{executable.parent}{os.pathsep}{os.environ['PATH']}"}


def solution_text(source: str) -> str:
    """An nbgrader source cell's answer without the ``### BEGIN/END SOLUTION`` marker lines."""
    return "\n".join(line for line in source.splitlines()
                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


def wrong_text(answer: str) -> str:
    """``answer`` with its first function wrapped so that it returns a changed result."""
    names = re.findall(r"^def (\w+)\(", answer, flags=re.MULTILINE)
    if not names:
        return answer + "\nraise ValueError('a wrong answer')"
    f = names[0]
    return (f"{answer}\n\n_{f}_right = {f}\n\n\ndef {f}(*args, **kwargs):\n"
            f"    out = _{f}_right(*args, **kwargs)\n"
            "    return out * 1.5 + 1 if hasattr(out, '__array__') or isinstance(out, (int, float))"
            " else None\n")


def build_class(course: Path, lessons: list[str], n_students: int, executable: Path) -> list:
    """Export, release and hand in the class; return the students' names."""
    run([sys.executable, "-m", "mha_course", "export", "nbgrader", *lessons, "-o", course,
         "--name", NAME], cwd=ROOT)
    run([executable, "generate_assignment", NAME], cwd=course, env=nbgrader_env(executable))
    released = nbformat.read(course / "release" / NAME / f"{NAME}.ipynb", as_version=4)
    source = nbformat.read(course / "source" / NAME / f"{NAME}.ipynb", as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: solution_text(c.source)
               for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")}
    kinds = ["right", "blank", "wrong"]
    students = []
    for i in range(n_students):
        kind = kinds[i % 3]
        student = f"{kind}{i // 3 + 1}"
        nb = copy.deepcopy(released)
        n = 0
        for cell in nb.cells:
            grading = cell.metadata.get("nbgrader", {})
            if not grading.get("solution") or grading.get("grade_id") not in answers:
                continue
            answer = answers[grading["grade_id"]]
            if kind == "right":
                cell.source = answer
            elif kind == "wrong":
                cell.source = wrong_text(answer) if n % 2 == 0 else answer
            n += 1
        target = course / "submitted" / student / NAME / f"{NAME}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
        students.append(student)
    return students


def time_nbgrader(course: Path, executable: Path) -> tuple[float, dict]:
    """``nbgrader autograde`` of the whole class (again: ``--force``); (seconds, points)."""
    shutil.rmtree(course / "autograded", ignore_errors=True)
    start = time.perf_counter()
    run([executable, "autograde", NAME, "--force"], cwd=course, env=nbgrader_env(executable))
    seconds = time.perf_counter() - start
    run([executable, "export"], cwd=course, env=nbgrader_env(executable))
    with open(course / "grades.csv", newline="") as f:
        points = {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}
    return seconds, points


def time_checker(course: Path, jobs: int) -> tuple[float, dict]:
    """The checker in grading mode on the same submissions; (seconds, points)."""
    results = course / "checker.csv"
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "mha_course", "check", course / "submitted",
                          "--assignment", course / f"{NAME}.assignment.json", "--jobs",
                          str(jobs), "--csv", results, "--force"], cwd=ROOT,
                         capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"the checker failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr}")
    with open(results, newline="") as f:
        points = {row["student"]: float(row["total"]) for row in csv.DictReader(f)}
    return seconds, points


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="lesson 03 only, 3 students, 1 round (a smoke run)")
    parser.add_argument("--lessons", nargs="+", default=None, help="default: 03 06 10")
    parser.add_argument("--students", type=int, default=None, help="default: 6 (3 quick)")
    parser.add_argument("--rounds", type=int, default=None, help="default: 3 (1 quick)")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2],
                        help="the checker's --jobs, each timed (default: 1 2; nbgrader grades "
                             "one notebook at a time)")
    args = parser.parse_args(argv)
    lessons = args.lessons or (["03"] if args.quick else ["03", "06", "10"])
    n_students = args.students or (3 if args.quick else 6)
    rounds = args.rounds or (1 if args.quick else 3)
    executable = nbgrader_executable()
    if executable is None:
        print("grading benchmark skipped: nbgrader is not installed (make nbgrader, or set "
              "MHA_COURSE_NBGRADER)")
        return 0
    version = run([executable, "--version"], cwd=ROOT, env=nbgrader_env(executable)).strip()
    print(f"Grading a class: the course's checker against {version.splitlines()[-1]}")
    print(f"  lessons {' '.join(lessons)}, {n_students} students (right / blank / wrong), "
          f"{rounds} round(s), checker --jobs {' and '.join(map(str, args.jobs))}, "
          f"{os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="mha-course-bench-") as tmp:
        course = Path(tmp) / "course"
        students = build_class(course, lessons, n_students, executable)
        graders = ["nbgrader", *(f"checker --jobs {j}" for j in args.jobs)]
        totals = dict.fromkeys(graders, 0.0)
        points = {}
        for r in range(rounds):
            order = graders[r % len(graders):] + graders[:r % len(graders)]
            line = []
            for who in order:
                seconds, points[who] = (time_nbgrader(course, executable) if who == "nbgrader"
                                        else time_checker(course, int(who.split()[-1])))
                totals[who] += seconds
                line.append(f"{who} {seconds:.1f} s ({seconds / n_students:.1f} s a notebook)")
            print(f"  round {r + 1}: " + ", ".join(line))
        agree = True
        for who in graders[1:]:
            print(f"  points ({who} / nbgrader): " + ", ".join(
                f"{s} {points[who].get(s, 0):g}/{points['nbgrader'].get(s, 0):g}"
                for s in students))
            agree &= all(points[who].get(s) == points["nbgrader"].get(s) for s in students)
        print(f"  the graders {'agree on every student' if agree else 'DISAGREE'}")
    for who in graders[1:]:
        ratio = totals[who] / totals["nbgrader"]
        print(f"  {who} {totals[who]:.1f} s, nbgrader {totals['nbgrader']:.1f} s ({rounds} "
              f"round(s), {n_students} notebooks each): ratio checker / nbgrader = {ratio:.2f} "
              f"(target <= 1.0: {'met' if ratio <= 1.0 else 'NOT met'})")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
