"""The tiny local tokenizer and GPT-2 every test shares (built once per session, never downloaded)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from llmtrace.server.tiny_model import build_gpt2, train_tokenizer

CACHE_DIR = Path(os.environ.get("LLMTRACE_TEST_CACHE", Path.home() / ".cache" / "llmtrace" / "tiny"))


@functools.lru_cache(maxsize=1)
def tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` (byte-level BPE, 512 ids), padding on the left for generate()."""
    tok = train_tokenizer(512, cache_dir=CACHE_DIR)
    tok.padding_side = "left"
    return tok


@functools.lru_cache(maxsize=1)
def model() -> Any:
    """A random-weight 2-layer GPT-2 matching :func:`tokenizer`."""
    tok = tokenizer()
    return build_gpt2(len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def fresh_model(**overrides: Any) -> Any:
    tok = tokenizer()
    return build_gpt2(len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **overrides)
