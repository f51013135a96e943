"""The memory-lean forward (``mha_course.kernels.lean``) equals the readable one, in values and
errors.

``lean_forward`` carries the speed and memory targets (``benchmarks/attention.py``); the layer's
``forward`` is what the lessons teach. Like ``tiled_attention`` against
``scaled_dot_product_attention``, the fast path must give the same output and weights on every
kind of input the readable one takes: GQA/MQA, RoPE, biases, masks of every broadcast shape,
cross-attention with broadcast batch axes, float32, fully masked rows, and scores large enough
that the max subtraction cannot be skipped.
"""

from __future__ import annotations

import functools
import tracemalloc

import conftest
import numpy as np
import pytest

from mha_course import MultiHeadAttention, causal_mask, padding_mask, softmax
from mha_course.kernels import lean as lean_module
from mha_course.kernels.lean import exp_is_safe, lean_forward

B, T, S, H, D_K, D_V, D_MODEL = 2, 3, 5, 4, 6, 7, 10
# the shared helper (tests/conftest.py) with this module's sizes
random_layer = functools.partial(
    conftest.random_layer, d_model=D_MODEL, h=H, d_k=D_K, d_v=D_V, bias=True
)

CASES = {
    # name: (x lead, context lead or None for self-attention, mask builder)
    "self": ((), None, lambda T, S: None),
    "self_causal": ((B,), None, lambda T, S: causal_mask(T)),
    "batched_padding": ((B,), None, lambda T, S: padding_mask([2, 3], S)),
    "cross": ((B,), (B,), lambda T, S: None),
    "cross_one_context": ((B, 3), (), lambda T, S: padding_mask([4, 1, 5], S)),
    "cross_key_mask": ((B,), (B,), lambda T, S: np.arange(S) % 2 == 0),
    "fully_masked_row": ((B,), (B,), lambda T, S: np.arange(S) < np.array([0, 2, 9])[:, None]),
}


def inputs(rng, case, dtype=np.float64, scale=1.0):
    x_lead, c_lead, make_mask = CASES[case]
    x = (rng.normal(size=(*x_lead, T, D_MODEL)) * scale).astype(dtype)
    context = None if c_lead is None else rng.normal(size=(*c_lead, S, D_MODEL)).astype(dtype)
    return x, context, make_mask(T, T if context is None else S)


# RoPE is for self-attention only (queries and keys share positions)
CASES_AND_ROPE = [(case, rope) for case in CASES for rope in (None, "half", "interleaved")
                  if rope is None or CASES[case][1] is None]


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("case,rope", CASES_AND_ROPE)
def test_lean_forward_equals_the_readable_forward(rng, case, rope, n_kv_heads):
    layer = random_layer(rng, n_kv_heads=n_kv_heads, rope=rope)
    x, context, mask = inputs(rng, case)
    out, weights = layer(x, context, mask)
    lean_out, lean_weights = lean_forward(layer, x, context, mask)
    assert lean_out.shape == out.shape and lean_weights.shape == weights.shape
    np.testing.assert_allclose(lean_out, out, rtol=0, atol=1e-13)
    np.testing.assert_allclose(lean_weights, weights, rtol=0, atol=1e-14)
    assert np.isfinite(lean_out).all() and np.isfinite(lean_weights).all()


@pytest.mark.parametrize("case", ["cross_one_context", "fully_masked_row", "self_causal"])
@pytest.mark.parametrize("rows_per_block", [1, 2, 100])
def test_the_per_head_row_blocks_give_the_same_result(rng, monkeypatch, case, rows_per_block):
    """Heads too big for the cache are done one head and a block of query rows at a time."""
    layer = random_layer(rng, n_kv_heads=2)
    x, context, mask = inputs(rng, case)
    want_out, want_weights = layer(x, context, mask)
    monkeypatch.setattr(lean_module, "BLOCK_BYTES", 1)  # every head is "too big"
    monkeypatch.setattr(lean_module, "MIN_ROWS", rows_per_block)
    out, weights = lean_forward(layer, x, context, mask)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=1e-13)
    np.testing.assert_allclose(weights, want_weights, rtol=0, atol=1e-14)


def test_float32_stays_float32_and_matches_float64(rng):
    layer = random_layer(rng, n_kv_heads=2)
    x, context, mask = inputs(rng, "self_causal", dtype=np.float32)
    out, weights = lean_forward(layer, x, context, mask)
    assert out.dtype == weights.dtype == np.float32
    out64, weights64 = layer(x.astype(np.float64), mask=mask)
    np.testing.assert_allclose(out, out64, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(weights, weights64, rtol=1e-4, atol=1e-6)


def test_large_scores_take_the_shifted_softmax_and_stay_finite(rng):
    layer = random_layer(rng)
    x, _, mask = inputs(rng, "self_causal", scale=300.0)  # scores far beyond exp's range
    kT = np.swapaxes(x @ layer.W_k, -1, -2)
    assert not exp_is_safe(x @ layer.W_q, kT, np.float64)
    out, weights = lean_forward(layer, x, mask=mask)
    want_out, want_weights = layer(x, mask=mask)
    assert np.isfinite(out).all() and np.isfinite(weights).all()
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(weights, want_weights, rtol=0, atol=1e-12)


def test_exp_is_safe_follows_the_cauchy_schwarz_bound():
    d = 4
    q = np.zeros((1, 2, d))
    kT = np.zeros((1, d, 3))
    q[0, 0, 0] = 5.0
    kT[0, 0, 1] = 7.0  # |q|·|k| = 35: inside float32's 0.4·ln(max) ≈ 35.5, outside at 36
    assert exp_is_safe(q, kT, np.float32)
    kT[0, 0, 1] = 7.2
    assert not exp_is_safe(q, kT, np.float32)
    assert exp_is_safe(q, kT, np.float64)  # float64 allows |q|·|k| up to about 283
    assert not exp_is_safe(q * np.nan, kT, np.float64)  # NaN compares False: shifted path
    assert not exp_is_safe(q[:, :0], kT, np.float64)  # nothing to prove on empty input


def test_lean_forward_raises_the_layers_errors(rng):
    layer = random_layer(rng)
    bad_inputs = [
        (rng.normal(size=(T, D_MODEL + 1)), None, None),
        (rng.normal(size=(T, D_MODEL)), None, np.ones((T, T + 1), bool)),
        (rng.normal(size=(2, T, D_MODEL)), rng.normal(size=(3, S, D_MODEL)), None),
        (np.ones((T, D_MODEL), dtype=int), None, None),
    ]
    for x, context, mask in bad_inputs:
        with pytest.raises(ValueError) as readable:
            layer(x, context, mask)
        with pytest.raises(ValueError) as lean:
            lean_forward(layer, x, context, mask)
        assert str(lean.value) == str(readable.value)
        assert str(lean.value).startswith("MultiHeadAttention: ")


def peak_extra_bytes(f) -> int:
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = f()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del result
    return peak - start


@pytest.mark.parametrize("n", [512, 1024])
def test_lean_peak_memory_is_the_weights_plus_q_k_v(n):
    """The memory target of issue 9: at most 1.25x the (h, n, n) weights at n >= 512.

    Peak extra memory of one call = the returned weights (h·n²) plus two (n, d_model) arrays
    (q and k; then q and v; then the merged heads and the output): for d_model = 512, h = 8,
    1 + 2·512/(8·n) times the weights, 1.25x at n = 512. The readable forward holds more.
    """
    d_model, h = 512, 8
    layer = MultiHeadAttention(d_model, h, rng=0)
    for name, p in layer.parameters().items():  # stored in float32, as a float32 model's
        setattr(layer, name, p.astype(np.float32))
    x = np.random.default_rng(0).normal(size=(n, d_model)).astype(np.float32)
    weights_bytes = h * n * n * 4
    lean = peak_extra_bytes(lambda: lean_forward(layer, x))
    readable = peak_extra_bytes(lambda: layer(x))
    assert lean <= 1.25 * weights_bytes + lean_module.BLOCK_BYTES, lean / weights_bytes
    assert lean < readable


@pytest.mark.parametrize("mask_shape", [None, (7,), (50, 7), (3, 1, 7), (3, 50, 7), (1, 50, 1)])
@pytest.mark.parametrize("block_bytes", [1, 400, 1000, 10**9])  # rows per block: 1, 2, 5, all
def test_large_arrays_done_in_blocks_of_rows_equal_the_whole_array(rng, monkeypatch,
                                                                    mask_shape, block_bytes):
    """lean.softmax_rows normalises an array larger than 4 * SOFTMAX_BLOCK_BYTES a block of rows
    at a time (for the cache): every block size and mask shape gives the whole-array result,
    shifted or not."""
    x = rng.normal(size=(3, 50, 7)) * 20  # a row of all leading axes: 3·7·8 = 168 bytes
    mask = None if mask_shape is None else rng.random(mask_shape) < 0.6
    want = softmax(x, mask=mask)  # small: one block
    monkeypatch.setattr(lean_module, "SOFTMAX_BLOCK_BYTES", block_bytes)
    got = lean_module.softmax_rows(x.copy(), mask=mask)
    np.testing.assert_array_equal(got, want)
    assert not np.isnan(got).any()
    unshifted = lean_module.softmax_rows(x.copy() / 20, mask=mask, shift=False)
    np.testing.assert_allclose(unshifted, softmax(x / 20, mask=mask), rtol=1e-12, atol=1e-300)
