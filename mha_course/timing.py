"""Timing small computations fairly: CPU time, the best of several runs, BLAS on one thread.

Not a concept of the course but its measuring tape: lesson 01 (``notebooks/01_matmul.ipynb``)
times pure-Python loops against NumPy with it, so the lesson shows what is measured rather than
how the stopwatch works; lesson 07's performance lab (``notebooks/07_flash_attention.ipynb``)
times with it too and checks every share it prints with the last two functions here.

- :func:`best_time` is the fastest of a few runs of one call, in CPU seconds. CPU time
  (``time.process_time``) counts only this process's work, so other programs on a busy machine
  do not inflate it; the minimum over repeats is the least noisy estimate.
- :func:`best_of_alternating` times several functions in turns (a, b, a, b, ...), so a busy
  moment slows all of them alike instead of one.
- :func:`one_blas_thread` holds NumPy's matrix library (BLAS) to one thread while it is active,
  for a like-for-like comparison with single-threaded Python loops (needs ``threadpoolctl``,
  which comes with the test tools; without it the block runs unchanged and says so).
- :func:`share_of_peak` and :func:`share_of_roof` turn a measured rate into a share of the
  machine's peak or of its roofline and *refuse* a share above 100 %: a point above its roof
  means the peak (or the bandwidth) was measured badly, not that the program beat the machine.
  A timing cell whose output the tests cannot compare calls them, so a wrong peak makes the cell
  fail instead of printing a wrong table.
- :func:`measure_roofline` times a roofline's probes (a matrix product for the peak, copies for
  the bandwidths) and its points in the same rounds, in turns, so a busy moment cannot lower the
  roof alone; it adds rounds while a point is above its roof and refuses one still above after
  the last. The decision is the pure function :func:`roofline_verdict`.
"""

from __future__ import annotations

import contextlib
import math
import numbers as numbers_module
import time
import timeit
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ._validate import fail, validate_positive_int

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # an optional extra: the lesson then times NumPy with all its threads
    threadpool_limits = None


def best_time(fn: Callable[[], object], repeat: int = 5, number: int = 1,
              budget: float = 0.1, timer: Callable[[], float] = time.process_time) -> float:
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
    timer : callable returning seconds, default ``time.process_time``
        The clock (tests pass a fake one).

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
        t = timeit.timeit(fn, number=number, timer=timer)
        best, spent = min(best, t), spent + t
        if spent > budget:
            break
    return best / number


def best_of_alternating(functions: dict[str, Callable[[], object]], rounds: int = 3,
                        timer: Callable[[], float] = time.process_time) -> dict[str, float]:
    """Time each function once per round, in turns, and keep each one's fastest call.

    Parameters
    ----------
    functions : dict of str -> callable taking no arguments
    rounds : int, default 3
    timer : callable returning seconds, default ``time.process_time``

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
    return _more_rounds(dict.fromkeys(functions, math.inf), functions, rounds, timer)


def _more_rounds(best: dict[str, float], functions: dict[str, Callable[[], object]], rounds: int,
                 timer: Callable[[], float]) -> dict[str, float]:
    # a, b, c, a, b, c, ...: each function once per round, keeping its fastest call
    for _ in range(rounds):
        for name, fn in functions.items():
            best[name] = min(best[name], best_time(fn, repeat=1, timer=timer))
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


def share_of_peak(rate: float, peak: float, what: str, unit: str = "GFLOP/s") -> float:
    """``rate / peak``, refusing a share above 1 (more than the machine's best measured rate).

    Parameters
    ----------
    rate, peak : float
        Positive rates in the same unit; ``peak`` should be the best rate of any matrix product
        timed in the same run (a peak measured in a slow moment makes every share too large).
    what : str
        What ran at ``rate``, for the message.
    unit : str, default "GFLOP/s"

    Returns
    -------
    float
        The share, in (0, 1].

    Raises
    ------
    ValueError
        If a rate is not a positive finite number, or ``rate > peak``.

    Examples
    --------
    >>> share_of_peak(30.0, 120.0, "the lean forward")
    0.25
    """
    func = "share_of_peak"
    _check_positive(func, rate=rate, peak=peak)
    if rate > peak:
        raise fail(func, f"{what} ran at {rate:.1f} {unit}, {rate / peak:.0%} of the peak "
                         f"{peak:.1f} {unit}: no program outruns the machine's best matrix "
                         "product, so the peak was measured in a slow moment; take the best rate "
                         "of every product timed in this run, re-timed beside the others")
    return rate / peak


def share_of_roof(achieved: float, intensity: float, peak: float, bandwidth: float, what: str,
                  unit: str = "GFLOP/s") -> float:
    """Share of its roofline bound ``min(peak, bandwidth · intensity)``; refuses a point above it.

    Parameters
    ----------
    achieved : float
        The rate a step reached (FLOPs per second in ``unit``).
    intensity : float
        Its arithmetic intensity, FLOPs per byte moved through the memory ``bandwidth`` measures.
    peak, bandwidth : float
        The flat roof (``unit``) and the slanted one's slope (bytes per second in the matching
        unit: GB/s with GFLOP/s).
    what : str
        The step, for the message.
    unit : str, default "GFLOP/s"

    Returns
    -------
    float
        ``achieved / min(peak, bandwidth · intensity)``, in (0, 1].

    Raises
    ------
    ValueError
        If a number is not positive and finite, or the point lies above its roof.

    Examples
    --------
    >>> share_of_roof(5.0, 0.5, peak=100.0, bandwidth=20.0, what="softmax")
    0.5
    """
    func = "share_of_roof"
    _check_positive(func, achieved=achieved, intensity=intensity, peak=peak, bandwidth=bandwidth)
    roof = min(peak, bandwidth * intensity)
    if achieved > roof:
        limit = "peak" if roof == peak else f"bandwidth {bandwidth:.1f} x intensity {intensity:.3g}"
        raise fail(func, f"{what} is above its roof: achieved {achieved:.1f} {unit}, roof "
                         f"{roof:.1f} {unit} ({limit}); a measured point cannot beat the "
                         "roofline, so the peak or the bandwidth was measured badly (or the "
                         "intensity counts bytes the step does not move through that memory)")
    return achieved / roof


@dataclass(frozen=True)
class RoofPoint:
    """One step on a roofline: the timed call it comes from, its intensity, the memory it uses.

    ``timed`` names a call of :func:`measure_roofline` (two points may share one call, e.g. a
    softmax held to two memories); ``memory`` names the copy whose bandwidth is its slanted roof.
    """

    timed: str
    intensity: float
    memory: str


@dataclass(frozen=True)
class Roofline:
    """A roofline and its points, all from the same rounds (GFLOP/s, GB/s, shares in (0, 1])."""

    peak: float
    bandwidth: dict[str, float]
    achieved: dict[str, float]
    share: dict[str, float]
    rounds: int


def roofline_verdict(seconds: dict[str, float], work: dict[str, float], matmuls: Sequence[str],
                     copies: Sequence[str], points: dict[str, RoofPoint], rounds: int,
                     max_rounds: int) -> Roofline | None:
    """Decide from the best times so far: every point under its roof, measure more, or refuse.

    A pure function of plain numbers. The peak is the best rate of the matrix products, each
    bandwidth the rate of its copy, each point's rate its call's work over its best time.

    Parameters
    ----------
    seconds : dict of str -> float
        Best seconds per call of every timed call so far.
    work : dict of str -> float
        Work per call: FLOPs for a matrix product or a point's call, bytes for a copy.
    matmuls : sequence of str
        The matrix products (points may be among them): the flat roof is their best rate.
    copies : sequence of str
        The copies: each one's rate is the bandwidth of its memory.
    points : dict of str -> RoofPoint
    rounds, max_rounds : int
        Rounds timed so far, and the most there will be.

    Returns
    -------
    Roofline or None
        The roofline when every point is under its roof; ``None`` when one is above it and rounds
        remain (a roof timed in a slow moment rises with more rounds; a wrong point does not).

    Raises
    ------
    ValueError
        When a point is still above its roof after ``max_rounds`` rounds (from
        :func:`share_of_roof`), or a rate is not positive and finite.

    Examples
    --------
    >>> points = {"softmax": RoofPoint("softmax", 0.5, "copy")}
    >>> seconds = {"matmul": 1.0, "copy": 1.0, "softmax": 1.0}
    >>> work = {"matmul": 100e9, "copy": 20e9, "softmax": 5e9}
    >>> roofline_verdict(seconds, work, ["matmul"], ["copy"], points, 1, 3).share
    {'softmax': 0.5}
    >>> work["softmax"] = 15e9  # above its roof of 20 GB/s x 0.5 = 10 GFLOP/s
    >>> roofline_verdict(seconds, work, ["matmul"], ["copy"], points, 1, 3) is None
    True
    """
    rate = {name: work[name] / t / 1e9 if t > 0 else math.inf for name, t in seconds.items()}
    peak = max(rate[name] for name in matmuls)
    bandwidth = {name: rate[name] for name in copies}
    achieved = {name: rate[p.timed] for name, p in points.items()}
    above = [name for name, p in points.items()
             if achieved[name] > min(peak, bandwidth[p.memory] * p.intensity)]
    if above and rounds < max_rounds:
        return None  # time another round before judging
    share = {name: share_of_roof(achieved[name], p.intensity, peak, bandwidth[p.memory], name)
             for name, p in points.items()}  # raises for a point still above its roof
    return Roofline(peak, bandwidth, achieved, share, rounds)


def measure_roofline(calls: dict[str, Callable[[], object]], work: dict[str, float],
                     matmuls: Sequence[str], copies: Sequence[str],
                     points: dict[str, RoofPoint], rounds: int = 5, max_rounds: int = 20,
                     timer: Callable[[], float] = time.process_time) -> Roofline:
    """Time a roofline's probes and points in the same rounds, in turns; judge the best of each.

    ``rounds`` rounds first (every call once per round, in turns: the roof and the points see
    the same moments of the machine); then one more round at a time while
    :func:`roofline_verdict` finds a point above its roof, up to ``max_rounds``.

    Parameters
    ----------
    calls : dict of str -> callable taking no arguments
        Every call to time: the matrix products, the copies and the points' steps.
    work, matmuls, copies, points
        As in :func:`roofline_verdict`; every name must be a key of ``calls``.
    rounds : int, default 5
    max_rounds : int, default 20
    timer : callable returning seconds, default ``time.process_time``

    Returns
    -------
    Roofline

    Raises
    ------
    ValueError
        If a name is unknown, ``rounds`` exceeds ``max_rounds``, or a point is still above its
        roof after ``max_rounds`` rounds.
    """
    func = "measure_roofline"
    rounds = validate_positive_int(func, "rounds", rounds)
    max_rounds = validate_positive_int(func, "max_rounds", max_rounds, minimum=rounds)
    named = {"work": list(work), "matmuls": list(matmuls), "copies": list(copies),
             "points' timed calls": [p.timed for p in points.values()]}
    for what, names in named.items():
        unknown = sorted(set(names) - set(calls))
        if unknown:
            raise fail(func, f"{what} name {unknown} not in calls; expected one of {list(calls)}")
    unknown = sorted({p.memory for p in points.values()} - set(copies))
    if unknown or set(calls) - set(work):
        raise fail(func, f"every point's memory must be a copy and every call needs its work; "
                         f"got memories {unknown} not in copies, calls without work "
                         f"{sorted(set(calls) - set(work))}")
    best = _more_rounds(dict.fromkeys(calls, math.inf), calls, rounds, timer)
    done = rounds
    while (verdict := roofline_verdict(best, work, matmuls, copies, points, done,
                                       max_rounds)) is None:
        best = _more_rounds(best, calls, 1, timer)
        done += 1
    return verdict


def _check_positive(func: str, **numbers: float) -> None:
    for name, x in numbers.items():
        ok = isinstance(x, numbers_module.Real) and not isinstance(x, bool)
        if not (ok and math.isfinite(float(x)) and x > 0):
            raise fail(func, f"{name} must be a positive finite number, got {x!r}")
