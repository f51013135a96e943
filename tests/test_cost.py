"""param_count and attention_flops, against hand counts and the layer (PyTorch's
count: the gold table of ``tests/test_torch_parity.py``)."""

from __future__ import annotations

import pytest

from mha_course import MultiHeadAttention, attention_flops, param_count

TERMS = {"projections", "scores", "weighted_sum", "output_projection", "total"}


def matmul_flops(m, n, p):
    """An (m, n) @ (n, p) product: m·p dot products of length n, 2 FLOPs per multiply-add."""
    return 2 * m * n * p


# ------------------------------------------------------------------------------- param_count
def test_param_count_hand_values():
    # d_model=512, h=8: four 512 x 512 matrices = 4 · 262144 = 1048576; biases add 4 · 512.
    assert param_count(512, 8) == 1_048_576
    assert param_count(512, 8, bias=True) == 1_048_576 + 2048
    # d_model=6, h=2, d_k=5, d_v=3: W_q, W_k 6·10 = 60 each; W_v 6·6 = 36; W_o 6·6 = 36;
    # total 192. Biases: b_q, b_k 10 each, b_v 6, b_o 6 = 32 more.
    assert param_count(6, 2, d_k=5, d_v=3) == 192
    assert param_count(6, 2, d_k=5, d_v=3, bias=True) == 224
    # d_v defaults to d_k: d_model=6, h=2, d_k=5 -> 4 · 6·10 = 240, biases 3·10 + 6 = 36.
    assert param_count(6, 2, d_k=5) == 240
    assert param_count(6, 2, d_k=5, bias=True) == 276


@pytest.mark.parametrize("d_model", [8, 12, 48])
@pytest.mark.parametrize("bias", [False, True])
def test_param_count_does_not_depend_on_h(d_model, bias):
    counts = {h: param_count(d_model, h, bias=bias) for h in (1, 2, 4) if d_model % h == 0}
    assert set(counts.values()) == {4 * d_model**2 + (4 * d_model if bias else 0)}


@pytest.mark.parametrize(
    ("d_model", "h", "d_k", "d_v"),
    [(8, 2, None, None), (12, 3, None, None), (7, 2, 4, 6), (6, 4, 1, 5), (5, 1, 5, None)],
)
@pytest.mark.parametrize("bias", [False, True])
def test_param_count_equals_the_size_of_the_layers_arrays(d_model, h, d_k, d_v, bias):
    layer = MultiHeadAttention(d_model, h, d_k, d_v, bias=bias, rng=0)
    actual = sum(p.size for p in layer.parameters().values())
    assert param_count(d_model, h, d_k, d_v, bias=bias) == actual


def test_param_count_is_a_python_int():
    assert type(param_count(4096, 32, bias=True)) is int


# --------------------------------------------------------------------------- attention_flops
def test_attention_flops_terms_by_hand():
    # T=3 queries, S=5 keys, d_model=7, h=2 heads, d_k=4, d_v=6.
    # projections: Q (3x7)@(7x8) = 2·3·7·8 = 336; K (5x7)@(7x8) = 2·5·7·8 = 560;
    #              V (5x7)@(7x12) = 2·5·7·12 = 840; together 1736.
    # scores: per head (3x4)@(4x5) = 2·3·4·5 = 120; 2 heads: 240.
    # weighted sum: per head (3x5)@(5x6) = 2·3·5·6 = 180; 2 heads: 360.
    # output projection: (3x12)@(12x7) = 2·3·12·7 = 504.
    # total: 1736 + 240 + 360 + 504 = 2840.
    flops = attention_flops(T=3, d_model=7, h=2, d_k=4, d_v=6, S=5)
    assert flops == {
        "projections": 1736,
        "scores": 240,
        "weighted_sum": 360,
        "output_projection": 504,
        "total": 2840,
    }


@pytest.mark.parametrize(
    ("T", "S", "d_model", "h", "d_k", "d_v"),
    [(3, None, 8, 2, None, None), (3, 5, 7, 2, 4, 6), (1, 9, 6, 3, 1, 5), (10, 4, 16, 4, 8, 2)],
)
def test_attention_flops_terms_equal_the_matmuls_of_a_forward_pass(T, S, d_model, h, d_k, d_v):
    S_ = T if S is None else S
    d_k_ = d_model // h if d_k is None else d_k
    d_v_ = d_k_ if d_v is None else d_v
    expected = {
        "projections": matmul_flops(T, d_model, h * d_k_)  # x @ W_q
        + matmul_flops(S_, d_model, h * d_k_)  # context @ W_k
        + matmul_flops(S_, d_model, h * d_v_),  # context @ W_v
        "scores": h * matmul_flops(T, d_k_, S_),  # q_i @ k_iᵀ for each head
        "weighted_sum": h * matmul_flops(T, S_, d_v_),  # weights_i @ v_i for each head
        "output_projection": matmul_flops(T, h * d_v_, d_model),  # Concat(heads) @ W_o
    }
    expected["total"] = sum(expected.values())
    assert attention_flops(T, d_model, h, d_k=d_k, d_v=d_v, S=S) == expected


@pytest.mark.parametrize("n", [1, 7, 128, 2048])
@pytest.mark.parametrize("d_model", [48, 512])
def test_attention_flops_total_does_not_change_with_h(n, d_model):
    heads = [h for h in (1, 2, 4, 8, 16) if d_model % h == 0]
    totals = {h: attention_flops(n, d_model, h)["total"] for h in heads}
    assert len(totals) >= 4
    assert set(totals.values()) == {8 * n * d_model**2 + 4 * n**2 * d_model}


def test_attention_flops_named_terms_sum_to_the_total():
    flops = attention_flops(T=6, d_model=12, h=3, S=4)
    assert set(flops) == TERMS
    assert flops["total"] == sum(v for k, v in flops.items() if k != "total")


def test_attention_flops_default_S_is_T():
    assert attention_flops(5, 8, 2) == attention_flops(5, 8, 2, S=5)
    assert attention_flops(5, 8, 2) != attention_flops(5, 8, 2, S=6)


def test_attention_flops_are_exact_python_ints_for_long_sequences():
    # n = 10^6, d_model = 4096: the total is ~6.7e19, beyond int64; it must stay exact.
    n, d_model = 10**6, 4096
    flops = attention_flops(n, d_model, 32)
    assert all(type(v) is int for v in flops.values())
    assert flops["total"] == 8 * n * d_model**2 + 4 * n**2 * d_model
