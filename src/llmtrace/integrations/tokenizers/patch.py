"""Wiring of the ``tokenizers`` integration: wrap ``Tokenizer`` encode/decode methods."""

from __future__ import annotations

from typing import Any

from llmtrace.integrations import _common
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.tokenizers import _constants, extractors


def _count_encode(result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    info = extractors.encode_info(result)
    return info.tokens, info.batch


def _count_decode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return extractors.decode_tokens(_common.first_argument(args, kwargs, "ids"), batched=False)


def _count_decode_batch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return extractors.decode_tokens(_common.first_argument(args, kwargs, "sequences"), batched=True)


class TokenizersInstrumentor(Instrumentor):
    name = "tokenizers"
    trigger = _constants.MODULE
    distribution = _constants.DISTRIBUTION
    supported = _constants.SUPPORTED

    def _patch(self) -> None:
        module = _constants.MODULE
        self.patches.replace(module, "Tokenizer.encode", _common.encode_method(_count_encode, "sequence"))
        self.patches.replace(module, "Tokenizer.encode_batch", _common.encode_method(_count_encode, "input"))
        self.patches.replace(module, "Tokenizer.decode", _common.decode_method(_count_decode))
        self.patches.replace(module, "Tokenizer.decode_batch", _common.decode_method(_count_decode_batch))
