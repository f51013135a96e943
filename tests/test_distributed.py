"""The appendix's runs on real processes: tensor-parallel and ring attention with
``torch.distributed`` (gloo, 127.0.0.1) equal the single-device layer and the NumPy simulation,
the bytes counted around each rank's sends equal the simulated cluster's counters, and a failing
rank leaves no process behind. Skipped without PyTorch unless ``MHA_COURSE_REQUIRE_TORCH=1``.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from mha_course import causal_mask, scaled_dot_product_attention
from mha_course.parallel import torch_dist
from mha_course.parallel.collectives import Cluster
from mha_course.parallel.ring import ring_attention, sequence_layout
from mha_course.parallel.tensor import TensorParallelAttention

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("p", [2, 4])
def test_real_processes_equal_the_layer_and_the_simulation(torch, p):
    got = torch_dist.run(p, seed=3, timeout=120)
    layer, x, (q, k, v) = torch_dist.problem(3, p)
    mask = causal_mask(len(x))
    want = layer(x, mask=mask)[0]
    sim = Cluster(p)
    simulated = TensorParallelAttention(layer, p).forward(sim, x, mask=mask)
    for rank in range(p):
        np.testing.assert_allclose(got["tp_gloo"][rank], want, atol=1e-12)
        np.testing.assert_allclose(got["tp_ring"][rank], simulated[rank], atol=1e-12)
    assert got["tp_bytes"] == sim.sent.tolist()

    pos = sequence_layout(q.shape[-2], p)
    ring = Cluster(p)
    out, lse, _ = ring_attention(ring, *([a[:, i] for i in pos] for a in (q, k, v)), pos,
                                 causal=True)
    full, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(q.shape[-2]))
    for rank, idx in enumerate(pos):
        np.testing.assert_allclose(got["ring_out"][rank], full[:, idx], atol=1e-12)
        np.testing.assert_allclose(got["ring_lse"][rank], lse[rank], atol=1e-12)
    assert got["ring_bytes"] == ring.sent.tolist()
    assert not multiprocessing.active_children()


def test_a_failing_rank_stops_every_process(torch):
    with pytest.raises(RuntimeError, match="rank 1 fails on purpose"):
        torch_dist.run(2, fail_rank=1, timeout=60)
    assert not multiprocessing.active_children()
