"""llmtrace tests. A package so that `tests.<helper>` imports work under plain `pytest`."""
