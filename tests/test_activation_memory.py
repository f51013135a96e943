"""The activation-memory formulas: Korthikanti et al.'s per-layer attention terms, each
parallelism and recomputation setting, and the package's own layer measured against the same
kind of formula (what its backward pass saves, per device, under tensor parallelism).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_course import MultiHeadAttention
from mha_course.parallel.memory import attention_activation_bytes
from mha_course.parallel.tensor import TensorParallelAttention

S, B, H, A = 2048, 1, 12288, 96  # GPT-3 175B's width and heads, the paper's running example


def test_the_papers_attention_terms():
    m = attention_activation_bytes(S, B, H, A)
    sbh, as2b = S * B * H, A * S * S * B
    assert m["total"] == 11 * sbh + 5 * as2b
    assert m["softmax output"] + m["softmax dropout mask"] + m["softmax dropout output"] == 5 * as2b


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_tensor_and_sequence_parallelism_and_selective_recomputation(t):
    sbh, as2b = S * B * H, A * S * S * B
    tp = attention_activation_bytes(S, B, H, A, t=t)["total"]
    assert tp == 3 * sbh + (8 * sbh + 5 * as2b) // t  # the input and a mask stay replicated
    sp = attention_activation_bytes(S, B, H, A, t=t, sequence_parallel=True)["total"]
    assert sp == (11 * sbh + 5 * as2b) // t
    sel = attention_activation_bytes(S, B, H, A, t=t, sequence_parallel=True,
                                     recompute="selective")["total"]
    assert sel == 11 * sbh // t


def test_flash_keeps_a_log_sum_exp_and_full_recomputation_the_input():
    flash = attention_activation_bytes(S, B, H, A, recompute="flash", dropout=False)
    assert flash["log-sum-exp (float32)"] == 4 * A * S * B
    assert flash["total"] == 10 * S * B * H + 4 * A * S * B
    assert attention_activation_bytes(S, B, H, A, recompute="full")["total"] == 2 * S * B * H


@given(c=st.sampled_from([1, 2, 4, 8]), g=st.sampled_from([8, 32, 96]))
def test_context_parallelism_divides_every_term_and_gqa_shrinks_k_and_v(c, g):
    one = attention_activation_bytes(S, B, H, A, g=g)
    split = attention_activation_bytes(S, B, H, A, g=g, c=c)
    assert split["total"] == sum(n // c for k, n in one.items() if k != "total")
    assert one["V"] == 2 * S * B * H * g // A


def test_the_package_layers_saved_activations_per_device_under_tensor_parallelism():
    """Our layer saves x, q, k, v, the weights and the concatenated heads (float64 here, no
    dropout): x is replicated on every device, the rest is split by heads."""
    d_model, h, g, T, b = 32, 8, 2, 12, 3
    layer = MultiHeadAttention(d_model, h, n_kv_heads=g, rng=0)
    x = np.random.default_rng(0).normal(size=(b, T, d_model))
    for t in (1, 2, 4, 8):
        tp = TensorParallelAttention(layer, t)
        d_k = d_model // h
        for shard in tp.shards:
            _, saved = shard.forward(x, return_cache=True)
            stored = sum(a.nbytes for a in (saved.x, saved.q, saved.k, saved.v, saved.weights,
                                            saved.concat))
            g_local = max(g // t, 1)
            want = 8 * (b * T * d_model                      # x, replicated
                        + b * T * (h // t) * d_k * 2         # q and the concatenated heads
                        + b * T * g_local * d_k * 2          # k and v
                        + b * (h // t) * T * T)              # the weights
            assert stored == want


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match=r"attention_activation_bytes: t=5 must divide a=96"):
        attention_activation_bytes(S, B, H, A, t=5)
    with pytest.raises(ValueError, match=r"recompute='some'"):
        attention_activation_bytes(S, B, H, A, recompute="some")
