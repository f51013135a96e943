"""Checks for the exercises of lesson 13, the attention block of 2025
(``solutions/13_attention_2025.ipynb``).

The lesson is ``notebooks/13_attention_2025.ipynb``; each ``check_*`` is called by an exercise's
check cell (see :mod:`mha_course.checks`). The references come from the package at check time:
:func:`mha_course.variants.logit_control.soft_cap`,
:func:`mha_course.variants.logit_control.qk_norm`,
:func:`mha_course.variants.sinks.softmax_with_sink`,
:func:`mha_course.variants.delta_rule.delta_rule` and
:func:`mha_course.variants.ssd.ssd_recurrent` (13.5, the chunked scan of deep dive 13c) and
:func:`mha_course.models.phenomena.first_position_mass` (13.6, the sink of deep dive 13d).
"""

from __future__ import annotations

import numpy as np

from ..attention import causal_mask
from ..models.phenomena import first_position_mass
from ..softmax import softmax
from ..variants.delta_rule import delta_rule
from ..variants.logit_control import qk_norm, soft_cap
from ..variants.sinks import softmax_with_sink
from ..variants.ssd import ssd_recurrent
from .harness import call, compare, fail, fmt, passed
from .measure import check_rng

__all__ = ["check_bos_mass", "check_capped_weights", "check_chunked_scan", "check_delta_write",
           "check_qk_norm_fused", "check_sink_softmax"]


def _masks(rng, T, S):
    """A causal mask (bottom-right) and a random one with no empty row."""
    random = rng.uniform(size=(T, S)) < 0.6
    random[:, 0] = True
    return [causal_mask(T, S), random]


# ---------------------------------------------------------------------------------- 13.1
def check_capped_weights(fn) -> None:
    """Exercise 13.1: ``capped_weights(scores, mask, cap)``: the softmax weights of soft-capped,
    masked scores, the cap applied before the mask."""
    ex = "13.1"
    rng = check_rng(1201)
    for shape, cap in (((2, 3, 4, 6), 5.0), ((5, 7), 50.0), ((3, 2, 9), 1.5)):
        for mask in _masks(rng, *shape[-2:]):
            _capped_case(ex, fn, rng.normal(scale=4.0 * cap, size=shape), mask, cap)
    passed(ex, "the weights match softmax(mask(cap·tanh(scores/cap))) for 3 shapes, causal "
               "and random masks, caps 1.5 to 50")


def _capped_case(ex, fn, scores, mask, cap):
    shape = scores.shape
    want = softmax(soft_cap(scores, cap), mask=mask)
    got = call(ex, fn, (scores, mask, cap), ("scores", "mask", "cap"),
               forbid={"mha_course.variants.logit_control.soft_cap": "write the cap yourself"})
    filled = np.where(mask, scores, -np.inf)
    compare(ex, got, want, f"your weights for scores {shape}, cap {cap}",
            "(..., T, S)", variants=[
                ("the cap is applied after the mask: c·tanh(-inf/c) = -c is a finite "
                 "score, so masked keys get weight; cap the scores first, then mask",
                 lambda: softmax(cap * np.tanh(filled / cap))),
                ("the scores are not capped: c·tanh(s/c) squashes each score into "
                 "(-c, c) before the softmax",
                 lambda: softmax(scores, mask=mask)),
                ("tanh(s/c) without the factor c: the capped score is c·tanh(s/c), "
                 "close to s when |s| ≪ c",
                 lambda: softmax(np.tanh(scores / cap), mask=mask)),
                ("a hard clip is not a soft cap: use c·tanh(s/c), smooth and with a "
                 "gradient everywhere", lambda: softmax(np.clip(scores, -cap, cap),
                                                        mask=mask)),
            ])


# ---------------------------------------------------------------------------------- 13.2
def check_sink_softmax(fn) -> None:
    """Exercise 13.2: ``sink_softmax(scores, sinks)``: weights of (..., h, T, S) scores with one
    learned sink logit per head in the denominator only."""
    ex = "13.2"
    rng = check_rng(1202)
    for shape in ((2, 3, 4, 5), (4, 6, 3), (1, 2, 7, 7)):
        _sink_case(ex, fn, rng.normal(scale=2.0, size=shape), rng.normal(scale=1.5,
                                                                         size=shape[-3]))
    passed(ex, "the weights match gpt-oss's sink softmax (extra column, softmax, drop it) for "
               "3 shapes of (..., h, T, S)")


def _sink_case(ex, fn, scores, sinks):
    shape, h = scores.shape, scores.shape[-3]
    want, _ = softmax_with_sink(scores, sinks)
    got = call(ex, fn, (scores, sinks), ("scores", "sinks"),
               forbid={"mha_course.variants.sinks.softmax_with_sink": "write the sink softmax "
                       "yourself", "mha_course.variants.sinks.sink_attention": "write the sink "
                       "softmax yourself"})
    col = np.broadcast_to(sinks[:, None, None], shape[:-1] + (1,))
    with_col = softmax(np.concatenate([scores, col], axis=-1))
    if np.asarray(got).shape == with_col.shape:
        raise fail(ex, f"your weights have shape {np.asarray(got).shape}, one column too "
                       "many. Likely mistake: the sink's column is still there; drop it "
                       "after the softmax, it carries no value")
    compare(ex, got, want, f"your weights for scores {shape}, {h} sinks", "(..., h, T, S)",
            variants=[
                ("the sink's column is dropped and the rest renormalised: that is the "
                 "plain softmax again; the sink stays in the denominator, so the rows sum "
                 "to less than 1", lambda: softmax(scores)),
                ("the sink logit is added to the denominator as sink, not exp(sink)",
                 lambda: np.exp(scores) / (np.exp(scores).sum(-1, keepdims=True)
                                           + col)),
            ])


# ---------------------------------------------------------------------------------- 13.3
def check_qk_norm_fused(fn) -> None:
    """Exercise 13.3: ``qk_norm_fused(x, h, gain, eps)``: per-head RMSNorm of a fused
    (..., T, h·d_k) projection, returned fused."""
    ex = "13.3"
    rng = check_rng(1203)
    for shape, h in (((2, 5, 12), 3), ((7, 8), 2), ((2, 3, 4, 20), 5)):
        d_k = shape[-1] // h
        x = rng.normal(size=shape) * rng.uniform(0.1, 10.0, size=h).repeat(d_k)
        _qk_case(ex, fn, x, h, rng.uniform(0.5, 1.5, size=d_k), 1e-6)
    passed(ex, "per-head RMSNorm of the fused projection matches qk_norm on (..., h, d_k) for "
               "3 shapes (h = 3, 2, 5), heads of very different scales")


def _qk_case(ex, fn, x, h, gain, eps):
    shape, d_k = x.shape, x.shape[-1] // h
    heads = x.reshape(*shape[:-1], h, d_k)
    want = qk_norm(heads, gain, eps).reshape(shape)
    got = call(ex, fn, (x, h, gain, eps), ("x", "h", "gain", "eps"),
               forbid={"mha_course.variants.logit_control.qk_norm": "write the norm yourself",
                       "mha_course.block.rms_norm": "write the norm yourself",
                       "mha_course.rms_norm": "write the norm yourself"})
    rms_all = np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    compare(ex, got, want, f"your output for x {shape}, h = {h}", "(..., T, h·d_k)",
            variants=[
                ("the norm is over the whole h·d_k row (OLMo 2's QK-norm), not over each "
                 "head's d_k features: reshape to (..., h, d_k) first",
                 lambda: x / rms_all * np.tile(gain, h)),
                ("the norm runs over the tokens (axis -2), not over each head's features",
                 lambda: (heads / np.sqrt((heads * heads).mean(-3, keepdims=True) + eps)
                          * gain).reshape(shape)),
                ("the gain is missing: multiply each normalised head by gain (d_k,)",
                 lambda: qk_norm(heads, None, eps).reshape(shape)),
                ("that is LayerNorm: QK-norm here is RMSNorm, no mean is subtracted",
                 lambda: ((heads - heads.mean(-1, keepdims=True))
                          / np.sqrt(heads.var(-1, keepdims=True) + eps) * gain
                          ).reshape(shape)),
            ])


# ---------------------------------------------------------------------------------- 13.4
def check_delta_write(fn) -> None:
    """Exercise 13.4: ``delta_write(S, k, v, beta)``: one write of the delta rule to a
    (d_k, d_v) state, k already of unit length."""
    ex = "13.4"
    rng = check_rng(1204)
    for d_k, d_v, beta in ((5, 5, 0.25), (4, 6, 1.0), (7, 3, 0.5)):
        k = rng.normal(size=d_k)
        _delta_case(ex, fn, rng.normal(size=(d_k, d_v)), k / np.linalg.norm(k),
                    rng.normal(size=d_v), beta)
    _delta_exact(ex, fn)
    passed(ex, "the delta-rule write matches delta_rule for 3 states (beta 0.25, 1, 0.5), and at "
               "beta 1 a unit key that already held a value reads back the new one exactly")


def _delta_case(ex, fn, S, k, v, beta):
    d_k, d_v = S.shape
    _, want = delta_rule(k[None], k[None], v[None], beta, state=S, normalize=False)
    got = call(ex, fn, (S, k, v, beta), ("S", "k", "v", "beta"),
               forbid={"mha_course.variants.delta_rule.delta_rule": "write the update yourself",
                       "mha_course.variants.delta_rule.delta_rule_parallel": "write the update "
                       "yourself"})
    compare(ex, got, want, f"your new state (d_k {d_k}, d_v {d_v}, beta {beta})",
            "(d_k, d_v)", variants=[
                ("that is linear attention's write S + beta·k vᵀ: the delta rule writes "
                 "only the error v − Sᵀk",
                 lambda: S + beta * np.outer(k, v)),
                ("the read is S k, not Sᵀ k: the state maps a key (d_k) to a value "
                 "(d_v), so read with k @ S",
                 lambda: S + beta * np.outer(k, v - S @ k) if d_k == d_v else None),
                ("beta scales the whole write, the read included: S + beta·k(v − Sᵀk)ᵀ",
                 lambda: S + np.outer(k, beta * v - k @ S)),
                ("the new state is transposed: it is S + beta·k (v − Sᵀk)ᵀ, shape (d_k, d_v), "
                 "np.outer(k, error), not np.outer(error, k)",
                 lambda: (S + beta * np.outer(k, v - k @ S)).T),
            ],
            shape_hints={(d_v, d_k): "the state is (d_k, d_v): np.outer(k, error), not "
                                     "np.outer(error, k)"} if d_k != d_v else None)


def _delta_exact(ex, fn):
    """Overwriting, the delta rule's point: at beta = 1 a unit key that already held a value
    reads back the new one (exact only at beta = 1; linear attention's write returns the sum)."""
    k = np.eye(3)[1]
    S = np.array([[0.5, 1.0], [3.0, 4.0], [-1.0, 2.0]])  # key k already holds [3, 4]
    v = np.array([2.0, -1.0])
    got = np.asarray(call(ex, fn, (S.copy(), k, v, 1.0), ("S", "k", "v", "beta")))
    read = k @ got
    if not np.allclose(read, v):
        raise fail(ex, f"after writing v = {v.tolist()} with beta = 1 under a unit key that held "
                       f"{(k @ S).tolist()}, reading that key gives {np.round(read, 4).tolist()}; "
                       "the delta rule overwrites it exactly")


# ---------------------------------------------------------------------------------- 13.5
def check_chunked_scan(fn) -> None:
    """Exercise 13.5: ``chunked_scan(q, k, v, a, C)``: causal linear attention with a decay,
    computed chunk by chunk (Mamba-2's SSD), from a zero state."""
    ex = "13.5"
    rng = check_rng(1205)
    for T, d_k, d_v, C in ((10, 3, 4, 4), (12, 5, 2, 3), (6, 4, 3, 8), (9, 2, 5, 1)):
        q, k = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k))
        _chunked_case(ex, fn, q, k, rng.normal(size=(T, d_v)), rng.uniform(0.5, 1.0, size=T), C)
    # Memory: a (T, T) float64 array would be 8 MiB here; chunk by chunk holds far less.
    n, C = 1024, 16
    q, k, v = (rng.normal(size=(n, 8)) for _ in range(3))
    measure: dict = {}
    call(ex, fn, (q, k, v, rng.uniform(0.9, 1.0, size=n), C), ("q", "k", "v", "a", "C"),
         forbid=_SSD_FORBID, measure=measure)
    full = n * n * 8
    if measure["peak"] >= full / 2:
        raise fail(ex, f"at T = {n}, C = {C} your function held {fmt(measure['peak'] / 2**20)} MiB "
                       f"at its peak, at least half of one (T, T) array ({fmt(full / 2**20)} "
                       "MiB). Likely mistake: that is the whole masked matrix (L ∘ QKᵀ)V; build "
                       "only each chunk's (C, C) block, and carry the state between chunks")
    passed(ex, "4 shapes (chunks that divide T, a shorter last chunk, C > T, C = 1) match the "
               "recurrence S_t = a_t S_(t-1) + k_t v_tᵀ; at T = 1024, C = 16 the peak memory "
               "stays below half of one (T, T) array")


_SSD_FORBID = {name: "write the chunked scan yourself" for name in (
    "mha_course.variants.ssd.ssd_chunked", "mha_course.variants.ssd.ssd_recurrent",
    "mha_course.variants.ssd.ssd_quadratic", "mha_course.variants.ssd.decay_mask",
    "mha_course.variants.delta_rule.delta_rule")}


def _chunked_variant(q, k, v, a, C, *, carry=True, read_decay=True, key_decay=True,
                     read_first=True, causal=True, diagonal=True, late=False):
    """The chunked scan with one known mistake switched on (all defaults: the right one)."""
    S = np.zeros((k.shape[1], v.shape[1]))
    out = []
    for s in range(0, len(k), C):
        qc, kc, vc, ac = q[s:s + C], k[s:s + C], v[s:s + C], a[s:s + C]
        g = np.cumprod(ac)
        L = g[:, None] / g[None, :]
        if causal:
            L = np.tril(L, 0 if diagonal else -1)
        g_read = (g / ac[0] if late else g) if read_decay else np.ones_like(g)
        S_new = (g[-1] if carry else 1.0) * S + kc.T @ (
            ((g[-1] / g) if key_decay else np.ones_like(g))[:, None] * vc)
        out.append((L * (qc @ kc.T)) @ vc + g_read[:, None] * (qc @ (S if read_first else S_new)))
        S = S_new
    return np.concatenate(out)


def _chunked_case(ex, fn, q, k, v, a, C):
    T, d_v = len(q), v.shape[1]
    want, _ = ssd_recurrent(q, k, v, a)
    got = call(ex, fn, (q, k, v, a, C), ("q", "k", "v", "a", "C"), forbid=_SSD_FORBID)

    def wrong(**switch):
        return lambda: _chunked_variant(q, k, v, a, C, **switch)

    compare(ex, got, want, f"your output (T {T}, d_k {q.shape[1]}, d_v {d_v}, C {C})", "(T, d_v)",
            variants=[
                ("the decay is not carried across the chunk boundary: before adding a chunk, "
                 "multiply the state carried in by the chunk's whole decay a_s⋯a_e",
                 wrong(carry=False)),
                ("the state carried in is read without its decay to each query: row i of "
                 "Q_c S needs g_i = a_s⋯a_i, the decay from the chunk boundary to position i",
                 wrong(read_decay=False)),
                ("the decay from the chunk boundary starts one token late: g_i = a_s⋯a_i "
                 "includes a_s, the decay of the chunk's first token",
                 wrong(late=True)),
                ("the chunk's keys are added to the state without their decay to the chunk's "
                 "end: key j is multiplied by a_(j+1)⋯a_e before it is carried on",
                 wrong(key_decay=False)),
                ("the state is updated with this chunk before it is read (off by one chunk): "
                 "read the state carried in first, then add this chunk's keys and values",
                 wrong(read_first=False)),
                ("the intra-chunk mask is not causal: L_c is 0 above the diagonal, a query "
                 "sees no later key of its chunk",
                 wrong(causal=False)),
                ("the intra-chunk mask leaves out its diagonal: o_t includes its own key "
                 "(L_tt = 1: the state is written before it is read)",
                 wrong(diagonal=False)),
            ])


# ---------------------------------------------------------------------------------- 13.6
def check_bos_mass(fn) -> None:
    """Exercise 13.6: ``bos_mass(scores, t_min)``: every head's mean causal attention weight
    on position 0 (the BOS), over the examples and the queries at ``t >= t_min``."""
    ex = "13.6"
    rng = check_rng(1206)
    for B, h, T, t_min in ((3, 4, 9, 2), (2, 3, 12, 5), (1, 2, 7, 1)):
        scores = rng.normal(size=(B, h, T, T))
        scores[:, 0, :, 0] += 3.0  # head 0 is a sink: its queries favour position 0
        _bos_case(ex, fn, scores, t_min)
    passed(ex, "the mass on position 0 matches the causal softmax's weight averaged over the "
               "examples and the queries t >= t_min, for 3 shapes (B, h, T, T), a sink head "
               "among them")


def _bos_case(ex, fn, scores, t_min):
    B, h, T, _ = scores.shape
    mask = causal_mask(T)
    want = first_position_mass([softmax(scores, mask=mask)], t_min)[0]
    got = call(ex, fn, (scores, t_min), ("scores", "t_min"), forbid={
        "mha_course.models.phenomena.first_position_mass": "measure the mass yourself",
        "mha_course.models.specialisation.pattern_score": "measure the mass yourself"})

    def mean_col0(w, start=t_min):
        return w[:, :, start:, 0].mean(axis=(0, 2))

    compare(ex, got, want, f"your mass for scores {(B, h, T, T)}, t_min {t_min}", "(h,)",
            variants=[
                ("the causal mask is forgotten: every query also weighs the keys after it, "
                 "so the weights on position 0 are too small; mask the future keys before the "
                 "softmax", lambda: mean_col0(softmax(scores))),
                ("the softmax normalises over the wrong axis (the queries, axis -2): each "
                 "query's weights over the keys it can see must sum to 1, so normalise over "
                 "the keys, the last axis", lambda: mean_col0(softmax(scores, axis=-2,
                                                                      mask=mask))),
                ("the queries before t_min are counted: at t = 0 the only key is position 0, "
                 "whose weight is trivially 1, and the first queries see few keys; average "
                 "over t >= t_min only", lambda: mean_col0(softmax(scores, mask=mask), 0)),
                ("off by one: the query at t_min is left out; count t >= t_min",
                 lambda: mean_col0(softmax(scores, mask=mask), t_min + 1)),
            ],
            shape_hints={(B, h): "the mean over the examples is missing: average over the "
                                 "batch and the queries, one number per head",
                         (h, T - t_min): "the mean over the queries is missing: one number "
                                         "per head"})
