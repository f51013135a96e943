"""Running strict nbval on a notebook in a subprocess, with a backstop for the whole run.

The checker never runs a learner's code in its own process: :func:`run_nbval` starts
``python -m pytest --nbval`` (with the course's plugin, :mod:`mha_course.grading.nbval_plugin`,
which writes one JSON line per cell) in a temporary folder and reads the records back. nbval's
own cell timeout stops a cell that runs too long; when the whole run passes the backstop, the
pytest process and everything below it (the kernel) are killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .notebooks import ExerciseError, clean, notebook_text

#: nbval's timeout for one cell, in seconds (``python -m mha_course check --timeout``).
DEFAULT_TIMEOUT = 30
#: The pytest plugin loaded into the nbval run (``-p``).
PLUGIN = "mha_course.grading.nbval_plugin"


def descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (the pytest run and its kernel)."""
    for each in [pid, *descendants(pid)]:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_nbval(nb, cell_timeout: float, sanitize: Path | None = None, total_timeout=None):
    """Run strict nbval on ``nb`` in a subprocess; return ``(records by cell, hit the backstop)``.

    ``total_timeout`` is the backstop for the whole run (kernel start included); when it is
    reached the pytest process and its kernel are killed. A run in which no cell ran at all
    (the kernel did not start: a port race or a slow start on a loaded machine) is tried once
    more, then reported as an error with nbval's last lines, never as exercises "not checked".
    """
    for _attempt in (1, 2):
        records, backstop, tail = run_nbval_once(nb, cell_timeout, sanitize, total_timeout)
        if records or backstop:
            return records, backstop
    raise ExerciseError("nbval could not run the notebook: " + " / ".join(tail))


def run_nbval_once(nb, cell_timeout, sanitize, total_timeout):
    """One nbval run: ``(records by cell index, hit the backstop, last 5 lines of output)``."""
    if total_timeout is None:
        n_code = sum(c.cell_type == "code" for c in nb.cells)
        total_timeout = 90 + n_code * (cell_timeout + 10)
    with tempfile.TemporaryDirectory(prefix="mha-course-check-") as tmp:
        tmp = Path(tmp)
        nb_path = tmp / "submission.ipynb"
        nb_path.write_text(notebook_text(nb), encoding="utf-8")
        (tmp / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        report = tmp / "report.jsonl"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "FORCE_COLOR")}
        env.update(NO_COLOR="1", PY_COLORS="0", TERM="dumb", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
                   JUPYTER_PLATFORM_DIRS="1")
        # The report path goes on the command line, not into the environment the kernel inherits.
        cmd = [sys.executable, "-m", "pytest", "-p", "nbval.plugin", "-p", PLUGIN,
               "--mha-report", str(report), "--nbval",
               "--nbval-current-env", "-p", "no:cacheprovider", "--color=no", "-q",
               "--nbval-cell-timeout", str(cell_timeout), "-c", str(tmp / "pytest.ini"),
               "--rootdir", str(tmp)]
        if sanitize is not None:
            cmd += ["--nbval-sanitize-with", str(sanitize)]
        cmd.append(str(nb_path))
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        backstop = False
        try:
            output, _ = proc.communicate(timeout=total_timeout)
        except subprocess.TimeoutExpired:
            backstop = True
            kill_tree(proc.pid)
            output, _ = proc.communicate()
        records = {}
        if report.exists():
            for line in report.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                records[record["cell"]] = record
        tail = clean(output.decode("utf-8", "replace")).strip().splitlines()[-5:]
        return records, backstop, tail
