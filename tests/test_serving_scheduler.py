"""The scheduler: every policy gives each request exactly the tokens it gets alone, on random
workloads; static batches admit nobody mid-batch, chunked passes keep their budget, the pool is
empty at the end, and the cost model is fitted by least squares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course.serving.decoder import Decoder, generate_alone
from mha_course.serving.paged import PagedStore
from mha_course.serving.scheduler import (
    CostModel,
    Request,
    fit_cost_model,
    make_workload,
    pairs_of,
    serve,
)

DEC = Decoder.random(vocab=13, d_model=16, n_layers=2, h=4, n_kv_heads=2, rng=5)
COST = CostModel(fixed=1e-3, per_sequence=1e-4, per_token=1e-5, per_pair=1e-8)

workloads = st.lists(st.tuples(st.integers(1, 14), st.integers(1, 6), st.floats(0, 0.01),
                               st.sampled_from([0.0, 0.8])), min_size=1, max_size=6)


@settings(max_examples=12, deadline=None)
@given(workloads, st.sampled_from(["static", "continuous", "chunked"]), st.integers(1, 4),
       st.integers(4, 9), st.integers(1, 5), st.integers(0, 10_000))
def test_every_policy_gives_each_request_its_tokens_alone(shapes, policy, max_batch, budget,
                                                          block, seed):
    rng = np.random.default_rng(seed)
    requests = [Request(i, rng.integers(0, DEC.vocab, n), m, t, temp, seed=seed + i)
                for i, (n, m, t, temp) in enumerate(shapes)]
    result = serve(DEC, requests, policy, cost=COST, max_batch=max_batch,
                   token_budget=max(budget, max_batch), n_blocks=64, block_size=block)
    for r in requests:
        alone = generate_alone(DEC, r.prompt, r.max_new_tokens, temperature=r.temperature,
                               seed=r.seed)
        assert result.requests[r.rid].tokens == alone
        times = result.requests[r.rid].token_times
        assert times[0] >= r.arrival and times == sorted(times)
    if policy == "chunked":
        assert max(p["tokens"] for p in result.passes) <= max(budget, max_batch)


def test_static_batches_wait_for_their_longest_request_and_continuous_ones_do_not():
    requests = [Request(0, np.arange(4), 20), Request(1, np.arange(4), 2),
                Request(2, np.arange(4), 2, arrival=1e-4)]
    static = serve(DEC, requests, "static", cost=COST, max_batch=2)
    continuous = serve(DEC, requests, "continuous", cost=COST, max_batch=2)
    # request 2 waits for request 0's 20 tokens under static batching, not under continuous
    assert static.requests[2].token_times[0] > static.requests[0].token_times[-1]
    assert continuous.requests[2].token_times[0] < continuous.requests[0].token_times[-1]
    assert continuous.summary()["throughput"] > static.summary()["throughput"]


def test_chunked_prefill_bounds_the_stall_a_long_prompt_causes():
    long = Request(1, np.arange(60) % 13, 2, arrival=0.0031)
    requests = [Request(0, np.arange(3), 30), long]
    cost = CostModel(1e-3, 0.0, 1e-4, 0.0)
    gaps = {p: serve(DEC, requests, p, cost=cost, max_batch=2, token_budget=8).requests[0].gaps
            for p in ("continuous", "chunked")}
    assert gaps["continuous"].max() == pytest.approx(1e-3 + 1e-4 * 61)  # one pass with 60 + 1
    assert gaps["chunked"].max() == pytest.approx(1e-3 + 1e-4 * 8)


def test_the_pool_is_empty_afterwards_and_a_request_too_big_is_refused():
    requests = make_workload(5, np.arange(200) % 13, rng=0, rate=1000.0, short=(2, 6),
                             long=(10, 12), new_tokens=(2, 4))
    store = PagedStore(DEC, 32, 4)
    from mha_course.serving.prefix_cache import PrefixCache
    serve(DEC, requests, "continuous", cost=COST, prefix_cache=PrefixCache(store))
    cache_held = {store.ref_count(b) for b in range(store.n_blocks)} - {0}
    assert cache_held <= {1}  # only the prefix cache's own holds remain
    with pytest.raises(ValueError, match="serve: request 0 needs 100 positions"):
        serve(DEC, [Request(0, np.arange(90) % 13, 10)], cost=COST, n_blocks=4, block_size=8)
    with pytest.raises(ValueError, match="serve: token_budget=2 must be at least max_batch=4"):
        serve(DEC, requests, "chunked", cost=COST, max_batch=4, token_budget=2)


def test_pairs_and_the_cost_fit():
    assert pairs_of(0, 3) == 6 and pairs_of(10, 1) == 11
    truth = CostModel(2e-3, 5e-4, 3e-5, 4e-9)
    samples = [(b, n, p, truth.pass_time(b, n, p)) for b, n, p in (
        (1, 1, 5), (9, 9, 700), (2, 40, 30000), (3, 3, 90000), (1, 64, 2000))]
    fit = fit_cost_model(samples)
    assert fit.fixed == pytest.approx(2e-3) and fit.per_pair == pytest.approx(4e-9)
