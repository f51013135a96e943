"""The timing helpers of lesson 01: what they return and what they refuse (never how fast)."""

from __future__ import annotations

import pytest

from mha_course import timing


class Counter:
    """A callable that counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return sum(range(200))


def test_best_time_calls_number_times_per_run_and_returns_seconds_per_call():
    fn = Counter()
    t = timing.best_time(fn, repeat=3, number=4, budget=float("inf"))
    assert fn.calls == 12
    assert 0 <= t < 1


def test_best_time_stops_repeating_once_the_budget_is_spent():
    fn = Counter()
    timing.best_time(fn, repeat=50, number=1, budget=-1.0)  # spent > budget after one run
    assert fn.calls == 1


def test_best_of_alternating_times_each_function_once_per_round_in_turns():
    order = []
    functions = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    best = timing.best_of_alternating(functions, rounds=2)
    assert order == ["a", "b", "c", "a", "b", "c"]
    assert list(best) == ["a", "b", "c"]
    assert all(t >= 0 for t in best.values())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: timing.best_time(3), "best_time: fn must be callable, got int"),
        (lambda: timing.best_time(Counter(), repeat=0), r"best_time: repeat=0 must be an integer"),
        (lambda: timing.best_time(Counter(), number=1.5), r"best_time: number=1.5 must be an"),
        (lambda: timing.best_of_alternating({}), "best_of_alternating: functions is empty"),
        (lambda: timing.best_of_alternating({"a": Counter()}, rounds=0),
         "best_of_alternating: rounds=0 must be an integer"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_function(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_one_blas_thread_limits_blas_when_threadpoolctl_is_there():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with timing.one_blas_thread() as limited:
        assert limited is True
        blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
        assert all(i["num_threads"] == 1 for i in blas)


def test_one_blas_thread_without_threadpoolctl_yields_false(monkeypatch):
    monkeypatch.setattr(timing, "threadpool_limits", None)
    with timing.one_blas_thread() as limited:
        assert limited is False
