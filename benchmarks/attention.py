"""Benchmark the package's multi-head self-attention forward against loops and PyTorch.

Run from the repository root (one thread unless ``--threads N``)::

    .venv/bin/python benchmarks/attention.py            # n = 128, 512, 2048; ~3-5 minutes
    .venv/bin/python benchmarks/attention.py --quick    # n = 128, float32 only: a smoke run
    .venv/bin/python benchmarks/attention.py --big      # adds n = 4096
    .venv/bin/python benchmarks/attention.py --cpu-time # busy machine: CPU time, not wall time

Two package paths are timed for ``MultiHeadAttention(d_model=512, h=8)`` (no bias): the layer's
readable ``forward`` (lesson 04's recipe, composed of ``split_heads``,
``scaled_dot_product_attention`` and ``merge_heads``) and ``mha_course.kernels.lean.lean_forward``
(the
same output, ordered for speed and memory). It prints, from one run: the versions, the BLAS and
thread counts; each path's time and its ratio to a pure-Python version (n = 32 only), a NumPy
loop over heads, ``torch.nn.MultiheadAttention`` (with and without the per-head weights) and
``torch.nn.functional.scaled_dot_product_attention``; GFLOP/s as a share of plain matmul GFLOP/s
measured in the same run, and the *matmul floor* (the time of the forward's matmuls alone at that
speed) as a share of torch's time; peak extra memory as a multiple of the (h, n, n) weights; and
whether the targets are met.
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as bench  # noqa: E402  (benchmarks/harness.py: environment, timing, memory)

if __name__ == "__main__":
    bench.reexec_without_openblas_overrides(sys.argv[1:])

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import mha_course as mc  # noqa: E402
from mha_course import naive  # noqa: E402
from mha_course.kernels.lean import lean_forward  # noqa: E402

torch = bench.torch  # None when torch is not installed
D_MODEL, H = 512, 8
TARGETS = {"forward": 1.0, "lean": 0.6, "lean_128": 1.0, "memory": 1.25}


# ------------------------------------------------------------------------------ contenders
def make_layer(dtype) -> mc.MultiHeadAttention:
    """The package's layer with its weights stored in ``dtype`` (as a float32 model would)."""
    layer = mc.MultiHeadAttention(D_MODEL, H, rng=0)
    for name, W in layer.parameters().items():
        setattr(layer, name, W.astype(dtype))
    return layer


def numpy_head_loop(layer: mc.MultiHeadAttention):
    """Multi-head attention as the article writes it: per-head matrices, a Python loop over h."""
    P = layer.per_head()  # W_q, W_k, W_v (h, d_model, d_k); W_o (h, d_v, d_model)
    scale = 1.0 / math.sqrt(layer.d_k)

    def forward(x, mask=None):
        heads, weights = [], []
        for i in range(layer.h):
            q, k, v = x @ P["W_q"][i], x @ P["W_k"][i], x @ P["W_v"][i]  # (n, d_k)
            w = mc.softmax((q * scale) @ k.T, mask=mask)  # (n, n)
            heads.append(w @ v)
            weights.append(w)
        return np.concatenate(heads, axis=-1) @ layer.W_o, np.stack(weights)

    return forward


def pure_python(layer: mc.MultiHeadAttention):
    """The same forward on lists of lists with ``mha_course.naive`` (float64, no mask)."""
    P = {name: [W.tolist() for W in Ws] for name, Ws in layer.per_head().items()}
    scale = 1.0 / math.sqrt(layer.d_k)

    def forward(x_list):
        concat = [[] for _ in x_list]
        weights = []
        for i in range(layer.h):
            q = naive.matmul(x_list, P["W_q"][i])
            k = naive.matmul(x_list, P["W_k"][i])
            v = naive.matmul(x_list, P["W_v"][i])
            scores = naive.matmul(q, naive.transpose(k))
            w = naive.softmax_rows([[s * scale for s in row] for row in scores])
            for row_out, row_head in zip(concat, naive.matmul(w, v), strict=True):
                row_out.extend(row_head)
            weights.append(w)
        return naive.matmul(concat, layer.W_o.tolist()), weights

    return forward


def torch_module(layer: mc.MultiHeadAttention, dtype):
    """``torch.nn.MultiheadAttention`` with the package's weights copied in (no bias)."""
    tdtype = getattr(torch, np.dtype(dtype).name)
    mod = torch.nn.MultiheadAttention(D_MODEL, H, bias=False, batch_first=True, dtype=tdtype)
    with torch.no_grad():
        # torch computes x @ W.T with W (out, in); the package computes x @ W with W (in, out).
        mod.in_proj_weight.copy_(
            torch.from_numpy(np.concatenate([layer.W_q.T, layer.W_k.T, layer.W_v.T]))
        )
        mod.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(layer.W_o.T)))
    return mod.eval()


def torch_sdpa(layer: mc.MultiHeadAttention):
    """Same projections in torch, then ``F.scaled_dot_product_attention`` (no weights out)."""
    W = {name: torch.from_numpy(np.ascontiguousarray(A)) for name, A in layer.parameters().items()}
    h = layer.h

    def forward(x, is_causal=False):
        n = x.shape[0]
        # (n, d_model) @ (d_model, h*d_k) -> (n, h, d_k) -> (h, n, d_k)
        q, k, v = ((x @ W[name]).view(n, h, -1).transpose(0, 1) for name in ("W_q", "W_k", "W_v"))
        heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return heads.transpose(0, 1).reshape(n, -1) @ W["W_o"]  # (h, n, d_v) -> (n, h*d_v)

    return forward


# ---------------------------------------------------------------------------------- report
def main(argv: list[str] | None = None) -> int:
    parser = bench.common_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="n = 128, float32 only")
    parser.add_argument("--big", action="store_true", help="also n = 4096")
    args = parser.parse_args(argv)
    bench.apply_common_options(parser, args)
    sizes = [128] if args.quick else [128, 512, 2048] + ([4096] if args.big else [])
    dtypes = [np.float32] if args.quick else [np.float32, np.float64]

    with threadpool_limits(limits=args.threads, user_api="blas"):
        print("== environment")
        for line in bench.environment_lines(args.threads, args.keep_env):
            print("  " + line)
        print(f"  layer: MultiHeadAttention(d_model={D_MODEL}, h={H}), no bias, self-attention")
        print(
            f"  timing: {bench.CLOCK['name']}, minimum over >= {bench.MIN_RUNS} runs and >= "
            f"{bench.MIN_SECONDS} s per contender, called round-robin"
        )
        results = run(sizes, dtypes)
    print_targets(results, sizes, args.threads)
    return 0


def run(sizes, dtypes) -> dict:
    rng = np.random.default_rng(0)
    results = {}

    # The pure-Python version only at n = 32: it is about 1e3 times slower.
    n = 32
    layer = make_layer(np.float64)
    x = rng.standard_normal((n, D_MODEL))
    slow = pure_python(layer)
    x_list = x.tolist()
    t = bench.best_times({"forward": lambda: layer(x)})["forward"]
    t_py = bench.best_times({"python": lambda: slow(x_list)}, min_runs=1)["python"]
    out_py = np.array(slow(x_list)[0])
    print(f"\n== pure Python (mha_course.naive loops) at n = {n}, float64, no mask")
    print(
        f"  forward {t * 1e3:.3f} ms, pure Python {t_py * 1e3:.0f} ms: forward / Python = "
        f"{t / t_py:.5f}x (Python is {t_py / t:.0f}x slower); "
        f"max |out difference| = {np.abs(out_py - layer(x)[0]).max():.1e}"
    )

    for dtype in dtypes:
        name = np.dtype(dtype).name
        layer = make_layer(dtype)
        loop = numpy_head_loop(layer)
        torch_mods = None if torch is None else (torch_module(layer, dtype), torch_sdpa(layer))
        if dtype == dtypes[0]:
            print("\n== columns\n" + LEGEND)
        print(f"\n== {name}: time, and time / other time (< 1 = package faster)")
        header = (
            f"  {'n':>5} {'mask':>6} {'forward':>10} {'lean':>10} {'fwd/torch(w)':>12} "
            f"{'lean/torch(w)':>13} {'floor/torch(w)':>14} {'lean/np-loop':>12} "
            f"{'lean/torch(fused)':>17} {'lean/F.sdpa':>11} {'lean %peak':>10} "
            f"{'mem fwd':>8} {'mem lean':>8}"
        )
        if torch is not None:
            x = rng.standard_normal((sizes[0], D_MODEL)).astype(dtype)
            for mask in (None, mc.causal_mask(sizes[0])):
                label = f"{name}, n={sizes[0]}, {'no mask' if mask is None else 'causal'}"
                check_agreement(label, layer, contenders(layer, loop, torch_mods, x, mask), x, mask)
        print(header)
        for n in sizes:
            x = rng.standard_normal((n, D_MODEL)).astype(dtype)
            a = rng.standard_normal((H, n, D_MODEL // H)).astype(dtype)
            b = rng.standard_normal((H, D_MODEL // H, n)).astype(dtype)
            W = layer.W_q
            flops = mc.attention_flops(n, D_MODEL, H)
            for causal in (False, True):
                mask = mc.causal_mask(n) if causal else None
                funcs = contenders(layer, loop, torch_mods, x, mask)
                if not causal:
                    # The plain matmuls join the same round-robin, so they see the same load.
                    funcs.update(proj=lambda x=x, W=W: x @ W, scores=lambda a=a, b=b: a @ b)
                t = bench.best_times(funcs)
                if not causal:
                    t_proj, t_scores = t["proj"], t["scores"]
                    # (8, n, 64) @ (8, 64, n) is exactly the forward's "scores" term
                    peak = max(2 * n * D_MODEL * D_MODEL / t_proj, flops["scores"] / t_scores) / 1e9
                    # The forward's matmuls alone at the speeds just measured: 4 projections,
                    # the scores and the weighted sum (as many FLOPs as the scores).
                    floor = 4 * t_proj + 2 * t_scores
                weights_bytes = H * n * n * np.dtype(dtype).itemsize
                row = {
                    "time": t,
                    "floor": floor,
                    "share": flops["total"] / t["lean"] / 1e9 / peak,
                    "mem": bench.peak_extra_bytes(funcs["forward"]) / weights_bytes,
                    "mem_lean": bench.peak_extra_bytes(funcs["lean"]) / weights_bytes,
                }
                results[(name, n, causal)] = row
                tw = t.get("torch_w")
                print(
                    f"  {n:>5} {'causal' if causal else 'none':>6} "
                    f"{t['forward'] * 1e3:>7.2f} ms {t['lean'] * 1e3:>7.2f} ms "
                    f"{bench.fmt_ratio(t['forward'], tw):>12} "
                    f"{bench.fmt_ratio(t['lean'], tw):>13} "
                    f"{bench.fmt_ratio(floor, tw):>14} "
                    f"{bench.fmt_ratio(t['lean'], t['loop']):>12} "
                    f"{bench.fmt_ratio(t['lean'], t.get('torch_fused')):>17} "
                    f"{bench.fmt_ratio(t['lean'], t.get('sdpa')):>11} {row['share']:>10.0%} "
                    f"{row['mem']:>7.3f}x {row['mem_lean']:>7.3f}x",
                    flush=True,
                )
    return results


LEGEND = """\
  forward    MultiHeadAttention.forward, the readable path (weights stored in this dtype)
  lean       mha_course.kernels.lean.lean_forward, the same output ordered for speed and memory
  torch(w)   torch.nn.MultiheadAttention, need_weights=True, average_attn_weights=False: like
             both package paths it returns the (h, n, n) weights
  floor      the forward's matmuls alone (4 projections, scores, weighted sum) at the GFLOP/s
             of plain (n, 512) @ (512, 512) and (8, n, 64) @ (8, 64, n) matmuls measured in
             this run: no NumPy forward can be faster than this
  np-loop    a NumPy loop over the h heads with per-head matrices
  torch(fused)  torch MHA with need_weights=False (its fused SDPA kernel: no weights returned)
  F.sdpa     torch projections + F.scaled_dot_product_attention (no weights returned)
  %peak      attention_flops(n, 512, 8)["total"] / lean time, as a share of the faster plain
             matmul's GFLOP/s (the causal mask saves no FLOPs)
  mem        peak extra traced memory of one call / bytes of the (8, n, n) weights (returned
             weights and output included); the floor for a forward that keeps full q and k while
             it computes the scores is 1 + 2·n·d_model/(h·n²): 1.25x at n = 512"""


def contenders(layer, loop, torch_mods, x, mask) -> dict:
    """Zero-argument callables, one per implementation, all computing the same forward."""
    funcs = {
        "forward": lambda: layer(x, mask=mask),
        "lean": lambda: lean_forward(layer, x, mask=mask),
        "loop": lambda: loop(x, mask),
    }
    if torch_mods is None:
        return funcs
    mod, sdpa = torch_mods
    xt = torch.from_numpy(x)
    tmask = None if mask is None else torch.from_numpy(~mask)  # torch: True = may NOT attend
    causal = mask is not None

    def torch_w():
        with torch.inference_mode():
            return mod(xt, xt, xt, attn_mask=tmask, need_weights=True, average_attn_weights=False)

    def torch_fused():
        with torch.inference_mode():
            return mod(xt, xt, xt, attn_mask=tmask, need_weights=False, is_causal=causal)

    def torch_sdpa_():
        with torch.inference_mode():
            return sdpa(xt, is_causal=causal)

    funcs.update(torch_w=torch_w, torch_fused=torch_fused, sdpa=torch_sdpa_)
    return funcs


def check_agreement(label, layer, funcs, x, mask) -> None:
    """Print how far each contender's output is from the package's (a wiring check)."""
    ref_out, ref_w = layer(x, mask=mask)
    lean_out, lean_w = funcs["lean"]()
    diffs = {"lean": max(np.abs(lean_out - ref_out).max(), np.abs(lean_w - ref_w).max())}
    diffs["np-loop"] = np.abs(funcs["loop"]()[0] - ref_out).max()
    out_w, w_t = funcs["torch_w"]()
    diffs["torch(w)"] = np.abs(out_w.numpy() - ref_out).max()
    diffs["torch weights"] = np.abs(w_t.numpy() - ref_w).max()
    diffs["torch(fused)"] = np.abs(funcs["torch_fused"]()[0].numpy() - ref_out).max()
    diffs["F.sdpa"] = np.abs(funcs["sdpa"]().numpy() - ref_out).max()
    print(
        f"  wiring check ({label}), max |difference| from the package: "
        + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items())
    )


def print_targets(results: dict, sizes, threads: int) -> None:
    """The targets of the readable and the lean path, judged on the runs without a mask."""
    print(f"\n== targets ({threads} thread{'s' if threads > 1 else ''}; no mask)")
    print(
        "  time: against torch MultiheadAttention with need_weights=True, which, like both\n"
        "  package paths, returns the (h, n, n) weights (torch's fused path returns none: its\n"
        "  ratio is in the tables above). Where a target sits below the matmul floor (floor/\n"
        "  torch(w) above it), no NumPy forward on this machine can meet it.\n"
        "  memory: judged at n >= 512 (at n = 128 q and k alone are 1.0x the weights), to the\n"
        "  target's two decimals; n = 512 sits at the floor of 1.25x (weights + q + k)."
    )
    rows = sorted((key, row) for key, row in results.items() if not key[2])
    lines = []
    for (name, n, _), row in rows:
        tw = row["time"].get("torch_w")
        if n > 2048 or tw is None:
            continue
        r = row["time"]["forward"] / tw
        lines.append((f"forward <= {TARGETS['forward']}x torch(w), {name} n={n}", f"{r:.2f}x",
                      r <= TARGETS["forward"], ""))
        goal = TARGETS["lean_128"] if n == 128 else TARGETS["lean"]
        r = row["time"]["lean"] / tw
        floor = row["floor"] / tw
        note = f"(floor {floor:.2f}x)" if floor > goal else ""
        lines.append((f"lean <= {goal}x torch(w), {name} n={n}", f"{r:.2f}x", r <= goal, note))
    for (name, n, _), row in rows:
        if n >= 512:
            m = row["mem_lean"]
            lines.append((f"lean peak memory <= {TARGETS['memory']}x weights, {name} n={n}",
                          f"{m:.3f}x", round(m, 2) <= TARGETS["memory"], ""))
    if 512 not in sizes:
        print("  (n = 512 not run: the lean and memory targets need the default sizes)")
    for what, value, ok, note in lines:
        print(f"  {what:<52} {value:>7}  {'met' if ok else 'MISSED'} {note}".rstrip())


if __name__ == "__main__":
    sys.exit(main())
