"""Checks for the exercises of lesson 05, from a layer to a model
(``solutions/05_layer_to_model.ipynb``).

The lesson is ``notebooks/05_layer_to_model.ipynb``; each ``check_*`` is called by an
exercise's check cell (see :mod:`mha_course.checks`).
"""

from __future__ import annotations

import numpy as np

from .. import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_positions,
    softmax,
)
from ..variants.rope_scaling import llama3_frequencies
from .harness import (
    call,
    check_rng,
    compare,
    compare_pair,
    fail,
    fmt_shape,
    passed,
)
from .variants import attention_hint, attention_variant

__all__ = [
    "check_alibi_chunk_attention",
    "check_encoder_decoder_masks",
    "check_llama3_rope_frequencies",
    "check_mrope_position_ids",
    "check_padded_heads_attention",
    "check_rope_interleaved",
    "check_sinusoidal_positions",
]

BASE = 10000.0


# ------------------------------------------------------------------- 05.1 sinusoidal encodings
def _pe_variant(T, d_model, layout="interleaved", exponent="pair", first="sin"):
    """The paper's encodings with one classic mistake switched on."""
    c = np.arange(d_model)
    i = c // 2
    power = {"pair": 2 * i / d_model, "column": c / d_model, "no_two": i / d_model}[exponent]
    angles = np.arange(T)[:, None] / BASE ** power  # (T, d_model)
    if exponent == "times":
        angles = np.arange(T)[:, None] * BASE ** (2 * i / d_model)
    sin, cos = (np.sin, np.cos) if first == "sin" else (np.cos, np.sin)
    if layout == "interleaved":
        return np.where(c % 2 == 0, sin(angles), cos(angles))
    half = angles[:, 0::2]  # (T, d_model/2): one angle per pair
    return np.concatenate([sin(half), cos(half)], axis=-1)


def check_sinusoidal_positions(fn) -> None:
    """Exercise 05.1: ``positional_encoding(T, d_model)`` -> (T, d_model), the paper's layout."""
    ex = "05.1"
    for T, d_model in ((6, 8), (9, 4), (5, 12)):
        want = sinusoidal_positions(T, d_model)
        got = call(ex, fn, (T, d_model), ("T", "d_model"),
                   forbid={"mha_course.sinusoidal_positions": "write the formula yourself"})
        compare(
            ex, got, want, f"your encodings for T={T}, d_model={d_model}", "(T, d_model)",
            variants=[
                ("sin and cos swapped: the paper puts sin in the even columns 2i and cos in the "
                 "odd columns 2i+1", lambda T=T, d=d_model: _pe_variant(T, d, first="cos")),
                ("all sines first, then all cosines ([sin | cos], as tensor2tensor and fairseq "
                 "lay them out); the paper interleaves them: column 2i is sin, column 2i+1 cos",
                 lambda T=T, d=d_model: _pe_variant(T, d, layout="concat")),
                ("the exponent uses the column index c, not the pair index i = c // 2: both "
                 "columns of pair i use 10000**(2i/d_model)",
                 lambda T=T, d=d_model: _pe_variant(T, d, exponent="column")),
                ("the exponent is i/d_model; the paper's is 2i/d_model",
                 lambda T=T, d=d_model: _pe_variant(T, d, exponent="no_two")),
                ("you multiplied the position by 10000**(2i/d_model); divide by it (the "
                 "frequencies fall from 1 to nearly 1/10000)",
                 lambda T=T, d=d_model: _pe_variant(T, d, exponent="times")),
            ],
            shape_hints={(d_model, T): "rows are positions: return (T, d_model), not its "
                                       "transpose"},
        )
    passed(ex, "(T, d_model) = (6, 8), (9, 4) and (5, 12) match the paper's formula "
               "(mha_course.sinusoidal_positions)")


# ------------------------------------------------------------------- 05.2 RoPE, interleaved
def _rope_variant(x, positions, exponent=2.0):
    d = x.shape[-1]
    theta = np.asarray(positions)[:, None] * BASE ** (-exponent * np.arange(d // 2) / d)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(theta) - b * np.sin(theta)
    out[..., 1::2] = a * np.sin(theta) + b * np.cos(theta)
    return out


def check_rope_interleaved(fn) -> None:
    """Exercise 05.2: ``rope_interleaved(x, positions)``: pairs (2j, 2j+1) turned by p·θ_j."""
    ex = "05.2"
    rng = check_rng(502)
    probes = [(rng.normal(size=(5, 6)), np.arange(5), "(T, d)"),
              (rng.normal(size=(2, 3, 4, 8)), np.array([7, 0, 3, 12]), "(B, h, T, d)"),
              (rng.normal(size=(3, 2, 10)), np.array([4, 9]), "(h, T, d)")]
    for x, positions, letters in probes:
        want = apply_rope(x, positions, layout="interleaved")
        got = call(ex, fn, (x, positions), ("x", "positions"),
                   forbid={"mha_course.apply_rope": "write the rotation yourself"})
        compare(
            ex, got, want,
            f"your rotated x for x {fmt_shape(x.shape)}, positions {positions.tolist()}", letters,
            variants=[
                ("you paired features (j, j + d/2), the half-split layout (GPT-NeoX, Hugging "
                 "Face); this exercise asks for the interleaved pairs (2j, 2j+1)",
                 lambda x=x, p=positions: apply_rope(x, p, layout="half")),
                ("the rotation goes the wrong way: (a, b) -> (a cos θ - b sin θ, "
                 "a sin θ + b cos θ)",
                 lambda x=x, p=positions: apply_rope(x, -p, layout="interleaved")),
                ("you rotated by 0, 1, ..., T-1 instead of the given positions",
                 lambda x=x: apply_rope(x, layout="interleaved")),
                ("the speeds use j/d; pair j turns by p · 10000**(-2j/d)",
                 lambda x=x, p=positions: _rope_variant(x, p, exponent=1.0)),
            ],
        )
    passed(ex, "x (5, 6), (2, 3, 4, 8) and (3, 2, 10) at given positions match "
               "mha_course.apply_rope(x, positions, layout='interleaved')")


# --------------------------------------------------- 05.3 Llama 3.1's rope_scaling, from its config
#: Configurations the check probes: Llama 3.1 itself, a 64-wide head with Llama 3.2 1B's factor,
#: and made-up values whose thresholds all differ (every probe has a different head width).
LLAMA3_PROBES = (
    (128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    (64, 500000.0, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    (96, 10000.0, {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0,
                   "high_freq_factor": 8.0, "original_max_position_embeddings": 2048}),
)


def _llama3_variant(d, base, cfg, *, speed=2.0, swap=False, blend="smooth", times=False,
                    compare="wavelength"):
    """Llama 3.1's rule with one classic slip switched on."""
    theta = base ** (-speed * np.arange(d // 2) / d)
    factor, L = cfg["factor"], cfg["original_max_position_embeddings"]
    low, high = cfg["low_freq_factor"], cfg["high_freq_factor"]
    if swap:
        low, high = high, low
    wavelength = 2 * np.pi / theta if compare == "wavelength" else theta
    slow = theta * factor if times else theta / factor
    smooth = (L / wavelength - low) / (high - low)
    middle = {"smooth": (1 - smooth) * slow + smooth * theta,
              "reversed": smooth * slow + (1 - smooth) * theta,
              "keep": theta, "divide": slow}[blend]
    return np.where(wavelength < L / high, theta, np.where(wavelength > L / low, slow, middle))


def check_llama3_rope_frequencies(fn) -> None:
    """Exercise 05.3: ``llama3_rope_frequencies(d, base, rope_scaling)`` -> (d/2,) frequencies."""
    ex = "05.3"
    for d, base, cfg in LLAMA3_PROBES:
        want = llama3_frequencies(d, base, cfg["factor"], cfg["low_freq_factor"],
                                  cfg["high_freq_factor"], cfg["original_max_position_embeddings"])
        got = call(ex, fn, (d, base, dict(cfg)), ("d", "base", "rope_scaling"),
                   forbid={"mha_course.variants.rope_scaling":
                           "write the rule from the config yourself"})
        label = (f"your frequencies for d={d}, base={base:g}, factor={cfg['factor']:g}, "
                 f"low/high_freq_factor={cfg['low_freq_factor']:g}/{cfg['high_freq_factor']:g}, "
                 f"original_max_position_embeddings={cfg['original_max_position_embeddings']}")
        theta = base ** (-2.0 * np.arange(d // 2) / d)

        def var(d=d, base=base, cfg=cfg, **kw):
            return lambda: _llama3_variant(d, base, cfg, **kw)

        compare(
            ex, got, want, label, "(d/2,)",
            variants=[
                ("the pairs between the two thresholds are left alone (which is also what "
                 "swapping low_freq_factor and high_freq_factor gives): pairs whose wavelength is "
                 "shorter than L / high_freq_factor are left alone, longer than L / "
                 "low_freq_factor divided by the factor, and the ones between blended with "
                 "smooth", var(swap=True)),
                ("the blend is the wrong way round: smooth = 1 at the short-wavelength end means "
                 "'keep θ', so the middle pairs get (1 - smooth) · θ / factor + smooth · θ",
                 var(blend="reversed")),
                ("you multiplied the slow pairs' frequency by the factor; dividing it (as "
                 "position interpolation does) makes them turn slower, so longer texts stay "
                 "within the angles training saw", var(times=True)),
                ("the middle pairs are divided by the factor: between the two thresholds the "
                 "frequencies are blended with smooth, not divided", var(blend="divide")),
                ("every pair is divided by the factor: that is position interpolation; Llama "
                 "3.1 leaves the fast pairs (short wavelengths) alone",
                 lambda theta=theta, cfg=cfg: theta / cfg["factor"]),
                ("you compared the frequencies θ with the thresholds; the thresholds are "
                 "wavelengths, 2π / θ positions", var(compare="frequency")),
                ("RoPE's frequencies are base**(-2j/d), with the pair index j; yours use "
                 "base**(-j/d)", var(speed=1.0)),
            ],
            shape_hints={(d,): "one frequency per PAIR of features: return d/2 values, not d"},
        )
    passed(ex, "Llama 3.1's rope_scaling (d=128) and two other configs (d=64, d=96) match "
               "mha_course.variants.rope_scaling.llama3_frequencies")


# ---------------------------------------------------------- 05.4 the masks of an encoder-decoder
def check_encoder_decoder_masks(fn) -> None:
    """Exercise 05.4: ``encoder_decoder_masks(src_lengths, tgt_lengths, S, T)`` -> 3 masks."""
    ex = "05.4"
    probes = (([5, 2], [3, 1], 5, 3), ([4, 4, 1], [2, 6, 5], 4, 6))
    for src, tgt, S, T in probes:
        B = len(src)
        src_pad, tgt_pad = padding_mask(src, S), padding_mask(tgt, T)  # (B, 1, S), (B, 1, T)
        want = (np.broadcast_to(src_pad, (B, S, S)), causal_mask(T) & tgt_pad,
                np.broadcast_to(src_pad, (B, T, S)))
        got = call(ex, fn, (src, tgt, S, T), ("src_lengths", "tgt_lengths", "S", "T"))
        if not isinstance(got, tuple) or len(got) != 3:
            kind = f"a tuple of {len(got)}" if isinstance(got, tuple) else type(got).__name__
            raise fail(ex, f"your function returned {kind}; expected a tuple "
                           "(encoder_self, decoder_self, cross)")
        label = f"for src_lengths {src}, tgt_lengths {tgt}, S={S}, T={T}"
        bcast = {(B, 1, S): "you returned the (B, 1, S) padding mask; broadcast it to the full "
                            "shape with np.broadcast_to(mask, (B, S, S))"}
        compare(
            ex, got[0], want[0], f"your encoder self-attention mask {label}", "(B, S, S)",
            variants=[
                ("the encoder is bidirectional: no causal mask in its self-attention, only the "
                 "source padding", lambda w=want[0], S=S: w & causal_mask(S)),
                ("the mask is inverted: True means may attend", lambda w=want[0]: ~w),
            ],
            shape_hints=bcast,
        )
        compare(
            ex, got[1], want[1], f"your decoder self-attention mask {label}", "(B, T, T)",
            variants=[
                ("the decoder's self-attention must be causal: combine causal_mask(T) with the "
                 "target padding", lambda tp=tgt_pad, B=B, T=T: np.broadcast_to(tp, (B, T, T))),
                ("you left out the target padding: combine causal_mask(T) & "
                 "padding_mask(tgt_lengths, T)",
                 lambda B=B, T=T: np.broadcast_to(causal_mask(T), (B, T, T))),
                ("you combined the masks with | (or): a key must pass both, use &",
                 lambda tp=tgt_pad, T=T: causal_mask(T) | tp),
                ("the decoder's self-attention reads the target, so its padding is "
                 "tgt_lengths, not src_lengths",
                 lambda s=src, T=T: causal_mask(T) & padding_mask(np.minimum(s, T), T)),
            ],
        )
        compare(
            ex, got[2], want[2], f"your cross-attention mask {label}", "(B, T, S)",
            variants=[
                ("cross-attention has no causal mask: every target token may read the whole "
                 "source", lambda w=want[2], T=T, S=S: w & causal_mask(T, S)),
                ("cross-attention's keys are the source tokens: hide the source padding "
                 "(src_lengths), not the target's",
                 lambda tgt=tgt, B=B, T=T, S=S: np.broadcast_to(
                     (np.arange(T) < np.asarray(tgt)[:, None])[:, :, None], (B, T, S))),
            ],
            shape_hints={(B, S, T): "cross-attention's mask has one row per target query and "
                                    "one column per source key: (B, T, S)", **bcast},
        )
    passed(ex, "encoder (B, S, S), decoder (B, T, T) and cross (B, T, S) masks match for "
               "B = 2 and 3, S = 5 and 4, T = 3 and 6")


# --------------------------------------------------- 05.5 a padded batch through several heads
def _heads_hint(exc):
    if "broadcast" in str(exc):
        return ("a (B, 1, S) mask against (B, h, T, S) scores lines its B axis up with the head "
                "axis: give it a head axis first, mask[:, None] -> (B, 1, 1, S)")
    return None


def check_padded_heads_attention(fn) -> None:
    """Exercise 05.5: ``padded_heads_attention(q, k, v, lengths)`` -> (out, weights)."""
    ex = "05.5"
    rng = check_rng(505)
    for B, h, lengths in ((2, 2, [5, 2]), (3, 2, [3, 5, 1]), (2, 4, [4, 2])):
        T, d_k, d_v = 5, 4, 6
        q, k = rng.normal(size=(2, B, h, T, d_k))
        v = rng.normal(size=(B, h, T, d_v))
        pad = padding_mask(lengths, T)  # (B, 1, T)
        want_out, want_w = scaled_dot_product_attention(q, k, v, mask=pad[:, None])
        got = call(ex, fn, (q, k, v, lengths), ("q", "k", "v", "lengths"), hint=_heads_hint)

        def var(m, q=q, k=k, v=v, **kw):
            return lambda: attention_variant(q, k, v, m, **kw)

        variants = [
            ("the (B, 1, S) mask met the (B, h, T, S) scores without a head axis, so sequence i's "
             "mask went to head i (this runs silently when B == h). Use mask[:, None], shape "
             "(B, 1, 1, S)", var(pad)),
            ("you hid the padded queries instead of the padded keys: the mask must be "
             "(B, 1, 1, S), False in the key columns past each length",
             var(np.swapaxes(pad, -1, -2)[:, None])),
            ("the mask is inverted: True means may attend", var(~pad[:, None])),
            ("the mask had no effect", var(None)),
        ]
        compare_pair(ex, got, want_out, want_w, f"for B={B}, h={h}, lengths {lengths}",
                     variants, mask=pad[:, None])
    passed(ex, "(out, weights) match with B=2, h=2 (where the bug hides), B=3, h=2 and B=2, h=4: "
               "no head of any sequence attends to padding")


# ----------------------------------------------- 05.6 ALiBi for a chunk of new tokens over a cache
def _alibi_variant(q, k, v, *, top_left=False, mask="bottom-right", sign=1.0, reverse=False,
                   first_slope_one=False, scale="sqrt", bias_scaled=False):
    """ALiBi attention for T new queries over S keys, with one classic slip switched on."""
    h, T, S, d_k = q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]
    slopes = alibi_slopes(h)
    if first_slope_one:
        slopes = 2.0 ** (-8 * np.arange(h) / h)
    if reverse:
        slopes = slopes[::-1]
    t_pos = np.arange(T)[:, None] + (0 if top_left else S - T)  # (T, 1): the queries' positions
    bias = -sign * slopes[:, None, None] * (t_pos - np.arange(S)[None, :])  # (h, T, S)
    scores = q @ np.swapaxes(k, -1, -2)
    if bias_scaled:
        scores = (scores + bias) / np.sqrt(d_k)
    else:
        scores = {"sqrt": scores / np.sqrt(d_k), "none": scores}[scale] + bias
    m = {"bottom-right": causal_mask(T, S), "top-left": np.tril(np.ones((T, S), dtype=bool)),
         "none": None}[mask]
    weights = softmax(scores, mask=m)
    return weights @ v, weights


def check_alibi_chunk_attention(fn) -> None:
    """Exercise 05.6: ``alibi_chunk_attention(q, k, v)``: T new queries over S keys, ALiBi."""
    ex = "05.6"
    rng = check_rng(506)
    for lead, h, T, S in (((), 8, 3, 7), ((2,), 4, 1, 5), ((), 6, 4, 4), ((2,), 2, 2, 9)):
        d_k, d_v = 4, 5
        q = rng.normal(size=(*lead, h, T, d_k))
        k, v = rng.normal(size=(*lead, h, S, d_k)), rng.normal(size=(*lead, h, S, d_v))
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k) + alibi_bias(h, T, S)
        want_w = softmax(scores, mask=causal_mask(T, S))
        want_out = want_w @ v
        got = call(ex, fn, (q, k, v), ("q", "k", "v"), hint=attention_hint,
                   forbid={"mha_course.alibi_bias": "build ALiBi's bias yourself"})

        def var(q=q, k=k, v=v, **kw):
            return lambda: _alibi_variant(q, k, v, **kw)

        variants = [
            ("the causal mask is aligned top-left (np.tril of a (T, S) block, or positions "
             "counted from the chunk's start): the new queries are the LAST T of the S "
             "positions, so query t may see keys s <= S - T + t (mha_course.causal_mask(T, S))",
             var(mask="top-left")),
            ("the bias has the wrong sign: ALiBi SUBTRACTS m_i · distance, so far keys lose "
             "weight", var(sign=-1.0)),
            ("the slopes go the wrong way round: head 0 has the steepest slope, 2**(-8/h)",
             var(reverse=True)),
            ("the slopes start at 2**0 = 1; ALiBi's are 2**(-8/h), 2**(-16/h), ..., 2**(-8) "
             "(mha_course.alibi_slopes(h))", var(first_slope_one=True)),
            ("no causal mask: a new query sees the chunk's later tokens, its future",
             var(mask="none")),
            ("the bias was added before dividing by √d_k: scale q·k only, then add the bias",
             var(bias_scaled=True)),
            ("the scores are not divided by √d_k", var(scale="none")),
        ]
        compare_pair(ex, got, want_out, want_w,
                     f"for h={h}, T={T} new queries over S={S} keys", variants,
                     mask=causal_mask(T, S))
    passed(ex, "chunks (h, T, S) = (8, 3, 7), (4, 1, 5), (6, 4, 4), (2, 2, 9), with and without a "
               "batch axis, match scores + mha_course.alibi_bias(h, T, S) under "
               "causal_mask(T, S)")


# ------------------------------------------------------------- 05.7 M-RoPE positions of an image
def _mrope_ids_variant(n_before, grid_thw, n_after, *, swap=False, order="raster",
                       after="max", image_from=None, text_rope=False):
    """Qwen2-VL's (t, h, w) positions of text, one image or video, text; keywords make the
    classic mistakes."""
    g_t, g_h, g_w = grid_thw
    n_img = g_t * g_h * g_w
    if text_rope:
        return np.stack([np.arange(n_before + n_img + n_after)] * 3)
    f, r, c = np.meshgrid(np.arange(g_t), np.arange(g_h), np.arange(g_w), indexing="ij")
    if order == "columns":  # the grid read column by column
        f, r, c = (a.transpose(0, 2, 1) for a in (f, r, c))
    if swap:
        r, c = c, r
    offset = n_before if image_from is None else image_from
    image = offset + np.stack([f.ravel(), r.ravel(), c.ravel()])
    start = {"max": image.max() + 1, "max_no_one": image.max(),
             "count": n_before + n_img}[after]
    text = np.arange(n_before)
    return np.concatenate([np.stack([text] * 3), image,
                           np.stack([start + np.arange(n_after)] * 3)], axis=1)


def check_mrope_position_ids(fn) -> None:
    """Exercise 05.7: ``mrope_position_ids(n_before, grid_thw, n_after)`` -> (3, L) ints."""
    ex = "05.7"
    probes = ((3, (1, 3, 4), 2), (5, (1, 4, 2), 3), (0, (2, 2, 3), 4), (2, (1, 1, 1), 0))
    for n_before, grid, n_after in probes:
        want = _mrope_ids_variant(n_before, grid, n_after)
        got = call(ex, fn, (n_before, grid, n_after), ("n_before", "grid_thw", "n_after"))
        L = want.shape[1]

        def var(n_before=n_before, grid=grid, n_after=n_after, **kw):
            return lambda: _mrope_ids_variant(n_before, grid, n_after, **kw)

        compare(
            ex, got, want,
            f"your positions for {n_before} text tokens, an image grid (t, h, w) = {grid} and "
            f"{n_after} text tokens", "(3, L)",
            variants=[
                ("row and column swapped: image token (f, r, c) gets height s + r (its row) "
                 "and width s + c (its column)", var(swap=True)),
                ("the image tokens are in column-major order: the patches are read row by "
                 "row (raster order), so the width position changes fastest",
                 var(order="columns")),
                ("the text after the image continues the 1-D count (n_before + t*h*w): in "
                 "M-RoPE it starts at one past the largest position used so far",
                 var(after="count")),
                ("the text after the image starts AT the largest position used so far; it "
                 "starts one past it (max + 1)", var(after="max_no_one")),
                ("the image's positions start at 0: add n_before, the number of tokens "
                 "before it, to all three", var(image_from=0)),
                ("every token got (p, p, p) with p its index in the sequence: that is a text "
                 "RoPE on the flattened image; an image token's height and width come from "
                 "its row and column", var(text_rope=True)),
            ],
            shape_hints={(L, 3): "one row per axis (t, h, w) and one column per token: "
                                 "(3, L), not (L, 3)"},
        )
    passed(ex, "(t, h, w) positions match Qwen2-VL's rule for images 3 x 4, 4 x 2 and 1 x 1 "
               "and a 2-frame video, with text before and after")
