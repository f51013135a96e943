"""The source article's algorithms on plain lists of lists, for lesson 01 to show and time.

Taught in ``notebooks/01_matmul.ipynb``. These are deliberately slow: they exist so the lesson
can measure how much faster NumPy is, and so a learner can read every step.
"""

from __future__ import annotations

import math

from ._validate import fail


def _dims(func: str, name: str, a) -> tuple[int, int]:
    rows = len(a)
    cols = len(a[0]) if rows else 0
    if rows == 0 or cols == 0 or any(len(row) != cols for row in a):
        raise fail(func, f"{name} must be a non-empty rectangular list of lists")
    return rows, cols


def matmul(a, b):
    """Matrix product of lists of lists, in the cache-friendly i-k-j loop order.

    The inner loop walks row ``k`` of ``b`` and row ``i`` of the result left to right, so both
    are read in the order they lie in memory.

    Parameters
    ----------
    a : list of list of float, shape (m, n)
    b : list of list of float, shape (n, p)

    Returns
    -------
    list of list of float, shape (m, p)

    Raises
    ------
    ValueError
        If the inner dimensions differ or an argument is not rectangular.

    Examples
    --------
    >>> matmul([[1, 2], [3, 4]], [[5], [6]])
    [[17], [39]]
    """
    m, n = _dims("matmul", "a", a)
    n2, p = _dims("matmul", "b", b)
    if n != n2:
        raise fail("matmul", f"b has shape ({n2}, {p}); expected (n, p) with n={n} (from a)")
    out = [[0] * p for _ in range(m)]
    for i in range(m):
        row_out = out[i]
        for k in range(n):
            a_ik = a[i][k]
            row_b = b[k]
            for j in range(p):
                row_out[j] += a_ik * row_b[j]
    return out


def matmul_ijk(a, b):
    """The textbook i-j-k order: the inner loop walks *down* a column of ``b``.

    Same result as :func:`matmul`; kept so lesson 01 can compare loop orders.

    Examples
    --------
    >>> matmul_ijk([[1, 2], [3, 4]], [[5], [6]])
    [[17], [39]]
    """
    m, n = _dims("matmul_ijk", "a", a)
    n2, p = _dims("matmul_ijk", "b", b)
    if n != n2:
        raise fail("matmul_ijk", f"b has shape ({n2}, {p}); expected (n, p) with n={n} (from a)")
    out = [[0] * p for _ in range(m)]
    for i in range(m):
        for j in range(p):
            total = 0
            for k in range(n):
                total += a[i][k] * b[k][j]
            out[i][j] = total
    return out


def transpose(a):
    """Rows become columns: ``transpose(a)[j][i] == a[i][j]``.

    Examples
    --------
    >>> transpose([[1, 2, 3], [4, 5, 6]])
    [[1, 4], [2, 5], [3, 6]]
    """
    _dims("transpose", "a", a)
    return [list(col) for col in zip(*a, strict=True)]


def softmax_rows(a, stable=True):
    """Softmax of each row of a list of lists.

    With ``stable=False`` this is the textbook formula ``exp(x_i) / sum(exp(x_j))``, which
    overflows for scores above about 709 (``math.exp`` raises ``OverflowError``); the default
    subtracts each row's maximum first.

    Examples
    --------
    >>> softmax_rows([[1000.0, 1000.0]])
    [[0.5, 0.5]]
    """
    _dims("softmax_rows", "a", a)
    out = []
    for row in a:
        shift = max(row) if stable else 0.0
        exps = [math.exp(x - shift) for x in row]
        total = sum(exps)
        out.append([e / total for e in exps])
    return out
