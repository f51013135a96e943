"""Checks for lesson 15's spot-the-bug drill: the 2025 attention block (15.25, 15.26).

Taught with lesson 13 (``notebooks/13_attention_2025.ipynb``, §1: soft-capping and QK-norm) and
drilled in ``notebooks/15_interview_drill.ipynb``. Each bug comes from a public report:
soft-capping applied after the mask (onnx/onnx#7865: the ONNX Attention operator's soft-cap
turned the mask's ``-inf`` into a finite score), and QK-norm computed over all heads at once
instead of per head (vllm-project/vllm#16311, Llama 4's QK-norm). Like
:mod:`mha_course.checks.drill.generation`, each check computes its reference at check time
on several shapes, names the first property the learner's function breaks with the evidence,
and recognises the likely wrong fixes.
"""

from __future__ import annotations

import numpy as np

from ...attention import causal_mask
from ...softmax import softmax
from ...variants.logit_control import qk_norm, soft_cap
from .. import properties as P
from ..harness import call, compare, fmt, passed
from ..measure import check_rng
from ..properties import array, require

__all__ = ["check_per_head_qk_norm", "check_softcap_before_mask"]

#: The property the fixed soft-capped attention keeps, beside properties.MASKED_ZERO.
CAPPED = "every score the softmax sees is within ±cap"
#: The property per-head QK-norm keeps.
PER_HEAD = ("each head is normalised on its own: scaling one head's queries changes no other "
            "head's normalised queries")


# ------------------------------------------------------ 15.25 soft-capping after the mask
def check_softcap_before_mask(fn) -> None:
    """Exercise 15.25: ``capped_attention(q, k, v, mask, cap)`` -> (out, weights) with the
    scores soft-capped before the mask."""
    ex, rng = "15.25", check_rng(1327)
    for B, h, T, S, d_k, d_v, cap in ((2, 3, 4, 6, 5, 7, 1.0), (1, 2, 5, 5, 3, 4, 2.5)):
        q = rng.normal(size=(B, h, T, d_k)) * 2
        k = rng.normal(size=(B, h, S, d_k)) * 2
        v = rng.normal(size=(B, h, S, d_v))
        mask = causal_mask(T, S)
        label = f"for q {q.shape}, k {k.shape}, a causal mask and cap {cap}"
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)
        want_w = softmax(soft_cap(scores, cap), mask=mask)
        got = call(ex, fn, (q.copy(), k.copy(), v.copy(), mask.copy(), cap),
                   ("q", "k", "v", "mask", "cap"),
                   forbid={"mha_course.variants.logit_control.soft_cap": "fix the order yourself"})
        if not (isinstance(got, tuple) and len(got) == 2):
            require(ex, P.REFERENCE, f"your function returned {type(got).__name__}; expected "
                    "a tuple (out, weights)")
        out = array(ex, got[0], want_w.shape[:-1] + (d_v,), f"your output {label}",
                    "(B, h, T, d_v)")
        w = array(ex, got[1], want_w.shape, f"your weights {label}", "(B, h, T, S)")
        wrong = [("the cap was removed: the fix keeps c·tanh(s/c) and moves it before the "
                  "mask", lambda s=scores, m=mask: softmax(s, mask=m)),
                 ("a hard clip at ±cap is not Gemma 2's soft-cap c·tanh(s/c)",
                  lambda s=scores, m=mask, c=cap: softmax(np.clip(s, -c, c), mask=m))]
        leaked = np.where(~np.broadcast_to(mask, w.shape), w, 0.0)
        require(ex, P.MASKED_ZERO, (np.abs(leaked) > 1e-12).any()
                and f"{label}: a masked key gets weight {fmt(np.abs(leaked).max())}: "
                f"cap·tanh(-inf/cap) = -cap is a finite score (onnx/onnx#7865)", w, wrong)
        require(ex, CAPPED, np.allclose(w, softmax(scores, mask=mask)) and f"{label}: your "
                "weights are the uncapped softmax", w, wrong)
        compare(ex, w, want_w, f"your weights {label}", "(B, h, T, S)", variants=wrong)
        compare(ex, out, want_w @ v, f"your output {label}", "(B, h, T, d_v)")
    passed(ex, "masked keys get weight 0 and the weights are softmax(mask(cap·tanh(s/cap))), for "
               "caps 1 and 2.5 and two shapes")


# --------------------------------------------------------- 15.26 QK-norm across the heads
def check_per_head_qk_norm(fn) -> None:
    """Exercise 15.26: ``qk_normed(x, h, gain, eps)`` -> a fused (..., T, h·d_k) projection with
    each head RMS-normalised on its own."""
    ex, rng = "15.26", check_rng(1328)
    for shape, h in (((2, 5, 12), 3), ((3, 4, 2, 10), 5)):
        d_k = shape[-1] // h
        x = rng.normal(size=shape)
        gain = rng.uniform(0.5, 1.5, size=d_k)
        label = f"for x {shape} with h = {h}"
        want = qk_norm(x.reshape(*shape[:-1], h, d_k), gain, 1e-6).reshape(shape)
        got = array(ex, call(ex, fn, (x.copy(), h, gain.copy(), 1e-6), ("x", "h", "gain", "eps"),
                             forbid={"mha_course.variants.logit_control.qk_norm":
                                     "fix the norm yourself",
                                     "mha_course.block.rms_norm": "fix the norm yourself",
                                     "mha_course.rms_norm": "fix the norm yourself"}),
                    shape, f"your output {label}", "(..., T, h·d_k)")
        scaled = x.copy()
        scaled[..., :d_k] *= 100.0  # head 0 a hundred times larger
        again = array(ex, call(ex, fn, (scaled, h, gain.copy(), 1e-6), ("x", "h", "gain", "eps")),
                      shape, f"your output {label}", "(..., T, h·d_k)")
        wrong = [("the gain is gone: each head is normalised, then multiplied by gain (d_k,)",
                  lambda x=x, h=h, d=d_k: qk_norm(x.reshape(*x.shape[:-1], h, d), None,
                                                  1e-6).reshape(x.shape)),
                 ("the norm now runs over the tokens (axis -2) instead of each head's features",
                  lambda x=x, h=h, d=d_k, g=gain: (
                      x.reshape(*x.shape[:-1], h, d)
                      / np.sqrt((x.reshape(*x.shape[:-1], h, d) ** 2).mean(-3, keepdims=True)
                                + 1e-6) * g).reshape(x.shape))]
        moved = np.abs(again[..., d_k:] - got[..., d_k:]).max()
        require(ex, PER_HEAD, moved > 1e-9 and f"{label}: making head 0 a hundred times larger "
                f"moved the other heads' outputs by up to {fmt(moved)}: the norm mixes the heads "
                "(vllm-project/vllm#16311)", got, wrong)
        compare(ex, got, want, f"your output {label}", "(..., T, h·d_k)", variants=wrong)
    passed(ex, "each head is normalised on its own (scaling head 0 leaves the others unchanged) "
               "and equals qk_norm per head, for h = 3 and h = 5")
