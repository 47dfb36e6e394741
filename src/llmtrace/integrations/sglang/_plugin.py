"""The ``sglang.srt.plugins`` entry point: llmtrace in every SGLang process, opt-in.

SGLang's ``load_plugins()`` runs every general plugin once per process — the HTTP
server (with the TokenizerManager), each Scheduler rank, the DetokenizerManager and
the data-parallel controller — before it builds the managers, so the class patches
land before any instance exists. The entry point is installed with llmtrace, so it
must be a no-op unless asked for: it acts only when ``LLMTRACE_SGLANG`` is true.
It never raises (SGLang logs a plugin's exception, but a tracer must not be noisy).
"""

from __future__ import annotations

import sys

from llmtrace.integrations import _engine_plugin
from llmtrace.integrations.sglang._constants import PLUGIN_ENV

#: SGLang's process entry functions (they call ``load_plugins()`` first) -> llmtrace process role.
_ROLES = {"run_scheduler_process": "scheduler", "run_detokenizer_process": "detokenizer",
          "run_data_parallel_controller_process": "dp-controller"}
#: Frames walked up from the plugin to find that entry function.
_MAX_FRAMES = 16


def enabled_by_env(environ: dict[str, str] | None = None) -> bool:
    return _engine_plugin.enabled_by_env(PLUGIN_ENV, environ)


def process_role(function_names: list[str] | None = None) -> str:
    """``scheduler``, ``detokenizer`` or ``dp-controller`` inside SGLang's process entry functions,
    else ``api-server`` (the HTTP server and TokenizerManager)."""
    names = function_names if function_names is not None else _caller_names()
    for name in names:
        if name in _ROLES:
            return _ROLES[name]
    return "api-server"


def _caller_names() -> list[str]:
    names: list[str] = []
    frame = sys._getframe(1)
    while frame is not None and len(names) < _MAX_FRAMES:
        names.append(frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    return names


def sglang_plugin() -> None:
    """Called by SGLang in each of its processes; turns llmtrace on when ``LLMTRACE_SGLANG=1``."""
    _engine_plugin.start("SGLang", PLUGIN_ENV, process_role)
