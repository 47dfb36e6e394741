"""Shared pytest configuration. Fixture plugins are registered here; fixtures live beside their code."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

import pytest

pytest_plugins = ["tests.stack.fixtures", "tests.helpers.fixtures"]

# The spill's default directory is the XDG state directory: a test run (and every subprocess it
# starts) gets its own, so that no test writes into the user's home or re-sends another run's spill.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="llmtrace-test-state-")
atexit.register(functools.partial(shutil.rmtree, os.environ["XDG_STATE_HOME"], ignore_errors=True))

#: A test that uses one of these fixtures needs what the marker says, declared or not, so that
#: ``make test-fast`` leaves it out.
_MARK_OF_FIXTURE = {"otel_stack": "stack", "otel_stack_factory": "stack", "vllm_module": "vllm"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in _MARK_OF_FIXTURE.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(_MARK_OF_FIXTURE[fixture])
