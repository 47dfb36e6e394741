"""Shared pytest configuration. Fixture plugins are registered here; fixtures live beside their code."""

pytest_plugins = ["tests.stack.fixtures", "tests.helpers.fixtures"]
