"""What every benchmark here shares: the clean BLAS environment, timing, memory and the report.

Each benchmark script does, before anything else::

    import harness as bench
    if __name__ == "__main__":
        bench.reexec_without_openblas_overrides(sys.argv[1:])

then parses its options with :func:`common_parser` / :func:`apply_common_options`, prints
:func:`environment_lines`, times with :func:`best_times` and measures with
:func:`peak_extra_bytes`. Timings are the minimum over repeats, called round-robin: on a shared
machine they are indicative, not exact, and only ratios measured in the same run are reported.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import tracemalloc

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



import numpy as np  # noqa: E402
from threadpoolctl import threadpool_info  # noqa: E402

import mha_course as mc  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:  # the benchmarks still run their NumPy parts
    torch = None

MIN_SECONDS, MIN_RUNS = 0.5, 3
# The clock: wall time by default; --cpu-time switches to this process's CPU time, which does
# not count the time the process waits while other processes hold the cores (one thread only).
CLOCK = {"name": "wall time (time.perf_counter)", "func": time.perf_counter}


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
