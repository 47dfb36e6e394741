"""The lazy patching that installs the integrations of :mod:`llmtrace._registry`.

``instrument()`` imports nothing heavy: it registers a wrapt post-import hook per
integration on its trigger module. The hook fires when the host imports the
library (or at once, if it already has), checks that llmtrace is still enabled,
then imports the integration and patches. A hook never raises.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any

import wrapt

from llmtrace._registry import REGISTRY, IntegrationSpec
from llmtrace._safety import record_error
from llmtrace.config import Settings
from llmtrace.integrations._base import Instrumentor

_lock = threading.Lock()
_enabled = False
_hooked: set[str] = set()
_instrumentors: dict[str, Instrumentor] = {}


def _on_import(spec: IntegrationSpec) -> Any:
    def hook(module: Any) -> None:
        if not _enabled:
            return
        try:
            integration = importlib.import_module(spec.module)
            instrumentor = _instrumentors.get(spec.name)
            if instrumentor is None:
                instrumentor = integration.INSTRUMENTOR()
                _instrumentors[spec.name] = instrumentor
            instrumentor.instrument()
        except Exception as exc:  # noqa: BLE001 - a hook never raises into an import
            record_error(f"hook:{spec.name}", exc)

    return hook


def enable(settings: Settings) -> None:
    """Register (once) the post-import hooks of every enabled integration."""
    global _enabled
    with _lock:
        _enabled = True
        for spec in REGISTRY:
            if not settings.integration_enabled(spec.name):
                continue
            instrumentor = _instrumentors.get(spec.name)
            if spec.name in _hooked:
                # The hook already fired once (and will not again): re-patch directly —
                # also when it fired while llmtrace was off and so created no instrumentor.
                if instrumentor is not None:
                    instrumentor.instrument()
                elif (module := sys.modules.get(spec.trigger)) is not None:
                    _on_import(spec)(module)
                continue
            _hooked.add(spec.name)
            wrapt.register_post_import_hook(_on_import(spec), spec.trigger)


def disable() -> None:
    """Unpatch everything; hooks that fire later do nothing."""
    global _enabled
    with _lock:
        _enabled = False
        for instrumentor in _instrumentors.values():
            try:
                instrumentor.uninstrument()
            except Exception as exc:  # noqa: BLE001
                record_error("uninstrument", exc)


def active() -> list[str]:
    return sorted(name for name, inst in _instrumentors.items() if inst.active)


def instrumentor(name: str) -> Instrumentor | None:
    return _instrumentors.get(name)
