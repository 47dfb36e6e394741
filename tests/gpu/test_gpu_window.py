"""The O(1) window statistics agree with a direct scan of the samples, whatever the
window, across history copies (the "ring" wrapping), and for readers holding an old copy."""

from __future__ import annotations

import math
import random

import pytest

from llmtrace.gpu._window import Series
from llmtrace.semconv import HW_GPU_ID, HW_GPU_MEMORY_LIMIT

Attrs = dict[str, float | int | str]
PERIOD = 100
STALE = 2 * PERIOD


def _reference(samples: list[tuple[int, dict[str, float]]], cap: int, start: int, end: int) -> Attrs | None:
    """The spec, computed by scanning the newest ``cap`` samples (what Series.attributes must equal)."""
    kept = samples[-cap:]
    if end - start > PERIOD:
        inside = [row for t, row in kept if start <= t <= end]
        if inside:
            out: Attrs = {}
            for key in inside[0]:
                values = [row[key] for row in inside]
                out[key + ".mean"] = sum(values) / len(values)
                out[key + ".max"] = max(values)
            return out
    if not kept:
        return None
    mid = (start + end) // 2
    t, row = min(kept, key=lambda s: (abs(s[0] - mid), s[0]))  # a tie goes to the earlier sample
    if abs(t - mid) > (end - start) // 2 + STALE:
        return None
    return dict(row)


def _assert_matches(expected: Attrs | None, actual: Attrs | None) -> None:
    if expected is None:
        assert actual is None
        return
    assert actual is not None
    assert "0" == actual.pop(HW_GPU_ID)
    assert 7.0 == actual.pop(HW_GPU_MEMORY_LIMIT)
    assert expected.keys() == actual.keys()
    for key, value in expected.items():
        if key.endswith(".mean"):
            assert pytest.approx(value, rel=1e-12, abs=1e-12) == actual[key]
        else:
            assert value == actual[key]  # maxima and plain values are the samples themselves


def test_attributes_equal_a_direct_scan_for_random_windows_across_wraps() -> None:
    """Long and short spans, windows inside, straddling, before the first and after the
    last sample, with irregular sample times, while the history is copied many times."""
    rng = random.Random(11)
    cap = 16
    series = Series(cap)
    series.limit = 7.0
    samples: list[tuple[int, dict[str, float]]] = []
    t = 1_000
    for _ in range(7 * cap + 5):
        t += rng.choice((PERIOD, PERIOD, PERIOD - 7, PERIOD + 13, 3 * PERIOD))  # jitter and a stall
        row = {"x": rng.uniform(0, 100), "y": rng.uniform(-5, 5)}
        samples.append((t, row))
        series.append(t, row)
        first, last = samples[max(0, len(samples) - cap)][0], t
        for _ in range(25):
            start = rng.randint(first - 5 * PERIOD, last + 2 * PERIOD)
            end = start + rng.choice((0, 1, PERIOD // 5, PERIOD, PERIOD + 1, rng.randint(0, 30 * PERIOD)))
            _assert_matches(_reference(samples, cap, start, end), series.attributes(start, end, PERIOD, STALE, "0"))


@pytest.mark.parametrize("cap", [1, 2, 3, 5, 16, 33])
def test_every_retained_window_matches_brute_force_after_wrapping(cap: int) -> None:
    """mean(a..b) and max(a..b) by absolute index, for all windows still held, with
    capacities around the sparse table's level boundaries."""
    rng = random.Random(7)
    series = Series(cap)
    rows = [{"x": rng.uniform(0, 100), "y": rng.uniform(-5, 5)} for _ in range(5 * cap + 3)]
    for i, row in enumerate(rows):
        series.append(i, row)
    last = len(rows) - 1
    assert last - cap + 1 == series.oldest
    for a in range(series.oldest, last + 1):
        for b in range(a, last + 1):
            out = series.aggregate(a, b)
            for key in ("x", "y"):
                window = [r[key] for r in rows[a : b + 1]]
                assert abs(sum(window) / len(window) - float(out[key + ".mean"])) < 1e-9
                assert max(window) == out[key + ".max"]


def test_window_before_the_first_sample_gets_nothing_and_after_the_last_gets_the_newest() -> None:
    """A span ending before the first sample has no data; one just after the newest gets
    its plain values; one far after it (sampler stalled) gets nothing."""
    series = Series(8)
    series.limit = 7.0
    for i in range(5):
        series.append(1_000 + i * PERIOD, {"x": float(i)})
    assert series.attributes(0, 500, PERIOD, STALE, "0") is None
    assert {"x": 4.0, HW_GPU_MEMORY_LIMIT: 7.0, HW_GPU_ID: "0"} == series.attributes(1_450, 1_550, PERIOD, STALE, "0")
    assert series.attributes(1_400 + 10 * PERIOD, 1_400 + 12 * PERIOD, PERIOD, STALE, "0") is None


def test_a_span_longer_than_the_history_is_aggregated_over_what_is_kept() -> None:
    """Only the newest ``capacity`` samples count, however long the span."""
    series = Series(4)
    series.limit = 7.0
    for i in range(10):
        series.append(i * PERIOD, {"x": float(i)})
    out = series.attributes(-(10**12), 10**12, PERIOD, STALE, "0")
    assert out is not None
    assert (7.5, 9.0) == (out["x.mean"], out["x.max"])


def test_reader_holding_an_old_copy_still_answers_consistently() -> None:
    """A reader that loaded the history just before the writer replaced it keeps a
    consistent view: the old lists are never written again (no lock on the reader's path)."""
    series = Series(4)
    for i in range(4):
        series.append(i * PERIOD, {"x": float(i)})
    held = series._h
    for i in range(4, 20):
        series.append(i * PERIOD, {"x": float(i)})
    assert held is not series._h
    assert [0, 100, 200, 300, 400] == held.ts  # the fifth sample was appended, then copied
    assert (0.0, 0.0, 1.0, 3.0, 6.0, 10.0) == tuple(p[0] for p in held.prefix)


def test_group_series_keeps_separate_mean_and_max_inputs() -> None:
    """A group series averages one input and takes the maximum of the other."""
    series = Series(8)
    series.append(0, {"u": 10.0}, {"u": 30.0})
    series.append(1, {"u": 20.0}, {"u": 25.0})
    assert {"u.mean": 15.0, "u.max": 30.0} == series.aggregate(0, 1)


def test_missing_quantity_repeats_and_a_new_one_restarts_history() -> None:
    """A quantity absent from one sample carries its last value; a quantity never seen
    before restarts the series so no window mixes samples with and without it, and the
    quantities already known keep repeating their last value across the restart."""
    series = Series(8)
    series.append(0, {"u": 1.0})
    series.append(1, {})
    assert {"u": 1.0} == series.point(1)
    series.append(2, {"p": 5.0})
    assert ("u", "p") == series.keys
    assert (0, 0) == series.window(0, 10)
    assert {"u": 1.0, "p": 5.0} == series.point(0)


def test_nan_and_infinite_readings_are_skipped() -> None:
    """A quantity first seen as NaN is no key; a NaN or infinity later repeats the last
    good value, so no running sum is poisoned."""
    series = Series(8)
    series.append(0, {"u": 1.0, "bad": math.nan})
    series.append(1, {"u": math.nan})
    series.append(2, {"u": math.inf}, {"u": math.nan})
    series.append(3, {"u": 3.0})
    assert ("u",) == series.keys
    assert {"u.mean": 1.5, "u.max": 3.0} == series.aggregate(0, 3)


def test_window_and_nearest_by_index() -> None:
    """Samples inside [start, end] are found by bisection; nearest picks the closer neighbour."""
    series = Series(4)
    for t in (100, 200, 300, 400, 500, 600):
        series.append(t, {"x": 1.0})
    assert (3, 4) == series.window(350, 550)
    assert 2 == series.oldest  # capacity 4: indices 2..5 retained
    assert (2, 3) == series.window(0, 420)  # clipped to what is kept
    assert 4 == series.nearest(520)
    assert 5 == series.nearest(10_000)
    assert 2 == series.nearest(0)


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
    assert 5.0 == series.energy_between(1_000, 1_500, 0)


def test_energy_before_the_first_counter_reading_and_after_wrapping() -> None:
    """Samples before the first energy value do not count; after many history copies the
    interpolation uses the kept samples only."""
    series = Series(4)
    series.append(0, {})
    series.append(100, {}, None, 0.0)
    assert series.energy_at(50, 0) is None
    for i in range(2, 40):
        series.append(i * 100, {}, None, float(i - 1))  # 1 J per 100 ns
    assert pytest.approx(2.5) == series.energy_between(3_600, 3_850, 0)
    assert series.energy_at(3_400, 0) is None  # older than the kept samples


def test_energy_between_equals_the_difference_of_cumulative_energies() -> None:
    """The one-bisection shortcuts (both ends between the same two samples, or both after
    the newest) give exactly what two independent lookups give, across history copies."""
    rng = random.Random(5)
    series = Series(8)
    series.last_power_w = 250.0
    t, joules = 0, 0.0
    for _ in range(40):
        t += rng.choice((PERIOD, PERIOD - 3, 2 * PERIOD))
        joules += rng.uniform(0, 30)
        series.append(t, {}, None, joules)
        for _ in range(40):
            start = rng.randint(t - 12 * PERIOD, t + 3 * PERIOD)
            end = start + rng.choice((0, 1, PERIOD // 5, PERIOD, rng.randint(-PERIOD, 10 * PERIOD)))
            e0, e1 = series.energy_at(start, STALE), series.energy_at(end, STALE)
            expected = None if e0 is None or e1 is None else max(0.0, e1 - e0)
            assert expected == series.energy_between(start, end, STALE)
