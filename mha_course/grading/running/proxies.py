"""What the grader holds of the learner's kernel: proxies for its objects, the pickling of a
check's arguments for it, and the errors a session raises or rebuilds.

Not taught in a lesson: part of grading mode's channel (:mod:`mha_course.grading.running.session`
holds the conversation these objects go through; :mod:`mha_course.grading.running.remote` is the
kernel's side).

- :class:`Proxy` and :class:`CallableProxy`: an object or function that lives in the kernel;
  attributes, calls, repeated calls and Triton launches go to it through its session;
  :func:`proxy_class` names their classes like the learner's types;
- :class:`ArgumentPickler`: the grader's arguments for the kernel: proxies and the learner's own
  objects by reference, the grader's functions (a check's ``f(x)``) as callbacks, the rest by
  value;
- :func:`remote_error`: the learner's exception rebuilt from its name, bases and message;
  :class:`RemoteTimeout`, :class:`KernelLost` and :class:`RemoteBroken`: a session's own.
"""

from __future__ import annotations

import builtins
import functools
import pickle
import sys
import types

import numpy as np

from .remote import BUILTIN_ERRORS, TEXT_LIMIT

__all__ = ["ArgumentPickler", "CallableProxy", "KernelLost", "Proxy", "RemoteBroken",
           "RemoteTimeout", "proxy_class", "remote_error"]

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

    def mha_course_remote_launch(self, grid, specs, kwargs):
        """Launch this Triton kernel in the learner's kernel, watched, on the tensors ``specs``
        describes (:func:`mha_course.checks.kernel_launch.launch_watched`): its outputs and the
        guard zones touched come back as values; the learner's error is raised (rebuilt)."""
        return self._mha_session.launch(self, grid, specs, kwargs)


class CallableProxy(Proxy):
    """A function (or callable object) of the learner's kernel."""

    def __call__(self, *args, **kwargs):
        outcome = self._mha_session.call(self, args, kwargs)
        if "error" in outcome:
            raise remote_error(outcome["error"])
        return outcome["value"]

    def mha_course_remote_repeat(self, args, kwargs, n: int) -> list:
        """``[self(*args, **kwargs) for _ in range(n)]`` in one request to the kernel (see
        :func:`mha_course.checks.harness.repeat`); the first error raised as the calls would."""
        return self._mha_session.repeat(self, args, kwargs, n)

    def mha_course_remote_call(self, args, kwargs, forbid=(), inplace=True,
                               measure=False) -> dict:
        """The call as :func:`mha_course.checks.harness.call` needs it: ``{"value" or "error",
        "found": [rule, written, canonical, helper] or None, "changed": [argument indices],
        "peak": bytes (with ``measure``)}``, the error rebuilt (see :func:`remote_error`)."""
        outcome = self._mha_session.call(self, args, kwargs, forbid=list(forbid),
                                         inplace=inplace, measure=measure)
        if "error" in outcome:
            outcome["error"] = remote_error(outcome["error"])
        return outcome


@functools.lru_cache(maxsize=256)
def proxy_class(name: str, is_callable: bool) -> type:
    """A proxy class named like the learner's type, so messages read "got Attention"."""
    base = CallableProxy if is_callable else Proxy
    safe = "".join(c for c in name if c.isalnum() or c == "_")[:60] or base.__name__
    return type(safe, (base,), {})


class ArgumentPickler(pickle.Pickler):
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
        if isinstance(obj, (types.MethodType, functools.partial)) or (
                isinstance(obj, types.FunctionType) and not _importable(obj)):
            self.session.callbacks.append(obj)
            return ("cb", len(self.session.callbacks) - 1)
        return None


def _importable(fn) -> bool:
    """Whether pickle can send ``fn`` by name (a module's function, not a closure or lambda)."""
    obj = sys.modules.get(getattr(fn, "__module__", None) or "")
    for part in getattr(fn, "__qualname__", "<lambda>").split("."):
        obj = getattr(obj, part, None)
    return obj is fn
