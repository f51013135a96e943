"""The article's list-of-lists algorithms equal NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mha_course import naive

moderate = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
side = st.integers(1, 5)


@given(side, side, side, st.data())
def test_matmul_equals_numpy(m, n, p, data):
    a = data.draw(hnp.arrays(np.float64, (m, n), elements=moderate), label="a")
    b = data.draw(hnp.arrays(np.float64, (n, p), elements=moderate), label="b")
    for func in (naive.matmul, naive.matmul_ijk):
        out = func(a.tolist(), b.tolist())
        assert isinstance(out, list) and len(out) == m and all(len(row) == p for row in out)
        np.testing.assert_allclose(np.array(out), a @ b, rtol=1e-12, atol=1e-12)


def test_matmul_hand_example_on_integers():
    # [[1, 2], [3, 4]] @ [[5], [6]] = [[1·5 + 2·6], [3·5 + 4·6]] = [[17], [39]]
    assert naive.matmul([[1, 2], [3, 4]], [[5], [6]]) == [[17], [39]]
    assert naive.matmul_ijk([[1, 2], [3, 4]], [[5], [6]]) == [[17], [39]]
    # A (2, 3) @ (3, 4) with every dimension different, exact on integers.
    rng = np.random.default_rng(0)
    a, b = rng.integers(-9, 10, (2, 3)), rng.integers(-9, 10, (3, 4))
    assert naive.matmul(a.tolist(), b.tolist()) == (a @ b).tolist()
    assert naive.matmul_ijk(a.tolist(), b.tolist()) == (a @ b).tolist()


def test_matmul_does_not_modify_its_inputs():
    a, b = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[1.0], [0.0], [2.0]]
    naive.matmul(a, b)
    naive.matmul_ijk(a, b)
    assert a == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]] and b == [[1.0], [0.0], [2.0]]


@given(side, side, st.data())
def test_transpose_equals_numpy(m, n, data):
    a = data.draw(hnp.arrays(np.float64, (m, n), elements=moderate), label="a")
    out = naive.transpose(a.tolist())
    assert out == a.T.tolist()
    assert naive.transpose(out) == a.tolist()


def test_transpose_hand_example():
    assert naive.transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


@given(side, side, st.data())
def test_softmax_rows_equals_numpy(m, n, data):
    a = data.draw(hnp.arrays(np.float64, (m, n), elements=moderate), label="a")
    e = np.exp(a - a.max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(naive.softmax_rows(a.tolist()), expected, rtol=1e-12)
    # |a| <= 10: the textbook formula is safe here and gives the same numbers.
    np.testing.assert_allclose(naive.softmax_rows(a.tolist(), stable=False), expected, rtol=1e-12)


def test_softmax_rows_hand_example():
    # exp([0, ln 3]) = [1, 3] -> [1/4, 3/4]
    out = naive.softmax_rows([[0.0, math.log(3)], [5.0, 5.0]])
    np.testing.assert_allclose(out, [[0.25, 0.75], [0.5, 0.5]])


def test_unstable_softmax_overflows_where_the_stable_one_does_not():
    with pytest.raises(OverflowError):
        naive.softmax_rows([[1000.0, 1000.0]], stable=False)
    assert naive.softmax_rows([[1000.0, 1000.0]]) == [[0.5, 0.5]]
