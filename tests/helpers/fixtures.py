"""pytest plugin (registered in tests/conftest.py): the tiny model and in-memory span capture.

OpenTelemetry allows one global TracerProvider per process, so every test shares the
provider :mod:`llmtrace.testing` installs, with a switchable in-memory exporter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

import llmtrace
from llmtrace import testing


@pytest.fixture(scope="session", autouse=True)
def _capture_providers() -> None:
    """The process's OpenTelemetry providers are llmtrace.testing's from the first test on, so
    every capture can read metrics whichever test ran first (the SDK allows one MeterProvider)."""
    with testing.capture(instrument=False):
        pass


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    from tests.helpers import tiny_models

    return tiny_models.tokenizer()


@pytest.fixture(scope="session")
def tiny_model() -> Any:
    from tests.helpers import tiny_models

    return tiny_models.model()


@pytest.fixture
def capture_spans() -> Iterator[Callable[..., AbstractContextManager[testing.CapturedTelemetry]]]:
    """``with capture_spans(**options) as captured:`` — llmtrace instrumented with *options* for the block."""
    llmtrace.uninstrument()  # a test before us may have left other options in place

    def start(**options: Any) -> AbstractContextManager[testing.CapturedTelemetry]:
        return testing.capture(**options)

    yield start
    llmtrace.uninstrument()


@pytest.fixture
def captured() -> Iterator[testing.CapturedTelemetry]:
    """llmtrace instrumented with defaults for the whole test; spans collected at the end
    (call ``captured.collect()`` to read them earlier)."""
    llmtrace.uninstrument()
    with testing.capture() as telemetry:
        yield telemetry
