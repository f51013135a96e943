"""Launching a learner's Triton kernel for a check: on guarded memory, watched, through
Triton's interpreter, here or (grading mode) in the learner's kernel.

Used by the checks of lesson 07's kernel exercises (:mod:`mha_course.checks.kernels`, 07.7 to
07.11; the lesson is ``notebooks/07_flash_attention.ipynb``, its deep dive
``notebooks/deep_dives/07c_triton_kernels.ipynb``). Every tensor a check hands the kernel is a
view of a larger one whose extra :data:`GUARD` rows hold NaN, and the interpreter's loads and
stores are watched while the kernel runs: a lane that touches those rows is a read (or write)
past the end, even where a later ``tl.where`` hides the value it read.

- :func:`launch_watched`: build the tensors, launch, return the outputs and the guard rows
  touched (in grading mode the learner's kernel runs it: ``op: launch`` of
  :mod:`mha_course.grading.running.remote`);
- :func:`launch_kernel`: what a check calls: :func:`launch_watched` here or remotely, the
  learner's exception turned into a :class:`~mha_course.checks.CheckFailed`.

Triton and torch are imported when a kernel is launched, never when this module is imported;
without them a launch raises ``ImportError`` saying how to install them.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from .harness import CheckFailed, fail

__all__ = ["GUARD", "INSTALL", "launch_kernel", "launch_watched"]

#: Rows of NaN past the end of every tensor a check hands a kernel.
GUARD = 16
INSTALL = ("the kernel exercises (07.7 to 07.11) need Triton and PyTorch: "
           "pip install -e '.[kernels]' (triton==3.9.0), then restart the kernel")


def _modules():
    """(torch, triton), or ImportError saying how to install them."""
    try:
        import torch
        import triton
    except ImportError as exc:
        raise ImportError(f"{INSTALL} ({exc})") from None
    return torch, triton


class _Memory:
    """The tensors of one launch: each a view of a larger tensor whose extra rows are guards."""

    def __init__(self):
        self.torch, _ = _modules()
        self.zones: list[tuple[str, int, int]] = []  # (name, start, end) of the guard rows
        self.bodies: list[tuple[str, int, int]] = []  # (name, start, end) of the tensors
        self.backing: dict[str, object] = {}

    def tensor(self, name: str, array, fill=math.nan):
        """A float32 torch tensor holding ``array``, then GUARD rows of ``fill`` in memory."""
        torch = self.torch
        array = np.asarray(array, dtype=np.float32)
        rows, rest = array.shape[0], array.shape[1:]
        big = torch.full((rows + GUARD, *rest), fill, dtype=torch.float32)
        view = big[:rows]
        view.copy_(torch.from_numpy(np.ascontiguousarray(array)))
        start = big.data_ptr() + view.numel() * 4
        self.bodies.append((name, big.data_ptr(), start))
        self.zones.append((name, start, big.data_ptr() + big.numel() * 4))
        self.backing[name] = big
        return view

    def empty(self, name: str, shape):
        """An output tensor, NaN where the kernel has not written (guards past its end too)."""
        return self.tensor(name, np.full(shape, np.nan, dtype=np.float32))


@contextlib.contextmanager
def _watch(memory: _Memory):
    """Record which guard zones the interpreter's active load and store lanes touch."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store
    hits: dict[str, list[str]] = {"read": [], "wrote": [], "stored": []}

    def touched(ptrs, mask, kind):
        addr = np.asarray(ptrs.data).astype(np.uint64)
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)
        addr = addr[active]
        zones = [(kind, memory.zones)] + ([("stored", memory.bodies)] if kind == "wrote" else [])
        for key, where in zones:
            for name, lo, hi in where:
                if name not in hits[key] and ((addr >= lo) & (addr < hi)).any():
                    hits[key].append(name)

    def watched_load(self, ptrs, mask, other, *args, **kwargs):
        touched(ptrs, mask, "read")
        return load(self, ptrs, mask, other, *args, **kwargs)

    def watched_store(self, ptrs, value, mask, *args, **kwargs):
        touched(ptrs, mask, "wrote")
        return store(self, ptrs, value, mask, *args, **kwargs)

    builder.create_masked_load, builder.create_masked_store = watched_load, watched_store
    try:
        yield hits
    finally:
        builder.create_masked_load, builder.create_masked_store = load, store


def _is_kernel(fn) -> bool:
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:
        return False
    return isinstance(fn, KernelInterface)


def _unwrap(exc: BaseException) -> BaseException:
    """The learner's own exception inside the interpreter's ``InterpreterError``."""
    seen = 0
    while type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None and seen < 5:
        exc, seen = exc.__cause__, seen + 1
    return exc


def launch_watched(kernel, grid, specs, kwargs) -> dict:
    """Build the tensors ``specs`` describes, launch ``kernel[grid]`` on them, watched.

    ``specs`` lists the kernel's positional arguments: ``("in", name, array)`` for an input,
    ``("out", name, shape)`` for an output (filled with NaN), anything else as it is. Each
    tensor is followed in memory by GUARD rows of NaN. A plain Python function (not a Triton
    kernel) is called with the same arguments. Returns ``{"out": {name: array}, "read": [...],
    "wrote": [...], "stored": [...]}``: the outputs and the tensors whose guard rows an active
    lane read or wrote, and those stored into. The learner's own exception is raised, not the
    interpreter's ``InterpreterError`` around it.

    In grading mode the checker runs this in the learner's kernel (``op: launch``, see
    :mod:`mha_course.grading.running.remote`): the kernel lives there, and only what this
    returns, arrays and names, comes back.
    """
    mem = _Memory()
    args, outs = [], {}
    for spec in specs:
        if isinstance(spec, tuple) and len(spec) == 3 and spec[0] in ("in", "out"):
            kind, name, value = spec
            args.append(mem.tensor(name, value) if kind == "in" else mem.empty(name, value))
            if kind == "out":
                outs[name] = args[-1]
        else:
            args.append(spec)
    with _watch(mem) as hits, warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # NaN and inf of a wrong kernel: judged, not warned
        try:
            if _is_kernel(kernel):
                kernel[grid](*args, **kwargs)
            else:
                kernel(*args, **kwargs)
        except Exception as exc:
            raise _unwrap(exc) from None
    return {"out": {name: _np(t) for name, t in outs.items()}, **hits}


def launch_kernel(ex, kernel, grid, specs, kwargs):
    """Run the learner's kernel through :func:`launch_watched`, here or (grading mode) in the
    learner's kernel; turn its exception into a :class:`CheckFailed` (the stub's unchanged)."""
    _modules()
    if not callable(kernel) and not _is_kernel(kernel):
        raise fail(ex, f"expected your @triton.jit kernel, got {type(kernel).__name__}: pass "
                       "the kernel itself (check_x(my_kernel)), not a launch of it")
    remote = getattr(kernel, "mha_course_remote_launch", None)
    try:
        if remote is not None:
            return remote(grid, specs, kwargs)
        return launch_watched(kernel, grid, specs, kwargs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:
        shapes = ", ".join(f"{s[1]} {tuple(np.shape(s[2])) if s[0] == 'in' else tuple(s[2])}"
                           for s in specs if isinstance(s, tuple) and len(s) == 3)
        raise fail(ex, f"your kernel raised {type(exc).__name__}: {exc}\n  (launched on the "
                       f"grid {grid} with {shapes} and {kwargs})") from exc


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy().astype(float)
