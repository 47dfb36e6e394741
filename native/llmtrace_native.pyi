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
