"""Checks for lesson 15's spot-the-bug drill: the decoding bugs (15.9 to 15.14).

A KV cache's mask, a cache that outlives its prompt, grouped K/V heads, RoPE, a sliding window
and MLA's cache formula. Like :mod:`mha_course.checks.drill.attention`
(15.1 to 15.8), each check names the first property of :mod:`mha_course.checks.properties` that
the learner's function breaks, with the evidence, and the likely mistake of a known wrong fix.
"""

from __future__ import annotations

import copy
import numbers

import numpy as np

from ... import (
    MultiHeadAttention,
    MultiHeadLatentAttention,
    apply_rope,
    causal_mask,
    merge_heads,
    mla_cache_bytes,
    scaled_dot_product_attention,
    split_heads,
)
from ...cost import MODELS
from .. import properties as P
from ..harness import as_array, call, check_rng, close, compare, fail, fmt_shape, pair, passed
from ..properties import array, require
from ..variants import attention_hint

__all__ = ["check_cache_reset", "check_chunk_mask", "check_gqa_prefill", "check_mla_cache_formula",
           "check_rope_values", "check_window_off_by_one"]

sdpa = scaled_dot_product_attention
LAYER_CALLS = ("forward", "__call__", "step", "decode_step", "init_cache")


def no_layer(task: str) -> dict[str, str]:
    """The ``forbid=`` of an exercise that must not call a layer's own passes."""
    return {f"mha_course.MultiHeadAttention.{m}": task for m in LAYER_CALLS}


# --------------------------------------------------- 15.9 a chunk over a cache: which corner
def check_chunk_mask(fn) -> None:
    """Exercise 15.9: ``attend_chunk(q, k, v, causal_buffer)``: T new queries over S keys.

    First one token at a time (T = 1 over S = 1, 2, ...: decoding), then chunks of several tokens
    over a cache, each time against one causal forward pass without a cache.
    """
    ex, rng = "15.9", check_rng(909)
    buffer = np.tril(np.ones((16, 16), dtype=bool))  # precomputed once, like nanoGPT's `bias`
    for lead, n, d_k, d_v in (((2,), 6, 4, 3), ((), 5, 3, 5)):  # decoding: T = 1, explicitly
        q, k, v = (rng.normal(size=(*lead, n, d)) for d in (d_k, d_k, d_v))
        want_out, want_w = sdpa(q, k, v, mask=causal_mask(n))
        for S in range(1, n + 1):
            label = f"for one new token (T = 1) at position {S - 1} over {S} keys"
            args = (q[..., S - 1 : S, :], k[..., :S, :], v[..., :S, :], buffer)
            got = call(ex, fn, args, ("q", "k", "v", "causal_buffer"), hint=attention_hint)
            out, w = pair(ex, got)
            out = array(ex, out, (*lead, 1, d_v), f"your output {label}", "(..., T, d_v)")
            w = array(ex, w, (*lead, 1, S), f"your weights {label}", "(..., T, S)")
            blind = np.argwhere(w == 0)
            only_first = (", and all of its weight to key 0: single-token decoding attends to "
                          "the first token only") if S > 1 and np.all(w[..., 0] == 1) else ""
            require(ex, P.CACHED, len(blind) and f"{label}: it gives key {blind[0][-1]}, which "
                    f"it may attend to, weight 0{only_first}, so decoding differs from the full "
                    "causal forward")
            compare(ex, out, want_out[..., S - 1 : S, :], f"your output {label}", "(..., T, d_v)")
            compare(ex, w, want_w[..., S - 1 : S, :S], f"your weights {label}", "(..., T, S)")
    for lead, n, chunks, d_k, d_v in (((2,), 8, (3, 1, 4), 4, 3), ((), 7, (2, 5), 3, 5)):
        q, k, v = (rng.normal(size=(*lead, n, d)) for d in (d_k, d_k, d_v))
        want_out, want_w = sdpa(q, k, v, mask=causal_mask(n))  # one causal forward, no cache
        start = 0
        for size in chunks:
            S, T = start + size, size  # keys: everything so far; queries: the chunk
            label = f"for the chunk of tokens {start}..{S - 1} over {S} keys"
            args = (q[..., start:S, :], k[..., :S, :], v[..., :S, :], buffer)
            got = call(ex, fn, args, ("q", "k", "v", "causal_buffer"), hint=attention_hint)
            out, w = pair(ex, got)
            out = array(ex, out, (*lead, T, d_v), f"your output {label}", "(..., T, d_v)")
            w = array(ex, w, (*lead, T, S), f"your weights {label}", "(..., T, S)")
            seen_all = ("every query of the chunk saw the whole chunk, its later tokens too: no "
                        "mask, or a (1, S) row of the buffer, right for one new token only")
            wrong = [(seen_all, lambda a=args: sdpa(*a[:3])[1]),
                     (seen_all, lambda a=args, S=S: sdpa(*a[:3], mask=a[3][S - 1:S, :S])[1])]
            leak = np.argwhere(~causal_mask(T, S) & (w != 0))
            require(ex, P.CAUSAL, len(leak) and f"{label}: the query at position "
                    f"{start + leak[0][-2]} gives the later key {leak[0][-1]} weight "
                    f"{w[tuple(leak[0])]:.4f}", w, wrong)
            blind = np.argwhere(causal_mask(T, S) & (w == 0))
            require(ex, P.CACHED, len(blind) and f"{label}: the query at position "
                    f"{start + blind[0][-2]} gives the earlier key {blind[0][-1]} weight 0, so its "
                    f"output differs from the full causal forward", w, wrong)
            compare(ex, out, want_out[..., start:S, :], f"your output {label}", "(..., T, d_v)")
            compare(ex, w, want_w[..., start:S, :S], f"your weights {label}", "(..., T, S)")
            start = S
    passed(ex, "one token at a time (T = 1) and chunks of 3, 1, 4 and 2, 5 new tokens over a "
               "cache equal one causal forward")


# ------------------------------------------------- 15.10 a cache that outlives its prompt
PROMPTS = "prompts are independent: a prompt's outputs do not depend on the prompts before it"


def check_cache_reset(fn) -> None:
    """Exercise 15.10: ``run_prompts(layer, prompts)`` -> a list of (T_i, d_model) outputs."""
    ex, rng = "15.10", check_rng(910)
    for layer, lengths in ((MultiHeadAttention(12, 3, rope="half", rng=rng), (3, 5, 2)),
                           (MultiHeadAttention(8, 2, 6, 3, rope="interleaved", rng=rng), (4, 4))):
        _prompts(ex, fn, layer, [rng.normal(size=(n, layer.d_model)) for n in lengths])
    passed(ex, "every prompt decoded after others equals its own causal forward (RoPE, 2 layouts)")


def _prompts(ex, fn, layer, prompts):
    def run(ps):
        got = call(ex, fn, (layer, ps), ("layer", "prompts"), hint=attention_hint,
                   forbid={**no_layer("write the decoding loop yourself"),
                           "mha_course.KVCache": "write the cache yourself"})
        if not isinstance(got, (list, tuple)) or len(got) != len(ps):
            raise fail(ex, f"expected a list of {len(ps)} arrays, one per prompt; got "
                           f"{type(got).__name__}")
        return [array(ex, o, x.shape, f"your output for prompt {i}", "(T_i, d_model)")
                for i, (x, o) in enumerate(zip(ps, got, strict=True))]

    together = run(prompts)
    for i, x in enumerate(prompts):
        alone = run([x])[0]
        found = P.moved_text(layer(x, mask=causal_mask(len(x)))[0], alone)
        require(ex, P.CACHED, found and f"prompt {i} ({len(x)} tokens) decoded alone, against "
                f"the layer's causal forward: {found}", alone, [(
                    "every token rotated as if it sat at position 0: RoPE needs the token's "
                    "position, the number of tokens before it in its prompt",
                    lambda x=x: _decode_at_zero(layer, x))])
        found = P.moved_text(alone, together[i])
        require(ex, PROMPTS, found and f"prompt {i} decoded after prompts 0..{i - 1} instead "
                f"of alone: {found}", together[i], [(
                    "rotating by the token's index in its prompt fixes the positions, but the "
                    "cache still holds the earlier prompts' keys: start each prompt with an "
                    "empty cache (reset its pointer)",
                    lambda i=i: _decode_at_zero(layer, prompts[i], after=prompts[:i]))])


def _decode_at_zero(layer, x, after=None):
    """The wrong decodes: RoPE at position 0 (after=None), or at the index in the prompt with
    the keys of the prompts ``after`` still cached."""
    keys, values, h = [], [], layer.h

    def step(x_t, pos):
        q, k, v = (split_heads(x_t @ W, h) for W in (layer.W_q, layer.W_k, layer.W_v))
        q, k = (apply_rope(a, np.array([pos]), layout=layer.rope) for a in (q, k))
        keys.append(k)
        values.append(v)
        heads = sdpa(q, np.concatenate(keys, -2), np.concatenate(values, -2))[0]
        return merge_heads(heads) @ layer.W_o

    for earlier in after or ():
        for t in range(len(earlier)):
            step(earlier[t:t + 1], t)
    return np.concatenate([step(x[t:t + 1], 0 if after is None else t) for t in range(len(x))])


# ------------------------------------------------------- 15.11 GQA: which K/V head, and cached how
GROUPS = "query head i reads K/V head i // (h/g), its group's"
GQA_CACHE = "a GQA cache holds the g K/V heads, not h copies"


def check_gqa_prefill(fn) -> None:
    """Exercise 15.11: ``gqa_prefill(layer, x)`` -> (out, (k_cache, v_cache))."""
    ex, rng = "15.11", check_rng(911)
    for lead, T, d_model, h, d_k, d_v, g in (((2,), 5, 16, 4, 4, 4, 2), ((), 4, 12, 6, 2, 3, 3),
                                             ((), 3, 8, 4, 2, 2, 1)):
        layer = MultiHeadAttention(d_model, h, d_k, d_v, n_kv_heads=g, rng=rng)
        _gqa(ex, fn, layer, rng.normal(size=(*lead, T, d_model)))
    passed(ex, "query head i reads K/V head i // (h/g) and the cache keeps g heads (g = 2, 3, 1)")


def _gqa(ex, fn, layer, x):
    h, g, d_v, T = layer.h, layer.n_kv_heads, layer.d_v, x.shape[-2]
    label = f"for h={h} query heads over g={g} K/V heads"

    def run(layer_):
        got = call(ex, fn, (layer_, x), ("layer", "x"), hint=attention_hint,
                   forbid=no_layer("fix the function, not call the package's layer"))
        if not (isinstance(got, tuple) and len(got) == 2 and len(got[1]) == 2):
            raise fail(ex, f"expected (out, (k_cache, v_cache)); got {type(got).__name__}")
        return array(ex, got[0], x.shape, f"your output {label}", "(..., T, d_model)"), got[1]

    out, caches = run(layer)
    q = split_heads(x @ layer.W_q, h)  # (..., h, T, d_k)
    k, v = split_heads(x @ layer.W_k, g), split_heads(x @ layer.W_v, g)  # (..., g, T, d)
    for i in range(h):  # W_o cut down to head i's rows: the output shows head i alone
        alone = copy.copy(layer)
        alone.W_o = np.where((np.arange(h * d_v) // d_v == i)[:, None], layer.W_o, 0.0)
        out_i = run(alone)[0]
        reads = [j for j in range(g) if np.allclose(out_i, sdpa(
            q[..., i, :, :], k[..., j, :, :], v[..., j, :, :], mask=causal_mask(T))[0]
            @ alone.W_o[i * d_v:(i + 1) * d_v], rtol=1e-6, atol=1e-9)]
        require(ex, GROUPS, reads and reads[0] != i // (h // g) and
                f"{label}, query head {i} reads K/V head {reads[0]}, not {i // (h // g)}")
    for name, got, want in (("k_cache", caches[0], k), ("v_cache", caches[1], v)):
        arr = as_array(ex, got, f"your {name}", want.shape, "(..., g, T, d)", "f")
        require(ex, GQA_CACHE, arr.shape != want.shape and f"{label}: your {name} has shape "
                f"{fmt_shape(arr.shape)}, where the g K/V heads are {fmt_shape(want.shape)}", arr,
                [("you cached the h repeated K/V heads: cache the g K/V heads, and repeat them "
                  "only to attend (facebookresearch/lingua#44)",
                  lambda want=want: np.repeat(want, h // g, axis=-3))])
        compare(ex, arr, want, f"your {name} {label}", "(..., g, T, d)")
    compare(ex, out, layer(x, mask=causal_mask(T))[0], f"your output {label}", "(..., T, d_model)")


# ------------------------------------------------------------------ 15.12 RoPE on the values
SHIFT = ("relative positions only: with RoPE on q and k, shifting every position by the same "
         "amount changes nothing")
ORDER = "positions matter: spreading the same tokens further apart changes the scores"


def check_rope_values(fn) -> None:
    """Exercise 15.12: ``rope_attention(layer, x, positions)`` -> out (T, d_model), causal."""
    ex, rng = "15.12", check_rng(912)
    for layer, positions in ((MultiHeadAttention(12, 3, rope="half", rng=rng), [0, 1, 2, 3, 4]),
                             (MultiHeadAttention(16, 2, 6, 4, rope="interleaved", rng=rng),
                              [3, 4, 5, 9, 10, 11])):
        _rope(ex, fn, layer, rng.normal(size=(len(positions), layer.d_model)), np.array(positions))
    passed(ex, "q and k rotated in the layer's layout, v untouched: shifts change nothing")


def _rope(ex, fn, layer, x, positions):
    h = layer.h
    label = f"for rope={layer.rope!r}, positions {positions.tolist()}"

    def reference(pos, layout=layer.rope):
        q, k = (apply_rope(split_heads(x @ W, h), pos, base=layer.rope_base, layout=layout)
                for W in (layer.W_q, layer.W_k))
        heads = sdpa(q, k, split_heads(x @ layer.W_v, h), mask=causal_mask(len(pos)))[0]
        return merge_heads(heads) @ layer.W_o

    def run(pos):
        got = call(ex, fn, (layer, x, pos), ("layer", "x", "positions"), hint=attention_hint,
                   forbid=no_layer("fix the function, not call the package's layer"))
        return array(ex, got, x.shape, f"your output {label}", "(T, d_model)")

    out = run(positions)
    found = P.moved_text(out, run(positions + 17))
    require(ex, SHIFT, found and f"{label}, then every position + 17: {found}")
    found = P.moved_text(out, run(2 * positions))
    require(ex, ORDER, not found and f"{label}: positions twice as far apart give the same output, "
            "so your scores ignore the positions", out, [
                ("without RoPE on q and k nothing knows the positions",
                 lambda: reference(positions * 0))])
    other = "half" if layer.rope == "interleaved" else "interleaved"
    wrong = [(f"you rotated in the {other!r} layout; weights trained with one layout give wrong "
              "scores in the other (the FAQ thread huggingface/transformers#25199 explains the "
              "permutation between them): use layout=layer.rope",
              lambda: reference(positions, other))]
    want = reference(positions)
    require(ex, P.REFERENCE, not close(out, want) and f"{label}: {P.moved_text(want, out)} "
            "against RoPE on q and k only", out, wrong)


# ------------------------------------------------------------- 15.13 the sliding window, by one
WINDOW = "a query sees exactly the last `window` tokens, itself included"


def check_window_off_by_one(fn) -> None:
    """Exercise 15.13: ``window_attention(q, k, v, window)`` -> (out, weights), T over T."""
    ex, rng = "15.13", check_rng(913)
    for lead, T, window, d_k, d_v in (((2,), 7, 3, 4, 5), ((), 5, 1, 3, 2), ((), 4, 10, 2, 3)):
        q, k, v = (rng.normal(size=(*lead, T, d)) for d in (d_k, d_k, d_v))
        label = f"for T={T}, window={window}"
        got = call(ex, fn, (q, k, v, window), ("q", "k", "v", "window"), hint=attention_hint,
                   forbid={"mha_course.sliding_window_mask": "fix the mask yourself"})
        out, w = pair(ex, got)
        out = array(ex, out, (*lead, T, d_v), f"your output {label}", "(..., T, d_v)")
        w = array(ex, w, (*lead, T, T), f"your weights {label}", "(..., T, T)")
        require(ex, P.SELF, P.self_weight_violation(w))
        seen = (w != 0).sum(axis=-1)  # (..., T): keys each query gives weight to
        want_seen = np.minimum(window, np.arange(T) + 1)
        bad = np.argwhere(seen != want_seen)
        require(ex, WINDOW, len(bad) and f"{label}: query {bad[0][-1]} gives weight to "
                f"{seen[tuple(bad[0])]} keys, not {want_seen[bad[0][-1]]}")
        rolling = np.concatenate([sdpa(q[..., t:t + 1, :], k[..., max(0, t - window + 1):t + 1, :],
                                       v[..., max(0, t - window + 1):t + 1, :])[0]
                                  for t in range(T)], axis=-2)  # a buffer of `window` slots
        found = P.moved_text(rolling, out)
        require(ex, P.CACHED, found and f"{label}, against decoding with a rolling buffer of "
                f"{window} slots: {found}")
    passed(ex, "each query sees itself and the window - 1 tokens before it, as the rolling "
               "buffer does")


# --------------------------------------------------------- 15.14 MLA's cache: the RoPE key too
MEASURED = "the formula counts what a real latent cache holds"
HEADS_FREE = "one latent and one RoPE key per token and layer, shared by all heads: no h in it"


def check_mla_cache_formula(fn) -> None:
    """Exercise 15.14: ``mla_cache_bytes_of(config, seq_len, batch=1, bytes_per_value=2)``."""
    ex = "15.14"
    tiny = {"num_hidden_layers": 3, "hidden_size": 32, "num_attention_heads": 4,
            "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 6, "v_head_dim": 5}
    layer = MultiHeadLatentAttention(32, 4, d_c=8, d_rope=4, d_k=6, d_v=5, rng=914)
    cache = layer.init_cache(batch_shape=(2,))
    for x_t in check_rng(914).normal(size=(7, 2, 1, 32)):
        layer.decode_step(x_t, cache)
    held = tiny["num_hidden_layers"] * cache.entries.size * 4  # 3 layers, 7 tokens, batch 2, fp32
    forbid = {"mha_course.mla_cache_bytes": "write the formula yourself",
              "mha_course.cost": "read the config's fields yourself"}
    probes = [("a tiny MLA model (3 layers, d_c=8, d_rope=4, h=4)", tiny, 7, 2, 4, held)]
    probes += [(name, dict(MODELS[name]), n, 1, 2, None)
               for name, n in (("DeepSeek-V2", 8192), ("DeepSeek-V3", 131072))]
    for name, config, seq_len, batch, width, measured in probes:
        L, d_c, d_r = (config[f] for f in ("num_hidden_layers", "kv_lora_rank", "qk_rope_head_dim"))
        want = mla_cache_bytes(L, d_c, d_r, seq_len, batch, width)
        got = call(ex, fn, (config, seq_len), ("config", "seq_len"),
                   {"batch": batch, "bytes_per_value": width}, forbid=forbid)
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral, np.integer)):
            raise fail(ex, f"you returned {got!r} ({type(got).__name__}); expected an int")
        wrong = [("2·d_c counts a K and a V (LMCache PR #694); MLA caches ONE latent, from which "
                  "both are made, plus one shared RoPE key", want * 2 * d_c // (d_c + d_r)),
                 ("the RoPE key is shared by all heads: d_rope once, not once per head",
                  want * (d_c + config["num_attention_heads"] * d_r) // (d_c + d_r))]
        why = "; or ".join(m for m, value in wrong if value == int(got))
        why = f". Likely mistake: {why}" if why else ""
        if measured is not None and int(got) != measured:
            raise P.violated(ex, MEASURED, f"for {name}, 7 tokens × batch 2 in float32, the "
                             f"cache holds {measured:,} bytes; you return {int(got):,}{why}")
        more = dict(config, num_attention_heads=2 * config["num_attention_heads"])
        doubled = call(ex, fn, (more, seq_len), ("config", "seq_len"),
                       {"batch": batch, "bytes_per_value": width})
        require(ex, HEADS_FREE, doubled != got and f"for {name}, doubling num_attention_heads "
                f"changes your answer from {int(got):,} to {int(doubled):,}")
        if int(got) != want:
            raise fail(ex, f"for {name} at seq_len={seq_len} you returned {int(got):,}, "
                           f"expected {want:,}{why}")
    passed(ex, "d_c + d_rope values per token and layer: a tiny layer measured, DeepSeek-V2, V3")
