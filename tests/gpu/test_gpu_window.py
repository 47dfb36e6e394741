"""The O(1) window statistics agree with a brute-force scan, across ring wrap-around."""

from __future__ import annotations

import random

from llmtrace.gpu._window import Series, Timeline


def test_window_mean_and_max_match_brute_force_over_every_retained_window() -> None:
    """mean(a..b) and max(a..b) of each quantity equal a direct computation for all
    windows still held, after the ring has wrapped several times."""
    rng = random.Random(7)
    cap = 16
    series = Series(cap)
    rows = [{"x": rng.uniform(0, 100), "y": rng.uniform(-5, 5)} for _ in range(5 * cap + 3)]
    for i, row in enumerate(rows):
        series.append(i, row)
    last = len(rows) - 1
    for a in range(last - cap + 1, last + 1):
        for b in range(a, last + 1):
            out: dict[str, float | int | str] = {}
            series.aggregate(a, b, out)
            for key in ("x", "y"):
                window = [r[key] for r in rows[a : b + 1]]
                assert abs(sum(window) / len(window) - float(out[key + ".mean"])) < 1e-9
                assert max(window) == out[key + ".max"]


def test_group_series_keeps_separate_mean_and_max_inputs() -> None:
    """A group series averages one input and takes the maximum of the other."""
    series = Series(8)
    series.append(0, {"u": 10.0}, {"u": 30.0})
    series.append(1, {"u": 20.0}, {"u": 25.0})
    out: dict[str, float | int | str] = {}
    series.aggregate(0, 1, out)
    assert {"u.mean": 15.0, "u.max": 30.0} == out


def test_missing_quantity_repeats_and_a_new_one_restarts_history() -> None:
    """A quantity absent from one sample carries its last value; a quantity never seen
    before restarts the series so no window mixes samples with and without it."""
    series = Series(8)
    series.append(0, {"u": 1.0})
    series.append(1, {})
    out: dict[str, float | int | str] = {}
    series.point(1, out)
    assert {"u": 1.0} == out
    series.append(2, {"u": 2.0, "p": 5.0})
    assert ("u", "p") == series.keys
    assert (0, 0) == series.timeline.window(0, 10)


def test_timeline_window_and_nearest() -> None:
    """Samples inside [start, end] are found by bisection; nearest picks the closer neighbour."""
    tl = Timeline(4)
    for t in (100, 200, 300, 400, 500, 600):
        tl.append(t)
    assert (3, 4) == tl.window(350, 550)
    assert 2 == tl.oldest  # capacity 4: indices 2..5 retained
    assert (2, 3) == tl.window(0, 420)  # clipped to what the ring still holds
    assert 4 == tl.nearest(520)
    assert 5 == tl.nearest(10_000)


def test_series_energy_interpolates_and_extrapolates_within_slack() -> None:
    """Cumulative energy is linear between samples and extrapolated with the last power
    reading for at most the allowed slack."""
    series = Series(8)
    series.last_power_w = 100.0
    series.append(1_000, {}, {}, 0.0)
    series.append(2_000, {}, {}, 10.0)
    assert 5.0 == series.energy_at(1_500, 0)
    assert abs(10.0 + 100.0 * 500 / 1e9 - (series.energy_at(2_500, 1_000) or 0)) < 1e-12
    assert series.energy_at(5_000, 1_000) is None
    assert series.energy_at(500, 1_000) is None
