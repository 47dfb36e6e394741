"""The lifecycle core: records on the hot path, spans off it. See :mod:`llmtrace.lifecycle.request`."""
