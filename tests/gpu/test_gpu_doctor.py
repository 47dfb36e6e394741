"""``llmtrace doctor`` on this real machine (no GPU, real pynvml, real sockets), and its
--json shape. One test shows the per-device section with the one test double,
``RecordedBackend`` (gpu_recorded.py), since this machine has no device to list.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import os
import socket
from collections.abc import Iterator

import pytest

from llmtrace.cli import main
from llmtrace.cli._doctor import run_doctor
from llmtrace.gpu.doctor import INTEGRATIONS, collect, render, resolve_endpoint
from tests.gpu.gpu_recorded import RecordedBackend


def _has_nvml_library() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.fixture(autouse=True)
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> None:
    """No llmtrace or OTLP setting from the environment running the tests."""
    for name in list(os.environ):
        if name.startswith(("LLMTRACE_", "OTEL_")):
            monkeypatch.delenv(name)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


def test_json_shape_and_exit_status_with_a_reachable_collector(
    listener: socket.socket, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json prints one object with nvml/exporters/collector/integrations; exit 0 when the collector answers."""
    port = listener.getsockname()[1]
    code = run_doctor(argparse.Namespace(json=True, endpoint=f"http://127.0.0.1:{port}"))
    report = json.loads(capsys.readouterr().out)
    assert 0 == code
    assert {"llmtrace", "nvml", "exporters", "collector", "integrations"} == set(report)
    assert {
        "library_found",
        "driver_version",
        "unavailable",
        "cuda_visible_devices",
        "gpus",
        "mapped",
    } <= set(report["nvml"])
    assert (True, "127.0.0.1", port) == (report["collector"]["reachable"], report["collector"]["host"], port)
    assert set(INTEGRATIONS) == set(report["integrations"])
    assert importlib.metadata.version("opentelemetry-sdk") == report["integrations"]["opentelemetry-sdk"]


@pytest.mark.skipif(_has_nvml_library(), reason="this machine has libnvidia-ml.so")
def test_human_report_on_this_cpu_machine_names_the_missing_library(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Text output says the NVML library is missing and why telemetry is off; exit 1 when
    nothing listens on the collector port."""
    code = run_doctor(argparse.Namespace(json=False, endpoint=f"localhost:{_closed_port()}"))
    text = capsys.readouterr().out
    assert 1 == code
    assert "NVML library:      NOT FOUND" in text
    assert "no_nvml_library" in text
    assert "UNREACHABLE" in text
    assert f"torch                {importlib.metadata.version('torch')}" in text


def test_with_no_endpoint_the_report_names_the_trace_file(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing configured: spans go to the embedded default file, and the doctor says so instead
    of reporting an unreachable collector nobody asked for; exit 0."""
    code = main(["doctor"])
    text = capsys.readouterr().out
    assert 0 == code
    assert "Traces to:         file llmtrace-traces.jsonl (in the traced process's working directory)" in text
    assert "Collector:         none configured" in text
    assert "UNREACHABLE" not in text


def test_the_report_follows_llmtrace_exporter(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """LLMTRACE_EXPORTER=file:PATH is where spans go; --json has the exporters and no collector."""
    monkeypatch.setenv("LLMTRACE_EXPORTER", "file:/var/tmp/traces.jsonl")
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert (0, ["file:/var/tmp/traces.jsonl"], None) == (code, report["exporters"], report["collector"])


def test_an_endpoint_from_the_environment_is_still_checked(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """LLMTRACE_ENDPOINT set: spans go over OTLP, and a collector that refuses connections is
    UNREACHABLE with exit 1."""
    monkeypatch.setenv("LLMTRACE_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    code = main(["doctor"])
    text = capsys.readouterr().out
    assert 1 == code
    assert "Traces to:         the OTLP collector below" in text
    assert "UNREACHABLE" in text


def test_device_section_lists_mapping_and_supported_queries() -> None:
    """With devices, the report maps cuda ordinals to hw.gpu.id and marks each query."""
    backend = RecordedBackend()
    backend.devices[1]["unsupported"] = ["pcie_tx_kbps"]
    report = collect("localhost:1", backend=backend, environ={"CUDA_VISIBLE_DEVICES": "1"})
    (dev,) = report["nvml"]["mapped"]
    assert (dev["cuda_ordinal"], dev["hw.gpu.id"]) == (0, "1")
    assert "not supported" == dev["queries"]["pcie_tx"]["status"]
    assert "ok" == dev["queries"]["utilization"]["status"]
    assert report["nvml"]["driver_version"] != "recorded"
    assert "cuda:0 -> hw.gpu.id=1" in render(report)
    assert backend.inits == backend.shutdowns


@pytest.mark.parametrize(
    ("arg", "env", "expected"),
    [
        (None, {}, ("localhost", 4317)),
        (None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ("localhost", 4318)),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, ("collector", 4317)),
        (
            None,
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "b:2"},
            ("b", 2),
        ),
        (None, {"LLMTRACE_ENDPOINT": "c:3", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1"}, ("c", 3)),
        ("https://gw.example", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1"}, ("gw.example", 4317)),
    ],
)
def test_endpoint_resolution(arg: str | None, env: dict[str, str], expected: tuple[str, int]) -> None:
    """--endpoint, then LLMTRACE_ENDPOINT, then the OTLP traces/generic variables, then localhost."""
    assert expected == resolve_endpoint(arg, env)[1:]
