"""The SGLang test model directory: the vLLM tests' tokenizer and config, architecture
``TinyTraceLMForCausalLM`` (tests/sglang/tiny_lm), float32 for the CPU. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

from tests.vllm import tiny_model as vllm_tiny_model

#: SGLANG_EXTERNAL_MODEL_PACKAGE: where SGLang finds the architecture.
MODEL_PACKAGE = "tests.sglang.tiny_lm"


def build(directory: Path) -> Path:
    vllm_tiny_model.build(directory)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config.update(architectures=["TinyTraceLMForCausalLM"], torch_dtype="float32")
    config_path.write_text(json.dumps(config))
    return directory
