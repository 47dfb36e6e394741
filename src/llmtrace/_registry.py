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
    distribution: str  # the package that provides the library (``llmtrace doctor`` reports its version)


REGISTRY: tuple[IntegrationSpec, ...] = (
    IntegrationSpec("tokenizers", "tokenizers", "llmtrace.integrations.tokenizers", "tokenizers"),
    IntegrationSpec("transformers", "transformers", "llmtrace.integrations.transformers", "transformers"),
    IntegrationSpec("torch", "torch", "llmtrace.integrations.torch", "torch"),
    IntegrationSpec("fastapi", "fastapi", "llmtrace.integrations.fastapi", "fastapi"),
    IntegrationSpec("starlette", "starlette.applications", "llmtrace.integrations.starlette", "starlette"),
    IntegrationSpec("aiohttp", "aiohttp.web", "llmtrace.integrations.aiohttp", "aiohttp"),
    IntegrationSpec("grpc", "grpc", "llmtrace.integrations.grpc", "grpcio"),
    IntegrationSpec("vllm", "vllm", "llmtrace.integrations.vllm", "vllm"),
    IntegrationSpec("sglang", "sglang.srt", "llmtrace.integrations.sglang", "sglang"),
)

NAMES: tuple[str, ...] = tuple(spec.name for spec in REGISTRY)
