"""The learner's side of grading mode: answering the grader's calls from inside the kernel.

Not taught in a lesson: part of the checker's grading mode (``check --assignment``; see
:mod:`mha_course.grading.running.grader` for the grader's side and the "Trust model" of
docs/instructors.md). In
grading mode a check never runs in the learner's kernel. The grader (the trusted pytest process
of the run) runs it, and every time the check calls the learner's function, the grader asks the
kernel to call it through :func:`serve`, which the grader starts in the kernel for each check
cell. Requests and replies travel over the kernel's stdin channel (Jupyter's ``input_request`` /
``input_reply``), which only that execution can use.

Trust runs one way. What the grader sends is a pickle (the kernel may unpickle it: the grader
is trusted). What the kernel sends back is JSON with arrays in NumPy's ``.npy`` format, read by
the grader without pickle (:func:`decode`, ``allow_pickle=False``): plain numbers, strings,
lists, tuples, dicts and numeric arrays come back as values, anything else stays in the kernel
and comes back as a reference the grader can call or ask for an attribute. So whatever the
learner's code does in its kernel (replace a check, patch NumPy, install an import hook), all it
can change is what its own functions return, and the grader judges that.

A Triton kernel (lesson 07's exercises 07.7 to 07.11) is launched the same way, by the
``launch`` request: the kernel runs :func:`mha_course.checks.kernel_launch.launch_watched` on the
learner's kernel and sends back its outputs and the guard rows it touched, as arrays and names.

The kernel also reports, for a call, a use of what the exercise forbids (found by the kernel's
copy of :mod:`mha_course.checks.forbid`) and which arguments the function changed in place:
evidence that can only fail an answer, never pass one.
"""

from __future__ import annotations

import base64
import builtins
import copy
import io
import json
import pickle
import socket
import sys
import warnings

import numpy as np

from ...checks.forbid import CallWatch, find_in_source, rules_for
from ...checks.harness import equal
from ...checks.kernel_launch import launch_watched  # imports triton only when it launches
from ...checks.measure import traced

#: Longest message or name the kernel reports (the rest is cut).
TEXT_LIMIT = 2_000
#: The longest message either side reads (1 GiB): a result larger than this is an error.
FRAME_LIMIT = 1 << 30
#: Containers deeper than this come back as references.
DEPTH_LIMIT = 40
#: Exceptions the grader re-raises as themselves (by name); others become subclasses of the
#: first of these in their class's bases, or of Exception.
BUILTIN_ERRORS = ("ArithmeticError", "AssertionError", "AttributeError", "BufferError",
                  "EOFError", "FloatingPointError", "ImportError", "IndexError", "KeyError",
                  "LookupError", "MemoryError", "ModuleNotFoundError", "NameError",
                  "NotImplementedError", "OSError", "OverflowError", "RecursionError",
                  "RuntimeError", "StopIteration", "TypeError", "UnboundLocalError",
                  "ValueError", "ZeroDivisionError")


def _npy(array) -> str:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def from_npy(text: str):
    """An array sent as :func:`encode` sends it (``.npy`` in base64), read without pickle."""
    return np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False)


# ------------------------------------------------------------------------ kernel -> grader


def encode(obj, refs: dict, depth: int = 0):
    """``obj`` as JSON data: values as values, anything else as a reference into ``refs``.

    Containers and arrays carry the reference of the kernel's own object too (``"id"``), so
    that passing them back to the learner's code passes the very object (a cache the learner's
    ``decode_step`` fills, say).
    """
    if obj is None or isinstance(obj, bool):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, complex):
        return {"complex": [obj.real, obj.imag]}
    if isinstance(obj, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, np.generic) and not isinstance(obj, np.object_):
        return {"np": _npy(np.asarray(obj))}
    if depth < DEPTH_LIMIT:
        if isinstance(obj, np.ndarray) and obj.dtype != object:
            return {"nd": _npy(np.asarray(obj)), "id": _ref(obj, refs)}
        if isinstance(obj, (list, tuple, dict, set, frozenset)):
            kind = next(k for k in (list, tuple, dict, set, frozenset) if isinstance(obj, k))
            if kind is dict:
                items = [[encode(k, refs, depth + 1), encode(v, refs, depth + 1)]
                         for k, v in dict.items(obj)]
            else:
                items = [encode(v, refs, depth + 1) for v in kind.__iter__(obj)]
            return {kind.__name__: items, "id": _ref(obj, refs)}
    return {"ref": _ref(obj, refs), "type": type(obj).__name__[:100],
            "callable": callable(obj)}


class Refs(dict):
    """The kernel's objects the grader holds references to: ``{key: object}``, found by identity."""

    def __init__(self):
        super().__init__()
        self.keys_by_id: dict[int, int] = {}

    def add(self, obj) -> int:
        key = self.keys_by_id.get(id(obj))
        if key is not None and self[key] is obj:
            return key
        key = len(self) + 1
        self[key] = obj
        self.keys_by_id[id(obj)] = key
        return key


def _ref(obj, refs) -> int:
    if isinstance(refs, Refs):
        return refs.add(obj)
    key = len(refs) + 1  # a plain dict: values the grader only reads (a Generator's state)
    refs[key] = obj
    return key


def error_info(exc: BaseException) -> dict:
    """What the grader needs to raise the same error: its name, bases and message."""
    bases = [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"]
    try:
        message = str(exc)
    except Exception:
        message = "(its message could not be read)"
    return {"type": type(exc).__name__[:100], "module": str(type(exc).__module__)[:100],
            "bases": bases, "message": message[:TEXT_LIMIT]}


# ------------------------------------------------------------------------ grader -> kernel


class _Unpickler(pickle.Unpickler):
    """The grader's arguments: references to the kernel's objects, and the grader's callables."""

    def __init__(self, data: bytes, server):
        super().__init__(io.BytesIO(data))
        self.server = server

    def persistent_load(self, pid):
        kind, key = pid
        if kind == "ref":
            return self.server.refs[key]
        if kind == "cb":
            return self.server.callback(key)
        raise pickle.UnpicklingError(f"unknown reference {kind!r}")


def generators(obj, found=None, depth=0) -> list:
    """The NumPy Generators in ``obj`` (arguments), in a fixed order: their state goes back.

    The kernel sends the state of each after a call, and the grader sets its own Generators
    to it, so a check that passes one Generator to many calls sees it advance, as it would if
    the function ran in its own process.
    """
    found = [] if found is None else found
    if isinstance(obj, np.random.Generator):
        found.append(obj)
    elif depth < DEPTH_LIMIT and isinstance(obj, (list, tuple)):
        for item in obj:
            generators(item, found, depth + 1)
    elif depth < DEPTH_LIMIT and isinstance(obj, dict):
        for item in obj.values():
            generators(item, found, depth + 1)
    return found


class Server:
    """The loop :func:`serve` runs: one request of the grader at a time, over ``ask``.

    ``ask(prompt) -> reply`` is the kernel's ``raw_input``: it sends ``prompt`` (a JSON text)
    to the grader and returns the grader's next message.
    """

    def __init__(self, ask, namespace: dict):
        self.ask, self.namespace, self.refs = ask, namespace, Refs()

    def loop(self, prompt: dict, until_reply: bool = False):
        """Answer requests until the grader says "done" (or, in a callback, sends its reply)."""
        while True:
            message = json.loads(self.ask(json.dumps(prompt)))
            if "op" not in message:
                if until_reply:
                    return message
                prompt = {"reply": {"error": error_info(RuntimeError("unexpected message"))}}
                continue
            if message["op"] == "done":
                return None
            try:
                prompt = {"reply": self.handle(message)}
            except BaseException as exc:  # noqa: BLE001 (KeyboardInterrupt: the grader's timeout)
                prompt = {"reply": {"error": error_info(exc)}}

    def handle(self, request: dict) -> dict:
        op = request["op"]
        if op == "get":
            name = request["name"]
            if name not in self.namespace:
                raise NameError(f"name {name!r} is not defined")
            return {"value": encode(self.namespace[name], self.refs)}
        if op == "getattr":
            return {"value": encode(getattr(self.refs[request["ref"]], request["name"]),
                                    self.refs)}
        if op == "call":
            return self.call(request)
        if op == "launch":  # a Triton kernel of the learner's, launched here (lesson 07.7+)
            grid, specs, kwargs = _Unpickler(base64.b64decode(request["args"]), self).load()
            value = launch_watched(self.refs[request["ref"]], grid, specs, kwargs)
            return {"value": encode(value, self.refs)}
        if op == "repeat":
            return self.repeat(request)
        raise ValueError(f"unknown request {op!r}")

    def call(self, request: dict) -> dict:
        fn = self.refs[request["ref"]]
        args, kwargs = _Unpickler(base64.b64decode(request["args"]), self).load()
        rules = rules_for({name: "" for name in request.get("forbid", [])})
        reply: dict = {}
        use = find_in_source(fn, rules) if rules else None
        if use is not None:
            reply["found"] = [use.rule.name, use.written, use.canonical, use.helper]
            return reply
        watch = CallWatch(rules)
        pristine = copy.deepcopy((args, kwargs)) if request.get("inplace") else None
        measure = bool(request.get("measure"))
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"), \
                    traced(reply if measure else None):
                warnings.simplefilter("ignore")
                value = watch.run(fn, args, kwargs) if watch.rules else fn(*args, **kwargs)
            reply["value"] = encode(value, self.refs)
        except BaseException as exc:  # noqa: BLE001 (every error goes back to the grader)
            reply["error"] = error_info(exc)
        if watch.found is not None:
            use = watch.found
            reply["found"] = [use.rule.name, use.written, use.canonical, use.helper]
        if pristine is not None:
            reply["changed"] = [i for i, (before, after) in enumerate(zip(
                [*pristine[0], *pristine[1].values()], [*args, *kwargs.values()], strict=True))
                if not _same(before, after)]
        reply["states"] = [encode(g.bit_generator.state, {}) for g in generators([args, kwargs])]
        return reply

    def repeat(self, request: dict) -> dict:
        """``request["n"]`` calls of the same function on the same arguments, in one request:
        the draws of a random function whose Generator argument advances from call to call
        (13.8's check draws 8,000). The results come back as a list, in order, up to the first
        error; the Generators' states after the last call, as after :meth:`call`."""
        fn = self.refs[request["ref"]]
        args, kwargs = _Unpickler(base64.b64decode(request["args"]), self).load()
        reply: dict = {}
        values = []
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                for _ in range(int(request["n"])):
                    values.append(encode(fn(*args, **kwargs), self.refs))
        except BaseException as exc:  # noqa: BLE001 (every error goes back to the grader)
            reply["error"] = error_info(exc)
        reply["values"] = values
        reply["states"] = [encode(g.bit_generator.state, {}) for g in generators([args, kwargs])]
        return reply

    def callback(self, key: int):
        """A function of the kernel that calls the grader's callable ``key`` (a check's ``f``)."""

        def call_grader(*args, **kwargs):
            answer = self.loop({"callback": key, "args": encode([list(args), kwargs], self.refs)},
                               until_reply=True)
            if answer is None:  # the grader is done: the check stopped during the callback
                raise RuntimeError("the check stopped")
            if "error" in answer:
                info = answer["error"]
                kind = getattr(builtins, str(info.get("type")), None)
                if not (isinstance(kind, type) and issubclass(kind, Exception)):
                    kind = RuntimeError
                raise kind(info.get("message", ""))
            return _Unpickler(base64.b64decode(answer["value"]), self).load()

        call_grader.__name__ = f"check_function_{key}"
        return call_grader


def _same(before, after) -> bool:
    try:
        return equal(before, after)
    except Exception:  # an argument type ``equal`` does not know: compare by identity
        return before is after


def send_frame(sock, text: str) -> None:
    """One message on a stream socket: its length (8 bytes, big-endian), then UTF-8 text."""
    data = text.encode("utf-8")
    sock.sendall(len(data).to_bytes(8, "big") + data)


def recv_frame(sock) -> str:
    """The next message :func:`send_frame` sent (blocking); EOFError when the socket closed,
    ValueError for a message longer than :data:`FRAME_LIMIT`."""
    size = int.from_bytes(_recv_exactly(sock, 8), "big")
    if size > FRAME_LIMIT:
        raise ValueError(f"a message of {size} bytes, more than {FRAME_LIMIT}")
    return _recv_exactly(sock, size).decode("utf-8")


def _recv_exactly(sock, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the grader closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve(path: str | None = None) -> None:
    """Answer the grader until it is done (the grader runs this in the kernel, per check cell).

    ``path`` is a Unix socket the grader listens on (in the run's kernel folder, which the
    sandbox shares); without it the kernel's stdin channel carries the messages, which only
    works when the grader executes this with ``allow_stdin`` (a learner running it by hand gets
    IPython's "stdin not supported" error).
    """
    shell = sys.modules["IPython"].get_ipython()
    if path is None:
        Server(shell.kernel.raw_input, shell.user_ns).loop({"ready": True})
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)

        def ask(prompt: str) -> str:
            send_frame(sock, prompt)
            return recv_frame(sock)

        Server(ask, shell.user_ns).loop({"ready": True})
