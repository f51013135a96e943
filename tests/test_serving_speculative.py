"""Speculative decoding: greedy output identical to the target's greedy output for random draft
lengths; the rejection rule keeps the target's distribution exactly (computed), and a mutated
rule is caught both by the exact computation and by sampling speculative_generate itself."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course.serving.decoder import ContiguousCache, Decoder, generate_alone
from mha_course.serving.sampling import probabilities
from mha_course.serving.speculative import (
    acceptance_probability,
    acceptance_rate,
    expected_tokens_per_round,
    output_distribution,
    residual_distribution,
    speculative_generate,
    tree_mask,
    verify,
    verify_tree,
)

TARGET = Decoder.random(vocab=9, d_model=16, n_layers=2, h=4, n_kv_heads=2, rng=11)
DRAFT = Decoder.random(vocab=9, d_model=8, n_layers=1, h=2, rng=12)

#: Wrong rules, each a real mistake: the ratio upside down, the residual replaced by p (the
#: replacement drawn from the target, not from what it adds over the draft), the residual
#: left unnormalised-then-renormalised over the rejected token only.
MUTANTS = {
    "q/p instead of p/q": (lambda p, q: np.minimum(1.0, q / p), residual_distribution),
    "resample from p": (acceptance_probability, lambda p, q: p),
    "always accept": (lambda p, q: np.ones_like(p), residual_distribution),
}

distributions = st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n),
    st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n)))


@settings(max_examples=60, deadline=None)
@given(distributions)
def test_the_rejection_rule_keeps_the_target_distribution_exactly(pq):
    p, q = (np.array(x) / np.sum(x) for x in pq)
    np.testing.assert_allclose(output_distribution(p, q), p, rtol=0, atol=1e-12)
    assert acceptance_rate(p, q) == pytest.approx(np.minimum(p, q).sum())


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_mutated_rule_changes_the_distribution(name):
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.3, 0.5])
    wrong = output_distribution(p, q, *MUTANTS[name])
    assert np.abs(wrong - p).max() > 0.05, f"the mutant {name!r} went unnoticed"


def _first_token_frequencies(rule=None, n=4000):
    """Rounds of verify() with one draft from the draft model's real distribution: how often
    each token is emitted first."""
    p_rows = TARGET.forward(np.array([1, 2, 5]))[1:]  # after [1, 2], after [1, 2, 5]
    q = probabilities(DRAFT.forward(np.array([1, 2]))[-1])
    rng, counts = np.random.default_rng(0), np.zeros(TARGET.vocab)
    for _ in range(n):
        d = int(np.searchsorted(np.cumsum(q), rng.random() * q.sum(), side="right"))
        rows = p_rows.copy()
        counts[verify(rows, [min(d, len(q) - 1)], [q], 1.0, rng, rule)[0]] += 1
    return counts / n


def test_speculative_sampling_itself_draws_from_the_target_and_a_mutant_does_not():
    p = probabilities(TARGET.forward(np.array([1, 2]))[-1])
    tol = 4 * np.sqrt(p * (1 - p) / 4000) + 1e-3  # four standard errors (the mutants: > 0.08)
    assert np.all(np.abs(_first_token_frequencies() - p) <= tol)
    for name in ("resample from p", "q/p instead of p/q"):
        wrong = _first_token_frequencies(MUTANTS[name])
        assert np.any(np.abs(wrong - p) > tol), f"sampling did not see the mutant {name!r}"


def test_sampled_speculative_generation_is_seeded_and_its_stats_add_up():
    out, stats = speculative_generate(TARGET, DRAFT, [1, 2], 20, 3, temperature=0.8, seed=1)
    assert out == speculative_generate(TARGET, DRAFT, [1, 2], 20, 3, temperature=0.8,
                                       seed=1)[0]
    assert sum(stats["emitted"]) >= 20 and stats["accepted"] <= stats["drafted"]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=6), st.integers(1, 6),
       st.integers(1, 12), st.booleans())
def test_greedy_speculative_output_equals_the_targets_greedy_output(prompt, k, n_new, same):
    draft = TARGET if same else DRAFT
    out, stats = speculative_generate(TARGET, draft, prompt, n_new, k)
    assert out == generate_alone(TARGET, prompt, n_new)
    assert all(1 <= e <= k + 1 for e in stats["emitted"])
    if same:  # a perfect draft: every token accepted
        assert stats["alpha"] == 1.0


def test_expected_tokens_formula():
    assert expected_tokens_per_round(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    np.testing.assert_allclose(expected_tokens_per_round(np.array([0.0, 1.0]), 2), [1.0, 3.0])


def test_tree_verification_equals_verifying_each_branch_alone():
    prompt = [3, 1, 4]
    cache = ContiguousCache(TARGET)
    TARGET.step(np.array(prompt), cache)
    tokens, parents = [5, 6, 7, 8, 2, 0], [-1, -1, 0, 0, 1, 2]
    rows = verify_tree(TARGET, cache, tokens, parents)
    assert cache.length == 3  # the tree wrote nothing
    for j in range(len(tokens)):
        path, i = [], j
        while i >= 0:
            path.insert(0, tokens[i])
            i = parents[i]
        np.testing.assert_allclose(rows[j], TARGET.forward(np.array(prompt + path))[-1],
                                   rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match=r"tree_mask: parents\[1\]=1"):
        tree_mask([-1, 1])
