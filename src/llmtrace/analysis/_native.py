"""Whether the analyzer uses llmtrace's compiled core (``native/``, the ``llmtrace_native``
module; :mod:`llmtrace._native` checks that the build is usable).

Decided once, here; :mod:`llmtrace.analysis._kernels` then runs the compiled kernels or
the Python ones (the module's types come from ``native/llmtrace_native.pyi``), with the same
results. ``LLMTRACE_ANALYSIS_NATIVE=0`` leaves the compiled core out on request (to rule it
out when a result looks wrong; the tests compare both implementations).
"""

from __future__ import annotations

import os
from types import ModuleType

from llmtrace import _native
from llmtrace._native import ABI_VERSION

__all__ = ["ABI_VERSION", "native"]


def _load() -> ModuleType | None:
    if os.environ.get("LLMTRACE_ANALYSIS_NATIVE", "1") == "0":
        return None
    return _native.load()


#: The compiled module, or ``None`` when the Python kernels serve everything.
native: ModuleType | None = _load()
