"""Shared pytest configuration. Fixture plugins are registered here; fixtures live beside their code."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.stack.fixtures", "tests.helpers.fixtures"]

#: A test that uses one of these fixtures needs what the marker says, declared or not, so that
#: ``make test-fast`` leaves it out.
_MARK_OF_FIXTURE = {"otel_stack": "stack", "otel_stack_factory": "stack", "vllm_module": "vllm"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in _MARK_OF_FIXTURE.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(_MARK_OF_FIXTURE[fixture])
