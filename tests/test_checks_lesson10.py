"""The checks of lesson 10's exercises name each classic mistake.

The generic contract (a right answer passes with one stable line, the stub's
``NotImplementedError`` passes through as "not attempted", ``None`` and an unexpected
exception fail) is bound to lesson 10's right answers, :data:`CORRECT_10`, by
:class:`TestContract` here (``tests/check_contract.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from check_contract import CheckContract

from mha_course import checks
from mha_course.checks import CheckFailed, lesson10
from mha_course.serving.roofline import decode_step_cost

# ------------------------------------------------------------------ correct implementations


def _bytes(config, batch, context, bytes_per_value=2, embedding=False, h_for_g=False,
           batch_weights=False):
    L, d, h = (config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
    g = h if h_for_g else config["num_key_value_heads"]
    d_head = config.get("head_dim", d // h)
    d_ff, V = config["intermediate_size"], config["vocab_size"]
    per_layer = 2 * d * h * d_head + 2 * d * config["num_key_value_heads"] * d_head
    per_layer += 3 * d * d_ff + 2 * d
    head = V * d + (V * d if embedding and not config.get("tie_word_embeddings") else 0)
    weights = (L * per_layer + d + head) * bytes_per_value * (batch if batch_weights else 1)
    return weights, 2 * L * g * d_head * context * batch * bytes_per_value


def _critical(config, context, gpu, cache=True, rounding=math.ceil):
    one = decode_step_cost(config, 1, context)
    F, W, C = one["flops"], one["weight_bytes"], one["cache_bytes"] if cache else 0
    beta = gpu["flops_per_s"] / gpu["bytes_per_s"]
    if F <= beta * C:
        return None
    b = max(1, rounding(beta * W / (F - beta * C)))
    if rounding is math.ceil:
        while b > 1 and (b - 1) * F >= beta * (W + (b - 1) * C):
            b -= 1
        while b * F < beta * (W + b * C):
            b += 1
    return b


def _best(alpha, c, k_max=16, free=False, off_by_one=False):
    def speed(k):
        e = k + (0 if off_by_one else 1)
        tokens = e if alpha == 1 else (1 - alpha ** e) / (1 - alpha)
        return tokens / (1 if free else k * c + 1)

    k = max(range(1, k_max + 1), key=speed)
    return k, speed(k)


def _tree(parents, n_cached, causal=False, index_positions=False, one_too_far=False):
    N = len(parents)
    tree, depth = np.eye(N, dtype=bool), np.zeros(N, dtype=int)
    for j, p in enumerate(parents):
        tree[j] |= tree[p] if p >= 0 else False
        depth[j] = depth[p] + 1 if p >= 0 else 1
    if causal:
        tree = np.tril(np.ones((N, N), bool))
    pos = n_cached + np.arange(N) if index_positions else n_cached - 1 + depth + one_too_far
    return np.concatenate([np.ones((N, n_cached), bool), tree], axis=1), pos


def _crossover(config, gpu, link, bytes_per_value=2, pairs="causal", kv_factor=1.0,
               all_heads=False, last_recompute=False):
    from mha_course.serving.roofline import model_sizes

    L, h = config["num_hidden_layers"], config["num_attention_heads"]
    g = h if all_heads else config.get("num_key_value_heads", h)
    d_head = config.get("head_dim", config["hidden_size"] // h)
    M = model_sizes(config)["matmul"]
    kv = 2 * L * g * d_head * bytes_per_value * kv_factor
    count = {"causal": lambda T: T * (T + 1) // 2, "square": lambda T: T * T,
             "none": lambda T: 0}[pairs]

    def wins(T):
        return kv * T / link < (2 * M * T + 4 * L * h * d_head * count(T)) / gpu["flops_per_s"]

    T = 1
    if not wins(1 << 40):
        return None
    step = 1 << 40  # the first T that wins, by galloping down
    while step:
        if T + step <= 1 << 40 and not wins(T + step - 1):
            T += step
        step //= 2
    return T - 1 if last_recompute and T > 1 else T


def _radix(prompts, trie=False, previous_only=False, after_insert=False, split_on_end=True):
    root, n_nodes, reused, last = {}, 0, [], ()
    for prompt in prompts:
        tokens, children, n = tuple(prompt), root, 0
        while n < len(tokens) and tokens[n] in children:
            edge, below = children[tokens[n]]
            k = 0
            while k < len(edge) and n + k < len(tokens) and edge[k] == tokens[n + k]:
                k += 1
            if k < len(edge) and (split_on_end or n + k < len(tokens)):
                below = {edge[k]: [edge[k:], below]}
                children[tokens[n]] = [edge[:k], below]
                n_nodes += 1
            elif k < len(edge):
                n += k
                break  # ends inside the edge: left unsplit
            n, children = n + k, below
        found = n
        if previous_only:
            pairs = zip(tokens, last, strict=False)
            found = next((i for i, (a, b) in enumerate(pairs) if a != b),
                         min(len(tokens), len(last)))
        reused.append(len(tokens) if after_insert else found)
        if n < len(tokens):
            children[tokens[n]] = [tokens[n:], {}]
            n_nodes += 1
        last = tokens
    if trie:
        n_nodes = len({tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)})
    return reused, n_nodes


CORRECT_10 = {
    "10.1": ("check_decode_step_bytes", _bytes),
    "10.2": ("check_critical_batch", _critical),
    "10.3": ("check_best_draft_length", _best),
    "10.4": ("check_tree_verification", _tree),
    "10.5": ("check_reload_crossover", _crossover),
    "10.6": ("check_radix_tree", _radix),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson10, CORRECT_10

# ----------------------------------------------------------------------- named mistakes
MISTAKES = [
    ("10.1", lambda c, b, n, bytes_per_value=2: _bytes(c, b, n, bytes_per_value, embedding=True),
     "counted the embedding table"),
    ("10.1", lambda c, b, n, bytes_per_value=2: _bytes(c, b, n, bytes_per_value, h_for_g=True),
     "you used num_attention_heads"),
    ("10.1", lambda c, b, n, bytes_per_value=2: _bytes(c, b, n, bytes_per_value,
                                                       batch_weights=True),
     "read once for the whole batch"),
    ("10.2", lambda c, n, g: _critical(c, n, g, cache=False), "you left out the cache"),
    ("10.2", lambda c, n, g: _critical(c, n, g, rounding=lambda x: int(math.floor(x))),
     "round up"),
    ("10.3", lambda a, c, k_max=16: _best(a, c, k_max, free=True), "left out the draft's cost"),
    ("10.3", lambda a, c, k_max=16: _best(a, c, k_max, off_by_one=True),
     "the accepted drafts AND the target's own token"),
    ("10.4", lambda p, n: _tree(p, n, causal=True), "lets a node see its siblings"),
    ("10.4", lambda p, n: _tree(p, n, index_positions=True), "its depth after the cache"),
    ("10.4", lambda p, n: _tree(p, n, one_too_far=True), "n_cached - 1 + depth"),
    ("10.5", lambda c, g, b, bytes_per_value=2: _crossover(c, g, b, bytes_per_value, pairs="none"),
     "always a crossover"),
    ("10.5", lambda c, g, b, bytes_per_value=2: _crossover(c, g, b, bytes_per_value,
                                                           pairs="square"),
     "T(T+1)/2 query-key pairs, not T²"),
    ("10.5", lambda c, g, b, bytes_per_value=2: _crossover(c, g, b, bytes_per_value,
                                                           kv_factor=0.5),
     "a key AND a value"),
    ("10.5", lambda c, g, b, bytes_per_value=2: _crossover(c, g, b, bytes_per_value,
                                                           all_heads=True),
     "num_key_value_heads heads (GQA)"),
    ("10.5", lambda c, g, b, bytes_per_value=2: _crossover(c, g, b, bytes_per_value,
                                                           last_recompute=True),
     "not the last at which recomputing is"),
    ("10.5", lambda c, g, b, bytes_per_value=2: _crossover(c, g, b),
     "you returned T ="),  # a cache in bf16 whatever bytes_per_value says: fails, unnamed
    ("10.6", lambda p: _radix(p, trie=True), "edges carry RUNS of tokens"),
    ("10.6", lambda p: _radix(p, previous_only=True), "ANY of them"),
    ("10.6", lambda p: _radix(p, after_insert=True), "match BEFORE you insert"),
    ("10.6", lambda p: _radix(p, split_on_end=False), "or ends inside it, splits that edge"),
]


@pytest.mark.parametrize("ex, wrong, named", MISTAKES,
                         ids=[f"{ex}-{named[:24]}" for ex, _, named in MISTAKES])
def test_each_classic_mistake_is_named(ex, wrong, named, capsys):
    with pytest.raises(CheckFailed) as info:
        getattr(checks, CORRECT_10[ex][0])(wrong)
    message = str(info.value)
    assert message.startswith(f"Exercise {ex}: ") and named in message, message
    assert capsys.readouterr().out == ""


def test_forbidden_helpers_are_refused():
    from mha_course.serving.roofline import critical_batch

    with pytest.raises(CheckFailed, match=r"Exercise 10.2 asks you to solve for the batch"):
        checks.check_critical_batch(lambda c, n, g: critical_batch(c, n, g))


def test_reload_crossover_refuses_the_package_prefill_cost():
    from mha_course.cost import cache_bytes
    from mha_course.serving.roofline import prefill_cost

    def uses_prefill_cost(config, gpu, link, bytes_per_value=2):
        return next(T for T in range(1, 1 << 20) if cache_bytes(config, T, 1, bytes_per_value)
                    / link < prefill_cost(config, T)["flops"] / gpu["flops_per_s"])

    with pytest.raises(CheckFailed, match=r"Exercise 10.5 asks you to count the prefill's FLOPs"):
        checks.check_reload_crossover(uses_prefill_cost)


def test_radix_tree_refuses_the_package_radix_cache():
    from mha_course.serving.radix_cache import RadixCache

    def uses_the_package(prompts):
        cache = RadixCache()
        return [cache.insert(p) for p in prompts], cache.n_nodes

    with pytest.raises(CheckFailed, match=r"Exercise 10.6 asks you to build the radix tree"):
        checks.check_radix_tree(uses_the_package)
