"""Real models' configurations (``mha_course.cost``) and the cache sizes computed from
them, against the figures the models' papers and cards publish."""

from __future__ import annotations

import math

import pytest

from mha_course import kv_cache_bytes, mla_cache_bytes
from mha_course.cost import (
    MODELS,
    cache_bytes,
    head_dim,
    is_mla,
    layer_windows,
    mla_layer_options,
    values_per_layer_token,
)
from mha_course.variants.rope_scaling import mla_softmax_scale

KIB, MIB, GIB = 2**10, 2**20, 2**30

# Published or directly derivable figures, bf16, per token (batch 1) and where they come from.
PER_TOKEN = {
    "Llama 3 8B": 128 * KIB,  # 32 layers · 8 KV heads · 128 · 2 (K, V) · 2 bytes
    "Llama 3 70B": 320 * KIB,  # 80 · 8 · 128 · 2 · 2
    "Mistral 7B v0.1": 128 * KIB,  # 32 · 8 · 128 · 2 · 2, until the 4096-token window fills
    "DeepSeek-V2": 60 * 576 * 2,  # 576 cached values per layer (512 latent + 64 RoPE key)
    "DeepSeek-V3": 61 * 576 * 2,
    "gpt-oss-120b": 36 * 2 * 8 * 64 * 2,  # every layer, until the 128-token windows fill
}


@pytest.mark.parametrize("name", list(MODELS))
def test_bytes_of_the_first_token_match_the_published_figures(name):
    assert cache_bytes(MODELS[name], seq_len=1) == PER_TOKEN[name]


def test_full_attention_models_grow_linearly():
    for name in ("Llama 3 8B", "Llama 3 70B", "DeepSeek-V2", "DeepSeek-V3"):
        assert cache_bytes(MODELS[name], 131072) == 131072 * PER_TOKEN[name]
    assert cache_bytes(MODELS["Llama 3 70B"], 8192) == 2.5 * GIB
    assert cache_bytes(MODELS["Llama 3 70B"], 131072) == 40 * GIB
    assert cache_bytes(MODELS["Llama 3 8B"], 8192) == 1 * GIB


def test_mistral_v0_1_stops_growing_at_its_window():
    mistral = MODELS["Mistral 7B v0.1"]
    assert layer_windows(mistral) == [4096] * 32
    assert cache_bytes(mistral, 4096) == 512 * MIB == cache_bytes(mistral, 131072)
    assert cache_bytes(mistral, 2048) == 256 * MIB


def test_gpt_oss_windows_every_other_layer():
    oss = MODELS["gpt-oss-120b"]
    windows = layer_windows(oss)
    assert windows == [128, None] * 18
    per_layer_token = 2 * 8 * 64 * 2
    assert cache_bytes(oss, 8192) == 18 * per_layer_token * (8192 + 128)
    assert cache_bytes(oss, 131072) == 18 * per_layer_token * (131072 + 128)


def test_head_dim_defaults_to_hidden_size_over_heads():
    assert head_dim(MODELS["Llama 3 70B"]) == 8192 // 64 == 128
    assert head_dim({"head_dim": 64, "hidden_size": 2880, "num_attention_heads": 64}) == 64


def test_mla_configs_are_recognised_and_counted_without_heads():
    assert is_mla(MODELS["DeepSeek-V2"]) and not is_mla(MODELS["Llama 3 8B"])
    assert values_per_layer_token(MODELS["DeepSeek-V2"]) == 576
    assert cache_bytes(MODELS["DeepSeek-V2"], 1000, batch=3, bytes_per_value=1) == (
        mla_cache_bytes(60, 512, 64, 1000, batch=3, bytes_per_value=1))


def test_batch_and_dtype_scale_every_model():
    for config in MODELS.values():
        one = cache_bytes(config, 8192)
        assert cache_bytes(config, 8192, batch=4, bytes_per_value=4) == 8 * one


def test_gqa_saving_of_llama_3_70b_is_h_over_g():
    cfg = MODELS["Llama 3 70B"]
    as_mha = kv_cache_bytes(80, cfg["num_attention_heads"], 128, 8192)
    assert as_mha / cache_bytes(cfg, 8192) == cfg["num_attention_heads"] / 8 == 8


def test_every_config_names_its_source():
    for name, config in MODELS.items():
        assert "config.json" in config["source"], name


@pytest.mark.parametrize("config, message", [
    ({"num_hidden_layers": 2}, "cache_bytes: config has no 'num_key_value_heads'"),
    ({"num_hidden_layers": 0, "num_key_value_heads": 1, "head_dim": 4},
     "layer_windows: config['num_hidden_layers']=0 must be an integer >= 1"),
])
def test_incomplete_configs_are_named_errors(config, message):
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        cache_bytes(config, 8)


@pytest.mark.parametrize("name, mscale_all_dim", [("DeepSeek-V2", 0.707), ("DeepSeek-V3", 1.0)])
def test_deepseek_configs_give_the_layer_its_norm_eps_and_yarn_scale(name, mscale_all_dim):
    opts = mla_layer_options(MODELS[name])
    assert (opts["d_c"], opts["d_rope"], opts["d_k"], opts["d_v"], opts["d_cq"]) == (
        512, 64, 128, 128, 1536)
    assert opts["eps"] == 1e-6 and opts["rope_base"] == 10000.0
    assert opts["rope_scaling"]["factor"] == 40
    assert opts["rope_scaling"]["mscale_all_dim"] == mscale_all_dim
    # 0.1 · mscale_all_dim · ln(40) + 1, squared, on 1/sqrt(128 + 64)
    m = 0.1 * mscale_all_dim * math.log(40) + 1
    assert mla_softmax_scale(192, opts["rope_scaling"]) == pytest.approx(m * m / math.sqrt(192),
                                                                         rel=1e-15)


def test_mla_layer_options_refuses_a_config_without_a_latent():
    with pytest.raises(ValueError, match=r"^mla_layer_options: config has no 'kv_lora_rank'; "
                                         r"expected an MLA config"):
        mla_layer_options(MODELS["Llama 3 8B"])
