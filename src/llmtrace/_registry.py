"""Which integrations exist, what triggers them, and the lazy patching that installs them.

``instrument()`` imports nothing heavy: it registers a wrapt post-import hook per
integration on its trigger module. The hook fires when the host imports the
library (or at once, if it already has), checks that llmtrace is still enabled,
then imports the integration and patches. A hook never raises.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any

import wrapt

from llmtrace._safety import record_error
from llmtrace.config import Settings
from llmtrace.integrations._base import Instrumentor

log = logging.getLogger("llmtrace")


@dataclass(frozen=True)
class IntegrationSpec:
    name: str
    trigger: str
    module: str  # the integration's module; it defines INSTRUMENTOR (an Instrumentor subclass)
    default_on: bool = True


REGISTRY: tuple[IntegrationSpec, ...] = (
    IntegrationSpec("tokenizers", "tokenizers", "llmtrace.integrations.tokenizers"),
    IntegrationSpec("transformers", "transformers", "llmtrace.integrations.transformers"),
    IntegrationSpec("torch", "torch", "llmtrace.integrations.torch"),
    IntegrationSpec("fastapi", "fastapi", "llmtrace.integrations.fastapi"),
    IntegrationSpec("starlette", "starlette.applications", "llmtrace.integrations.starlette"),
    IntegrationSpec("aiohttp", "aiohttp.web", "llmtrace.integrations.aiohttp"),
    IntegrationSpec("grpc", "grpc", "llmtrace.integrations.grpc"),
    IntegrationSpec("vllm", "vllm", "llmtrace.integrations.vllm"),
    IntegrationSpec("sglang", "sglang.srt", "llmtrace.integrations.sglang"),
)

_lock = threading.Lock()
_enabled = False
_hooked: set[str] = set()
_instrumentors: dict[str, Instrumentor] = {}
_options: dict[str, Any] = {}


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
            instrumentor.instrument(**_options)
        except Exception as exc:  # noqa: BLE001 - a hook never raises into an import
            record_error(f"hook:{spec.name}", exc)

    return hook


def enable(settings: Settings, **options: Any) -> None:
    """Register (once) the post-import hooks of every enabled integration."""
    global _enabled
    with _lock:
        _enabled = True
        _options.clear()
        _options.update(options)
        for spec in REGISTRY:
            if not settings.integration_enabled(spec.name) or not spec.default_on:
                continue
            instrumentor = _instrumentors.get(spec.name)
            if spec.name in _hooked:
                # The hook already fired once (and will not again): re-patch directly —
                # also when it fired while llmtrace was off and so created no instrumentor.
                if instrumentor is not None:
                    instrumentor.instrument(**_options)
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
