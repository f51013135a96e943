"""Checks for the exercises of lesson 05, from a layer to a model
(``solutions/05_layer_to_model.ipynb``).

The lesson is ``notebooks/05_layer_to_model.ipynb``; each ``check_*`` is called by an
exercise's check cell (see :mod:`mha_course.checks`).
"""

from __future__ import annotations

import numpy as np

from .. import (
    apply_rope,
    causal_mask,
    dropout,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_positions,
)
from .harness import (
    call,
    check_rng,
    compare,
    compare_pair,
    fail,
    fmt,
    fmt_shape,
    passed,
)
from .variants import attention_variant

__all__ = [
    "check_attention_dropout",
    "check_encoder_decoder_masks",
    "check_padded_heads_attention",
    "check_rope_interleaved",
    "check_rope_score_table",
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


# ------------------------------------------------------- 05.3 scores depend only on the offset
def check_rope_score_table(fn) -> None:
    """Exercise 05.3: ``rope_score_table(q, k, P, layout)`` -> (P, P), score[m, n]."""
    ex = "05.3"
    rng = check_rng(503)
    for d, P, layout in ((6, 5, "half"), (10, 7, "interleaved"), (4, 3, "half")):
        q, k = rng.normal(size=d), rng.normal(size=d)
        pos = np.arange(P)
        qs = apply_rope(np.tile(q, (P, 1)), pos, layout=layout)  # (P, d): q at every m
        ks = apply_rope(np.tile(k, (P, 1)), pos, layout=layout)  # (P, d): k at every n
        want = qs @ ks.T
        got = call(ex, fn, (q, k, P, layout), ("q", "k", "P", "layout"))

        def toeplitz(arr, P=P):
            for off in range(-P + 1, P):
                diag = np.diagonal(arr, off)
                if np.ptp(diag) > 1e-9:
                    raise fail(ex, f"your table is not constant along the diagonal n - m = {off}:"
                                   f" it runs from {fmt(diag.min())} to {fmt(diag.max())}. "
                                   "Rotate q by its position m and k by its position n, with "
                                   "the same layout for both")

        compare(
            ex, got, want, f"your table for d={d}, P={P}, layout={layout!r}", "(P, P)",
            variants=[
                ("rows and columns swapped: score[m, n] has the query position m as its row",
                 lambda w=want: w.T),
                ("you divided by √d: this table is the raw dot product (R_m q)·(R_n k)",
                 lambda w=want, d=d: w / np.sqrt(d)),
                ("only q is rotated: rotate k by its position n too",
                 lambda qs=qs, k=k, P=P: qs @ np.tile(k, (P, 1)).T),
                ("you used the other layout: pass layout to apply_rope",
                 lambda q=q, k=k, pos=pos, lay=layout: (
                     apply_rope(np.tile(q, (len(pos), 1)), pos,
                                layout="interleaved" if lay == "half" else "half")
                     @ apply_rope(np.tile(k, (len(pos), 1)), pos,
                                  layout="interleaved" if lay == "half" else "half").T)),
            ],
            props=[toeplitz],
        )
    passed(ex, "score tables for d = 6, 10, 4 and P = 5, 7, 3 in both layouts match, and each is "
               "constant along its diagonals: the score depends only on n - m")


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


# ------------------------------------------------------------------------- 05.6 dropout
def check_attention_dropout(fn) -> None:
    """Exercise 05.6: ``attention_dropout(weights, p, seed, training)`` -> inverted dropout."""
    ex = "05.6"
    rng = check_rng(506)
    probes = [(rng.random((2, 3, 4, 5)), 0.1, 11, True), (rng.random((3, 6)), 0.3, 12, True),
              (rng.random((2, 4, 4)), 0.25, 13, False), (rng.random((4, 7)), 0.5, 14, True)]
    forbid = {"mha_course.dropout": "write the dropout yourself"}
    for w, p, seed, training in probes:
        want = dropout(w, p, rng=seed, training=training)
        keep = np.random.default_rng(seed).random(w.shape) >= p
        got = call(ex, fn, (w, p, seed, training), ("weights", "p", "seed", "training"),
                   forbid=forbid)
        label = f"for weights {fmt_shape(w.shape)}, p={p}, training={training}"
        compare(
            ex, got, want, f"your dropped weights {label}", "the shape of weights",
            variants=[
                ("you scaled the survivors by 1/p; it is 1/(1-p), so that each weight keeps its "
                 "expected value (the two agree only at p = 0.5, the book example behind "
                 "rasbt/LLMs-from-scratch#431)",
                 lambda w=w, keep=keep, p=p: np.where(keep, w / p, 0.0)),
                ("the survivors are not scaled: multiply them by 1/(1-p), or the expected weight "
                 "shrinks to (1-p)·w", lambda w=w, keep=keep: np.where(keep, w, 0.0)),
                ("you kept each weight with probability p; p is the probability of DROPPING it: "
                 "keep where rng.random(shape) >= p",
                 lambda w=w, keep=keep, p=p: np.where(~keep, w / (1 - p), 0.0)),
                ("in evaluation (training=False) dropout does nothing: return the weights "
                 "unchanged", lambda w=w, keep=keep, p=p: np.where(keep, w / (1 - p), 0.0)),
                ("in evaluation (training=False) dropout does nothing, not even the scaling",
                 lambda w=w, p=p: w / (1 - p)),
            ],
        )
    passed(ex, "four probes (p = 0.1, 0.3, 0.5 in training, 0.25 in evaluation) match "
               "mha_course.dropout with the same seed")
