"""Checks for lesson 15's spot-the-bug drill: attention across devices and packed
rows (15.22 to 15.24), from ``notebooks/11_parallel.ipynb``.

A row-parallel output projection whose bias is added on every device, a packed row whose
documents see each other, and a log-sum-exp merge fed a base-2 log-sum-exp. Like
:mod:`mha_course.checks.drill.attention`, each check names the first property the learner's function
breaks, with the evidence, computes its reference at check time, probes several shapes, and
names the likely mistake of a known wrong fix.
"""

from __future__ import annotations

import math

import numpy as np

from ... import MultiHeadAttention, causal_mask, sinusoidal_positions, tiled_attention
from ...parallel.collectives import Cluster
from ...parallel.packing import varlen_mask
from .. import properties as P
from ..harness import call, fail, pair, passed
from ..measure import check_rng
from ..properties import array, require

__all__ = ["check_lse_merge", "check_packed_documents", "check_row_parallel_bias"]

#: The properties these checks name, beside those of :mod:`mha_course.checks.properties`.
TP_EQUAL = ("tensor parallelism changes nothing: every device ends with the single-device "
            "layer's output, concat @ W_o + b_o")
TP_TRAFFIC = "one all-reduce of the (T, d_model) output per layer: 2 (p - 1) / p of it per device"
DOCS = "packed documents are independent: changing one changes no other document's output"
ALONE = "a packed document's output equals the document run alone, from position 0"
MERGE = "merging two parts by their log-sum-exp equals attention over all the keys"
LSE_NATURAL = "the merged log-sum-exp is log Σ exp(score), in natural log"


# ------------------------------------------------ 15.22 the bias of a row-parallel W_o
def _row_parallel(cluster, concat_shards, W_o_shards, b_o, how):
    """The known wrong versions of 15.22, on the cluster."""
    partial = [c @ W for c, W in zip(concat_shards, W_o_shards, strict=True)]
    if how == "no_all_reduce":
        return [x + b_o for x in partial]
    if how == "average":
        return [x / cluster.p + b_o for x in cluster.all_reduce(partial)]
    return cluster.all_reduce([x + b_o for x in partial])  # the bug itself


def check_row_parallel_bias(fn) -> None:
    """Exercise 15.22: ``row_parallel_out(cluster, concat_shards, W_o_shards, b_o)`` -> list."""
    ex, rng = "15.22", check_rng(1324)
    for p, T, d_model, d_head in ((2, 3, 5, 4), (4, 4, 6, 2), (3, 2, 7, 3)):
        concat = rng.normal(size=(T, p * d_head))  # every head's output, side by side
        W_o = rng.normal(size=(p * d_head, d_model))
        b_o = rng.normal(size=d_model) + 2.0
        want = concat @ W_o + b_o
        concat_shards = np.split(concat, p, axis=1)  # device j: its heads' columns
        W_o_shards = np.split(W_o, p, axis=0)  # device j: the rows that read them
        label = f"on p={p} devices, T={T}, d_model={d_model}"
        cluster = Cluster(p)
        got = call(ex, lambda c_, w_, b_, cl=cluster: fn(cl, c_, w_, b_),
                   (concat_shards, W_o_shards, b_o), ("concat_shards", "W_o_shards", "b_o"),
                   forbid={"mha_course.parallel.tensor.TensorParallelAttention":
                           "fix the row-parallel projection yourself"})
        if not isinstance(got, (list, tuple)) or len(got) != p:
            raise fail(ex, f"{label} your function returned {type(got).__name__}; expected a "
                           f"list of {p} arrays, one per device")
        wrong = [("the all-reduce is gone: each device keeps its own heads' term, a 1/p share "
                  "of the output (sgl-project/sglang PR #14811: reduce_results=False on a "
                  "RowParallelLinear gave garbage with TP > 1)",
                  lambda a=(concat_shards, W_o_shards, b_o), p=p: _row_parallel(
                      Cluster(p), *a, "no_all_reduce")),
                 ("averaging the sum hides the extra biases but divides the layer's output by "
                  "p: sum the terms, then add b_o once",
                  lambda a=(concat_shards, W_o_shards, b_o), p=p: _row_parallel(
                      Cluster(p), *a, "average"))]
        for i, g in enumerate(got):
            g = array(ex, g, want.shape, f"device {i}'s output {label}", "(T, d_model)")
            found = P.moved_text(want, g)
            variants = [(m, (lambda mk=mk, i=i: mk()[i])) for m, mk in wrong]
            require(ex, TP_EQUAL, found and f"{label}, device {i}: {found}", g, variants)
        sent = cluster.sent.tolist()
        limit = 2 * (p - 1) * -(-want.size // p) * want.itemsize  # 2 (p - 1) chunks of 1/p
        require(ex, TP_TRAFFIC, max(sent) > limit and f"{label} the devices sent {sent} bytes; "
                f"one all-reduce of the output sends {limit} per device (gathering the heads "
                "and multiplying by the whole W_o needs every shard on every device)")
    passed(ex, "2, 3 and 4 devices: the bias once after one all-reduce, every device equal to "
               "concat @ W_o + b_o")


# --------------------------------------- 15.23 packed documents: the mask and the positions
def _alone(layer, x, lengths):
    cu = np.concatenate([[0], np.cumsum(lengths)])
    pe = sinusoidal_positions(max(lengths), layer.d_model)
    return np.concatenate([layer(x[a:b] + pe[: b - a], mask=causal_mask(b - a))[0]
                           for a, b in zip(cu[:-1], cu[1:], strict=True)])


def _packed_variant(layer, x, lengths, reset_positions, block_mask):
    cu = np.concatenate([[0], np.cumsum(lengths)])
    total = int(cu[-1])
    pos = (np.arange(total) - np.repeat(cu[:-1], lengths)) if reset_positions else np.arange(total)
    mask = varlen_mask(cu) if block_mask else causal_mask(total)
    return layer(x + sinusoidal_positions(total, layer.d_model)[pos], mask=mask)[0]


def check_packed_documents(fn) -> None:
    """Exercise 15.23: ``packed_forward(layer, x, lengths)`` -> (total, d_model)."""
    ex, rng = "15.23", check_rng(1325)
    for d_model, h, lengths in ((8, 2, [3, 5, 2]), (12, 3, [4, 1, 6, 3]), (6, 1, [7])):
        layer = MultiHeadAttention(d_model, h, rng=rng)
        x = rng.normal(size=(sum(lengths), d_model))
        label = f"for documents of lengths {lengths} (d_model={d_model}, h={h})"
        args = (layer, x, list(lengths))

        def run(xx, ls=tuple(lengths), layer=layer, label=label):
            got = call(ex, fn, (layer, xx, list(ls)), ("layer", "x", "lengths"),
                       forbid={"mha_course.parallel.packing":
                               "build the mask and positions yourself"})
            return array(ex, got, (sum(ls), layer.d_model), f"your output {label}",
                         "(total, d_model)")

        out = run(x)
        reset_only = ("restarting the positions is half the fix: the causal mask still spans "
                      "the row, so a document attends to the ones packed before it "
                      "(huggingface/nanoVLM PR #204 measured it: positions reset alone did not "
                      "stop the leak)",
                      lambda a=args: _packed_variant(*a, True, False))
        mask_only = ("the block-diagonal mask is half the fix: with absolute positions a "
                     "document packed at offset n sees encodings n, n+1, ... that it never sees "
                     "alone; restart them at 0 in each document",
                     lambda a=args: _packed_variant(*a, False, True))
        if len(lengths) > 1:
            x2 = x.copy()
            x2[: lengths[0]] = rng.normal(size=(lengths[0], d_model))  # another first document
            found = P.moved_text(out[lengths[0]:], run(x2)[lengths[0]:])
            require(ex, DOCS, found and f"{label}: document 0 changed and a later document's "
                    f"{found}", out, [reset_only])
        found = P.moved_text(_alone(layer, x, lengths), out)
        require(ex, ALONE, found and f"{label}: {found}", out, [reset_only, mask_only])
    passed(ex, "one, three and four packed documents: each independent of the others and equal "
               "to itself alone, positions from 0")


# --------------------------------------------- 15.24 a log-sum-exp merge, and its base
LN2 = math.log(2.0)


def _parts(rng, T, S, d, split, empty_row=False, gap=0.0):
    """Two partial results over keys ``:split`` and ``split:``, their lse in base 2, and the
    reference over all keys. ``gap`` lifts part b's scores far above part a's."""
    u = rng.normal(size=d)
    q = rng.normal(size=(T, d)) + (5.0 * u if gap else 0.0)
    k, v = rng.normal(size=(S, d)), rng.normal(size=(S, d))
    k[split:] += gap * u  # part b's keys along the queries' shared direction
    in_a = np.zeros((T, S), dtype=bool)
    in_a[:, :split] = True
    if empty_row:
        in_a[0, :] = False  # query 0 has no key in part a (its lse there is -inf)
    out_a, lse_a = tiled_attention(q, k, v, mask=in_a, return_lse=True)
    out_b, lse_b = tiled_attention(q, k, v, mask=~in_a, return_lse=True)
    full, lse = tiled_attention(q, k, v, return_lse=True)
    return (out_a, lse_a / LN2, out_b, lse_b / LN2), (full, lse)


def check_lse_merge(fn) -> None:
    """Exercise 15.24: ``merge(out_a, lse2_a, out_b, lse2_b)`` -> (out, lse), lse natural."""
    ex, rng = "15.24", check_rng(1326)
    for T, S, d, split, empty, gap in ((3, 7, 4, 3, False, 0.0), (4, 9, 5, 5, True, 0.0),
                                       (2, 6, 3, 2, False, 3000.0)):
        args, (want, want_lse) = _parts(rng, T, S, d, split, empty, gap)
        label = (f"for T={T} queries over {split} + {S - split} keys"
                 + (", query 0 with no key in part a" if empty else "")
                 + (", one part's scores far above the other's" if gap else ""))
        got = pair(ex, call(ex, fn, args, ("out_a", "lse2_a", "out_b", "lse2_b")),
                   ("out", "lse"))
        out = array(ex, got[0], want.shape, f"your out {label}", "(T, d_v)")
        lse = array(ex, got[1], want_lse.shape, f"your lse {label}", "(T,)")
        bad = P.first_nonfinite(out)
        require(ex, P.FINITE, bad and f"{label}: out {bad}", out, [
            ("lse_a + log(1 + exp(lse_b - lse_a)) breaks when a part is empty (-inf + inf) "
             "and overflows when the parts' scores are far apart; np.logaddexp (or "
             "lse_a - log sigmoid(lse_a - lse_b)) does neither "
             "(zhuzilin/ring-flash-attention PR #30)",
             lambda args=args: _merge(args, lambda a, b: a + np.log(1 + np.exp(b - a)))[0])])
        found = P.moved_text(want, out)
        require(ex, MERGE, found and f"{label}: {found}", out, [
            ("the two log-sum-exps were added: log a + log b is log(a·b), not log(a + b) "
             "(zhuzilin/ring-flash-attention#20)",
             lambda args=args: _merge(args, lambda a, b: a + b)[0]),
            ("the base-2 log-sum-exps were merged as natural ones: multiply them by ln 2 first "
             "(or merge with np.logaddexp2 and np.exp2)",
             lambda args=args: _merge(args, np.logaddexp, convert=False)[0])])
        found = P.moved_text(want_lse, lse, "lse")
        require(ex, LSE_NATURAL, found and f"{label}: {found}", lse, [
            ("the output is right but lse is still in base 2: callers expect natural log, "
             "torch.logsumexp's (lightseekorg/tokenspeed PR #571 fixed a kernel that stored "
             "its base-2 lse)",
             lambda args=args: _merge(args, np.logaddexp2, convert=False, natural_out=True)[1])])
    passed(ex, "three merges (a query with no key in one part, parts far apart) equal attention "
               "over all the keys, lse in natural log")


def _merge(args, combine, convert=True, natural_out=False):
    out_a, a, out_b, b = args
    if convert:
        a, b = a * LN2, b * LN2
    with np.errstate(all="ignore"):
        lse = combine(a, b)
        if natural_out:  # base-2 throughout: the output right, lse left in base 2
            w_a, w_b = np.exp2(a - lse), np.exp2(b - lse)
        else:
            w_a, w_b = np.exp(a - lse), np.exp(b - lse)
        return w_a[..., None] * out_a + w_b[..., None] * out_b, lse

