"""Targets of the ``fastapi`` integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "fastapi"
DISTRIBUTION: Final = "fastapi"
SUPPORTED: Final = ">=0.110"
BUILD_MIDDLEWARE_STACK: Final = "FastAPI.build_middleware_stack"
