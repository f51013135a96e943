"""Benchmark the package's multi-head self-attention forward against loops and PyTorch.

Run from the repository root (one thread unless ``--threads N``)::

    .venv/bin/python benchmarks/attention.py            # n = 128, 512, 2048; ~2-4 minutes
    .venv/bin/python benchmarks/attention.py --quick    # n = 128, float32 only: a smoke run
    .venv/bin/python benchmarks/attention.py --big      # adds n = 4096
    .venv/bin/python benchmarks/attention.py --cpu-time # busy machine: CPU time, not wall time

It prints, from one run: the versions, the BLAS and thread counts; the time of
``MultiHeadAttention(d_model=512, h=8)`` (no bias) and its ratio to a pure-Python version (n = 32
only), a NumPy loop over heads, ``torch.nn.MultiheadAttention`` (with and without the per-head
weights) and ``torch.nn.functional.scaled_dot_product_attention``; its GFLOP/s as a share of plain
matmul GFLOP/s measured in the same run; its peak extra memory as a multiple of the (h, n, n)
weights array; and whether the targets are met. Timings are the minimum over repeats: on a
shared machine they are indicative, not exact.
"""

from __future__ import annotations

import argparse
import os
import sys

# OpenBLAS reads OPENBLAS_CORETYPE (which kernel to use) and OPENBLAS_L2_SIZE when it is loaded,
# i.e. when NumPy is imported. To benchmark the kernel OpenBLAS picks for this CPU, the script
# re-executes itself once without them, before NumPy is imported. The marker variable holds what
# was removed, so the child can print it and does not re-execute again.
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
MARKER = "MHA_COURSE_BENCH_REEXEC"


def reexec_without_openblas_overrides(argv: list[str]) -> None:
    """Replace this process by the same command without the OpenBLAS override variables."""
    if "--keep-env" in argv or MARKER in os.environ:
        return
    removed = {name: os.environ[name] for name in OPENBLAS_OVERRIDES if name in os.environ}
    env = {k: v for k, v in os.environ.items() if k not in removed}
    env[MARKER] = ";".join(f"{k}={v}" for k, v in removed.items()) or "-"
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


if __name__ == "__main__":
    reexec_without_openblas_overrides(sys.argv[1:])

import math  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402

import mha_course as mc  # noqa: E402
from mha_course import naive  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:  # the benchmark still runs the NumPy parts
    torch = None

D_MODEL, H = 512, 8
MIN_SECONDS, MIN_RUNS = 0.5, 3
# The clock: wall time by default; --cpu-time switches to this process's CPU time, which does
# not count the time the process waits while other processes hold the cores (one thread only).
CLOCK = {"name": "wall time (time.perf_counter)", "func": time.perf_counter}


# ----------------------------------------------------------------------------------- timing
def best_times(funcs: dict, min_runs: int = MIN_RUNS, min_seconds: float = MIN_SECONDS) -> dict:
    """Minimum time of each function (on ``CLOCK``), in seconds.

    The functions are called round-robin (one warm-up call each first), so a burst of load from
    another process hits all of them alike; each keeps running until it has ``min_runs`` runs
    and ``min_seconds`` of accumulated time (at most 200 runs). The order is shuffled every
    round: a call runs measurably slower right after one that allocated and freed a lot of
    memory (the package's causal forward at n = 2048, float64: 460 ms CPU alone, 610 ms always
    following torch's SDPA), and a fixed order would always put the same one after it.
    """
    for f in funcs.values():
        f()
    times = {name: [] for name in funcs}
    order = random.Random(0)
    while True:
        todo = [
            name
            for name, ts in times.items()
            if len(ts) < 200 and (len(ts) < min_runs or sum(ts) < min_seconds)
        ]
        if not todo:
            return {name: min(ts) for name, ts in times.items()}
        order.shuffle(todo)
        for name in todo:
            clock = CLOCK["func"]
            t0 = clock()
            funcs[name]()
            times[name].append(clock() - t0)


def peak_extra_bytes(f) -> int:
    """Peak traced memory during one call of ``f`` minus the traced size at the start.

    NumPy reports its array buffers to tracemalloc, so this counts every array the call
    allocates, including the ones it returns.
    """
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = f()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del result
    return peak - start


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
def environment_lines(threads: int, keep_env: bool) -> list[str]:
    lines = [
        f"python {sys.version.split()[0]}, numpy {np.__version__}, mha_course {mc.__version__}"
    ]
    if torch is not None:
        blas = "?"
        for part in torch.__config__.show().split(","):
            if "BLAS_INFO" in part:
                blas = part.split("=")[-1].strip()
        lines.append(
            f"torch {torch.__version__} (BLAS {blas}, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}), torch threads {torch.get_num_threads()}"
        )
    else:
        lines.append("torch not installed: its columns are skipped")
    for info in threadpool_info():
        lines.append(
            f"threadpool: {info['user_api']}/{info['internal_api']} {info.get('version')} "
            f"kernel {info.get('architecture', '-')} threads {info['num_threads']} "
            f"({os.path.basename(info['filepath'])})"
        )
    marker = os.environ.get(MARKER)
    if keep_env:
        state = ", ".join(f"{n}={os.environ.get(n, '(unset)')}" for n in OPENBLAS_OVERRIDES)
        lines.append(f"--keep-env: environment kept as it was: {state}")
    elif marker and marker != "-":
        lines.append(f"re-executed without {marker} (unset for this run only)")
    else:
        lines.append(f"{' and '.join(OPENBLAS_OVERRIDES)} were not set; no re-execution needed")
    lines.append(f"threads: {threads} (threadpoolctl limit on NumPy's BLAS; torch.set_num_threads)")
    return lines


def fmt_ratio(t_pkg: float, t_other: float | None) -> str:
    return "-" if t_other is None else f"{t_pkg / t_other:.2f}x"


def common_parser(doc: str) -> argparse.ArgumentParser:
    """The options every benchmark here takes: --threads, --keep-env, --cpu-time."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (1)")
    parser.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_* variables")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with time.process_time (for a busy shared machine; needs --threads 1)",
    )
    return parser


def apply_common_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Act on the common options: choose the clock and set torch's thread count."""
    if args.cpu_time:
        if args.threads != 1:
            parser.error("--cpu-time sums the CPU time of all threads: use it with --threads 1")
        CLOCK.update(name="CPU time of this process (time.process_time)", func=time.process_time)
    if torch is not None:
        torch.set_num_threads(args.threads)


def main(argv: list[str] | None = None) -> int:
    parser = common_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="n = 128, float32 only")
    parser.add_argument("--big", action="store_true", help="also n = 4096")
    args = parser.parse_args(argv)
    apply_common_options(parser, args)
    sizes = [128] if args.quick else [128, 512, 2048] + ([4096] if args.big else [])
    dtypes = [np.float32] if args.quick else [np.float32, np.float64]

    with threadpool_limits(limits=args.threads, user_api="blas"):
        print("== environment")
        for line in environment_lines(args.threads, args.keep_env):
            print("  " + line)
        print(f"  layer: MultiHeadAttention(d_model={D_MODEL}, h={H}), no bias, self-attention")
        print(
            f"  timing: {CLOCK['name']}, minimum over >= {MIN_RUNS} runs and >= {MIN_SECONDS} s"
            " per contender, called round-robin"
        )
        results = run(sizes, dtypes)
    print_targets(results, sizes, args.threads)
    return 0


def run(sizes, dtypes) -> dict:
    rng = np.random.default_rng(0)
    results = {}

    # The pure-Python version only at n = 32: it is about 1e4 times slower.
    n = 32
    layer = make_layer(np.float64)
    x = rng.standard_normal((n, D_MODEL))
    slow = pure_python(layer)
    x_list = x.tolist()
    t = best_times({"package": lambda: layer(x)})["package"]
    t_py = best_times({"python": lambda: slow(x_list)}, min_runs=1)["python"]
    out_py = np.array(slow(x_list)[0])
    print(f"\n== pure Python (mha_course.naive loops) at n = {n}, float64, no mask")
    print(
        f"  package {t * 1e3:.3f} ms, pure Python {t_py * 1e3:.0f} ms: package / Python = "
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
        print(f"\n== {name}: package time, and package time / other time (< 1 = package faster)")
        header = (
            f"  {'n':>5} {'mask':>6} {'package':>10} {'/np-loop':>9} {'/torch(w)':>10} "
            f"{'/torch(fused)':>13} {'/F.sdpa':>8} {'GFLOP/s':>8} {'proj':>6} {'scores':>7} "
            f"{'%peak':>6} {'mem':>7} {'floor':>6} {'np-loop mem':>11}"
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
            flops = mc.attention_flops(n, D_MODEL, H)["total"]
            for causal in (False, True):
                mask = mc.causal_mask(n) if causal else None
                funcs = contenders(layer, loop, torch_mods, x, mask)
                if not causal:
                    # The plain matmuls join the same round-robin, so they see the same load.
                    funcs.update(proj=lambda x=x, W=W: x @ W, scores=lambda a=a, b=b: a @ b)
                t = best_times(funcs)
                if not causal:
                    gf_proj = 2 * n * D_MODEL * D_MODEL / t["proj"] / 1e9
                    gf_scores = 2 * H * n * n * (D_MODEL // H) / t["scores"] / 1e9
                    peak = max(gf_proj, gf_scores)
                weights_bytes = H * n * n * np.dtype(dtype).itemsize
                mem = peak_extra_bytes(funcs["package"]) / weights_bytes
                mem_loop = peak_extra_bytes(funcs["loop"]) / weights_bytes
                gf = flops / t["package"] / 1e9
                row = {
                    "time": t,
                    "gflops": gf,
                    "peak": peak,
                    "mem": mem,
                    "share": gf / peak,
                    "mem_loop": mem_loop,
                    "floor": mem_floor(n),
                }
                results[(name, n, causal)] = row
                print(
                    f"  {n:>5} {'causal' if causal else 'none':>6} "
                    f"{t['package'] * 1e3:>7.2f} ms {fmt_ratio(t['package'], t['loop']):>9} "
                    f"{fmt_ratio(t['package'], t.get('torch_w')):>10} "
                    f"{fmt_ratio(t['package'], t.get('torch_fused')):>13} "
                    f"{fmt_ratio(t['package'], t.get('sdpa')):>8} {gf:>8.1f} {gf_proj:>6.1f} "
                    f"{gf_scores:>7.1f} {gf / peak:>6.0%} {mem:>6.3f}x {mem_floor(n):>5.3f}x "
                    f"{mem_loop:>10.2f}x",
                    flush=True,
                )
    return results


LEGEND = """\
  package    MultiHeadAttention forward time (weights stored in this dtype)
  /np-loop   ratio to a NumPy loop over the h heads with per-head matrices
  /torch(w)  ratio to torch.nn.MultiheadAttention, need_weights=True, average_attn_weights=False
  /torch(fused)  ... need_weights=False (torch's fused SDPA kernel: no weights returned)
  /F.sdpa    ratio to torch projections + F.scaled_dot_product_attention (no weights returned)
  GFLOP/s    attention_flops(n, 512, 8)["total"] / package time (the causal mask saves no FLOPs)
  proj, scores  GFLOP/s of plain (n, 512) @ (512, 512) and (8, n, 64) @ (8, 64, n) matmuls in
             this run; peak = the faster of the two (proj, in practice); %peak = GFLOP/s / peak
  mem        peak extra traced memory of one package forward / bytes of the (8, n, n) weights
             (the returned weights and output included); floor = weights + q + k, the least any
             forward holds that keeps full q and k while it computes the scores"""


def mem_floor(n: int) -> float:
    """(weights + q + k) / weights for self-attention: 1 + 2·n·d_model / (h·n²)."""
    return 1 + 2 * n * D_MODEL / (H * n * n)


def contenders(layer, loop, torch_mods, x, mask) -> dict:
    """Zero-argument callables, one per implementation, all computing the same forward."""
    funcs = {
        "package": lambda: layer(x, mask=mask),
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
    diffs = {"np-loop": np.abs(funcs["loop"]()[0] - ref_out).max()}
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
    """The three targets, judged on the non-causal runs."""
    print(f"\n== targets ({threads} thread{'s' if threads > 1 else ''}; no mask)")
    print(
        "  time: against torch MultiheadAttention with need_weights=True, which, like the\n"
        "  package, returns the (h, n, n) weights; its fused path (need_weights=False) returns\n"
        "  none and so never writes or reads that array (its ratio is in the tables above).\n"
        "  memory: judged at n >= 512 (at n = 128 q and k alone are 1.0x the weights), to the\n"
        "  target's two decimals; n = 512 sits at the floor of 1.25x (weights + q + k)."
    )
    rows = sorted((key, row) for key, row in results.items() if not key[2])
    lines = []
    for (name, n, _), row in rows:
        if n <= 2048 and "torch_w" in row["time"]:
            r = row["time"]["package"] / row["time"]["torch_w"]
            lines.append((f"time <= 1.0x torch(w), {name} n={n}", f"{r:.2f}x", r <= 1.0))
    for (name, n, _), row in rows:
        if n == 512:
            s = row["share"]
            lines.append((f">= 65% of matmul peak, {name} n={n}", f"{s:.0%}", s >= 0.65))
    for (name, n, _), row in rows:
        if n >= 512:
            m = row["mem"]
            lines.append(
                (
                    f"peak extra memory <= 1.25x weights, {name} n={n}",
                    f"{m:.3f}x",
                    round(m, 2) <= 1.25,
                )
            )
    if 512 not in sizes:
        print("  (n = 512 not run: the GFLOP/s and memory targets need the default sizes)")
    for what, value, ok in lines:
        print(f"  {what:<50} {value:>7}  {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
