"""Every ValueError path: bad input gets a message that names the function, the argument, the
shape (or dtype) it got and what was expected, with the letters filled in."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from mha_course import (
    MultiHeadAttention,
    attention_flops,
    causal_mask,
    log_softmax,
    logsumexp,
    merge_heads,
    naive,
    padding_mask,
    param_count,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)

z = np.zeros
INT = np.arange(6, dtype=np.int64).reshape(2, 3)
BOOL = np.ones((2, 3), dtype=bool)
COMPLEX = np.ones((2, 3), dtype=np.complex128)
FLOAT_DTYPE = "expected a real floating dtype (float32 or float64)"
MASK_DTYPE = (
    "expected bool (True = may attend). "
    "Build one with causal_mask, padding_mask or a comparison such as `lengths > 0`"
)
SDPA = "scaled_dot_product_attention"
MHA = "MultiHeadAttention"
FPH = "MultiHeadAttention.from_per_head"
LAYER = MultiHeadAttention(8, 2, rng=0)  # d_model=8, h=2, d_k=d_v=4


def sdpa(q_shape, k_shape, v_shape, mask=None, dtype=np.float64):
    return lambda: scaled_dot_product_attention(
        z(q_shape, dtype), z(k_shape, dtype), z(v_shape, dtype), mask=mask
    )


def per_head(q=(2, 4, 3), k=(2, 4, 3), v=(2, 4, 5), o=(10, 4), **biases):
    return lambda: MultiHeadAttention.from_per_head(z(q), z(k), z(v), z(o), **biases)


CASES = {
    # ------------------------------------------------------------------------------ softmax
    "softmax int": (lambda: softmax(INT), f"softmax: x has dtype int64; {FLOAT_DTYPE}"),
    "softmax bool": (lambda: softmax(BOOL), f"softmax: x has dtype bool; {FLOAT_DTYPE}"),
    "softmax complex": (
        lambda: softmax(COMPLEX), f"softmax: x has dtype complex128; {FLOAT_DTYPE}"
    ),
    "softmax scalar": (
        lambda: softmax(np.float64(1.0)),
        "softmax: x has shape (); expected an array with at least one axis",
    ),
    "softmax axis": (
        lambda: softmax(z((2, 3)), axis=2),
        "softmax: axis=2 is out of range for x with shape (2, 3)",
    ),
    "softmax negative axis": (
        lambda: softmax(z((2, 3)), axis=-3),
        "softmax: axis=-3 is out of range for x with shape (2, 3)",
    ),
    "softmax mask not bool": (
        lambda: softmax(z((2, 3)), mask=np.ones((2, 3), dtype=np.int64)),
        f"softmax: mask has dtype int64; {MASK_DTYPE}",
    ),
    "softmax mask shape": (
        lambda: softmax(z((2, 3)), mask=np.ones((3, 2), dtype=bool)),
        "softmax: mask has shape (3, 2); expected a shape that broadcasts to x's shape (2, 3)",
    ),
    "softmax mask larger than x": (
        lambda: softmax(z((2, 3)), mask=np.ones((4, 2, 3), dtype=bool)),
        "softmax: mask has shape (4, 2, 3); expected a shape that broadcasts to x's shape (2, 3)",
    ),
    "logsumexp int": (lambda: logsumexp(INT), f"logsumexp: x has dtype int64; {FLOAT_DTYPE}"),
    "logsumexp axis": (
        lambda: logsumexp(z((2, 3)), axis=5),
        "logsumexp: axis=5 is out of range for x with shape (2, 3)",
    ),
    "log_softmax complex": (
        lambda: log_softmax(COMPLEX), f"log_softmax: x has dtype complex128; {FLOAT_DTYPE}"
    ),
    "log_softmax mask float": (
        lambda: log_softmax(z((2, 3)), mask=z((2, 3))),
        f"log_softmax: mask has dtype float64; {MASK_DTYPE}",
    ),
    # ----------------------------------------------------------- scaled_dot_product_attention
    "sdpa design example": (
        sdpa((3, 8), (5, 6), (5, 6)),
        f"{SDPA}: k has shape (5, 6); expected (S, d_k) with d_k=8 (from q)",
    ),
    "sdpa q rank": (
        sdpa((4,), (5, 4), (5, 6)), f"{SDPA}: q has shape (4,); expected (..., T, d_k)"
    ),
    "sdpa k rank": (
        sdpa((3, 4), (4,), (5, 6)),
        f"{SDPA}: k has shape (4,); expected (..., S, d_k) with d_k=4 (from q)",
    ),
    "sdpa v rank": (
        sdpa((3, 4), (5, 4), (6,)),
        f"{SDPA}: v has shape (6,); expected (..., S, d_v) with S=5 (from k)",
    ),
    "sdpa d_k batched": (
        sdpa((2, 3, 4), (2, 5, 6), (2, 5, 6)),
        f"{SDPA}: k has shape (2, 5, 6); expected (..., S, d_k) with d_k=4 (from q)",
    ),
    "sdpa S": (
        sdpa((3, 4), (5, 4), (6, 6)),
        f"{SDPA}: v has shape (6, 6); expected (S, d_v) with S=5 (from k)",
    ),
    "sdpa batch": (
        sdpa((2, 3, 4), (3, 5, 4), (3, 5, 6)),
        f"{SDPA}: the batch axes of q (2,), k (3,) and v (3,) do not broadcast together",
    ),
    "sdpa mask not bool": (
        sdpa((3, 4), (5, 4), (5, 6), mask=np.ones((3, 5))),
        f"{SDPA}: mask has dtype float64; {MASK_DTYPE}",
    ),
    "sdpa mask transposed": (
        sdpa((2, 3, 4), (2, 5, 4), (2, 5, 6), mask=np.ones((5, 3), dtype=bool)),
        f"{SDPA}: mask has shape (5, 3); expected a shape that broadcasts to "
        "(..., T, S) = (2, 3, 5)",
    ),
    "sdpa mask extra batch": (
        sdpa((3, 4), (5, 4), (5, 6), mask=np.ones((2, 3, 5), dtype=bool)),
        f"{SDPA}: mask has shape (2, 3, 5); expected a shape that broadcasts to "
        "(..., T, S) = (3, 5)",
    ),
    "sdpa q int": (
        sdpa((3, 4), (5, 4), (5, 6), dtype=np.int64), f"{SDPA}: q has dtype int64; {FLOAT_DTYPE}"
    ),
    "sdpa k bool": (
        lambda: scaled_dot_product_attention(z((3, 4)), np.ones((5, 4), bool), z((5, 6))),
        f"{SDPA}: k has dtype bool; {FLOAT_DTYPE}",
    ),
    "sdpa v complex": (
        lambda: scaled_dot_product_attention(z((3, 4)), z((5, 4)), z((5, 6), np.complex64)),
        f"{SDPA}: v has dtype complex64; {FLOAT_DTYPE}",
    ),
    # ------------------------------------------------------------------------------- masks
    "causal T zero": (lambda: causal_mask(0), "causal_mask: T=0 must be an integer >= 1"),
    "causal T float": (lambda: causal_mask(2.0), "causal_mask: T=2.0 must be an integer >= 1"),
    "causal T bool": (lambda: causal_mask(True), "causal_mask: T=True must be an integer >= 1"),
    "causal S zero": (lambda: causal_mask(3, 0), "causal_mask: S=0 must be an integer >= 1"),
    "padding lengths 2-D": (
        lambda: padding_mask([[1, 2]], 3),
        "padding_mask: lengths has shape (1, 2) and dtype int64; "
        "expected a 1-D array of integers, shape (B,)",
    ),
    "padding lengths float": (
        lambda: padding_mask([1.5, 2.0], 3),
        "padding_mask: lengths has shape (2,) and dtype float64; "
        "expected a 1-D array of integers, shape (B,)",
    ),
    "padding lengths scalar": (
        lambda: padding_mask(np.int64(3), 5),
        "padding_mask: lengths has shape () and dtype int64; "
        "expected a 1-D array of integers, shape (B,)",
    ),
    "padding length above S": (
        lambda: padding_mask([1, 4], 3), "padding_mask: lengths [1, 4] must lie between 0 and S=3"
    ),
    "padding length negative": (
        lambda: padding_mask([-1, 2], 3),
        "padding_mask: lengths [-1, 2] must lie between 0 and S=3",
    ),
    "padding S zero": (lambda: padding_mask([1], 0), "padding_mask: S=0 must be an integer >= 1"),
    # ------------------------------------------------------------------- split / merge heads
    "split not divisible": (
        lambda: split_heads(z((3, 10)), 3),
        "split_heads: x has shape (3, 10); its last axis 10 is not divisible by h=3",
    ),
    "split rank": (
        lambda: split_heads(z(6), 2), "split_heads: x has shape (6,); expected (..., T, h*d)"
    ),
    "split h zero": (lambda: split_heads(z((3, 6)), 0), "split_heads: h=0 must be an integer >= 1"),
    "merge rank": (
        lambda: merge_heads(z((3, 4))), "merge_heads: x has shape (3, 4); expected (..., h, T, d)"
    ),
    # ------------------------------------------------------------------ MultiHeadAttention
    "mha not divisible": (
        lambda: MultiHeadAttention(10, 3),
        f"{MHA}: d_model=10 is not divisible by h=3; pass d_k explicitly",
    ),
    "mha h zero": (lambda: MultiHeadAttention(8, 0), f"{MHA}: h=0 must be an integer >= 1"),
    "mha h negative": (lambda: MultiHeadAttention(8, -1), f"{MHA}: h=-1 must be an integer >= 1"),
    "mha h float": (lambda: MultiHeadAttention(8, 2.0), f"{MHA}: h=2.0 must be an integer >= 1"),
    "mha d_model zero": (
        lambda: MultiHeadAttention(0, 1), f"{MHA}: d_model=0 must be an integer >= 1"
    ),
    "mha d_k zero": (
        lambda: MultiHeadAttention(8, 2, d_k=0), f"{MHA}: d_k=0 must be an integer >= 1"
    ),
    "mha d_v zero": (
        lambda: MultiHeadAttention(8, 2, d_v=0), f"{MHA}: d_v=0 must be an integer >= 1"
    ),
    "mha x d_model": (
        lambda: LAYER(z((3, 7))),
        f"{MHA}: x has shape (3, 7); expected (T, d_model) with d_model=8 (from the layer)",
    ),
    "mha x d_model batched": (
        lambda: LAYER(z((2, 3, 7))),
        f"{MHA}: x has shape (2, 3, 7); expected (..., T, d_model) with d_model=8 "
        "(from the layer)",
    ),
    "mha x rank": (
        lambda: LAYER(z(8)),
        f"{MHA}: x has shape (8,); expected (..., T, d_model) with d_model=8 (from the layer)",
    ),
    "mha context d_model": (
        lambda: LAYER(z((3, 8)), context=z((5, 6))),
        f"{MHA}: context has shape (5, 6); expected (S, d_model) with d_model=8 (from the layer)",
    ),
    "mha x int": (
        lambda: LAYER(np.ones((3, 8), dtype=np.int64)), f"{MHA}: x has dtype int64; {FLOAT_DTYPE}"
    ),
    "mha x bool": (
        lambda: LAYER(np.ones((3, 8), dtype=bool)), f"{MHA}: x has dtype bool; {FLOAT_DTYPE}"
    ),
    "mha context complex": (
        lambda: LAYER(z((3, 8)), context=z((5, 8), np.complex128)),
        f"{MHA}: context has dtype complex128; {FLOAT_DTYPE}",
    ),
    "mha batch": (
        lambda: LAYER(z((2, 3, 8)), context=z((3, 5, 8))),
        f"{MHA}: the batch axes of x (2,) and context (3,) do not broadcast together",
    ),
    "mha mask shape": (
        lambda: LAYER(z((2, 3, 8)), context=z((2, 5, 8)), mask=np.ones((3, 3), dtype=bool)),
        f"{MHA}: mask has shape (3, 3); expected a shape that broadcasts to "
        "(..., T, S) = (2, 3, 5)",
    ),
    "mha mask not bool": (
        lambda: LAYER(z((3, 8)), mask=np.tril(np.ones((3, 3), dtype=np.int64))),
        f"{MHA}: mask has dtype int64; {MASK_DTYPE}",
    ),
    # -------------------------------------------------------------------------- from_per_head
    "per head int": (
        lambda: MultiHeadAttention.from_per_head(
            np.ones((2, 4, 3), dtype=np.int64), z((2, 4, 3)), z((2, 4, 5)), z((10, 4))
        ),
        f"{FPH}: W_q has dtype int64; {FLOAT_DTYPE}",
    ),
    "per head W_q rank": (
        per_head(q=(4, 3)), f"{FPH}: W_q has shape (4, 3); expected (h, d_model, d_k)"
    ),
    "per head W_k d_k": (
        per_head(k=(2, 4, 2)),
        f"{FPH}: W_k has shape (2, 4, 2); expected (h, d_model, d_k) with h=2 (from W_q), "
        "d_model=4 (from W_q), d_k=3 (from W_q)",
    ),
    "per head W_v d_model": (
        per_head(v=(2, 6, 5)),
        f"{FPH}: W_v has shape (2, 6, 5); expected (h, d_model, d_v) with h=2 (from W_q), "
        "d_model=4 (from W_q)",
    ),
    "per head W_o": (
        per_head(o=(8, 4)),
        f"{FPH}: W_o has shape (8, 4); expected (h*d_v, d_model) with h*d_v=10 (from W_v), "
        "d_model=4 (from W_q)",
    ),
    "per head some biases": (
        per_head(b_q=z((2, 3))), f"{FPH}: give all four biases b_q, b_k, b_v, b_o, or none"
    ),
    "per head b_q size": (
        per_head(b_q=z((2, 2)), b_k=z((2, 3)), b_v=z((2, 5)), b_o=z(4)),
        f"{FPH}: b_q has shape (4,); expected (h*d_k) with h*d_k=6 (from W_q)",
    ),
    "per head b_o size": (
        per_head(b_q=z((2, 3)), b_k=z((2, 3)), b_v=z((2, 5)), b_o=z(5)),
        f"{FPH}: b_o has shape (5,); expected (d_model) with d_model=4 (from W_q)",
    ),
    # ---------------------------------------------------------------------------------- cost
    "param_count not divisible": (
        lambda: param_count(10, 3),
        "param_count: d_model=10 is not divisible by h=3; pass d_k explicitly",
    ),
    "param_count h zero": (lambda: param_count(8, 0), "param_count: h=0 must be an integer >= 1"),
    "flops T zero": (
        lambda: attention_flops(0, 8, 2), "attention_flops: T=0 must be an integer >= 1"
    ),
    "flops S zero": (
        lambda: attention_flops(3, 8, 2, S=0), "attention_flops: S=0 must be an integer >= 1"
    ),
    "flops not divisible": (
        lambda: attention_flops(3, 10, 3),
        "attention_flops: d_model=10 is not divisible by h=3; pass d_k explicitly",
    ),
    # --------------------------------------------------------------------------------- naive
    "naive matmul inner": (
        lambda: naive.matmul([[1, 2]], [[1], [2], [3]]),
        "matmul: b has shape (3, 1); expected (n, p) with n=2 (from a)",
    ),
    "naive matmul_ijk inner": (
        lambda: naive.matmul_ijk([[1, 2]], [[1], [2], [3]]),
        "matmul_ijk: b has shape (3, 1); expected (n, p) with n=2 (from a)",
    ),
    "naive matmul ragged": (
        lambda: naive.matmul([[1, 2], [3]], [[1], [2]]),
        "matmul: a must be a non-empty rectangular list of lists",
    ),
    "naive transpose empty": (
        lambda: naive.transpose([]), "transpose: a must be a non-empty rectangular list of lists"
    ),
    "naive softmax_rows empty row": (
        lambda: naive.softmax_rows([[]]),
        "softmax_rows: a must be a non-empty rectangular list of lists",
    ),
}


@pytest.mark.parametrize(("call", "message"), CASES.values(), ids=list(CASES))
def test_bad_input_raises_value_error_with_exact_message(call, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        call()


def test_design_example_message_exactly():
    q, k, v = z((3, 8)), z((5, 6)), z((5, 6))
    with pytest.raises(ValueError) as info:
        scaled_dot_product_attention(q, k, v)
    assert str(info.value) == (
        "scaled_dot_product_attention: k has shape (5, 6); expected (S, d_k) with d_k=8 (from q)"
    )
    with pytest.raises(ValueError) as info:
        MultiHeadAttention(d_model=10, h=3)
    assert str(info.value) == (
        "MultiHeadAttention: d_model=10 is not divisible by h=3; pass d_k explicitly"
    )


def test_per_head_matrices_of_different_shapes_get_a_named_error():
    # A list of per-head matrices that disagree: the message should name the function and
    # the argument, like every other shape error (not numpy's stacking error).
    W_q = [z((4, 3)), z((4, 2))]
    with pytest.raises(ValueError, match="^" + re.escape(f"{FPH}: W_q")):
        MultiHeadAttention.from_per_head(W_q, z((2, 4, 3)), z((2, 4, 3)), z((6, 4)))


def test_explicit_d_k_allows_any_h():
    # The error's advice works: with d_k given, h need not divide d_model.
    layer = MultiHeadAttention(10, 3, d_k=4)
    assert layer.W_q.shape == (10, 12) and layer.W_o.shape == (12, 10)
    assert layer(z((2, 10)))[0].shape == (2, 10)


def test_checks_survive_python_dash_O():
    # `python -O` strips `assert`: input checks must not rely on it.
    code = (
        "import numpy as np, mha_course as m\n"
        "calls = [lambda: m.scaled_dot_product_attention(np.zeros((3, 8)), np.zeros((5, 6)),"
        " np.zeros((5, 6))),\n"
        "         lambda: m.softmax(np.zeros(3), mask=np.ones(4, bool)),\n"
        "         lambda: m.MultiHeadAttention(10, 3),\n"
        "         lambda: m.MultiHeadAttention(8, 2)(np.zeros((3, 7))),\n"
        "         lambda: m.split_heads(np.zeros((3, 10)), 3)]\n"
        "for call in calls:\n"
        "    try:\n"
        "        call()\n"
        "    except ValueError:\n"
        "        continue\n"
        "    raise SystemExit('no ValueError under -O')\n"
    )
    result = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _zeros_or_named_error(call, func, check_result):
    """Either a result that passes ``check_result`` or a ValueError that names ``func``."""
    try:
        result = call()
    except ValueError as exc:
        assert str(exc).startswith(f"{func}: "), f"unnamed error: {exc}"
    else:
        check_result(result)


def test_empty_key_axis_gives_zeros_or_a_named_error():
    # S = 0 keys: every query has nothing to attend to, like a fully masked row (output 0),
    # unless the package refuses it; either way no bare numpy reduction error.
    def check(result):
        out, weights = result
        assert out.shape == (3, 6) and weights.shape == (3, 0) and np.all(out == 0)

    _zeros_or_named_error(
        lambda: scaled_dot_product_attention(z((3, 4)), z((0, 4)), z((0, 6))), SDPA, check
    )

    def check_layer(result):
        out, weights = result
        assert out.shape == (3, 8) and weights.shape == (2, 3, 0) and np.all(out == 0)

    _zeros_or_named_error(lambda: LAYER(z((3, 8)), context=z((0, 8))), MHA, check_layer)


def test_softmax_over_an_empty_axis_gives_an_empty_array_or_a_named_error():
    def check(out):
        assert out.shape == (3, 0)

    _zeros_or_named_error(lambda: softmax(z((3, 0))), "softmax", check)


def test_no_heads_in_from_per_head_is_a_named_error():
    with pytest.raises(ValueError, match="^" + re.escape(f"{FPH}: ")):
        MultiHeadAttention.from_per_head([], [], [], z((0, 4)))
