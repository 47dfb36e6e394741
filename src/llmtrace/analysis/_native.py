"""Whether the analyzer's compiled core (``native/``, the ``llmtrace_native`` module) is usable.

Decided once, here; :mod:`llmtrace.analysis._kernels` then runs the compiled kernels or
the Python ones (the module's types come from ``native/llmtrace_native.pyi``):

* not built (no Rust toolchain where llmtrace was installed): ``None``, and the Python
  kernels run, with the same results;
* built from another llmtrace version (its ``ABI_VERSION`` differs, e.g. a venv reused
  across checkouts): ignored with one warning, never called with arguments it does not
  expect;
* ``LLMTRACE_ANALYSIS_NATIVE=0``: ignored on request (to rule it out when a result looks
  wrong; the tests compare both implementations).
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

#: Bump together with ``ABI_VERSION`` in native/src/lib.rs whenever a signature changes.
ABI_VERSION = 5

_log = logging.getLogger(__name__)


def _load() -> ModuleType | None:
    if os.environ.get("LLMTRACE_ANALYSIS_NATIVE", "1") == "0":
        return None
    try:
        import llmtrace_native
    except ImportError:
        return None
    found = getattr(llmtrace_native, "ABI_VERSION", None)  # a stale build may lack it
    if found != ABI_VERSION:
        _log.warning(
            "llmtrace-native is built from another llmtrace version (ABI %s, this one needs %s); "
            "using the Python code instead. Rebuild it: pip install ./native",
            found,
            ABI_VERSION,
        )
        return None
    return llmtrace_native


#: The compiled module, or ``None`` when the Python kernels serve everything.
native: ModuleType | None = _load()
