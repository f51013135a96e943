"""Deep dive 14c, rapid questions past the core (Q60 onward): the claims its self-checks assert,
recomputed here from the package and the cited configs, independently of the notebook; and the
shape of the notebook itself (every self-check asserts before it prints).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from mha_course import (
    MultiHeadAttention,
    MultiHeadLatentAttention,
    apply_rope,
    attention_flops,
    causal_mask,
    kv_cache_bytes,
    merge_heads,
    mla_cache_bytes,
    rms_norm,
    scaled_dot_product_attention,
    sliding_window_mask,
    softmax,
    split_heads,
    tiled_attention,
)
from mha_course.backward import attention_backward
from mha_course.cost import MODELS, cache_bytes, head_dim
from mha_course.models import shakespeare
from mha_course.serving.roofline import GPUS, decode_step_cost, prefill_cost
from mha_course.serving.speculative import expected_tokens_per_round, improvement_factor
from mha_course.variants.delta_rule import delta_rule
from mha_course.variants.ssd import ssd_chunked, ssd_flops, ssd_quadratic, ssd_recurrent

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "deep_dives" / "14c_rapid_questions_past_the_core.ipynb"
H100 = GPUS["H100 SXM"]
GIB = 2**30


def test_every_self_check_asserts_its_claims_and_every_question_has_one():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    asked = [int(n) for n in re.findall(r"(?m)^\*\*Q(\d+)\. ", text)]
    assert asked == list(range(60, 60 + len(asked))) and len(asked) >= 15
    checked = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and "self-check" in cell.source:
            assert "assert" in cell.source, "a self-check that only prints"
            printed = "".join(o.get("text", "") for o in cell.outputs)
            checked |= {int(n) for n in re.findall(r"Q(\d+) self-check: ", printed)}
    assert checked == set(asked), f"questions without a self-check: {set(asked) - checked}"


# ------------------------------------------------------------------ 05c: attention beyond text
def test_vit_b16_tokens_and_the_patch_embedding_as_a_strided_convolution():
    side, P, C, d = 224, 16, 3, 768  # google/vit-base-patch16-224 config.json
    assert (side // P) ** 2 + 1 == 197 and C * P * P * d + d == 590_592
    assert round(((384 // P) ** 2 + 1) ** 2 / 197**2, 2) == 8.58
    rng = np.random.default_rng(0)
    img, W_e = rng.normal(size=(3, 8, 12)), rng.normal(size=(48, 5))
    patches = img.reshape(3, 2, 4, 3, 4).transpose(1, 3, 0, 2, 4).reshape(6, 48)
    kernel = W_e.T.reshape(5, 3, 4, 4)  # the Conv2d weight (d, C, P, P)
    conv = [np.einsum("dcuv,cuv->d", kernel, img[:, 4 * r:4 * r + 4, 4 * c:4 * c + 4])
            for r in range(2) for c in range(3)]
    np.testing.assert_allclose(np.array(conv), patches @ W_e, atol=1e-12)
    layer, cls = MultiHeadAttention(5, 1, rng=1), rng.normal(size=(1, 5))
    tokens = patches @ W_e
    shuffled = tokens[rng.permutation(6)]
    np.testing.assert_allclose(layer(np.vstack([cls, shuffled]))[0][0],
                               layer(np.vstack([cls, tokens]))[0][0], atol=1e-12)


def test_a_text_rope_on_the_raster_index_merges_2d_offsets_and_m_rope_on_text_is_rope():
    g_h, g_w = 6, 8
    rows, cols = np.divmod(np.arange(g_h * g_w), g_w)
    dr, dc = rows[None] - rows[:, None], cols[None] - cols[:, None]
    assert len(set(zip(dr.ravel(), dc.ravel(), strict=True))) == 165
    assert len(set((dr * g_w + dc).ravel())) == 95
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(2, 32))

    def one_d(r, c):
        return np.array([r * g_w + c])

    right = apply_rope(q[None], one_d(2, 3))[0] @ apply_rope(k[None], one_d(2, 4))[0]
    wrap = apply_rope(q[None], one_d(2, 7))[0] @ apply_rope(k[None], one_d(3, 0))[0]
    assert np.isclose(right, wrap)  # Δp = 1 both: a row's end is "next to" the next row's start
    theta = 1e6 ** (-2 * np.arange(64) / 128)
    x, p = rng.normal(size=(9, 128)), np.arange(9)
    angles = np.stack([p] * 3)[np.repeat([0, 1, 2], (16, 24, 24))].T * theta  # M-RoPE, text
    a, b = x[:, :64], x[:, 64:]
    mrope = np.concatenate([a * np.cos(angles) - b * np.sin(angles),
                            a * np.sin(angles) + b * np.cos(angles)], axis=-1)
    np.testing.assert_allclose(mrope, apply_rope(x, p, base=1e6), atol=1e-12)
    assert (1344 // 28, (1344 // 28) ** 2) == (48, 2304)


def test_cross_attention_keys_and_values_once_per_input_and_whisper_bytes():
    layer, rng = MultiHeadAttention(16, 2, rng=3), np.random.default_rng(3)
    enc = rng.normal(size=(10, 16))
    k, v = split_heads(enc @ layer.W_k, 2), split_heads(enc @ layer.W_v, 2)
    for y in rng.normal(size=(3, 1, 16)):
        heads = scaled_dot_product_attention(split_heads(y @ layer.W_q, 2), k, v)[0]
        np.testing.assert_allclose(merge_heads(heads) @ layer.W_o, layer(y, context=enc)[0],
                                   atol=1e-12)
    cross, per_token = kv_cache_bytes(32, 20, 64, 1500), kv_cache_bytes(32, 20, 64, 1)
    assert (cross, per_token, 448 * per_token) == (245_760_000, 163_840, 73_400_320)
    assert round(cross / (cross + 448 * per_token), 2) == 0.77


# --------------------------------------------------------------- 06c: model-family layouts
GEMMA3_27B = {"num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
              "head_dim": 128, "sliding_window": 1024,
              "layer_types": ("sliding_attention",) * 5 + ("full_attention",)}


def test_gemma3_cache_five_local_to_one_global():
    n = 131_072
    per_layer = 2 * 16 * 128 * 2
    gemma = cache_bytes(GEMMA3_27B, n)
    assert gemma == per_layer * (10 * n + 52 * 1024)
    everything = cache_bytes({k: v for k, v in GEMMA3_27B.items() if k != "sliding_window"}, n)
    assert (round(gemma / GIB, 2), everything / GIB, round(everything / gemma, 1)) == (
        10.41, 62.0, 6.0)
    assert cache_bytes(GEMMA3_27B, n + 1) - gemma == 80 * 1024


def test_a_chunk_at_its_boundary_and_a_chunked_stack_never_crosses_it():
    C = 8192
    t = C  # the first query of chunk 1
    s = np.arange(t + 1)
    assert (s // C == t // C).sum() == 1 and (s > t - C).sum() == C
    assert np.mean([(np.arange(u + 1) // C == u // C).sum() for u in range(C, 2 * C)]) == (
        (C + 1) / 2)
    T, size = 24, 4
    tq, sk = np.arange(T)[:, None], np.arange(T)[None, :]
    masks = {"window": sliding_window_mask(T, size),
             "chunk": (sk <= tq) & (sk // size == tq // size)}
    layers = [MultiHeadAttention(16, 4, rng=i) for i in range(4)]
    x = np.random.default_rng(4).normal(size=(T, 16))
    x2 = x.copy()
    x2[0] += 1.0
    for rule, mask in masks.items():
        a, b = x, x2
        for layer in layers:
            a, b = a + layer(a, mask=mask)[0], b + layer(b, mask=mask)[0]
        reach = int(np.flatnonzero(np.abs(a - b).max(axis=-1) > 1e-12).max())
        assert reach == (12 if rule == "window" else 3), rule


def test_nope_one_causal_layer_sees_a_bag_two_layers_see_the_order():
    first, second = MultiHeadAttention(8, 2, rng=5), MultiHeadAttention(8, 2, rng=6)
    x = np.random.default_rng(5).normal(size=(6, 8))
    perm = np.r_[[3, 0, 4, 1, 2], 5]
    mask = causal_mask(6)

    def stack(z, n_layers):  # the last token's output after 1 or 2 residual NoPE layers
        for layer in (first, second)[:n_layers]:
            z = z + layer(z, mask=mask)[0]
        return z[5]

    np.testing.assert_allclose(stack(x[perm], 1), stack(x, 1), atol=1e-12)
    assert not np.allclose(stack(x[perm], 2), stack(x, 2))
    w = first(np.ones((6, 8)), mask=mask)[1][0]
    np.testing.assert_allclose(w[5], 1 / 6)
    assert sum((i + 1) % 4 == 0 for i in range(48)) == 12  # Llama 4 Scout's NoPE layers


def test_cla2_and_yoco_caches_on_llama_3_8b_shape():
    llama8, n = MODELS["Llama 3 8B"], 131_072
    shipped = cache_bytes(llama8, n)
    cla2 = cache_bytes({**llama8, "num_hidden_layers": 16}, n)
    yoco = cache_bytes({**llama8, "num_hidden_layers": 17, "sliding_window": 1024,
                        "layer_types": ("sliding_attention",) * 16 + ("full_attention",)}, n)
    assert (shipped / GIB, cla2 / GIB, yoco / GIB) == (16.0, 8.0, 0.5625)
    assert round(shipped / yoco, 1) == 28.4 and yoco == 4096 * (n + 16 * 1024)


# -------------------------------------------------------------------- 07c: Triton kernels
def test_one_program_per_query_block_and_head_with_gqa_by_address():
    rng = np.random.default_rng(7)
    h, g, T, d, B = 4, 2, 64, 16, 16
    q, k, v = rng.normal(size=(h, T, d)), rng.normal(size=(g, T, d)), rng.normal(size=(g, T, d))
    out, visits = np.zeros_like(q), []
    for i in range(h):
        for t0 in range(0, T, B):
            seen = []
            out[i, t0:t0 + B] = tiled_attention(q[i, t0:t0 + B], k[i // 2, :t0 + B],
                                                v[i // 2, :t0 + B], causal=True, block_size=B,
                                                on_tile=lambda tile, s=seen: s.append(tile))
            visits.append(len(seen))
    ref = scaled_dot_product_attention(q, np.repeat(k, 2, axis=0), np.repeat(v, 2, axis=0),
                                       mask=causal_mask(T))[0]
    np.testing.assert_allclose(out, ref, atol=1e-12)
    assert visits[:4] == [1, 2, 3, 4] and sum(visits) == 4 * 10


def _flash_values(N, d, B_m):
    return 2 * N * d + N + 2 * (N // B_m) * N * d


def test_flash_and_standard_bytes_at_8192_and_the_h100_ridge():
    N, d, B_m = 8192, 128, 128
    flops = 4 * N * N * d
    standard, flash, once = 2 * (4 * N * N + 4 * N * d), 2 * _flash_values(N, d, B_m), 2 * (
        4 * N * d + N)
    assert (round(standard / 1e6, 1), round(flash / 1e6, 1), round(once / 1e6, 1)) == (
        545.3, 272.6, 8.4)
    ridge = H100["flops_per_s"] / H100["bytes_per_s"]
    assert round(ridge) == 295 and flops / standard < flops / flash < ridge < flops / once


def test_the_flash_closed_form_is_the_kernels_count():
    try:  # the byte formulas without the kernels extra, where the package has them apart
        counts = importlib.import_module("mha_course.kernels.traffic")
    except ImportError:
        counts = pytest.importorskip("mha_course.kernels.triton_flash")  # needs triton, torch
    for N, d, B_m in ((8192, 128, 128), (256, 16, 32)):
        assert counts.flash_forward_bytes(1, 1, 1, N, N, d, block_m=B_m, block_n=64,
                                          itemsize=2) == 2 * _flash_values(N, d, B_m)
        assert counts.standard_attention_bytes(1, 1, 1, N, N, d, block_m=B_m, block_n=64,
                                               itemsize=2) >= 2 * (4 * N * N + 4 * N * d)


# -------------------------------------------------------------------- 09c: heads as circuits
def test_the_ov_circuits_sum_to_the_layer_and_have_rank_d_k():
    model, tok = shakespeare.load_shakespeare_gpt()
    m = model.astype(np.float64)
    per, P, c = m.blocks[0].attn.per_head(), m.parameters(), m.config
    ids = tok.encode("ROMEO:\nBut soft, what light")
    x = rms_norm(P["W_E"][ids], P["L0.attn_norm"], c.eps)
    out, w = m.blocks[0].attn(x, mask=causal_mask(len(ids)))
    kv = [i // (c.h // c.n_kv_heads) for i in range(c.h)]
    W_OV = [per["W_v"][kv[i]] @ per["W_o"][i] for i in range(c.h)]
    np.testing.assert_allclose(sum(w[i] @ x @ W_OV[i] for i in range(c.h)), out, atol=1e-12)
    W_QK = per["W_q"][0] @ per["W_k"][0].T
    assert np.linalg.matrix_rank(W_QK) == np.linalg.matrix_rank(W_OV[0]) == c.d_k == 24


def test_backward_flops_two_times_two_and_a_half_with_recompute_three_with_rerun():
    flops = [0]

    def mm(a, b):
        flops[0] += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return a @ b

    T, d = 24, 8
    rng = np.random.default_rng(9)
    X, dY = rng.normal(size=(T, d)), rng.normal(size=(T, d))
    Wq, Wk, Wv, Wo = rng.normal(size=(4, d, d)) / 3
    Q, K, V = mm(X, Wq), mm(X, Wk), mm(X, Wv)
    A = softmax(np.where(causal_mask(T), mm(Q, K.T) / np.sqrt(d), -np.inf))
    O = mm(A, V)
    mm(O, Wo)
    forward, flops[0] = flops[0], 0
    assert forward == attention_flops(T, d, 1)["total"]
    dO = (mm(O.T, dY), mm(dY, Wo.T))[1]
    dV, dA = mm(A.T, dO), mm(dO, V.T)
    dS = A * (dA - (dA * A).sum(-1, keepdims=True)) / np.sqrt(d)
    dQ, dK = mm(dS, K), mm(dS.T, Q)
    for W, g in ((Wq, dQ), (Wk, dK), (Wv, dV)):
        mm(X.T, g), mm(g, W.T)
    backward = flops[0]
    for mine, theirs in zip((dQ, dK, dV), attention_backward(dO, Q, K, V, A), strict=True):
        np.testing.assert_allclose(mine, theirs, atol=1e-12)
    core = 2 * 2 * T * T * d
    assert backward == 2 * forward and (2 * core + core // 2) / core == 2.5
    assert (backward + forward) / forward == 3.0


# -------------------------------------------------------------------- 10d: serving at scale
def test_disaggregation_prefill_compute_bound_decode_memory_bound_and_the_transfer():
    llama70 = MODELS["Llama 3 70B"]
    ridge = H100["flops_per_s"] / H100["bytes_per_s"]
    pre, dec = prefill_cost(llama70, 8192), decode_step_cost(llama70, 1, 8192)
    assert pre["intensity"] > ridge > dec["intensity"]
    kv = kv_cache_bytes(80, 8, head_dim(llama70), 8192)
    assert round(kv / 1e9, 2) == 2.68 and round(kv / 50e9 * 1e3) == 54
    assert kv / 50e9 < pre["flops"] / (8 * H100["flops_per_s"])


PCIE5 = 32e9 * 16 * (128 / 130) / 8  # PCIe 5.0 x16, one direction (PCI-SIG)
NVME = 7.45e9  # Samsung 990 PRO, sequential read


def test_reload_or_recompute_the_crossover():
    llama8 = MODELS["Llama 3 8B"]

    def recompute(n):
        return prefill_cost(llama8, n)["flops"] / H100["flops_per_s"]

    for cfg in (llama8, MODELS["Llama 3 70B"]):  # PCIe 5.0 x16: reloading wins at every length
        for n in range(64, 131_072, 4096):
            assert cache_bytes(cfg, n) / PCIE5 < prefill_cost(cfg, n)["flops"] / H100["flops_per_s"]
    cross = next(n for n in range(1, 200_000) if cache_bytes(llama8, n) / NVME < recompute(n))
    assert cross == 9_119  # deep dive 10d §2's crossover, from the same links
    assert cache_bytes(llama8, 1024) / NVME > recompute(1024) > cache_bytes(llama8, 1024) / PCIE5


def test_mla_cache_has_no_head_axis_so_tensor_parallelism_cannot_split_it():
    v3 = MODELS["DeepSeek-V3"]
    assert mla_cache_bytes(61, v3["kv_lora_rank"], v3["qk_rope_head_dim"], 1) == 70_272
    total = mla_cache_bytes(61, 512, 64, 32768, 64)
    assert total > H100["memory_bytes"] > total / 8
    assert round(total / 1e9, 1) == 147.4 and round(total / 8 / 1e9, 1) == 18.4
    layer = MultiHeadLatentAttention(32, 4, d_c=12, d_rope=4, rng=0)
    cache = layer.init_cache()
    for x in np.random.default_rng(0).normal(size=(5, 1, 32)):
        layer.decode_step(x, cache)
    assert cache.entries.shape == (5, 16)


def test_mtp_as_a_one_token_draft():
    assert np.allclose([expected_tokens_per_round(a, 1) for a in (0.85, 0.9)], [1.85, 1.9])
    bounds = [improvement_factor(a, 1, 1 / 61) for a in (0.85, 0.9)]
    assert all(abs(b - 1.8) < 0.1 for b in bounds) and bounds[0] < bounds[1]


# -------------------------------------------------------------------- 13c: state-space view
def test_three_forms_one_function_and_the_flops_at_mamba2_sizes():
    rng = np.random.default_rng(13)
    q, k, v = rng.normal(size=(12, 3)), rng.normal(size=(12, 3)), rng.normal(size=(12, 2))
    a = rng.uniform(0.6, 1.0, 12)
    ref = ssd_quadratic(q, k, v, a)
    np.testing.assert_allclose(ssd_recurrent(q, k, v, a)[0], ref, atol=1e-12)
    for C in (1, 4, 5, 12):
        np.testing.assert_allclose(ssd_chunked(q, k, v, a, C)[0], ref, atol=1e-12)
    cross = next(T for T in range(1, 4096)
                 if ssd_flops(T, 128, 64, 256)["quadratic"] > ssd_flops(T, 128, 64, 256)[
                     "recurrent"])
    f = ssd_flops(65536, 128, 64, 256)
    assert cross == 107 and round(f["chunked"] / f["recurrent"], 2) == 3.21


def test_the_gated_delta_rule_is_d_k_semiseparable_without_a_scalar_mask():
    rng = np.random.default_rng(77)
    T, dk, dv = 12, 3, 2
    q, k = rng.normal(size=(2, T, dk))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.normal(size=(T, dv))
    beta, alpha = rng.uniform(0.3, 1.0, T), rng.uniform(0.6, 1.0, T)
    A = [alpha[t] * (np.eye(dk) - beta[t] * np.outer(k[t], k[t])) for t in range(T)]
    M = np.zeros((T, T))
    for t in range(T):
        P = np.eye(dk)
        for j in range(t, -1, -1):
            M[t, j] = q[t] @ P @ (beta[j] * k[j])
            P = P @ A[j]
    np.testing.assert_allclose(M @ v, delta_rule(q, k, v, beta, alpha)[0], atol=1e-10)
    implied = np.tril(M / (q @ (beta[:, None] * k).T))
    assert max(np.linalg.matrix_rank(M[m:, :m]) for m in range(1, T)) == dk
    assert max(np.linalg.matrix_rank(implied[m:, :m]) for m in range(1, T)) > 1
