"""Deep dive 10d's equivalences and figures, recomputed: the cache a disaggregated request ships,
the interference of a prefill chunk, the reload-or-recompute crossover in closed form against a
brute-force search, MLA's cache under tensor and data parallelism, and MTP as a one-token draft.
(§3, the radix tree, is tested in ``test_serving_radix_cache.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.cost import MODELS, cache_bytes, head_dim, kv_cache_bytes, mla_cache_bytes
from mha_course.serving.roofline import (
    GPUS,
    decode_step_cost,
    model_sizes,
    prefill_cost,
    roofline_time,
)
from mha_course.serving.speculative import expected_tokens_per_round, improvement_factor

H100 = GPUS["H100 SXM"]
TP8 = {"flops_per_s": 8 * H100["flops_per_s"], "bytes_per_s": 8 * H100["bytes_per_s"]}
LLAMA70, LLAMA8, V3 = MODELS["Llama 3 70B"], MODELS["Llama 3 8B"], MODELS["DeepSeek-V3"]


# ----------------------------------------------------------------- §1 disaggregation
def test_the_cache_a_request_ships_and_the_two_rooflines():
    L, g, d = LLAMA70["num_hidden_layers"], LLAMA70["num_key_value_heads"], head_dim(LLAMA70)
    assert 2 * L * g * d * 4096 * 2 == cache_bytes(LLAMA70, 4096) == 1_342_177_280
    balance = H100["flops_per_s"] / H100["bytes_per_s"]
    assert prefill_cost(LLAMA70, 4096)["intensity"] > balance
    assert decode_step_cost(LLAMA70, 64, 4096)["intensity"] < balance


@pytest.mark.parametrize("T", [1024, 4096, 16384, 65536])
def test_the_send_is_shorter_than_the_prefill_on_every_link(T):
    t_pre = roofline_time(prefill_cost(LLAMA70, T), TP8)["time_s"]
    kv = cache_bytes(LLAMA70, T)
    assert kv / 50e9 < t_pre  # one 400 Gb/s NIC
    assert kv / 400e9 < 0.05 * t_pre and kv / 450e9 < 0.05 * t_pre  # 8 NICs, NVLink


def test_a_small_chunk_rides_free_and_a_whole_prompt_stalls_every_decoder():
    dec = decode_step_cost(LLAMA70, 64, 4096)
    alone = roofline_time(dec, TP8)["time_s"]

    def mixed(chunk):
        extra = prefill_cost(LLAMA70, chunk)
        return roofline_time({"flops": dec["flops"] + extra["flops"],
                              "bytes": dec["bytes"] + extra["cache_bytes"]}, TP8)

    assert mixed(256)["bound"] == "memory" and mixed(256)["time_s"] < 1.001 * alone
    assert mixed(512)["bound"] == "compute" and mixed(512)["time_s"] > 1.2 * alone
    assert mixed(4096)["time_s"] > 9 * alone


# ----------------------------------------------------------------- §2 reload or recompute
def _closed_form(config, link):
    kv = cache_bytes(config, 1)
    excess = kv * H100["flops_per_s"] / link - 2 * model_sizes(config)["matmul"]
    per_pair = 2 * config["num_hidden_layers"] * config["num_attention_heads"] * head_dim(config)
    return 1 if excess < 0 else int(excess // per_pair)


def _reload_wins(config, T, link):
    return (cache_bytes(config, T) / link
            < prefill_cost(config, T)["flops"] / H100["flops_per_s"])


@pytest.mark.parametrize("name, link, want", [("Llama 3 8B", 7.45e9, 9119),
                                              ("Llama 3 8B", 2e9, 189_994),
                                              ("Llama 3 8B", 63e9, 1),
                                              ("Llama 3 70B", 7.45e9, 1)])
def test_the_crossover_in_closed_form_is_the_first_length_that_reloads_faster(name, link, want):
    config = MODELS[name]
    T = _closed_form(config, link)
    assert T == want
    assert _reload_wins(config, T, link) and (T == 1 or not _reload_wins(config, T - 1, link))
    assert all(_reload_wins(config, t, link) for t in (T + 1, 2 * T, 10 * T))  # and stays


def test_pcie5_x16_bandwidth():
    assert round(32e9 * 16 * (128 / 130) / 8 / 1e9, 1) == 63.0


# ----------------------------------------------------------------- §4 DP attention for MLA
def test_mla_keeps_the_whole_cache_on_every_tp_rank_and_gqa_an_eighth():
    per_token = mla_cache_bytes(61, 512, 64, 1)
    assert per_token == 61 * 576 * 2 == cache_bytes(V3, 1) == 70_272
    total = cache_bytes(V3, 32768, batch=64)
    assert cache_bytes(V3, 32768, batch=8) * 8 == total  # DP-8: an eighth of the sequences
    L, g, d = LLAMA70["num_hidden_layers"], LLAMA70["num_key_value_heads"], head_dim(LLAMA70)
    assert kv_cache_bytes(L, g // 8, d, 32768, 64) * 8 == cache_bytes(LLAMA70, 32768, batch=64)


def test_dp_attention_breaks_even_where_the_cache_outweighs_the_attention_weights():
    d, h = V3["hidden_size"], V3["num_attention_heads"]
    qk = V3["qk_nope_head_dim"] + V3["qk_rope_head_dim"]
    attn = V3["num_hidden_layers"] * (
        d * V3["q_lora_rank"] + V3["q_lora_rank"] * h * qk
        + d * (V3["kv_lora_rank"] + V3["qk_rope_head_dim"])
        + V3["kv_lora_rank"] * h * (V3["qk_nope_head_dim"] + V3["v_head_dim"])
        + h * V3["v_head_dim"] * d)
    assert round(attn / 1e9, 2) == 11.41
    even = attn / cache_bytes(V3, 1)  # FP8 weights: one byte a parameter
    assert round(even) == 162_418  # the notebook prints it rounded
    for context in (int(even) // 8 - 2, int(even) // 8 + 2):  # 8 sequences, around the even
        tp = cache_bytes(V3, context, batch=8) + attn / 8  # every rank: all 8 sequences
        dp = cache_bytes(V3, context, batch=1) + attn  # one sequence a rank, all the weights
        assert (dp < tp) == (8 * context > even)
    assert {8 * c > even for c in (int(even) // 8 - 2, int(even) // 8 + 2)} == {True, False}


# ----------------------------------------------------------------- §5 MTP as a draft
@pytest.mark.parametrize("alpha", [0.85, 0.90])
def test_a_one_token_draft_emits_one_plus_alpha_and_mtp_bounds_the_speedup(alpha):
    assert np.isclose(alpha * 2 + (1 - alpha), expected_tokens_per_round(alpha, 1))
    simulated = 1 + (np.random.default_rng(5).random(200_000) < alpha).mean()
    assert abs(simulated - (1 + alpha)) < 0.01
    bound = improvement_factor(alpha, 1, 1 / 61)
    assert 1.8 < bound < 1 + alpha
