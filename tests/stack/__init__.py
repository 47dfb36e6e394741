"""The pytest side of the real collector + Jaeger stack (:mod:`scripts.otel_stack`).

- :mod:`tests.stack.fixtures` is the pytest plugin (``otel_stack`` and friends);
- :mod:`tests.stack.app` / ``run_app.py`` are the instrumented apps the stack tests drive.
"""
