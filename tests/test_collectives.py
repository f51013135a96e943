"""The simulated collectives: each equals its NumPy meaning (a sum, a concatenation, a
re-sharding) on every device, and its byte counters equal the formula of ``expected_bytes``.

Hypothesis draws the number of devices, the shapes (sizes that p divides and sizes it does
not) and the axes; placeholders (``Meta``) must count exactly the bytes real arrays do.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_course.parallel.collectives import (
    Cluster,
    Meta,
    expected_bytes,
    meta,
    shard,
    unshard,
)

devices = st.integers(min_value=1, max_value=6)


def arrays(rng, p, shape, dtype=np.float64):
    return [rng.normal(size=shape).astype(dtype) for _ in range(p)]


@given(p=devices, rows=st.integers(1, 9), cols=st.integers(1, 7), seed=st.integers(0, 99))
def test_all_reduce_gives_every_device_the_sum(p, rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = arrays(rng, p, (rows, cols))
    cluster = Cluster(p)
    out = cluster.all_reduce(x)
    for o in out:
        np.testing.assert_allclose(o, np.sum(x, axis=0), atol=1e-12)
        assert o.shape == (rows, cols)
    n = rows * cols
    if n % p == 0:  # equal chunks: exactly the formula
        assert cluster.sent.tolist() == [expected_bytes("all_reduce", x[0].nbytes, p)] * p
    assert cluster.sent.sum() == cluster.received.sum()
    # each element is sent twice around the ring but for its own chunk: 2 (p-1) chunks per device
    assert cluster.sent.sum() == 2 * (p - 1) * x[0].nbytes


def test_all_reduce_of_integers_is_exact_and_logged_once():
    cluster = Cluster(4)
    out = cluster.all_reduce([np.arange(12).reshape(3, 4) * (i + 1) for i in range(4)])
    np.testing.assert_array_equal(out[3], np.arange(12).reshape(3, 4) * 10)
    assert [name for name, _ in cluster.log] == ["all_reduce"]
    assert cluster.bytes_by_collective() == {"all_reduce": expected_bytes("all_reduce", 96, 4)}


@given(p=devices, rows=st.integers(1, 8), cols=st.integers(1, 8), axis=st.sampled_from([0, 1, -1]),
       seed=st.integers(0, 99))
def test_reduce_scatter_leaves_chunk_i_of_the_sum_on_device_i(p, rows, cols, axis, seed):
    rng = np.random.default_rng(seed)
    x = arrays(rng, p, (rows, cols))
    cluster = Cluster(p)
    out = cluster.reduce_scatter(x, axis=axis)
    want = np.array_split(np.sum(x, axis=0), p, axis=axis)
    for o, w in zip(out, want, strict=True):
        np.testing.assert_allclose(o, w, atol=1e-12)
    if x[0].shape[axis] % p == 0:
        assert cluster.sent.tolist() == [expected_bytes("reduce_scatter", x[0].nbytes, p)] * p


@given(p=devices, sizes=st.lists(st.integers(1, 5), min_size=6, max_size=6),
       seed=st.integers(0, 99))
def test_all_gather_concatenates_in_device_order(p, sizes, seed):
    rng = np.random.default_rng(seed)
    x = [rng.normal(size=(sizes[i], 3)) for i in range(p)]  # pieces of different lengths
    cluster = Cluster(p)
    out = cluster.all_gather(x, axis=0)
    for o in out:
        np.testing.assert_array_equal(o, np.concatenate(x, axis=0))
    # device i forwards every piece but the one of device i + 1
    for i in range(p):
        assert cluster.sent[i] == sum(x[j].nbytes for j in range(p) if j != (i + 1) % p)
    if len(set(sizes[:p])) == 1:
        assert cluster.sent.tolist() == [expected_bytes("all_gather", x[0].nbytes, p)] * p


@given(p=devices, heads=st.integers(1, 3), tokens=st.integers(1, 4), seed=st.integers(0, 99))
def test_all_to_all_moves_chunk_j_of_device_i_to_device_j(p, heads, tokens, seed):
    rng = np.random.default_rng(seed)
    x = arrays(rng, p, (heads * p, tokens, 2))  # (heads, T/p, d) on each device
    cluster = Cluster(p)
    out = cluster.all_to_all(x, split_axis=0, concat_axis=1)
    for j, o in enumerate(out):
        want = np.concatenate([np.split(x[i], p, axis=0)[j] for i in range(p)], axis=1)
        np.testing.assert_array_equal(o, want)
        assert o.shape == (heads, tokens * p, 2)
    assert cluster.sent.tolist() == [expected_bytes("all_to_all", x[0].nbytes, p)] * p
    back = cluster.all_to_all(out, split_axis=1, concat_axis=0)  # the inverse re-sharding
    for a, b in zip(back, x, strict=True):
        np.testing.assert_array_equal(a, b)


@given(p=devices, shift=st.integers(-3, 3))
def test_ring_pass_sends_each_array_to_the_next_device(p, shift):
    x = [np.full(5, float(i)) for i in range(p)]
    cluster = Cluster(p)
    out = cluster.ring_pass(x, shift=shift)
    for j, o in enumerate(out):
        np.testing.assert_array_equal(o, x[(j - shift) % p])
    moved = p if (shift % p) else 0
    assert cluster.sent.sum() == moved * x[0].nbytes
    assert cluster.messages == moved


def test_a_received_array_is_a_copy_not_the_senders_buffer():
    cluster = Cluster(2)
    x = [np.zeros(3), np.ones(3)]
    out = cluster.ring_pass(x)
    out[0][:] = 7.0
    np.testing.assert_array_equal(x[1], np.ones(3))


@given(p=devices, rows=st.integers(1, 9), cols=st.integers(1, 9),
       dtype=st.sampled_from([np.float16, np.float32, np.float64]))
def test_placeholders_count_the_bytes_real_arrays_count(p, rows, cols, dtype):
    rng = np.random.default_rng(0)
    real, fake = Cluster(p), Cluster(p)
    x = arrays(rng, p, (rows, cols * p), dtype)
    m = [meta((rows, cols * p), dtype)] * p
    outs = []
    for c, data in ((real, x), (fake, m)):
        outs.append([c.all_reduce(data), c.reduce_scatter(data, axis=1),
                     c.all_gather(data, axis=0), c.all_to_all(data, split_axis=1, concat_axis=0),
                     c.ring_pass(data)])
    assert real.sent.tolist() == fake.sent.tolist()
    assert real.received.tolist() == fake.received.tolist()
    assert [(n, b.tolist()) for n, b in real.log] == [(n, b.tolist()) for n, b in fake.log]
    for got_real, got_fake in zip(outs[0], outs[1], strict=True):
        assert [a.shape for a in got_real] == [a.shape for a in got_fake]
        assert all(isinstance(a, Meta) for a in got_fake)


def test_a_placeholder_of_a_128k_token_activation_allocates_nothing():
    cluster = Cluster(8)
    out = cluster.all_reduce([meta((131072, 8192), np.float16)] * 8)
    assert out[0].nbytes == 2 * 2**30
    assert cluster.sent.tolist() == [expected_bytes("all_reduce", 2 * 2**30, 8)] * 8 == \
        [2 * 7 * (2 * 2**30) // 8] * 8


def test_one_device_sends_nothing():
    cluster = Cluster(1)
    x = [np.arange(4.0)]
    assert cluster.all_reduce(x)[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert cluster.all_gather(x)[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert cluster.sent.tolist() == [0] and expected_bytes("all_reduce", 32, 1) == 0


def test_shard_and_unshard_are_inverse_and_count_nothing():
    x = np.arange(10.0).reshape(5, 2)
    pieces = shard(x, 3, axis=0)
    assert [p.shape for p in pieces] == [(2, 2), (2, 2), (1, 2)]
    np.testing.assert_array_equal(unshard(pieces, axis=0), x)


def test_expected_bytes_formulas():
    n = 2**20
    assert expected_bytes("ring_pass", n, 8) == n
    assert expected_bytes("all_gather", n, 8) == 7 * n
    assert expected_bytes("reduce_scatter", n, 8) == 7 * n // 8
    assert expected_bytes("all_to_all", n, 8) == 7 * n // 8
    assert expected_bytes("all_reduce", n, 8) == 2 * 7 * n // 8


def test_bad_input_is_refused_by_name():
    cluster = Cluster(3)
    with pytest.raises(ValueError, match=r"Cluster.all_reduce: got 2 arrays; expected one per "
                                         r"device, p=3"):
        cluster.all_reduce([np.zeros(2)] * 2)
    with pytest.raises(ValueError, match=r"Cluster.all_reduce: device 1 holds shape \(3,\); "
                                         r"expected \(2,\) like device 0"):
        cluster.all_reduce([np.zeros(2), np.zeros(3), np.zeros(2)])
    with pytest.raises(ValueError, match=r"Cluster: p=0 must be an integer >= 1"):
        Cluster(0)
    with pytest.raises(ValueError, match=r"expected_bytes: collective='broadcast'"):
        expected_bytes("broadcast", 8, 2)
    with pytest.raises(ValueError, match=r"Cluster.send: devices 0 -> 3; expected 0..2"):
        cluster.send(0, 3, np.zeros(1))
