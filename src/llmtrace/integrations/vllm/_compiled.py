"""The pieces of llmtrace's compiled core (``native/``) the vLLM adapter calls, where it is built.

``OUTPUTS_PASS`` (``llmtrace_native.outputs_pass``): counts a step's common output — one token of a
running request with a record, nothing else to read — on the API server (``_api._api_outputs``)
and in EngineCore (``_engine._engine_outputs``), and hands every other output, in order, to the
Python pass. ``LLMTRACE_VLLM_OUTPUTS=python`` keeps it out: the Python pass alone is the
reference, with the same results. (EngineCore's step counter is the engine tracer's:
``EngineTracer.attach_counter``.)
"""

from __future__ import annotations

from typing import Any

from llmtrace import _native


def _outputs_pass() -> Any:
    native = _native.chosen_by("LLMTRACE_VLLM_OUTPUTS")
    return None if native is None else native.outputs_pass


OUTPUTS_PASS: Any = _outputs_pass()
