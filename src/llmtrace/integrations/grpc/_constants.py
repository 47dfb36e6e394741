"""Targets of the ``grpc`` (server) integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "grpc"
AIO_MODULE: Final = "grpc.aio"
SERVER: Final = "server"
DISTRIBUTION: Final = "grpcio"
SUPPORTED: Final = ">=1.60"
