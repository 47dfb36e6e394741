"""Operator and developer scripts; :mod:`scripts.otel_stack` is importable (tests and CI use it)."""
