"""The known wrong implementations the checks recognise, and hints for the learner's errors.

A check computes these on its own inputs; when the learner's answer equals one of them (and not
the reference), the check names that mistake. Each is written as the mistake would be, beside
the reference it imitates (``mha_course.softmax``, ``mha_course.scaled_dot_product_attention``,
``mha_course.MultiHeadAttention``). The hints turn an exception the learner's function raised
into a likely mistake (``call(..., hint=attention_hint)``).
"""

from __future__ import annotations

import numpy as np

from .. import softmax


def softmax_plain(x, axis=-1):
    """Softmax without max subtraction: overflows (inf/inf = NaN) once scores pass ~709."""
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def softmax_global_max(x):
    e = np.exp(x - x.max())
    return e / e.sum(axis=-1, keepdims=True)


def attention_variant(q, k, v, mask=None, scale="sqrt", axis=-1, where="before",
                      fill=-np.inf, stable=True):
    """One attention function with a switch for each classic mistake."""
    d_k = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2)
    scores = {"sqrt": scores / np.sqrt(d_k), "none": scores, "d_k": scores / d_k,
              "times": scores * np.sqrt(d_k)}[scale]
    if mask is not None and where == "before":
        if fill == -np.inf and axis == -1 and stable:
            weights = softmax(scores, mask=np.broadcast_to(mask, scores.shape))
        else:
            s = np.where(mask, scores, fill)
            weights = (softmax(s, axis=axis) if stable else softmax_plain(s, axis=axis))
    else:
        weights = softmax(scores, axis=axis) if stable else softmax_plain(scores, axis=axis)
        if mask is not None and where == "after":
            weights = weights * mask
    return weights @ v, weights


def attention_hint(exc):
    text = str(exc)
    if "axes don't match array" in text:
        return ("a transpose written for one rank (e.g. k.transpose(0, 2, 1) for 3-D arrays) "
                "fails on another: swap only the last two axes, np.swapaxes(k, -1, -2)")
    if "matmul" in text or "mismatch" in text or "shapes" in text or "broadcast" in text:
        return ("a shape mismatch in a matmul: for batched arrays, k.T reverses ALL axes; swap "
                "only the last two with np.swapaxes(k, -1, -2)")
    return None


def keepdims_hint(exc):
    if "broadcast" in str(exc):
        return ("x.max(axis=-1) and x.sum(axis=-1) drop the axis; pass keepdims=True so the "
                "result broadcasts back against x")
    return None


def mha_variant(x, W_q, W_k, W_v, W_o, mask=None, scale="sqrt", axis=-1, order=1,
                use_mask=True):
    heads, weights = [], []
    d_model = x.shape[-1]
    for i in range(W_q.shape[0])[::order]:
        q, k, v = x @ W_q[i], x @ W_k[i], x @ W_v[i]
        if scale == "d_model":
            q = q * np.sqrt(q.shape[-1] / d_model)
        out, w = attention_variant(q, k, v, mask if use_mask else None,
                                   scale="none" if scale == "none" else "sqrt", axis=axis)
        heads.append(out)
        weights.append(w)
    return np.concatenate(heads, axis=-1) @ W_o, np.stack(weights[::order], axis=-3)



# ------------------------------------------------- lesson 15: the wrong fixes of the drill
# Each imitates a fix that hides a bug's symptom without restoring the property it breaks;
# the drill's checks name the mistake when a learner's answer equals one of them.


def heads_scaled(x, W_q, W_k, W_v, W_o, h, width):
    """Multi-head attention whose scores are divided by √width instead of √d_k."""
    q, k, v = (np.swapaxes(p.reshape(*p.shape[:-1], h, -1), -3, -2)
               for p in (x @ W_q, x @ W_k, x @ W_v))  # (..., h, T, d)
    weights = softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(width))
    heads = weights @ v  # (..., h, T, d_v)
    concat = np.swapaxes(heads, -3, -2).reshape(*heads.shape[:-3], heads.shape[-2], -1)
    return concat @ W_o, weights


def scores_of(q, k):
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])


def renormalised_after_mask(q, k, v, mask):
    """softmax, then zero the masked weights, then divide by the row sums (0/0 possible)."""
    w = softmax(scores_of(q, k)) * mask
    w = w / w.sum(axis=-1, keepdims=True)
    return w @ v, w


def bias_product_attention(q, k, v, keep, fill=-np.inf, clean=False):
    """An additive mask made by a product, ``scores + (1 - keep) * fill``, in ``keep``'s dtype;
    ``clean`` turns NaN weights into 0 afterwards."""
    keep = np.asarray(keep, dtype=q.dtype)
    w = softmax(scores_of(q, k) + (1.0 - keep) * np.asarray(fill, dtype=q.dtype))
    w = np.nan_to_num(w, nan=0.0) if clean else w
    return w @ v, w


def dropout_variant(weights, p, rng, training=True, how="scale_1_minus_p"):
    """A dropout with one classic slip: multiply by 1 - p, renormalise rows, or keep with p."""
    if not training:
        return weights
    keep = rng.random(weights.shape) >= p
    if how == "keep_with_p":
        return np.where(~keep, weights / (1 - p), 0.0)
    if how == "times":
        return np.where(keep, weights * (1 - p), 0.0)
    dropped = np.where(keep, weights, 0.0)  # "renormalise"
    return dropped / dropped.sum(axis=-1, keepdims=True)
