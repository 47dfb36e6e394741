"""The ``vllm.general_plugins`` entry point: llmtrace in every vLLM process, opt-in.

vLLM calls every general plugin in each of its processes (API server, EngineCore,
workers) before it builds engines, schedulers or workers — so the class patches
land before any instance exists. The entry point is installed with llmtrace, so
it must be a no-op unless asked for: it acts only when ``LLMTRACE_VLLM`` is true.
It never raises (vLLM calls it without a guard).
"""

from __future__ import annotations

import multiprocessing

from llmtrace.integrations import _engine_plugin
from llmtrace.integrations.vllm._constants import PLUGIN_ENV


def enabled_by_env(environ: dict[str, str] | None = None) -> bool:
    return _engine_plugin.enabled_by_env(PLUGIN_ENV, environ)


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
    _engine_plugin.start("vLLM", PLUGIN_ENV, process_role)
