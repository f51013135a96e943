"""``tiled_attention``: the online-softmax, tile-by-tile attention equals standard attention.

Checked against the package's ``scaled_dot_product_attention`` (and against torch's
``F.scaled_dot_product_attention``, float64 to 1e-12, float32 to 1e-5, in
``tests/test_torch_parity.py``'s gold table), for every block size
that does or does not divide S, masks, causal (bottom-right aligned, as ``causal_mask``),
T != S, batch axes, fully masked rows, huge scores; that it never allocates a (T, S) array;
that causal skips the tiles above the diagonal; and that bad input gets the same messages as
standard attention.
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mha_course.kernels.lean as lean_module
import mha_course.kernels.tiled as tiled_module
from mha_course import (
    causal_mask,
    logsumexp,
    padding_mask,
    scaled_dot_product_attention,
    tiled_attention,
)
from mha_course.kernels.lean import lean_tiled_attention

TOL = {np.float64: 1e-12, np.float32: 1e-5}  # max abs difference from the reference
# Every dimension different: B=2, h=3, T=11, S=13, d_k=4, d_v=6.
B, H, T, S, D_K, D_V = 2, 3, 11, 13, 4, 6
BLOCKS = [1, 3, 7, S, S + 4]  # 1, two that do not divide S, S itself, more than S


def qkv(rng, T_=T, S_=S, lead=(B, H), dtype=np.float64, scale=1.0):
    q = rng.normal(size=(*lead, T_, D_K)) * scale
    k = rng.normal(size=(*lead, S_, D_K))
    v = rng.normal(size=(*lead, S_, D_V))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def reference(q, k, v, mask=None, causal=False):
    """Standard attention's output, with ``causal`` spelled as an explicit ``causal_mask``."""
    if causal:
        c = causal_mask(q.shape[-2], k.shape[-2])
        mask = c if mask is None else mask & c
    return scaled_dot_product_attention(q, k, v, mask=mask)[0]


def max_abs_diff(a, b):
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def masks(kind, rng, T_=T, S_=S):
    """Masks of several shapes, each broadcastable to (B, h, T, S); no row fully masked."""
    if kind == "none":
        return None
    if kind == "random":  # one per batch element and head
        m = rng.random((B, H, T_, S_)) > 0.5
        m[..., rng.integers(S_)] = True
        return m
    if kind == "padding":  # (B, 1, 1, S): lengths per batch element, the same for every head
        return padding_mask([S_ - 4, S_ - 9], S_)[:, None]
    if kind == "key_vector":  # (S,): one row of keys for every query
        m = np.arange(S_) % 3 != 1
        return m
    raise AssertionError(kind)


MASK_KINDS = ["none", "random", "padding", "key_vector"]


# ------------------------------------------------------------------ parity with the package
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize(("T_", "S_"), [(T, S), (S, T), (S, S)], ids=["T<S", "T>S", "T=S"])
def test_tiled_matches_standard_attention(rng, T_, S_, block_size, kind, causal, dtype):
    q, k, v = qkv(rng, T_, S_, dtype=dtype)
    mask = masks(kind, rng, T_, S_)
    out = tiled_attention(q, k, v, mask=mask, causal=causal, block_size=block_size)
    expected = reference(q, k, v, mask, causal)
    assert out.shape == (B, H, T_, D_V)
    assert out.dtype == dtype
    assert max_abs_diff(out, expected) <= TOL[dtype]


@pytest.mark.parametrize(
    ("q_lead", "k_lead", "v_lead", "mask_shape"),
    [
        ((), (), (), None),  # unbatched
        ((B, H), (1, H), (B, 1), None),  # k shared across the batch, v across heads
        ((H,), (H,), (B, H), (B, 1, 1, S)),  # v and the mask carry a batch axis q and k lack
        ((), (), (B,), (T, S)),  # one mask for the whole batch
    ],
    ids=["unbatched", "k_v_broadcast", "v_and_mask_batched", "mask_shared"],
)
def test_batch_axes_broadcast_as_in_standard_attention(rng, q_lead, k_lead, v_lead, mask_shape):
    q = rng.normal(size=(*q_lead, T, D_K))
    k = rng.normal(size=(*k_lead, S, D_K))
    v = rng.normal(size=(*v_lead, S, D_V))
    mask = None if mask_shape is None else rng.random(mask_shape) > 0.3
    # The reference gets q and k broadcast to every batch axis (standard attention cannot yet
    # apply a mask with batch axes that only v carries: it masks the (..., T, S) scores of q, k).
    batch = np.broadcast_shapes(q_lead, k_lead, v_lead, () if mask is None else mask.shape[:-2])
    q_full = np.broadcast_to(q, (*batch, T, D_K))
    k_full = np.broadcast_to(k, (*batch, S, D_K))
    for causal in (False, True):
        out = tiled_attention(q, k, v, mask=mask, causal=causal, block_size=4)
        expected = reference(q_full, k_full, v, mask, causal)
        assert out.shape == expected.shape
        assert max_abs_diff(out, expected) <= TOL[np.float64]


def test_mask_with_a_length_one_key_axis_broadcasts_over_keys(rng):
    # (B, 1, T, 1): whole queries switched off (e.g. padded query positions); the key axis of
    # length 1 must broadcast to every key block, not be sliced like a full axis.
    q, k, v = qkv(rng)
    mask = np.ones((B, 1, T, 1), dtype=bool)
    mask[0, 0, [1, 4]] = False
    out = tiled_attention(q, k, v, mask=mask, block_size=3)
    assert np.all(out[0, :, [1, 4]] == 0)
    assert max_abs_diff(out, reference(q, k, v, mask)) <= TOL[np.float64]


def test_mixed_precision_promotes_like_standard_attention(rng):
    q, k, v = qkv(rng, dtype=np.float32)
    out = tiled_attention(q, k, v.astype(np.float64), block_size=4)
    assert out.dtype == np.float64
    assert max_abs_diff(out, reference(q, k, v.astype(np.float64))) <= TOL[np.float32]


def test_inputs_are_not_modified(rng):
    q, k, v = qkv(rng)
    mask = masks("random", rng)
    copies = [a.copy() for a in (q, k, v, mask)]
    tiled_attention(q, k, v, mask=mask, causal=True, block_size=3)
    for before, after in zip(copies, (q, k, v, mask), strict=True):
        np.testing.assert_array_equal(before, after)


@given(
    T_=st.integers(1, 9),
    S_=st.integers(1, 9),
    block_size=st.integers(1, 11),
    causal=st.booleans(),
    masked=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_block_size_gives_standard_attention(T_, S_, block_size, causal, masked, seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, T_, S_, lead=(2,), scale=3.0)
    mask = rng.random((2, T_, S_)) > 0.4 if masked else None  # rows may be fully masked
    out = tiled_attention(q, k, v, mask=mask, causal=causal, block_size=block_size)
    assert np.all(np.isfinite(out))
    assert max_abs_diff(out, reference(q, k, v, mask, causal)) <= TOL[np.float64]


# ---------------------------------------------------------------------- numerical extremes
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_fully_masked_rows_give_zero_not_nan(rng, dtype):
    q, k, v = qkv(rng, dtype=dtype)
    mask = rng.random((B, H, T, S)) > 0.5
    mask[0, 1, 2] = False  # one query with no key at all
    mask[1, :, 4, :8] = False  # masked in the first blocks, allowed later: m stays -inf, then not
    mask[1, :, 4, 8:] = True
    with np.errstate(all="raise"):  # no invalid operation (inf - inf) anywhere
        out = tiled_attention(q, k, v, mask=mask, block_size=3)
    assert np.all(out[0, 1, 2] == 0)
    assert max_abs_diff(out, reference(q, k, v, mask)) <= TOL[dtype]


def test_causal_queries_before_the_first_key_give_zero():
    # T > S: query t sees keys s <= t + (S - T), so the first T - S queries see none.
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng, T_=S, S_=T)  # T=13 queries, S=11 keys: queries 0 and 1 see nothing
    out = tiled_attention(q, k, v, causal=True, block_size=1)
    assert np.all(out[..., : S - T, :] == 0)
    assert np.all(out[..., S - T :, :] != 0)


def test_no_keys_gives_zero_output():
    out = tiled_attention(np.ones((3, 4)), np.ones((0, 4)), np.ones((0, 6)))
    assert out.shape == (3, 6) and np.all(out == 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_huge_scores_do_not_overflow(rng, dtype, sign):
    # Scores of about ±1e4 (exp overflows past ~89 in float32, ~710 in float64); the largest
    # keys come last, so the running max grows block after block and every rescale is used.
    q = np.full((2, T, D_K), 60.0 * sign)
    k = np.linspace(0.0, 100.0, S)[:, None] * np.ones(D_K) + rng.normal(size=(2, S, D_K))
    v = rng.normal(size=(2, S, D_V))
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    with np.errstate(over="raise", invalid="raise"):
        out = tiled_attention(q, k, v, block_size=3)
    expected = reference(q, k, v)
    assert np.all(np.isfinite(out))
    assert np.abs(q[0] @ k[0].T).max() / np.sqrt(D_K) > 1e4  # the scores really are huge
    assert max_abs_diff(out, expected) <= TOL[dtype]


def test_float32_in_float32_out_for_every_path(rng):
    q, k, v = qkv(rng, dtype=np.float32)
    for mask in (None, masks("random", rng)):
        for causal in (False, True):
            out = tiled_attention(q, k, v, mask=mask, causal=causal, block_size=5)
            assert out.dtype == np.float32


# ------------------------------------------------------------------------------- memory
def peak_traced_bytes(f) -> int:
    """Peak memory traced during ``f()`` above what was traced at its start."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        f()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_never_allocates_a_T_by_S_array(causal):
    n, block = 2048, 128
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, n, 64)) for _ in range(3))  # one head, float64
    t_by_s = n * n * 8  # bytes of one (T, S) float64 array: 32 MiB
    peak = peak_traced_bytes(lambda: tiled_attention(q, k, v, causal=causal, block_size=block))
    # Holds q / √d_k, the output and one (block, block) tile: about 2.3 MiB here.
    assert peak < t_by_s / 8, f"peak {peak / 2**20:.1f} MiB"
    # The measurement does see NumPy arrays: standard attention holds at least the (T, S) weights.
    assert peak_traced_bytes(lambda: scaled_dot_product_attention(q, k, v)) >= t_by_s


def test_float32_input_computes_in_float32():
    # A float64 temporary anywhere (e.g. NumPy 2 promoting by an np.float64 scalar) would show as
    # float32 peak memory close to float64's instead of half of it.
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 512, 64)) for _ in range(3))
    peaks = {}
    for dtype in (np.float64, np.float32):
        args = [a.astype(dtype) for a in (q, k, v)]
        peaks[dtype] = peak_traced_bytes(
            lambda args=args: tiled_attention(*args, causal=True, block_size=128)
        )
    assert peaks[np.float32] <= 0.6 * peaks[np.float64], peaks


def test_mask_is_sliced_not_expanded(rng):
    # A (S,) key mask must not be broadcast to a full (B, h, T, S) array along the way.
    n = 1024
    q, k, v = qkv(rng, T_=n, S_=n, lead=(1,))
    mask = np.arange(n) % 5 != 0
    full = n * n  # bytes of one (T, S) bool array
    peak = peak_traced_bytes(lambda: tiled_attention(q, k, v, mask=mask, block_size=64))
    assert peak < full / 2, f"peak {peak / 2**20:.2f} MiB"


# ------------------------------------------------------------------------- causal skipping
def count_visited_tiles(monkeypatch, call) -> int:
    """Run ``call`` while counting the (query block, key block) tiles the loop computes."""
    visited = []
    original = tiled_module.key_blocks

    def counting(*args, **kwargs):
        for s0, s1 in original(*args, **kwargs):
            visited.append((s0, s1))
            yield s0, s1

    monkeypatch.setattr(tiled_module, "key_blocks", counting)
    call()
    return len(visited)


@pytest.mark.parametrize(
    ("n_q_blocks", "n_k_blocks", "causal", "expected"),
    [
        (8, 8, False, 64),  # every tile
        (8, 8, True, 36),  # 8 + 7 + ... + 1: the diagonal tiles and those below it
        (2, 8, True, 15),  # T < S: the 2 query blocks are the last 2 of 8, seeing 7 and 8 blocks
        (8, 2, True, 3),  # T > S: 6 query blocks see no key; the last 2 see 1 and 2 blocks
    ],
)
def test_causal_skips_tiles_above_the_diagonal(
    monkeypatch, rng, n_q_blocks, n_k_blocks, causal, expected
):
    block = 4
    q, k, v = qkv(rng, T_=n_q_blocks * block, S_=n_k_blocks * block, lead=(2,))
    result = {}

    def call():
        result["out"] = tiled_attention(q, k, v, causal=causal, block_size=block)

    assert count_visited_tiles(monkeypatch, call) == expected
    # ... and skipping changed nothing: the output is still standard attention's.
    assert max_abs_diff(result["out"], reference(q, k, v, causal=causal)) <= TOL[np.float64]


# ------------------------------------------------------------------------------- errors
z = np.zeros
BAD_INPUTS = {
    "k d_k": ((3, 8), (5, 6), (5, 6), None),
    "q rank": ((4,), (5, 4), (5, 6), None),
    "k rank": ((3, 4), (4,), (5, 6), None),
    "v rank": ((3, 4), (5, 4), (6,), None),
    "v S": ((3, 4), (5, 4), (6, 6), None),
    "batch": ((2, 3, 4), (3, 5, 4), (3, 5, 6), None),
    "mask not bool": ((3, 4), (5, 4), (5, 6), np.ones((3, 5))),
    "mask transposed": ((2, 3, 4), (2, 5, 4), (2, 5, 6), np.ones((5, 3), dtype=bool)),
    "mask extra batch": ((3, 4), (5, 4), (5, 6), np.ones((2, 3, 5), dtype=bool)),
}


def message_of(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize(("q", "k", "v", "mask"), BAD_INPUTS.values(), ids=list(BAD_INPUTS))
def test_bad_shapes_get_standard_attentions_message(q, k, v, mask):
    ours = message_of(lambda: tiled_attention(z(q), z(k), z(v), mask=mask))
    standard = message_of(lambda: scaled_dot_product_attention(z(q), z(k), z(v), mask=mask))
    assert ours == standard.replace("scaled_dot_product_attention:", "tiled_attention:", 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            (z((3, 8)), z((5, 6)), z((5, 6))),
            "tiled_attention: k has shape (5, 6); expected (S, d_k) with d_k=8 (from q)",
        ),
        (
            (z((3, 4), np.int64), z((5, 4)), z((5, 6))),
            "tiled_attention: q has dtype int64; expected a real floating dtype "
            "(float32 or float64)",
        ),
        (
            (z((3, 4)), z((5, 4)), z((5, 6), np.complex64)),
            "tiled_attention: v has dtype complex64; expected a real floating dtype "
            "(float32 or float64)",
        ),
    ],
    ids=["design_example", "q_int", "v_complex"],
)
def test_bad_input_message_exactly(args, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        tiled_attention(*args)


@pytest.mark.parametrize(
    ("block_size", "message"),
    [
        (0, "tiled_attention: block_size=0 must be an integer >= 1"),
        (-3, "tiled_attention: block_size=-3 must be an integer >= 1"),
        (2.0, "tiled_attention: block_size=2.0 must be an integer >= 1"),
        (True, "tiled_attention: block_size=True must be an integer >= 1"),
        (None, "tiled_attention: block_size=None must be an integer >= 1"),
    ],
)
def test_block_size_must_be_a_positive_integer(block_size, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        tiled_attention(z((3, 4)), z((5, 4)), z((5, 6)), block_size=block_size)


def test_numpy_integer_block_size_is_accepted(rng):
    q, k, v = qkv(rng)
    out = tiled_attention(q, k, v, block_size=np.int64(4))
    assert max_abs_diff(out, reference(q, k, v)) <= TOL[np.float64]


# ------------------------------------------------------------------------ the log-sum-exp
def reference_lse(q, k, mask=None, causal=False):
    """``logsumexp`` of the scaled, masked scores, from the whole (..., T, S) matrix."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        c = causal_mask(q.shape[-2], k.shape[-2])
        mask = c if mask is None else mask & c
    if mask is not None:
        mask = np.broadcast_to(mask, scores.shape)
    return logsumexp(scores, axis=-1, mask=mask)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("block_size", BLOCKS)
@pytest.mark.parametrize(("T_", "S_"), [(T, S), (S, T), (S, S)], ids=["T<S", "T>S", "T=S"])
def test_lse_is_the_logsumexp_of_the_scaled_masked_scores(rng, T_, S_, block_size, kind, causal):
    q, k, v = qkv(rng, T_, S_)
    mask = masks(kind, rng, T_, S_)
    out, lse = tiled_attention(q, k, v, mask=mask, causal=causal, block_size=block_size,
                               return_lse=True)
    expected = reference_lse(q, k, mask, causal)
    assert lse.shape == (B, H, T_) and lse.dtype == np.float64
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(expected))  # -inf on the same rows
    assert max_abs_diff(np.where(np.isinf(lse), 0, lse), np.where(np.isinf(lse), 0, expected)) \
        <= 1e-12
    # ... and return_lse changes nothing about out.
    np.testing.assert_array_equal(out, tiled_attention(q, k, v, mask=mask, causal=causal,
                                                       block_size=block_size))


@pytest.mark.parametrize("block_size", BLOCKS)
def test_lse_is_minus_inf_and_out_zero_on_fully_masked_rows(rng, block_size):
    q, k, v = qkv(rng)
    mask = rng.random((B, H, T, S)) > 0.5
    mask[..., 0] = True
    mask[0, 1, 2] = False  # no key at all
    mask[1, 2, [0, 5]] = False
    with np.errstate(all="raise"):  # no log(0) warning, no inf - inf
        out, lse = tiled_attention(q, k, v, mask=mask, block_size=block_size, return_lse=True)
    assert lse[0, 1, 2] == -np.inf and lse[1, 2, 0] == -np.inf and lse[1, 2, 5] == -np.inf
    assert np.all(out[0, 1, 2] == 0) and np.all(out[1, 2, [0, 5]] == 0)
    assert np.isfinite(lse).sum() == lse.size - 3
    expected = reference_lse(q, k, mask)
    finite = np.isfinite(lse)
    assert max_abs_diff(lse[finite], expected[finite]) <= 1e-12


def test_lse_of_causal_queries_before_the_first_key_is_minus_inf(rng):
    q, k, v = qkv(rng, T_=S, S_=T)  # T=13 queries, S=11 keys: queries 0 and 1 see no key
    out, lse = tiled_attention(q, k, v, causal=True, block_size=4, return_lse=True)
    assert np.all(lse[..., : S - T] == -np.inf) and np.all(np.isfinite(lse[..., S - T :]))
    assert np.all(out[..., : S - T, :] == 0)


def test_lse_with_no_keys_is_minus_inf():
    out, lse = tiled_attention(np.ones((3, 4)), np.ones((0, 4)), np.ones((0, 6)),
                               return_lse=True)
    assert out.shape == (3, 6) and lse.shape == (3,) and np.all(lse == -np.inf)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_lse_of_huge_scores_is_exact(rng, dtype, sign):
    # Scores of about ±1e4: exp overflows long before; lse = m + log l must not.
    q = np.full((2, T, D_K), 60.0 * sign)
    k = np.linspace(0.0, 100.0, S)[:, None] * np.ones(D_K) + rng.normal(size=(2, S, D_K))
    q, k, v = q.astype(dtype), k.astype(dtype), rng.normal(size=(2, S, D_V)).astype(dtype)
    with np.errstate(over="raise", invalid="raise"):
        _, lse = tiled_attention(q, k, v, block_size=3, return_lse=True)
    expected = reference_lse(q.astype(np.float64), k.astype(np.float64))
    assert lse.dtype == dtype and np.all(np.isfinite(lse))
    assert np.abs(q[0] @ k[0].T).max() / np.sqrt(D_K) > 1e4  # the scores really are huge
    assert np.max(np.abs(lse - expected) / np.abs(expected)) <= {np.float64: 1e-14,
                                                                 np.float32: 1e-6}[dtype]


def test_weights_recomputed_from_q_k_and_lse_equal_standard_attentions(rng):
    # What a FlashAttention backward pass does: it keeps out and lse, not the (T, S) weights,
    # and recomputes the weights from q, k and lse when it needs them.
    q, k, v = qkv(rng)
    mask = masks("random", rng)
    _, lse = tiled_attention(q, k, v, mask=mask, causal=True, block_size=4, return_lse=True)
    full = mask & causal_mask(T, S)
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(D_K)
    recomputed = np.where(full, np.exp(scores - lse[..., None]), 0.0)
    _, weights = scaled_dot_product_attention(q, k, v, mask=full)
    assert max_abs_diff(recomputed, weights) <= 1e-13


# ------------------------------------------------- the fast paths change nothing but rounding
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_skipping_the_running_max_gives_the_same_result(rng, dtype, causal):
    # Ordinary scores take lean's path without a running max; tiled_attention always keeps it.
    q, k, v = qkv(rng, dtype=dtype)
    assert lean_module.exp_is_safe(q / np.sqrt(D_K), np.swapaxes(k, -1, -2), dtype)
    fast = lean_tiled_attention(q, k, v, causal=causal, block_size=4, return_lse=True)
    kept = tiled_attention(q, k, v, causal=causal, block_size=4, return_lse=True)
    for a, b in zip(fast, kept, strict=True):
        assert max_abs_diff(a, b) <= TOL[dtype]


def test_scores_too_large_for_the_shortcut_keep_the_running_max(rng):
    # Scores beyond 89, where exp overflows float32: exp_is_safe must say no, and the output is
    # still finite and right, which it could not be without the running max.
    q, k, v = qkv(rng, scale=40.0, dtype=np.float32)
    assert not lean_module.exp_is_safe(q / np.sqrt(D_K), np.swapaxes(k, -1, -2), np.float32)
    assert (q @ np.swapaxes(k, -1, -2)).max() / np.sqrt(D_K) > 89
    for attention in (tiled_attention, lean_tiled_attention):
        with np.errstate(over="raise", invalid="raise"):
            out = attention(q, k, v, block_size=4)
        assert max_abs_diff(out, reference(q, k, v)) <= 1e-5


# ------------------------------------------------------------------------------- on_tile
def test_on_tile_reports_the_running_max_sum_and_output_of_every_tile(rng):
    q, k, v = qkv(rng, lead=())  # one head: (T, d_k), (S, d_k), (S, d_v)
    states = []
    out, lse = tiled_attention(q, k, v, block_size=4, causal=True, return_lse=True,
                               on_tile=states.append)
    scores = q @ k.T / np.sqrt(D_K)
    allowed = causal_mask(T, S)
    assert [(s["queries"], s["keys"]) for s in states] == [
        ((t0, min(t0 + 4, T)), (s0, min(s0 + 4, S)))
        for t0 in range(0, T, 4) for s0 in range(0, min(S, t0 + 4 + S - T), 4)
    ]
    for state in states:
        (t0, t1), (_, s1) = state["queries"], state["keys"]
        seen = np.where(allowed[t0:t1, :s1], scores[t0:t1, :s1], -np.inf)  # keys 0..s1-1
        m = seen.max(axis=-1)
        p = np.exp(seen - m[:, None])
        np.testing.assert_allclose(state["m"], m, rtol=1e-13)
        np.testing.assert_allclose(state["l"], p.sum(axis=-1), rtol=1e-12)
        np.testing.assert_allclose(state["acc"], p @ v[:s1], rtol=1e-12, atol=1e-13)
        if s1 == min(S, t1 + S - T):  # the query block's last tile: the final result
            np.testing.assert_allclose(state["acc"] / state["l"][:, None], out[t0:t1],
                                       atol=1e-13)
            np.testing.assert_allclose(state["m"] + np.log(state["l"]), lse[t0:t1], atol=1e-13)


def test_on_tile_gets_copies(rng):
    q, k, v = qkv(rng, lead=(2,))
    states = []
    tiled_attention(q, k, v, block_size=5, on_tile=states.append)
    first = states[0]
    assert first["acc"].shape == (2, 5, D_V) and first["m"].shape == first["l"].shape == (2, 5)
    assert not np.shares_memory(first["acc"], states[1]["acc"])
    np.testing.assert_allclose(first["acc"], states[0]["acc"])  # not overwritten later


# ------------------------------------------------------------------------- the four tricks
ALL_TRICKS = [
    lean_module.Tricks(max_shortcut=a, ones_column=b, base2=c, shift_in_matmul=d)
    for a in (True, False) for b in (True, False) for c in (True, False) for d in (True, False)
]


@pytest.mark.parametrize("tricks", ALL_TRICKS, ids=lambda t: "".join(
    "1" if x else "0" for x in (t.max_shortcut, t.ones_column, t.base2, t.shift_in_matmul)))
@pytest.mark.parametrize("scale", [1.0, 3.0], ids=["N(0,1)", "N(0,9)"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_combination_of_tricks_gives_standard_attention(rng, tricks, scale, causal):
    q, k, v = qkv(rng, scale=scale)
    k *= scale
    out, lse = lean_tiled_attention(q, k, v, causal=causal, block_size=4, return_lse=True,
                               tricks=tricks)
    assert max_abs_diff(out, reference(q, k, v, causal=causal)) <= TOL[np.float64]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(D_K)
    allowed = causal_mask(T, S) if causal else None
    np.testing.assert_allclose(lse, logsumexp(scores, mask=allowed), atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize(("T_", "S_"), [(T, S), (S, T)], ids=["T<S", "T>S"])
def test_the_shift_in_the_matmul_matches_standard_attention(rng, T_, S_, kind, causal, dtype):
    # Scores too large for the shortcut (q and k scaled until the Cauchy-Schwarz bound fails at
    # d_k = 4), so trick 4 runs (or, for blocks it cannot take, the running max).
    scale = 4.0 if dtype == np.float32 else 10.0
    q, k, v = qkv(rng, T_=T_, S_=S_, dtype=dtype, scale=scale)
    k = (k * scale).astype(dtype)
    assert not lean_module.exp_is_safe(q / np.sqrt(D_K), np.swapaxes(k, -1, -2), dtype)
    mask = masks(kind, rng, T_, S_)
    out = lean_tiled_attention(q, k, v, mask=mask, causal=causal, block_size=4)
    assert out.dtype == dtype
    assert max_abs_diff(out, reference(q, k, v, mask, causal)) <= 4 * TOL[dtype]


def test_trick_4_runs_for_large_scores_and_not_for_small_ones(rng, monkeypatch):
    calls = []
    real = lean_module._folded_block
    monkeypatch.setattr(lean_module, "_folded_block",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = qkv(rng, lead=(2,))
    lean_tiled_attention(q, k, v, block_size=4)
    assert calls == []  # the shortcut: no shift at all
    lean_tiled_attention(q * 300.0, k, v, block_size=4)
    assert len(calls) == -(-T // 4)  # one call per query block
    calls.clear()
    lean_tiled_attention(q * 300.0, k, v, block_size=4, tricks=lean_module.Tricks(
        shift_in_matmul=False))
    assert calls == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_trick_4_redoes_a_block_whose_later_scores_overflow_the_first_tiles_shift(rng, dtype):
    # The keys grow along s, so the last tiles' scores exceed the first tile's max by far more
    # than exp can take (~88 in float32, ~709 in float64): the block must be redone with the
    # running max, silently (no FloatingPointError even with errors raised) and exactly.
    q = np.full((T, D_K), 1.0)
    big = 400.0 if dtype == np.float32 else 3000.0
    k = np.linspace(0.0, big, S)[:, None] * np.ones(D_K) / np.sqrt(D_K) + rng.normal(size=(S, D_K))
    v = rng.normal(size=(S, D_V))
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    with np.errstate(over="raise", invalid="raise"):
        out, lse = lean_tiled_attention(q, k, v, block_size=4, return_lse=True)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    assert max_abs_diff(out, reference(q, k, v)) <= TOL[dtype] * 10
    scores = q @ k.T / np.sqrt(D_K)
    np.testing.assert_allclose(lse, logsumexp(scores.astype(np.float64)), rtol=1e-6)


def test_tricks_must_be_a_tricks(rng):
    q, k, v = qkv(rng, lead=())
    with pytest.raises(ValueError,
                       match="^lean_tiled_attention: tricks must be a Tricks, got dict$"):
        lean_tiled_attention(q, k, v, tricks={"base2": True})


def test_base2_none_follows_what_numpy_vectorises(rng, monkeypatch):
    assert isinstance(lean_module.exp2_is_vectorised(), bool)
    used = []
    real_exp2, real_exp = np.exp2, np.exp
    monkeypatch.setattr(np, "exp2", lambda *a, **kw: used.append("exp2") or real_exp2(*a, **kw))
    monkeypatch.setattr(np, "exp", lambda *a, **kw: used.append("exp") or real_exp(*a, **kw))
    q, k, v = qkv(rng, lead=())
    lean_tiled_attention(q, k, v, block_size=4)
    assert set(used) == {"exp2" if lean_module.exp2_is_vectorised() else "exp"}
    used.clear()
    lean_tiled_attention(q, k, v, block_size=4, tricks=lean_module.Tricks(base2=True))
    assert set(used) == {"exp2"}
