"""The exercise checks: they pass right answers, fail stubs, and name each classic mistake.

Every check in ``mha_course.checks`` is run here on a correct implementation (the package's own
function where the signatures agree, otherwise the solution code), on a stub that raises
``NotImplementedError``, and on wrong implementations, each of which must get its own message.
"""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from check_contract import CheckContract

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, harness, lesson01, lesson02, lesson03, lesson04

# ------------------------------------------------------------------ correct implementations


def _matmul(a, b):  # Exercise 01.1 forbids NumPy and mha_course.naive.matmul: three loops
    if len(a[0]) != len(b):
        raise ValueError("inner dimensions differ")
    out = [[0] * len(b[0]) for _ in a]
    for i in range(len(a)):
        for k in range(len(b)):
            for j in range(len(b[0])):
                out[i][j] += a[i][k] * b[k][j]
    return out


def _flops_chain(shapes):
    (m, n), total = shapes[0], 0
    for n2, p in shapes[1:]:
        if n2 != n:
            raise ValueError(f"inner dimensions {n} and {n2} differ")
        total += 2 * m * n * p
        n = p
    return total


def _cheaper_order(a, b, c):
    left = _flops_chain([a, b]) + _flops_chain([(a[0], b[1]), c])
    right = _flops_chain([b, c]) + _flops_chain([a, (b[0], c[1])])
    return "(AB)C" if left <= right else "A(BC)"


def _scores(q, k):
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])


def _matmul_shape(a_shape, b_shape):  # Exercise 01.6 forbids NumPy: the rules in plain Python
    *batch_a, m, n = a_shape
    *batch_b, n_b, p = b_shape
    if n != n_b:
        raise ValueError(f"inner sizes {n} and {n_b} differ")
    rank = max(len(batch_a), len(batch_b))
    batch_a = [1] * (rank - len(batch_a)) + batch_a
    batch_b = [1] * (rank - len(batch_b)) + batch_b
    batch = []
    for size_a, size_b in zip(batch_a, batch_b, strict=True):
        if size_a != size_b and 1 not in (size_a, size_b):
            raise ValueError(f"batch sizes {size_a} and {size_b} differ")
        batch.append(max(size_a, size_b))
    return (*batch, m, p)


def _cross_entropy(logits, targets):  # 02.4 allows mha_course.log_softmax
    C = logits.shape[-1]
    logp = mha_course.log_softmax(logits).reshape(-1, C)
    t = np.asarray(targets).reshape(-1)
    real = t != -100
    return float(-logp[np.arange(len(t))[real], t[real]].mean())


def _cross_entropy_by_hand(logits, targets):  # the same with NumPy only, through take_along_axis
    m = logits.max(axis=-1, keepdims=True)
    logp = logits - (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))  # (..., C)
    real = targets != -100
    picked = np.take_along_axis(logp, np.where(real, targets, 0)[..., None], axis=-1)[..., 0]
    return -picked[real].sum() / real.sum()


def _causal_self_attention(x, W_q, W_k, W_v, lengths, *, scale_by_d_model=False,
                           pad_queries=False, after=False):
    """Exercise 03.5 fixed (03.5 forbids the package's attention and masks), with a switch for
    each of the colleague's bugs."""
    T = x.shape[-2]
    q, k, v = x @ W_q, x @ W_k, x @ W_v
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(x.shape[-1] if scale_by_d_model
                                                  else q.shape[-1])
    real = np.arange(T)[None, :] < np.asarray(lengths)[:, None]  # (B, T)
    mask = np.tril(np.ones((T, T), dtype=bool)) & (real[:, :, None] if pad_queries
                                                   else real[:, None, :])
    if after:
        weights = mha_course.softmax(scores) * mask
    else:
        weights = mha_course.softmax(scores, mask=mask)
    return weights @ v, weights


def _choose_scale(q, k):
    return 1 / (q * k).sum(axis=-1).std()


def _cross_attention(layer, x, context):  # Exercise 04.6 forbids calling the layer
    q = mha_course.split_heads(x @ layer.W_q, layer.h)
    k = mha_course.split_heads(context @ layer.W_k, layer.h)
    v = mha_course.split_heads(context @ layer.W_v, layer.h)
    heads, weights = mha_course.scaled_dot_product_attention(q, k, v)
    return mha_course.merge_heads(heads) @ layer.W_o, weights


def _mha_forward(x, W_q, W_k, W_v, W_o, mask=None):  # 04.5 forbids the layer: the heads by hand
    heads = [mha_course.scaled_dot_product_attention(x @ W_q[i], x @ W_k[i], x @ W_v[i], mask)
             for i in range(len(W_q))]
    out = np.concatenate([o for o, _ in heads], axis=-1) @ W_o
    return out, np.stack([w for _, w in heads], axis=1)


def _param_count(d_model, h, d_k, d_v, bias):  # 04.4 forbids mha_course.param_count
    return 2 * d_model * h * d_k + 2 * h * d_v * d_model + (
        2 * h * d_k + h * d_v + d_model if bias else 0)


def _softmax(x, axis=-1):  # 02.1 forbids every library softmax
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x):  # 02.3 forbids mha_course.log_softmax
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def _attention(q, k, v, mask=None, scale=True, axis=-1, after=False, shift=True):
    """Attention by hand (03.2 forbids the package's), with a switch for each classic mistake."""
    scores = q @ np.swapaxes(k, -1, -2)
    if scale:
        scores = scores / np.sqrt(q.shape[-1])
    if mask is not None and not after:
        scores = np.where(mask, scores, -np.inf)
    if shift:
        m = scores.max(axis=axis, keepdims=True)
        scores = scores - np.where(np.isfinite(m), m, 0)
    e = np.exp(scores)
    total = e.sum(axis=axis, keepdims=True)
    weights = e / np.where(total == 0, 1, total)
    if mask is not None and after:
        weights = weights * mask
    return weights @ v, weights


def _causal_mask(T):  # 03.3 forbids mha_course.causal_mask
    return np.arange(T)[None, :] <= np.arange(T)[:, None]


def _padding_mask(lengths, S):  # 03.4 forbids mha_course.padding_mask
    return (np.arange(S)[None, :] < np.asarray(lengths)[:, None])[:, None, :]


def _split_heads(x, h):  # 04.1 forbids mha_course.split_heads
    B, T, D = x.shape
    return x.reshape(B, T, h, D // h).transpose(0, 2, 1, 3)


def _merge_heads(x):  # 04.2 forbids mha_course.merge_heads
    B, h, T, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, h * d)


CORRECT = {
    "01.1": ("check_matmul_loops", _matmul),
    "01.2": ("check_most_similar", lambda q, k: np.argmax(q @ k.T, axis=1)),
    "01.3": ("check_batched_scores", lambda Q, K: np.einsum("bhtd,bhsd->bhts", Q, K)),
    "01.4": ("check_flops_chain", _flops_chain),
    "01.5": ("check_cheaper_order", _cheaper_order),
    "01.6": ("check_matmul_shape", _matmul_shape),
    "02.1": ("check_softmax", _softmax),
    "02.2": ("check_softmax_temperature", lambda x, tau: mha_course.softmax(x / tau)),
    "02.3": ("check_log_softmax", _log_softmax),
    "02.4": ("check_cross_entropy", _cross_entropy),
    "03.1": ("check_attention_scores", _scores),
    "03.2": ("check_attention", _attention),
    "03.3": ("check_causal_mask", _causal_mask),
    "03.4": ("check_padding_mask", _padding_mask),
    "03.5": ("check_causal_self_attention", _causal_self_attention),
    "03.6": ("check_choose_scale", _choose_scale),
    "04.1": ("check_split_heads", _split_heads),
    "04.2": ("check_merge_heads", _merge_heads),
    "04.3": ("check_fuse_heads", lambda W: np.concatenate(list(W), axis=1)),
    "04.4": ("check_param_count", _param_count),
    "04.5": ("check_mha_forward", _mha_forward),
    "04.6": ("check_cross_attention", _cross_attention),
}


def _check(name):
    return getattr(checks, name)


def _of_lesson(n):
    return {ex: answer for ex, answer in CORRECT.items() if ex.startswith(f"{n}.")}


class TestLesson01Contract(CheckContract):
    MODULE, CORRECT = lesson01, _of_lesson("01")


class TestLesson02Contract(CheckContract):
    MODULE, CORRECT = lesson02, _of_lesson("02")


class TestLesson03Contract(CheckContract):
    MODULE, CORRECT = lesson03, _of_lesson("03")


class TestLesson04Contract(CheckContract):
    MODULE, CORRECT = lesson04, _of_lesson("04")


def _contracted_modules():
    """The checks modules some test module binds the contract to (``MODULE, CORRECT = m, ...``
    in a ``CheckContract`` subclass), read from the tests' source."""
    found = set()
    for path in Path(__file__).parent.glob("test_*.py"):
        found.update(re.findall(r"\(CheckContract\):\n\s+MODULE, CORRECT = (\w+),",
                                path.read_text(encoding="utf-8")))
    return found


def test_every_public_check_is_bound_to_the_contract():
    """Every public check is exported by one checks module, and some test binds the generic
    contract (tests/check_contract.py) to that module and its right answers."""
    modules = {f"lesson{n:02d}" for n in range(1, 14)} | {"drill", "kernels"}  # 07.7+
    exported = {name: getattr(checks, name) for name in modules}
    public = {n for n in checks.__all__ if n.startswith("check_")}
    owners = [{n for n in m.__all__ if n.startswith("check_")} for m in exported.values()]
    assert sum(map(len, owners)) == len(set().union(*owners)), "a check exported twice"
    assert set().union(*owners) == public
    assert _contracted_modules() == modules


def test_check_failed_is_an_assertion_error():
    assert issubclass(CheckFailed, AssertionError)


def test_check_refuses_a_value_instead_of_a_function():
    with pytest.raises(CheckFailed, match="pass the function itself"):
        checks.check_causal_mask(np.ones((3, 3), dtype=bool))


# --------------------------------------------------------------------- the targeted mistakes


def _softmax_no_shift(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _split_no_transpose(x, h):
    B, T, D = x.shape
    return x.reshape(B, h, T, D // h)


def _merge_no_transpose(x):
    B, h, T, d = x.shape
    return x.reshape(B, T, h * d)


def _mha_unscaled(x, W_q, W_k, W_v, W_o, mask=None):
    heads = [_attention(x @ W_q[i], x @ W_k[i], x @ W_v[i], mask, scale=False)
             for i in range(len(W_q))]
    out = np.concatenate([o for o, _ in heads], axis=-1) @ W_o
    return out, np.stack([w for _, w in heads], axis=-3)


def _softmax_in_place(x):
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def _cross_attention_kv_from_x(layer, x, context):
    return _cross_attention(layer, x, x)


def _log_of_softmax(x):
    return np.log(mha_course.softmax(x))


def _global_max_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum(axis=-1, keepdims=True)


def _param_count_no_w_o(d_model, h, d_k, d_v, bias):
    return _param_count(d_model, h, d_k, d_v, bias) - h * d_v * d_model


def _matmul_overwrite(a, b):
    if len(a[0]) != len(b):
        raise ValueError("inner dimensions differ")
    out = [[0] * len(b[0]) for _ in a]
    for i in range(len(a)):
        for k in range(len(b)):
            for j in range(len(b[0])):
                out[i][j] = a[i][k] * b[k][j]
    return out


def _matmul_unchecked(a, b):
    out = [[0] * len(b[0]) for _ in a]
    for i in range(len(a)):
        for k in range(len(b)):
            for j in range(len(b[0])):
                out[i][j] += a[i][k] * b[k][j]
    return out


def _self_attention_or(x, W_q, W_k, W_v, lengths):
    T = x.shape[-2]
    real = np.arange(T)[None, :] < np.asarray(lengths)[:, None]
    mask = np.tril(np.ones((T, T), dtype=bool)) | real[:, None, :]
    scores = (x @ W_q) @ np.swapaxes(x @ W_k, -1, -2) / np.sqrt(W_q.shape[-1])
    weights = mha_course.softmax(scores, mask=mask)
    return weights @ (x @ W_v), weights


def _self_attention_nan_rows(x, W_q, W_k, W_v, lengths):  # queries hidden, -inf, no guard
    T = x.shape[-2]
    real = np.arange(T)[None, :] < np.asarray(lengths)[:, None]
    mask = np.tril(np.ones((T, T), dtype=bool)) & real[:, :, None]
    scores = (x @ W_q) @ np.swapaxes(x @ W_k, -1, -2) / np.sqrt(W_q.shape[-1])
    weights = mha_course.softmax(np.where(mask, scores, -np.inf))
    return weights @ (x @ W_v), weights


def _flat_log_probs(logits, targets):
    C = logits.shape[-1]
    return mha_course.log_softmax(logits).reshape(-1, C), np.asarray(targets).reshape(-1)


def _cross_entropy_pairing(logits, targets):  # probs[:, targets], with the padding left out
    logp, t = _flat_log_probs(logits, targets)
    real = t != -100
    return float(-logp[real][:, t[real]].mean())


def _cross_entropy_log_of_softmax(logits, targets):  # fixed, except -log(softmax)
    C = logits.shape[-1]
    p, t = mha_course.softmax(logits).reshape(-1, C), np.asarray(targets).reshape(-1)
    real = t != -100
    return float(-np.log(p[np.arange(len(t))[real], t[real]]).mean())


def _cross_entropy_no_ignore(logits, targets):  # fixed, except the padding
    logp, t = _flat_log_probs(logits, targets)
    return float(-logp[np.arange(len(t)), t].mean())


def _cross_entropy_wraps_padding(logits, targets):  # keeps every target NumPy can index with
    logp, t = _flat_log_probs(logits, targets)
    usable = (t >= -logp.shape[-1]) & (t < logp.shape[-1])
    return float(-logp[np.arange(len(t))[usable], t[usable]].mean())


def _cross_entropy_2d(logits, targets):  # right for (N, C) logits only
    logp = mha_course.log_softmax(logits)
    real = targets != -100
    return float(-logp[np.arange(len(targets))[real], targets[real]].mean())


def _cross_entropy_mean_over_all(logits, targets):
    logp, t = _flat_log_probs(logits, targets)
    real = t != -100
    losses = np.where(real, -logp[np.arange(len(t)), np.where(real, t, 0)], 0.0)
    return float(losses.mean())


def _cross_entropy_per_position(logits, targets):
    logp, t = _flat_log_probs(logits, targets)
    real = t != -100
    return -logp[np.arange(len(t))[real], t[real]]


def _cross_entropy_wrong_axis(logits, targets):
    C = logits.shape[-1]
    logp = mha_course.log_softmax(logits, axis=-2).reshape(-1, C)
    t = np.asarray(targets).reshape(-1)
    real = t != -100
    return float(-logp[np.arange(len(t))[real], t[real]].mean())


def _shape_without_stretching(a, b):  # batch axes must be equal (missing ones allowed)
    shape = _matmul_shape(a, b)
    batch_a, batch_b = a[:-2], b[:-2]
    k = min(len(batch_a), len(batch_b))
    if k and batch_a[len(batch_a) - k:] != batch_b[len(batch_b) - k:]:
        raise ValueError("batch axes differ")
    return shape


def _shape_max_batch(a, b):  # the larger batch size wins, never an error
    batch_a, batch_b = list(a[:-2]), list(b[:-2])
    if a[-1] != b[-2]:
        raise ValueError("inner sizes differ")
    rank = max(len(batch_a), len(batch_b))
    batch_a = [1] * (rank - len(batch_a)) + batch_a
    batch_b = [1] * (rank - len(batch_b)) + batch_b
    return (*[max(x, y) for x, y in zip(batch_a, batch_b, strict=True)], a[-2], b[-1])


def _shape_inner_stretch(a, b):  # a 1 may stretch in the inner sizes too
    if a[-1] != b[-2] and 1 not in (a[-1], b[-2]):
        raise ValueError("inner sizes differ")
    return _matmul_shape(a[:-1] + (b[-2],), b)


def _cross_attention_reshape_t(layer, x, context):  # 04.6 half fixed: K, V split with x's T
    B, T, _ = x.shape
    q, k, v = x @ layer.W_q, context @ layer.W_k, context @ layer.W_v
    q, k, v = (a.reshape(B, T, layer.h, -1).transpose(0, 2, 1, 3) for a in (q, k, v))
    weights = mha_course.softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))
    return mha_course.merge_heads(weights @ v) @ layer.W_o, weights


def _cross_attention_bugs(layer, x, context, reshape=False, scale=False):
    h = layer.h

    def heads(a, W):
        y = a @ W
        return y.reshape(y.shape[0], h, y.shape[1], -1) if reshape else \
            mha_course.split_heads(y, h)

    q, k, v = heads(x, layer.W_q), heads(context, layer.W_k), heads(context, layer.W_v)
    d = layer.W_q.shape[1] if scale else q.shape[-1]
    weights = mha_course.softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(d))
    return mha_course.merge_heads(weights @ v) @ layer.W_o, weights


MISTAKES = [
    # The six the course must diagnose, in every check where they can happen.
    ("scores-unscaled", "check_attention_scores", lambda q, k: q @ np.swapaxes(k, -1, -2),
     r"not scaled by √d_k"),
    ("attention-unscaled", "check_attention",
     lambda q, k, v, mask=None: _attention(q, k, v, mask, scale=False), r"not scaled by √d_k"),
    ("mha-unscaled", "check_mha_forward", _mha_unscaled, r"not scaled by √d_k"),
    ("softmax-wrong-axis", "check_softmax", lambda x: _softmax(x, axis=-2),
     r"softmax over the wrong axis"),
    ("attention-wrong-axis", "check_attention",
     lambda q, k, v, mask=None: _attention(q, k, v, mask, axis=-2),
     r"softmax over the wrong axis"),
    ("attention-mask-after-softmax", "check_attention",
     lambda q, k, v, mask=None: _attention(q, k, v, mask, after=True),
     r"mask applied after the softmax"),
    ("self-attention-mask-after-softmax", "check_causal_self_attention",
     lambda *args: _causal_self_attention(*args, after=True),
     r"^Exercise 03\.5: .*Likely mistake: the mask is applied after the softmax"),
    ("split-reshape-without-transpose", "check_split_heads", _split_no_transpose,
     r"reshape without the transpose"),
    ("merge-reshape-without-transpose", "check_merge_heads", _merge_no_transpose,
     r"reshape without the transpose"),
    ("fuse-reshape-without-transpose", "check_fuse_heads", lambda W: W.reshape(W.shape[1], -1),
     r"reshape without the transpose"),
    ("causal-diagonal-excluded", "check_causal_mask",
     lambda T: np.tril(np.ones((T, T), dtype=bool), k=-1),
     r"causal triangle off by one: you excluded the diagonal"),
    ("causal-one-too-many", "check_causal_mask",
     lambda T: np.tril(np.ones((T, T), dtype=bool), k=1),
     r"causal triangle off by one: one diagonal too many"),
    ("softmax-no-max-subtraction", "check_softmax", _softmax_no_shift,
     r"softmax without max subtraction.*overflows"),
    ("attention-no-max-subtraction", "check_attention",
     lambda q, k, v, mask=None: _attention(q, k, v, mask, shift=False),
     r"softmax without max subtraction"),
    ("temperature-no-max-subtraction", "check_softmax_temperature",
     lambda x, tau: _softmax_no_shift(x / tau), r"max subtraction"),
    # Further mistakes with their own messages.
    ("softmax-global-max", "check_softmax", _global_max_softmax,
     r"max of the whole array instead of each row's max"),
    ("softmax-no-keepdims", "check_softmax",
     lambda x: np.exp(x - x.max(axis=-1)) / np.exp(x - x.max(axis=-1)).sum(axis=-1),
     r"(?s)raised ValueError.*keepdims=True"),
    ("softmax-modifies-input", "check_softmax", _softmax_in_place,
     r"changed its argument `x` in place"),
    ("temperature-multiplied", "check_softmax_temperature",
     lambda x, tau: mha_course.softmax(x * tau), r"multiplied the scores by the temperature"),
    ("log-of-softmax", "check_log_softmax", _log_of_softmax, r"you computed log\(softmax\(x\)\)"),
    ("scores-divided-by-d_k", "check_attention_scores",
     lambda q, k: q @ np.swapaxes(k, -1, -2) / q.shape[-1], r"divided by d_k instead of √d_k"),
    ("attention-returns-weights-first", "check_attention",
     lambda q, k, v, mask=None: _attention(q, k, v, mask)[::-1],
     r"return \(out, weights\) in that order"),
    ("causal-upper-triangle", "check_causal_mask", lambda T: np.triu(np.ones((T, T), bool)),
     r"upper triangle"),
    ("causal-int-mask", "check_causal_mask", lambda T: np.tril(np.ones((T, T), dtype=int)),
     r"dtype int64; expected bool"),
    ("padding-off-by-one", "check_padding_mask",
     lambda lengths, S: (np.arange(S) <= np.asarray(lengths)[:, None])[:, None, :],
     r"off by one: position lengths\[b\] is the first PADDING"),
    ("padding-missing-axis", "check_padding_mask",
     lambda lengths, S: np.arange(S) < np.asarray(lengths)[:, None],
     r"shape \(4, 5\); expected \(B, 1, S\).*add a middle axis"),
    ("self-attention-causal-only", "check_causal_self_attention",
     lambda x, W_q, W_k, W_v, lengths: _causal_self_attention(x, W_q, W_k, W_v,
                                                              [x.shape[-2]] * len(x)),
     r"only the causal mask"),
    ("self-attention-or", "check_causal_self_attention", _self_attention_or, r"\| \(or\)"),
    # Exercise 03.5's colleague: each bug alone, two together, all three.
    ("self-attention-scaled-by-d_model", "check_causal_self_attention",
     lambda *args: _causal_self_attention(*args, scale_by_d_model=True),
     r"Likely mistake: the scores are divided by √d_model"),
    ("self-attention-pads-queries", "check_causal_self_attention",
     lambda *args: _causal_self_attention(*args, pad_queries=True),
     r"Likely mistake: the padding mask hides padded QUERIES"),
    ("self-attention-two-bugs", "check_causal_self_attention",
     lambda *args: _causal_self_attention(*args, scale_by_d_model=True, after=True),
     r"Likely mistake: 2 of the colleague's bugs: the scores are divided by √d_model.*; and "
     r"the mask is applied after the softmax"),
    ("self-attention-the-colleagues-code", "check_causal_self_attention",
     lambda *args: _causal_self_attention(*args, scale_by_d_model=True, pad_queries=True,
                                          after=True),
     r"Likely mistake: 3 of the colleague's bugs"),
    ("self-attention-pads-queries-with-minus-inf", "check_causal_self_attention",
     _self_attention_nan_rows, r"nan at index \(0, 3, 0\)\. Likely mistake: a query row with "
                               r"no allowed key gives NaN: the padding mask hides padded QUERIES"),
    # Exercise 02.4's colleague and the other ways to get the loss wrong.
    ("cross-entropy-pairs-every-row-with-every-target", "check_cross_entropy",
     _cross_entropy_pairing, r"on logits \(6, 5\) .*probs\[:, targets\] pairs every position "
                             r"with every target"),
    ("cross-entropy-log-of-softmax", "check_cross_entropy", _cross_entropy_log_of_softmax,
     r"confidently wrong .* is inf, the reference 227\.0300\. Likely mistake: "
     r"-np\.log\(softmax\(\.\.\.\)\) is inf"),
    ("cross-entropy-padding-as-a-class", "check_cross_entropy", _cross_entropy_no_ignore,
     r"(?s)raised IndexError: index -100 is out of bounds.*Likely mistake: targets of -100 "
     r"mark padding"),
    ("cross-entropy-padding-as-class-20", "check_cross_entropy", _cross_entropy_wraps_padding,
     r"on logits \(5, 120\) with padding \(-100\) .*Likely mistake: targets of -100 mark "
     r"padding: leave them out of the mean \(as an index, -100 silently picks class C-100\)"),
    ("cross-entropy-2-d-only", "check_cross_entropy",
     lambda logits, targets: _cross_entropy_2d(logits, targets),
     r"(?s)raised IndexError.*Likely mistake: logits may have leading axes, \(B, T, C\)"),
    ("cross-entropy-summed", "check_cross_entropy",
     lambda logits, targets: _cross_entropy(logits, targets) * np.sum(targets != -100),
     r"you summed the losses"),
    ("cross-entropy-padding-in-the-mean", "check_cross_entropy", _cross_entropy_mean_over_all,
     r"you divided by every position, padding included"),
    ("cross-entropy-per-position", "check_cross_entropy", _cross_entropy_per_position,
     r"you returned an array of shape \(6,\); expected one float, the mean loss \(one loss "
     r"per position"),
    ("cross-entropy-wrong-axis", "check_cross_entropy",
     _cross_entropy_wrong_axis,
     r"softmax over the wrong axis: normalise over the classes"),
    # Exercise 03.6: the measured scale, and the ways to measure the wrong thing.
    ("scale-from-theory", "check_choose_scale", lambda q, k: 1 / np.sqrt(q.shape[-1]),
     r"you returned 1/√d_k: the right scale only when"),
    ("scale-one-over-variance", "check_choose_scale",
     lambda q, k: 1 / (q * k).sum(axis=-1).var(), r"you divided by the variance"),
    ("scale-is-the-std", "check_choose_scale", lambda q, k: (q * k).sum(axis=-1).std(),
     r"you returned the standard deviation itself"),
    ("scale-from-the-mean-square", "check_choose_scale",
     lambda q, k: 1 / np.sqrt(((q * k).sum(axis=-1) ** 2).mean()),
     r"entries with mean 1 .*you used the mean square of the dot products"),
    ("scale-of-single-products", "check_choose_scale", lambda q, k: 1 / (q * k).std(),
     r"you measured single products q_j·k_j"),
    ("scale-of-all-pairs", "check_choose_scale", lambda q, k: 1 / (q @ k.T).std(),
     r"you paired every query with every key"),
    # Exercise 01.6: the broadcasting rules, one wrong rule at a time.
    ("shape-size-1-does-not-stretch", "check_matmul_shape", _shape_without_stretching,
     r"for a \(2, 1, 4, 5\) @ b \(3, 5, 6\) you raised ValueError .* NumPy computes it: "
     r"shape \(2, 3, 4, 6\)"),
    ("shape-batch-from-a-only", "check_matmul_shape",
     lambda a, b: _matmul_shape(a[-2:], b[-2:]) and (*a[:-2], a[-2], b[-1]),
     r"you kept only a's leading axes"),
    ("shape-larger-batch-size-wins", "check_matmul_shape", _shape_max_batch,
     r"for a \(2, 4, 5\) @ b \(3, 5, 6\) you returned \(3, 4, 6\), but NumPy refuses this "
     r"product \(ValueError\)\. Likely mistake: the batch sizes 2 and 3 differ"),
    ("shape-inner-1-stretches", "check_matmul_shape", _shape_inner_stretch,
     r"a 1 stretches only in the batch axes, never in the two matrix axes"),
    ("shape-inner-sizes-unchecked", "check_matmul_shape",
     lambda a, b: _matmul_shape(a[:-1] + (b[-2],), b),
     r"the inner sizes 5 \(a's last axis\) and 4 \(b's second-to-last\) differ"),
    # Exercise 04.6's colleague: reshape without transpose and the scale, with context used.
    ("cross-attention-split-by-reshape", "check_cross_attention",
     lambda layer, x, context: _cross_attention_bugs(layer, x, context, reshape=True),
     r"Likely mistake: the heads are split by reshape alone"),
    ("cross-attention-scaled-by-h-d_k", "check_cross_attention",
     lambda layer, x, context: _cross_attention_bugs(layer, x, context, scale=True),
     r"Likely mistake: the scores are divided by √\(h·d_k\)"),
    ("cross-attention-keys-split-with-T", "check_cross_attention", _cross_attention_reshape_t,
     r"(?s)raised ValueError: cannot reshape.*Likely mistake: keys and values have S = "
     r"context\.shape\[-2\] positions, not T"),
    ("cross-attention-the-colleagues-code", "check_cross_attention",
     lambda layer, x, context: _cross_attention_bugs(layer, x, x, reshape=True, scale=True),
     r"keys and values must come from context"),
    ("fuse-stacked-rows", "check_fuse_heads", lambda W: np.concatenate(list(W), axis=0),
     r"stacked the heads' rows"),
    ("param-count-without-w_o", "check_param_count", _param_count_no_w_o,
     r"left out the output projection W_o"),
    ("mha-without-w_o", "check_mha_forward",
     lambda x, W_q, W_k, W_v, W_o, mask=None: (
         _mha_unscaled(x, W_q, W_k, W_v, np.eye(W_o.shape[0]), mask)[0],
         _mha_forward(x, W_q, W_k, W_v, W_o, mask)[1]),
     r"forgot the output projection"),
    ("cross-attention-kv-from-x", "check_cross_attention", _cross_attention_kv_from_x,
     r"keys and values must come from context"),
    ("flops-without-factor-2", "check_flops_chain", lambda shapes: _flops_chain(shapes) // 2,
     r"a multiply-add is 2 FLOPs"),
    ("flops-pairwise", "check_flops_chain",
     lambda shapes: sum(2 * a * b * c for (a, b), (_, c) in zip(shapes, shapes[1:],
                                                                 strict=False)),
     r"the left operand is the running product"),
    ("cheaper-order-always-left", "check_cheaper_order", lambda a, b, c: "(AB)C",
     r"you always return '\(AB\)C'"),
    ("matmul-overwrites", "check_matmul_loops", _matmul_overwrite, r"`=` instead of `\+=`"),
    ("matmul-no-shape-check", "check_matmul_loops", _matmul_unchecked,
     r"the inner dimensions 5 and 3 differ, so raise ValueError"),
    ("most-similar-by-distance", "check_most_similar",
     lambda q, k: np.argmin(np.linalg.norm(q[:, None] - k[None], axis=-1), axis=1),
     r"nearest key by distance"),
    ("batched-scores-with-k-dot-t", "check_batched_scores", lambda Q, K: Q @ K.T,
     r"k.T reverses ALL axes"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        _check(check)(wrong)
    assert str(info.value).startswith("Exercise ")
    assert capsys.readouterr().out == "", "a failing check prints nothing"


# ---------------------------------------------------- NaN and wrong shapes get their own words


NAN_AND_SHAPE = [
    ("softmax", "check_softmax", lambda x: np.full_like(x, np.nan),
     r"softmax on scores of shape \(2, 3, 5\): nan at index"),
    ("attention", "check_attention",
     lambda q, k, v, mask=None: tuple(np.full_like(a, np.nan) for a in _attention(q, k, v, mask)),
     r"your weights without a mask: nan at index"),
    ("split_heads", "check_split_heads", lambda x, h: np.full(
        (x.shape[0], h, x.shape[1], x.shape[2] // h), np.nan), r": nan at index"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in NAN_AND_SHAPE],
                         ids=[m[0] for m in NAN_AND_SHAPE])
def test_check_reports_nan_in_its_own_words(check, wrong, pattern):
    with pytest.raises(CheckFailed, match=pattern):
        _check(check)(wrong)


WRONG_SHAPE = [
    ("softmax", "check_softmax", lambda x: x[..., :-1], r"shape \(2, 3, 4\); expected"),
    ("attention-scores", "check_attention_scores", lambda q, k: q @ q.swapaxes(-1, -2),
     r"shape \(2, 3, 3\); expected \(B, T, S\) = \(2, 3, 5\)"),
    ("attention", "check_attention",
     lambda q, k, v, mask=None: (np.zeros((2, 3, 4)), _attention(q, k, v, mask)[1]),
     r"your output without a mask: shape \(2, 3, 4\); expected"),
    ("merge_heads", "check_merge_heads", lambda x: x, r"shape \(2, 3, 4, 5\); expected"),
    ("causal_mask", "check_causal_mask", lambda T: np.ones(T, bool),
     r"shape \(4,\); expected \(T, T\)"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in WRONG_SHAPE],
                         ids=[m[0] for m in WRONG_SHAPE])
def test_check_reports_a_wrong_shape_in_its_own_words(check, wrong, pattern):
    with pytest.raises(CheckFailed, match=pattern):
        _check(check)(wrong)


def test_nan_from_ordinary_inputs_is_not_blamed_on_overflow():
    with pytest.raises(CheckFailed, match=r"nan at index \(0, 0, 0\)\. Likely mistake: NaN and inf "
                                          r"come from 0/0") as info:
        checks.check_softmax(lambda x: np.full_like(x, np.nan))
    assert "max subtraction" not in str(info.value)


def test_check_does_not_leak_numpy_warnings_from_a_wrong_answer(recwarn):
    with pytest.raises(CheckFailed):
        checks.check_softmax(_softmax_no_shift)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_stub_of_another_exercise_keeps_its_own_number():
    def calls_an_unfinished_helper(x, W_q, W_k, W_v, lengths):
        raise NotImplementedError("Exercise 03.2: write attention")

    with pytest.raises(NotImplementedError, match=r"^Exercise 03.2: write attention$"):
        checks.check_causal_self_attention(calls_an_unfinished_helper)


# ------------------------------------------------ property checks when no known mistake matches


def _unnormalised_attention(q, k, v, mask=None):
    weights = np.exp(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))
    return weights @ v, weights


def _leaky_causal_mask(T):
    mask = _causal_mask(T)
    mask[0, T - 1] = True
    return mask


def _leaky_self_attention(x, W_q, W_k, W_v, lengths):  # 0.01 on every masked key
    T = x.shape[-2]
    mask = _causal_mask(T) & _padding_mask(lengths, T)
    _, weights = _causal_self_attention(x, W_q, W_k, W_v, lengths)
    weights = np.where(mask, weights, 0.01)
    return weights @ (x @ W_v), weights


PROPERTIES = [
    ("rows-do-not-sum-to-one", "check_attention", _unnormalised_attention,
     r"row \(0, 0\) of your weights without a mask sums to \d+\.\d{4}, not 1: did you "
     r"normalise over the right axis"),
    ("causal-upper-triangle-not-zero", "check_causal_mask", _leaky_causal_mask,
     r"True at \(query 0, key 3\): query 0 would see the future key 3"),
    ("masked-entries-not-zero", "check_causal_self_attention", _leaky_self_attention,
     r"your weights for x \(2, 5, 8\), d_k=4, lengths \[3, 5\]: 0\.0100 at \(0, 0, 1\), "
     r"where the mask is False"),
    ("matmul-ragged-result", "check_matmul_loops", lambda a, b: [[1, 2], [3]],
     r"not a rectangular list of lists"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in PROPERTIES],
                         ids=[m[0] for m in PROPERTIES])
def test_check_reports_the_first_broken_property(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern):
        _check(check)(wrong)
    assert capsys.readouterr().out == ""


# ------------------------------------------- probes of several shapes: hard-coded sizes fail


def _attention_sqrt_hard_coded(q, k, v, mask=None):  # d_k = 4 in the first probes: √4 = 2
    scores = q @ np.swapaxes(k, -1, -2) / 2.0
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    return _attention_from_scores(scores, v)


def _attention_from_scores(scores, v):
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(m), m, 0))
    total = e.sum(axis=-1, keepdims=True)
    weights = e / np.where(total == 0, 1, total)
    return weights @ v, weights


def _attention_3d_transpose(q, k, v, mask=None):  # k.transpose(0, 2, 1) works for 3-D only
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    return _attention_from_scores(scores, v)


def _mha_sqrt6(x, W_q, W_k, W_v, W_o, mask=None):  # d_k = 6 in the first probe
    heads = []
    for i in range(len(W_q)):
        s = (x @ W_q[i]) @ np.swapaxes(x @ W_k[i], -1, -2) / np.sqrt(6)
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        heads.append(_attention_from_scores(s, x @ W_v[i]))
    return (np.concatenate([o for o, _ in heads], axis=-1) @ W_o,
            np.stack([w for _, w in heads], axis=1))


def _mha_three_heads(x, W_q, W_k, W_v, W_o, mask=None):  # h = 3 in the first probe
    heads = [mha_course.scaled_dot_product_attention(x @ W_q[i], x @ W_k[i], x @ W_v[i], mask)
             for i in range(3)]
    return (np.concatenate([o for o, _ in heads], axis=-1) @ W_o,
            np.stack([w for _, w in heads], axis=1))


def _cross_three_heads(layer, x, context):
    q = x @ layer.W_q
    k, v = context @ layer.W_k, context @ layer.W_v
    B, T, _ = q.shape
    q = q.reshape(B, T, 3, -1).transpose(0, 2, 1, 3)
    k = k.reshape(B, context.shape[1], 3, -1).transpose(0, 2, 1, 3)
    v = v.reshape(B, context.shape[1], 3, -1).transpose(0, 2, 1, 3)
    out, weights = mha_course.scaled_dot_product_attention(q, k, v)
    return out.transpose(0, 2, 1, 3).reshape(B, T, -1) @ layer.W_o, weights


HARD_CODED = [
    ("most-similar-three-queries", "check_most_similar",
     lambda q, k: np.argmax(q[:3] @ k.T, axis=1), r"your indices for 6 queries"),
    ("batched-scores-fixed-heads", "check_batched_scores",
     lambda Q, K: np.stack([Q[:, i] @ np.swapaxes(K[:, i], -1, -2) for i in range(3)], axis=1),
     r"Exercise 01\.3: your scores for Q \(1, 4, 2, 5\)"),
    ("softmax-axis-2", "check_softmax", lambda x: _softmax(x, axis=2) if x.ndim > 2 else
     _softmax(x), r"on scores of shape \(2, 2, 3, 4\)"),
    ("temperature-3d-only", "check_softmax_temperature",
     lambda x, tau: _softmax(x.reshape(2, 3, 5) / tau).reshape(x.shape),
     r"raised ValueError"),
    ("log-softmax-axis-2", "check_log_softmax",
     lambda x: _log_softmax(np.swapaxes(x, -1, 2)).swapaxes(-1, 2) if x.ndim > 2 else
     _log_softmax(x), r"on scores of shape \(2, 2, 3, 4\)"),
    ("matmul-shape-always-4-axes", "check_matmul_shape", lambda a, b: (2, 3, 4, 6),
     r"for a \(7, 4, 5\) @ b \(5, 6\) you returned \(2, 3, 4, 6\); NumPy gives \(7, 4, 6\)"),
    ("cross-entropy-five-classes", "check_cross_entropy",
     lambda logits, targets: _cross_entropy(logits[..., :5], np.where(targets < 5, targets,
                                                                       -100)),
     r"on logits \(2, 4, 7\) with padding \(-100\) is \d"),
    ("scores-divide-by-2", "check_attention_scores",
     lambda q, k: q @ np.swapaxes(k, -1, -2) / 2.0, r"for q \(3, 9\), k \(5, 9\)"),
    ("scores-3d-transpose", "check_attention_scores",
     lambda q, k: q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]),
     r"transpose written for one rank.*np\.swapaxes\(k, -1, -2\)"),
    ("attention-divide-by-2", "check_attention", _attention_sqrt_hard_coded,
     r"your weights for q \(2, 2, 3, 9\) and a \(3, 5\) mask: at index"),
    ("attention-3d-transpose", "check_attention", _attention_3d_transpose,
     r"transpose written for one rank"),
    ("self-attention-d_k-4", "check_causal_self_attention",
     lambda x, W_q, W_k, W_v, lengths: _causal_self_attention(
         x, W_q * np.sqrt(W_q.shape[-1]) / 2.0, W_k, W_v, lengths),
     r"for x \(3, 6, 10\), d_k=6, lengths \[6, 2, 4\]"),
    ("choose-scale-a-quarter", "check_choose_scale", lambda q, k: 0.25,
     r"for unit-variance entries, d_k=16 you chose c = 0\.2500"),
    ("fuse-heads-fixed-size", "check_fuse_heads", lambda W: W.transpose(1, 0, 2).reshape(10, 18),
     r"raised ValueError: cannot reshape"),
    ("mha-sqrt-6", "check_mha_forward", _mha_sqrt6,
     r"your weights without a mask \(h=2, d_k=4, d_v=3\): at index"),
    ("mha-three-heads", "check_mha_forward", _mha_three_heads, r"raised IndexError"),
    ("cross-attention-three-heads", "check_cross_attention", _cross_three_heads,
     r"raised ValueError: cannot reshape"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in HARD_CODED],
                         ids=[m[0] for m in HARD_CODED])
def test_an_answer_that_hard_codes_a_size_fails_on_the_other_probes(check, wrong, pattern,
                                                                    capsys):
    with pytest.raises(CheckFailed, match=pattern):
        _check(check)(wrong)
    assert capsys.readouterr().out == ""


# ------------------------------------------------------------- short, exact messages


def test_numbers_that_look_equal_at_4_decimals_get_more_digits_and_the_relative_difference():
    want = np.array([0.4418081, 0.25])
    got = want.astype(np.float32) + np.float32(3e-6)  # a float32 answer, slightly off
    with pytest.raises(CheckFailed) as info:
        harness.compare("99.1", got, want, "your weights", "(n,)")
    message = str(info.value)
    mine, theirs = re.search(r"you have (\S+), the reference has (\S+?)[ ;(]", message).groups()
    assert mine != theirs, message
    assert "relative difference of" in message and "your array is float32" in message


def test_a_failed_check_in_a_notebook_shows_the_learners_frames_and_the_message():
    """IPython shows CheckFailed through _render_traceback_: no frame of the checker."""
    cell = ("def attention(q, k, v, mask=None):\n"
            "    scores = q @ k.T\n"
            "    return scores, scores\n")
    namespace = {}
    exec(compile(cell, "<learner cell 7>", "exec"), namespace)
    linecache.cache["<learner cell 7>"] = (len(cell), None, cell.splitlines(True),
                                           "<learner cell 7>")
    check_line = "checks.check_attention(attention)\n"
    linecache.cache["<learner cell 8>"] = (len(check_line), None, [check_line],
                                           "<learner cell 8>")
    with pytest.raises(CheckFailed) as info:
        exec(compile(check_line, "<learner cell 8>", "exec"),
             {"checks": checks, "attention": namespace["attention"]})
    lines = info.value._render_traceback_()
    text = "\n".join(lines)
    assert len(lines) <= 6, text
    assert lines[:2] == ["<learner cell 8>, line 1", "----> 1 checks.check_attention(attention)"]
    assert "<learner cell 7>, line 2, in attention" in text and "scores = q @ k.T" in text
    assert lines[-1].startswith("\x1b[0;31mCheckFailed\x1b[0m: Exercise 03.2: your function raised")
    assert "harness.py" not in text and "lesson03.py" not in text


# ------------------------------------------- the exercise notebooks of lessons 01 to 04 (issue 11)

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS_01_04 = sorted((ROOT / "solutions").glob("0[1-4]_*.ipynb"))


def _cells(path):
    return nbformat.read(path, as_version=4).cells


def _tasks(path):
    return {c.metadata["mha_course"]["exercise"]: c.source for c in _cells(path)
            if c.metadata.get("mha_course", {}).get("role") == "task"}


TASKS_01_04 = {x: src for path in SOLUTIONS_01_04 for x, src in _tasks(path).items()}


@pytest.mark.parametrize("exercise", sorted(TASKS_01_04))
def test_every_hint_unfolds_in_three_stages_a_question_the_shapes_then_code(exercise):
    summaries = re.findall(r"<details><summary>(.*?)</summary>(.*?)</details>",
                           TASKS_01_04[exercise], flags=re.S)
    assert [title for title, _ in summaries] == [
        "Hint 1: a question", "Hint 2: the shapes", "Hint 3: code"], exercise
    question, shapes, _ = (body for _, body in summaries)
    assert "?" in question, f"{exercise}: the first hint asks a question"
    assert re.search(r"\([^()]*,[^()]*\)", shapes), f"{exercise}: the second hint gives shapes"


def _solution_lines(path, exercise):
    """The code lines between BEGIN and END SOLUTION of an exercise, without comments."""
    for cell in _cells(path):
        meta = cell.metadata.get("mha_course", {})
        if meta.get("exercise") == exercise and meta.get("role") == "solution":
            body = cell.source.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
            return [line.split("#")[0].strip() for line in body.splitlines()
                    if line.split("#")[0].strip()]
    raise AssertionError(f"no solution cell for {exercise}")


#: Issue 11: these hints gave the exact code of the answer; now they give the idea, not the lines.
NO_ANSWER_IN_THE_HINT = {"01.2": "01_matmul", "01.3": "01_matmul",
                         "03.3": "03_single_head_attention", "03.4": "03_single_head_attention",
                         "04.1": "04_multi_head_attention", "04.3": "04_multi_head_attention"}


@pytest.mark.parametrize("exercise", sorted(NO_ANSWER_IN_THE_HINT))
def test_the_hint_does_not_give_the_answers_code(exercise):
    path = ROOT / "solutions" / f"{NO_ANSWER_IN_THE_HINT[exercise]}.ipynb"
    stub = next(c.metadata["mha_course"]["task"] for c in _cells(path)
                if c.metadata.get("mha_course", {}).get("exercise") == exercise
                and c.metadata["mha_course"]["role"] == "solution")  # the stub's one line
    task = re.sub(r"\s+", "", TASKS_01_04[exercise] + stub)
    answer = {
        "01.2": ["np.argmax(queries@keys.T,axis=1)", "queries@keys.T", "keys.T"],
        "01.3": ["np.swapaxes(K,-1,-2)", "bhtd,bhsd->bhts"],
        "03.3": ["s<=t", "np.arange(T)[None,:]<=np.arange(T)[:,None]", "np.tril(np.ones"],
        "03.4": ["np.arange(S)[None,:]<np.asarray(lengths)[:,None]"],
        "04.1": ["reshape(B,T,h,", "transpose(0,2,1,3)", "reshapedto(B,T,h,d)"],
        "04.3": ["W.transpose(1,0,2)", "np.concatenate(list(W),axis=1)", "axis=1)"],
    }[exercise]
    answer += [re.sub(r"\s+", "", line) for line in _solution_lines(path, exercise)
               if not line.startswith(("return", "def ")) or len(line) > 12]
    leaked = [a for a in answer if a and a in task]
    assert not leaked, f"{exercise}: the task cell shows {leaked}"


@pytest.mark.parametrize("path", SOLUTIONS_01_04, ids=[p.stem for p in SOLUTIONS_01_04])
def test_each_exercise_notebook_ends_with_its_lesson_and_the_next_lessons_exercises(path):
    last = _cells(path)[-1]
    assert last.cell_type == "markdown", path.name
    links = re.findall(r"\]\(\.\./([^)]+)\)", last.source)
    n = int(path.name[:2])
    assert f"notebooks/{path.name}" in links, links
    after = [link for link in links if link.startswith(f"exercises/{n + 1:02d}_")]
    assert after, links
    for link in links:
        assert (ROOT / link).exists(), link


#: The three find-the-bug exercises: the colleague's code, the name of their function, the
#: check, and the words of the failure the colleague's code must get.
COLLEAGUES = [
    ("02_softmax", "cross_entropy_buggy", "check_cross_entropy",
     r"probs\[:, targets\] pairs every position with every target"),
    ("03_single_head_attention", "causal_self_attention_buggy", "check_causal_self_attention",
     r"3 of the colleague's bugs: the scores are divided by √d_model .*padded QUERIES.*after "
     r"the softmax"),
    ("04_multi_head_attention", "cross_attention_buggy", "check_cross_attention",
     r"keys and values must come from context"),
]


@pytest.mark.parametrize(("name", "function", "check", "pattern"), COLLEAGUES,
                         ids=[c[0] for c in COLLEAGUES])
def test_the_colleagues_code_passes_its_own_test_and_fails_the_check(name, function, check,
                                                                      pattern, capsys):
    """The buggy cell runs the colleague's test (its saved output says it passes); the check
    then fails the same function and names the bugs."""
    cells = _cells(ROOT / "solutions" / f"{name}.ipynb")
    namespace = {"__name__": "__main__"}
    exec(compile(cells[1].source, f"<{name} setup>", "exec"), namespace)
    buggy = next(c for c in cells if f"def {function}(" in c.source)
    assert buggy.metadata["mha_course"]["role"] == "text"
    exec(compile(buggy.source, f"<{name} buggy>", "exec"), namespace)
    printed = capsys.readouterr().out
    assert printed.startswith("the colleague's test passes"), printed
    assert "".join(o.get("text", "") for o in buggy.outputs) == printed
    with pytest.raises(CheckFailed, match=pattern):
        getattr(checks, check)(namespace[function])
