"""The checks of lesson 06's exercises name each classic mistake.

The generic contract (a right answer passes with one stable line, the stub's
``NotImplementedError`` passes through as "not attempted", ``None`` and an unexpected
exception fail) is bound to lesson 06's right answers, :data:`CORRECT_06`, by
:class:`TestContract` here (``tests/check_contract.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from check_contract import CheckContract

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, lesson06

# ------------------------------------------------------------------ correct implementations


def _cache_bytes_of(config, seq_len, batch=1, bytes_per_value=2):
    d = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    return (2 * config["num_hidden_layers"] * config["num_key_value_heads"] * d * seq_len * batch
            * bytes_per_value)


def _decode(layer, x, step=None):
    """Token by token with a cache of every key and value so far (06.2's forbid: no layer
    passes). ``step`` swaps in a wrong attention for the mistakes below."""
    h = layer.h
    keys, values, outs = [], [], []
    for t in range(x.shape[-2]):
        x_t = x[..., t : t + 1, :]
        q = mha_course.split_heads(x_t @ layer.W_q, h)  # (B, h, 1, d_k)
        keys.append(mha_course.split_heads(x_t @ layer.W_k, h))
        values.append(mha_course.split_heads(x_t @ layer.W_v, h))
        k, v = np.concatenate(keys, -2), np.concatenate(values, -2)  # (B, h, t+1, d)
        heads, _ = (step or mha_course.scaled_dot_product_attention)(q, k, v)
        outs.append(mha_course.merge_heads(heads) @ layer.W_o)
    return np.concatenate(outs, -2)


def _streaming_step(q_t, keys, values, n_sink, window, *, positions="cache", sinks=True,
                    extra=0, duplicate=False, query_at="last", layout="half"):
    """06.4's step; the keywords make the wrong ones."""
    n = keys.shape[-2]
    first = list(range(min(n_sink, n))) if sinks else []
    last = list(range(max(0, n - window - extra), n))
    kept = first + last if duplicate else sorted(set(first) | set(last))
    pos = np.arange(len(kept)) if positions == "cache" else np.array(kept)
    k = mha_course.apply_rope(keys[..., kept, :], pos, layout=layout)
    q_pos = {"last": pos[-1], "past": len(kept), "zero": 0}[query_at]
    q = mha_course.apply_rope(q_t, np.array([q_pos]), layout=layout)
    return mha_course.scaled_dot_product_attention(q, k, values[..., kept, :])


def _absorbed_head(q_nope, q_rope, c, k_rope, W_uk, W_uv, scale=None, rope=True,
                   mask="bottom-right"):
    d = q_nope.shape[-1] + q_rope.shape[-1]
    T, S = q_nope.shape[-2], c.shape[-2]
    scores = (q_nope @ W_uk.T) @ c.T + (q_rope @ k_rope.T if rope else 0)
    keep = {"bottom-right": mha_course.causal_mask(T, S), "none": None,
            "top-left": np.tril(np.ones((T, S), dtype=bool))}[mask]
    weights = mha_course.softmax(scores / (scale or np.sqrt(d)), mask=keep)
    return (weights @ c) @ W_uv, weights


def _chunk_attention(q, k, v, mask=None):
    T, S = q.shape[-2], k.shape[-2]
    mask = mha_course.causal_mask(T, S) if mask is None else mask(T, S)
    return mha_course.scaled_dot_product_attention(q, k, v, mask=mask)


CORRECT_06 = {
    "06.1": ("check_cache_bytes", _cache_bytes_of),
    "06.2": ("check_decode_with_cache", _decode),
    "06.3": ("check_repeat_kv", lambda k, n_rep: np.repeat(k, n_rep, axis=1)),
    "06.4": ("check_streaming_step", _streaming_step),
    "06.5": ("check_absorbed_head", _absorbed_head),
    "06.6": ("check_chunk_attention", _chunk_attention),
    "06.7": ("check_chunked_mask", lesson06.reference_chunked_mask),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson06, CORRECT_06


# --------------------------------------------------------------------- the targeted mistakes


def _with_config(**changes):
    def wrong(config, seq_len, batch=1, bytes_per_value=2):
        return _cache_bytes_of({**config, **changes(config)} if callable(changes) else config,
                               seq_len, batch, bytes_per_value)
    return wrong


def _cache_bytes_all_heads(config, seq_len, batch=1, bytes_per_value=2):
    return _cache_bytes_of({**config, "num_key_value_heads": config["num_attention_heads"]},
                           seq_len, batch, bytes_per_value)


def _cache_bytes_no_head_dim(config, seq_len, batch=1, bytes_per_value=2):
    return _cache_bytes_of({k: v for k, v in config.items() if k != "head_dim"}, seq_len, batch,
                           bytes_per_value)


def _decode_all_tokens(layer, x):
    h = layer.h
    k = mha_course.split_heads(x @ layer.W_k, h)
    v = mha_course.split_heads(x @ layer.W_v, h)
    outs = []
    for t in range(x.shape[-2]):
        q = mha_course.split_heads(x[..., t : t + 1, :] @ layer.W_q, h)
        heads, _ = mha_course.scaled_dot_product_attention(q, k, v)  # the future too
        outs.append(mha_course.merge_heads(heads) @ layer.W_o)
    return np.concatenate(outs, -2)


def _chunk_top_left(q, k, v):
    return _chunk_attention(q, k, v, mask=lambda T, S: np.tril(np.ones((T, S), dtype=bool)))


MISTAKES = [
    ("cache-bytes-all-heads", "check_cache_bytes", _cache_bytes_all_heads,
     r"you used num_attention_heads; the cache holds one key and one value per K/V head"),
    ("cache-bytes-keys-only", "check_cache_bytes",
     lambda config, seq_len, batch=1, bytes_per_value=2:
         _cache_bytes_of(config, seq_len, batch, bytes_per_value) // 2,
     r"you counted only the keys"),
    ("cache-bytes-no-dtype", "check_cache_bytes",
     lambda config, seq_len, batch=1, bytes_per_value=2:
         _cache_bytes_of(config, seq_len, batch, 1),
     r"you left out bytes_per_value"),
    ("cache-bytes-hidden-over-heads", "check_cache_bytes", _cache_bytes_no_head_dim,
     r"gpt-oss-120b without its windows .* the head width is config\['head_dim'\]"),
    ("cache-bytes-float", "check_cache_bytes",
     lambda config, seq_len, batch=1, bytes_per_value=2:
         float(_cache_bytes_of(config, seq_len, batch, bytes_per_value)),
     r"a float; return an int"),
    ("cache-bytes-model-configs", "check_cache_bytes",
     lambda config, seq_len, batch=1, bytes_per_value=2:
         mha_course.cost.cache_bytes(config, seq_len, batch, bytes_per_value),
     r"asks you to read the config's fields yourself; your answer calls "
     r"mha_course.cost.cache_bytes"),
    ("decode-sees-the-future", "check_decode_with_cache", _decode_all_tokens,
     r"every step attended to all T tokens, the future too"),
    ("decode-only-itself", "check_decode_with_cache",
     lambda layer, x: _decode(layer, x, step=lambda q, k, v: (v[..., -1:, :], None)),
     r"each step attended only to its own token"),
    ("decode-no-w-o", "check_decode_with_cache",
     lambda layer, x: mha_course.merge_heads(mha_course.split_heads(x @ layer.W_v, layer.h)),
     r"you returned the merged heads: multiply by layer.W_o"),
    ("decode-calls-the-layer", "check_decode_with_cache",
     lambda layer, x: layer(x, mask=mha_course.causal_mask(x.shape[-2]))[0],
     r"asks you to write the decoding loop and its cache yourself"),
    ("decode-uses-decode-step", "check_decode_with_cache",
     lambda layer, x: np.concatenate(
         [layer.decode_step(x[..., t : t + 1, :], cache)[0]
          for cache in [layer.init_cache(x.shape[:-2])] for t in range(x.shape[-2])], -2),
     r"your answer calls mha_course.MultiHeadAttention.init_cache"),
    ("repeat-kv-tile", "check_repeat_kv", lambda k, n_rep: np.tile(k, (1, n_rep, 1, 1)),
     r"np.tile interleaves the K/V heads .* np.repeat\(k, n_rep, axis=1\)"),
    ("repeat-kv-wrong-axis", "check_repeat_kv", lambda k, n_rep: np.repeat(k, n_rep, axis=2),
     r"you repeated along the positions \(axis 2\)"),
    ("streaming-text-positions", "check_streaming_step",
     lambda *a: _streaming_step(*a, positions="text"),
     r"rotated the kept keys at their positions in the TEXT"),
    ("streaming-window-only", "check_streaming_step", lambda *a: _streaming_step(*a, sinks=False),
     r"you kept only the window: StreamingLLM also keeps the first n_sink tokens"),
    ("streaming-window-plus-one", "check_streaming_step", lambda *a: _streaming_step(*a, extra=1),
     r"you kept window \+ 1 tokens at the end"),
    ("streaming-query-past", "check_streaming_step",
     lambda *a: _streaming_step(*a, query_at="past"), r"the query is rotated one position too far"),
    ("streaming-query-zero", "check_streaming_step",
     lambda *a: _streaming_step(*a, query_at="zero"), r"the query was rotated at position 0"),
    ("streaming-interleaved", "check_streaming_step",
     lambda *a: _streaming_step(*a, layout="interleaved"), r"you used the interleaved layout"),
    ("absorb-scale-d-c", "check_absorbed_head",
     lambda q_nope, q_rope, c, k_rope, W_uk, W_uv: _absorbed_head(
         q_nope, q_rope, c, k_rope, W_uk, W_uv, scale=np.sqrt(c.shape[-1] + q_rope.shape[-1])),
     r"you scaled by √\(d_c \+ d_rope\)"),
    ("absorb-no-rope", "check_absorbed_head",
     lambda q_nope, q_rope, c, k_rope, W_uk, W_uv: _absorbed_head(
         q_nope, q_rope, c, k_rope, W_uk, W_uv, rope=False),
     r"the RoPE part is missing"),
    ("absorb-no-mask", "check_absorbed_head",
     lambda *a: _absorbed_head(*a, mask="none"), r"no causal mask: a query of the chunk sees"),
    ("absorb-top-left", "check_absorbed_head",
     lambda *a: _absorbed_head(*a, mask="top-left"), r"the causal mask is aligned top-left"),
    ("absorb-untransposed", "check_absorbed_head",
     lambda q_nope, q_rope, c, k_rope, W_uk, W_uv: (q_nope @ W_uk, None),
     r"(?s)raised ValueError.*Likely mistake: a shape mismatch: W_uk is \(d_c, d_k\)"),
    ("chunk-top-left", "check_chunk_attention", _chunk_top_left,
     r"with ONE new token \(T = 1\) your weights put everything on key 0: the top-left mask"),
    ("chunk-no-mask", "check_chunk_attention", mha_course.scaled_dot_product_attention,
     r"no mask: a query of the chunk sees the chunk's later tokens"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        getattr(checks, check)(wrong)
    assert str(info.value).startswith("Exercise 06.")
    assert capsys.readouterr().out == "", "a failing check prints nothing"


def test_a_fix_that_leaves_one_token_decoding_top_left_fails_at_t_1(capsys):
    """The premise of exercise 06.6: one new token is where the top-left mask is worst."""
    def fixed_for_chunks_only(q, k, v):
        T, S = q.shape[-2], k.shape[-2]
        mask = np.tril(np.ones((T, S), dtype=bool)) if T == 1 else mha_course.causal_mask(T, S)
        return mha_course.scaled_dot_product_attention(q, k, v, mask=mask)

    with pytest.raises(CheckFailed, match=r"for T=1 new queries over S=5 keys.*ONE new token"):
        checks.check_chunk_attention(fixed_for_chunks_only)


def test_the_top_left_mask_with_one_new_token_attends_to_key_0_only():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 6))
    out, w = _chunk_top_left(q, k, v)
    np.testing.assert_array_equal(w, [[1, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_allclose(out, v[:1])


def test_the_streaming_step_rotates_at_cache_positions_not_text_positions():
    rng = np.random.default_rng(1)
    q_t, keys, values = (rng.normal(size=(2, 1, 6)), rng.normal(size=(2, 10, 6)),
                         rng.normal(size=(2, 10, 5)))
    _, w_cache = _streaming_step(q_t, keys, values, 4, 4)
    _, w_text = _streaming_step(q_t, keys, values, 4, 4, positions="text")
    assert w_cache.shape == (2, 1, 8) and not np.allclose(w_cache, w_text)
    # nothing evicted (n <= n_sink + window): cache positions are the text positions
    _, w_all = _streaming_step(q_t, keys[:, :6], values[:, :6], 4, 4)
    _, w_all_text = _streaming_step(q_t, keys[:, :6], values[:, :6], 4, 4, positions="text")
    np.testing.assert_allclose(w_all, w_all_text)


def test_a_streaming_step_that_keeps_a_token_twice_is_told_so():
    with pytest.raises(CheckFailed, match=r"kept once, not twice"):
        checks.check_streaming_step(lambda *a: _streaming_step(*a, duplicate=True))


def test_leaky_chunk_mask_is_reported_as_a_property():
    def leaky(q, k, v):
        T, S = q.shape[-2], k.shape[-2]
        mask = mha_course.causal_mask(T, S)
        mask[..., 0, -1] = True  # the first new query sees the last one
        return mha_course.scaled_dot_product_attention(q, k, v, mask=mask)

    with pytest.raises(CheckFailed, match=r"where the mask is False"):
        checks.check_chunk_attention(leaky)
