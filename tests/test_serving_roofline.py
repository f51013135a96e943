"""What a token costs: the counts of a decode step and a prefill, by hand, and their roofline."""

from __future__ import annotations

import pytest

from mha_course.cost import MODELS
from mha_course.serving.roofline import (
    GPUS,
    critical_batch,
    decode_step_cost,
    fit_step_time,
    model_sizes,
    prefill_cost,
    roofline_time,
)

LLAMA70 = MODELS["Llama 3 70B"]
H100 = GPUS["H100 SXM"]


def test_llama_parameter_counts_from_their_configs():
    assert model_sizes(MODELS["Llama 3 8B"])["total"] == 8_030_261_248
    sizes = model_sizes(LLAMA70)
    assert sizes["total"] == 70_553_706_496
    d, L = 8192, 80
    assert sizes["attention"] == d * 64 * 128 + 2 * d * 8 * 128 + 64 * 128 * d  # GQA: 8 K/V heads
    assert sizes["matmul"] == L * (sizes["attention"] + 3 * d * 28672) + 128256 * d


def test_a_decode_step_counted_by_hand():
    c = decode_step_cost(LLAMA70, batch=64, context=32768)
    matmul = model_sizes(LLAMA70)["matmul"]
    assert c["weight_flops"] == 2 * matmul * 64
    assert c["attention_flops"] == 4 * 80 * 64 * 128 * 32768 * 64
    assert c["cache_bytes"] == 2 * 80 * 8 * 128 * 32768 * 64 * 2  # K and V, bf16
    assert c["weight_bytes"] == (matmul + 80 * 2 * 8192 + 8192) * 2  # no embedding table
    t = roofline_time(c, H100)
    assert t["bound"] == "memory" and t["time_s"] == pytest.approx(c["bytes"] / 3.35e12)


def test_batching_raises_intensity_until_the_cache_dominates():
    short = [decode_step_cost(LLAMA70, b, 128)["intensity"] for b in (1, 8, 64, 512)]
    assert short == sorted(short) and short[0] < 2
    long = decode_step_cost(LLAMA70, 1 << 20, 32768)["intensity"]
    one = decode_step_cost(LLAMA70, 1, 32768)
    limit = one["flops"] / one["cache_bytes"]  # the weights' bytes shared by an endless batch
    assert long == pytest.approx(limit, rel=1e-3) and limit < 25
    assert critical_batch(LLAMA70, 32768, H100) is None
    b = critical_batch(LLAMA70, 128, H100)
    balance = H100["flops_per_s"] / H100["bytes_per_s"]
    assert decode_step_cost(LLAMA70, b, 128)["intensity"] >= balance
    assert decode_step_cost(LLAMA70, b - 1, 128)["intensity"] < balance


def test_prefill_is_compute_bound_and_decode_memory_bound():
    assert roofline_time(prefill_cost(LLAMA70, 4096), H100)["bound"] == "compute"
    assert roofline_time(decode_step_cost(LLAMA70, 1, 4096), H100)["bound"] == "memory"


def test_fit_step_time_recovers_a_line_and_refuses_too_few_points():
    fit = fit_step_time([1, 4, 16, 64], [2.0 + 0.5 * b for b in (1, 4, 16, 64)])
    assert fit["fixed"] == pytest.approx(2.0) and fit["crossover"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="fit_step_time: batches and seconds"):
        fit_step_time([1], [1.0])
    with pytest.raises(ValueError, match=r"model_sizes: config has no \['intermediate_size'"):
        model_sizes(MODELS["Mistral 7B v0.1"])
