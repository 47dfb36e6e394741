"""No GPU here: the sampler says once which of the three cases applies, reports
``available = False``, and nothing raises.

The first tests use the *real* pynvml on this CPU-only machine (no libnvidia-ml.so);
the rest use the one test double, ``RecordedBackend`` (gpu_recorded.py), to play the
driver-missing / zero-GPU / all-hidden cases.
"""

from __future__ import annotations

import ctypes
import logging
import sys

import pytest

import llmtrace.gpu._state as state_mod
from llmtrace.gpu.backend import NvmlUnavailable, PynvmlBackend, Unavailable
from llmtrace.gpu.sampler import GpuSampler, SamplerState, get_sampler, start_sampler, stop_sampler
from tests.gpu.gpu_recorded import RecordedBackend, inventory


def _has_nvml_library() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


needs_no_nvml = pytest.mark.skipif(_has_nvml_library(), reason="this machine has libnvidia-ml.so")


@pytest.fixture(autouse=True)
def _fresh_announcements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_mod, "_ANNOUNCED", set())


@needs_no_nvml
def test_real_pynvml_without_library_reports_no_nvml_library_once(caplog: pytest.LogCaptureFixture) -> None:
    """Real pynvml, no libnvidia-ml.so: NO_NVML_LIBRARY, one log line for two samplers."""
    with caplog.at_level(logging.INFO, logger="llmtrace.gpu"):
        first, second = GpuSampler(), GpuSampler()
        assert not first.open()
        assert not second.open()
    status = first.status()
    assert (status.state, status.unavailable) == (SamplerState.UNAVAILABLE, Unavailable.NO_NVML_LIBRARY)
    assert "libnvidia-ml.so.1" in status.detail
    lines = [r.getMessage() for r in caplog.records]
    assert 1 == len(lines)
    assert "no_nvml_library" in lines[0] and "llmtrace.gpu.available=0" in lines[0]
    assert not first.available
    assert {} == first.span_attributes(0, 10**9)


def test_missing_nvidia_ml_py_package_is_no_nvml_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the nvidia-ml-py package the real backend reports NO_NVML_LIBRARY."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NvmlUnavailable) as info:
        PynvmlBackend().init()
    assert info.value.reason == Unavailable.NO_NVML_LIBRARY
    assert "nvidia-ml-py" in info.value.detail


@needs_no_nvml
def test_start_sampler_on_this_machine_returns_an_unavailable_sampler() -> None:
    """The process singleton starts, finds no NVML, and its thread exits; no exception."""
    sampler = start_sampler(0.1, required=True)
    try:
        assert not sampler.wait_ready(5)
        assert get_sampler() is sampler
        assert sampler.status().state == SamplerState.UNAVAILABLE
    finally:
        stop_sampler()
    assert get_sampler() is None
    assert "llmtrace-gpu-sampler" not in [t.name for t in __import__("threading").enumerate()]


@pytest.mark.parametrize(
    ("backend", "visible", "reason"),
    [
        (RecordedBackend(init_error=NvmlUnavailable(Unavailable.NO_GPU, "driver not loaded")), "0", "no_gpu"),
        (RecordedBackend(inventory([])), None, "no_gpu"),
        (RecordedBackend(inventory(["GPU-aa", "GPU-bb"])), "", "no_visible_device"),
        (RecordedBackend(inventory(["GPU-aa", "GPU-bb"])), "GPU-cc", "no_visible_device"),
    ],
)
def test_each_unavailable_case_is_named(
    backend: RecordedBackend, visible: str | None, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Driver missing, zero GPUs, all hidden: each says its own reason once, at INFO."""
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    with caplog.at_level(logging.INFO, logger="llmtrace.gpu"):
        for _ in range(3):
            sampler = GpuSampler(backend=backend, environ=env)
            assert not sampler.open()
    assert reason == sampler.status().unavailable.value
    assert [reason] == [r.getMessage().split("(")[1].split(")")[0] for r in caplog.records]
    assert [logging.INFO] == [r.levelno for r in caplog.records]
    assert backend.inits == backend.shutdowns  # NVML released when there is nothing to sample


def test_required_gpu_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """instrument(gpu='on') -> required=True: the missing GPU is a warning."""
    backend = RecordedBackend(inventory(["GPU-aa"]))
    with caplog.at_level(logging.INFO, logger="llmtrace.gpu"):
        GpuSampler(backend=backend, environ={"CUDA_VISIBLE_DEVICES": ""}, unavailable_log_level=logging.WARNING).open()
    assert [logging.WARNING] == [r.levelno for r in caplog.records]


def test_pynvml_errors_translate_to_the_seam_vocabulary() -> None:
    """Real pynvml error classes map to QueryNotSupported / DeviceGone / QueryFailed."""
    import pynvml

    from llmtrace.gpu.backend import DeviceGone, QueryFailed, QueryNotSupported, _translate

    cases = {
        pynvml.NVML_ERROR_NOT_SUPPORTED: QueryNotSupported,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: QueryNotSupported,
        pynvml.NVML_ERROR_NO_PERMISSION: QueryNotSupported,
        pynvml.NVML_ERROR_GPU_IS_LOST: DeviceGone,
        pynvml.NVML_ERROR_RESET_REQUIRED: DeviceGone,
        pynvml.NVML_ERROR_UNKNOWN: QueryFailed,
        pynvml.NVML_ERROR_TIMEOUT: QueryFailed,
    }
    for code, expected in cases.items():
        assert expected is type(_translate(pynvml, pynvml.NVMLError(code)))


def test_start_sampler_is_idempotent_and_replaces_on_new_settings() -> None:
    """Same settings return the running singleton; a new interval stops it and starts another."""
    backend = RecordedBackend()
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    try:
        first = start_sampler(0.05, backend=backend, environ=env)
        assert first.wait_ready(5)
        assert first is start_sampler(0.05, backend=backend, environ=env)
        second = start_sampler(0.02, backend=backend, environ=env)
        assert second is not first
        assert SamplerState.STOPPED == first.status().state
        assert second.wait_ready(5)
    finally:
        stop_sampler()
