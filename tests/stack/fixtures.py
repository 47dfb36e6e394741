"""pytest plugin: the real collector + Jaeger stack (registered in tests/conftest.py).

``otel_stack`` (session) keeps every trace and decides after 2 s, so any test can
send spans and read them back with ``otel_stack.find_traces(service, span_name)``.
Tests that need other sampling knobs start their own with ``otel_stack_factory``.
If the binaries cannot be built (no Go), the fixtures *fail*: CI must build them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from scripts.otel_stack.stack import TEST_SAMPLING, OtelStack


@pytest.fixture(scope="session")
def otel_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtelStack]:
    """Collector (collector/otel-collector.yaml) -> Jaeger (collector/jaeger.yaml) on free loopback ports."""
    stack = OtelStack.start(TEST_SAMPLING, log_dir=tmp_path_factory.mktemp("otel-stack"))
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def otel_stack_factory(tmp_path: Path) -> Iterator[Callable[[Mapping[str, str]], OtelStack]]:
    """Start stacks with other collector settings (merged over the test defaults); stopped after the test."""
    stacks: list[OtelStack] = []

    def start(overrides: Mapping[str, str]) -> OtelStack:
        log_dir = tmp_path / f"stack-{len(stacks)}"
        log_dir.mkdir()
        stack = OtelStack.start({**TEST_SAMPLING, **overrides}, log_dir=log_dir)
        stacks.append(stack)
        return stack

    try:
        yield start
    finally:
        for stack in stacks:
            stack.stop()
