"""Which integrations exist: the one list, read by ``instrument()`` (to install each one's
post-import hook, :mod:`llmtrace.integrations._hooks`) and by :mod:`llmtrace.config` (the
names ``integrations=`` / ``disable=`` accept).

Data only, importing nothing, so the configuration layer can read it. To add an
integration, add its spec here (docs/integrations/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IntegrationSpec:
    name: str
    trigger: str  # the module whose import activates it
    module: str  # the integration's module; it defines INSTRUMENTOR (an Instrumentor subclass)


REGISTRY: tuple[IntegrationSpec, ...] = (
    IntegrationSpec("tokenizers", "tokenizers", "llmtrace.integrations.tokenizers"),
    IntegrationSpec("transformers", "transformers", "llmtrace.integrations.transformers"),
    IntegrationSpec("torch", "torch", "llmtrace.integrations.torch"),
    IntegrationSpec("fastapi", "fastapi", "llmtrace.integrations.fastapi"),
    IntegrationSpec("starlette", "starlette.applications", "llmtrace.integrations.starlette"),
    IntegrationSpec("aiohttp", "aiohttp.web", "llmtrace.integrations.aiohttp"),
    IntegrationSpec("grpc", "grpc", "llmtrace.integrations.grpc"),
    IntegrationSpec("vllm", "vllm", "llmtrace.integrations.vllm"),
)

NAMES: tuple[str, ...] = tuple(spec.name for spec in REGISTRY)
