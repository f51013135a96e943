"""Checks for lesson 15's spot-the-bug drill: the attention and layer bugs (15.1 to 15.8).

Each exercise hands the learner a broken function from a public bug report; its check runs the
learner's fix against the property tests of :mod:`mha_course.checks.properties` and reports
the first property it breaks, by name, with the evidence (``Exercise 13.N: property violated:
<property>. <evidence>``). The fix passes only when every property holds and the output equals
the package's reference, computed now. A known wrong fix (one that hides the symptom) gets its
likely mistake named as well (:mod:`mha_course.checks.variants`). The drill's other parts sit
beside this module in :mod:`mha_course.checks.drill`.
"""

from __future__ import annotations

import numpy as np

from ... import (
    MultiHeadAttention,
    causal_mask,
    param_count,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from .. import properties as P
from ..harness import (
    as_array,
    call,
    check_rng,
    compare,
    fail,
    fmt,
    fmt_index,
    fmt_shape,
    pair,
    passed,
    repeat,
)
from ..properties import array, require
from ..variants import (
    attention_hint,
    bias_product_attention,
    dropout_variant,
    heads_scaled,
    renormalised_after_mask,
)
from .decoding import no_layer

__all__ = [
    "check_causal_off_by_one", "check_dropout_scale", "check_fully_masked_rows",
    "check_head_scale", "check_mask_after_softmax", "check_merge_order", "check_minus_inf_bias",
    "check_output_width",
]

sdpa = scaled_dot_product_attention


def _qkv(rng, lead, T, S, d_k, d_v):
    return (rng.normal(size=(*lead, T, d_k)), rng.normal(size=(*lead, S, d_k)),
            rng.normal(size=(*lead, S, d_v)))


def _pair(ex, got, lead, T, S, d_v, label):
    out, w = pair(ex, got)
    return (array(ex, out, (*lead, T, d_v), f"your output {label}", "(..., T, d_v)"),
            array(ex, w, (*lead, T, S), f"your weights {label}", "(..., T, S)"))


# ----------------------------------------------------------- 15.1 scaled by d_model, not d_k
def check_head_scale(fn) -> None:
    """Exercise 15.1: ``multi_head_attention(x, W_q, W_k, W_v, W_o, h)`` -> (out, weights)."""
    ex, rng = "15.1", check_rng(901)
    for lead, T, d_model, h, d_k, d_v in (((2,), 5, 12, 3, 4, 6), ((), 4, 10, 2, 3, 5),
                                          ((1,), 3, 8, 4, 6, 2)):
        layer = MultiHeadAttention(d_model, h, d_k, d_v, rng=rng)
        _head_scale(ex, fn, layer, rng.normal(size=(*lead, T, d_model)))
    passed(ex, "every head is scaled by its own √d_k (d_k = d_model/h and d_k ≠ d_model/h)")


def _head_scale(ex, fn, layer, x):
    h, d_k, d_model = layer.h, layer.d_k, layer.d_model
    W = (layer.W_q, layer.W_k, layer.W_v, layer.W_o)
    label = f"for d_model={d_model}, h={h}, d_k={d_k}"
    got = call(ex, fn, (x, *W, h), ("x", "W_q", "W_k", "W_v", "W_o", "h"), hint=attention_hint,
               forbid=no_layer("fix the function, not call the package's layer"))
    out, w = pair(ex, got)
    want_out, want_w = layer(x)
    w = array(ex, w, want_w.shape, f"your weights {label}", "(..., h, T, T)")
    wrong = [("you divided by √(d_model / h): that is √d_k only when d_k = d_model / h; here "
              f"d_k = {d_k} (W_q.shape[1] // h)", lambda: heads_scaled(x, *W, h, d_model / h)[1])]
    for i in range(h):
        q_i, k_i = (x @ M[:, i * d_k:(i + 1) * d_k] for M in (layer.W_q, layer.W_k))
        alone = sdpa(q_i, k_i, k_i[..., :1])[1]  # single-head weights of head i
        found = P.moved(alone, w[..., i, :, :])
        require(ex, P.HEADS, found and f"head {i} ({label}): weight {fmt_index(found[0])} is "
                f"{fmt(found[2])} where single-head attention on its own q, k (d_k={d_k}) gives "
                f"{fmt(found[1])}", w, wrong)
    compare(ex, out, want_out, f"your output {label}", "(..., T, d_model)")


# --------------------------------------------------------- 15.2 the causal triangle, off by one
def check_causal_off_by_one(fn) -> None:
    """Exercise 15.2: ``causal_attention(q, k, v)`` -> (out, weights), T queries over T keys."""
    ex, rng = "15.2", check_rng(902)
    for lead, T, d_k, d_v in (((2,), 5, 4, 3), ((), 6, 3, 5), ((2, 1), 1, 2, 4)):
        _causal(ex, fn, rng, *_qkv(rng, lead, T, T, d_k, d_v))
    passed(ex, "each query sees itself and every earlier key, nothing later (T = 5, 6, 1)")


def _causal(ex, fn, rng, q, k, v):
    *lead, T, d_v = v.shape
    label = f"for T={T}"
    got = call(ex, fn, (q, k, v), ("q", "k", "v"), hint=attention_hint)
    out, w = _pair(ex, got, lead, T, T, d_v, label)
    tril = np.tril(np.ones((T, T), dtype=bool))
    first = (np.arange(T) == 0)[:, None] & (np.arange(T) == 0)  # only (0, 0)
    wrong = [("the triangle is the wrong way round (tril and triu swapped, nanoGPT#170): your "
              "mask shows the future and hides the past", lambda: sdpa(q, k, v, mask=tril.T)[1]),
             ("patching the first row hides the symptom: every query t sees keys 0..t, the "
              "diagonal included", lambda: sdpa(q, k, v, mask=np.tril(tril, -1) | first)[1])]
    require(ex, P.SELF, P.self_weight_violation(w), w, wrong)
    cut = T // 2 + 1
    q2, k2, v2 = (np.concatenate([a[..., :cut, :], 5 * rng.normal(size=a[..., cut:, :].shape)],
                                 axis=-2) for a in (q, k, v))
    out2, _ = pair(ex, call(ex, fn, (q2, k2, v2), ("q", "k", "v")))
    found = P.moved_text(out[..., :cut, :], np.asarray(out2, float)[..., :cut, :])
    require(ex, P.CAUSAL, found and f"changing tokens {cut}..{T - 1}: {found}", w, wrong)
    require(ex, P.SUMS, P.row_sum_violation(w), w, wrong)
    want_out, want_w = sdpa(q, k, v, mask=causal_mask(T))
    compare(ex, w, want_w, f"your weights {label}", "(..., T, T)")
    compare(ex, out, want_out, f"your output {label}", "(..., T, d_v)")


# ------------------------------------------------------ 15.3 masking the weights, not the scores
def check_mask_after_softmax(fn) -> None:
    """Exercise 15.3: ``masked_attention(q, k, v, mask)`` -> (out, weights)."""
    ex, rng = "15.3", check_rng(903)
    for lead, T, S, d_k, d_v in (((2,), 3, 5, 4, 6), ((), 4, 4, 3, 2)):
        mask = rng.random((*lead, T, S)) < 0.6
        mask[..., 0] |= ~mask.any(axis=-1)  # every query keeps a key
        _mask_after(ex, fn, rng, *_qkv(rng, lead, T, S, d_k, d_v), mask)
    passed(ex, "masked keys get 0, rows sum to 1, and masked keys cannot move the output")


def _mask_after(ex, fn, rng, q, k, v, mask):
    *lead, T, _ = q.shape
    S, d_v = v.shape[-2:]
    label = f"for T={T}, S={S}"
    names = ("q", "k", "v", "mask")
    out, w = _pair(ex, call(ex, fn, (q, k, v, mask), names, hint=attention_hint), lead, T, S,
                   d_v, label)
    require(ex, P.MASKED_ZERO, P.masked_weight_violation(w, mask))
    require(ex, P.SUMS, P.row_sum_violation(w))
    pad = np.arange(S) < S - 2  # (S,): the last two keys are padding for every query
    k3, v3 = k.copy(), v.copy()  # the padding keys made huge: their scores reach thousands
    k3[..., S - 2:, :] = 3000 * rng.normal(size=k3[..., S - 2:, :].shape)
    v3[..., S - 2:, :] = 3000 * rng.normal(size=v3[..., S - 2:, :].shape)
    before = _pair(ex, call(ex, fn, (q, k, v, pad), names), lead, T, S, d_v, label)[0]
    after = np.asarray(pair(ex, call(ex, fn, (q, k3, v3, pad), names))[0], float)
    wrong = [("renormalising after the softmax fixes the sums, but a masked key with a large "
              "score still pushes every other exp() to 0 (then 0/0): mask the scores with "
              "-inf BEFORE the softmax", lambda: renormalised_after_mask(q, k3, v3, pad)[0])]
    found = P.moved_text(before, after)
    require(ex, P.MASK_FREE, found and f"making the 2 padding keys 3000 times larger: {found}",
            after, wrong)
    want_out, want_w = sdpa(q, k, v, mask=mask)
    compare(ex, w, want_w, f"your weights {label}", "(..., T, S)")
    compare(ex, out, want_out, f"your output {label}", "(..., T, d_v)")


# ------------------------------------------------- 15.4 an additive mask built by multiplication
def check_minus_inf_bias(fn) -> None:
    """Exercise 15.4: ``attention_with_bias(q, k, v, keep)``, keep a float 1.0/0.0 mask."""
    ex, rng = "15.4", check_rng(904)
    for lead, T, S, d_k, d_v, dtype in (((2,), 3, 5, 4, 6, np.float64),
                                        ((), 4, 6, 3, 2, np.float64), ((), 3, 4, 4, 3, np.float16)):
        keep = rng.random((*lead, T, S)) < 0.6
        keep[..., 0] |= ~keep.any(axis=-1)
        _bias(ex, fn, *(a.astype(dtype) for a in _qkv(rng, lead, T, S, d_k, d_v)), keep)
    passed(ex, "finite weights that sum to 1 from a float mask, in float64 and in float16")


def _bias(ex, fn, q, k, v, keep):
    *lead, T, _ = q.shape
    S, d_v = v.shape[-2:]
    half = q.dtype == np.float16
    label = f"for T={T}, S={S}, {q.dtype.name}"
    got = call(ex, fn, (q, k, v, keep.astype(q.dtype)), ("q", "k", "v", "keep"),
               hint=attention_hint)
    out, w = _pair(ex, got, lead, T, S, d_v, label)
    wrong = [("np.nan_to_num turns the NaN weights into 0, so every kept weight is 0 too: the "
              "NaN came from 0·(−inf) in the bias",
              lambda: bias_product_attention(q, k, v, keep, clean=True)[1]),
             ("(1 - keep) * -1e9 is -inf in float16 (its largest value is 65504): 0·(−inf) is "
              "back. Build the bias with np.where(keep > 0, 0.0, -np.inf), no product",
              lambda: bias_product_attention(q, k, v, keep, -1e9)[1] if half else None)]
    bad = P.first_nonfinite(w)
    require(ex, P.FINITE, bad and f"your weights {label}: {bad}", w, wrong)
    want_out, want_w = sdpa(*(a.astype(float) for a in (q, k, v)), mask=keep)
    if not half:
        require(ex, P.SUMS, P.row_sum_violation(w), w, wrong)
        compare(ex, w, want_w, f"your weights {label}", "(..., T, S)")
        compare(ex, out, want_out, f"your output {label}", "(..., T, d_v)")
        return
    sums = w.sum(axis=-1)  # half precision keeps about 3 significant digits
    off = np.argwhere(np.abs(sums - 1) > 0.01)
    require(ex, P.SUMS, len(off) and f"{label}: row {fmt_shape(off[0])} of the weights sums "
            f"to {fmt(sums[tuple(off[0])])}", w, wrong)
    if not np.allclose(out, want_out, atol=0.02):
        raise fail(ex, f"your output {label} is not the float64 output to 2 decimals")


# -------------------------------------------------- 15.5 a row with nothing to attend to
def check_fully_masked_rows(fn) -> None:
    """Exercise 15.5: ``masked_softmax(scores, valid_lens)``: scores (B, T, S), lengths (B,)."""
    ex, rng = "15.5", check_rng(905)
    for B, T, S, lens in ((3, 2, 5, [5, 0, 2]), (2, 3, 4, [0, 3]), (2, 4, 3, [3, 1])):
        _empty_rows(ex, fn, rng.normal(size=(B, T, S)) * 2, np.array(lens))
    passed(ex, "valid_lens with 0s: masked keys get 0, an empty sequence gets 0s, never a NaN")


def _empty_rows(ex, fn, scores, lens):
    B, T, S = scores.shape
    keep = np.arange(S)[None, None, :] < lens[:, None, None]  # (B, 1, S)
    label = f"for valid_lens={lens.tolist()}, S={S}"
    wrong = [("a -inf fill on a row with no key left: its max is -inf and -inf - (-inf) is NaN",
              lambda: softmax(np.where(keep, scores, -np.inf)))]
    w = array(ex, call(ex, fn, (scores, lens), ("scores", "valid_lens")), (B, T, S),
              f"your weights {label}", "(B, T, S)")
    require(ex, P.FINITE, P.first_nonfinite(w), w, wrong)
    require(ex, P.MASKED_ZERO, P.masked_weight_violation(w, keep), w, wrong)
    require(ex, P.SUMS, P.row_sum_violation(w, np.broadcast_to(lens[:, None] == 0, (B, T))), w,
            wrong)
    try:
        with np.errstate(invalid="raise", divide="raise", over="ignore", under="ignore"):
            fn(scores.copy(), lens.copy())
    except FloatingPointError as exc:
        raise P.violated(ex, P.NO_NAN_INSIDE, f"{label}: NumPy reports '{exc}' inside your "
                         "function; a NaN cleaned up afterwards still makes NaN gradients in an "
                         "autograd framework (pytorch/pytorch#24816)") from None
    want = softmax(scores, mask=np.broadcast_to(keep, scores.shape))
    compare(ex, w, want, f"your weights {label}", "(B, T, S)")


# ----------------------------------------------------- 15.6 merging heads: reshape, then transpose
def check_merge_order(fn) -> None:
    """Exercise 15.6: ``attention_layer(x, W_q, W_k, W_v, W_o, h)`` -> (out, weights)."""
    ex, rng = "15.6", check_rng(906)
    for lead, T, d_model, h, d_k, d_v in (((), 5, 12, 3, 4, 2), ((2,), 4, 10, 3, 3, 5),
                                          ((3,), 3, 8, 2, 4, 6)):
        layer = MultiHeadAttention(d_model, h, d_k, d_v, rng=rng)
        _merge(ex, fn, rng, layer, rng.normal(size=(*lead, T, d_model)))
    passed(ex, "the merged heads keep each token's row: shuffles commute, batches stay apart")


def _merge(ex, fn, rng, layer, x):
    W, h = (layer.W_q, layer.W_k, layer.W_v, layer.W_o), layer.h
    *lead, T, d_model = x.shape
    label = f"for x {fmt_shape(x.shape)}, h={h}"

    def run(x_):
        got = call(ex, fn, (x_, *W, h), ("x", "W_q", "W_k", "W_v", "W_o", "h"),
                   hint=attention_hint,
                   forbid=no_layer("fix the function, not call the package's layer"))
        return array(ex, pair(ex, got)[0], x_.shape, f"your output {label}", "(..., T, d_model)")

    heads = sdpa(*(split_heads(x @ M, h) for M in W[:3]))[0]  # (..., h, T, d_v)
    wrong = [("np.swapaxes(heads, 0, 1) swaps heads and tokens for ONE sequence; with a batch "
              "axis it swaps batch and heads: swap axes -3 and -2", lambda: np.swapaxes(
                  heads, 0, 1).reshape(*lead, T, -1) @ layer.W_o)]
    out = run(x)
    perm = rng.permutation(T)
    found = P.moved_text(out[..., perm, :], run(x[..., perm, :]))
    require(ex, P.EQUIVARIANT, found and f"{label}: {found}", out, wrong)
    if lead:
        found = P.moved_text(out[1:], run(x[1:]))
        require(ex, P.BATCH, found and f"{label}, sequences 1.. run without sequence 0: "
                f"{found}", out, wrong)
    compare(ex, out, layer(x)[0], f"your output {label}", "(..., T, d_model)")


# ---------------------------------------------------------- 15.7 W_o's input width: h·d_v
FITS = "the weights fit together: Concat of the h heads, h·d_v wide, times W_o gives d_model"
PARAMS = ("the parameters are 2·d_model·h·d_k + 2·h·d_v·d_model (4·d_model² when h·d_k = "
          "h·d_v = d_model)")
XAVIER = "Xavier uniform: a (fan_in, fan_out) matrix spreads over ±√(6 / (fan_in + fan_out))"


def check_output_width(fn) -> None:
    """Exercise 15.7: ``init_weights(d_model, h, d_k=None, d_v=None, rng=None)`` -> dict."""
    ex = "15.7"
    for d_model, h, d_k, d_v in ((64, 8, None, None), (48, 4, 16, 8), (30, 3, 10, 7)):
        dk = d_model // h if d_k is None else d_k
        dv = dk if d_v is None else d_v
        label = f"for d_model={d_model}, h={h}, d_k={dk}, d_v={dv}"
        got = call(ex, fn, (d_model, h, d_k, d_v), ("d_model", "h", "d_k", "d_v"),
                   {"rng": 907}, forbid={"mha_course.MultiHeadAttention.__init__":
                                         "fix the function, not build the package's layer"})
        if not isinstance(got, dict) or set(got) != {"W_q", "W_k", "W_v", "W_o"}:
            raise fail(ex, f"expected a dict with keys W_q, W_k, W_v, W_o; got {got!r:.80}")
        want = {"W_q": (d_model, h * dk), "W_k": (d_model, h * dk), "W_v": (d_model, h * dv),
                "W_o": (h * dv, d_model)}
        for name, shape in want.items():
            arr = as_array(ex, got[name], name, shape, "", "f")
            require(ex, FITS, arr.shape != shape and f"{label}: {name} has shape "
                     f"{fmt_shape(arr.shape)}; {name} must be {fmt_shape(shape)}")
        total = sum(np.size(a) for a in got.values())
        require(ex, PARAMS, total != param_count(d_model, h, dk, dv) and
                 f"{label}: you have {total:,} parameters, not {param_count(d_model, h, dk, dv):,}")
        for name, arr in got.items():
            fan_in, fan_out = arr.shape
            bound = np.sqrt(6 / (fan_in + fan_out))
            ratio = float(np.std(arr)) / (bound / np.sqrt(3))
            if np.abs(arr).max() > bound * (1 + 1e-9) or not 0.85 < ratio < 1.15:
                raise P.violated(ex, XAVIER, f"{label}: {name}'s entries have std {ratio:.2f} "
                                 f"times the Xavier value for {fmt_shape(arr.shape)}",
                                 "W_o was drawn for a wider input and then cut: draw it with "
                                 "fan_in = h·d_v" if name == "W_o" else None)
    passed(ex, "W_o reads the h·d_v concatenated head outputs, for d_k and d_v set or not")


# ----------------------------------------------------------------- 15.8 dropout's scale
EXPECTED = "dropout keeps each weight's expected value: the mean over many draws is the weight"
DROPPED = "dropout drops a fraction p of the weights"
EVAL = "in evaluation (training=False) dropout changes nothing"


def check_dropout_scale(fn) -> None:
    """Exercise 15.8: ``attention_dropout(weights, p, rng, training=True)``."""
    ex, n = "15.8", 4000
    w = softmax(check_rng(908).normal(size=(3, 4, 5)))
    for p in (0.1, 0.3):
        args, names = (w, p, 1), ("weights", "p", "rng")  # a seed; a Generator below
        got = call(ex, fn, args, names, forbid={"mha_course.dropout": "write the dropout yourself"})
        first = array(ex, got, w.shape, f"your weights for p={p}", "the weights' shape")
        wrong = [(m, lambda how=how, p=p: dropout_variant(w, p, np.random.default_rng(1), how=how))
                 for m, how in (("you multiplied the survivors by 1 - p; divide by 1 - p",
                                 "times"),
                                ("renormalising each row after dropout does not keep each "
                                 "weight's expected value", "renormalise"),
                                ("you kept each weight with probability p; dropout DROPS with "
                                 "probability p and keeps with 1 - p", "keep_with_p"))]
        evaluated = call(ex, fn, args, names, {"training": False})
        require(ex, EVAL, P.moved_text(w, array(ex, evaluated, w.shape, "your eval weights", "")))
        gen = np.random.default_rng(2)
        with np.errstate(all="ignore"):
            draws = np.stack([np.asarray(x, dtype=float) for x in repeat(fn, (w, p, gen), n)])
        share = float((draws == 0).mean())
        spread = 6 * np.sqrt(p * (1 - p) / draws.size)
        require(ex, DROPPED, abs(share - p) > spread and f"with p={p} you zeroed "
                 f"{share:.1%} of {draws.size:,} weights", first, wrong)
        mean = draws.mean(axis=0)
        bad = np.argwhere(~(np.abs(mean - w) <= 6 * w * np.sqrt(p / (1 - p) / n) + 1e-9))
        if len(bad):
            i = tuple(bad[0])
            require(ex, EXPECTED, f"with p={p}, weight {fmt_index(i)} = {fmt(w[i])} averages "
                     f"{fmt(mean[i])} over {n:,} draws", first, wrong)
    passed(ex, f"p = 0.1 and 0.3: {n:,} draws keep every expected weight; eval changes nothing")
