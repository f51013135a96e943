"""softmax, logsumexp and log_softmax: hand-computed cases and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mha_course import log_softmax, logsumexp, softmax

LN2, LN3, LN4, LN6 = math.log(2), math.log(3), math.log(4), math.log(6)

# Finite float64 arrays of 1 to 3 axes, each axis 1 to 5 long.
moderate = st.floats(-50, 50, allow_nan=False, allow_infinity=False)
any_finite = st.floats(allow_nan=False, allow_infinity=False)
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


def arrays(elements=moderate, dtype=np.float64, shape=shapes):
    return hnp.arrays(dtype, shape, elements=elements)


# ------------------------------------------------------------------------- hand-computed cases
def test_softmax_of_logs_is_the_normalised_numbers():
    # exp([0, ln 2, ln 3]) = [1, 2, 3], whose sum is 6: softmax = [1/6, 2/6, 3/6].
    np.testing.assert_allclose(softmax(np.array([0.0, LN2, LN3])), [1 / 6, 2 / 6, 3 / 6])


def test_softmax_normalises_the_axis_it_is_given():
    # x = [[0, 0, ln 4], [ln 3, 0, 0]], exp(x) = [[1, 1, 4], [3, 1, 1]].
    # axis=-1, rows:    [1, 1, 4] / 6 and [3, 1, 1] / 5.
    # axis=0, columns:  [1, 3] / 4, [1, 1] / 2, [4, 1] / 5.
    x = np.array([[0.0, 0.0, LN4], [LN3, 0.0, 0.0]])
    rows = [[1 / 6, 1 / 6, 4 / 6], [3 / 5, 1 / 5, 1 / 5]]
    cols = [[1 / 4, 1 / 2, 4 / 5], [3 / 4, 1 / 2, 1 / 5]]
    np.testing.assert_allclose(softmax(x), rows)
    np.testing.assert_allclose(softmax(x, axis=1), rows)
    np.testing.assert_allclose(softmax(x, axis=0), cols)
    np.testing.assert_allclose(softmax(x, axis=-2), cols)


def test_softmax_does_not_overflow_on_large_scores():
    # exp(1000) overflows a float64, but softmax is shift-invariant: same as [0, ln 2, ln 3].
    x = 1000.0 + np.array([0.0, LN2, LN3])
    np.testing.assert_allclose(softmax(x), [1 / 6, 2 / 6, 3 / 6])
    assert softmax(np.array([1000.0, 1000.0])).tolist() == [0.5, 0.5]
    assert softmax(np.array([-1000.0, -1000.0])).tolist() == [0.5, 0.5]


def test_masked_entries_get_zero_and_the_rest_renormalise():
    # Keep entries 0 and 2: exp([ln 2, ln 6]) = [2, 6], sum 8 -> [1/4, 0, 3/4]. The masked
    # entry is the largest score, so a mask applied after the softmax (or not at all) shows.
    x = np.array([LN2, 5.0, LN6])
    mask = np.array([True, False, True])
    np.testing.assert_allclose(softmax(x, mask=mask), [1 / 4, 0.0, 3 / 4])
    assert softmax(x, mask=mask)[1] == 0.0


def test_fully_masked_row_is_zero_not_nan():
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = np.array([[True, True, False], [False, False, False]])
    out = softmax(x, mask=mask)
    e = math.e
    np.testing.assert_allclose(out[0], [1 / (1 + e), e / (1 + e), 0.0])
    assert out[1].tolist() == [0.0, 0.0, 0.0]


def test_mask_broadcasts_against_x():
    # A (3,) mask applies to every row of a (2, 3) input.
    x = np.array([[0.0, 9.0, LN3], [LN3, -9.0, 0.0]])
    out = softmax(x, mask=np.array([True, False, True]))
    np.testing.assert_allclose(out, [[1 / 4, 0.0, 3 / 4], [3 / 4, 0.0, 1 / 4]])


def test_logsumexp_hand_values():
    # log(1 + 2 + 3) = ln 6; log(2·e^1000) = 1000 + ln 2 (exp(1000) alone would overflow).
    np.testing.assert_allclose(logsumexp(np.array([0.0, LN2, LN3])), LN6)
    np.testing.assert_allclose(logsumexp(np.array([1000.0, 1000.0])), 1000.0 + LN2)
    np.testing.assert_allclose(logsumexp(np.array([-1000.0, -1000.0])), -1000.0 + LN2)


def test_logsumexp_axis_keepdims_and_mask():
    # Rows of exp: [1, 1, 4] and [3, 1, 1] -> ln 6, ln 5; columns -> ln 4, ln 2, ln 5.
    x = np.array([[0.0, 0.0, LN4], [LN3, 0.0, 0.0]])
    np.testing.assert_allclose(logsumexp(x), [LN6, math.log(5)])
    np.testing.assert_allclose(logsumexp(x, axis=0), [LN4, LN2, math.log(5)])
    assert logsumexp(x, keepdims=True).shape == (2, 1)
    assert logsumexp(x, axis=0, keepdims=True).shape == (1, 3)
    # Masking the 4 out of row 0 leaves ln(1 + 1); a fully masked row is log(0) = -inf.
    mask = np.array([[True, True, False], [False, False, False]])
    out = logsumexp(x, mask=mask)
    np.testing.assert_allclose(out[0], LN2)
    assert out[1] == -np.inf


def test_log_softmax_hand_values():
    # log([1/6, 2/6, 3/6]) = [-ln 6, ln 2 - ln 6, ln 3 - ln 6].
    np.testing.assert_allclose(
        log_softmax(np.array([0.0, LN2, LN3])), [-LN6, LN2 - LN6, LN3 - LN6]
    )


def test_log_softmax_is_exact_where_softmax_underflows():
    # softmax([0, -1000]) = [1, e^-1000] underflows to [1, 0], whose log is -inf; log_softmax
    # is x - logsumexp(x) = [0, -1000] - log(1 + e^-1000) = [0, -1000] to float64 precision.
    assert softmax(np.array([0.0, -1000.0]))[1] == 0.0
    np.testing.assert_allclose(log_softmax(np.array([0.0, -1000.0])), [0.0, -1000.0])


def test_log_softmax_masked_entries_are_minus_inf():
    # Keep entries 0 and 2 of [ln 2, 5, ln 6]: log([1/4, 0, 3/4]).
    x = np.array([[LN2, 5.0, LN6], [1.0, 2.0, 3.0]])
    mask = np.array([[True, False, True], [False, False, False]])
    out = log_softmax(x, mask=mask)
    np.testing.assert_allclose(out[0, [0, 2]], [math.log(1 / 4), math.log(3 / 4)])
    assert out[0, 1] == -np.inf
    assert np.all(out[1] == -np.inf)
    assert not np.isnan(out).any()


# -------------------------------------------------------------------------------- properties
@given(arrays(elements=any_finite), st.data())
def test_softmax_slices_sum_to_one_for_any_finite_input(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    p = softmax(x, axis=axis)
    assert p.shape == x.shape
    assert np.all(np.isfinite(p))
    assert np.all(p >= 0) and np.all(p <= 1)
    np.testing.assert_allclose(p.sum(axis=axis), 1.0, rtol=1e-12)


@given(arrays(), st.data())
def test_softmax_is_shift_invariant(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    # One constant per slice along `axis`, broadcast along it.
    shift_shape = list(x.shape)
    shift_shape[axis] = 1
    c = data.draw(hnp.arrays(np.float64, tuple(shift_shape), elements=moderate), label="c")
    np.testing.assert_allclose(softmax(x + c, axis=axis), softmax(x, axis=axis), atol=1e-12)


@given(arrays(shape=hnp.array_shapes(min_dims=1, max_dims=1, max_side=8)))
def test_softmax_preserves_order(x):
    p = softmax(x)
    order = np.argsort(x, kind="stable")
    assert np.all(np.diff(p[order]) >= 0)


@given(arrays(shape=hnp.array_shapes(min_dims=2, max_dims=2, max_side=6)), st.data())
def test_masked_softmax_equals_softmax_of_the_kept_entries(x, data):
    mask = data.draw(hnp.arrays(np.bool_, x.shape), label="mask")
    p = softmax(x, mask=mask)
    assert not np.isnan(p).any()
    for row, keep, out in zip(x, mask, p, strict=True):
        if keep.any():
            kept = np.exp(row[keep] - row[keep].max())
            np.testing.assert_allclose(out[keep], kept / kept.sum(), rtol=1e-12)
            np.testing.assert_allclose(out.sum(), 1.0, rtol=1e-12)
        else:
            assert np.all(out == 0)  # a fully masked row: zeros, never NaN
        assert np.all(out[~keep] == 0)


@given(arrays(), st.data())
def test_log_softmax_and_logsumexp_agree_with_the_definitions(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    # |x| <= 50, so the textbook formulas cannot overflow here.
    np.testing.assert_allclose(
        logsumexp(x, axis=axis), np.log(np.exp(x).sum(axis=axis)), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        np.exp(log_softmax(x, axis=axis)), softmax(x, axis=axis), rtol=1e-12, atol=1e-300
    )


@given(arrays(elements=st.floats(-1e4, 1e4)), st.sampled_from([np.float32, np.float64]))
def test_huge_finite_scores_never_give_nan_or_inf(x, dtype):
    x = x.astype(dtype)
    p = softmax(x)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert np.all(np.isfinite(logsumexp(x)))
    assert np.all(np.isfinite(log_softmax(x)))


# ------------------------------------------------------------------------ dtypes, axes, copies
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("func", [softmax, log_softmax, logsumexp])
def test_output_keeps_the_input_float_dtype(func, dtype, rng):
    x = rng.normal(size=(2, 3, 5)).astype(dtype)
    mask = rng.random((3, 5)) > 0.3
    assert func(x).dtype == dtype
    assert func(x, axis=1, mask=mask).dtype == dtype


def test_leading_axes_are_independent_slices(rng):
    x = rng.normal(size=(2, 3, 4, 5))
    mask = rng.random((3, 4, 5)) > 0.3
    out = softmax(x, mask=mask)
    lse = logsumexp(x, mask=mask)
    for i in range(2):
        for j in range(3):
            for t in range(4):
                np.testing.assert_array_equal(out[i, j, t], softmax(x[i, j, t], mask=mask[j, t]))
                np.testing.assert_allclose(lse[i, j, t], logsumexp(x[i, j, t], mask=mask[j, t]))


def test_softmax_does_not_modify_its_input(rng):
    x = rng.normal(size=(3, 5))
    before = x.copy()
    softmax(x)
    softmax(x, mask=rng.random((3, 5)) > 0.5)
    log_softmax(x)
    logsumexp(x)
    np.testing.assert_array_equal(x, before)


def test_softmax_accepts_nested_lists():
    np.testing.assert_allclose(softmax([[0.0, LN3]]), [[1 / 4, 3 / 4]])
