"""The pytest plugin of the checker's nbval run (``-p mha_course.grading.nbval_plugin``).

Loaded by :func:`mha_course.grading.run.run_nbval_once` next to ``-p nbval.plugin``. With
``--mha-report PATH`` it

- records, for every notebook cell nbval runs, whether it passed, nbval's message, the error the
  kernel reported and the text the cell printed against the text it should have printed, as
  one JSON line per cell appended to PATH;
- makes nbval notice a dead kernel within a second, instead of waiting for the cell timeout:
  the cell then fails with a message containing ``MHA_COURSE_KERNEL_DIED``.

The path is a command-line option, not an environment variable, so the kernel (which inherits
the environment of the pytest process) is not told where the report is. Without the option
the plugin does nothing.
"""

from __future__ import annotations

import json
import time
from queue import Empty

import pytest

from .verdicts import KERNEL_DIED

try:
    from nbval.kernel import RunningKernel
except ImportError:  # another nbval: it keeps its own behaviour (the cell timeout)
    RunningKernel = None


def pytest_addoption(parser) -> None:
    parser.addoption("--mha-report", metavar="PATH", default=None,
                     help="mha-course checker: append one JSON line per notebook cell to PATH")


def pytest_configure(config) -> None:
    if config.getoption("mha_report"):
        watch_for_a_dead_kernel()


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
        record["message"] = str(call.excinfo.value)
    outputs = getattr(item, "test_outputs", None) or []
    for out in outputs:
        if out.get("output_type") == "error":
            record["error"] = {
                "ename": out.get("ename", ""),
                "evalue": out.get("evalue", ""),
                "traceback": list(out.get("traceback", [])),
            }
    record["got"] = output_text(outputs)
    record["expected"] = output_text(item.cell.get("outputs"))
    return record


def pytest_runtest_makereport(item, call):  # returns None: pytest still makes its own report
    path = item.config.getoption("mha_report")
    if not path or call.when != "call" or not hasattr(item, "cell_num"):
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(cell_record(item, call)) + "\n")
