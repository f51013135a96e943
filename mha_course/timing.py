"""Timing small computations fairly: CPU time, the best of several runs, BLAS on one thread.

Not a concept of the course but its measuring tape: lesson 01 (``notebooks/01_matmul.ipynb``)
times pure-Python loops against NumPy with it, so the lesson shows what is measured rather than
how the stopwatch works.

- :func:`best_time` is the fastest of a few runs of one call, in CPU seconds. CPU time
  (``time.process_time``) counts only this process's work, so other programs on a busy machine
  do not inflate it; the minimum over repeats is the least noisy estimate.
- :func:`best_of_alternating` times several functions in turns (a, b, a, b, ...), so a busy
  moment slows all of them alike instead of one.
- :func:`one_blas_thread` holds NumPy's matrix library (BLAS) to one thread while it is active,
  for a like-for-like comparison with single-threaded Python loops (needs ``threadpoolctl``,
  which comes with the test tools; without it the block runs unchanged and says so).
"""

from __future__ import annotations

import contextlib
import time
import timeit
from collections.abc import Callable, Iterator

from ._validate import fail, validate_positive_int

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # an optional extra: the lesson then times NumPy with all its threads
    threadpool_limits = None


def best_time(fn: Callable[[], object], repeat: int = 5, number: int = 1,
              budget: float = 0.1) -> float:
    """Fastest of up to ``repeat`` runs of ``number`` calls of ``fn``, in CPU seconds per call.

    Repeating stops early once ``budget`` CPU seconds are spent, so a slow function is run few
    times and a fast one many.

    Parameters
    ----------
    fn : callable taking no arguments
        Wrap arguments with ``functools.partial(f, a, b)``.
    repeat : int, default 5
        Most runs.
    number : int, default 1
        Calls per run (raise it for calls of a few microseconds, which one clock tick can hide).
    budget : float, default 0.1
        CPU seconds after which no further run starts.

    Returns
    -------
    float
        CPU seconds per call, the minimum over the runs.

    Raises
    ------
    ValueError
        If ``fn`` is not callable or ``repeat`` / ``number`` is not a positive integer.

    Examples
    --------
    >>> best_time(lambda: sum(range(100)), number=10) > 0
    True
    """
    func = "best_time"
    if not callable(fn):
        raise fail(func, f"fn must be callable, got {type(fn).__name__}")
    repeat = validate_positive_int(func, "repeat", repeat)
    number = validate_positive_int(func, "number", number)
    best, spent = float("inf"), 0.0
    for _ in range(repeat):
        t = timeit.timeit(fn, number=number, timer=time.process_time)
        best, spent = min(best, t), spent + t
        if spent > budget:
            break
    return best / number


def best_of_alternating(functions: dict[str, Callable[[], object]],
                        rounds: int = 3) -> dict[str, float]:
    """Time each function once per round, in turns, and keep each one's fastest call.

    Parameters
    ----------
    functions : dict of str -> callable taking no arguments
    rounds : int, default 3

    Returns
    -------
    dict of str -> float
        CPU seconds of each function's fastest call, in the order given.

    Raises
    ------
    ValueError
        If ``rounds`` is not a positive integer or ``functions`` is empty.

    Examples
    --------
    >>> times = best_of_alternating({"short": lambda: sum(range(10)),
    ...                              "long": lambda: sum(range(10_000))}, rounds=2)
    >>> list(times)
    ['short', 'long']
    """
    func = "best_of_alternating"
    rounds = validate_positive_int(func, "rounds", rounds)
    if not functions:
        raise fail(func, "functions is empty; expected at least one callable")
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(rounds):
        for name, fn in functions.items():
            best[name] = min(best[name], best_time(fn, repeat=1))
    return best


@contextlib.contextmanager
def one_blas_thread() -> Iterator[bool]:
    """Hold NumPy's BLAS to one thread inside the ``with`` block; yield whether it could.

    Examples
    --------
    >>> import numpy as np
    >>> with one_blas_thread() as limited:
    ...     _ = np.ones((4, 4)) @ np.ones((4, 4))
    >>> limited in (True, False)
    True
    """
    if threadpool_limits is None:
        yield False
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield True
