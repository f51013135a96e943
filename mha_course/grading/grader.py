"""The grader's side of grading mode: checks run where the learner's code never ran.

Not taught in a lesson: a pytest plugin of the checker's nbval run (``-p
mha_course.grading.grader``, added by :mod:`mha_course.grading.check` in grading mode, that is
``check --assignment``). The checker marks the reference's check cells of the notebook it runs
(cell metadata ``mha_course.grader``); this plugin runs those cells here, in the pytest process,
instead of sending them to the learner's kernel:

- the names the check cell uses come from the reference's setup cells, executed here
  (``checks``, ``np``, ...), except the names the exercises' solution cells define, which
  always come from the kernel: :class:`Session` asks :func:`mha_course.grading.remote.serve`
  (running in the kernel for the cell) for them, and gets values (numbers, arrays, tuples, ...)
  or references it calls through :class:`Proxy`;
- the check itself, its reference results, its comparisons and its printed line all happen
  here, in code the learner's cells never touched, so a check replaced or wrapped in the
  kernel, a patched NumPy or harness, an import hook or a decorator change nothing;
- the cell passes when the check raised nothing and printed what the solution's check printed;
  then, if the assignment asks for it, the check runs again on other random inputs (the probe
  seed) and the instructor's own probes run (a ``probe_03_1(attention_scores)`` function of
  the assignment's probes file), which the learners' local checks never saw;
- a cell that runs longer than nbval's cell timeout is interrupted and reported as nbval
  reports it, naming the learner's function that was running; a kernel that dies is reported
  as the nbval plugin reports it (``KERNEL_DIED``).

What the plugin records for the cell (``test_outputs``, the exception) is what nbval would
record, so :mod:`mha_course.grading.verdicts` decides as for any other cell.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import functools
import inspect
import io
import json
import pickle
import time
import types

import numpy as np
import pytest
import zmq

from ..checks import harness
from .notebooks import info
from .remote import BUILTIN_ERRORS, TEXT_LIMIT, from_npy, generators
from .verdicts import KERNEL_DIED

try:
    from nbval.plugin import IPyNbCell, NbCellError
except ImportError:  # the plugin is only loaded into nbval runs
    IPyNbCell = NbCellError = None

#: The module name the checker passes to pytest with ``-p``.
PLUGIN = "mha_course.grading.grader"
#: How long an interrupted cell may take to answer before its kernel is stopped (nbval's).
INTERRUPT_GRACE = 5.0
SERVE = "import mha_course.grading.remote as _mha_course_remote\n_mha_course_remote.serve()"
_NUMPY_ERRORS = {"LinAlgError": np.linalg.LinAlgError,
                 "AxisError": getattr(getattr(np, "exceptions", np), "AxisError", ValueError)}


class RemoteTimeout(BaseException):  # noqa: N818 (not an Exception: checks must not catch it)
    """The learner's function ran past the cell's time limit."""

    def __init__(self, function: str, interrupted: bool):
        super().__init__(function)
        self.function, self.interrupted = function, interrupted


class KernelLost(BaseException):  # noqa: N818
    """The learner's kernel died while the grader waited for it."""


class RemoteBroken(Exception):
    """The kernel stopped answering the grader (its side of the conversation is gone)."""


@functools.lru_cache(maxsize=256)
def _error_class(name: str, module: str, base: type) -> type:
    return type(name, (base,), {"__module__": module})


def remote_error(data) -> Exception:
    """The exception the learner's code raised, rebuilt here from its name, bases and message.

    >>> e = remote_error({"type": "ValueError", "module": "builtins", "bases": ["ValueError"],
    ...                   "message": "bad shape"})
    >>> type(e) is ValueError, str(e)
    (True, 'bad shape')
    >>> e = remote_error({"type": "MyError", "module": "__main__", "bases": ["KeyError"],
    ...                   "message": "x"})
    >>> isinstance(e, KeyError), type(e).__name__
    (True, 'MyError')
    """
    data = data if isinstance(data, dict) else {}
    name = str(data.get("type", "Exception"))[:100] or "Exception"
    module = str(data.get("module", ""))[:100]
    message = str(data.get("message", ""))[:TEXT_LIMIT]
    if module == "builtins" and name in BUILTIN_ERRORS:
        return getattr(builtins, name)(message)
    if name in _NUMPY_ERRORS and module.startswith("numpy"):
        return _NUMPY_ERRORS[name](message)
    found = data.get("bases") if isinstance(data.get("bases"), list) else []
    bases = [b for b in found if b in BUILTIN_ERRORS]
    base = getattr(builtins, bases[0]) if bases else Exception
    return _error_class(name, module or "learner", base)(message)


class Proxy:
    """An object that lives in the learner's kernel: attributes and calls go there."""

    def __init__(self, session, ref: int, name: str):
        self._mha_session, self._mha_ref, self._mha_name = session, ref, name

    def __getattr__(self, attr: str):
        if attr.startswith("__") or attr.startswith("_mha_"):
            raise AttributeError(attr)
        return self._mha_session.getattr(self, attr)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} in the learner's kernel>"


class CallableProxy(Proxy):
    """A function (or callable object) of the learner's kernel."""

    def __call__(self, *args, **kwargs):
        outcome = self._mha_session.call(self, args, kwargs)
        if "error" in outcome:
            raise remote_error(outcome["error"])
        return outcome["value"]

    def mha_course_remote_call(self, args, kwargs, forbid=(), inplace=True) -> dict:
        """The call as :func:`mha_course.checks.harness.call` needs it: ``{"value" or "error",
        "found": [rule, written, canonical, helper] or None, "changed": [argument indices]}``,
        the error rebuilt (see :func:`remote_error`)."""
        outcome = self._mha_session.call(self, args, kwargs, forbid=list(forbid),
                                         inplace=inplace)
        if "error" in outcome:
            outcome["error"] = remote_error(outcome["error"])
        return outcome


@functools.lru_cache(maxsize=256)
def _proxy_class(name: str, is_callable: bool) -> type:
    """A proxy class named like the learner's type, so messages read "got Attention"."""
    base = CallableProxy if is_callable else Proxy
    safe = "".join(c for c in name if c.isalnum() or c == "_")[:60] or base.__name__
    return type(safe, (base,), {})


class _Pickler(pickle.Pickler):
    """The grader's arguments for the kernel: proxies and the learner's own objects by reference,
    the grader's functions (a check's ``f(x)``) as callbacks, the rest by value."""

    def __init__(self, file, session):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.session = session

    def persistent_id(self, obj):
        if isinstance(obj, Proxy):
            return ("ref", obj._mha_ref)
        origin = self.session.origins.get(id(obj))
        if origin is not None and origin[0] is obj:
            return ("ref", origin[1])
        if isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)):
            self.session.callbacks.append(obj)
            return ("cb", len(self.session.callbacks) - 1)
        return None


class Session:
    """One check cell's conversation with :func:`~mha_course.grading.remote.serve` in the kernel.

    ``kernel`` is nbval's ``RunningKernel``; every wait ends at ``deadline`` (then the kernel
    is interrupted, see :class:`RemoteTimeout`) or when the kernel dies (:class:`KernelLost`).
    """

    def __init__(self, kernel, deadline: float):
        self.kernel, self.deadline = kernel, deadline
        self.kc = kernel.kc
        self.msg_id = None
        #: ``{id(object): (object, kernel reference)}`` of values that came from the kernel.
        self.origins: dict = {}
        self.callbacks: list = []
        self.current = ""  # the learner's function running now, for the timeout's message
        self.open = False

    # ---------------------------------------------------------------- values from the kernel

    def decode(self, data, depth: int = 0):
        """The kernel's JSON value as Python objects (no pickle; arrays with allow_pickle=False)."""
        if data is None or isinstance(data, (bool, int, float, str)):
            return data
        if not isinstance(data, dict) or depth > 60:
            raise RemoteBroken("the kernel sent a value the grader cannot read")
        if "nd" in data:
            return self._remember(from_npy(data["nd"]), data.get("id"))
        if "np" in data:
            return from_npy(data["np"])[()]
        if "complex" in data:
            real, imag = data["complex"]
            return complex(float(real), float(imag))
        if "bytes" in data:
            return base64.b64decode(data["bytes"])
        if "ref" in data:
            name = str(data.get("type", "object"))
            proxy = _proxy_class(name, bool(data.get("callable")))(self, int(data["ref"]), name)
            return proxy
        for kind in ("list", "tuple", "set", "frozenset"):
            if kind in data:
                items = [self.decode(x, depth + 1) for x in data[kind]]
                value = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind]
                return self._remember(value(items), data.get("id"), kind == "list")
        if "dict" in data:
            value = {self.decode(k, depth + 1): self.decode(v, depth + 1) for k, v in data["dict"]}
            return self._remember(value, data.get("id"))
        raise RemoteBroken("the kernel sent a value the grader cannot read")

    def _remember(self, value, ref, keep: bool = True):
        if keep and isinstance(ref, int) and not isinstance(ref, bool):
            self.origins[id(value)] = (value, ref)
        return value

    # ------------------------------------------------------------------------- the channel

    def start(self) -> None:
        self.msg_id = self.kc.execute(SERVE, silent=False, store_history=False,
                                      allow_stdin=True, stop_on_error=False)
        self.open = True
        first = self._receive()
        if not first.get("ready"):
            raise RemoteBroken("the kernel did not start answering the grader")

    def request(self, message: dict) -> dict:
        self.kc.input(json.dumps(message))
        answer = self._receive()
        if "reply" not in answer or not isinstance(answer["reply"], dict):
            raise RemoteBroken("the kernel sent something other than an answer")
        return answer["reply"]

    def _receive(self, on_deadline=None) -> dict | None:
        """The kernel's next message of this cell; answers its callbacks on the way.

        At the deadline: :meth:`_time_out` (or ``on_deadline()``, whose result is returned).
        """
        poller = zmq.Poller()
        stdin, shell = self.kc.stdin_channel.socket, self.kc.shell_channel.socket
        poller.register(stdin, zmq.POLLIN)
        poller.register(shell, zmq.POLLIN)
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                return self._time_out() if on_deadline is None else on_deadline()
            ready = dict(poller.poll(int(min(left, 1.0) * 1000) + 1))
            if stdin in ready:
                msg = self.kc.stdin_channel.get_msg(timeout=0)
                if msg["parent_header"].get("msg_id") != self.msg_id:
                    continue
                try:
                    prompt = json.loads(msg["content"].get("prompt", ""))
                except (json.JSONDecodeError, TypeError):
                    raise RemoteBroken("the kernel sent the grader something unreadable") from None
                if isinstance(prompt, dict) and "callback" in prompt:
                    self._answer_callback(prompt)
                    continue
                return prompt if isinstance(prompt, dict) else {}
            if shell in ready:
                msg = self.kc.shell_channel.get_msg(timeout=0)
                if msg["parent_header"].get("msg_id") == self.msg_id:
                    self.open = False
                    content = msg.get("content", {})
                    detail = (f": {content.get('ename')}: {content.get('evalue')}"
                              if content.get("status") == "error" else "")
                    raise RemoteBroken("your kernel stopped answering the grader"
                                       + str(detail)[:300])
                continue
            if not self.kernel.is_alive():
                self.open = False
                raise KernelLost()

    def _answer_callback(self, prompt: dict) -> None:
        try:
            fn = self.callbacks[int(prompt["callback"])]
            args, kwargs = self.decode(prompt["args"])
            value = fn(*args, **dict(kwargs))
            reply = {"value": self._pickle(value)}
        except Exception as exc:
            reply = {"error": {"type": type(exc).__name__, "message": str(exc)[:TEXT_LIMIT]}}
        self.kc.input(json.dumps(reply))

    def _time_out(self):
        """Interrupt the kernel; raise :class:`RemoteTimeout` once it answered or was stopped."""
        function = self.current or "the check"
        with contextlib.suppress(Exception):
            self.kernel.interrupt()
        self.deadline = time.monotonic() + INTERRUPT_GRACE
        try:
            answer = self._receive(on_deadline=lambda: None)
        except (KernelLost, RemoteBroken):
            answer = None
        if answer is None:
            with contextlib.suppress(Exception):
                self.kernel.stop()
            self.open = False
        raise RemoteTimeout(function, interrupted=answer is not None)

    def _pickle(self, value) -> str:
        buf = io.BytesIO()
        _Pickler(buf, self).dump(value)
        return base64.b64encode(buf.getvalue()).decode("ascii")

    # --------------------------------------------------------------------------- requests

    def get(self, name: str):
        reply = self.request({"op": "get", "name": name})
        if "error" in reply:
            raise remote_error(reply["error"])
        value = self.decode(reply.get("value"))
        if isinstance(value, Proxy):
            value._mha_name = name
        return value

    def getattr(self, proxy: Proxy, attr: str):
        reply = self.request({"op": "getattr", "ref": proxy._mha_ref, "name": attr})
        if "error" in reply:
            raise remote_error(reply["error"])
        value = self.decode(reply.get("value"))
        if isinstance(value, Proxy):
            value._mha_name = f"{proxy._mha_name}.{attr}"
        return value

    def call(self, proxy: Proxy, args, kwargs, forbid=(), inplace=False) -> dict:
        self.current = proxy._mha_name
        payload = self._pickle((tuple(args), dict(kwargs)))
        try:
            reply = self.request({"op": "call", "ref": proxy._mha_ref, "args": payload,
                                  "forbid": list(forbid), "inplace": bool(inplace)})
        finally:
            self.current = ""
        outcome = {"found": None, "changed": []}
        found = reply.get("found")
        if isinstance(found, list) and len(found) == 4 and all(isinstance(x, str) for x in found):
            outcome["found"] = [x[:200] for x in found]
        changed = reply.get("changed")
        if isinstance(changed, list):
            outcome["changed"] = [i for i in changed if isinstance(i, int)]
        if "error" in reply:
            outcome["error"] = reply["error"]
        elif "value" in reply:
            outcome["value"] = self.decode(reply["value"])
        elif outcome["found"] is None:
            raise RemoteBroken("the kernel answered a call without a result")
        self._sync_generators([args, kwargs], reply.get("states"))
        return outcome

    def _sync_generators(self, args, states) -> None:
        """Advance the grader's Generators as the learner's function advanced the kernel's."""
        if not isinstance(states, list):
            return
        mine = generators(args)
        for gen, state in zip(mine, states, strict=False):
            with contextlib.suppress(Exception):
                gen.bit_generator.state = self.decode(state)

    def finish(self) -> str:
        """End the conversation; return what the learner's code printed during it."""
        if self.msg_id is None:
            return ""
        if self.open:
            with contextlib.suppress(Exception):
                self.kc.input(json.dumps({"op": "done"}))
        printed = []
        end = time.monotonic() + INTERRUPT_GRACE
        while time.monotonic() < end and self.kernel.is_alive():
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.05, end - time.monotonic()))
            except Exception:
                break
            if msg["parent_header"].get("msg_id") != self.msg_id:
                continue
            if msg["msg_type"] == "stream":
                printed.append(msg["content"].get("text", ""))
            elif msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                break
        self.open = False
        return "".join(printed)


class Names(dict):
    """The check cell's local names: the learner's names from the kernel, the rest from the setup.

    ``exec(code, trusted, Names(...))`` looks a name up here first: a name in ``remote`` (what
    the exercises' solution cells define) is always the kernel's; a name the setup cells
    defined, or a builtin, is the grader's own; any other name is asked of the kernel.
    """

    def __init__(self, session: Session, trusted: dict, remote: set):
        super().__init__()
        self.session, self.trusted, self.remote = session, trusted, remote

    def __missing__(self, name: str):
        if name not in self.remote and (name in self.trusted or hasattr(builtins, name)):
            raise KeyError(name)
        value = self.session.get(name)
        self[name] = value
        return value


class Grader:
    """What the plugin keeps for one notebook: the trusted namespace, the settings, the probes."""

    def __init__(self, nb):
        settings = info(nb).get("grader") or {}
        self.remote = set(settings.get("remote") or [])
        self.probe_seed = settings.get("probe_seed")
        self.trusted: dict = {"__name__": "__grader__"}
        for cell in nb.cells:
            if cell.cell_type == "code" and info(cell).get("role") == "setup":
                exec(compile(_plain(cell.source), "<setup cell>", "exec"), self.trusted)
        self.probes: dict = {}
        if settings.get("probes"):
            exec(compile(settings["probes"], "<the assignment's probes>", "exec"), self.probes)

    def run(self, source: str, exercise: str, session: Session) -> str:
        """Run a check cell with the learner's names from ``session``; return what it printed."""
        code = compile(source, "<check cell>", "exec")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, self.trusted, Names(session, self.trusted, self.remote))
        printed = out.getvalue()
        if self.probe_seed is not None:
            seed = harness.PROBE["seed"]
            harness.PROBE["seed"] = self.probe_seed
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(code, self.trusted, Names(session, self.trusted, self.remote))
            finally:
                harness.PROBE["seed"] = seed
        probe = self.probes.get("probe_" + exercise.replace(".", "_"))
        if callable(probe):
            names = Names(session, self.trusted, self.remote | set(
                inspect.signature(probe).parameters))
            with contextlib.redirect_stdout(io.StringIO()):
                probe(*(names[p] for p in inspect.signature(probe).parameters))
        return printed


def _plain(source: str) -> str:
    """A setup cell without IPython's magics and shell lines (the grader runs plain Python)."""
    return "\n".join(line for line in source.split("\n")
                     if not line.lstrip().startswith(("%", "!")))


def graded_runtest(item) -> None:
    """nbval's ``runtest`` for a check cell the grader runs (see the module docstring)."""
    kernel = item.parent.kernel
    if not kernel.is_alive():
        raise RuntimeError("Kernel dead on test start")
    grader = getattr(item.parent, "mha_course_grader", None)
    if grader is None:
        grader = item.parent.mha_course_grader = Grader(item.parent.nb)
    timeout = float(item.config.option.nbval_cell_timeout or 30)
    session = Session(kernel, time.monotonic() + timeout)
    item.test_outputs = outputs = []
    printed, error, lost = "", None, None
    try:
        session.start()
        printed = grader.run(item.cell.source, info(item.cell).get("exercise", ""), session)
    except RemoteTimeout as exc:
        item.parent.timed_out = True
        where = f" (in your function `{exc.function}`)" if exc.function != "the check" else ""
        if exc.interrupted:
            lost = f"Timeout of {timeout:g} seconds exceeded executing cell{where}"
        else:
            lost = (f"Timeout of {timeout:g} seconds exceeded while executing cell. Failed to "
                    f"interrupt kernel in {INTERRUPT_GRACE:g} seconds, so failing without "
                    f"traceback.{where}")
    except KernelLost:
        raise RuntimeError(KERNEL_DIED) from None
    except Exception as exc:  # the check's verdict (CheckFailed), or the learner's NameError
        error = exc
    finally:
        kernel_printed = session.finish() if kernel.is_alive() else ""
    if not kernel.is_alive() and lost is None:
        raise RuntimeError(KERNEL_DIED)
    text = printed + kernel_printed
    if text:
        outputs.append({"output_type": "stream", "name": "stdout", "text": text})
    if lost is not None:
        raise NbCellError(item.cell_num, lost, item.cell.source)
    if error is not None:
        outputs.append({"output_type": "error", "ename": type(error).__name__,
                        "evalue": str(error), "traceback": []})
        raise NbCellError(item.cell_num, "Cell execution caused an exception",
                          item.cell.source)
    expected = "".join(o.get("text", "") for o in item.cell.get("outputs", [])
                       if o.get("output_type") == "stream")
    if item.sanitize(printed) != item.sanitize(expected) or kernel_printed:
        raise NbCellError(item.cell_num, "Cell outputs differ", item.cell.source)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Give every check cell the checker marked for the grader :func:`graded_runtest`."""
    if IPyNbCell is None:
        return
    for item in items:
        if isinstance(item, IPyNbCell) and info(item.cell).get("grader"):
            item.runtest = types.MethodType(graded_runtest, item)


pytest_collection_modifyitems = pytest.hookimpl(trylast=True)(pytest_collection_modifyitems)
