"""The exercise checks: they pass right answers, fail stubs, and name each classic mistake.

Every check in ``mha_course.checks`` is run here on a correct implementation (the package's own
function where the signatures agree, otherwise the solution code), on a stub that raises
``NotImplementedError``, and on wrong implementations, each of which must get its own message.
"""

from __future__ import annotations

import linecache
import re

import numpy as np
import pytest
from test_checks_lesson05 import CORRECT_05
from test_checks_lesson06 import CORRECT_06
from test_checks_lesson07 import CORRECT_07
from test_checks_lesson08 import CORRECT_08
from test_checks_lesson09 import CORRECT_09

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, harness

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


def _masked_softmax(x, mask, fill=-np.inf):  # Exercise 02.4 forbids mha_course.softmax
    scores = np.where(mask, x, fill)
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


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


def _masked_self_attention(q, k, v, lengths):
    T = q.shape[-2]
    mask = mha_course.causal_mask(T) & mha_course.padding_mask(lengths, T)
    return mha_course.scaled_dot_product_attention(q, k, v, mask=mask)


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
    "02.1": ("check_softmax", _softmax),
    "02.2": ("check_softmax_temperature", lambda x, tau: mha_course.softmax(x / tau)),
    "02.3": ("check_log_softmax", _log_softmax),
    "02.4": ("check_masked_softmax", _masked_softmax),
    "03.1": ("check_attention_scores", _scores),
    "03.2": ("check_attention", _attention),
    "03.3": ("check_causal_mask", _causal_mask),
    "03.4": ("check_padding_mask", _padding_mask),
    "03.5": ("check_masked_self_attention", _masked_self_attention),
    "04.1": ("check_split_heads", _split_heads),
    "04.2": ("check_merge_heads", _merge_heads),
    "04.3": ("check_fuse_heads", lambda W: np.concatenate(list(W), axis=1)),
    "04.4": ("check_param_count", _param_count),
    "04.5": ("check_mha_forward", _mha_forward),
    "04.6": ("check_cross_attention", _cross_attention),
    **CORRECT_05,  # lesson 05's right answers live with its tests (tests/test_checks_lesson05.py)
    **CORRECT_06,  # and lesson 06's (tests/test_checks_lesson06.py)
    **CORRECT_07,  # and lesson 07's (tests/test_checks_lesson07.py)
    **CORRECT_08,  # and lesson 08's (tests/test_checks_lesson08.py)
    **CORRECT_09,  # and lesson 09's, read from its solution notebook (test_checks_lesson09.py)
}


def _check(name):
    return getattr(checks, name)


def test_every_public_check_is_tested_here():
    public = {n for n in checks.__all__ if n.startswith("check_")}
    assert public == {name for name, _ in CORRECT.values()}


@pytest.mark.parametrize("ex", sorted(CORRECT))
def test_check_passes_a_correct_answer_with_one_stable_line(ex, capsys):
    name, fn = CORRECT[ex]
    assert _check(name)(fn) is None
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("\n") == 1
    assert out.startswith(f"Exercise {ex} passed: ")
    assert not re.search(r"\d\.\d{5,}", out), "no long floats in the success line"


@pytest.mark.parametrize("ex", sorted(CORRECT))
def test_check_passes_twice_with_identical_output(ex, capsys):
    name, fn = CORRECT[ex]
    _check(name)(fn)
    first = capsys.readouterr().out
    _check(name)(fn)
    assert capsys.readouterr().out == first


def _stub(ex):
    def stub(*args, **kwargs):
        raise NotImplementedError(f"Exercise {ex}: the one-line task")

    return stub


@pytest.mark.parametrize("ex", sorted(CORRECT))
def test_check_lets_the_stub_error_through_for_not_attempted(ex, capsys):
    name, _ = CORRECT[ex]
    with pytest.raises(NotImplementedError, match=rf"^Exercise {ex}: the one-line task$"):
        _check(name)(_stub(ex))
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("ex", sorted(CORRECT))
def test_check_fails_a_function_that_returns_none(ex, capsys):
    name, _ = CORRECT[ex]
    with pytest.raises(CheckFailed, match=rf"^Exercise {ex}: "):
        _check(name)(lambda *a, **k: None)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("ex", sorted(CORRECT))
def test_check_quotes_an_unexpected_exception(ex, capsys):
    name, _ = CORRECT[ex]

    def broken(*args, **kwargs):
        raise KeyError("oops")

    with pytest.raises(CheckFailed, match=rf"^Exercise {ex}: .*raised KeyError"):
        _check(name)(broken)
    assert capsys.readouterr().out == ""


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


def _masked_softmax_nan(x, mask):
    s = np.where(mask, x, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


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
    ("masked-softmax-mask-after", "check_masked_softmax",
     lambda x, mask: _masked_softmax(x, True) * mask, r"mask was applied after the softmax"),
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
    ("masked-softmax-nan-row", "check_masked_softmax", _masked_softmax_nan,
     r"fully masked: their max is -inf"),
    ("masked-softmax-minus-1e9", "check_masked_softmax",
     lambda x, mask: _masked_softmax(x, mask, fill=-1e9), r"uniform.*-1e9"),
    ("masked-softmax-inverted", "check_masked_softmax",
     lambda x, mask: _masked_softmax(x, ~mask), r"mask is inverted"),
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
    ("self-attention-causal-only", "check_masked_self_attention",
     lambda q, k, v, lengths: mha_course.scaled_dot_product_attention(
         q, k, v, mha_course.causal_mask(q.shape[-2])), r"only the causal mask"),
    ("self-attention-or", "check_masked_self_attention",
     lambda q, k, v, lengths: mha_course.scaled_dot_product_attention(
         q, k, v, mha_course.causal_mask(q.shape[-2])
         | mha_course.padding_mask(lengths, q.shape[-2])), r"\| \(or\)"),
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
    def calls_an_unfinished_helper(q, k, v, lengths):
        raise NotImplementedError("Exercise 03.2: write attention")

    with pytest.raises(NotImplementedError, match=r"^Exercise 03.2: write attention$"):
        checks.check_masked_self_attention(calls_an_unfinished_helper)


# ------------------------------------------------ property checks when no known mistake matches


def _unnormalised_attention(q, k, v, mask=None):
    weights = np.exp(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))
    return weights @ v, weights


def _leaky_causal_mask(T):
    mask = _causal_mask(T)
    mask[0, T - 1] = True
    return mask


def _leaky_masked_softmax(x, mask):
    return np.where(mask, _masked_softmax(x, mask), 0.01)


PROPERTIES = [
    ("rows-do-not-sum-to-one", "check_attention", _unnormalised_attention,
     r"row \(0, 0\) of your weights without a mask sums to \d+\.\d{4}, not 1: did you "
     r"normalise over the right axis"),
    ("causal-upper-triangle-not-zero", "check_causal_mask", _leaky_causal_mask,
     r"True at \(query 0, key 3\): query 0 would see the future key 3"),
    ("masked-entries-not-zero", "check_masked_softmax", _leaky_masked_softmax,
     r"0\.0100 at \(0, 0, 1\), where the mask is False"),
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
    ("masked-softmax-five-keys", "check_masked_softmax",
     lambda x, mask: _masked_softmax(x[..., :5], mask[..., :5]),
     r"shape \(4, 5\); expected x\.shape = \(4, 6\)"),
    ("scores-divide-by-2", "check_attention_scores",
     lambda q, k: q @ np.swapaxes(k, -1, -2) / 2.0, r"for q \(3, 9\), k \(5, 9\)"),
    ("scores-3d-transpose", "check_attention_scores",
     lambda q, k: q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]),
     r"transpose written for one rank.*np\.swapaxes\(k, -1, -2\)"),
    ("attention-divide-by-2", "check_attention", _attention_sqrt_hard_coded,
     r"your weights for q \(2, 2, 3, 9\) and a \(3, 5\) mask: at index"),
    ("attention-3d-transpose", "check_attention", _attention_3d_transpose,
     r"transpose written for one rank"),
    ("self-attention-d_k-4", "check_masked_self_attention",
     lambda q, k, v, lengths: _attention(
         q * np.sqrt(q.shape[-1]) / 2.0, k, v,
         _causal_mask(q.shape[-2]) & _padding_mask(lengths, q.shape[-2])),
     r"for lengths \[6, 1, 4\], T=S=6"),
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
