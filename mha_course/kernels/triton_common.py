"""What the Triton modules share: importing triton and torch (choosing Triton's interpreter when
there is no GPU) and checking the kernels' arguments.

Taught with the kernels in ``notebooks/deep_dives/07c_triton_kernels.ipynb`` (lesson 07's deep
dive), through :mod:`mha_course.kernels.triton_flash`, which re-exports ``HAS_TRITON``,
``INTERPRETED``, ``KERNELS_MISSING`` and :func:`require_triton`.

Importing this module on a machine without CUDA sets ``TRITON_INTERPRET=1`` (unless it is
already set) before triton is imported, so the kernels defined after it run in Triton's
interpreter on torch CPU tensors (``INTERPRETED`` says which way they run). Without the
``kernels`` extra (triton, torch) it still imports: ``HAS_TRITON`` is False, ``torch``,
``triton`` and ``tl`` are None, and :func:`require_triton` says how to install them.

The checks (:func:`check_qkv`, :func:`check_like`, :func:`check_block`,
:func:`launch_options`) raise ``ValueError`` naming the function, the argument, what it got and
what was expected, as the rest of the package does.
"""

from __future__ import annotations

import os
import sys

from .._validate import fail, fmt_shape

__all__ = ["HAS_TRITON", "IMPORT_ERROR", "INTERPRETED", "KERNELS_MISSING", "block_d",
           "check_block", "check_like", "check_qkv", "launch_options", "require_triton"]

_TRITON_TOO_EARLY = False  # triton was imported before the interpreter could be chosen
try:
    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # no GPU: the interpreter runs the kernels
        # triton's own library (tl.sum, tl.max, ...) was compiled-mode already: it cannot run
        _TRITON_TOO_EARLY = "triton" in sys.modules
    import triton
    import triton.language as tl
except ImportError as _exc:  # the extra is not installed: the module imports, the kernels refuse
    HAS_TRITON = False
    IMPORT_ERROR: ImportError | None = _exc
    torch = triton = tl = None
else:
    HAS_TRITON = True
    IMPORT_ERROR = None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

KERNELS_MISSING = (
    "mha_course.kernels.triton_flash needs triton and torch: pip install -e '.[kernels]'"
)


def require_triton() -> None:
    """Raise a clear ``ImportError`` when triton or torch is missing, and a ``RuntimeError``
    when triton was imported, without a GPU, before this module could choose its interpreter.

    >>> require_triton() if HAS_TRITON else None
    """
    if not HAS_TRITON:
        raise ImportError(f"{KERNELS_MISSING} ({IMPORT_ERROR})")
    if _TRITON_TOO_EARLY:
        raise RuntimeError(
            "triton was imported before mha_course.kernels.triton_flash on a machine without a "
            "GPU, so Triton's interpreter cannot run the kernels: restart Python and import "
            "mha_course.kernels.triton_flash first (or set TRITON_INTERPRET=1 before importing "
            "triton)")


def check_block(func: str, name: str, value) -> int:
    """A block size: a power of two >= 16 (``tl.dot``'s smallest tile).

    >>> check_block("f", "block_m", 32)
    32
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value & (value - 1):
        raise fail(func, f"{name} is {value!r}; expected a power of two >= 16 (tl.dot's minimum)")
    return value


def block_d(d: int) -> int:
    """The head width a kernel's tiles hold: ``d`` padded to a power of two, at least 16.

    >>> block_d(24), block_d(8), block_d(64)
    (32, 16, 64)
    """
    return max(16, 1 << (d - 1).bit_length())


def launch_options(func: str, num_warps, num_stages) -> dict:
    """``num_warps`` and ``num_stages`` for a launch, the ones given (integers >= 1) only."""
    options = {}
    for name, value in (("num_warps", num_warps), ("num_stages", num_stages)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise fail(func, f"{name} is {value!r}; expected an integer >= 1 or None")
            options[name] = value
    return options


def _check_tensor(func: str, name: str, x, ndim: int, letters: str):
    if not isinstance(x, torch.Tensor):
        raise fail(func, f"{name} is a {type(x).__name__}; expected a torch tensor {letters}")
    if x.ndim != ndim:
        raise fail(func, f"{name} has shape {fmt_shape(x.shape)}; expected {letters}")
    if x.dtype != torch.float32:
        raise fail(func, f"{name} has dtype {x.dtype}; expected torch.float32")
    return x


def check_qkv(func: str, q, k, v):
    """The shapes of q (B, h, T, d), k and v (B, g, S, d) with h % g == 0; returns them."""
    _check_tensor(func, "q", q, 4, "(B, h, T, d)")
    _check_tensor(func, "k", k, 4, "(B, g, S, d)")
    _check_tensor(func, "v", v, 4, "(B, g, S, d)")
    B, h, T, d = q.shape
    _, g, S, _ = k.shape
    if k.shape[0] != B or k.shape[3] != d or g < 1 or h % g:
        raise fail(func, f"k has shape {fmt_shape(k.shape)}; expected (B, g, S, d) with B={B}, "
                         f"d={d} (from q) and g dividing h={h}")
    if tuple(v.shape) != tuple(k.shape):
        raise fail(func, f"v has shape {fmt_shape(v.shape)}; expected (B, g, S, d) = "
                         f"{fmt_shape(k.shape)} (from k)")
    if T < 1 or S < 1 or d < 1:
        raise fail(func, f"q has shape {fmt_shape(q.shape)} and k {fmt_shape(k.shape)}; "
                         "expected T, S and d >= 1")
    if not (q.device == k.device == v.device):
        raise fail(func, f"q, k, v are on {q.device}, {k.device}, {v.device}; expected one device")
    return B, h, g, T, S, d


def check_like(func: str, name: str, x, shape: tuple, letters: str, device):
    """``x``: a float32 torch tensor of exactly ``shape`` on ``device`` (both from q)."""
    _check_tensor(func, name, x, len(shape), letters)
    if tuple(x.shape) != tuple(shape):
        raise fail(func, f"{name} has shape {fmt_shape(x.shape)}; expected {letters} = "
                         f"{fmt_shape(shape)} (from q)")
    if x.device != device:
        raise fail(func, f"{name} is on {x.device}; expected {device} (from q)")
    return x
