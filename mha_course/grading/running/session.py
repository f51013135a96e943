"""The grader's conversation with the learner's kernel: proxies, values, callbacks, timeouts.

Not taught in a lesson: grading mode's channel (see :mod:`mha_course.grading.running.grader`, which
runs the checks, and :mod:`mha_course.grading.running.remote`, the kernel's side). A
:class:`Session`
lasts one check cell: it starts :func:`~mha_course.grading.running.remote.serve` in the kernel,
accepts
its connection on a Unix socket in the run's kernel folder (or uses the kernel's stdin channel),
and then

- gets the learner's names: values (numbers, strings, tuples, lists, dicts, numeric arrays)
  decoded without pickle (:meth:`Session.decode`), anything else as a :class:`Proxy` whose
  attributes and calls go to the kernel (:class:`CallableProxy`);
- calls the learner's functions with the check's arguments, pickled for the kernel (the grader's
  own functions among them, a check's ``f(x)``, become callbacks the kernel calls back), and
  gets back the result, the error (rebuilt by :func:`remote_error`), a forbidden call the
  kernel saw, the arguments changed in place, the peak memory when asked, and the state of
  every NumPy Generator passed (so the grader's advance as the kernel's did);
- stops at the cell's deadline: the kernel is interrupted and, if it does not answer within
  :data:`INTERRUPT_GRACE` seconds, stopped (:class:`RemoteTimeout`, naming the learner's
  function); a kernel that dies raises :class:`KernelLost`.

The proxies, the pickling of a check's arguments and these errors are in
:mod:`mha_course.grading.running.proxies`.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import socket
import time
import uuid

import zmq

from .proxies import (
    ArgumentPickler,
    KernelLost,
    Proxy,
    RemoteBroken,
    RemoteTimeout,
    proxy_class,
    remote_error,
)
from .remote import TEXT_LIMIT, from_npy, generators, recv_frame, send_frame

#: How long an interrupted cell may take to answer before its kernel is stopped (nbval's).
INTERRUPT_GRACE = 5.0
SERVE = "import mha_course.grading.running.remote as _mha_course_remote\n_mha_course_remote.serve"


class Session:
    """One check cell's conversation with :func:`~mha_course.grading.running.remote.serve` in the
    kernel.

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
        self.conn = None  # the Unix socket to the kernel (None: the stdin channel)
        #: Whether background output (a thread's, a subprocess's) arrived during the cell.
        self.background = False

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
            proxy = proxy_class(name, bool(data.get("callable")))(self, int(data["ref"]), name)
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
        """Start :func:`~mha_course.grading.running.remote.serve` in the kernel and connect to it.

        The grader listens on a Unix socket in the run's kernel folder (which the sandbox
        shares with the kernel): one connection, accepted once, for this cell only. Where that
        is impossible (a path too long for a Unix socket) the kernel's stdin channel is used.
        """
        folder = os.path.dirname(getattr(getattr(self.kernel, "km", None), "connection_file",
                                         "") or "")
        path = os.path.join(folder, f"g{uuid.uuid4().hex[:12]}.sock") if folder else ""
        listener = None
        if path and len(path.encode()) < 100 and hasattr(socket, "AF_UNIX"):
            with contextlib.suppress(OSError):
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(path)
                os.chmod(path, 0o666)  # a kernel running as a user of its own may connect
                listener.listen(1)
        code = SERVE + (f"({path!r})" if listener is not None else "()")
        self.msg_id = self.kc.execute(code, silent=False, store_history=False,
                                      allow_stdin=listener is None, stop_on_error=False)
        self.open = True
        try:
            if listener is not None:
                self._wait(listener)
                self.conn, _ = listener.accept()
        finally:
            if listener is not None:
                listener.close()
                with contextlib.suppress(OSError):
                    os.unlink(path)
        first = self._receive()
        if not first.get("ready"):
            raise RemoteBroken("the kernel did not start answering the grader")

    def request(self, message: dict) -> dict:
        self._send(json.dumps(message))
        answer = self._receive()
        if "reply" not in answer or not isinstance(answer["reply"], dict):
            raise RemoteBroken("the kernel sent something other than an answer")
        return answer["reply"]

    def _send(self, text: str) -> None:
        if self.conn is None:
            self.kc.input(text)
            return
        self.conn.settimeout(max(0.1, self.deadline - time.monotonic()))
        try:
            send_frame(self.conn, text)
        except OSError:
            raise RemoteBroken("the kernel stopped reading the grader's messages") from None

    def _wait(self, sock=None, on_deadline=None):
        """Wait until ``sock`` (default: the channel) is readable; mind the deadline, the
        kernel's death and the end of the cell (its execute_reply)."""
        poller = zmq.Poller()
        shell = self.kc.shell_channel.socket
        channel = sock if sock is not None else (
            self.conn if self.conn is not None else self.kc.stdin_channel.socket)
        poller.register(channel, zmq.POLLIN)
        poller.register(shell, zmq.POLLIN)
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                return self._time_out() if on_deadline is None else on_deadline()
            ready = dict(poller.poll(int(min(left, 1.0) * 1000) + 1))
            if any(key is channel or key == getattr(channel, "fileno", lambda: -1)()
                   for key in ready):
                return True
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

    def _receive(self, on_deadline=None) -> dict | None:
        """The kernel's next message of this cell; answers its callbacks on the way.

        At the deadline: :meth:`_time_out` (or ``on_deadline()``, whose result is returned).
        """
        while True:
            waited = self._wait(on_deadline=on_deadline)
            if waited is not True:
                return waited
            if self.conn is not None:
                self.conn.settimeout(max(0.1, self.deadline - time.monotonic()))
                try:
                    text = recv_frame(self.conn)
                except TimeoutError:  # stuck in the middle of a message: the channel is lost
                    with contextlib.suppress(Exception):
                        self.kernel.stop()
                    self.conn, self.open = None, False
                    raise RemoteTimeout(self.current or "the check", interrupted=False) from None
                except (EOFError, OSError, ValueError, UnicodeDecodeError):
                    self.conn = None
                    self.open = False
                    if not self.kernel.is_alive():
                        raise KernelLost() from None
                    raise RemoteBroken("your kernel stopped answering the grader") from None
            else:
                msg = self.kc.stdin_channel.get_msg(timeout=0)
                if msg["parent_header"].get("msg_id") != self.msg_id:
                    continue
                text = msg["content"].get("prompt", "")
            try:
                prompt = json.loads(text)
            except (json.JSONDecodeError, TypeError):
                raise RemoteBroken("the kernel sent the grader something unreadable") from None
            if isinstance(prompt, dict) and "callback" in prompt:
                self._answer_callback(prompt)
                continue
            return prompt if isinstance(prompt, dict) else {}

    def _answer_callback(self, prompt: dict) -> None:
        try:
            fn = self.callbacks[int(prompt["callback"])]
            args, kwargs = self.decode(prompt["args"])
            value = fn(*args, **dict(kwargs))
            reply = {"value": self._pickle(value)}
        except Exception as exc:
            reply = {"error": {"type": type(exc).__name__, "message": str(exc)[:TEXT_LIMIT]}}
        self._send(json.dumps(reply))

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
        ArgumentPickler(buf, self).dump(value)
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

    def call(self, proxy: Proxy, args, kwargs, forbid=(), inplace=False,
             measure=False) -> dict:
        self.current = proxy._mha_name
        payload = self._pickle((tuple(args), dict(kwargs)))
        try:
            reply = self.request({"op": "call", "ref": proxy._mha_ref, "args": payload,
                                  "forbid": list(forbid), "inplace": bool(inplace),
                                  "measure": bool(measure)})
        finally:
            self.current = ""
        outcome = {"found": None, "changed": []}
        found = reply.get("found")
        if isinstance(found, list) and len(found) == 4 and all(isinstance(x, str) for x in found):
            outcome["found"] = [x[:200] for x in found]
        changed = reply.get("changed")
        if isinstance(changed, list):
            outcome["changed"] = [i for i in changed if isinstance(i, int)]
        peak = reply.get("peak")
        if isinstance(peak, int) and not isinstance(peak, bool):
            outcome["peak"] = peak
        if "error" in reply:
            outcome["error"] = reply["error"]
        elif "value" in reply:
            outcome["value"] = self.decode(reply["value"])
        elif outcome["found"] is None:
            raise RemoteBroken("the kernel answered a call without a result")
        self._sync_generators([args, kwargs], reply.get("states"))
        return outcome

    def launch(self, proxy: Proxy, grid, specs, kwargs):
        """``proxy[grid](...)`` run in the kernel by ``launch_watched``: what it returns."""
        self.current = proxy._mha_name
        payload = self._pickle((tuple(grid), list(specs), dict(kwargs)))
        try:
            reply = self.request({"op": "launch", "ref": proxy._mha_ref, "args": payload})
        finally:
            self.current = ""
        if "error" in reply:
            raise remote_error(reply["error"])
        return self.decode(reply.get("value"))

    def repeat(self, proxy: Proxy, args, kwargs, n: int) -> list:
        """``n`` calls of ``proxy`` on the same arguments, run in the kernel as one request: its
        results, in order; the learner's error (rebuilt) if a call raised one."""
        self.current = proxy._mha_name
        payload = self._pickle((tuple(args), dict(kwargs)))
        try:
            reply = self.request({"op": "repeat", "ref": proxy._mha_ref, "args": payload,
                                  "n": int(n)})
        finally:
            self.current = ""
        values = reply.get("values")
        if not isinstance(values, list) or len(values) > n:
            raise RemoteBroken("the kernel answered repeated calls without their results")
        self._sync_generators([args, kwargs], reply.get("states"))
        if "error" in reply:
            raise remote_error(reply["error"])
        if len(values) != n:
            raise RemoteBroken("the kernel answered repeated calls without their results")
        return [self.decode(v) for v in values]

    def _sync_generators(self, args, states) -> None:
        """Advance the grader's Generators as the learner's function advanced the kernel's."""
        if not isinstance(states, list):
            return
        mine = generators(args)
        for gen, state in zip(mine, states, strict=False):
            with contextlib.suppress(Exception):
                gen.bit_generator.state = self.decode(state)

    def finish(self) -> str:
        """End the conversation; return what the learner's code printed during it.

        Only the cell's own stream output counts (see :func:`cell_output`); :attr:`background`
        says whether background output (another parent's) arrived meanwhile.
        """
        if self.msg_id is None:
            return ""
        if self.open:
            with contextlib.suppress(Exception):
                self._send(json.dumps({"op": "done"}))
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
            self.conn = None
        messages = []
        end = time.monotonic() + INTERRUPT_GRACE
        while time.monotonic() < end and self.kernel.is_alive():
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.05, end - time.monotonic()))
            except Exception:
                break
            messages.append(msg)
            if (msg["parent_header"].get("msg_id") == self.msg_id and msg["msg_type"] == "status"
                    and msg["content"].get("execution_state") == "idle"):
                break
        self.open = False
        printed, background = cell_output(messages, self.msg_id)
        self.background = self.background or background
        return printed


#: The parent ``msg_id`` of output the kernel could not attribute to the running cell
#: (:data:`mha_course.grading.running.kernel.BACKGROUND`; repeated here so the grader's side does
#: not
#: import the kernel's module).
BACKGROUND_ID = "mha-course-background"


def cell_output(messages, msg_id: str) -> tuple[str, bool]:
    """What the cell whose execute request is ``msg_id`` printed, from iopub ``messages`` in the
    order they arrived; and whether background output was among them.

    The rule (the same nbval applies to a cell, with the kernel's attribution of
    :mod:`mha_course.grading.running.kernel`): the cell's stream text, with its parent header, up
    to its
    ``idle`` status. Output with another parent (an earlier cell's late output, or
    :data:`BACKGROUND_ID`: a thread's, a subprocess's) and anything after ``idle`` is not the
    cell's, whatever its timing.

    >>> def msg(parent, kind, **content):
    ...     return {"parent_header": {"msg_id": parent}, "msg_type": kind, "content": content}
    >>> cell_output([msg("c", "stream", name="stdout", text="ok\\n"),
    ...              msg(BACKGROUND_ID, "stream", name="stderr", text="."),
    ...              msg("c", "status", execution_state="idle"),
    ...              msg("c", "stream", name="stdout", text="late")], "c")
    ('ok\\n', True)
    """
    printed, background = [], False
    for msg in messages:
        parent = (msg.get("parent_header") or {}).get("msg_id")
        kind, content = msg.get("msg_type"), msg.get("content") or {}
        if parent == BACKGROUND_ID:
            background = True
        if parent != msg_id:
            continue
        if kind == "status" and content.get("execution_state") == "idle":
            break
        if kind == "stream":
            printed.append(content.get("text", ""))
    return "".join(printed), background
