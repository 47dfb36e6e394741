"""llmtrace's optional compiled core (``native/``, the ``llmtrace_native`` module): whether
this build of it may be called.

* not built (no Rust toolchain where llmtrace was installed): ``None``, and the Python code
  runs everywhere, with the same results;
* built from another llmtrace version (its ``ABI_VERSION`` differs, e.g. a venv reused
  across checkouts): ignored with one warning, never called with arguments it does not
  expect.

The analyzer (:mod:`llmtrace.analysis._native`), the OTLP/JSON encoder
(:mod:`llmtrace._otel.otlp_json`) and the ASGI middlewares' ``send``
(:mod:`llmtrace.integrations._asgi`) each add their own switch to turn it off
(:func:`chosen_by`).
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

#: Bump together with ``ABI_VERSION`` in native/src/lib.rs whenever a signature changes.
ABI_VERSION = 11

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


def chosen_by(variable: str) -> ModuleType | None:
    """:func:`load`, unless the environment variable ``variable`` is ``python`` (the Python
    code, which stays the reference). ``native`` or unset: the compiled module where built."""
    choice = os.environ.get(variable, "")
    if choice not in ("", "native", "python"):
        _log.warning("%s=%r is not one of native, python: using the default", variable, choice)
    return None if choice == "python" else load()
