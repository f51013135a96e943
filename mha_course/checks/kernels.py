"""Checks for lesson 07's kernel exercises, 07.7 to 07.10: FlashAttention's classic mistakes in
Triton (``solutions/07_flash_attention.ipynb``).

The lesson is ``notebooks/07_flash_attention.ipynb`` and its deep dive
``notebooks/deep_dives/07c_triton_kernels.ipynb``. Each ``check_*`` takes the learner's
``@triton.jit`` kernel (whose signature the exercise gives), launches it through Triton's
interpreter on torch CPU tensors (``TRITON_INTERPRET=1``, set before triton is imported) on
designed inputs, and compares what it wrote with :func:`mha_course.tiled_attention` (float64,
NumPy). When they differ it names the classic mistake: the accumulator not rescaled when the
running max grows, the log-sum-exp not written or in base 2, the causal mask off by one on the
diagonal or aligned top-left, the GQA head mapped by ``i % g``, a tail block read or written past
the end, the backward's weights recomputed without the saved log-sum-exp or without subtracting
D = rowsum(dO ∘ O). Every tensor the kernel reads or writes is a view of a larger one whose
extra rows hold NaN, and the interpreter's loads and stores are watched while the kernel runs:
a lane that touches those rows is a read (or write) past the end, even where a later
``tl.where`` hides the value it read (the launch: :mod:`mha_course.checks.kernel_launch`).

Triton and torch are imported when a check runs, never by ``import mha_course``; without them a
check raises ``ImportError`` saying how to install them (``pip install -e '.[kernels]'``). A plain
Python function in place of a kernel (the generic contract's stubs) is called with the same
arguments as the kernel, so the exercise stub's ``NotImplementedError`` passes through.
"""

from __future__ import annotations

import math

import numpy as np

from .. import attention_backward, softmax, tiled_attention
from .harness import check_rng, fail, fmt_pair, passed
from .kernel_launch import GUARD, launch_kernel

__all__ = [
    "check_backward_from_lse",
    "check_causal_mask_tile",
    "check_gqa_head_map",
    "check_online_softmax_kernel",
    "check_tail_block_masks",
]

#: float32 kernel against the float64 reference.
RTOL, ATOL = 2e-4, 2e-5


def _out(ex, hits, name, shape) -> np.ndarray:
    """Output ``name`` of a launch, as float64, checked to be what the launch returns."""
    try:
        arr = np.asarray(hits["out"][name], dtype=float)
    except (KeyError, TypeError, ValueError):
        raise fail(ex, f"the launch did not return the output {name}") from None
    if arr.shape != tuple(shape):
        raise fail(ex, f"the launch returned {name} of shape {arr.shape}; expected {shape}")
    return arr


def _close(a, b) -> bool:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))


def _first_diff(got, want) -> str:
    diff = np.abs(got - want)
    diff = np.where(np.isnan(diff) & ~(np.isnan(got) & np.isnan(want)), np.inf, diff)
    diff = np.where(np.isnan(diff), 0.0, diff)
    at = np.unravel_index(int(np.argmax(diff)), diff.shape)
    mine, theirs = fmt_pair(got[at], want[at])
    return f"at index {tuple(int(i) for i in at)} you wrote {mine}, the reference gives {theirs}"


def _judge(ex, got, want, what, variants, unwritten, stored=True):
    """Fail unless ``got`` (float array) is close to ``want``; name a matching variant.
    ``stored``: whether the kernel stored anything into it (else ``unwritten`` is the mistake)."""
    if _close(got, want):
        return
    if not stored and np.isnan(got).all():
        raise fail(ex, f"{what}: still all NaN, as the check filled it. Likely mistake: "
                       f"{unwritten}")
    for message, make in variants:
        with np.errstate(all="ignore"):
            wrong = make()
        if wrong is not None and not _close(wrong, want) and _close(got, wrong):
            raise fail(ex, f"{what}: not what the reference gives. Likely mistake: {message}")
    raise fail(ex, f"{what}: not what the reference gives; {_first_diff(got, want)}")


def _past_end(ex, hits, label, fixes):
    """Fail if a lane read or wrote a guard row; ``fixes`` maps a tensor name to its fix."""
    for kind in ("wrote", "read"):
        for name in hits[kind]:
            raise fail(ex, f"{label}: your kernel {kind} past the end of {name} (the check put "
                           f"{GUARD} rows of NaN after it in memory and watched every "
                           f"tl.load and tl.store). Likely mistake: {fixes.get(name, '')}")


# ------------------------------------------------------------------ NumPy references, variants
def _rising(rng, T, S, d, steps):
    """q, k, v whose scores grow from key block to key block: the running max keeps moving."""
    q = rng.normal(size=(T, d))
    q[:, 0] = np.abs(q[:, 0]) + 1.0
    k = rng.normal(size=(S, d))
    k[:, 0] = np.linspace(0.0, steps, S) + rng.normal(size=S) * 0.3
    return q, k, rng.normal(size=(S, d))


def _online(q, k, v, block, rescale_acc=True, rescale_l=True, flip=False, divide=True):
    """(out, lse) of the online softmax over key blocks, with a switch per mistake."""
    T, d = q.shape
    x = q @ k.T / math.sqrt(d)
    m = np.full(T, -np.inf)
    l_ = np.zeros(T)
    acc = np.zeros((T, v.shape[1]))
    for s0 in range(0, k.shape[0], block):
        s = x[:, s0 : s0 + block]
        m_new = np.maximum(m, s.max(axis=1))
        alpha = np.exp(m_new - m) if flip else np.exp(m - m_new)
        p = np.exp(s - m_new[:, None])
        l_ = (l_ * alpha if rescale_l else l_) + p.sum(axis=1)
        acc = (acc * alpha[:, None] if rescale_acc else acc) + p @ v[s0 : s0 + block]
        m = m_new
    return (acc / l_[:, None] if divide else acc), m + np.log(l_)


# ---------------------------------------------------------------------------------- 07.7
def check_online_softmax_kernel(kernel) -> None:
    """Exercise 07.7: ``flash_forward(Q, K, V, O, LSE, T, S, scale, D, BLOCK_M, BLOCK_N)``."""
    ex = "07.7"
    rng = check_rng(707)
    # (T, S, d, how fast the scores rise across key blocks, what is special)
    for T, S, d, steps, label in ((20, 45, 16, 12.0, "scores that rise block by block"),
                                  (9, 16, 32, 0.0, "one key block"),
                                  (17, 40, 16, -12.0, "scores that fall block by block")):
        q, k, v = _rising(rng, T, S, d, steps)
        want_o, want_lse = tiled_attention(q, k, v, block_size=16, return_lse=True)
        specs = [("in", "Q", q), ("in", "K", k), ("in", "V", v), ("out", "O", (T, d)),
                 ("out", "LSE", (T,)), T, S, 1 / math.sqrt(d)]
        hits = launch_kernel(ex, kernel, ((T + 15) // 16,), specs,
                       {"D": d, "BLOCK_M": 16, "BLOCK_N": 16})
        what = f"for T={T} queries, S={S} keys, d={d} ({label})"
        _past_end(ex, hits, what, {"O": "store O with mask=rows[:, None] < T",
                                   "LSE": "store LSE with mask=rows < T"})
        o, lse = _out(ex, hits, "O", (T, d)), _out(ex, hits, "LSE", (T,))
        a = (q, k, v, 16)
        _judge(ex, o, want_o, f"your O {what}", [
            ("the accumulator is not rescaled when the running max grows: multiply acc by "
             "alpha = exp(m_i - m_new) (alpha[:, None]) before adding tl.dot(p, v)",
             lambda a=a: _online(*a, rescale_acc=False)[0]),
            ("l is not rescaled when the running max grows: l_i = l_i * alpha + tl.sum(p, 1)",
             lambda a=a: _online(*a, rescale_l=False)[0]),
            ("the rescaling factor is upside down: alpha = exp(m_i - m_new) <= 1, not "
             "exp(m_new - m_i)", lambda a=a: _online(*a, flip=True)[0]),
            ("O is the unnormalised acc: divide by l once, after the loop (acc / l_i[:, None])",
             lambda a=a: _online(*a, divide=False)[0]),
        ], "store O after the loop: tl.store(O + rows[:, None] * D + offs_d[None, :], "
           "acc / l_i[:, None], mask=rows[:, None] < T)", "O" in hits["stored"])
        m_row = (q @ k.T / math.sqrt(d)).max(axis=1)
        _judge(ex, lse, want_lse, f"your LSE {what}", [
            ("LSE is in base 2 (m + log2 l, or exp2 scores): the backward pass expects the "
             "natural log, lse = m_i + log(l_i)", lambda w=want_lse: w / math.log(2)),
            ("LSE is log(l_i) alone: l_i is relative to the running max, so lse = m_i + "
             "log(l_i)", lambda w=want_lse, m=m_row: w - m),
            ("LSE is the running max alone: add log(l_i)", lambda m=m_row: m),
        ], "the log-sum-exp was not written: tl.store(LSE + rows, m_i + tl.log(l_i), "
           "mask=rows < T); the backward pass recomputes the weights from it",
            "LSE" in hits["stored"])
    passed(ex, "scores that rise and fall across key blocks, one key block, T and S not "
               "multiples of 16: O and LSE match mha_course.tiled_attention, nothing past the "
               "ends touched")


# ---------------------------------------------------------------------------------- 07.8
def _masked(q, k, v, keep):
    return tiled_attention(q, k, v, mask=keep, block_size=16, return_lse=True)


def check_causal_mask_tile(kernel) -> None:
    """Exercise 07.8: ``causal_forward(Q, K, V, O, LSE, T, S, scale, D, BLOCK_M, BLOCK_N)``."""
    ex = "07.8"
    rng = check_rng(708)
    for T, S, d in ((20, 37, 16), (32, 32, 16), (16, 48, 16)):
        q, k, v = rng.normal(size=(T, d)), rng.normal(size=(S, d)), rng.normal(size=(S, d))
        want_o, want_lse = tiled_attention(q, k, v, causal=True, block_size=16,
                                           return_lse=True)
        t, s = np.arange(T)[:, None], np.arange(S)[None, :]
        specs = [("in", "Q", q), ("in", "K", k), ("in", "V", v), ("out", "O", (T, d)),
                 ("out", "LSE", (T,)), T, S, 1 / math.sqrt(d)]
        hits = launch_kernel(ex, kernel, ((T + 15) // 16,), specs,
                       {"D": d, "BLOCK_M": 16, "BLOCK_N": 16})
        what = f"for T={T} queries, S={S} keys (offset S - T = {S - T}), blocks of 16"
        _past_end(ex, hits, what, {"K": "keep the loads masked (cols < S)",
                                   "V": "keep the loads masked (cols < S)"})
        o, lse = _out(ex, hits, "O", (T, d)), _out(ex, hits, "LSE", (T,))
        variants = [
            ("the diagonal is excluded: query t sees key s when s <= t + (S - T), '<=' not "
             "'<' (each query sees itself)", t + (S - T) > s),
            ("the mask is aligned top-left (s <= t): with T != S the queries are the LAST T "
             "of the S positions, so query t sees keys s <= t + (S - T)", t >= s),
            ("the mask is one key too wide: s <= t + (S - T), not s <= t + (S - T) + 1",
             t + (S - T) + 1 >= s),
            ("the mask compares the offsets inside the tile (tl.arange) instead of the "
             "absolute positions: use rows = start_m + ... and cols = start_n + ...",
             (t % 16) + (S - T) >= (s % 16)),
        ]
        for got, idx, name in ((o, 0, "O"), (lse, 1, "LSE")):
            want = (want_o, want_lse)[idx]
            if _close(got, want):
                continue
            for message, keep in variants:
                if keep.any(axis=1).all():
                    wrong = _quiet_masked(q, k, v, keep)
                    if wrong is not None and not _close(wrong[idx], want) \
                            and _close(got, wrong[idx]):
                        raise fail(ex, f"your {name} {what}: not what the reference gives. "
                                       f"Likely mistake: {message}")
            bad = np.argwhere(~np.isclose(got.reshape(T, -1), want.reshape(T, -1),
                                          rtol=RTOL, atol=ATOL).all(axis=1)).ravel()
            rows = ", ".join(str(int(r)) for r in bad[:4])
            raise fail(ex, f"your {name} {what}: wrong for queries {rows}"
                           f"{' ...' if len(bad) > 4 else ''} (query t sees keys 0 .. "
                           f"t + {S - T}; block edges at 16, 32, ...); "
                           f"{_first_diff(got, want)}")
    passed(ex, "T < S, T = S and T = S / 3 with blocks of 16 (the diagonal on a block edge): "
               "O and LSE match tiled_attention's bottom-right causal mask")


def _quiet_masked(q, k, v, keep):
    try:
        with np.errstate(all="ignore"):
            return _masked(q, k, v, keep)
    except Exception:
        return None


# ---------------------------------------------------------------------------------- 07.9
def check_gqa_head_map(kernel) -> None:
    """Exercise 07.9: ``gqa_forward(Q, K, V, O, T, S, scale, H, G, D, BLOCK_M, BLOCK_N)``,
    grid (query blocks, H)."""
    ex = "07.9"
    rng = check_rng(709)
    for H, G, T, S, d in ((6, 2, 9, 20, 16), (8, 4, 5, 13, 16), (4, 1, 7, 18, 16)):
        q = rng.normal(size=(H, T, d))
        k, v = rng.normal(size=(G, S, d)), rng.normal(size=(G, S, d))
        per_kv = np.stack([tiled_attention(q, k[j], v[j], block_size=16) for j in range(G)],
                          axis=1)  # (H, G, T, d): query head i against K/V head j
        want_map = np.arange(H) // (H // G)
        want = per_kv[np.arange(H), want_map]
        specs = [("in", "Q", q), ("in", "K", k), ("in", "V", v), ("out", "O", (H, T, d)),
                 T, S, 1 / math.sqrt(d), H, G]
        hits = launch_kernel(ex, kernel, ((T + 15) // 16, H), specs,
                       {"D": d, "BLOCK_M": 16, "BLOCK_N": 16})
        what = f"for h={H} query heads, g={G} K/V heads (groups of {H // G})"
        i = np.arange(H)
        guesses = [
            (i % G, "i % g interleaves the groups: consecutive query heads share a K/V head, "
                    "so head i reads K/V head i // (h // g)"),
            (i // G, "i // g divides by the number of K/V heads; divide by the group size "
                     "h // g: kv_head = i // (h // g)"),
            (i, "query head i read K/V head i, as if K and V had been copied to h heads "
                "(repeat_interleave); GQA never copies them: kv_head = i // (h // g)"),
        ]
        _past_end(ex, {"read": [], "wrote": hits["wrote"]}, what, {
            "O": "write only this program's rows of its head: mask=rows[:, None] < T"})
        o = _out(ex, hits, "O", (H, T, d))
        past = "K" in hits["read"] or "V" in hits["read"]
        if _close(o, want) and not past:
            continue
        got_map = np.array([next((j for j in range(G) if _close(o[h], per_kv[h, j])), -1)
                            for h in range(H)])
        for mapping, message in guesses:  # a head mapped past g reads NaN: matches none
            if (got_map == np.where(mapping < G, mapping, -1)).all():
                shown = [int(j) for j in mapping]
                raise fail(ex, f"{what}: query heads 0..{H - 1} read K/V heads {shown}; "
                               f"expected {want_map.tolist()}"
                               + (f" (there are only {G}: a read past the end of K and V)"
                                  if past else "") + f". Likely mistake: {message}")
        if past:
            raise fail(ex, f"{what}: your kernel read past the end of K or V, whose first axis "
                           f"has g={G} heads (the check put NaN after them and watched every "
                           "load). Likely mistake: kv_head must be < g: i // (h // g)")
        wrong = [h for h in range(H) if got_map[h] != want_map[h]]
        h = wrong[0]
        said = (f"matches K/V head {got_map[h]}" if got_map[h] >= 0 else
                "matches no K/V head")
        raise fail(ex, f"{what}: query head {h}'s output {said}; expected K/V head "
                       f"{want_map[h]} = {h} // ({H} // {G}); {_first_diff(o[h], want[h])}")
    passed(ex, "h=6, g=2; h=8, g=4; h=4, g=1 (multi-query): each query head i reads K/V head "
               "i // (h // g) in place, nothing past the end of K or V read")


# ---------------------------------------------------------------------------------- 07.10
def check_tail_block_masks(kernel) -> None:
    """Exercise 07.10: ``tail_forward(Q, K, V, O, T, S, scale, D, BLOCK_M, BLOCK_N)``."""
    ex = "07.10"
    rng = check_rng(710)
    for T, S, d in ((19, 21, 16), (16, 32, 16), (5, 7, 32)):
        q, k, v = rng.normal(size=(T, d)), rng.normal(size=(S, d)), rng.normal(size=(S, d))
        want = tiled_attention(q, k, v, block_size=16)
        specs = [("in", "Q", q), ("in", "K", k), ("in", "V", v), ("out", "O", (T, d)), T, S,
                 1 / math.sqrt(d)]
        hits = launch_kernel(ex, kernel, ((T + 15) // 16,), specs,
                       {"D": d, "BLOCK_M": 16, "BLOCK_N": 16})
        what = (f"for T={T} queries, S={S} keys, blocks of 16 (the last key block has "
                f"{S % 16 or 16} real keys)")
        _past_end(ex, hits, what, {
            "O": "the store of the last query block needs its mask too: tl.store(..., "
                 "mask=rows[:, None] < T); without it the padded rows overwrite what follows O",
            "K": "the last key block's load needs mask=cols[:, None] < S, other=0.0: "
                 "tl.where on the scores hides the garbage, but the read itself is past the "
                 "end (on a GPU: an illegal address, or another tensor's data)",
            "V": "the last key block's load of V needs mask=cols[:, None] < S, other=0.0: "
                 "p is 0 there, but 0 × NaN is NaN",
            "Q": "load Q with mask=rows[:, None] < T",
        })
        o = _out(ex, hits, "O", (T, d))
        x = q @ k.T / math.sqrt(d)
        pad = (-S) % 16
        unmasked = None
        if pad:  # the padded keys (loaded as 0) kept score 0: exp(0 - m) joins the sum
            xp = np.concatenate([x, np.zeros((T, pad))], axis=1)
            vp = np.concatenate([v, np.zeros((pad, d))])
            w = np.exp(xp - xp.max(axis=1, keepdims=True))
            unmasked = (w / w.sum(axis=1, keepdims=True)) @ vp
        _judge(ex, o, want, f"your O {what}", [
            ("the padded keys of the last block were loaded as 0 but their scores were not "
             "set to -inf: a score of 0 still takes a share of the softmax; "
             "s = tl.where(cols[None, :] < S, s, float('-inf'))", lambda u=unmasked: u),
        ], "store O: tl.store(O + rows[:, None] * D + offs_d[None, :], acc / l_i[:, None], "
           "mask=rows[:, None] < T)", "O" in hits["stored"])
    passed(ex, "T and S not multiples of the block (and one length that is): O matches "
               "tiled_attention; no load or store touched the NaN the check put past the end "
               "of Q, K, V and O")


# ---------------------------------------------------------------------------------- 07.11
def _backward_variant(q, k, v, do, block, weights="lse", delta=True, scale_dk=True):
    """(dk, dv) with the weights recomputed as ``weights`` says, D subtracted or not."""
    d = q.shape[1]
    x = q @ k.T / math.sqrt(d)
    if weights == "lse":
        p = softmax(x)
    elif weights == "tile":  # a softmax over each key tile alone
        p = np.concatenate([softmax(x[:, s0 : s0 + block]) for s0 in range(0, k.shape[0], block)],
                           axis=1)
    else:  # exp(s): the lse never subtracted
        p = np.exp(x)
    o = softmax(x) @ v
    dp = do @ v.T
    ds = p * (dp - ((do * o).sum(axis=1)[:, None] if delta else 0.0))
    return ds.T @ q / (math.sqrt(d) if scale_dk else 1.0), p.T @ do


def check_backward_from_lse(kernel) -> None:
    """Exercise 07.11: ``flash_backward_kv(Q, K, V, DO, LSE, DELTA, DK, DV, T, S, scale, D,
    BLOCK_M, BLOCK_N)``, one program per key block."""
    ex = "07.11"
    rng = check_rng(711)
    for T, S, d, spread in ((20, 37, 16, 1.0), (33, 16, 16, 3.0), (9, 24, 32, 1.0)):
        q, k, v = rng.normal(size=(T, d)) * spread, rng.normal(size=(S, d)), \
            rng.normal(size=(S, d))
        do = rng.normal(size=(T, d))
        o, lse = tiled_attention(q, k, v, block_size=16, return_lse=True)
        delta = (do * o).sum(axis=1)
        weights = softmax(q @ k.T / math.sqrt(d))
        _, want_dk, want_dv = attention_backward(do, q, k, v, weights)
        specs = [("in", "Q", q), ("in", "K", k), ("in", "V", v), ("in", "DO", do),
                 ("in", "LSE", lse), ("in", "DELTA", delta), ("out", "DK", (S, d)),
                 ("out", "DV", (S, d)), T, S, 1 / math.sqrt(d)]
        hits = launch_kernel(ex, kernel, ((S + 15) // 16,), specs,
                       {"D": d, "BLOCK_M": 16, "BLOCK_N": 16})
        what = f"for T={T} queries, S={S} keys, d={d}, blocks of 16"
        _past_end(ex, hits, what, {"DK": "store DK with mask=cols[:, None] < S",
                                   "DV": "store DV with mask=cols[:, None] < S"})
        dk, dv = _out(ex, hits, "DK", (S, d)), _out(ex, hits, "DV", (S, d))
        a = (q, k, v, do, 16)
        weights_wrong = [
            ("the weights were recomputed as a softmax of each key tile alone: a tile does "
             "not hold the whole row; p = exp(s - lse[:, None]) with the lse the forward saved",
             "tile"),
            ("the weights are exp(s): subtract the saved log-sum-exp, p = exp(s - lse[:, None])",
             "exp"),
        ]
        _judge(ex, dv, want_dv, f"your DV {what}", [
            (m, lambda a=a, w=w: _backward_variant(*a, weights=w)[1]) for m, w in weights_wrong
        ], "accumulate dv += tl.dot(tl.trans(p), do) over the query blocks", "DV" in hits["stored"])
        _judge(ex, dk, want_dk, f"your DK {what}", [
            ("D was not subtracted: ds = p * (dp - delta[:, None]), with delta = rowsum(dO ∘ O) "
             "(the softmax's backward, one number per query)",
             lambda a=a: _backward_variant(*a, delta=False)[0]),
            ("dK is missing the scale: the scores were q kᵀ · scale, so dk += tl.dot(tl.trans("
             "ds), q) * scale", lambda a=a: _backward_variant(*a, scale_dk=False)[0]),
            *[(m, lambda a=a, w=w: _backward_variant(*a, weights=w)[0])
              for m, w in weights_wrong],
        ], "accumulate dk += tl.dot(tl.trans(ds), q) * scale over the query blocks",
            "DK" in hits["stored"])
    passed(ex, "T != S (and T > S), queries whose scores spread wide, T and S not multiples of "
               "16: DK and DV match mha_course.attention_backward, the weights recomputed from "
               "the saved lse")
