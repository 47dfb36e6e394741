"""llmtrace's optional compiled core (``native/``, the ``llmtrace_native`` module): whether
this build of it may be called.

* not built (no Rust toolchain where llmtrace was installed): ``None``, and the Python code
  runs everywhere, with the same results;
* built from another llmtrace version (its ``ABI_VERSION`` differs, e.g. a venv reused
  across checkouts): ignored with one warning, never called with arguments it does not
  expect.

The analyzer (:mod:`llmtrace.analysis._native`) and the OTLP/JSON encoder
(:mod:`llmtrace._otel.otlp_json`) each add their own switch to turn it off.
"""

from __future__ import annotations

import logging
from types import ModuleType

#: Bump together with ``ABI_VERSION`` in native/src/lib.rs whenever a signature changes.
ABI_VERSION = 6

_log = logging.getLogger(__name__)


def load() -> ModuleType | None:
    """The compiled module when it is built and of this version, else ``None``."""
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
