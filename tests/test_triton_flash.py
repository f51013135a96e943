"""The Triton kernels (mha_course.kernels.triton_flash) against the package's NumPy references.

Run by Triton's interpreter on a machine without a GPU (the module sets ``TRITON_INTERPRET=1``
itself), so the shapes stay small. Skipped with one line without the ``kernels`` extra, unless
``MHA_COURSE_REQUIRE_TRITON=1`` (CI).
"""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import (
    attention_backward,
    causal_mask,
    scaled_dot_product_attention,
    tiled_attention,
)

ATOL = 2e-5  # float32: a few units in the last place of sums over <= 128 terms

# (B, h, g, T, S, d, causal, block_m, block_n): odd lengths, T != S both ways, GQA h=4 with
# g=2 and g=1, causal and not, blocks 16 and 32, d padded (24) and not
SHAPES = [
    (1, 2, 1, 5, 7, 16, True, 16, 16),
    (2, 4, 2, 37, 29, 16, False, 16, 32),
    (1, 4, 2, 45, 23, 32, True, 32, 16),  # T > S causal: the first 22 queries see no key
    (1, 4, 1, 19, 40, 16, True, 16, 16),
    (1, 2, 2, 33, 33, 24, True, 32, 32),
    (1, 4, 4, 50, 17, 16, False, 32, 16),
]
IDS = [f"B{s[0]}h{s[1]}g{s[2]}T{s[3]}S{s[4]}d{s[5]}{'c' if s[6] else ''}m{s[7]}n{s[8]}"
       for s in SHAPES]


def random_qkv(torch, B, h, g, T, S, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(B, h, T, d, generator=gen), torch.randn(B, g, S, d, generator=gen),
            torch.randn(B, g, S, d, generator=gen))


def expand_heads(x, h):
    """(B, g, S, d) -> (B, h, S, d) as NumPy: each K/V head repeated for its group (reference
    only; the kernel never copies)."""
    return np.repeat(x.numpy(), h // x.shape[1], axis=1)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_forward_equals_tiled_attention_and_its_lse(triton_flash, torch, shape):
    B, h, g, T, S, d, causal, bm, bn = shape
    q, k, v = random_qkv(torch, B, h, g, T, S, d)
    o, lse = triton_flash.flash_forward(q, k, v, causal=causal, block_m=bm, block_n=bn)
    ref_o, ref_lse = tiled_attention(q.numpy(), expand_heads(k, h), expand_heads(v, h),
                                     causal=causal, block_size=16, return_lse=True)
    assert o.shape == (B, h, T, d) and lse.shape == (B, h, T)
    np.testing.assert_allclose(o.numpy(), ref_o, rtol=0, atol=ATOL)
    # -inf (a query with no allowed key) in the same places, the finite values equal
    np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(ref_lse))
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=0, atol=ATOL)
    if causal and T > S:
        assert np.isneginf(lse.numpy()[..., : T - S]).all()
        assert (o.numpy()[..., : T - S, :] == 0).all()


def reference_backward(q, k, v, do, causal):
    """The package's backward (attention_backward on the weights of the package's attention),
    with dk and dv summed over each group's query heads."""
    B, h, T, d = q.shape
    g, S = k.shape[1], k.shape[2]
    mask = causal_mask(T, S) if causal else None
    kk, vv = expand_heads(k, h), expand_heads(v, h)
    _, weights = scaled_dot_product_attention(q.numpy(), kk, vv, mask=mask)
    dq, dk, dv = attention_backward(do.numpy(), q.numpy(), kk, vv, weights)
    return (dq, dk.reshape(B, g, h // g, S, d).sum(axis=2),
            dv.reshape(B, g, h // g, S, d).sum(axis=2))


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_backward_equals_the_packages_backward_pass(triton_flash, torch, shape):
    B, h, g, T, S, d, causal, bm, bn = shape
    q, k, v = random_qkv(torch, B, h, g, T, S, d, seed=1)
    do = torch.randn(B, h, T, d, generator=torch.Generator().manual_seed(2))
    o, lse = triton_flash.flash_forward(q, k, v, causal=causal, block_m=bm, block_n=bn)
    grads = triton_flash.flash_backward(q, k, v, o, lse, do, causal=causal, block_m=bm,
                                        block_n=bn)
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference_backward(q, k, v, do, causal),
                               strict=True):
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=ATOL, err_msg=name)
