"""Renderers: they consume an :class:`~llmtrace.analysis.summary.Analysis` summary, never compute."""
