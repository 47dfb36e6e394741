"""Targets of the ``aiohttp`` (server) integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "aiohttp.web"
APP_MODULE: Final = "aiohttp.web_app"
APP_INIT: Final = "Application.__init__"
RESPONSE_MODULE: Final = "aiohttp.web_response"
STREAM_WRITE: Final = "StreamResponse.write"
DISTRIBUTION: Final = "aiohttp"
SUPPORTED: Final = ">=3.9"
