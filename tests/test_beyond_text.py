"""Deep dive 05c (``notebooks/deep_dives/05c_attention_beyond_text.ipynb``): every equivalence
the notebook asserts, recomputed here, and the check of exercise 05.7 (M-RoPE positions), which
passes the right answer and names each classic wrong one.

- a ViT's patch embedding (cut into P x P patches, flatten (C, P, P), project) equals a
  convolution with kernel P and stride P, inline and against ``torch.nn.functional.conv2d``;
- without position embeddings the [CLS] output does not change when the patches are shuffled;
- 2-D sinusoidal encodings and axial 2-D RoPE depend only on the 2-D offset; a 1-D RoPE on the
  raster index scores the end of a row and the start of the next like right neighbours, and its
  score to the patch below changes with the grid's width;
- M-RoPE (Qwen2-VL's ``mrope_section`` [16, 24, 24]) is ``apply_rope`` on text and is unchanged
  by a shift along each of t, h, w;
- an encoder-decoder decoded with a cross-attention cache (computed once) and a self-attention
  cache (one row per token) equals the full recomputation with ``MultiHeadAttention``; the
  cache bytes equal the formulas; Whisper large-v3's numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

import mha_course
from mha_course import (
    MultiHeadAttention,
    apply_rope,
    causal_mask,
    checks,
    merge_heads,
    scaled_dot_product_attention,
    sinusoidal_positions,
    split_heads,
)
from mha_course.checks import CheckFailed
from mha_course.checks.lesson05 import _mrope_ids_variant

# ------------------------------------------------------------------ §1 patches as tokens


def patchify(img, P):
    """(C, H, W) -> (N, C*P*P): patches in raster order, each flattened as (C, P, P)."""
    C, H, W = img.shape
    gh, gw = H // P, W // P
    return img.reshape(C, gh, P, gw, P).transpose(1, 3, 0, 2, 4).reshape(gh * gw, C * P * P)


def conv_stride_p(img, kernel, bias, P):
    """A convolution with kernel P and stride P, window by window -> (d, H/P, W/P)."""
    d, C = kernel.shape[:2]
    gh, gw = img.shape[1] // P, img.shape[2] // P
    out = np.zeros((d, gh, gw))
    for i in range(gh):
        for j in range(gw):
            window = img[:, i * P:i * P + P, j * P:j * P + P]
            out[:, i, j] = np.einsum("dcuv,cuv->d", kernel, window) + bias
    return out


@pytest.mark.parametrize(("C", "H", "W", "P", "d"), [(3, 12, 16, 4, 8), (1, 6, 9, 3, 5),
                                                      (2, 8, 8, 2, 7)])
def test_patch_embedding_equals_a_stride_p_convolution(C, H, W, P, d):
    rng = np.random.default_rng(C * 100 + P)
    img = rng.normal(size=(C, H, W))
    W_e, b_e = rng.normal(size=(C * P * P, d)), rng.normal(size=d)
    tokens = patchify(img, P) @ W_e + b_e
    for r in range(H // P):
        for c in range(W // P):
            np.testing.assert_array_equal(patchify(img, P)[r * (W // P) + c],
                                          img[:, r * P:(r + 1) * P, c * P:(c + 1) * P].ravel())
    conv = conv_stride_p(img, W_e.T.reshape(d, C, P, P), b_e, P)
    np.testing.assert_allclose(conv.reshape(d, -1).T, tokens, atol=1e-12)


def test_patch_embedding_equals_torch_conv2d(torch):
    rng = np.random.default_rng(0)
    C, H, W, P, d = 3, 12, 16, 4, 8
    img = rng.normal(size=(C, H, W))
    W_e, b_e = rng.normal(size=(C * P * P, d)), rng.normal(size=d)
    out = torch.nn.functional.conv2d(torch.from_numpy(img)[None],
                                     torch.from_numpy(W_e.T.reshape(d, C, P, P).copy()),
                                     torch.from_numpy(b_e), stride=P)      # (1, d, H/P, W/P)
    np.testing.assert_allclose(out.flatten(2).transpose(1, 2)[0].numpy(),
                               patchify(img, P) @ W_e + b_e, atol=1e-12)


def test_wrong_flatten_order_and_column_major_grid_differ():
    rng = np.random.default_rng(1)
    C, H, W, P, d = 3, 12, 16, 4, 8
    img = rng.normal(size=(C, H, W))
    W_e = rng.normal(size=(C * P * P, d))
    hwc = img.reshape(C, 3, P, 4, P).transpose(1, 3, 2, 4, 0).reshape(12, -1)
    assert not np.allclose(hwc @ W_e, patchify(img, P) @ W_e)
    conv = conv_stride_p(img, W_e.T.reshape(d, C, P, P), np.zeros(d), P)
    col_major = conv.transpose(0, 2, 1).reshape(d, -1).T
    np.testing.assert_allclose(col_major[1], (patchify(img, P) @ W_e)[4], atol=1e-12)


def test_vit_b16_numbers():
    side, p, c, d = 224, 16, 3, 768       # google/vit-base-patch16-224 config.json
    assert ((side // p) ** 2, c * p * p, (side // p) ** 2 + 1, c * p * p * d + d) == (
        196, 768, 197, 590_592)
    assert (384 // p) ** 2 + 1 == 577


# ------------------------------------------------------------------ §2 [CLS]


def test_cls_output_ignores_patch_order_without_positions_only():
    rng = np.random.default_rng(2)
    cls_vec, tokens = rng.normal(size=8), rng.normal(size=(12, 8))
    pos = 0.5 * rng.normal(size=(13, 8))
    enc = MultiHeadAttention(8, 2, rng=3)
    perm = np.random.default_rng(4).permutation(12)
    np.testing.assert_allclose(enc(np.vstack([cls_vec, tokens[perm]]))[0][0],
                               enc(np.vstack([cls_vec, tokens]))[0][0], atol=1e-12)
    assert not np.allclose(enc(np.vstack([cls_vec, tokens[perm]]) + pos)[0][0],
                           enc(np.vstack([cls_vec, tokens]) + pos)[0][0])


# ------------------------------------------------------------------ §3 2-D positions


def rope_2d(x, r, c):
    half = x.shape[-1] // 2
    return np.concatenate([apply_rope(x[..., :half], r), apply_rope(x[..., half:], c)], axis=-1)


def by_offset_spread(table, *offsets):
    groups = {}
    for key, v in zip(zip(*(o.ravel() for o in offsets), strict=True), table.ravel(),
                      strict=True):
        groups.setdefault(key, []).append(v)
    return max(np.ptp(v) for v in groups.values()), len(groups)


@pytest.mark.parametrize(("G_H", "G_W"), [(6, 8), (3, 5)])
def test_2d_positions_depend_only_on_the_2d_offset(G_H, G_W):
    d = 32
    rows, cols = np.divmod(np.arange(G_H * G_W), G_W)
    dr, dc = rows[None] - rows[:, None], cols[None] - cols[:, None]
    pe = np.concatenate([sinusoidal_positions(G_H, d // 2)[rows],
                         sinusoidal_positions(G_W, d // 2)[cols]], axis=-1)
    spread, n = by_offset_spread(pe @ pe.T, dr, dc)
    assert spread < 1e-12 and n == (2 * G_H - 1) * (2 * G_W - 1)
    q, k = np.random.default_rng(5).normal(size=(2, d))
    n_p = G_H * G_W
    scores = rope_2d(np.tile(q, (n_p, 1)), rows, cols) @ rope_2d(np.tile(k, (n_p, 1)), rows,
                                                                  cols).T
    assert by_offset_spread(scores, dr, dc)[0] < 1e-12


def test_1d_rope_on_the_raster_index_loses_the_geometry():
    G_H, G_W, d = 6, 8, 32
    q, k = np.random.default_rng(5).normal(size=(2, d))
    rows, cols = np.divmod(np.arange(G_H * G_W), G_W)
    raster = rows * G_W + cols
    s1 = apply_rope(np.tile(q, (48, 1)), raster) @ apply_rope(np.tile(k, (48, 1)), raster).T
    s2 = rope_2d(np.tile(q, (48, 1)), rows, cols) @ rope_2d(np.tile(k, (48, 1)), rows, cols).T
    centre, right, wrap = 2 * G_W + 3, 2 * G_W + 4, (2 * G_W + G_W - 1, 3 * G_W)
    assert np.isclose(s1[centre, right], s1[wrap])          # a row's end scored as a neighbour
    assert not np.isclose(s2[centre, right], s2[wrap])
    assert len(set((raster[None] - raster[:, None]).ravel())) == 2 * 48 - 1   # 95 < 165

    def below(width, two_d):
        if two_d:
            return rope_2d(q[None], np.array([2]), np.array([3]))[0] @ rope_2d(
                k[None], np.array([3]), np.array([3]))[0]
        return apply_rope(q[None], np.array([2 * width + 3]))[0] @ apply_rope(
            k[None], np.array([3 * width + 3]))[0]

    assert len({round(float(below(w, False)), 9) for w in (8, 14, 32)}) == 3
    assert np.ptp([below(w, True) for w in (8, 14, 32)]) < 1e-12


# ------------------------------------------------------------------ §4 M-RoPE


def mrope(x, pos3, section=(16, 24, 24), base=1_000_000.0):
    d = x.shape[-1]
    theta = base ** (-2 * np.arange(d // 2) / d)
    angles = pos3[np.repeat([0, 1, 2], section)].T * theta
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def test_qwen2_vl_config_numbers():
    hidden, heads, section = 3584, 28, [16, 24, 24]   # Qwen/Qwen2-VL-7B-Instruct config.json
    assert hidden // heads == 128 and sum(section) == 64


def test_mrope_on_text_is_rope():
    x = np.random.default_rng(6).normal(size=(9, 128))
    p = np.arange(9)
    np.testing.assert_allclose(mrope(x, np.stack([p] * 3)), apply_rope(x, p, base=1e6),
                               atol=1e-12)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_mrope_is_relative_in_each_axis(axis):
    rng = np.random.default_rng(7)
    q, k = rng.normal(size=(2, 128))
    pq, pk = rng.integers(0, 40, size=(2, 3, 64))

    def score(a, b):
        return (mrope(np.tile(q, (64, 1)), a) * mrope(np.tile(k, (64, 1)), b)).sum(-1)

    shift = np.zeros((3, 1), dtype=int)
    shift[axis] = 17
    np.testing.assert_allclose(score(pq + shift, pk + shift), score(pq, pk), atol=1e-10)
    assert not np.allclose(score(pq, pk + shift), score(pq, pk))


def test_mrope_tells_apart_every_2d_offset_and_1d_rope_does_not():
    g_h, g_w, n_txt = 4, 6, 5
    pos = _mrope_ids_variant(n_txt, (1, g_h, g_w), 0)[:, n_txt:]
    n = g_h * g_w
    q, k = np.random.default_rng(7).normal(size=(2, 128))
    s_m = mrope(np.tile(q, (n, 1)), pos) @ mrope(np.tile(k, (n, 1)), pos).T
    p = n_txt + np.arange(n)
    s_t = apply_rope(np.tile(q, (n, 1)), p, base=1e6) @ apply_rope(np.tile(k, (n, 1)), p,
                                                                  base=1e6).T
    d_h, d_w = pos[1][None] - pos[1][:, None], pos[2][None] - pos[2][:, None]
    spread, n_rel = by_offset_spread(s_m, d_h, d_w)
    assert spread < 1e-10 and n_rel == 77
    assert len(np.unique(np.round(s_m, 9))) == 77
    assert len(np.unique(np.round(s_t, 9))) == 2 * n - 1


# ------------------------------------------------------------------ §5 encoder-decoder caches


def cross_cache_bytes(n_layers, S, d_model, itemsize):
    return n_layers * 2 * S * d_model * itemsize


def self_cache_bytes(n_layers, t, d_model, itemsize):
    return n_layers * 2 * t * d_model * itemsize


@pytest.mark.parametrize(("d_m", "h", "n_layers", "S", "T"), [(16, 2, 2, 10, 6), (12, 3, 3, 4, 7)])
def test_cached_encoder_decoder_equals_full_recomputation(d_m, h, n_layers, S, T):
    rng = np.random.default_rng(8)
    enc, y_in = rng.normal(size=(S, d_m)), rng.normal(size=(T, d_m))
    layers = [(MultiHeadAttention(d_m, h, rng=10 + i), MultiHeadAttention(d_m, h, rng=20 + i))
              for i in range(n_layers)]

    def full(y):
        t = y.shape[0]
        for s_attn, c_attn in layers:
            y = y + s_attn(y, mask=causal_mask(t))[0]
            y = y + c_attn(y, context=enc)[0]
        return y

    def attend(layer, y, k, v):
        heads, _ = scaled_dot_product_attention(split_heads(y @ layer.W_q, h), k, v)
        return merge_heads(heads) @ layer.W_o

    cross_kv = [(split_heads(enc @ c.W_k, h), split_heads(enc @ c.W_v, h)) for _, c in layers]
    self_kv = [(np.zeros((h, 0, d_m // h)),) * 2 for _ in layers]
    for t in range(T):
        y = y_in[t:t + 1]
        for i, (s_attn, c_attn) in enumerate(layers):
            self_kv[i] = (np.concatenate([self_kv[i][0], split_heads(y @ s_attn.W_k, h)], 1),
                          np.concatenate([self_kv[i][1], split_heads(y @ s_attn.W_v, h)], 1))
            y = y + attend(s_attn, y, *self_kv[i])
            y = y + attend(c_attn, y, *cross_kv[i])
        np.testing.assert_allclose(y, full(y_in[:t + 1])[-1:], atol=1e-12)
        assert sum(k.nbytes + v.nbytes for k, v in self_kv) == self_cache_bytes(
            n_layers, t + 1, d_m, 8)
    assert sum(k.nbytes + v.nbytes for k, v in cross_kv) == cross_cache_bytes(n_layers, S, d_m, 8)


def test_whisper_large_v3_cache_bytes():
    # openai/whisper-large-v3 config.json: d_model 1280, decoder_layers 32, 1500 frames, float16
    assert cross_cache_bytes(32, 1500, 1280, 2) == 245_760_000
    assert self_cache_bytes(32, 1, 1280, 2) == 163_840
    assert self_cache_bytes(32, 448, 1280, 2) == 73_400_320


# ------------------------------------------------------------------ exercise 05.7


def test_mrope_check_passes_the_right_answer(capsys):
    checks.check_mrope_position_ids(lambda a, g, b: _mrope_ids_variant(a, g, b))
    assert capsys.readouterr().out.startswith("Exercise 05.7 passed: ")


def test_the_check_reference_is_the_notebooks_rule():
    ids = _mrope_ids_variant(3, (1, 3, 4), 2)
    assert ids.tolist() == [[0, 1, 2] + [3] * 12 + [7, 8],
                            [0, 1, 2] + [3] * 4 + [4] * 4 + [5] * 4 + [7, 8],
                            [0, 1, 2] + [3, 4, 5, 6] * 3 + [7, 8]]
    video = _mrope_ids_variant(0, (2, 1, 2), 1)
    assert video.tolist() == [[0, 0, 1, 1, 2], [0, 0, 0, 0, 2], [0, 1, 0, 1, 2]]


MROPE_MISTAKES = [
    ("rows-cols-swapped", dict(swap=True), r"row and column swapped"),
    ("column-major", dict(order="columns"), r"column-major order"),
    ("text-after-counts-on", dict(after="count"), r"continues the 1-D count"),
    ("text-after-at-max", dict(after="max_no_one"), r"starts AT the largest position"),
    ("image-from-zero", dict(image_from=0), r"image's positions start at 0"),
    ("text-rope", dict(text_rope=True), r"a text RoPE on the flattened image"),
]


@pytest.mark.parametrize(("kw", "pattern"), [m[1:] for m in MROPE_MISTAKES],
                         ids=[m[0] for m in MROPE_MISTAKES])
def test_mrope_check_names_the_mistake(kw, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        checks.check_mrope_position_ids(lambda a, g, b: _mrope_ids_variant(a, g, b, **kw))
    assert str(info.value).startswith("Exercise 05.7")
    assert capsys.readouterr().out == ""


def test_mrope_check_names_a_transposed_answer():
    with pytest.raises(CheckFailed, match=r"\(3, L\), not \(L, 3\)"):
        checks.check_mrope_position_ids(lambda a, g, b: _mrope_ids_variant(a, g, b).T)


def test_mrope_check_is_exported():
    assert "check_mrope_position_ids" in mha_course.checks.lesson05.__all__
