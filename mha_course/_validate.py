"""Input validation: the one helper every public function uses to refuse bad input.

Used by every lesson from ``notebooks/01_matmul.ipynb`` on: whatever a lesson calls with a wrong
shape answers in this one style.

(Named "validate", not "check": in this course a *check* is an exercise check,
:mod:`mha_course.checks`, or the ``check`` command that grades notebooks.)

Each error names the function, the argument, what it got and what it expected, with the
shape letters filled in where they are known, e.g.::

    scaled_dot_product_attention: k has shape (5, 6); expected (S, d_k) with d_k=8 (from q)

Every refusal is a ``ValueError`` (never ``assert``, which ``python -O`` removes).
"""

from __future__ import annotations

import numpy as np


def fail(func: str, message: str) -> ValueError:
    """Build a ``ValueError`` whose message starts with the function's name."""
    return ValueError(f"{func}: {message}")


def fmt_shape(shape) -> str:
    """A shape as Python prints a tuple: ``(5, 6)``, ``(3,)``, ``()``."""
    shape = tuple(int(n) for n in shape)
    return "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def as_float_array(func: str, name: str, x) -> np.ndarray:
    """Return ``x`` as a NumPy array with a real floating dtype, or raise.

    Integers, booleans and complex numbers are refused rather than silently converted: attention
    is defined on real numbers, and an integer array is usually a sign of a mix-up (a mask or a
    list of lengths passed where scores were meant).
    """
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        raise fail(
            func,
            f"{name} has dtype {arr.dtype}; expected a real floating dtype "
            "(float32 or float64)",
        )
    return arr


def validate_shape(
    func: str,
    name: str,
    arr: np.ndarray,
    letters: tuple[str, ...],
    known: dict[str, tuple[int, str]] | None = None,
    batch: bool = True,
) -> dict[str, int]:
    """Check the trailing axes of ``arr`` against named letters; return the letters' values.

    Parameters
    ----------
    func, name : str
        The public function and the argument, for the message.
    arr : ndarray
        The array to check.
    letters : tuple of str
        Names of the trailing axes, e.g. ``("S", "d_k")``.
    known : dict of str to (int, str), optional
        Letters whose value is already fixed, with where it came from, e.g.
        ``{"d_k": (8, "q")}``. A mismatch is reported as ``with d_k=8 (from q)``.
    batch : bool
        Whether leading batch axes (``...``) are allowed before ``letters``.

    Returns
    -------
    dict of str to int
        The value of every letter, read off ``arr``.

    Raises
    ------
    ValueError
        When the rank is too low (or too high without batch axes) or a known letter differs.

    Examples
    --------
    >>> validate_shape("f", "k", np.zeros((5, 8)), ("S", "d_k"), {"d_k": (8, "q")})
    {'S': 5, 'd_k': 8}
    """
    known = known or {}
    n = len(letters)
    shape = arr.shape
    rank_ok = arr.ndim >= n if batch else arr.ndim == n
    values = dict(zip(letters, shape[arr.ndim - n :], strict=True)) if arr.ndim >= n else {}
    wrong = [k for k, (v, _) in known.items() if k in values and values[k] != v]
    if rank_ok and not wrong:
        return {k: int(v) for k, v in values.items()}
    show_batch = batch and (arr.ndim > n or not rank_ok)
    pattern = ", ".join((["..."] if show_batch else []) + list(letters))
    known_txt = ", ".join(f"{k}={v} (from {src})" for k, (v, src) in known.items() if k in letters)
    message = f"{name} has shape {fmt_shape(shape)}; expected ({pattern})"
    if known_txt:
        message += f" with {known_txt}"
    raise fail(func, message)


def validate_mask(func: str, mask, target_shape: tuple[int, ...], target: str) -> np.ndarray | None:
    """Check that ``mask`` is boolean and broadcasts to ``target_shape``; return it as an array.

    ``target`` spells the expected shape in letters, e.g. ``"(..., T, S) = (2, 3, 5)"``.
    """
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise fail(
            func,
            f"mask has dtype {m.dtype}; expected bool (True = may attend). "
            "Build one with causal_mask, padding_mask or a comparison such as `lengths > 0`",
        )
    try:
        ok = np.broadcast_shapes(m.shape, target_shape) == tuple(target_shape)
    except ValueError:
        ok = False
    if not ok:
        raise fail(
            func,
            f"mask has shape {fmt_shape(m.shape)}; expected a shape that broadcasts to {target}",
        )
    return m


def validate_positive_int(func: str, name: str, value, minimum: int = 1) -> int:
    """Check that ``value`` is an integer >= ``minimum``; return it as ``int``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise fail(func, f"{name}={value!r} must be an integer >= {minimum}")
    if value < minimum:
        raise fail(func, f"{name}={value} must be an integer >= {minimum}")
    return int(value)


def refuse_layer_scale(func: str, layer, name: str = "layer"):
    """Raise unless ``layer`` scores with the default ``1/√d_k``; return the layer.

    Only ``MultiHeadAttention.forward`` and ``decode_step`` apply a layer's own ``scale``
    (Gemma 2's ``query_pre_attn_scalar**-0.5``); the other paths over a layer's weights (the lean
    forward, chunked and split-KV decoding, the serving decoder, tensor parallelism, the
    hand-written backward) assume ``1/√d_k`` and refuse a layer with a ``scale`` rather than
    return a different layer's output.
    """
    scale = getattr(layer, "scale", None)
    if scale is not None:
        raise fail(func, f"{name} has scale={scale!r}; this path scores with 1/sqrt(d_k) only: "
                         f"build the layer with scale=None, or use its forward / decode_step")
    return layer
