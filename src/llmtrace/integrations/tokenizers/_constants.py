"""Targets of the ``tokenizers`` integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "tokenizers"
DISTRIBUTION: Final = "tokenizers"
SUPPORTED: Final = ">=0.19"
ENCODE_METHODS: Final = ("Tokenizer.encode", "Tokenizer.encode_batch")
DECODE_METHODS: Final = ("Tokenizer.decode", "Tokenizer.decode_batch")
