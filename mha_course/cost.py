"""What attention costs: parameters and floating-point operations.

Taught in ``notebooks/04_multi_head_attention.ipynb``.

FLOPs count a multiply-add as 2 operations, so an (m, n) @ (n, p) matmul costs ``2·m·n·p``.
The softmax (about 5 operations per weight: max, subtract, exp, sum, divide) is not in the
total: it is not a matmul, and it is the part that *does* grow with ``h`` (``h·T·S`` weights).
"""

from __future__ import annotations

from ._checks import check_positive_int
from .multihead import _head_dims


def param_count(d_model, h, d_k=None, d_v=None, bias=False) -> int:
    """Number of parameters of :class:`~mha_course.MultiHeadAttention`.

    ``W_q``, ``W_k``: d_model·h·d_k each; ``W_v``: d_model·h·d_v; ``W_o``: h·d_v·d_model; with
    biases, h·d_k + h·d_k + h·d_v + d_model more. With d_k = d_v = d_model / h this is
    ``4·d_model²`` (+ ``4·d_model``), whatever ``h`` is.

    Parameters
    ----------
    d_model, h : int
    d_k, d_v : int, optional
        Defaults as in :class:`~mha_course.MultiHeadAttention`.
    bias : bool, default False

    Returns
    -------
    int

    Raises
    ------
    ValueError
        As :class:`~mha_course.MultiHeadAttention`.

    Examples
    --------
    >>> param_count(512, 8), param_count(512, 8, bias=True)
    (1048576, 1050624)
    """
    d_model, h, d_k, d_v = _head_dims("param_count", d_model, h, d_k, d_v)
    weights = 2 * d_model * h * d_k + d_model * h * d_v + h * d_v * d_model
    biases = 2 * h * d_k + h * d_v + d_model if bias else 0
    return weights + biases


def attention_flops(T, d_model, h, d_k=None, d_v=None, S=None) -> dict[str, int]:
    """Matmul FLOPs of one multi-head attention forward pass, by term.

    Parameters
    ----------
    T : int
        Query positions.
    d_model, h : int
    d_k, d_v : int, optional
        Defaults as in :class:`~mha_course.MultiHeadAttention`.
    S : int, optional
        Key/value positions (default ``T``, self-attention).

    Returns
    -------
    dict of str to int
        ``"projections"`` (Q, K and V: ``2·T·d_model·h·d_k + 2·S·d_model·h·(d_k + d_v)``),
        ``"scores"`` (``2·h·T·S·d_k``), ``"weighted_sum"`` (``2·h·T·S·d_v``),
        ``"output_projection"`` (``2·T·h·d_v·d_model``) and ``"total"``. With
        d_k = d_v = d_model / h the total is ``8·n·d_model² + 4·n²·d_model`` for n = T = S:
        it does not depend on ``h``.

    Raises
    ------
    ValueError
        If a size is not a positive integer, or as :class:`~mha_course.MultiHeadAttention`.

    Examples
    --------
    >>> attention_flops(T=10, d_model=512, h=8)["total"] == 8 * 10 * 512**2 + 4 * 10**2 * 512
    True
    """
    func = "attention_flops"
    T = check_positive_int(func, "T", T)
    S = T if S is None else check_positive_int(func, "S", S)
    d_model, h, d_k, d_v = _head_dims(func, d_model, h, d_k, d_v)
    terms = {
        "projections": 2 * T * d_model * h * d_k + 2 * S * d_model * h * (d_k + d_v),
        "scores": 2 * h * T * S * d_k,
        "weighted_sum": 2 * h * T * S * d_v,
        "output_projection": 2 * T * h * d_v * d_model,
    }
    terms["total"] = sum(terms.values())
    return terms
