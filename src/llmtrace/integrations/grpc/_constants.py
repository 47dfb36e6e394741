"""Targets of the ``grpc`` (server) integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "grpc"
SERVER: Final = "server"
DISTRIBUTION: Final = "grpcio"
SUPPORTED: Final = ">=1.60"
