"""Low precision: the formats' parameters from their dtypes, rounding to nearest, the simulated
accumulators, FP8 quantisation with per-tensor and per-block scales, the Hadamard rotation that
leaves q kᵀ unchanged, and the measured effects the lesson reports (the directions, not
frozen numbers).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_course import scaled_dot_product_attention
from mha_course.parallel.precision import (
    FORMATS,
    attention_steps,
    block_quantize,
    format_info,
    fp8_attention,
    hadamard,
    matmul_accumulate,
    random_hadamard,
    round_to,
    sequential_sum,
)


def test_format_parameters_come_from_the_dtypes():
    assert format_info("bfloat16")["mantissa_bits"] == 7
    assert format_info("bfloat16")["exponent_bits"] == 8
    assert format_info("float16")["max"] == 65504.0
    assert format_info("float8_e4m3fn")["max"] == 448.0
    assert format_info("float8_e5m2")["max"] == 57344.0
    for name in FORMATS:
        info = format_info(name)
        assert info["eps"] == 2.0 ** -info["mantissa_bits"]
        assert info["bits"] == 1 + info["exponent_bits"] + info["mantissa_bits"]


@given(x=st.floats(-400, 400, allow_nan=False), fmt=st.sampled_from(list(FORMATS)[1:]))
def test_round_to_is_within_half_an_ulp(x, fmt):
    got = float(round_to(np.array([x]), fmt)[0])
    eps = format_info(fmt)["eps"]
    tiny = format_info(fmt)["smallest_normal"]
    assert abs(got - x) <= max(abs(x) * eps / 2, tiny * eps) * (1 + 1e-12) or abs(x) > 400


def test_saturation_and_overflow():
    assert round_to(np.array([1e6]), "float16").tolist() == [np.inf]
    assert np.isnan(round_to(np.array([1e6]), "float8_e4m3fn")[0])  # e4m3fn has no infinity
    assert round_to(np.array([1e6, -1e6]), "float8_e4m3fn", saturate=True).tolist() == [448, -448]


def test_an_accumulator_in_bfloat16_stops_growing():
    """Adding 1 to 256 in bfloat16 gives 256: 8 significant bits."""
    ones = np.ones(1000)
    assert sequential_sum(ones, "float32").tolist() == 1000.0
    assert sequential_sum(ones, "bfloat16").tolist() == 256.0
    assert sequential_sum(ones, "float16").tolist() == 1000.0  # 11 bits: exact up to 2048
    assert sequential_sum(np.ones(3000), "float16").tolist() == 2048.0


def test_matmul_accumulate_in_float32_matches_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 3, 16)), rng.normal(size=(2, 16, 5))
    np.testing.assert_allclose(matmul_accumulate(a, b, "float32"), a @ b, rtol=1e-5, atol=1e-5)
    assert matmul_accumulate(a, b, "bfloat16").shape == (2, 3, 5)


def test_each_low_precision_step_costs_and_float32_everywhere_does_not():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(16, 32)) * 2, rng.normal(size=(512, 32)), rng.normal(size=(512, 8))
    ref = scaled_dot_product_attention(q, k, v)[0]

    def err(out):
        return np.linalg.norm(out - ref) / np.linalg.norm(ref)

    assert err(attention_steps(q, k, v)) < 1e-5
    errors = {step: err(attention_steps(q, k, v, **{step: "bfloat16"}))
              for step in ("scores_acc", "scores_store", "softmax_sum", "weights_store",
                           "out_acc")}
    assert all(e > 1e-4 for e in errors.values())
    # the weights, numbers in [0, 1] fed to a float32 accumulator, are the cheapest to narrow;
    # the softmax's denominator, a long sum of small terms, the most expensive
    assert min(errors, key=errors.get) == "weights_store"
    assert max(errors, key=errors.get) == "softmax_sum"


def test_float16_overflows_on_unscaled_scores_and_not_on_prescaled_queries():
    rng = np.random.default_rng(2)
    q, k = rng.normal(30, 5, size=(8, 128)), rng.normal(30, 5, size=(8, 128))  # q·k ~ 115,000
    q16, k16 = q.astype(np.float16), k.astype(np.float16)
    with np.errstate(over="ignore"):
        unscaled = (q16 @ k16.T) / np.float16(np.sqrt(128))
    prescaled = (q16 * np.float16(1 / np.sqrt(128))) @ k16.T
    assert not np.isfinite(unscaled).all()
    assert np.isfinite(prescaled).all()


def test_hadamard_is_orthogonal_and_keeps_the_scores():
    for d in (1, 2, 8, 64):
        H = hadamard(d)
        np.testing.assert_allclose(H @ H.T, np.eye(d), atol=1e-12)
    M = random_hadamard(16, rng=3)
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(4, 16)), rng.normal(size=(5, 16))
    np.testing.assert_allclose((q @ M) @ (k @ M).T, q @ k.T, atol=1e-12)
    with pytest.raises(ValueError, match=r"hadamard: d=12 is not a power of two"):
        hadamard(12)


def test_per_block_scales_keep_small_blocks_that_a_tensor_scale_flushes():
    x = np.vstack([np.full((4, 2), 1e-3), np.full((4, 2), 1e3)])
    assert (block_quantize(x, block=None)[:4] == 0).all()
    np.testing.assert_allclose(block_quantize(x, block=4)[:4], 1e-3, rtol=0.07)


def test_incoherent_processing_reduces_the_fp8_error_on_outlier_channels():
    rng = np.random.default_rng(4)
    T, d = 128, 64
    q, k, v = rng.normal(size=(T, d)), rng.normal(size=(T, d)), rng.normal(size=(T, d))
    q[:, [3, 40]] *= 20
    k[:, [3, 40]] *= 20
    q, k = q / 4, k / 4
    ref = scaled_dot_product_attention(q, k, v)[0]

    def rmse(out):
        return float(np.sqrt(np.mean((out - ref) ** 2)))

    plain = rmse(fp8_attention(q, k, v))
    rotated = rmse(fp8_attention(q, k, v, rotate=random_hadamard(d, rng=5)))
    assert rotated < plain / 1.5


def test_bad_formats_are_refused_by_name():
    with pytest.raises(ValueError, match=r"precision: format 'int8'; expected one of float64"):
        round_to(np.zeros(2), "int8")
    with pytest.raises(ValueError, match=r"round_to: x has dtype int64"):
        round_to(np.arange(3), "float16")
