"""Reports: one notebook's verdicts as text, and the instructor's table (printed and CSV).

Pure functions of :class:`~mha_course.grading.verdicts.NotebookResult` and of status rows
``{submission: {exercise: status}}``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .verdicts import STATUS_SHORT, NotebookResult


def format_result(result: NotebookResult, timeout: float) -> str:
    """The plain-text report for one notebook."""
    head = f"{result.path}"
    if result.error:
        return f"{head}: ERROR: {result.error}"
    lines = [f"{head} (checked against {result.reference}; cell timeout {timeout:g} s)"]
    for v in result.verdicts:
        text = {
            "passed": "passed",
            "not attempted": "not attempted",
            "failed": f"FAILED: {v.message}",
            "timed out": v.message,
            "crashed": f"CRASHED: {v.message}",
        }.get(v.status, f"{v.status}: {v.message}")
        body = text.split("\n")
        lines.append(f"  Exercise {v.exercise}  {body[0]}")
        lines += [" " * (len(v.exercise) + 13) + ln for ln in body[1:]]
    counts = {}
    for v in result.verdicts:
        counts[v.status] = counts.get(v.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if s != "passed")
    lines.append(f"  {counts.get('passed', 0)} of {len(result.verdicts)} passed"
                 + (f"; {summary}" if summary else "") + ".")
    return "\n".join(lines)


def collect_submissions(paths) -> list[tuple[str, list[Path]]]:
    """``[(submission name, notebooks)]``: each file, or each entry of a folder, is one."""
    subs = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for entry in sorted(path.iterdir()):
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():
                    subs.append((entry.name, sorted(entry.rglob("*.ipynb"))))
                elif entry.suffix == ".ipynb":
                    subs.append((entry.stem, [entry]))
        else:
            subs.append((path.stem, [path]))
    return subs


def summary_table(rows: dict[str, dict[str, str]], exercises: list[str]) -> str:
    """Plain-text table: one row per submission, one column per exercise."""
    name_w = max([len("submission")] + [len(n) for n in rows])
    col_w = max([7] + [len(x) for x in exercises])
    columns = "  ".join(x.ljust(col_w) for x in exercises)
    head = "submission".ljust(name_w) + "  " + columns + "  passed"
    lines = [head, "-" * len(head)]
    for name, statuses in rows.items():
        cells = [STATUS_SHORT[statuses.get(x, "missing")].ljust(col_w) for x in exercises]
        passed = sum(s == "passed" for s in statuses.values())
        lines.append(name.ljust(name_w) + "  " + "  ".join(cells) + f"  {passed}/{len(exercises)}")
    lines.append("pass = passed, FAIL = failed, — = not attempted, TIMEOUT = timed out, "
                 "CRASH = kernel died, · = no such exercise in the submission, ERROR = unreadable")
    return "\n".join(lines)


def csv_text(rows: dict[str, dict[str, str]], exercises: list[str]) -> str:
    """CSV: ``submission, <one column per exercise>, passed``; cells hold the status words."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["submission", *exercises, "passed"])
    for name, statuses in rows.items():
        writer.writerow([name, *(statuses.get(x, "missing") for x in exercises),
                         sum(s == "passed" for s in statuses.values())])
    return buf.getvalue()

