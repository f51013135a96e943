"""The pytest plugin of the checker's nbval run (``-p mha_course.grading.running.nbval_plugin``).

Loaded by :func:`mha_course.grading.running.run.run_nbval_once` next to ``-p nbval.plugin``. It

- with ``--mha-report-fd N`` (a pipe the checker opened) or ``--mha-report PATH``, records for
  every notebook cell nbval runs whether it passed, nbval's message, the error the kernel
  reported and the text the cell printed against the text it should have printed, as one JSON
  line per cell (every text capped at :data:`TEXT_CAP` characters, so a 5 MB print stays
  small);
- with ``--mha-kernel SPEC.json``, starts the kernel the checker describes there (its command,
  which may be a bubblewrap sandbox, its working folder, its transport) instead of nbval's;
- makes nbval notice a dead kernel within a second, instead of waiting for the cell timeout:
  the cell then fails with a message containing ``MHA_COURSE_KERNEL_DIED``;
- adds ``"limit"`` to the record of a cell during which the kernel reached one of its limits
  (memory, processes, disk: :mod:`mha_course.grading.running.limits`), in the report's words: from
  the
  kernel's cgroups' event counters where it has cgroups, else from the error the cell raised
  (``MemoryError``, ``[Errno 11]`` from a fork, ``[Errno 28]`` from a write).

The report goes to a pipe that only the pytest process holds: jupyter_client starts the kernel
with every other file descriptor closed, the environment names nothing, and in the sandbox the
kernel cannot see this process at all. Without these options the plugin does nothing.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from queue import Empty

import pytest

from ..reporting.verdicts import KERNEL_DIED, cap_line
from .limits import Limits, cgroup_events, limit_message, memory_words, process_words
from .session import BACKGROUND_ID

try:
    import nbval.kernel as nbval_kernel
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbval.kernel import RunningKernel
except ImportError:  # another nbval: it keeps its own behaviour (the cell timeout)
    nbval_kernel = RunningKernel = None

#: At most this many characters of any text in a record (the rest is replaced by a count).
TEXT_CAP = 20_000


class LimitWatch:
    """The kernel's limits and cgroups (from the checker's kernel spec): which limit fired."""

    def __init__(self, limits: Limits | None = None, cgroups=()):
        self.limits = limits or Limits(None, None, None)
        self.cgroups = [str(c) for c in cgroups]
        self.seen = cgroup_events(self.cgroups)

    def fired(self, error: dict | None) -> str | None:
        """The limit reached since the last cell, in words (None: none)."""
        now = cgroup_events(self.cgroups)
        new = {k for k, v in now.items() if v > self.seen.get(k, 0)}
        self.seen = now
        if "memory" in new and self.limits.memory:
            return memory_words(self.limits)
        if "processes" in new and self.limits.processes:
            return process_words(self.limits)
        if error:
            return limit_message(self.limits, error.get("ename", ""), error.get("evalue", ""))
        return None


WATCH = LimitWatch()


def pytest_addoption(parser) -> None:
    parser.addoption("--mha-report", metavar="PATH", default=None,
                     help="mha-course checker: append one JSON line per notebook cell to PATH")
    parser.addoption("--mha-report-fd", metavar="FD", type=int, default=None,
                     help="mha-course checker: write one JSON line per notebook cell to FD")
    parser.addoption("--mha-kernel", metavar="SPEC", default=None,
                     help="mha-course checker: start the kernel described in this JSON file")


def pytest_configure(config) -> None:
    fd, path = config.getoption("mha_report_fd"), config.getoption("mha_report")
    if fd is not None:
        config.mha_report = os.fdopen(fd, "w", encoding="utf-8")
        keep_out_of_proc()
    elif path:
        config.mha_report = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed at exit)
    else:
        return
    watch_for_a_dead_kernel()
    watch_for_background_output()
    spec = config.getoption("mha_kernel")
    if spec:
        with open(spec, encoding="utf-8") as f:
            start_kernels_from(json.load(f))


def keep_out_of_proc() -> None:
    """Linux: make this process non-dumpable, so that a kernel running as the same (non-root)
    user cannot open the report pipe through ``/proc/<pid>/fd``. The sandbox does more: the
    kernel cannot see this process at all."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
        except (OSError, AttributeError):
            pass


def pytest_unconfigure(config) -> None:
    report = getattr(config, "mha_report", None)
    if report is not None:
        report.close()


def start_kernels_from(spec: dict) -> None:
    """Make nbval start every kernel from ``spec`` (see ``sandbox.kernel_spec``)."""
    global WATCH
    WATCH = LimitWatch(Limits(**spec.get("limits", {})) if spec.get("limits") else None,
                       spec.get("cgroups", ()))
    if nbval_kernel is None:
        return
    kernel_spec = KernelSpec(argv=spec["argv"], env=spec.get("env", {}), language="python",
                             display_name="mha-course checker",
                             interrupt_mode=spec.get("interrupt_mode", "signal"))

    class Specs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return kernel_spec

    def start_new_kernel(startup_timeout=60, kernel_name="python", **kwargs):
        kwargs.update(cwd=spec["cwd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        km = KernelManager(kernel_name="mha-course", kernel_spec_manager=Specs(),
                           transport=spec.get("transport", "tcp"), ip=spec["ip"],
                           connection_file=spec["connection_file"])
        km.start_kernel(**kwargs)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=startup_timeout)
        except RuntimeError:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        return km, kc

    nbval_kernel.start_new_kernel = start_new_kernel


def watch_for_a_dead_kernel() -> None:
    """Patch nbval's ``RunningKernel.await_reply`` to wait in 1 s steps and check the kernel.

    Another nbval, without that method, keeps its own behaviour (the cell timeout).
    """
    original = getattr(RunningKernel, "await_reply", None)
    if original is None or getattr(original, "mha_course_patched", False):
        return

    def await_reply(self, msg_id, timeout=None):
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            step = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if step <= 0:
                raise Empty
            try:
                return original(self, msg_id, timeout=step)
            except Empty:
                if not self.is_alive():
                    raise RuntimeError(KERNEL_DIED) from None

    await_reply.mha_course_patched = True
    RunningKernel.await_reply = await_reply


#: Whether output sent under :data:`~mha_course.grading.running.session.BACKGROUND_ID` (a thread's,
#: a
#: subprocess's: see ``kernel.py``) arrived since the last cell's record was written.
BACKGROUND_SEEN = False


def watch_for_background_output() -> None:
    """Patch nbval's ``RunningKernel.get_message`` to note background output as it passes.

    nbval skips a message whose parent is not the running cell, so background output is never
    compared; this only remembers that some arrived, for the learner's report.
    """
    original = getattr(RunningKernel, "get_message", None)
    if original is None or getattr(original, "mha_course_patched", False):
        return

    def get_message(self, *args, **kwargs):
        global BACKGROUND_SEEN
        msg = original(self, *args, **kwargs)
        if isinstance(msg, dict) and \
                msg.get("parent_header", {}).get("msg_id") == BACKGROUND_ID:
            BACKGROUND_SEEN = True
        return msg

    get_message.mha_course_patched = True
    RunningKernel.get_message = get_message


def cap(text, limit: int = TEXT_CAP) -> str:
    """``text`` (made a string) cut to ``limit`` characters, saying how many more there were."""
    return cap_line(text if isinstance(text, str) else str(text), limit)


def cap_output(text: str, line_limit: int = 2_000, lines: int = 100) -> str:
    """Printed ``text`` with each line cut to ``line_limit`` characters and at most ``lines``
    lines (the first and the last halves): a check's own line after a 5 MB print survives.

    >>> cap_output("a" * 10 + "\\nok\\n", line_limit=4)
    'aaaa... (6 more characters)\\nok\\n'
    """
    parts = [cap_line(line, line_limit) for line in text.split("\n")]
    if len(parts) > lines:
        half = lines // 2
        parts = parts[:half] + [f"... ({len(parts) - 2 * half} more lines)"] + parts[-half:]
    return "\n".join(parts)


def output_text(outputs) -> str:
    """What a list of notebook outputs shows as text: streams and ``text/plain`` results."""
    parts = []
    for out in outputs or []:
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "text/plain" in data:
                text = data["text/plain"]
                parts.append(text if isinstance(text, str) else "".join(text))
                parts.append("\n")
    return "".join(parts)


def cell_record(item, call) -> dict:
    """The JSON record of one notebook cell that nbval ran (see the module docstring)."""
    record = {"cell": item.cell_num, "ok": True, "message": "", "error": None}
    if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        record["ok"] = False
        record["message"] = cap(str(call.excinfo.value))
    outputs = getattr(item, "test_outputs", None) or []
    for out in outputs:
        if out.get("output_type") == "error":
            record["error"] = {
                "ename": cap(out.get("ename", ""), 200),
                "evalue": cap(out.get("evalue", "")),
                "traceback": [cap(t, 2_000) for t in list(out.get("traceback", []))[:40]],
            }
    record["got"] = cap_output(output_text(outputs))
    record["expected"] = cap_output(output_text(item.cell.get("outputs")))
    limit = WATCH.fired(record["error"])
    if limit:
        record["limit"] = limit
    global BACKGROUND_SEEN
    if BACKGROUND_SEEN or getattr(item, "mha_background", False):
        record["background"] = True
    BACKGROUND_SEEN = False
    return record


def pytest_runtest_makereport(item, call):  # returns None: pytest still makes its own report
    report = getattr(item.config, "mha_report", None)
    if report is None or call.when != "call" or not hasattr(item, "cell_num"):
        return
    report.write(json.dumps(cell_record(item, call)) + "\n")
    report.flush()
