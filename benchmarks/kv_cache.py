"""Benchmark decoding with a KV cache against recomputing the causal forward; GQA, MLA and the
rolling buffer of a sliding window.

Run from the repository root (one thread unless ``--threads N``)::

    .venv/bin/python benchmarks/kv_cache.py            # 1024 tokens; about a minute
    .venv/bin/python benchmarks/kv_cache.py --quick    # 128 tokens: a smoke run
    .venv/bin/python benchmarks/kv_cache.py --cpu-time # busy machine: CPU time, not wall time

It prints, from one run: the versions, the BLAS and thread counts (the helpers of
``benchmarks/harness.py``, imported); for ``MultiHeadAttention(d_model=512, h=8)`` in float32,
the time to generate N tokens one at a time with ``decode_step`` and a KV cache, against
recomputing the full causal forward over the first t tokens at every step t (the speed-up), the
bytes the cache holds and the peak extra memory of one step of each; then, with GQA at
g = n_kv_heads = 1, 2, 8 (h = 8), the cache bytes and the decode time per token; multi-head
latent attention at the same d_model (DeepSeek-V2's proportions: d_c = 4·d_k, d_rope = d_k/2),
absorbed and naive, against GQA and MHA: cache bytes and time per token; the rolling buffer of a
sliding window (W = 128): its bytes and the peak extra memory of a step as n grows, against an
ordinary cache; the redraw time of lesson 06's cache-memory widget; and whether the targets are
met. Decode times are the minimum over >= 3 runs; the recompute loop runs once (it is the slow
side, so its one run is long enough to be stable).
"""

from __future__ import annotations

import sys

import harness as bench  # benchmarks/harness.py: environment, timing and re-exec helpers

if __name__ == "__main__":
    # OpenBLAS's own kernel for this CPU, not one forced by OPENBLAS_CORETYPE (see harness.py).
    bench.reexec_without_openblas_overrides(sys.argv[1:])

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import mha_course as mc  # noqa: E402

D_MODEL, H = 512, 8
DTYPE = np.float32
TARGET_SPEEDUP = 20.0


def make_layer(n_kv_heads=None) -> mc.MultiHeadAttention:
    """The package's layer, its weights stored in float32 (as a float32 model would)."""
    layer = mc.MultiHeadAttention(D_MODEL, H, rng=0, n_kv_heads=n_kv_heads)
    for name, W in layer.parameters().items():
        setattr(layer, name, W.astype(DTYPE))
    return layer


def decode_all(layer, x):
    """Generate with a cache: one ``decode_step`` per token of x (n, d_model)."""
    cache = layer.init_cache(max_len=x.shape[0])
    outs = [layer.decode_step(x[t : t + 1], cache)[0] for t in range(x.shape[0])]
    return np.concatenate(outs), cache


def recompute_all(layer, x):
    """Generate without a cache: the full causal forward over tokens 0..t at every step t."""
    outs = []
    for t in range(1, x.shape[0] + 1):
        out, _ = layer(x[:t], mask=mc.causal_mask(t))
        outs.append(out[-1:])  # the new token's row; the rest was computed before
    return np.concatenate(outs)


def once(f) -> float:
    """Time of one call of ``f`` with the benchmark's clock."""
    clock = bench.CLOCK["func"]
    t0 = clock()
    f()
    return clock() - t0


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:.2f} MiB"


def run_cache_vs_recompute(n: int, rng) -> dict:
    layer = make_layer()
    x = rng.standard_normal((n, D_MODEL)).astype(DTYPE)
    out_cache, cache = decode_all(layer, x)
    t_cache = bench.best_times({"decode": lambda: decode_all(layer, x)})["decode"]
    t_recompute = once(lambda: recompute_all(layer, x))
    diff = float(np.abs(out_cache - layer(x, mask=mc.causal_mask(n))[0]).max())
    # Memory of the last step: decoding token n with a cache of n - 1, against the full forward
    # over n tokens (whose (h, n, n) weights dominate).
    step_cache = layer.init_cache(max_len=n)
    for t in range(n - 1):
        layer.decode_step(x[t : t + 1], step_cache)
    mem_step = bench.peak_extra_bytes(lambda: layer.decode_step(x[n - 1 :], step_cache))
    mem_full = bench.peak_extra_bytes(lambda: layer(x, mask=mc.causal_mask(n)))
    expected = mc.kv_cache_bytes(1, H, D_MODEL // H, n, bytes_per_value=np.dtype(DTYPE).itemsize)
    print(f"\n== generating {n} tokens, float32, batch 1: KV cache against recomputing")
    print(f"  wiring check: max |cached - full causal forward| over all {n} outputs = {diff:.1e}")
    print(f"  {'':<34} {'time':>10} {'per token':>10} {'peak extra memory of the last step':>36}")
    print(
        f"  {'decode_step with a KV cache':<34} {t_cache:>8.3f} s {t_cache / n * 1e3:>7.3f} ms "
        f"{mib(mem_step):>36}"
    )
    print(
        f"  {'full causal forward every step':<34} {t_recompute:>8.3f} s "
        f"{t_recompute / n * 1e3:>7.3f} ms {mib(mem_full):>36}"
    )
    speedup = t_recompute / t_cache
    print(f"  speed-up (recompute time / cache time): {speedup:.1f}x")
    print(
        f"  bytes held by the cache after {n} tokens: {cache.nbytes} ({mib(cache.nbytes)}); "
        f"kv_cache_bytes(1, {H}, {D_MODEL // H}, {n}, bytes_per_value=4) = {expected}"
    )
    return {"speedup": speedup, "bytes": cache.nbytes, "expected": expected, "diff": diff}


def run_gqa(n: int, rng) -> dict:
    x = rng.standard_normal((n, D_MODEL)).astype(DTYPE)
    layers = {g: make_layer(g) for g in (8, 2, 1)}
    times = bench.best_times({g: (lambda layer=layer: decode_all(layer, x)) for g, layer in
                              layers.items()})
    print(f"\n== GQA: h = {H} query heads sharing g K/V heads, {n} tokens decoded, float32, "
          "batch 1")
    print(f"  {'g':>3} {'':<4} {'cache bytes':>12} {'/ g=8':>6} {'per token':>10} {'/ g=8':>6} "
          f"{'parameters':>11}")
    rows = {}
    for g, layer in layers.items():
        _, cache = decode_all(layer, x)
        kind = {8: "MHA", 1: "MQA"}.get(g, "GQA")
        rows[g] = {"bytes": cache.nbytes, "time": times[g]}
        print(
            f"  {g:>3} {kind:<4} {cache.nbytes:>12} {cache.nbytes / rows[8]['bytes']:>6.3f} "
            f"{times[g] / n * 1e3:>7.3f} ms {times[g] / times[8]:>6.2f} "
            f"{mc.param_count(D_MODEL, H, n_kv_heads=g):>11}"
        )
    print(
        "  per token = decode time of all n tokens / n. A step at cache length L costs the Q and\n"
        "  O projections (2·d_model² multiply-adds, the same for every g), the K and V\n"
        "  projections (2·d_model·g·d_k: g shrinks them), the scores and weighted sum (2·h·L·d_k:\n"
        "  the same for every g, but reading g/h of the cache's bytes) and Python overhead."
    )
    return rows


MLA_D_C, MLA_D_ROPE = 4 * (D_MODEL // H), (D_MODEL // H) // 2  # DeepSeek-V2: 512 and 64 of 128


def make_mla() -> mc.MultiHeadLatentAttention:
    mla = mc.MultiHeadLatentAttention(D_MODEL, H, MLA_D_C, MLA_D_ROPE, rng=0)
    for name, W in mla.parameters().items():
        setattr(mla, name, W.astype(DTYPE))
    return mla


def decode_mla(mla, x, absorbed):
    cache = mla.init_cache(max_len=x.shape[0])
    for t in range(x.shape[0]):
        mla.decode_step(x[t : t + 1], cache, absorbed=absorbed)
    return cache


def run_mla(n: int, rng) -> dict:
    """MHA, GQA g=2, MQA and MLA (absorbed and naive) decoding the same n tokens."""
    x = rng.standard_normal((n, D_MODEL)).astype(DTYPE)
    mla = make_mla()
    layers = {"MHA (g=8)": make_layer(8), "GQA (g=2)": make_layer(2), "MQA (g=1)": make_layer(1)}
    funcs = {name: (lambda layer=layer: decode_all(layer, x)[1]) for name, layer in layers.items()}
    funcs["MLA absorbed"] = lambda: decode_mla(mla, x, True)
    funcs["MLA naive"] = lambda: decode_mla(mla, x, False)
    times = bench.best_times(funcs)
    d_k = D_MODEL // H
    print(f"\n== MLA against GQA at d_model = {D_MODEL}, h = {H}, d_k = {d_k}: d_c = {MLA_D_C}, "
          f"d_rope = {MLA_D_ROPE}, {n} tokens decoded, float32, batch 1")
    print(f"  {'':<14} {'values/token':>12} {'cache bytes':>12} {'/ MHA':>6} {'per token':>10} "
          f"{'/ MHA':>6}")
    rows = {}
    for name, f in funcs.items():
        cache = f()
        values = (cache.values_per_token if name.startswith("MLA")
                  else 2 * cache.n_kv_heads * d_k)
        rows[name] = (values, cache.nbytes, times[name])
    mha_bytes, mha_time = rows["MHA (g=8)"][1:]
    for name, (values, n_bytes, t) in rows.items():
        print(f"  {name:<14} {values:>12} {n_bytes:>12} {n_bytes / mha_bytes:>6.3f} "
              f"{t / n * 1e3:>7.3f} ms {t / mha_time:>6.2f}")
    print("  MLA's cache: d_c + d_rope values a token for all heads, like GQA with "
          f"{(MLA_D_C + MLA_D_ROPE) / (2 * d_k):.2f} groups.\n"
          "  The naive form rebuilds every head's keys and values from all cached latents at\n"
          "  each step (O(n·d_c·h·(d_k + d_v))); the absorbed form attends in the latent space\n"
          "  (O(n·h·(2·d_c + d_rope))). At this small width a step is mostly fixed overhead, so\n"
          "  times differ less than bytes.")
    return {"mla_bytes": rows["MLA absorbed"][1], "gqa2_bytes": rows["GQA (g=2)"][1],
            "absorbed": times["MLA absorbed"], "naive": times["MLA naive"]}


def run_rolling(ns, rng, window=128) -> dict:
    layer = make_layer(2)
    print(f"\n== the rolling buffer of a sliding window (W = {window}) against an ordinary cache, "
          "GQA g=2, float32")
    print(f"  {'n':>6} {'window: bytes':>14} {'step peak extra':>16} {'ordinary: bytes':>16} "
          f"{'step peak extra':>16}")
    rows = {}
    for n in ns:
        x = rng.standard_normal((n + 1, D_MODEL)).astype(DTYPE)
        caches = {"window": layer.init_cache(window=window),
                  "ordinary": layer.init_cache(max_len=n + 1)}  # preallocated: no growth copy
        row = {}
        for name, cache in caches.items():
            k = mc.split_heads(x[:n] @ layer.W_k, 2)  # prefill n tokens at once
            cache.append(k, mc.split_heads(x[:n] @ layer.W_v, 2))
            step = x[n:]
            peak = bench.peak_extra_bytes(lambda c=cache, s=step: layer.decode_step(s, c))
            row[name] = (cache.nbytes, peak)
        rows[n] = row
        print(f"  {n:>6} {row['window'][0]:>14} {row['window'][1]:>16} {row['ordinary'][0]:>16} "
              f"{row['ordinary'][1]:>16}")
    return rows


def run_widget_redraw() -> float:
    from mha_course.widgets.cache_memory import draw_cache_memory, preset
    from mha_course.widgets.explorer import figure_png

    times = bench.best_times({
        name: (lambda name=name: figure_png(draw_cache_memory(**preset(name), seq_len=131072,
                                                              batch=8)[0]))
        for name in ("Llama 3 70B", "DeepSeek-V2", "gpt-oss-120b")}, min_runs=3)
    worst = max(times.values())
    print("\n== lesson 06's cache-memory widget: one redraw (draw_cache_memory + PNG)")
    for name, t in times.items():
        print(f"  preset {name:<14} {t * 1e3:7.1f} ms")
    return worst


def print_targets(cache_row: dict, gqa_rows: dict, n: int, threads: int, extra=None) -> None:
    print(f"\n== targets ({threads} thread{'s' if threads > 1 else ''}, {n} tokens)")
    speedup = cache_row["speedup"]
    lines = [
        (f"KV-cache speed-up >= {TARGET_SPEEDUP:.0f}x over recomputing", f"{speedup:.1f}x",
         speedup >= TARGET_SPEEDUP if n >= 1024 else None),
        ("cache bytes = 2·h·d_k·n·4 (kv_cache_bytes)", f"{cache_row['bytes']}",
         cache_row["bytes"] == cache_row["expected"]),
        ("cached outputs = causal forward (float32, <= 1e-5)", f"{cache_row['diff']:.1e}",
         cache_row["diff"] <= 1e-5),
    ]
    for g in (2, 1):
        ratio = gqa_rows[g]["bytes"] / gqa_rows[8]["bytes"]
        lines.append((f"GQA g={g}: cache bytes = g/h = {g}/{H} of MHA's", f"{ratio:.3f}",
                      ratio == g / H))
    if extra:
        mla, rolling, redraw = extra["mla"], extra["rolling"], extra["redraw"]
        d_k = D_MODEL // H
        lines.append(("MLA cache bytes = (d_c + d_rope) / (2·2·d_k) of GQA g=2",
                      f"{mla['mla_bytes'] / mla['gqa2_bytes']:.4f}",
                      mla["mla_bytes"] / mla["gqa2_bytes"] == (MLA_D_C + MLA_D_ROPE) / (4 * d_k)))
        lines.append(("MLA absorbed decodes faster than naive",
                      f"{mla['naive'] / mla['absorbed']:.1f}x", mla["absorbed"] < mla["naive"]))
        window_bytes = {row["window"][0] for row in rolling.values()}
        lines.append(("rolling buffer bytes flat in n", f"{sorted(window_bytes)}",
                      len(window_bytes) == 1))
        peaks = [row["window"][1] for row in rolling.values()]
        lines.append(("rolling buffer step memory flat in n (max/min <= 1.5)",
                      f"{max(peaks) / min(peaks):.2f}", max(peaks) <= 1.5 * min(peaks)))
        lines.append(("widget redraw <= 0.3 s", f"{redraw:.3f} s", redraw <= 0.3))
    if n < 1024:
        print("  (--quick: the speed-up target is set for 1024 tokens, so it is not judged)")
    for what, value, ok in lines:
        verdict = "not judged" if ok is None else "met" if ok else "MISSED"
        print(f"  {what:<52} {value:>10}  {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = bench.common_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="128 tokens instead of 1024")
    args = parser.parse_args(argv)
    bench.apply_common_options(parser, args)
    n = 128 if args.quick else 1024
    rng = np.random.default_rng(0)
    with threadpool_limits(limits=args.threads, user_api="blas"):
        print("== environment")
        for line in bench.environment_lines(args.threads, args.keep_env):
            print("  " + line)
        print(f"  layer: MultiHeadAttention(d_model={D_MODEL}, h={H}), no bias, float32 weights")
        print(f"  timing: {bench.CLOCK['name']}")
        cache_row = run_cache_vs_recompute(n, rng)
        gqa_rows = run_gqa(n, rng)
        extra = {"mla": run_mla(n // 4, rng),
                 "rolling": run_rolling([n, 2 * n, 4 * n], rng),
                 "redraw": run_widget_redraw()}
    print_targets(cache_row, gqa_rows, n, args.threads, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
