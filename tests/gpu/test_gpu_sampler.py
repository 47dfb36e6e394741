"""GpuSampler logic, driven pass by pass through the NVML seam.

Every test here uses the one test double, ``RecordedBackend`` (gpu_recorded.py): a
recorded device model replayed through the ``NvmlBackend`` Protocol, with a controlled
monotonic clock so that pass k happens at ``T0 + k * 100 ms``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from llmtrace.gpu.sampler import GpuSampler, SamplerState, split_energy_by_tokens
from llmtrace.semconv import (
    HW_GPU_ID,
    HW_GPU_MEMORY_LIMIT,
    HW_GPU_MEMORY_USAGE,
    HW_GPU_POWER,
    HW_GPU_UTILIZATION,
)
from tests.gpu.gpu_recorded import FakeClock, RecordedBackend, load_recording

STEP = 100_000_000


def _sampler(backend: RecordedBackend, visible: str = "0", **kw: Any) -> tuple[GpuSampler, FakeClock]:
    clock = FakeClock(step_ns=STEP)
    sampler = GpuSampler(
        0.1, backend=backend, environ={"CUDA_VISIBLE_DEVICES": visible}, clock=clock, slow_every=1, **kw
    )
    assert sampler.open()
    sampler._state = SamplerState.RUNNING  # driven by hand instead of by the thread
    return sampler, clock


def _passes(sampler: GpuSampler, clock: FakeClock, n: int) -> list[int]:
    times = []
    for _ in range(n):
        times.append(clock())
        sampler.sample_once()
        clock.tick()
    return times


def _recorded(device: int, field: str, ks: range) -> list[Any]:
    samples = load_recording()["devices"][device]["samples"]
    return [samples[k][field] for k in ks]


def test_long_span_gets_mean_and_max_over_its_own_window() -> None:
    """A span covering passes 5..14 (idle then busy) gets .mean/.max over exactly those samples."""
    sampler, clock = _sampler(RecordedBackend())
    t = _passes(sampler, clock, 30)
    attrs = sampler.span_attributes(t[5], t[14])
    util = [u / 100 for u, _m in _recorded(0, "utilization", range(5, 15))]
    power = [p / 1000 for p in _recorded(0, "power_mw", range(5, 15))]
    assert "0" == attrs[HW_GPU_ID]
    assert pytest.approx(sum(util) / len(util)) == attrs[HW_GPU_UTILIZATION + ".mean"]
    assert max(util) == attrs[HW_GPU_UTILIZATION + ".max"]
    assert pytest.approx(sum(power) / len(power)) == attrs[HW_GPU_POWER + ".mean"]
    assert max(power) == attrs[HW_GPU_POWER + ".max"]
    assert 150754820096 == attrs[HW_GPU_MEMORY_LIMIT]
    assert HW_GPU_UTILIZATION not in attrs


def test_short_span_gets_the_nearest_snapshot() -> None:
    """A span shorter than one period gets the plain keys of the sample nearest its middle."""
    sampler, clock = _sampler(RecordedBackend())
    t = _passes(sampler, clock, 30)
    attrs = sampler.span_attributes(t[20] + 10_000_000, t[20] + 30_000_000)
    assert _recorded(0, "power_mw", range(20, 21))[0] / 1000 == attrs[HW_GPU_POWER]
    assert 1.0 == attrs[HW_GPU_UTILIZATION]
    assert not any(k.endswith((".mean", ".max")) for k in attrs)


def test_stale_nearest_snapshot_is_not_attached() -> None:
    """A short span long after the last sample (sampler stalled) gets no GPU attributes."""
    sampler, clock = _sampler(RecordedBackend())
    t = _passes(sampler, clock, 5)
    assert {} == sampler.span_attributes(t[4] + 10 * STEP, t[4] + 10 * STEP + 1_000)


def test_device_group_sums_power_and_memory_and_averages_utilisation() -> None:
    """With two devices, power/memory are summed per pass; utilisation averaged, max = hottest device."""
    sampler, clock = _sampler(RecordedBackend(), visible="0,1")
    t = _passes(sampler, clock, 30)
    attrs = sampler.span_attributes(t[12], t[20])
    ks = range(12, 21)
    p0, p1 = _recorded(0, "power_mw", ks), _recorded(1, "power_mw", ks)
    u0 = [u / 100 for u, _ in _recorded(0, "utilization", ks)]
    u1 = [u / 100 for u, _ in _recorded(1, "utilization", ks)]
    sums = [(a + b) / 1000 for a, b in zip(p0, p1, strict=True)]
    assert "0,1" == attrs[HW_GPU_ID]
    assert pytest.approx(sum(sums) / len(sums)) == attrs[HW_GPU_POWER + ".mean"]
    assert pytest.approx(max(sums)) == attrs[HW_GPU_POWER + ".max"]
    assert pytest.approx(sum(u0 + u1) / (2 * len(ks))) == attrs[HW_GPU_UTILIZATION + ".mean"]
    assert max(u0 + u1) == attrs[HW_GPU_UTILIZATION + ".max"]
    assert 2 * 150754820096 == attrs[HW_GPU_MEMORY_LIMIT]


def test_device_indices_select_one_device_by_cuda_ordinal() -> None:
    """device_indices=[1] annotates with cuda:1 only (hw.gpu.id of that device)."""
    sampler, clock = _sampler(RecordedBackend(), visible="1,0")
    t = _passes(sampler, clock, 20)
    attrs = sampler.span_attributes(t[2], t[8], device_indices=[1])
    used = _recorded(0, "memory", range(2, 9))
    assert "0" == attrs[HW_GPU_ID]  # cuda:1 is physical GPU 0 under CUDA_VISIBLE_DEVICES=1,0
    assert max(u for u, _t in used) == attrs[HW_GPU_MEMORY_USAGE + ".max"]


def test_unsupported_query_is_asked_once_then_skipped(caplog: pytest.LogCaptureFixture) -> None:
    """A query the device answers NOT_SUPPORTED is tried on the first pass only, and its
    keys never appear; the other queries keep working."""
    backend = RecordedBackend()
    backend.devices[0]["unsupported"] = ["power_mw"]
    sampler, clock = _sampler(backend)
    with caplog.at_level(logging.WARNING, logger="llmtrace.gpu"):
        t = _passes(sampler, clock, 10)
    assert ("power",) == sampler.status().unsupported["0"]
    attrs = sampler.span_attributes(t[1], t[8])
    assert HW_GPU_POWER + ".mean" not in attrs
    assert HW_GPU_UTILIZATION + ".mean" in attrs
    assert [] == [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_unsupported_query_costs_no_further_calls() -> None:
    """After the first NOT_SUPPORTED, the backend method is not called again."""

    class Counting(RecordedBackend):
        power_calls = 0

        def power_mw(self, handle: object) -> int:
            Counting.power_calls += 1
            return int(super().power_mw(handle))

    backend = Counting()
    backend.devices[0]["unsupported"] = ["power_mw"]
    sampler, clock = _sampler(backend)
    _passes(sampler, clock, 10)
    assert 1 == Counting.power_calls


def test_lost_device_is_logged_once_and_omitted(caplog: pytest.LogCaptureFixture) -> None:
    """GPU lost mid-run: one warning, no exception from passes or readers, and spans after
    the loss carry no attributes of that device while the other device keeps reporting."""
    backend = RecordedBackend()
    sampler, clock = _sampler(backend, visible="0,1")
    _passes(sampler, clock, 5)
    backend.lost.add(1)
    with caplog.at_level(logging.WARNING, logger="llmtrace.gpu"):
        t = _passes(sampler, clock, 10)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 == len(warnings)
    assert "GPU 1" in warnings[0] and "lost" in warnings[0]
    assert ("1",) == sampler.status().lost_devices
    assert sampler.available
    attrs = sampler.span_attributes(t[2], t[8])
    assert "0" == attrs[HW_GPU_ID]
    assert {} == sampler.span_attributes(t[2], t[8], device_indices=[1])
    assert sampler.energy_j(t[2], t[8], device_indices=[1]) is None


def test_span_across_a_device_loss_aggregates_what_each_pass_had() -> None:
    """A device lost in the middle of a span: the group's passes before the loss sum both
    devices' power, the passes after only the survivor's; hw.gpu.id names the survivor."""
    backend = RecordedBackend()
    sampler, clock = _sampler(backend, visible="0,1")
    t = _passes(sampler, clock, 10)
    backend.lost.add(1)
    t += _passes(sampler, clock, 10)
    p0, p1 = _recorded(0, "power_mw", range(20)), _recorded(1, "power_mw", range(10))
    per_pass = [(p0[k] + p1[k]) / 1000 for k in range(5, 10)] + [p0[k] / 1000 for k in range(10, 15)]
    attrs = sampler.span_attributes(t[5], t[14])
    assert "0" == attrs[HW_GPU_ID]
    assert pytest.approx(sum(per_pass) / len(per_pass)) == attrs[HW_GPU_POWER + ".mean"]
    assert max(per_pass) == attrs[HW_GPU_POWER + ".max"]


def test_only_device_lost_leaves_spans_bare_but_past_energy_known() -> None:
    """With its only device lost, the sampler attaches nothing to spans, while a step
    taken before the loss still gets its energy from the device's history."""
    backend = RecordedBackend()
    sampler, clock = _sampler(backend)
    t = _passes(sampler, clock, 10)
    backend.lost.add(0)
    _passes(sampler, clock, 2)
    e = _recorded(0, "energy_mj", range(10))
    assert {} == sampler.span_attributes(t[2], t[8])
    assert pytest.approx((e[8] - e[2]) / 1000) == sampler.energy_j(t[2], t[8])


def test_nan_readings_are_skipped_and_the_last_good_value_stands() -> None:
    """A device answering NaN for power on every third pass: those passes repeat the
    previous power, so the span's mean and max stay finite and exact."""

    class NanPower(RecordedBackend):
        def power_mw(self, handle: object) -> int:
            value = super().power_mw(handle)
            return float("nan") if self.calls[(handle, "power_mw")] % 3 == 0 else value  # type: ignore[return-value]

    sampler, clock = _sampler(NanPower())
    t = _passes(sampler, clock, 20)
    p = [w / 1000 for w in _recorded(0, "power_mw", range(20))]
    seen: list[float] = []
    for k in range(20):
        seen.append(seen[-1] if (k + 1) % 3 == 0 else p[k])
    attrs = sampler.span_attributes(t[4], t[15])
    assert pytest.approx(sum(seen[4:16]) / 12) == attrs[HW_GPU_POWER + ".mean"]
    assert max(seen[4:16]) == attrs[HW_GPU_POWER + ".max"]


def test_device_failing_every_query_three_passes_is_declared_lost(caplog: pytest.LogCaptureFixture) -> None:
    """Unknown errors on every query: each (query, error) logged once, lost after 3 passes."""
    backend = RecordedBackend()
    sampler, clock = _sampler(backend)
    _passes(sampler, clock, 3)
    backend.failing.add(0)
    with caplog.at_level(logging.WARNING, logger="llmtrace.gpu"):
        _passes(sampler, clock, 6)
    messages = [r.getMessage() for r in caplog.records]
    assert 1 == sum("lost" not in m and "utilization failed" in m for m in messages)
    assert 1 == sum("3 passes in a row" in m for m in messages)
    assert not sampler.available


def test_energy_is_the_counter_delta_interpolated_between_samples() -> None:
    """energy_j over [t5, t15] equals the recorded counter difference (mJ -> J); a
    half-period shift interpolates linearly."""
    sampler, clock = _sampler(RecordedBackend())
    t = _passes(sampler, clock, 30)
    e = _recorded(0, "energy_mj", range(30))
    assert pytest.approx((e[15] - e[5]) / 1000) == sampler.energy_j(t[5], t[15])
    half = STEP // 2
    expected = ((e[15] + e[16]) / 2 - (e[5] + e[6]) / 2) / 1000
    assert pytest.approx(expected) == sampler.energy_j(t[5] + half, t[15] + half)
    assert "counter" == sampler.status().energy_source["0"]


def test_group_energy_sums_device_counters_and_survives_a_lost_device() -> None:
    """Two devices: energy_j is the sum of both counter deltas; after device 1 is lost the
    total keeps only device 0's increments and never goes backwards."""
    backend = RecordedBackend()
    sampler, clock = _sampler(backend, visible="0,1")
    t = _passes(sampler, clock, 10)
    backend.lost.add(1)
    t += _passes(sampler, clock, 10)
    e0, e1 = _recorded(0, "energy_mj", range(20)), _recorded(1, "energy_mj", range(20))
    assert pytest.approx((e0[8] - e0[2] + e1[8] - e1[2]) / 1000) == sampler.energy_j(t[2], t[8])
    assert pytest.approx((e0[8] - e0[2]) / 1000) == sampler.energy_j(t[2], t[8], device_indices=[0])
    assert pytest.approx((e0[15] - e0[5] + e1[9] - e1[5]) / 1000) == sampler.energy_j(t[5], t[15])


def test_energy_falls_back_to_power_integration_without_a_counter() -> None:
    """A device without the energy counter integrates power (trapezoid) instead."""
    backend = RecordedBackend()
    backend.devices[0]["unsupported"] = ["energy_mj"]
    sampler, clock = _sampler(backend)
    t = _passes(sampler, clock, 30)
    p = [w / 1000 for w in _recorded(0, "power_mw", range(30))]
    expected = sum((p[k] + p[k + 1]) / 2 * 0.1 for k in range(5, 15))
    assert pytest.approx(expected) == sampler.energy_j(t[5], t[15])
    assert "power_integration" == sampler.status().energy_source["0"]


def test_split_energy_by_tokens_is_proportional_and_sums_to_total() -> None:
    """Each request's share follows its token count; equal shares when all counts are 0."""
    assert {"a": 3.0, "b": 1.0} == split_energy_by_tokens(4.0, {"a": 3, "b": 1})
    assert {"a": 1.0, "b": 1.0} == split_energy_by_tokens(2.0, {"a": 0, "b": 0})
    assert {} == split_energy_by_tokens(2.0, {})


def test_thread_samples_and_stop_really_stops() -> None:
    """start() runs a named daemon thread that samples; stop() joins it and releases NVML."""
    backend = RecordedBackend()
    sampler = GpuSampler(0.01, backend=backend, environ={"CUDA_VISIBLE_DEVICES": "0"})
    with sampler:
        assert sampler.wait_ready(5)
        deadline = time.monotonic() + 5
        while sampler.status().passes < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        names = [th.name for th in threading.enumerate()]
        assert "llmtrace-gpu-sampler" in names
    assert sampler.status().state == SamplerState.STOPPED
    assert "llmtrace-gpu-sampler" not in [th.name for th in threading.enumerate()]
    passes = sampler.status().passes
    time.sleep(0.05)
    assert passes == sampler.status().passes
    assert 1 == backend.shutdowns
    assert sampler.status().passes >= 5


def test_readers_never_raise() -> None:
    """span_attributes / energy_j on a sampler with no data answer empty, not an exception."""
    sampler = GpuSampler(0.1, backend=RecordedBackend(), environ={"CUDA_VISIBLE_DEVICES": "0"})
    assert {} == sampler.span_attributes(0, 10**9)
    assert sampler.energy_j(0, 10**9) is None
    sampler.open()
    assert {} == sampler.span_attributes(0, 10**9)
    assert sampler.energy_j(0, 10**9) is None


def test_readers_concurrent_with_a_wrapping_ring_stay_consistent() -> None:
    """While the thread samples every 1 ms into a 16-slot ring (wrapping and trimming
    constantly), concurrent span_attributes/energy_j calls never raise and never return
    values outside what the device reported."""
    backend = RecordedBackend()
    sampler = GpuSampler(0.001, backend=backend, environ={"CUDA_VISIBLE_DEVICES": "0"}, capacity=16)
    max_power = max(_recorded(0, "power_mw", range(60))) / 1000
    calls = 0
    with sampler:
        assert sampler.wait_ready(5)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            now = time.monotonic_ns()
            attrs = sampler.span_attributes(now - 8_000_000, now)
            energy = sampler.energy_j(now - 8_000_000, now)
            calls += 1
            if attrs:
                assert "0" == attrs[HW_GPU_ID]
                if HW_GPU_POWER in attrs:  # no sample inside the window: the nearest one
                    assert 0 < float(attrs[HW_GPU_POWER]) <= max_power
                else:
                    assert 0 < float(attrs[HW_GPU_POWER + ".max"]) <= max_power
                    assert float(attrs[HW_GPU_POWER + ".mean"]) <= float(attrs[HW_GPU_POWER + ".max"]) + 1e-9
            assert energy is None or energy >= 0
    assert calls > 100
    assert sampler.status().passes > 16


def test_lock_free_readers_see_matching_ids_and_values_while_a_device_is_lost() -> None:
    """Readers (no lock) racing a 1 ms sampler over a 16-sample history while one of two
    devices is lost: every answer names a device set that existed and has mean <= max."""
    backend = RecordedBackend()
    sampler = GpuSampler(0.001, backend=backend, environ={"CUDA_VISIBLE_DEVICES": "0,1"}, capacity=16)
    answers = 0
    with sampler:
        assert sampler.wait_ready(5)
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline:
            if time.monotonic() > deadline - 0.2:
                backend.lost.add(1)
            now = time.monotonic_ns()
            attrs = sampler.span_attributes(now - 10_000_000, now)
            if attrs:
                answers += 1
                assert attrs[HW_GPU_ID] in ("0,1", "0")
                if HW_GPU_POWER + ".max" in attrs:
                    assert float(attrs[HW_GPU_POWER + ".mean"]) <= float(attrs[HW_GPU_POWER + ".max"]) + 1e-9
    assert answers > 0
    assert ("1",) == sampler.status().lost_devices
