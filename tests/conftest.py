"""Shared pytest configuration. Fixture plugins are registered here; fixtures live beside their code."""

import atexit
import functools
import os
import shutil
import tempfile

pytest_plugins = ["tests.stack.fixtures", "tests.helpers.fixtures"]

# The spill's default directory is the XDG state directory: a test run (and every subprocess it
# starts) gets its own, so that no test writes into the user's home or re-sends another run's spill.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="llmtrace-test-state-")
atexit.register(functools.partial(shutil.rmtree, os.environ["XDG_STATE_HOME"], ignore_errors=True))
