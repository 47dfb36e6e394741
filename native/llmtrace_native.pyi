"""Type stubs of the compiled module (native/src/lib.rs)."""

from collections.abc import Mapping, Sequence
from typing import Any

class Decoder:
    def __init__(
        self,
        span_type: type[tuple[Any, ...]],
        link_type: type[tuple[Any, ...]],
        kinds: Sequence[Any],
        statuses: Sequence[Any],
        empty_attrs: Mapping[str, Any],
    ) -> None: ...
    def spans_from_line(self, data: bytes, strings: dict[str, str]) -> list[Any] | None: ...

def classify_gaps(
    engine_id: str,
    segs: list[tuple[int, int]],
    forwards: list[Any],
    hosts: list[Any],
    host_cause: dict[str, int],
    extras: list[tuple[int, int, int]],
    work: list[tuple[int, int]],
    gap_type: type[tuple[Any, ...]],
    causes: tuple[str, ...],
) -> list[Any]: ...

ABI_VERSION: int
