"""Pure functions from ``tokenizers`` objects to counts; no OTel, no patching."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EncodeInfo:
    """What one encode call produced."""

    tokens: int
    batch: int


def encode_info(result: Any) -> EncodeInfo:
    """Token count of an ``Encoding`` or a list of them (``encode_batch``)."""
    if isinstance(result, Sequence):
        return EncodeInfo(tokens=sum(len(item) for item in result), batch=len(result))
    return EncodeInfo(tokens=len(result), batch=1)


def decode_tokens(ids: Any, batched: bool) -> int:
    """Number of ids given to ``decode`` (one sequence) or ``decode_batch`` (a list of them)."""
    if batched:
        return sum(len(seq) for seq in ids)
    return len(ids)
