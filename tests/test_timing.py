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


# ------------------------------------------------------------ the lab's honesty checks (07)
def test_share_of_peak_is_the_rate_over_the_peak():
    assert timing.share_of_peak(30.0, 120.0, "x") == 0.25
    assert timing.share_of_peak(120.0, 120.0, "x") == 1.0


def test_a_wrong_peak_makes_the_lab_table_fail_instead_of_printing_over_100_percent():
    # Lesson 07's committed table once printed lean_forward at 102.6 % and PyTorch at 113.7 % of
    # a 33 GFLOP/s "peak" measured in a slow moment; the lab calls share_of_peak, which refuses.
    with pytest.raises(ValueError, match=r"share_of_peak: PyTorch F\.sdpa ran at 37\.4 GFLOP/s, "
                                         r"113% of the peak 33\.0 GFLOP/s"):
        timing.share_of_peak(37.4, 33.0, "PyTorch F.sdpa")


def test_share_of_roof_under_the_flat_and_the_slanted_roof():
    assert timing.share_of_roof(50.0, 100.0, peak=100.0, bandwidth=10.0, what="matmul") == 0.5
    assert timing.share_of_roof(2.5, 0.5, peak=100.0, bandwidth=10.0, what="softmax") == 0.5


def test_a_wrong_peak_puts_the_roofline_point_above_its_roof_and_is_refused():
    # The committed roofline once showed projections at 282 % of a 33 GFLOP/s roof.
    with pytest.raises(ValueError, match=r"share_of_roof: projections is above its roof: "
                                         r"achieved 92\.9 GFLOP/s, roof 33\.0 GFLOP/s \(peak\)"):
        timing.share_of_roof(92.9, 56.9, peak=33.0, bandwidth=8.6, what="projections")
    with pytest.raises(ValueError, match=r"roof 4\.3 GFLOP/s \(bandwidth 8\.6 x intensity 0\.5\)"):
        timing.share_of_roof(5.0, 0.5, peak=33.0, bandwidth=8.6, what="softmax")


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "fast", True])
def test_shares_refuse_what_is_not_a_positive_number(bad):
    with pytest.raises(ValueError, match="share_of_peak: rate must be a positive finite number"):
        timing.share_of_peak(bad, 1.0, "x")
    with pytest.raises(ValueError, match="share_of_roof: bandwidth must be a positive finite"):
        timing.share_of_roof(1.0, 1.0, 1.0, bad, "x")


def test_numpy_floats_are_numbers_too():
    import numpy as np

    assert timing.share_of_peak(np.float32(1.0), np.float64(2.0), "x") == 0.5


def test_lesson_07s_timing_cells_check_what_they_print():
    """The performance lab's outputs are not compared by nbval, so the cells that print shares
    must compute them with the refusing functions above, the roofline (roof and points timed in
    the same rounds) before it is drawn, and every other timing cell must assert something about
    what it prints."""
    from pathlib import Path

    import nbformat

    path = (Path(__file__).resolve().parent.parent / "notebooks" / "deep_dives"
            / "07a_performance_lab.ipynb")
    nb = nbformat.read(path, as_version=4)
    ignored = [c.source for c in nb.cells if "nbval-ignore-output" in c.metadata.get("tags", [])]
    lab = [s for s in ignored if "% peak" in s]
    roof = [s for s in ignored if "of its roof" in s]
    assert len(lab) == 1 and "share_of_peak(" in lab[0]
    assert len(roof) == 1 and "measure_roofline(" in roof[0]
    assert roof[0].index("measure_roofline(") < roof[0].index("plt.subplots(")
    # Every ignored cell that times something or prints a share (not the tile stepper's widget
    # view, nor the count of contenders, which differs without PyTorch).
    timers = ("best_time(", "best_of_alternating(", "share_of_", "secs")
    timed = [s for s in ignored if any(k in s for k in timers)]
    assert len(timed) >= 5  # the lab, the peak, where the time goes, the roofline, the savings
    for source in timed:
        assert "assert " in source or "share_of_" in source or "measure_roofline(" in source, (
            source.splitlines()[0])


# ------------------------------------------- the roofline: roof and points from the same rounds
# Lesson 07's Run All once stopped on a loaded machine: "softmax, 5 passes is above its roof:
# achieved 1.3 GFLOP/s, roof 0.5 GFLOP/s (bandwidth 3.4 x intensity 0.156)": the bandwidth had
# been timed in a slow moment, the softmax in a fast one. These numbers replay it.
SOFTMAX = {"softmax, 5 passes": timing.RoofPoint("softmax", 5 / 32, "copy within L2")}
NAMES = {"matmuls": ["matmul"], "copies": ["copy within L2"], "points": SOFTMAX}
WORK = {"matmul": 50e9, "copy within L2": 1e9, "softmax": 1.3e9}  # per call: FLOPs, bytes


def seconds(copy_gb_per_s, softmax_gflop_per_s=1.3):
    return {"matmul": 1.0, "copy within L2": 1 / copy_gb_per_s,
            "softmax": 1.3 / softmax_gflop_per_s}


def test_a_point_above_a_roof_timed_slow_asks_for_another_round_while_rounds_remain():
    assert timing.roofline_verdict(seconds(3.4), WORK, **NAMES, rounds=5, max_rounds=20) is None


def test_once_the_roof_is_timed_fast_the_same_point_is_under_it():
    roof = timing.roofline_verdict(seconds(60.0), WORK, **NAMES, rounds=6, max_rounds=20)
    assert roof.share == {"softmax, 5 passes": pytest.approx(1.3 / (60.0 * 5 / 32))}
    assert roof.peak == 50.0 and roof.bandwidth == {"copy within L2": 60.0} and roof.rounds == 6


def test_a_point_still_above_its_roof_after_the_last_round_is_refused():
    with pytest.raises(ValueError, match=r"share_of_roof: softmax, 5 passes is above its roof: "
                                         r"achieved 1\.3 GFLOP/s, roof 0\.5 GFLOP/s "
                                         r"\(bandwidth 3\.4 x intensity 0\.156\)"):
        timing.roofline_verdict(seconds(3.4), WORK, **NAMES, rounds=20, max_rounds=20)


def test_the_peak_is_the_best_of_every_matrix_product_including_the_points():
    points = {"scores": timing.RoofPoint("scores", 28.4, "copy within L2")}
    roof = timing.roofline_verdict({"matmul": 1.0, "copy within L2": 0.1, "scores": 0.5},
                                   {"matmul": 40e9, "copy within L2": 1e9, "scores": 30e9},
                                   ["matmul", "scores"], ["copy within L2"], points, 1, 1)
    assert roof.peak == 60.0 and roof.share == {"scores": 1.0}


class FakeClock:
    """A clock that moves only when a scripted call says how long it took."""

    def __init__(self):
        self.now, self.log = 0.0, []

    def __call__(self):
        return self.now

    def call(self, name, durations):
        durations = iter(durations)

        def run():
            self.log.append(name)
            self.now += next(durations)
        return run


def fake_roofline(clock, copy_durations, softmax_seconds=1.0):
    calls = {"matmul": clock.call("matmul", [1.0] * 50),
             "copy within L2": clock.call("copy within L2", copy_durations),
             "softmax": clock.call("softmax", [softmax_seconds] * 50)}
    return calls


def test_measure_roofline_times_roof_and_points_in_turns_and_adds_rounds_until_the_roof_rises():
    clock = FakeClock()
    # the copy is slow (3.4 GB/s) in the first three rounds, fast (60 GB/s) from the fourth on
    calls = fake_roofline(clock, [1 / 3.4] * 3 + [1 / 60] * 47)
    roof = timing.measure_roofline(calls, WORK, **NAMES, rounds=2, max_rounds=8, timer=clock)
    assert clock.log == ["matmul", "copy within L2", "softmax"] * 4  # interleaved, 2 + 1 + 1 rounds
    assert roof.rounds == 4
    assert roof.bandwidth == {"copy within L2": pytest.approx(60.0)}
    assert roof.share["softmax, 5 passes"] == pytest.approx(1.3 / (60.0 * 5 / 32))


def test_measure_roofline_refuses_a_point_above_its_roof_in_every_round():
    clock = FakeClock()
    calls = fake_roofline(clock, [1 / 60] * 50, softmax_seconds=1.3 / 20)  # 20 GFLOP/s > 9.4
    with pytest.raises(ValueError, match=r"softmax, 5 passes is above its roof: achieved 20\.0"):
        timing.measure_roofline(calls, WORK, **NAMES, rounds=2, max_rounds=6, timer=clock)
    assert len(clock.log) == 3 * 6  # it tried every round it was allowed


def test_measure_roofline_stops_after_its_first_rounds_when_every_point_is_under_its_roof():
    clock = FakeClock()
    roof = timing.measure_roofline(fake_roofline(clock, [1 / 60] * 50), WORK, **NAMES, rounds=3,
                                   timer=clock)
    assert roof.rounds == 3 and len(clock.log) == 9


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"matmuls": ["gemm"]}, r"measure_roofline: matmuls name \['gemm'\] not in calls"),
        ({"points": {"p": timing.RoofPoint("softmax", 1.0, "dram")}},
         r"memories \['dram'\] not in copies"),
        ({"rounds": 9, "max_rounds": 3}, r"measure_roofline: max_rounds=3 must be an integer >= 9"),
    ],
)
def test_measure_roofline_refuses_names_it_cannot_match(change, message):
    arguments = {**NAMES, "rounds": 1, "max_rounds": 2, **change}
    with pytest.raises(ValueError, match=message):
        timing.measure_roofline(fake_roofline(FakeClock(), [1.0] * 5), WORK, **arguments)
