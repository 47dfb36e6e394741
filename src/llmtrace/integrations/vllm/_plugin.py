"""The ``vllm.general_plugins`` entry point: llmtrace in every vLLM process, opt-in.

vLLM calls every general plugin in each of its processes (API server, EngineCore,
workers) before it builds engines, schedulers or workers — so the class patches
land before any instance exists. The entry point is installed with llmtrace, so
it must be a no-op unless asked for: it acts only when ``LLMTRACE_VLLM`` is true.
It never raises (vLLM calls it without a guard).
"""

from __future__ import annotations

import logging
import multiprocessing
import os

from llmtrace.integrations.vllm._constants import PLUGIN_ENV

log = logging.getLogger("llmtrace")

_TRUE = ("1", "true", "yes", "on")


def enabled_by_env(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(PLUGIN_ENV, "").strip().lower() in _TRUE


def process_role(process_name: str | None = None) -> str:
    """``engine`` in vLLM's EngineCore processes, ``worker`` in its GPU workers, else ``api-server``."""
    name = process_name if process_name is not None else multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return "engine"
    if name.startswith(("VllmWorker", "Worker")):
        return "worker"
    return "api-server"


def vllm_plugin() -> None:
    """Called by vLLM in each of its processes; turns llmtrace on when ``LLMTRACE_VLLM=1``."""
    try:
        if not enabled_by_env():
            return
        from llmtrace import _instrument, instrument

        if _instrument.current() is not None:
            return  # the application called llmtrace.instrument() itself
        options: dict[str, str] = {}
        if not os.environ.get("LLMTRACE_PROCESS_ROLE"):
            options["process_role"] = process_role()
        instrument(**options)
    except Exception as exc:  # noqa: BLE001 - a tracing plugin must never stop vLLM from starting
        log.warning("llmtrace: vLLM plugin could not start tracing: %s", exc)
