"""Attention in low precision: bfloat16, float16 and 8-bit floats, and what must stay float32.

Taught in lesson 12, ``notebooks/12_precision.ipynb``.

NumPy has float16; ``ml_dtypes`` (the package JAX uses for its NumPy dtypes) adds bfloat16 and the
two 8-bit formats of Micikevicius et al. (2022), ``float8_e4m3fn`` (4 exponent bits, 3 mantissa
bits, largest 448, no infinity) and ``float8_e5m2`` (5 and 2, largest 57344). The functions here
*simulate* a kernel's number formats on the CPU: a value "in bfloat16" is a float32 that
bfloat16 can represent (:func:`round_to`), and an accumulator "in bfloat16" is rounded to
bfloat16 after every addition (:func:`sequential_sum`, :func:`matmul_accumulate`), as a
hardware accumulator of that width would be. The lesson measures what each choice costs
instead of asserting it.

FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608) runs attention's matrix products in FP8
with two tricks, both here: **block quantisation** (one scale per block of rows instead of one per
tensor: :func:`block_quantize`) and **incoherent processing** (multiply ``q`` and ``k`` by the same
random orthogonal matrix, which leaves ``q kᵀ`` unchanged and spreads an outlier channel over
every channel before rounding; a Hadamard matrix with random signs is one, cheap to apply:
:func:`random_hadamard`).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .._validate import as_float_array, fail, validate_positive_int
from ..softmax import softmax

#: The formats the lesson compares, narrowest last.
FORMATS = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}


def as_format(fmt) -> np.dtype:
    """The dtype of a format name (or a dtype among :data:`FORMATS`)."""
    if isinstance(fmt, str) and fmt in FORMATS:
        return FORMATS[fmt]
    try:
        dtype = np.dtype(fmt)
    except TypeError:
        dtype = None
    if dtype is None or dtype not in FORMATS.values():
        raise fail("precision", f"format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return dtype


def format_info(fmt) -> dict:
    """Bits, largest value, smallest normal and machine epsilon of a format, from its dtype.

    Examples
    --------
    >>> info = format_info("float8_e4m3fn")
    >>> info["bits"], info["max"], info["mantissa_bits"]
    (8, 448.0, 3)
    """
    dtype = as_format(fmt)
    fi = ml_dtypes.finfo(dtype) if dtype.kind == "V" or dtype.name not in (
        "float64", "float32", "float16") else np.finfo(dtype)
    return {"name": dtype.name, "bits": dtype.itemsize * 8, "mantissa_bits": int(fi.nmant),
            "exponent_bits": dtype.itemsize * 8 - 1 - int(fi.nmant), "max": float(fi.max),
            "smallest_normal": float(fi.smallest_normal), "eps": float(fi.eps)}


def round_to(x, fmt, saturate: bool = False) -> np.ndarray:
    """``x`` rounded to the nearest value of ``fmt`` (round to nearest even), as float32
    (float64 for ``"float64"``).

    ``saturate=True`` clips to the format's largest value first, as FP8 kernels do; otherwise a
    value beyond it becomes ``inf`` (or NaN in ``float8_e4m3fn``, which has no infinity).

    Examples
    --------
    >>> round_to(np.array([1.0 + 2**-9, 300.0, 1000.0]), "float8_e4m3fn", saturate=True).tolist()
    [1.0, 288.0, 448.0]
    """
    dtype = as_format(fmt)
    x = as_float_array("round_to", "x", x)
    carrier = np.float64 if dtype == np.float64 else np.float32
    if saturate:
        top = format_info(dtype)["max"]
        x = np.clip(x, -top, top)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype).astype(carrier)


def sequential_sum(x, fmt, axis: int = -1) -> np.ndarray:
    """The sum along ``axis`` with an accumulator in ``fmt``: one term at a time, the running
    sum rounded to ``fmt`` after every addition (float32 arithmetic in between)."""
    x = np.moveaxis(as_float_array("sequential_sum", "x", x), axis, 0)
    acc = np.zeros(x.shape[1:], dtype=np.float32)
    for term in x:
        acc = round_to(acc + term.astype(np.float32), fmt)
    return acc


def matmul_accumulate(a, b, fmt) -> np.ndarray:
    """``a @ b`` ((..., T, d) @ (..., d, S)) with every product and every partial sum rounded
    to ``fmt``, adding the ``d`` products one at a time (a tensor core accumulating in
    ``fmt``)."""
    a = as_float_array("matmul_accumulate", "a", a)
    b = as_float_array("matmul_accumulate", "b", b)
    acc = np.zeros(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, 1))[:-1]
                   + (b.shape[-1],), dtype=np.float32)
    for j in range(a.shape[-1]):
        product = round_to(a[..., :, j : j + 1] * b[..., j : j + 1, :], fmt)
        acc = round_to(acc + product, fmt)
    return acc


def attention_steps(q, k, v, *, scores_acc="float32", scores_store="float32",
                    softmax_sum="float32", weights_store="float32", out_acc="float32"):
    """Attention (no mask) with the number format of each step chosen, to measure each one.

    ``q`` (..., T, d_k), ``k`` (..., S, d_k), ``v`` (..., S, d_v), already in their input
    format. The steps, each sum done one term at a time in its accumulator's format:

    1. ``(q / √d_k) kᵀ`` accumulated in ``scores_acc``;
    2. the scores stored in ``scores_store``: the argument of ``exp``, where an absolute error
       becomes a relative error of the weight;
    3. ``exp(scores - max)`` summed in ``softmax_sum``, the softmax's denominator (the max is
       exact in any format: it is one of the values);
    4. the weights stored in ``weights_store``, the input of the second matrix product;
    5. ``weights @ v`` accumulated in ``out_acc``.

    FlashAttention keeps 1, 2, 3 and 5 in float32 and sends the weights (4) to the tensor cores
    in bf16 (or FP8 in FlashAttention-3). Returns the output (..., T, d_v) in float32.
    """
    q = as_float_array("attention_steps", "q", q).astype(np.float32)
    q = q * np.float32(1.0 / math.sqrt(q.shape[-1]))
    scores = round_to(matmul_accumulate(q, np.swapaxes(k, -1, -2), scores_acc), scores_store)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # every term in (0, 1]
    weights = round_to(e / sequential_sum(e, softmax_sum, axis=-1)[..., None], weights_store)
    return matmul_accumulate(weights, v, out_acc)


# --------------------------------------------------------------------------------- FP8 tricks
def block_quantize(x, fmt="float8_e4m3fn", block=None) -> np.ndarray:
    """``x`` through an FP8 (or other) format with a scale, back in float32.

    One scale ``amax / max(fmt)`` for the whole tensor (``block=None``), or one per block of
    ``block`` consecutive rows along axis -2 (FlashAttention-3's block quantisation: one scale
    per tile of tokens); each value is divided by its scale, rounded to ``fmt`` (saturating) and
    multiplied back.

    Examples
    --------
    >>> x = np.array([[0.001], [1000.0]])
    >>> bool(block_quantize(x, block=None)[0, 0] == 0.0)
    True
    >>> bool(block_quantize(x, block=1)[0, 0] > 0)
    True
    """
    func = "block_quantize"
    x = as_float_array(func, "x", x).astype(np.float32)
    top = format_info(fmt)["max"]
    if block is None:
        amax = np.abs(x).max()
        scale = amax / top if amax > 0 else 1.0
        return round_to(x / scale, fmt, saturate=True) * scale
    block = validate_positive_int(func, "block", block)
    out = np.empty_like(x)
    for r0 in range(0, x.shape[-2], block):
        part = x[..., r0 : r0 + block, :]
        amax = np.abs(part).max(axis=(-2, -1), keepdims=True)
        scale = np.where(amax > 0, amax / top, 1.0)
        out[..., r0 : r0 + block, :] = round_to(part / scale, fmt, saturate=True) * scale
    return out


def hadamard(d) -> np.ndarray:
    """The ``d × d`` Hadamard matrix (Sylvester's construction) divided by ``√d``: orthogonal,
    every entry ``±1/√d``. ``d`` must be a power of two.

    Examples
    --------
    >>> H = hadamard(4)
    >>> bool(np.allclose(H @ H.T, np.eye(4))), H[1].tolist()
    (True, [0.5, -0.5, 0.5, -0.5])
    """
    d = validate_positive_int("hadamard", "d", d)
    if d & (d - 1):
        raise fail("hadamard", f"d={d} is not a power of two (Sylvester's construction doubles)")
    H = np.ones((1, 1))
    while H.shape[0] < d:
        H = np.block([[H, H], [H, -H]])
    return H / math.sqrt(d)


def random_hadamard(d, rng=None) -> np.ndarray:
    """``diag(s) · hadamard(d)`` with random signs ``s``: the random orthogonal matrix of
    incoherent processing. ``(q M)(k M)ᵀ = q kᵀ`` for any orthogonal ``M``."""
    signs = np.random.default_rng(rng).choice([-1.0, 1.0], size=validate_positive_int(
        "random_hadamard", "d", d))
    return signs[:, None] * hadamard(d)


def fp8_attention(q, k, v, *, fmt="float8_e4m3fn", block=None, rotate=None) -> np.ndarray:
    """Attention whose ``q``, ``k`` and ``v`` pass through ``fmt`` (scaled per tensor or per
    ``block`` of tokens, :func:`block_quantize`), the rest in float32; ``rotate`` (a
    ``(d_k, d_k)`` orthogonal matrix) multiplies ``q`` and ``k`` before they are quantised.
    Shapes: q (..., T, d_k), k (..., S, d_k), v (..., S, d_v) -> (..., T, d_v)."""
    if rotate is not None:
        q, k = q @ rotate, k @ rotate
    qq, kq, vq = (block_quantize(a, fmt, block) for a in (q, k, v))
    scores = qq @ np.swapaxes(kq, -1, -2) / np.float32(math.sqrt(q.shape[-1]))
    return softmax(scores) @ vq
