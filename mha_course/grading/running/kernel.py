"""The kernel a learner's notebook runs in: the course's checks loaded first, then ipykernel.

Not taught in a lesson: the checker starts ``python -m mha_course.grading.running.kernel -f FILE``
(see
:func:`mha_course.grading.running.sandbox.kernel_spec`) with ``PYTHONPATH`` pointing at the run's
private copy of the package. Importing :mod:`mha_course.checks` here, before the kernel executes
any cell, means that a learner's file named ``mha_course/...`` or ``numpy.py`` in the working
folder cannot replace the checks: the modules are already loaded. Nothing is added to the
notebook's namespace.

Before that, without a sandbox and as root, the kernel becomes the unprivileged user the checker
chose for it (:func:`mha_course.grading.running.account.drop_privileges`); then it sets on itself
the
rlimits the checker asks for in ``MHA_COURSE_LIMITS`` (memory, file size and, inside the
sandbox's user namespace or as its own user, processes: see
:mod:`mha_course.grading.running.limits`);
no learner code has run yet, and without privileges (which the sandbox drops) a limit cannot be
raised again.

Output belongs to the cell that printed it, or to nobody (:func:`own_output`). ipykernel sends
whatever reaches ``sys.stdout``/``sys.stderr`` (or a display) with the parent header of the cell
running *now*, whoever wrote it: a thread the learner left running, a subprocess writing to the
kernel's file descriptors (ipykernel's pipe watcher, a thread of its own), an asyncio callback of
an earlier cell. That text then lands in whichever cell happened to be running, by timing. Here
such output is sent with the parent header :data:`BACKGROUND` instead, which no cell has: nbval
and the grader (:meth:`mha_course.grading.running.session.Session.finish`) never compare it with
anything, so the same notebook gets the same verdicts on every run.
"""

from __future__ import annotations

import os
import sys
import threading

from mha_course.grading.running.account import DROP_ENV, drop_privileges
from mha_course.grading.running.limits import ENV, apply_rlimits

drop_privileges(os.environ.pop(DROP_ENV, None), sys.argv)
apply_rlimits(os.environ.pop(ENV, None))

import mha_course.checks  # noqa: E402, F401  (loaded before any learner code runs)

#: The parent header of output no cell can own: a thread's, a subprocess's, a late callback's.
#: No execute request has this id, so nbval and the grader skip it like another cell's output.
BACKGROUND = {"msg_id": "mha-course-background", "msg_type": "background",
              "session": "mha-course-background", "username": "", "version": "5.3"}

#: The cell running now: (process id, thread id, the execute request's msg_id), or None.
_cell: tuple | None = None


def own_output(header: dict, cell: tuple | None, pid: int, thread: int) -> bool:
    """Whether output written now belongs to the cell running now.

    ``header`` is the parent header ipykernel would send the output with, ``cell`` the running
    cell as ``(pid, thread, msg_id)`` (None between cells), ``pid`` and ``thread`` who writes.
    Only the cell's own code, running synchronously in the thread and the process that execute
    it, owns output: not another thread, not a forked child, not a callback that carries an
    earlier cell's header, and nothing between cells.

    >>> cell = (10, 1, "a")
    >>> own_output({"msg_id": "a"}, cell, 10, 1)
    True
    >>> [own_output({"msg_id": "a"}, cell, 10, 2), own_output({"msg_id": "a"}, cell, 11, 1),
    ...  own_output({"msg_id": "b"}, cell, 10, 1), own_output({"msg_id": "a"}, None, 10, 1)]
    [False, False, False, False]
    """
    return (cell is not None and bool(header) and header.get("msg_id") is not None
            and (pid, thread, header.get("msg_id")) == cell)


def _owned(prop: property) -> property:
    """``prop`` (a ``parent_header`` property) giving :data:`BACKGROUND` for output no cell
    owns; setting it is unchanged."""

    def get(self):
        header = prop.fget(self)
        if own_output(header, _cell, os.getpid(), threading.get_ident()):
            return header
        return BACKGROUND

    return property(get, prop.fset, prop.fdel, prop.__doc__)


def attribute_output(shell) -> bool:
    """Make ``shell``'s kernel send only the running cell's own output with its header.

    Patches ``parent_header`` of ipykernel's ``OutStream`` (print, sys.stderr, the pipe watcher
    that carries subprocesses' and C code's writes) and ``ZMQDisplayPublisher`` (display()),
    and follows the running cell with IPython's ``pre_run_cell``/``post_run_cell`` events.
    Returns False (and changes nothing) for an ipykernel without these properties.
    """
    from ipykernel.iostream import OutStream
    from ipykernel.zmqshell import ZMQDisplayPublisher
    from jupyter_client.session import extract_header

    classes = [c for c in (OutStream, ZMQDisplayPublisher)
               if isinstance(c.__dict__.get("parent_header"), property)]
    if len(classes) < 2 or shell is None:
        return False

    def started(*_args) -> None:
        global _cell
        try:
            msg_id = extract_header(shell.parent_header).get("msg_id")
        except Exception:
            msg_id = None
        _cell = (os.getpid(), threading.get_ident(), msg_id)

    def finished(*_args) -> None:
        global _cell
        _cell = None

    for cls in classes:
        cls.parent_header = _owned(cls.__dict__["parent_header"])
    shell.events.register("pre_run_cell", started)
    shell.events.register("post_run_cell", finished)
    return True


def main() -> None:
    """Start ipykernel as ``python -m ipykernel_launcher`` would, output attributed to cells."""
    if sys.path and sys.path[0] in ("", ".", os.getcwd()):
        del sys.path[0]  # the working folder holds only what the learner's code writes
    from ipykernel import kernelapp  # ipykernel is a dependency of the checker, not the course

    app = kernelapp.IPKernelApp.instance()
    app.initialize()
    attribute_output(app.shell)
    app.start()


if __name__ == "__main__":
    main()
