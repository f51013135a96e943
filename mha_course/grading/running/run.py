"""Running strict nbval on a notebook in a subprocess, isolated, with a backstop for the whole run.

The checker never runs a learner's code in its own process: :func:`run_nbval` starts
``python -m pytest --nbval`` (with the course's plugin,
:mod:`mha_course.grading.running.nbval_plugin`)
in a fresh temporary folder (see :mod:`mha_course.grading.running.sandbox`): the package it imports
is a
private copy written from the checker's snapshot, the kernel is started from the checker's
description (in a bubblewrap sandbox where one works), and the per-cell records come back
through a pipe that only the pytest process holds. nbval's own cell timeout stops a cell that
runs too long; when the whole run passes the backstop, everything the run started is stopped
(:func:`stop_run`). Each kernel gets the command's
:class:`~mha_course.grading.running.limits.Limits`
(its own cgroups where they can be made), and after each run the files no run may change are
compared with their snapshots (:class:`~mha_course.grading.running.sandbox.FileGuard`).

Every run in progress is registered, so that :func:`stop_on_signals` can stop them all: on
Ctrl-C (SIGINT) or SIGTERM the command kills every run's processes (pytest, bwrap, the kernel and
whatever it started), removes their temporary folders and cgroups, prints one line and exits
(130 or 143) without waiting for anything else.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..authoring.notebooks import ExerciseError, clean, notebook_text
from .account import RUN_PREFIX, SWEPT, Accounts, Written, kill_user, prepare_run_folder, sweep
from .limits import Enforcement, KernelCgroups, Limits
from .sandbox import FileGuard, Library, RunFolders, TreeWatch, kernel_spec

#: nbval's timeout for one cell, in seconds (``python -m mha_course check --timeout``).
DEFAULT_TIMEOUT = 30
#: The pytest plugin loaded into the nbval run (``-p``).
PLUGIN = "mha_course.grading.running.nbval_plugin"
#: Environment variable marking every process of a run, so that :func:`stop_run` finds those
#: that left the process tree (a daemon started by a learner's code, without a sandbox).
RUN_MARK = "MHA_COURSE_RUN"
#: How each run starts pytest: ``python -m pytest``, without the optional ``rfc3987_syntax``.
#: jsonschema (which nbformat, hence nbval, imports) loads it when installed, for its "iri" format
#: checker, and it compiles 38 grammars as it is imported: 2-4 s of every notebook's run.
#: nbformat validates without format checkers, so no check of a notebook changes.
PYTEST_MAIN = ("import runpy, sys; sys.modules['rfc3987_syntax'] = None; "
               "runpy.run_module('pytest', run_name='__main__', alter_sys=True)")
#: How much of pytest's own output is kept, from its end (for the "could not run" message).
OUTPUT_TAIL = 64 * 1024


@dataclass
class Isolation:
    """What every run of a check needs besides the notebook: taken once, when the check starts.

    ``library`` is the snapshot of the package each run gets a copy of; ``sanitize`` the text
    of nbval's sanitize file (also a snapshot); ``bwrap`` the sandbox (None: unsandboxed);
    ``hidden`` the folders the sandbox hides from the kernel; ``plugins`` more pytest plugins
    for the run (grading mode's :mod:`mha_course.grading.running.grader`); ``limits`` what each
    kernel
    may use and ``enforcement`` how this machine enforces it; ``guard`` the files no run may
    change; ``accounts`` the users kernels run as without the sandbox (as root), and
    ``swept`` the folders searched after each run for what such a kernel wrote; ``tree``
    (kernels running as the checker's user) the folders whose changes are reported.
    """

    library: Library
    sanitize: str | None = None
    bwrap: str | None = None
    hidden: tuple = field(default_factory=tuple)
    plugins: tuple = field(default_factory=tuple)
    limits: Limits = field(default_factory=lambda: Limits(None, None, None))
    enforcement: Enforcement = field(default_factory=Enforcement)
    guard: FileGuard = field(default_factory=FileGuard)
    #: Without the sandbox, as root: the user ids kernels run as (None: the checker's user).
    accounts: Accounts | None = None
    #: Folders besides the world-writable ones where a kernel's leftovers are looked for.
    swept: tuple = field(default_factory=tuple)
    #: Kernels running as the checker's user, unsandboxed: the folders whose changes are
    #: reported after every run (the checkout, the submissions).
    tree: TreeWatch | None = None


class Stopped(Exception):
    """The command is stopping (Ctrl-C or SIGTERM): no new run may start."""


@dataclass
class ActiveRun:
    """A run in progress: what :func:`stop_all` must stop and remove."""

    who: str
    folder: Path
    pid: int | None = None
    mark: str = ""
    cgroups: KernelCgroups | None = None


_LOCK = threading.RLock()  # re-entrant: the signal handler may run while the main thread holds it
_ACTIVE: dict[int, ActiveRun] = {}
#: The submissions whose runs were in progress since the guard last looked (see
#: :func:`runs_since_last_look`).
_SEEN: dict[str, None] = {}
_STOPPING = threading.Event()
#: Every run folder that exists now (see :func:`run_folder`).
_FOLDERS: set[str] = set()


def _register(run: ActiveRun) -> int:
    with _LOCK:
        if _STOPPING.is_set():
            raise Stopped
        key = id(run)
        _ACTIVE[key] = run
        if run.who:
            _SEEN[run.who] = None
        return key


def _unregister(key: int) -> None:
    with _LOCK:
        _ACTIVE.pop(key, None)


def runs_since_last_look() -> tuple:
    """The submissions checked since the last call (finished or still running), in order."""
    with _LOCK:
        seen = tuple(_SEEN)
        _SEEN.clear()
        for run in _ACTIVE.values():
            if run.who:
                _SEEN[run.who] = None
        return seen


def stop_all() -> int:
    """Stop every run in progress, remove its folders and cgroups; return how many there were.

    No run starts after this (a run starts its pytest under the same lock and checks first).
    """
    with _LOCK:
        _STOPPING.set()
        runs = list(_ACTIVE.values())
        folders = {*_FOLDERS, *(str(run.folder) for run in runs)}
    for run in runs:
        if run.pid is not None:
            kill_tree(run.pid)
        if run.cgroups is not None:
            run.cgroups.kill()
    kill_marked({run.mark for run in runs if run.mark})
    for run in runs:
        if run.cgroups is not None:
            run.cgroups.remove()
    for folder in folders:  # every run's folder, registered or still being set up
        remove_folder(folder)
    return len(runs)


@contextlib.contextmanager
def run_folder():
    """A run's temporary folder, made only while no stop is under way and known to
    :func:`stop_all` from the moment it exists, so a stop removes it even when the run's own
    thread never gets to (the signal handler leaves with ``os._exit``)."""
    with _LOCK:
        if _STOPPING.is_set():
            raise Stopped
        folder = tempfile.mkdtemp(prefix=RUN_PREFIX)
        _FOLDERS.add(folder)
    try:
        yield folder
    finally:
        remove_folder(folder)
        with _LOCK:
            _FOLDERS.discard(folder)


def remove_folder(folder) -> None:
    """Remove ``folder`` and everything in it, trying again for up to a second while a process
    just killed may still be writing into it (SIGKILL is not instant) or a folder inside was
    made read-only."""
    for _ in range(20):
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.lexists(folder):
            return
        for root, dirs, _files in os.walk(folder):
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(root, name), 0o700)
        time.sleep(0.05)


@contextlib.contextmanager
def stop_on_signals():
    """While inside: Ctrl-C (SIGINT) and SIGTERM stop every run, print one line and exit.

    The handler runs in the main thread: it kills every run's processes, removes their
    temporary folders and cgroups, writes one line to stderr and leaves with ``os._exit`` (130
    or 143), so no worker thread is waited for. Outside the main thread it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        n = stop_all()
        sys.stderr.write(f"stopped by {name}: {n} run{'s' if n != 1 else ''} in progress "
                         "stopped, their processes killed and temporary folders removed\n")
        sys.stderr.flush()
        os._exit(128 + signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def descendants(pid: int) -> list[int]:
    """Process ids below ``pid``, children first (psutil: Linux, macOS and Windows)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, every process below it and their process groups."""
    pids = [pid, *descendants(pid)]
    own = os.getpgid(0) if hasattr(os, "getpgid") else None
    groups = set()
    for each in pids:
        try:
            groups.add(os.getpgid(each))
        except (OSError, AttributeError):
            pass
    for group in groups - {own}:
        try:
            os.killpg(group, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    for each in pids:
        try:
            psutil.Process(each).kill()
        except psutil.Error:
            pass


def stop_run(pid: int, mark: str) -> None:
    """Stop everything a run started: pytest (``pid``), its tree, and processes carrying ``mark``.

    pytest starts in a session of its own and the kernel in another (jupyter_client does so);
    :func:`kill_tree` kills both process groups. A process of the run that left the tree (a
    daemon started by learner code outside the sandbox) still carries the run's mark in its
    environment, unless it cleared it; in the sandbox nothing survives the sandbox's end.
    """
    kill_tree(pid)
    kill_marked({mark})


def kill_marked(marks) -> None:
    """Kill the tree of every process whose environment carries one of the run ``marks``."""
    if not marks:
        return
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_MARK) in marks:
                kill_tree(proc.pid)
        except (psutil.Error, OSError):
            continue


def run_nbval(nb, cell_timeout: float, isolation: Isolation, total_timeout=None, who: str = ""):
    """Run strict nbval on ``nb`` in a subprocess; return ``(records by cell, hit the backstop)``.

    ``total_timeout`` is the backstop for the whole run (kernel start included); when it is
    reached everything the run started is stopped. A run in which no cell ran at all (the
    kernel did not start: a port race or a slow start on a loaded machine) is tried once more,
    then reported as an error with nbval's last lines, never as exercises "not checked".
    ``who`` names the submission in the report when a watched file changed during its run.
    """
    try:
        for _attempt in (1, 2):
            records, backstop, tail = run_nbval_once(nb, cell_timeout, isolation, total_timeout,
                                                     who)
            if records or backstop:
                return records, backstop
        raise ExerciseError("nbval could not run the notebook: " + " / ".join(tail))
    finally:
        during = runs_since_last_look()
        if len(isolation.guard):
            isolation.guard.verify(during)
        if isolation.tree is not None:
            isolation.guard.report(isolation.tree.look(during, isolation.guard.paths()))


def _drain(stream, sink: bytearray, limit: int | None) -> None:
    """Read the binary ``stream`` to its end into ``sink`` (keeping the last ``limit`` bytes)."""
    with stream:
        while chunk := stream.read1(65536):
            sink += chunk
            if limit is not None and len(sink) > limit:
                del sink[: len(sink) - limit]


def run_nbval_once(nb, cell_timeout, isolation: Isolation, total_timeout=None, who: str = ""):
    """One nbval run: ``(records by cell index, hit the backstop, last 5 lines of output)``."""
    if total_timeout is None:
        n_code = sum(c.cell_type == "code" for c in nb.cells)
        total_timeout = 90 + n_code * (cell_timeout + 10)
    uid = isolation.accounts.lease() if isolation.accounts is not None and not isolation.bwrap \
        else None
    try:
        with run_folder() as tmp:
            active = ActiveRun(who, Path(tmp))
            key = _register(active)
            try:
                return _run_in(Path(tmp), nb, cell_timeout, isolation, total_timeout, active,
                               uid)
            finally:
                if active.cgroups is not None:
                    active.cgroups.remove()
                _unregister(key)
    finally:
        if uid is not None:
            kill_user(uid)
            written = sweep(uid, (*SWEPT, *isolation.swept))
            isolation.guard.report(Written(p, who) for p in written)
            isolation.accounts.release(uid)


def _run_in(tmp: Path, nb, cell_timeout, isolation: Isolation, total_timeout, active: ActiveRun,
            uid: int | None = None):
    """The body of :func:`run_nbval_once`, in the run's registered folder ``tmp``; the kernel
    runs as ``uid`` (None: as the checker)."""
    folders = RunFolders(tmp).make()
    if uid is not None:
        prepare_run_folder(folders.root, folders.run, folders.work, uid)
        os.chmod(folders.kernel, 0o711)  # the grader's socket in it: reachable, not listed
    isolation.library.write(folders.lib)
    nb_path = folders.run / "submission.ipynb"
    nb_path.write_text(notebook_text(nb), encoding="utf-8")
    (folders.run / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    active.cgroups = KernelCgroups(isolation.limits, isolation.enforcement)
    spec = folders.run / "kernel.json"
    spec.write_text(json.dumps(kernel_spec(folders, isolation.bwrap, isolation.hidden,
                                           isolation.limits, isolation.enforcement,
                                           active.cgroups, uid)), encoding="utf-8")
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "FORCE_COLOR", "PYTHONSTARTUP")}
    env.update(NO_COLOR="1", PY_COLORS="0", TERM="dumb", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               JUPYTER_PLATFORM_DIRS="1", JUPYTER_RUNTIME_DIR=str(folders.kernel),
               PYTHONPATH=os.pathsep.join([str(folders.lib), env.get("PYTHONPATH", "")]),
               **{RUN_MARK: mark})
    read_end, write_end = os.pipe()
    cmd = [sys.executable, "-c", PYTEST_MAIN, "-p", "nbval.plugin", "-p", PLUGIN,
           *(arg for plugin in isolation.plugins for arg in ("-p", plugin)),
           "--mha-report-fd", str(write_end), "--mha-kernel", str(spec), "--nbval",
           "-p", "no:cacheprovider", "--color=no", "-q",
           "--nbval-cell-timeout", str(cell_timeout), "-c", str(folders.run / "pytest.ini"),
           "--rootdir", str(folders.run)]
    if isolation.sanitize is not None:
        sanitize = folders.run / "sanitize.cfg"
        sanitize.write_text(isolation.sanitize, encoding="utf-8")
        cmd += ["--nbval-sanitize-with", str(sanitize)]
    cmd.append(str(nb_path))
    try:
        with _LOCK:  # so that stop_all() either sees this run's pytest or stops it starting
            if _STOPPING.is_set():
                raise Stopped
            proc = subprocess.Popen(cmd, cwd=folders.run, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    pass_fds=(write_end,), start_new_session=True)
            active.pid, active.mark = proc.pid, mark
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)  # pytest holds the only write end now
    report, output = bytearray(), bytearray()
    streams = [(os.fdopen(read_end, "rb"), report, None), (proc.stdout, output, OUTPUT_TAIL)]
    readers = [threading.Thread(target=_drain, args=a, daemon=True) for a in streams]
    for reader in readers:
        reader.start()
    backstop = False
    try:
        proc.wait(timeout=total_timeout)
    except subprocess.TimeoutExpired:
        backstop = True
    finally:
        stop_run(proc.pid, mark)
        active.cgroups.kill()
        proc.wait()
    for reader in readers:
        reader.join(timeout=30)
    records = {}
    for line in report.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the backstop
        records[record["cell"]] = record
    tail = clean(output.decode("utf-8", "replace")).strip().splitlines()[-5:]
    return records, backstop, tail
