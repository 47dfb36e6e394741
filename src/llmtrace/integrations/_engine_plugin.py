"""What the engine plugins (vLLM's ``vllm.general_plugins``, SGLang's ``sglang.srt.plugins``)
share: opt-in by an environment variable, and turning llmtrace on in the engine process that
loads them, with the process's role. The entry point is installed with llmtrace, so it must be
a no-op unless asked for, and it never raises into the engine's start-up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

log = logging.getLogger("llmtrace")

_TRUE = ("1", "true", "yes", "on")


def enabled_by_env(variable: str, environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(variable, "").strip().lower() in _TRUE


def start(engine: str, variable: str, role: Callable[[], str]) -> None:
    """``instrument()`` in this process when *variable* is true, unless the application already
    did; ``llmtrace.process.role`` from *role* unless ``LLMTRACE_PROCESS_ROLE`` is set."""
    try:
        if not enabled_by_env(variable):
            return
        from llmtrace import _instrument, instrument

        if _instrument.current() is not None:
            return  # the application called llmtrace.instrument() itself
        options: dict[str, str] = {}
        if not os.environ.get("LLMTRACE_PROCESS_ROLE"):
            options["process_role"] = role()
        instrument(**options)
    except Exception as exc:  # noqa: BLE001 - a tracing plugin must never stop the engine from starting
        log.warning("llmtrace: %s plugin could not start tracing: %s", engine, exc)
